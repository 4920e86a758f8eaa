"""``RealNvml`` against a stand-in for the ``pynvml`` module (no GPU here).

The stand-in keeps pynvml's real pieces — its ``NVMLError`` classes and ctypes structs — and replaces
the library calls with a small two-GPU machine, so the binding details (versioned fabric struct, raw
``c_char`` fields, ``c_uint`` MIG-handle answers, per-entry field returns, link iteration, event
timeouts, error translation) are exercised for real. The ``gpu``-marked contract test covers the rest.
"""

# The stand-in mirrors pynvml's function and struct names.
# ruff: noqa: N802, N815
from __future__ import annotations

import ctypes
import types
from typing import Any, ClassVar

import pynvml
import pytest

from agent.nvml.errors import (
    NVMLError,
    NVMLError_DriverNotLoaded,
    NVMLError_GpuIsLost,
    NVMLError_Uninitialized,
)
from agent.nvml.fabric import decode_health_mask
from agent.nvml.protocol import EventKind
from agent.nvml.real import RealNvml, format_cluster_uuid, format_ib_guid, status_name
from topology.model import (
    FabricHealthSummary,
    FabricState,
    LinkLevel,
    RemoteDeviceType,
)

CLUSTER = bytes.fromhex("9c6f5af3a1b24c3d8e7f00112233aabb")


def _raise(code: int) -> None:
    raise pynvml.NVMLError(code)


def _obj(ref: Any) -> Any:
    """The struct behind a ``ctypes.byref``."""
    return ref._obj


def _handle_value(h: Any) -> int:
    return int(ctypes.cast(h, ctypes.c_void_p).value or 0)


class FakeLibrary:
    """GPU 0: Blackwell, 18 NVLinks to switches (link 3 down), fabric v3, MIG with one 3g + one 1g.
    GPU 1: no NVLink, no MIG, no fabric; becomes lost when ``lost`` is set."""

    NVMLError = pynvml.NVMLError
    NVML_NVLINK_MAX_LINKS = 36
    c_nvmlGpuFabricInfo_v3_t = pynvml.c_nvmlGpuFabricInfo_v3_t
    c_nvmlGpuFabricInfo_v2_t = pynvml.c_nvmlGpuFabricInfo_v2_t
    c_nvmlPlatformInfo_v2_t = pynvml.c_nvmlPlatformInfo_v2_t
    c_nvmlGpuInstance_t = pynvml.c_nvmlGpuInstance_t
    c_nvmlComputeInstance_t = pynvml.c_nvmlComputeInstance_t

    def __init__(self) -> None:
        self.init_error: int | None = None
        self.lost = False
        self.fabric_v3 = True
        self.events: list[Any] = []
        self.calls: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml"):
            object.__getattribute__(self, "calls").append(name)
        return object.__getattribute__(self, name)

    # ------------------------------------------------------------------ system
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            _raise(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.126.09"

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "13.580.126.09"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if index >= 2:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ctypes.cast(ctypes.c_void_p(0x100 + index), pynvml.c_nvmlDevice_t)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        if uuid.startswith("MIG-"):
            return ctypes.cast(ctypes.c_void_p(int(uuid[4:12], 16)), pynvml.c_nvmlDevice_t)
        return self.nvmlDeviceGetHandleByIndex(int(uuid[4]))

    def _gpu(self, h: Any) -> int:
        index = _handle_value(h) - 0x100
        if index == 1 and self.lost:
            _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        return index

    # ------------------------------------------------------------------ identity
    def nvmlDeviceGetUUID(self, h: Any) -> str:
        if _handle_value(h) >= 0x1000:
            return f"MIG-{_handle_value(h):08x}-0000-0000-0000-000000000000"
        return f"GPU-{self._gpu(h)}0000000-0000-0000-0000-000000000000"

    def nvmlDeviceGetName(self, h: Any) -> str:
        return ("NVIDIA GB200", "NVIDIA L40S")[self._gpu(h)]

    def nvmlDeviceGetSerial(self, h: Any) -> str:
        if self._gpu(h) == 1:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return "1650000000001"

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        i = self._gpu(h)
        return types.SimpleNamespace(
            busId=("00000008:01:00.0", "00000000:4A:00.0")[i], pciDeviceId=0x294110DE
        )

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        if _handle_value(h) >= 0x1000:
            return types.SimpleNamespace(total=93 * 2**30, used=2**20, free=93 * 2**30 - 2**20)
        return types.SimpleNamespace(total=189471 * 2**20, used=2**30, free=189471 * 2**20 - 2**30)

    def nvmlDeviceGetCudaComputeCapability(self, h: Any) -> tuple[int, int]:
        return ((10, 0), (8, 9))[self._gpu(h)]

    def nvmlDeviceGetArchitecture(self, h: Any) -> int:
        return (10, 8)[self._gpu(h)]

    def nvmlDeviceGetMinorNumber(self, h: Any) -> int:
        return self._gpu(h)

    def nvmlDeviceGetNumaNodeId(self, h: Any) -> int:
        if self._gpu(h) == 1:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 0

    def nvmlDeviceGetPersistenceMode(self, h: Any) -> int:
        return 1

    def nvmlDeviceGetComputeMode(self, h: Any) -> int:
        return 3

    def nvmlDeviceGetBrand(self, h: Any) -> int:
        return 14

    def nvmlDeviceGetPowerManagementLimit(self, h: Any) -> int:
        return 1200000

    def nvmlDeviceGetCpuAffinity(self, h: Any, words: int) -> list[int]:
        mask = (1 << 72) - 1  # CPUs 0-71
        return [(mask >> (64 * w)) & (2**64 - 1) for w in range(words)]

    def nvmlDeviceGetPlatformInfo(self, h: Any, ref: Any) -> None:
        if self._gpu(h) == 1:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = _obj(ref)
        base = ctypes.addressof(info)
        cls = type(info)
        ctypes.memmove(base + cls.chassisSerialNumber.offset, b"1821324000123\0", 14)
        ctypes.memmove(base + cls.ibGuid.offset, bytes(range(1, 17)), 16)
        for name, value in (
            ("slotNumber", 7),
            ("trayIndex", 5),
            ("hostId", 1),
            ("peerType", 0),
            ("moduleId", 0x82),
        ):
            ctypes.memmove(base + getattr(cls, name).offset, bytes([value]), 1)

    # ------------------------------------------------------------------ NVLink, PCIe
    def nvmlDeviceGetNvLinkState(self, h: Any, link: int) -> int:
        if self._gpu(h) == 1:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= 18:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # GB200 beyond link 17
        return 0 if link == 3 else 1

    def nvmlDeviceGetNvLinkVersion(self, h: Any, link: int) -> int:
        return 7

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Any, link: int) -> int:
        if link == 3:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 2

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Any, link: int) -> Any:
        if link == 3:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return types.SimpleNamespace(busId=f"00000000:{5 + link % 4:02X}:00.0")

    def nvmlDeviceGetNvLinkErrorCounter(self, h: Any, link: int, counter: int) -> int:
        return counter * 10 + link

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any) -> int:
        return 50

    # ------------------------------------------------------------------ MIG
    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        if self._gpu(h) == 1:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [1, 1]

    _GI_PROFILES: ClassVar[dict[int, tuple[int, int, int, str]]] = {
        2: (9, 3, 1, "MIG 3g.93gb"),
        0: (19, 1, 1, "MIG 1g.23gb"),
    }  # enum -> (id, slices, count, name)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: Any, profile: int) -> Any:
        if profile not in self._GI_PROFILES:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED if profile < 0x12 else pynvml.NVML_ERROR_INVALID_ARGUMENT)
        pid, slices, count, name = self._GI_PROFILES[profile]
        return types.SimpleNamespace(id=pid, sliceCount=slices, instanceCount=count, name=name)

    def nvmlDeviceGetGpuInstances(self, h: Any, profile_id: int, array: Any, count_ref: Any) -> int:
        gi_id = {9: 1, 19: 13}[profile_id]
        array[0] = ctypes.cast(ctypes.c_void_p(0x200 + gi_id), pynvml.c_nvmlGpuInstance_t)
        _obj(count_ref).value = 1
        return 0

    def nvmlGpuInstanceGetInfo(self, gi: Any) -> Any:
        gi_id = _handle_value(gi) - 0x200
        start, size, pid = {1: (4, 4, 9), 13: (2, 1, 19)}[gi_id]
        return types.SimpleNamespace(
            id=gi_id, profileId=pid, placement=types.SimpleNamespace(start=start, size=size)
        )

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: Any, profile: int, eng: int) -> Any:
        gi_id = _handle_value(gi) - 0x200
        wanted = {1: 2, 13: 0}[gi_id]  # the full-size CI profile enum of each GI
        if profile != wanted:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return types.SimpleNamespace(id=profile, sliceCount={1: 3, 13: 1}[gi_id], instanceCount=1)

    def nvmlGpuInstanceGetComputeInstances(self, gi: Any, pid: int, array: Any, count_ref: Any) -> int:
        array[0] = ctypes.cast(ctypes.c_void_p(_handle_value(gi) + 0x100), pynvml.c_nvmlComputeInstance_t)
        _obj(count_ref).value = 1
        return 0

    def nvmlComputeInstanceGetInfo(self, ci: Any) -> Any:
        return types.SimpleNamespace(id=0, profileId={0x301: 2, 0x30D: 0}[_handle_value(ci)])

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, slot: int) -> Any:
        if slot >= 2:
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        return ctypes.cast(ctypes.c_void_p(0x1000 + slot), pynvml.c_nvmlDevice_t)

    def nvmlDeviceIsMigDeviceHandle(self, h: Any) -> ctypes.c_uint:
        return ctypes.c_uint(1)  # a c_uint object, as pynvml returns: truthy even when 0

    def nvmlDeviceGetGpuInstanceId(self, mig: Any) -> int:
        return (1, 13)[_handle_value(mig) - 0x1000]

    def nvmlDeviceGetComputeInstanceId(self, mig: Any) -> int:
        return 0

    def nvmlDeviceGetAttributes(self, mig: Any) -> Any:
        slot = _handle_value(mig) - 0x1000
        return types.SimpleNamespace(
            gpuInstanceSliceCount=(3, 1)[slot],
            computeInstanceSliceCount=(3, 1)[slot],
            memorySizeMB=(95000, 22000)[slot],
            multiprocessorCount=(70, 18)[slot],
        )

    # ------------------------------------------------------------------ fabric
    def nvmlDeviceGetGpuFabricInfoV(self, h: Any, ref: Any) -> int:
        if self._gpu(h) == 1:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = _obj(ref)
        if isinstance(info, pynvml.c_nvmlGpuFabricInfo_v3_t) and not self.fabric_v3:
            _raise(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        info.clusterUuid = (ctypes.c_uint8 * 16)(*CLUSTER)
        info.cliqueId = 32766
        info.state = 3
        info.status = 0
        info.healthMask = 0x1AA
        if isinstance(info, pynvml.c_nvmlGpuFabricInfo_v3_t):
            info.healthSummary = 1
        return 0

    # ------------------------------------------------------------------ samples
    def nvmlDeviceGetFieldValues(self, h: Any, ids: list[Any]) -> Any:
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for i, request in enumerate(ids):
            field_id, scope = request if isinstance(request, tuple) else (request, 0)
            values[i].fieldId = field_id
            values[i].scopeId = scope
            if field_id == 82:  # memory temperature: this entry alone fails
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            values[i].nvmlReturn = 0
            if field_id == 186:
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = 650_000  # mW
            elif field_id == 83:
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                values[i].value.ullVal = 5_000_000  # mJ
            elif field_id in (202, 204):
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                values[i].value.ullVal = 1000 * (scope + 1) + (field_id - 200)
            else:
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                values[i].value.ullVal = 1 if field_id == 144 else 0
        return values

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        return types.SimpleNamespace(gpu=55, memory=20)

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return 61

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        return {1: 1980, 2: 3996}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return 0

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        return [
            types.SimpleNamespace(
                pid=42, usedGpuMemory=None, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF
            )
        ]

    def nvmlDeviceGetProcessUtilization(self, h: Any, ts: int) -> list[Any]:
        if ts:
            _raise(0)  # pynvml's "no samples": it raises with the success code
        return [types.SimpleNamespace(pid=42, timeStamp=77, smUtil=90, memUtil=30)]

    # ------------------------------------------------------------------ events
    def nvmlEventSetCreate(self) -> Any:
        return "event-set"

    def nvmlEventSetFree(self, event_set: Any) -> None:
        pass

    def nvmlDeviceGetSupportedEventTypes(self, h: Any) -> int:
        return 0xFFFF

    def nvmlDeviceRegisterEvents(self, h: Any, mask: int, event_set: Any) -> None:
        self.registered_mask = mask

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        if not self.events:
            _raise(pynvml.NVML_ERROR_TIMEOUT)
        event = self.events.pop(0)
        if isinstance(event, int):
            _raise(event)
        return event

    def nvmlDeviceGetIndex(self, h: Any) -> int:
        return _handle_value(h) - 0x100


@pytest.fixture
def lib() -> FakeLibrary:
    return FakeLibrary()


@pytest.fixture
def nvml(lib: FakeLibrary) -> RealNvml:
    backend = RealNvml(loader=lambda: lib)  # type: ignore[arg-type,return-value]
    backend.init()
    return backend


def test_init_errors_are_translated(lib: FakeLibrary) -> None:
    lib.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    backend = RealNvml(loader=lambda: lib)  # type: ignore[arg-type,return-value]
    with pytest.raises(NVMLError_DriverNotLoaded):
        backend.init()
    with pytest.raises(NVMLError_Uninitialized):
        backend.device_count()


def test_identity_and_not_supported_values(nvml: RealNvml) -> None:
    driver = nvml.driver()
    assert (driver.driver_version, driver.cuda_major, driver.cuda_minor) == ("580.126.09", 13, 0)
    gpu = nvml.gpu(0)
    assert gpu.uuid.startswith("GPU-")
    assert gpu.architecture == "blackwell"
    assert gpu.cpu_affinity == "0-71"
    assert gpu.compute_mode == "EXCLUSIVE_PROCESS"
    assert gpu.power_limit_watts == 1200.0
    assert gpu.brand == "NVIDIA"
    assert gpu.nvlink_count == 18
    assert gpu.mig_capable
    assert gpu.platform is not None
    assert gpu.platform.chassis_serial == "1821324000123"
    assert (gpu.platform.slot_number, gpu.platform.tray_index, gpu.platform.host_id) == (7, 5, 1)
    assert gpu.platform.module_id == 0x82  # a byte pynvml's str decoding would choke on
    assert gpu.platform.ib_guid == "0x" + bytes(range(1, 17)).hex()
    other = nvml.gpu(1)
    assert other.serial is None
    assert other.numa_node is None
    assert other.nvlink_count == 0
    assert not other.mig_capable
    assert other.platform is None


def test_nvlinks_iterate_until_invalid_argument(nvml: RealNvml, lib: FakeLibrary) -> None:
    links = nvml.nvlinks(0)
    assert len(links) == 18
    assert lib.calls.count("nvmlDeviceGetNvLinkState") == 19  # 18 links + the one that says stop
    down = links[3]
    assert not down.active
    assert down.remote_type is None
    assert down.remote_pci_bus_id is None
    up = links[0]
    assert (up.version, up.remote_type, up.remote_pci_bus_id) == (
        5,
        RemoteDeviceType.SWITCH,
        "00000000:05:00.0",
    )
    assert nvml.nvlinks(1) == ()
    assert nvml.pcie_level(0, 1) is LinkLevel.SYS


def test_mig_state_from_instances_and_devices(nvml: RealNvml) -> None:
    nvml.gpu(0)
    state = nvml.mig_state(0)
    assert state is not None
    assert state.current_enabled
    assert [(g.id, g.profile, g.placement_start, g.placement_size) for g in state.gpu_instances] == [
        (1, "3g.93gb", 4, 4),
        (13, "1g.23gb", 2, 1),
    ]
    assert [(c.gpu_instance_id, c.profile_id, c.slice_count) for c in state.compute_instances] == [
        (1, 2, 3),
        (13, 0, 1),
    ]
    assert [(d.profile, d.gpu_slices, d.memory_slices, d.sm_count) for d in state.devices] == [
        ("3g.93gb", 3, 4, 70),
        ("1g.23gb", 1, 1, 18),
    ]
    assert all(d.parent_uuid == nvml.gpu(0).uuid and d.uuid.startswith("MIG-") for d in state.devices)
    assert nvml.mig_state(1) is None
    sample = nvml.mig_sample(state.devices[0].uuid)
    assert sample.memory_total_bytes == 93 * 2**30
    assert [p.pid for p in sample.processes] == [42]


@pytest.mark.parametrize("v3", [True, False], ids=["v3", "v2-fallback"])
def test_fabric_versioned_struct(nvml: RealNvml, lib: FakeLibrary, v3: bool) -> None:
    lib.fabric_v3 = v3
    info = nvml.fabric(0)
    assert info is not None
    assert info.cluster_uuid == "9c6f5af3-a1b2-4c3d-8e7f-00112233aabb"
    assert info.clique == "9c6f5af3-a1b2-4c3d-8e7f-00112233aabb.32766"
    assert info.state is FabricState.COMPLETED
    assert info.status == "SUCCESS"
    assert info.health.route_unhealthy is False
    assert info.health.incorrect_configuration == "NONE"
    expected = FabricHealthSummary.HEALTHY if v3 else FabricHealthSummary.NOT_SUPPORTED
    assert info.health_summary is expected
    assert nvml.fabric(1) is None


def test_sample_reads_fields_in_bulk_and_skips_failed_entries(nvml: RealNvml, lib: FakeLibrary) -> None:
    sample = nvml.sample(0)
    assert sample.power_watts == 650.0
    assert sample.energy_joules == 5000.0
    assert sample.memory_temperature_celsius is None  # that entry's own nvmlReturn failed
    assert sample.remapped_rows_pending is True
    assert sample.ecc_uncorrected_volatile == 0
    assert (sample.gpu_utilization_percent, sample.temperature_celsius, sample.sm_clock_mhz) == (55, 61, 1980)
    assert len(sample.nvlinks) == 18
    assert sample.nvlinks[2].tx_bytes == 3002
    assert sample.nvlinks[2].rx_bytes == 3004
    assert sample.nvlinks[2].crc_flit_errors == 22
    assert not sample.nvlinks[3].active
    assert sample.processes[0].used_memory_bytes is None
    assert sample.processes[0].gpu_instance_id is None
    assert "nvmlDeviceGetPowerUsage" not in lib.calls  # the bulk read answered


def test_process_utilization_keeps_its_timestamp(nvml: RealNvml) -> None:
    first = nvml.process_utilization(0)
    assert [(p.pid, p.sm_percent) for p in first] == [(42, 90)]
    assert nvml.process_utilization(0) == ()  # no samples since: pynvml's odd "success" error


def test_events_timeout_xid_and_lost(nvml: RealNvml, lib: FakeLibrary) -> None:
    nvml.register_events((0, 1))
    assert lib.registered_mask & 0x8
    assert nvml.wait_event(10) is None
    data = pynvml.c_nvmlEventData_t()
    data.device = ctypes.cast(ctypes.c_void_p(0x100), pynvml.c_nvmlDevice_t)
    data.eventType = 0x8
    data.eventData = 79
    data.gpuInstanceId = 0xFFFFFFFF
    data.computeInstanceId = 0xFFFFFFFF
    lib.events.append(data)
    event = nvml.wait_event(10)
    assert event is not None
    assert (event.kind, event.gpu_index, event.xid, event.gpu_instance_id) == (EventKind.XID, 0, 79, None)
    lib.lost = True
    lib.events.append(pynvml.NVML_ERROR_GPU_IS_LOST)
    lost = nvml.wait_event(10)
    assert lost is not None
    assert (lost.kind, lost.gpu_index) == (EventKind.GPU_LOST, 1)
    assert lost.gpu_uuid.startswith("GPU-1")
    with pytest.raises(NVMLError_GpuIsLost):
        nvml.gpu(1)
    counters = nvml.counters()
    assert counters.errors_by_code["GPU_IS_LOST"] == 2  # the probe that found it, then gpu(1)
    assert "TIMEOUT" not in counters.errors_by_code  # a wait's timeout is an answer, not an error
    assert counters.calls > 10


def test_errors_other_than_not_supported_propagate(nvml: RealNvml, lib: FakeLibrary) -> None:
    lib.lost = True
    with pytest.raises(NVMLError) as info:
        nvml.sample(1)
    assert info.value.name == "GPU_IS_LOST"
    assert not isinstance(info.value, pynvml.NVMLError)


def test_shutdown_then_calls_are_uninitialized(nvml: RealNvml) -> None:
    nvml.register_events((0,))
    nvml.shutdown()
    with pytest.raises(NVMLError_Uninitialized):
        nvml.gpu(0)


def test_pure_helpers() -> None:
    assert format_cluster_uuid(bytes(16)) == "00000000-0000-0000-0000-000000000000"
    assert format_ib_guid(bytes.fromhex("e09d730320000001") + bytes(8)) == "0xe09d730320000001"
    assert format_ib_guid(bytes(16)) is None
    assert status_name(0) == "SUCCESS"
    assert status_name(23) == "INSUFFICIENT_RESOURCES"
    assert decode_health_mask(None).degraded_bandwidth is None
    unhealthy = decode_health_mask(0x1 | (0x2 << 2) | (0x1 << 4) | (0x5 << 8) | (0x1 << 12) | (0x2 << 14))
    assert unhealthy.degraded_bandwidth is True
    assert unhealthy.route_recovery_in_progress is False
    assert unhealthy.route_unhealthy is True
    assert unhealthy.access_timeout_recovery is None
    assert unhealthy.incorrect_configuration == "INSUFFICIENT_NVLINKS"
    assert unhealthy.partition_assigned is True
    assert unhealthy.gfm_connected is False
    assert decode_health_mask(0xAA).incorrect_configuration is None
