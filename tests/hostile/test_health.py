"""Hostile faults on device health (issue 27, the health half): a GPU that answers GPU_IS_LOST to every
query without any event, an Xid that needs a reset while the volatile uncorrectable ECC count keeps rising,
uncorrectable errors without events, NVML errors on the health probe, and bad health fault lines. Each runs
the node's real pieces (simulator under the one NVML composition, health monitor, device plugin) against
the kubelet stand-in, and is bounded in time."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agent.fakekubelet import running_kubelet
from agent.nvml.errors import NVMLError
from agent.nvml.faults import FaultFollower
from agent.nvml.simulate import build_simulator
from tests.integration.test_deviceplugin_kubelet import agent, all_healthy, run, short_dir, wait_until

__all__ = ["short_dir"]  # the fixture, used by name

GPU = "nvidia.com/gpu"


def _append(path: Path, *events: dict[str, object]) -> None:
    with path.open("a", encoding="utf-8") as fh:
        for event in events:
            fh.write(json.dumps(event) + "\n")


# how long a step may take on a loaded CI machine: a bound for the harness, not a figure under test (the
# 2 s bound is the next test's)
SLACK_S = 30.0


def test_a_gpu_lost_without_any_event_is_withdrawn_alone_and_returns(short_dir: Path) -> None:
    """No Xid, no GPU_LOST from the event wait: only queries answer GPU_IS_LOST. The health probe sees it;
    the other GPUs stay Healthy and their events keep coming."""
    faults = short_dir / "faults.jsonl"
    faults.write_text("")

    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir, faults=faults) as a:
            await kubelet.wait_for(all_healthy(kubelet, GPU, 8), SLACK_S)
            lost = a.store.inventory.gpu(2).uuid
            _append(faults, {"event": "gpu_lost_silent", "gpu": 2})
            await kubelet.wait_for(lambda: kubelet.devices[GPU][lost] == "Unhealthy", SLACK_S)
            assert {u: h for u, h in kubelet.devices[GPU].items() if u != lost} == {
                u: "Healthy" for u in kubelet.devices[GPU] if u != lost
            }
            reason = a.store.health_of(lost).reason or ""
            assert reason.startswith("GPU lost (GPU is lost)")
            assert "needs a GPU reset" in reason
            seen = a.health.events_seen
            _append(faults, {"event": "xid", "gpu": 5, "xid": 13})  # a healthy GPU's event still arrives
            await wait_until(lambda: a.health.events_seen > seen)
            await asyncio.sleep(0.5)  # longer than the quiet period: still out while it does not answer
            assert kubelet.devices[GPU][lost] == "Unhealthy"
            _append(faults, {"event": "reset", "gpu": 2})
            await kubelet.wait_for(all_healthy(kubelet, GPU, 8), SLACK_S)

    run(body())


def test_a_lost_answer_to_any_call_reaches_kubelet_without_a_probe(short_dir: Path) -> None:
    """The probe is far off (an hour): the metrics refresh's read answering GPU_IS_LOST is enough."""
    faults = short_dir / "faults.jsonl"
    faults.write_text("")
    slow_probe = {"health": {"recoveryQuietSeconds": 0.3, "probeIntervalSeconds": 3600}}

    async def body() -> None:
        async with (
            running_kubelet(short_dir) as kubelet,
            agent(short_dir, data=slow_probe, faults=faults) as a,
        ):
            await kubelet.wait_for(all_healthy(kubelet, GPU, 8))
            lost = a.store.inventory.gpu(6).uuid
            _append(faults, {"event": "gpu_lost_silent", "gpu": 6})
            await wait_until(lambda: a.node.sim.xid_history(6) == () and _answers_lost(a.node.sim, 6))
            with pytest.raises(NVMLError):
                await asyncio.to_thread(a.node.sim.sample, 6)  # what the metrics refresh reads
            await kubelet.wait_for(lambda: kubelet.devices[GPU][lost] == "Unhealthy", timeout=2)
            assert sum(h == "Unhealthy" for h in kubelet.devices[GPU].values()) == 1

    run(body())


def test_a_lost_answer_reaches_kubelet_within_2_s_while_event_waits_fail_and_back_off(
    short_dir: Path,
) -> None:
    """Every event wait fails (the driver answers UNKNOWN), so the monitor backs off, doubling up to
    ``MAX_WAIT_BACKOFF_S``; the probe is an hour off. A GPU_IS_LOST answer to the metrics refresh's read,
    given while the monitor sleeps its longest back-off yet, still reaches kubelet within 2 s."""
    faults = short_dir / "faults.jsonl"
    faults.write_text("")
    slow_probe = {"health": {"recoveryQuietSeconds": 0.3, "probeIntervalSeconds": 3600}}

    async def body() -> None:
        async with (
            running_kubelet(short_dir) as kubelet,
            agent(short_dir, data=slow_probe, faults=faults) as a,
        ):
            await kubelet.wait_for(all_healthy(kubelet, GPU, 8))
            lost = a.store.inventory.gpu(6).uuid
            a.node.sim.inject_error(999, call="nvmlEventSetWait_v2")  # every wait from now on
            # the 6th failure in a row sleeps 3.2 s before the next wait (0.1 s doubling)
            await wait_until(lambda: a.health.wait_failures >= 6, timeout=10)
            _append(faults, {"event": "gpu_lost_silent", "gpu": 6})
            await wait_until(lambda: _answers_lost(a.node.sim, 6))
            with pytest.raises(NVMLError):
                await asyncio.to_thread(a.node.sim.sample, 6)  # what the metrics refresh reads
            await kubelet.wait_for(lambda: kubelet.devices[GPU][lost] == "Unhealthy", timeout=2)
            assert sum(h == "Unhealthy" for h in kubelet.devices[GPU].values()) == 1
            assert a.health.wait_failures >= 6  # the waits were failing all along

    run(body())


def _answers_lost(sim: object, index: int) -> bool:
    pynvml = sim.pynvml  # type: ignore[attr-defined]
    try:
        pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
    except pynvml.NVMLError as exc:
        return int(exc.value) == 15
    return False


def test_xid_79_with_rising_ecc_stays_out_past_the_quiet_period_until_a_reset(short_dir: Path) -> None:
    faults = short_dir / "faults.jsonl"
    faults.write_text("")

    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir, faults=faults) as a:
            await kubelet.wait_for(all_healthy(kubelet, GPU, 8))
            bad = a.store.inventory.gpu(4).uuid
            _append(faults, {"event": "xid", "gpu": 4, "xid": 79})
            await kubelet.wait_for(lambda: kubelet.devices[GPU][bad] == "Unhealthy")
            _append(faults, {"event": "recover", "gpu": 4}, {"event": "ecc_rising", "gpu": 4, "count": 2})
            for _ in range(4):  # the count keeps rising, well past the quiet period (0.3 s)
                await asyncio.sleep(0.2)
                _append(faults, {"event": "ecc_rising", "gpu": 4})
            await asyncio.sleep(0.5)
            assert kubelet.devices[GPU][bad] == "Unhealthy"
            assert "needs a GPU reset" in (a.store.health_of(bad).reason or "")
            _append(faults, {"event": "reset", "gpu": 4})
            await kubelet.wait_for(all_healthy(kubelet, GPU, 8))

    run(body())


def test_uncorrectable_errors_without_events_mark_a_healthy_gpu(short_dir: Path) -> None:
    faults = short_dir / "faults.jsonl"
    faults.write_text("")

    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir, faults=faults) as a:
            await kubelet.wait_for(all_healthy(kubelet, GPU, 8))
            await wait_until(lambda: len(a.health.book._readings) == 8)  # a baseline reading of each
            bad = a.store.inventory.gpu(1).uuid
            seen = a.health.events_seen
            _append(faults, {"event": "ecc_rising", "gpu": 1, "count": 3})
            await kubelet.wait_for(lambda: kubelet.devices[GPU][bad] == "Unhealthy")
            assert a.health.events_seen == seen  # no event told it
            assert "uncorrectable ECC errors rising (volatile count 0 -> 3)" in (
                a.store.health_of(bad).reason or ""
            )
            assert sum(h == "Unhealthy" for h in kubelet.devices[GPU].values()) == 1

    run(body())


def test_nvml_errors_on_the_health_probe_withdraw_nothing(short_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir) as a:
            await kubelet.wait_for(all_healthy(kubelet, GPU, 8))
            for code in (999, 2, 3):  # UNKNOWN, INVALID_ARGUMENT, NOT_SUPPORTED
                a.node.sim.inject_error(code, call="nvmlDeviceGetFieldValues")
                a.node.sim.inject_error(code, call="nvmlDeviceGetUUID", gpu=3, times=5)
                await asyncio.sleep(0.3)  # several probes
                assert set(kubelet.devices[GPU].values()) == {"Healthy"}
                a.node.sim.clear_errors()

    run(body())


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ('{"event":"ecc_rising","gpu":0,"count":0}', "field 'count' must be a positive integer, got 0"),
        ('{"event":"ecc_rising","gpu":0,"count":-3}', "field 'count' must be a positive integer, got -3"),
        ('{"event":"ecc_rising","gpu":0,"count":"9"}', "field 'count' must be an integer, got '9'"),
        ('{"event":"ecc_rising","gpu":0,"count":true}', "field 'count' must be an integer, got True"),
        ('{"event":"reset","gpu":99}', "no GPU 99"),
        ('{"event":"gpu_lost_silent","gpu":-1}', "no GPU -1"),
        ('{"event":"reset"}', "field 'gpu' must be an integer, got None"),
    ],
    ids=["zero", "negative", "string", "bool", "no-such-gpu", "negative-gpu", "no-gpu"],
)
def test_bad_health_fault_lines_are_errors_and_the_rest_applies(
    tmp_path: Path, line: str, error: str
) -> None:
    faults = tmp_path / "faults.jsonl"
    faults.write_text(line + "\n" + '{"event":"ecc_rising","gpu":1,"count":2}\n')
    sim = build_simulator("dgx-h100")
    sim.init()
    try:
        follower = FaultFollower(sim, faults)
        assert follower.poll() == 1
        assert len(follower.errors) == 1
        assert error in follower.errors[0]
        assert f"{faults}:1:" in follower.errors[0]
        assert sim.sample(1).ecc_uncorrected_volatile == 2
        assert sim.sample(0).ecc_uncorrected_volatile == 0
    finally:
        sim.shutdown()
