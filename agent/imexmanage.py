"""Host-managed IMEX (``imex.manage: true``): the agent keeps its node's IMEX peer list equal to its NVLink
clique's nodes and restarts the daemon when, and only when, that membership changes.

- **Members**: the ``GPUNode`` objects labelled with this node's clique (``gpuagent.dev/nvlink-clique``,
  watched with that label selector: at most one rack's objects), each giving its IMEX address in
  ``status.imex.address``. This node's own address (``imex.address``, else its Node's ``InternalIP``)
  comes first, the others follow sorted. An address that is not an IP address is left out with a warning.
  More members than ``imex.maxPeers`` (default 64; an NVL72 clique has 18 trays) is an error: the list on
  disk is kept and the error logged.
- **Writing**: ``nodes_config.cfg`` is written to a temporary file in the same directory, flushed and
  renamed over the old one, so the daemon never reads half a list.
- **When**: a member that is *gone* applies at once (its trays' memory exports are lost anyway, and the
  survivors must form a new quorum); a member that was *added* waits while a pod on this node holds a
  GPU (every GPU container gets the IMEX channel, so a running job may be using the current quorum) and
  applies when none does. The first list (no file yet, or a daemon not yet started) applies at once.
- **Daemon**: ``imex.daemon: systemd`` restarts the ``nvidia-imex`` service (``systemctl restart``),
  ``child`` runs ``imex.command`` as the agent's child and restarts it, ``none`` only writes the file;
  under ``--simulate`` the simulated daemon restarts with the new list.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import signal
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from agent.imex import ImexManageConfig, ImexStatus, parse_peers
from agent.imexctl import ImexReader, run_bounded
from agent.imexsim import SimulatedImexDaemon
from topology import logs
from topology.lifecycle import sleep_until, wait_for_event
from topology.nvlink import CLIQUE_LABEL, CliqueKey

DEFAULT_NODES_CONFIG = Path("/etc/nvidia-imex/nodes_config.cfg")


class PeerListTooLongError(ValueError):
    pass


def peer_address(obj: Mapping[str, Any]) -> str | None:
    """The IMEX address a ``GPUNode`` publishes (``status.imex.address``), if it is an IP address."""
    status = obj.get("status")
    imex = status.get("imex") if isinstance(status, Mapping) else None
    value = imex.get("address") if isinstance(imex, Mapping) else None
    if not isinstance(value, str) or len(value) > 45:
        return None
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return None


def peer_list(
    own_address: str, own_name: str, members: Iterable[Mapping[str, Any]], *, max_peers: int
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(peers, skipped member names)``: this node's address first, then every other member's, sorted
    (as addresses), each once. Raises :class:`PeerListTooLongError` past ``max_peers``."""
    others: set[str] = set()
    skipped: list[str] = []
    for obj in members:
        meta = obj.get("metadata")
        name = str(meta.get("name", "")) if isinstance(meta, Mapping) else ""
        if name == own_name:
            continue
        addr = peer_address(obj)
        if addr is None:
            skipped.append(name[:253])
            continue
        if addr != own_address:
            others.add(addr)
    peers = (own_address, *sorted(others, key=ipaddress.ip_address))
    if len(peers) > max_peers:
        raise PeerListTooLongError(
            f"{len(peers)} IMEX peers in this node's clique exceed imex.maxPeers {max_peers}; "
            "the peer list on disk is kept"
        )
    return peers, tuple(sorted(skipped))


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file in the same directory, renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def render_peers(peers: Iterable[str]) -> str:
    return "# written by gpu-node-agent (imex.manage); one peer per line, this node first\n" + "".join(
        f"{p}\n" for p in peers
    )


class DaemonControl(Protocol):
    # True: the daemon lives and dies with the agent (it must be started); False: it outlives the agent
    # (systemd, or run by something else), so a restarted agent leaves it alone when its list is right
    owned: bool

    def restart(self) -> None: ...

    def stop(self) -> None: ...


class SystemdDaemon:
    """``systemctl restart <service>`` (the host's ``nvidia-imex`` unit)."""

    owned = False

    def __init__(self, service: str, *, timeout_s: float = 60.0) -> None:
        self.service = service
        self.timeout_s = timeout_s

    def restart(self) -> None:
        code, text, timed_out = run_bounded(["systemctl", "restart", self.service], self.timeout_s, 4096)
        if timed_out or code != 0:
            said = " ".join(text.split())[:200]
            raise RuntimeError(
                f"systemctl restart {self.service}: exit {code}{' (timed out)' if timed_out else ''}: {said}"
            )

    def stop(self) -> None:
        """The service outlives the agent."""


class ChildDaemon:
    """The daemon as the agent's child process (its own process group), restarted with SIGTERM then a
    new start; stopped with the agent."""

    owned = True

    def __init__(self, command: tuple[str, ...], *, grace_s: float = 5.0) -> None:
        self.command = command
        self.grace_s = grace_s
        self.process: subprocess.Popen[bytes] | None = None

    def restart(self) -> None:
        self.stop()
        self.process = subprocess.Popen(list(self.command), stdin=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(self.grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class NoDaemon:
    """``imex.daemon: none``: the file is written, something else restarts the daemon."""

    owned = False

    def restart(self) -> None:
        pass

    def stop(self) -> None:
        pass


class SimulatedDaemonControl:
    """The simulated daemon, restarted on its address with the new list."""

    owned = True

    def __init__(
        self, daemon: SimulatedImexDaemon, *, address: Callable[[], str | None], port: int, nodes_config: Path
    ) -> None:
        self.daemon = daemon
        self.address = address
        self.port = port
        self.nodes_config = nodes_config

    def restart(self) -> None:
        addr = self.address()
        if addr is None:
            raise RuntimeError("no IMEX address yet")
        self.daemon.start_managed(address=addr, port=self.port, nodes_config=self.nodes_config)

    def stop(self) -> None:
        self.daemon.stop_managed()


class MembersSource(Protocol):
    """This clique's GPUNodes (a :class:`topology.kube.Store` kept by an informer fits)."""

    def snapshot(self) -> dict[str, dict[str, Any]]: ...


class ImexPeerManager:
    """Component: keeps ``nodes_config`` equal to the clique's members and restarts the daemon on a change
    (see the module docstring for when). ``peers`` is the list last applied."""

    def __init__(
        self,
        *,
        config: ImexManageConfig,
        node_name: str,
        nodes_config: Path,
        daemon: DaemonControl,
        address: Callable[[], Awaitable[str | None]],
        clique: Callable[[], CliqueKey | None],
        watch: Callable[[CliqueKey, Callable[[], None]], tuple[MembersSource, Callable[[], None]]],
        busy: Callable[[], Awaitable[bool]],
    ) -> None:
        self.config = config
        self.node_name = node_name
        self.nodes_config = nodes_config
        self.daemon = daemon
        self._resolve_address = address
        self._clique = clique
        self._watch = watch
        self._busy = busy
        self._log = logs.get_logger("agent.imexmanage").bind(node=node_name)
        self.address: str | None = config.address
        self.peers: tuple[str, ...] | None = None
        self.restarts = 0
        self.deferred: tuple[str, ...] | None = None  # a list waiting for the node's GPU pods to end
        self._members: MembersSource | None = None
        self._reported: set[str] = set()

    def _once(self, key: str, event: str, **fields: Any) -> None:
        if key not in self._reported:
            self._reported.add(key)
            self._log.warning(event, **fields)

    async def run(self, stop: asyncio.Event) -> None:
        wake = asyncio.Event()
        loop = asyncio.get_running_loop()

        def changed() -> None:
            loop.call_soon_threadsafe(wake.set)

        backoff = 1.0
        while self.address is None:
            self.address = await self._resolve_address()
            if self.address is None:
                self._once(
                    "address",
                    "imex_address_unknown",
                    hint="set imex.address, or wait for the Node's InternalIP",
                )
                if await sleep_until(stop, backoff):
                    return
                backoff = min(backoff * 2, 30.0)
        clique = self._clique()
        while clique is None:
            self._once(
                "clique",
                "imex_no_clique",
                hint="this node has no multi-node NVLink clique; nothing to manage",
            )
            if await sleep_until(stop, self.config.interval_s):
                return
            clique = self._clique()
        self.peers = self._on_disk()
        members, close = self._watch(clique, changed)
        self._members = members
        self._log.info(
            "imex_manage_started", clique=str(clique), address=self.address, file=str(self.nodes_config)
        )
        try:
            while True:
                wake.clear()
                try:
                    await self.step()
                except Exception as exc:  # a failed write or restart: logged, retried
                    self._log.error("imex_apply_failed", error=str(exc), retry_s=self.config.interval_s)
                if await wait_for_event(wake, stop, self.config.interval_s):
                    break
        finally:
            close()
            await asyncio.to_thread(self.daemon.stop)

    def _on_disk(self) -> tuple[str, ...] | None:
        try:
            text = self.nodes_config.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        return parse_peers(text)[0]

    async def step(self) -> bool:
        """Compare the wanted list with the applied one; apply it when the rules allow. ``True`` when it
        was applied."""
        assert self.address is not None
        assert self._members is not None
        try:
            wanted, skipped = peer_list(
                self.address,
                self.node_name,
                self._members.snapshot().values(),
                max_peers=self.config.max_peers,
            )
        except PeerListTooLongError as exc:
            self._once(f"too-long {exc}", "imex_peer_list_too_long", error=str(exc))
            return False
        for name in skipped:
            self._once(
                f"skip {name}",
                "imex_peer_without_address",
                peer=name,
                hint="its agent has not published a valid IMEX address",
            )
        # the agent's first step starts a daemon it owns; one that outlives the agent (systemd) and already
        # has the wanted list on disk is left running: a restarted agent never breaks a job's quorum
        first = self.restarts == 0 and (self.daemon.owned or self.peers is None)
        if wanted == self.peers and not first:
            self.deferred = None
            return False
        current = set(self.peers or ())
        removed = sorted(current - set(wanted))
        added = sorted(set(wanted) - current)
        if not first and not removed and await self._busy():
            if self.deferred != wanted:
                self.deferred = wanted
                self._log.info(
                    "imex_peers_deferred",
                    added=added,
                    hint="a pod on this node holds GPUs; the new member joins when none does",
                )
            return False
        if wanted != self.peers:
            await asyncio.to_thread(write_atomic, self.nodes_config, render_peers(wanted))
        await asyncio.to_thread(self.daemon.restart)
        self.restarts += 1
        self.peers = wanted
        self.deferred = None
        self._log.info(
            "imex_peers_applied",
            peers=len(wanted),
            peer_list=list(wanted),
            added=added,
            removed=removed,
            restarts=self.restarts,
        )
        return True


class ManagedImexReader:
    """The daemon's status with ``managed`` and this node's address, for ``status.imex``."""

    def __init__(self, reader: ImexReader, manager: ImexPeerManager) -> None:
        self.reader = reader
        self.manager = manager

    def read(self) -> ImexStatus:
        status = self.reader.read()
        return ImexStatus(
            status.status, status.peers, status.reason, managed=True, address=self.manager.address
        )


# --------------------------------------------------------------------------- the run command's wiring


def internal_ip(node: Mapping[str, Any]) -> str | None:
    """The Node's first ``InternalIP`` address."""
    status = node.get("status")
    addresses = status.get("addresses") if isinstance(status, Mapping) else None
    for a in addresses if isinstance(addresses, list) else []:
        if isinstance(a, Mapping) and a.get("type") == "InternalIP":
            with contextlib.suppress(ValueError):
                return str(ipaddress.ip_address(str(a.get("address"))))
    return None


def manager_for_run(
    *,
    config: ImexManageConfig,
    node_name: str,
    kubeconfig: Path | None,
    reader: ImexReader,
    simulated_root: Path | None,
    clique: Callable[[], CliqueKey | None],
    pod_resources_socket: Path,
) -> tuple[ImexPeerManager, ImexReader]:
    """The manager for ``run`` and the reader that adds ``managed``/``address`` to the status; raises
    ``RuntimeError`` with one line when there is no Kubernetes API to watch the clique in."""
    from topology.kube import GPUNODES, NODES, Informer, Kube, KubeError, Store, api_client_from  # noqa: PLC0415

    try:
        kube = Kube(api_client_from(str(kubeconfig) if kubeconfig else None))
    except Exception as exc:
        raise RuntimeError(
            f"imex.manage needs the Kubernetes API to find the clique's nodes: {exc}"
        ) from None
    if config.nodes_config is not None:
        nodes_config = config.nodes_config
    elif simulated_root is not None:
        nodes_config = simulated_root / "etc" / "nvidia-imex" / "nodes_config.cfg"
    else:
        nodes_config = DEFAULT_NODES_CONFIG
    if isinstance(reader, SimulatedImexDaemon):
        reader.expect_managed()
        holder: list[ImexPeerManager] = []
        daemon: DaemonControl = SimulatedDaemonControl(
            reader,
            address=lambda: holder[0].address if holder else None,
            port=config.port,
            nodes_config=nodes_config,
        )
    elif config.daemon == "systemd":
        daemon = SystemdDaemon(config.service)
    elif config.daemon == "child":
        daemon = ChildDaemon(config.command)
    else:
        daemon = NoDaemon()

    async def address() -> str | None:
        try:
            node = await asyncio.to_thread(kube.get, f"{NODES}/{node_name}")
        except KubeError:
            return None
        return internal_ip(node)

    def watch(key: CliqueKey, changed: Callable[[], None]) -> tuple[MembersSource, Callable[[], None]]:
        store = Store(changed)
        informer = Informer(kube, GPUNODES, store, label_selector=f"{CLIQUE_LABEL}={key}", optional=True)
        informer.start()
        return store, informer.stop_soon

    async def busy() -> bool:
        from agent.podresources.client import PodResourcesClient, PodResourcesError  # noqa: PLC0415

        client = PodResourcesClient(str(pod_resources_socket))
        try:
            rows, _ = await client.list()
        except PodResourcesError:
            return True  # cannot tell: a running job's quorum is kept
        finally:
            await client.close()
        return any(r.resource.startswith("nvidia.com/") or r.resource.endswith("gpuagent.dev") for r in rows)

    manager = ImexPeerManager(
        config=config,
        node_name=node_name,
        nodes_config=nodes_config,
        daemon=daemon,
        address=address,
        clique=clique,
        watch=watch,
        busy=busy,
    )
    if isinstance(reader, SimulatedImexDaemon):
        holder.append(manager)
    return manager, ManagedImexReader(reader, manager)
