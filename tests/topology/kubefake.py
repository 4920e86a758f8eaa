"""A small Kubernetes API server fake, at the HTTP level, on loopback.

Enough of the REST API for the topology controller and the agent's publisher: list (with label
selectors), watch (JSON lines, resourceVersion, timeoutSeconds), get, create (incl. generateName),
replace (optimistic concurrency), delete, and server-side apply (``application/apply-patch+yaml``)
with per-manager ownership so fields a manager stops sending are removed. ``/status`` subresources are
separate. Faults: ``down`` answers 503 to everything; ``missing`` collections answer 404 (a CRD not
installed); a watch from a resourceVersion below ``compacted`` gets an ``ERROR`` event with code 410
(Gone), as after etcd compaction. Every request is logged in ``requests`` as ``(method, path)``.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

COLLECTIONS = (
    "/api/v1/nodes",
    "/apis/topology.gpuagent.dev/v1alpha1/gpunodes",
    "/apis/topology.volcano.sh/v1alpha1/hypernodes",
    "/apis/topology.gpuagent.dev/v1alpha1/nvlinkdomains",
    "/api/v1/pods",  # every namespace; pods are seeded here by name
)
NAMESPACED = (
    ("/api/v1/namespaces/", "/configmaps"),
    ("/apis/coordination.k8s.io/v1/namespaces/", "/leases"),
    ("/api/v1/namespaces/", "/events"),
)


def _remove_dropped(target: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in old.items():
        if key not in new:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(new[key], dict) and isinstance(target.get(key), dict):
            _remove_dropped(target[key], value, new[key])


def _merge(target: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class FakeKube:
    def __init__(self, *, chunked: bool = False) -> None:
        # chunked: watches in HTTP/1.1 chunked coding, as the API server sends them (each event's size
        # line and data flushed apart, so a reader sees the framing split); else ended by closing
        self.chunked = chunked
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}
        self.applied: dict[tuple[str, str, str, bool], dict[str, Any]] = {}  # (coll, name, manager, status)
        self.events: list[tuple[int, str, str, dict[str, Any]]] = []  # (rv, collection, type, obj)
        self.rv = itertools.count(100)
        self.cond = threading.Condition()
        self.requests: list[tuple[str, str]] = []
        self.down = False
        self.missing: set[str] = set()
        self.compacted = 0
        self.server: ThreadingHTTPServer | None = None

    # -- store -------------------------------------------------------------------------------
    def _collection(self, path: str) -> tuple[str, str | None, bool] | None:
        parts = path.rstrip("/")
        status = parts.endswith("/status")
        if status:
            parts = parts[: -len("/status")]
        for coll in COLLECTIONS:
            if parts == coll:
                return coll, None, status
            if parts.startswith(coll + "/"):
                return coll, parts[len(coll) + 1 :], status
        for prefix, suffix in NAMESPACED:
            if parts.startswith(prefix):
                rest = parts[len(prefix) :]
                ns, _, _tail = rest.partition("/")
                coll = f"{prefix}{ns}{suffix}"
                if parts == coll:
                    return coll, None, status
                if parts.startswith(coll + "/"):
                    return coll, parts[len(coll) + 1 :], status
        return None

    def _record(self, coll: str, kind: str, obj: dict[str, Any]) -> None:
        rv = next(self.rv)
        obj.setdefault("metadata", {})["resourceVersion"] = str(rv)
        self.events.append((rv, coll, kind, copy.deepcopy(obj)))
        self.cond.notify_all()

    def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Seed or overwrite an object directly (as another client would)."""
        with self.cond:
            coll = path
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            existed = meta["name"] in self.objects.setdefault(coll, {})
            self.objects[coll][meta["name"]] = obj
            self._record(coll, "MODIFIED" if existed else "ADDED", obj)
            return copy.deepcopy(obj)

    def remove(self, path: str, name: str) -> None:
        with self.cond:
            obj = self.objects.get(path, {}).pop(name)
            self._record(path, "DELETED", obj)

    def get(self, path: str, name: str) -> dict[str, Any] | None:
        with self.cond:
            obj = self.objects.get(path, {}).get(name)
            return copy.deepcopy(obj) if obj is not None else None

    def items(self, path: str) -> dict[str, dict[str, Any]]:
        with self.cond:
            return copy.deepcopy(self.objects.get(path, {}))

    def writes(self, path_prefix: str = "") -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.requests if m != "GET" and p.startswith(path_prefix)]

    # -- HTTP ----------------------------------------------------------------------------------
    def handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.requests.append((h.command, url.path))
        if self.down:
            return self._send(h, 503, {"kind": "Status", "message": "apiserver down", "code": 503})
        found = self._collection(url.path)
        if found is None or found[0] in self.missing:
            return self._send(h, 404, {"kind": "Status", "message": f"no route {url.path}", "code": 404})
        coll, name, status = found
        length = int(h.headers.get("Content-Length") or 0)
        body = json.loads(h.rfile.read(length)) if length else None
        if h.command == "GET" and name is None and query.get("watch") == "true":
            return self._watch(h, coll, query)
        with self.cond:
            code, payload = self._dispatch(
                method=h.command,
                coll=coll,
                name=name,
                status=status,
                query=query,
                body=body,
                ctype=h.headers.get("Content-Type", ""),
            )
        self._send(h, code, payload)
        return None

    def _dispatch(
        self,
        *,
        method: str,
        coll: str,
        name: str | None,
        status: bool,
        query: dict[str, str],
        body: Any,
        ctype: str,
    ) -> tuple[int, dict[str, Any]]:
        store = self.objects.setdefault(coll, {})
        if method == "GET" and name is None:
            items = [
                copy.deepcopy(o)
                for _, o in sorted(store.items())
                if self._selected(o, query.get("labelSelector"))
            ]
            rv = str(self.events[-1][0]) if self.events else "1"
            return 200, {"kind": "List", "metadata": {"resourceVersion": rv}, "items": items}
        if method == "GET":
            if name not in store:
                return 404, {"kind": "Status", "code": 404, "message": f"{name} not found"}
            return 200, copy.deepcopy(store[name])
        if method == "POST":
            meta = body.setdefault("metadata", {})
            if "name" not in meta:
                meta["name"] = meta.get("generateName", "obj-") + uuid.uuid4().hex[:5]
            if meta["name"] in store:
                return 409, {"kind": "Status", "code": 409, "message": "already exists"}
            meta["uid"] = str(uuid.uuid4())
            store[meta["name"]] = body
            self._record(coll, "ADDED", body)
            return 201, copy.deepcopy(body)
        if method == "PUT":
            assert name is not None
            cur = store.get(name)
            if cur is None:
                return 404, {"kind": "Status", "code": 404, "message": "not found"}
            if body["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
                return 409, {"kind": "Status", "code": 409, "message": "conflict"}
            body["metadata"]["uid"] = cur["metadata"].get("uid")
            store[name] = body
            self._record(coll, "MODIFIED", body)
            return 200, copy.deepcopy(body)
        if method == "PATCH":
            assert name is not None
            if ctype != "application/apply-patch+yaml" or "fieldManager" not in query:
                return 415, {"kind": "Status", "code": 415, "message": f"only server-side apply, got {ctype}"}
            manager = query["fieldManager"]
            cur = store.get(name)
            if cur is None and status:
                return 404, {"kind": "Status", "code": 404, "message": f"{name} not found"}
            body = dict(body)
            if status:
                body = {"status": body.get("status", {})}
            else:
                body.pop("status", None)
            key = (coll, name, manager, status)
            old = self.applied.get(key, {})
            new_obj = (
                copy.deepcopy(cur)
                if cur is not None
                else {"metadata": {"name": name, "uid": str(uuid.uuid4())}}
            )
            _remove_dropped(new_obj, old, body)
            _merge(new_obj, body)
            self.applied[key] = copy.deepcopy(body)
            if cur is not None:
                a = {k: v for k, v in cur.items() if k != "metadata"}
                b = {k: v for k, v in new_obj.items() if k != "metadata"}
                ma = {k: v for k, v in cur["metadata"].items() if k != "resourceVersion"}
                mb = {k: v for k, v in new_obj["metadata"].items() if k != "resourceVersion"}
                if a == b and ma == mb:
                    return 200, copy.deepcopy(cur)  # no-op apply: no new resourceVersion, no event
            store[name] = new_obj
            self._record(coll, "MODIFIED" if cur is not None else "ADDED", new_obj)
            return 200, copy.deepcopy(new_obj)
        if method == "DELETE":
            assert name is not None
            if name not in store:
                return 404, {"kind": "Status", "code": 404, "message": "not found"}
            obj = store.pop(name)
            self._record(coll, "DELETED", obj)
            return 200, {"kind": "Status", "status": "Success"}
        return 405, {"kind": "Status", "code": 405, "message": method}

    @staticmethod
    def _selected(obj: dict[str, Any], selector: str | None) -> bool:
        if not selector:
            return True
        labels = (obj.get("metadata") or {}).get("labels") or {}
        for term in selector.split(","):
            key, _, value = term.partition("=")
            if key not in labels or (value and labels[key] != value):
                return False
        return True

    def _watch(self, h: BaseHTTPRequestHandler, coll: str, query: dict[str, str]) -> None:
        since = int(query.get("resourceVersion") or 0)
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 5)
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        if self.chunked:
            h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def send(event: dict[str, Any]) -> None:
            line = json.dumps(event).encode() + b"\n"
            if not self.chunked:
                h.wfile.write(line)
                return
            h.wfile.write(f"{len(line):x}\r\n".encode() + line[: len(line) // 2])
            h.wfile.flush()
            h.wfile.write(line[len(line) // 2 :] + b"\r\n")

        def end() -> None:
            if self.chunked:
                h.wfile.write(b"0\r\n\r\n")
                h.wfile.flush()

        if since < self.compacted:
            gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
            send({"type": "ERROR", "object": gone})
            end()
            return
        sent = since
        try:
            while time.monotonic() < deadline and self.server is not None:
                with self.cond:
                    pending = [e for e in self.events if e[0] > sent and e[1] == coll]
                    if not pending:
                        self.cond.wait(timeout=min(0.1, max(deadline - time.monotonic(), 0)))
                        continue
                for rv, _, kind, obj in pending:
                    if self._selected(obj, query.get("labelSelector")):
                        send({"type": kind, "object": obj})
                    sent = rv
                h.wfile.flush()
            end()
        except (BrokenPipeError, ConnectionResetError):
            return

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, code: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    # -- lifecycle -------------------------------------------------------------------------------
    @contextmanager
    def serve(self) -> Iterator[str]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.handle(self)

            def do_POST(self) -> None:
                fake.handle(self)

            def do_PUT(self) -> None:
                fake.handle(self)

            def do_PATCH(self) -> None:
                fake.handle(self)

            def do_DELETE(self) -> None:
                fake.handle(self)

            def log_message(self, *args: Any) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self.server = server
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            self.server = None
            with self.cond:
                self.cond.notify_all()
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


def api_client(url: str) -> Any:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = url
    return client.ApiClient(cfg)
