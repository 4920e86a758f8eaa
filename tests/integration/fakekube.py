"""A small fake Kubernetes API server at the HTTP level, for the extender and ``plan --from-cluster``.

It serves what those call: list and watch of nodes, pods (all namespaces), Volcano HyperNodes and
PodGroups; ``POST pods/{name}/binding``; ``POST events``. Objects are plain JSON; every change gets
a new ``resourceVersion`` and is streamed to open watches. The real ``kubernetes`` client talks to it.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

PATHS = {
    "/api/v1/nodes": "nodes",
    "/api/v1/pods": "pods",
    "/apis/topology.volcano.sh/v1alpha1/hypernodes": "hypernodes",
    "/apis/scheduling.volcano.sh/v1beta1/podgroups": "podgroups",
}


def _key(kind: str, obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    if kind in ("pods", "podgroups"):
        return f"{meta.get('namespace') or 'default'}/{meta['name']}"
    return str(meta["name"])


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients (watches being stopped) hang up at will; that is not an error here."""


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {k: {} for k in PATHS.values()}
        self.log: list[tuple[int, str, str, dict[str, Any]]] = []
        self.rv = 100
        self.events: list[dict[str, Any]] = []
        self.bindings: list[tuple[str, str]] = []  # (pod key, node)
        self.fail_bindings: set[str] = set()  # pod keys whose binding answers 500
        self.requests: list[tuple[str, str]] = []
        self.cond = threading.Condition()
        self.stopping = False
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- objects ---------------------------------------------------------------------------------
    def put(self, kind: str, obj: dict[str, Any]) -> None:
        with self.cond:
            obj = copy.deepcopy(obj)
            key = _key(kind, obj)
            event = "MODIFIED" if key in self.objects[kind] else "ADDED"
            self.rv += 1
            obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
            obj["metadata"].setdefault("uid", f"uid-{key.replace('/', '-')}")
            self.objects[kind][key] = obj
            self.log.append((self.rv, kind, event, copy.deepcopy(obj)))
            self.cond.notify_all()

    def delete(self, kind: str, key: str) -> None:
        with self.cond:
            obj = self.objects[kind].pop(key)
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.log.append((self.rv, kind, "DELETED", obj))
            self.cond.notify_all()

    def get(self, kind: str, key: str) -> dict[str, Any]:
        with self.cond:
            return copy.deepcopy(self.objects[kind][key])

    # -- server ----------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                fake.requests.append(("GET", url.path))
                kind = PATHS.get(url.path)
                if kind is None:
                    self._send(
                        404, {"kind": "Status", "code": 404, "reason": "NotFound", "message": url.path}
                    )
                    return
                if q.get("watch") in ("true", "1", "True"):
                    self._watch(
                        kind, int(q.get("resourceVersion") or 0), float(q.get("timeoutSeconds") or 30)
                    )
                    return
                with fake.cond:
                    items = [copy.deepcopy(o) for _, o in sorted(fake.objects[kind].items())]
                    rv = fake.rv
                self._send(
                    200,
                    {
                        "kind": "List",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(rv)},
                        "items": items,
                    },
                )

            def _watch(self, kind: str, since: int, timeout_s: float) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                deadline = time.monotonic() + min(timeout_s, 30)
                seen = since
                try:
                    while True:
                        with fake.cond:
                            pending = [e for e in fake.log if e[0] > seen and e[1] == kind]
                            if not pending:
                                left = deadline - time.monotonic()
                                if left <= 0 or fake.stopping:
                                    break
                                fake.cond.wait(min(left, 0.2))
                                continue
                        for rv, _, typ, obj in pending:
                            line = json.dumps({"type": typ, "object": obj}).encode() + b"\n"
                            self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                            seen = rv
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

            def do_POST(self) -> None:
                url = urlparse(self.path)
                fake.requests.append(("POST", url.path))
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                parts = url.path.strip("/").split("/")
                # /api/v1/namespaces/{ns}/pods/{name}/binding
                if (
                    len(parts) == 7
                    and parts[:3] == ["api", "v1", "namespaces"]
                    and parts[4] == "pods"
                    and parts[6] == "binding"
                ):
                    ns, name = parts[3], parts[5]
                    key = f"{ns}/{name}"
                    node = (body.get("target") or {}).get("name")
                    with fake.cond:
                        pod = fake.objects["pods"].get(key)
                    if pod is None:
                        self._send(
                            404,
                            {"kind": "Status", "code": 404, "reason": "NotFound", "message": f"pod {key}"},
                        )
                        return
                    if key in fake.fail_bindings:
                        self._send(
                            500,
                            {"kind": "Status", "code": 500, "reason": "InternalError", "message": "injected"},
                        )
                        return
                    if (pod.get("spec") or {}).get("nodeName"):
                        self._send(
                            409,
                            {"kind": "Status", "code": 409, "reason": "Conflict", "message": "already bound"},
                        )
                        return
                    pod["spec"]["nodeName"] = node
                    # as the API server does: a Binding's annotations are copied to the pod
                    given = (body.get("metadata") or {}).get("annotations") or {}
                    if given:
                        pod["metadata"]["annotations"] = {
                            **(pod["metadata"].get("annotations") or {}),
                            **given,
                        }
                    fake.put("pods", pod)
                    with fake.cond:
                        fake.bindings.append((key, node))
                    self._send(201, {"kind": "Status", "status": "Success", "code": 201})
                    return
                # /api/v1/namespaces/{ns}/events
                if len(parts) == 5 and parts[4] == "events":
                    with fake.cond:
                        fake.events.append(body)
                    self._send(201, body)
                    return
                self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound", "message": url.path})

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)


def node(name: str, gpus: int, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(
    name: str,
    gpus: int,
    *,
    namespace: str = "default",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "annotations": annotations or {},
            "labels": labels or {},
        },
        "spec": {
            "schedulerName": "gpu-topology-scheduler",
            "nodeName": node_name,
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {},
                }
            ],
        },
        "status": {"phase": "Pending" if node_name is None else "Running"},
    }


def hypernode(
    name: str, tier: int, tier_name: str, members: list[str], *, member_type: str = "Node"
) -> dict[str, Any]:
    return {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": name},
        "spec": {
            "tier": tier,
            "tierName": tier_name,
            "members": [{"type": member_type, "selector": {"exactMatch": {"name": m}}} for m in members],
        },
    }
