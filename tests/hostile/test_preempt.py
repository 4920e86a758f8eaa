"""Hostile input to the extender's ``preempt`` verb over real HTTP on loopback: garbage
``ExtenderPreemptionArgs`` (wrong types, negative or huge PDB counts, victims without UIDs), victim maps
of over a hundred thousand pods or ten thousand nodes, unknown and forged preemptors and
victims. Every case gets a clear answer (HTTP 400 naming the field, or a result that takes nothing it
cannot vouch for), in bounded time, and the server keeps serving (``run`` checks health after each)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler_plugin.queueing import MAX_VICTIM_PODS
from tests.hostile.test_extender import Served, gang_pod, make_state, run
from tests.integration.fakekube import pod


def _args(victims: Any, *, preemptor: dict[str, Any] | None = None, meta: bool = True) -> bytes:
    key = "NodeNameToMetaVictims" if meta else "NodeNameToVictims"
    return json.dumps({"Pod": preemptor or pod("urgent", 4), key: victims}).encode()


@pytest.mark.parametrize(
    ("victims", "field"),
    [
        pytest.param([1, 2], "NodeNameToMetaVictims", id="map-is-a-list"),
        pytest.param({"r0-t0": "all"}, "NodeNameToMetaVictims['r0-t0']", id="victims-a-string"),
        pytest.param({"r0-t0": {"Pods": {"UID": "x"}}}, "Pods", id="pods-not-a-list"),
        pytest.param({"r0-t0": {"Pods": [7]}}, "Pods[0]", id="pod-not-an-object"),
        pytest.param({"r0-t0": {"Pods": [{"UID": ""}]}}, "Pods[0]", id="empty-uid"),
        pytest.param({"r0-t0": {"Pods": [{"Name": "x"}]}}, "Pods[0]", id="no-uid"),
        pytest.param({"r0-t0": {"Pods": [], "NumPDBViolations": -1}}, "NumPDBViolations", id="negative-pdb"),
        pytest.param({"r0-t0": {"Pods": [], "NumPDBViolations": "1"}}, "NumPDBViolations", id="pdb-string"),
        pytest.param({"r0-t0": {"Pods": [], "NumPDBViolations": True}}, "NumPDBViolations", id="pdb-bool"),
    ],
)
def test_garbage_victims_are_a_400_naming_the_field(victims: Any, field: str) -> None:
    async def test(srv: Served) -> None:
        status, out = await srv.call("POST", "/preempt", _args(victims))
        assert status == 400
        assert field in out["Error"]

    run(test, make_state([pod("urgent", 4), pod("v", 4, node_name="r0-t0")]))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"[]", id="not-an-object"),
        pytest.param(b'{"NodeNameToMetaVictims": {}}', id="no-pod"),
        pytest.param(
            b'{"Pod": {"metadata": {"name": "urgent"}}, "NodeNameToMetaVictims": {"n": {"NumPDBViolations": '
            + b"9" * 5000
            + b"}}}",
            id="5000-digit-pdb",
        ),
        pytest.param(b'{"Pod": ' * 200 + b"{}" + b"}" * 200, id="nested-200-deep"),
    ],
)
def test_bodies_that_are_not_preemption_args_are_refused(body: bytes) -> None:
    async def test(srv: Served) -> None:
        status, out = await srv.call("POST", "/preempt", body)
        assert status in (200, 400)
        assert out.get("Error")
        assert status == 400 or "Pod" in out["Error"]

    run(test, make_state([pod("urgent", 4)]))


def test_more_victims_than_the_limit_are_refused_without_reading_them_all() -> None:
    per_node = 1000
    nodes = MAX_VICTIM_PODS // per_node + 2
    victims = {f"n{i}": {"Pods": [{"UID": f"u{i}-{j}"} for j in range(per_node)]} for i in range(nodes)}

    async def test(srv: Served) -> None:
        status, out = await srv.call("POST", "/preempt", _args(victims))
        assert status == 400
        assert f"more than {MAX_VICTIM_PODS}" in out["Error"]

    run(test, make_state([pod("urgent", 4)]), max_body=32 << 20)


def test_ten_thousand_nodes_of_unknown_victims_take_nothing() -> None:
    victims = {f"ghost-{i}": {"Pods": [{"UID": f"forged-{i}"}], "NumPDBViolations": 0} for i in range(10_000)}

    async def test(srv: Served) -> None:
        status, out = await srv.call("POST", "/preempt", _args(victims))
        assert status == 200
        assert out == {"NodeNameToMetaVictims": {}}

    run(test, make_state([pod("urgent", 4), pod("v", 4, node_name="r0-t0")]), max_body=32 << 20)


def test_unknown_forged_and_gang_preemptors_get_no_victims() -> None:
    victim = pod("v", 4, node_name="r0-t0")
    uid = victim["metadata"]["uid"]
    meta = {"r0-t0": {"Pods": [{"UID": uid}], "NumPDBViolations": 0}}
    gang_member = gang_pod("g-0", 0, size=1)

    async def test(srv: Served) -> None:
        for preemptor in (
            pod("nobody", 4),  # not known to the informer
            {**pod("urgent", 4), "metadata": {**pod("urgent", 4)["metadata"], "uid": "forged-uid"}},
            gang_member,  # a gang's preemption is the queue's, whole gangs only
        ):
            status, out = await srv.call("POST", "/preempt", _args(meta, preemptor=preemptor))
            assert status == 200
            assert out == {"NodeNameToMetaVictims": {}}, preemptor["metadata"]
        # the real pod on its own may take the pod on its own
        status, out = await srv.call("POST", "/preempt", _args(meta))
        assert out == {"NodeNameToMetaVictims": meta}

    run(test, make_state([pod("urgent", 4), victim, gang_member]))


def test_full_victims_form_is_read_and_half_a_gang_is_never_offered() -> None:
    members = [gang_pod(f"pair-{i}", i, gang="pair", size=2) for i in range(2)]
    members[0]["spec"]["nodeName"], members[1]["spec"]["nodeName"] = "r0-t0", "r0-t1"
    members[0]["status"]["phase"] = members[1]["status"]["phase"] = "Running"

    async def test(srv: Served) -> None:
        full = {"r0-t0": {"Pods": [members[0]], "NumPDBViolations": 0}}
        status, out = await srv.call("POST", "/preempt", _args(full, meta=False))
        assert status == 200
        assert out == {"NodeNameToMetaVictims": {}}

    run(test, make_state([pod("urgent", 4), *members]))
