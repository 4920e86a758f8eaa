"""Requests on an event loop: the API calls a server makes while it answers its own clients.

:class:`AsyncKube` sends small JSON requests (the extender's pod bindings) straight from the event loop
over a few kept-alive HTTP/1.1 connections to the API server, with the same server, TLS settings and
credentials as the injected ``ApiClient`` (:func:`~topology.kube.client.api_client_from`). No worker
thread and no client serializer per request: a binding costs one write and one read of a few hundred
bytes, and many can be in flight at once (up to ``max_connections``, the rest wait for a connection).

- the credentials are the client's own (``Configuration.auth_settings()``: a bearer token, refreshed by
  its hook, e.g. the in-cluster token file or an exec plugin); they are read in a worker thread at most
  every ``auth_refresh_s``, so a hook that runs a program never blocks the loop;
- every request is bounded: a connection within ``connect_s``, the whole answer within ``timeout_s``,
  a head of at most :data:`MAX_HEAD_BYTES` and a body of at most ``max_body_bytes``; an answer that
  breaks HTTP (a bad status line or length, broken chunks) is a :class:`KubeError` with status 0
  naming what was wrong, and that connection is dropped;
- a kept-alive connection that the server closed while it was idle is noticed when the request on it
  gets no byte of an answer; that request is sent once more on a new connection (as Go's client does
  for a connection it reused), never a request that got part of an answer;
- a refusal (non-2xx) is a :class:`KubeError` with the API's status and its ``message``.

Configurations this does not speak (an HTTP proxy, basic auth) give ``None`` from
:meth:`AsyncKube.from_api_client`; the caller then keeps the synchronous client.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from topology.kube.client import Dechunker, KubeError, binding

MAX_HEAD_BYTES = 64 * 1024
_HEADER_VALUE_RE = re.compile(r"[\x20-\x7e]{0,16384}")
MAX_BODY_BYTES = 4 * 1024 * 1024
USER_AGENT = "gpu-node-agent"


class _BrokenAnswerError(Exception):
    """The server's answer broke HTTP, or the connection ended inside it."""


class _NoCredentialsError(Exception):
    """The client's credentials could not be read (its refresh hook failed)."""


class _NoAnswerError(Exception):
    """The connection ended before any byte of an answer (a kept-alive one the server closed)."""


class _Conn:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

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
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        """``auth``: a ``kubernetes.client.Configuration`` whose ``auth_settings()`` gives the bearer token
        (None: no Authorization header). ``idle_s``: a connection idle longer is closed rather than
        reused (below the API server's own keep-alive timeout)."""
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
        self.max_body_bytes = max_body_bytes
        self.opened = 0  # connections opened so far (kept-alive reuse shows as few)
        self._idle: list[_Conn] = []
        self._slots: asyncio.Semaphore | None = None  # made on the loop that first uses it
        self._auth_header: str | None = None
        self._auth_at = -1e18
        self._auth_lock: asyncio.Lock | None = None
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
    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Bind a pod to a node (``pods/binding``); ``uid`` (when given) guards against a re-created pod."""
        meta: dict[str, str] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.request("POST", binding(namespace, name), body)

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
        except (OSError, _BrokenAnswerError, _NoAnswerError, _NoCredentialsError) as exc:
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
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        async with self._slots:
            head = await self._head(method, path, len(payload))
            for attempt in range(2):
                conn, reused = await self._connection()
                try:
                    conn.writer.write(head + payload)
                    status, data, keep = await self._answer(conn.reader)
                except _NoAnswerError:
                    conn.close()
                    if reused and attempt == 0:
                        continue  # the server closed it while idle: once more, on a new connection
                    raise
                except BaseException:
                    conn.close()
                    raise
                if keep:
                    conn.idle_since = time.monotonic()
                    self._idle.append(conn)
                else:
                    conn.close()
                return status, data
        raise AssertionError("unreachable")  # pragma: no cover

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

    async def _authorization(self) -> str | None:
        if self.auth is None:
            return None
        if time.monotonic() - self._auth_at < self.auth_refresh_s:
            return self._auth_header
        if self._auth_lock is None:
            self._auth_lock = asyncio.Lock()
        async with self._auth_lock:
            if time.monotonic() - self._auth_at >= self.auth_refresh_s:
                try:
                    settings = await asyncio.to_thread(self.auth.auth_settings)
                except Exception as exc:  # e.g. an exec credential plugin that failed
                    raise _NoCredentialsError(f"{type(exc).__name__}: {str(exc)[:200]}") from None
                value = str((settings.get("BearerToken") or {}).get("value") or "")
                if not _HEADER_VALUE_RE.fullmatch(value):  # CR, LF or a character a header cannot carry
                    raise _NoCredentialsError("the client's token cannot be sent in a header")
                self._auth_header = value or None
                self._auth_at = time.monotonic()
        return self._auth_header

    async def _connection(self) -> tuple[_Conn, bool]:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if (
                now - conn.idle_since < self.idle_s
                and not conn.writer.transport.is_closing()
                and not conn.reader.at_eof()
            ):
                return conn, True
            conn.close()
        async with asyncio.timeout(self.connect_s):
            reader, writer = await asyncio.open_connection(
                self.host,
                self.port,
                ssl=self.tls,
                server_hostname=self.server_hostname if self.tls is not None else None,
                limit=MAX_HEAD_BYTES,
            )
        self.opened += 1
        return _Conn(reader, writer), False

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
        """Status, body and whether the connection may be kept."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _NoAnswerError("the connection closed before an answer") from None
            raise _BrokenAnswerError("the connection closed inside the answer's head") from None
        except asyncio.LimitOverrunError:
            raise _BrokenAnswerError(f"an answer head over {MAX_HEAD_BYTES} bytes") from None
        except ConnectionResetError:
            raise _NoAnswerError("the connection was reset before an answer") from None
        status, headers = _parse_head(head)
        encoding = headers.get("transfer-encoding", "").lower()
        keep = headers.get("connection", "").lower() != "close"
        try:
            if encoding == "chunked":
                body, over = await self._chunked(reader)
                keep = keep and not over  # bytes past the body: the stream is not where it should be
            elif encoding:
                raise _BrokenAnswerError(f"unsupported Transfer-Encoding {encoding[:40]!r}")
            elif "content-length" in headers:
                length = _length(headers["content-length"])
                if length > self.max_body_bytes:
                    raise _BrokenAnswerError(f"an answer body of {length} bytes, over {self.max_body_bytes}")
                body = await reader.readexactly(length)
            elif status in (204, 304) or 100 <= status < 200:
                body = b""
            else:  # delimited by the connection's end
                body = b"".join(await self._until(reader, lambda data: (data, False)))
                keep = False
        except asyncio.IncompleteReadError:
            raise _BrokenAnswerError("the connection closed inside the answer's body") from None
        return status, body, keep

    async def _chunked(self, reader: asyncio.StreamReader) -> tuple[bytes, bool]:
        """The de-chunked body (:class:`~topology.kube.client.Dechunker`, the watches' own) and whether
        bytes came past its end."""
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

        parts = await self._until(reader, feed)
        if not dechunker.done:
            raise _BrokenAnswerError("the connection closed inside the answer's body")
        return b"".join(parts), bool(dechunker.rest)

    async def _until(
        self, reader: asyncio.StreamReader, take: Callable[[bytes], tuple[bytes, bool]]
    ) -> list[bytes]:
        """Body bytes as ``take`` makes them of what arrives, until it says the body ended or the
        connection does; more than ``max_body_bytes`` is an error."""
        parts: list[bytes] = []
        total = 0
        while data := await reader.read(64 * 1024):
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
            return str(message)[:300]
    return data[:200].decode("utf-8", "replace")
