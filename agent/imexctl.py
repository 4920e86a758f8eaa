"""The IMEX daemon adapter: asks ``nvidia-imex-ctl -q`` and reads the peer list; the component of ``run``
that keeps the latest status for the publisher (``GPUNode`` ``status.imex``, label ``gpuagent.dev/imex``)
and the metrics (``gpuagent_imex_daemon_status``; ``DCGM_FI_IMEX_DAEMON_STATUS`` in DCGM format).

No ``nvidia-imex-ctl`` on the ``PATH`` is ``NOT_INSTALLED`` (the label says ``absent``), not an error.
A command that fails, hangs past ``timeout_s`` or answers nothing usable is ``COMMAND_ERROR`` with the
reason. The command runs in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Protocol

from agent.imex import ImexDaemonStatus, ImexStatus, parse_ctl_output, parse_peers
from topology import logs
from topology.lifecycle import sleep_until

DEFAULT_CTL = "nvidia-imex-ctl"
DEFAULT_NODES_CONFIG = Path("/etc/nvidia-imex/nodes_config.cfg")
MAX_OUTPUT_CHARS = 4096
MAX_PEER_FILE_BYTES = 256 * 1024


class ImexReader(Protocol):
    def read(self) -> ImexStatus: ...


class ImexCtlReader:
    """The host's daemon, through its control command and its peer list."""

    def __init__(
        self, *, ctl: str = DEFAULT_CTL, nodes_config: Path = DEFAULT_NODES_CONFIG, timeout_s: float = 5.0
    ) -> None:
        self.ctl = ctl
        self.nodes_config = nodes_config
        self.timeout_s = timeout_s

    def read(self) -> ImexStatus:
        path = shutil.which(self.ctl)
        if path is None:
            return ImexStatus(ImexDaemonStatus.NOT_INSTALLED)
        peers, peer_problem = self._peers()
        try:
            code, text, timed_out = run_bounded([path, "-q"], self.timeout_s, MAX_OUTPUT_CHARS)
        except OSError as exc:
            return ImexStatus(ImexDaemonStatus.COMMAND_ERROR, peers, f"{self.ctl} -q: {exc.strerror or exc}")
        if timed_out:
            return ImexStatus(
                ImexDaemonStatus.COMMAND_ERROR, peers, f"{self.ctl} -q gave no answer in {self.timeout_s:g} s"
            )
        if code != 0:
            said = " ".join(text.split())[:200]
            return ImexStatus(ImexDaemonStatus.COMMAND_ERROR, peers, f"{self.ctl} -q exited {code}: {said}")
        status = parse_ctl_output(text)
        return ImexStatus(status, peers, peer_problem)

    def _peers(self) -> tuple[tuple[str, ...], str | None]:
        try:
            with self.nodes_config.open("rb") as fh:
                raw = fh.read(MAX_PEER_FILE_BYTES)
        except OSError as exc:
            return (), f"no peer list: {self.nodes_config}: {exc.strerror or exc}"
        return parse_peers(raw.decode("utf-8", "replace"))


def run_bounded(argv: list[str], timeout_s: float, limit: int) -> tuple[int, str, bool]:
    """Run ``argv`` and keep at most ``limit`` bytes of its output (stdout and stderr together); a
    command still running after ``timeout_s``, or writing more, is killed with whatever it started (its
    own process group). Returns (exit code, output, whether it timed out)."""
    expired = threading.Event()
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    ) as proc:

        def stop() -> None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

        def expire() -> None:
            expired.set()
            stop()

        timer = threading.Timer(timeout_s, expire)
        timer.start()
        try:
            assert proc.stdout is not None
            data = proc.stdout.read(limit)
            if len(data) == limit:
                stop()  # more than we keep
            code = proc.wait()
        finally:
            timer.cancel()
    return code, data.decode("utf-8", "replace"), expired.is_set()


class ImexMonitor:
    """Component: reads the daemon's status every ``interval_s``; ``status`` is the latest (``None``
    before the first read), ``version`` counts its changes."""

    def __init__(self, *, reader: ImexReader, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._reader = reader
        self._interval = interval_s
        self._log = logs.get_logger("agent.imex")
        self.status: ImexStatus | None = None
        self.version = 0
        self.read_once = asyncio.Event()  # set after the first read, whatever it found

    async def run(self, stop: asyncio.Event) -> None:
        if self.status is None:
            await self.once()
        while not await sleep_until(stop, self._interval):
            await self.once()

    async def once(self) -> bool:
        """One read; ``True`` when the status changed."""
        status = await asyncio.to_thread(self._reader.read)
        self.read_once.set()
        if status == self.status:
            return False
        before, self.status = self.status, status
        self.version += 1
        event = self._log.info if status.status is ImexDaemonStatus.READY else self._log.warning
        event(
            "imex_status_changed",
            status=status.status.value,
            previous=before.status.value if before is not None else None,
            peers=len(status.peers),
            reason=status.reason,
            hint=None
            if status.label != "not-ready"
            else "multi-node NVLink needs the IMEX daemon READY; check nvidia-imex on this node",
        )
        return True
