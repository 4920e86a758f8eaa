"""The node's IMEX daemon as ``nvidia-imex-ctl -q`` reports it, and the simulated daemon of ``--simulate``.

Multi-node NVLink needs the ``nvidia-imex`` daemon on every node of the domain, with the domain's nodes
in its peer list (``/etc/nvidia-imex/nodes_config.cfg``, one IP address or DNS name per line). Its
state is one of DCGM's ``DCGM_FI_IMEX_DAEMON_STATUS`` values (``INITIALIZING`` 0 … ``READY`` 5 …
``UNAVAILABLE`` 7; ``NOT_INSTALLED`` -1, ``NOT_CONFIGURED`` -2, ``COMMAND_ERROR`` -3). The node's label
``gpuagent.dev/imex`` is ``ready`` (``READY``), ``absent`` (no daemon installed — not an error) or
``not-ready`` (anything else).

Pure: :func:`parse_ctl_output` reads the command's answer, :func:`parse_peers` the peer list; the
adapter that runs the command and reads the file is :mod:`agent.imexctl`. :class:`SimulatedImexDaemon`
answers the same text; fault lines ``{"event":"imex","state":"…"}`` (``agent.nvml.faults``) drive it.
"""

from __future__ import annotations

import enum
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_PEERS = 1024  # an NVL72 domain has 18 nodes; a larger list is cut here, with a reason
MAX_PEER_LENGTH = 253


class ImexDaemonStatus(enum.StrEnum):
    INITIALIZING = "INITIALIZING"
    STARTING_AUTH_SERVER = "STARTING_AUTH_SERVER"
    WAITING_FOR_PEERS = "WAITING_FOR_PEERS"
    WAITING_FOR_RECOVERY = "WAITING_FOR_RECOVERY"
    INIT_GPU = "INIT_GPU"
    READY = "READY"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    UNAVAILABLE = "UNAVAILABLE"
    NOT_INSTALLED = "NOT_INSTALLED"
    NOT_CONFIGURED = "NOT_CONFIGURED"
    COMMAND_ERROR = "COMMAND_ERROR"


DCGM_VALUES: Mapping[ImexDaemonStatus, int] = {
    **{s: i for i, s in enumerate(list(ImexDaemonStatus)[:8])},
    ImexDaemonStatus.NOT_INSTALLED: -1,
    ImexDaemonStatus.NOT_CONFIGURED: -2,
    ImexDaemonStatus.COMMAND_ERROR: -3,
}
"""``DCGM_FI_IMEX_DAEMON_STATUS`` (field 1503) per status, as DCGM's ``dcgm_fields.h`` numbers them."""


@dataclass(frozen=True, slots=True)
class ImexStatus:
    status: ImexDaemonStatus
    peers: tuple[str, ...] = ()
    reason: str | None = None  # why the status is what it is, where the agent knows more
    managed: bool = False  # the agent keeps the peer list (imex.manage)
    address: str | None = None  # this node's IMEX address, where the agent manages the daemon

    @property
    def label(self) -> str:
        """The ``gpuagent.dev/imex`` value: ``ready``, ``not-ready`` or ``absent``."""
        if self.status is ImexDaemonStatus.READY:
            return "ready"
        if self.status is ImexDaemonStatus.NOT_INSTALLED:
            return "absent"
        return "not-ready"

    def to_status(self) -> dict[str, Any]:
        """The ``GPUNode`` ``status.imex`` object (and ``discover``'s ``imex``)."""
        out: dict[str, Any] = {"state": self.label, "status": self.status.value, "peers": len(self.peers)}
        if self.reason:
            out["reason"] = self.reason
        if self.managed:
            out["managed"] = True
        if self.address:
            out["address"] = self.address
        return out

    def to_dict(self) -> dict[str, Any]:
        """For ``discover``: the status object plus the peer list."""
        return {**self.to_status(), "peerList": list(self.peers)}


def parse_ctl_output(text: str) -> ImexDaemonStatus:
    """The status in ``nvidia-imex-ctl -q``'s answer: its first word that names one (``READY``, …);
    ``UNAVAILABLE`` when none does."""
    for word in text.replace(":", " ").split()[:64]:
        try:
            return ImexDaemonStatus(word.strip().upper())
        except ValueError:
            continue
    return ImexDaemonStatus.UNAVAILABLE


def parse_peers(text: str) -> tuple[tuple[str, ...], str | None]:
    """The peers of a ``nodes_config.cfg`` (one address or name per line; ``#`` comments and blank
    lines skipped), at most ``MAX_PEERS``; the second item says what was left out, if anything."""
    peers: list[str] = []
    skipped = 0
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if len(line) > MAX_PEER_LENGTH or any(c.isspace() for c in line) or not line.isprintable():
            skipped += 1
            continue
        if len(peers) == MAX_PEERS:
            skipped += 1
            continue
        peers.append(line)
    reason = f"{skipped} line(s) of the peer list left out (not an address or name, or past {MAX_PEERS})"
    return tuple(peers), (reason if skipped else None)


class SimulatedImexDaemon:
    """The IMEX daemon of a simulated GB200 tray: ``READY`` with the rack's trays as peers until a fault
    line changes its state (``NOT_INSTALLED`` makes it absent).

    Managed (:meth:`start_managed`, what ``imex.manage`` does under ``--simulate``): it listens on its
    address and port as the real daemon does, reads its peers from the ``nodes_config.cfg`` the agent
    wrote, and is ``READY`` only while every listed peer answers on that port (``WAITING_FOR_PEERS``
    otherwise), so a stopped agent's tray degrades its peers' quorum. A fault line's state other than
    ``READY`` still wins."""

    PROBE_TIMEOUT_S = 0.3

    def __init__(self, peers: tuple[str, ...], state: ImexDaemonStatus = ImexDaemonStatus.READY) -> None:
        self.peers = peers
        self._state = state
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._managed: tuple[str, int, Path] | None = None  # (address, port, nodes_config)
        self._expect_managed = False  # imex.manage: not started until the agent starts it
        self.starts = 0

    def expect_managed(self) -> None:
        """The agent manages this daemon: it reports ``UNAVAILABLE`` until :meth:`start_managed`."""
        with self._lock:
            self._expect_managed = True

    def start_managed(self, *, address: str, port: int, nodes_config: Path) -> None:
        """(Re)start as the managed daemon: listen on ``address:port``, take peers from ``nodes_config``."""
        self.stop_managed()
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        sock.settimeout(0.2)
        with self._lock:
            self._listener = sock
            self._managed = (address, port, nodes_config)
            self.starts += 1
        self._thread = threading.Thread(target=self._accept, args=(sock,), name="sim-imex", daemon=True)
        self._thread.start()

    def stop_managed(self) -> None:
        with self._lock:
            sock, self._listener = self._listener, None
        if sock is not None:
            sock.close()
        if self._thread is not None:
            self._thread.join(2.0)
            self._thread = None

    def _accept(self, sock: socket.socket) -> None:
        while True:
            with self._lock:
                if self._listener is not sock:
                    return
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.close()

    def _quorum(
        self, address: str, port: int, nodes_config: Path
    ) -> tuple[ImexDaemonStatus, tuple[str, ...], str | None]:
        try:
            peers, _ = parse_peers(nodes_config.read_text(encoding="utf-8", errors="replace"))
        except OSError as exc:
            return ImexDaemonStatus.NOT_CONFIGURED, (), f"no peer list: {exc.strerror or exc}"
        missing = []
        for peer in peers:
            if peer == address:
                continue
            try:
                with socket.create_connection((peer, port), timeout=self.PROBE_TIMEOUT_S):
                    pass
            except OSError:
                missing.append(peer)
        if missing:
            shown = ", ".join(missing[:4]) + (f" (+{len(missing) - 4} more)" if len(missing) > 4 else "")
            return ImexDaemonStatus.WAITING_FOR_PEERS, peers, f"{len(missing)} peer(s) not answering: {shown}"
        return ImexDaemonStatus.READY, peers, None

    @property
    def state(self) -> ImexDaemonStatus:
        with self._lock:
            return self._state

    def set_state(self, state: str) -> None:
        """A fault line's ``state``; ``ValueError`` naming the valid states."""
        try:
            value = ImexDaemonStatus(state.upper())
        except ValueError:
            valid = ", ".join(s.value for s in ImexDaemonStatus)
            raise ValueError(f"unknown IMEX daemon state {state[:40]!r}; valid: {valid}") from None
        with self._lock:
            self._state = value

    def query(self) -> str:
        """What ``nvidia-imex-ctl -q`` prints."""
        return f"{self.state.value}\n"

    def read(self) -> ImexStatus:
        state = self.state
        if state is ImexDaemonStatus.NOT_INSTALLED:
            return ImexStatus(state)
        with self._lock:
            managed, listening, expected = self._managed, self._listener is not None, self._expect_managed
        if managed is None and expected:
            return ImexStatus(
                ImexDaemonStatus.UNAVAILABLE, (), "waiting for the agent to write the peer list"
            )
        if managed is not None:
            address, port, nodes_config = managed
            if not listening:
                return ImexStatus(ImexDaemonStatus.UNAVAILABLE, (), "the simulated daemon is stopped")
            quorum, peers, reason = self._quorum(address, port, nodes_config)
            if state is not ImexDaemonStatus.READY:  # a fault line's state wins
                return ImexStatus(state, peers)
            return ImexStatus(quorum, peers, reason)
        return ImexStatus(parse_ctl_output(self.query()), self.peers)

    def close(self) -> None:
        self.stop_managed()


class NoImexDaemon:
    """A node without multi-node NVLink (a simulated one): no IMEX daemon installed."""

    def read(self) -> ImexStatus:
        return ImexStatus(ImexDaemonStatus.NOT_INSTALLED)
