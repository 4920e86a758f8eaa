"""Machine facts every benchmark prints beside its figures."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence


def machine_summary() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        mem = f", {pages / 2**30:.0f} GiB RAM"
    except (ValueError, OSError):
        pass
    return (
        f"machine: {cpu}, {os.cpu_count()} CPUs{mem}; "
        f"Python {platform.python_version()} on {platform.system()} {platform.release()}"
    )


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (pct in 0..100) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(pct / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def describe_ms(values_s: Sequence[float]) -> str:
    """'p50 … ms, p95 …, p99 …, max …' for durations given in seconds."""
    ms = [v * 1000 for v in values_s]
    return (
        f"median {statistics.median(ms):.3f} ms, p95 {percentile(ms, 95):.3f} ms, "
        f"p99 {percentile(ms, 99):.3f} ms, max {max(ms):.3f} ms (n={len(ms)})"
    )
