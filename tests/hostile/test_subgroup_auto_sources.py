"""Hostile ``subgroup-size: auto`` on the RayCluster, Volcano PodGroup and native PodGroup sources:
minimums of 0, negative, huge (5000 digits, one over the limit) and not numbers, more than the role's
pods, a minimum without ``auto``, ``auto`` beside an elastic minimum or in two roles, a Volcano policy
that is not there or keeps a ``subGroupSize``. Each is a ``GangError`` naming the object and the field,
short; through the extender's state the pod is unresolvable with one ``InvalidGang`` Event and nothing
held."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.extender import ExtenderState
from scheduler_plugin.gangs import (
    GangError,
    gang_from_podgroup,
    gang_from_raycluster,
    gang_from_workload_podgroup,
)
from scheduler_plugin.snapshot import MAX_GANG_PODS
from tests.integration.fakekube import hypernode, node
from tests.scheduler_plugin.test_gang_sources import (
    TIERS,
    member,
    native_pg,
    ray_pod,
    raycluster,
    worker_group,
)
from tests.scheduler_plugin.test_subgroup_auto_sources import _vpods, volcano_pg

HUGE = "9" * 5000
AUTO = {"gpuagent.dev/subgroup-size": "auto"}
MIN = "gpuagent.dev/subgroup-size-min"

MINIMUMS = [
    pytest.param("0", "expected an integer >= 1, got 0", id="min-0"),
    pytest.param("-3", "expected an integer >= 1, got '-3'", id="negative"),
    pytest.param(HUGE, "over the limit of", id="5000-digits"),
    pytest.param(str(MAX_GANG_PODS + 1), "over the limit of", id="one-over-the-limit"),
    pytest.param("two", "got 'two'", id="text"),
    pytest.param("1.5", "got '1.5'", id="float"),
    pytest.param("5", "5 is more than", id="more-than-the-pods"),
]


def _short(err: pytest.ExceptionInfo[GangError], *needles: str) -> None:
    msg = str(err.value)
    for needle in needles:
        assert needle in msg, msg
    assert len(msg) < 400, msg


# -- RayCluster -------------------------------------------------------------------------------------


def _ray(group_ann: dict[str, str], cluster_ann: dict[str, str] | None = None, **group: Any) -> Any:
    rc = raycluster([worker_group("gpu", 4, ann=group_ann, **group)], ann=cluster_ann)
    pods = [ray_pod("rc-head", "headgroup")] + [ray_pod(f"rc-gpu-{i}", "gpu") for i in range(4)]
    return lambda: gang_from_raycluster(rc, pods, TIERS)


@pytest.mark.parametrize(("value", "needle"), MINIMUMS)
def test_raycluster_hostile_minimum_names_the_template_field(value: str, needle: str) -> None:
    with pytest.raises(GangError) as err:
        _ray({**AUTO, MIN: value})()
    _short(err, "RayCluster ml/rc: spec.workerGroupSpecs[0].template.metadata.annotations", MIN, needle)


@pytest.mark.parametrize(
    ("group_ann", "cluster_ann", "group", "needle"),
    [
        pytest.param({MIN: "2"}, None, {}, f"{MIN}] is read only with", id="min-without-auto"),
        pytest.param({}, {MIN: "2"}, {}, f"RayCluster ml/rc: metadata.annotations[{MIN}]", id="cluster-min"),
        pytest.param(
            AUTO,
            None,
            {"minReplicas": 1},
            "cannot be combined with spec.enableInTreeAutoscaling",
            id="elastic",
        ),
        pytest.param({"gpuagent.dev/subgroup-size": "AUTO"}, None, {}, "got 'AUTO'", id="upper-case"),
    ],
)
def test_raycluster_hostile_auto_is_a_gang_error(
    group_ann: dict[str, str], cluster_ann: dict[str, str] | None, group: dict[str, Any], needle: str
) -> None:
    rc = raycluster(
        [worker_group("gpu", 4, ann=group_ann, **group)], ann=cluster_ann, enableInTreeAutoscaling=True
    )
    pods = [ray_pod("rc-head", "headgroup")] + [ray_pod(f"rc-gpu-{i}", "gpu") for i in range(4)]
    with pytest.raises(GangError) as err:
        gang_from_raycluster(rc, pods, TIERS)
    _short(err, needle)


def test_raycluster_auto_in_two_worker_groups_is_a_gang_error() -> None:
    rc = raycluster([worker_group("a", 2), worker_group("b", 2)], ann=AUTO)
    pods = [ray_pod(f"rc-{g}-{i}", g) for g in "ab" for i in range(2)]
    with pytest.raises(GangError) as err:
        gang_from_raycluster(rc, pods, TIERS)
    _short(err, "roles a and b both have gpuagent.dev/subgroup-size: auto")


# -- Volcano PodGroup -------------------------------------------------------------------------------

NAMED = {"gpuagent.dev/subgroup-size-auto": "workers"}


@pytest.mark.parametrize(
    ("value", "needle"), [*MINIMUMS[:-1], pytest.param("7", "7 is more than the 6 pods")]
)
def test_volcano_hostile_minimum_names_the_podgroup_annotation(value: str, needle: str) -> None:
    with pytest.raises(GangError) as err:
        gang_from_podgroup(volcano_pg({**NAMED, MIN: value}), _vpods(), TIERS)
    _short(err, "PodGroup ml/pg", MIN, needle)


@pytest.mark.parametrize(
    ("ann", "worker", "needle"),
    [
        pytest.param(
            {MIN: "2"}, {}, "is read only with gpuagent.dev/subgroup-size-auto", id="min-without-auto"
        ),
        pytest.param(
            {"gpuagent.dev/subgroup-size-auto": "nope"},
            {},
            "'nope' names no subGroupPolicy entry",
            id="unknown",
        ),
        pytest.param(
            {"gpuagent.dev/subgroup-size-auto": "x" * 100_000},
            {},
            "names no subGroupPolicy entry",
            id="long-name",
        ),
        pytest.param(NAMED, {"subGroupSize": 2}, "must leave", id="fixed-size-too"),
        pytest.param(NAMED, {"minSubGroups": 2}, "set no minSubGroups", id="elastic"),
        pytest.param(NAMED, {"matchLabelKeys": ["role"]}, "nor matchLabelKeys", id="keyed"),
    ],
)
def test_volcano_hostile_auto_is_a_gang_error(
    ann: dict[str, str], worker: dict[str, Any], needle: str
) -> None:
    with pytest.raises(GangError) as err:
        gang_from_podgroup(volcano_pg(ann, **worker), _vpods(), TIERS)
    _short(err, "PodGroup ml/pg", needle)


# -- native PodGroup --------------------------------------------------------------------------------


def _native(ann: dict[str, str], pods: list[dict[str, Any]] | None = None, **kw: Any) -> Any:
    pg = native_pg(ref=None, **kw)
    pg["metadata"]["annotations"] = ann
    return lambda: gang_from_workload_podgroup(pg, pods or [member(f"p{i}") for i in range(4)], TIERS)


@pytest.mark.parametrize(("value", "needle"), MINIMUMS)
def test_native_hostile_minimum_names_the_podgroup_annotation(value: str, needle: str) -> None:
    with pytest.raises(GangError) as err:
        _native({**AUTO, MIN: value})()
    _short(err, "PodGroup ml/pg (scheduling.k8s.io): metadata.annotations", MIN, needle)


@pytest.mark.parametrize(
    ("ann", "kw", "needle"),
    [
        pytest.param(
            {MIN: "2"}, {}, "is read only with gpuagent.dev/subgroup-size: auto", id="min-without-auto"
        ),
        pytest.param({"gpuagent.dev/subgroup-size": "4"}, {}, "only 'auto' is read", id="a-count"),
        pytest.param({"gpuagent.dev/subgroup-size": HUGE}, {}, "only 'auto' is read", id="huge"),
        pytest.param(AUTO, {"min_count": 2}, "cannot be elastic", id="elastic"),
        pytest.param(AUTO, {"min_count": None}, "cannot be elastic", id="basic"),
    ],
)
def test_native_hostile_auto_is_a_gang_error(ann: dict[str, str], kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(GangError) as err:
        _native(ann, **kw)()
    _short(err, "PodGroup ml/pg (scheduling.k8s.io)", needle)


def test_native_auto_over_pods_of_two_shapes_is_a_gang_error() -> None:
    pods = [member("a", gpus=4), member("b", gpus=2)]
    with pytest.raises(GangError) as err:
        _native(AUTO, pods, min_count=2)()
    _short(err, "needs every pod of the group to request the same (it has 2 shapes)")


# -- through the extender's state -----------------------------------------------------------------


def test_state_answers_a_hostile_volcano_auto_unresolvable_and_holds_nothing() -> None:
    s = ExtenderState()
    names = [f"n{i}" for i in range(8)]
    s.cache.replace("nodes", [node(n, 4, labels={"gpuagent.dev/nvlink-domain": "d0"}) for n in names])
    s.cache.replace("hypernodes", [hypernode("nvl-0", 1, "nvlink", names)])
    pods = _vpods()
    for p in pods:
        p["spec"]["schedulerName"] = "gpu-topology-scheduler"
        p["metadata"]["uid"] = f"u-{p['metadata']['name']}"
    s.cache.replace("pods", pods)
    s.cache.replace("podgroups", [volcano_pg({**NAMED, MIN: HUGE})])
    out = s.filter(pods[3], names, now=1.0)
    assert not out.passed
    assert set(out.unresolvable) == set(names)
    assert "over the limit of" in next(iter(out.unresolvable.values()))
    assert [e.reason for e in out.events] == ["InvalidGang"]
    assert s.holds.started == {}
    assert s.holds.held_gpus() == {}
