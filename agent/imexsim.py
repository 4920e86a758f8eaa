"""The simulated IMEX daemon of ``--simulate`` GB200 trays: it answers as ``nvidia-imex-ctl -q`` does;
fault lines ``{"event":"imex","state":"…"}`` (``agent.nvml.faults``) drive it, and managed by the agent
(``imex.manage``) it listens on its address and reaches ``READY`` only when every listed peer answers.
Kept apart from :mod:`agent.imex` (pure, read by the metrics cores) because it opens sockets."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from agent.imex import ImexDaemonStatus, ImexStatus, parse_ctl_output, parse_peers


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
