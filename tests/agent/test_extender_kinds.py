"""The extender's informers watch exactly the kinds its cache keeps (``scheduler_plugin.extender.KINDS``,
the one table of watched kinds), each with a projection or kept whole but for ``managedFields``."""

from __future__ import annotations

from agent.commands.extender import SOURCES
from scheduler_plugin.extender import KINDS, project


def test_every_informer_feeds_a_kind_the_cache_keeps_and_every_kept_kind_has_an_informer() -> None:
    assert sorted(kind for kind, _, _ in SOURCES) == sorted(KINDS)


def test_every_kind_is_kept_without_the_servers_bookkeeping() -> None:
    for kind in KINDS:
        obj = {"metadata": {"name": "x", "namespace": "ns", "managedFields": [{"manager": "m"}]}}
        assert "managedFields" not in project(kind, obj)["metadata"], kind
