"""The planner is optimal under its documented objective: brute force over every feasible placement.

On small clusters (up to eight nodes, two tiers, three tier-1 domains each under one of two leaves, random
free GPUs, some nodes unschedulable, some with a degraded NVLink fabric) every placement of a one-role
gang is enumerated (as pods per node: the pods are alike), its figures computed with
``objective.evaluate``, and the plan must have the smallest ``Figures.key`` (and be infeasible exactly
when no placement exists); its score must be ``evaluate`` of its own placement. These are the planner's
claim and its conditions (``scheduler_plugin.planner``): the role's blocks are placed by the block
programme (a subgroup tier, or a gang tier), not greedily; and no plan can open two tier-1 domains under
one wholly free leaf without fitting in that leaf (three tier-1 domains, so a better plan there is found
by the leaf scope). The two known gaps outside these conditions are pinned at the end.

For several roles, placed in turn, the weaker property that holds: the first role placed (a role with
a subgroup tier) has the smallest figures through ``leftover``, measured for it alone at its subgroup
tier, among all its placements inside the domain the whole plan occupies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_plugin.planner import plan, role_subgroups
from scheduler_plugin.planner.attempt import role_order
from scheduler_plugin.planner.autosize import ready_view
from scheduler_plugin.planner.objective import Figures, evaluate, measuring_tier
from scheduler_plugin.planner.roles import min_blocks
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, NodeState, Plan, PodSlot, Role

TIERS = ("nvlink", "leaf")


@st.composite
def small_clusters(draw: st.DrawFn, *, max_nodes: int = 8) -> ClusterSnapshot:
    leaf_of = [draw(st.integers(0, 1)) for _ in range(3)]  # three tier-1 domains, nested in leaves
    nodes = []
    for i in range(draw(st.integers(1, max_nodes))):
        gpus = draw(st.sampled_from([0, 2, 4, 4, 8, 8]))
        nv = draw(st.integers(0, 2))
        nodes.append(
            NodeState(
                name=f"n{i}",
                gpus=gpus,
                free=draw(st.one_of(st.just(gpus), st.integers(0, gpus))),  # wholly free half the time
                domains={"nvlink": f"d{nv}", "leaf": f"l{leaf_of[nv]}"},
                schedulable=draw(st.integers(0, 5)) > 0,
                degraded=draw(st.integers(0, 3)) == 0,  # a degraded NVLink fabric, a quarter of the time
            )
        )
    return ClusterSnapshot(tiers=TIERS, nodes=tuple(draw(st.permutations(nodes))))


@st.composite
def one_role_gangs(draw: st.DrawFn) -> Gang:
    """Within the planner's claim: a subgroup tier, or a gang tier, or both; elastic or not."""
    pods = draw(st.integers(1, 6))
    size = draw(st.one_of(st.none(), st.integers(1, pods)))
    sub_tier = draw(st.sampled_from([None, "nvlink", "leaf"]))
    gang_tier = draw(st.sampled_from(["nvlink", "leaf"] if sub_tier is None else [None, "nvlink", "leaf"]))
    blocks = -(-pods // (size or pods))
    role = Role(
        name="w",
        pods=pods,
        # 6 or 8 GPUs: the useful block (the standard 16-GPU segment in pods) is below the subgroup
        gpus_per_pod=draw(st.sampled_from([1, 1, 2, 2, 3, 4, 6, 8])),
        subgroup_size=size,
        subgroup_tier=sub_tier,
        min_subgroups=draw(st.one_of(st.none(), st.integers(0, blocks))) if size else None,
    )
    return Gang(name="g", roles=(role,), tier=gang_tier)


def placements(
    snap: ClusterSnapshot, role: Role, *, gang_tier: str | None = None, within: Sequence[int] | None = None
) -> Iterator[dict[PodSlot, str]]:
    """Every feasible placement of ``role`` alone, up to the order of its (alike) pods: a prefix of
    whole blocks (at least the minimum), each block inside one domain of its subgroup tier, every pod
    inside one domain of ``gang_tier``, no node over its free GPUs, only schedulable nodes (of
    ``within`` when given). Enumerated as pods per node; the blocks are then cut in domain order."""
    size, full, rem = role_subgroups(role)
    nodes = snap.nodes
    g = role.gpus_per_pod
    candidates = [i for i in (within if within is not None else range(len(nodes))) if nodes[i].schedulable]
    room = [max(0, min(nodes[i].free, nodes[i].gpus)) // g if g else role.pods for i in candidates]

    def counts(k: int, left: int) -> Iterator[list[int]]:
        if k == len(candidates):
            if left == 0:
                yield []
            return
        for c in range(min(left, room[k]) + 1):
            for rest in counts(k + 1, left - c):
                yield [c, *rest]

    def domain_of(i: int, tier: str | None) -> str | None:
        return nodes[i].domains.get(tier) if tier is not None else ""

    for count in range(full + (1 if rem else 0), min_blocks(role) - 1, -1):
        short = rem if count > full else 0
        n_pods = min(count * size, role.pods)
        for vector in counts(0, n_pods):
            used = [(i, c) for i, c in zip(candidates, vector, strict=True) if c]
            if gang_tier is not None:
                held = {domain_of(i, gang_tier) for i, _ in used}
                if len(held) != 1 or None in held:
                    continue
            per_domain: dict[str | None, int] = {}
            for i, c in used:
                d = domain_of(i, role.subgroup_tier)
                per_domain[d] = per_domain.get(d, 0) + c
            if role.subgroup_tier is not None and not _blocks_fit(per_domain, size, short):
                continue
            pods = [i for i, c in used for _ in range(c)]
            yield {PodSlot(role.name, k): nodes[i].name for k, i in enumerate(pods)}


def _blocks_fit(per_domain: dict[str | None, int], size: int, short: int) -> bool:
    """Whether pods counted per domain split into whole blocks of ``size`` in every domain, plus the
    short block (``short`` pods, 0 for none) in one of them."""
    if None in per_domain:
        return False
    ns = list(per_domain.values())
    if not short:
        return all(n % size == 0 for n in ns)
    return any(
        n >= short and (n - short) % size == 0 and all(m % size == 0 for k, m in enumerate(ns) if k != j)
        for j, n in enumerate(ns)
    )


def best_key(snap: ClusterSnapshot, role: Role, measure: int | None, **kw: object) -> tuple[int, ...] | None:
    """The smallest ``Figures.key`` over every feasible placement of ``role``, or None when none is."""
    keys = [
        evaluate(snap, placement, [role], main=role, measure=measure).key()
        for placement in placements(snap, role, **kw)  # type: ignore[arg-type]
    ]
    return min(keys, default=None)


def score_figures(result: Plan) -> Figures:
    s = result.score
    return Figures(
        placed=int(s["placed_pods"]),
        opened=int(s["opened_domains"]),
        upper=int(s["opened_upper"]),
        stranded=int(s["stranded_gpus"]),
        lost=int(s["lost_blocks"]),
        leftover=int(s["leftover_gpus"]),
        span=int(s["span_tier"]) - 1,
        degraded=int(s["degraded_pods"]),
    )


def measure_of(snap: ClusterSnapshot, gang: Gang) -> int | None:
    (role,) = gang.roles
    _, full, rem = role_subgroups(role)
    index = {t: i for i, t in enumerate(snap.tiers)}
    return measuring_tier(
        len(snap.tiers),
        [index[role.subgroup_tier] if role.subgroup_tier else None],
        index[gang.tier] if gang.tier else None,
        one_block=full + (1 if rem else 0) == 1,
    )


@settings(max_examples=300, deadline=None)
@given(small_clusters(), one_role_gangs())
def test_a_one_role_plan_has_the_smallest_rank_of_every_placement(snap: ClusterSnapshot, gang: Gang) -> None:
    (role,) = gang.roles
    measure = measure_of(snap, gang)
    best = best_key(snap, role, measure, gang_tier=gang.tier)
    result = plan(snap, gang)
    if best is None:
        assert isinstance(result, Infeasible), result
        return
    assert isinstance(result, Plan), (result.reason, best)
    figures = evaluate(snap, result.placement, gang.roles, main=role, measure=measure)
    assert score_figures(result) == figures  # the score is the objective's measure of the plan
    assert figures.key() == best


@st.composite
def two_role_gangs(draw: st.DrawFn) -> Gang:
    roles = []
    for k, most in enumerate((3, 2)):
        pods = draw(st.integers(1, most))
        roles.append(
            Role(
                name=f"r{k}",
                pods=pods,
                gpus_per_pod=draw(st.integers(0 if k else 1, 2)),
                subgroup_size=draw(st.one_of(st.none(), st.integers(1, pods))),
                subgroup_tier=draw(
                    st.sampled_from(["nvlink", "leaf"] if k == 0 else [None, "nvlink", "leaf"])
                ),
            )
        )
    return Gang(name="g", roles=tuple(roles), tier=draw(st.sampled_from([None, "nvlink", "leaf"])))


@settings(max_examples=100, deadline=None)
@given(small_clusters(max_nodes=6), two_role_gangs())
def test_the_first_role_of_several_is_placed_optimally_for_itself(snap: ClusterSnapshot, gang: Gang) -> None:
    result = plan(snap, gang)
    if isinstance(result, Infeasible):
        return
    index = {t: i for i, t in enumerate(snap.tiers)}
    first = role_order(
        gang, {r.name: index[r.subgroup_tier] if r.subgroup_tier else None for r in gang.roles}
    )[0]
    assert first.subgroup_tier is not None
    # the smallest domain holding the whole plan (the plan came from a scope containing it)
    by_name = {n.name: i for i, n in enumerate(snap.nodes)}
    span = int(result.score["span_tier"]) - 1
    within = list(range(len(snap.nodes)))
    if span < len(snap.tiers):
        tier = snap.tiers[span]
        domain = snap.nodes[by_name[next(iter(result.placement.values()))]].domains[tier]
        within = [i for i, n in enumerate(snap.nodes) if n.domains.get(tier) == domain]
    measure = index[first.subgroup_tier]
    own = {pod: node for pod, node in result.placement.items() if pod.role == first.name}
    got = evaluate(snap, own, [first], main=first, measure=measure).key(through="leftover")
    alone = [
        evaluate(snap, p, [first], main=first, measure=measure).key(through="leftover")
        for p in placements(snap, first, within=within)
    ]
    assert got == min(alone)


# -- subgroup_size: auto ----------------------------------------------------------------------------


@st.composite
def auto_gangs(draw: st.DrawFn) -> Gang:
    pods = draw(st.integers(1, 6))
    role = Role(
        name="w",
        pods=pods,
        gpus_per_pod=draw(st.sampled_from([1, 1, 2, 4])),
        subgroup_tier=draw(st.sampled_from(["nvlink", "nvlink", "leaf"])),
        subgroup_auto_min=draw(st.integers(1, pods)),
    )
    return Gang(name="g", roles=(role,), tier=draw(st.sampled_from([None, None, "leaf"])))


@st.composite
def clusters_with_unready_trays(draw: st.DrawFn) -> ClusterSnapshot:
    snap = draw(small_clusters(max_nodes=7))
    nodes = tuple(dataclasses.replace(n, ready=draw(st.integers(0, 2)) > 0) for n in snap.nodes)
    return ClusterSnapshot(tiers=snap.tiers, nodes=nodes)


@settings(max_examples=200, deadline=None)
@given(clusters_with_unready_trays(), auto_gangs())
def test_auto_takes_the_largest_size_any_placement_on_ready_trays_has_and_its_best_plan(
    snap: ClusterSnapshot, gang: Gang
) -> None:
    """Brute force over every size (divisors of the pods, at least the minimum) and every placement on
    the ready nodes: the planner's size is the largest with a placement, its plan the best there, and it
    is infeasible exactly when no size has one."""
    (role,) = gang.roles
    assert role.subgroup_auto_min is not None
    ready = ready_view(snap)
    sizes = [d for d in range(role.pods, role.subgroup_auto_min - 1, -1) if role.pods % d == 0]
    chosen: tuple[int, Role, tuple[int, ...]] | None = None
    for size in sizes:
        fixed = dataclasses.replace(role, subgroup_size=size, subgroup_auto_min=None)
        sized = dataclasses.replace(gang, roles=(fixed,))
        best = best_key(ready, fixed, measure_of(ready, sized), gang_tier=gang.tier)
        if best is not None:
            chosen = (size, fixed, best)
            break
    result = plan(snap, gang)
    if chosen is None:
        assert isinstance(result, Infeasible), result
        return
    size, fixed, best = chosen
    assert isinstance(result, Plan), (result.reason, size)
    assert result.subgroup_sizes == {"w": size}
    unready = {n.name for n in snap.nodes if not n.ready}
    assert not unready & set(result.placement.values())
    measure = measure_of(ready, dataclasses.replace(gang, roles=(fixed,)))
    assert evaluate(ready, result.placement, (fixed,), main=fixed, measure=measure).key() == best


def test_a_role_without_a_subgroup_tier_fills_the_clean_nodes_of_its_domain_first() -> None:
    # inside the gang's one NVLink domain every figure but ``degraded`` is the same wherever the two
    # pods go: the clean 4-GPU tray takes them, not the degraded 2-GPU one that best fit would pick
    snap = ClusterSnapshot(
        tiers=TIERS,
        nodes=(
            NodeState("n1", 4, 4, {"nvlink": "d1", "leaf": "l0"}),
            NodeState("n3", 2, 2, {"nvlink": "d1", "leaf": "l0"}, degraded=True),
        ),
    )
    gang = Gang("g", (Role("w", 2, 1, subgroup_size=1),), tier="nvlink")
    result = plan(snap, gang)
    assert isinstance(result, Plan)
    assert set(result.placement.values()) == {"n1"}
    assert score_figures(result).key() == best_key(
        snap, gang.roles[0], measure_of(snap, gang), gang_tier="nvlink"
    )


# -- the known gaps, outside the claim -------------------------------------------------------------


def test_a_role_without_subgroup_or_gang_tier_is_placed_greedily_by_node() -> None:
    # best fit by node, not by domain: d1's single free GPU would leave nothing over, but the greedy
    # order takes the first of the equally full nodes, n0 in d0
    nvl = {"n0": "d0", "n1": "d0", "n2": "d1"}
    snap = ClusterSnapshot(
        tiers=TIERS,
        nodes=tuple(NodeState(n, 1, 1, {"nvlink": d, "leaf": "l0"}) for n, d in nvl.items()),
    )
    gang = Gang("g", (Role("w", 1, 1),))
    result = plan(snap, gang)
    assert isinstance(result, Plan)
    assert result.placement == {PodSlot("w", 0): "n0"}
    best = best_key(snap, gang.roles[0], measure_of(snap, gang))
    assert score_figures(result).key() > best  # type: ignore[operator]


def test_two_racks_opened_under_one_free_leaf_are_counted_twice_by_the_block_programme() -> None:
    # three pods, one per rack: d0+d1 (leaf l0) and d2 break two free leaves but strand a GPU in d1;
    # d0, d2, d3 break three leaves and strand nothing. The programme prices ``upper`` per opened
    # rack (3 either way) and takes the second; the figures count l0 once and prefer the first.
    racks = {"n0": ("d0", "l0", 2), "n1": ("d1", "l0", 3), "n2": ("d2", "l1", 2), "n3": ("d3", "l2", 2)}
    snap = ClusterSnapshot(
        tiers=TIERS,
        nodes=tuple(NodeState(n, g, g, {"nvlink": d, "leaf": lf}) for n, (d, lf, g) in racks.items()),
    )
    gang = Gang("g", (Role("w", 3, 2, subgroup_size=1, subgroup_tier="nvlink"),))
    result = plan(snap, gang)
    assert isinstance(result, Plan)
    assert sorted(result.placement.values()) == ["n0", "n2", "n3"]
    assert result.score["opened_upper"] == 3
    best = best_key(snap, gang.roles[0], measure_of(snap, gang))
    assert best is not None
    assert best[:3] == (-3, 3, 2)
