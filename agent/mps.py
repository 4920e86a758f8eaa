"""MPS (Multi-Process Service) detection under a root path (``/`` on a node, a temp dir in tests).

The control daemon ``nvidia-cuda-mps-control`` writes ``nvidia-cuda-mps-control.pid`` into its pipe
directory (default ``/tmp/nvidia-mps``; ``CUDA_MPS_PIPE_DIRECTORY`` moves it). The daemon counts as
running when that pid file names a live process (``<root>/proc/<pid>`` exists and, where ``comm`` is
readable, is an MPS process). Per-GPU limits come from the daemon's environment
(``<root>/proc/<pid>/environ``), the way the daemon itself reads them at start:

- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25`` → every visible GPU;
- ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1G,1=512MB`` → per CUDA device ordinal, which maps to a GPU through
  the daemon's ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs) or, without it, the NVML index.

Limits a client sets later through the control pipe are not visible here. Unreadable or malformed values
give one error line each and no limit for that value; everything else is kept. Files are read through
:func:`agent.files.read_bytes` (regular files only, bounded); numbers are ASCII digits of bounded length.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.files import RefusedFileError, read_bytes, read_text
from topology.model import Gpu, MpsGpuLimits, MpsInfo

DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # the MPS default, not a temp file of ours
PID_FILE = "nvidia-cuda-mps-control.pid"

MAX_ENVIRON_BYTES = (
    1024 * 1024
)  # a process environment (Linux allows a quarter of the stack, 2 MiB by default)
_SIZE = re.compile(r"([0-9]{1,15})[ \t]*([KMGT]?)B?", re.IGNORECASE)
_ORDINAL = re.compile(r"[0-9]{1,5}")  # a CUDA device ordinal, an NVML index
_PID = re.compile(r"[0-9]{1,10}")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """``"1G"`` / ``"512MB"`` / ``"1024"`` → bytes (binary units, as MPS reads them)."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise ValueError(f"not a size: {text.strip()[:40]!r}")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


@dataclass(frozen=True, slots=True)
class MpsScan:
    info: MpsInfo
    errors: tuple[str, ...] = ()


def _why(exc: OSError) -> str:
    """Why a file was not read: the bounded reader's own words, or ``unreadable (<strerror>)``."""
    return str(exc.strerror) if isinstance(exc, RefusedFileError) else f"unreadable ({exc.strerror or exc})"


def _under(root: Path, absolute: str) -> Path:
    return root / absolute.lstrip("/")


def _ordinal_gpus(env: dict[str, str], gpus: Sequence[Gpu], errors: list[str], where: str) -> list[Gpu]:
    """CUDA device ordinal → GPU, following ``CUDA_VISIBLE_DEVICES`` when set."""
    by_index = {g.index: g for g in gpus}
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return sorted(gpus, key=lambda g: g.index)
    by_uuid = {g.uuid: g for g in gpus}
    out: list[Gpu] = []
    for item in (v.strip() for v in visible.split(",")):
        if not item:
            continue
        if _ORDINAL.fullmatch(item) and int(item) in by_index:
            out.append(by_index[int(item)])
        elif item in by_uuid:
            out.append(by_uuid[item])
        else:
            errors.append(f"{where}: CUDA_VISIBLE_DEVICES entry {item[:60]!r} is not a GPU of this node")
            break  # CUDA stops at the first invalid entry
    return out


def detect_mps(
    *,
    root: Path,
    gpus: Sequence[Gpu],
    pipe_directory: str = DEFAULT_PIPE_DIRECTORY,
) -> MpsScan:
    """Whether an MPS control daemon runs, and the limits it was started with."""
    pid_path = _under(root, pipe_directory) / PID_FILE
    try:
        raw_pid = read_text(pid_path).strip()
    except FileNotFoundError:
        return MpsScan(MpsInfo(daemon_running=False, pipe_directory=None))
    except OSError as exc:
        return MpsScan(
            MpsInfo(daemon_running=False, pipe_directory=None),
            (f"{pid_path}: {_why(exc)}",),
        )
    if not _PID.fullmatch(raw_pid):
        return MpsScan(
            MpsInfo(daemon_running=False, pipe_directory=None),
            (f"{pid_path}: not a process id: {raw_pid[:40]!r}",),
        )
    proc = root / "proc" / raw_pid
    if not proc.is_dir():  # a stale pid file left by a daemon that died
        return MpsScan(MpsInfo(daemon_running=False, pipe_directory=None))
    try:
        comm = read_text(proc / "comm").strip()
    except OSError:
        comm = None
    if comm is not None and not comm.startswith("nvidia-cuda-mps"):
        return MpsScan(MpsInfo(daemon_running=False, pipe_directory=None))  # the pid was reused
    errors: list[str] = []
    environ_path = proc / "environ"
    try:
        raw_env = read_bytes(environ_path, limit=MAX_ENVIRON_BYTES)
    except OSError as exc:
        errors.append(f"{environ_path}: {_why(exc)}; MPS limits unknown")
        return MpsScan(MpsInfo(daemon_running=True, pipe_directory=pipe_directory), tuple(errors))
    env: dict[str, str] = {}
    for item in raw_env.split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep:
            env[key] = value
    ordered = _ordinal_gpus(env, gpus, errors, str(environ_path))
    percentage: int | None = None
    raw_pct = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    if raw_pct is not None:
        if re.fullmatch(r"[0-9]{1,3}", raw_pct.strip()) and 0 < int(raw_pct) <= 100:
            percentage = int(raw_pct)
        else:
            errors.append(f"{environ_path}: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={raw_pct[:40]!r} is not 1..100")
    pinned: dict[str, int] = {}
    raw_pinned = env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
    if raw_pinned:
        for entry in (e.strip() for e in raw_pinned.split(",")):
            if not entry:
                continue
            ordinal, sep, size = entry.partition("=")
            try:
                if not sep or not _ORDINAL.fullmatch(ordinal.strip()):
                    raise ValueError(f"expected '<ordinal>=<size>', got {entry[:60]!r}")
                n = int(ordinal)
                if n >= len(ordered):
                    raise ValueError(f"device ordinal {n} is not visible to the daemon")
                pinned[ordered[n].uuid] = parse_size(size)
            except ValueError as exc:
                errors.append(f"{environ_path}: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: {exc}")
    limits = [
        MpsGpuLimits(
            gpu_uuid=gpu.uuid,
            active_thread_percentage=percentage,
            pinned_memory_limit_bytes=pinned.get(gpu.uuid),
        )
        for gpu in ordered
        if percentage is not None or gpu.uuid in pinned
    ]
    info = MpsInfo(daemon_running=True, pipe_directory=pipe_directory, gpus=tuple(limits))
    return MpsScan(info, tuple(errors))
