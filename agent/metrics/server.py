"""The agent's HTTP listeners: ``/metrics`` + ``/healthz`` + ``/readyz``, and health alone.

:class:`MetricsServer` serves ``/metrics`` (the registry, our collector over the cached snapshot, in the
Prometheus text format 0.0.4) and, for compatibility, ``/healthz`` and ``/readyz``. :class:`HealthServer`
serves only ``/healthz`` and ``/readyz`` on a listener of its own (``--health-addr``), so kubelet's probes
never wait behind the metrics port's connections. ``/healthz`` answers 200 while the event loop runs;
``/readyz`` runs the injected readiness checks (each a callable returning ``None`` when fine or a
one-line reason) and answers 503 listing every failing reason.

These are route layers only: the connection handling (head parsing, the timeouts in :class:`Timeouts`,
the connection cap that evicts waiting clients, lingering close, throttled warnings) is
``topology.httpserver``'s, with the limits here: a 16 KiB head and body, 64 connections for metrics
and 32 for health.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.metrics.native import ScrapeStats
from topology import logs
from topology.httpserver import TEXT, HttpServer, Limits, Request, Response, require_positive

ReadinessCheck = Callable[[], str | None]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_BODY_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long a listener waits on a client, in seconds: a request head (from connect, or from a
    kept-alive request's first byte), a body, the next request on a kept-alive connection, and a
    response to drain."""

    head_s: float = 5.0
    body_s: float = 5.0
    idle_s: float = 15.0
    write_s: float = 10.0

    def __post_init__(self) -> None:
        require_positive(self, "head_s", "body_s", "idle_s", "write_s")


class HttpListener:
    """``/healthz`` and ``/readyz`` over a ``topology.httpserver.HttpServer``; subclasses add routes.

    ``setting`` names the flag that chose the address (for the error when it cannot listen); ``name``
    tells the listeners apart in logs.
    """

    paths: tuple[str, ...] = ("/healthz", "/readyz")

    def __init__(
        self,
        *,
        name: str,
        setting: str,
        host: str,
        port: int,
        readiness: Sequence[tuple[str, ReadinessCheck]] = (),
        max_connections: int = 64,
        timeouts: Timeouts | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.setting = setting
        self.host = host
        self.port = port
        self.timeouts = timeouts or Timeouts()
        self._readiness = tuple(readiness)
        self._log = logs.get_logger("agent.metrics.server").bind(listener=name)
        t = self.timeouts
        self._http = HttpServer(
            name=name,
            handler=self._handle,
            limits=Limits(
                head_s=t.head_s,
                body_s=t.body_s,
                idle_s=t.idle_s,
                write_s=t.write_s,
                max_connections=max_connections,
                max_body_bytes=MAX_BODY_BYTES,
            ),
            log=self._log,
            clock=clock,
        )

    @property
    def max_connections(self) -> int:
        return self._http.limits.max_connections

    @property
    def bound_port(self) -> int:
        """The port actually bound (useful with port 0)."""
        return self._http.port

    @property
    def open_connections(self) -> int:
        return self._http.open_connections

    async def start(self) -> None:
        try:
            await self._http.start(self.host, self.port)
        except OSError as exc:
            raise RuntimeError(
                f"{self.setting} {self.host}:{self.port}: cannot listen: {exc.strerror or exc}"
            ) from None
        self._log.info(f"{self.name}_listening", host=self.host, port=self.bound_port)

    async def stop(self) -> None:
        await self._http.stop()

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    def readiness(self) -> list[str]:
        """Every failing readiness reason, as ``name: reason``."""
        failing = []
        for name, check in self._readiness:
            try:
                reason = check()
            except Exception as exc:  # a broken check is itself a reason not to be ready
                reason = f"check raised {type(exc).__name__}: {exc}"
            if reason is not None:
                failing.append(f"{name}: {reason}")
        return failing

    async def _handle(self, request: Request, body: bytes) -> Response:
        return Response(*self._route(request.method, request.path))

    def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):
            return 405, TEXT, b"only GET and HEAD\n"
        if path == "/healthz":
            return 200, TEXT, b"ok\n"
        if path == "/readyz":
            failing = self.readiness()
            if failing:
                return 503, TEXT, ("\n".join(failing) + "\n").encode()
            return 200, TEXT, b"ok\n"
        return 404, TEXT, f"not found; try {', '.join(self.paths)}\n".encode()


class HealthServer(HttpListener):
    """``/healthz`` and ``/readyz`` on their own listener (``--health-addr``), for kubelet's probes."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        readiness: Sequence[tuple[str, ReadinessCheck]] = (),
        max_connections: int = 32,
        timeouts: Timeouts | None = None,
    ) -> None:
        super().__init__(
            name="health",
            setting="--health-addr",
            host=host,
            port=port,
            readiness=readiness,
            max_connections=max_connections,
            timeouts=timeouts,
        )


class MetricsServer(HttpListener):
    """``/metrics`` (and ``/healthz``, ``/readyz`` for compatibility) on ``--metrics-addr``."""

    paths = ("/metrics", "/healthz", "/readyz")

    def __init__(
        self,
        *,
        host: str,
        port: int,
        render: Callable[[], bytes],
        readiness: Sequence[tuple[str, ReadinessCheck]] = (),
        monotonic: Callable[[], float] = time.perf_counter,
        max_connections: int = 64,
        timeouts: Timeouts | None = None,
    ) -> None:
        super().__init__(
            name="metrics",
            setting="--metrics-addr",
            host=host,
            port=port,
            readiness=readiness,
            max_connections=max_connections,
            timeouts=timeouts,
        )
        self._render = render
        self._monotonic = monotonic
        self._scrapes = ScrapeStats()

    def scrape_stats(self) -> ScrapeStats:
        return self._scrapes

    def _metrics(self) -> bytes:
        started = self._monotonic()
        body = self._render()
        elapsed = self._monotonic() - started
        self._scrapes = ScrapeStats(self._scrapes.count + 1, self._scrapes.total_seconds + elapsed)
        return body

    def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if path == "/metrics" and method in ("GET", "HEAD"):
            return 200, METRICS_CONTENT_TYPE, self._metrics()
        return super()._route(method, path)
