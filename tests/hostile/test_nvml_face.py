"""Hostile input to the simulator's pynvml face and to ``RealNvml`` over it: bad handles, indices and
field requests answer pynvml's errors (never a Python crash), and a driver stuck on GPU_IS_LOST is
waited out without spinning. Bounded: small machines, a fixed number of calls."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml
import pytest

from agent.nvml.errors import CODES
from agent.nvml.fake import SimulatedNvml
from agent.nvml.real import RealNvml
from agent.nvml.simulate import build_simulator, parse_spec


def started(profile: str = "dgx-h100") -> SimulatedNvml:
    sim = build_simulator(profile)
    sim.init()
    return sim


@pytest.mark.parametrize(
    "handle",
    [None, 0, 8, 2**63, ctypes.cast(ctypes.c_void_p(0xDEAD0), pynvml.c_nvmlDevice_t)],
    ids=["none", "zero", "small-int", "huge-int", "unknown-pointer"],
)
def test_bad_handles_answer_invalid_argument(handle: Any) -> None:
    face = started().pynvml
    for call in (face.nvmlDeviceGetUUID, face.nvmlDeviceGetMemoryInfo, face.nvmlDeviceGetIndex):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            call(handle)


@pytest.mark.parametrize("index", [-1, 8, 2**31, -(2**31)])
def test_bad_gpu_indices_answer_invalid_argument(index: int) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        started().pynvml.nvmlDeviceGetHandleByIndex(index)


@pytest.mark.parametrize("index", [-1, 18, 2**31, -(2**31)])
def test_bad_link_and_mig_slot_indices_answer_invalid_argument(index: int) -> None:
    face = started("dgx-a100-mig").pynvml
    handle = face.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        face.nvmlDeviceGetNvLinkState(handle, index)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        face.nvmlDeviceGetMigDeviceHandleByIndex(handle, index if index != 18 else 7)


def test_unknown_and_out_of_range_fields_fail_per_entry_only() -> None:
    face = started().pynvml
    handle = face.nvmlDeviceGetHandleByIndex(0)
    requests: list[Any] = [0, 2**32 - 1, (138, 10**6), (139, -1 & 0xFFFFFFFF), 83] * 200
    entries = face.nvmlDeviceGetFieldValues(handle, requests)
    codes = [int(e.nvmlReturn) for e in entries[:5]]
    assert codes == [CODES["NOT_SUPPORTED"], CODES["NOT_SUPPORTED"], 2, 2, 0]


def test_bad_uuids_answer_not_found_or_invalid() -> None:
    face = started().pynvml
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        face.nvmlDeviceGetHandleByUUID("x" * 10_000)
    with pytest.raises(pynvml.NVMLError_NotFound):
        face.nvmlDeviceGetHandleByUUID("MIG-" + "0" * 36)
    with pytest.raises(pynvml.NVMLError_NotFound):
        face.nvmlDeviceGetHandleByUUID(b"GPU-00000000-0000-0000-0000-000000000000")


def test_freed_or_foreign_event_sets_are_refused() -> None:
    face = started().pynvml
    event_set = face.nvmlEventSetCreate()
    face.nvmlEventSetFree(event_set)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        face.nvmlEventSetWait_v2(event_set, 0)
    other = started().pynvml.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        face.nvmlDeviceRegisterEvents(face.nvmlDeviceGetHandleByIndex(0), 0x8, other)


def test_every_gpu_lost_and_a_stuck_driver_do_not_spin() -> None:
    sleeps: list[float] = []
    sim = SimulatedNvml(parse_spec("pcie-l40s").machine(), sleep=sleeps.append)
    sim.init()
    nvml: RealNvml = sim.backend
    nvml.register_events(tuple(range(4)))
    for gpu in range(4):
        sim.inject_xid(gpu, 79)
    seen = [nvml.wait_event(0) for _ in range(1000)]
    assert sorted(e.gpu_index for e in seen if e is not None and e.kind.value == "gpu_lost") == [0, 1, 2, 3]
    assert nvml.counters().errors_by_code == {"GPU_IS_LOST": 4}
    assert sleeps == []  # nothing left registered: the waits time out instead of answering at once
    sim.inject_error(CODES["GPU_IS_LOST"], call="nvmlEventSetWait_v2")
    for _ in range(1000):
        assert nvml.wait_event(100) is None
    assert len(sleeps) >= 998  # every answer after the first rebuild backs off
    assert nvml.counters().errors_by_code == {"GPU_IS_LOST": 5}
