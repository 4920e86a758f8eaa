"""The one NVML composition: :class:`RealNvml` turns pynvml's answers into the project's model.

``RealNvml(nvml)`` takes the ``pynvml`` module to call (default: the real one, imported at
:meth:`RealNvml.init`, so the package imports on machines without the library; a missing module is
reported as ``NVMLError_LibraryNotFound``). ``--simulate`` passes the simulator's pynvml face
(:class:`agent.nvml.face.SimulatedPynvml`), so the code a real node runs is the code every simulated
test runs. Functions, struct classes and error classes are all read from that module object.

Every ``pynvml.NVMLError`` is translated into ``agent.nvml.errors.NVMLError(code)``; "not supported"
(and "function not found" / ``NVMLLibraryMismatchError`` on older libraries) becomes ``None`` / an empty
tuple, as the protocol says. Answers that are control flow — INVALID_ARGUMENT past the last NVLink,
NOT_FOUND for an empty MIG slot or no new samples, ARGUMENT_VERSION_MISMATCH before a fallback, an event
wait's TIMEOUT — are not counted as errors. NO_PERMISSION on process and MIG-instance listings (an
unprivileged agent) leaves those parts empty and keeps the rest of the GPU's answers.

Older drivers and GPUs: fabric info falls back from ``nvmlDeviceGetGpuFabricInfoV`` (v3, then v2) to the
unversioned v1 call; platform info from the v2 to the v1 struct; clocks-event reasons to the older
throttle-reasons call; temperature from ``nvmlDeviceGetTemperatureV`` to ``nvmlDeviceGetTemperature``;
NVLink traffic from the NVLink-5 byte counters (fields 202/204) to the link-scoped throughput fields
138/139 (KiB).

Events: after Xid 79 a driver answers GPU_IS_LOST on every wait of an event set with the lost GPU
registered. The backend then reports each newly lost GPU once (GPU_LOST), frees the set and builds a
new one with the GPUs that still answer, so the healthy GPUs' events keep coming; a lost GPU that
answers again is registered again. If waits still answer GPU_IS_LOST with nothing newly lost, it backs
off (sleeps the wait's timeout) instead of spinning.

Lost from any answer: a per-GPU call (identity, NVLinks, PCIe levels, MIG, fabric, samples, process
utilisation, the health probe) that answers GPU_IS_LOST (or another lost code) reports that GPU lost
once, as a GPU_LOST event the next ``wait_event`` returns (at once, ahead of the wait), so health learns it
from whichever reader saw it first — also from a GPU that went away without any event.

Binding details handled here (see the project's NVML reference, §9.3):
- fabric info through the versioned ``c_nvmlGpuFabricInfo_v3_t`` (``healthSummary``), clusterUuid
  formatted from its 16 raw bytes, healthMask decoded by :func:`decode_health_mask`;
- ``nvmlDeviceIsMigDeviceHandle`` returns a ``c_uint``: use ``.value``;
- NVLink links are iterated until INVALID_ARGUMENT / NOT_SUPPORTED (``NVML_NVLINK_MAX_LINKS`` is 18 or 36
  depending on the binding; GB200 answers INVALID_ARGUMENT beyond link 17);
- ``nvmlDeviceGetFieldValues`` succeeds overall while entries fail: each entry's ``nvmlReturn`` is checked;
- ``nvmlEventSetWait_v2`` signals a timeout by raising: that is ``None`` here;
- platform-info single-byte fields are ``c_char`` (read raw, not through pynvml's str decoding);
- MIG device handles are fetched again for each use (NVML may reuse a handle after reconfiguration).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import os
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, Concatenate, ParamSpec, TypeVar

from agent.host import cpulist_from_masks
from agent.nvml.errors import CODES, LOST_CODES, NVMLError
from agent.nvml.fabric import decode_health_mask
from agent.nvml.protocol import (
    EventKind,
    GpuSample,
    HealthReading,
    MigSample,
    NvLinkCounters,
    NvmlCounters,
    NvmlEvent,
    ProcessInfo,
    ProcessUtilization,
)
from topology import logs
from topology.model import (
    ComputeInstance,
    Driver,
    FabricHealthSummary,
    FabricInfo,
    FabricState,
    Gpu,
    GpuInstance,
    LinkLevel,
    MigDevice,
    MigState,
    NvLink,
    PlatformInfo,
    RemoteDeviceType,
)

log = logs.get_logger("agent.nvml.real")

P = ParamSpec("P")
R = TypeVar("R")

_NOT_SUPPORTED = CODES["NOT_SUPPORTED"]
_FUNCTION_NOT_FOUND = CODES["FUNCTION_NOT_FOUND"]
_INVALID_ARGUMENT = CODES["INVALID_ARGUMENT"]
_NOT_FOUND = CODES["NOT_FOUND"]
_TIMEOUT = CODES["TIMEOUT"]
_ARGUMENT_VERSION_MISMATCH = CODES["ARGUMENT_VERSION_MISMATCH"]
_NO_PERMISSION = CODES["NO_PERMISSION"]
_UNSUPPORTED = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND})
_QUIET_UNSUPPORTED = frozenset({_FUNCTION_NOT_FOUND})  # an older library: an answer, not an error
_PAST_THE_END = frozenset({_INVALID_ARGUMENT, _FUNCTION_NOT_FOUND})  # iteration ends; not errors
_QUIET_PERMISSION = frozenset({_NO_PERMISSION})  # an unprivileged agent: those parts stay empty
_WAIT_ANSWERS = frozenset({_TIMEOUT, *LOST_CODES})  # a wait's answers, handled (and counted) below

ARCHITECTURES: dict[int, str] = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
    13: "rubin",
}

BRANDS: dict[int, str] = {
    0: "UNKNOWN",
    1: "QUADRO",
    2: "TESLA",
    3: "NVS",
    4: "GRID",
    5: "GEFORCE",
    6: "TITAN",
    7: "NVIDIA_VAPPS",
    8: "NVIDIA_VPC",
    9: "NVIDIA_VCS",
    10: "NVIDIA_VWS",
    11: "NVIDIA_CLOUD_GAMING",
    12: "QUADRO_RTX",
    13: "NVIDIA_RTX",
    14: "NVIDIA",
    15: "GEFORCE_RTX",
    16: "TITAN_RTX",
}

COMPUTE_MODES: dict[int, str] = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}

# nvmlDeviceGetTopologyCommonAncestor → matrix level
TOPOLOGY_LEVELS: dict[int, LinkLevel] = {
    0: LinkLevel.PIX,  # NVML_TOPOLOGY_INTERNAL: same board
    10: LinkLevel.PIX,
    20: LinkLevel.PXB,
    30: LinkLevel.PHB,
    40: LinkLevel.NODE,
    50: LinkLevel.SYS,
}

# NVML_NVLINK_VERSION_* enum → NVLink generation (the model stores the generation)
NVLINK_GENERATIONS: dict[int, int] = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}

REMOTE_TYPES: dict[int, RemoteDeviceType] = {
    0: RemoteDeviceType.GPU,
    1: RemoteDeviceType.IBMNPU,
    2: RemoteDeviceType.SWITCH,
}

FABRIC_STATES: dict[int, FabricState] = {
    0: FabricState.NOT_SUPPORTED,
    1: FabricState.NOT_STARTED,
    2: FabricState.IN_PROGRESS,
    3: FabricState.COMPLETED,
}

HEALTH_SUMMARIES: dict[int, FabricHealthSummary] = {
    0: FabricHealthSummary.NOT_SUPPORTED,
    1: FabricHealthSummary.HEALTHY,
    2: FabricHealthSummary.UNHEALTHY,
    3: FabricHealthSummary.LIMITED_CAPACITY,
}

# event type masks
EVENT_SBE = 0x1
EVENT_DBE = 0x2
EVENT_XID = 0x8
EVENT_MIG_CONFIG_CHANGE = 0x100
EVENT_GPU_UNAVAILABLE = 0x4000
EVENT_RECOVERY_ACTION = 0x8000
HEALTH_EVENTS = EVENT_SBE | EVENT_DBE | EVENT_XID | EVENT_MIG_CONFIG_CHANGE | EVENT_GPU_UNAVAILABLE
HEALTH_EVENTS |= EVENT_RECOVERY_ACTION
_EVENT_KINDS: tuple[tuple[int, EventKind], ...] = (
    (EVENT_XID, EventKind.XID),
    (EVENT_DBE, EventKind.ECC_DBE),
    (EVENT_SBE, EventKind.ECC_SBE),
    (EVENT_GPU_UNAVAILABLE, EventKind.GPU_UNAVAILABLE),
    (EVENT_MIG_CONFIG_CHANGE, EventKind.MIG_CONFIG_CHANGE),
    (EVENT_RECOVERY_ACTION, EventKind.RECOVERY_ACTION),
)
_NO_INSTANCE = 0xFFFFFFFF

# field ids (nvidia-ml-py 13.615.71)
FI_ECC_SBE_VOL_TOTAL = 3
FI_ECC_DBE_VOL_TOTAL = 4
FI_ECC_SBE_AGG_TOTAL = 5
FI_ECC_DBE_AGG_TOTAL = 6
FI_RETIRED_PENDING = 31
FI_MEMORY_TEMP = 82
FI_TOTAL_ENERGY_CONSUMPTION = 83  # mJ
FI_PCIE_REPLAY_COUNTER = 94
FI_REMAPPED_COR = 142
FI_REMAPPED_UNC = 143
FI_REMAPPED_PENDING = 144
FI_REMAPPED_FAILURE = 145
FI_POWER_INSTANT = 186  # mW
FI_NVLINK_THROUGHPUT_DATA_TX = 138  # KiB, link scope (before NVLink 5)
FI_NVLINK_THROUGHPUT_DATA_RX = 139
FI_NVLINK_COUNT_XMIT_BYTES = 202  # bytes, link scope (NVLink 5)
FI_NVLINK_COUNT_RCV_BYTES = 204
_DEVICE_FIELDS = (
    FI_ECC_SBE_VOL_TOTAL,
    FI_ECC_DBE_VOL_TOTAL,
    FI_ECC_SBE_AGG_TOTAL,
    FI_ECC_DBE_AGG_TOTAL,
    FI_MEMORY_TEMP,
    FI_TOTAL_ENERGY_CONSUMPTION,
    FI_PCIE_REPLAY_COUNTER,
    FI_REMAPPED_COR,
    FI_REMAPPED_UNC,
    FI_REMAPPED_PENDING,
    FI_REMAPPED_FAILURE,
    FI_POWER_INSTANT,
)
_HEALTH_FIELDS = (
    FI_ECC_SBE_VOL_TOTAL,
    FI_ECC_DBE_VOL_TOTAL,
    FI_REMAPPED_PENDING,
    FI_REMAPPED_FAILURE,
    FI_RETIRED_PENDING,
)
# NVML_NVLINK_ERROR_DL_*
_NVLINK_ERRORS = {"replay_errors": 0, "recovery_errors": 1, "crc_flit_errors": 2, "crc_data_errors": 3}
_GPU_INSTANCE_PROFILE_COUNT = 0x12
_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
_CI_ENGINE_PROFILE_SHARED = 0


# --------------------------------------------------------------------------- pure helpers


def format_cluster_uuid(raw: bytes) -> str:
    """16 raw bytes → ``xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    return str(uuidlib.UUID(bytes=bytes(raw[:16]).ljust(16, b"\0")))


def format_ib_guid(raw: bytes) -> str | None:
    """``ibGuid[16]`` → ``0x`` + 16 hex digits when it holds one 8-byte GUID (the rest zero), else all
    32 digits; ``None`` when all zero."""
    if not any(raw):
        return None
    if not any(raw[8:]):
        return "0x" + raw[:8].hex()
    return "0x" + raw.hex()


def status_name(code: int) -> str:
    """A fabric ``status`` (an nvmlReturn) as the name the model stores."""
    if code == 0:
        return "SUCCESS"
    return NVMLError(code).name


def _raw_field(struct: Any, name: str, size: int) -> bytes:
    """A struct field's bytes, bypassing pynvml's str decoding of ``c_char`` fields."""
    offset = getattr(type(struct), name).offset
    return ctypes.string_at(ctypes.addressof(struct) + offset, size)


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("ascii", "replace").strip()


def _str(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _reports_lost(
    fn: Callable[Concatenate[RealNvml, int, P], R],
) -> Callable[Concatenate[RealNvml, int, P], R]:
    """A per-GPU call (GPU index first) whose lost answer reports that GPU lost (see the module doc)."""

    @functools.wraps(fn)
    def wrapper(self: RealNvml, index: int, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(self, index, *args, **kwargs)
        except NVMLError as exc:
            if exc.value in LOST_CODES:
                self.note_lost(index)
            raise

    return wrapper


# --------------------------------------------------------------------------- the backend


class RealNvml:
    """:class:`agent.nvml.protocol.NvmlBackend` over a ``pynvml`` module (the real one by default)."""

    def __init__(
        self,
        nvml: Any = None,
        *,
        loader: Callable[[], ModuleType] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``nvml``: the pynvml module (or the simulator's face) to call; ``loader``: how to import
        it at :meth:`init` when ``nvml`` is not given; ``sleep``: the event wait's backoff."""
        if nvml is not None:
            self._loader: Callable[[], Any] = lambda: nvml
        else:
            self._loader = loader or _import_pynvml
        self._sleep = sleep
        self._event_lock = threading.RLock()  # the event set is replaced by the waiting thread only
        self._nv: Any = None
        self._init_count = 0
        self._calls = 0
        self._errors: collections.Counter[str] = collections.Counter()
        self._reset()

    def _reset(self) -> None:
        """Forget every handle and every per-session fact (at init and shutdown)."""
        self._handles: dict[int, Any] = {}
        self._uuids: dict[int, str] = {}
        self._event_set: Any = None
        self._wanted: tuple[int, ...] = ()  # GPUs the caller asked events for
        self._registered: tuple[int, ...] = ()  # GPUs registered on the current event set
        self._lost_reported: set[int] = set()
        self._lost_on_set: set[int] = set()  # lost GPUs whose loss the current event set answered
        self._lost_wait_seen = False  # the current GPU_IS_LOST episode of the waits was counted
        self._set_rebuilt = False  # the event set was rebuilt since the last answered wait
        self._pending: collections.deque[NvmlEvent] = collections.deque()
        self._process_ts: dict[int, int] = {}

    # ---------------------------------------------------------------- plumbing

    def _call(self, fn_name: str, *args: Any, quiet: frozenset[int] = frozenset()) -> Any:
        """Call a pynvml function; errors become ours and are counted unless their code is ``quiet``
        (an answer the caller expects as control flow)."""
        if self._nv is None:
            self._count_error(CODES["UNINITIALIZED"])
            raise NVMLError(CODES["UNINITIALIZED"])
        self._calls += 1
        fn = getattr(self._nv, fn_name, None)
        try:
            if fn is None:  # a binding older than the function
                raise self._nv.NVMLError(_FUNCTION_NOT_FOUND)
            return fn(*args)
        except self._nv.NVMLError as exc:
            code = int(exc.value)
            if code not in quiet:
                self._count_error(code)
            raise NVMLError(code) from None
        except self._mismatch_error:
            # pynvml's unversioned wrapper when the library lacks the versioned symbol
            if _FUNCTION_NOT_FOUND not in quiet:
                self._count_error(_FUNCTION_NOT_FOUND)
            raise NVMLError(_FUNCTION_NOT_FOUND) from None

    @property
    def _mismatch_error(self) -> type[BaseException] | tuple[()]:
        error = getattr(self._nv, "NVMLLibraryMismatchError", None)
        return error if isinstance(error, type) and issubclass(error, BaseException) else ()

    def _count_error(self, code: int) -> None:
        self._errors[NVMLError(code).name] += 1

    def _optional(self, fn_name: str, *args: Any, also: frozenset[int] = frozenset()) -> Any:
        """A call whose "not supported" answer (or one of ``also``) is ``None``."""
        try:
            return self._call(fn_name, *args, quiet=_QUIET_UNSUPPORTED | also)
        except NVMLError as exc:
            if exc.value in _UNSUPPORTED or exc.value in also:
                return None
            raise

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._call("nvmlDeviceGetHandleByIndex", index)
            self._handles[index] = handle
        return handle

    # ---------------------------------------------------------------- lifecycle

    def init(self) -> None:
        """``nvmlInit``; reference-counted like NVML's own (each ``init`` needs a ``shutdown``)."""
        if self._nv is not None:
            self._call("nvmlInit")
            self._init_count += 1
            return
        try:
            module = self._loader()
        except ImportError:
            self._count_error(CODES["LIBRARY_NOT_FOUND"])
            raise NVMLError(CODES["LIBRARY_NOT_FOUND"]) from None
        try:
            module.nvmlInit()
        except module.NVMLError as exc:
            self._count_error(int(exc.value))
            raise NVMLError(int(exc.value)) from None
        self._calls += 1
        self._reset()
        self._nv = module
        self._init_count = 1

    def shutdown(self) -> None:
        """``nvmlShutdown``; the last one frees the event set and forgets every handle."""
        if self._nv is None:
            return
        if self._init_count > 1:
            self._init_count -= 1
            with contextlib.suppress(NVMLError):
                self._call("nvmlShutdown")
            return
        self._init_count = 0
        try:
            if self._event_set is not None:
                self._call("nvmlEventSetFree", self._event_set)
        except NVMLError:
            pass
        finally:
            nv, self._nv = self._nv, None
            self._reset()
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlShutdown()

    # ---------------------------------------------------------------- system

    def driver(self) -> Driver:
        return Driver(
            driver_version=_str(self._call("nvmlSystemGetDriverVersion")),
            nvml_version=_str(self._call("nvmlSystemGetNVMLVersion")),
            cuda_driver_version=int(self._call("nvmlSystemGetCudaDriverVersion")),
        )

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    # ---------------------------------------------------------------- identity

    @_reports_lost
    def gpu(self, index: int) -> Gpu:
        h = self._handle(index)
        uuid = _str(self._call("nvmlDeviceGetUUID", h))
        self._uuids[index] = uuid
        pci = self._call("nvmlDeviceGetPciInfo", h)
        memory = self._call("nvmlDeviceGetMemoryInfo", h)
        cc = self._optional("nvmlDeviceGetCudaComputeCapability", h) or (0, 0)
        arch = self._optional("nvmlDeviceGetArchitecture", h)
        serial = self._optional("nvmlDeviceGetSerial", h)
        minor = self._optional("nvmlDeviceGetMinorNumber", h)
        numa = self._optional("nvmlDeviceGetNumaNodeId", h)
        persistence = self._optional("nvmlDeviceGetPersistenceMode", h)
        compute_mode = self._optional("nvmlDeviceGetComputeMode", h)
        brand = self._optional("nvmlDeviceGetBrand", h)
        power = self._optional("nvmlDeviceGetPowerManagementLimit", h)
        # room for at least 1024 CPUs: the agent may see fewer CPUs than the host has
        words = max(16, ((os.cpu_count() or 0) + 63) // 64)
        masks = self._optional("nvmlDeviceGetCpuAffinity", h, words)
        affinity = cpulist_from_masks(int(m) for m in masks) if masks is not None else None
        return Gpu(
            index=index,
            uuid=uuid,
            name=_str(self._call("nvmlDeviceGetName", h)),
            serial=_str(serial) if serial else None,
            pci_bus_id=_str(pci.busId),
            minor_number=int(minor) if minor is not None else None,
            memory_total_bytes=int(memory.total),
            compute_capability=(int(cc[0]), int(cc[1])),
            architecture=ARCHITECTURES.get(int(arch), "unknown") if arch is not None else "unknown",
            numa_node=int(numa) if numa is not None and int(numa) >= 0 else None,
            cpu_affinity=affinity or None,
            persistence_mode=bool(persistence) if persistence is not None else None,
            compute_mode=COMPUTE_MODES.get(int(compute_mode)) if compute_mode is not None else None,
            pci_device_id=int(pci.pciDeviceId),
            brand=BRANDS.get(int(brand), f"BRAND_{brand}") if brand is not None else None,
            power_limit_watts=int(power) / 1000 if power is not None else None,
            nvlink_count=len(self._links(h)),
            mig_capable=self._optional("nvmlDeviceGetMigMode", h) is not None,
            platform=self._platform(h),
        )

    def _platform(self, h: Any) -> PlatformInfo | None:
        """Platform info through the v2 struct; a driver that knows only v1 (ARGUMENT_VERSION_MISMATCH)
        is asked with the v1 struct, whose rack GUID stands in for the chassis serial."""
        for struct_name in ("c_nvmlPlatformInfo_v2_t", "c_nvmlPlatformInfo_v1_t"):
            struct = getattr(self._nv, struct_name, None)
            if struct is None:
                continue
            info = struct()
            try:
                self._call(
                    "nvmlDeviceGetPlatformInfo",
                    h,
                    ctypes.byref(info),
                    quiet=_QUIET_UNSUPPORTED | {_ARGUMENT_VERSION_MISMATCH},
                )
            except NVMLError as exc:
                if exc.value == _ARGUMENT_VERSION_MISMATCH:
                    continue
                if exc.value in _UNSUPPORTED:
                    return None
                raise
            return _platform_info(info)
        return None

    # ---------------------------------------------------------------- NVLink, PCIe

    def _links(self, h: Any) -> dict[int, int]:
        """Link index → NVML feature state, for the links the API answers for (stopping at
        INVALID_ARGUMENT / NOT_SUPPORTED)."""
        links: dict[int, int] = {}
        for link in range(int(getattr(self._nv, "NVML_NVLINK_MAX_LINKS", 36))):
            try:
                state = self._call("nvmlDeviceGetNvLinkState", h, link, quiet=_PAST_THE_END)
            except NVMLError as exc:
                if exc.value in (_INVALID_ARGUMENT, *_UNSUPPORTED):
                    break
                raise
            links[link] = int(state)
        return links

    @_reports_lost
    def nvlinks(self, index: int) -> tuple[NvLink, ...]:
        h = self._handle(index)
        out: list[NvLink] = []
        for link in range(int(getattr(self._nv, "NVML_NVLINK_MAX_LINKS", 36))):
            try:
                state = self._call("nvmlDeviceGetNvLinkState", h, link, quiet=_PAST_THE_END)
            except NVMLError as exc:
                if exc.value in (_INVALID_ARGUMENT, *_UNSUPPORTED):
                    break
                raise
            active = int(state) == 1
            version = self._link_optional("nvmlDeviceGetNvLinkVersion", h, link)
            remote_type = self._link_optional("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
            remote_pci = self._link_optional("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
            out.append(
                NvLink(
                    gpu_index=index,
                    link=link,
                    active=active,
                    version=NVLINK_GENERATIONS.get(int(version)) if version is not None else None,
                    remote_type=(
                        REMOTE_TYPES.get(int(remote_type), RemoteDeviceType.UNKNOWN)
                        if remote_type is not None
                        else None
                    ),
                    remote_pci_bus_id=_str(remote_pci.busId) if remote_pci is not None else None,
                    remote_gpu_index=None,
                )
            )
        return tuple(out)

    def _link_optional(self, fn_name: str, h: Any, link: int, *extra: Any) -> Any:
        """Per-link facts: an inactive link may answer NOT_SUPPORTED / INVALID_ARGUMENT → ``None``."""
        try:
            return self._call(fn_name, h, link, *extra, quiet=_PAST_THE_END)
        except NVMLError as exc:
            if exc.value in (_INVALID_ARGUMENT, *_UNSUPPORTED):
                return None
            raise

    def pcie_level(self, a: int, b: int) -> LinkLevel | None:
        try:
            level = self._optional("nvmlDeviceGetTopologyCommonAncestor", self._handle(a), self._handle(b))
        except NVMLError as exc:
            if exc.value in LOST_CODES:  # which of the two: ask each
                with self._event_lock:
                    for index in {a, b}:
                        with contextlib.suppress(NVMLError):
                            self._is_lost(index)
            raise
        if a == b:
            return LinkLevel.SELF
        return TOPOLOGY_LEVELS.get(int(level)) if level is not None else None

    # ---------------------------------------------------------------- MIG

    @_reports_lost
    def mig_state(self, index: int) -> MigState | None:
        h = self._handle(index)
        mode = self._optional("nvmlDeviceGetMigMode", h)
        if mode is None:
            return None
        current, pending = int(mode[0]) == 1, int(mode[1]) == 1
        if not current:
            return MigState(gpu_index=index, current_enabled=False, pending_enabled=pending)
        gis: list[GpuInstance] = []
        cis: list[ComputeInstance] = []
        gi_profiles: dict[int, tuple[str, int, int]] = {}  # gi id → (profile, slices, placement size)
        try:
            self._gpu_instances(index, h, gis, cis, gi_profiles)
        except NVMLError as exc:
            if exc.value != _NO_PERMISSION:
                raise
            # listing instances needs privileges; the MIG devices below do not
            gis, cis, gi_profiles = [], [], {}
        devices = self._mig_devices(index, h, gi_profiles)
        return MigState(
            gpu_index=index,
            current_enabled=True,
            pending_enabled=pending,
            gpu_instances=tuple(sorted(gis, key=lambda g: g.id)),
            compute_instances=tuple(sorted(cis, key=lambda c: (c.gpu_instance_id, c.id))),
            devices=devices,
        )

    def _gpu_instances(
        self,
        index: int,
        h: Any,
        gis: list[GpuInstance],
        cis: list[ComputeInstance],
        gi_profiles: dict[int, tuple[str, int, int]],
    ) -> None:
        skip = frozenset({_INVALID_ARGUMENT, _NOT_FOUND, *_UNSUPPORTED})
        for profile in range(_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", h, profile, quiet=skip)
            except NVMLError as exc:
                if exc.value in skip:
                    continue
                raise
            if int(info.instanceCount) == 0:
                continue
            array = (self._nv.c_nvmlGpuInstance_t * int(info.instanceCount))()
            count = ctypes.c_uint(0)
            self._call(
                "nvmlDeviceGetGpuInstances",
                h,
                int(info.id),
                array,
                ctypes.byref(count),
                quiet=_QUIET_PERMISSION,
            )
            name = _str(info.name).removeprefix("MIG ").strip()
            for i in range(count.value):
                gi = array[i]
                gi_info = self._call("nvmlGpuInstanceGetInfo", gi, quiet=_QUIET_PERMISSION)
                gi_id = int(gi_info.id)
                gis.append(
                    GpuInstance(
                        gpu_index=index,
                        id=gi_id,
                        profile_id=int(gi_info.profileId),
                        profile=name,
                        placement_start=int(gi_info.placement.start),
                        placement_size=int(gi_info.placement.size),
                    )
                )
                gi_profiles[gi_id] = (name, int(info.sliceCount), int(gi_info.placement.size))
                cis.extend(self._compute_instances(index, gi, gi_id))

    def _compute_instances(self, index: int, gi: Any, gi_id: int) -> list[ComputeInstance]:
        out: list[ComputeInstance] = []
        skip = frozenset({_INVALID_ARGUMENT, _NOT_FOUND, *_UNSUPPORTED})
        for profile in range(_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = self._call(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                    gi,
                    profile,
                    _CI_ENGINE_PROFILE_SHARED,
                    quiet=skip | _QUIET_PERMISSION,
                )
            except NVMLError as exc:
                if exc.value in skip:
                    continue
                raise
            if int(info.instanceCount) == 0:
                continue
            array = (self._nv.c_nvmlComputeInstance_t * int(info.instanceCount))()
            count = ctypes.c_uint(0)
            self._call(
                "nvmlGpuInstanceGetComputeInstances",
                gi,
                int(info.id),
                array,
                ctypes.byref(count),
                quiet=_QUIET_PERMISSION,
            )
            for i in range(count.value):
                ci_info = self._call("nvmlComputeInstanceGetInfo", array[i], quiet=_QUIET_PERMISSION)
                out.append(
                    ComputeInstance(
                        gpu_index=index,
                        gpu_instance_id=gi_id,
                        id=int(ci_info.id),
                        profile_id=int(ci_info.profileId),
                        slice_count=int(info.sliceCount),
                    )
                )
        return out

    def _mig_devices(
        self, index: int, h: Any, gi_profiles: dict[int, tuple[str, int, int]]
    ) -> tuple[MigDevice, ...]:
        parent_uuid = self._uuids.get(index) or _str(self._call("nvmlDeviceGetUUID", h))
        out: list[MigDevice] = []
        empty = frozenset({_NOT_FOUND, _INVALID_ARGUMENT})
        for slot in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", h))):
            try:
                mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", h, slot, quiet=empty)
            except NVMLError as exc:
                if exc.value in empty:
                    continue
                raise
            if not self._call("nvmlDeviceIsMigDeviceHandle", mig).value:
                continue
            uuid = _str(self._call("nvmlDeviceGetUUID", mig))
            gi_id = int(self._call("nvmlDeviceGetGpuInstanceId", mig))
            ci_id = int(self._call("nvmlDeviceGetComputeInstanceId", mig))
            attrs = self._call("nvmlDeviceGetAttributes", mig)
            memory = self._optional("nvmlDeviceGetMemoryInfo", mig)
            known = gi_profiles.get(gi_id)
            if known is None:  # instances not listed (no permission): the MIG device's name has it
                name = _str(self._optional("nvmlDeviceGetName", mig) or "")
                known = (
                    name.rpartition(" MIG ")[2] if " MIG " in name else "",
                    int(attrs.gpuInstanceSliceCount),
                    0,
                )
            profile, gi_slices, mem_slices = known
            out.append(
                MigDevice(
                    uuid=uuid,
                    parent_uuid=parent_uuid,
                    parent_index=index,
                    index=slot,
                    gpu_instance_id=gi_id,
                    compute_instance_id=ci_id,
                    profile=profile,
                    gpu_slices=gi_slices,
                    memory_slices=mem_slices,
                    compute_slices=int(attrs.computeInstanceSliceCount),
                    memory_bytes=(
                        int(memory.total) if memory is not None else int(attrs.memorySizeMB) * 1024 * 1024
                    ),
                    sm_count=int(attrs.multiprocessorCount),
                )
            )
        return tuple(out)

    # ---------------------------------------------------------------- fabric

    @_reports_lost
    def fabric(self, index: int) -> FabricInfo | None:
        """Fabric info through the versioned call (v3 struct, then v2 on ARGUMENT_VERSION_MISMATCH);
        a driver without ``nvmlDeviceGetGpuFabricInfoV`` is asked through the v1 call (no health)."""
        h = self._handle(index)
        fallback = _QUIET_UNSUPPORTED | {_ARGUMENT_VERSION_MISMATCH}
        info: Any = None
        for struct_name in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t"):
            candidate = self._nv_struct(struct_name)
            try:
                self._call("nvmlDeviceGetGpuFabricInfoV", h, ctypes.byref(candidate), quiet=fallback)
            except NVMLError as exc:
                if exc.value == _ARGUMENT_VERSION_MISMATCH:
                    continue
                if exc.value == _FUNCTION_NOT_FOUND:
                    break
                if exc.value in _UNSUPPORTED:
                    return None
                raise
            info = candidate
            break
        if info is None:
            info = self._nv_struct("c_nvmlGpuFabricInfo_t")
            try:
                self._call("nvmlDeviceGetGpuFabricInfo", h, ctypes.byref(info), quiet=_QUIET_UNSUPPORTED)
            except NVMLError as exc:
                if exc.value in _UNSUPPORTED:
                    return None
                raise
        state = FABRIC_STATES.get(int(info.state) & 0xFF, FabricState.NOT_SUPPORTED)
        if state is FabricState.NOT_SUPPORTED:
            return None
        mask = int(info.healthMask) if hasattr(type(info), "healthMask") else None
        summary = (
            HEALTH_SUMMARIES.get(int(info.healthSummary), FabricHealthSummary.NOT_SUPPORTED)
            if hasattr(type(info), "healthSummary")
            else FabricHealthSummary.NOT_SUPPORTED
        )
        return FabricInfo(
            gpu_index=index,
            cluster_uuid=format_cluster_uuid(bytes(info.clusterUuid)),
            clique_id=int(info.cliqueId),
            state=state,
            status=status_name(int(info.status)),
            health_mask=mask,
            health=decode_health_mask(mask),
            health_summary=summary,
        )

    def _nv_struct(self, name: str) -> Any:
        return getattr(self._nv, name)()

    # ---------------------------------------------------------------- samples

    def _field_values(self, h: Any, ids: list[Any]) -> dict[Any, Any]:
        """Bulk field read; entries whose own ``nvmlReturn`` is not SUCCESS are left out."""
        if not ids:
            return {}
        values = self._optional("nvmlDeviceGetFieldValues", h, ids)
        if values is None:
            return {}
        out: dict[Any, Any] = {}
        for request, entry in zip(ids, values, strict=True):
            if int(entry.nvmlReturn) != 0:
                continue
            out[request] = _field_value(entry)
        return out

    def _link_traffic(self, h: Any, links: list[int]) -> dict[int, tuple[int | None, int | None]]:
        """Per-link (tx, rx) bytes: the NVLink-5 byte counters (202/204), else the link-scoped
        throughput fields 138/139 in KiB (Hopper, Ampere and older)."""
        per_link = (FI_NVLINK_COUNT_XMIT_BYTES, FI_NVLINK_COUNT_RCV_BYTES)
        fields = self._field_values(h, [(fid, link) for link in links for fid in per_link])
        out: dict[int, tuple[int | None, int | None]] = {}
        missing: list[int] = []
        for link in links:
            tx = _int_or_none(fields.get((FI_NVLINK_COUNT_XMIT_BYTES, link)))
            rx = _int_or_none(fields.get((FI_NVLINK_COUNT_RCV_BYTES, link)))
            out[link] = (tx, rx)
            if tx is None and rx is None:
                missing.append(link)
        if missing:
            older = (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX)
            kib = self._field_values(h, [(fid, link) for link in missing for fid in older])
            for link in missing:
                tx = _int_or_none(kib.get((FI_NVLINK_THROUGHPUT_DATA_TX, link)))
                rx = _int_or_none(kib.get((FI_NVLINK_THROUGHPUT_DATA_RX, link)))
                out[link] = (tx * 1024 if tx is not None else None, rx * 1024 if rx is not None else None)
        return out

    def _temperature(self, h: Any) -> Any:
        try:
            return self._call("nvmlDeviceGetTemperatureV", h, 0, quiet=_UNSUPPORTED)
        except NVMLError as exc:
            if exc.value == _NOT_SUPPORTED:
                return None
            if exc.value != _FUNCTION_NOT_FOUND:
                raise
        return self._optional("nvmlDeviceGetTemperature", h, 0)  # a driver before 13.x's versioned call

    def _clocks_event_reasons(self, h: Any) -> Any:
        try:
            return self._call("nvmlDeviceGetCurrentClocksEventReasons", h, quiet=_UNSUPPORTED)
        except NVMLError as exc:
            if exc.value == _NOT_SUPPORTED:
                return None
            if exc.value != _FUNCTION_NOT_FOUND:
                raise
        return self._optional("nvmlDeviceGetCurrentClocksThrottleReasons", h)  # older drivers' name

    @_reports_lost
    def sample(self, index: int) -> GpuSample:
        h = self._handle(index)
        fields = self._field_values(h, list(_DEVICE_FIELDS))
        util = self._optional("nvmlDeviceGetUtilizationRates", h)
        memory = self._optional("nvmlDeviceGetMemoryInfo", h)
        temp = self._temperature(h)
        power_mw = fields.get(FI_POWER_INSTANT)
        if power_mw is None:
            power_mw = self._optional("nvmlDeviceGetPowerUsage", h)
        energy_mj = fields.get(FI_TOTAL_ENERGY_CONSUMPTION)
        if energy_mj is None:
            energy_mj = self._optional("nvmlDeviceGetTotalEnergyConsumption", h)
        links = self._links(h)
        traffic = self._link_traffic(h, list(links))
        counters: list[NvLinkCounters] = []
        for link, state in links.items():
            errors: dict[str, int | None] = {}
            for key, counter in _NVLINK_ERRORS.items():
                value = self._link_counter(h, link, counter)
                errors[key] = value
            counters.append(
                NvLinkCounters(
                    link=link,
                    active=state == 1,
                    tx_bytes=traffic[link][0],
                    rx_bytes=traffic[link][1],
                    **errors,
                )
            )
        pending = fields.get(FI_REMAPPED_PENDING)
        failure = fields.get(FI_REMAPPED_FAILURE)
        return GpuSample(
            gpu_index=index,
            gpu_utilization_percent=int(util.gpu) if util is not None else None,
            memory_utilization_percent=int(util.memory) if util is not None else None,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_free_bytes=int(memory.free) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            temperature_celsius=int(temp) if temp is not None else None,
            memory_temperature_celsius=_int_or_none(fields.get(FI_MEMORY_TEMP)),
            power_watts=float(power_mw) / 1000 if power_mw is not None else None,
            energy_joules=float(energy_mj) / 1000 if energy_mj is not None else None,
            sm_clock_mhz=_int_or_none(self._optional("nvmlDeviceGetClockInfo", h, 1)),
            memory_clock_mhz=_int_or_none(self._optional("nvmlDeviceGetClockInfo", h, 2)),
            throttle_reasons=_int_or_none(self._clocks_event_reasons(h)),
            pcie_replays=_int_or_none(fields.get(FI_PCIE_REPLAY_COUNTER)),
            ecc_corrected_volatile=_int_or_none(fields.get(FI_ECC_SBE_VOL_TOTAL)),
            ecc_uncorrected_volatile=_int_or_none(fields.get(FI_ECC_DBE_VOL_TOTAL)),
            ecc_corrected_aggregate=_int_or_none(fields.get(FI_ECC_SBE_AGG_TOTAL)),
            ecc_uncorrected_aggregate=_int_or_none(fields.get(FI_ECC_DBE_AGG_TOTAL)),
            remapped_rows_correctable=_int_or_none(fields.get(FI_REMAPPED_COR)),
            remapped_rows_uncorrectable=_int_or_none(fields.get(FI_REMAPPED_UNC)),
            remapped_rows_pending=bool(pending) if pending is not None else None,
            remapped_rows_failure=bool(failure) if failure is not None else None,
            nvlinks=tuple(counters),
            processes=self._processes(h),
        )

    def _link_counter(self, h: Any, link: int, counter: int) -> int | None:
        return _int_or_none(self._link_optional("nvmlDeviceGetNvLinkErrorCounter", h, link, counter))

    def _processes(self, h: Any) -> tuple[ProcessInfo, ...]:
        """Compute processes; empty where not supported, not permitted (MIG parents without
        privileges) or where the library lacks the versioned call."""
        procs = self._optional("nvmlDeviceGetComputeRunningProcesses", h, also=_QUIET_PERMISSION) or []
        out = []
        for p in procs:
            gi = getattr(p, "gpuInstanceId", _NO_INSTANCE)
            ci = getattr(p, "computeInstanceId", _NO_INSTANCE)
            used = getattr(p, "usedGpuMemory", None)
            out.append(
                ProcessInfo(
                    pid=int(p.pid),
                    used_memory_bytes=int(used) if used is not None else None,
                    gpu_instance_id=None if gi in (None, _NO_INSTANCE) else int(gi),
                    compute_instance_id=None if ci in (None, _NO_INSTANCE) else int(ci),
                )
            )
        return tuple(out)

    @_reports_lost
    def health_reading(self, index: int) -> HealthReading:
        """One identity query and one bulk field read: volatile ECC counts, row remap pending/failed,
        retirement pending (NVML_FI_DEV_RETIRED_PENDING); ``None`` where the GPU does not support one."""
        h = self._handle(index)
        uuid = _str(self._call("nvmlDeviceGetUUID", h))
        fields = self._field_values(h, list(_HEALTH_FIELDS))

        def flag(fid: int) -> bool | None:
            value = fields.get(fid)
            return bool(value) if value is not None else None

        return HealthReading(
            uuid=uuid,
            ecc_corrected_volatile=_int_or_none(fields.get(FI_ECC_SBE_VOL_TOTAL)),
            ecc_uncorrected_volatile=_int_or_none(fields.get(FI_ECC_DBE_VOL_TOTAL)),
            remapped_rows_pending=flag(FI_REMAPPED_PENDING),
            remapped_rows_failure=flag(FI_REMAPPED_FAILURE),
            retired_pages_pending=flag(FI_RETIRED_PENDING),
        )

    def mig_sample(self, uuid: str) -> MigSample:
        # fetched for each use: NVML may hand a cached MIG handle to another instance after reconfiguration
        mig = self._call("nvmlDeviceGetHandleByUUID", uuid)
        memory = self._optional("nvmlDeviceGetMemoryInfo", mig)
        return MigSample(
            uuid=uuid,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            processes=self._processes(mig),
        )

    @_reports_lost
    def process_utilization(self, index: int) -> tuple[ProcessUtilization, ...]:
        h = self._handle(index)
        # NOT_FOUND: no samples since last time; 0: pynvml raises "success" when there are none
        none = frozenset({0, _NOT_FOUND, *_UNSUPPORTED, _NO_PERMISSION})
        try:
            samples = self._call(
                "nvmlDeviceGetProcessUtilization",
                h,
                self._process_ts.get(index, 0),
                quiet=none - {_NOT_SUPPORTED},
            )
        except NVMLError as exc:
            if exc.value in none:
                return ()
            raise
        latest = self._process_ts.get(index, 0)
        out: dict[int, ProcessUtilization] = {}
        for s in samples:
            latest = max(latest, int(s.timeStamp))
            out[int(s.pid)] = ProcessUtilization(
                pid=int(s.pid), sm_percent=int(s.smUtil), memory_percent=int(s.memUtil)
            )
        self._process_ts[index] = latest
        return tuple(out[pid] for pid in sorted(out))

    # ---------------------------------------------------------------- events

    def register_events(self, indices: tuple[int, ...]) -> None:
        """Register the health events of ``indices``. A GPU that does not support registration gets
        no events (the set still serves the others, as ``nvml.h`` says); a lost GPU is skipped,
        reported once, and registered again when it answers. NVML cannot unregister: a GPU left out
        stays on the current set until the set is rebuilt (only the waiting thread frees a set)."""
        with self._event_lock:
            if self._event_set is None:
                self._event_set = self._call("nvmlEventSetCreate")
            self._wanted = tuple(sorted(set(indices)))
            self._registered = self._register_on_set(
                [i for i in self._wanted if i not in self._registered], self._registered
            )

    def _register_on_set(self, indices: list[int], registered: tuple[int, ...]) -> tuple[int, ...]:
        """Register ``indices`` on the current set; returns ``registered`` plus those now on it."""
        done = set(registered)
        for index in indices:
            try:
                h = self._handle(index)
                if index not in self._uuids:
                    self._uuids[index] = _str(self._call("nvmlDeviceGetUUID", h))
                supported = self._optional("nvmlDeviceGetSupportedEventTypes", h)
                mask = HEALTH_EVENTS & int(supported or 0)
                if mask:
                    self._call("nvmlDeviceRegisterEvents", h, mask, self._event_set)
            except NVMLError as exc:
                if exc.value in _UNSUPPORTED:
                    log.info("nvml_events_not_supported", gpu=index, hint="health follows probes for it")
                    done.add(index)  # nothing to register: the set serves the others
                    continue
                if exc.value in LOST_CODES:
                    self._report_lost(index)
                    continue
                raise
            self._lost_reported.discard(index)
            done.add(index)
        return tuple(sorted(done))

    def _report_lost(self, index: int) -> None:
        if index not in self._lost_reported:
            self._lost_reported.add(index)
            self._pending.append(NvmlEvent(EventKind.GPU_LOST, index, self._uuids.get(index, "")))

    def note_lost(self, index: int) -> None:
        """A call answered GPU_IS_LOST for GPU ``index``: report it once (from any thread)."""
        with self._event_lock:
            self._report_lost(index)

    def _rebuild_event_set(self) -> None:
        """Free the event set and build a new one with the wanted GPUs that still answer."""
        old, self._event_set = self._event_set, None
        if old is not None:
            with contextlib.suppress(NVMLError):
                self._call("nvmlEventSetFree", old, quiet=LOST_CODES)
        self._event_set = self._call("nvmlEventSetCreate")
        self._lost_on_set.clear()
        alive = [i for i in self._wanted if not self._is_lost(i)]
        self._registered = self._register_on_set(alive, ())

    def _is_lost(self, index: int) -> bool:
        """Probe one GPU; a newly lost GPU is reported (and counted) once, a known one quietly."""
        known = index in self._lost_reported
        try:
            self._call("nvmlDeviceGetUUID", self._handle(index), quiet=LOST_CODES if known else frozenset())
        except NVMLError as exc:
            if exc.value in LOST_CODES:
                self._report_lost(index)
                return True
            raise
        return False

    def wait_event(self, timeout_ms: int) -> NvmlEvent | None:
        if self._pending:
            return self._pending.popleft()
        if self._event_set is None:
            raise NVMLError(CODES["UNINITIALIZED"])
        self._readmit_recovered()
        if self._pending:
            return self._pending.popleft()
        try:
            data = self._call("nvmlEventSetWait_v2", self._event_set, timeout_ms, quiet=_WAIT_ANSWERS)
        except NVMLError as exc:
            if exc.value == _TIMEOUT:
                self._lost_wait_seen = self._set_rebuilt = False
                return None
            if exc.value in LOST_CODES:
                return self._after_lost_wait(exc.value, timeout_ms)
            raise
        self._lost_wait_seen = self._set_rebuilt = False
        index = int(self._call("nvmlDeviceGetIndex", data.device))
        kind = next((k for mask, k in _EVENT_KINDS if int(data.eventType) & mask), None)
        if kind is None:
            return None
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        return NvmlEvent(
            kind=kind,
            gpu_index=index,
            gpu_uuid=self._uuids.get(index, ""),
            xid=int(data.eventData) if kind is EventKind.XID else None,
            gpu_instance_id=None if gi == _NO_INSTANCE else gi,
            compute_instance_id=None if ci == _NO_INSTANCE else ci,
        )

    def take_lost_reports(self) -> tuple[NvmlEvent, ...]:
        taken: list[NvmlEvent] = []
        while self._pending:  # popleft is atomic: reporters append under the lock, takers pop without it
            try:
                taken.append(self._pending.popleft())
            except IndexError:  # the waiting thread took the last one
                break
        return tuple(taken)

    def _after_lost_wait(self, code: int, timeout_ms: int) -> NvmlEvent | None:
        """The set answered GPU_IS_LOST. Newly lost GPUs are reported (once each) and the set kept, so
        the healthy GPUs' events queued on it still come; when it answers GPU_IS_LOST with nothing newly
        lost, it is freed and built again with the GPUs that answer; if even that does not help, the
        wait backs off (sleeps its timeout) instead of spinning, and the episode is counted once."""
        with self._event_lock:
            newly = [i for i in self._registered if i not in self._lost_on_set and self._is_lost(i)]
            self._lost_on_set.update(newly)  # reported by now (here, or earlier by another call)
            if newly:
                return self._pending.popleft() if self._pending else None
            if not self._set_rebuilt:
                self._set_rebuilt = True
                self._rebuild_event_set()
                return self._pending.popleft() if self._pending else None
        if not self._lost_wait_seen:
            self._count_error(code)
            self._lost_wait_seen = True
            log.warning(
                "nvml_event_wait_gpu_lost",
                registered=list(self._registered),
                hint="the driver answers GPU_IS_LOST on a set of GPUs that answer; check dmesg for Xid 79",
            )
        self._sleep(max(timeout_ms, 0) / 1000)
        return None

    def _readmit_recovered(self) -> None:
        """Register again the wanted GPUs that were lost and answer now."""
        with self._event_lock:
            for index in sorted(self._lost_reported & set(self._wanted)):
                if not self._is_lost(index):
                    self._lost_reported.discard(index)
                    self._lost_on_set.discard(index)
                    self._registered = self._register_on_set([index], self._registered)

    def counters(self) -> NvmlCounters:
        return NvmlCounters(calls=self._calls, errors_by_code=dict(self._errors))


def _platform_info(info: Any) -> PlatformInfo:
    def byte(name: str) -> int:
        return _raw_field(info, name, 1)[0]

    guid = format_ib_guid(_raw_field(info, "ibGuid", 16))
    if hasattr(type(info), "chassisSerialNumber"):  # v2
        return PlatformInfo(
            chassis_serial=_text(_raw_field(info, "chassisSerialNumber", 16)),
            slot_number=byte("slotNumber"),
            tray_index=byte("trayIndex"),
            host_id=byte("hostId"),
            module_id=byte("moduleId"),
            peer_type=byte("peerType"),
            ib_guid=guid,
        )
    rack = _raw_field(info, "rackGuid", 16)
    return PlatformInfo(
        chassis_serial=rack.hex() if any(rack) else "",
        slot_number=byte("chassisPhysicalSlotNumber"),
        tray_index=byte("computeSlotIndex"),
        host_id=byte("nodeIndex"),
        module_id=byte("moduleId"),
        peer_type=byte("peerType"),
        ib_guid=guid,
    )


def _int_or_none(value: Any) -> int | None:
    return int(value) if value is not None else None


def _field_value(entry: Any) -> float | int:
    kind = int(entry.valueType)
    v = entry.value
    if kind == 0:
        return float(v.dVal)
    raw = {1: v.uiVal, 2: v.ulVal, 3: v.ullVal, 4: v.sllVal, 5: v.siVal, 6: v.usVal}.get(kind, v.ullVal)
    return int(raw)


def _import_pynvml() -> ModuleType:
    import pynvml  # noqa: PLC0415 - lazy: the package must import without the NVML binding

    module: ModuleType = pynvml
    return module
