"""Small asyncio HTTP/1.1 listeners: ``/metrics`` + ``/healthz`` + ``/readyz``, and health alone.

:class:`MetricsServer` serves ``/metrics`` (the registry, our collector over the cached snapshot, in the
Prometheus text format 0.0.4) and, for compatibility, ``/healthz`` and ``/readyz``. :class:`HealthServer`
serves only ``/healthz`` and ``/readyz`` on a listener of its own (``--health-addr``), so kubelet's probes
never wait behind the metrics port's connections. ``/healthz`` answers 200 while the event loop runs;
``/readyz`` runs the injected readiness checks (each a callable returning ``None`` when fine or a
one-line reason) and answers 503 listing every failing reason.

Both run behind the same connection handling (:class:`HttpListener`), written for clients that are
slow, idle, broken or hostile:

- every wait on the client is bounded (:class:`Timeouts`): a request head must arrive within
  ``head_s`` of the connection opening or of its first byte, a body within ``body_s``, the next
  request on a kept-alive connection within ``idle_s``, and a response must drain within ``write_s``;
- open connections are capped (``max_connections``), but waiting clients cannot hold the cap: when a
  new connection arrives at the cap, the connection that has kept the server waiting longest (idle
  keep-alive, a stalled head or body) is closed to make room; only when every connection is being
  answered is the new one refused;
- a malformed request (request line, header, ``Content-Length`` that is not ASCII digits, an unsupported
  ``Transfer-Encoding``, a head or body over its size limit) gets a 4xx/5xx status with a one-line reason
  and the connection is closed; the listener logs one warning line for it (at most one per event and
  ``_LOG_EVERY_S`` seconds, with a count of those not logged), never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.metrics.native import ScrapeStats
from topology import logs

ReadinessCheck = Callable[[], str | None]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 16 * 1024
_LOG_EVERY_S = 10.0
_LINGER_S = 1.0  # after an error answer, how long (and how much) of the client's rest is read and dropped,
_LINGER_BYTES = 64 * 1024  # so that closing with unread input (a TCP reset) does not destroy the answer
_MAX_LEADING_EMPTY_LINES = 4
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
_METHOD_RE = re.compile(r"[A-Z]{1,20}")
_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}")
_DIGITS_RE = re.compile(r"[0-9]{1,12}")  # ASCII only: str.isdigit() also accepts '²' (b'\xb2' in latin-1)
_PRINTABLE_RE = re.compile(r"[\x21-\x7e]+")
_FIELD_VALUE_RE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long a listener waits on a client, in seconds (see the module docstring)."""

    head_s: float = 5.0
    body_s: float = 5.0
    idle_s: float = 15.0
    write_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("head_s", "body_s", "idle_s", "write_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Timeouts.{name}: must be > 0 seconds, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    keep_alive: bool
    content_length: int


@dataclass(frozen=True, slots=True)
class Rejected:
    """A request the listener answers with ``status`` and ``reason`` and then closes."""

    status: int
    reason: str


def _shown(text: str, limit: int = 40) -> str:
    """``text`` as an ASCII literal, cut to ``limit`` characters, for error messages and logs."""
    return ascii(text[:limit]) + ("..." if len(text) > limit else "")


def parse_head(head: bytes) -> Request | Rejected:
    """Parse a request head (request line and headers, ending with the empty line) without trusting it."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        return Rejected(400, f"bad request line {_shown(lines[0])}: expected 'METHOD /path HTTP/1.1'")
    method, target, version = parts
    if not _METHOD_RE.fullmatch(method):
        return Rejected(400, f"bad request line: method {_shown(method)} is not an upper-case token")
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        if version.startswith("HTTP/") and _PRINTABLE_RE.fullmatch(version):
            return Rejected(505, f"{_shown(version)} is not supported; use HTTP/1.1")
        return Rejected(400, f"bad request line: {_shown(version)} is not an HTTP version")
    if not target.startswith("/") or not _PRINTABLE_RE.fullmatch(target):
        return Rejected(
            400,
            f"request target {_shown(target)} must be a path of printable ASCII (percent-encode the rest)",
        )
    lengths: set[str] = set()
    connection: list[str] = []
    for line in lines[1:]:
        if not line:
            continue  # the empty line(s) that end the head
        if line[0] in " \t":
            return Rejected(400, "folded header lines are not supported")
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN_RE.fullmatch(name):
            return Rejected(400, f"malformed header line {_shown(line)}")
        value = value.strip(" \t")
        if not _FIELD_VALUE_RE.fullmatch(value):
            return Rejected(400, f"header {name}: the value has control characters")
        lowered = name.lower()
        if lowered == "content-length":
            lengths.update(v.strip(" \t") for v in value.split(","))
        elif lowered == "transfer-encoding":
            return Rejected(501, "Transfer-Encoding is not supported; send Content-Length")
        elif lowered == "connection":
            connection.extend(t.strip(" \t").lower() for t in value.split(","))
    for text in sorted(lengths):
        if not _DIGITS_RE.fullmatch(text):
            return Rejected(400, f"Content-Length must be a number in ASCII digits, got {_shown(text)}")
    if len(lengths) > 1:
        return Rejected(400, f"conflicting Content-Length values {', '.join(sorted(lengths))}")
    keep = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    return Request(
        method=method,
        path=target.split("?", 1)[0],
        keep_alive=keep,
        content_length=int(lengths.pop()) if lengths else 0,
    )


class _Throttle:
    """At most one log line per event name and ``every_s`` seconds; counts the lines left out."""

    def __init__(self, every_s: float, clock: Callable[[], float]) -> None:
        self._every_s = every_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def admit(self, event: str) -> int | None:
        """``None`` to leave this line out; else how many were left out since the last one logged."""
        now = self._clock()
        last = self._last.get(event)
        if last is not None and now - last < self._every_s:
            self._skipped[event] = self._skipped.get(event, 0) + 1
            return None
        self._last[event] = now
        return self._skipped.pop(event, 0)


class _Connection:
    __slots__ = ("evicted", "peer", "waiting_since", "writer")

    def __init__(self, writer: asyncio.StreamWriter, peer: str, now: float) -> None:
        self.writer = writer
        self.peer = peer
        self.waiting_since: float | None = now  # None while a request is being answered
        self.evicted = False


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


class HttpListener:
    """One listening socket with bounded, evictable connections; subclasses add routes.

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
        if max_connections < 1:
            raise ValueError(f"max_connections: must be >= 1, got {max_connections}")
        self.name = name
        self.setting = setting
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self.timeouts = timeouts or Timeouts()
        self._readiness = tuple(readiness)
        self._clock = clock
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._throttle = _Throttle(_LOG_EVERY_S, clock)
        self._log = logs.get_logger("agent.metrics.server").bind(listener=name)

    @property
    def bound_port(self) -> int:
        """The port actually bound (useful with port 0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError(f"the {self.name} listener is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=MAX_HEAD_BYTES)
        except OSError as exc:
            raise RuntimeError(
                f"{self.setting} {self.host}:{self.port}: cannot listen: {exc.strerror or exc}"
            ) from None
        self._log.info(f"{self.name}_listening", host=self.host, port=self.bound_port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for conn in list(self._connections):
                conn.writer.transport.abort()
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

    def _warn(self, event: str, **fields: object) -> None:
        skipped = self._throttle.admit(event)
        if skipped is not None:
            self._log.warning(event, **fields, **({"not_logged_since_last": skipped} if skipped else {}))

    def _make_room(self) -> bool:
        """At the cap, close the connection that has kept us waiting longest; ``False`` if every one is
        being answered (then the new connection is refused)."""
        waiting = [c for c in self._connections if c.waiting_since is not None]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: c.waiting_since or 0.0)
        oldest.evicted = True
        self._connections.discard(oldest)
        oldest.writer.close()  # nothing is being written to a waiting connection: the client sees EOF
        self._warn(
            "http_connection_evicted",
            peer=oldest.peer,
            waited_s=round(self._clock() - (oldest.waiting_since or 0.0), 3),
            max_connections=self.max_connections,
            hint="a client holds connections without sending requests; the oldest waiting one was closed",
        )
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(writer, _peer(writer), self._clock())
        if len(self._connections) >= self.max_connections and not self._make_room():
            self._warn("http_connection_refused", peer=conn.peer, max_connections=self.max_connections)
            writer.transport.abort()
            return
        self._connections.add(conn)
        try:
            await self._requests(reader, conn)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception as exc:  # one line, never a traceback from asyncio's client_connected_cb
            self._log.error("http_connection_failed", peer=conn.peer, error=f"{type(exc).__name__}: {exc}")
        finally:
            self._connections.discard(conn)
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), timeout=1.0)
            except (TimeoutError, OSError):
                writer.transport.abort()

    async def _requests(self, reader: asyncio.StreamReader, conn: _Connection) -> None:
        first = True
        while True:
            conn.waiting_since = self._clock()
            request = await self._read_request(reader, conn, first=first)
            if request is None:
                return
            first = False
            conn.waiting_since = None
            try:
                status, ctype, body = self._route(request.method, request.path)
            except Exception as exc:  # a bug in a route answers 500, the listener keeps serving
                self._log.error("http_route_failed", path=request.path, error=f"{type(exc).__name__}: {exc}")
                status, ctype, body = 500, TEXT, b"internal error; see the agent log\n"
            sent = await self._respond(
                conn, status, ctype, body, keep=request.keep_alive, head_only=request.method == "HEAD"
            )
            if not sent or not request.keep_alive:
                return

    async def _read_request(
        self, reader: asyncio.StreamReader, conn: _Connection, *, first: bool
    ) -> Request | None:
        """The next request, its body read and dropped; ``None`` when the connection is to close (the
        client left, waited too long, or sent something we answered with an error)."""
        t = self.timeouts
        now = asyncio.get_running_loop().time
        opened = now()
        try:
            async with asyncio.timeout(t.head_s if first else t.idle_s):
                lead = await reader.readexactly(1)
                for _ in range(_MAX_LEADING_EMPTY_LINES * 2):
                    if lead not in (b"\r", b"\n"):  # empty lines before a request are allowed (RFC 9112)
                        break
                    lead = await reader.readexactly(1)
        except TimeoutError:
            return None  # nothing was asked: close without a word
        try:
            # a new connection has head_s from connect for its whole head, a kept-alive one from its
            # request's first byte: one byte now and then (slowloris) cannot stretch it
            async with asyncio.timeout_at((opened if first else now()) + t.head_s):
                head = lead + await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            await self._reject(
                reader, conn, Rejected(408, f"request head not complete within {t.head_s:g} s")
            )
            return None
        except asyncio.LimitOverrunError:
            await self._reject(
                reader, conn, Rejected(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
            )
            return None
        parsed = parse_head(head)
        if isinstance(parsed, Rejected):
            await self._reject(reader, conn, parsed)
            return None
        if parsed.content_length > MAX_BODY_BYTES:
            await self._reject(
                reader, conn, Rejected(413, f"request body larger than {MAX_BODY_BYTES} bytes")
            )
            return None
        if parsed.content_length:
            try:
                async with asyncio.timeout(t.body_s):
                    await reader.readexactly(parsed.content_length)
            except TimeoutError:
                await self._reject(
                    reader, conn, Rejected(408, f"request body not complete within {t.body_s:g} s")
                )
                return None
        return parsed

    async def _reject(self, reader: asyncio.StreamReader, conn: _Connection, rejected: Rejected) -> None:
        if conn.evicted:
            return
        self._warn("http_request_rejected", peer=conn.peer, status=rejected.status, reason=rejected.reason)
        conn.waiting_since = None
        if await self._respond(conn, rejected.status, TEXT, f"{rejected.reason}\n".encode(), keep=False):
            conn.waiting_since = self._clock()  # lingering is waiting on the client: evictable
            await self._linger(reader, conn.writer)

    @staticmethod
    async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Half-close, then read and drop what the client still sends, bounded in time and bytes."""
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
            async with asyncio.timeout(_LINGER_S):
                dropped = 0
                while dropped < _LINGER_BYTES:
                    chunk = await reader.read(4096)
                    if not chunk:
                        return
                    dropped += len(chunk)

    async def _respond(
        self,
        conn: _Connection,
        status: int,
        ctype: str,
        body: bytes,
        *,
        keep: bool,
        head_only: bool = False,
    ) -> bool:
        """Write a response; ``False`` when the client did not take it within the write timeout."""
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n"
            f"Content-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
        ).encode("latin-1")
        conn.writer.write(head if head_only else head + body)
        try:
            async with asyncio.timeout(self.timeouts.write_s):
                await conn.writer.drain()
        except TimeoutError:
            self._warn("http_write_timed_out", peer=conn.peer, timeout_s=self.timeouts.write_s)
            conn.writer.transport.abort()
            return False
        return True


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
