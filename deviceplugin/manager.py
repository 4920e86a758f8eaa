"""The plugin manager: one server per advertised resource, registration with kubelet, and keeping both
true while the node and kubelet change underneath.

- Start: build the resource plan from the node's inventory, serve each resource on
  ``<kubelet-dir>/nvidia-<name>.sock``, check the socket answers, register with ``kubelet.sock``.
- Health: every health change of the node is pushed at once to the affected ListAndWatch streams
  (the servers read health from the node; nothing here keeps a copy).
- Change without restart: an inventory change (MIG reconfiguration, hot-plug) re-plans; new resources
  get a server and a registration, vanished ones are stopped (kubelet withdraws them), the rest get the
  new device list on their stream.
- Kubelet restarts: the directory is watched with inotify (:mod:`deviceplugin.dirwatch`): every entry
  created, removed or moved wakes the manager at once, and every ``watched_poll_s`` (1 s) it looks anyway.
  Where inotify is unavailable the directory is polled every ``poll_s`` (~100 ms) instead, with one
  warning saying why. When ``kubelet.sock`` is recreated, or one of our sockets is gone, every plugin
  restarts and registers again; while a registration or a start is pending the manager looks every
  ``poll_s`` either way. A plugin that cannot serve (the whole directory removed, say) is retried every
  second, never fatal. Where a
  pod-resources check is given, every ``check_interval_s`` kubelet's allocatable devices are compared
  with ours and a resource kubelet lost is registered again.
- Stop: servers stop with a grace period and their sockets are removed.
- Resources ``served_elsewhere`` says another API serves (the DRA driver) are left out of the plan, so
  each device is served by exactly one.

The node arrives as a :class:`~deviceplugin.node.NodeState` (the agent's inventory store satisfies it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from deviceplugin.cdi import cdi_spec, write_spec
from deviceplugin.config import PluginConfig
from deviceplugin.dirwatch import DirWatch, DirWatchFactory, WatchUnavailableError, inotify_watch
from deviceplugin.imex import imex_cdi_spec
from deviceplugin.node import NodeChange, NodeState
from deviceplugin.preferred import Topology, topology_from_inventory
from deviceplugin.resources import Resource, ResourceError, ResourcePlan, build_plan
from deviceplugin.server import PluginError, PluginServer, PluginState, check_socket_path, register
from topology import logs
from topology.lifecycle import wait_for_event
from topology.model import LinkLevel, NodeInventory

KUBELET_SOCKET = "kubelet.sock"
START_RETRY_S = 1.0

AllocatableCheck = Callable[[], Awaitable[Mapping[str, frozenset[str]] | None]]
PcieLevels = Callable[[NodeInventory], Mapping[tuple[int, int], LinkLevel]]
"""PCIe common-ancestor level per GPU index pair (NVML), which the matrix hides for NVLinked pairs."""
"""Kubelet's allocatable device IDs by resource (pod-resources ``GetAllocatableResources``), or None
when that cannot be known right now."""


@dataclass(slots=True)
class _Plugin:
    server: PluginServer
    registered_with: tuple[int, int] | None = None  # identity of the kubelet.sock we registered with
    registered_at: float = 0.0  # clock of the last accepted registration
    next_try: float = 0.0
    backoff: float = 0.1


class PluginManager:
    """Component serving every resource of the node to kubelet."""

    def __init__(
        self,
        *,
        store: NodeState,
        config: PluginConfig,
        kubelet_dir: Path,
        poll_s: float = 0.1,
        watched_poll_s: float = 1.0,
        dir_watch: DirWatchFactory | None = inotify_watch,
        grace_s: float = 1.0,
        register_timeout_s: float = 1.0,
        allocatable_check: AllocatableCheck | None = None,
        pcie_levels: PcieLevels | None = None,
        check_interval_s: float = 30.0,
        served_elsewhere: Callable[[str], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._config = config
        self._dir = kubelet_dir
        self._kubelet = kubelet_dir / KUBELET_SOCKET
        self._poll = poll_s
        self._watched_poll = max(poll_s, watched_poll_s)
        self._dir_watch = dir_watch
        self._watch: DirWatch | None = None
        self._grace = grace_s
        self._register_timeout = register_timeout_s
        self._check = allocatable_check
        self._pcie_levels = pcie_levels
        self._check_interval = check_interval_s
        self._elsewhere = served_elsewhere
        self._clock = clock
        self._plugins: dict[str, _Plugin] = {}
        self._unstarted: dict[str, Resource] = {}  # servers that failed to start; retried every tick
        self._retry_at = 0.0
        self._plan: ResourcePlan | None = None
        self._topology: Topology | None = None
        self._kubelet_seen: tuple[int, int] | None = None
        self._inventory_dirty = False
        self._wake = asyncio.Event()
        self._next_check = 0.0
        self._log = logs.get_logger("deviceplugin.manager")
        self.restarts = 0
        self.registrations = 0
        self.kubelet_restarts_seen = 0
        self.started = asyncio.Event()  # set once every plugin serves its socket
        # set once the first pass after that has run: each served resource registered, or its registration
        # tried and failed, or kubelet.sock absent (what may wait for registration without delaying it)
        self.first_pass = asyncio.Event()

    # ----------------------------------------------------------------- public view

    def plan(self) -> ResourcePlan:
        """The plan now advertised (build it first when the manager has not started)."""
        if self._plan is None:
            self._plan = self._build_plan()
        return self._plan

    def _build_plan(self) -> ResourcePlan:
        """The resource plan less the resources served by another API (DRA): each device by one."""
        plan = build_plan(self._store.inventory, self._config)
        if self._elsewhere is None:
            return plan
        kept = tuple(r for r in plan.resources if not self._elsewhere(r.name))
        return ResourcePlan(resources=kept, warnings=plan.warnings, unmatched=plan.unmatched)

    def registered(self) -> dict[str, bool]:
        """Each served resource and whether kubelet has accepted its registration."""
        out = {name: p.registered_with is not None for name, p in self._plugins.items()}
        out.update(dict.fromkeys(self._unstarted, False))
        return dict(sorted(out.items()))

    def ready(self) -> bool:
        """Started, and every resource is served and registered (true with no resources at all)."""
        return self.started.is_set() and all(self.registered().values())

    def states(self) -> dict[str, PluginState]:
        return {name: p.server.state for name, p in self._plugins.items()}

    # ----------------------------------------------------------------- lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        plan = self._build_plan()  # a bad plan at start is fatal
        for resource in plan.resources:
            check_socket_path(self._dir / resource.socket_name)  # so is a directory path too long
        remove = self._store.add_listener(self._on_store)
        try:
            self._start_watch()
            await self._apply(plan)
            self._kubelet_seen = self._kubelet_identity()
            self.started.set()
            while not stop.is_set():
                await self._tick()
                self.first_pass.set()
                await self._sleep(stop)
        finally:
            remove()
            if self._watch is not None:
                self._watch.close()
                self._watch = None
            await self._stop_all()

    @property
    def watching(self) -> bool:
        """True while inotify wakes the manager; False while it polls every ``poll_s``."""
        return self._watch is not None

    def _start_watch(self) -> None:
        if self._dir_watch is None:
            return
        try:
            self._watch = self._dir_watch(self._dir, self._wake.set)
        except WatchUnavailableError as exc:
            self._fall_back(str(exc))

    def _fall_back(self, reason: str) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self._log.warning(
            "kubelet_dir_watch_unavailable",
            path=str(self._dir),
            reason=reason,
            poll_s=self._poll,
            hint=f"polling the folder every {self._poll:g} s instead; kubelet restarts are seen that late",
        )

    async def _tick(self) -> None:
        if self._inventory_dirty:
            self._inventory_dirty = False
            try:
                plan = self._build_plan()
            except ResourceError as exc:
                self._log.error(
                    "resource_plan_rejected", reason=str(exc), hint="keeping the resources advertised before"
                )
            else:
                await self._apply(plan)
        if self._unstarted and self._clock() >= self._retry_at:
            for resource in list(self._unstarted.values()):
                await self._start(resource)
        await self._watch_kubelet()
        await self._register_pending()
        await self._check_allocatable()
        if self._watch is not None:
            try:
                self._watch.ensure()  # the folder removed and made again (by us just now): watch the new one
            except WatchUnavailableError as exc:
                self._fall_back(str(exc))

    async def _sleep(self, stop: asyncio.Event) -> None:
        await wait_for_event(self._wake, stop, self._poll if self._busy() else self._watched_poll)
        self._wake.clear()

    def _busy(self) -> bool:
        """Poll every ``poll_s``: no inotify, or work that waits on a clock (a start or registration to
        retry, an inventory change to apply)."""
        if self._watch is None or self._unstarted or self._inventory_dirty:
            return True
        return self._kubelet_seen is not None and any(
            p.registered_with != self._kubelet_seen for p in self._plugins.values()
        )

    # ----------------------------------------------------------------- plan

    async def _apply(self, plan: ResourcePlan) -> None:
        for warning in plan.warnings:
            self._log.warning("resource_plan_warning", reason=warning)
        self._plan = plan
        self._topology = self._build_topology()
        wanted = plan.by_name()
        for name in sorted(set(self._unstarted) - set(wanted)):
            del self._unstarted[name]
        for name in sorted(set(self._plugins) - set(wanted)):
            plugin = self._plugins.pop(name)
            await plugin.server.stop(self._grace)
            self._log.info("resource_withdrawn", resource=name)
        for name, resource in sorted(wanted.items()):
            current = self._plugins.get(name)
            if current is None:
                if await self._start(resource):
                    self._log.info("resource_added", resource=name, devices=len(resource.devices))
            else:
                current.server.state.update(resource=resource, topology=self._topology)
        self._write_cdi()

    def _build_topology(self) -> Topology:
        inventory = self._store.inventory
        levels = None
        if self._pcie_levels is not None:
            try:
                levels = self._pcie_levels(inventory)
            except Exception as exc:  # the matrix alone still gives a topology-aware answer
                self._log.warning("pcie_levels_unavailable", error=str(exc))
        return topology_from_inventory(inventory, pcie_levels=levels)

    async def _start(self, resource: Resource) -> bool:
        """Serve one resource; a server that cannot start is logged and retried (not fatal)."""
        assert self._topology is not None
        state = PluginState(
            resource=resource, topology=self._topology, config=self._config, health=self._store
        )
        try:
            server = PluginServer(
                state=state, socket_path=self._dir / resource.socket_name, grace_s=self._grace
            )
            try:
                self._dir.mkdir(parents=True, exist_ok=True)  # a folder removed under us comes back
            except OSError as exc:
                raise PluginError(f"cannot create {self._dir}: {exc.strerror or exc}") from None
            await server.start()
        except PluginError as exc:
            self._unstarted[resource.name] = resource
            self._retry_at = self._clock() + START_RETRY_S
            self._log.error(
                "plugin_start_failed",
                resource=resource.name,
                reason=str(exc),
                retry_in_s=START_RETRY_S,
                hint="check the device-plugin directory is writable and the path short enough",
            )
            return False
        self._unstarted.pop(resource.name, None)
        self._plugins[resource.name] = _Plugin(server=server)
        return True

    async def _restart_all(self, why: str) -> None:
        self.restarts += 1
        self._log.info("plugins_restarting", reason=why, resources=sorted(self._plugins))
        resources = [p.server.state.resource for p in self._plugins.values()]
        resources += list(self._unstarted.values())
        for plugin in self._plugins.values():
            await plugin.server.stop(0)
        self._plugins.clear()
        for resource in resources:
            await self._start(resource)

    async def _stop_all(self) -> None:
        plugins, self._plugins = self._plugins, {}
        await asyncio.gather(*(p.server.stop(self._grace) for p in plugins.values()), return_exceptions=True)

    def _write_cdi(self) -> None:
        if not self._config.cdi.enabled or self._plan is None:
            return
        devices = [d for r in self._plan.resources for d in r.devices]
        try:
            path = write_spec(Path(self._config.cdi.spec_dir), cdi_spec(devices, kind=self._config.cdi.kind))
            if self._config.imex_channels:
                spec = imex_cdi_spec(self._config.imex_channels, gpu_kind=self._config.cdi.kind)
                write_spec(Path(self._config.cdi.spec_dir), spec)
        except OSError as exc:
            self._log.error("cdi_spec_write_failed", error=str(exc), hint="check cdi.specDir is writable")
        else:
            self._log.info("cdi_spec_written", path=str(path))

    # ----------------------------------------------------------------- health

    def _on_store(self, update: NodeChange) -> None:
        if update.health_changed:
            for plugin in self._plugins.values():
                plugin.server.state.refresh()
        if update.inventory_changed:
            self._inventory_dirty = True
            self._wake.set()

    # ----------------------------------------------------------------- kubelet

    def _kubelet_identity(self) -> tuple[int, int] | None:
        try:
            st = self._kubelet.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    async def _watch_kubelet(self) -> None:
        identity = self._kubelet_identity()
        if identity != self._kubelet_seen:
            previous, self._kubelet_seen = self._kubelet_seen, identity
            for plugin in self._plugins.values():  # a new kubelet.sock: register at once, not after back-off
                plugin.next_try, plugin.backoff = 0.0, 0.1
            if identity is not None and previous is not None:
                self.kubelet_restarts_seen += 1
                await self._restart_all("kubelet.sock was recreated (kubelet restarted)")
                return
            if identity is None:
                self._log.warning("kubelet_socket_gone", path=str(self._kubelet))
        missing = [name for name, p in self._plugins.items() if not p.server.socket_present()]
        if missing:
            await self._restart_all(f"plugin socket(s) removed: {', '.join(sorted(missing))}")

    async def _register_pending(self) -> None:
        identity = self._kubelet_seen
        now = self._clock()
        pending = [
            (name, p)
            for name, p in sorted(self._plugins.items())
            if p.registered_with != identity and p.next_try <= now
        ]
        if identity is None:
            for _, p in pending:
                p.registered_with = None
            return
        if not pending:
            return
        results = await asyncio.gather(
            *(
                register(
                    self._kubelet,
                    endpoint=p.server.socket_path.name,
                    resource_name=name,
                    timeout_s=self._register_timeout,
                )
                for name, p in pending
            ),
            return_exceptions=True,
        )
        for (name, p), result in zip(pending, results, strict=True):
            if isinstance(result, PluginError):
                p.registered_with = None
                p.next_try = self._clock() + p.backoff
                self._log.warning(
                    "registration_failed", resource=name, reason=str(result), retry_in_s=p.backoff
                )
                p.backoff = min(p.backoff * 2, 5.0)
            elif isinstance(result, BaseException):
                raise result
            else:
                p.registered_with = identity
                p.registered_at = self._clock()
                p.backoff = 0.1
                self.registrations += 1
                self._log.info("registered", resource=name, endpoint=p.server.socket_path.name)

    async def _check_allocatable(self) -> None:
        if self._check is None or self._clock() < self._next_check:
            return
        self._next_check = self._clock() + self._check_interval
        try:
            listed = await self._check()
        except Exception as exc:  # an unreadable pod-resources socket only skips this check
            self._log.warning("allocatable_check_failed", error=str(exc))
            return
        if listed is None:
            return
        now = self._clock()
        for name, plugin in self._plugins.items():
            state = plugin.server.state
            unhealthy = state.unhealthy
            healthy = {d.id for d in state.resource.devices if d.id not in unhealthy}
            # A registration younger than one check interval is left alone: kubelet lists a resource's
            # devices only after its ListAndWatch stream delivered them, and kubelet 1.37 refuses a second
            # registration of a socket it is connected to ("device plugin already connected"), forever.
            settled = now - plugin.registered_at >= self._check_interval
            if (
                plugin.registered_with is not None
                and settled
                and healthy
                and not healthy & listed.get(name, frozenset())
            ):
                self._log.warning(
                    "kubelet_lost_resource",
                    resource=name,
                    hint="kubelet lists none of our healthy devices; registering again",
                )
                plugin.registered_with = None
                plugin.next_try = 0.0
