"""Requests on an event loop: the API calls a server makes while it answers its own clients.

:class:`AsyncKube` sends small JSON requests (the extender's pod bindings) straight from the event loop
over a few kept-alive HTTP/1.1 connections to the API server, with the same server, TLS settings and
credentials as the injected ``ApiClient`` (:func:`~topology.kube.client.api_client_from`). No worker
thread and no client serializer per request: a binding costs one write and one read of a few hundred
bytes, and many can be in flight at once (up to ``max_connections``, the rest wait for a connection).

- the credentials are the client's own (``Configuration.auth_settings()``: a bearer token, refreshed by
  its hook, e.g. the in-cluster token file or an exec plugin); they are read at most every
  ``auth_refresh_s``, one read at a time, on a thread of its own (never the loop's default executor,
  which the caller's ``asyncio.to_thread`` work needs): requests wait for a read at most until
  ``auth_timeout_s`` after it began, then go on with the last token read (a hook that hangs or fails
  costs one thread, not one per request); with no token read yet they fail naming the hook;
- every request is bounded: a connection within ``connect_s``, the whole answer within ``timeout_s``,
  a head of at most :data:`MAX_HEAD_BYTES` and a body of at most ``max_body_bytes``; an answer that
  breaks HTTP (a bad status line or length, broken chunks) is a :class:`KubeError` with status 0
  naming what was wrong, and that connection is dropped;
- interim answers (``100 Continue``, ``103 Early Hints``; at most :data:`MAX_INTERIM_ANSWERS`) are
  skipped: the request's answer is the final one after them;
- a connection is kept only where the stream stands at the next answer's start: bytes past an
  answer's body, or bytes or the server's close while it was idle, drop it (they are never read as
  the next request's answer);
- a request whose bytes were written is never sent again: a connection that ends before its answer
  is that request's :class:`KubeError` (status 0); a POST may have been carried out, so the caller
  decides (kube-scheduler retries a failed binding; a binding it finds done, 409 "already assigned to
  node" the same node, counts as bound: :func:`~topology.kube.client.bound_already`);
- a refusal (non-2xx) is a :class:`KubeError` with the API's status and its ``message``.

Configurations this does not speak (an HTTP proxy, basic auth) give ``None`` from
:meth:`AsyncKube.from_api_client`; the caller then keeps the synchronous client.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from topology import logs
from topology.kube.client import MAX_MESSAGE_CHARS, Dechunker, KubeError, binding, bound_already

MAX_HEAD_BYTES = 64 * 1024
MAX_INTERIM_ANSWERS = 8  # 1xx heads before the final answer; more is a broken answer
_HEADER_VALUE_RE = re.compile(r"[\x20-\x7e]{0,16384}")
MAX_BODY_BYTES = 4 * 1024 * 1024
USER_AGENT = "gpu-node-agent"

log = logs.get_logger("topology.kube.aio")


class _BrokenAnswerError(Exception):
    """The server's answer broke HTTP, or the connection ended inside it."""


class _NoCredentialsError(Exception):
    """The client's credentials could not be read (its refresh hook failed or hangs)."""


class _NoAnswerError(Exception):
    """The connection ended before any byte of an answer."""


class _Counting(asyncio.StreamReaderProtocol):
    """The stream's protocol, counting the bytes that arrive, so that bytes no answer accounted for
    (past a body's end, or sent while the connection was idle) are seen before it is used again."""

    received = 0

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        super().data_received(data)


class _Conn:
    __slots__ = ("idle_since", "protocol", "reader", "taken", "writer")

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, protocol: _Counting
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.protocol = protocol
        self.taken = 0  # bytes the answers read so far took (heads and bodies)
        self.idle_since = 0.0

    @property
    def unread(self) -> int:
        """Bytes that arrived and belong to no answer read."""
        return self.protocol.received - self.taken

    def usable(self) -> bool:
        """Whether the stream stands at an answer's start: nothing unread, not ended, not closing."""
        return (
            self.unread == 0
            and not self.reader.at_eof()
            and self.reader.exception() is None
            and not self.writer.transport.is_closing()
        )

    def close(self) -> None:
        self.writer.transport.abort()


class AsyncKube:
    """JSON requests to one API server from an event loop (see the module docstring)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None,
        server_hostname: str | None = None,
        auth: Any = None,
        max_connections: int = 16,
        connect_s: float = 10.0,
        timeout_s: float = 30.0,
        idle_s: float = 30.0,
        auth_refresh_s: float = 10.0,
        auth_timeout_s: float = 5.0,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        """``auth``: a ``kubernetes.client.Configuration`` whose ``auth_settings()`` gives the bearer token
        (None: no Authorization header). ``idle_s``: a connection idle longer is closed rather than
        reused (below the API server's own keep-alive timeout). ``auth_timeout_s``: how long after a
        credential read began requests wait for it before they go on with the last token read."""
        if max_connections < 1:
            raise ValueError(f"max_connections: must be >= 1, got {max_connections}")
        self.host = host
        self.port = port
        self.tls = tls
        self.server_hostname = server_hostname or host
        self.auth = auth
        self.max_connections = max_connections
        self.connect_s = connect_s
        self.timeout_s = timeout_s
        self.idle_s = idle_s
        self.auth_refresh_s = auth_refresh_s
        self.auth_timeout_s = auth_timeout_s
        self.max_body_bytes = max_body_bytes
        self.opened = 0  # connections opened so far (kept-alive reuse shows as few)
        self._idle: list[_Conn] = []
        self._slots: asyncio.Semaphore | None = None  # made on the loop that first uses it
        # credentials: the last header read (valid once _auth_read), when the last read ended, the read
        # in flight (at most one; its thread may outlive every request that waited for it) and when it
        # began, and why the last read failed
        self._auth_header: str | None = None
        self._auth_read = False
        self._auth_at = -1e18
        self._auth_refresh: asyncio.Future[None] | None = None
        self._auth_began = 0.0
        self._auth_error = ""
        self._auth_late = False  # the read in flight is past auth_timeout_s (logged once)
        netloc = host if ":" not in host else f"[{host}]"
        default = 443 if tls is not None else 80
        self._host_header = netloc if port == default else f"{netloc}:{port}"

    @classmethod
    def from_api_client(cls, api_client: Any, **kwargs: Any) -> AsyncKube | None:
        """One for the server and credentials of a ``kubernetes`` ``ApiClient``; ``None`` when its
        configuration needs what this does not speak (a proxy, basic auth, a scheme but http(s))."""
        cfg = api_client.configuration
        url = urlsplit(str(cfg.host))
        if url.scheme not in ("http", "https") or not url.hostname:
            return None
        if getattr(cfg, "proxy", None) or getattr(cfg, "username", None) or getattr(cfg, "password", None):
            return None
        tls: ssl.SSLContext | None = None
        if url.scheme == "https":
            tls = ssl.create_default_context(
                cafile=cfg.ssl_ca_cert, cadata=getattr(cfg, "ca_cert_data", None)
            )
            if not cfg.verify_ssl:
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
            elif getattr(cfg, "assert_hostname", None) is False:
                tls.check_hostname = False
            if cfg.cert_file:
                tls.load_cert_chain(cfg.cert_file, cfg.key_file)
        return cls(
            url.hostname,
            url.port or (443 if tls is not None else 80),
            tls=tls,
            server_hostname=getattr(cfg, "tls_server_name", None) or url.hostname,
            auth=cfg,
            **kwargs,
        )

    # -- requests ---------------------------------------------------------------------------------
    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        """Bind a pod to a node (``pods/binding``); ``uid`` (when given) guards against a re-created pod;
        ``annotations`` go on the Binding, which the API server copies to the pod.
        A pod already on that node counts as bound (:func:`~topology.kube.client.bound_already`)."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if annotations:
            meta["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await self.request("POST", binding(namespace, name), body)
        except KubeError as exc:
            if not bound_already(exc, name, node):
                raise
            log.info("pod_already_bound", namespace=namespace, pod=name, node=node)

    async def request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """The decoded JSON answer (``{}`` for none); :class:`KubeError` for a refusal (its status) or
        for no usable answer (status 0)."""
        what = f"{method} {path}"
        payload = orjson.dumps(body) if body is not None else b""
        try:
            async with asyncio.timeout(self.timeout_s):
                status, data = await self._exchange(method, path, payload)
        except TimeoutError:
            raise KubeError(0, f"{what}: no answer within {self.timeout_s:g} s") from None
        except _NoAnswerError as exc:
            raise KubeError(
                0, f"{what}: {exc}; not sent again (the server may have carried it out)"
            ) from None
        except (OSError, _BrokenAnswerError, _NoCredentialsError) as exc:
            raise KubeError(0, f"{what}: {type(exc).__name__}: {str(exc)[:200]}") from None
        if not 200 <= status <= 299:
            raise KubeError(status, f"{what}: {_message(data)}")
        if not data:
            return {}
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise KubeError(0, f"{what}: the answer is not JSON ({exc})") from None

    async def aclose(self) -> None:
        """Close the idle connections (requests in flight keep theirs until they end)."""
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    # -- one exchange -----------------------------------------------------------------------------
    async def _exchange(self, method: str, path: str, payload: bytes) -> tuple[int, bytes]:
        """One request on one connection, written once: no answer is the request's error."""
        head = await self._head(method, path, len(payload))
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        async with self._slots:
            conn = await self._connection()
            try:
                conn.writer.write(head + payload)
                status, data = await self._answer(conn)
            except BaseException:
                conn.close()
                raise
            if conn.usable():
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
            else:
                conn.close()
            return status, data

    async def _head(self, method: str, path: str, length: int) -> bytes:
        lines = [
            f"{method} {path} HTTP/1.1",
            f"Host: {self._host_header}",
            f"User-Agent: {USER_AGENT}",
            "Accept: application/json",
        ]
        if length or method in ("POST", "PUT", "PATCH"):
            lines += ["Content-Type: application/json", f"Content-Length: {length}"]
        token = await self._authorization()
        if token:
            lines.append(f"Authorization: {token}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    # -- credentials ------------------------------------------------------------------------------
    async def _authorization(self) -> str | None:
        """The Authorization header: the last one read, read again when ``auth_refresh_s`` passed (one
        read at a time, on its own thread). Requests wait for a read until ``auth_timeout_s`` after it
        began, then use the last header read; with none read yet, the request fails."""
        if self.auth is None:
            return None
        if self._auth_refresh is None and time.monotonic() - self._auth_at >= self.auth_refresh_s:
            self._auth_refresh = self._start_refresh()
        refresh = self._auth_refresh
        if refresh is not None:
            wait = self._auth_began + self.auth_timeout_s - time.monotonic()
            try:
                if wait <= 0:
                    raise TimeoutError
                async with asyncio.timeout(wait):
                    await asyncio.shield(refresh)  # one waiter's end never ends the read for the rest
            except TimeoutError:
                if not self._auth_late:
                    self._auth_late = True
                    log.warning(
                        "kube_credentials_refresh_slow",
                        timeout_s=self.auth_timeout_s,
                        action="the last token is used until the credential hook answers"
                        if self._auth_read
                        else "requests fail until the credential hook answers",
                    )
        if self._auth_read:
            return self._auth_header
        if self._auth_refresh is not None:
            began = time.monotonic() - self._auth_began
            raise _NoCredentialsError(
                f"the credential hook has not answered in {began:.1f} s (no token read yet)"
            )
        raise _NoCredentialsError(self._auth_error)

    def _start_refresh(self) -> asyncio.Future[None]:
        """Read ``auth_settings()`` on a thread of its own; the future ends when the read has."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        auth = self.auth
        self._auth_began = time.monotonic()
        self._auth_late = False

        def read() -> None:
            try:
                settings = auth.auth_settings()
                value = str((settings.get("BearerToken") or {}).get("value") or "")
                outcome: tuple[str | None, str] = (value, "")
            except Exception as exc:  # e.g. an exec credential plugin that failed
                outcome = (None, f"{type(exc).__name__}: {str(exc)[:200]}")
            with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
                loop.call_soon_threadsafe(self._refreshed, done, *outcome)

        threading.Thread(target=read, name="kube-credentials", daemon=True).start()
        return done

    def _refreshed(self, done: asyncio.Future[None], value: str | None, error: str) -> None:
        """On the loop: a read ended with ``value`` (None: it failed with ``error``)."""
        if value is not None and not _HEADER_VALUE_RE.fullmatch(value):  # CR, LF, or beyond ASCII
            value, error = None, "the client's token cannot be sent in a header"
        self._auth_refresh = None
        if value is not None:
            self._auth_header = value or None
            self._auth_read = True
            self._auth_at = time.monotonic()
        else:
            self._auth_error = error
            if self._auth_read:  # keep the last token; read again after the interval
                self._auth_at = time.monotonic()
                log.warning("kube_credentials_refresh_failed", error=error, action="keeping the last token")
        if not done.done():
            done.set_result(None)

    # -- connections and answers ------------------------------------------------------------------
    async def _connection(self) -> _Conn:
        """An idle connection standing at an answer's start, else a new one. (One the server closed
        just now, with its close still on the way, can still be taken; its request then fails.)"""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < self.idle_s and conn.usable():
                return conn
            conn.close()
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_HEAD_BYTES, loop=loop)
        protocol = _Counting(reader, loop=loop)
        async with asyncio.timeout(self.connect_s):
            transport, _ = await loop.create_connection(
                lambda: protocol,
                self.host,
                self.port,
                ssl=self.tls,
                server_hostname=self.server_hostname if self.tls is not None else None,
            )
        self.opened += 1
        return _Conn(reader, asyncio.StreamWriter(transport, protocol, reader, loop), protocol)

    async def _answer(self, conn: _Conn) -> tuple[int, bytes]:
        """Status and body of the final answer, interim (1xx) heads skipped. What the answer took is
        counted in ``conn.taken``; whatever else arrived is ``conn.unread`` (the connection's end)."""
        reader = conn.reader
        for interim in range(MAX_INTERIM_ANSWERS + 1):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise _BrokenAnswerError("the connection closed inside the answer's head") from None
                if interim:
                    raise _BrokenAnswerError("the connection closed after an interim (1xx) answer") from None
                raise _NoAnswerError("the connection closed before an answer") from None
            except asyncio.LimitOverrunError:
                raise _BrokenAnswerError(f"an answer head over {MAX_HEAD_BYTES} bytes") from None
            except ConnectionResetError:
                raise _NoAnswerError("the connection was reset before an answer") from None
            conn.taken += len(head)
            status, headers = _parse_head(head)
            if status >= 200:
                break
            if status == 101:
                raise _BrokenAnswerError(
                    "a 101 Switching Protocols answer to a request that asked no upgrade"
                )
            # an interim answer (100 Continue, 103 Early Hints): no body; the final answer follows
        else:
            raise _BrokenAnswerError(f"more than {MAX_INTERIM_ANSWERS} interim (1xx) answers")
        encoding = headers.get("transfer-encoding", "").lower()
        try:
            if encoding == "chunked":
                body = await self._chunked(conn)
            elif encoding:
                raise _BrokenAnswerError(f"unsupported Transfer-Encoding {encoding[:40]!r}")
            elif "content-length" in headers:
                length = _length(headers["content-length"])
                if length > self.max_body_bytes:
                    raise _BrokenAnswerError(f"an answer body of {length} bytes, over {self.max_body_bytes}")
                body = await reader.readexactly(length)
                conn.taken += length
            elif status in (204, 304):
                body = b""
            else:  # delimited by the connection's end
                body = b"".join(await self._until(conn, lambda data: (data, False)))
                conn.close()
        except asyncio.IncompleteReadError:
            raise _BrokenAnswerError("the connection closed inside the answer's body") from None
        tokens = {t.strip() for t in headers.get("connection", "").lower().split(",")}
        if "close" in tokens or (head.startswith(b"HTTP/1.0 ") and "keep-alive" not in tokens):
            conn.close()  # the server ends the connection after this answer
        return status, body

    async def _chunked(self, conn: _Conn) -> bytes:
        """The de-chunked body (:class:`~topology.kube.client.Dechunker`, the watches' own); bytes that
        came past its end are left unread (``conn.unread``)."""
        dechunker = Dechunker()
        seen = 0

        def feed(data: bytes) -> tuple[bytes, bool]:
            nonlocal seen
            try:
                part = dechunker.feed(data)
            except ValueError as exc:
                raise _BrokenAnswerError(str(exc)) from None
            seen += len(part)
            if seen + dechunker.pending > self.max_body_bytes:  # a chunk announced too big: not read
                raise _BrokenAnswerError(f"an answer body over {self.max_body_bytes} bytes")
            return part, dechunker.done

        parts = await self._until(conn, feed)
        if not dechunker.done:
            raise _BrokenAnswerError("the connection closed inside the answer's body")
        conn.taken -= len(dechunker.rest)
        return b"".join(parts)

    async def _until(self, conn: _Conn, take: Callable[[bytes], tuple[bytes, bool]]) -> list[bytes]:
        """Body bytes as ``take`` makes them of what arrives, until it says the body ended or the
        connection does; more than ``max_body_bytes`` is an error."""
        parts: list[bytes] = []
        total = 0
        while data := await conn.reader.read(64 * 1024):
            conn.taken += len(data)
            part, ended = take(data)
            total += len(part)
            if total > self.max_body_bytes:
                raise _BrokenAnswerError(f"an answer body over {self.max_body_bytes} bytes")
            parts.append(part)
            if ended:
                break
        return parts


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isascii() or not code.isdigit():
        raise _BrokenAnswerError(f"a bad status line {lines[0][:60]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _BrokenAnswerError(f"a bad header line {line[:60]!r}")
        key = name.lower()
        value = value.strip()
        if key in headers and headers[key] != value:
            if key in ("content-length", "transfer-encoding"):
                raise _BrokenAnswerError(f"two {name} headers that disagree")
            value = f"{headers[key]}, {value}"
        headers[key] = value
    return int(code), headers


def _length(text: str) -> int:
    if not text or len(text) > 15 or not text.isascii() or not text.isdigit():
        raise _BrokenAnswerError(f"a bad Content-Length {text[:20]!r}")
    return int(text)


def _message(data: bytes) -> str:
    """The API's ``message`` from a refusal's body, else the start of the body."""
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError):
        message = orjson.loads(data).get("message")
        if message:
            return str(message)[:MAX_MESSAGE_CHARS]
    return data[:200].decode("utf-8", "replace")
