"""The metrics cache: a background refresher that reads NVML in bulk and builds the next snapshot.

Each refresh (every ``interval_s``, default 10 s) reads, in a worker thread, one ``sample`` per GPU
(the backends use bulk field reads), fabric info where the GPU has a fabric, one ``mig_sample`` per
MIG device and, for shared GPUs only, per-process utilisation; maps the processes of shared devices
to pods; and combines that with the latest pod-resources snapshot, device health and XID counts into
a frozen :class:`~agent.metrics.snapshot.MetricsSnapshot`. Scrapes only read the last snapshot.

NVML failing as a whole (library/driver version mismatch after a driver upgrade, driver unloaded,
NVML not initialised) is reported by :meth:`MetricsCache.nvml_problem`, which ``/readyz`` uses; one GPU
failing only marks that GPU (``gpuagent_gpu_sample_ok 0``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from agent.metrics.attribution import Attribution, DeviceResolver, PodOfProcess, attribute, sharing
from agent.metrics.procmap import ProcessPodMapper
from agent.metrics.snapshot import GpuView, MetricsSnapshot, MigView, RefreshStats
from agent.nvml.errors import NVMLError
from agent.nvml.protocol import EventKind, GpuSample, MigSample, NvmlBackend, NvmlEvent, ProcessUtilization
from agent.podresources.cache import PodResourcesStats
from agent.podresources.model import EMPTY, PodResourcesSnapshot
from topology import logs
from topology.lifecycle import sleep_until
from topology.model import FabricInfo, Gpu, NodeInventory

# NVML codes after which NVML as a whole is unusable (not one GPU): UNINITIALIZED, DRIVER_NOT_LOADED,
# LIBRARY_NOT_FOUND, LIB_RM_VERSION_MISMATCH.
FATAL_CODES = frozenset({1, 9, 12, 18})

# Codes that are answers, not failures: an event wait that saw no event, a query the GPU does not support.
_NOT_ERRORS = frozenset({"TIMEOUT", "NOT_SUPPORTED"})

_HINTS = {
    18: "the NVIDIA driver changed under the running agent; restart the agent pod (or reboot the node)",
    9: "the NVIDIA kernel driver is not loaded; check the driver installation",
    12: "libnvidia-ml.so is not reachable from the agent container; check the container runtime setup",
    1: "NVML was shut down or never initialised; restart the agent pod",
}


def describe_nvml_problem(exc: NVMLError) -> str:
    hint = _HINTS.get(exc.value, "see the agent log")
    return f"NVML unusable: {exc.name} ({exc}): {hint}"


class XidSource(Protocol):
    """XID counts per GPU and the last XID seen; ``refresh`` is called once per cache refresh."""

    def refresh(self) -> None: ...

    def of(self, gpu_uuid: str) -> tuple[tuple[tuple[int, int], ...], int | None]: ...


class XidCounter:
    """Counts XID events per GPU from an event hook: hand every NVML event to :meth:`record`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, dict[int, int]] = defaultdict(dict)
        self._last: dict[str, int] = {}

    def record(self, event: NvmlEvent) -> None:
        if event.kind is not EventKind.XID or event.xid is None:
            return
        with self._lock:
            per_gpu = self._counts[event.gpu_uuid]
            per_gpu[event.xid] = per_gpu.get(event.xid, 0) + 1
            self._last[event.gpu_uuid] = event.xid

    def refresh(self) -> None:
        """Nothing to do: events arrive through :meth:`record`."""

    def of(self, gpu_uuid: str) -> tuple[tuple[tuple[int, int], ...], int | None]:
        with self._lock:
            counts = tuple(sorted(self._counts.get(gpu_uuid, {}).items()))
            return counts, self._last.get(gpu_uuid)


class CountsXids:
    """XIDs from a table of counts by ``(gpu_uuid, xid)`` kept elsewhere (the run command's
    ``InventoryStore.xid_counts``).

    The last XID of a GPU is inferred at each refresh from the counts that grew since the previous
    one: the XID that grew most (ties: the higher XID number). Like DCGM's sampled
    ``DCGM_FI_DEV_XID_ERRORS``, several XIDs within one refresh interval report one of them.
    """

    def __init__(self, counts: Callable[[], Mapping[tuple[str, int], int]]) -> None:
        self._counts = counts
        self._table: dict[str, dict[int, int]] = {}
        self._last: dict[str, int] = {}

    def refresh(self) -> None:
        table: dict[str, dict[int, int]] = defaultdict(dict)
        for (uuid, xid), count in self._counts().items():
            table[uuid][xid] = count
        for uuid, per_gpu in table.items():
            before = self._table.get(uuid, {})
            grown = [(count - before.get(xid, 0), xid) for xid, count in per_gpu.items()]
            best = max(grown)
            if best[0] > 0:
                self._last[uuid] = best[1]
        self._table = dict(table)

    def of(self, gpu_uuid: str) -> tuple[tuple[tuple[int, int], ...], int | None]:
        return tuple(sorted(self._table.get(gpu_uuid, {}).items())), self._last.get(gpu_uuid)


@dataclass(frozen=True, slots=True)
class Reads:
    """What one refresh read from NVML (and /proc), before it is combined."""

    samples: Mapping[int, GpuSample]
    errors: Mapping[int, str]
    fabric: Mapping[int, FabricInfo]
    migs: Mapping[str, MigSample]
    utilization: Mapping[int, tuple[ProcessUtilization, ...]]
    pods_of_pids: Mapping[int, PodOfProcess]
    problem: str | None = None


def build_snapshot(
    *,
    hostname: str,
    inventory: NodeInventory,
    reads: Reads,
    attribution: Attribution,
    health: Callable[[str], bool | None],
    xids: XidSource,
    refresh: RefreshStats,
) -> MetricsSnapshot:
    """Combines one refresh's reads into a snapshot (pure apart from reading the XID source)."""
    mig_by_gpu = {m.gpu_index: m for m in inventory.mig}
    views: list[GpuView] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        state = mig_by_gpu.get(gpu.index)
        migs = []
        for dev in state.devices if state is not None else ():
            mig_sample = reads.migs.get(dev.uuid)
            migs.append(
                MigView(
                    device=dev,
                    sample=mig_sample,
                    owners=attribution.owners.get(dev.uuid, ()),
                    healthy=health(dev.uuid),
                    sharing=sharing(
                        uuid=dev.uuid,
                        attribution=attribution,
                        processes=mig_sample.processes if mig_sample is not None else (),
                        utilization=None,
                        pods_of_pids=reads.pods_of_pids,
                    ),
                )
            )
        sample = reads.samples.get(gpu.index)
        counts, last = xids.of(gpu.uuid)
        views.append(
            GpuView(
                gpu=gpu,
                sample=sample,
                error=reads.errors.get(gpu.index),
                mig_enabled=None if state is None else state.current_enabled,
                fabric=reads.fabric.get(gpu.index),
                healthy=False if gpu.lost else health(gpu.uuid),
                xid_counts=counts,
                last_xid=last,
                owners=attribution.owners.get(gpu.uuid, ()),
                sharing=sharing(
                    uuid=gpu.uuid,
                    attribution=attribution,
                    processes=sample.processes if sample is not None else (),
                    utilization=reads.utilization.get(gpu.index, ()),
                    pods_of_pids=reads.pods_of_pids,
                ),
                migs=tuple(migs),
            )
        )
    return MetricsSnapshot(
        hostname=hostname,
        driver_version=inventory.driver.driver_version if inventory.driver is not None else None,
        gpus=tuple(views),
        allocations=attribution.allocations,
        refresh=refresh,
    )


def _unknown(uuid: str) -> bool | None:
    return None


class MetricsCache:
    def __init__(
        self,
        *,
        backend: NvmlBackend,
        inventory: Callable[[], NodeInventory],
        hostname: str,
        interval_s: float = 10.0,
        podresources: Callable[[], tuple[PodResourcesSnapshot, PodResourcesStats]] | None = None,
        device_health: Callable[[str], bool | None] | None = None,
        xids: XidSource | None = None,
        pid_mapper: ProcessPodMapper | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"metrics refresh interval must be > 0 s, got {interval_s}")
        self._backend = backend
        self._inventory = inventory
        self._hostname = hostname
        self.interval_s = interval_s
        self._podresources = podresources
        self._device_health = device_health
        self.xids: XidSource = xids if xids is not None else XidCounter()
        self._pid_mapper = pid_mapper
        self._clock = clock
        self._monotonic = monotonic
        self._snapshot = MetricsSnapshot(hostname=hostname)
        self._resolver: tuple[NodeInventory, DeviceResolver] | None = None
        self._problem: str | None = "waiting for the first NVML refresh"
        self._refreshes = 0
        self._known: dict[int, Gpu] = {}  # last identity of each GPU index that answered
        self._log = logs.get_logger("agent.metrics").bind(node=hostname)

    def snapshot(self) -> MetricsSnapshot:
        return self._snapshot

    def nvml_problem(self) -> str | None:
        """Why NVML is unusable (readiness fails with it), or ``None``."""
        return self._problem

    def _remember_lost(self, inventory: NodeInventory) -> NodeInventory:
        """Discovery lists a GPU that fell off the bus as a placeholder without identity; put back the
        identity it had when it last answered, so its series (XIDs, health) keep their UUID."""
        patched = []
        for gpu in inventory.gpus:
            known = self._known.get(gpu.index)
            if gpu.lost and not gpu.uuid and known is not None:
                patched.append(dataclasses.replace(known, lost=True, error=gpu.error))
                continue
            if gpu.uuid and not gpu.lost:
                self._known[gpu.index] = gpu
            patched.append(gpu)
        if all(a is b for a, b in zip(patched, inventory.gpus, strict=True)):
            return inventory
        return dataclasses.replace(inventory, gpus=tuple(patched))

    def _resolver_for(self, inventory: NodeInventory) -> DeviceResolver:
        if self._resolver is None or self._resolver[0] is not inventory:
            self._resolver = (inventory, DeviceResolver(inventory))
        return self._resolver[1]

    def _read(self, inventory: NodeInventory, shared: frozenset[int], shared_uuids: frozenset[str]) -> Reads:
        samples: dict[int, GpuSample] = {}
        errors: dict[int, str] = {}
        fabric: dict[int, FabricInfo] = {}
        migs: dict[str, MigSample] = {}
        utilization: dict[int, tuple[ProcessUtilization, ...]] = {}
        problem: str | None = None
        has_fabric = {f.gpu_index for f in inventory.fabric}
        mig_devices = inventory.mig_devices()
        for gpu in sorted(inventory.gpus, key=lambda g: g.index):
            if gpu.lost:
                errors[gpu.index] = "GPU lost at discovery"
                continue
            try:
                samples[gpu.index] = self._backend.sample(gpu.index)
                if gpu.index in has_fabric:
                    info = self._backend.fabric(gpu.index)
                    if info is not None:
                        fabric[gpu.index] = info
                if gpu.index in shared:
                    utilization[gpu.index] = self._backend.process_utilization(gpu.index)
                for dev in mig_devices:
                    if dev.parent_index == gpu.index:
                        migs[dev.uuid] = self._backend.mig_sample(dev.uuid)
            except NVMLError as exc:
                errors[gpu.index] = f"{exc.name}: {exc}"
                if exc.value in FATAL_CODES and problem is None:
                    problem = describe_nvml_problem(exc)
        pids: set[int] = set()
        if self._pid_mapper is not None:
            for index in shared:
                if index in samples:
                    pids.update(p.pid for p in samples[index].processes)
            for uuid in shared_uuids:
                if uuid in migs:
                    pids.update(p.pid for p in migs[uuid].processes)
        pods = self._pid_mapper.map(pids) if self._pid_mapper is not None and pids else {}
        return Reads(samples, errors, fabric, migs, utilization, pods, problem)

    async def refresh(self) -> MetricsSnapshot:
        started = self._monotonic()
        raw = self._inventory()
        inventory = self._remember_lost(raw)
        pr_snap, pr_stats = self._podresources() if self._podresources is not None else (EMPTY, None)
        attribution = attribute(pr_snap, self._resolver_for(raw))  # keyed on discovery's own object
        shared_uuids = frozenset(attribution.replica_holders)
        shared = frozenset(g.index for g in inventory.gpus if g.uuid in shared_uuids)
        reads = await asyncio.to_thread(self._read, inventory, shared, shared_uuids)
        if reads.problem != self._problem:
            if reads.problem is not None:
                self._log.error("nvml_unusable", reason=reads.problem)
            elif self._refreshes > 0:
                self._log.info("nvml_usable_again")
        self._problem = reads.problem
        for index, error in sorted(reads.errors.items()):
            self._log.debug("gpu_sample_failed", index=index, error=error)
        self._refreshes += 1
        counters = self._backend.counters()
        self.xids.refresh()
        refresh = RefreshStats(
            refreshes=self._refreshes,
            last_duration_seconds=self._monotonic() - started,
            last_unix=self._clock(),
            nvml_errors=tuple(
                sorted((k, v) for k, v in counters.errors_by_code.items() if k not in _NOT_ERRORS)
            ),
            nvml_problem=reads.problem,
            podresources_up=None
            if pr_stats is None
            else pr_stats.last_error is None and pr_stats.refreshes > 0,
            podresources_errors=0 if pr_stats is None else pr_stats.errors,
            podresources_last_success_unix=None if pr_stats is None else pr_stats.last_success_unix,
            pods_listed=pr_snap.pods_listed,
        )
        self._snapshot = build_snapshot(
            hostname=self._hostname,
            inventory=inventory,
            reads=reads,
            attribution=attribution,
            health=self._device_health if self._device_health is not None else _unknown,
            xids=self.xids,
            refresh=refresh,
        )
        return self._snapshot

    async def refresh_guarded(self) -> bool:
        """One :meth:`refresh` that never raises: a failure is logged and the last snapshot stays.
        Every refresh of the running exporter goes through here, the first one included."""
        try:
            await self.refresh()
        except Exception as exc:  # one bad refresh must not end the exporter, nor the agent
            self._log.exception("metrics_refresh_failed", error=str(exc))
            return False
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.refresh_guarded()
            await sleep_until(stop, self.interval_s)
