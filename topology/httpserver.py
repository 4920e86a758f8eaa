"""The one HTTP/1.1 connection layer: an asyncio listener for clients that are slow, idle, broken or hostile.

Used by the agent's metrics and health listeners (``agent.metrics.server``) and by the scheduler
extender (``scheduler_plugin.extender``); each supplies a handler (its routes) and its limits, this
module owns everything between the socket and the handler:

- the request head is parsed without trusting it (:func:`parse_head`): a malformed request line or
  header, a ``Content-Length`` that is not ASCII digits (or two that disagree), ``Transfer-Encoding``,
  an unsupported HTTP version, a head or body over its size limit get a 4xx/5xx status with a one-line
  reason, and the connection is closed after a *lingering close* (half-close, then read and drop what
  the client still sends, bounded in time and bytes, so the answer is not destroyed by a TCP reset);
- every wait on the client is bounded (:class:`Limits`): a request head must arrive within ``head_s``
  of the connection opening (a kept-alive connection: of its request's first byte), a body within
  ``body_s``, the next request on a kept-alive connection within ``idle_s``, and a response must drain
  within ``write_s``; one byte now and then cannot stretch a deadline;
- open connections are capped (``max_connections``), but waiting clients cannot hold the cap: a new
  connection at the cap evicts one that is not being answered (never-served first, then the one that
  has kept the server waiting longest); a connection whose request is being answered (the handler runs
  or the response drains, e.g. a bind waiting at a gang barrier) is never evicted; only when every one
  is being answered is the newcomer refused (reset, or answered 503 when ``answer_when_full``);
- optional TLS (an ``ssl.SSLContext``; the handshake is bounded by ``head_s``);
- problems are logged as one warning line each (at most one per event name and ``LOG_EVERY_S``
  seconds, with a count of those left out), never a traceback; a handler that raises answers 500 and
  the listener keeps serving.

Must not import ``agent``, ``deviceplugin``, ``scheduler_plugin`` or node-side adapter libraries.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from topology import logs

MAX_HEAD_BYTES = 16 * 1024
LOG_EVERY_S = 10.0
TEXT = "text/plain; charset=utf-8"
_LINGER_S = 1.0  # after an error answer, how long (and how much) of the client's rest is read and dropped
_LINGER_BYTES = 64 * 1024
_MAX_LEADING_EMPTY_LINES = 4
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
_METHOD_RE = re.compile(r"[A-Z]{1,20}")
_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}")
_DIGITS_RE = re.compile(r"[0-9]{1,15}")  # ASCII only: str.isdigit() also accepts '²' (b'\xb2' in latin-1)
_PRINTABLE_RE = re.compile(r"[\x21-\x7e]+")
_FIELD_VALUE_RE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")


def require_positive(obj: object, *names: str) -> None:
    """``ValueError`` naming ``Type.field`` for the first of ``names`` on ``obj`` that is not > 0."""
    for name in names:
        value = getattr(obj, name)
        if not value > 0:
            raise ValueError(f"{type(obj).__name__}.{name}: must be > 0, got {value}")


@dataclass(frozen=True, slots=True)
class Limits:
    """What a listener allows a client (see the module docstring); every server passes its own."""

    head_s: float
    body_s: float
    idle_s: float
    write_s: float
    max_connections: int
    max_body_bytes: int
    max_head_bytes: int = MAX_HEAD_BYTES

    def __post_init__(self) -> None:
        require_positive(self, "head_s", "body_s", "idle_s", "write_s", "max_body_bytes", "max_head_bytes")
        if self.max_connections < 1:
            raise ValueError(f"max_connections: must be >= 1, got {self.max_connections}")


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # without the query
    keep_alive: bool
    content_length: int
    content_type: str = ""


@dataclass(frozen=True, slots=True)
class Rejected:
    """A request the listener answers with ``status`` and ``reason`` and then closes."""

    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    content_type: str
    body: bytes


Handler = Callable[[Request, bytes], Awaitable[Response]]
ErrorResponse = Callable[[int, str], Response]


def text_error(status: int, reason: str) -> Response:
    """The default error answer: the reason as one line of plain text."""
    return Response(status, TEXT, f"{reason}\n".encode())


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
    content_type = ""
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
        elif lowered == "content-type":
            content_type = value
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
        content_type=content_type,
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


@dataclass
class ConnectionStats:
    """Counts since start: connections evicted and refused at the cap, requests rejected, and timeouts
    by what was awaited (``header``, ``body``, ``idle``, ``write``)."""

    evicted: int = 0
    refused: int = 0
    rejected: int = 0
    timeouts: dict[str, int] = field(default_factory=dict)


class _Connection:
    __slots__ = ("peer", "served", "task", "waiting_since", "writer")

    def __init__(self, writer: asyncio.StreamWriter, peer: str, now: float) -> None:
        self.writer = writer
        self.peer = peer
        self.task = asyncio.current_task()
        self.waiting_since: float | None = now  # None while a request is being answered: not evictable
        self.served = 0

    def victim_order(self) -> tuple[bool, float]:
        """Never-served connections go first, then the one that has waited longest."""
        return (self.served > 0, self.waiting_since or 0.0)


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


class HttpServer:
    """One listening socket with bounded, evictable connections, serving ``handler``.

    ``name`` tells listeners apart in logs (bound as ``listener``); ``error_response`` renders the
    answers the server gives by itself (rejections, 500 for a handler that raised, 503 when full).
    """

    def __init__(
        self,
        *,
        name: str,
        handler: Handler,
        limits: Limits,
        log: logs.Logger,
        error_response: ErrorResponse = text_error,
        tls: ssl.SSLContext | None = None,
        answer_when_full: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.limits = limits
        self.tls = tls
        self.stats = ConnectionStats()
        self._handler = handler
        self._error_response = error_response
        self._answer_when_full = answer_when_full
        self._clock = clock
        self._log = log.bind(listener=name)
        self._throttle = _Throttle(LOG_EVERY_S, clock)
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()

    @property
    def port(self) -> int:
        """The port actually bound (useful with port 0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError(f"the {self.name} listener is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port``; raises ``OSError`` when it cannot."""
        self._server = await asyncio.start_server(
            self._serve,
            host,
            port,
            limit=self.limits.max_head_bytes,
            ssl=self.tls,
            ssl_handshake_timeout=self.limits.head_s if self.tls is not None else None,
        )

    def stop_accepting(self) -> None:
        """Close the listening socket; open connections go on (see :meth:`stop`)."""
        if self._server is not None:
            self._server.close()

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop accepting, close waiting connections at once, give those being answered ``grace_s`` to
        finish, then cut the rest."""
        if self._server is None:
            return
        self._server.close()
        tasks = {c.task for c in self._connections if c.task is not None}
        for conn in list(self._connections):
            if conn.waiting_since is not None and conn.task is not None:
                conn.task.cancel()  # nobody waits on an idle or stalled connection
        busy = {c.task for c in self._connections if c.waiting_since is None and c.task is not None}
        if busy and grace_s > 0:
            await asyncio.wait(busy, timeout=grace_s)
        for conn in list(self._connections):
            if conn.waiting_since is None:  # still answering after the grace: cut it
                conn.writer.transport.abort()
            if conn.task is not None:
                conn.task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), timeout=5.0)
        self._server = None

    def warn(self, event: str, **fields: object) -> None:
        """A warning line, throttled per event name."""
        skipped = self._throttle.admit(event)
        if skipped is not None:
            self._log.warning(event, **fields, **({"not_logged_since_last": skipped} if skipped else {}))

    def _timed_out(self, what: str) -> None:
        self.stats.timeouts[what] = self.stats.timeouts.get(what, 0) + 1

    def _make_room(self) -> bool:
        """At the cap, close a connection that is not being answered (see ``victim_order``); ``False``
        if every one is being answered (then the new connection is refused)."""
        waiting = [c for c in self._connections if c.waiting_since is not None and c.task is not None]
        if not waiting:
            return False
        victim = min(waiting, key=_Connection.victim_order)
        self._connections.discard(victim)
        if victim.task is not None:
            victim.task.cancel()  # it closes its socket: nothing is being written, the client sees EOF
        self.stats.evicted += 1
        self.warn(
            "http_connection_evicted",
            peer=victim.peer,
            waited_s=round(self._clock() - (victim.waiting_since or 0.0), 3),
            served=victim.served,
            max_connections=self.limits.max_connections,
            evicted_total=self.stats.evicted,
            hint="a client holds connections without sending requests; a waiting one was closed",
        )
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(writer, _peer(writer), self._clock())
        if len(self._connections) >= self.limits.max_connections and not self._make_room():
            await self._refuse(reader, conn)
            return
        self._connections.add(conn)
        try:
            await self._requests(reader, conn)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, asyncio.CancelledError):
            pass
        except Exception as exc:  # one line, never a traceback from asyncio's client_connected_cb
            self._log.error("http_connection_failed", peer=conn.peer, error=f"{type(exc).__name__}: {exc}")
        finally:
            self._connections.discard(conn)
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), timeout=1.0)
            except (TimeoutError, OSError, asyncio.CancelledError):
                writer.transport.abort()

    async def _refuse(self, reader: asyncio.StreamReader, conn: _Connection) -> None:
        self.stats.refused += 1
        self.warn("http_connection_refused", peer=conn.peer, max_connections=self.limits.max_connections)
        if not self._answer_when_full:
            conn.writer.transport.abort()
            return
        with contextlib.suppress(Exception):
            if await self._respond(
                conn, self._error_response(503, "too many connections answering requests"), keep=False
            ):
                await self._linger(reader, conn.writer)
        conn.writer.close()

    async def _requests(self, reader: asyncio.StreamReader, conn: _Connection) -> None:
        while True:
            conn.waiting_since = self._clock()
            got = await self._read_request(reader, conn)
            if got is None:
                return
            request, body = got
            conn.waiting_since = None
            try:
                response = await self._handler(request, body)
            except Exception as exc:  # a bug in a route answers 500, the listener keeps serving
                self._log.error("http_route_failed", path=request.path, error=f"{type(exc).__name__}: {exc}")
                response = self._error_response(500, f"internal error; see the {self.name} listener's log")
            conn.served += 1
            sent = await self._respond(
                conn, response, keep=request.keep_alive, head_only=request.method == "HEAD"
            )
            if not sent or not request.keep_alive:
                return

    async def _read_request(
        self, reader: asyncio.StreamReader, conn: _Connection
    ) -> tuple[Request, bytes] | None:
        """The next request and its body; ``None`` when the connection is to close (the client left,
        waited too long, or sent something we answered with an error)."""
        lim = self.limits
        first = conn.served == 0
        now = asyncio.get_running_loop().time
        # one timer for the request, moved on at each step (a timer per step costs as much as the
        # rest of reading a small request): the first byte within head_s of connecting (a kept-alive
        # connection: idle_s), the head within head_s of connecting (kept-alive: of its first byte),
        # so one byte now and then (slowloris) cannot stretch it, then the body within body_s
        step = "header" if first else "idle"
        try:
            async with asyncio.timeout(lim.head_s if first else lim.idle_s) as timer:
                lead = await reader.readexactly(1)
                for _ in range(_MAX_LEADING_EMPTY_LINES * 2):
                    if lead not in (b"\r", b"\n"):  # empty lines before a request are allowed (RFC 9112)
                        break
                    lead = await reader.readexactly(1)
                step = "head"
                if not first:
                    timer.reschedule(now() + lim.head_s)
                head = lead + await reader.readuntil(b"\r\n\r\n")
                parsed = parse_head(head)
                if isinstance(parsed, Rejected) or parsed.content_length > lim.max_body_bytes:
                    body = b""
                elif parsed.content_length:
                    step = "body"
                    timer.reschedule(now() + lim.body_s)
                    body = await reader.readexactly(parsed.content_length)
                else:
                    body = b""
        except TimeoutError:
            if step in ("header", "idle"):
                self._timed_out(step)
                return None  # nothing was asked: close without a word
            if step == "head":
                self._timed_out("header")
                await self._reject(reader, conn, 408, f"request headers not complete within {lim.head_s:g} s")
                return None
            self._timed_out("body")
            await self._reject(reader, conn, 408, f"request body not complete within {lim.body_s:g} s")
            return None
        except asyncio.LimitOverrunError:
            await self._reject(reader, conn, 431, f"request headers larger than {lim.max_head_bytes} bytes")
            return None
        if isinstance(parsed, Rejected):
            await self._reject(reader, conn, parsed.status, parsed.reason)
            return None
        if parsed.content_length > lim.max_body_bytes:
            await self._reject(
                reader,
                conn,
                413,
                f"request body of {parsed.content_length} bytes is larger than the limit of "
                f"{lim.max_body_bytes} bytes",
            )
            return None
        return parsed, body

    async def _reject(
        self, reader: asyncio.StreamReader, conn: _Connection, status: int, reason: str
    ) -> None:
        """Answer ``status`` with ``reason``, then close lingering."""
        self.stats.rejected += 1
        self.warn("http_request_rejected", peer=conn.peer, status=status, reason=reason)
        conn.waiting_since = None
        if await self._respond(conn, self._error_response(status, reason), keep=False):
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
        self, conn: _Connection, response: Response, *, keep: bool, head_only: bool = False
    ) -> bool:
        """Write a response; ``False`` when the client did not take it within the write timeout."""
        head = (
            f"HTTP/1.1 {response.status} {REASONS.get(response.status, 'Unknown')}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
        ).encode("latin-1")
        conn.writer.write(head if head_only else head + response.body)
        transport = conn.writer.transport
        if transport.get_write_buffer_size() == 0 and not transport.is_closing():
            return True  # the kernel took it all: nothing to wait for
        try:
            async with asyncio.timeout(self.limits.write_s):
                await conn.writer.drain()
        except TimeoutError:
            self._timed_out("write")
            self.warn("http_write_timed_out", peer=conn.peer, timeout_s=self.limits.write_s)
            conn.writer.transport.abort()
            return False
        return True
