"""Node labels the agent publishes, computed from the inventory. Pure.

Two families:

- GPU Feature Discovery compatible ``nvidia.com/*`` labels (names in ARCHITECTURE.md; values as GFD
  writes them), so workloads and tools written for GFD keep working. ``nvidia.com/gpu.clique`` is set
  only when every GPU's fabric is ``COMPLETED`` with status ``SUCCESS`` and all agree on
  ``<clusterUuid>.<cliqueId>``.
- ``gpuagent.dev/*`` labels we own: the node's NVLink domain (the same name as its tier-1 HyperNode),
  the fabric status, the fabric health (``gpuagent.dev/fabric-health``: ``healthy``, ``degraded`` or
  ``unhealthy`` under the fabric policy, see :mod:`topology.fabrichealth`; absent without multi-node
  fabric info), the IMEX daemon (``gpuagent.dev/imex``: ``ready``, ``not-ready`` or ``absent``, when the
  agent reports it), and the InfiniBand leaf set its ports cable to (the name the controller gives the
  leaf domain when it knows nothing more than the switch GUIDs).
"""

from __future__ import annotations

import re

from topology.fabrichealth import DEFAULT_FABRIC_POLICY, LABEL_FABRIC_HEALTH, FabricPolicy, node_fabric_level
from topology.model import NodeInventory
from topology.names import clique_domain_name, node_domain_name, normalize_guid, switch_set_name
from topology.nvlink import FabricStatus, nvlink_facts

NVIDIA = "nvidia.com/"
OURS = "gpuagent.dev/"
LABEL_NVLINK_DOMAIN = f"{OURS}nvlink-domain"
LABEL_FABRIC = f"{OURS}nvlink-fabric"
LABEL_IB_LEAF = f"{OURS}ib-leaf"
LABEL_CLIQUE = f"{NVIDIA}gpu.clique"
LABEL_IMEX = f"{OURS}imex"
IMEX_LABEL_VALUES = ("ready", "not-ready", "absent")

MIG_STRATEGIES = ("none", "single", "mixed")
SHARING_STRATEGIES = ("none", "time-slicing", "mps")

_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")

GFD_FAMILIES = {"ada": "ada-lovelace"}
"""Our architecture names whose ``nvidia.com/gpu.family`` value GFD spells otherwise (compared against
NVIDIA's GFD in tests/e2e/test_peer_gfd.py); every other name is the label value as it is."""


def label_value(text: str) -> str:
    """Spaces and other characters a label value cannot hold become ``-``; at most 63 characters."""
    return _VALUE_BAD.sub("-", text).strip("-_.")[:63].rstrip("-_.")


def ib_leaf_switches(inventory: NodeInventory) -> frozenset[str]:
    """Normalized GUIDs of the switches this node's active InfiniBand ports cable to (where known)."""
    out: set[str] = set()
    for port in inventory.ib:
        if port.switch_guid and port.link_layer == "InfiniBand" and port.state.upper().endswith("ACTIVE"):
            try:
                out.add(normalize_guid(port.switch_guid))
            except ValueError:
                continue
    return frozenset(out)


def _single_is_invalid(inventory: NodeInventory, gpu_indices: set[int]) -> bool:
    """migStrategy ``single`` with MIG on somewhere, but not every GPU enabled with MIG devices of one
    profile (the layouts GFD labels ``-MIG-INVALID`` and our device plugin refuses)."""
    on = {s.gpu_index: s for s in inventory.mig if s.current_enabled and s.gpu_index in gpu_indices}
    if not on:
        return False
    if any(not s.devices for s in on.values()) or set(on) != gpu_indices:
        return True
    return len({d.profile for s in on.values() for d in s.devices}) > 1


def node_labels(
    inventory: NodeInventory,
    *,
    node_name: str,
    mig_strategy: str = "none",
    sharing_strategy: str = "none",
    replicas: int = 1,
    shared_renamed: bool = False,
    fabric_policy: FabricPolicy = DEFAULT_FABRIC_POLICY,
    imex: str | None = None,
) -> dict[str, str]:
    """Every label the agent owns on its Node; a label absent here is removed from the Node.
    ``imex``: the IMEX daemon's label value (``IMEX_LABEL_VALUES``), ``None`` to leave it out."""
    if mig_strategy not in MIG_STRATEGIES:
        raise ValueError(f"mig_strategy {mig_strategy!r}: valid: {', '.join(MIG_STRATEGIES)}")
    if sharing_strategy not in SHARING_STRATEGIES:
        raise ValueError(f"sharing_strategy {sharing_strategy!r}: valid: {', '.join(SHARING_STRATEGIES)}")
    if replicas < 1:
        raise ValueError(f"replicas {replicas}: must be at least 1")
    labels: dict[str, str] = {}
    gpus = [g for g in inventory.gpus if not g.lost]
    labels[f"{NVIDIA}gpu.present"] = "true" if gpus else "false"
    if gpus:
        first = min(gpus, key=lambda g: g.index)
        product = label_value(first.name)
        if replicas > 1 and not shared_renamed:
            product = label_value(f"{product}-SHARED")
        labels[f"{NVIDIA}gpu.product"] = product
        labels[f"{NVIDIA}gpu.count"] = str(len(gpus))
        labels[f"{NVIDIA}gpu.memory"] = str(first.memory_total_mib)
        labels[f"{NVIDIA}gpu.family"] = label_value(GFD_FAMILIES.get(first.architecture, first.architecture))
        labels[f"{NVIDIA}gpu.compute.major"] = str(first.compute_capability[0])
        labels[f"{NVIDIA}gpu.compute.minor"] = str(first.compute_capability[1])
        devices = inventory.mig_devices()
        profiles = {d.profile for d in devices}
        invalid_single = mig_strategy == "single" and _single_is_invalid(inventory, {g.index for g in gpus})
        if invalid_single:
            # as GFD labels it: the node offers no nvidia.com/gpu (our device plugin refuses this layout too)
            labels[f"{NVIDIA}gpu.product"] = label_value(f"{label_value(first.name)}-MIG-INVALID")
            labels[f"{NVIDIA}gpu.count"] = "0"
            labels[f"{NVIDIA}gpu.memory"] = "0"
        elif mig_strategy == "single" and len(profiles) == 1:
            # single strategy: every GPU is cut the same way and the MIG devices are what is counted
            profile = next(iter(profiles))
            labels[f"{NVIDIA}gpu.product"] = label_value(f"{product}-MIG-{profile}")
            labels[f"{NVIDIA}gpu.count"] = str(len(devices))
            labels[f"{NVIDIA}gpu.memory"] = str(min(d.memory_bytes for d in devices) // 2**20)
            labels[f"{NVIDIA}gpu.slices.gi"] = str(devices[0].gpu_slices)
            labels[f"{NVIDIA}gpu.slices.ci"] = str(devices[0].compute_slices)
            if devices[0].sm_count is not None:
                labels[f"{NVIDIA}gpu.multiprocessors"] = str(devices[0].sm_count)
        elif mig_strategy == "mixed":
            for profile in sorted(profiles):
                of_profile = [d for d in devices if d.profile == profile]
                key = f"{NVIDIA}mig-{profile}"
                labels[f"{key}.count"] = str(len(of_profile))
                labels[f"{key}.memory"] = str(of_profile[0].memory_bytes // 2**20)
                labels[f"{key}.slices.gi"] = str(of_profile[0].gpu_slices)
                labels[f"{key}.slices.ci"] = str(of_profile[0].compute_slices)
        labels[f"{NVIDIA}mig.capable"] = "true" if any(g.mig_capable for g in gpus) else "false"
        labels[f"{NVIDIA}mig.strategy"] = mig_strategy
        labels[f"{NVIDIA}gpu.sharing-strategy"] = "" if invalid_single else sharing_strategy
        labels[f"{NVIDIA}gpu.replicas"] = "0" if invalid_single else str(replicas)
    if inventory.driver is not None:
        parts = inventory.driver.driver_version.split(".")
        names = ("major", "minor", "rev")
        for name, part in zip(names, parts, strict=False):
            labels[f"{NVIDIA}cuda.driver.{name}"] = label_value(part)
            labels[f"{NVIDIA}cuda.driver-version.{'revision' if name == 'rev' else name}"] = label_value(part)
        labels[f"{NVIDIA}cuda.driver-version.full"] = label_value(inventory.driver.driver_version)
        cuda_major, cuda_minor = inventory.driver.cuda_major, inventory.driver.cuda_minor
        labels[f"{NVIDIA}cuda.runtime.major"] = str(cuda_major)
        labels[f"{NVIDIA}cuda.runtime.minor"] = str(cuda_minor)
        labels[f"{NVIDIA}cuda.runtime-version.major"] = str(cuda_major)
        labels[f"{NVIDIA}cuda.runtime-version.minor"] = str(cuda_minor)
        labels[f"{NVIDIA}cuda.runtime-version.full"] = f"{cuda_major}.{cuda_minor}"

    facts = nvlink_facts(inventory, fabric_policy)
    if facts.gfd_clique is not None:
        labels[LABEL_CLIQUE] = facts.gfd_clique
    if gpus:
        labels[LABEL_FABRIC] = facts.status.value
        if facts.status is FabricStatus.OK and facts.clique is not None:
            labels[LABEL_NVLINK_DOMAIN] = clique_domain_name(facts.clique)
        elif facts.status is FabricStatus.NONE:
            labels[LABEL_NVLINK_DOMAIN] = node_domain_name(node_name)
    level = node_fabric_level(inventory, fabric_policy) if gpus else None
    if level is not None:
        labels[LABEL_FABRIC_HEALTH] = level.value
    if imex is not None:
        if imex not in IMEX_LABEL_VALUES:
            raise ValueError(f"imex {imex!r}: valid: {', '.join(IMEX_LABEL_VALUES)}")
        labels[LABEL_IMEX] = imex
    leaves = ib_leaf_switches(inventory)
    if leaves:
        labels[LABEL_IB_LEAF] = switch_set_name("leaf", leaves)
    return labels
