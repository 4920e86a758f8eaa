"""``subgroup_size: auto``: the subgroup size a role gets from the domains' ready nodes. Pure.

A role of ``subgroup_size: auto`` (``Role.subgroup_auto_min`` set) is cut into equal subgroups (data-
parallel replicas must be equal), so its size divides its pods; the planner chooses the largest such
size, at least ``subgroup_auto_min``, for which the whole gang has a plan on the snapshot's **ready**
nodes (``NodeState.ready``: trays whose NVLink fabric and IMEX daemon can carry a multi-node NVLink
subgroup now). The chosen size is the same for every subgroup of the role and is reported in
``Plan.subgroup_sizes``. Without a subgroup tier the role's subgroups go by the first tier.

Sizes are tried from the largest down; a size is skipped without planning when it is more than any
domain's ready nodes hold of the role's pods, or when the domains together hold fewer whole subgroups
of it than the role needs (both necessary for any plan). The first size with a plan wins: the plan is
the planner's own (``search``) for the role at that fixed size, so everything the planner guarantees
for a fixed size holds for the chosen one (``tests/scheduler_plugin/test_planner_optimality.py``
checks the choice and the plan against brute force over every size).

Limits, each an ``Infeasible`` reason naming the role and the field: one ``auto`` role per gang (the
sizes of two would have to be searched jointly); ``auto`` with a fixed ``subgroup_size`` or with
``min_subgroups`` (an elastic role's starting part depends on the size, which is not known before the
plan); a minimum below 1 or above the role's pods. Every role of a gang with an ``auto`` role is placed
on ready nodes only (the gang is one job; its other roles share the fabric it needs).

Where ``topology`` gains a domain readiness of its own (the ``NVLinkDomain`` status: ready trays, the
largest subgroup of whole ready trays), it and :func:`domain_holds` count the same thing from the same
node facts; this module keeps the planner's own count over its own input so the planner stays pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from scheduler_plugin.planner.prepared import PreparedSnapshot, SnapshotCache
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, NodeState, Plan, PlanResult, Role

__all__ = ["auto_role", "candidate_sizes", "domain_holds", "plan_auto", "ready_view"]

Place = Callable[[ClusterSnapshot | PreparedSnapshot, Gang, SnapshotCache | None], PlanResult]


def auto_role(gang: Gang) -> Role | None:
    """The gang's role of ``subgroup_size: auto``, if it has one (the first, when several)."""
    return next((r for r in gang.roles if r.subgroup_auto_min is not None), None)


def ready_view(snapshot: ClusterSnapshot) -> ClusterSnapshot:
    """``snapshot`` with every node that is not ready made unschedulable (the very snapshot when every
    node is ready, so a caller's prepared-snapshot cache finds it; otherwise the ready nodes' states are
    the same objects, so the cache recomputes only the unready ones)."""
    if all(n.ready for n in snapshot.nodes):
        return snapshot
    nodes = tuple(
        n if n.ready or not n.schedulable else dataclasses.replace(n, schedulable=False)
        for n in snapshot.nodes
    )
    return ClusterSnapshot(tiers=snapshot.tiers, nodes=nodes)


def _pods_fit(node: NodeState, role: Role) -> int:
    """How many of the role's pods fit on the node (capped at the role's pods)."""
    if not node.schedulable:
        return 0
    fit = role.pods if role.gpus_per_pod <= 0 else node.free // role.gpus_per_pod
    for res, qty in role.resources_per_pod.items():
        if qty > 0 and res in node.free_resources:
            fit = min(fit, node.free_resources[res] // qty)
    return max(0, min(fit, role.pods))


def domain_holds(snapshot: ClusterSnapshot, role: Role, tier: str) -> dict[str, int]:
    """Per domain of ``tier``: how many of the role's pods its schedulable nodes hold now (apply
    :func:`ready_view` first to count ready nodes only). Nodes outside every domain of the tier hold no
    subgroup."""
    holds: dict[str, int] = {}
    for n in snapshot.nodes:
        d = n.domains.get(tier)
        if d is None:
            continue
        fit = _pods_fit(n, role)
        if fit:
            holds[d] = holds.get(d, 0) + fit
    return holds


def candidate_sizes(pods: int, minimum: int, most: int) -> list[int]:
    """The sizes an ``auto`` role of ``pods`` pods may take, largest first: divisors of ``pods`` from
    ``minimum`` to ``most``."""
    small = [d for d in range(1, int(pods**0.5) + 1) if pods % d == 0]
    divisors = sorted({*small, *(pods // d for d in small)}, reverse=True)
    return [d for d in divisors if minimum <= d <= most]


def _invalid(gang: Gang) -> str | None:
    autos = [r for r in gang.roles if r.subgroup_auto_min is not None]
    if len(autos) > 1:
        return (
            f"gang {gang.name!r}: roles {autos[0].name!r} and {autos[1].name!r} both have "
            "subgroup_size auto; at most one role of a gang may"
        )
    role = autos[0]
    where = f"role {role.name!r}: subgroup_size auto"
    minimum = role.subgroup_auto_min
    assert minimum is not None
    if role.subgroup_size is not None:
        return f"{where} and a fixed subgroup_size {role.subgroup_size} contradict each other"
    if role.min_subgroups is not None:
        return f"{where} cannot be elastic (min_subgroups): the subgroups' size is chosen by the plan"
    if minimum < 1:
        return f"{where}: subgroup_size_min must be at least 1, got {minimum}"
    if minimum > role.pods:
        return f"{where}: subgroup_size_min {minimum} is more than the role's {role.pods} pods"
    return None


def plan_auto(
    snapshot: ClusterSnapshot | PreparedSnapshot, gang: Gang, *, cache: SnapshotCache | None, place: Place
) -> PlanResult:
    """The plan of ``gang`` (with one ``auto`` role) at the largest size that has one, on ready nodes;
    ``place`` plans the gang at a fixed size (the planner's search)."""
    invalid = _invalid(gang)
    if invalid is not None:
        return Infeasible(invalid)
    role = auto_role(gang)
    assert role is not None
    assert role.subgroup_auto_min is not None
    raw = snapshot.snapshot if isinstance(snapshot, PreparedSnapshot) else snapshot
    tier = role.subgroup_tier or (raw.tiers[0] if raw.tiers else None)
    where = f"role {role.name!r}: subgroup_size auto"
    if tier is None:
        return Infeasible(f"{where}: the cluster has no tiers to make subgroups in")
    view = ready_view(raw)
    unready = sum(1 for n in raw.nodes if not n.ready)
    left_out = f"; {unready} node(s) not ready left out" if unready else ""
    holds = domain_holds(view, role, tier)
    most = max(holds.values(), default=0)
    minimum = role.subgroup_auto_min
    if most < minimum:
        return Infeasible(
            f"{where}: no {tier} domain's ready nodes hold {minimum} of its pods (subgroup_size_min) now; "
            f"the most one holds is {most}{left_out}"
        )
    sizes = candidate_sizes(role.pods, minimum, most)
    if not sizes:
        return Infeasible(
            f"{where}: no size from {minimum} (subgroup_size_min) to {most} (the most pods one {tier} "
            f"domain's ready nodes hold now) divides its {role.pods} pods into equal subgroups{left_out}"
        )
    first: str | None = None
    for size in sizes:
        if sum(h // size for h in holds.values()) < role.pods // size:
            first = first or (
                f"the {tier} domains' ready nodes hold fewer than {role.pods // size} subgroups of {size}"
            )
            continue
        sized = dataclasses.replace(role, subgroup_size=size, subgroup_tier=tier, subgroup_auto_min=None)
        fixed = dataclasses.replace(gang, roles=tuple(sized if r is role else r for r in gang.roles))
        result = place(view, fixed, cache)
        if isinstance(result, Plan):
            return dataclasses.replace(result, subgroup_sizes={**result.subgroup_sizes, role.name: size})
        first = first or f"at size {size}: {result.reason}"
    tried = ", ".join(map(str, sizes))
    return Infeasible(
        f"{where}: no plan at any size that divides its {role.pods} pods ({tried}); {first}{left_out}"
    )
