"""The real NVML backend over pynvml (``nvidia-ml-py`` >= 13) — the only module that imports ``pynvml``.

``pynvml`` is imported inside :meth:`RealNvml.init`, so the package imports on machines without the
library (a missing module is reported as ``NVMLError_LibraryNotFound``). Every ``pynvml.NVMLError`` is
translated into ``agent.nvml.errors.NVMLError(code)``; "not supported" (and "function not found" on older
drivers) becomes ``None`` / an empty tuple, as the protocol says.

Binding details handled here (see the project's NVML reference, §9.3):
- fabric info through the versioned ``c_nvmlGpuFabricInfo_v3_t`` (``healthSummary``), clusterUuid
  formatted from its 16 raw bytes, healthMask decoded by :func:`decode_health_mask`;
- ``nvmlDeviceIsMigDeviceHandle`` returns a ``c_uint``: use ``.value``;
- NVLink links are iterated until INVALID_ARGUMENT / NOT_SUPPORTED (``NVML_NVLINK_MAX_LINKS`` is 18 or 36
  depending on the binding; GB200 answers INVALID_ARGUMENT beyond link 17);
- ``nvmlDeviceGetFieldValues`` succeeds overall while entries fail: each entry's ``nvmlReturn`` is checked;
- ``nvmlEventSetWait_v2`` signals a timeout by raising: that is ``None`` here;
- platform-info single-byte fields are ``c_char`` (read raw, not through pynvml's str decoding).

This module cannot be exercised without a GPU; ``tests/agent/test_contract.py`` (marker ``gpu``) runs the
same assertions against it as against the simulator.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import uuid as uuidlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from agent.host import cpulist_from_masks
from agent.nvml.errors import CODES, LOST_CODES, NVMLError
from agent.nvml.fabric import decode_health_mask
from agent.nvml.protocol import (
    EventKind,
    GpuSample,
    MigSample,
    NvLinkCounters,
    NvmlCounters,
    NvmlEvent,
    ProcessInfo,
    ProcessUtilization,
)
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

_NOT_SUPPORTED = CODES["NOT_SUPPORTED"]
_FUNCTION_NOT_FOUND = CODES["FUNCTION_NOT_FOUND"]
_INVALID_ARGUMENT = CODES["INVALID_ARGUMENT"]
_NOT_FOUND = CODES["NOT_FOUND"]
_TIMEOUT = CODES["TIMEOUT"]
_ARGUMENT_VERSION_MISMATCH = CODES["ARGUMENT_VERSION_MISMATCH"]
_UNSUPPORTED = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND})

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
FI_MEMORY_TEMP = 82
FI_TOTAL_ENERGY_CONSUMPTION = 83  # mJ
FI_PCIE_REPLAY_COUNTER = 94
FI_REMAPPED_COR = 142
FI_REMAPPED_UNC = 143
FI_REMAPPED_PENDING = 144
FI_REMAPPED_FAILURE = 145
FI_POWER_INSTANT = 186  # mW
FI_NVLINK_COUNT_XMIT_BYTES = 202
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


# --------------------------------------------------------------------------- the backend


class RealNvml:
    """:class:`agent.nvml.protocol.NvmlBackend` over the driver's NVML library."""

    def __init__(self, *, loader: Callable[[], ModuleType] | None = None) -> None:
        self._loader = loader or _import_pynvml
        self._nv: Any = None
        self._handles: dict[int, Any] = {}
        self._uuids: dict[int, str] = {}
        self._mig_handles: dict[str, Any] = {}
        self._event_set: Any = None
        self._registered: tuple[int, ...] = ()
        self._lost_reported: set[int] = set()
        self._pending: collections.deque[NvmlEvent] = collections.deque()
        self._process_ts: dict[int, int] = {}
        self._calls = 0
        self._errors: collections.Counter[str] = collections.Counter()

    # ---------------------------------------------------------------- plumbing

    def _call(self, fn_name: str, *args: Any) -> Any:
        if self._nv is None:
            self._count_error(CODES["UNINITIALIZED"])
            raise NVMLError(CODES["UNINITIALIZED"])
        self._calls += 1
        try:
            return getattr(self._nv, fn_name)(*args)
        except self._nv.NVMLError as exc:
            code = int(exc.value)
            self._count_error(code)
            raise NVMLError(code) from None

    def _count_error(self, code: int) -> None:
        self._errors[NVMLError(code).name] += 1

    def _optional(self, fn_name: str, *args: Any) -> Any:
        """A call whose "not supported" answer is ``None``."""
        try:
            return self._call(fn_name, *args)
        except NVMLError as exc:
            if exc.value in _UNSUPPORTED:
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
        if self._nv is None:
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
            self._nv = module

    def shutdown(self) -> None:
        if self._nv is None:
            return
        try:
            if self._event_set is not None:
                self._call("nvmlEventSetFree", self._event_set)
        except NVMLError:
            pass
        finally:
            self._event_set = None
            nv, self._nv = self._nv, None
            self._handles.clear()
            self._mig_handles.clear()
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
        info = self._nv.c_nvmlPlatformInfo_v2_t()
        try:
            self._call("nvmlDeviceGetPlatformInfo", h, ctypes.byref(info))
        except NVMLError as exc:
            if exc.value in _UNSUPPORTED or exc.value == _ARGUMENT_VERSION_MISMATCH:
                return None
            raise

        def byte(name: str) -> int:
            return _raw_field(info, name, 1)[0]

        guid = _raw_field(info, "ibGuid", 16)
        return PlatformInfo(
            chassis_serial=_text(_raw_field(info, "chassisSerialNumber", 16)),
            slot_number=byte("slotNumber"),
            tray_index=byte("trayIndex"),
            host_id=byte("hostId"),
            module_id=byte("moduleId"),
            peer_type=byte("peerType"),
            ib_guid=format_ib_guid(guid),
        )

    # ---------------------------------------------------------------- NVLink, PCIe

    def _links(self, h: Any) -> list[int]:
        """Link indices the API answers for, stopping at INVALID_ARGUMENT / NOT_SUPPORTED."""
        links: list[int] = []
        for link in range(int(getattr(self._nv, "NVML_NVLINK_MAX_LINKS", 36))):
            try:
                self._call("nvmlDeviceGetNvLinkState", h, link)
            except NVMLError as exc:
                if exc.value in (_INVALID_ARGUMENT, *_UNSUPPORTED):
                    break
                raise
            links.append(link)
        return links

    def nvlinks(self, index: int) -> tuple[NvLink, ...]:
        h = self._handle(index)
        out: list[NvLink] = []
        for link in range(int(getattr(self._nv, "NVML_NVLINK_MAX_LINKS", 36))):
            try:
                state = self._call("nvmlDeviceGetNvLinkState", h, link)
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
            return self._call(fn_name, h, link, *extra)
        except NVMLError as exc:
            if exc.value in (_INVALID_ARGUMENT, *_UNSUPPORTED):
                return None
            raise

    def pcie_level(self, a: int, b: int) -> LinkLevel | None:
        level = self._optional("nvmlDeviceGetTopologyCommonAncestor", self._handle(a), self._handle(b))
        return TOPOLOGY_LEVELS.get(int(level)) if level is not None else None

    # ---------------------------------------------------------------- MIG

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
        for profile in range(_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", h, profile)
            except NVMLError as exc:
                if exc.value in (_INVALID_ARGUMENT, _NOT_FOUND, *_UNSUPPORTED):
                    continue
                raise
            if int(info.instanceCount) == 0:
                continue
            array = (self._nv.c_nvmlGpuInstance_t * int(info.instanceCount))()
            count = ctypes.c_uint(0)
            self._call("nvmlDeviceGetGpuInstances", h, int(info.id), array, ctypes.byref(count))
            name = _str(info.name).removeprefix("MIG ").strip()
            for i in range(count.value):
                gi = array[i]
                gi_info = self._call("nvmlGpuInstanceGetInfo", gi)
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
        devices = self._mig_devices(index, h, gi_profiles)
        return MigState(
            gpu_index=index,
            current_enabled=True,
            pending_enabled=pending,
            gpu_instances=tuple(sorted(gis, key=lambda g: g.id)),
            compute_instances=tuple(sorted(cis, key=lambda c: (c.gpu_instance_id, c.id))),
            devices=devices,
        )

    def _compute_instances(self, index: int, gi: Any, gi_id: int) -> list[ComputeInstance]:
        out: list[ComputeInstance] = []
        for profile in range(_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = self._call(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, profile, _CI_ENGINE_PROFILE_SHARED
                )
            except NVMLError as exc:
                if exc.value in (_INVALID_ARGUMENT, _NOT_FOUND, *_UNSUPPORTED):
                    continue
                raise
            if int(info.instanceCount) == 0:
                continue
            array = (self._nv.c_nvmlComputeInstance_t * int(info.instanceCount))()
            count = ctypes.c_uint(0)
            self._call("nvmlGpuInstanceGetComputeInstances", gi, int(info.id), array, ctypes.byref(count))
            for i in range(count.value):
                ci_info = self._call("nvmlComputeInstanceGetInfo", array[i])
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
        for slot in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", h))):
            try:
                mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", h, slot)
            except NVMLError as exc:
                if exc.value in (_NOT_FOUND, _INVALID_ARGUMENT):
                    continue
                raise
            if not self._call("nvmlDeviceIsMigDeviceHandle", mig).value:
                continue
            uuid = _str(self._call("nvmlDeviceGetUUID", mig))
            self._mig_handles[uuid] = mig
            gi_id = int(self._call("nvmlDeviceGetGpuInstanceId", mig))
            ci_id = int(self._call("nvmlDeviceGetComputeInstanceId", mig))
            attrs = self._call("nvmlDeviceGetAttributes", mig)
            memory = self._optional("nvmlDeviceGetMemoryInfo", mig)
            profile, gi_slices, mem_slices = gi_profiles.get(gi_id, ("", int(attrs.gpuInstanceSliceCount), 0))
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

    def fabric(self, index: int) -> FabricInfo | None:
        h = self._handle(index)
        info = self._nv.c_nvmlGpuFabricInfo_v3_t()
        has_summary = True
        try:
            self._call("nvmlDeviceGetGpuFabricInfoV", h, ctypes.byref(info))
        except NVMLError as exc:
            if exc.value in _UNSUPPORTED:
                return None
            if exc.value != _ARGUMENT_VERSION_MISMATCH:
                raise
            info = self._nv.c_nvmlGpuFabricInfo_v2_t()  # a driver without v3
            has_summary = False
            try:
                self._call("nvmlDeviceGetGpuFabricInfoV", h, ctypes.byref(info))
            except NVMLError as exc2:
                if exc2.value in _UNSUPPORTED:
                    return None
                raise
        state = FABRIC_STATES.get(int(info.state) & 0xFF, FabricState.NOT_SUPPORTED)
        if state is FabricState.NOT_SUPPORTED:
            return None
        mask = int(info.healthMask)
        summary = (
            HEALTH_SUMMARIES.get(int(info.healthSummary), FabricHealthSummary.NOT_SUPPORTED)
            if has_summary
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

    def sample(self, index: int) -> GpuSample:
        h = self._handle(index)
        fields = self._field_values(h, list(_DEVICE_FIELDS))
        util = self._optional("nvmlDeviceGetUtilizationRates", h)
        memory = self._optional("nvmlDeviceGetMemoryInfo", h)
        temp = self._optional("nvmlDeviceGetTemperature", h, 0)
        power_mw = fields.get(FI_POWER_INSTANT)
        if power_mw is None:
            power_mw = self._optional("nvmlDeviceGetPowerUsage", h)
        energy_mj = fields.get(FI_TOTAL_ENERGY_CONSUMPTION)
        if energy_mj is None:
            energy_mj = self._optional("nvmlDeviceGetTotalEnergyConsumption", h)
        links = self._links(h)
        per_link = (FI_NVLINK_COUNT_XMIT_BYTES, FI_NVLINK_COUNT_RCV_BYTES)
        link_fields = self._field_values(h, [(fid, link) for link in links for fid in per_link])
        counters: list[NvLinkCounters] = []
        for link in links:
            state = self._link_optional("nvmlDeviceGetNvLinkState", h, link)
            errors: dict[str, int | None] = {}
            for key, counter in _NVLINK_ERRORS.items():
                value = self._link_counter(h, link, counter)
                errors[key] = value
            counters.append(
                NvLinkCounters(
                    link=link,
                    active=state is not None and int(state) == 1,
                    tx_bytes=_int_or_none(link_fields.get((FI_NVLINK_COUNT_XMIT_BYTES, link))),
                    rx_bytes=_int_or_none(link_fields.get((FI_NVLINK_COUNT_RCV_BYTES, link))),
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
            throttle_reasons=_int_or_none(self._optional("nvmlDeviceGetCurrentClocksEventReasons", h)),
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
        procs = self._optional("nvmlDeviceGetComputeRunningProcesses", h) or []
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

    def mig_sample(self, uuid: str) -> MigSample:
        mig = self._mig_handles.get(uuid)
        if mig is None:
            mig = self._call("nvmlDeviceGetHandleByUUID", uuid)
            self._mig_handles[uuid] = mig
        memory = self._optional("nvmlDeviceGetMemoryInfo", mig)
        return MigSample(
            uuid=uuid,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            processes=self._processes(mig),
        )

    def process_utilization(self, index: int) -> tuple[ProcessUtilization, ...]:
        h = self._handle(index)
        try:
            samples = self._call("nvmlDeviceGetProcessUtilization", h, self._process_ts.get(index, 0))
        except NVMLError as exc:
            # NOT_FOUND: no samples since last time; 0: pynvml raises "success" when there are none
            if exc.value in (0, _NOT_FOUND, *_UNSUPPORTED):
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
        if self._event_set is None:
            self._event_set = self._call("nvmlEventSetCreate")
        for index in indices:
            h = self._handle(index)
            supported = self._optional("nvmlDeviceGetSupportedEventTypes", h)
            mask = HEALTH_EVENTS & int(supported or 0)
            if mask:
                self._call("nvmlDeviceRegisterEvents", h, mask, self._event_set)
            if index not in self._uuids:
                self._uuids[index] = _str(self._call("nvmlDeviceGetUUID", h))
        self._registered = tuple(sorted(set(self._registered) | set(indices)))

    def wait_event(self, timeout_ms: int) -> NvmlEvent | None:
        if self._pending:
            return self._pending.popleft()
        if self._event_set is None:
            raise NVMLError(CODES["UNINITIALIZED"])
        try:
            data = self._call("nvmlEventSetWait_v2", self._event_set, timeout_ms)
        except NVMLError as exc:
            if exc.value == _TIMEOUT:
                return None
            if exc.value in LOST_CODES:
                self._pending.extend(self._lost_events())
                return self._pending.popleft() if self._pending else None
            raise
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

    def _lost_events(self) -> list[NvmlEvent]:
        """Which registered GPUs stopped answering: probe each (the wait does not say)."""
        out: list[NvmlEvent] = []
        for index in self._registered:
            try:
                self._call("nvmlDeviceGetUUID", self._handle(index))
            except NVMLError as exc:
                if exc.value in LOST_CODES and index not in self._lost_reported:
                    self._lost_reported.add(index)
                    out.append(NvmlEvent(EventKind.GPU_LOST, index, self._uuids.get(index, "")))
                continue
            self._lost_reported.discard(index)
        return out

    def counters(self) -> NvmlCounters:
        return NvmlCounters(calls=self._calls, errors_by_code=dict(self._errors))


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
