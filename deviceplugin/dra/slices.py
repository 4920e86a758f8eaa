"""The node's ResourceSlices (``resource.k8s.io/v1``): a pure function of the inventory, the devices DRA
serves (the device plugin's resource plan, the one resource manager) and device taints.

- One pool per node, named after the node; at most :data:`MAX_DEVICES_PER_SLICE` devices per slice
  (the API's limit for slices whose devices carry taints or consume counters, used always so a taint
  never reshuffles the slices), slices named ``<node>-<driver>-<n>`` (bounded to 253 characters).
- MIG devices are partitionable devices (``resource.k8s.io/v1``, ``DRAPartitionableDevices``, on since
  1.36): each GPU with a published MIG device has a counter set ``<gpu device name>-counters`` holding
  its ``memory``, and each of its MIG devices (and the whole GPU, were it published beside them)
  consumes its own memory from it, so the scheduler never hands out more of a GPU than it has. The
  API allows devices and counter sets only in separate slices (at most 8 sets each): the counter sets
  come after the device slices in the same pool. The layout is the MIG devices that exist now (no MIG
  device is created at prepare).
- Device names are the lowercased GPU/MIG UUID with anything outside ``[a-z0-9-]`` as ``-`` (a DNS label,
  stable across restarts and re-indexing): ``gpu-8f3c…``, ``mig-1a2b…``.
- Attributes with NVIDIA's names where NVIDIA's driver publishes the same fact (``type``, ``uuid``,
  ``productName``, ``brand``, ``architecture``, ``cudaComputeCapability``, ``driverVersion``,
  ``cudaDriverVersion``, ``index``, ``minor``, ``resource.kubernetes.io/pciBusID``,
  ``resource.kubernetes.io/pcieRoot``; MIG ``parentUUID``, ``profile``; capacity ``memory``) and ours
  that no driver publishes: ``nvlinkDomain`` (``<clusterUUID>.<cliqueId>``, only while the node sits
  in a completed, agreed clique: a claim can ``matchAttribute`` on it), ``cliqueId``, ``clusterUUID``,
  ``rack`` (chassis serial) and ``tray`` from platform info, ``numaNode``, ``fabricHealth``
  (``healthy|degraded|unhealthy`` from the GPU's own fabric summary).
- With ``imex_channel``, while the node sits in a complete NVLink domain, one more device
  ``imex-channel`` (``type: imex-channel``, the domain attributes, ``allowMultipleAllocations``: every
  claim of the DeviceClass ``imex-channel.gpuagent.dev`` on the node gets it; the channel number is
  decided at prepare, :mod:`deviceplugin.dra.channels`).
- Taints (``spec.devices[].taints``) come from the caller (``taints``, keyed by device UUID): the
  hook for health-as-taints; this module decides nothing about health.

Unqualified attribute names are in the driver's domain (``gpu.gpuagent.dev/nvlinkDomain``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deviceplugin.preferred import DeviceKind
from deviceplugin.resources import Device
from topology.model import FabricHealthSummary, FabricInfo, Gpu, MigDevice, NodeInventory
from topology.nvlink import nvlink_facts

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 64
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_NAME = 253
MAX_STRING = 64
IMEX_CHANNEL_DEVICE = "imex-channel"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
_NOT_LABEL = re.compile(r"[^a-z0-9-]+")

PcieRoot = Callable[[str], str | None]
"""The PCIe root complex (``pci0000:00``) of a PCI bus ID, where the node can tell."""


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One published device and what prepare needs to know of it."""

    name: str
    device: Device


def device_name(uuid: str) -> str:
    """The DNS-label name of the device with this GPU/MIG UUID."""
    return _NOT_LABEL.sub("-", uuid.lower()).strip("-")[:63].rstrip("-")


def slice_devices(devices: Iterable[Device]) -> tuple[SliceDevice, ...]:
    """Whole GPUs and MIG devices (replicas are the device plugin's), by name."""
    seen: dict[str, SliceDevice] = {}
    for d in devices:
        if d.kind is DeviceKind.REPLICA:
            continue
        name = device_name(d.base_uuid)
        seen.setdefault(name, SliceDevice(name=name, device=d))
    return tuple(seen[k] for k in sorted(seen))


def pci_bus_id(nvml_form: str) -> str:
    """NVML's ``00000000:1B:00.0`` as the kernel writes it, ``0000:1b:00.0``."""
    domain, _, rest = nvml_form.partition(":")
    if not rest:
        return nvml_form.lower()
    return f"{domain[-4:].rjust(4, '0')}:{rest}".lower()


def quantity(n_bytes: int) -> str:
    """Bytes as a Kubernetes quantity (``81920Mi`` where whole MiB, else the plain number)."""
    mib = 1024 * 1024
    return f"{n_bytes // mib}Mi" if n_bytes % mib == 0 and n_bytes else str(n_bytes)


def _version(major: int, minor: int, patch: int = 0) -> dict[str, str]:
    return {"version": f"{major}.{minor}.{patch}"}


def _semver(text: str) -> dict[str, str] | None:
    parts = text.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() and len(p) <= 9 for p in parts):
        return None
    nums = [int(p) for p in parts] + [0] * (3 - len(parts))
    return _version(*nums)


_FABRIC_HEALTH = {
    FabricHealthSummary.HEALTHY: "healthy",
    FabricHealthSummary.LIMITED_CAPACITY: "degraded",
    FabricHealthSummary.UNHEALTHY: "unhealthy",
}


def _gpu_attributes(
    gpu: Gpu, inventory: NodeInventory, fabric: FabricInfo | None, clique: str | None, pcie_root: PcieRoot
) -> dict[str, dict[str, Any]]:
    attrs: dict[str, dict[str, Any]] = {
        "productName": {"string": gpu.name},
        "architecture": {"string": gpu.architecture},
        "cudaComputeCapability": _version(*gpu.compute_capability),
        "index": {"int": gpu.index},
        PCI_BUS_ID: {"string": pci_bus_id(gpu.pci_bus_id)},
    }
    if gpu.brand:
        attrs["brand"] = {"string": gpu.brand}
    if gpu.minor_number is not None:
        attrs["minor"] = {"int": gpu.minor_number}
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        attrs["numaNode"] = {"int": gpu.numa_node}
    root = pcie_root(attrs[PCI_BUS_ID]["string"])
    if root:
        attrs[PCIE_ROOT] = {"string": root}
    driver = inventory.driver
    if driver is not None:
        version = _semver(driver.driver_version)
        if version is not None:
            attrs["driverVersion"] = version
        attrs["cudaDriverVersion"] = _version(driver.cuda_major, driver.cuda_minor)
    if fabric is not None and fabric.multi_node:
        attrs["clusterUUID"] = {"string": fabric.cluster_uuid.lower()}
        attrs["cliqueId"] = {"int": fabric.clique_id}
        health = _FABRIC_HEALTH.get(fabric.health_summary)
        if health is not None:
            attrs["fabricHealth"] = {"string": health}
        if clique is not None:
            attrs["nvlinkDomain"] = {"string": clique}
    if gpu.platform is not None:
        if gpu.platform.chassis_serial:
            attrs["rack"] = {"string": gpu.platform.chassis_serial}
        attrs["tray"] = {"int": gpu.platform.tray_index}
    return attrs


def _device(
    sd: SliceDevice,
    *,
    gpu: Gpu,
    mig: MigDevice | None,
    inventory: NodeInventory,
    fabric: FabricInfo | None,
    clique: str | None,
    pcie_root: PcieRoot,
    taints: Sequence[Mapping[str, Any]],
    counter_set: str | None,
) -> dict[str, Any]:
    attrs = _gpu_attributes(gpu, inventory, fabric, clique, pcie_root)
    if mig is None:
        attrs["type"] = {"string": "gpu"}
        attrs["uuid"] = {"string": gpu.uuid}
        memory = gpu.memory_total_bytes
    else:
        attrs["type"] = {"string": "mig"}
        attrs["uuid"] = {"string": mig.uuid}
        attrs["parentUUID"] = {"string": gpu.uuid}
        attrs["parentIndex"] = attrs.pop("index")
        attrs["profile"] = {"string": mig.profile}
        memory = mig.memory_bytes
    for value in attrs.values():  # the API's limit for a string attribute
        if "string" in value:
            value["string"] = value["string"][:MAX_STRING]
    out: dict[str, Any] = {
        "name": sd.name,
        "attributes": dict(sorted(attrs.items())),
        "capacity": {"memory": {"value": quantity(memory)}},
    }
    if counter_set is not None:
        out["consumesCounters"] = [
            {"counterSet": counter_set, "counters": {"memory": {"value": quantity(memory)}}}
        ]
    if taints:
        out["taints"] = [dict(t) for t in taints]
    return out


def counter_set_name(gpu_uuid: str) -> str:
    """The DNS-label name of a GPU's counter set: ``<gpu device name>-counters``."""
    return device_name(gpu_uuid)[:54].rstrip("-") + "-counters"


def build_slices(
    inventory: NodeInventory,
    devices: Iterable[Device],
    *,
    node_name: str,
    node_uid: str | None,
    driver: str,
    generation: int,
    taints: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    pcie_root: PcieRoot = lambda _bus: None,
    imex_channel: bool = False,
) -> list[dict[str, Any]]:
    """The node's pool as ResourceSlice objects (at least one, even with no devices, so the pool's
    emptiness is published too)."""
    gpus = {g.uuid: g for g in inventory.gpus if g.uuid}
    migs = {m.uuid: m for m in inventory.mig_devices()}
    fabric = {f.gpu_index: f for f in inventory.fabric}
    facts = nvlink_facts(inventory)
    clique = nvlink_domain(inventory)
    published = slice_devices(devices)
    partitioned = sorted(
        {
            sd.device.gpu_uuid
            for sd in published
            if sd.device.kind is DeviceKind.MIG and sd.device.gpu_uuid in gpus
        }
    )
    rendered: list[dict[str, Any]] = []
    for sd in published:
        gpu = gpus.get(sd.device.gpu_uuid)
        if gpu is None:
            continue
        mig = migs.get(sd.device.base_uuid) if sd.device.kind is DeviceKind.MIG else None
        if sd.device.kind is DeviceKind.MIG and mig is None:
            continue
        device_taints = (taints or {}).get(sd.device.base_uuid, ())
        rendered.append(
            _device(
                sd,
                gpu=gpu,
                mig=mig,
                inventory=inventory,
                fabric=fabric.get(gpu.index),
                clique=clique,
                pcie_root=pcie_root,
                taints=device_taints,
                counter_set=counter_set_name(gpu.uuid) if gpu.uuid in partitioned else None,
            )
        )
    if imex_channel and clique is not None and facts.clique is not None:
        rendered.append(
            {
                "name": IMEX_CHANNEL_DEVICE,
                "attributes": {
                    "type": {"string": "imex-channel"},
                    "nvlinkDomain": {"string": clique[:MAX_STRING]},
                    "clusterUUID": {"string": str(facts.clique.cluster_uuid).lower()[:MAX_STRING]},
                    "cliqueId": {"int": facts.clique.clique_id},
                },
                "allowMultipleAllocations": True,
            }
        )
    counter_sets = [
        {
            "name": counter_set_name(uuid),
            "counters": {"memory": {"value": quantity(gpus[uuid].memory_total_bytes)}},
        }
        for uuid in partitioned
    ]
    chunks: list[tuple[str, list[dict[str, Any]]]] = [
        ("devices", rendered[i : i + MAX_DEVICES_PER_SLICE])
        for i in range(0, len(rendered), MAX_DEVICES_PER_SLICE)
    ] or [("devices", [])]
    chunks += [
        ("sharedCounters", counter_sets[i : i + MAX_COUNTER_SETS_PER_SLICE])
        for i in range(0, len(counter_sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    out = []
    for n, (field, chunk) in enumerate(chunks):
        meta: dict[str, Any] = {"name": slice_name(node_name, driver, n)}
        if node_uid:
            meta["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}
            ]
        out.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": meta,
                "spec": {
                    "driver": driver,
                    "nodeName": node_name,
                    "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(chunks)},
                    field: chunk,
                },
            }
        )
    return out


def nvlink_domain(inventory: NodeInventory) -> str | None:
    """The node's ``nvlinkDomain`` (``<clusterUUID>.<cliqueId>``): only while the node sits in a
    completed, agreed clique (as GFD's clique label)."""
    facts = nvlink_facts(inventory)
    return str(facts.clique) if facts.clique is not None and facts.gfd_clique is not None else None


def slice_name(node_name: str, driver: str, n: int) -> str:
    """``<node>-<driver>-<n>``, cut to the API's 253 characters from the node name's end."""
    tail = f"-{driver}-{n}"
    return node_name[: MAX_NAME - len(tail)] + tail


def content(slices: Sequence[Mapping[str, Any]]) -> list[Any]:
    """What decides whether a pool must be written again: the slices without the pool generation."""
    out: list[Any] = []
    for s in slices:
        spec = dict(s["spec"])
        pool = dict(spec.pop("pool"))
        pool.pop("generation", None)
        out.append((s["metadata"], spec, pool))
    return out
