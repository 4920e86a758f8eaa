"""Wiring of the DRA driver (:mod:`deviceplugin.dra`) into ``run``: the Kubernetes client it reads claims
and writes ResourceSlices with, the node's PCIe roots from sysfs, and the devices' faults for the
taints (:func:`health_faults`: the health book's decisions and the fabric policy's levels, read, never
decided again)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from agent.config import RunSettings
from agent.healthbook import FaultClass
from agent.runtime import InventoryStore
from deviceplugin.dra.channelbook import KubeChannelBook
from deviceplugin.dra.driver import DraDriver
from deviceplugin.dra.imexchannel import ImexChannels
from deviceplugin.dra.publish import KubeDraApi
from deviceplugin.dra.slices import nvlink_domain
from deviceplugin.dra.taints import Fault, TaintCause, TaintEffect
from deviceplugin.resources import Device
from topology.fabrichealth import FabricLevel, FabricPolicy, fabric_verdicts


class DraUnavailableError(RuntimeError):
    """The DRA driver cannot be built (one line for the operator)."""


def pcie_root_reader(sysfs_root: Path) -> Callable[[str], str | None]:
    """``pcie_root(bus_id)``: the root complex (``pci0000:00``) above a PCI device in sysfs, or None."""

    def pcie_root(bus_id: str) -> str | None:
        try:
            real = os.path.realpath(sysfs_root / "bus" / "pci" / "devices" / bus_id)
        except OSError:
            return None
        for part in Path(real).parts:
            if part.startswith("pci") and ":" in part:
                return part
        return None

    return pcie_root


_CAUSE = {
    FaultClass.XID: TaintCause.XID,
    FaultClass.LOST: TaintCause.LOST,
    FaultClass.FABRIC: TaintCause.FABRIC,
}


def health_faults(store: InventoryStore, policy: FabricPolicy) -> Callable[[Device], list[Fault]]:
    """``faults(device)`` for the DRA taints: what the health book decided for the device (its rule:
    unhealthy when any of its keys is) withdraws it (``NoSchedule``, keyed by the book's fault class);
    a fabric the fabric policy rates degraded or unhealthy but the book did not turn into a withdrawal
    is told with effect ``None``."""

    def faults(device: Device) -> list[Fault]:
        out = []
        status = store.device_health(device.health_keys)
        if not status.healthy:
            cause = _CAUSE[status.fault_class or FaultClass.XID]
            out.append(Fault(cause, status.fault or status.reason or "unhealthy"))
        inventory = store.inventory
        index = next((g.index for g in inventory.gpus if g.uuid == device.gpu_uuid), None)
        for verdict in fabric_verdicts(inventory, policy):
            if verdict.gpu_index == index and verdict.level is not FabricLevel.HEALTHY:
                out.append(Fault(TaintCause.FABRIC, verdict.reason, TaintEffect.NONE))
        return out

    return faults


def domain_of(store: InventoryStore) -> Callable[[], str | None]:
    """The node's NVLink domain (``<clusterUUID>.<cliqueId>``) while it is complete and agreed, as the
    slices publish it."""

    return lambda: nvlink_domain(store.inventory)


def dra_driver_for_run(
    settings: RunSettings,
    store: InventoryStore,
    *,
    grace_s: float,
    dev_root: Path = Path("/dev"),
    proc_devices: Path = Path("/proc/devices"),
    simulated: bool = False,
) -> DraDriver:
    """The driver for ``run``; raises :class:`DraUnavailableError` without a Kubernetes API (prepare reads
    each claim's allocation from it)."""
    if settings.no_kube:
        raise DraUnavailableError(
            "dra.enabled needs the Kubernetes API (claims are read from it); drop --no-kube"
        )
    from topology.kube import Kube, api_client_from  # noqa: PLC0415 - loads the Kubernetes client only here

    try:
        client = api_client_from(str(settings.kubeconfig) if settings.kubeconfig else None)
    except Exception as exc:  # no kubeconfig and not in a cluster
        raise DraUnavailableError(f"dra.enabled: no Kubernetes API configuration: {exc}") from None
    api = KubeDraApi(Kube(client))
    reader = pcie_root_reader(settings.sysfs_root or Path("/sys"))
    channels = None
    if settings.dra.imex_channels:
        channels = ImexChannels(
            book=KubeChannelBook(api.kube, namespace=settings.dra.imex_namespace),
            node_name=settings.node_name,
            driver=settings.dra.driver_name,
            domain=domain_of(store),
            dev_root=dev_root,
            proc_devices=proc_devices,
            cdi_dir=Path(settings.plugin.cdi.spec_dir),
            allow_stand_in=simulated,
            claim_get=api.get_claim,
        )
    return DraDriver(
        store=store,
        config=settings.dra,
        plugin_config=settings.plugin,
        node_name=settings.node_name,
        claims=api,
        slices=api,
        pcie_root=reader,
        faults=health_faults(store, settings.health.fabric_policy),
        channels=channels,
        grace_s=grace_s,
    )
