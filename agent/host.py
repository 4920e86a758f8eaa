"""Host facts: hostname, CPUs, memory, NUMA nodes — read from a sysfs/procfs root, or given.

:func:`read_host` is the adapter for a real machine (roots injectable, so tests point it at a tree);
discovery itself only receives a :class:`topology.model.Host`. A simulated node supplies its own host
(its profile knows it), so nothing here is read on that path. CPU lists use Linux list syntax
(``0-55,112-167``); :func:`parse_cpulist` and :func:`format_cpulist` convert.

Every file is read through :func:`agent.files.read_text` (regular files only, bounded), and every
number is ASCII digits of bounded length: CPU ids stay below :data:`MAX_CPUS`, so ``cpu/online`` of
``0-4294967295`` is refused instead of built. A fact that cannot be read or makes no sense is left out
(``None``, or the fallback named below) with one ``host_fact_skipped`` warning naming the file.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from agent.files import read_text
from topology import logs
from topology.model import Host, NumaNode

if TYPE_CHECKING:
    from agent.nvml.profiles import MachineSpec

MAX_CPUS = 65536  # CPU ids 0..65535; Linux's NR_CPUS tops out at 8192
_NODE_DIR = re.compile(r"node([0-9]{1,5})")
_MEMINFO_TOTAL = re.compile(r"MemTotal:[ \t]+([0-9]{1,15})[ \t]*kB")
_CPU_RANGE = re.compile(r"([0-9]{1,6})(?:-([0-9]{1,6}))?")
_MAX_LINE = 256  # hostname, osrelease, product_uuid: one short line

log = logs.get_logger("agent.host")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` → ``(0, 1, 2, 3, 8, 10, 11)``; ``""`` → ``()``. Raises ``ValueError`` for
    anything else, including a CPU id of :data:`MAX_CPUS` or more (so the work is bounded)."""
    shown = text.strip()[:80]
    out: set[int] = set()
    for raw in text.strip().split(","):
        part = raw.strip()
        if not part:
            continue
        match = _CPU_RANGE.fullmatch(part)
        if match is None:
            raise ValueError(f"not a CPU list: {shown!r}")
        start = int(match.group(1))
        end = start if match.group(2) is None else int(match.group(2))
        if end < start:
            raise ValueError(f"not a CPU list (descending range {part!r}): {shown!r}")
        if end >= MAX_CPUS:
            raise ValueError(f"not a CPU list (CPU {end} is beyond the limit of {MAX_CPUS}): {shown!r}")
        out.update(range(start, end + 1))
    return tuple(sorted(out))


def format_cpulist(cpus: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 8]`` → ``"0-3,8"`` (sorted, ranges merged)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def cpulist_from_masks(masks: Iterable[int], bits: int = 64) -> str:
    """CPU list of an array of ``bits``-wide affinity masks (NVML's ``nvmlDeviceGetCpuAffinity``)."""
    cpus = [word * bits + bit for word, mask in enumerate(masks) for bit in range(bits) if mask >> bit & 1]
    return format_cpulist(cpus)


def _read(path: Path) -> str | None:
    """The file's text, stripped; ``None`` when it is missing, or (with a warning) unreadable."""
    try:
        return read_text(path).strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("host_fact_skipped", path=str(path), error=exc.strerror or str(exc))
        return None


def _read_line(path: Path) -> str | None:
    """A one-line fact (hostname, kernel release, DMI UUID): printable ASCII of at most ``_MAX_LINE``
    characters, else ``None`` with a warning."""
    text = _read(path)
    if text is None or (text.isascii() and text.isprintable() and 0 < len(text) <= _MAX_LINE):
        return text or None
    log.warning("host_fact_skipped", path=str(path), error=f"not one short line of text: {text[:40]!r}")
    return None


def read_numa_nodes(sysfs_root: Path) -> tuple[NumaNode, ...]:
    """NUMA nodes from ``<sysfs_root>/devices/system/node/node<N>/{cpulist,meminfo}``."""
    base = sysfs_root / "devices" / "system" / "node"
    try:
        entries = [(int(m.group(1)), p) for p in base.iterdir() if (m := _NODE_DIR.fullmatch(p.name))]
    except OSError:
        return ()
    nodes: list[NumaNode] = []
    for node_id, path in sorted(entries):
        raw_cpus = _read(path / "cpulist") or ""
        try:
            cpus = format_cpulist(parse_cpulist(raw_cpus))
        except ValueError as exc:
            log.warning("host_fact_skipped", path=str(path / "cpulist"), error=str(exc))
            cpus = ""
        memory: int | None = None
        meminfo = _read(path / "meminfo")
        if meminfo:
            match = _MEMINFO_TOTAL.search(meminfo)
            memory = int(match.group(1)) * 1024 if match else None
        nodes.append(NumaNode(id=node_id, cpus=cpus, memory_bytes=memory))
    return tuple(nodes)


def read_host(
    *,
    sysfs_root: Path = Path("/sys"),
    proc_root: Path = Path("/proc"),
    hostname: str | None = None,
) -> Host:
    """This machine's facts. ``hostname`` overrides the kernel's (a node name from the Downward API)."""
    name = hostname or _read_line(proc_root / "sys" / "kernel" / "hostname") or socket.gethostname()
    cpu_count = 0
    online_path = sysfs_root / "devices" / "system" / "cpu" / "online"
    online = _read(online_path)
    if online:
        try:
            cpu_count = len(parse_cpulist(online))
        except ValueError as exc:
            log.warning("host_fact_skipped", path=str(online_path), error=str(exc))
            cpu_count = 0
    if cpu_count == 0:
        cpu_count = os.cpu_count() or 0
    memory = 0
    meminfo = _read(proc_root / "meminfo")
    if meminfo and (match := _MEMINFO_TOTAL.search(meminfo)):
        memory = int(match.group(1)) * 1024
    return Host(
        name=name,
        cpu_count=cpu_count,
        memory_bytes=memory,
        numa_nodes=read_numa_nodes(sysfs_root),
        kernel=_read_line(proc_root / "sys" / "kernel" / "osrelease"),
        system_uuid=_read_line(sysfs_root / "class" / "dmi" / "id" / "product_uuid"),
    )


def simulated_host(machine: MachineSpec, *, hostname: str | None = None) -> Host:
    """The host a simulator profile describes (its hostname, CPUs, memory and NUMA nodes)."""
    return Host(
        name=hostname or machine.hostname,
        cpu_count=machine.cpu_count,
        memory_bytes=machine.memory_bytes,
        numa_nodes=machine.numa_nodes,
        kernel=None,
        system_uuid=machine.system_uuid,
    )
