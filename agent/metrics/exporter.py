"""The metrics component the ``run`` command starts: cache refresher, pod-resources cache, HTTP server.

Settings (flags of ``run``, see :func:`add_arguments`):

- ``--metrics-addr HOST:PORT`` (default ``0.0.0.0:9400``, dcgm-exporter's port, so existing scrape
  configs and ServiceMonitors keep working; an empty value turns the exporter off);
- ``--metrics-format native|dcgm`` (default ``native``);
- ``--metrics-interval SECONDS`` (default 10): NVML refresh period of the cache;
- ``--pod-resources-socket PATH`` (default ``/var/lib/kubelet/pod-resources/kubelet.sock``; empty turns
  pod attribution off) and ``--pod-resources-interval SECONDS`` (default 10);
- ``--proc-root`` (default ``/proc``) and ``--pod-logs-root`` (default ``/var/log/pods``) for mapping
  processes of shared GPUs to pods (needs ``hostPID: true`` to see other pods' processes).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata

from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from agent.metrics.cache import MetricsCache, XidCounter
from agent.metrics.dcgm import render_dcgm
from agent.metrics.native import SnapshotCollector, render_native
from agent.metrics.procmap import ProcessPodMapper
from agent.metrics.server import MetricsServer, ReadinessCheck
from agent.metrics.snapshot import AgentStats
from agent.nvml.protocol import NvmlBackend
from agent.podresources.cache import PodResourcesCache
from agent.podresources.client import PodResourcesClient
from agent.podresources.model import DEFAULT_SOCKET
from topology.model import NodeInventory

FORMATS = ("native", "dcgm")


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    host: str = "0.0.0.0"
    port: int = 9400
    format: str = "native"
    interval_s: float = 10.0
    pod_resources_socket: str | None = DEFAULT_SOCKET
    pod_resources_interval_s: float = 10.0
    proc_root: str = "/proc"
    pod_logs_root: str = "/var/log/pods"

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"--metrics-format: {self.format!r} is not one of {', '.join(FORMATS)}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--metrics-addr: port {self.port} is outside 0..65535")
        if self.interval_s <= 0:
            raise ValueError(f"--metrics-interval: must be > 0 seconds, got {self.interval_s}")
        if self.pod_resources_interval_s <= 0:
            raise ValueError(
                f"--pod-resources-interval: must be > 0 seconds, got {self.pod_resources_interval_s}"
            )


def parse_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) to ``(host, port)``; ``ValueError`` names the flag."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--metrics-addr: expected HOST:PORT, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = MetricsSettings()
    g = parser.add_argument_group("metrics")
    g.add_argument(
        "--metrics-addr",
        default=f"{d.host}:{d.port}",
        help="HOST:PORT for /metrics, /healthz, /readyz ('' disables; default %(default)s)",
    )
    g.add_argument(
        "--metrics-format",
        choices=FORMATS,
        default=d.format,
        help="metric names: native gpuagent_* or dcgm-exporter's (default %(default)s)",
    )
    g.add_argument(
        "--metrics-interval",
        type=float,
        default=d.interval_s,
        help="seconds between NVML refreshes of the metrics cache (default %(default)s)",
    )
    g.add_argument(
        "--pod-resources-socket",
        default=d.pod_resources_socket,
        help="kubelet pod-resources socket for pod labels ('' disables; default %(default)s)",
    )
    g.add_argument(
        "--pod-resources-interval",
        type=float,
        default=d.pod_resources_interval_s,
        help="seconds between pod-resources refreshes (default %(default)s)",
    )
    g.add_argument("--proc-root", default=d.proc_root, help="host /proc for per-process attribution")
    g.add_argument("--pod-logs-root", default=d.pod_logs_root, help="kubelet pod log directory root")


def settings_from_args(ns: argparse.Namespace) -> MetricsSettings | None:
    """The settings from parsed flags; ``None`` when ``--metrics-addr ''`` turns the exporter off."""
    if not ns.metrics_addr:
        return None
    host, port = parse_addr(ns.metrics_addr)
    return MetricsSettings(
        host=host,
        port=port,
        format=ns.metrics_format,
        interval_s=ns.metrics_interval,
        pod_resources_socket=ns.pod_resources_socket or None,
        pod_resources_interval_s=ns.pod_resources_interval,
        proc_root=ns.proc_root,
        pod_logs_root=ns.pod_logs_root,
    )


def agent_version() -> str:
    try:
        return metadata.version("gpu-node-agent")
    except metadata.PackageNotFoundError:
        return "unknown"


class MetricsExporter:
    """The component: ``await exporter.run(stop)`` serves until ``stop`` is set.

    ``readiness`` adds checks to ``/readyz`` besides NVML's (e.g. "every plugin registered");
    ``agent_stats`` supplies discovery duration, registrations and kubelet restarts; ``device_health``
    maps device UUIDs to healthy/unhealthy; XID events go to ``exporter.xids.record``.
    """

    def __init__(
        self,
        *,
        settings: MetricsSettings,
        backend: NvmlBackend,
        inventory: Callable[[], NodeInventory],
        hostname: str,
        readiness: Sequence[tuple[str, ReadinessCheck]] = (),
        agent_stats: Callable[[], AgentStats] = AgentStats,
        device_health: Callable[[], Mapping[str, bool]] | None = None,
        xids: XidCounter | None = None,
        version: str | None = None,
    ) -> None:
        self.settings = settings
        self.podresources: PodResourcesCache | None = None
        if settings.pod_resources_socket:
            self.podresources = PodResourcesCache(
                client=PodResourcesClient(settings.pod_resources_socket),
                interval_s=settings.pod_resources_interval_s,
            )
        pr = self.podresources
        self.cache = MetricsCache(
            backend=backend,
            inventory=inventory,
            hostname=hostname,
            interval_s=settings.interval_s,
            podresources=(lambda: (pr.snapshot(), pr.stats())) if pr is not None else None,
            device_health=device_health,
            xids=xids,
            pid_mapper=ProcessPodMapper(proc_root=settings.proc_root, pod_logs_root=settings.pod_logs_root),
        )
        self.xids = self.cache.xids
        self.registry = CollectorRegistry(auto_describe=False)
        self.server = MetricsServer(
            host=settings.host,
            port=settings.port,
            render=lambda: generate_latest(self.registry),
            readiness=(("nvml", self.cache.nvml_problem), *readiness),
        )
        self.registry.register(
            SnapshotCollector(
                render=render_dcgm if settings.format == "dcgm" else render_native,
                snapshot=self.cache.snapshot,
                agent_stats=agent_stats,
                scrape_stats=self.server.scrape_stats,
                version=version or agent_version(),
            )
        )
        self.serving = asyncio.Event()  # set once the first refresh is in the cache and the port is bound

    async def run(self, stop: asyncio.Event) -> None:
        await self.server.start()
        try:
            if self.podresources is not None:
                await self.podresources.refresh()
            await self.cache.refresh()
            self.serving.set()
            async with asyncio.TaskGroup() as tasks:
                if self.podresources is not None:
                    tasks.create_task(self.podresources.run(stop))
                tasks.create_task(self._refresh_loop(stop))
        finally:
            await self.server.stop()

    async def _refresh_loop(self, stop: asyncio.Event) -> None:
        # the first refresh already ran in run(); wait one interval before the next
        try:
            await asyncio.wait_for(stop.wait(), timeout=self.settings.interval_s)
        except TimeoutError:
            await self.cache.run(stop)
