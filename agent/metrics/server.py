"""A small asyncio HTTP/1.1 server for ``/metrics``, ``/healthz`` and ``/readyz``.

``/metrics`` renders the registry (our collector over the cached snapshot) in the Prometheus text
format 0.0.4; ``/healthz`` answers 200 while the event loop runs; ``/readyz`` runs the injected
readiness checks (each a callable returning ``None`` when fine or a one-line reason) and answers 503
listing every failing reason. Connections are kept alive (Prometheus reuses them); requests are
bounded in size and time, and open connections in number (``max_connections``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

from agent.metrics.native import ScrapeStats
from topology import logs

ReadinessCheck = Callable[[], str | None]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_MAX_HEAD = 16 * 1024
_IDLE_TIMEOUT_S = 120.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


class MetricsServer:
    def __init__(
        self,
        *,
        host: str,
        port: int,
        render: Callable[[], bytes],
        readiness: Sequence[tuple[str, ReadinessCheck]] = (),
        monotonic: Callable[[], float] = time.perf_counter,
        max_connections: int = 64,
    ) -> None:
        self.host = host
        self.max_connections = max_connections
        self.port = port
        self._render = render
        self._readiness = tuple(readiness)
        self._monotonic = monotonic
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._scrapes = ScrapeStats()
        self._log = logs.get_logger("agent.metrics.server")

    def scrape_stats(self) -> ScrapeStats:
        return self._scrapes

    @property
    def bound_port(self) -> int:
        """The port actually bound (useful with port 0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("metrics server is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=_MAX_HEAD)
        self._log.info("metrics_listening", host=self.host, port=self.bound_port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), timeout=5.0)
            self._server = None

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

    def _metrics(self) -> bytes:
        started = self._monotonic()
        body = self._render()
        elapsed = self._monotonic() - started
        self._scrapes = ScrapeStats(self._scrapes.count + 1, self._scrapes.total_seconds + elapsed)
        return body

    def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):
            return 405, "text/plain; charset=utf-8", b"only GET and HEAD\n"
        if path == "/metrics":
            return 200, METRICS_CONTENT_TYPE, self._metrics()
        if path == "/healthz":
            return 200, "text/plain; charset=utf-8", b"ok\n"
        if path == "/readyz":
            failing = self.readiness()
            if failing:
                return 503, "text/plain; charset=utf-8", ("\n".join(failing) + "\n").encode()
            return 200, "text/plain; charset=utf-8", b"ok\n"
        return 404, "text/plain; charset=utf-8", b"not found; try /metrics, /healthz or /readyz\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._writers) >= self.max_connections:
            writer.close()  # scrapers hold one or two connections; this many means a misbehaving client
            return
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=_IDLE_TIMEOUT_S)
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    await self._respond(
                        writer, 400, "text/plain", b"request head too large\n", False, head_only=False
                    )
                    return
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split()
                if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                    await self._respond(
                        writer, 400, "text/plain", b"bad request line\n", False, head_only=False
                    )
                    return
                method, target, version = parts
                headers = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                raw_length = headers.get("content-length", "0") or "0"
                length = int(raw_length) if raw_length.isdigit() else -1
                if length < 0 or length > _MAX_HEAD:
                    await self._respond(
                        writer, 400, "text/plain", b"bad request body\n", False, head_only=False
                    )
                    return
                if length:
                    await reader.readexactly(length)
                conn = headers.get("connection", "").lower()
                keep = conn != "close" if version == "HTTP/1.1" else conn == "keep-alive"
                status, ctype, body = self._route(method, target.split("?", 1)[0])
                await self._respond(writer, status, ctype, body, keep, head_only=method == "HEAD")
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    async def _respond(
        writer: asyncio.StreamWriter, status: int, ctype: str, body: bytes, keep: bool, *, head_only: bool
    ) -> None:
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n"
            f"Content-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
        ).encode("latin-1")
        writer.write(head if head_only else head + body)
        await writer.drain()
