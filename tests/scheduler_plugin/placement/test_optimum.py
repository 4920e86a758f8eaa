"""The integer-program optimum agrees with brute force on tiny cases, and its placements are valid."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_plugin.placement import optimum
from scheduler_plugin.placement.policies import POLICIES
from scheduler_plugin.placement.policies.base import gang_gpus, units
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, PodSlot, Role

from .builders import racks


def feasible(snapshot: ClusterSnapshot, gangs: Sequence[Gang]) -> bool:
    """Exhaustive search: every pod of every gang on a node, subgroups and gang tiers respected."""
    nodes = list(snapshot.nodes)
    free = [n.free for n in nodes]
    pods: list[tuple[int, int, int]] = []  # (gang, unit, gpus)
    unit_tier: dict[tuple[int, int], str | None] = {}
    for j, g in enumerate(gangs):
        for k, u in enumerate(units(g)):
            unit_tier[(j, k)] = u.tier
            pods += [(j, k, u.gpus_per_pod)] * u.pods
    unit_dom: dict[tuple[int, int], str] = {}
    gang_dom: dict[int, str] = {}

    def go(i: int) -> bool:
        if i == len(pods):
            return True
        j, k, g = pods[i]
        for n, node in enumerate(nodes):
            if free[n] < g:
                continue
            tier = unit_tier[(j, k)]
            if tier is not None and unit_dom.get((j, k), node.domains[tier]) != node.domains[tier]:
                continue
            gt = gangs[j].tier
            if gt is not None and gang_dom.get(j, node.domains[gt]) != node.domains[gt]:
                continue
            set_u = tier is not None and (j, k) not in unit_dom
            set_g = gt is not None and j not in gang_dom
            if set_u and tier is not None:
                unit_dom[(j, k)] = node.domains[tier]
            if set_g and gt is not None:
                gang_dom[j] = node.domains[gt]
            free[n] -= g
            if go(i + 1):
                return True
            free[n] += g
            if set_u:
                del unit_dom[(j, k)]
            if set_g:
                del gang_dom[j]
        return False

    return go(0)


def brute_force(snapshot: ClusterSnapshot, gangs: Sequence[Gang]) -> int:
    best = 0
    for mask in range(1 << len(gangs)):
        chosen = [g for i, g in enumerate(gangs) if mask >> i & 1]
        total = sum(gang_gpus(g) for g in chosen)
        if total > best and feasible(snapshot, chosen):
            best = total
    return best


@st.composite
def tiny(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[Gang]]:
    frees = [draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)) for _ in range(2)]
    snap = racks(*frees, racks_per_leaf=draw(st.sampled_from([1, 2])))
    gangs = []
    for j in range(draw(st.integers(1, 3))):
        pods = draw(st.integers(1, 3))
        sub = draw(st.one_of(st.none(), st.integers(1, pods)))
        role = Role(
            name="w",
            pods=pods,
            gpus_per_pod=draw(st.sampled_from([1, 2, 4])),
            subgroup_size=sub,
            subgroup_tier="nvlink" if sub else None,
        )
        gangs.append(Gang(name=f"g{j}", roles=(role,), tier=draw(st.sampled_from([None, "leaf"]))))
    return snap, gangs


@settings(max_examples=60)
@given(case=tiny())
def test_optimum_equals_brute_force_on_tiny_cases(case: tuple[ClusterSnapshot, list[Gang]]) -> None:
    snap, gangs = case
    got = optimum.solve(snap, gangs, time_limit_s=30)
    assert got.optimal
    assert got.gpus == brute_force(snap, gangs)
    placed = [g for g in gangs if g.name in got.placed]
    assert feasible(snap, placed)
    # the returned placement itself is valid
    free = {n.name: n.free for n in snap.nodes}
    for g in placed:
        assert len(got.placement[g.name]) == sum(r.pods for r in g.roles)
        for node in got.placement[g.name].values():
            free[node] -= g.roles[0].gpus_per_pod
    assert min(free.values()) >= 0


def test_optimum_chooses_the_subset_a_first_come_policy_misses() -> None:
    # a 4-node gang first would block the two 3-node subgroups; the optimum skips it
    snap = racks([4] * 3, [4] * 3, racks_per_leaf=1)
    gangs = [
        Gang(name="a", roles=(Role(name="w", pods=4, gpus_per_pod=4),)),
        Gang(
            name="b", roles=(Role(name="w", pods=3, gpus_per_pod=4, subgroup_size=3, subgroup_tier="nvlink"),)
        ),
        Gang(
            name="c", roles=(Role(name="w", pods=3, gpus_per_pod=4, subgroup_size=3, subgroup_tier="nvlink"),)
        ),
    ]
    got = optimum.solve(snap, gangs)
    assert got.placed == ("b", "c")
    assert got.gpus == 24


def test_small_instance_is_seeded_and_bounds_every_policy() -> None:
    a, b = optimum.small_instance(7), optimum.small_instance(7)
    assert a == b
    assert optimum.small_instance(8) != a
    best = optimum.solve(a.snapshot, a.gangs)
    for name, make in POLICIES.items():  # kube-default too: gangs outside their tiers count for nothing
        assert optimum.greedy_in_order(make(), a) <= best.bound, name


def test_only_gangs_kept_inside_their_tiers_count() -> None:
    snap = racks([4, 4], [4, 4])
    sub = Gang(
        name="s", roles=(Role(name="w", pods=2, gpus_per_pod=4, subgroup_size=2, subgroup_tier="nvlink"),)
    )
    names = sorted(n.name for n in snap.nodes)
    same_rack = {PodSlot("w", 0): names[0], PodSlot("w", 1): names[1]}
    split = {PodSlot("w", 0): names[0], PodSlot("w", 1): names[2]}
    assert optimum.keeps_constraints(snap, sub, same_rack)
    assert not optimum.keeps_constraints(snap, sub, split)
    assert not optimum.keeps_constraints(snap, sub, {PodSlot("w", 0): names[0]})  # a pod missing
    leaf_gang = Gang(name="l", roles=(Role(name="w", pods=2, gpus_per_pod=4),), tier="nvlink")
    assert not optimum.keeps_constraints(snap, leaf_gang, split)
    assert optimum.keeps_constraints(snap, leaf_gang, same_rack)
