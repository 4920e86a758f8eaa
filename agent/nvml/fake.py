"""The embedded NVML simulator: a stateful machine model that behaves like a driver under pynvml.

``SimulatedNvml`` holds a machine preset's state (``agent.nvml.profiles``) in three layers:

- *primitives* named after the NVML calls they stand for (``device_get_name``,
  ``device_get_nvlink_state`` …), addressed by GPU index. They raise ``agent.nvml.errors`` exactly where
  real NVML fails: ``Uninitialized`` before ``nvml_init``, ``InvalidArgument`` for an index or NVLink
  index out of range, ``GpuIsLost`` for a GPU that fell off the bus, ``NotSupported`` where the hardware
  says so, ``NotFound`` for an empty MIG slot, ``Timeout`` from an event wait. Tests of error handling
  can force any code on any primitive — or on any pynvml function of the face — with ``inject_error``.
- the *pynvml face* (``sim.pynvml``, :class:`agent.nvml.face.SimulatedPynvml`): pynvml's functions,
  structs, handle types and ``NVMLError`` subclasses over the primitives;
- the ``NvmlBackend`` methods (``gpu``, ``nvlinks``, ``mig_state`` …): those of ``sim.backend``, the one
  composition :class:`agent.nvml.real.RealNvml` running over the face — the code a real node runs.

Mutations for tests and fault injection: ``lose_gpu``, ``lose_gpu_silently``, ``recover_gpu``,
``reset_gpu``, ``inject_xid``, ``ecc_dbe``, ``ecc_rising``,
``nvlink_down``/``nvlink_up``, ``set_fabric_health``/``set_fabric_state``, ``reconfigure_mig``,
``set_init_error``, ``inject_error``,
``add_process``/``remove_process``. Misuse of a mutation (unknown GPU, invalid MIG layout …) raises
``SimulationError`` and changes nothing.

Changing values are deterministic: a function of the GPU, its load and the time. Time comes from an
injected ``clock`` (seconds); without one, each ``sample()`` of a GPU (one bulk read of its device
fields through the face) advances that GPU's virtual time by one second.

Hot-plug: a GPU lost or recovered emits ``HotplugEvent(action, subsystem, pci_address)`` tuples
(``("remove"|"add", "pci", "0000:1b:00.0")``) to listeners registered with ``add_hotplug_listener``
and to every ``asyncio.Queue`` returned by ``hotplug_events()`` (safe from any thread).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Concatenate, NamedTuple, ParamSpec, TypeVar

from agent.nvml.errors import (
    CODES,
    NVMLError,
    NVMLError_GpuIsLost,
    NVMLError_InsufficientResources,
    NVMLError_InvalidArgument,
    NVMLError_NotFound,
    NVMLError_NotSupported,
    NVMLError_Timeout,
    NVMLError_Uninitialized,
)
from agent.nvml.face import SimulatedPynvml
from agent.nvml.profiles import (
    MIG_COMPUTE_SLICES,
    MIG_MEMORY_SLICES,
    FabricSpec,
    GpuSpec,
    MachineSpec,
    MigProfileSpec,
    det_uuid,
)
from agent.nvml.protocol import (
    EventKind,
    GpuSample,
    HealthReading,
    MigSample,
    NvmlCounters,
    NvmlEvent,
    ProcessInfo,
    ProcessUtilization,
)
from agent.nvml.real import RealNvml
from topology.model import (
    Driver,
    FabricHealthSummary,
    FabricInfo,
    FabricState,
    Gpu,
    LinkLevel,
    MigState,
    NvLink,
    PlatformInfo,
    RemoteDeviceType,
)

P = ParamSpec("P")
R = TypeVar("R")

MIB = 1024 * 1024
NVLINK_MAX_LINKS = 36  # nvidia-ml-py 13.x

# NVML event type bits
EVENT_SBE = 0x1
EVENT_DBE = 0x2
EVENT_PSTATE = 0x4
EVENT_XID = 0x8
EVENT_CLOCK = 0x10
EVENT_MIG_CONFIG_CHANGE = 0x100
EVENT_GPU_UNAVAILABLE = 0x4000
EVENT_RECOVERY_ACTION = 0x8000
HEALTH_EVENT_MASK = EVENT_SBE | EVENT_DBE | EVENT_XID | EVENT_MIG_CONFIG_CHANGE | EVENT_GPU_UNAVAILABLE
HEALTH_EVENT_MASK |= EVENT_RECOVERY_ACTION

_EVENT_BITS: dict[EventKind, int] = {
    EventKind.XID: EVENT_XID,
    EventKind.ECC_DBE: EVENT_DBE,
    EventKind.ECC_SBE: EVENT_SBE,
    EventKind.GPU_UNAVAILABLE: EVENT_GPU_UNAVAILABLE,
    EventKind.MIG_CONFIG_CHANGE: EVENT_MIG_CONFIG_CHANGE,
    EventKind.RECOVERY_ACTION: EVENT_RECOVERY_ACTION,
}

# NVML topology levels (nvmlDeviceGetTopologyCommonAncestor)
TOPOLOGY_LEVELS: dict[LinkLevel, int] = {
    LinkLevel.PIX: 10,
    LinkLevel.PXB: 20,
    LinkLevel.PHB: 30,
    LinkLevel.NODE: 40,
    LinkLevel.SYS: 50,
}
_LEVEL_BY_VALUE = {v: k for k, v in TOPOLOGY_LEVELS.items()}

# NVML_NVLINK_VERSION_* enum -> NVLink generation
NVLINK_GENERATION: dict[int, int] = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
_REMOTE_TYPE_VALUE = {RemoteDeviceType.GPU: 0, RemoteDeviceType.IBMNPU: 1, RemoteDeviceType.SWITCH: 2}
_REMOTE_TYPE_BY_VALUE = {v: k for k, v in _REMOTE_TYPE_VALUE.items()}
ARCHITECTURES = {5: "volta", 6: "turing", 7: "ampere", 8: "ada", 9: "hopper", 10: "blackwell"}
BRANDS = {2: "TESLA", 14: "NVIDIA"}

# fabric
_FABRIC_STATES = {
    0: FabricState.NOT_SUPPORTED,
    1: FabricState.NOT_STARTED,
    2: FabricState.IN_PROGRESS,
    3: FabricState.COMPLETED,
}
_HEALTH_SUMMARIES = {
    0: FabricHealthSummary.NOT_SUPPORTED,
    1: FabricHealthSummary.HEALTHY,
    2: FabricHealthSummary.UNHEALTHY,
    3: FabricHealthSummary.LIMITED_CAPACITY,
}
_SUMMARY_VALUE = {v: k for k, v in _HEALTH_SUMMARIES.items()}
# healthMask for each summary the simulator can be set to (2-bit fields: 1 TRUE, 2 FALSE)
HEALTH_MASKS: dict[FabricHealthSummary, int] = {
    FabricHealthSummary.HEALTHY: 0x1AA,
    FabricHealthSummary.LIMITED_CAPACITY: 0x1A9,  # bandwidth degraded
    FabricHealthSummary.UNHEALTHY: 0x19A,  # route unhealthy
    FabricHealthSummary.NOT_SUPPORTED: 0,
}

_CODE_NAMES = {code: name for name, code in CODES.items()}
FABRIC_INFO_V2 = 0x02000024
FABRIC_INFO_V3 = 0x03000028


class SimulationError(ValueError):
    """A mutation of the simulator was asked for something the machine cannot do."""


class HotplugEvent(NamedTuple):
    action: str  # "remove" | "add"
    subsystem: str  # "pci"
    pci_address: str  # sysfs form "0000:1b:00.0"


@dataclass(frozen=True, slots=True)
class PlacedInstance:
    """A GPU instance with its single full-size compute instance."""

    profile: MigProfileSpec
    gi_id: int
    start: int
    serial: int  # creation number on this GPU (MIG UUIDs change when instances are recreated)

    @property
    def end(self) -> int:
        return self.start + self.profile.placement_size


@dataclass(slots=True)
class _Process:
    pid: int
    used_memory_bytes: int | None
    mig_uuid: str | None
    sm_percent: int


@dataclass(slots=True)
class _GpuState:
    spec: GpuSpec
    lost: bool = False
    link_up: list[bool] = field(default_factory=list)
    nvlink_errors: list[int] = field(default_factory=list)
    mig_enabled: bool = False
    mig_pending: bool = False
    instances: tuple[PlacedInstance, ...] = ()
    next_serial: int = 0
    fabric: FabricSpec | None = None
    ecc_dbe: int = 0  # volatile (since the last driver load / GPU reset)
    ecc_sbe: int = 0
    ecc_dbe_aggregate: int = 0  # lifetime (InfoROM)
    ecc_sbe_aggregate: int = 0
    remapped_pending: bool = False
    lost_silently: bool = False  # lost without an event: event waits do not answer GPU_IS_LOST for it
    xids: list[int] = field(default_factory=list)
    processes: list[_Process] = field(default_factory=list)
    registered_mask: int = 0
    time_s: float = 0.0
    energy_j: float = 0.0
    energy_time_s: float = 0.0
    nvlink_bytes: float = 0.0
    mig_cache: MigState | None = None


def _ci_profile(slices: int) -> int:
    """NVML_COMPUTE_INSTANCE_PROFILE_* of a full-size compute instance with this many slices."""
    return {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}[slices]


def gi_id_for(start: int, size: int) -> int:
    """GPU-instance id the driver gives a placement in NVIDIA's examples (§10.4)."""
    if size == MIG_MEMORY_SLICES:
        return 0
    if size == 4:
        return 1 if start == 4 else 2
    if size == 2:
        return 3 + start // 2
    return 7 + start


def place_instances(
    profiles: Sequence[MigProfileSpec], existing: Sequence[PlacedInstance] = ()
) -> list[tuple[MigProfileSpec, int]] | None:
    """Place GPU instances as the driver does without explicit placements: each in turn at its
    highest free start. Returns ``(profile, start)`` pairs or ``None`` when one does not fit.
    Order matters (creating 1g, 1g, 2g before a 3g fails, as on real A100s)."""
    used = [False] * MIG_MEMORY_SLICES
    counts: Counter[int] = Counter()
    slices = 0
    for inst in existing:
        for s in range(inst.start, inst.end):
            used[s] = True
        counts[inst.profile.id] += 1
        slices += inst.profile.slices
    out: list[tuple[MigProfileSpec, int]] = []
    for prof in profiles:
        if counts[prof.id] >= prof.max_instances or slices + prof.slices > MIG_COMPUTE_SLICES:
            return None
        for start in sorted(prof.starts, reverse=True):
            if not any(used[start : start + prof.placement_size]):
                break
        else:
            return None
        for s in range(start, start + prof.placement_size):
            used[s] = True
        counts[prof.id] += 1
        slices += prof.slices
        out.append((prof, start))
    return out


def plan_layout(profiles: Sequence[MigProfileSpec]) -> list[tuple[MigProfileSpec, int]] | None:
    """A valid placement for a whole layout, as a MIG manager applies it: largest profiles first
    (then the requested order); ``None`` when no valid placement exists this way."""
    ordered = sorted(profiles, key=lambda p: (-p.placement_size, -p.slices))
    return place_instances(ordered)


def _primitive(fn: Callable[Concatenate[SimulatedNvml, P], R]) -> Callable[Concatenate[SimulatedNvml, P], R]:
    """Count the call, apply injected errors, count the error it raises."""
    name = fn.__name__

    def wrapper(self: SimulatedNvml, /, *args: P.args, **kwargs: P.kwargs) -> R:
        self._calls += 1
        try:
            if self._injected:
                self._apply_injected(name, args)
            return fn(self, *args, **kwargs)
        except NVMLError as exc:
            self._errors[_CODE_NAMES.get(exc.value, str(exc.value))] += 1
            raise

    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = fn.__doc__
    return wrapper


@dataclass(frozen=True, slots=True)
class _LostMarker:
    """In an event set's queue: from here on, waits answer GPU_IS_LOST while ``gpu`` is lost."""

    gpu: int


@dataclass(slots=True)
class _EventSet:
    id: int
    registered: dict[int, int] = field(default_factory=dict)  # gpu index -> event mask
    events: deque[NvmlEvent | _LostMarker] = field(default_factory=deque)


@dataclass(slots=True)
class _Injected:
    code: int
    call: str | None
    gpu: int | None
    remaining: int | None


class SimulatedNvml:
    """A simulated machine behind the ``NvmlBackend`` protocol (see module docstring)."""

    def __init__(
        self,
        machine: MachineSpec,
        *,
        clock: Callable[[], float] | None = None,
        missing: Iterable[str] = (),
        platform_info_versions: Iterable[int] = (1, 2),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``missing`` / ``platform_info_versions`` shape the simulated driver library (an older
        driver; see :class:`agent.nvml.face.SimulatedPynvml`); ``sleep`` is the backend's backoff."""
        self.machine = machine
        self._clock = clock
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._init_count = 0
        self._init_error: int | None = None
        self._calls = 0
        self._errors: Counter[str] = Counter()
        self._injected: list[_Injected] = []
        self._event_sets: dict[int, _EventSet] = {}
        self._next_event_set = 1
        self._hotplug_listeners: list[Callable[[HotplugEvent], None]] = []
        self._driver = Driver(
            driver_version=machine.driver_version,
            nvml_version=machine.nvml_version,
            cuda_driver_version=machine.cuda_driver_version,
        )
        self._gpus: list[_GpuState] = []
        self._by_uuid: dict[str, int] = {}
        self._by_mig_uuid: dict[str, tuple[int, PlacedInstance]] = {}
        for spec in machine.gpus:
            state = _GpuState(
                spec=spec,
                link_up=[True] * len(spec.nvlinks),
                nvlink_errors=[0] * len(spec.nvlinks),
                fabric=spec.fabric,
            )
            if spec.mig_layout is not None:
                state.mig_enabled = state.mig_pending = True
                planned = plan_layout([self._profile(spec, name) for name in spec.mig_layout])
                if planned is None:
                    raise SimulationError(
                        f"GPU {spec.index}: preset MIG layout {spec.mig_layout} does not fit"
                    )
                state.instances, state.next_serial = self._instances(planned, 0)
            self._gpus.append(state)
            self._by_uuid[spec.uuid] = spec.index
        self._reindex_mig()
        self._face = SimulatedPynvml(self, missing=missing, platform_info_versions=platform_info_versions)
        self._backend = RealNvml(self._face, sleep=sleep)

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _profile(spec: GpuSpec, name: str) -> MigProfileSpec:
        for prof in spec.mig_profiles:
            if prof.name == name:
                return prof
        valid = ", ".join(p.name for p in spec.mig_profiles) or "none (not MIG-capable)"
        raise SimulationError(f"GPU {spec.index} ({spec.name}): unknown MIG profile {name!r}; valid: {valid}")

    @staticmethod
    def _instances(
        planned: list[tuple[MigProfileSpec, int]], serial: int
    ) -> tuple[tuple[PlacedInstance, ...], int]:
        out = []
        for prof, start in planned:
            out.append(PlacedInstance(prof, gi_id_for(start, prof.placement_size), start, serial))
            serial += 1
        return tuple(sorted(out, key=lambda i: i.gi_id)), serial

    def _mig_uuid(self, state: _GpuState, inst: PlacedInstance) -> str:
        return "MIG-" + det_uuid(state.spec.uuid, "gi", inst.gi_id, "ci", 0, inst.serial)

    def _reindex_mig(self) -> None:
        index: dict[str, tuple[int, PlacedInstance]] = {}
        for state in self._gpus:
            state.mig_cache = None
            if state.mig_enabled:
                for inst in state.instances:
                    index[self._mig_uuid(state, inst)] = (state.spec.index, inst)
        self._by_mig_uuid = index

    def _require_init(self) -> None:
        if self._init_count == 0:
            raise NVMLError_Uninitialized(1)

    def _state(self, index: int) -> _GpuState:
        self._require_init()
        if not 0 <= index < len(self._gpus):
            raise NVMLError_InvalidArgument(2)
        state = self._gpus[index]
        if state.lost:
            raise NVMLError_GpuIsLost(15)
        return state

    def _link(self, index: int, link: int) -> _GpuState:
        state = self._state(index)
        if not state.spec.nvlinks:
            raise NVMLError_NotSupported(3)
        if not 0 <= link < len(state.spec.nvlinks):
            raise NVMLError_InvalidArgument(2)
        return state

    def _apply_injected(self, name: str, args: tuple[object, ...]) -> None:
        gpu = args[0] if args and isinstance(args[0], int) else None
        for rule in list(self._injected):
            if rule.call not in (None, name) or (rule.gpu is not None and rule.gpu != gpu):
                continue
            if rule.remaining is not None:
                rule.remaining -= 1
                if rule.remaining <= 0:
                    self._injected.remove(rule)
            raise NVMLError(rule.code)

    def _gpu_index_checked(self, gpu: int) -> _GpuState:
        if not 0 <= gpu < len(self._gpus):
            raise SimulationError(
                f"no GPU {gpu}; this {self.machine.profile} has GPUs 0-{len(self._gpus) - 1}"
            )
        return self._gpus[gpu]

    def _now(self, state: _GpuState) -> float:
        if self._clock is not None:
            return self._clock()
        return state.time_s

    def _enqueue(self, event: NvmlEvent) -> None:
        """Queue an event for a wait, if its GPU registered for that type (as NVML delivers them)."""
        bit = _EVENT_BITS[event.kind]
        with self._cond:
            for event_set in self._event_sets.values():
                if event_set.registered.get(event.gpu_index, 0) & bit:
                    event_set.events.append(event)
            self._cond.notify_all()

    def _emit_hotplug(self, event: HotplugEvent) -> None:
        for listener in list(self._hotplug_listeners):
            listener(event)

    # ------------------------------------------------------------------ primitives: init / system

    @_primitive
    def nvml_init(self) -> None:
        if self._init_error is not None:
            raise NVMLError(self._init_error)
        self._init_count += 1

    @_primitive
    def nvml_shutdown(self) -> None:
        self._require_init()
        self._init_count -= 1

    @_primitive
    def system_get_driver_version(self) -> str:
        self._require_init()
        return self.machine.driver_version

    @_primitive
    def system_get_nvml_version(self) -> str:
        self._require_init()
        return self.machine.nvml_version

    @_primitive
    def system_get_cuda_driver_version(self) -> int:
        self._require_init()
        return self.machine.cuda_driver_version

    @_primitive
    def device_get_count(self) -> int:
        self._require_init()
        return len(self._gpus)

    @_primitive
    def device_get_handle_by_uuid(self, uuid: str) -> int:
        self._require_init()
        if not uuid.startswith(("GPU-", "MIG-")):
            raise NVMLError_InvalidArgument(2)
        if uuid in self._by_uuid:
            index = self._by_uuid[uuid]
        elif uuid in self._by_mig_uuid:
            index = self._by_mig_uuid[uuid][0]
        else:
            raise NVMLError_NotFound(6)
        self._state(index)
        return index

    # ------------------------------------------------------------------ primitives: identity

    @_primitive
    def device_get_name(self, index: int) -> str:
        return self._state(index).spec.name

    @_primitive
    def device_get_uuid(self, index: int) -> str:
        return self._state(index).spec.uuid

    @_primitive
    def device_get_serial(self, index: int) -> str:
        return self._state(index).spec.serial

    @_primitive
    def device_get_pci_info(self, index: int) -> tuple[str, int]:
        """``(busId, pciDeviceId)`` of ``nvmlDeviceGetPciInfo``."""
        spec = self._state(index).spec
        return spec.pci_bus_id, spec.pci_device_id

    @_primitive
    def device_get_minor_number(self, index: int) -> int:
        return self._state(index).spec.minor_number

    @_primitive
    def device_get_memory_info(self, index: int) -> tuple[int, int, int, int]:
        """``nvmlDeviceGetMemoryInfo(h, nvmlMemory_v2)``: ``(total, reserved, free, used)`` bytes."""
        state = self._state(index)
        total = state.spec.memory_total_mib * MIB
        reserved = state.spec.memory_reserved_mib * MIB
        used = sum(p.used_memory_bytes or 0 for p in state.processes)
        return total, reserved, max(0, total - reserved - used), used

    @_primitive
    def device_get_bar1_memory_info(self, index: int) -> int:
        return self._state(index).spec.bar1_mib * MIB

    @_primitive
    def device_get_cuda_compute_capability(self, index: int) -> tuple[int, int]:
        return self._state(index).spec.compute_capability

    @_primitive
    def device_get_architecture(self, index: int) -> int:
        return self._state(index).spec.architecture

    @_primitive
    def device_get_brand(self, index: int) -> int:
        return self._state(index).spec.brand

    @_primitive
    def device_get_memory_affinity(self, index: int) -> tuple[int, ...]:
        """NUMA nodes closest to the GPU (scope NODE), as ``nvmlDeviceGetMemoryAffinity`` reports."""
        return (self._state(index).spec.numa_node,)

    @_primitive
    def device_get_cpu_affinity(self, index: int) -> str:
        """The CPU set of ``nvmlDeviceGetCpuAffinity`` in Linux list syntax."""
        return self._state(index).spec.cpu_affinity

    @_primitive
    def device_get_persistence_mode(self, index: int) -> bool:
        self._state(index)
        return True

    @_primitive
    def device_get_compute_mode(self, index: int) -> int:
        self._state(index)
        return 0  # NVML_COMPUTEMODE_DEFAULT

    @_primitive
    def device_get_power_management_limit(self, index: int) -> int:
        """Milliwatts."""
        return self._state(index).spec.power_limit_watts * 1000

    @_primitive
    def device_get_platform_info(self, index: int) -> PlatformInfo:
        platform = self._state(index).spec.platform
        if platform is None:
            raise NVMLError_NotSupported(3)
        return platform

    @_primitive
    def device_get_module_id(self, index: int) -> int:
        return self._state(index).spec.module_id

    # ------------------------------------------------------------------ primitives: NVLink

    @_primitive
    def device_get_nvlink_state(self, index: int, link: int) -> int:
        """NVML_FEATURE_ENABLED (1) / DISABLED (0)."""
        return int(self._link(index, link).link_up[link])

    @_primitive
    def device_get_nvlink_version(self, index: int, link: int) -> int:
        """The NVML_NVLINK_VERSION_* enum (not the generation)."""
        version = self._link(index, link).spec.nvlink_version
        assert version is not None
        return version

    @_primitive
    def device_get_nvlink_remote_pci_info(self, index: int, link: int) -> str:
        return self._link(index, link).spec.nvlinks[link].remote_pci_bus_id

    @_primitive
    def device_get_nvlink_remote_device_type(self, index: int, link: int) -> int:
        return _REMOTE_TYPE_VALUE.get(self._link(index, link).spec.nvlinks[link].remote_type, 0xFF)

    @_primitive
    def device_get_nvlink_error_counter(self, index: int, link: int, counter: int) -> int:
        """NVML_NVLINK_ERROR_DL_REPLAY 0, DL_RECOVERY 1, DL_CRC_FLIT 2, DL_CRC_DATA 3."""
        state = self._link(index, link)
        if not 0 <= counter <= 4:
            raise NVMLError_InvalidArgument(2)
        return state.nvlink_errors[link] if counter in (1, 2) else 0

    # ------------------------------------------------------------------ primitives: topology

    @_primitive
    def device_get_topology_common_ancestor(self, a: int, b: int) -> int:
        self._state(a)
        self._state(b)
        if a == b:
            return 0  # NVML_TOPOLOGY_INTERNAL
        return TOPOLOGY_LEVELS[self.machine.pcie[a][b]]

    # ------------------------------------------------------------------ primitives: MIG

    def _mig_capable(self, index: int) -> _GpuState:
        state = self._state(index)
        if not state.spec.mig_profiles:
            raise NVMLError_NotSupported(3)
        return state

    @_primitive
    def device_get_mig_mode(self, index: int) -> tuple[int, int]:
        state = self._mig_capable(index)
        return int(state.mig_enabled), int(state.mig_pending)

    @_primitive
    def device_get_max_mig_device_count(self, index: int) -> int:
        # nvml.h: zero while MIG is not enabled (go-nvlib then visits no MIG device of a MIG-off GPU)
        return MIG_COMPUTE_SLICES if self._mig_capable(index).mig_enabled else 0

    @_primitive
    def device_get_gpu_instance_profile_info(self, index: int, profile_enum: int) -> MigProfileSpec:
        state = self._mig_capable(index)
        for prof in state.spec.mig_profiles:
            if prof.nvml_enum == profile_enum:
                return prof
        raise NVMLError_NotSupported(3) if 0 <= profile_enum < 0x12 else NVMLError_InvalidArgument(2)

    @_primitive
    def device_get_gpu_instances(self, index: int) -> tuple[PlacedInstance, ...]:
        state = self._mig_capable(index)
        if not state.mig_enabled:
            raise NVMLError_NotSupported(3)
        return state.instances

    @_primitive
    def device_get_mig_device_handle_by_index(self, index: int, mig_index: int) -> str:
        state = self._mig_capable(index)
        if not state.mig_enabled:
            raise NVMLError_NotSupported(3)
        if not 0 <= mig_index < MIG_COMPUTE_SLICES:
            raise NVMLError_InvalidArgument(2)
        if mig_index >= len(state.instances):
            raise NVMLError_NotFound(6)
        return self._mig_uuid(state, state.instances[mig_index])

    @_primitive
    def device_get_gpu_instance_possible_placements(self, index: int, profile_id: int) -> tuple[int, ...]:
        state = self._mig_capable(index)
        for prof in state.spec.mig_profiles:
            if prof.id == profile_id:
                return prof.starts
        raise NVMLError_InvalidArgument(2)

    @_primitive
    def device_get_gpu_instance_remaining_capacity(self, index: int, profile_id: int) -> int:
        """How many more instances of the profile fit next to the existing ones."""
        state = self._mig_capable(index)
        if not state.mig_enabled:
            raise NVMLError_NotSupported(3)
        prof = next((p for p in state.spec.mig_profiles if p.id == profile_id), None)
        if prof is None:
            raise NVMLError_InvalidArgument(2)
        count = 0
        while place_instances([prof] * (count + 1), state.instances) is not None:
            count += 1
        return count

    @_primitive
    def device_create_gpu_instance(self, index: int, profile_id: int) -> int:
        """Create a GPU instance (driver-chosen placement) with its default compute instance."""
        state = self._mig_capable(index)
        if not state.mig_enabled:
            raise NVMLError_NotSupported(3)
        prof = next((p for p in state.spec.mig_profiles if p.id == profile_id), None)
        if prof is None:
            raise NVMLError_InvalidArgument(2)
        placed = place_instances([prof], state.instances)
        if placed is None:
            raise NVMLError_InsufficientResources(23)
        with self._lock:
            new, state.next_serial = self._instances(placed, state.next_serial)
            state.instances = tuple(sorted(state.instances + new, key=lambda i: i.gi_id))
            self._reindex_mig()
        self._enqueue(NvmlEvent(EventKind.MIG_CONFIG_CHANGE, index, state.spec.uuid))
        return new[0].gi_id

    @_primitive
    def gpu_instance_destroy(self, index: int, gi_id: int) -> None:
        state = self._mig_capable(index)
        inst = next((i for i in state.instances if i.gi_id == gi_id), None)
        if inst is None:
            raise NVMLError_NotFound(6)
        uuid = self._mig_uuid(state, inst)
        if any(p.mig_uuid == uuid for p in state.processes):
            raise NVMLError(19)  # IN_USE
        with self._lock:
            state.instances = tuple(i for i in state.instances if i.gi_id != gi_id)
            self._reindex_mig()
        self._enqueue(NvmlEvent(EventKind.MIG_CONFIG_CHANGE, index, state.spec.uuid))

    # ------------------------------------------------------------------ primitives: fabric

    @_primitive
    def device_get_gpu_fabric_info(self, index: int) -> FabricSpec:
        """``nvmlDeviceGetGpuFabricInfo`` (the unversioned v1 struct: no health fields, read as 0)."""
        fabric = self._state(index).fabric
        if fabric is None:
            raise NVMLError_NotSupported(3)
        return replace(fabric, health_mask=0, health_summary=0)

    @_primitive
    def device_get_gpu_fabric_info_v(self, index: int, version: int = FABRIC_INFO_V3) -> FabricSpec:
        """``nvmlDeviceGetGpuFabricInfoV``: v3 (``0x3000028``) has ``healthSummary``, v2
        (``0x02000024``, pynvml's ``c_nvmlGpuFabricInfoV_t``) only ``healthMask``; any other version
        is ``ARGUMENT_VERSION_MISMATCH``."""
        fabric = self._state(index).fabric
        if version not in (FABRIC_INFO_V2, FABRIC_INFO_V3):
            raise NVMLError(25)  # ARGUMENT_VERSION_MISMATCH
        if fabric is None:
            raise NVMLError_NotSupported(3)
        return fabric if version == FABRIC_INFO_V3 else replace(fabric, health_summary=0)

    # ------------------------------------------------------------------ primitives: samples

    def _load(self, state: _GpuState) -> int:
        if not state.processes:
            return 0
        t = int(self._now(state))
        base = min(100, sum(p.sm_percent for p in state.processes))
        return max(0, min(100, base - 5 + (t * 7 + state.spec.index * 3) % 11))

    @_primitive
    def device_get_utilization_rates(self, index: int) -> tuple[int, int]:
        state = self._state(index)
        load = self._load(state)
        return load, load * 2 // 3

    @_primitive
    def device_get_temperature(self, index: int) -> int:
        state = self._state(index)
        return 31 + state.spec.index % 4 + self._load(state) * 45 // 100

    @_primitive
    def device_get_memory_temperature(self, index: int) -> int:
        """``NVML_FI_DEV_MEMORY_TEMP`` (HBM parts only)."""
        state = self._state(index)
        if state.spec.architecture in (8,):  # GDDR6 Ada boards report no memory temperature
            raise NVMLError_NotSupported(3)
        return 35 + state.spec.index % 4 + self._load(state) * 40 // 100

    def _power_w(self, state: _GpuState) -> float:
        spec = state.spec
        return (
            spec.idle_power_watts
            + (spec.power_limit_watts * 0.9 - spec.idle_power_watts) * self._load(state) / 100
        )

    @_primitive
    def device_get_power_usage(self, index: int) -> int:
        """Milliwatts."""
        return int(self._power_w(self._state(index)) * 1000)

    @_primitive
    def device_get_total_energy_consumption(self, index: int) -> int:
        """Millijoules since driver load."""
        state = self._state(index)
        self._accumulate(state)
        return int(state.energy_j * 1000)

    def _accumulate(self, state: _GpuState) -> None:
        now = self._now(state)
        dt = max(0.0, now - state.energy_time_s)
        if dt:
            power = self._power_w(state)
            state.energy_j += power * dt
            links_up = sum(state.link_up)
            state.nvlink_bytes += dt * self._load(state) / 100 * 20e9 * (1 if links_up else 0)
            state.energy_time_s = now

    @_primitive
    def device_get_clock_info(self, index: int, clock: int) -> int:
        """NVML_CLOCK_GRAPHICS 0, SM 1, MEM 2 (MHz)."""
        state = self._state(index)
        if clock == 2:
            return state.spec.memory_clock_mhz
        return state.spec.max_sm_clock_mhz if self._load(state) else 345

    @_primitive
    def device_get_current_clocks_event_reasons(self, index: int) -> int:
        state = self._state(index)
        return 0 if self._load(state) else 0x1  # GpuIdle

    @_primitive
    def device_get_pcie_replay_counter(self, index: int) -> int:
        self._state(index)
        return 0

    @_primitive
    def device_get_total_ecc_errors(self, index: int, error_type: int, counter_type: int) -> int:
        """error_type CORRECTED 0 / UNCORRECTED 1; counter_type VOLATILE 0 / AGGREGATE 1."""
        state = self._state(index)
        if error_type not in (0, 1) or counter_type not in (0, 1):
            raise NVMLError_InvalidArgument(2)
        if counter_type == 1:
            return state.ecc_dbe_aggregate if error_type == 1 else state.ecc_sbe_aggregate
        return state.ecc_dbe if error_type == 1 else state.ecc_sbe

    @_primitive
    def device_get_remapped_rows(self, index: int) -> tuple[int, int, bool, bool]:
        """``(correctable, uncorrectable, pending, failure)``; Ampere and newer HBM parts."""
        state = self._state(index)
        if state.spec.architecture < 7 or state.spec.architecture == 8:
            raise NVMLError_NotSupported(3)
        return 0, state.ecc_dbe_aggregate, state.remapped_pending, False

    @_primitive
    def device_get_compute_running_processes(self, index: int) -> tuple[ProcessInfo, ...]:
        state = self._state(index)
        out = []
        for proc in state.processes:
            gi = ci = None
            if proc.mig_uuid is not None:
                gi = self._by_mig_uuid[proc.mig_uuid][1].gi_id
                ci = 0
            out.append(ProcessInfo(proc.pid, proc.used_memory_bytes, gi, ci))
        return tuple(out)

    @_primitive
    def device_get_process_utilization(self, index: int) -> tuple[ProcessUtilization, ...]:
        state = self._state(index)
        load = self._load(state)
        total = sum(p.sm_percent for p in state.processes) or 1
        return tuple(
            ProcessUtilization(p.pid, load * p.sm_percent // total, (load * 2 // 3) * p.sm_percent // total)
            for p in state.processes
        )

    # ------------------------------------------------------------------ primitives: events

    @_primitive
    def event_set_create(self) -> int:
        """A new event set; returns its id."""
        self._require_init()
        with self._lock:
            set_id = self._next_event_set
            self._next_event_set += 1
            self._event_sets[set_id] = _EventSet(set_id)
        return set_id

    def _event_set_of(self, set_id: int | None) -> _EventSet:
        self._require_init()
        if set_id is None:  # the newest set
            set_id = max(self._event_sets, default=0)
        event_set = self._event_sets.get(set_id)
        if event_set is None:
            raise NVMLError_Uninitialized(1) if not self._event_sets else NVMLError_InvalidArgument(2)
        return event_set

    @_primitive
    def event_set_free(self, set_id: int) -> None:
        event_set = self._event_set_of(set_id)
        with self._lock:
            del self._event_sets[event_set.id]
            self._refresh_registered()

    def _refresh_registered(self) -> None:
        for state in self._gpus:
            state.registered_mask = 0
        for event_set in self._event_sets.values():
            for gpu, mask in event_set.registered.items():
                self._gpus[gpu].registered_mask |= mask

    @_primitive
    def device_get_supported_event_types(self, index: int) -> int:
        state = self._state(index)
        mask = EVENT_SBE | EVENT_DBE | EVENT_PSTATE | EVENT_XID | EVENT_CLOCK
        if state.spec.mig_profiles:
            mask |= EVENT_MIG_CONFIG_CHANGE
        if int(self.machine.driver_version.split(".")[0]) >= 570:
            mask |= EVENT_GPU_UNAVAILABLE | EVENT_RECOVERY_ACTION
        return mask

    @_primitive
    def device_register_events(self, index: int, mask: int, set_id: int | None = None) -> None:
        """Register ``mask`` of the GPU on an event set (the newest when ``set_id`` is ``None``)."""
        state = self._state(index)
        if not self._event_sets:
            raise NVMLError_Uninitialized(1)
        event_set = self._event_set_of(set_id)
        supported = self.device_get_supported_event_types(index)
        if mask & ~supported:
            raise NVMLError_NotSupported(3)
        with self._lock:
            event_set.registered[index] = event_set.registered.get(index, 0) | mask
            state.registered_mask |= mask

    @_primitive
    def event_set_wait(self, timeout_ms: int, set_id: int | None = None) -> NvmlEvent:
        """Next event of an event set; raises ``Timeout`` when none arrives. As a driver does after
        Xid 79: the wait that reaches a GPU's loss answers ``GpuIsLost``; events queued after it are
        still delivered; then, while a GPU registered on the set stays lost, every wait answers
        ``GpuIsLost`` at once instead of waiting — until the GPU answers again or the set is freed
        and built again without it."""
        event_set = self._event_set_of(set_id)
        with self._cond:
            if timeout_ms > 0:
                self._cond.wait_for(lambda: self._ready(event_set), timeout=timeout_ms / 1000)
            if not self._ready(event_set):
                raise NVMLError_Timeout(10)
            if not event_set.events:  # ready without an event: a registered GPU is lost
                raise NVMLError_GpuIsLost(15)
            head = event_set.events.popleft()
            if isinstance(head, _LostMarker):
                raise NVMLError_GpuIsLost(15)
            return head

    def _ready(self, event_set: _EventSet) -> bool:
        """Whether a wait on the set has an answer now (markers of recovered GPUs are dropped)."""
        while event_set.events:
            head = event_set.events[0]
            if isinstance(head, _LostMarker) and not self._gpus[head.gpu].lost:
                event_set.events.popleft()
                continue
            return True
        return any(
            self._gpus[gpu].lost and not self._gpus[gpu].lost_silently
            for gpu, mask in event_set.registered.items()
            if mask
        )

    def event_type_of(self, event: NvmlEvent) -> int:
        """The NVML event-type bit of a simulated event."""
        return _EVENT_BITS[event.kind]

    def _apply_face_injected(self, name: str, gpu: int | None) -> None:
        """Errors injected on a pynvml function name (checked by the pynvml face)."""
        if self._injected:
            rules = [r for r in self._injected if r.call == name]
            if rules:
                for rule in rules:
                    if rule.gpu is not None and rule.gpu != gpu:
                        continue
                    if rule.remaining is not None:
                        rule.remaining -= 1
                        if rule.remaining <= 0:
                            self._injected.remove(rule)
                    self._errors[_CODE_NAMES.get(rule.code, str(rule.code))] += 1
                    raise NVMLError(rule.code)

    # ------------------------------------------------------------------ the NvmlBackend protocol
    # One composition: these are RealNvml's answers over this machine's pynvml face.

    @property
    def pynvml(self) -> SimulatedPynvml:
        """The machine's ``pynvml`` face (what ``RealNvml`` calls)."""
        return self._face

    @property
    def backend(self) -> RealNvml:
        """The ``RealNvml`` running over this machine's face (the simulator's ``NvmlBackend``)."""
        return self._backend

    def init(self) -> None:
        self._backend.init()

    def shutdown(self) -> None:
        self._backend.shutdown()

    def driver(self) -> Driver:
        return self._backend.driver()

    def device_count(self) -> int:
        return self._backend.device_count()

    def gpu(self, index: int) -> Gpu:
        return self._backend.gpu(index)

    def nvlinks(self, index: int) -> tuple[NvLink, ...]:
        return self._backend.nvlinks(index)

    def pcie_level(self, a: int, b: int) -> LinkLevel | None:
        return self._backend.pcie_level(a, b)

    def mig_state(self, index: int) -> MigState | None:
        return self._backend.mig_state(index)

    def fabric(self, index: int) -> FabricInfo | None:
        return self._backend.fabric(index)

    def sample(self, index: int) -> GpuSample:
        return self._backend.sample(index)

    def mig_sample(self, uuid: str) -> MigSample:
        return self._backend.mig_sample(uuid)

    def process_utilization(self, index: int) -> tuple[ProcessUtilization, ...]:
        return self._backend.process_utilization(index)

    def health_reading(self, index: int) -> HealthReading:
        return self._backend.health_reading(index)

    def register_events(self, indices: tuple[int, ...]) -> None:
        self._backend.register_events(indices)

    def wait_event(self, timeout_ms: int) -> NvmlEvent | None:
        return self._backend.wait_event(timeout_ms)

    def take_lost_reports(self) -> tuple[NvmlEvent, ...]:
        return self._backend.take_lost_reports()

    def counters(self) -> NvmlCounters:
        return self._backend.counters()

    # ------------------------------------------------------------------ mutations

    def set_init_error(self, code: int | None) -> None:
        """Make the next ``init()`` calls fail with this NVML code (e.g. 9 DRIVER_NOT_LOADED,
        12 LIBRARY_NOT_FOUND, 18 LIB_RM_VERSION_MISMATCH); ``None`` clears it."""
        if code is not None and code not in _CODE_NAMES:
            raise SimulationError(f"unknown NVML code {code}")
        self._init_error = code

    def inject_error(
        self, code: int, *, call: str | None = None, gpu: int | None = None, times: int | None = None
    ) -> None:
        """Make ``call`` fail with ``code`` for GPU ``gpu`` (any when ``None``), ``times`` times
        (forever when ``None``). ``call`` is a simulator primitive (``device_get_memory_info``), a
        pynvml function of the face (``nvmlDeviceRegisterEvents``), or ``None``: every primitive."""
        face_call = (
            call is not None and call.startswith("nvml") and callable(getattr(SimulatedPynvml, call, None))
        )
        if call is not None and not face_call and not callable(getattr(self, call, None)):
            raise SimulationError(f"no simulator primitive or pynvml function {call!r}")
        if code not in _CODE_NAMES:
            raise SimulationError(f"unknown NVML code {code}")
        self._injected.append(_Injected(code, call, gpu, times))

    def clear_errors(self) -> None:
        self._injected.clear()

    def lose_gpu(self, gpu: int) -> None:
        """The GPU falls off the bus: every query of it raises GPU_IS_LOST from now on."""
        state = self._gpu_index_checked(gpu)
        with self._cond:
            if state.lost:
                return
            state.lost = True
            for event_set in self._event_sets.values():
                if event_set.registered.get(gpu):
                    event_set.events.append(_LostMarker(gpu))
            self._cond.notify_all()
        self._emit_hotplug(HotplugEvent("remove", "pci", state.spec.bus_id_sysfs))

    def recover_gpu(self, gpu: int) -> None:
        """The GPU answers again without a reset (the bus came back): its MIG layout is kept and so is
        its event registration; NVLinks come up, processes are gone; the volatile ECC counters and a
        pending row remap stay (only a reset clears them: :meth:`reset_gpu`)."""
        state = self._gpu_index_checked(gpu)
        with self._lock:
            if not state.lost:
                return
            state.lost = state.lost_silently = False
            state.link_up = [True] * len(state.spec.nvlinks)
            state.processes.clear()
        self._emit_hotplug(HotplugEvent("add", "pci", state.spec.bus_id_sysfs))

    def reset_gpu(self, gpu: int) -> None:
        """A GPU reset (``nvidia-smi -r``, or a reboot's): a lost GPU answers again (re-enumerated);
        volatile ECC counters go to zero, a pending row remap is applied, NVLinks come up, processes
        are gone; MIG layout and event registration are kept."""
        state = self._gpu_index_checked(gpu)
        was_lost = state.lost
        with self._lock:
            state.lost = state.lost_silently = False
            state.ecc_dbe = state.ecc_sbe = 0
            state.remapped_pending = False
            state.link_up = [True] * len(state.spec.nvlinks)
            state.processes.clear()
        if was_lost:
            self._emit_hotplug(HotplugEvent("add", "pci", state.spec.bus_id_sysfs))

    def lose_gpu_silently(self, gpu: int) -> None:
        """The GPU answers GPU_IS_LOST to every query, without an event: no Xid, and event waits go on
        as if nothing happened (only the queries tell)."""
        state = self._gpu_index_checked(gpu)
        with self._cond:
            if state.lost:
                return
            state.lost = state.lost_silently = True
        self._emit_hotplug(HotplugEvent("remove", "pci", state.spec.bus_id_sysfs))

    def ecc_rising(self, gpu: int, count: int = 1) -> None:
        """Uncorrectable ECC errors without an event: the volatile and aggregate uncorrectable counts
        rise by ``count``."""
        state = self._gpu_index_checked(gpu)
        if count <= 0:
            raise SimulationError(f"ECC count must rise by a positive number, got {count}")
        with self._lock:
            state.ecc_dbe += count
            state.ecc_dbe_aggregate += count

    def inject_xid(self, gpu: int, xid: int, *, gpu_instance_id: int | None = None) -> None:
        """An Xid critical error (on one MIG GPU instance when ``gpu_instance_id`` is given);
        Xid 79 (fallen off the bus) also loses the GPU."""
        state = self._gpu_index_checked(gpu)
        if xid <= 0:
            raise SimulationError(f"Xid must be a positive number, got {xid}")
        if gpu_instance_id is not None and not (
            state.mig_enabled and any(i.gi_id == gpu_instance_id for i in state.instances)
        ):
            ids = sorted(i.gi_id for i in state.instances) if state.mig_enabled else []
            raise SimulationError(f"GPU {gpu} has no GPU instance {gpu_instance_id}; its instances: {ids}")
        state.xids.append(xid)
        ci = 0 if gpu_instance_id is not None else None
        self._enqueue(NvmlEvent(EventKind.XID, gpu, state.spec.uuid, xid, gpu_instance_id, ci))
        if xid == 79:
            self.lose_gpu(gpu)

    def ecc_dbe(self, gpu: int) -> None:
        """A double-bit (uncorrectable) ECC error: counters, a pending row remap, the DBE event and Xid 48."""
        state = self._gpu_index_checked(gpu)
        with self._lock:
            state.ecc_dbe += 1
            state.ecc_dbe_aggregate += 1
            state.remapped_pending = True
        self._enqueue(NvmlEvent(EventKind.ECC_DBE, gpu, state.spec.uuid))
        self.inject_xid(gpu, 48)

    def ecc_sbe(self, gpu: int) -> None:
        """A single-bit (corrected) ECC error: the corrected counters and the SBE event."""
        state = self._gpu_index_checked(gpu)
        with self._lock:
            state.ecc_sbe += 1
            state.ecc_sbe_aggregate += 1
        self._enqueue(NvmlEvent(EventKind.ECC_SBE, gpu, state.spec.uuid))

    def nvlink_down(self, gpu: int, link: int) -> None:
        state = self._gpu_index_checked(gpu)
        if not 0 <= link < len(state.spec.nvlinks):
            raise SimulationError(f"GPU {gpu} has {len(state.spec.nvlinks)} NVLinks; no link {link}")
        with self._lock:
            state.link_up[link] = False
            state.nvlink_errors[link] += 1

    def nvlink_up(self, gpu: int, link: int) -> None:
        state = self._gpu_index_checked(gpu)
        if not 0 <= link < len(state.spec.nvlinks):
            raise SimulationError(f"GPU {gpu} has {len(state.spec.nvlinks)} NVLinks; no link {link}")
        state.link_up[link] = True

    def set_fabric_health(
        self, gpu: int, summary: FabricHealthSummary | str, *, mask: int | None = None
    ) -> None:
        """Set the GPU's fabric ``healthSummary`` (and a matching ``healthMask`` unless given)."""
        state = self._gpu_index_checked(gpu)
        if state.fabric is None:
            raise SimulationError(f"GPU {gpu} ({state.spec.name}) has no NVLink fabric info")
        try:
            value = FabricHealthSummary(summary)
        except ValueError:
            valid = ", ".join(s.value for s in FabricHealthSummary)
            raise SimulationError(f"unknown fabric health summary {summary!r}; valid: {valid}") from None
        state.fabric = replace(
            state.fabric,
            health_summary=_SUMMARY_VALUE[value],
            health_mask=HEALTH_MASKS[value] if mask is None else mask,
        )

    def set_fabric_state(
        self,
        gpu: int,
        *,
        state: FabricState | str | None = None,
        status: str | None = None,
        clique_id: int | None = None,
    ) -> None:
        """Change the fabric registration: ``state`` (``IN_PROGRESS`` while Fabric Manager / NMX
        works), ``status`` (an NVML error name such as ``INSUFFICIENT_RESOURCES``, or ``SUCCESS``),
        ``clique_id`` (a new NVLink partition)."""
        gpu_state = self._gpu_index_checked(gpu)
        fabric = gpu_state.fabric
        if fabric is None:
            raise SimulationError(f"GPU {gpu} ({gpu_state.spec.name}) has no NVLink fabric info")
        new = fabric
        if state is not None:
            try:
                value = FabricState(state)
            except ValueError:
                valid = ", ".join(s.value for s in FabricState)
                raise SimulationError(f"unknown fabric state {state!r}; valid: {valid}") from None
            new = replace(new, state={v: k for k, v in _FABRIC_STATES.items()}[value])
        if status is not None:
            if status != "SUCCESS" and status not in CODES:
                raise SimulationError(f"unknown fabric status {status!r}; SUCCESS or an NVML error name")
            new = replace(new, status=0 if status == "SUCCESS" else CODES[status])
        if clique_id is not None:
            if not 0 <= clique_id <= 0xFFFFFFFF:
                raise SimulationError(f"clique id {clique_id} is not a 32-bit unsigned number")
            new = replace(new, clique_id=clique_id)
        gpu_state.fabric = new

    def reconfigure_mig(self, gpu: int, profiles: Sequence[str] | None) -> None:
        """Apply a whole MIG layout (``None``: MIG disabled; ``[]``: enabled, no instances), placing
        the instances as a MIG manager does; raises ``SimulationError`` and changes nothing when the
        layout has an unknown profile, exceeds the GPU's slices or has no valid placement."""
        state = self._gpu_index_checked(gpu)
        spec = state.spec
        if not spec.mig_profiles:
            raise SimulationError(f"GPU {gpu} ({spec.name}) is not MIG-capable")
        if state.lost:
            raise SimulationError(f"GPU {gpu} is lost")
        if any(p.mig_uuid is not None for p in state.processes):
            raise SimulationError(f"GPU {gpu} has processes on MIG devices; stop them first")
        if profiles is None:
            planned: list[tuple[MigProfileSpec, int]] = []
        else:
            wanted = [self._profile(spec, name) for name in profiles]
            total = sum(p.slices for p in wanted)
            if total > MIG_COMPUTE_SLICES:
                raise SimulationError(
                    f"GPU {gpu}: layout {list(profiles)} needs {total} compute slices; "
                    f"the GPU has {MIG_COMPUTE_SLICES}"
                )
            plan = plan_layout(wanted)
            if plan is None:
                raise SimulationError(f"GPU {gpu}: layout {list(profiles)} has no valid MIG placement")
            planned = plan
        with self._lock:
            state.mig_enabled = state.mig_pending = profiles is not None
            state.instances, state.next_serial = self._instances(planned, state.next_serial)
            self._reindex_mig()
        self._enqueue(NvmlEvent(EventKind.MIG_CONFIG_CHANGE, gpu, spec.uuid))

    def add_process(
        self,
        gpu: int,
        pid: int,
        *,
        used_memory_bytes: int | None = None,
        mig_uuid: str | None = None,
        sm_percent: int = 80,
    ) -> None:
        """A compute process on the GPU (or on one of its MIG devices)."""
        state = self._gpu_index_checked(gpu)
        if mig_uuid is not None and self._by_mig_uuid.get(mig_uuid, (None,))[0] != gpu:
            raise SimulationError(f"{mig_uuid} is not a MIG device of GPU {gpu}")
        if any(p.pid == pid for p in state.processes):
            raise SimulationError(f"pid {pid} already runs on GPU {gpu}")
        with self._lock:
            state.processes.append(_Process(pid, used_memory_bytes, mig_uuid, max(0, min(100, sm_percent))))

    def remove_process(self, gpu: int, pid: int) -> None:
        state = self._gpu_index_checked(gpu)
        with self._lock:
            state.processes = [p for p in state.processes if p.pid != pid]

    def advance(self, seconds: float) -> None:
        """Move every GPU's virtual time forward (only without an injected clock)."""
        if seconds < 0:
            raise SimulationError("time only moves forward")
        for state in self._gpus:
            state.time_s += seconds

    def xid_history(self, gpu: int) -> tuple[int, ...]:
        return tuple(self._gpu_index_checked(gpu).xids)

    # ------------------------------------------------------------------ hot-plug

    def add_hotplug_listener(self, listener: Callable[[HotplugEvent], None]) -> Callable[[], None]:
        """Call ``listener`` for every hot-plug event; returns a function that unsubscribes it."""
        self._hotplug_listeners.append(listener)

        def remove() -> None:
            if listener in self._hotplug_listeners:
                self._hotplug_listeners.remove(listener)

        return remove

    def hotplug_events(self) -> asyncio.Queue[HotplugEvent]:
        """An ``asyncio.Queue`` of hot-plug events on the running loop (events from any thread)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[HotplugEvent] = asyncio.Queue()

        def push(event: HotplugEvent) -> None:
            if loop.is_closed():
                return
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                queue.put_nowait(event)
            else:
                loop.call_soon_threadsafe(queue.put_nowait, event)

        self.add_hotplug_listener(push)
        return queue


__all__ = [
    "HEALTH_EVENT_MASK",
    "HotplugEvent",
    "PlacedInstance",
    "SimulatedNvml",
    "SimulationError",
    "place_instances",
    "plan_layout",
]
