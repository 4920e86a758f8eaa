"""Builds the metrics exporter from the ``run`` command's context (its settings, NVML, inventory store
and plugin manager), so ``run`` needs one factory line.

Inputs taken from the context: the inventory (``store.inventory``, so MIG reconfiguration and hot-plug
show up at the next refresh), device health (``store.health_of``), XID counts (``store.xid_counts``),
registration state for ``/readyz`` and the self-metrics (``manager.registered()``,
``manager.registrations``, ``manager.kubelet_restarts_seen``) and the initial discovery time
(``extras["discovery_duration_s"]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from agent.metrics.cache import CountsXids
from agent.metrics.exporter import MetricsExporter, MetricsSettings, parse_addr
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


def exporter_for_run(ctx: RunContextLike) -> MetricsExporter | None:
    settings = metrics_settings(ctx.settings)
    if settings is None:
        return None
    store, manager = ctx.store, ctx.manager
    duration = ctx.extras.get("discovery_duration_s")

    def agent_stats() -> AgentStats:
        return AgentStats(
            discovery_duration_seconds=float(duration) if isinstance(duration, int | float) else None,
            registrations=manager.registrations,
            registered=tuple(sorted(manager.registered().items())),
            kubelet_restarts=manager.kubelet_restarts_seen,
        )

    def plugins_registered() -> str | None:
        missing = [name for name, ok in sorted(manager.registered().items()) if not ok]
        return f"not registered with kubelet: {', '.join(missing)}" if missing else None

    return MetricsExporter(
        settings=settings,
        backend=ctx.nvml,
        inventory=lambda: store.inventory,
        hostname=ctx.settings.node_name,
        readiness=(("plugins", plugins_registered),),
        agent_stats=agent_stats,
        device_health=lambda uuid: store.health_of(uuid).healthy,
        xids=CountsXids(store.xid_counts),
    )
