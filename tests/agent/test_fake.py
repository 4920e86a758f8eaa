from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.nvml import errors
from agent.nvml.fabric import decode_health_mask
from agent.nvml.fake import (
    HotplugEvent,
    SimulatedNvml,
    SimulationError,
    place_instances,
    plan_layout,
)
from agent.nvml.profiles import MIG_A100_80GB, MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, MigProfileSpec
from agent.nvml.protocol import EventKind, NvmlBackend
from agent.nvml.simulate import build_simulator
from topology.model import FabricHealth, FabricHealthSummary, FabricState

A100_NAMES = [p.name for p in MIG_A100_80GB]


def started(spec: str) -> SimulatedNvml:
    sim = build_simulator(spec)
    sim.init()
    return sim


# --------------------------------------------------------------------------- protocol and init


def test_simulator_implements_the_backend_protocol() -> None:
    assert isinstance(build_simulator("dgx-h100"), NvmlBackend)


CALLS: list[tuple[str, Callable[[SimulatedNvml], Any]]] = [
    ("driver", lambda s: s.driver()),
    ("device_count", lambda s: s.device_count()),
    ("gpu", lambda s: s.gpu(0)),
    ("nvlinks", lambda s: s.nvlinks(0)),
    ("pcie_level", lambda s: s.pcie_level(0, 1)),
    ("mig_state", lambda s: s.mig_state(0)),
    ("fabric", lambda s: s.fabric(0)),
    ("sample", lambda s: s.sample(0)),
    ("register_events", lambda s: s.register_events((0,))),
    ("wait_event", lambda s: s.wait_event(0)),
]


def test_shutdown_before_init_is_a_no_op() -> None:
    sim = build_simulator("dgx-a100-mig")
    sim.shutdown()  # as RealNvml does over the real library: nothing to release
    with pytest.raises(errors.NVMLError_Uninitialized):
        sim.device_count()


@pytest.mark.parametrize(("name", "call"), CALLS, ids=[c[0] for c in CALLS])
def test_every_call_before_init_raises_uninitialized(name: str, call: Callable[[SimulatedNvml], Any]) -> None:
    sim = build_simulator("dgx-a100-mig")
    with pytest.raises(errors.NVMLError_Uninitialized):
        call(sim)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (9, errors.NVMLError_DriverNotLoaded),
        (12, errors.NVMLError_LibraryNotFound),
        (18, errors.NVMLError_LibRmVersionMismatch),
        (4, errors.NVMLError_NoPermission),
    ],
    ids=["driver-not-loaded", "library-not-found", "lib-rm-mismatch", "no-permission"],
)
def test_init_error_fails_init_until_cleared(code: int, cls: type[errors.NVMLError]) -> None:
    sim = build_simulator("pcie-l40s")
    sim.set_init_error(code)
    with pytest.raises(cls):
        sim.init()
    with pytest.raises(errors.NVMLError_Uninitialized):
        sim.device_count()
    sim.set_init_error(None)
    sim.init()
    assert sim.device_count() == 4
    assert sim.counters().errors_by_code[errors.NVMLError(code).name] == 1


def test_init_is_refcounted_like_nvml() -> None:
    sim = started("pcie-l40s")
    sim.init()
    sim.shutdown()
    assert sim.device_count() == 4
    sim.shutdown()
    with pytest.raises(errors.NVMLError_Uninitialized):
        sim.device_count()


def test_index_out_of_range_is_invalid_argument() -> None:
    sim = started("gb200-nvl72")
    with pytest.raises(errors.NVMLError_InvalidArgument):
        sim.gpu(4)
    with pytest.raises(errors.NVMLError_InvalidArgument):
        sim.gpu(-1)


def test_unknown_uuid_is_not_found_and_malformed_uuid_invalid() -> None:
    sim = started("dgx-h100")
    with pytest.raises(errors.NVMLError_NotFound):
        sim.device_get_handle_by_uuid("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(errors.NVMLError_InvalidArgument):
        sim.device_get_handle_by_uuid("nonsense")
    assert sim.device_get_handle_by_uuid(sim.gpu(5).uuid) == 5


# --------------------------------------------------------------------------- lost GPUs and hot-plug


def test_lost_gpu_raises_gpu_is_lost_and_recovers() -> None:
    sim = started("dgx-h100")
    seen: list[HotplugEvent] = []
    unsubscribe = sim.add_hotplug_listener(seen.append)
    bus = sim.gpu(2).pci_bus_id
    sim.lose_gpu(2)
    for call in (sim.gpu, sim.nvlinks, sim.sample, sim.fabric, sim.mig_state):
        with pytest.raises(errors.NVMLError_GpuIsLost):
            call(2)
    assert sim.gpu(3).index == 3  # the others still answer
    assert sim.device_count() == 8  # a lost GPU is still enumerated
    sim.recover_gpu(2)
    assert sim.gpu(2).pci_bus_id == bus
    unsubscribe()
    sim.lose_gpu(2)
    assert seen == [HotplugEvent("remove", "pci", "0000:52:00.0"), HotplugEvent("add", "pci", "0000:52:00.0")]
    assert sim.counters().errors_by_code["GPU_IS_LOST"] == 5


def test_xid_79_loses_the_gpu() -> None:
    sim = started("dgx-h100")
    sim.inject_xid(1, 79)
    with pytest.raises(errors.NVMLError_GpuIsLost):
        sim.gpu(1)
    assert sim.xid_history(1) == (79,)


def test_hotplug_queue_receives_events_from_another_thread() -> None:
    sim = build_simulator("dgx-h100")

    async def scenario() -> list[HotplugEvent]:
        queue = sim.hotplug_events()
        thread = threading.Thread(target=lambda: (sim.lose_gpu(0), sim.recover_gpu(0)))
        thread.start()
        got = [await asyncio.wait_for(queue.get(), 5), await asyncio.wait_for(queue.get(), 5)]
        thread.join(5)
        return got

    got = asyncio.run(scenario())
    assert [e.action for e in got] == ["remove", "add"]
    assert got[0] == ("remove", "pci", "0000:1b:00.0")


# --------------------------------------------------------------------------- NVLink


def test_link_index_beyond_the_gpus_links_is_invalid_argument() -> None:
    sim = started("gb200-nvl72")
    assert sim.device_get_nvlink_state(0, 17) == 1
    with pytest.raises(errors.NVMLError_InvalidArgument):
        sim.device_get_nvlink_state(0, 18)
    with pytest.raises(errors.NVMLError_InvalidArgument):
        sim.device_get_nvlink_remote_pci_info(0, 35)
    assert len(sim.nvlinks(0)) == 18


def test_gpu_without_nvlink_says_not_supported_and_protocol_gives_empty() -> None:
    sim = started("pcie-l40s")
    with pytest.raises(errors.NVMLError_NotSupported):
        sim.device_get_nvlink_state(0, 0)
    assert sim.nvlinks(0) == ()
    assert sim.gpu(0).nvlink_count == 0


def test_nvlink_down_shows_inactive_link_and_error_counter() -> None:
    sim = started("dgx-h100")
    sim.nvlink_down(0, 5)
    links = sim.nvlinks(0)
    assert [link.link for link in links if not link.active] == [5]
    sample = sim.sample(0)
    assert not sample.nvlinks[5].active
    assert sample.nvlinks[5].crc_flit_errors == 1
    sim.nvlink_up(0, 5)
    assert all(link.active for link in sim.nvlinks(0))
    with pytest.raises(SimulationError, match="no link 18"):
        sim.nvlink_down(0, 18)


# --------------------------------------------------------------------------- MIG


@pytest.mark.parametrize(
    "layout",
    [
        ["1g.10gb"] * 7,
        ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
        ["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"],
        ["4g.40gb", "3g.40gb"],
        ["1g.20gb"] * 4,
        ["7g.80gb"],
        ["1g.10gb+me", "1g.10gb", "3g.40gb"],
        [],
    ],
    ids=["7x1g", "3g+2g+1g+1g", "3x2g+1g", "4g+3g", "4x1g.20gb", "7g", "me+1g+3g", "enabled-empty"],
)
def test_valid_mig_layouts_apply_and_emit_a_config_change(layout: list[str]) -> None:
    sim = started("dgx-a100-mig")
    sim.register_events((5,))
    sim.reconfigure_mig(5, layout)
    state = sim.mig_state(5)
    assert state is not None
    assert state.current_enabled
    assert sorted(d.profile for d in state.devices) == sorted(layout)
    event = sim.wait_event(0)
    assert event is not None
    assert event.kind is EventKind.MIG_CONFIG_CHANGE
    assert event.gpu_index == 5


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (["1g.10gb"] * 8, "needs 8 compute slices"),
        (["4g.40gb", "4g.40gb"], "needs 8 compute slices"),
        (["3g.40gb", "3g.40gb", "1g.10gb"], "no valid MIG placement"),  # 7 slices, 9 memory slices
        (["1g.20gb"] * 5, "no valid MIG placement"),
        (["1g.10gb+me", "1g.10gb+me"], "no valid MIG placement"),
        (["1g.20gb", "1g.20gb", "1g.20gb", "2g.20gb", "2g.20gb"], "no valid MIG placement"),
        (["3g.20gb"], "unknown MIG profile '3g.20gb'"),
    ],
    ids=["8x1g", "2x4g", "3g+3g+1g", "5x1g.20gb", "2x-me", "3x1g.20gb+2x2g", "40gb-name-on-80gb"],
)
def test_invalid_mig_layouts_are_refused_and_change_nothing(layout: list[str], message: str) -> None:
    sim = started("dgx-a100-mig")
    before = sim.mig_state(1)
    with pytest.raises(SimulationError, match=message.replace("+", r"\+")) as info:
        sim.reconfigure_mig(1, layout)
    assert "\n" not in str(info.value)
    assert sim.mig_state(1) == before


def test_mig_on_a_gpu_that_is_not_mig_capable_is_refused() -> None:
    sim = started("pcie-l40s")
    assert sim.mig_state(0) is None
    with pytest.raises(errors.NVMLError_NotSupported):
        sim.device_get_mig_mode(0)
    with pytest.raises(SimulationError, match="not MIG-capable"):
        sim.reconfigure_mig(0, ["1g.10gb"])


def test_disabling_mig_leaves_the_gpu_whole() -> None:
    sim = started("dgx-a100-mig")
    sim.reconfigure_mig(0, None)
    state = sim.mig_state(0)
    assert state is not None
    assert not state.current_enabled
    assert state.devices == ()
    with pytest.raises(errors.NVMLError_NotSupported):
        sim.device_get_gpu_instances(0)


def test_driver_placement_is_order_dependent_like_the_real_a100() -> None:
    sim = started("dgx-a100-mig")
    sim.reconfigure_mig(6, [])
    for profile_id in (19, 19, 14):
        sim.device_create_gpu_instance(6, profile_id)
    with pytest.raises(errors.NVMLError_InsufficientResources):
        sim.device_create_gpu_instance(6, 9)
    sim.reconfigure_mig(6, [])
    for profile_id in (9, 19, 19, 14):
        sim.device_create_gpu_instance(6, profile_id)
    state = sim.mig_state(6)
    assert state is not None
    assert {(g.profile, g.placement_start) for g in state.gpu_instances} == {
        ("3g.40gb", 4),
        ("1g.10gb", 3),
        ("1g.10gb", 2),
        ("2g.20gb", 0),
    }


def test_mig_device_ids_and_uuids() -> None:
    a = started("dgx-a100-mig")
    b = started("dgx-a100-mig")
    state = a.mig_state(0)
    assert state is not None
    assert [g.id for g in state.gpu_instances] == list(range(7, 14))  # 1g at start s -> GI 7+s
    assert [d.index for d in state.devices] == list(range(7))
    assert all(d.uuid.startswith("MIG-") and len(d.uuid) == 40 for d in state.devices)
    assert state == b.mig_state(0)  # deterministic
    uuids = {d.uuid for d in state.devices}
    a.reconfigure_mig(0, ["1g.10gb"] * 7)
    state2 = a.mig_state(0)
    assert state2 is not None
    assert uuids.isdisjoint(d.uuid for d in state2.devices)
    assert a.device_get_handle_by_uuid(state2.devices[3].uuid) == 0
    with pytest.raises(errors.NVMLError_NotFound):
        a.device_get_handle_by_uuid(next(iter(uuids)))
    with pytest.raises(errors.NVMLError_NotFound):
        a.device_get_mig_device_handle_by_index(2, 2)  # GPU 2 has only two instances


def test_reconfigure_refused_while_a_mig_device_runs_a_process() -> None:
    sim = started("dgx-a100-mig")
    state = sim.mig_state(2)
    assert state is not None
    sim.add_process(2, 4242, used_memory_bytes=2**30, mig_uuid=state.devices[0].uuid)
    with pytest.raises(SimulationError, match="processes"):
        sim.reconfigure_mig(2, None)
    sample = sim.mig_sample(state.devices[0].uuid)
    assert sample.memory_used_bytes == 2**30
    assert [p.pid for p in sample.processes] == [4242]
    assert sim.mig_sample(state.devices[1].uuid).processes == ()


MIG_MOVES = st.lists(
    st.one_of(
        st.none(),
        st.lists(st.sampled_from(A100_NAMES), max_size=9),
    ),
    min_size=1,
    max_size=8,
)


@given(moves=MIG_MOVES)
def test_mig_devices_never_exceed_the_parents_slices(moves: list[list[str] | None]) -> None:
    sim = started("dgx-a100-mig")
    for layout in moves:
        with contextlib.suppress(SimulationError):
            sim.reconfigure_mig(0, layout)
        state = sim.mig_state(0)
        assert state is not None
        assert sum(d.gpu_slices for d in state.devices) <= MIG_COMPUTE_SLICES
        assert sum(d.memory_slices for d in state.devices) <= MIG_MEMORY_SLICES
        used = [0] * MIG_MEMORY_SLICES
        for gi in state.gpu_instances:
            for s in range(gi.placement_start, gi.placement_start + gi.placement_size):
                used[s] += 1
        assert max(used) <= 1
        assert len({d.uuid for d in state.devices}) == len(state.devices) == len(state.gpu_instances)
        assert len({g.id for g in state.gpu_instances}) == len(state.gpu_instances)


@given(names=st.lists(st.sampled_from(A100_NAMES), max_size=8))
def test_driver_placement_uses_only_listed_starts(names: list[str]) -> None:
    profiles = [next(p for p in MIG_A100_80GB if p.name == n) for n in names]
    placed = place_instances(profiles)
    if placed is None:
        return
    for prof, start in placed:
        assert start in prof.starts
    assert sum(p.slices for p, _ in placed) <= MIG_COMPUTE_SLICES


def _fits(profiles: list[MigProfileSpec]) -> bool:
    """Exhaustive search over every placement combination (the reference for ``plan_layout``)."""
    counts = Counter(p.id for p in profiles)
    if sum(p.slices for p in profiles) > MIG_COMPUTE_SLICES or any(
        counts[p.id] > p.max_instances for p in profiles
    ):
        return False

    def search(i: int, used: frozenset[int]) -> bool:
        if i == len(profiles):
            return True
        prof = profiles[i]
        for start in prof.starts:
            span = frozenset(range(start, start + prof.placement_size))
            if not span & used and search(i + 1, used | span):
                return True
        return False

    return search(0, frozenset())


def test_layout_planning_finds_a_placement_exactly_when_one_exists() -> None:
    checked = 0
    for size in range(1, MIG_COMPUTE_SLICES + 1):
        for combo in itertools.combinations_with_replacement(MIG_A100_80GB, size):
            profiles = list(combo)
            assert (plan_layout(profiles) is not None) == _fits(profiles), [p.name for p in profiles]
            checked += 1
    assert checked == 3431


# --------------------------------------------------------------------------- events


def test_events_are_delivered_only_for_registered_gpus() -> None:
    sim = started("dgx-h100")
    sim.inject_xid(0, 31)  # before any registration: dropped, as NVML does
    sim.register_events((0, 1))
    sim.inject_xid(7, 13)  # GPU 7 is not registered
    sim.inject_xid(1, 43)
    event = sim.wait_event(0)
    assert event is not None
    assert (event.kind, event.gpu_index, event.xid, event.gpu_uuid) == (EventKind.XID, 1, 43, sim.gpu(1).uuid)
    assert sim.wait_event(0) is None
    with pytest.raises(errors.NVMLError_Timeout):
        sim.event_set_wait(0)


def test_ecc_dbe_raises_dbe_event_xid_48_and_counters() -> None:
    sim = started("dgx-h100")
    sim.register_events(tuple(range(8)))
    sim.ecc_dbe(3)
    kinds = [sim.wait_event(0), sim.wait_event(0)]
    assert [(e.kind, e.xid) for e in kinds if e] == [(EventKind.ECC_DBE, None), (EventKind.XID, 48)]
    sample = sim.sample(3)
    assert sample.ecc_uncorrected_volatile == 1
    assert sample.remapped_rows_pending is True


def test_gpu_lost_while_waiting_yields_gpu_lost_event_and_raw_wait_raises() -> None:
    sim = started("dgx-h100")
    sim.register_events((0, 1))
    sim.lose_gpu(1)
    event = sim.wait_event(0)
    assert event is not None
    assert event.kind is EventKind.GPU_LOST
    assert event.gpu_index == 1
    sim.recover_gpu(1)
    sim.register_events((1,))
    sim.lose_gpu(1)
    with pytest.raises(errors.NVMLError_GpuIsLost):
        sim.event_set_wait(0)


def test_wait_event_wakes_when_an_event_arrives_from_another_thread() -> None:
    sim = started("dgx-h100")
    sim.register_events((0,))
    ready = threading.Event()

    def inject() -> None:
        ready.wait(5)
        sim.inject_xid(0, 94)

    thread = threading.Thread(target=inject)
    thread.start()
    ready.set()
    event = sim.wait_event(10_000)
    thread.join(5)
    assert event is not None
    assert event.xid == 94


def test_register_unsupported_event_type_is_not_supported() -> None:
    sim = started("pcie-l40s")
    sim.event_set_create()
    with pytest.raises(errors.NVMLError_NotSupported):
        sim.device_register_events(0, 0x100)  # MIG config change on a GPU without MIG


# --------------------------------------------------------------------------- counters and injected errors


def test_counters_count_calls_and_errors_by_code() -> None:
    sim = started("pcie-l40s")
    before = sim.counters().calls
    sim.gpu(0)
    sim.nvlinks(0)
    counters = sim.counters()
    assert counters.calls > before
    # MIG mode, platform info, the link count of gpu() and the first link of nvlinks()
    assert counters.errors_by_code == {"NOT_SUPPORTED": 4}


def test_injected_error_hits_one_call_on_one_gpu_for_a_number_of_times() -> None:
    sim = started("dgx-h100")
    sim.inject_error(4, call="device_get_memory_info", gpu=2, times=1)
    with pytest.raises(errors.NVMLError_NoPermission):
        sim.gpu(2)
    assert sim.gpu(2).memory_total_mib == 81559
    sim.inject_error(3, call="device_get_serial")
    assert sim.gpu(0).serial is None  # not supported becomes None at the protocol surface
    sim.clear_errors()
    assert sim.gpu(0).serial is not None
    with pytest.raises(SimulationError, match="no simulator primitive"):
        sim.inject_error(3, call="device_get_nothing")


# --------------------------------------------------------------------------- fabric


def test_fabric_health_can_be_set_and_is_decoded() -> None:
    sim = started("gb200-nvl72")
    healthy = sim.fabric(0)
    assert healthy is not None
    assert healthy.state is FabricState.COMPLETED
    assert healthy.status == "SUCCESS"
    assert healthy.health_summary is FabricHealthSummary.HEALTHY
    assert healthy.health_mask == 0x1AA
    sim.set_fabric_health(0, "UNHEALTHY")
    bad = sim.fabric(0)
    assert bad is not None
    assert bad.health_summary is FabricHealthSummary.UNHEALTHY
    assert bad.health.route_unhealthy is True
    assert bad.clique == healthy.clique
    with pytest.raises(SimulationError, match="valid: NOT_SUPPORTED, HEALTHY"):
        sim.set_fabric_health(0, "SICK")
    with pytest.raises(SimulationError, match="no NVLink fabric"):
        started("dgx1-v100").set_fabric_health(0, "HEALTHY")


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        (0x1AA, FabricHealth(False, False, False, False, "NONE", None, None)),
        (0xAA, FabricHealth(False, False, False, False, None, None, None)),
        (0x1A9, FabricHealth(True, False, False, False, "NONE", None, None)),
        (0x0, FabricHealth()),
        (0x5000 | 0x4AA, FabricHealth(False, False, False, False, "NO_PARTITION", True, True)),
        (0x8000 | 0x2000 | 0x1AA, FabricHealth(False, False, False, False, "NONE", False, False)),
    ],
    ids=["healthy-580", "healthy-older-driver", "degraded-bw", "not-supported", "no-partition", "gfm-down"],
)
def test_health_mask_decoding(mask: int, expected: FabricHealth) -> None:
    assert decode_health_mask(mask) == expected


# --------------------------------------------------------------------------- samples


def test_samples_are_deterministic_and_counters_monotonic() -> None:
    a = started("dgx-h100")
    b = started("dgx-h100")
    for sim in (a, b):
        sim.add_process(0, 100, used_memory_bytes=10 * 2**30, sm_percent=90)
    first = [a.sample(0) for _ in range(3)]
    assert first == [b.sample(0) for _ in range(3)]
    energies = [s.energy_joules or 0 for s in first]
    assert energies == sorted(energies)
    assert energies[0] < energies[-1]
    busy = first[-1]
    assert busy.gpu_utilization_percent
    assert busy.gpu_utilization_percent > 50
    assert busy.memory_used_bytes == 10 * 2**30
    assert busy.memory_free_bytes == (81559 - 551) * 2**20 - 10 * 2**30
    assert busy.power_watts is not None
    assert busy.power_watts <= 700
    idle = a.sample(1)
    assert idle.gpu_utilization_percent == 0
    assert idle.throttle_reasons == 0x1
    a.remove_process(0, 100)
    assert a.sample(0).processes == ()


def test_injected_clock_drives_energy() -> None:
    now = [0.0]
    sim = build_simulator("pcie-l40s", clock=lambda: now[0])
    sim.init()
    start = sim.sample(0).energy_joules
    now[0] = 10.0
    later = sim.sample(0).energy_joules
    assert start is not None
    assert later is not None
    assert later - start == pytest.approx(33 * 10)  # idle L40S draws 33 W


def test_not_supported_values_are_none_in_samples() -> None:
    sim = started("pcie-l40s")
    sample = sim.sample(0)
    assert sample.memory_temperature_celsius is None  # GDDR board
    assert sample.remapped_rows_pending is None
    assert sample.nvlinks == ()
    sim.add_process(0, 7)
    assert sim.process_utilization(0) != ()
    sim.inject_error(3, call="device_get_process_utilization")
    assert sim.process_utilization(0) == ()


def test_process_utilization_splits_the_load() -> None:
    sim = started("dgx-h100")
    sim.add_process(4, 1, sm_percent=40)
    sim.add_process(4, 2, sm_percent=40)
    util = sim.process_utilization(4)
    assert [u.pid for u in util] == [1, 2]
    assert util[0].sm_percent == util[1].sm_percent > 0
    with pytest.raises(SimulationError, match="already runs"):
        sim.add_process(4, 1)


def test_mutations_name_the_gpu_they_cannot_find() -> None:
    sim = build_simulator("gb200-nvl72")
    with pytest.raises(SimulationError, match="no GPU 4; this gb200-nvl72 has GPUs 0-3"):
        sim.lose_gpu(4)


def test_xid_on_a_mig_gpu_instance_carries_its_ids() -> None:
    sim = started("dgx-a100-mig")
    sim.register_events((2,))
    sim.inject_xid(2, 31, gpu_instance_id=1)
    event = sim.wait_event(0)
    assert event is not None
    assert (event.xid, event.gpu_instance_id, event.compute_instance_id) == (31, 1, 0)
    with pytest.raises(SimulationError, match=r"no GPU instance 5; its instances: \[1, 2\]"):
        sim.inject_xid(2, 31, gpu_instance_id=5)
    with pytest.raises(SimulationError, match=r"its instances: \[\]"):
        sim.inject_xid(7, 31, gpu_instance_id=0)  # GPU 7 runs without MIG


def test_ecc_sbe_counts_corrected_errors_and_raises_the_sbe_event() -> None:
    sim = started("dgx-h100")
    sim.register_events((6,))
    sim.ecc_sbe(6)
    sim.ecc_sbe(6)
    sample = sim.sample(6)
    assert (sample.ecc_corrected_volatile, sample.ecc_uncorrected_volatile) == (2, 0)
    event = sim.wait_event(0)
    assert event is not None
    assert event.kind is EventKind.ECC_SBE


def test_injecting_an_unknown_code_is_refused() -> None:
    with pytest.raises(SimulationError, match="unknown NVML code 4242"):
        build_simulator("dgx-h100").inject_error(4242)


def test_fabric_info_struct_versions() -> None:
    sim = started("gb200-nvl72")
    v3 = sim.device_get_gpu_fabric_info_v(0, 0x03000028)
    assert (v3.health_mask, v3.health_summary) == (0x1AA, 1)
    v2 = sim.device_get_gpu_fabric_info_v(0, 0x02000024)
    assert (v2.health_mask, v2.health_summary) == (0x1AA, 0)
    v1 = sim.device_get_gpu_fabric_info(0)
    assert (v1.cluster_uuid, v1.clique_id, v1.health_mask) == (v3.cluster_uuid, 32766, 0)
    with pytest.raises(errors.NVMLError_ArgumentVersionMismatch):
        sim.device_get_gpu_fabric_info_v(0, 0x01000000)
    with pytest.raises(errors.NVMLError_NotSupported):
        started("dgx-a100-mig").device_get_gpu_fabric_info_v(0)


def test_a_recovery_without_reset_keeps_the_volatile_ecc_counts() -> None:
    sim = started("dgx-h100")
    sim.ecc_dbe(2)
    sim.lose_gpu(2)
    sim.recover_gpu(2)
    sample = sim.sample(2)
    assert sample.ecc_uncorrected_volatile == 1
    assert sample.remapped_rows_pending is True  # only a reset applies the remap


def test_aggregate_ecc_counts_survive_a_reset_volatile_do_not() -> None:
    sim = started("dgx-h100")
    sim.ecc_dbe(2)
    sim.ecc_sbe(2)
    sim.lose_gpu(2)
    sim.reset_gpu(2)
    sample = sim.sample(2)
    assert (sample.ecc_uncorrected_volatile, sample.ecc_corrected_volatile) == (0, 0)
    assert (sample.ecc_uncorrected_aggregate, sample.ecc_corrected_aggregate) == (1, 1)
    assert sample.remapped_rows_uncorrectable == 1
    assert sample.remapped_rows_pending is False  # the reset applied the remap


@pytest.mark.parametrize(
    ("gpu", "profile_id", "expected"),
    [(0, 19, 0), (1, 19, 1), (1, 14, 0), (2, 19, 0), (3, 19, 0), (4, 19, 0)],
    ids=["7x1g-full", "3g+2g+1g-one-1g-left", "no-2g-left", "2x3g-full", "4g+2g+1g-full", "mig-off"],
)
def test_remaining_capacity(gpu: int, profile_id: int, expected: int) -> None:
    sim = started("dgx-a100-mig")
    if gpu == 4:
        with pytest.raises(errors.NVMLError_NotSupported):
            sim.device_get_gpu_instance_remaining_capacity(gpu, profile_id)
        sim.reconfigure_mig(gpu, [])
        assert sim.device_get_gpu_instance_remaining_capacity(gpu, 19) == 7
        assert sim.device_get_gpu_instance_remaining_capacity(gpu, 9) == 2
        assert sim.device_get_gpu_instance_remaining_capacity(gpu, 20) == 1
        return
    assert sim.device_get_gpu_instance_remaining_capacity(gpu, profile_id) == expected
    created = [sim.device_create_gpu_instance(gpu, profile_id) for _ in range(expected)]
    assert len(set(created)) == expected
    with pytest.raises(errors.NVMLError_InsufficientResources):
        sim.device_create_gpu_instance(gpu, profile_id)


def test_destroying_a_gpu_instance_frees_its_slices() -> None:
    sim = started("dgx-a100-mig")
    sim.gpu_instance_destroy(2, 1)
    state = sim.mig_state(2)
    assert state is not None
    assert [g.id for g in state.gpu_instances] == [2]
    assert sim.device_get_gpu_instance_remaining_capacity(2, 9) == 1
    with pytest.raises(errors.NVMLError_NotFound):
        sim.gpu_instance_destroy(2, 1)


# --------------------------------------------------------------------------- lost from any answer (issue 27)


LOST_READS: dict[str, Callable[[SimulatedNvml, int], object]] = {
    "gpu": lambda sim, i: sim.gpu(i),
    "nvlinks": lambda sim, i: sim.nvlinks(i),
    "mig_state": lambda sim, i: sim.mig_state(i),
    "fabric": lambda sim, i: sim.fabric(i),
    "sample": lambda sim, i: sim.sample(i),
    "process_utilization": lambda sim, i: sim.process_utilization(i),
    "health_reading": lambda sim, i: sim.health_reading(i),
    "pcie_level": lambda sim, i: sim.pcie_level(0, i),
}


@pytest.mark.parametrize("call", sorted(LOST_READS))
def test_a_lost_answer_to_any_call_is_reported_once_as_gpu_lost(call: str) -> None:
    """A GPU lost without any event: the first call that hears GPU_IS_LOST for it makes the next wait
    report it (once), ahead of the wait; the other GPUs are not reported."""
    sim = started("dgx-h100")
    sim.register_events(tuple(range(8)))
    sim.lose_gpu_silently(3)
    assert sim.wait_event(0) is None  # no event says so
    with pytest.raises(errors.NVMLError_GpuIsLost):
        LOST_READS[call](sim, 3)
    with pytest.raises(errors.NVMLError_GpuIsLost):
        LOST_READS[call](sim, 3)  # asked again: still reported once
    event = sim.wait_event(0)
    assert event is not None
    assert (event.kind, event.gpu_index, event.gpu_uuid) == (EventKind.GPU_LOST, 3, sim.machine.gpus[3].uuid)
    assert sim.wait_event(0) is None
    sim.reset_gpu(3)
    assert sim.wait_event(0) is None  # answers again: registered again, nothing to report
    sim.ecc_sbe(3)
    event = sim.wait_event(0)
    assert event is not None
    assert (event.kind, event.gpu_index) == (EventKind.ECC_SBE, 3)


def test_lost_reports_are_taken_without_a_wait_and_only_once() -> None:
    """While event waits fail, the health monitor takes the lost reports other calls queued without
    waiting; the next wait then returns none of them, and a new loss is reported again."""
    sim = started("dgx-h100")
    sim.register_events(tuple(range(8)))
    assert sim.take_lost_reports() == ()
    sim.inject_error(999, call="nvmlEventSetWait_v2")  # every wait fails from now on
    sim.lose_gpu_silently(3)
    sim.lose_gpu_silently(5)
    for index in (3, 5, 3):
        with pytest.raises(errors.NVMLError_GpuIsLost):
            sim.sample(index)
    taken = sim.take_lost_reports()
    assert [(e.kind, e.gpu_index, e.gpu_uuid) for e in taken] == [
        (EventKind.GPU_LOST, i, sim.machine.gpus[i].uuid) for i in (3, 5)
    ]
    with pytest.raises(errors.NVMLError_GpuIsLost):
        sim.sample(3)  # still lost: reported once, not again
    assert sim.take_lost_reports() == ()
    with pytest.raises(errors.NVMLError):
        sim.wait_event(0)  # the failing wait has nothing queued to return first


def test_health_reading_follows_ecc_remap_and_reset() -> None:
    sim = started("dgx-h100")
    clean = sim.health_reading(2)
    assert clean.uuid == sim.machine.gpus[2].uuid
    assert (clean.ecc_uncorrected_volatile, clean.remapped_rows_pending, clean.retired_pages_pending) == (
        0,
        False,
        None,  # H100 remaps rows; page retirement is not supported
    )
    sim.ecc_rising(2, 4)
    assert sim.health_reading(2).ecc_uncorrected_volatile == 4
    assert sim.health_reading(2).remapped_rows_pending is False  # counts alone, no remap
    sim.ecc_dbe(2)
    after = sim.health_reading(2)
    assert (after.ecc_uncorrected_volatile, after.remapped_rows_pending) == (5, True)
    sim.reset_gpu(2)
    reset = sim.health_reading(2)
    assert (reset.ecc_uncorrected_volatile, reset.ecc_corrected_volatile, reset.remapped_rows_pending) == (
        0,
        0,
        False,
    )
    with pytest.raises(SimulationError, match="must rise by a positive number"):
        sim.ecc_rising(2, 0)


def test_max_mig_device_count_is_zero_while_mig_is_off() -> None:
    """nvml.h: "Returns zero if MIG is not supported or enabled"; go-nvlib (NVIDIA's device plugin and GFD)
    visits that many MIG handles and stops at the first it cannot get."""
    sim = started("dgx-a100-mig")
    counts: dict[int, tuple[bool, int]] = {}
    for index in range(8):
        state = sim.mig_state(index)
        assert state is not None
        counts[index] = (state.current_enabled, sim.device_get_max_mig_device_count(index))
    assert {enabled for enabled, _ in counts.values()} == {True, False}  # both kinds are on this machine
    assert all(count == (MIG_COMPUTE_SLICES if enabled else 0) for enabled, count in counts.values()), counts
