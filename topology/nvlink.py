"""Which NVLink domain a node belongs to, decided from its inventory alone. Pure.

Rules (GPU Feature Discovery's clique rule, plus health):

- A GPU is *fabric-attached* when NVML reports fabric state ``COMPLETED``, status ``SUCCESS`` and a
  non-zero clusterUuid. The clique of a node is ``<clusterUuid>.<cliqueId>`` when every fabric entry is
  attached and all agree; the domain is keyed by the pair, never by cliqueId alone (cliqueId 32766 is
  reported by unrelated racks).
- A node without a multi-node fabric (no fabric info, state ``NOT_SUPPORTED``, or ``COMPLETED`` with the
  all-zero clusterUuid of an HGX board) is its own domain: its NVSwitch or NVLink mesh, or just itself.
- A node whose fabric is not ``COMPLETED`` (or not ``SUCCESS``), whose GPUs disagree, or where a GPU's
  fabric is unhealthy under the fabric policy (``topology.fabrichealth``: by default route unhealthy,
  incorrect configuration or health summary ``UNHEALTHY``) has no trustworthy NVLink domain; ``status``
  and ``reason`` say why, and GFD's clique label is withdrawn.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from topology.fabrichealth import (
    DEFAULT_FABRIC_POLICY,
    FabricLevel,
    FabricPolicy,
    GpuFabricVerdict,
    gpu_fabric_verdict,
)
from topology.model import FabricState, NodeInventory


class FabricStatus(enum.StrEnum):
    NONE = "none"  # no multi-node fabric: the node is its own NVLink domain
    OK = "ok"  # a healthy, completed clique
    INCOMPLETE = "incomplete"  # state not COMPLETED or status not SUCCESS on some GPU
    UNHEALTHY = "unhealthy"  # health summary UNHEALTHY on some GPU
    INCONSISTENT = "inconsistent"  # GPUs disagree on clusterUuid / cliqueId


@dataclass(frozen=True, slots=True, order=True)
class CliqueKey:
    """The identity of a multi-node NVLink domain (an NVL72 partition)."""

    cluster_uuid: str
    clique_id: int

    def __str__(self) -> str:
        return f"{self.cluster_uuid}.{self.clique_id}"


CLIQUE_LABEL = "gpuagent.dev/nvlink-clique"
"""On a ``GPUNode``: the clique its node belongs to (:func:`member_clique`), also while its fabric is not
ready, so an agent managing IMEX can watch its clique's members alone."""


@dataclass(frozen=True, slots=True)
class NvlinkFacts:
    status: FabricStatus
    clique: CliqueKey | None  # the agreed clique (also set when UNHEALTHY), None otherwise
    reason: str | None  # why the node is not in its clique, for the operator

    @property
    def gfd_clique(self) -> str | None:
        """Value of ``nvidia.com/gpu.clique``: completed, agreed and not unhealthy."""
        if self.clique is None or self.status is not FabricStatus.OK:
            return None
        return str(self.clique)


def nvlink_facts(
    inventory: NodeInventory,
    policy: FabricPolicy = DEFAULT_FABRIC_POLICY,
    *,
    verdicts: Sequence[GpuFabricVerdict] | None = None,
) -> NvlinkFacts:
    """The node's NVLink facts. ``verdicts``: the levels the node's agent published under its own fabric
    policy (``GPUNode`` ``status.fabric``); they replace ``policy`` for the GPUs they name."""
    published = {v.gpu_index: v for v in verdicts} if verdicts is not None else {}
    entries = [f for f in inventory.fabric if f.state is not FabricState.NOT_SUPPORTED]
    if not entries:
        return NvlinkFacts(FabricStatus.NONE, None, None)
    multi = [f for f in entries if f.multi_node]
    if not multi and all(f.state is FabricState.COMPLETED for f in entries):
        return NvlinkFacts(FabricStatus.NONE, None, None)
    for f in sorted(entries, key=lambda e: e.gpu_index):
        if f.state is not FabricState.COMPLETED:
            return NvlinkFacts(
                FabricStatus.INCOMPLETE,
                None,
                f"fabric state {f.state.value} on GPU {f.gpu_index}",
            )
        if f.status != "SUCCESS":
            return NvlinkFacts(
                FabricStatus.INCOMPLETE, None, f"fabric status {f.status} on GPU {f.gpu_index}"
            )
    keys = {CliqueKey(f.cluster_uuid.lower(), f.clique_id) for f in entries}
    if len(keys) != 1 or len(multi) != len(entries):
        seen = ", ".join(sorted(str(k) for k in keys))
        return NvlinkFacts(FabricStatus.INCONSISTENT, None, f"GPUs disagree on the clique ({seen})")
    (key,) = keys
    judged = [
        published.get(f.gpu_index) or gpu_fabric_verdict(f, policy)
        for f in sorted(entries, key=lambda e: e.gpu_index)
    ]
    bad = [v for v in judged if v.level is FabricLevel.UNHEALTHY]
    if bad:
        groups: dict[str, list[str]] = {}
        for v in bad:
            groups.setdefault(", ".join(c.value for c in v.conditions), []).append(str(v.gpu_index))
        where = "; ".join(f"on GPU {', '.join(gpus)}: {conds}" for conds, gpus in groups.items())
        return NvlinkFacts(FabricStatus.UNHEALTHY, key, f"fabric unhealthy {where}")
    return NvlinkFacts(FabricStatus.OK, key, None)


def member_clique(inventory: NodeInventory) -> CliqueKey | None:
    """The clique a tray belongs to, also while its fabric is not ``COMPLETED`` or unhealthy: the
    clusterUuid/cliqueId most of its multi-node GPUs name (ties: the smallest); ``None`` for a node
    without a multi-node fabric."""
    counts: dict[CliqueKey, int] = {}
    for f in inventory.fabric:
        if f.state is FabricState.NOT_SUPPORTED or not f.multi_node:
            continue
        key = CliqueKey(f.cluster_uuid.lower(), f.clique_id)
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        return None
    return min(counts, key=lambda k: (-counts[k], k))
