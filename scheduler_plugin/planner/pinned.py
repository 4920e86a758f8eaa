"""Roles pinned to one domain (``Role.domain``): a repair's replacement pods. Pure.

A running gang that lost pods (their tray failed) is planned again for the lost pods only; the pods
of a subgroup whose other pods still run must go inside the domain those run in (``Role.domain`` of
the subgroup tier). Each pinned role is planned alone on the nodes of its domain, in the gang's role
order, each taking what the ones before it took; the roles without a pin are then planned together
(as the planner plans any gang) on what is left. All or nothing: the first role with no room makes
the whole plan infeasible, naming the role and the domain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from scheduler_plugin.planner.prepared import PreparedSnapshot, SnapshotCache
from scheduler_plugin.snapshot import (
    ClusterSnapshot,
    Gang,
    Infeasible,
    NodeState,
    Plan,
    PlanResult,
    PodSlot,
    Role,
    SubgroupPlacement,
)

__all__ = ["plan_pinned"]

Place = Callable[[ClusterSnapshot | PreparedSnapshot, Gang, SnapshotCache | None], PlanResult]


def _inside(snapshot: ClusterSnapshot, tier: str, domain: str) -> ClusterSnapshot:
    """``snapshot`` with every node outside ``domain`` of ``tier`` unschedulable."""
    nodes = tuple(
        n if n.domains.get(tier) == domain or not n.schedulable else dataclasses.replace(n, schedulable=False)
        for n in snapshot.nodes
    )
    return ClusterSnapshot(tiers=snapshot.tiers, nodes=nodes)


def _taken(snapshot: ClusterSnapshot, role: Role, placement: Mapping[PodSlot, str]) -> ClusterSnapshot:
    """``snapshot`` less what ``placement`` (of ``role``'s pods) takes."""
    pods: dict[str, int] = {}
    for node in placement.values():
        pods[node] = pods.get(node, 0) + 1
    nodes: list[NodeState] = []
    for n in snapshot.nodes:
        k = pods.get(n.name, 0)
        if not k:
            nodes.append(n)
            continue
        left = {r: max(0, v - k * role.resources_per_pod.get(r, 0)) for r, v in n.free_resources.items()}
        nodes.append(dataclasses.replace(n, free=max(0, n.free - k * role.gpus_per_pod), free_resources=left))
    return ClusterSnapshot(tiers=snapshot.tiers, nodes=tuple(nodes))


def plan_pinned(
    snapshot: ClusterSnapshot | PreparedSnapshot, gang: Gang, *, cache: SnapshotCache | None, place: Place
) -> PlanResult:
    """The plan of ``gang`` whose roles may carry ``domain``; ``place`` plans a gang without pins."""
    raw = snapshot.snapshot if isinstance(snapshot, PreparedSnapshot) else snapshot
    left = raw
    placement: dict[PodSlot, str] = {}
    subgroups: list[SubgroupPlacement] = []
    score: dict[str, float] = {}
    for role in gang.roles:
        if role.domain is None:
            continue
        tier = role.subgroup_tier or (raw.tiers[0] if raw.tiers else None)
        if tier is None:
            return Infeasible(
                f"role {role.name!r}: pinned to domain {role.domain} but the cluster has no tiers"
            )
        alone = dataclasses.replace(
            role,
            domain=None,
            subgroup_size=None,
            subgroup_tier=None,
            min_subgroups=None,
            subgroup_auto_min=None,
        )
        one = dataclasses.replace(gang, roles=(alone,), tier=None, soft=False)
        result = place(_inside(left, tier, role.domain), one, None)
        if isinstance(result, Infeasible):
            return Infeasible(
                f"role {role.name!r}: its {role.pods} pod(s) must go inside {tier} domain {role.domain} "
                f"(where the rest of their subgroup runs): {result.reason}"
            )
        placement.update(result.placement)
        subgroups.append(SubgroupPlacement(role.name, 0, role.domain))
        for k, v in result.score.items():
            score[k] = score.get(k, 0) + v
        left = _taken(left, alone, result.placement)
    rest = tuple(r for r in gang.roles if r.domain is None)
    if rest:
        result = place(left, dataclasses.replace(gang, roles=rest), cache if left is raw else None)
        if isinstance(result, Infeasible):
            return result
        placement.update(result.placement)
        subgroups.extend(result.subgroups)
        for k, v in result.score.items():
            score[k] = score.get(k, 0) + v
        sizes = dict(result.subgroup_sizes)
    else:
        sizes = {}
    return Plan(
        placement=dict(sorted(placement.items())),
        subgroups=tuple(subgroups),
        score=score,
        subgroup_sizes=sizes,
    )
