"""One multi-node NVLink domain (an NVL72 clique) as a whole: which trays are ready, why the others are not,
the IMEX quorum, and the largest subgroup of whole trays it can take now. Pure.

A *tray* is one node of the clique. It is **ready** when

- its fabric is ``COMPLETED`` with status ``SUCCESS`` on every GPU, the GPUs agree on the clique, and no
  GPU is unhealthy under the fabric policy of the node's own agent (``GPUNode`` ``status.fabric``; the
  default policy for objects of older agents that do not publish it) — route-unhealthy is unhealthy by
  default;
- its IMEX daemon is ``READY`` where the agent manages it (``status.imex.managed``);
- its Node is not ``NotReady``.

A ready tray can still be **degraded** (fabric degraded: reduced bandwidth, route recovery; an unhealthy
GPU; an unmanaged IMEX daemon that is not ready); every tray that is not ready, or degraded, is listed
with the reason. ``largest_subgroup`` counts the ready trays whose GPUs are all healthy and free: the
most trays a subgroup of whole-tray pods can get in this domain now (the planner's
``subgroup_size: auto`` reads it). ``stranded`` GPUs are free GPUs on trays that are not ready;
``fragmentation`` is the share of free GPUs on ready trays that do not lie on a wholly free tray.

:func:`tray_from_gpunode` reads a tray from its ``GPUNode``, its Node and the GPUs its pods hold;
:func:`domain_statuses` groups trays into domains; :func:`nvlinkdomain_object` is the ``NVLinkDomain``
object (cluster-scoped, named like the domain's tier-1 ``HyperNode``) and :func:`nvlinkdomain_crd` its
CustomResourceDefinition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topology.fabrichealth import FabricLevel, GpuFabricVerdict, fabric_verdicts
from topology.gpunode import API_VERSION as GROUP_VERSION
from topology.gpunode import GROUP, VERSION, printer_column
from topology.model import Health, NodeInventory
from topology.names import clique_domain_name
from topology.nvlink import CliqueKey, FabricStatus, member_clique, nvlink_facts

KIND = "NVLinkDomain"
PLURAL = "nvlinkdomains"
SINGULAR = "nvlinkdomain"
API_VERSION = GROUP_VERSION
MAX_REASON = 200
NVLINKDOMAINS = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
DOMAIN_LABEL = "gpuagent.dev/nvlink-domain"


@dataclass(frozen=True, slots=True)
class TrayState:
    """What the domain needs to know about one tray."""

    name: str
    clique: CliqueKey
    gpus: int
    healthy_gpus: int
    used_gpus: int = 0  # GPUs held by pods bound to the node
    fabric: FabricStatus = FabricStatus.OK
    fabric_reason: str | None = None
    fabric_level: FabricLevel | None = FabricLevel.HEALTHY  # worst GPU's level under the agent's policy
    fabric_conditions: tuple[str, ...] = ()  # the degraded conditions seen
    imex: str = "absent"  # ready | not-ready | absent
    imex_status: str = "NOT_INSTALLED"
    imex_managed: bool = False
    node_ready: bool = True

    @property
    def free_gpus(self) -> int:
        return max(0, self.healthy_gpus - self.used_gpus)

    @property
    def whole_free(self) -> bool:
        """Every GPU healthy and free: a whole-tray pod fits."""
        return self.gpus > 0 and self.healthy_gpus == self.gpus and self.used_gpus == 0

    def not_ready_reason(self) -> str | None:
        """Why the tray cannot take multi-node NVLink work now, or ``None`` when it is ready."""
        reasons: list[str] = []
        if not self.node_ready:
            reasons.append("Node NotReady")
        if self.fabric is not FabricStatus.OK:
            reasons.append(self.fabric_reason or f"fabric {self.fabric.value}")
        if self.imex_managed and self.imex != "ready":
            reasons.append(f"IMEX {self.imex_status}")
        return "; ".join(reasons)[:MAX_REASON] if reasons else None

    def degraded_reason(self) -> str | None:
        """Why a ready tray is still not clean (degraded fabric, unhealthy GPUs, an unmanaged IMEX daemon
        that is not ready), or ``None``."""
        reasons: list[str] = []
        if self.fabric_level is FabricLevel.DEGRADED:
            said = ", ".join(self.fabric_conditions)
            reasons.append(f"fabric degraded: {said}" if said else "fabric degraded")
        if self.healthy_gpus < self.gpus:
            reasons.append(f"{self.gpus - self.healthy_gpus} of {self.gpus} GPUs unhealthy")
        if not self.imex_managed and self.imex == "not-ready":
            reasons.append(f"IMEX {self.imex_status} (not managed by the agent)")
        return "; ".join(reasons)[:MAX_REASON] if reasons else None


@dataclass(frozen=True, slots=True)
class DegradedTray:
    name: str
    ready: bool
    reason: str


@dataclass(frozen=True, slots=True)
class DomainStatus:
    """One NVLink domain now."""

    name: str  # the tier-1 HyperNode's name (``nvl-<clusterUuid>-<cliqueId>``)
    clique: CliqueKey
    members: tuple[str, ...]  # sorted
    gpus: int
    healthy_gpus: int
    free_gpus: int
    ready: tuple[str, ...]  # ready trays, sorted
    degraded: tuple[DegradedTray, ...]  # trays not ready or not clean, sorted by name
    imex_ready: int  # members whose IMEX daemon is READY
    largest_subgroup: int  # ready trays whose GPUs are all healthy and free
    gpus_per_tray: int  # the most GPUs one member has (4 on GB200)
    stranded_gpus: int  # free GPUs on trays that are not ready
    free_ready_gpus: int  # free GPUs on ready trays

    @property
    def quorum(self) -> str:
        """``ready/members`` of the IMEX daemons, e.g. ``18/18``."""
        return f"{self.imex_ready}/{len(self.members)}"

    @property
    def all_ready(self) -> bool:
        return len(self.ready) == len(self.members)

    @property
    def fragmentation(self) -> float:
        """Share of free GPUs on ready trays that are not on a wholly free tray (0 when none is free)."""
        if self.free_ready_gpus == 0:
            return 0.0
        whole = self.largest_subgroup * self.gpus_per_tray
        return max(0.0, 1.0 - min(whole, self.free_ready_gpus) / self.free_ready_gpus)


def largest_subgroup(trays: Iterable[TrayState]) -> int:
    """The most whole trays a subgroup can get in one domain now: ready trays with every GPU healthy
    and free."""
    return sum(1 for t in trays if t.not_ready_reason() is None and t.whole_free)


def domain_status(clique: CliqueKey, trays: Sequence[TrayState]) -> DomainStatus:
    """The status of one domain from its trays (all of ``clique``)."""
    ordered = sorted(trays, key=lambda t: t.name)
    ready: list[str] = []
    degraded: list[DegradedTray] = []
    stranded = 0
    free_ready = 0
    for t in ordered:
        why_not = t.not_ready_reason()
        if why_not is None:
            ready.append(t.name)
            free_ready += t.free_gpus
            rough = t.degraded_reason()
            if rough is not None:
                degraded.append(DegradedTray(t.name, True, rough))
        else:
            stranded += t.free_gpus
            degraded.append(DegradedTray(t.name, False, why_not))
    return DomainStatus(
        name=clique_domain_name(clique),
        clique=clique,
        members=tuple(t.name for t in ordered),
        gpus=sum(t.gpus for t in ordered),
        healthy_gpus=sum(t.healthy_gpus for t in ordered),
        free_gpus=sum(t.free_gpus for t in ordered),
        ready=tuple(ready),
        degraded=tuple(degraded),
        imex_ready=sum(1 for t in ordered if t.imex == "ready"),
        largest_subgroup=largest_subgroup(ordered),
        gpus_per_tray=max((t.gpus for t in ordered), default=0),
        stranded_gpus=stranded,
        free_ready_gpus=free_ready,
    )


def domain_statuses(trays: Iterable[TrayState]) -> dict[str, DomainStatus]:
    """Every domain of ``trays``, by name."""
    by_clique: dict[CliqueKey, list[TrayState]] = {}
    for t in trays:
        by_clique.setdefault(t.clique, []).append(t)
    out = (domain_status(k, v) for k, v in sorted(by_clique.items()))
    return {s.name: s for s in out}


# --------------------------------------------------------------------------- from the cluster's objects


def node_is_ready(node: Mapping[str, Any] | None) -> bool:
    """``False`` only for a Node whose ``Ready`` condition is ``False`` or ``Unknown``; a Node not (yet)
    seen counts as ready (the GPUNode says the agent runs)."""
    if node is None:
        return True
    conditions = (node.get("status") or {}).get("conditions") or []
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return True


def tray_from_gpunode(
    name: str,
    inventory: NodeInventory,
    *,
    verdicts: Sequence[GpuFabricVerdict] | None,
    health: Mapping[str, Health] | None,
    imex: Mapping[str, Any] | None,
    node: Mapping[str, Any] | None = None,
    used_gpus: int = 0,
) -> TrayState | None:
    """The tray a ``GPUNode`` describes (``None`` for a node without a multi-node fabric). ``verdicts``
    are the levels the node's agent published (``None``: the default policy judges); ``imex`` the
    object's ``status.imex``."""
    clique = member_clique(inventory)
    if clique is None:
        return None
    facts = nvlink_facts(inventory, verdicts=verdicts)
    judged = verdicts if verdicts is not None else fabric_verdicts(inventory)
    levels = [v.level for v in judged]
    conditions: list[str] = []
    for v in judged:
        if v.level is FabricLevel.DEGRADED:
            conditions.extend(c.value for c in v.conditions if c.value not in conditions)
    level = (
        FabricLevel.UNHEALTHY
        if FabricLevel.UNHEALTHY in levels
        else FabricLevel.DEGRADED
        if FabricLevel.DEGRADED in levels
        else FabricLevel.HEALTHY
    )
    gpus = len(inventory.gpus)
    unhealthy = 0
    if health is not None:
        uuids = {g.uuid for g in inventory.gpus}
        unhealthy = sum(1 for dev, h in health.items() if dev in uuids and h is Health.UNHEALTHY)
    imex_obj = imex if isinstance(imex, Mapping) else {}
    imex_state = str(imex_obj.get("state", "absent"))
    if imex_state not in ("ready", "not-ready", "absent"):
        imex_state = "not-ready"
    return TrayState(
        name=name,
        clique=clique,
        gpus=gpus,
        healthy_gpus=max(0, gpus - unhealthy),
        used_gpus=max(0, used_gpus),
        fabric=facts.status if facts.status is not FabricStatus.NONE else FabricStatus.INCOMPLETE,
        fabric_reason=facts.reason,
        fabric_level=level,
        fabric_conditions=tuple(conditions),
        imex=imex_state,
        imex_status=str(imex_obj.get("status", "NOT_INSTALLED"))[:40],
        imex_managed=imex_obj.get("managed") is True,
        node_ready=node_is_ready(node),
    )


# --------------------------------------------------------------------------- the HyperNode's condition

CONDITION_TYPE = "gpuagent.dev/NVLinkDomainReady"


def hypernode_condition(s: DomainStatus) -> tuple[str, str, str]:
    """``(status, reason, message)`` of the domain's condition on its tier-1 ``HyperNode``: ``True`` when
    every tray is ready."""
    if s.all_ready:
        status, reason = "True", "AllTraysReady"
    elif s.ready:
        status, reason = "False", "TraysNotReady"
    else:
        status, reason = "False", "NoTrayReady"
    message = (
        f"{len(s.ready)}/{len(s.members)} trays ready, IMEX quorum {s.quorum}, "
        f"largest subgroup {s.largest_subgroup} whole trays"
    )
    not_ready = [d for d in s.degraded if not d.ready]
    if not_ready:
        shown = "; ".join(f"{d.name}: {d.reason}" for d in not_ready[:3])
        more = f" (+{len(not_ready) - 3} more)" if len(not_ready) > 3 else ""
        message += f"; not ready: {shown}{more}"
    return status, reason, message[:1024]


def merged_conditions(
    current: Any, status: str, reason: str, message: str, *, now: str
) -> list[dict[str, Any]] | None:
    """The HyperNode's ``status.conditions`` with ours set (other writers' conditions kept), or ``None``
    when ours already says this. ``lastTransitionTime`` moves only when the status changes."""
    kept = [c for c in current if isinstance(c, dict)] if isinstance(current, list) else []
    mine = next((c for c in kept if c.get("type") == CONDITION_TYPE), None)
    if mine is not None and (mine.get("status"), mine.get("reason"), mine.get("message")) == (
        status,
        reason,
        message,
    ):
        return None
    since = mine.get("lastTransitionTime") if mine is not None and mine.get("status") == status else None
    ours = {
        "type": CONDITION_TYPE,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now,
    }
    return [c for c in kept if c.get("type") != CONDITION_TYPE] + [ours]


# --------------------------------------------------------------------------- the object and its CRD


def nvlinkdomain_object(s: DomainStatus) -> dict[str, Any]:
    """The ``NVLinkDomain`` object of one domain: the clique in ``spec``, the facts in ``status`` (a
    subresource: written by a second apply)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": s.name, "labels": {DOMAIN_LABEL: s.name}},
        "spec": {"clique": str(s.clique)},
        "status": {
            "members": list(s.members),
            "trays": len(s.members),
            "readyTrays": len(s.ready),
            "ready": list(s.ready),
            "degraded": [{"node": d.name, "ready": d.ready, "reason": d.reason} for d in s.degraded],
            "gpus": {
                "total": s.gpus,
                "healthy": s.healthy_gpus,
                "free": s.free_gpus,
                "stranded": s.stranded_gpus,
            },
            "imex": {"ready": s.imex_ready, "members": len(s.members), "quorum": s.quorum},
            "largestSubgroup": s.largest_subgroup,
            "gpusPerTray": s.gpus_per_tray,
            "fragmentation": round(s.fragmentation, 4),
            "phase": "Ready" if s.all_ready else ("Degraded" if s.ready else "NotReady"),
        },
    }


def status_of(obj: Mapping[str, Any]) -> Any:
    """What :func:`nvlinkdomain_object` owns, to compare a wanted object with the one the cluster holds."""
    return (
        obj.get("spec"),
        obj.get("status"),
        ((obj.get("metadata") or {}).get("labels") or {}).get(DOMAIN_LABEL),
    )


def nvlinkdomain_crd() -> dict[str, Any]:
    """The ``nvlinkdomains.topology.gpuagent.dev`` CustomResourceDefinition."""
    count = {"type": "integer", "minimum": 0}
    names = {"type": "array", "items": {"type": "string", "maxLength": 253}, "maxItems": 1024}
    status = {
        "type": "object",
        "properties": {
            "members": names,
            "trays": count,
            "readyTrays": count,
            "ready": names,
            "degraded": {
                "type": "array",
                "maxItems": 1024,
                "items": {
                    "type": "object",
                    "required": ["node", "ready", "reason"],
                    "properties": {
                        "node": {"type": "string", "maxLength": 253},
                        "ready": {"type": "boolean"},
                        "reason": {"type": "string", "maxLength": 1024},
                    },
                },
            },
            "gpus": {
                "type": "object",
                "properties": {"total": count, "healthy": count, "free": count, "stranded": count},
            },
            "imex": {
                "type": "object",
                "properties": {"ready": count, "members": count, "quorum": {"type": "string"}},
            },
            "largestSubgroup": count,
            "gpusPerTray": count,
            "fragmentation": {"type": "number", "minimum": 0, "maximum": 1},
            "phase": {"type": "string", "enum": ["Ready", "Degraded", "NotReady"]},
        },
    }

    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": ["nvld"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        printer_column("Phase", ".status.phase"),
                        printer_column("Trays", ".status.trays", "integer"),
                        printer_column("Ready", ".status.readyTrays", "integer"),
                        printer_column("IMEX", ".status.imex.quorum"),
                        printer_column("Largest-Subgroup", ".status.largestSubgroup", "integer"),
                        printer_column("GPUs", ".status.gpus.total", "integer"),
                        printer_column("Healthy", ".status.gpus.healthy", "integer"),
                        printer_column("Free", ".status.gpus.free", "integer"),
                        printer_column("Stranded", ".status.gpus.stranded", "integer", priority=1),
                        printer_column("Clique", ".spec.clique", priority=1),
                        printer_column("Age", ".metadata.creationTimestamp", "date"),
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": {
                                    "type": "object",
                                    "properties": {"clique": {"type": "string", "maxLength": 100}},
                                },
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    import yaml  # noqa: PLC0415 - only the CRD writer needs it

    header = "# Generated by `python -m topology.nvlinkdomain`; do not edit by hand.\n"
    return header + yaml.safe_dump(nvlinkdomain_crd(), sort_keys=False, width=100)


if __name__ == "__main__":
    import pathlib
    import sys

    target = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "daemonset/crds/nvlinkdomain.yaml")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(crd_yaml(), encoding="utf-8")
    print(f"wrote {target}")
