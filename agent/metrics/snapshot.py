"""One refresh of everything ``/metrics`` shows, as frozen data (no I/O, no clock)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.nvml.protocol import GpuSample, MigSample
from topology.model import FabricInfo, Gpu, MigDevice


@dataclass(frozen=True, slots=True, order=True)
class Owner:
    """The pod container that holds a device (from the kubelet's pod-resources ``List``)."""

    namespace: str
    pod: str
    container: str


@dataclass(frozen=True, slots=True)
class PodShare:
    """A pod's part of a shared gpu or mig device (replicas ``<uuid>::<n>``).

    ``utilization_percent`` and ``memory_used_bytes`` are the sums over the pod's processes on the
    device; ``None`` where the split is unknown (host PIDs not visible) or not supported.
    """

    owner: Owner
    replicas: tuple[int, ...]
    utilization_percent: float | None = None
    memory_used_bytes: int | None = None
    processes: int = 0


@dataclass(frozen=True, slots=True)
class Sharing:
    """Replica facts of one gpu or mig device."""

    replicas: int | None  # replicas the kubelet can allocate (GetAllocatableResources); None: unknown
    allocated: int  # replica IDs held by containers now
    split: bool  # True when shares carry per-process values; False: values not split (documented rule)
    shares: tuple[PodShare, ...] = ()


@dataclass(frozen=True, slots=True)
class Allocation:
    resource: str
    device_id: str
    uuid: str  # the gpu or mig device behind the ID
    gpu_index: int
    owner: Owner


@dataclass(frozen=True, slots=True)
class MigView:
    device: MigDevice
    sample: MigSample | None
    owners: tuple[Owner, ...] = ()  # exclusive holders (normally one)
    healthy: bool | None = None
    sharing: Sharing | None = None


@dataclass(frozen=True, slots=True)
class GpuView:
    gpu: Gpu
    sample: GpuSample | None  # None when the read failed (``error`` says why)
    error: str | None = None
    mig_enabled: bool | None = None  # None: not MIG-capable
    fabric: FabricInfo | None = None
    healthy: bool | None = None
    xid_counts: tuple[tuple[int, int], ...] = ()  # (xid, events) sorted by xid
    last_xid: int | None = None
    owners: tuple[Owner, ...] = ()  # exclusive holders of the whole gpu (normally one)
    sharing: Sharing | None = None
    migs: tuple[MigView, ...] = ()


@dataclass(frozen=True, slots=True)
class AgentStats:
    """The agent's own figures, from the components that own them (injected by ``run``)."""

    discovery_duration_seconds: float | None = None
    registrations: int | None = None  # successful device-plugin registrations with kubelet, all resources
    registered: tuple[tuple[str, bool], ...] = ()  # (resource, registered now)
    kubelet_restarts: int | None = None
    imex_daemon_status: str | None = None  # agent.imex.ImexDaemonStatus value; None: not read yet


@dataclass(frozen=True, slots=True)
class RefreshStats:
    refreshes: int = 0
    last_duration_seconds: float | None = None
    last_unix: float | None = None
    nvml_errors: tuple[tuple[str, int], ...] = ()  # (code name, count) sorted
    nvml_problem: str | None = None  # why NVML is unusable, None when it works
    podresources_up: bool | None = None  # None: attribution disabled
    podresources_errors: int = 0
    podresources_last_success_unix: float | None = None
    pods_listed: int = 0


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    hostname: str
    driver_version: str | None = None
    gpus: tuple[GpuView, ...] = ()
    allocations: tuple[Allocation, ...] = ()
    refresh: RefreshStats = field(default_factory=RefreshStats)


EMPTY_SNAPSHOT = MetricsSnapshot(hostname="")
