from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from agent.nvml import errors
from agent.nvml.fake import SimulatedNvml
from agent.nvml.faults import FaultFollower
from agent.nvml.protocol import EventKind
from agent.nvml.simulate import (
    PROFILES,
    SimSpec,
    SimSpecError,
    build_simulator,
    parse_spec,
)
from agent.simnode import open_simulated_node
from topology.model import FabricHealthSummary, FabricState

# --------------------------------------------------------------------------- spec parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("dgx-h100", SimSpec("dgx-h100")),
        ("dgx-h100:", SimSpec("dgx-h100")),
        ("gb200-nvl72:rack=3,tray=5", SimSpec("gb200-nvl72", (("rack", 3), ("tray", 5)))),
        ("gb200-nvl72:tray=5, rack=3", SimSpec("gb200-nvl72", (("rack", 3), ("tray", 5)))),
        ("gb200-nvl72:node=4", SimSpec("gb200-nvl72", (("node", 4),))),
        (
            "dgx-h100:su=2,node=31,hostname=dgx-a",
            SimSpec("dgx-h100", (("su", 2), ("node", 31), ("hostname", "dgx-a"))),
        ),
        ("pcie-l40s:node=0x1f", SimSpec("pcie-l40s", (("node", 31),))),
    ],
    ids=["bare", "empty-options", "rack-tray", "reordered", "node-alias", "server", "hex"],
)
def test_parse_valid_specs(text: str, expected: SimSpec) -> None:
    spec = parse_spec(text)
    assert spec == expected
    assert parse_spec(str(spec)) == spec


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("dgx-h200", "unknown simulator profile 'dgx-h200'; valid: dgx-h100, hgx-h200, gb200-nvl72"),
        ("", "unknown simulator profile ''"),
        ("gb200-nvl72:rak=3", "unknown option 'rak'; valid: rack, tray, node, su, clique, hostname"),
        ("dgx-h100:rack=3", "unknown option 'rack'; valid: su, node, hostname"),
        ("gb200-nvl72:tray=18", "option tray=18 out of range 0-17"),
        ("gb200-nvl72:rack=-1", "option rack=-1 out of range 0-63"),
        ("gb200-nvl72:rack=three", "option rack='three' is not an integer"),
        ("gb200-nvl72:rack", "option 'rack' is not key=value"),
        ("gb200-nvl72:rack=1,rack=2", "option 'rack' given twice"),
        ("gb200-nvl72:tray=1,node=2", "node=2 contradicts tray=1"),
    ],
    ids=[
        "profile",
        "empty",
        "option",
        "option-of-other-profile",
        "range",
        "negative",
        "int",
        "no-eq",
        "twice",
        "alias",
    ],
)
def test_parse_errors_are_one_line_listing_the_valid_choices(text: str, fragment: str) -> None:
    with pytest.raises(SimSpecError) as info:
        parse_spec(text)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_profiles_list_names_with_descriptions() -> None:
    assert list(PROFILES) == ["dgx-h100", "hgx-h200", "gb200-nvl72", "dgx-a100-mig", "dgx1-v100", "pcie-l40s"]
    assert "NVL72" in PROFILES["gb200-nvl72"]


def test_build_simulator_from_text_or_spec() -> None:
    a = build_simulator("gb200-nvl72:rack=1,tray=2")
    b = build_simulator(parse_spec("gb200-nvl72:rack=1,tray=2"))
    assert a.machine == b.machine
    assert a.machine.hostname == "rack1-tray2"


# --------------------------------------------------------------------------- fault file


def write_lines(path: Path, *lines: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        for line in lines:
            fh.write(line + "\n")


def started(spec: str) -> SimulatedNvml:
    sim = build_simulator(spec)
    sim.init()
    return sim


def test_follower_applies_every_event_kind(tmp_path: Path) -> None:
    faults = tmp_path / "faults.jsonl"
    faults.touch()
    sim = started("dgx-a100-mig")
    follower = FaultFollower(sim, faults)
    sim.register_events(tuple(range(8)))
    write_lines(
        faults,
        json.dumps({"event": "xid", "gpu": 3, "xid": 31}),
        json.dumps({"event": "gpu_lost", "gpu": 2}),
        json.dumps({"event": "nvlink_down", "gpu": 0, "link": 5}),
        json.dumps({"event": "ecc_dbe", "gpu": 1}),
        json.dumps({"event": "mig_reconfig", "gpu": 0, "profiles": ["3g.40gb", "3g.40gb"]}),
        json.dumps({"event": "mig_reconfig", "gpu": 4, "profiles": None}),
    )
    assert follower.poll() == 6
    assert follower.errors == []
    with pytest.raises(errors.NVMLError_GpuIsLost):
        sim.gpu(2)
    assert not sim.nvlinks(0)[5].active
    assert sim.sample(1).ecc_uncorrected_volatile == 1
    mig = sim.mig_state(0)
    assert mig is not None
    assert [d.profile for d in mig.devices] == ["3g.40gb", "3g.40gb"]
    kinds = []
    for _ in range(10):  # a wait that answers GPU_IS_LOST for a GPU already reported is a None
        if (event := sim.wait_event(0)) is not None:
            kinds.append((event.kind, event.gpu_index, event.xid))
    assert kinds == [
        (EventKind.GPU_LOST, 2, None),  # the query of GPU 2 above answered GPU_IS_LOST first
        (EventKind.XID, 3, 31),
        (EventKind.ECC_DBE, 1, None),
        (EventKind.XID, 1, 48),
        (EventKind.MIG_CONFIG_CHANGE, 0, None),
        (EventKind.MIG_CONFIG_CHANGE, 4, None),
    ]
    write_lines(faults, '{"event":"recover","gpu":2}', '{"event":"nvlink_up","gpu":0,"link":5}')
    assert follower.poll() == 2
    assert sim.gpu(2).index == 2
    assert sim.nvlinks(0)[5].active
    assert follower.poll() == 0  # nothing new


def test_fabric_event(tmp_path: Path) -> None:
    faults = tmp_path / "f.jsonl"
    write_lines(faults, '{"event":"fabric","gpu":0,"health_summary":"UNHEALTHY"}')
    with open_simulated_node("gb200-nvl72", faults_path=faults) as node:  # lines already there apply
        sim = node.nvml
        sim.init()
        fabric = sim.fabric(0)
        assert fabric is not None
        assert fabric.health_summary is FabricHealthSummary.UNHEALTHY
        assert node.faults is not None
        assert node.faults.applied == 1


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("not json", "Expecting value"),
        ("[1, 2]", "not a JSON object"),
        ('{"event":"meltdown","gpu":0}', "unknown event 'meltdown'; valid: xid, gpu_lost"),
        ('{"event":"xid","gpu":"3","xid":79}', "field 'gpu' must be an integer"),
        ('{"event":"xid","gpu":3}', "field 'xid' must be an integer"),
        ('{"event":"gpu_lost","gpu":9}', "no GPU 9"),
        ('{"event":"nvlink_down","gpu":0,"link":40}', "no link 40"),
        ('{"event":"fabric","gpu":0,"health_summary":"UNHEALTHY"}', "has no NVLink fabric info"),
        ('{"event":"mig_reconfig","gpu":0,"profiles":["9g.99gb"]}', "unknown MIG profile '9g.99gb'"),
        ('{"event":"mig_reconfig","gpu":0,"profiles":"7g.80gb"}', "must be a list of profile names"),
    ],
    ids=[
        "json",
        "array",
        "event",
        "gpu-type",
        "xid-missing",
        "gpu-range",
        "link",
        "fabric",
        "mig-profile",
        "mig-type",
    ],
)
def test_bad_line_is_logged_with_its_number_and_others_still_apply(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, line: str, fragment: str
) -> None:
    faults = tmp_path / "faults.jsonl"
    write_lines(faults, '{"event":"xid","gpu":0,"xid":13}', line, '{"event":"gpu_lost","gpu":1}')
    sim = started("dgx-a100-mig")
    follower = FaultFollower(sim, faults)
    with caplog.at_level(logging.ERROR):
        assert follower.poll() == 2
    assert len(follower.errors) == 1
    assert follower.errors[0].startswith(f"{faults}:2: ")
    assert fragment in follower.errors[0]
    assert sim.xid_history(0) == (13,)
    with pytest.raises(errors.NVMLError_GpuIsLost):
        sim.gpu(1)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == ["fault_line_invalid"]


def test_partial_lines_wait_for_their_newline_and_truncation_restarts(tmp_path: Path) -> None:
    faults = tmp_path / "faults.jsonl"
    sim = started("dgx-h100")
    follower = FaultFollower(sim, faults)
    assert follower.poll() == 0  # no file yet
    faults.write_text('{"event":"xid","gpu":0,', encoding="utf-8")
    assert follower.poll() == 0
    with faults.open("a", encoding="utf-8") as fh:
        fh.write('"xid":31}\n')
    assert follower.poll() == 1
    faults.write_text('{"event":"xid","gpu":1,"xid":43}\n', encoding="utf-8")  # replaced, shorter
    assert follower.poll() == 1
    assert sim.xid_history(0) == (31,)
    assert sim.xid_history(1) == (43,)


def test_follower_task_applies_lines_while_running_and_stops(tmp_path: Path) -> None:
    faults = tmp_path / "faults.jsonl"
    faults.touch()
    sim = started("dgx-h100")
    sim.register_events((3,))
    follower = FaultFollower(sim, faults, poll_interval_s=0.005)

    async def scenario() -> int | None:
        stop = asyncio.Event()
        task = asyncio.create_task(follower.run(stop))
        await asyncio.sleep(0)
        write_lines(faults, '{"event":"xid","gpu":3,"xid":79}')
        event = await asyncio.to_thread(sim.wait_event, 5000)
        stop.set()
        await asyncio.wait_for(task, 5)
        return event.xid if event else None

    assert asyncio.run(scenario()) == 79
    assert follower.applied == 1


def test_follower_rejects_a_non_positive_interval(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="poll_interval_s"):
        FaultFollower(build_simulator("dgx-h100"), tmp_path / "x", poll_interval_s=0)


def test_nvml_error_fault_fails_every_call_until_cleared(tmp_path: Path) -> None:
    faults = tmp_path / "faults.jsonl"
    sim = started("dgx-h100")
    follower = FaultFollower(sim, faults)
    write_lines(faults, '{"event":"nvml_error","code":"LIB_RM_VERSION_MISMATCH"}')
    assert follower.poll() == 1
    with pytest.raises(errors.NVMLError_LibRmVersionMismatch):
        sim.gpu(0)
    with pytest.raises(errors.NVMLError_LibRmVersionMismatch):
        sim.device_count()
    write_lines(faults, '{"event":"nvml_error","code":null}', '{"event":"nvml_error","code":15,"gpu":3}')
    assert follower.poll() == 2
    assert sim.gpu(0).index == 0
    with pytest.raises(errors.NVMLError_GpuIsLost):
        sim.gpu(3)
    write_lines(
        faults,
        '{"event":"nvml_error","code":"MELTED"}',
        '{"event":"nvml_error","code":3,"call":"device_get_nothing"}',
        '{"event":"nvml_error","code":true}',
    )
    assert follower.poll() == 0
    assert [e.split(": ", 1)[1] for e in follower.errors] == [
        "unknown NVML error 'MELTED'; e.g. GPU_IS_LOST, LIB_RM_VERSION_MISMATCH",
        "no simulator primitive or pynvml function 'device_get_nothing'",
        "field 'code' must be an NVML error name or number, got True",
    ]


def test_xid_fault_on_a_mig_instance_and_sbe(tmp_path: Path) -> None:
    faults = tmp_path / "faults.jsonl"
    write_lines(faults, '{"event":"xid","gpu":1,"xid":94,"gpu_instance_id":1}', '{"event":"ecc_sbe","gpu":1}')
    with open_simulated_node("dgx-a100-mig", faults_path=faults) as node:
        sim = node.nvml
        sim.init()
        assert sim.xid_history(1) == (94,)
        assert sim.sample(1).ecc_corrected_volatile == 1


def test_fabric_state_status_and_clique_events(tmp_path: Path) -> None:
    faults = tmp_path / "faults.jsonl"
    sim = started("gb200-nvl72:rack=4")
    follower = FaultFollower(sim, faults)
    write_lines(
        faults,
        '{"event":"fabric","gpu":1,"state":"in_progress","status":"INSUFFICIENT_RESOURCES"}',
        '{"event":"fabric","gpu":2,"clique_id":7,"health_summary":"limited_capacity"}',
        '{"event":"fabric","gpu":3,"state":"DONE"}',
        '{"event":"fabric","gpu":3,"clique_id":9,"health_summary":"SICK"}',
        '{"event":"fabric","gpu":3}',
    )
    assert follower.poll() == 2
    one, two, three = (sim.fabric(i) for i in (1, 2, 3))
    assert one is not None
    assert (one.state, one.status) == (FabricState.IN_PROGRESS, "INSUFFICIENT_RESOURCES")
    assert two is not None
    assert two.clique.endswith(".7")
    assert two.health_summary is FabricHealthSummary.LIMITED_CAPACITY
    assert two.health.degraded_bandwidth is True
    assert three is not None
    assert three.clique_id == 32766  # the bad lines changed nothing, not even their valid parts
    assert three.health_summary is FabricHealthSummary.HEALTHY
    assert [e.split(": ", 1)[1] for e in follower.errors] == [
        "unknown fabric state 'DONE'; valid: NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED",
        "unknown fabric health summary 'SICK'; valid: NOT_SUPPORTED, HEALTHY, UNHEALTHY, LIMITED_CAPACITY",
        "a fabric event needs health_summary, conditions, incorrect_configuration, state, status or "
        "clique_id",
    ]


def test_process_events_show_in_samples(tmp_path: Path) -> None:
    faults = tmp_path / "faults.jsonl"
    sim = started("dgx-a100-mig")
    mig = sim.mig_state(2)
    assert mig is not None
    follower = FaultFollower(sim, faults)
    write_lines(
        faults,
        '{"event":"process_start","gpu":5,"pid":11,"used_memory_mib":2048,"sm_percent":60}',
        json.dumps({"event": "process_start", "gpu": 2, "pid": 12, "mig_uuid": mig.devices[1].uuid}),
        '{"event":"process_start","gpu":5,"pid":11}',
    )
    assert follower.poll() == 2
    assert "pid 11 already runs on GPU 5" in follower.errors[0]
    sample = sim.sample(5)
    assert [(p.pid, p.used_memory_bytes) for p in sample.processes] == [(11, 2 * 2**30)]
    assert sample.gpu_utilization_percent
    assert [p.pid for p in sim.mig_sample(mig.devices[1].uuid).processes] == [12]
    write_lines(faults, '{"event":"process_exit","gpu":5,"pid":11}')
    assert follower.poll() == 1
    assert sim.sample(5).processes == ()
