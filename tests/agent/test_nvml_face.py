"""``RealNvml`` over the simulator's pynvml face: the error paths a real driver takes (issue 18, rows 1-8).

Each test drives the one NVML composition through :class:`agent.nvml.face.SimulatedPynvml`, which
answers as a driver does (GPU_IS_LOST on every wait after Xid 79, NOT_SUPPORTED on event registration,
NO_PERMISSION on listings, older libraries without newer symbols).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable

import pynvml
import pytest

from agent.nvml.errors import CODES, NVMLError
from agent.nvml.face import SimulatedPynvml
from agent.nvml.fake import SimulatedNvml
from agent.nvml.protocol import EventKind, NvmlEvent
from agent.nvml.real import RealNvml
from agent.nvml.simulate import parse_spec
from topology.model import FabricHealthSummary


def machine(
    profile: str,
    *,
    missing: Iterable[str] = (),
    platform_info_versions: Iterable[int] = (1, 2),
    sleeps: list[float] | None = None,
) -> tuple[SimulatedNvml, RealNvml]:
    """A simulated machine and a ``RealNvml`` over its pynvml face (initialised)."""
    sim = SimulatedNvml(
        parse_spec(profile).machine(), missing=missing, platform_info_versions=platform_info_versions
    )
    nvml = RealNvml(sim.pynvml, sleep=(sleeps.append if sleeps is not None else lambda _s: None))
    nvml.init()
    return sim, nvml


def drain(nvml: RealNvml, waits: int = 20) -> list[tuple[EventKind, int, int | None]]:
    out = []
    for _ in range(waits):
        event = nvml.wait_event(0)
        if event is not None:
            out.append((event.kind, event.gpu_index, event.xid))
    return out


# --------------------------------------------------------------------------- 1: GPU_IS_LOST on every wait


def test_xid_79_rebuilds_the_event_set_counts_once_and_keeps_healthy_events() -> None:
    sleeps: list[float] = []
    sim, nvml = machine("dgx-h100", sleeps=sleeps)
    nvml.register_events(tuple(range(8)))
    sim.inject_xid(3, 79)
    assert drain(nvml, 3) == [(EventKind.XID, 3, 79), (EventKind.GPU_LOST, 3, None)]
    # the driver answers GPU_IS_LOST on every wait of a set holding GPU 3: no spin, no error storm
    assert drain(nvml, 200) == []
    assert nvml.counters().errors_by_code.get("GPU_IS_LOST") == 1
    assert sleeps == []  # the rebuilt set waits normally: nothing to back off from
    (event_set,) = sim._event_sets.values()  # the old set was freed
    assert sorted(event_set.registered) == [0, 1, 2, 4, 5, 6, 7]
    sim.inject_xid(1, 31)
    assert drain(nvml, 2) == [(EventKind.XID, 1, 31)]
    # recovered: registered again, its events come again
    sim.recover_gpu(3)
    sim.inject_xid(3, 13)
    assert drain(nvml, 2) == []  # it was not registered when the Xid came
    sim.inject_xid(3, 31)
    assert drain(nvml, 2) == [(EventKind.XID, 3, 31)]


def test_a_driver_that_keeps_answering_gpu_is_lost_is_backed_off_and_counted_once() -> None:
    sleeps: list[float] = []
    sim, nvml = machine("dgx-h100", sleeps=sleeps)
    nvml.register_events((0, 1))
    sim.inject_error(CODES["GPU_IS_LOST"], call="nvmlEventSetWait_v2")
    for _ in range(50):
        assert nvml.wait_event(250) is None
    assert nvml.counters().errors_by_code == {"GPU_IS_LOST": 1}
    assert len(sleeps) == 49
    assert set(sleeps) == {0.25}
    sim.clear_errors()
    sim.inject_xid(0, 31)
    assert drain(nvml, 1) == [(EventKind.XID, 0, 31)]


# --------------------------------------------------------------------------- 2: NOT_SUPPORTED on register


def test_register_events_not_supported_for_one_gpu_keeps_the_set_for_the_others() -> None:
    sim, nvml = machine("dgx-h100")
    sim.inject_error(CODES["NOT_SUPPORTED"], call="nvmlDeviceRegisterEvents", gpu=0)
    nvml.register_events((0, 1, 2))
    sim.inject_xid(1, 31)
    sim.lose_gpu(2)
    assert drain(nvml, 4) == [(EventKind.XID, 1, 31), (EventKind.GPU_LOST, 2, None)]


# --------------------------------------------------------------------------- 3: NO_PERMISSION


def test_no_permission_on_process_lists_keeps_the_rest_of_the_sample() -> None:
    sim, nvml = machine("dgx-a100-mig")
    sim.add_process(1, 77, used_memory_bytes=1 << 30)
    sim.inject_error(CODES["NO_PERMISSION"], call="nvmlDeviceGetComputeRunningProcesses")
    sample = nvml.sample(1)
    assert sample.processes == ()
    assert sample.temperature_celsius is not None
    assert sample.power_watts is not None
    assert sample.ecc_uncorrected_volatile == 0
    assert len(sample.nvlinks) == 12
    assert nvml.process_utilization(1) != ()
    sim.inject_error(CODES["NO_PERMISSION"], call="nvmlDeviceGetProcessUtilization")
    assert nvml.process_utilization(1) == ()
    assert "NO_PERMISSION" not in nvml.counters().errors_by_code


@pytest.mark.parametrize(
    "call",
    ["nvmlDeviceGetGpuInstances", "nvmlGpuInstanceGetComputeInstances", "nvmlGpuInstanceGetInfo"],
)
def test_no_permission_on_instance_listings_keeps_the_mig_devices(call: str) -> None:
    sim, nvml = machine("dgx-a100-mig")
    full = nvml.mig_state(0)
    assert full is not None
    assert full.devices
    sim.inject_error(CODES["NO_PERMISSION"], call=call)
    state = nvml.mig_state(0)
    assert state is not None
    assert [(d.uuid, d.profile, d.gpu_slices, d.memory_bytes) for d in state.devices] == [
        (d.uuid, d.profile, d.gpu_slices, d.memory_bytes) for d in full.devices
    ]


# --------------------------------------------------------------------------- 4: no _v3 symbol


def test_library_without_v3_process_symbol_does_not_abort_the_refresh() -> None:
    sim, nvml = machine("dgx-h100", missing={"nvmlDeviceGetComputeRunningProcesses_v3"})
    sim.add_process(0, 5, used_memory_bytes=1 << 20)
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        sim.pynvml.nvmlDeviceGetComputeRunningProcesses(sim.pynvml.nvmlDeviceGetHandleByIndex(0))
    samples = [nvml.sample(i) for i in range(8)]
    assert all(s.processes == () and s.temperature_celsius is not None for s in samples)


# --------------------------------------------------------------------------- 5: control flow is not an error


def test_control_flow_answers_are_not_counted_as_errors() -> None:
    _sim, nvml = machine("dgx-a100-mig", platform_info_versions={1})
    for index in range(nvml.device_count()):
        nvml.gpu(index)
        nvml.nvlinks(index)
        nvml.sample(index)
        nvml.process_utilization(index)
        nvml.process_utilization(index)  # NOT_FOUND: no samples since
        state = nvml.mig_state(index)
        for dev in state.devices if state is not None else ():
            nvml.mig_sample(dev.uuid)
    nvml.register_events((0,))
    assert nvml.wait_event(0) is None
    errors = nvml.counters().errors_by_code
    for code in ("INVALID_ARGUMENT", "NOT_FOUND", "ARGUMENT_VERSION_MISMATCH", "TIMEOUT", "CODE_0"):
        assert code not in errors, errors


# ------------------------------------------------------------------- 6: NVLink traffic before NVLink 5


@pytest.mark.parametrize(("profile", "fields"), [("dgx-h100", (138, 139)), ("gb200-nvl72", (202, 204))])
def test_nvlink_traffic_from_the_fields_the_generation_has(profile: str, fields: tuple[int, int]) -> None:
    sim, nvml = machine(profile)
    sim.add_process(0, 9, sm_percent=90)
    nvml.sample(0)
    sample = nvml.sample(0)
    assert all(link.tx_bytes and link.rx_bytes for link in sample.nvlinks)
    face = sim.pynvml
    handle = face.nvmlDeviceGetHandleByIndex(0)
    entries = face.nvmlDeviceGetFieldValues(handle, [(fid, 0) for fid in (138, 139, 202, 204)])
    assert [e.fieldId for e in entries if e.nvmlReturn == 0] == list(fields)


# --------------------------------------------------------------------------- 7: older drivers


def test_fabric_info_without_the_versioned_call_uses_v1() -> None:
    _, new = machine("gb200-nvl72")
    _, old = machine("gb200-nvl72", missing={"nvmlDeviceGetGpuFabricInfoV"})
    want, got = new.fabric(0), old.fabric(0)
    assert want is not None
    assert got is not None
    assert (got.cluster_uuid, got.clique_id, got.state) == (want.cluster_uuid, want.clique_id, want.state)
    assert got.health_summary is FabricHealthSummary.NOT_SUPPORTED
    assert got.health_mask is None
    assert "FUNCTION_NOT_FOUND" not in old.counters().errors_by_code


def test_platform_info_v1_driver() -> None:
    _, new = machine("gb200-nvl72:rack=2,tray=5")
    _, old = machine("gb200-nvl72:rack=2,tray=5", platform_info_versions={1})
    want, got = new.gpu(1).platform, old.gpu(1).platform
    assert want is not None
    assert got is not None
    assert (got.slot_number, got.tray_index, got.host_id, got.module_id, got.ib_guid) == (
        want.slot_number,
        want.tray_index,
        want.host_id,
        want.module_id,
        want.ib_guid,
    )
    assert got.chassis_serial  # the rack GUID stands in for it


def test_clocks_and_temperature_on_older_drivers() -> None:
    _sim, nvml = machine(
        "dgx-h100", missing={"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperatureV"}
    )
    sample = nvml.sample(0)
    assert sample.throttle_reasons == 0x1  # idle, through ...ClocksThrottleReasons
    assert sample.temperature_celsius is not None


def test_temperature_uses_the_call_that_is_not_deprecated() -> None:
    sim, nvml = machine("dgx-h100")
    sim.inject_error(CODES["DEPRECATED"], call="nvmlDeviceGetTemperature")
    assert nvml.sample(0).temperature_celsius is not None


# --------------------------------------------------------------------------- 8: handles and session state


def test_mig_handle_is_fetched_again_after_reconfiguration() -> None:
    sim, nvml = machine("dgx-a100-mig")
    state = nvml.mig_state(0)
    assert state is not None
    old_uuid = state.devices[0].uuid
    assert nvml.mig_sample(old_uuid).memory_total_bytes == state.devices[0].memory_bytes
    sim.reconfigure_mig(0, ["7g.80gb"])  # slot 0 now holds another instance
    with pytest.raises(NVMLError) as info:
        nvml.mig_sample(old_uuid)
    assert info.value.value == CODES["NOT_FOUND"]
    new = nvml.mig_state(0)
    assert new is not None
    assert nvml.mig_sample(new.devices[0].uuid).memory_total_bytes == new.devices[0].memory_bytes


def test_shutdown_forgets_registrations_and_uuids() -> None:
    sim, nvml = machine("dgx-h100")
    nvml.register_events((0, 1, 2))
    nvml.shutdown()
    nvml.init()
    nvml.register_events((0,))
    sim.lose_gpu(2)
    sim.lose_gpu(0)
    lost = [e for e in (nvml.wait_event(0) for _ in range(5)) if e is not None]
    assert lost == [NvmlEvent(EventKind.GPU_LOST, 0, sim.machine.gpus[0].uuid)]


# --------------------------------------------------------------------------- the face itself


def test_face_returns_pynvml_structs_and_raises_pynvml_errors() -> None:
    sim, _nvml = machine("dgx-h100")
    face: SimulatedPynvml = sim.pynvml
    handle = face.nvmlDeviceGetHandleByIndex(2)
    assert isinstance(handle, pynvml.c_nvmlDevice_t)
    assert isinstance(face.nvmlDeviceGetMemoryInfo(handle), pynvml.c_nvmlMemory_t)
    assert face.nvmlDeviceGetIndex(handle) == 2
    sim.lose_gpu(2)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        face.nvmlDeviceGetUUID(handle)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        face.nvmlDeviceGetUUID(ctypes.cast(ctypes.c_void_p(8), pynvml.c_nvmlDevice_t))
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        machine("dgx-h100", missing={"nvmlDeviceGetName"})[0].pynvml.nvmlDeviceGetName(handle)
