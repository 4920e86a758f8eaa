"""The project's vocabulary: frozen dataclasses for what a node has and how it is wired.

Words (one per concept):
- *gpu*: a physical GPU, identified by its NVML index and its ``GPU-…`` UUID.
- *mig device*: a MIG slice of a gpu (``MIG-…`` UUID).
- *device*: what kubelet allocates (a gpu, a mig device or a replica).
- *replica*: a time-slice or MPS share of a gpu (``<uuid>::<n>``).
- *domain*: a group of nodes at one *tier* (``nvlink`` = tier 1, ``leaf``, ``spine``, ``core``).

This module imports nothing of ours. Sizes are bytes; bandwidths Gb/s; "not supported" is ``None``.
``NodeInventory.to_dict`` is the stable JSON/YAML schema of ``discover`` and of the ``GPUNode`` status.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

SCHEMA_VERSION = "v1"
# the extended resource of a whole GPU (kubelet device plugin, scheduler requests): written here only
GPU_RESOURCE = "nvidia.com/gpu"

TIERS: tuple[str, ...] = ("nvlink", "leaf", "spine", "core")
"""Tier names in order: index 0 is tier 1."""


def tier_number(name: str) -> int:
    """Tier number (1-based) of a tier name; raises ``ValueError`` naming the valid ones."""
    try:
        return TIERS.index(name) + 1
    except ValueError:
        raise ValueError(f"unknown tier {name!r}; valid: {', '.join(TIERS)}") from None


class LinkLevel(enum.StrEnum):
    """A cell of the GPU connectivity matrix, with ``nvidia-smi topo -m`` meaning.

    ``NV`` cells carry the link count separately (``Connection.nvlinks``).
    Ordered best first: lower rank means a closer pair.
    """

    SELF = "X"
    NVLINK = "NV"
    PIX = "PIX"  # at most one PCIe bridge
    PXB = "PXB"  # several PCIe bridges, no host bridge
    PHB = "PHB"  # through a PCIe host bridge (CPU)
    NODE = "NODE"  # across host bridges inside one NUMA node
    SYS = "SYS"  # across the inter-socket link

    @property
    def rank(self) -> int:
        return _LEVEL_RANK[self]


_LEVEL_RANK = {
    LinkLevel.SELF: 0,
    LinkLevel.NVLINK: 1,
    LinkLevel.PIX: 2,
    LinkLevel.PXB: 3,
    LinkLevel.PHB: 4,
    LinkLevel.NODE: 5,
    LinkLevel.SYS: 6,
}


class RemoteDeviceType(enum.StrEnum):
    GPU = "GPU"
    IBMNPU = "IBMNPU"
    SWITCH = "SWITCH"
    UNKNOWN = "UNKNOWN"


class FabricState(enum.StrEnum):
    NOT_SUPPORTED = "NOT_SUPPORTED"
    NOT_STARTED = "NOT_STARTED"
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"


class FabricHealthSummary(enum.StrEnum):
    NOT_SUPPORTED = "NOT_SUPPORTED"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    LIMITED_CAPACITY = "LIMITED_CAPACITY"


class Health(enum.StrEnum):
    """Health of a device as kubelet sees it (device-plugin API strings)."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


# --------------------------------------------------------------------------- host, driver


@dataclass(frozen=True, slots=True)
class NumaNode:
    id: int
    cpus: str  # Linux list syntax, e.g. "0-55,112-167"; "" for memory-only nodes
    memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Host:
    name: str
    cpu_count: int
    memory_bytes: int
    numa_nodes: tuple[NumaNode, ...] = ()
    kernel: str | None = None
    system_uuid: str | None = None


@dataclass(frozen=True, slots=True)
class Driver:
    driver_version: str  # e.g. "580.126.20"
    nvml_version: str  # e.g. "13.580.126.20"
    cuda_driver_version: int  # NVML's integer form, e.g. 13000 for 13.0

    @property
    def cuda_major(self) -> int:
        return self.cuda_driver_version // 1000

    @property
    def cuda_minor(self) -> int:
        return (self.cuda_driver_version % 1000) // 10

    @property
    def driver_major(self) -> int:
        return int(self.driver_version.split(".")[0])


# --------------------------------------------------------------------------- GPUs


@dataclass(frozen=True, slots=True)
class PlatformInfo:
    """``nvmlDeviceGetPlatformInfo`` (GB200-class trays); ``None`` where not supported."""

    chassis_serial: str
    slot_number: int
    tray_index: int
    host_id: int
    module_id: int
    peer_type: int | None = None
    ib_guid: str | None = None


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str  # "GPU-…"
    name: str  # "NVIDIA H100 80GB HBM3"
    serial: str | None
    pci_bus_id: str  # NVML form "00000000:1B:00.0"
    minor_number: int | None
    memory_total_bytes: int
    compute_capability: tuple[int, int]
    architecture: str  # "hopper", "blackwell", …
    numa_node: int | None
    cpu_affinity: str | None  # Linux list syntax
    persistence_mode: bool | None
    compute_mode: str | None  # "DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED"
    pci_device_id: int | None = None
    brand: str | None = None
    power_limit_watts: float | None = None
    nvlink_count: int = 0  # active + inactive links the API reports
    mig_capable: bool = False
    platform: PlatformInfo | None = None
    lost: bool = False  # NVML said GPU_IS_LOST (or similar) during discovery
    error: str | None = None  # what failed while discovering this GPU, for the operator

    @property
    def memory_total_mib(self) -> int:
        return self.memory_total_bytes // (1024 * 1024)


# --------------------------------------------------------------------------- MIG


@dataclass(frozen=True, slots=True)
class GpuInstance:
    gpu_index: int
    id: int
    profile_id: int  # the "-lgip" id (19 for 1g, 9 for 3g, …)
    profile: str  # "3g.40gb"
    placement_start: int
    placement_size: int


@dataclass(frozen=True, slots=True)
class ComputeInstance:
    gpu_index: int
    gpu_instance_id: int
    id: int
    profile_id: int
    slice_count: int


@dataclass(frozen=True, slots=True)
class MigDevice:
    uuid: str  # "MIG-…"
    parent_uuid: str
    parent_index: int
    index: int  # NVML MIG device index within the parent
    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # "1g.10gb"
    gpu_slices: int  # compute slices of the GPU instance
    memory_slices: int  # memory slices (placement size)
    compute_slices: int  # compute-instance slices
    memory_bytes: int
    sm_count: int | None = None


@dataclass(frozen=True, slots=True)
class MigState:
    gpu_index: int
    current_enabled: bool
    pending_enabled: bool
    gpu_instances: tuple[GpuInstance, ...] = ()
    compute_instances: tuple[ComputeInstance, ...] = ()
    devices: tuple[MigDevice, ...] = ()


# --------------------------------------------------------------------------- MPS


@dataclass(frozen=True, slots=True)
class MpsGpuLimits:
    gpu_uuid: str
    active_thread_percentage: int | None = None
    pinned_memory_limit_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class MpsInfo:
    daemon_running: bool
    pipe_directory: str | None
    gpus: tuple[MpsGpuLimits, ...] = ()


# --------------------------------------------------------------------------- NVLink, matrix


@dataclass(frozen=True, slots=True)
class NvLink:
    gpu_index: int
    link: int
    active: bool
    version: int | None  # NVLink generation (2.0, 3.0 … as the integer 2, 3, 4, 5)
    remote_type: RemoteDeviceType | None
    remote_pci_bus_id: str | None
    remote_gpu_index: int | None  # set when the remote is one of this node's GPUs


@dataclass(frozen=True, slots=True)
class Connection:
    level: LinkLevel
    nvlinks: int = 0  # active links between the pair (direct or through NVSwitch)

    def __str__(self) -> str:
        if self.level is LinkLevel.NVLINK:
            return f"NV{self.nvlinks}"
        return self.level.value

    @classmethod
    def parse(cls, cell: str) -> Connection:
        if cell.startswith("NV") and cell[2:].isdigit():
            return cls(LinkLevel.NVLINK, int(cell[2:]))
        return cls(LinkLevel(cell))


@dataclass(frozen=True, slots=True)
class ConnectivityMatrix:
    """GPU-pair connectivity with ``nvidia-smi topo -m`` semantics, indexed by GPU index order."""

    gpu_indices: tuple[int, ...]
    cells: tuple[tuple[str, ...], ...]  # "X", "NV18", "PIX", …

    def connection(self, a: int, b: int) -> Connection:
        i = self.gpu_indices.index(a)
        j = self.gpu_indices.index(b)
        return Connection.parse(self.cells[i][j])


# --------------------------------------------------------------------------- fabric


@dataclass(frozen=True, slots=True)
class FabricHealth:
    """``healthMask`` decoded; each flag is ``None`` where the driver does not report it."""

    degraded_bandwidth: bool | None = None
    route_recovery_in_progress: bool | None = None
    route_unhealthy: bool | None = None
    access_timeout_recovery: bool | None = None
    incorrect_configuration: str | None = None  # "NONE", "INCORRECT_SYSGUID", …
    partition_assigned: bool | None = None
    gfm_connected: bool | None = None


@dataclass(frozen=True, slots=True)
class FabricInfo:
    gpu_index: int
    cluster_uuid: str  # UUID string; all zeros where there is no multi-node fabric
    clique_id: int
    state: FabricState
    status: str  # "SUCCESS" or the NVML error name; meaningful when COMPLETED
    health_mask: int | None
    health: FabricHealth
    health_summary: FabricHealthSummary

    @property
    def clique(self) -> str:
        """The GFD label value ``<clusterUUID>.<cliqueId>``."""
        return f"{self.cluster_uuid}.{self.clique_id}"

    @property
    def multi_node(self) -> bool:
        return self.cluster_uuid.strip("0-") != ""


# --------------------------------------------------------------------------- InfiniBand


@dataclass(frozen=True, slots=True)
class IbPort:
    device: str  # "mlx5_0"
    port: int
    state: str  # "ACTIVE"
    physical_state: str  # "LinkUp"
    rate_gbps: float
    link_layer: str  # "InfiniBand" / "Ethernet"
    node_guid: str  # "0x58a2e103002a09b8"
    port_guid: str | None
    sys_image_guid: str | None
    numa_node: int | None
    pci_address: str | None  # sysfs form "0000:18:00.0"
    netdev: str | None = None
    hca_type: str | None = None
    firmware: str | None = None
    lid: int | None = None
    switch_guid: str | None = None  # the switch this port cables to, where obtainable


# --------------------------------------------------------------------------- the inventory


@dataclass(frozen=True, slots=True)
class NodeInventory:
    host: Host
    driver: Driver | None
    gpus: tuple[Gpu, ...] = ()
    mig: tuple[MigState, ...] = ()
    mps: MpsInfo | None = None
    nvlinks: tuple[NvLink, ...] = ()
    matrix: ConnectivityMatrix | None = None
    fabric: tuple[FabricInfo, ...] = ()
    ib: tuple[IbPort, ...] = ()
    errors: tuple[str, ...] = field(default=())  # node-level problems seen during discovery

    def gpu(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(f"no GPU with index {index}")

    def mig_devices(self) -> tuple[MigDevice, ...]:
        return tuple(d for state in self.mig for d in state.devices)

    def to_dict(self) -> dict[str, Any]:
        """The stable schema (``schema`` key plus the inventory's fields)."""
        out: dict[str, Any] = {"schema": SCHEMA_VERSION}
        out.update(to_plain(self))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeInventory:
        # ``discover``'s output puts the node's IMEX daemon status beside the inventory, under "imex"
        body = {k: v for k, v in data.items() if k not in ("schema", "imex")}
        return from_plain(cls, body)


# --------------------------------------------------------------------------- plain-data conversion

T = TypeVar("T")


def to_plain(value: Any) -> Any:
    """Dataclasses, enums and tuples to JSON-ready dicts, strings and lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    return value


def from_plain(cls: type[T], data: Any) -> T:
    """Inverse of :func:`to_plain` for the dataclasses of this module; raises ``ValueError``
    naming the field path on a shape mismatch."""
    return typing.cast(T, _convert(cls, data, cls.__name__))


def _convert(tp: Any, data: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if data is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, data, path)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(errors[0] if errors else f"{path}: unexpected null")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(data, list | tuple):
            raise ValueError(f"{path}: expected a list, got {type(data).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(data))
        if len(args) != len(data):
            raise ValueError(f"{path}: expected {len(args)} items, got {len(data)}")
        return tuple(_convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, data, strict=True)))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: expected an object, got {type(data).__name__}")
        hints = typing.get_type_hints(tp)
        kwargs = {}
        names = {f.name for f in dataclasses.fields(tp)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}")
        for f in dataclasses.fields(tp):
            if f.name in data:
                kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{path}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{path}.{f.name}: missing")
        return tp(**kwargs)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            valid = ", ".join(str(m.value) for m in tp)
            raise ValueError(f"{path}: {data!r} is not one of {valid}") from None
    if tp is float:
        if isinstance(data, int | float) and not isinstance(data, bool):
            return float(data)
        raise ValueError(f"{path}: expected a number, got {type(data).__name__}")
    if tp in (int, str, bool):
        if isinstance(data, tp) and not (tp is int and isinstance(data, bool)):
            return data
        raise ValueError(f"{path}: expected {tp.__name__}, got {type(data).__name__}")
    if tp is Any:
        return data
    raise ValueError(f"{path}: unsupported type {tp!r}")
