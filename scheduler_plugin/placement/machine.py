"""The machine a benchmark ran on, in one line (scheduler_plugin may not import ``agent.benchinfo``)."""

from __future__ import annotations

import os
import platform


def machine_summary() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), model)
    except OSError:
        pass
    try:
        ram = f", {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB RAM"
    except (ValueError, OSError):
        ram = ""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return (
        f"machine: {model}, {usable} usable CPUs of {os.cpu_count()}{ram}; "
        f"Python {platform.python_version()} ({platform.python_implementation()}) on {platform.system()} "
        f"{platform.release()}"
    )
