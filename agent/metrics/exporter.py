"""The metrics component the ``run`` command starts: cache refresher, pod-resources cache, HTTP server.

Settings (``run`` flags, also settable by environment and config file through ``agent.config``):

- ``--metrics-addr HOST:PORT`` (default ``0.0.0.0:9400``, dcgm-exporter's port, so existing scrape
  configs and ServiceMonitors keep working; an empty value turns the exporter off);
- ``--metrics-format native|dcgm`` (default ``native``);
- ``--metrics-interval SECONDS`` (default 10): NVML refresh period of the cache;
- ``--pod-resources-socket PATH`` (default ``/var/lib/kubelet/pod-resources/kubelet.sock``, shared with
  the device plugin's registration check) and ``--pod-resources-interval SECONDS`` (default 10);
- ``--proc-root`` (default ``/proc``) and ``--pod-logs-root`` (default ``/var/log/pods``) for mapping
  processes of shared GPUs to pods (needs ``hostPID: true`` to see other pods' processes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata

from prometheus_client.registry import CollectorRegistry

from agent.metrics.cache import MetricsCache, XidSource
from agent.metrics.dcgm import render_dcgm, render_dcgm_agent, render_dcgm_devices
from agent.metrics.exposition import render_text
from agent.metrics.families import Families
from agent.metrics.native import (
    ScrapeStats,
    SnapshotCollector,
    render_agent,
    render_native,
    render_native_devices,
)
from agent.metrics.procmap import ProcessPodMapper
from agent.metrics.server import MetricsServer, ReadinessCheck, Timeouts
from agent.metrics.snapshot import AgentStats, MetricsSnapshot
from agent.nvml.protocol import NvmlBackend
from agent.podresources.cache import PodResourcesCache
from agent.podresources.client import PodResourcesClient
from agent.podresources.model import DEFAULT_SOCKET
from topology.lifecycle import sleep_until
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


def agent_version() -> str:
    try:
        return metadata.version("gpu-node-agent")
    except metadata.PackageNotFoundError:
        return "unknown"


class CachedRender:
    """The ``/metrics`` body: the device families are rendered once per cache refresh (the snapshot
    changes only then), the agent's self-metrics (scrape count and time, registrations) on every scrape.

    Same text as rendering the registry's collector, which stays registered for in-process readers;
    a scrape then costs a bytes concatenation plus a few self-metric lines instead of thousands of
    samples, so its latency does not follow the node's series count.
    """

    def __init__(
        self,
        *,
        devices: Callable[[MetricsSnapshot], Families],
        snapshot: Callable[[], MetricsSnapshot],
        agent_stats: Callable[[], AgentStats],
        scrape_stats: Callable[[], ScrapeStats],
        version: str,
        agent: Callable[[Families, MetricsSnapshot, AgentStats, ScrapeStats, str], None] = render_agent,
    ) -> None:
        self._agent = agent
        self._devices = devices
        self._snapshot = snapshot
        self._agent_stats = agent_stats
        self._scrape_stats = scrape_stats
        self._version = version
        self._rendered: tuple[MetricsSnapshot, bytes] | None = None

    def __call__(self) -> bytes:
        snap = self._snapshot()
        if self._rendered is None or self._rendered[0] is not snap:
            self._rendered = (snap, render_text(self._devices(snap)))
        tail = Families()
        self._agent(tail, snap, self._agent_stats(), self._scrape_stats(), self._version)
        return self._rendered[1] + render_text(tail)


class MetricsExporter:
    """The component: ``await exporter.run(stop)`` serves until ``stop`` is set.

    ``readiness`` adds checks to ``/readyz`` besides NVML's (e.g. "every plugin registered");
    ``agent_stats`` supplies discovery duration, registrations and kubelet restarts; ``device_health``
    answers healthy/unhealthy per device UUID; ``xids`` supplies XID counts (default: an
    :class:`~agent.metrics.cache.XidCounter` at ``exporter.xids`` fed through its ``record`` hook);
    ``timeouts`` are the ``/metrics`` listener's (default :class:`~agent.metrics.server.Timeouts`).
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
        device_health: Callable[[str], bool | None] | None = None,
        xids: XidSource | None = None,
        version: str | None = None,
        timeouts: Timeouts | None = None,
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
        dcgm = settings.format == "dcgm"
        self.registry = CollectorRegistry(auto_describe=False)
        self.server = MetricsServer(
            host=settings.host,
            port=settings.port,
            render=lambda: self.render(),  # noqa: PLW0108 - self.render is built below, from the server
            readiness=(("nvml", self.cache.nvml_problem), *readiness),
            timeouts=timeouts,
        )
        version = version or agent_version()
        self.render = CachedRender(
            devices=render_dcgm_devices if dcgm else render_native_devices,
            snapshot=self.cache.snapshot,
            agent_stats=agent_stats,
            scrape_stats=self.server.scrape_stats,
            version=version,
            agent=render_dcgm_agent if dcgm else render_agent,
        )
        self.registry.register(
            SnapshotCollector(
                render=render_dcgm if dcgm else render_native,
                snapshot=self.cache.snapshot,
                agent_stats=agent_stats,
                scrape_stats=self.server.scrape_stats,
                version=version,
            )
        )
        self.serving = asyncio.Event()  # set once the first refresh has run (or failed) and the port is bound

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self.server.start()
        except OSError as exc:
            where = f"{self.settings.host}:{self.settings.port}"
            raise RuntimeError(f"--metrics-addr {where}: cannot listen: {exc.strerror or exc}") from None
        try:
            if self.podresources is not None:
                await self.podresources.refresh()
            await self.cache.refresh_guarded()  # like every later one: a failure ends nothing
            self.serving.set()
            async with asyncio.TaskGroup() as tasks:
                if self.podresources is not None:
                    tasks.create_task(self.podresources.run(stop, refresh_first=False))
                tasks.create_task(self._refresh_loop(stop))
        finally:
            await self.server.stop()

    async def _refresh_loop(self, stop: asyncio.Event) -> None:
        # the first refresh already ran in run(); wait one interval before the next
        if not await sleep_until(stop, self.settings.interval_s):
            await self.cache.run(stop)
