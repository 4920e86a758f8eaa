"""``agent.nvml.describe``: the simulator's machine and faults, exported for the C-level NVML stand-in."""

from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Any

import pytest

from agent.nvml.describe import (
    FORMAT_VERSION,
    DescribeError,
    FaultTranslator,
    canonical_call,
    describe_machine,
    fault_command,
    features,
    mig_instances,
    rack_guid,
    supported_event_types,
)
from agent.nvml.errors import NVMLError_NotSupported
from agent.nvml.profiles import MachineSpec, build_machine
from agent.nvml.simulate import PROFILES, build_simulator
from topology.model import PlatformInfo

ALL_PROFILES = sorted(PROFILES)


def _records(text: str) -> list[list[str]]:
    return [line.split("\t") for line in text.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_every_profile_describes_its_whole_machine(profile: str) -> None:
    machine = build_machine(profile)
    records = _records(describe_machine(machine))
    assert records[0] == ["nvmlstub", str(FORMAT_VERSION)]
    assert records[1] == [
        "system",
        machine.driver_version,
        machine.nvml_version,
        str(machine.cuda_driver_version),
    ]
    by_kind: dict[str, list[list[str]]] = {}
    for record in records:
        by_kind.setdefault(record[0], []).append(record)
    gpus = by_kind["gpu"]
    assert [r[1] for r in gpus] == [str(g.index) for g in machine.gpus]
    assert all(len(r) == 25 for r in gpus)
    assert [(r[2], r[3], r[5]) for r in gpus] == [(g.uuid, g.name, g.pci_bus_id) for g in machine.gpus]
    assert len(by_kind.get("link", [])) == sum(len(g.nvlinks) for g in machine.gpus)
    assert len(by_kind["pcie"]) == len(machine.gpus) ** 2
    assert len(by_kind.get("fabric", [])) == sum(g.fabric is not None for g in machine.gpus)
    assert len(by_kind.get("platform", [])) == sum(g.platform is not None for g in machine.gpus)
    assert len(by_kind.get("migprofile", [])) == sum(len(g.mig_profiles) for g in machine.gpus)
    assert len(by_kind.get("gi", [])) == sum(len(g.mig_layout or ()) for g in machine.gpus)


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_the_rules_restated_here_are_the_simulators(profile: str) -> None:
    """MIG UUIDs and placements, supported event types and optional sensors agree with the simulator."""
    sim = build_simulator(profile)
    sim.init()
    try:
        for gpu in sim.machine.gpus:
            assert supported_event_types(sim.machine, gpu) == sim.device_get_supported_event_types(gpu.index)
            try:
                sim.device_get_memory_temperature(gpu.index)
                memory_temperature = True
            except NVMLError_NotSupported:
                memory_temperature = False
            try:
                sim.device_get_remapped_rows(gpu.index)
                remapped = True
            except NVMLError_NotSupported:
                remapped = False
            assert features(gpu) == memory_temperature | (remapped << 1)
            state = sim.mig_state(gpu.index)
            expected = [] if state is None else [(d.gpu_instance_id, d.uuid) for d in state.devices]
            assert [(gi_id, mig_uuid) for gi_id, _p, _s, mig_uuid in mig_instances(gpu)] == expected
            if state is not None:
                placements = {gi.id: gi.placement_start for gi in state.gpu_instances}
                assert {gi_id: start for gi_id, _p, start, _u in mig_instances(gpu)} == placements
    finally:
        sim.shutdown()


def test_gb200_platform_and_fabric_records() -> None:
    machine = build_machine("gb200-nvl72", {"rack": 2, "tray": 5})
    records = _records(describe_machine(machine))
    platform = next(r for r in records if r[0] == "platform" and r[1] == "0")
    info = machine.gpus[0].platform
    assert info is not None
    assert info.ib_guid is not None
    assert platform[2:9] == [info.chassis_serial, "6", "5", "6", "1", "0", info.ib_guid]
    assert platform[9] == uuid.uuid5(uuid.NAMESPACE_OID, info.chassis_serial).hex
    assert rack_guid(info.chassis_serial) == bytes.fromhex(platform[9])
    fabric = next(r for r in records if r[0] == "fabric" and r[1] == "3")
    spec = machine.gpus[3].fabric
    assert spec is not None
    assert fabric[2:] == [uuid.UUID(spec.cluster_uuid).hex, str(spec.clique_id), "3", "0", "0x1AA", "1"]


def _with_gpu0(machine: MachineSpec, **changes: Any) -> MachineSpec:
    gpus = (dataclasses.replace(machine.gpus[0], **changes), *machine.gpus[1:])
    return dataclasses.replace(machine, gpus=gpus)


def test_a_value_that_cannot_be_one_field_is_refused_by_name() -> None:
    machine = _with_gpu0(build_machine("pcie-l40s"), name="NVIDIA\tL40S")
    with pytest.raises(DescribeError, match=r"GPU 0 field 3: 'NVIDIA\\tL40S' cannot be one field"):
        describe_machine(machine)
    with pytest.raises(DescribeError, match="GPU 0 field 4"):
        describe_machine(_with_gpu0(build_machine("pcie-l40s"), serial=""))


def test_a_bad_platform_guid_or_mig_layout_is_refused() -> None:
    gb200 = build_machine("gb200-nvl72")
    platform = gb200.gpus[0].platform
    assert platform is not None
    bad = dataclasses.replace(platform, ib_guid="0x12")
    with pytest.raises(DescribeError, match="ib_guid '0x12'"):
        describe_machine(_with_gpu0(gb200, platform=bad))
    no_guid = _with_gpu0(gb200, platform=PlatformInfo("C1", 1, 0, 1, 1, 0, None))
    assert "\tC1\t1\t0\t1\t1\t0\t-\t" in describe_machine(no_guid)
    a100 = build_machine("dgx-a100-mig")
    with pytest.raises(DescribeError, match=r"unknown profile '9g\.90gb'"):
        describe_machine(_with_gpu0(a100, mig_layout=("9g.90gb",)))
    with pytest.raises(DescribeError, match="has no valid placement"):
        describe_machine(_with_gpu0(a100, mig_layout=("1g.20gb",) * 5))


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("device_get_uuid", "devicegetuuid"),
        ("nvmlDeviceGetUUID", "devicegetuuid"),
        ("nvmlEventSetWait_v2", "eventsetwait"),
        ("event_set_wait", "eventsetwait"),
        ("nvmlDeviceGetGpuFabricInfoV", "devicegetgpufabricinfov"),
        ("device_get_gpu_fabric_info_v", "devicegetgpufabricinfov"),
        ("nvmlDeviceGetComputeRunningProcesses_v3", "devicegetcomputerunningprocesses"),
    ],
)
def test_canonical_call_names(name: str, key: str) -> None:
    assert canonical_call(name) == key


A100 = build_machine("dgx-a100-mig")
GB200 = build_machine("gb200-nvl72")
L40S = build_machine("pcie-l40s")
A100_GPU1_FIRST_MIG = mig_instances(A100.gpus[1])[0]


@pytest.mark.parametrize(
    ("machine", "event", "line"),
    [
        (A100, {"event": "xid", "gpu": 3, "xid": 79}, "xid\t3\t79\t-1"),
        (A100, {"event": "xid", "gpu": 1, "xid": 31, "gpu_instance_id": 1}, "xid\t1\t31\t1"),
        (A100, {"event": "gpu_lost", "gpu": 2}, "lost\t2"),
        (A100, {"event": "recover", "gpu": 2}, "recover\t2"),
        (A100, {"event": "ecc_dbe", "gpu": 1}, "ecc_dbe\t1"),
        (A100, {"event": "ecc_sbe", "gpu": 1}, "ecc_sbe\t1"),
        (A100, {"event": "nvlink_down", "gpu": 0, "link": 5}, "nvlink_down\t0\t5"),
        (A100, {"event": "nvlink_up", "gpu": 0, "link": 5}, "nvlink_up\t0\t5"),
        (GB200, {"event": "fabric", "gpu": 0, "health_summary": "unhealthy"}, "fabric\t0\t-\t-\t-\t0x19A\t2"),
        (
            GB200,
            {
                "event": "fabric",
                "gpu": 1,
                "state": "IN_PROGRESS",
                "status": "INSUFFICIENT_RESOURCES",
                "clique_id": 7,
            },
            "fabric\t1\t2\t23\t7\t-\t-",
        ),
        (GB200, {"event": "fabric", "gpu": 1, "status": "SUCCESS"}, "fabric\t1\t-\t0\t-\t-\t-"),
        (
            A100,
            {"event": "process_start", "gpu": 5, "pid": 42, "used_memory_mib": 2, "sm_percent": 150},
            "process_start\t5\t42\t2097152\t-1\t100",
        ),
        (
            A100,
            {"event": "process_start", "gpu": 1, "pid": 7, "mig_uuid": A100_GPU1_FIRST_MIG[3]},
            f"process_start\t1\t7\t-\t{A100_GPU1_FIRST_MIG[0]}\t80",
        ),
        (A100, {"event": "process_exit", "gpu": 5, "pid": 42}, "process_exit\t5\t42"),
        (A100, {"event": "nvml_error", "code": "NO_PERMISSION"}, "error\t4\t*\t-1\t-1"),
        (
            A100,
            {"event": "nvml_error", "code": 3, "call": "nvmlDeviceRegisterEvents", "gpu": 2, "times": 1},
            "error\t3\tdeviceregisterevents\t2\t1",
        ),
        (A100, {"event": "nvml_error", "code": None}, "clear_errors"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_fault_commands(machine: MachineSpec, event: dict[str, Any], line: str) -> None:
    assert fault_command(event, machine) == line


@pytest.mark.parametrize(
    ("machine", "event", "message"),
    [
        (A100, {"event": "meteor", "gpu": 0}, "unknown fault event 'meteor'"),
        (A100, {"event": "xid", "gpu": 8, "xid": 79}, "fault names GPU 8; this dgx-a100-mig has GPUs 0-7"),
        (A100, {"event": "xid", "gpu": "0", "xid": 79}, "fault field 'gpu' must be an integer"),
        (A100, {"event": "xid", "gpu": 0, "xid": 0}, "'xid' must be positive"),
        (A100, {"event": "xid", "gpu": 0, "xid": True}, "'xid' must be an integer"),
        (A100, {"event": "xid", "gpu": 5, "xid": 31, "gpu_instance_id": 1}, "GPU 5 has no GPU instance 1"),
        (A100, {"event": "nvlink_down", "gpu": 0, "link": 12}, "GPU 0 has 12 NVLinks; no link 12"),
        (L40S, {"event": "nvlink_up", "gpu": 0, "link": 0}, "GPU 0 has 0 NVLinks"),
        (L40S, {"event": "fabric", "gpu": 0, "health_summary": "HEALTHY"}, "has no NVLink fabric info"),
        (
            GB200,
            {"event": "fabric", "gpu": 0},
            "needs health_summary, conditions, incorrect_configuration, state, status or",
        ),
        (GB200, {"event": "fabric", "gpu": 0, "health_summary": "SO-SO"}, "unknown fabric health summary"),
        (GB200, {"event": "fabric", "gpu": 0, "state": "DONE"}, "unknown fabric state 'DONE'"),
        (GB200, {"event": "fabric", "gpu": 0, "status": "FINE"}, "unknown fabric status 'FINE'"),
        (
            A100,
            {"event": "process_start", "gpu": 5, "pid": 1, "mig_uuid": "MIG-x"},
            "MIG-x is not a MIG device",
        ),
        (A100, {"event": "mig_reconfig", "gpu": 0, "profiles": "3g.40gb"}, "'profiles' must be a list"),
        (L40S, {"event": "mig_reconfig", "gpu": 0, "profiles": []}, "GPU 0 (NVIDIA L40S) is not MIG-capable"),
        (A100, {"event": "mig_reconfig", "gpu": 0, "profiles": ["9g.1gb"]}, "unknown profile '9g.1gb'"),
        (A100, {"event": "mig_reconfig", "gpu": 0, "profiles": ["4g.40gb"] * 2}, "needs 8 compute slices"),
        (A100, {"event": "mig_reconfig", "gpu": 0, "profiles": ["1g.20gb"] * 5}, "has no valid placement"),
        (A100, {"event": "nvml_error", "code": "OOPS"}, "'code' must be an NVML error name or number"),
        (A100, {"event": "nvml_error", "code": 12345}, "'code' must be an NVML error name or number"),
        (A100, {"event": "nvml_error", "code": 3, "call": 5}, "'call' must be a function name"),
    ],
)
def test_fault_commands_refuse_what_the_stand_in_cannot_do(
    machine: MachineSpec, event: dict[str, Any], message: str
) -> None:
    with pytest.raises(DescribeError, match=re.escape(message)):
        fault_command(event, machine)


def test_the_translator_follows_mig_layouts_as_the_simulator_does() -> None:
    """After reconfigurations the MIG UUIDs, GPU-instance ids and placements equal the simulator's, and later
    faults name the new devices."""
    sim = build_simulator("dgx-a100-mig")
    sim.init()
    translator = FaultTranslator(sim.machine)
    try:
        for profiles in (["3g.40gb", "2g.20gb", "1g.10gb"], None, ["7g.80gb"], []):
            line = translator.command({"event": "mig_reconfig", "gpu": 2, "profiles": profiles})
            sim.reconfigure_mig(2, profiles)
            state = sim.mig_state(2)
            assert state is not None
            assert state.current_enabled is (profiles is not None)
            expected = [(d.gpu_instance_id, d.uuid) for d in state.devices]
            assert [(gi, uuid) for gi, _p, _s, uuid in translator.instances(2)] == expected
            layout = (
                ",".join(f"{gi}:{p.id}:{start}:{u}" for gi, p, start, u in translator.instances(2)) or "-"
            )
            assert line == f"mig\t2\t{int(profiles is not None)}\t{layout}"
    finally:
        sim.shutdown()
    translator.command({"event": "mig_reconfig", "gpu": 2, "profiles": ["3g.40gb", "3g.40gb"]})
    gi, _prof, _start, uuid = translator.instances(2)[0]
    assert (
        translator.command({"event": "xid", "gpu": 2, "xid": 31, "gpu_instance_id": gi})
        == f"xid\t2\t31\t{gi}"
    )
    assert translator.command({"event": "process_start", "gpu": 2, "pid": 5, "mig_uuid": uuid}).endswith(
        f"\t{gi}\t80"
    )


def test_the_translator_refuses_what_the_simulator_refuses_after_earlier_faults() -> None:
    translator = FaultTranslator(A100)
    gi, _prof, _start, uuid = translator.instances(1)[0]
    translator.command({"event": "process_start", "gpu": 1, "pid": 7, "mig_uuid": uuid})
    with pytest.raises(DescribeError, match="pid 7 already runs on GPU 1"):
        translator.command({"event": "process_start", "gpu": 1, "pid": 7})
    with pytest.raises(DescribeError, match="GPU 1 has processes on MIG devices; stop them first"):
        translator.command({"event": "mig_reconfig", "gpu": 1, "profiles": None})
    assert translator.command({"event": "process_exit", "gpu": 1, "pid": 7}) == "process_exit\t1\t7"
    assert translator.command({"event": "mig_reconfig", "gpu": 1, "profiles": None}) == "mig\t1\t0\t-"
    with pytest.raises(DescribeError, match=f"GPU 1 has no GPU instance {gi}; its instances: \\[\\]"):
        translator.command({"event": "xid", "gpu": 1, "xid": 31, "gpu_instance_id": gi})
    translator.command({"event": "xid", "gpu": 3, "xid": 79})
    with pytest.raises(DescribeError, match="GPU 3 is lost"):
        translator.command({"event": "mig_reconfig", "gpu": 3, "profiles": []})
    translator.command({"event": "recover", "gpu": 3})
    assert translator.command({"event": "mig_reconfig", "gpu": 3, "profiles": []}) == "mig\t3\t1\t-"
    translator.command({"event": "gpu_lost", "gpu": 0})
    with pytest.raises(DescribeError, match="GPU 0 is lost"):
        translator.command({"event": "mig_reconfig", "gpu": 0, "profiles": None})
    translator.command({"event": "recover", "gpu": 0})
    translator.command({"event": "recover", "gpu": 0})  # recovering a GPU that answers changes nothing
