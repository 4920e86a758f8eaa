"""The narrow NVML interface the project uses, and the plain data it returns.

One implementation: ``agent.nvml.real.RealNvml``, over the real ``pynvml`` or over the embedded
simulator's pynvml face (``agent.nvml.fake.SimulatedNvml`` answers through it). It raises
``agent.nvml.errors.NVMLError`` subclasses for real failures (GPU lost, uninitialized, library/driver
mismatch, …) and returns ``None`` (or an empty tuple) where the hardware says "not supported": callers
never catch ``NVMLError_NotSupported``.

Per-GPU calls take the NVML index. MIG devices are addressed by their ``MIG-…`` UUID.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from topology.model import (
    Driver,
    FabricInfo,
    Gpu,
    LinkLevel,
    MigState,
    NvLink,
)

XID_CRITICAL_EVENT = 0x8


class EventKind(enum.StrEnum):
    XID = "xid"  # nvmlEventTypeXidCriticalError; ``xid`` holds the number
    ECC_DBE = "ecc_dbe"  # nvmlEventTypeDoubleBitEccError
    ECC_SBE = "ecc_sbe"  # nvmlEventTypeSingleBitEccError
    GPU_LOST = "gpu_lost"  # a wait or query answered GPU_IS_LOST for this GPU
    GPU_UNAVAILABLE = "gpu_unavailable"  # nvmlEventTypeGpuUnavailableError
    MIG_CONFIG_CHANGE = "mig_config_change"  # nvmlEventMigConfigChange
    RECOVERY_ACTION = "recovery_action"  # nvmlEventTypeGpuRecoveryAction


@dataclass(frozen=True, slots=True)
class NvmlEvent:
    kind: EventKind
    gpu_index: int
    gpu_uuid: str
    xid: int | None = None
    gpu_instance_id: int | None = None  # None: not MIG-specific (NVML's 0xFFFFFFFF)
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    pid: int
    used_memory_bytes: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class NvLinkCounters:
    link: int
    active: bool
    tx_bytes: int | None = None
    rx_bytes: int | None = None
    crc_flit_errors: int | None = None
    crc_data_errors: int | None = None
    replay_errors: int | None = None
    recovery_errors: int | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One read of a GPU's changing values (bulk field reads where the backend can).

    Every field is ``None`` where not supported; counters are monotonic since driver load.
    """

    gpu_index: int
    gpu_utilization_percent: int | None = None
    memory_utilization_percent: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: int | None = None
    memory_temperature_celsius: int | None = None
    power_watts: float | None = None
    energy_joules: float | None = None  # total since driver load
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    throttle_reasons: int | None = None  # NVML clocks-event reasons bitmask
    pcie_replays: int | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    nvlinks: tuple[NvLinkCounters, ...] = ()
    processes: tuple[ProcessInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class HealthReading:
    """What the health probe reads of one GPU (one identity query and one bulk field read): who answers
    at the index, and the counters that say whether it needs a reset. ``None`` where not supported."""

    uuid: str
    ecc_corrected_volatile: int | None = None  # since the last driver load or GPU reset
    ecc_uncorrected_volatile: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    retired_pages_pending: bool | None = None


@dataclass(frozen=True, slots=True)
class MigSample:
    uuid: str
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    processes: tuple[ProcessInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class ProcessUtilization:
    pid: int
    sm_percent: int
    memory_percent: int


@dataclass(frozen=True, slots=True)
class NvmlCounters:
    """Calls and errors seen by a backend, for the agent's self-metrics."""

    calls: int = 0
    errors_by_code: dict[str, int] = field(default_factory=dict)


@runtime_checkable
class NvmlBackend(Protocol):
    """What discovery, health, the device plugin and metrics need from NVML."""

    def init(self) -> None:
        """nvmlInit; raises DriverNotLoaded / LibraryNotFound / NoPermission."""

    def shutdown(self) -> None: ...

    def driver(self) -> Driver: ...

    def device_count(self) -> int: ...

    def gpu(self, index: int) -> Gpu:
        """Identity and static facts; raises GpuIsLost for a GPU that fell off the bus."""
        ...

    def nvlinks(self, index: int) -> tuple[NvLink, ...]:
        """Every link the API reports (iterate until INVALID_ARGUMENT / NOT_SUPPORTED);
        ``remote_gpu_index`` is left ``None`` (discovery resolves it). Empty without NVLink."""
        ...

    def pcie_level(self, a: int, b: int) -> LinkLevel | None:
        """``nvmlDeviceGetTopologyCommonAncestor`` as a matrix level (PIX … SYS)."""
        ...

    def mig_state(self, index: int) -> MigState | None:
        """MIG mode, instances and MIG devices; ``None`` when the GPU is not MIG-capable."""
        ...

    def fabric(self, index: int) -> FabricInfo | None:
        """Fabric info via the versioned v3 struct; ``None`` when not supported."""
        ...

    def sample(self, index: int) -> GpuSample:
        """Current changing values of one GPU."""
        ...

    def mig_sample(self, uuid: str) -> MigSample: ...

    def health_reading(self, index: int) -> HealthReading:
        """The health probe's read of one GPU; raises GpuIsLost for a GPU that fell off the bus."""
        ...

    def process_utilization(self, index: int) -> tuple[ProcessUtilization, ...]:
        """Per-process SM/memory utilisation since the last call; empty when not supported."""
        ...

    def register_events(self, indices: tuple[int, ...]) -> None:
        """Create the event set (if needed) and register every supported health event type."""
        ...

    def wait_event(self, timeout_ms: int) -> NvmlEvent | None:
        """Next event, or ``None`` on timeout. A GPU lost while waiting yields a GPU_LOST event."""
        ...

    def take_lost_reports(self) -> tuple[NvmlEvent, ...]:
        """The GPU_LOST events other calls queued for the next wait (a GPU_IS_LOST answer to the metrics
        refresh, discovery, ...), taken now without waiting and without calling NVML, so a caller
        whose waits fail still learns of them; the next wait returns none of these."""
        ...

    def counters(self) -> NvmlCounters: ...
