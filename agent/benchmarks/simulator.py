"""``gpu-node-agent bench simulator [--runs N] [--interval-ms MS]``: the NVML simulator's own costs.

- ``fault → event``: a line appended to a ``--simulate-faults`` file until a thread blocked in
  ``wait_event`` (as the health monitor waits) returns its event, with the ``FaultFollower`` task
  polling every ``--interval-ms`` (default 20 ms, the follower's default). The device plugin's
  health-propagation budget is 200 ms end to end; this is the simulator's share of it.
- ``mutation → event``: the same without the file (``inject_xid`` from another thread).
- per-call cost of a few primitives and protocol methods (µs), for ``dgx-a100-mig``.

Figures are median / p95 / p99 / max, printed with the machine they ran on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.benchmarks.machine import describe_ms, machine_summary
from agent.nvml.fake import SimulatedNvml
from agent.nvml.faults import FaultFollower
from agent.nvml.simulate import build_simulator

BUDGET_MS = 200.0
_WAIT_MS = 5000


async def fault_to_event(runs: int, interval_s: float) -> list[float]:
    """Seconds from appending a fault line to the waiting thread holding its event."""
    sim = build_simulator("dgx-h100")
    sim.init()
    sim.register_events((0,))
    with tempfile.TemporaryDirectory(prefix="gpu-node-agent-simbench-") as tmp:
        path = Path(tmp) / "faults.jsonl"
        path.touch()
        follower = FaultFollower(sim, path, poll_interval_s=interval_s)
        stop = asyncio.Event()
        task = asyncio.create_task(follower.run(stop))
        out: list[float] = []
        try:
            with path.open("a", encoding="utf-8") as fh:
                for _ in range(runs):
                    waiter = asyncio.create_task(asyncio.to_thread(sim.wait_event, _WAIT_MS))
                    await asyncio.sleep(0.002)  # let the thread block in the wait
                    start = time.perf_counter()
                    fh.write(json.dumps({"event": "xid", "gpu": 0, "xid": 13}) + "\n")
                    fh.flush()
                    event = await waiter
                    if event is None:
                        raise RuntimeError("no event within the wait timeout")
                    out.append(time.perf_counter() - start)
        finally:
            stop.set()
            await task
            sim.shutdown()
    return out


def _wait_into(sim: SimulatedNvml, got: threading.Event) -> None:
    if sim.wait_event(_WAIT_MS) is not None:
        got.set()


def mutation_to_event(runs: int) -> list[float]:
    """Seconds from ``inject_xid`` on one thread to ``wait_event`` returning on another."""
    sim = build_simulator("dgx-h100")
    sim.init()
    sim.register_events((0,))
    out: list[float] = []
    for _ in range(runs):
        got = threading.Event()
        thread = threading.Thread(target=_wait_into, args=(sim, got))
        thread.start()
        time.sleep(0.001)
        start = time.perf_counter()
        sim.inject_xid(0, 13)
        thread.join(_WAIT_MS / 1000)
        if not got.is_set():
            raise RuntimeError("no event within the wait timeout")
        out.append(time.perf_counter() - start)
    sim.shutdown()
    return out


def call_costs(calls: int) -> dict[str, float]:
    """Microseconds per call of a few primitives and protocol methods on ``dgx-a100-mig``."""
    sim = build_simulator("dgx-a100-mig")
    sim.init()
    cases: dict[str, Callable[[SimulatedNvml], object]] = {
        "device_get_name": lambda s: s.device_get_name(3),
        "device_get_nvlink_state": lambda s: s.device_get_nvlink_state(3, 7),
        "gpu()": lambda s: s.gpu(3),
        "nvlinks()": lambda s: s.nvlinks(3),
        "mig_state() (7 devices)": lambda s: s.mig_state(0),
        "sample()": lambda s: s.sample(3),
    }
    out = {}
    for name, fn in cases.items():
        start = time.perf_counter()
        for _ in range(calls):
            fn(sim)
        out[name] = (time.perf_counter() - start) / calls * 1e6
    sim.shutdown()
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu-node-agent bench simulator", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=100, help="timed event round trips (default 100)")
    parser.add_argument(
        "--interval-ms", type=float, default=20.0, help="fault-file poll interval in ms (default 20)"
    )
    parser.add_argument("--calls", type=int, default=2000, help="calls per per-call figure (default 2000)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.calls < 1 or args.interval_ms <= 0:
        parser.error("--runs and --calls must be at least 1, --interval-ms positive")
    print(machine_summary())
    file_lat = asyncio.run(fault_to_event(args.runs, args.interval_ms / 1000))
    print(f"fault file -> event (poll {args.interval_ms:g} ms): {describe_ms(file_lat)}")
    print(f"mutation -> event:                 {describe_ms(mutation_to_event(args.runs))}")
    for name, micros in call_costs(args.calls).items():
        print(f"  {name:<26} {micros:9.1f} us/call")
    worst = max(file_lat) * 1000
    verdict = "within" if worst < BUDGET_MS else "OVER"
    print(f"target: fault file -> event under {BUDGET_MS:.0f} ms: {verdict} (max {worst:.1f} ms)")
    return 0
