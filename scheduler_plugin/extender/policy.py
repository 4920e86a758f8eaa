"""A gang's readiness and repair policy from its pods' annotations. Pure.

- ``gpuagent.dev/mnnvl: required|preferred|off`` (``snapshot.MNNVL_MODES``): whether the gang is placed
  only on ready trays, on ready trays first, or without reading readiness. Without the annotation the
  gang is ``required`` when it needs multi-node NVLink: a role has a subgroup tier ``nvlink`` (or a
  ``subgroup_size: auto`` role with no tier, whose subgroups go by the first tier, when that tier is
  ``nvlink``) and some node its pods may use is fabric-attached (``cluster.fabric_attached``: it carries
  ``gpuagent.dev/fabric-health``); otherwise ``off``. ``required`` and ``preferred`` gangs also wait at
  the bind barrier for every chosen tray's IMEX (``cluster.imex_ready``).
- ``gpuagent.dev/repair: same-domain|any`` (default ``same-domain``): where a running gang's replacement
  pod may go once it has waited the extender's repair wait for a ready tray in the domain the rest of
  its subgroup runs in: ``same-domain`` keeps waiting; ``any`` lets it go to another domain.

Every pod of the gang that sets one must agree; a value that is not one of the modes, or pods that
disagree, is a ``GangError`` naming the annotation, the pod and the valid values (the extender refuses
the gang with an ``InvalidGang`` Event and plans nothing for it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler_plugin.cluster import pod_key
from scheduler_plugin.gangs import GangError
from scheduler_plugin.snapshot import MNNVL_MODES, Gang

ANN_MNNVL = "gpuagent.dev/mnnvl"
ANN_REPAIR = "gpuagent.dev/repair"
REPAIR_MODES = ("same-domain", "any")
NVLINK_TIER = "nvlink"
_SHOWN = 64  # characters of a bad value a message repeats (a tenant writes it)

__all__ = ["ANN_MNNVL", "ANN_REPAIR", "REPAIR_MODES", "GangPolicy", "gang_policy", "resolve_mnnvl"]


@dataclass(frozen=True, slots=True)
class GangPolicy:
    mnnvl: str | None = None  # the annotation's mode; None: the default (``resolve_mnnvl``)
    repair: str = "same-domain"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _one(gang: str, pods: Sequence[Mapping[str, Any]], annotation: str, modes: Sequence[str]) -> str | None:
    found: tuple[str, str] | None = None  # (pod, value)
    for pod in pods:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if not isinstance(annotations, Mapping) or annotation not in annotations:
            continue
        value = annotations[annotation]
        if not isinstance(value, str) or value not in modes:
            raise GangError(
                f"gang {gang}: pod {pod_key(pod)} annotation {annotation}={_shown(value)} is not one of "
                f"{', '.join(modes)}"
            )
        if found is not None and found[1] != value:
            raise GangError(
                f"gang {gang}: pods {found[0]} and {pod_key(pod)} disagree on annotation {annotation} "
                f"({found[1]!r}, {value!r})"
            )
        found = (pod_key(pod), value)
    return found[1] if found is not None else None


def gang_policy(gang: str, pods: Sequence[Mapping[str, Any]]) -> GangPolicy:
    """The policy the gang's pods declare; ``GangError`` for a bad value or pods that disagree."""
    mnnvl = _one(gang, pods, ANN_MNNVL, MNNVL_MODES)
    repair = _one(gang, pods, ANN_REPAIR, REPAIR_MODES)
    return GangPolicy(mnnvl=mnnvl, repair=repair or REPAIR_MODES[0])


def needs_mnnvl(gang: Gang, tiers: Sequence[str]) -> bool:
    """Whether some role of ``gang`` keeps its subgroups inside NVLink domains."""
    first = tiers[0] if tiers else None
    return any(
        r.subgroup_tier == NVLINK_TIER
        or (r.subgroup_tier is None and r.subgroup_auto_min is not None and first == NVLINK_TIER)
        for r in gang.roles
    )


def resolve_mnnvl(
    policy: GangPolicy, gang: Gang, tiers: Sequence[str], *, fabric_attached: Callable[[], bool]
) -> str:
    """The gang's mode: the annotation's, else ``required`` for a gang that needs multi-node NVLink on
    fabric-attached nodes (``fabric_attached()``: some node its pods may use carries the fabric label;
    asked only for a gang that needs multi-node NVLink), else ``off``."""
    if policy.mnnvl is not None:
        return policy.mnnvl
    return "required" if needs_mnnvl(gang, tiers) and fabric_attached() else "off"
