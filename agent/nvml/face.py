"""pynvml's own face over the simulated machine: what ``RealNvml`` calls when ``--simulate`` is given.

:class:`SimulatedPynvml` is a module-like object with the ``pynvml`` functions the real backend calls
(same names, same signatures), returning pynvml's own ctypes structs and handle types
(``c_nvmlDevice_t``, ``c_nvmlMemory_t``, ``c_nvmlGpuFabricInfo_v3_t`` …) and raising pynvml's
``NVMLError`` subclasses (``pynvml.NVMLError(code)`` picks the subclass), so the one composition in
:mod:`agent.nvml.real` runs unchanged over a simulated machine. It also carries the pynvml names the
backend reads from the module (``NVMLError``, ``NVMLLibraryMismatchError``, struct classes, constants).

Handles are pynvml pointer types holding addresses that stand for simulated objects (never
dereferenced): a GPU, a MIG device, a GPU or compute instance, an event set. A MIG handle dies with
its instance: after a MIG reconfiguration the old handle answers INVALID_ARGUMENT, as NVML's handles
may not be used once their instance is gone.

What a driver does, the face does:

- an event set with a lost GPU registered answers GPU_IS_LOST on every ``nvmlEventSetWait`` once the
  events queued before the loss are drained (NVIDIA documents this after Xid 79); only freeing the set
  and building a new one without that GPU brings the waits back;
- bulk field reads (``nvmlDeviceGetFieldValues``) succeed overall while each entry carries its own
  ``nvmlReturn``; NVLink byte counters 202/204 exist on NVLink 5 parts only, older parts answer the
  link-scoped throughput fields 138/139 in KiB;
- the simulator's virtual time of a GPU advances one second per bulk read of its device-scope fields
  (one sampling round), unless the simulator has an injected clock.

Older drivers: ``missing`` names C symbols the simulated library lacks (``nvmlDeviceGetGpuFabricInfoV``,
``nvmlDeviceGetCurrentClocksEventReasons``, ``nvmlDeviceGetTemperatureV``,
``nvmlDeviceGetComputeRunningProcesses_v3`` …): pynvml answers FUNCTION_NOT_FOUND for them, and
``NVMLLibraryMismatchError`` for the unversioned process-list call whose ``_v3`` symbol is missing.
``platform_info_versions`` lists the platform-info struct versions the driver knows (a v1-only driver
answers ARGUMENT_VERSION_MISMATCH to a v2 struct).

Errors: the simulator's ``inject_error(code, call=NAME)`` accepts these pynvml function names as well
as its primitives' names; an injected error on a pynvml name is raised by that face call.
"""

# pynvml's own function, struct and constant names
# ruff: noqa: N802, N815
from __future__ import annotations

import ctypes
import functools
import itertools
import uuid as uuidlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pynvml

from agent.host import parse_cpulist
from agent.nvml.errors import CODES
from agent.nvml.errors import NVMLError as SimError

if TYPE_CHECKING:
    from agent.nvml.fake import PlacedInstance, SimulatedNvml, _GpuState

F = TypeVar("F", bound=Callable[..., Any])

MIB = 1024 * 1024
_NO_INSTANCE = 0xFFFFFFFF
NVLINK5_VERSION_ENUM = 7  # NVML_NVLINK_VERSION_5_0

# C symbol behind each face function where it differs from the function's own name
_SYMBOLS: dict[str, str] = {
    "nvmlDeviceGetComputeRunningProcesses": "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGpuInstanceProfileInfo": "nvmlDeviceGetGpuInstanceProfileInfoV",
    "nvmlGpuInstanceGetComputeInstanceProfileInfo": "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
    "nvmlComputeInstanceGetInfo": "nvmlComputeInstanceGetInfo_v2",
    "nvmlDeviceGetAttributes": "nvmlDeviceGetAttributes_v2",
    "nvmlDeviceGetTemperatureV": "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetHandleByIndex": "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetCount": "nvmlDeviceGetCount_v2",
}
# pynvml wraps these unversioned calls in ``throwOnVersionMismatch``
_VERSIONED_WRAPPERS = frozenset({"nvmlDeviceGetComputeRunningProcesses"})

# field ids (nvidia-ml-py 13.615.71)
_FI_ECC = {3: (0, 0), 4: (1, 0), 5: (0, 1), 6: (1, 1)}  # (error type, counter type)
_FI_MEMORY_TEMP = 82
_FI_ENERGY = 83
_FI_PCIE_REPLAY = 94
_FI_REMAPPED = {142: 0, 143: 1, 144: 2, 145: 3}
_FI_POWER_INSTANT = 186
_FI_NVLINK_THROUGHPUT_TX = 138  # KiB, link scope, pre-NVLink-5
_FI_NVLINK_THROUGHPUT_RX = 139
_FI_NVLINK_XMIT_BYTES = 202  # bytes, link scope, NVLink 5
_FI_NVLINK_RCV_BYTES = 204
_VALUE_UINT = 1
_VALUE_ULL = 3

_ADDRESS = itertools.count(0x10000, 0x10)


def _handle_address(handle: Any) -> int:
    known = getattr(handle, "_sim_address", None)  # set on the handles the face hands out
    if known is not None:
        return int(known)
    value = ctypes.cast(handle, ctypes.c_void_p).value
    return int(value or 0)


def _pointer(kind: Any, address: int) -> Any:
    pointer = ctypes.cast(ctypes.c_void_p(address), kind)
    pointer._sim_address = address  # the same value, without a ctypes cast on every call
    return pointer


def _target(ref: Any) -> Any:
    """The object behind ``ctypes.byref(x)`` (or ``x`` itself)."""
    return getattr(ref, "_obj", ref)


def _raise(code: int) -> None:
    raise pynvml.NVMLError(code)


@dataclass(frozen=True, slots=True)
class _Device:
    """A GPU, or the MIG device in slot ``mig_slot`` of it (whatever instance holds that slot now)."""

    gpu: int
    mig_slot: int | None = None


@dataclass(frozen=True, slots=True)
class _Instance:
    gpu: int
    gi_id: int  # the GPU instance (with its single, full-size compute instance)
    compute: bool  # a compute instance handle rather than a GPU instance handle


def _face(fn: F) -> F:
    """A pynvml call: a missing symbol, an injected error, and the simulator's errors as pynvml's."""
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(self: SimulatedPynvml, *args: Any, **kwargs: Any) -> Any:
        symbol = _SYMBOLS.get(name, name)
        if symbol in self.missing or name in self.missing:
            if name in _VERSIONED_WRAPPERS:
                raise pynvml.NVMLLibraryMismatchError(
                    f"Unversioned function called and the pyNVML version does not match the NVML lib "
                    f"version. Either use matching pyNVML and NVML lib versions or use a versioned "
                    f"function such as {name}_v2"
                )
            _raise(CODES["FUNCTION_NOT_FOUND"])
        try:
            if self._sim._injected:
                self._sim._apply_face_injected(name, self._gpu_of(args))
            return fn(self, *args, **kwargs)
        except SimError as exc:
            raise pynvml.NVMLError(exc.value) from None

    return wrapper  # type: ignore[return-value]


class SimulatedPynvml:
    """The ``pynvml`` functions ``RealNvml`` calls, answered by a :class:`SimulatedNvml` machine."""

    # what the backend reads from the module besides functions
    NVMLError = pynvml.NVMLError
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    c_nvmlPlatformInfo_v1_t = pynvml.c_nvmlPlatformInfo_v1_t
    c_nvmlPlatformInfo_v2_t = pynvml.c_nvmlPlatformInfo_v2_t
    c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t
    c_nvmlGpuFabricInfo_v2_t = pynvml.c_nvmlGpuFabricInfo_v2_t
    c_nvmlGpuFabricInfo_v3_t = pynvml.c_nvmlGpuFabricInfo_v3_t
    c_nvmlGpuInstance_t = pynvml.c_nvmlGpuInstance_t
    c_nvmlComputeInstance_t = pynvml.c_nvmlComputeInstance_t
    nvmlGpuFabricInfo_v2 = pynvml.nvmlGpuFabricInfo_v2
    nvmlGpuFabricInfo_v3 = pynvml.nvmlGpuFabricInfo_v3
    nvmlPlatformInfo_v1 = pynvml.nvmlPlatformInfo_v1
    nvmlPlatformInfo_v2 = pynvml.nvmlPlatformInfo_v2

    def __init__(
        self,
        sim: SimulatedNvml,
        *,
        missing: Iterable[str] = (),
        platform_info_versions: Iterable[int] = (1, 2),
    ) -> None:
        self._sim = sim
        self.missing = frozenset(missing)
        self.platform_info_versions = frozenset(platform_info_versions)
        self._devices: dict[int, _Device] = {}
        self._device_address: dict[_Device, int] = {}
        self._instances: dict[int, _Instance] = {}
        self._instance_address: dict[_Instance, int] = {}
        self._event_sets: dict[int, int] = {}  # handle address -> simulator event-set id

    # ------------------------------------------------------------------ handles

    def _device_handle(self, device: _Device) -> Any:
        address = self._device_address.get(device)
        if address is None:
            address = next(_ADDRESS)
            self._device_address[device] = address
            self._devices[address] = device
        return _pointer(pynvml.c_nvmlDevice_t, address)

    def _device(self, handle: Any) -> _Device:
        device = self._devices.get(_handle_address(handle))
        if device is None:
            _raise(CODES["INVALID_ARGUMENT"])
        assert device is not None
        if device.mig_slot is not None:
            self._mig(device)  # an empty slot: a dead handle
        return device

    def _gpu(self, handle: Any) -> int:
        return self._device(handle).gpu

    def _instance_handle(self, instance: _Instance) -> Any:
        address = self._instance_address.get(instance)
        if address is None:
            address = next(_ADDRESS)
            self._instance_address[instance] = address
            self._instances[address] = instance
        kind = pynvml.c_nvmlComputeInstance_t if instance.compute else pynvml.c_nvmlGpuInstance_t
        return _pointer(kind, address)

    def _instance(self, handle: Any) -> tuple[_Instance, PlacedInstance]:
        instance = self._instances.get(_handle_address(handle))
        if instance is None:
            _raise(CODES["INVALID_ARGUMENT"])
        assert instance is not None
        state = self._sim._state(instance.gpu)
        placed = next((i for i in state.instances if i.gi_id == instance.gi_id), None)
        if placed is None or not state.mig_enabled:
            _raise(CODES["INVALID_ARGUMENT"])
        assert placed is not None
        return instance, placed

    def _gpu_of(self, args: tuple[Any, ...]) -> int | None:
        """The GPU a call is about (for errors injected on one GPU)."""
        if not args or not isinstance(args[0], ctypes._Pointer):
            return None
        address = _handle_address(args[0])
        if address in self._devices:
            return self._devices[address].gpu
        if address in self._instances:
            return self._instances[address].gpu
        return None

    def _mig(self, device: _Device) -> tuple[_GpuState, PlacedInstance]:
        """The instance now in a MIG handle's slot (NVML reuses handles after reconfiguration)."""
        assert device.mig_slot is not None
        state = self._sim._state(device.gpu)
        if not state.mig_enabled or device.mig_slot >= len(state.instances):
            _raise(CODES["INVALID_ARGUMENT"])
        return state, state.instances[device.mig_slot]

    def _mig_uuid(self, device: _Device) -> str:
        state, inst = self._mig(device)
        return self._sim._mig_uuid(state, inst)

    # ------------------------------------------------------------------ init / system

    @_face
    def nvmlInit(self) -> None:
        self._sim.nvml_init()

    @_face
    def nvmlShutdown(self) -> None:
        self._sim.nvml_shutdown()

    @_face
    def nvmlSystemGetDriverVersion(self) -> str:
        return self._sim.system_get_driver_version()

    @_face
    def nvmlSystemGetNVMLVersion(self) -> str:
        return self._sim.system_get_nvml_version()

    @_face
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self._sim.system_get_cuda_driver_version()

    @_face
    def nvmlDeviceGetCount(self) -> int:
        return self._sim.device_get_count()

    @_face
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._sim._require_init()
        if not 0 <= index < len(self._sim._gpus):
            _raise(CODES["INVALID_ARGUMENT"])
        # a lost GPU still has a handle (NVML answers GPU_IS_LOST on its queries)
        return self._device_handle(_Device(index))

    @_face
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        index = self._sim.device_get_handle_by_uuid(text)
        owner = self._sim._by_mig_uuid.get(text)
        if owner is None:
            return self._device_handle(_Device(index))
        slot = self._sim._gpus[index].instances.index(owner[1])
        return self._device_handle(_Device(index, slot))

    @_face
    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._sim._require_init()
        return self._device(handle).gpu  # host-side: answers for a lost GPU too

    # ------------------------------------------------------------------ identity

    @_face
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        device = self._device(handle)
        if device.mig_slot is not None:
            return self._mig_uuid(device)
        return self._sim.device_get_uuid(device.gpu)

    @_face
    def nvmlDeviceGetName(self, handle: Any) -> str:
        device = self._device(handle)
        name = self._sim.device_get_name(device.gpu)
        if device.mig_slot is not None:
            _, inst = self._mig(device)
            return f"{name} MIG {inst.profile.name}"
        return name

    @_face
    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return self._sim.device_get_serial(self._gpu(handle))

    @_face
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        bus_id, device_id = self._sim.device_get_pci_info(self._gpu(handle))
        info = pynvml.nvmlPciInfo_t()
        info.busId = bus_id.encode()
        info.busIdLegacy = bus_id.encode()
        domain, bus, rest = bus_id.split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
        info.pciDeviceId = device_id
        return info

    @_face
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        device = self._device(handle)
        memory = pynvml.c_nvmlMemory_t()
        if device.mig_slot is not None:
            _state, inst = self._mig(device)
            total = inst.profile.memory_mib * MIB
            used = sum(
                p.used_memory_bytes or 0
                for p in self._sim.device_get_compute_running_processes(device.gpu)
                if p.gpu_instance_id == inst.gi_id
            )
            memory.total, memory.used, memory.free = total, used, max(0, total - used)
            return memory
        total, _reserved, free, used = self._sim.device_get_memory_info(device.gpu)
        memory.total, memory.free, memory.used = total, free, used
        return memory

    @_face
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        major, minor = self._sim.device_get_cuda_compute_capability(self._gpu(handle))
        return major, minor

    @_face
    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        return self._sim.device_get_architecture(self._gpu(handle))

    @_face
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._sim.device_get_minor_number(self._gpu(handle))

    @_face
    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        return min(self._sim.device_get_memory_affinity(self._gpu(handle)))

    @_face
    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        return int(self._sim.device_get_persistence_mode(self._gpu(handle)))

    @_face
    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        return self._sim.device_get_compute_mode(self._gpu(handle))

    @_face
    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        return self._sim.device_get_brand(self._gpu(handle))

    @_face
    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return self._sim.device_get_power_management_limit(self._gpu(handle))

    @_face
    def nvmlDeviceGetCpuAffinity(self, handle: Any, cpu_set_size: int) -> Any:
        cpus = parse_cpulist(self._sim.device_get_cpu_affinity(self._gpu(handle)))
        masks = (ctypes.c_ulonglong * cpu_set_size)()
        for cpu in cpus:
            if cpu // 64 < cpu_set_size:
                masks[cpu // 64] |= 1 << (cpu % 64)
        return masks

    @_face
    def nvmlDeviceGetPlatformInfo(self, handle: Any, info_ref: Any) -> int:
        info = _target(info_ref)
        platform = self._sim.device_get_platform_info(self._gpu(handle))
        version = int(info.version)
        known = {pynvml.nvmlPlatformInfo_v1: 1, pynvml.nvmlPlatformInfo_v2: 2}.get(version)
        if known not in self.platform_info_versions:
            _raise(CODES["ARGUMENT_VERSION_MISMATCH"])
        guid = b""
        if platform.ib_guid is not None:
            digits = platform.ib_guid.removeprefix("0x")
            guid = bytes.fromhex(digits.rjust(16, "0") if len(digits) <= 16 else digits)
        _write(info, "ibGuid", guid.ljust(16, b"\0")[:16])
        if known == 2:
            _write(info, "chassisSerialNumber", platform.chassis_serial.encode()[:16].ljust(16, b"\0"))
            singles = {
                "slotNumber": platform.slot_number,
                "trayIndex": platform.tray_index,
                "hostId": platform.host_id,
            }
        else:
            rack = uuidlib.uuid5(uuidlib.NAMESPACE_OID, platform.chassis_serial).bytes
            _write(info, "rackGuid", rack)
            singles = {
                "chassisPhysicalSlotNumber": platform.slot_number,
                "computeSlotIndex": platform.tray_index,
                "nodeIndex": platform.host_id,
            }
        singles["peerType"] = platform.peer_type or 0
        singles["moduleId"] = platform.module_id
        for name, value in singles.items():
            _write(info, name, bytes([value & 0xFF]))
        return 0

    # ------------------------------------------------------------------ NVLink, topology

    @_face
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        return self._sim.device_get_nvlink_state(self._gpu(handle), link)

    @_face
    def nvmlDeviceGetNvLinkVersion(self, handle: Any, link: int) -> int:
        return self._sim.device_get_nvlink_version(self._gpu(handle), link)

    @_face
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        return self._sim.device_get_nvlink_remote_device_type(self._gpu(handle), link)

    @_face
    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self._sim.device_get_nvlink_remote_pci_info(self._gpu(handle), link).encode()
        return info

    @_face
    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        return self._sim.device_get_nvlink_error_counter(self._gpu(handle), link, counter)

    @_face
    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any) -> int:
        return self._sim.device_get_topology_common_ancestor(self._gpu(a), self._gpu(b))

    # ------------------------------------------------------------------ MIG

    @_face
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        current, pending = self._sim.device_get_mig_mode(self._gpu(handle))
        return [current, pending]

    @_face
    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        spec = self._sim.device_get_gpu_instance_profile_info(self._gpu(handle), profile)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id = spec.id
        info.sliceCount = spec.slices
        info.instanceCount = spec.max_instances
        info.multiprocessorCount = spec.sm_count
        info.copyEngineCount = spec.copy_engines
        info.decoderCount = spec.decoders
        info.encoderCount = spec.encoders
        info.jpegCount = spec.jpegs
        info.ofaCount = spec.ofas
        info.memorySizeMB = spec.memory_mib
        info.name = f"MIG {spec.name}".encode()
        return info

    @_face
    def nvmlDeviceGetGpuInstances(self, handle: Any, profile_id: int, array: Any, count_ref: Any) -> int:
        gpu = self._gpu(handle)
        chosen = [i for i in self._sim.device_get_gpu_instances(gpu) if i.profile.id == profile_id]
        count = _target(count_ref)
        if len(chosen) > len(array):
            count.value = len(chosen)
            _raise(CODES["INSUFFICIENT_SIZE"])
        for slot, inst in enumerate(chosen):
            array[slot] = self._instance_handle(_Instance(gpu, inst.gi_id, compute=False))
        count.value = len(chosen)
        return 0

    @_face
    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any) -> Any:
        instance, inst = self._instance(gpu_instance)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = self._device_handle(_Device(instance.gpu))
        info.id = inst.gi_id
        info.profileId = inst.profile.id
        info.placement.start = inst.start
        info.placement.size = inst.profile.placement_size
        return info

    @_face
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpu_instance: Any, profile: int, eng_profile: int, version: int = 2
    ) -> Any:
        _instance, inst = self._instance(gpu_instance)
        # the simulator creates one full-size compute instance per GPU instance: only that profile exists
        if profile != _ci_profile(inst.profile.slices):
            _raise(CODES["NOT_SUPPORTED"])
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id = profile
        info.sliceCount = inst.profile.slices
        info.instanceCount = 1
        info.multiprocessorCount = inst.profile.sm_count
        info.name = f"MIG {inst.profile.name}".encode()
        return info

    @_face
    def nvmlGpuInstanceGetComputeInstances(
        self, gpu_instance: Any, profile_id: int, array: Any, count_ref: Any
    ) -> int:
        instance, inst = self._instance(gpu_instance)
        count = _target(count_ref)
        if profile_id != _ci_profile(inst.profile.slices):
            count.value = 0
            return 0
        if len(array) < 1:
            count.value = 1
            _raise(CODES["INSUFFICIENT_SIZE"])
        array[0] = self._instance_handle(_Instance(instance.gpu, instance.gi_id, compute=True))
        count.value = 1
        return 0

    @_face
    def nvmlComputeInstanceGetInfo(self, compute_instance: Any) -> Any:
        instance, inst = self._instance(compute_instance)
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.device = self._device_handle(_Device(instance.gpu))
        info.gpuInstance = self._instance_handle(_Instance(instance.gpu, instance.gi_id, compute=False))
        info.id = 0
        info.profileId = _ci_profile(inst.profile.slices)
        info.placement.start = 0
        info.placement.size = inst.profile.slices
        return info

    @_face
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return self._sim.device_get_max_mig_device_count(self._gpu(handle))

    @_face
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        gpu = self._gpu(handle)
        self._sim.device_get_mig_device_handle_by_index(gpu, index)
        return self._device_handle(_Device(gpu, index))

    @_face
    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> ctypes.c_uint:
        device = self._device(handle)
        return ctypes.c_uint(int(device.mig_slot is not None))

    @_face
    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        device = self._device(handle)
        if device.mig_slot is None:
            _raise(CODES["INVALID_ARGUMENT"])
        return self._mig(device)[1].gi_id

    @_face
    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        device = self._device(handle)
        if device.mig_slot is None:
            _raise(CODES["INVALID_ARGUMENT"])
        self._mig(device)
        return 0

    @_face
    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        device = self._device(handle)
        attrs = pynvml.c_nvmlDeviceAttributes()
        if device.mig_slot is None:
            _raise(CODES["NOT_SUPPORTED"])
        _state, inst = self._mig(device)
        prof = inst.profile
        attrs.multiprocessorCount = prof.sm_count
        attrs.sharedCopyEngineCount = prof.copy_engines
        attrs.sharedDecoderCount = prof.decoders
        attrs.sharedEncoderCount = prof.encoders
        attrs.sharedJpegCount = prof.jpegs
        attrs.sharedOfaCount = prof.ofas
        attrs.gpuInstanceSliceCount = prof.slices
        attrs.computeInstanceSliceCount = prof.slices
        attrs.memorySizeMB = prof.memory_mib
        return attrs

    # ------------------------------------------------------------------ fabric

    @_face
    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info_ref: Any) -> int:
        info = _target(info_ref)
        fabric = self._sim.device_get_gpu_fabric_info_v(self._gpu(handle), int(info.version))
        _fill_fabric(info, fabric.cluster_uuid, fabric.status, fabric.clique_id, fabric.state)
        info.healthMask = fabric.health_mask
        if hasattr(info, "healthSummary"):
            info.healthSummary = fabric.health_summary
        return 0

    @_face
    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info_ref: Any) -> int:
        info = _target(info_ref)
        fabric = self._sim.device_get_gpu_fabric_info(self._gpu(handle))
        _fill_fabric(info, fabric.cluster_uuid, fabric.status, fabric.clique_id, fabric.state)
        return 0

    # ------------------------------------------------------------------ samples

    @_face
    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any:
        gpu = self._gpu(handle)
        state = self._sim._state(gpu)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        if self._sim._clock is None and _FI_ENERGY in field_ids:
            state.time_s += 1.0  # one sampling round of this GPU
        for slot, request in enumerate(field_ids):
            entry = values[slot]
            field_id, scope = request if isinstance(request, tuple) else (request, 0)
            entry.fieldId, entry.scopeId = field_id, scope
            try:
                value = self._field(gpu, state, field_id, scope)
            except SimError as exc:
                entry.nvmlReturn = exc.value
                continue
            entry.nvmlReturn = 0
            entry.valueType = _VALUE_ULL
            entry.value.ullVal = value
        return values

    def _field(self, gpu: int, state: _GpuState, field_id: int, scope: int) -> int:
        sim = self._sim
        if field_id in _FI_ECC:
            return sim.device_get_total_ecc_errors(gpu, *_FI_ECC[field_id])
        if field_id == _FI_MEMORY_TEMP:
            return sim.device_get_memory_temperature(gpu)
        if field_id == _FI_ENERGY:
            return sim.device_get_total_energy_consumption(gpu)
        if field_id == _FI_PCIE_REPLAY:
            return sim.device_get_pcie_replay_counter(gpu)
        if field_id in _FI_REMAPPED:
            return int(sim.device_get_remapped_rows(gpu)[_FI_REMAPPED[field_id]])
        if field_id == _FI_POWER_INSTANT:
            return sim.device_get_power_usage(gpu)
        nvlink5 = state.spec.nvlink_version == NVLINK5_VERSION_ENUM
        if field_id in (_FI_NVLINK_XMIT_BYTES, _FI_NVLINK_RCV_BYTES) and nvlink5:
            return self._link_bytes(gpu, state, scope)
        if field_id in (_FI_NVLINK_THROUGHPUT_TX, _FI_NVLINK_THROUGHPUT_RX) and not nvlink5:
            return self._link_bytes(gpu, state, scope) // 1024
        raise SimError(CODES["NOT_SUPPORTED"])

    def _link_bytes(self, gpu: int, state: _GpuState, link: int) -> int:
        up = self._sim.device_get_nvlink_state(gpu, link)  # checks the link exists
        self._sim._accumulate(state)
        return int(state.nvlink_bytes / max(1, len(state.link_up))) if up else 0

    @_face
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu_util, mem_util = self._sim.device_get_utilization_rates(self._gpu(handle))
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = gpu_util, mem_util
        return util

    @_face
    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int, version: int = 0x100000C) -> int:
        if version != 0x100000C:
            _raise(CODES["ARGUMENT_VERSION_MISMATCH"])
        if sensor != 0:
            _raise(CODES["INVALID_ARGUMENT"])
        return self._sim.device_get_temperature(self._gpu(handle))

    @_face
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        if sensor != 0:
            _raise(CODES["INVALID_ARGUMENT"])
        return self._sim.device_get_temperature(self._gpu(handle))

    @_face
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._sim.device_get_power_usage(self._gpu(handle))

    @_face
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._sim.device_get_total_energy_consumption(self._gpu(handle))

    @_face
    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        return self._sim.device_get_clock_info(self._gpu(handle), clock)

    @_face
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._sim.device_get_current_clocks_event_reasons(self._gpu(handle))

    @_face
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._sim.device_get_current_clocks_event_reasons(self._gpu(handle))

    @_face
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        device = self._device(handle)
        procs = self._sim.device_get_compute_running_processes(device.gpu)
        if device.mig_slot is not None:
            gi_id = self._mig(device)[1].gi_id
            procs = tuple(p for p in procs if p.gpu_instance_id == gi_id)
        out = []
        for proc in procs:
            struct = pynvml.c_nvmlProcessInfo_v3_t()
            struct.pid = proc.pid
            struct.usedGpuMemory = (
                proc.used_memory_bytes
                if proc.used_memory_bytes is not None
                else pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
            )
            struct.gpuInstanceId = _NO_INSTANCE if proc.gpu_instance_id is None else proc.gpu_instance_id
            struct.computeInstanceId = (
                _NO_INSTANCE if proc.compute_instance_id is None else proc.compute_instance_id
            )
            obj = pynvml.nvmlStructToFriendlyObject(struct)
            if obj.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                obj.usedGpuMemory = None
            out.append(obj)
        return out

    @_face
    def nvmlDeviceGetProcessUtilization(self, handle: Any, last_seen: int) -> list[Any]:
        gpu = self._gpu(handle)
        samples = self._sim.device_get_process_utilization(gpu)
        stamp = int(self._sim._now(self._sim._gpus[gpu]) * 1_000_000) + 1  # µs, never 0 (= "all")
        if not samples or stamp <= last_seen:
            _raise(CODES["NOT_FOUND"])
        out = []
        for sample in samples:
            struct = pynvml.c_nvmlProcessUtilizationSample_t()
            struct.pid, struct.timeStamp = sample.pid, stamp
            struct.smUtil, struct.memUtil = sample.sm_percent, sample.memory_percent
            out.append(struct)
        return out

    # ------------------------------------------------------------------ events

    @_face
    def nvmlEventSetCreate(self) -> Any:
        set_id = self._sim.event_set_create()
        address = next(_ADDRESS)
        self._event_sets[address] = set_id
        return _pointer(pynvml.c_nvmlEventSet_t, address)

    def _event_set(self, handle: Any) -> int:
        set_id = self._event_sets.get(_handle_address(handle))
        if set_id is None:
            _raise(CODES["INVALID_ARGUMENT"])
        assert set_id is not None
        return set_id

    @_face
    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._sim.event_set_free(self._event_set(event_set))
        self._event_sets.pop(_handle_address(event_set), None)

    @_face
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._sim.device_get_supported_event_types(self._gpu(handle))

    @_face
    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, event_set: Any) -> None:
        self._sim.device_register_events(self._gpu(handle), mask, self._event_set(event_set))

    @_face
    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        event = self._sim.event_set_wait(timeout_ms, self._event_set(event_set))
        data = pynvml.c_nvmlEventData_t()
        data.device = self._device_handle(_Device(event.gpu_index))
        data.eventType = self._sim.event_type_of(event)
        data.eventData = event.xid or 0
        data.gpuInstanceId = _NO_INSTANCE if event.gpu_instance_id is None else event.gpu_instance_id
        data.computeInstanceId = (
            _NO_INSTANCE if event.compute_instance_id is None else event.compute_instance_id
        )
        return data


def _ci_profile(slices: int) -> int:
    """NVML_COMPUTE_INSTANCE_PROFILE_* of a full-size compute instance with this many slices."""
    return {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}[slices]


def _write(struct: Any, name: str, raw: bytes) -> None:
    """Write raw bytes into a struct field (``c_char`` fields included, bypassing str handling)."""
    offset = getattr(type(struct), name).offset
    ctypes.memmove(ctypes.addressof(struct) + offset, raw, len(raw))


def _fill_fabric(info: Any, cluster_uuid: str, status: int, clique_id: int, state: int) -> None:
    _write(info, "clusterUuid", uuidlib.UUID(cluster_uuid).bytes)
    info.status = status
    info.cliqueId = clique_id
    info.state = state
