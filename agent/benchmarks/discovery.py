"""``gpu-node-agent bench discovery [--runs N] [--profile P ...]``: full discovery time per profile.

For each simulator profile: the simulated sysfs tree is written once, then

- ``discover``: :func:`agent.discovery.discover` on an initialised simulator (NVML queries, NVLink
  resolution, matrix, IB sysfs read, MPS check) — what the agent pays on every rediscovery;
- ``cold``: building the simulator from its spec, ``init()`` and one discovery — what ``discover
  --simulate`` pays once.

Figures are median / p95 / p99 / max over ``--runs`` runs (after a few warm-up runs), printed with the
machine they ran on. The target for ``dgx-a100-mig`` (the largest inventory) is under 50 ms.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from agent.benchmarks.machine import describe_ms, machine_summary
from agent.nvml.simulate import PROFILES
from agent.simnode import open_simulated_node

TARGET_MS = 50.0
TARGET_PROFILE = "dgx-a100-mig"


def _time(fn: Callable[[], object], runs: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out: list[float] = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def bench_profile(profile: str, *, runs: int, warmup: int = 3) -> dict[str, list[float]]:
    """Durations in seconds, by phase (``discover``, ``cold``), for one profile."""
    with open_simulated_node(profile) as node:
        node.nvml.init()

        def cold() -> object:
            with open_simulated_node(node.spec, sysfs_root=node.sysfs_root) as fresh:
                fresh.nvml.init()
                try:
                    return fresh.discover()
                finally:
                    fresh.nvml.shutdown()

        try:
            return {"discover": _time(node.discover, runs, warmup), "cold": _time(cold, runs, warmup)}
        finally:
            node.nvml.shutdown()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu-node-agent bench discovery", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--runs", type=int, default=200, help="timed runs per profile and phase (default 200)"
    )
    parser.add_argument(
        "--profile",
        action="append",
        metavar="P",
        help=f"simulator profile (repeatable; default all: {', '.join(PROFILES)})",
    )
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if ns.runs < 1:
        print("bench discovery: --runs must be at least 1", flush=True)
        return 2
    profiles = ns.profile or list(PROFILES)
    unknown = [p for p in profiles if p.partition(":")[0] not in PROFILES]
    if unknown:
        print(f"bench discovery: unknown profile {unknown[0]!r}; valid: {', '.join(PROFILES)}")
        return 2
    print(machine_summary())
    print(f"discovery through the simulator, {ns.runs} runs per profile and phase")
    target_median: float | None = None
    for profile in profiles:
        results = bench_profile(profile, runs=ns.runs)
        for phase, values in results.items():
            print(f"  {profile:<14} {phase:<8} {describe_ms(values)}")
        if profile == TARGET_PROFILE:
            target_median = statistics.median(results["discover"]) * 1000
    if target_median is not None:
        verdict = "within" if target_median < TARGET_MS else "OVER"
        print(
            f"target: {TARGET_PROFILE} discovery under {TARGET_MS:.0f} ms: "
            f"{verdict} ({target_median:.3f} ms median)"
        )
    return 0
