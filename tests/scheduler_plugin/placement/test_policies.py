"""Each re-implemented anchor reproduces a decision its source documents; every policy keeps the rules."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_plugin.placement.policies import POLICIES
from scheduler_plugin.placement.policies.base import TierBlind
from scheduler_plugin.placement.policies.kai import Kai
from scheduler_plugin.placement.policies.kube_default import KubeDefault
from scheduler_plugin.placement.policies.kueue import Kueue
from scheduler_plugin.placement.policies.slurm import Slurm
from scheduler_plugin.placement.policies.volcano import Volcano
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, NodeState, Plan, PodSlot, Role

from .builders import TIERS, domains_of, gang, racks

FULL = [4] * 18


def plan_of(result: object) -> Plan:
    assert isinstance(result, Plan), result
    return result


def per_domain(snapshot: ClusterSnapshot, plan: Plan, tier: str = "nvlink") -> Counter[str]:
    return Counter(domains_of(snapshot, dict(plan.placement), tier))


# --- Volcano (allocate.go allocateForSubJob + network_topology_aware.go bin-pack HyperNode score) ---


def test_volcano_picks_the_hypernode_with_the_highest_binpack_score() -> None:
    snap = racks(FULL, [0] * 8 + [4] * 10)
    got = plan_of(Volcano().place(snap, gang(8, subgroup=8)))
    # (used + request) / allocatable: rack 1 scores 64/72, rack 0 only 32/72
    assert per_domain(snap, got) == {"nvl-1": 8}
    assert [s.domain for s in got.subgroups] == ["nvl-1"]


def test_volcano_aggregate_prefilter_passes_a_fragmented_hypernode_that_the_dry_run_rejects() -> None:
    # rack 1 has 36 idle GPUs (enough in aggregate, best score) but no node with 4 free
    snap = racks(FULL, [2] * 18)
    got = plan_of(Volcano().place(snap, gang(4, subgroup=4)))
    assert per_domain(snap, got) == {"nvl-0": 4}


# --- Kueue TAS BestFit (tas_flavor_snapshot.go findTopologyAssignment; KEP 2724 example) ---


def test_kueue_bestfit_reproduces_the_kep_example_6_4_2() -> None:
    # KEP 2724: per-node capacities 6/5/4/3/2, slice size 2, 12 pods -> BestFit takes 6/./4/./2
    nodes = tuple(
        NodeState(
            name=f"n{i}", gpus=8, free=f, domains={"nvlink": f"nv-n{i}", "leaf": "leaf-0", "spine": "s0"}
        )
        for i, f in enumerate([6, 5, 4, 3, 2])
    )
    snap = ClusterSnapshot(tiers=TIERS, nodes=nodes)
    got = plan_of(Kueue().place(snap, gang(12, gpus_per_pod=1, subgroup=2, tier="leaf")))
    assert Counter(got.placement.values()) == {"n0": 6, "n2": 4, "n4": 2}


def test_kueue_bestfit_takes_the_tightest_domain_that_holds_the_slices() -> None:
    snap = racks(FULL, [0] * 8 + [4] * 10, [0] * 12 + [4] * 6)
    got = plan_of(Kueue().place(snap, gang(8, subgroup=8)))
    assert per_domain(snap, got) == {"nvl-1": 8}


def test_kueue_required_level_without_a_fitting_domain_is_infeasible() -> None:
    snap = racks([4] * 3, [4] * 3, racks_per_leaf=1)
    assert isinstance(Kueue().place(snap, gang(4, tier="leaf")), Infeasible)


# --- KAI (job_filtering.go subSetNodesFn most-packed order; allocate.go first fit with rollback) ---


def test_kai_takes_the_most_packed_domain_first() -> None:
    snap = racks(FULL, [0] * 8 + [4] * 10)
    got = plan_of(Kai().place(snap, gang(8, subgroup=8)))
    assert per_domain(snap, got) == {"nvl-1": 8}


def test_kai_rolls_back_a_node_set_whose_subgroups_do_not_fit_and_tries_the_next() -> None:
    # leaf-0 is the most packed and holds 6 pods in aggregate, but no rack of it holds a 4-node subgroup
    snap = racks([0] * 15 + [4] * 3, [0] * 15 + [4] * 3, FULL, FULL)
    got = plan_of(Kai().place(snap, gang(4, subgroup=4, tier="leaf")))
    assert per_domain(snap, got) == {"nvl-2": 4}


# --- Slurm topology/block (eval_nodes_block.c) ---


def test_slurm_takes_the_smallest_block_level_then_the_best_fit_block_then_fewest_base_blocks() -> None:
    snap = racks([0] * 8 + [4] * 10, [0] * 6 + [4] * 12, FULL, FULL)
    got = plan_of(Slurm().place(snap, gang(20)))
    # level 0 holds no 20 nodes; at level 1 blocks [0,1] (22 free) and [2,3] (36): best fit [0,1];
    # inside it the roomiest base block first (12), then the best fit for the remaining 8
    assert per_domain(snap, got) == {"nvl-1": 12, "nvl-0": 8}


def test_slurm_best_fit_base_block_for_a_job_that_fits_one() -> None:
    snap = racks([0] * 8 + [4] * 10, [0] * 6 + [4] * 12, FULL)
    got = plan_of(Slurm().place(snap, gang(8, subgroup=4)))
    assert per_domain(snap, got) == {"nvl-0": 8}


# --- kube default (noderesources LeastAllocated, no gang) ---


def test_kube_default_spreads_pods_to_the_least_allocated_node() -> None:
    snap = racks([4, 4])
    got = plan_of(KubeDefault().place(snap, gang(2, gpus_per_pod=1)))
    assert sorted(got.placement.values()) == ["r0-n00", "r0-n01"]


def test_kube_default_places_part_of_a_gang_that_does_not_fit() -> None:
    snap = racks([4, 4])
    got = plan_of(KubeDefault().place(snap, gang(3, subgroup=3)))
    assert len(got.placement) == 2
    assert got.subgroups[0].domain is None


# --- properties of every gang policy (ours included) ---

GANG_POLICIES = [name for name, make in POLICIES.items() if make().gang]


@st.composite
def cases(draw: st.DrawFn) -> tuple[ClusterSnapshot, Gang]:
    n_racks = draw(st.integers(1, 4))
    frees = [draw(st.lists(st.integers(0, 4), min_size=1, max_size=6)) for _ in range(n_racks)]
    snap = racks(*frees, racks_per_leaf=2)
    pods = draw(st.integers(1, 8))
    g = draw(st.sampled_from([1, 2, 4]))
    sub = draw(st.one_of(st.none(), st.integers(1, pods)))
    tier = draw(st.sampled_from([None, "leaf"]))
    role = Role(
        name="w", pods=pods, gpus_per_pod=g, subgroup_size=sub, subgroup_tier="nvlink" if sub else None
    )
    return snap, Gang(name="g", roles=(role,), tier=tier)


@pytest.mark.parametrize("name", GANG_POLICIES)
@given(case=cases())
def test_gang_policies_respect_capacity_all_or_nothing_and_domains(
    name: str, case: tuple[ClusterSnapshot, Gang]
) -> None:
    snap, g = case
    policy = POLICIES[name]()
    result = policy.place(snap, g)
    again = policy.place(snap, g)
    assert result == again  # deterministic
    if isinstance(result, Infeasible):
        return
    role = g.roles[0]
    assert sorted(result.placement) == sorted(PodSlot("w", i) for i in range(role.pods))
    free = {n.name: n.free for n in snap.nodes}
    for node in result.placement.values():
        free[node] -= role.gpus_per_pod
    assert min(free.values()) >= 0
    if g.tier:
        assert len(set(domains_of(snap, dict(result.placement), g.tier))) == 1
    if role.subgroup_size:
        doms = domains_of(snap, dict(result.placement), "nvlink")
        for first in range(0, role.pods, role.subgroup_size):
            assert len(set(doms[first : first + role.subgroup_size])) == 1


def test_index_of_a_changed_snapshot_reuses_the_topology_and_reads_free_again() -> None:
    from scheduler_plugin.placement.policies.base import Index, IndexCache
    from scheduler_plugin.placement.shapes import nvl72
    from scheduler_plugin.snapshot import ClusterSnapshot, NodeState

    index_for = IndexCache().index_for
    cluster = nvl72(2, racks_per_leaf=1, leaves_per_spine=2)
    first = cluster.snapshot()
    before = index_for(first)
    nodes = list(first.nodes)
    nodes[5] = NodeState(nodes[5].name, 4, 1, nodes[5].domains)
    nodes[30] = NodeState(nodes[30].name, 4, 0, nodes[30].domains, schedulable=False)
    second = ClusterSnapshot(tiers=first.tiers, nodes=tuple(nodes))
    after = index_for(second)
    fresh = Index(second)
    assert after.domains is before.domains  # topology shared
    assert after.free == fresh.free
    assert after.names == fresh.names
    assert after.domains == fresh.domains
    assert before.free == [4] * len(nodes)  # the earlier index is untouched
    moved = ClusterSnapshot(
        tiers=first.tiers,
        nodes=(NodeState(nodes[0].name, 4, 4, {**nodes[0].domains, "nvlink": "elsewhere"}), *nodes[1:]),
    )
    rebuilt = index_for(moved)
    assert "elsewhere" in rebuilt.domains["nvlink"]
    assert rebuilt.domains == Index(moved).domains


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_tier_blind_policy_places_a_subgroup_across_domains(name: str) -> None:
    # two racks with two free nodes each: a subgroup of four cannot sit in one NVLink domain, and a
    # gang tier of one rack cannot hold it either; dropping the tiers places it across both
    snap = racks([4, 4, 0, 0], [4, 4, 0, 0])
    constrained = gang(4, subgroup=4, tier="nvlink")
    blind = TierBlind(POLICIES[name]())
    assert (blind.name, blind.gang) == (POLICIES[name]().name, POLICIES[name]().gang)
    if POLICIES[name]().gang:
        assert isinstance(POLICIES[name]().place(snap, constrained), Infeasible)
    result = blind.place(snap, constrained)
    assert isinstance(result, Plan)
    assert len(result.placement) == 4
    assert sorted(set(domains_of(snap, dict(result.placement), "nvlink"))) == ["nvl-0", "nvl-1"]
