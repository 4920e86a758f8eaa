"""The kube-scheduler extender HTTP API over the pure ``ClusterState``: filter, prioritize, bind.

Wire format (kube-scheduler ``extender/v1``; the Go structs have no JSON tags, so keys are the Go
field names): ``ExtenderArgs{Pod, Nodes, NodeNames}`` in, ``ExtenderFilterResult{Nodes, NodeNames,
FailedNodes, FailedAndUnresolvableNodes, Error}`` out; ``[{"Host", "Score"}]`` for prioritize;
``ExtenderBindingArgs{PodName, PodNamespace, PodUID, Node}`` in, ``{"Error"}`` out for bind.

The server is a small asyncio HTTP/1.1 server (keep-alive, ``Content-Length`` bodies only, bounded
headers and body). Bad input never stops it: undecodable JSON gets HTTP 400 with ``{"Error": ...}``;
input that decodes but makes no sense gets HTTP 200 with ``Error`` set, which kube-scheduler treats
as a failed call for the pod. Bind calls of a gang wait at the barrier (an open request each) until
the gang completes or its deadline passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from scheduler_plugin.state import BindDecision, ClusterState, EventRecord
from topology import logs

log = logs.get_logger("scheduler_plugin.extender")

MAX_HEADER_BYTES = 16 * 1024
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class Cluster(Protocol):
    """The API calls the extender makes (in production, ``topology.kube`` behind the command's root)."""

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...

    def event(self, pod: Mapping[str, Any], *, reason: str, message: str, warning: bool) -> None: ...


class BadRequestError(ValueError):
    pass


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequestError(f"{what}: expected a JSON object")
    return value


def _node_names(args: Mapping[str, Any]) -> tuple[list[str], list[dict[str, Any]] | None]:
    """Candidate node names, and the Node objects when the scheduler sent full ones."""
    names = args.get("NodeNames")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadRequestError("NodeNames: expected a list of strings")
        return list(names), None
    nodes = args.get("Nodes")
    if nodes is None:
        return [], None
    items = _obj(nodes, "Nodes").get("items") or []
    if not isinstance(items, list):
        raise BadRequestError("Nodes.items: expected a list")
    objs = [_obj(n, f"Nodes.items[{i}]") for i, n in enumerate(items)]
    return [str((n.get("metadata") or {}).get("name", "")) for n in objs], objs


def _pod(args: Mapping[str, Any]) -> dict[str, Any]:
    pod = _obj(args.get("Pod"), "Pod")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise BadRequestError("Pod.metadata.name: missing")
    return pod


@dataclass
class _Waiter:
    key: str
    future: asyncio.Future[str]


class Extender:
    """Request handlers. Every touch of ``state`` holds ``lock`` (informer threads share it)."""

    def __init__(
        self,
        *,
        state: ClusterState,
        cluster: Cluster,
        lock: threading.Lock | None = None,
        clock: Callable[[], float] = time.monotonic,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.state = state
        self.cluster = cluster
        self.lock = lock or threading.Lock()
        self.clock = clock
        self.ready = ready
        self._waiters: dict[str, list[_Waiter]] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- verbs ---------------------------------------------------------------------------------
    async def filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        pod = _pod(args)
        names, objs = _node_names(args)
        with self.lock:
            out = self.state.filter(pod, names, self.clock())
        self._record(out.events)
        passed = set(out.passed)
        result: dict[str, Any] = {
            "Nodes": None,
            "NodeNames": None,
            "FailedNodes": out.failed,
            "FailedAndUnresolvableNodes": out.unresolvable,
            "Error": out.error,
        }
        if objs is None:
            result["NodeNames"] = [n for n in names if n in passed]
        else:
            result["Nodes"] = {
                "items": [o for o, n in zip(objs, names, strict=True) if n in passed],
            }
        return result

    async def prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        pod = _pod(args)
        names, _ = _node_names(args)
        with self.lock:
            scores = self.state.prioritize(pod, names, self.clock())
        return [{"Host": h, "Score": s} for h, s in scores]

    async def bind(self, args: Mapping[str, Any]) -> dict[str, Any]:
        fields = {}
        for k in ("PodName", "PodNamespace", "PodUID", "Node"):
            v = args.get(k, "")
            if not isinstance(v, str):
                raise BadRequestError(f"{k}: expected a string")
            fields[k] = v
        if not fields["PodName"] or not fields["Node"]:
            raise BadRequestError("PodName and Node are required")
        key = f"{fields['PodNamespace'] or 'default'}/{fields['PodName']}"
        with self.lock:
            decision = self.state.bind(
                fields["PodNamespace"], fields["PodName"], fields["PodUID"], fields["Node"], self.clock()
            )
        return {"Error": await self._carry_out(decision, key)}

    # -- the barrier ---------------------------------------------------------------------------
    async def _carry_out(self, decision: BindDecision, key: str) -> str:
        self._record(decision.events)
        if decision.action == "error":  # this pod only; the rest of its gang keeps waiting
            return decision.error
        if decision.action == "bind":
            errors = await self._bind_all(decision)
            self._resolve(decision.gang, errors, "")
            return errors.get(key, "")
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(decision.gang, []).append(_Waiter(key, fut))
        while True:
            timeout = max(0.0, decision.deadline - self.clock())
            try:
                return await asyncio.wait_for(asyncio.shield(fut), timeout)
            except TimeoutError:
                if fut.done():
                    return fut.result()
                with self.lock:
                    decision = self.state.barrier_timeout(decision.gang, self.clock())
                if decision.action == "wait":
                    continue
                self._record(decision.events)
                if decision.action == "bind":
                    errors = await self._bind_all(decision)
                    self._resolve(decision.gang, errors, "")
                else:
                    self._resolve(decision.gang, {}, decision.error)
                return await fut

    async def _bind_all(self, decision: BindDecision) -> dict[str, str]:
        async def one(key: str, uid: str, node: str) -> tuple[str, str]:
            ns, name = key.split("/", 1)
            try:
                await asyncio.to_thread(self.cluster.bind, ns, name, uid, node)
            except Exception as exc:  # an API failure is that pod's bind error
                return key, f"binding {key} to {node} failed: {_short(exc)}"
            return key, ""

        results = await asyncio.gather(*(one(*p) for p in decision.pods))
        errors = {k: e for k, e in results if e}
        if errors:
            with self.lock:
                self.state.bind_failed(decision.gang, errors)
            log.warning("bind_failed", gang=decision.gang, errors=errors)
        else:
            log.info("pods_bound", gang=decision.gang or None, pods=[k for k, _, _ in decision.pods])
        if not decision.gang:
            with self.lock:
                for k, _, n in decision.pods:
                    if k not in errors:
                        self.state.assume_bound(k, n)
        return errors

    def _resolve(self, gang: str, errors: Mapping[str, str], error: str) -> None:
        for w in self._waiters.pop(gang, []) if gang else []:
            if not w.future.done():
                w.future.set_result(errors.get(w.key, error))

    def _record(self, events: tuple[EventRecord, ...] | list[EventRecord]) -> None:
        for ev in events:
            task = asyncio.get_running_loop().create_task(self._send_event(ev))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _send_event(self, ev: EventRecord) -> None:
        try:
            await asyncio.to_thread(
                self.cluster.event, ev.pod, reason=ev.reason, message=ev.message, warning=ev.warning
            )
        except Exception as exc:  # an Event that cannot be recorded is logged, never fatal
            log.warning("event_failed", reason=ev.reason, error=_short(exc))

    async def drain(self) -> None:
        """Answer every waiting bind with an error (shutdown) and let pending Events finish."""
        for gang in list(self._waiters):
            self._resolve(gang, {}, "extender shutting down")
        if self._background:
            await asyncio.wait(list(self._background), timeout=5)

    # -- HTTP dispatch -------------------------------------------------------------------------
    async def dispatch(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        route = path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if method == "GET" and route in ("healthz", "livez"):
            return 200, {"status": "ok"}
        if method == "GET" and route == "readyz":
            ok = self.ready()
            return (200 if ok else 503), {"status": "ok" if ok else "informers not synced"}
        handlers = {"filter": self.filter, "prioritize": self.prioritize, "bind": self.bind}
        handler = handlers.get(route)
        if handler is None:
            return 404, {"Error": f"unknown path {path}; POST filter, prioritize or bind"}
        if method != "POST":
            return 405, {"Error": f"{route}: POST only"}
        try:
            args = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return 400, {"Error": f"{route}: body is not JSON: {exc}"}
        try:
            return 200, await handler(_obj(args, "body"))
        except BadRequestError as exc:
            log.warning("bad_request", verb=route, error=str(exc))
            if route == "prioritize":
                return 400, {"Error": f"{route}: {exc}"}
            return 200, {"Error": f"{route}: {exc}"}
        except Exception as exc:  # a bug answers this request, never stops the server
            log.exception("handler_failed", verb=route)
            return 500, {"Error": f"{route}: internal error: {_short(exc)}"}


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


class ExtenderServer:
    """An asyncio HTTP/1.1 server for ``Extender.dispatch``; ``start``/``stop`` for tests and main."""

    def __init__(self, extender: Extender, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.extender = extender
        self.max_body_bytes = max_body_bytes
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        sock = self._server.sockets[0]
        return int(sock.getsockname()[1])

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEADER_BYTES)

    async def stop(self, grace_s: float = 5.0) -> None:
        if self._server is not None:
            self._server.close()
        await self.extender.drain()
        if self._conns:
            _, pending = await asyncio.wait(list(self._conns), timeout=grace_s)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
        try:
            while True:
                keep = await self._one(reader, writer)
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if task is not None:
                self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            await self._reply(writer, 431, {"Error": "request headers too large"}, keep=False)
            return False
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._reply(writer, 400, {"Error": "malformed request line"}, keep=False)
            return False
        method, path, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                await self._reply(writer, 400, {"Error": "malformed header"}, keep=False)
                return False
            headers[name.strip().lower()] = value.strip()
        keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            await self._reply(
                writer, 411, {"Error": "chunked bodies are not accepted; send Content-Length"}, keep=False
            )
            return False
        try:
            length = int(headers.get("content-length", "0"))
            if length < 0:
                raise ValueError
        except ValueError:
            await self._reply(writer, 400, {"Error": "bad Content-Length"}, keep=False)
            return False
        if length > self.max_body_bytes:
            await self._reply(
                writer,
                413,
                {"Error": f"body of {length} bytes is over the {self.max_body_bytes}-byte limit"},
                keep=False,
            )
            return False
        body = await reader.readexactly(length) if length else b""
        status, payload = await self.extender.dispatch(method, path, body)
        await self._reply(writer, status, payload, keep=keep)
        return keep

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, status: int, payload: Any, *, keep: bool) -> None:
        data = json.dumps(payload, separators=(",", ":")).encode()
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n"
            f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + data)
        await writer.drain()
