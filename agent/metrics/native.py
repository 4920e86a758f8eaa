"""The native rendering: ``gpuagent_*`` names in base units, bounded labels, facts in ``_info``.

Device series carry ``gpu`` (NVML index of the gpu, or of the parent for a mig device) and ``uuid``
(the device's own UUID); a device held by exactly one container also carries ``namespace``, ``pod`` and
``container``. Shared devices keep device-level series unlabelled and add per-pod series
(``gpuagent_pod_*``) when the split is known (see ``agent.metrics.attribution``).
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from agent.imex import ImexDaemonStatus
from agent.metrics.families import Families
from agent.metrics.snapshot import AgentStats, GpuView, MetricsSnapshot, MigView, Owner, Sharing
from topology.fabrichealth import FabricCondition, fabric_conditions
from topology.model import FabricHealthSummary, FabricState

P = "gpuagent_"

# nvmlClocksEventReason* bits (formerly nvmlClocksThrottleReason*)
CLOCKS_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

NVLINK_ERRORS = ("crc_flit", "crc_data", "replay", "recovery")


@dataclass(frozen=True, slots=True)
class ScrapeStats:
    count: int = 0
    total_seconds: float = 0.0


def _ratio(percent: float | None) -> float | None:
    return None if percent is None else percent / 100.0


def _hz(mhz: int | None) -> float | None:
    return None if mhz is None else mhz * 1_000_000.0


def _bool(flag: bool | None) -> float | None:
    return None if flag is None else float(flag)


def owner_labels(owners: tuple[Owner, ...]) -> dict[str, str]:
    """Pod labels of a device held by exactly one container; none otherwise."""
    if len(owners) != 1:
        return {}
    o = owners[0]
    return {"namespace": o.namespace, "pod": o.pod, "container": o.container}


def render_native(
    snap: MetricsSnapshot, agent: AgentStats, scrapes: ScrapeStats, version: str
) -> Iterable[Metric]:
    f = render_native_devices(snap)
    render_agent(f, snap, agent, scrapes, version)
    return f


def render_native_devices(snap: MetricsSnapshot) -> Families:
    """Every family that depends on the snapshot alone (all but the agent's self-metrics)."""
    f = Families()
    for view in snap.gpus:
        _gpu(f, view, snap.driver_version)
    for a in snap.allocations:
        f.gauge(
            P + "device_allocation_info",
            "A device ID the kubelet gave to a container (pod-resources List); value 1.",
            {
                "gpu": str(a.gpu_index),
                "uuid": a.uuid,
                "resource": a.resource,
                "device_id": a.device_id,
                "namespace": a.owner.namespace,
                "pod": a.owner.pod,
                "container": a.owner.container,
            },
            1,
        )
    return f


def _gpu(f: Families, view: GpuView, driver_version: str | None) -> None:
    g = view.gpu
    base = {"gpu": str(g.index), "uuid": g.uuid}
    mig_mode = "unsupported" if view.mig_enabled is None else ("enabled" if view.mig_enabled else "disabled")
    f.gauge(
        P + "gpu_info",
        "Static facts of a GPU; value 1.",
        {
            **base,
            "model": g.name,
            "pci_bus_id": g.pci_bus_id,
            "driver_version": driver_version or "",
            "mig_mode": mig_mode,
            "architecture": g.architecture,
            "device": f"nvidia{g.minor_number}" if g.minor_number is not None else "",
        },
        1,
    )
    f.gauge(
        P + "device_healthy",
        "1 when the device is healthy as the device plugin reports it to kubelet.",
        base,
        _bool(view.healthy),
    )
    f.gauge(
        P + "gpu_sample_ok",
        "1 when the last refresh read this GPU's values, 0 when it failed.",
        base,
        0.0 if view.sample is None else 1.0,
    )
    lb = {**base, **owner_labels(view.owners)}
    for xid, count in view.xid_counts:
        f.counter(
            P + "gpu_xid_errors",
            "XID events seen by the agent since it started, by XID.",
            {**lb, "xid": str(xid)},
            count,
        )
    if view.fabric is not None:
        fab = view.fabric
        for state in FabricState:
            f.gauge(
                P + "fabric_state",
                "NVLink fabric registration state (1 for the current state).",
                {**base, "state": state.value},
                float(fab.state is state),
            )
        for summary in FabricHealthSummary:
            f.gauge(
                P + "fabric_health",
                "NVLink fabric health summary (1 for the current summary).",
                {**base, "summary": summary.value},
                float(fab.health_summary is summary),
            )
        f.gauge(
            P + "fabric_info",
            "Fabric identity of a GPU (clique = cluster UUID + clique ID); value 1.",
            {**base, "cluster_uuid": fab.cluster_uuid, "clique_id": str(fab.clique_id)},
            1,
        )
        if fab.state is not FabricState.NOT_SUPPORTED:
            seen = fabric_conditions(fab)
            for condition in FabricCondition:
                f.gauge(
                    P + "fabric_condition",
                    "1 while the GPU's NVLink fabric shows the condition (health mask, state/status, "
                    "summary), else 0.",
                    {**base, "condition": condition.value},
                    float(condition in seen),
                )
        if fab.health_mask is not None:
            f.gauge(P + "fabric_health_mask", "NVML's raw fabric healthMask.", base, fab.health_mask)
        if fab.health.partition_assigned is not None:
            f.gauge(
                P + "fabric_partition_assigned",
                "1 while the fabric health mask reports the GPU assigned to an NVLink partition, 0 while "
                "it reports it unassigned; informational (no fabric condition, never unhealthy or degraded).",
                base,
                float(fab.health.partition_assigned),
            )
    if g.power_limit_watts is not None:
        f.gauge(P + "gpu_power_limit_watts", "Enforced power limit.", lb, g.power_limit_watts)
    s = view.sample
    if s is not None:
        f.gauge(
            P + "gpu_utilization_ratio",
            "Fraction of time a kernel ran over the last sample period.",
            lb,
            _ratio(s.gpu_utilization_percent),
        )
        f.gauge(
            P + "gpu_memory_utilization_ratio",
            "Fraction of time device memory was read or written.",
            lb,
            _ratio(s.memory_utilization_percent),
        )
        f.gauge(P + "gpu_memory_used_bytes", "Device memory in use.", lb, s.memory_used_bytes)
        f.gauge(P + "gpu_memory_free_bytes", "Device memory free.", lb, s.memory_free_bytes)
        f.gauge(
            P + "gpu_memory_total_bytes",
            "Device memory in total.",
            lb,
            s.memory_total_bytes if s.memory_total_bytes is not None else g.memory_total_bytes,
        )
        f.gauge(P + "gpu_temperature_celsius", "GPU die temperature.", lb, s.temperature_celsius)
        f.gauge(
            P + "gpu_memory_temperature_celsius",
            "Memory (HBM) temperature.",
            lb,
            s.memory_temperature_celsius,
        )
        f.gauge(P + "gpu_power_watts", "Power draw.", lb, s.power_watts)
        f.counter(P + "gpu_energy_joules", "Energy used since the driver loaded.", lb, s.energy_joules)
        f.gauge(P + "gpu_sm_clock_hertz", "SM clock.", lb, _hz(s.sm_clock_mhz))
        f.gauge(P + "gpu_memory_clock_hertz", "Memory clock.", lb, _hz(s.memory_clock_mhz))
        if s.throttle_reasons is not None:
            f.gauge(
                P + "gpu_clocks_event_reasons",
                "NVML clocks-event (throttle) reasons as a bitmask.",
                lb,
                s.throttle_reasons,
            )
            for bit, reason in CLOCKS_EVENT_REASONS:
                f.gauge(
                    P + "gpu_clocks_event_active",
                    "1 while this clocks-event (throttle) reason holds.",
                    {**lb, "reason": reason},
                    float(bool(s.throttle_reasons & bit)),
                )
        f.counter(P + "gpu_pcie_replays", "PCIe replays since the driver loaded.", lb, s.pcie_replays)
        ecc = "ECC errors (volatile: since driver load; aggregate: lifetime)."
        f.counter(
            P + "gpu_ecc_errors",
            ecc,
            {**lb, "type": "corrected", "scope": "volatile"},
            s.ecc_corrected_volatile,
        )
        f.counter(
            P + "gpu_ecc_errors",
            ecc,
            {**lb, "type": "uncorrected", "scope": "volatile"},
            s.ecc_uncorrected_volatile,
        )
        f.counter(
            P + "gpu_ecc_errors",
            ecc,
            {**lb, "type": "corrected", "scope": "aggregate"},
            s.ecc_corrected_aggregate,
        )
        f.counter(
            P + "gpu_ecc_errors",
            ecc,
            {**lb, "type": "uncorrected", "scope": "aggregate"},
            s.ecc_uncorrected_aggregate,
        )
        rows = "Rows remapped for memory errors, by error type."
        f.counter(P + "gpu_remapped_rows", rows, {**lb, "type": "correctable"}, s.remapped_rows_correctable)
        f.counter(
            P + "gpu_remapped_rows", rows, {**lb, "type": "uncorrectable"}, s.remapped_rows_uncorrectable
        )
        f.gauge(
            P + "gpu_remapped_rows_pending",
            "1 when a row remap waits for a GPU reset.",
            lb,
            _bool(s.remapped_rows_pending),
        )
        f.gauge(
            P + "gpu_remapped_rows_failure", "1 when a row remap failed.", lb, _bool(s.remapped_rows_failure)
        )
        f.gauge(P + "gpu_processes", "Compute processes running on the GPU.", lb, len(s.processes))
        for link in s.nvlinks:
            ll = {**base, "link": str(link.link)}
            f.gauge(P + "nvlink_up", "1 when the NVLink link is active.", ll, float(link.active))
            for kind, value in zip(
                NVLINK_ERRORS,
                (link.crc_flit_errors, link.crc_data_errors, link.replay_errors, link.recovery_errors),
                strict=True,
            ):
                f.counter(
                    P + "nvlink_errors",
                    "NVLink errors by type since the driver loaded.",
                    {**ll, "type": kind},
                    value,
                )
            f.counter(P + "nvlink_transmitted_bytes", "Bytes sent on the link.", ll, link.tx_bytes)
            f.counter(P + "nvlink_received_bytes", "Bytes received on the link.", ll, link.rx_bytes)
    if view.sharing is not None:
        _sharing(f, base, view.sharing, with_utilization=True)
    for mig in view.migs:
        _mig(f, g.index, mig)


def _sharing(f: Families, base: dict[str, str], sh: Sharing, *, with_utilization: bool) -> None:
    f.gauge(
        P + "device_replicas",
        "Replicas (time-slicing / MPS shares) the kubelet can allocate.",
        base,
        sh.replicas,
    )
    f.gauge(P + "device_replicas_allocated", "Replicas held by containers now.", base, sh.allocated)
    f.gauge(
        P + "device_pod_split",
        "1 when per-pod values of a shared device come from its processes.",
        base,
        float(sh.split),
    )
    if not sh.split:
        return
    for share in sh.shares:
        pl = {
            **base,
            "namespace": share.owner.namespace,
            "pod": share.owner.pod,
            "container": share.owner.container,
        }
        if with_utilization:
            f.gauge(
                P + "pod_gpu_utilization_ratio",
                "A pod's part of a shared GPU's utilisation.",
                pl,
                _ratio(share.utilization_percent),
            )
        f.gauge(
            P + "pod_memory_used_bytes",
            "Device memory used by a pod's processes on a shared device.",
            pl,
            share.memory_used_bytes,
        )
        f.gauge(P + "pod_processes", "A pod's processes on a shared device.", pl, share.processes)


def _mig(f: Families, gpu_index: int, mig: MigView) -> None:
    d = mig.device
    base = {
        "gpu": str(gpu_index),
        "uuid": d.uuid,
        "profile": d.profile,
        "gpu_instance_id": str(d.gpu_instance_id),
    }
    f.gauge(
        P + "mig_info",
        "Static facts of a MIG device; value 1.",
        {**base, "parent_uuid": d.parent_uuid, "compute_instance_id": str(d.compute_instance_id)},
        1,
    )
    f.gauge(
        P + "device_healthy",
        "1 when the device is healthy as the device plugin reports it to kubelet.",
        {"gpu": str(gpu_index), "uuid": d.uuid},
        _bool(mig.healthy),
    )
    lb = {**base, **owner_labels(mig.owners)}
    s = mig.sample
    total = d.memory_bytes if s is None or s.memory_total_bytes is None else s.memory_total_bytes
    f.gauge(P + "mig_memory_total_bytes", "MIG device memory in total.", lb, total)
    if s is not None:
        f.gauge(P + "mig_memory_used_bytes", "MIG device memory in use.", lb, s.memory_used_bytes)
        f.gauge(
            P + "mig_memory_free_bytes",
            "MIG device memory free.",
            lb,
            None if s.memory_used_bytes is None else max(0, total - s.memory_used_bytes),
        )
        f.gauge(P + "mig_processes", "Compute processes running on the MIG device.", lb, len(s.processes))
    if mig.sharing is not None:
        _sharing(f, {"gpu": str(gpu_index), "uuid": d.uuid}, mig.sharing, with_utilization=False)


def render_agent(
    f: Families, snap: MetricsSnapshot, agent: AgentStats, scrapes: ScrapeStats, version: str
) -> None:
    """The agent's self-metrics (both formats publish them)."""
    f.gauge(
        P + "build_info",
        "Version of the agent and of its Python; value 1.",
        {"version": version, "python_version": platform.python_version()},
        1,
    )
    f.gauge(
        P + "discovery_duration_seconds",
        "Duration of the last hardware discovery.",
        {},
        agent.discovery_duration_seconds,
    )
    f.counter(
        P + "plugin_registrations",
        "Successful device-plugin registrations with kubelet.",
        {},
        agent.registrations,
    )
    for resource, registered in agent.registered:
        f.gauge(
            P + "plugin_registered",
            "1 while the resource's device plugin is registered with kubelet.",
            {"resource": resource},
            float(registered),
        )
    f.counter(P + "kubelet_restarts", "Kubelet restarts the agent noticed.", {}, agent.kubelet_restarts)
    if agent.imex_daemon_status is not None:
        for status in ImexDaemonStatus:
            f.gauge(
                P + "imex_daemon_status",
                "The node's IMEX daemon as nvidia-imex-ctl -q reports it (1 for the current status; "
                "NOT_INSTALLED when there is none).",
                {"status": status.value},
                float(status.value == agent.imex_daemon_status),
            )
    r = snap.refresh
    f.gauge(
        P + "nvml_up",
        "1 when NVML answered the last refresh, 0 when it is unusable.",
        {},
        0.0 if r.nvml_problem is not None else 1.0,
    )
    for code, count in r.nvml_errors:
        f.counter(P + "nvml_errors", "NVML calls that failed, by NVML error code.", {"code": code}, count)
    f.counter(P + "metrics_refreshes", "Background refreshes of the metrics cache.", {}, r.refreshes)
    f.gauge(
        P + "metrics_refresh_duration_seconds", "Duration of the last refresh.", {}, r.last_duration_seconds
    )
    f.gauge(P + "metrics_refresh_timestamp_seconds", "Unix time of the last refresh.", {}, r.last_unix)
    f.summary(
        P + "metrics_scrape_duration_seconds",
        "Time spent rendering /metrics (previous scrapes).",
        {},
        scrapes.count,
        scrapes.total_seconds,
    )
    if r.podresources_up is not None:
        f.gauge(
            P + "podresources_up",
            "1 when the last pod-resources refresh succeeded.",
            {},
            float(r.podresources_up),
        )
        f.counter(P + "podresources_errors", "Failed pod-resources refreshes.", {}, r.podresources_errors)
        f.gauge(
            P + "podresources_last_success_timestamp_seconds",
            "Unix time of the last successful pod-resources refresh.",
            {},
            r.podresources_last_success_unix,
        )
        f.gauge(P + "podresources_pods", "Pods the kubelet listed at the last refresh.", {}, r.pods_listed)


class SnapshotCollector(Collector):
    """A ``Collector`` that renders the latest snapshot on each scrape (fresh families every time)."""

    def __init__(
        self,
        *,
        render: Callable[[MetricsSnapshot, AgentStats, ScrapeStats, str], Iterable[Metric]],
        snapshot: Callable[[], MetricsSnapshot],
        agent_stats: Callable[[], AgentStats],
        scrape_stats: Callable[[], ScrapeStats],
        version: str,
    ) -> None:
        self._render = render
        self._snapshot = snapshot
        self._agent_stats = agent_stats
        self._scrape_stats = scrape_stats
        self._version = version

    def collect(self) -> Iterator[Metric]:
        yield from self._render(self._snapshot(), self._agent_stats(), self._scrape_stats(), self._version)

    def describe(self) -> Iterable[Metric]:
        return ()
