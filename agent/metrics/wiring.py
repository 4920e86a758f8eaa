"""Builds the node's HTTP listeners from the ``run`` command's context (its settings, NVML, inventory store
and plugin manager), so ``run`` needs one factory line: the metrics exporter on ``--metrics-addr``
(``/metrics``, and ``/healthz``, ``/readyz`` for compatibility) and the health listener on
``--health-addr`` (``/healthz``, ``/readyz`` only, for kubelet's probes: it has its own connection slots,
so clients of the metrics port cannot starve the liveness probe). Both answer ``/readyz`` from the same
checks (:func:`readiness_for_run`, plus NVML's from the metrics cache while the exporter runs).

Inputs taken from the context: the inventory (``store.inventory``, so MIG reconfiguration and hot-plug
show up at the next refresh), device health (``store.health_of``), XID counts (``store.xid_counts``),
registration state for ``/readyz`` and the self-metrics (``manager.registered()``,
``manager.registrations``, ``manager.kubelet_restarts_seen``) and the initial discovery time
(``extras["discovery_duration_s"]``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from agent.imex import ImexStatus
from agent.metrics.cache import CountsXids
from agent.metrics.exporter import MetricsExporter, MetricsSettings, parse_addr
from agent.metrics.server import HealthServer, ReadinessCheck
from agent.metrics.snapshot import AgentStats
from agent.nvml.protocol import NvmlBackend
from topology.model import NodeInventory


class _Settings(Protocol):
    """The fields of ``agent.config.RunSettings`` the exporter reads."""

    @property
    def node_name(self) -> str: ...

    @property
    def pod_resources_socket(self) -> Path: ...

    @property
    def metrics_addr(self) -> str: ...

    @property
    def health_addr(self) -> str: ...

    @property
    def metrics_format(self) -> str: ...

    @property
    def metrics_interval_s(self) -> float: ...

    @property
    def pod_resources_interval_s(self) -> float: ...

    @property
    def proc_root(self) -> Path: ...

    @property
    def pod_logs_root(self) -> Path: ...


class _Health(Protocol):
    @property
    def healthy(self) -> bool: ...


class _Store(Protocol):
    @property
    def inventory(self) -> NodeInventory: ...

    def health_of(self, uuid: str) -> _Health: ...

    def xid_counts(self) -> Mapping[tuple[str, int], int]: ...


class _Manager(Protocol):
    @property
    def registrations(self) -> int: ...

    @property
    def kubelet_restarts_seen(self) -> int: ...

    def registered(self) -> dict[str, bool]: ...


class RunContextLike(Protocol):
    @property
    def settings(self) -> _Settings: ...

    @property
    def nvml(self) -> NvmlBackend: ...

    @property
    def store(self) -> _Store: ...

    @property
    def manager(self) -> _Manager: ...

    @property
    def extras(self) -> dict[str, object]: ...

    @property
    def readiness(self) -> Sequence[tuple[str, ReadinessCheck]]: ...


def metrics_settings(settings: _Settings) -> MetricsSettings | None:
    """The exporter's settings from ``run``'s; ``None`` when ``--metrics-addr ''`` turns it off."""
    if not settings.metrics_addr:
        return None
    host, port = parse_addr(settings.metrics_addr)
    return MetricsSettings(
        host=host,
        port=port,
        format=settings.metrics_format,
        interval_s=settings.metrics_interval_s,
        pod_resources_socket=str(settings.pod_resources_socket),
        pod_resources_interval_s=settings.pod_resources_interval_s,
        proc_root=str(settings.proc_root),
        pod_logs_root=str(settings.pod_logs_root),
    )


def readiness_for_run(ctx: RunContextLike) -> tuple[tuple[str, ReadinessCheck], ...]:
    """The ``/readyz`` checks of both listeners that do not need the metrics cache: plugin registration
    and the run's own (``ctx.readiness``, e.g. discovery)."""
    manager = ctx.manager

    def plugins_registered() -> str | None:
        missing = [name for name, ok in sorted(manager.registered().items()) if not ok]
        return f"not registered with kubelet: {', '.join(missing)}" if missing else None

    return (("plugins", plugins_registered), *ctx.readiness)


def exporter_for_run(
    ctx: RunContextLike, readiness: tuple[tuple[str, ReadinessCheck], ...] | None = None
) -> MetricsExporter | None:
    settings = metrics_settings(ctx.settings)
    if settings is None:
        return None
    store, manager = ctx.store, ctx.manager
    duration = ctx.extras.get("discovery_duration_s")

    imex = ctx.extras.get("imex")

    def agent_stats() -> AgentStats:
        imex_status = getattr(imex, "status", None)
        return AgentStats(
            imex_daemon_status=imex_status.status.value if isinstance(imex_status, ImexStatus) else None,
            discovery_duration_seconds=float(duration) if isinstance(duration, int | float) else None,
            registrations=manager.registrations,
            registered=tuple(sorted(manager.registered().items())),
            kubelet_restarts=manager.kubelet_restarts_seen,
        )

    return MetricsExporter(
        settings=settings,
        backend=ctx.nvml,
        inventory=lambda: store.inventory,
        hostname=ctx.settings.node_name,
        readiness=readiness_for_run(ctx) if readiness is None else readiness,
        agent_stats=agent_stats,
        device_health=lambda uuid: store.health_of(uuid).healthy,
        xids=CountsXids(store.xid_counts),
    )


def health_addr(settings: _Settings) -> tuple[str, int] | None:
    """``--health-addr`` as ``(host, port)``; ``None`` when ``''`` turns the health listener off."""
    if not settings.health_addr:
        return None
    try:
        return parse_addr(settings.health_addr)
    except ValueError:
        raise ValueError(f"--health-addr: expected HOST:PORT, got {settings.health_addr!r}") from None


class Listeners:
    """Component: the health listener (bound first, so its address problem stops the start) and the
    metrics exporter, either of which may be off."""

    def __init__(self, *, exporter: MetricsExporter | None, health: HealthServer | None) -> None:
        self.exporter = exporter
        self.health = health

    async def run(self, stop: asyncio.Event) -> None:
        if self.health is not None:
            await self.health.start()
        try:
            if self.exporter is not None:
                await self.exporter.run(stop)
            else:
                await stop.wait()
        finally:
            if self.health is not None:
                await self.health.stop()


def listeners_for_run(ctx: RunContextLike) -> Listeners | None:
    """Both listeners from ``run``'s settings; ``None`` when both addresses are ``''``."""
    readiness = readiness_for_run(ctx)
    exporter = exporter_for_run(ctx, readiness)
    addr = health_addr(ctx.settings)
    health = None
    if addr is not None:
        nvml = (("nvml", exporter.cache.nvml_problem),) if exporter is not None else ()
        health = HealthServer(host=addr[0], port=addr[1], readiness=(*nvml, *readiness))
    if exporter is None and health is None:
        return None
    return Listeners(exporter=exporter, health=health)
