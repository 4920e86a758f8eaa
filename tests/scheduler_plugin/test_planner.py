"""The planner: scenario tables and Hypothesis properties (capacity, all-or-nothing, domains,
determinism, and feasibility against a brute-force search on small clusters)."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_plugin.planner import plan, prepare, role_subgroups, useful_block
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, NodeState, Plan, PodSlot, Role

TIERS = ("nvlink", "leaf", "spine")


def rack_cluster(
    busy_per_rack: Sequence[int], *, trays: int = 18, racks_per_leaf: int = 2, leaves_per_spine: int = 2
):
    """NVL72-like racks of ``trays`` 4-GPU trays; rack r has its first ``busy_per_rack[r]`` trays busy."""
    nodes = []
    for r, busy in enumerate(busy_per_rack):
        leaf = r // racks_per_leaf
        for t in range(trays):
            nodes.append(
                NodeState(
                    name=f"rack{r:02d}-tray{t:02d}",
                    gpus=4,
                    free=0 if t < busy else 4,
                    domains={
                        "nvlink": f"nvl-{r:02d}",
                        "leaf": f"leaf-{leaf}",
                        "spine": f"spine-{leaf // leaves_per_spine}",
                    },
                )
            )
    return ClusterSnapshot(tiers=TIERS, nodes=tuple(nodes))


def nvl72_gang(*, pods: int = 18, size: int | None = 18, tier: str | None = None, soft: bool = False, **kw):
    role = Role(name="worker", pods=pods, gpus_per_pod=4, subgroup_size=size, subgroup_tier="nvlink", **kw)
    return Gang(name="train", roles=(role,), tier=tier, soft=soft)


def domain_of(snapshot: ClusterSnapshot, node: str, tier: str) -> str:
    return next(n.domains[tier] for n in snapshot.nodes if n.name == node)


def check_capacity(snapshot: ClusterSnapshot, gang: Gang, result: Plan) -> None:
    use: Counter[str] = Counter()
    roles = {r.name: r for r in gang.roles}
    for pod, node in result.placement.items():
        use[node] += roles[pod.role].gpus_per_pod
    free = {n.name: n.free for n in snapshot.nodes}
    for node, gpus in use.items():
        assert gpus <= free[node], f"{node}: {gpus} GPUs planned, {free[node]} free"


# -- scenarios ----------------------------------------------------------------------------------


def test_72_gpu_job_finds_the_one_free_rack() -> None:
    busy = [1, 2, 3, 1, 0, 2, 3, 1]  # rack 4 is the only whole one
    snap = rack_cluster(busy)
    result = plan(snap, nvl72_gang())
    assert isinstance(result, Plan)
    assert {domain_of(snap, n, "nvlink") for n in result.placement.values()} == {"nvl-04"}
    assert result.subgroups[0].domain == "nvl-04"
    assert result.score["stranded_gpus"] == 0
    # rank-aware: consecutive pods on the rack's trays in name order
    assert [result.placement[PodSlot("worker", i)] for i in range(18)] == [
        f"rack04-tray{t:02d}" for t in range(18)
    ]


def test_72_gpu_job_without_a_free_rack_says_why() -> None:
    result = plan(rack_cluster([1, 2, 3, 1, 2, 3]), nvl72_gang())
    assert isinstance(result, Infeasible)
    assert "nvlink" in result.reason
    assert "18 pod(s) x 4 GPU(s)" in result.reason
    assert "most room: 17 pods" in result.reason


def test_soft_mode_falls_back_across_domains() -> None:
    snap = rack_cluster([1, 2, 3, 1])
    hard = plan(snap, nvl72_gang())
    soft = plan(snap, nvl72_gang(soft=True))
    assert isinstance(hard, Infeasible)
    assert isinstance(soft, Plan)
    assert soft.score["relaxed_tiers"] >= 1
    assert len(soft.placement) == 18
    check_capacity(snap, nvl72_gang(), soft)
    # one relaxation step is enough: the block stays inside one leaf
    leaves = {domain_of(snap, n, "leaf") for n in soft.placement.values()}
    assert len(leaves) == 1


def test_several_16_node_subgroups_under_one_spine() -> None:
    # spine-0 = racks 0-3 (two racks whole), spine-1 = racks 4-7 (all four with >= 16 free trays)
    snap = rack_cluster([0, 3, 0, 5, 2, 1, 0, 2])
    gang = nvl72_gang(pods=64, size=16, tier="spine")
    result = plan(snap, gang)
    assert isinstance(result, Plan)
    spines = {domain_of(snap, n, "spine") for n in result.placement.values()}
    assert spines == {"spine-1"}
    by_sub = [result.placement[PodSlot("worker", i)] for i in range(64)]
    for k in range(4):
        racks = {domain_of(snap, n, "nvlink") for n in by_sub[k * 16 : (k + 1) * 16]}
        assert len(racks) == 1, f"subgroup {k} spans {racks}"
    assert len({s.domain for s in result.subgroups}) == 4
    check_capacity(snap, gang, result)


def test_best_fit_keeps_whole_racks_intact() -> None:
    # a 16-tray block fits exactly in rack 1 (2 busy); taking rack 0 would strand 2 trays
    snap = rack_cluster([0, 2, 0])
    result = plan(snap, nvl72_gang(pods=16, size=16))
    assert isinstance(result, Plan)
    assert result.subgroups[0].domain == "nvl-01"
    assert result.score["stranded_gpus"] == 0


def after(snapshot: ClusterSnapshot, gang: Gang, result: Plan) -> ClusterSnapshot:
    """The snapshot once ``result`` is bound: its GPUs are no longer free."""
    use: Counter[str] = Counter()
    roles = {r.name: r for r in gang.roles}
    for pod, node in result.placement.items():
        use[node] += roles[pod.role].gpus_per_pod
    nodes = tuple(
        NodeState(name=n.name, gpus=n.gpus, free=n.free - use[n.name], domains=n.domains)
        for n in snapshot.nodes
    )
    return ClusterSnapshot(tiers=snapshot.tiers, nodes=nodes)


@pytest.mark.parametrize("r0_free", [10, 12, 15], ids=lambda f: f"r0-{f}-free-trays")
def test_tops_up_a_partly_used_rack_and_keeps_the_empty_one_whole(r0_free: int) -> None:
    snap = rack_cluster([18 - r0_free, 0])  # rack 0 partly used, rack 1 empty
    small = nvl72_gang(pods=8, size=8)
    first = plan(snap, small)
    assert isinstance(first, Plan)
    assert {domain_of(snap, n, "nvlink") for n in first.placement.values()} == {"nvl-00"}
    assert first.score["opened_domains"] == 0
    check_capacity(snap, small, first)
    # the whole rack is left for the next 18-tray gang
    later = after(snap, small, first)
    second = plan(later, nvl72_gang())
    assert isinstance(second, Plan)
    assert {domain_of(later, n, "nvlink") for n in second.placement.values()} == {"nvl-01"}


@pytest.mark.parametrize("r0_free", [0, 5, 7], ids=lambda f: f"r0-{f}-free-trays")
def test_opens_an_empty_rack_when_no_partly_used_one_fits(r0_free: int) -> None:
    snap = rack_cluster([18 - r0_free, 0])
    result = plan(snap, nvl72_gang(pods=8, size=8))
    assert isinstance(result, Plan)
    assert {domain_of(snap, n, "nvlink") for n in result.placement.values()} == {"nvl-01"}
    assert result.score["opened_domains"] == 1


def test_top_up_that_leaves_useful_room_beats_the_tightest_fit() -> None:
    # rack 0: 9 free trays (8 would leave 1, too small for a standard 4-tray segment);
    # rack 1: 12 free (leaves 4, a segment's worth); rack 2 empty
    snap = rack_cluster([9, 6, 0])
    result = plan(snap, nvl72_gang(pods=8, size=8))
    assert isinstance(result, Plan)
    assert result.subgroups[0].domain == "nvl-01"
    assert result.score["stranded_gpus"] == 0
    assert result.score["leftover_gpus"] == 16


def test_among_partly_used_racks_best_fit_wins() -> None:
    snap = rack_cluster([0, 4, 2, 6])  # free: 18 (whole), 14, 16, 12
    result = plan(snap, nvl72_gang(pods=12, size=12))
    assert isinstance(result, Plan)
    assert result.subgroups[0].domain == "nvl-03"  # leaves nothing
    assert result.score["leftover_gpus"] == 0


def test_single_node_jobs_stay_out_of_whole_racks() -> None:
    snap = rack_cluster([0, 16])  # rack 0 whole (first by name), rack 1 has 2 free trays
    gang = Gang(name="small", roles=(Role(name="w", pods=2, gpus_per_pod=4),))
    result = plan(snap, gang)
    assert isinstance(result, Plan)
    assert set(result.placement.values()) == {"rack01-tray16", "rack01-tray17"}
    assert result.score["opened_domains"] == 0


def test_useful_block_is_the_smaller_of_the_block_and_the_standard_segment() -> None:
    assert useful_block(Role(name="w", pods=18, gpus_per_pod=4, subgroup_size=18)) == 4
    assert useful_block(Role(name="w", pods=2, gpus_per_pod=4)) == 2
    assert useful_block(Role(name="w", pods=4, gpus_per_pod=8, subgroup_size=4)) == 2
    assert useful_block(Role(name="w", pods=1, gpus_per_pod=0)) == 1


def test_heterogeneous_roles_head_without_gpus() -> None:
    snap = rack_cluster([0, 0])
    head = Role(name="head", pods=1, gpus_per_pod=0)
    workers = Role(name="worker", pods=18, gpus_per_pod=4, subgroup_size=18, subgroup_tier="nvlink")
    gang = Gang(name="rl", roles=(head, workers), tier="leaf")
    result = plan(snap, gang)
    assert isinstance(result, Plan)
    assert PodSlot("head", 0) in result.placement
    assert len(result.placement) == 19
    # the head sits with the workers (a node the gang already uses)
    assert result.placement[PodSlot("head", 0)] in {result.placement[PodSlot("worker", i)] for i in range(18)}


def test_head_with_resources_that_no_node_has() -> None:
    snap = ClusterSnapshot(
        tiers=TIERS,
        nodes=(NodeState(name="a", gpus=4, free=4, free_resources={"cpu": 1000}),),
    )
    gang = Gang(name="g", roles=(Role(name="head", pods=1, gpus_per_pod=0, resources_per_pod={"cpu": 4000}),))
    result = plan(snap, gang)
    assert isinstance(result, Infeasible)
    assert "head" in result.reason
    assert "4000 cpu" in result.reason


@pytest.mark.parametrize(
    ("min_subgroups", "placed"),
    [
        pytest.param(None, None, id="all-or-nothing-fails"),
        pytest.param(1, 2, id="elastic-places-what-fits"),
        pytest.param(2, 2, id="elastic-at-minimum"),
        pytest.param(3, None, id="elastic-below-minimum-fails"),
    ],
)
def test_min_subgroups_elasticity(min_subgroups: int | None, placed: int | None) -> None:
    snap = rack_cluster([0, 1, 0, 3])  # two whole racks
    gang = nvl72_gang(pods=72, size=18, min_subgroups=min_subgroups)
    result = plan(snap, gang)
    if placed is None:
        assert isinstance(result, Infeasible)
        assert "subgroup(s)" in result.reason
        return
    assert isinstance(result, Plan)
    assert sorted(s.index for s in result.subgroups) == list(range(placed))  # a prefix of the blocks
    assert set(result.placement) == {PodSlot("worker", i) for i in range(placed * 18)}


def test_per_node_fit_not_aggregate() -> None:
    # 36 trays with 2 free GPUs each: 72 GPUs free in the rack, but no tray holds a 4-GPU pod
    nodes = tuple(
        NodeState(name=f"t{t:02d}", gpus=4, free=2, domains={"nvlink": "nvl-0", "leaf": "l", "spine": "s"})
        for t in range(36)
    )
    result = plan(ClusterSnapshot(tiers=TIERS, nodes=nodes), nvl72_gang())
    assert isinstance(result, Infeasible)
    assert "no schedulable node has room for one pod (4 GPU(s))" in result.reason
    assert "most free GPUs on one node: 2" in result.reason


def test_gang_tier_failure_names_the_tier() -> None:
    # enough whole racks in total, but never two under one leaf
    snap = rack_cluster([0, 2, 0, 2], racks_per_leaf=2)
    result = plan(snap, nvl72_gang(pods=36, tier="leaf"))
    assert isinstance(result, Infeasible)
    assert "one leaf domain" in result.reason


def test_tightest_tier_wins_on_ties() -> None:
    nodes = (
        NodeState(name="a", gpus=8, free=4, domains={"nvlink": "n1", "leaf": "l1", "spine": "s"}),
        NodeState(name="b", gpus=8, free=4, domains={"nvlink": "n2", "leaf": "l2", "spine": "s"}),
        NodeState(name="c", gpus=8, free=4, domains={"nvlink": "n2", "leaf": "l2", "spine": "s"}),
    )
    gang = Gang(name="g", roles=(Role(name="w", pods=2, gpus_per_pod=4),))
    result = plan(ClusterSnapshot(tiers=TIERS, nodes=nodes), gang)
    assert isinstance(result, Plan)
    assert set(result.placement.values()) == {"b", "c"}
    assert result.score["span_tier"] == 1


def test_unschedulable_nodes_are_skipped() -> None:
    nodes = (
        NodeState(name="a", gpus=8, free=8, schedulable=False, domains={"nvlink": "n1"}),
        NodeState(name="b", gpus=8, free=8, domains={"nvlink": "n1"}),
    )
    gang = Gang(name="g", roles=(Role(name="w", pods=1, gpus_per_pod=8),))
    result = plan(ClusterSnapshot(tiers=("nvlink",), nodes=nodes), gang)
    assert isinstance(result, Plan)
    assert result.placement == {PodSlot("w", 0): "b"}


@pytest.mark.parametrize(
    ("gang", "needle"),
    [
        pytest.param(Gang(name="g", roles=()), "no roles", id="no-roles"),
        pytest.param(
            Gang(name="g", roles=(Role(name="w", pods=0, gpus_per_pod=1),)),
            "pods must be positive",
            id="zero-pods",
        ),
        pytest.param(
            Gang(name="g", roles=(Role(name="w", pods=1, gpus_per_pod=1, subgroup_tier="rack"),)),
            "unknown subgroup_tier 'rack'",
            id="unknown-subgroup-tier",
        ),
        pytest.param(
            Gang(name="g", roles=(Role(name="w", pods=1, gpus_per_pod=1),), tier="core"),
            "unknown tier",
            id="unknown-gang-tier",
        ),
        pytest.param(
            Gang(
                name="g",
                roles=(Role(name="w", pods=1, gpus_per_pod=1), Role(name="w", pods=1, gpus_per_pod=1)),
            ),
            "duplicate role",
            id="duplicate-role",
        ),
    ],
)
def test_invalid_gangs_are_infeasible_with_a_reason(gang: Gang, needle: str) -> None:
    result = plan(rack_cluster([0]), gang)
    assert isinstance(result, Infeasible)
    assert needle in result.reason


def test_short_last_subgroup() -> None:
    snap = rack_cluster([0, 10])
    gang = nvl72_gang(pods=26, size=18)  # blocks of 18 and 8
    result = plan(snap, gang)
    assert isinstance(result, Plan)
    assert role_subgroups(gang.roles[0]) == (18, 1, 8)
    assert {s.index: s.domain for s in result.subgroups} == {0: "nvl-00", 1: "nvl-01"}


def test_prepared_snapshot_reused_gives_same_plan() -> None:
    snap = rack_cluster([1, 0, 2])
    prepared = prepare(snap)
    assert plan(prepared, nvl72_gang()) == plan(snap, nvl72_gang())


# -- properties ---------------------------------------------------------------------------------


@st.composite
def small_cases(draw: st.DrawFn) -> tuple[ClusterSnapshot, Gang]:
    n_nodes = draw(st.integers(1, 5))
    nodes = []
    for i in range(n_nodes):
        gpus = draw(st.integers(0, 4))
        free = draw(st.integers(0, gpus))
        nv = draw(st.integers(0, 2))
        nodes.append(
            NodeState(name=f"n{i}", gpus=gpus, free=free, domains={"nvlink": f"d{nv}", "leaf": f"l{nv // 2}"})
        )
    pods = draw(st.integers(1, 4))
    gpus_per_pod = draw(st.integers(1, 3))
    size = draw(st.one_of(st.none(), st.integers(1, pods)))
    sub_tier = draw(st.sampled_from([None, "nvlink", "leaf"]))
    blocks = -(-pods // (size or pods))
    min_sg = draw(st.one_of(st.none(), st.integers(0, blocks))) if size else None
    gang_tier = draw(st.sampled_from([None, "nvlink", "leaf"]))
    role = Role(
        name="w",
        pods=pods,
        gpus_per_pod=gpus_per_pod,
        subgroup_size=size,
        subgroup_tier=sub_tier,
        min_subgroups=min_sg,
    )
    snap = ClusterSnapshot(tiers=("nvlink", "leaf"), nodes=tuple(draw(st.permutations(nodes))))
    return snap, Gang(name="g", roles=(role,), tier=gang_tier)


def brute_force_max_pods(snap: ClusterSnapshot, gang: Gang) -> int | None:
    """Most pods a valid placement holds (a prefix of whole blocks, at least the minimum), or None."""
    (role,) = gang.roles
    size, full, rem = role_subgroups(role)
    total = full + (1 if rem else 0)
    need = total if role.min_subgroups is None or role.subgroup_size is None else max(role.min_subgroups, 1)
    nodes = list(snap.nodes)
    for count in range(total, need - 1, -1):
        n_pods = min(count * size, role.pods)
        if n_pods == 0:
            return 0
        for assign in itertools.product(range(len(nodes)), repeat=n_pods):
            use = Counter(assign)
            if any(use[i] * role.gpus_per_pod > nodes[i].free for i in use):
                continue
            if gang.tier and len({nodes[i].domains.get(gang.tier) for i in assign}) != 1:
                continue
            if role.subgroup_tier:
                ok = True
                for b in range(count):
                    block = assign[b * size : (b + 1) * size]
                    if len({nodes[i].domains.get(role.subgroup_tier) for i in block}) != 1:
                        ok = False
                        break
                if not ok:
                    continue
            return n_pods
    return None


@settings(max_examples=150)
@given(small_cases())
def test_feasible_exactly_when_brute_force_finds_a_placement(case: tuple[ClusterSnapshot, Gang]) -> None:
    snap, gang = case
    best = brute_force_max_pods(snap, gang)
    result = plan(snap, gang)
    if best is None or best == 0:
        assert isinstance(result, Infeasible), result
        return
    assert isinstance(result, Plan), (result, best)
    assert len(result.placement) == best


@given(small_cases())
def test_plan_properties(case: tuple[ClusterSnapshot, Gang]) -> None:
    snap, gang = case
    result = plan(snap, gang)
    if isinstance(result, Infeasible):
        assert result.reason
        return
    check_capacity(snap, gang, result)
    (role,) = gang.roles
    size, _, _ = role_subgroups(role)
    placed_blocks = sorted(s.index for s in result.subgroups)
    assert placed_blocks == list(range(len(placed_blocks)))  # a prefix: ranks stay dense
    expected = {
        PodSlot("w", i) for b in placed_blocks for i in range(b * size, min((b + 1) * size, role.pods))
    }
    assert set(result.placement) == expected  # whole blocks only: all or nothing per block
    if role.min_subgroups is None:
        assert len(result.placement) == role.pods
    for b in placed_blocks:
        nodes = [result.placement[PodSlot("w", i)] for i in range(b * size, min((b + 1) * size, role.pods))]
        if role.subgroup_tier:
            assert len({domain_of(snap, n, role.subgroup_tier) for n in nodes}) == 1
    if gang.tier:
        assert len({domain_of(snap, n, gang.tier) for n in result.placement.values()}) == 1


@given(small_cases(), st.randoms(use_true_random=False))
def test_deterministic_whatever_the_node_order(case: tuple[ClusterSnapshot, Gang], rnd) -> None:  # type: ignore[no-untyped-def]
    snap, gang = case
    shuffled = list(snap.nodes)
    rnd.shuffle(shuffled)
    again = ClusterSnapshot(tiers=snap.tiers, nodes=tuple(shuffled))
    assert plan(snap, gang) == plan(again, gang)
    assert plan(snap, gang) == plan(snap, gang)


@settings(max_examples=60)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=5), st.integers(1, 6))
def test_never_opens_a_whole_rack_when_a_partly_used_one_fits(busy: list[int], pods: int) -> None:
    snap = rack_cluster(busy, trays=6)
    result = plan(snap, nvl72_gang(pods=pods, size=pods))
    fits = [6 - b >= pods for b in busy]
    if not any(fits):
        assert isinstance(result, Infeasible)
        return
    assert isinstance(result, Plan)
    chosen = int(result.subgroups[0].domain.removeprefix("nvl-"))  # type: ignore[union-attr]
    assert fits[chosen]
    partly_used_fits = [r for r, b in enumerate(busy) if fits[r] and b > 0]
    if partly_used_fits:
        assert chosen in partly_used_fits
        assert result.score["opened_domains"] == 0
    else:
        assert result.score["opened_domains"] == 1


def test_a_cluster_without_tiers() -> None:
    snap = ClusterSnapshot(
        tiers=(), nodes=(NodeState(name="a", gpus=8, free=8), NodeState(name="b", gpus=8, free=2))
    )
    result = plan(snap, Gang(name="g", roles=(Role(name="w", pods=3, gpus_per_pod=2),)))
    assert isinstance(result, Plan)
    assert result.placement == {
        PodSlot("w", 0): "b",
        PodSlot("w", 1): "a",
        PodSlot("w", 2): "a",
    }  # best fit: the fuller node first
    assert result.score["span_tier"] == 1  # one past the (absent) tiers: the cluster


@st.composite
def two_role_cases(draw: st.DrawFn) -> tuple[ClusterSnapshot, Gang]:
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        gpus = draw(st.integers(0, 8))
        nv = draw(st.integers(0, 2))
        cpu = draw(st.integers(0, 8000))
        nodes.append(
            NodeState(
                name=f"n{i}",
                gpus=gpus,
                free=draw(st.integers(0, gpus)),
                domains={"nvlink": f"d{nv}", "leaf": f"l{nv // 2}"},
                free_resources={"cpu": cpu},
            )
        )
    head = Role(
        name="head",
        pods=draw(st.integers(1, 2)),
        gpus_per_pod=0,
        resources_per_pod={"cpu": draw(st.integers(0, 4000))},
    )
    pods = draw(st.integers(1, 6))
    workers = Role(
        name="worker",
        pods=pods,
        gpus_per_pod=draw(st.integers(1, 4)),
        subgroup_size=draw(st.one_of(st.none(), st.integers(1, pods))),
        subgroup_tier=draw(st.sampled_from([None, "nvlink", "leaf"])),
        resources_per_pod={"cpu": draw(st.integers(0, 2000))},
    )
    gang = Gang(
        name="g", roles=(head, workers), tier=draw(st.sampled_from([None, "leaf"])), soft=draw(st.booleans())
    )
    return ClusterSnapshot(tiers=("nvlink", "leaf"), nodes=tuple(nodes)), gang


@given(two_role_cases())
def test_heterogeneous_roles_respect_every_resource(case: tuple[ClusterSnapshot, Gang]) -> None:
    snap, gang = case
    result = plan(snap, gang)
    assert result == plan(snap, gang)
    if isinstance(result, Infeasible):
        assert result.reason
        return
    roles = {r.name: r for r in gang.roles}
    assert set(result.placement) == {
        PodSlot(r.name, i) for r in gang.roles for i in range(r.pods)
    }  # all or nothing
    gpus: Counter[str] = Counter()
    cpu: Counter[str] = Counter()
    for pod, node in result.placement.items():
        role = roles[pod.role]
        gpus[node] += role.gpus_per_pod
        cpu[node] += role.resources_per_pod.get("cpu", 0)
    by_name = {n.name: n for n in snap.nodes}
    for node in gpus:
        assert gpus[node] <= by_name[node].free
        assert cpu[node] <= by_name[node].free_resources["cpu"]
    if gang.tier and not gang.soft:
        assert len({by_name[n].domains["leaf"] for n in result.placement.values()}) == 1


# -- opened higher-tier domains, prepared snapshots derived from the last one, shortcuts ----------


def test_opens_a_rack_under_a_leaf_in_use_before_breaking_a_free_leaf() -> None:
    # leaf-0: two empty racks; leaf-1: rack 2 partly used, rack 3 empty. A whole-rack gang takes
    # rack 3 and leaves leaf-0 whole for a two-rack gang that needs one leaf.
    snap = rack_cluster([0, 0, 5, 0])
    result = plan(snap, nvl72_gang())
    assert isinstance(result, Plan)
    assert {domain_of(snap, n, "nvlink") for n in result.placement.values()} == {"nvl-03"}
    assert result.score["opened_domains"] == 1
    assert result.score["opened_upper"] == 0
    taken = set(result.placement.values())
    after = ClusterSnapshot(
        tiers=snap.tiers,
        nodes=tuple(
            NodeState(n.name, n.gpus, 0 if n.name in taken else n.free, n.domains) for n in snap.nodes
        ),
    )
    assert isinstance(plan(after, nvl72_gang(pods=36, tier="leaf")), Plan)


def test_upper_figure_weighs_a_spine_above_every_leaf() -> None:
    # spine-0 = racks 0-3 all empty; spine-1: rack 4 partly used, racks 5-7 empty (leaf-3 empty).
    # Opening rack 5 (leaf-2, in use) beats rack 6 (breaks leaf-3) beats rack 0 (breaks a leaf and
    # a spine).
    snap = rack_cluster([0, 0, 0, 0, 3, 0, 0, 0])
    result = plan(snap, nvl72_gang())
    assert isinstance(result, Plan)
    assert {domain_of(snap, n, "nvlink") for n in result.placement.values()} == {"nvl-05"}


def _changed(snap: ClusterSnapshot, frees: dict[int, int]) -> ClusterSnapshot:
    """``snap`` with new free GPUs on some nodes; the other NodeState objects are the same objects."""
    nodes = list(snap.nodes)
    for i, f in frees.items():
        n = nodes[i]
        nodes[i] = NodeState(n.name, n.gpus, f, n.domains)
    return ClusterSnapshot(tiers=snap.tiers, nodes=tuple(nodes))


GANG_SHAPES = (
    nvl72_gang(),
    nvl72_gang(pods=36, tier="leaf"),
    nvl72_gang(pods=8, size=4),
    nvl72_gang(pods=16, size=4),
    nvl72_gang(pods=32, size=16, tier="spine"),
    Gang(name="small", roles=(Role(name="w", pods=3, gpus_per_pod=4),)),
    Gang(name="two", roles=(Role(name="w", pods=5, gpus_per_pod=2),)),
    nvl72_gang(pods=54, min_subgroups=1),
    nvl72_gang(pods=36, tier="leaf", min_subgroups=1),
    nvl72_gang(pods=12, size=4, tier="nvlink", min_subgroups=1),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([0, 0, 1, 3, 4, 4, 4, 4]), min_size=72, max_size=72),
    st.lists(st.tuples(st.integers(0, 71), st.integers(0, 4)), max_size=12),
)
def test_a_snapshot_prepared_from_the_last_one_plans_like_a_fresh_one(
    frees: list[int], changes: list[tuple[int, int]]
) -> None:
    base = rack_cluster([0] * 4)
    first = _changed(base, dict(enumerate(frees)))
    before = prepare(first)
    for gang in GANG_SHAPES:  # fill the caches the next snapshot derives from
        plan(before, gang)
    second = _changed(first, dict(changes))
    derived = prepare(second, like=before)
    for gang in GANG_SHAPES:
        assert plan(derived, gang) == plan(prepare(second), gang), gang


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.tuples(st.integers(0, 71), st.integers(0, 4)), max_size=10), st.integers(0, 9)),
        min_size=2,
        max_size=7,
    ),
)
def test_a_chain_of_snapshots_with_few_plans_each_plans_like_fresh_ones(
    steps: list[tuple[list[tuple[int, int]], int]],
) -> None:
    # each step changes some nodes and plans one gang shape (or none: 9 and up), so caches are
    # derived from snapshots several steps back, across snapshots that never built them
    snap = rack_cluster([0] * 4)
    prepared = prepare(snap)
    for changes, shape in steps:
        snap = _changed(snap, dict(changes))
        prepared = prepare(snap, like=prepared)
        if shape < len(GANG_SHAPES) - 1:
            gang = GANG_SHAPES[shape]
            assert plan(prepared, gang) == plan(prepare(snap), gang), gang
    for gang in GANG_SHAPES:
        assert plan(prepared, gang) == plan(prepare(snap), gang), gang


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from([0, 1, 2, 4, 4]), min_size=288, max_size=288),
    st.lists(st.tuples(st.integers(0, 35), st.integers(0, 4)), min_size=1, max_size=6),
)
def test_few_changed_nodes_in_a_large_cluster_plan_like_a_fresh_snapshot(
    frees: list[int], changes: list[tuple[int, int]]
) -> None:
    # 16 racks, changes within the first two: the node order of roles without a subgroup tier is
    # updated by taking out and putting back only the nodes of the changed racks
    first = _changed(rack_cluster([0] * 16), dict(enumerate(frees)))
    before = prepare(first)
    shapes = (*GANG_SHAPES, Gang("one", (Role("w", 1, 1),)), Gang("ones", (Role("w", 6, 1),)))
    for gang in shapes:
        plan(before, gang)
    second = _changed(first, dict(changes))
    derived, fresh = prepare(second, like=before), prepare(second)
    for gpus in (1, 2, 4):
        assert derived.free_order((gpus, ()), None, 1) == fresh.free_order((gpus, ()), None, 1)
    for gang in shapes:
        assert plan(derived, gang) == plan(fresh, gang), gang


@pytest.mark.parametrize(
    ("busy", "change"),
    [
        pytest.param([1, 3, 5, 18], {0: 4}, id="a-rack-becomes-wholly-free"),
        pytest.param([0, 3, 5, 18], {0: 0}, id="a-wholly-free-rack-is-broken-into"),
        pytest.param([1, 3, 5, 18], {1: 2}, id="a-node-of-a-partly-used-rack-changes"),
    ],
)
def test_the_node_order_follows_a_racks_wholeness_not_only_its_changed_nodes(
    busy: list[int], change: dict[int, int]
) -> None:
    # the order key of a node of a rack whose wholeness flipped moves though the node did not change
    first = rack_cluster(busy)
    before = prepare(first)
    for gpus in (1, 4):
        before.free_order((gpus, ()), None, 1)
    second = _changed(first, change)
    derived, fresh = prepare(second, like=before), prepare(second)
    for gpus in (1, 4):
        assert derived.free_order((gpus, ()), None, 1) == fresh.free_order((gpus, ()), None, 1)
    gang = Gang("ones", (Role("w", 6, 1),))
    assert plan(derived, gang) == plan(fresh, gang)


def test_a_changed_topology_is_prepared_from_scratch() -> None:
    first = rack_cluster([0, 0], trays=4)
    before = prepare(first)
    plan(before, nvl72_gang(pods=4, size=4))
    moved = ClusterSnapshot(
        tiers=first.tiers,
        nodes=tuple(
            NodeState(n.name, n.gpus, n.free, {**n.domains, "nvlink": "nvl-x"} if i < 2 else n.domains)
            for i, n in enumerate(first.nodes)
        ),
    )
    assert prepare(moved, like=before).members[0] != before.members[0]
    assert plan(prepare(moved, like=before), nvl72_gang(pods=4, size=4)) == plan(
        prepare(moved), nvl72_gang(pods=4, size=4)
    )


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.sampled_from([0, 0, 1, 3, 4, 4, 4, 4]), min_size=72, max_size=72),
    st.sampled_from(GANG_SHAPES),
)
def test_shortcuts_do_not_change_plans(frees: list[int], gang: Gang) -> None:
    snap = _changed(rack_cluster([0] * 4), dict(enumerate(frees)))
    assert_shortcuts_change_nothing(snap, gang)


def assert_shortcuts_change_nothing(snap: ClusterSnapshot, gang: Gang) -> None:
    fast = plan(prepare(snap), gang)
    slow = plan(prepare(snap), gang, shortcuts=False)
    assert fast == slow


def rack_frees(*racks: str) -> ClusterSnapshot:
    """One 4-GPU tray per character (its free GPUs) per rack; two racks per leaf."""
    nodes = []
    for r, frees in enumerate(racks):
        for t, f in enumerate(frees):
            nodes.append(
                NodeState(
                    name=f"rack{r:02d}-tray{t:02d}",
                    gpus=4,
                    free=int(f),
                    domains={"nvlink": f"nvl-{r:02d}", "leaf": f"leaf-{r // 2}", "spine": "spine-0"},
                )
            )
    return ClusterSnapshot(tiers=TIERS, nodes=tuple(nodes))


def test_small_gang_fills_room_left_over_beyond_whole_segments() -> None:
    # rack 0: 9 free trays (two 4-tray segments + 1), rack 1: 11 free (two + 3). A 4-tray job without
    # a subgroup goes to the left-over trays and both racks keep room for two segments each.
    snap = rack_frees("444444444000000000", "444444444440000000")
    result = plan(snap, Gang(name="small", roles=(Role(name="w", pods=4, gpus_per_pod=4),)))
    assert isinstance(result, Plan)
    assert result.score["lost_blocks"] == 0
    per_rack = Counter(domain_of(snap, n, "nvlink") for n in result.placement.values())
    assert per_rack == {"nvl-00": 1, "nvl-01": 3}
    segments = nvl72_gang(pods=16, size=4)  # four 4-tray segments still fit without opening a rack
    taken = set(result.placement.values())
    after = ClusterSnapshot(
        tiers=snap.tiers,
        nodes=tuple(
            NodeState(n.name, n.gpus, 0 if n.name in taken else n.free, n.domains) for n in snap.nodes
        ),
    )
    assert isinstance(plan(after, segments), Plan)


def test_a_gang_that_costs_a_segment_everywhere_takes_the_fullest_rack() -> None:
    # no left-over room anywhere (8 and 12 free trays): the 4-tray job costs one segment either way
    # and best fit puts it in the fuller rack
    snap = rack_frees("444444440000000000", "444444444444000000")
    result = plan(snap, Gang(name="small", roles=(Role(name="w", pods=4, gpus_per_pod=4),)))
    assert isinstance(result, Plan)
    assert result.score["lost_blocks"] == 1
    assert {domain_of(snap, n, "nvlink") for n in result.placement.values()} == {"nvl-00"}


def test_an_elastic_gang_takes_the_domain_where_more_pods_fit_even_if_it_opens_it() -> None:
    # d0 is wholly free and holds both pods; d1 is partly used and holds one: more pods rank first,
    # so skipping d0 for opening a domain would be wrong
    domains = ({"nvlink": "d1", "leaf": "l0"}, {"nvlink": "d0", "leaf": "l0"})
    snap = ClusterSnapshot(
        tiers=("nvlink", "leaf"),
        nodes=(
            NodeState("n0", 0, 0, domains[0]),
            NodeState("n1", 0, 0, domains[1]),
            NodeState("n2", 2, 2, domains[1]),
            NodeState("n3", 2, 1, domains[0]),
        ),
    )
    gang = Gang("g", (Role("w", 2, 1, subgroup_size=1, min_subgroups=0),), tier="nvlink")
    result = plan(snap, gang)
    assert isinstance(result, Plan)
    assert result.placement == {PodSlot("w", 0): "n2", PodSlot("w", 1): "n2"}


@st.composite
def varied_cases(draw: st.DrawFn) -> tuple[ClusterSnapshot, Gang]:
    """Racks of mixed nodes (some busy, some unschedulable) and gangs of one or two roles, elastic or
    not, with or without subgroup and gang tiers: the ground the search shortcuts must not change."""
    racks, trays = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    nodes = []
    for r in range(racks):
        for t in range(trays):
            gpus = draw(st.sampled_from([0, 2, 4, 4, 8]))
            nodes.append(
                NodeState(
                    name=f"r{r}t{t}",
                    gpus=gpus,
                    free=draw(st.integers(0, gpus)),
                    domains={"nvlink": f"nv{r}", "leaf": f"lf{r // 2}", "spine": "s0"},
                    schedulable=draw(st.booleans()) or draw(st.booleans()),
                )
            )
    roles = []
    for k in range(draw(st.integers(1, 2))):
        pods = draw(st.integers(1, 8))
        size = draw(st.one_of(st.none(), st.integers(1, min(4, pods))))
        roles.append(
            Role(
                name=f"r{k}",
                pods=pods,
                gpus_per_pod=draw(st.sampled_from([1, 2, 4])),
                subgroup_size=size,
                subgroup_tier=draw(st.sampled_from([None, "nvlink", "leaf"])) if size else None,
                min_subgroups=draw(st.one_of(st.none(), st.integers(0, 2))) if size else None,
            )
        )
    gang = Gang(
        name="g",
        roles=tuple(roles),
        tier=draw(st.sampled_from([None, "nvlink", "leaf", "spine"])),
        soft=draw(st.booleans()),
    )
    return ClusterSnapshot(tiers=TIERS, nodes=tuple(draw(st.permutations(nodes)))), gang


@settings(max_examples=300, deadline=None)
@given(varied_cases())
def test_shortcuts_do_not_change_plans_of_varied_gangs(case: tuple[ClusterSnapshot, Gang]) -> None:
    assert_shortcuts_change_nothing(*case)


def layered(*racks: tuple[str, str, str]) -> ClusterSnapshot:
    """Racks as (spine, leaf, free GPUs of each 4-GPU tray, one character per tray)."""
    nodes = [
        NodeState(f"r{r}t{t}", 4, int(f), {"nvlink": f"nv{r}", "leaf": leaf, "spine": spine})
        for r, (spine, leaf, frees) in enumerate(racks)
        for t, f in enumerate(frees)
    ]
    return ClusterSnapshot(tiers=TIERS, nodes=tuple(nodes))


def test_a_short_last_block_may_share_a_partly_used_domain() -> None:
    # leaf l1: nv3 holds 4 pods (a block of 3 and the short block of 1), nv5 a block of 3; nothing
    # has to be opened there, so l1 must not be skipped for "opening a domain at least"
    snap = layered(
        ("s0", "l0", "404044"),
        ("s0", "l0", "444424"),
        ("s0", "l0", "000040"),
        ("s0", "l1", "442044"),
        ("s0", "l1", "444444"),
        ("s0", "l1", "404204"),
    )
    gang = Gang("g", (Role("w", 7, 4, subgroup_size=3, subgroup_tier="nvlink"),), tier="leaf")
    result = plan(snap, gang)
    assert isinstance(result, Plan)
    assert result.score["opened_domains"] == 0
    assert {domain_of(snap, n, "leaf") for n in result.placement.values()} == {"l1"}
    assert_shortcuts_change_nothing(snap, gang)


def test_a_worse_plan_in_a_tighter_scope_does_not_end_the_search() -> None:
    # the cluster-wide plan fills stranded trays in two spines; leaf l3's plan strands as little
    # but loses a segment, so it is no better; spine s1 holds a plan as good and tighter
    snap = layered(
        ("s0", "l0", "4444444"),
        ("s0", "l0", "4044240"),
        ("s0", "l1", "4444444"),
        ("s0", "l1", "4440444"),
        ("s1", "l2", "4420444"),
        ("s1", "l2", "0000044"),
        ("s1", "l3", "2444444"),
        ("s1", "l3", "2020000"),
    )
    gang = Gang("g", (Role("w", 4, 2),), soft=True)
    result = plan(snap, gang)
    assert isinstance(result, Plan)
    assert result.score["span_tier"] == 3  # inside spine s1
    assert {domain_of(snap, n, "spine") for n in result.placement.values()} == {"s1"}
    assert_shortcuts_change_nothing(snap, gang)


@st.composite
def layered_cases(draw: st.DrawFn) -> tuple[ClusterSnapshot, Gang]:
    """Up to 14 racks, one to three per leaf and two leaves per spine, each rack busy to its own
    degree, and one-role gangs: many scopes per tier for the bounds that skip them."""
    trays, per_leaf = draw(st.integers(2, 8)), draw(st.integers(1, 3))
    racks = []
    for r in range(draw(st.integers(2, 14))):
        frees = "".join(str(draw(st.sampled_from([0, 2, 4, 4, 4]))) for _ in range(trays))
        racks.append((f"s{r // (2 * per_leaf)}", f"l{r // per_leaf}", frees))
    pods = draw(st.integers(1, 10))
    if draw(st.booleans()):
        role = Role("w", pods, draw(st.sampled_from([1, 2, 4])))
    else:
        role = Role(
            "w",
            pods,
            draw(st.sampled_from([2, 4])),
            subgroup_size=min(pods, draw(st.sampled_from([1, 2, 3, 4, trays]))),
            subgroup_tier=draw(st.sampled_from(["nvlink", "nvlink", "leaf"])),
            min_subgroups=draw(st.sampled_from([None, None, 1])),
        )
    gang = Gang(
        "g", (role,), tier=draw(st.sampled_from([None, None, "leaf", "spine"])), soft=draw(st.booleans())
    )
    return layered(*racks), gang


@settings(max_examples=300, deadline=None)
@given(layered_cases())
def test_shortcuts_do_not_change_plans_on_many_domains(case: tuple[ClusterSnapshot, Gang]) -> None:
    assert_shortcuts_change_nothing(*case)


def test_degraded_trays_are_ranked_after_clean_trays_of_the_same_domain() -> None:
    base = rack_cluster([0, 0], trays=6)
    # rack 0's first two trays have a degraded fabric; rack 1 has one degraded tray
    bad = {"rack00-tray00", "rack00-tray01", "rack01-tray05"}
    snap = ClusterSnapshot(
        tiers=base.tiers,
        nodes=tuple(dataclasses.replace(n, degraded=n.name in bad) for n in base.nodes),
    )
    result = plan(snap, nvl72_gang(pods=4, size=4))
    assert isinstance(result, Plan)
    # rack 0 (first by name) holds 4 pods on its clean trays: they are filled first, not tray00/01
    assert sorted(result.placement.values()) == [f"rack00-tray0{t}" for t in range(2, 6)]
    assert result.score["degraded_pods"] == 0
    # five pods: only rack 1 has five clean trays; both racks are otherwise alike
    five = plan(snap, nvl72_gang(pods=5, size=5))
    assert isinstance(five, Plan)
    assert sorted(five.placement.values()) == [f"rack01-tray0{t}" for t in range(5)]
    assert five.score["degraded_pods"] == 0
    # six: every tray of a rack; rack 1 has one degraded tray, rack 0 two
    six = plan(snap, nvl72_gang(pods=6, size=6))
    assert isinstance(six, Plan)
    assert {domain_of(snap, n, "nvlink") for n in six.placement.values()} == {"nvl-01"}
    assert six.score["degraded_pods"] == 1


def test_the_plan_format_reads_degraded_and_refuses_a_non_boolean() -> None:
    from scheduler_plugin.formats import FormatError, snapshot_from_data

    data = {
        "tiers": ["nvlink"],
        "nodes": [{"name": "t0", "gpus": 4, "free": 4, "domains": {"nvlink": "r0"}, "degraded": True}],
    }
    (n,) = snapshot_from_data(data).nodes
    assert n.degraded
    data["nodes"][0]["degraded"] = "yes"  # type: ignore[index]
    with pytest.raises(FormatError, match=r"cluster.nodes\[0\].degraded: expected true or false"):
        snapshot_from_data(data)
