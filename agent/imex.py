"""The node's IMEX daemon as ``nvidia-imex-ctl -q`` reports it, and the simulated daemon of ``--simulate``.

Multi-node NVLink needs the ``nvidia-imex`` daemon on every node of the domain, with the domain's nodes
in its peer list (``/etc/nvidia-imex/nodes_config.cfg``, one IP address or DNS name per line). Its
state is one of DCGM's ``DCGM_FI_IMEX_DAEMON_STATUS`` values (``INITIALIZING`` 0 … ``READY`` 5 …
``UNAVAILABLE`` 7; ``NOT_INSTALLED`` -1, ``NOT_CONFIGURED`` -2, ``COMMAND_ERROR`` -3). The node's label
``gpuagent.dev/imex`` is ``ready`` (``READY``), ``absent`` (no daemon installed — not an error) or
``not-ready`` (anything else).

Pure: :func:`parse_ctl_output` reads the command's answer, :func:`parse_peers` the peer list; the
adapter that runs the command and reads the file is :mod:`agent.imexctl`; the simulated daemon of
``--simulate`` is :mod:`agent.imexsim`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
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


class NoImexDaemon:
    """A node without multi-node NVLink (a simulated one): no IMEX daemon installed."""

    def read(self) -> ImexStatus:
        return ImexStatus(ImexDaemonStatus.NOT_INSTALLED)
