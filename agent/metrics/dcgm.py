"""The dcgm-exporter-compatible rendering: the same snapshot with DCGM field names, units and labels.

Existing dashboards and alerts keep working: ``DCGM_FI_DEV_GPU_UTIL`` (%), ``DCGM_FI_DEV_FB_USED`` (MiB),
``DCGM_FI_DEV_POWER_USAGE`` (W), ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ), … with the labels
``gpu``, ``UUID``, ``pci_bus_id``, ``device`` (``nvidia<minor>``), ``modelName``, ``Hostname`` (and
``hostname``, its newest spelling), ``DCGM_FI_DRIVER_VERSION``, ``GPU_I_PROFILE`` and ``GPU_I_ID`` on MIG
series (whose ``gpu``/``UUID`` are the parent's, as in dcgm-exporter), and ``pod``/``namespace``/
``container`` where a pod holds the device.

Differences, on purpose:

- DCGM's counter fields (energy, PCIe replays, ECC and NVLink error totals, remapped rows) keep their
  exact names and are typed ``untyped``: the text format's linters want counters to end in ``_total``,
  and PromQL does not look at the type.
- Shared devices (replicas): one series per holding container with label ``vgpu`` (its lowest replica
  index), like dcgm-exporter's virtual-GPU mode; ``GPU_UTIL`` and ``FB_USED`` are split per pod when
  the split is known, the other fields repeat the device's value (see ``agent.metrics.attribution``).
- Profiling fields (``DCGM_FI_PROF_*``), encoder/decoder utilisation and vGPU licence status need DCGM
  itself and are not published.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import Metric

from agent.imex import DCGM_VALUES, ImexDaemonStatus
from agent.metrics.families import Families
from agent.metrics.native import ScrapeStats, render_agent
from agent.metrics.snapshot import AgentStats, GpuView, MetricsSnapshot, MigView, Owner, PodShare
from topology.model import FabricHealthSummary, FabricInfo, FabricState

MIB = 1024 * 1024

_HELP = {
    "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
    "DCGM_FI_DEV_MEM_CLOCK": "Memory clock frequency (in MHz).",
    "DCGM_FI_DEV_MEMORY_TEMP": "Memory temperature (in C).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "Total energy consumption since boot (in mJ).",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "Total number of PCIe retries.",
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered.",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_FB_RESERVED": "Framebuffer memory reserved (in MiB).",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "Current clock throttle reasons (bitmask).",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "Number of remapped rows for correctable errors.",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "Number of remapped rows for uncorrectable errors.",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "Whether remapping of rows has failed.",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "Total number of single-bit volatile ECC errors.",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "Total number of double-bit volatile ECC errors.",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "Total number of single-bit persistent ECC errors.",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "Total number of double-bit persistent ECC errors.",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "Total number of NVLink flow-control CRC errors.",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "Total number of NVLink data CRC errors.",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "Total number of NVLink retries.",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "Total number of NVLink recovery errors.",
    "DCGM_FI_DEV_FABRIC_MANAGER_STATUS": "Fabric registration of the GPU (0 not supported, 1 not started, "
    "2 in progress, 3 success, 4 failure).",
    "DCGM_FI_DEV_FABRIC_CLUSTER_UUID": "UUID of the NVLink cluster the GPU belongs to (label cluster_uuid); "
    "value 1.",
    "DCGM_FI_DEV_FABRIC_CLIQUE_ID": "ID of the fabric clique the GPU belongs to.",
    "DCGM_FI_DEV_FABRIC_HEALTH_MASK": "GPU fabric health mask (NVML healthMask).",
    "DCGM_FI_IMEX_DAEMON_STATUS": "IMEX daemon status (0 initializing ... 5 ready, 6 shutting down, "
    "7 unavailable; -1 not installed, -2 not configured, -3 command error).",
    "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY": "GPU fabric health summary (0 not supported, 1 healthy, "
    "2 unhealthy, 3 limited capacity).",
}
_COUNTERS = frozenset(
    {
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    }
)


def _emit(f: Families, name: str, labels: dict[str, str], value: float | None) -> None:
    if name in _COUNTERS:
        f.untyped(name, _HELP[name], labels, value)
    else:
        f.gauge(name, _HELP[name], labels, value)


def _mib(value: int | None) -> float | None:
    return None if value is None else float(value // MIB)


def _sum(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _pod(owner: Owner) -> dict[str, str]:
    return {"pod": owner.pod, "namespace": owner.namespace, "container": owner.container}


def render_dcgm(
    snap: MetricsSnapshot, agent: AgentStats, scrapes: ScrapeStats, version: str
) -> Iterable[Metric]:
    f = render_dcgm_devices(snap)
    render_dcgm_agent(f, snap, agent, scrapes, version)
    return f


def render_dcgm_agent(
    f: Families, snap: MetricsSnapshot, agent: AgentStats, scrapes: ScrapeStats, version: str
) -> None:
    """The agent's self-metrics, and the node-wide DCGM fields the agent knows (the IMEX daemon)."""
    render_agent(f, snap, agent, scrapes, version)
    if agent.imex_daemon_status is not None:
        value = DCGM_VALUES[ImexDaemonStatus(agent.imex_daemon_status)]
        _emit(f, "DCGM_FI_IMEX_DAEMON_STATUS", {"Hostname": snap.hostname, "hostname": snap.hostname}, value)


def render_dcgm_devices(snap: MetricsSnapshot) -> Families:
    """Every family that depends on the snapshot alone (all but the agent's self-metrics)."""
    f = Families()
    for view in snap.gpus:
        _gpu(f, view, snap)
    return f


def _gpu_labels(view: GpuView, snap: MetricsSnapshot) -> dict[str, str]:
    g = view.gpu
    return {
        "gpu": str(g.index),
        "UUID": g.uuid,
        "pci_bus_id": g.pci_bus_id,
        "device": f"nvidia{g.minor_number if g.minor_number is not None else g.index}",
        "modelName": g.name,
        "Hostname": snap.hostname,
        "hostname": snap.hostname,  # dcgm-exporter's newest name for the same label
        "DCGM_FI_DRIVER_VERSION": snap.driver_version or "",
    }


def _label_sets(
    base: dict[str, str], owners: tuple[Owner, ...], shares: tuple[PodShare, ...]
) -> list[tuple[dict[str, str], PodShare | None]]:
    """One label set per series: the exclusive holder, each sharing pod, or the bare device."""
    if shares:
        return [({**base, **_pod(s.owner), "vgpu": str(s.replicas[0])}, s) for s in shares]
    if len(owners) == 1:
        return [({**base, **_pod(owners[0])}, None)]
    return [(base, None)]


def _gpu(f: Families, view: GpuView, snap: MetricsSnapshot) -> None:
    base = _gpu_labels(view, snap)
    s = view.sample
    sharing = view.sharing
    shares = sharing.shares if sharing is not None else ()
    split = sharing is not None and sharing.split
    for labels, share in _label_sets(base, view.owners, shares):
        _emit(f, "DCGM_FI_DEV_XID_ERRORS", labels, view.last_xid or 0)
        if s is None:
            continue
        util = s.gpu_utilization_percent
        used = s.memory_used_bytes
        if share is not None and split:
            util = None if share.utilization_percent is None else round(share.utilization_percent)
            used = share.memory_used_bytes
        _emit(f, "DCGM_FI_DEV_SM_CLOCK", labels, s.sm_clock_mhz)
        _emit(f, "DCGM_FI_DEV_MEM_CLOCK", labels, s.memory_clock_mhz)
        _emit(f, "DCGM_FI_DEV_MEMORY_TEMP", labels, s.memory_temperature_celsius)
        _emit(f, "DCGM_FI_DEV_GPU_TEMP", labels, s.temperature_celsius)
        _emit(f, "DCGM_FI_DEV_POWER_USAGE", labels, s.power_watts)
        _emit(
            f,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            labels,
            None if s.energy_joules is None else round(s.energy_joules * 1000),
        )
        _emit(f, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", labels, s.pcie_replays)
        _emit(f, "DCGM_FI_DEV_GPU_UTIL", labels, util)
        _emit(f, "DCGM_FI_DEV_MEM_COPY_UTIL", labels, s.memory_utilization_percent)
        _emit(f, "DCGM_FI_DEV_FB_USED", labels, _mib(used))
        _emit(f, "DCGM_FI_DEV_FB_FREE", labels, _mib(s.memory_free_bytes))
        if None not in (s.memory_total_bytes, s.memory_used_bytes, s.memory_free_bytes):
            reserved = (s.memory_total_bytes or 0) - (s.memory_used_bytes or 0) - (s.memory_free_bytes or 0)
            _emit(f, "DCGM_FI_DEV_FB_RESERVED", labels, _mib(max(0, reserved)))
        _emit(f, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", labels, s.throttle_reasons)
        _emit(f, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", labels, s.remapped_rows_correctable)
        _emit(f, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", labels, s.remapped_rows_uncorrectable)
        _emit(
            f,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            labels,
            None if s.remapped_rows_failure is None else float(s.remapped_rows_failure),
        )
        _emit(f, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", labels, s.ecc_corrected_volatile)
        _emit(f, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", labels, s.ecc_uncorrected_volatile)
        _emit(f, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", labels, s.ecc_corrected_aggregate)
        _emit(f, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", labels, s.ecc_uncorrected_aggregate)
        if s.nvlinks:
            _emit(
                f,
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                labels,
                _sum(lk.crc_flit_errors for lk in s.nvlinks),
            )
            _emit(
                f,
                "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                labels,
                _sum(lk.crc_data_errors for lk in s.nvlinks),
            )
            _emit(
                f,
                "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
                labels,
                _sum(lk.replay_errors for lk in s.nvlinks),
            )
            _emit(
                f,
                "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
                labels,
                _sum(lk.recovery_errors for lk in s.nvlinks),
            )
    if view.fabric is not None and view.fabric.state is not FabricState.NOT_SUPPORTED:
        _fabric(f, base, view.fabric)
    for mig in view.migs:
        _mig(f, base, mig)


# DCGM's dcgmFabricManagerStatus_t from NVML's fabric state (and status once COMPLETED)
_FM_STATUS = {FabricState.NOT_SUPPORTED: 0, FabricState.NOT_STARTED: 1, FabricState.IN_PROGRESS: 2}
_HEALTH_SUMMARY = {
    FabricHealthSummary.NOT_SUPPORTED: 0,
    FabricHealthSummary.HEALTHY: 1,
    FabricHealthSummary.UNHEALTHY: 2,
    FabricHealthSummary.LIMITED_CAPACITY: 3,
}


def _fabric(f: Families, base: dict[str, str], fab: FabricInfo) -> None:
    """DCGM's fabric fields (170, 172-175) of one GPU."""
    status = _FM_STATUS.get(fab.state, 3 if fab.status == "SUCCESS" else 4)
    _emit(f, "DCGM_FI_DEV_FABRIC_MANAGER_STATUS", base, status)
    _emit(f, "DCGM_FI_DEV_FABRIC_CLUSTER_UUID", {**base, "cluster_uuid": fab.cluster_uuid}, 1)
    _emit(f, "DCGM_FI_DEV_FABRIC_CLIQUE_ID", base, fab.clique_id)
    _emit(f, "DCGM_FI_DEV_FABRIC_HEALTH_MASK", base, fab.health_mask)
    _emit(f, "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY", base, _HEALTH_SUMMARY[fab.health_summary])


def _mig(f: Families, parent: dict[str, str], mig: MigView) -> None:
    d = mig.device
    base = {**parent, "GPU_I_PROFILE": d.profile, "GPU_I_ID": str(d.gpu_instance_id)}
    s = mig.sample
    if s is None:
        return
    sharing = mig.sharing
    shares = sharing.shares if sharing is not None else ()
    split = sharing is not None and sharing.split
    total = d.memory_bytes if s.memory_total_bytes is None else s.memory_total_bytes
    for labels, share in _label_sets(base, mig.owners, shares):
        used = s.memory_used_bytes
        if share is not None and split:
            used = share.memory_used_bytes
        _emit(f, "DCGM_FI_DEV_FB_USED", labels, _mib(used))
        _emit(
            f,
            "DCGM_FI_DEV_FB_FREE",
            labels,
            None if s.memory_used_bytes is None else _mib(max(0, total - s.memory_used_bytes)),
        )
