"""``subgroup-size: auto`` through every gang source beside pod annotations: a KubeRay RayCluster
(template or cluster annotations, as its fixed size), a Volcano PodGroup (``gpuagent.dev/subgroup-size-auto``
naming the ``subGroupPolicy`` entry, whose ``subGroupSize`` is an integer) and a native
``scheduling.k8s.io`` PodGroup (its own annotations); each gives the role the planner sizes, and the
extender's state places it on ready trays at the size it chose."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.extender import ExtenderState
from scheduler_plugin.extender import bind as bind_module
from scheduler_plugin.gangs import (
    GangError,
    gang_from_podgroup,
    gang_from_raycluster,
    gang_from_workload_podgroup,
)
from scheduler_plugin.queue import QueueConfig
from tests.integration.fakekube import hypernode, node
from tests.scheduler_plugin.test_gang_sources import (
    NS,
    TIERS,
    member,
    native_pg,
    ray_pod,
    raycluster,
    worker_group,
)

AUTO = {"gpuagent.dev/subgroup-size": "auto"}
AUTO2 = {**AUTO, "gpuagent.dev/subgroup-size-min": "2"}


def _ray_pods(group: str, count: int) -> list[dict[str, Any]]:
    return [ray_pod("rc-head", "headgroup")] + [ray_pod(f"rc-{group}-{i}", group) for i in range(count)]


# -- RayCluster -------------------------------------------------------------------------------------


def test_raycluster_auto_on_the_worker_template() -> None:
    rc = raycluster([worker_group("gpu", 6, ann={**AUTO2, "gpuagent.dev/subgroup-tier": "nvlink"})])
    spec = gang_from_raycluster(rc, _ray_pods("gpu", 6), TIERS)
    head, gpu = spec.gang.roles
    assert (gpu.subgroup_size, gpu.subgroup_auto_min, gpu.subgroup_tier) == (None, 2, "nvlink")
    assert head.subgroup_auto_min is None
    assert spec.min_member == 7  # an auto role starts whole, with the head


def test_raycluster_auto_on_the_cluster_reaches_its_one_worker_group() -> None:
    """On the RayCluster, as a fixed size is; without a tier the role still has no fixed size (the
    planner sizes it on the first tier), never the whole group as one subgroup."""
    rc = raycluster([worker_group("gpu", 4)], ann=AUTO)
    (_, gpu) = gang_from_raycluster(rc, _ray_pods("gpu", 4), TIERS).gang.roles
    assert (gpu.subgroup_size, gpu.subgroup_auto_min, gpu.subgroup_tier) == (None, 1, None)


def test_raycluster_template_size_wins_over_a_cluster_auto() -> None:
    rc = raycluster(
        [worker_group("a", 4, ann={"gpuagent.dev/subgroup-size": "2"}), worker_group("b", 4)], ann=AUTO
    )
    pods = _ray_pods("a", 4) + [ray_pod(f"rc-b-{i}", "b") for i in range(4)]
    _, a, b = gang_from_raycluster(rc, pods, TIERS).gang.roles
    assert (a.subgroup_size, a.subgroup_auto_min) == (2, None)
    assert (b.subgroup_size, b.subgroup_auto_min) == (None, 1)


def test_raycluster_autoscaling_at_its_minimum_takes_auto() -> None:
    group = worker_group("gpu", 4, minReplicas=4, ann=AUTO)
    spec = gang_from_raycluster(raycluster([group], enableInTreeAutoscaling=True), _ray_pods("gpu", 4), TIERS)
    assert spec.gang.roles[1].subgroup_auto_min == 1
    assert spec.min_member == 5


# -- Volcano PodGroup -------------------------------------------------------------------------------


def _vpod(name: str, role: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"role": role},
            "annotations": {"scheduling.k8s.io/group-name": "pg"},
        },
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
    }


def volcano_pg(ann: dict[str, str], **worker: Any) -> dict[str, Any]:
    policies = [
        {"name": "ps", "subGroupSize": 2, "labelSelector": {"matchLabels": {"role": "ps"}}},
        {
            "name": "workers",
            "subGroupSize": 1,
            "labelSelector": {"matchLabels": {"role": "w"}},
            "networkTopology": {"mode": "hard", "highestTierName": "nvlink"},
            **worker,
        },
    ]
    return {
        "metadata": {"name": "pg", "namespace": NS, "annotations": ann},
        "spec": {"minMember": 8, "subGroupPolicy": policies},
    }


def _vpods() -> list[dict[str, Any]]:
    return [_vpod(f"ps{i}", "ps") for i in range(2)] + [_vpod(f"w{i}", "w") for i in range(6)]


def test_volcano_podgroup_annotation_names_the_auto_policy() -> None:
    pg = volcano_pg({"gpuagent.dev/subgroup-size-auto": "workers", "gpuagent.dev/subgroup-size-min": "3"})
    spec = gang_from_podgroup(pg, _vpods(), TIERS)
    ps, workers = spec.gang.roles
    assert (ps.subgroup_size, ps.subgroup_auto_min) == (2, None)
    assert (workers.pods, workers.subgroup_size, workers.subgroup_auto_min) == (6, None, 3)
    assert workers.subgroup_tier == "nvlink"
    assert spec.min_member == 8


def test_volcano_podgroup_without_the_annotation_keeps_subgroupsize() -> None:
    (_, workers) = gang_from_podgroup(volcano_pg({}), _vpods(), TIERS).gang.roles
    assert (workers.subgroup_size, workers.subgroup_auto_min) == (1, None)


def test_volcano_podgroup_auto_for_an_unnamed_policy_by_its_default_name() -> None:
    pg = volcano_pg({"gpuagent.dev/subgroup-size-auto": "subgroup-1"}, name="")
    (_, workers) = gang_from_podgroup(pg, _vpods(), TIERS).gang.roles
    assert (workers.name, workers.subgroup_auto_min) == ("subgroup-1", 1)


# -- native PodGroup --------------------------------------------------------------------------------


def _native(ann: dict[str, str], **kw: Any) -> dict[str, Any]:
    pg = native_pg(ref=None, **kw)
    pg["metadata"]["annotations"] = ann
    return pg


def test_native_podgroup_auto_from_its_annotations() -> None:
    spec = gang_from_workload_podgroup(_native(AUTO2), [member(f"p{i}") for i in range(4)], TIERS)
    (role,) = spec.gang.roles
    assert (role.pods, role.subgroup_size, role.subgroup_auto_min, role.min_subgroups) == (4, None, 2, None)
    assert spec.gang.tier == "nvlink"
    assert spec.min_member == 4


def test_native_podgroup_without_auto_is_unchanged() -> None:
    (role,) = gang_from_workload_podgroup(_native({}), [member(f"p{i}") for i in range(4)], TIERS).gang.roles
    assert role.subgroup_auto_min is None


# -- through the extender's state: sized from the ready trays -----------------------------------------

RACKS = [f"r{r}-t{t}" for r in range(2) for t in range(4)]
READY = {"gpuagent.dev/fabric-health": "healthy", "nvidia.com/gpu.clique": "c.0"}


def _state() -> ExtenderState:
    """Two racks of 4 trays, the last tray of each without its clique label (not ready)."""
    s = ExtenderState(queue=QueueConfig(reservation_ttl_s=30.0, barrier_timeout_s=5.0))
    s.cache.replace(
        "nodes",
        [
            node(
                n,
                4,
                labels={
                    "gpuagent.dev/nvlink-domain": n[:2],
                    **({"gpuagent.dev/fabric-health": "healthy"} if n.endswith("t3") else READY),
                },
            )
            for n in RACKS
        ],
    )
    s.cache.replace(
        "hypernodes", [hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t{t}" for t in range(4)]) for r in range(2)]
    )
    return s


def _ours(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["schedulerName"] = "gpu-topology-scheduler"
    pod["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
    return pod


def _bind_all(s: ExtenderState, pods: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, Any]]:
    placed: dict[str, str] = {}
    for p in pods:
        out = s.filter(p, RACKS, now=1.0)
        assert len(out.passed) == 1, (p["metadata"]["name"], out.failed, out.unresolvable)
        placed[p["metadata"]["name"]] = out.passed[0]
    decisions = [s.bind(NS, name, f"uid-{name}", n, now=2.0) for name, n in placed.items()]
    assert decisions[-1].action == "bind"
    return placed, dict(decisions[-1].annotations)


def test_state_sizes_a_raycluster_auto_group_from_the_ready_trays() -> None:
    """6 GPU workers (auto, at least 2) on two racks of 3 ready trays: size 3, one subgroup per rack,
    none on an unready tray; the head (no GPU) goes anywhere."""
    s = _state()
    rc = raycluster([worker_group("gpu", 6, ann={**AUTO2, "gpuagent.dev/subgroup-tier": "nvlink"})])
    pods = [_ours(p) for p in _ray_pods("gpu", 6)]
    pods[0]["spec"]["containers"][0]["resources"] = {}  # the head asks for nothing
    s.cache.replace("pods", pods)
    s.cache.replace("rayclusters", [rc])
    placed, annotations = _bind_all(s, pods)
    workers = {k: v for k, v in placed.items() if k != "rc-head"}
    assert not any(n.endswith("t3") for n in workers.values())
    assert sorted(n[:2] for n in workers.values()) == ["r0"] * 3 + ["r1"] * 3
    chosen = {bind_module.SUBGROUP_SIZE_CHOSEN: "3"}
    assert annotations == {f"{NS}/rc-gpu-{i}": chosen for i in range(6)}  # the head has no auto role


def test_state_sizes_a_native_auto_podgroup_from_the_ready_trays() -> None:
    """A native PodGroup of 3 pods (auto) inside one NVLink domain: 3 ready trays of one rack."""
    s = _state()
    pods = [_ours(member(f"p{i}")) for i in range(3)]
    s.cache.replace("pods", pods)
    s.cache.replace("workload_podgroups", [_native(AUTO, min_count=3)])
    placed, annotations = _bind_all(s, pods)
    assert len({n[:2] for n in placed.values()}) == 1
    assert not any(n.endswith("t3") for n in placed.values())
    assert annotations == {f"{NS}/p{i}": {bind_module.SUBGROUP_SIZE_CHOSEN: "3"} for i in range(3)}


@pytest.mark.parametrize("size", ["1", "auto "])
def test_native_podgroup_auto_value_is_read_stripped_and_only_auto(size: str) -> None:
    pods = [member(f"p{i}") for i in range(4)]
    if size == "1":
        with pytest.raises(GangError, match=r"only 'auto' is read on a PodGroup, got '1'"):
            gang_from_workload_podgroup(_native({"gpuagent.dev/subgroup-size": size}), pods, TIERS)
    else:
        spec = gang_from_workload_podgroup(_native({"gpuagent.dev/subgroup-size": size}), pods, TIERS)
        assert spec.gang.roles[0].subgroup_auto_min == 1


def test_state_sizes_a_volcano_auto_policy_from_the_ready_trays() -> None:
    """A Volcano PodGroup of 6 workers whose policy ``gpuagent.dev/subgroup-size-auto`` names: size 3,
    one subgroup on each rack's 3 ready trays."""
    s = _state()
    pg = volcano_pg({"gpuagent.dev/subgroup-size-auto": "workers", "gpuagent.dev/subgroup-size-min": "2"})
    pg["spec"]["minMember"] = 6
    pods = [_ours(_vpod(f"w{i}", "w")) for i in range(6)]
    s.cache.replace("pods", pods)
    s.cache.replace("podgroups", [pg])
    placed, annotations = _bind_all(s, pods)
    assert sorted(n[:2] for n in placed.values()) == ["r0"] * 3 + ["r1"] * 3
    assert not any(n.endswith("t3") for n in placed.values())
    assert annotations == {f"{NS}/w{i}": {bind_module.SUBGROUP_SIZE_CHOSEN: "3"} for i in range(6)}
