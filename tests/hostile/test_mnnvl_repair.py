"""Hostile ``gpuagent.dev/mnnvl`` and ``gpuagent.dev/repair``: values that are no mode (wrong case, empty,
huge, control characters, not strings), pods of one gang that disagree, annotations that are no mapping.
A tenant writes them: each is an invalid gang naming the annotation (the pod unresolvable, one
``InvalidGang`` Event, nothing planned nor held), and a huge value is not repeated whole."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.extender import ExtenderState
from scheduler_plugin.extender.policy import GangPolicy, gang_policy
from scheduler_plugin.gangs import GangError
from tests.integration.fakekube import hypernode, node

NODES = [f"r0-t{t}" for t in range(4)]


def _pod(i: int, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"p{i}",
            "namespace": "ml",
            "uid": f"u{i}",
            "annotations": {
                "gpuagent.dev/gang": "g",
                "gpuagent.dev/gang-size": "2",
                "gpuagent.dev/subgroup-size": "2",
                "gpuagent.dev/subgroup-tier": "nvlink",
                "gpuagent.dev/rank": str(i),
                **extra,
            },
        },
        "spec": {
            "schedulerName": "gpu-topology-scheduler",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}],
        },
        "status": {"phase": "Pending"},
    }


BAD = [
    ("gpuagent.dev/mnnvl", "REQUIRED"),
    ("gpuagent.dev/mnnvl", " required"),
    ("gpuagent.dev/mnnvl", ""),
    ("gpuagent.dev/mnnvl", "required\n"),
    ("gpuagent.dev/mnnvl", "x" * 100_000),
    ("gpuagent.dev/mnnvl", 1),
    ("gpuagent.dev/mnnvl", None),
    ("gpuagent.dev/repair", "same_domain"),
    ("gpuagent.dev/repair", "ANY"),
    ("gpuagent.dev/repair", ["any"]),
]


@pytest.mark.parametrize(("annotation", "value"), BAD, ids=[f"{a}={str(v)[:12]!r}" for a, v in BAD])
def test_a_bad_value_is_an_invalid_gang_naming_the_annotation(annotation: str, value: Any) -> None:
    s = ExtenderState()
    s.cache.replace("nodes", [node(n, 4, labels={"gpuagent.dev/fabric-health": "healthy"}) for n in NODES])
    s.cache.replace("hypernodes", [hypernode("nvl-0", 1, "nvlink", NODES)])
    pods = [_pod(i, {annotation: value}) for i in range(2)]
    s.cache.replace("pods", pods)
    out = s.filter(pods[0], NODES, 0.0)
    assert not out.passed
    assert not s.holds.started
    msg = next(iter(out.unresolvable.values()))
    assert annotation in msg
    assert len(msg) < 1000  # a huge value is cut, not echoed
    assert [e.reason for e in out.events] == ["InvalidGang"]
    assert s.filter(pods[0], NODES, 0.0).events == []  # said once


def test_pods_that_disagree_are_an_error_naming_both() -> None:
    pods = [_pod(0, {"gpuagent.dev/repair": "any"}), _pod(1, {"gpuagent.dev/repair": "same-domain"})]
    with pytest.raises(GangError, match=r"ml/p0 and ml/p1 disagree on annotation gpuagent.dev/repair"):
        gang_policy("ml/g", pods)


def test_annotations_that_are_no_mapping_declare_nothing() -> None:
    odd = {"metadata": {"name": "p", "annotations": ["gpuagent.dev/mnnvl=off"]}}
    assert gang_policy("ml/g", [odd, {"metadata": None}, {}]) == GangPolicy()
