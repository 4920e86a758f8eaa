"""``subgroup_size: auto``: the planner sizes a role's subgroups from the domains' ready trays."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.cluster import node_ready, snapshot_from_objects
from scheduler_plugin.planner import plan
from scheduler_plugin.planner.autosize import candidate_sizes, domain_holds, ready_view
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, NodeState, Plan, Role

TIERS = ("nvlink", "leaf")


def racks(count: int, *, unready: dict[int, set[int]] | None = None, busy: int = 0) -> ClusterSnapshot:
    """``count`` GB200 NVL72 racks of 18 four-GPU trays under one leaf; ``unready``: rack -> trays."""
    nodes = [
        NodeState(
            name=f"r{r}-t{t:02}",
            gpus=4,
            free=0 if t < busy else 4,
            domains={"nvlink": f"nvl-r{r}", "leaf": "leaf-0"},
            ready=t not in (unready or {}).get(r, set()),
        )
        for r in range(count)
        for t in range(18)
    ]
    return ClusterSnapshot(tiers=TIERS, nodes=tuple(nodes))


def auto_gang(pods: int, minimum: int = 1, *, tier: str | None = "nvlink", gpus: int = 4) -> Gang:
    role = Role("worker", pods=pods, gpus_per_pod=gpus, subgroup_tier=tier, subgroup_auto_min=minimum)
    return Gang(name="train", roles=(role,))


def test_a_rack_with_two_unready_trays_takes_an_auto_gang_at_16() -> None:
    """What users of GB200 racks do by hand (a provider guarantees 16 of 18 trays): the planner does
    it from the trays' health, and places no pod on the unready trays."""
    snap = racks(1, unready={0: {3, 11}})
    result = plan(snap, auto_gang(16))
    assert isinstance(result, Plan), result
    assert result.subgroup_sizes == {"worker": 16}
    assert [(s.index, s.domain) for s in result.subgroups] == [(0, "nvl-r0")]
    assert not set(result.placement.values()) & {"r0-t03", "r0-t11"}


def test_data_parallel_replicas_are_equal_across_racks() -> None:
    # two racks, two and one unready trays: 16 and 17 ready; 32 pods -> two subgroups of 16 each
    snap = racks(2, unready={0: {0, 1}, 1: {5}})
    result = plan(snap, auto_gang(32))
    assert isinstance(result, Plan), result
    assert result.subgroup_sizes == {"worker": 16}
    assert sorted(s.domain or "" for s in result.subgroups) == ["nvl-r0", "nvl-r1"]
    per_rack: dict[str, int] = {}
    for node in result.placement.values():
        per_rack[node[:2]] = per_rack.get(node[:2], 0) + 1
    assert per_rack == {"r0": 16, "r1": 16}


def test_healthy_racks_take_the_whole_rack() -> None:
    result = plan(racks(2), auto_gang(36))
    assert isinstance(result, Plan), result
    assert result.subgroup_sizes == {"worker": 18}
    assert len(result.subgroups) == 2


def test_the_size_follows_free_ready_trays_not_only_health() -> None:
    # 6 trays busy in each rack, 1 unready: 11 free ready trays per rack; 20 pods -> 10 per rack
    result = plan(racks(2, unready={0: {17}, 1: {17}}, busy=6), auto_gang(20))
    assert isinstance(result, Plan), result
    assert result.subgroup_sizes == {"worker": 10}


def test_without_a_subgroup_tier_auto_sizes_by_the_first_tier() -> None:
    result = plan(racks(1, unready={0: {0, 1}}), auto_gang(16, tier=None))
    assert isinstance(result, Plan), result
    assert result.subgroup_sizes == {"worker": 16}
    assert [s.domain for s in result.subgroups] == ["nvl-r0"]


def test_unready_trays_are_left_to_fixed_size_gangs() -> None:
    """Only auto roles read readiness: a gang of fixed size keeps today's behaviour (item 3 of the
    issue, readiness for every multi-node NVLink gang, is the bind barrier's and not this)."""
    snap = racks(1, unready={0: set(range(18))})
    fixed = Gang(
        name="g", roles=(Role("w", pods=18, gpus_per_pod=4, subgroup_size=18, subgroup_tier="nvlink"),)
    )
    assert isinstance(plan(snap, fixed), Plan)
    assert isinstance(plan(snap, auto_gang(18)), Infeasible)


@pytest.mark.parametrize(
    ("gang", "snap", "needle"),
    [
        pytest.param(
            auto_gang(16, minimum=17),
            racks(1),
            "subgroup_size_min 17 is more than the role's 16 pods",
            id="min-over-pods",
        ),
        pytest.param(
            auto_gang(32, minimum=17),
            racks(2, unready={0: {0, 1}, 1: {0, 1}}),
            "no nvlink domain's ready nodes hold 17 of its pods (subgroup_size_min) now; the most one "
            "holds is 16; 4 node(s) not ready left out",
            id="min-over-ready",
        ),
        pytest.param(
            auto_gang(17, minimum=2),
            racks(2, unready={0: {0, 1}, 1: {0, 1}}),
            "no size from 2 (subgroup_size_min) to 16 (the most pods one nvlink domain's ready nodes hold "
            "now) divides its 17 pods into equal subgroups",
            id="prime-pods",
        ),
        pytest.param(
            auto_gang(36),
            racks(2, unready={0: {0}}),
            "no plan at any size that divides its 36 pods (18, 12, 9, 6, 4, 3, 2, 1); the nvlink domains' "
            "ready nodes hold fewer than 2 subgroups of 18",
            id="one-tray-short",
        ),
        pytest.param(
            auto_gang(16, minimum=0), racks(1), "subgroup_size_min must be at least 1, got 0", id="min-0"
        ),
        pytest.param(
            Gang(
                name="g",
                roles=(
                    Role("a", pods=2, gpus_per_pod=4, subgroup_auto_min=1),
                    Role("b", pods=2, gpus_per_pod=4, subgroup_auto_min=1),
                ),
            ),
            racks(1),
            "roles 'a' and 'b' both have subgroup_size auto; at most one role of a gang may",
            id="two-auto-roles",
        ),
        pytest.param(
            Gang(name="g", roles=(Role("w", pods=4, gpus_per_pod=4, min_subgroups=1, subgroup_auto_min=1),)),
            racks(1),
            "cannot be elastic",
            id="elastic",
        ),
        pytest.param(
            Gang(name="g", roles=(Role("w", pods=4, gpus_per_pod=4, subgroup_size=2, subgroup_auto_min=1),)),
            racks(1),
            "a fixed subgroup_size 2 contradict",
            id="fixed-and-auto",
        ),
    ],
)
def test_an_auto_gang_that_cannot_be_sized_says_why(gang: Gang, snap: ClusterSnapshot, needle: str) -> None:
    result = plan(snap, gang)
    assert isinstance(result, Infeasible)
    assert needle in result.reason


def test_candidate_sizes_are_the_divisors_in_range_largest_first() -> None:
    assert candidate_sizes(36, 1, 18) == [18, 12, 9, 6, 4, 3, 2, 1]
    assert candidate_sizes(36, 5, 16) == [12, 9, 6]
    assert candidate_sizes(17, 2, 16) == []
    assert candidate_sizes(9973, 1, 10_000) == [9973, 1]


def test_the_ready_view_keeps_ready_states_and_the_snapshot_when_all_are_ready() -> None:
    snap = racks(1)
    assert ready_view(snap) is snap
    partly = racks(1, unready={0: {2}})
    view = ready_view(partly)
    assert [n.name for n in view.nodes if not n.schedulable] == ["r0-t02"]
    assert all(a is b for a, b in zip(view.nodes, partly.nodes, strict=True) if a.name != "r0-t02")
    assert domain_holds(view, auto_gang(1).roles[0], "nvlink") == {"nvl-r0": 17}


def _tray(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {
            "allocatable": {"nvidia.com/gpu": "4"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


@pytest.mark.parametrize(
    ("labels", "ready"),
    [
        pytest.param({}, True, id="no-fabric"),
        pytest.param(
            {"gpuagent.dev/fabric-health": "healthy", "nvidia.com/gpu.clique": "c.1"}, True, id="ok"
        ),
        pytest.param(
            {"gpuagent.dev/fabric-health": "degraded", "nvidia.com/gpu.clique": "c.1"}, True, id="deg"
        ),
        pytest.param(
            {"gpuagent.dev/fabric-health": "unhealthy", "nvidia.com/gpu.clique": "c.1"}, False, id="bad"
        ),
        pytest.param({"gpuagent.dev/fabric-health": "healthy"}, False, id="clique-withdrawn"),
        pytest.param({"nvidia.com/gpu.clique": "c.1", "gpuagent.dev/imex": "ready"}, True, id="imex-ready"),
        pytest.param({"nvidia.com/gpu.clique": "c.1", "gpuagent.dev/imex": "absent"}, True, id="imex-absent"),
        pytest.param(
            {"nvidia.com/gpu.clique": "c.1", "gpuagent.dev/imex": "not-ready"}, False, id="imex-down"
        ),
        pytest.param({"nvidia.com/gpu.clique": "c.1", "gpuagent.dev/imex": "???"}, False, id="imex-unknown"),
    ],
)
def test_a_tray_is_ready_by_its_labels(labels: dict[str, str], ready: bool) -> None:
    assert node_ready(labels) is ready


def test_a_rack_of_nodes_with_two_unready_trays_takes_an_auto_gang_at_16_from_their_labels() -> None:
    """The same rack as the Kubernetes API serves it: one tray's clique label withdrawn (its fabric left
    COMPLETED), one tray's IMEX daemon not ready; the rack's domain comes from its HyperNode."""
    nodes = []
    for t in range(18):
        labels = {"gpuagent.dev/fabric-health": "healthy", "nvidia.com/gpu.clique": "uuid.0"}
        if t == 4:
            del labels["nvidia.com/gpu.clique"]
        if t == 9:
            labels["gpuagent.dev/imex"] = "not-ready"
        nodes.append(_tray(f"rack0-tray{t:02}", labels))
    hypernode = {
        "metadata": {"name": "nvl-rack0"},
        "spec": {
            "tier": 1,
            "tierName": "nvlink",
            "members": [{"type": "Node", "selector": {"regexMatch": {"pattern": "^rack0-"}}}],
        },
    }
    snap = snapshot_from_objects(nodes, [], [hypernode])
    assert [n.name for n in snap.nodes if not n.ready] == ["rack0-tray04", "rack0-tray09"]
    result = plan(snap, auto_gang(16))
    assert isinstance(result, Plan), result
    assert result.subgroup_sizes == {"worker": 16}
    assert not set(result.placement.values()) & {"rack0-tray04", "rack0-tray09"}
