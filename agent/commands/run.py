"""``gpu-node-agent run``: the node agent — device plugins, health, rediscovery (+ metrics, publishing).

The composition root: builds NVML (real or simulated), discovers the node, and starts the components
in one TaskGroup (:func:`agent.runtime.run_components`). SIGTERM/SIGINT set the stop event; components
then stop in their own order (servers with a grace period, sockets removed), and NVML is shut down last.

Other components plug in as factories: a function taking the :class:`RunContext` and returning a
component (or ``None`` when it does not apply, e.g. publishing with ``--no-kube``). :func:`serve` runs
:func:`default_factories` (metrics exporter, publisher) unless given its own list (the demo adds one). They
are built once the plugin manager has made its first registration pass (:class:`LateComponents`): kubelet
sees the devices before the metrics and Kubernetes client modules are loaded.

Exit codes: 0 after a clean stop, 1 when the agent cannot start (no NVML, an invalid resource plan),
2 for invalid settings (one line per problem) and for a missing IMEX channel with ``imex.required``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.config import RunSettings, add_arguments, load_settings
from agent.discovery import DiscoveryIncompleteError, discover
from agent.fabricwatch import FabricWatch
from agent.health import HealthMonitor
from agent.host import read_host
from agent.imex import NoImexDaemon
from agent.imexctl import ImexCtlReader, ImexMonitor, ImexReader
from agent.nvml.errors import NVMLError
from agent.nvml.protocol import NvmlBackend
from agent.runtime import Component, InventoryStore, Rediscovery, run_components
from deviceplugin.config import ConfigError, PluginConfig
from deviceplugin.imex import ImexChannelError, find_channels
from deviceplugin.manager import AllocatableCheck, PluginManager
from deviceplugin.resources import ResourceError, build_plan
from topology import logs
from topology.lifecycle import wait_for_event
from topology.model import LinkLevel, NodeInventory


class StartupError(RuntimeError):
    """The agent cannot start; the message is one line for the operator, ``exit_code`` the command's."""

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(slots=True)
class RunContext:
    """What components are built from."""

    settings: RunSettings
    nvml: NvmlBackend
    store: InventoryStore
    stop: asyncio.Event
    manager: PluginManager
    rediscovery: Rediscovery
    extras: dict[str, object] = field(default_factory=dict)
    readiness: list[tuple[str, ReadinessCheck]] = field(default_factory=list)  # besides the exporter's


ComponentFactory = Callable[[RunContext], Component | None]
ReadinessCheck = Callable[[], str | None]
"""Why the agent is not ready (a line for ``/readyz``), or ``None``."""


def _metrics_exporter(ctx: RunContext) -> Component | None:
    """``/metrics``, ``/healthz``, ``/readyz`` on ``--metrics-addr``, and ``/healthz``, ``/readyz`` alone on
    ``--health-addr`` (kubelet's probes; own connection slots); ``''`` turns either off, and with both off
    the metrics modules (prometheus_client, HTTP server) are never loaded."""
    if not ctx.settings.metrics_addr and not ctx.settings.health_addr:
        return None
    from agent.metrics.wiring import listeners_for_run  # noqa: PLC0415 - loads prometheus_client only here

    return listeners_for_run(ctx)


def _publisher(ctx: RunContext) -> Component | None:
    """GPUNode and node labels in the Kubernetes API (``--no-kube`` turns it off, and the Kubernetes client
    is then never loaded)."""
    if ctx.settings.no_kube:
        return None
    from agent.publisher import publisher_for_run  # noqa: PLC0415 - loads the Kubernetes client only here

    return publisher_for_run(ctx)


def default_factories() -> tuple[ComponentFactory, ...]:
    """The further components of every ``run``: metrics exporter, publisher (each may opt out)."""
    return (_metrics_exporter, _publisher)


@dataclass(slots=True)
class Node:
    """The hardware side: NVML, how to discover, and a fault follower when simulating."""

    nvml: NvmlBackend
    discover: Callable[[], NodeInventory]
    faults: Component | None = None
    hotplug: object | None = None  # an agent.udev HotplugSource, where one applies
    cleanup: Callable[[], None] = lambda: None
    dev_root: Path = Path("/dev")  # where the IMEX channel device nodes are
    proc_devices: Path = Path("/proc/devices")
    simulated: bool = False
    imex: ImexReader = field(default_factory=ImexCtlReader)  # the node's IMEX daemon


def build_node(settings: RunSettings) -> Node:
    """NVML and discovery for the settings; raises :class:`StartupError` with one line. Discovery is
    strict: it raises ``DiscoveryIncompleteError`` when NVML does not answer, so no device is withdrawn on an
    error."""
    if settings.simulate is not None:
        from agent.simnode import open_simulated_node  # noqa: PLC0415 - simulator path only
        from agent.udev import simulated_source  # noqa: PLC0415

        try:
            sim = open_simulated_node(
                settings.simulate,
                faults_path=settings.simulate_faults,
                sysfs_root=settings.sysfs_root,
                hostname=settings.node_name,
            )
        except ValueError as exc:
            raise StartupError(str(exc)) from None
        sim.nvml.init()
        return Node(
            nvml=sim.nvml,
            discover=lambda: sim.discover(strict=True),
            faults=sim.faults,
            hotplug=simulated_source(sim.nvml),
            cleanup=sim.close,
            dev_root=settings.dev_root or sim.dev_root or Path("/dev"),
            proc_devices=sim.proc_devices or settings.proc_root / "devices",
            simulated=True,
            imex=sim.imex if sim.imex is not None else NoImexDaemon(),
        )
    from agent.nvml.real import RealNvml  # noqa: PLC0415

    real = RealNvml()
    try:
        real.init()
    except NVMLError as exc:
        raise StartupError(
            f"cannot initialise NVML ({exc}); is the NVIDIA driver installed? "
            "'--simulate PROFILE' runs without a GPU"
        ) from None
    except Exception as exc:  # the library itself missing
        raise StartupError(f"cannot load NVML ({exc}); '--simulate PROFILE' runs without a GPU") from None
    sysfs_root = settings.sysfs_root or Path("/sys")
    real_host = read_host(sysfs_root=sysfs_root, hostname=settings.node_name)
    from agent.imexctl import DEFAULT_NODES_CONFIG  # noqa: PLC0415

    imex_reader = ImexCtlReader(
        ctl=settings.imex.ctl, nodes_config=settings.imex.nodes_config or DEFAULT_NODES_CONFIG
    )
    return Node(
        nvml=real,
        discover=lambda: discover(nvml=real, sysfs_root=sysfs_root, host=real_host, strict=True),
        dev_root=settings.dev_root or Path("/dev"),
        proc_devices=settings.proc_root / "devices",
        imex=imex_reader,
    )


def _imex_manager(settings: RunSettings, node: Node, store: InventoryStore) -> tuple[Component, ImexReader]:
    from agent.imexmanage import manager_for_run  # noqa: PLC0415 - loads the Kubernetes client only here
    from topology.nvlink import member_clique  # noqa: PLC0415

    if settings.no_kube:
        raise StartupError(
            "imex.manage needs the Kubernetes API (the clique's GPUNodes); drop --no-kube", exit_code=2
        )
    try:
        return manager_for_run(
            config=settings.imex,
            node_name=settings.node_name,
            kubeconfig=settings.kubeconfig,
            reader=node.imex,
            simulated_root=node.dev_root.parent if node.simulated else None,
            clique=lambda: member_clique(store.inventory),
            pod_resources_socket=settings.pod_resources_socket,
        )
    except RuntimeError as exc:
        raise StartupError(str(exc), exit_code=2) from None


def imex_plugin_config(settings: RunSettings, node: Node) -> PluginConfig:
    """The plugin config with the IMEX channels this node has (``imex.channelIDs``), checked once at
    start: a missing channel is a :class:`StartupError` (exit 2) with ``imex.required``, else one warning
    and no channel in any container."""
    plugin = settings.plugin
    ids = plugin.imex.channel_ids
    if not ids:
        return plugin
    try:
        channels = find_channels(
            ids, dev_root=node.dev_root, proc_devices=node.proc_devices, allow_stand_in=node.simulated
        )
    except ImexChannelError as exc:
        if plugin.imex.required:
            raise StartupError(f"imex.required: {exc}", exit_code=2) from None
        logs.get_logger("agent.run").bind(node=settings.node_name).warning(
            "imex_channel_missing",
            error=str(exc),
            hint="containers get no IMEX channel (multi-node NVLink falls back); set imex.required to refuse",
        )
        return plugin
    return dataclasses.replace(plugin, imex_channels=channels)


class LateComponents:
    """Component: builds the further components (metrics, publishing; :func:`default_factories`) once
    every event of ``after`` is set (the plugin manager's first registration pass, ...), and runs them;
    so loading their modules (prometheus_client, the Kubernetes client) never delays kubelet's
    registration."""

    def __init__(
        self, *, factories: Sequence[ComponentFactory], ctx: RunContext, after: Sequence[asyncio.Event]
    ) -> None:
        self._factories = factories
        self._ctx = ctx
        self._after = after

    async def run(self, stop: asyncio.Event) -> None:
        for event in self._after:
            if await wait_for_event(event, stop, None):
                return
        extras = [c for c in (factory(self._ctx) for factory in self._factories) if c is not None]
        if extras:
            await run_components(extras, stop)
        else:
            await stop.wait()


class HotplugTrigger:
    """Component: every hot-plug event asks for a rediscovery."""

    def __init__(self, *, source: object, rediscovery: Rediscovery) -> None:
        self._source = source
        self._rediscovery = rediscovery

    async def run(self, stop: asyncio.Event) -> None:
        events = getattr(self._source, "events", None)
        close = getattr(self._source, "close", None)
        if events is None:
            await stop.wait()
            return

        async def follow() -> None:
            async for event in events():
                self._rediscovery.request(f"hotplug {getattr(event, 'action', '?')}")

        task = asyncio.create_task(follow())
        try:
            await stop.wait()
        finally:
            if callable(close):
                close()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def serve(
    settings: RunSettings,
    *,
    node: Node | None = None,
    stop: asyncio.Event | None = None,
    factories: Sequence[ComponentFactory] | None = None,
) -> int:
    """Run until ``stop`` (or a signal); the body of ``main`` and of tests that run the whole agent.
    ``factories`` builds the further components (default: :func:`default_factories`)."""
    log = logs.get_logger("agent.run").bind(node=settings.node_name)
    node = node if node is not None else await asyncio.to_thread(build_node, settings)
    stop = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    try:
        started = time.perf_counter()
        first_failure: DiscoveryIncompleteError | None = None
        try:
            inventory = await asyncio.to_thread(node.discover)
        except DiscoveryIncompleteError as exc:  # start with what answered; not ready until NVML answers
            inventory, first_failure = exc.inventory, exc
        discovery_s = time.perf_counter() - started
        plugin_config = await asyncio.to_thread(imex_plugin_config, settings, node)  # stats device nodes
        try:
            plan = build_plan(inventory, plugin_config)
        except ResourceError as exc:
            raise StartupError(f"cannot advertise this node's devices: {exc}") from None
        if plan.unmatched:
            where = f"{settings.config_file}: " if settings.config_file is not None else ""
            raise StartupError(f"{where}{'; '.join(plan.unmatched)}")
        store = InventoryStore(inventory)

        def rediscovery_failed(exc: Exception) -> None:
            log.error(
                "rediscovery_failed",
                error=str(exc),
                hint="keeping the last inventory (no device is withdrawn) and retrying; not ready until "
                "NVML answers again",
            )

        rediscovery = Rediscovery(
            store=store,
            discover=node.discover,
            interval_s=settings.rediscover_interval_s,
            on_error=rediscovery_failed,
        )
        if first_failure is not None:
            rediscovery.failed(first_failure)
        health = HealthMonitor(
            nvml=node.nvml, store=store, config=settings.health, on_mig_change=rediscovery.request
        )
        manager = PluginManager(
            store=store,
            config=plugin_config,
            kubelet_dir=settings.kubelet_dir,
            grace_s=min(settings.shutdown_grace_s, 2.0),
            allocatable_check=_allocatable_check(settings.pod_resources_socket),
            check_interval_s=settings.registration_check_s,
            pcie_levels=_pcie_levels(node.nvml),
            served_elsewhere=settings.dra.serves if settings.dra.enabled else None,
        )
        imex_reader, imex_manager = node.imex, None
        if settings.imex.manage:  # host-managed IMEX: the peer list follows the clique (agent.imexmanage)
            imex_manager, imex_reader = _imex_manager(settings, node, store)
        imex = ImexMonitor(reader=imex_reader, interval_s=settings.health.probe_interval_s)
        ctx = RunContext(
            settings=settings,
            nvml=node.nvml,
            store=store,
            stop=stop,
            manager=manager,
            rediscovery=rediscovery,
            extras={"discovery_duration_s": discovery_s, "imex": imex},
            readiness=[("discovery", rediscovery.problem)],
        )
        fabric = FabricWatch(nvml=node.nvml, store=store, interval_s=settings.health.probe_interval_s)
        components: list[Component] = [health, rediscovery, manager, fabric, imex]
        if imex_manager is not None:
            components.append(imex_manager)
        if settings.dra.enabled:  # the DRA kubelet plugin, beside the device plugin (agent.dra)
            from agent.dra import DraUnavailableError, dra_driver_for_run  # noqa: PLC0415

            try:
                dra = dra_driver_for_run(
                    settings,
                    store,
                    grace_s=min(settings.shutdown_grace_s, 2.0),
                    dev_root=node.dev_root,
                    proc_devices=node.proc_devices,
                    simulated=node.simulated,
                )
            except DraUnavailableError as exc:
                raise StartupError(str(exc)) from None
            components.append(dra)
            ctx.readiness.append(("dra", dra.problem))
        if node.faults is not None:
            components.append(node.faults)
        if node.hotplug is not None:
            components.append(HotplugTrigger(source=node.hotplug, rediscovery=rediscovery))
        components.append(
            LateComponents(
                factories=default_factories() if factories is None else factories,
                ctx=ctx,
                # registration first; and the IMEX daemon read once (it runs nvidia-imex-ctl), so that the
                # first publication already says whether the node has a daemon
                after=(manager.first_pass, imex.read_once),
            )
        )
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
                installed.append(sig)
        log.info(
            "agent_started",
            gpus=len(inventory.gpus),
            resources=[r.name for r in manager.plan().resources],
            kubelet_dir=str(settings.kubelet_dir),
            kube=not settings.no_kube,
        )
        await run_components(components, stop)
        log.info("agent_stopped")
        return 0
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        with contextlib.suppress(NVMLError):
            node.nvml.shutdown()
        node.cleanup()


def _pcie_levels(nvml: NvmlBackend) -> Callable[[NodeInventory], Mapping[tuple[int, int], LinkLevel]]:
    """NVML's PCIe level for every pair of live GPUs (the preferred-allocation tie-breaker)."""

    def levels(inventory: NodeInventory) -> Mapping[tuple[int, int], LinkLevel]:
        live = sorted(g.index for g in inventory.gpus if not g.lost)
        out: dict[tuple[int, int], LinkLevel] = {}
        for pos, a in enumerate(live):
            for b in live[pos + 1 :]:
                level = nvml.pcie_level(a, b)
                if level is not None:
                    out[(a, b)] = level
        return out

    return levels


def _allocatable_check(socket_path: Path) -> AllocatableCheck:
    """The pod-resources check for the plugin manager: what kubelet lists as allocatable, by resource
    (``None`` while the pod-resources socket is absent or kubelet cannot answer)."""

    async def check() -> Mapping[str, frozenset[str]] | None:
        if not socket_path.exists():
            return None
        # the pod-resources stubs load at the first check, after registration (the manager's first pass)
        from agent.podresources.client import PodResourcesClient  # noqa: PLC0415

        client = PodResourcesClient(str(socket_path), timeout_s=2.0)
        try:
            rows = await client.allocatable()
        finally:
            await client.close()
        if rows is None:
            return None
        out: dict[str, set[str]] = {}
        for row in rows:
            out.setdefault(row.resource, set()).add(row.device_id)
        return {k: frozenset(v) for k, v in out.items()}

    return check


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpu-node-agent run", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args, os.environ)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"gpu-node-agent run: {problem}", file=sys.stderr)
        return 2
    logs.configure(settings.log_format, settings.log_level)
    try:
        return asyncio.run(serve(settings))
    except StartupError as exc:
        print(f"gpu-node-agent run: {exc}", file=sys.stderr)
        return exc.exit_code
    except ExceptionGroup as group:
        for failure in group.exceptions:
            print(f"gpu-node-agent run: stopped on error: {failure}", file=sys.stderr)
        return 1
