"""The node's IMEX daemon as ``nvidia-imex-ctl -q`` reports it, and the simulated daemon of ``--simulate``.

Multi-node NVLink needs the ``nvidia-imex`` daemon on every node of the domain, with the domain's nodes
in its peer list (``/etc/nvidia-imex/nodes_config.cfg``, one IP address or DNS name per line). Its
state is one of DCGM's ``DCGM_FI_IMEX_DAEMON_STATUS`` values (``INITIALIZING`` 0 … ``READY`` 5 …
``UNAVAILABLE`` 7; ``NOT_INSTALLED`` -1, ``NOT_CONFIGURED`` -2, ``COMMAND_ERROR`` -3). The node's label
``gpuagent.dev/imex`` is ``ready`` (``READY``), ``absent`` (no daemon installed — not an error) or
``not-ready`` (anything else).

Pure: :func:`parse_ctl_output` reads the command's answer, :func:`parse_peers` the peer list,
:class:`ImexManageConfig` is the config's ``imex`` daemon settings (here, not in :mod:`agent.imexmanage`,
so that reading the config does not load the manager); the
adapter that runs the command and reads the file is :mod:`agent.imexctl`; the simulated daemon of
``--simulate`` is :mod:`agent.imexsim`.
"""

from __future__ import annotations

import enum
import ipaddress
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


class NoImexDaemon:
    """A node without multi-node NVLink (a simulated one): no IMEX daemon installed."""

    def read(self) -> ImexStatus:
        return ImexStatus(ImexDaemonStatus.NOT_INSTALLED)


DEFAULT_COMMAND = ("nvidia-imex", "-c", "/etc/nvidia-imex/config.cfg")
DAEMONS = ("systemd", "child", "none")
MAX_PEERS_LIMIT = 1024


@dataclass(frozen=True, slots=True)
class ImexManageConfig:
    """The ``imex`` section's daemon settings (``channelIDs``/``required`` are the device plugin's)."""

    manage: bool = False
    ctl: str = "nvidia-imex-ctl"  # the status command (a path, or a name on the PATH); read also unmanaged
    daemon: str = "systemd"  # systemd | child | none
    service: str = "nvidia-imex.service"
    command: tuple[str, ...] = DEFAULT_COMMAND
    nodes_config: Path | None = None  # None: DEFAULT_NODES_CONFIG (--simulate: the simulated node's own)
    address: str | None = None  # None: the Node's InternalIP
    port: int = 50000  # SERVER_PORT of the daemon (the simulated daemon listens here)
    max_peers: int = 64
    interval_s: float = 5.0  # how often a deferred change is tried again

    def __post_init__(self) -> None:
        if self.daemon not in DAEMONS:
            raise ValueError(f"imex.daemon: {self.daemon!r} is not one of {', '.join(DAEMONS)}")
        if not 1 <= self.max_peers <= MAX_PEERS_LIMIT:
            raise ValueError(f"imex.maxPeers: must be 1..{MAX_PEERS_LIMIT}, got {self.max_peers}")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"imex.port: must be 1..65535, got {self.port}")
        if self.address is not None:
            try:
                ipaddress.ip_address(self.address)
            except ValueError:
                raise ValueError(f"imex.address: {self.address[:60]!r} is not an IP address") from None
        if self.daemon == "child" and not self.command:
            raise ValueError("imex.command: the child daemon needs a command")
