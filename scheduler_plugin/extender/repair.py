"""Repair inside the domain: the part of a running gang left to place, with each replacement pinned to
the domain the rest of its subgroup runs in. Pure.

A gang some of whose pods are bound and some not (its controller made again a pod whose tray failed,
or a restart of the extender mid-gang) is planned for its unbound pods only; no bound pod moves. A
role with a subgroup tier is cut into subgroups as the plan cut it (``subgroup_size``; for
``subgroup_size: auto`` the size its bound pods carry in ``gpuagent.dev/subgroup-size-chosen``; no
size: the whole role is one subgroup). The unbound pods of a subgroup some of whose pods still run
become a role of their own, ``<role>#<subgroup>``, pinned (``Role.domain``) to the domain of the
subgroup tier where most of those pods run (ties by name): the planner puts them on free nodes of that
domain only (``planner.pinned``), ready ones where the gang's mode asks for readiness. The unbound
pods of subgroups none of whose pods run, and of roles without a subgroup tier, are planned as before:
one gang of the roles' remaining pods (renumbered in rank order) with the same tiers.

``unpin`` (the repair wait is over and the gang's ``gpuagent.dev/repair`` is ``any``) drops the pins:
the replacements may then go to any domain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler_plugin.gangs import GangSpec
from scheduler_plugin.snapshot import Gang, PodSlot, Role

__all__ = ["SUBGROUP_SIZE_CHOSEN", "Unbound", "unbound_part"]

# on each pod of a role of subgroup-size auto, written with its binding (``state``'s constant, the same key)
SUBGROUP_SIZE_CHOSEN = "gpuagent.dev/subgroup-size-chosen"


@dataclass(frozen=True)
class Unbound:
    """The gang to plan (None: every pod is bound), its pods' places in it, and each pinned role's
    domain with the role it repairs (pinned role name -> (role, subgroup index, domain))."""

    gang: Gang | None
    members: dict[str, PodSlot]
    pinned: Mapping[str, tuple[str, int, str]] = field(default_factory=dict)
    # the subgroup size a ``subgroup_size: auto`` role's unbound pods keep (the one its bound pods
    # carry), per role of ``gang`` they are planned in: written on their Bindings as on the first ones
    sizes: Mapping[str, int] = field(default_factory=dict)


def _size(role: Role, bound: list[Mapping[str, Any]]) -> int | None:
    if role.subgroup_size:
        return role.subgroup_size
    if role.subgroup_auto_min is not None:
        for pod in bound:
            value = ((pod.get("metadata") or {}).get("annotations") or {}).get(SUBGROUP_SIZE_CHOSEN)
            if isinstance(value, str) and value.isdigit() and 0 < int(value) <= role.pods:
                return int(value)
        return None
    return role.pods


def unbound_part(
    spec: GangSpec,
    pods: Mapping[str, Mapping[str, Any]],
    node_domains: Mapping[str, Mapping[str, str]],
    tiers: tuple[str, ...],
    *,
    unpin: bool = False,
) -> Unbound:
    """The part of ``spec`` left to place (module docstring); ``node_domains``: each node's domain per
    tier."""
    bound = {
        k: str((pods[k].get("spec") or {}).get("nodeName"))
        for k in spec.members
        if k in pods and (pods[k].get("spec") or {}).get("nodeName")
    }
    if not bound:
        return Unbound(spec.gang, dict(spec.members))
    roles: list[Role] = []
    members: dict[str, PodSlot] = {}
    pinned: dict[str, tuple[str, int, str]] = {}
    sizes: dict[str, int] = {}
    names = {r.name for r in spec.gang.roles}
    by_slot = {slot: k for k, slot in spec.members.items()}
    for role in spec.gang.roles:
        taken = {spec.members[k].index: k for k in bound if spec.members[k].role == role.name}
        left = [i for i in range(role.pods) if i not in taken]
        if not left:
            continue
        tier = role.subgroup_tier or (tiers[0] if role.subgroup_auto_min is not None and tiers else None)
        size = _size(role, [pods[k] for k in taken.values()]) if tier is not None else None
        rest = left
        if tier is not None and size is not None and not unpin:
            rest = []
            lost: dict[int, list[int]] = {}
            for i in left:
                lost.setdefault(i // size, []).append(i)
            for block, indexes in sorted(lost.items()):
                where: dict[str, int] = {}
                for i, k in taken.items():
                    d = node_domains.get(bound[k], {}).get(tier)
                    if i // size == block and d is not None:
                        where[d] = where.get(d, 0) + 1
                if not where:
                    rest.extend(indexes)
                    continue
                domain = min(where, key=lambda d: (-where[d], d))
                name = f"{role.name}#{block}"
                while name in names:
                    name += "#"
                names.add(name)
                pinned[name] = (role.name, block, domain)
                if role.subgroup_auto_min is not None:
                    sizes[name] = size
                for new, old in enumerate(indexes):
                    key = by_slot.get(PodSlot(role.name, old))
                    if key is not None:
                        members[key] = PodSlot(name, new)
                roles.append(
                    Role(
                        name=name,
                        pods=len(indexes),
                        gpus_per_pod=role.gpus_per_pod,
                        subgroup_tier=tier,
                        resources_per_pod=role.resources_per_pod,
                        domain=domain,
                    )
                )
        if not rest:
            continue
        if role.subgroup_auto_min is not None and size is not None:
            sizes[role.name] = size
        for new, old in enumerate(rest):
            key = by_slot.get(PodSlot(role.name, old))
            if key is not None:
                members[key] = PodSlot(role.name, new)
        roles.append(
            Role(
                name=role.name,
                pods=len(rest),
                gpus_per_pod=role.gpus_per_pod,
                subgroup_size=min(role.subgroup_size, len(rest)) if role.subgroup_size else None,
                subgroup_tier=role.subgroup_tier,
                resources_per_pod=role.resources_per_pod,
            )
        )
    if not roles:
        return Unbound(None, {})
    gang = Gang(
        name=spec.gang.name,
        roles=tuple(roles),
        tier=spec.gang.tier,
        soft=spec.gang.soft,
        mnnvl=spec.gang.mnnvl,
    )
    return Unbound(gang, members, pinned, sizes)
