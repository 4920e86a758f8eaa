"""The local cluster's and the cluster benchmark's API-server calls go through ``topology.kube``: each
helper's requests (method, path, content type, query) as an HTTP-level recorder sees them, without the
built counterparts. The same helpers against a real kube-apiserver: tests/e2e/test_control_plane.py."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from agent import localcluster as cluster
from agent.benchmarks import cluster as bench
from topology.kube import KubeError, api_client_from

Answer = tuple[int, str, bytes]  # status, content type, body


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any


@dataclass
class Recorder:
    """An HTTP server that records every request and answers from ``answer`` (default: 200, ``{}``)."""

    answer: Callable[[Seen], Answer] = lambda _: (200, "application/json", b"{}")
    seen: list[Seen] = field(default_factory=list)

    def calls(self) -> list[tuple[str, str]]:
        return [(s.method, s.path) for s in self.seen]


def _status(code: int, message: str) -> Answer:
    body = {"kind": "Status", "code": code, "message": message}
    return code, "application/json", json.dumps(body).encode()


def _json(obj: Any) -> Answer:
    return 200, "application/json", json.dumps(obj).encode()


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[tuple[Recorder, Path]]:
    """The recorder and an admin kubeconfig pointing at it."""
    rec = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            seen = Seen(
                self.command,
                url.path,
                {k: v[0] for k, v in parse_qs(url.query).items()},
                self.headers.get("Content-Type", ""),
                json.loads(raw) if raw else None,
            )
            rec.seen.append(seen)
            code, ctype, body = rec.answer(seen)
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle  # noqa: N815 - http.server's names

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "admin.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    try:
        yield rec, kubeconfig
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class _Stopped:
    def stop(self) -> None:
        return


def _apiserver(kubeconfig: Path) -> cluster.ApiServer:
    return cluster.ApiServer(_Stopped(), "unused", kubeconfig, None)  # type: ignore[arg-type]


def test_apiserver_get_answers_status_and_body_refusals_included(recorder: tuple[Recorder, Path]) -> None:
    rec, kubeconfig = recorder
    rec.answer = lambda s: (
        (200, "text/plain", b"ok") if s.path == "/readyz" else _status(404, f'nodes "{s.path}" not found')
    )
    server = _apiserver(kubeconfig)
    try:
        assert server.get("/readyz") == (200, b"ok")  # plain text, not JSON: undecoded
        status, body = server.get("/api/v1/nodes/n1")
        assert status == 404
        assert json.loads(body)["code"] == 404
    finally:
        server.stop()
    assert rec.calls() == [("GET", "/readyz"), ("GET", "/api/v1/nodes/n1")]


def test_apiserver_get_without_an_answer_is_a_connection_error(tmp_path: Path) -> None:
    """What ``wait_until`` polls through while the API server starts: no answer is an ``OSError``."""
    with socket.socket() as s:  # a loopback port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    kubeconfig = tmp_path / "k"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    server = _apiserver(kubeconfig)
    try:
        with pytest.raises(ConnectionError):
            server.get("/readyz")
    finally:
        server.stop()


def test_register_nodes_creates_then_marks_ready_by_merge_patch(recorder: tuple[Recorder, Path]) -> None:
    rec, kubeconfig = recorder
    with api_client(kubeconfig) as api:
        names = cluster.register_nodes(api, [cluster.fake_gpu_node("n1", gpus=4)])
    assert names == ["n1"]
    assert rec.calls() == [("POST", "/api/v1/nodes"), ("PATCH", "/api/v1/nodes/n1/status")]
    created, patched = rec.seen
    assert "status" not in created.body
    assert created.body["metadata"]["name"] == "n1"
    assert patched.content_type == "application/merge-patch+json"
    status = patched.body["status"]
    assert status["allocatable"]["nvidia.com/gpu"] == "4"
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [("Ready", "True")]


def test_delete_nodes_counts_a_missing_node_as_deleted_and_names_other_refusals(
    recorder: tuple[Recorder, Path],
) -> None:
    rec, kubeconfig = recorder
    rec.answer = lambda s: _status(404, "gone") if s.path.endswith("/a") else _status(500, "etcd is down")
    with api_client(kubeconfig) as api, pytest.raises(KubeError, match="etcd is down") as err:
        cluster.delete_nodes(api, ["a", "b"])
    assert err.value.status == 500
    assert rec.calls() == [("DELETE", "/api/v1/nodes/a"), ("DELETE", "/api/v1/nodes/b")]


def test_apply_crds_applies_server_side_and_waits_for_established(recorder: tuple[Recorder, Path]) -> None:
    rec, kubeconfig = recorder
    reads = {"n": 0}
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/things.example.com"

    def answer(s: Seen) -> Answer:
        if s.method == "GET":
            reads["n"] += 1
            ok = "True" if reads["n"] >= 2 else "False"
            return _json({"status": {"conditions": [{"type": "Established", "status": ok}]}})
        return _json(s.body)

    rec.answer = answer
    crd: dict[str, Any] = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "things.example.com"},
    }
    with api_client(kubeconfig) as api:
        assert cluster.apply_crds(api, [crd], timeout_s=30) == ["things.example.com"]
    applied = rec.seen[0]
    assert (applied.method, applied.path) == ("PATCH", path)
    assert applied.content_type == "application/apply-patch+yaml"
    assert applied.query == {"fieldManager": "gpu-node-agent", "force": "true"}
    assert rec.calls()[1:] == [("GET", path), ("GET", path)]  # read until Established


def test_open_queue_merge_patches_the_queue_status(recorder: tuple[Recorder, Path]) -> None:
    rec, kubeconfig = recorder
    cluster.open_queue(_apiserver(kubeconfig), "default")
    (seen,) = rec.seen
    assert (seen.method, seen.path) == ("PATCH", "/apis/scheduling.volcano.sh/v1beta1/queues/default/status")
    assert seen.content_type == "application/merge-patch+json"
    assert seen.body == {"status": {"state": "Open"}}


def test_benchmark_pods_through_the_adapter(recorder: tuple[Recorder, Path]) -> None:
    rec, kubeconfig = recorder
    pods = {
        "kind": "PodList",
        "metadata": {"resourceVersion": "7"},
        "items": [
            {"metadata": {"name": "g-0"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}},
            {"metadata": {"name": "g-1"}, "spec": {}},
            {"metadata": {"name": "other"}, "spec": {}, "status": {"phase": "Pending"}},
        ],
    }

    def answer(s: Seen) -> Answer:
        if s.method == "POST" and s.path == "/api/v1/namespaces":
            return _status(409, "already exists")
        return _json(pods) if s.method == "GET" else _json({})

    rec.answer = answer
    with api_client(kubeconfig) as api:
        bench.ensure_namespace(api, "bench")  # 409: there already
        bench.create_pods(api, "bench", bench.extender_gang("g", 2))
        assert bench.list_pods(api, "bench", "g-") == {
            "g-0": bench.PodView("g-0", "n1", "Running"),
            "g-1": bench.PodView("g-1", None, None),
        }
        bench.delete_podgroups(api, "bench")
    posts = sorted(
        s.body["metadata"]["name"]
        for s in rec.seen
        if s.path == "/api/v1/namespaces/bench/pods" and s.method == "POST"
    )
    assert posts == ["g-0", "g-1"]
    assert ("DELETE", "/apis/scheduling.volcano.sh/v1beta1/namespaces/bench/podgroups") in rec.calls()


def test_benchmark_untaints_only_the_named_nodes_that_carry_taints(recorder: tuple[Recorder, Path]) -> None:
    rec, kubeconfig = recorder
    taint = [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
    nodes = {
        "kind": "NodeList",
        "metadata": {"resourceVersion": "3"},
        "items": [
            {
                "metadata": {"name": "a"},
                "spec": {"taints": taint},
                "status": {"allocatable": {"nvidia.com/gpu": "4"}},
            },
            {"metadata": {"name": "b"}, "spec": {}},
            {"metadata": {"name": "c"}, "spec": {"taints": taint}},
        ],
    }
    rec.answer = lambda s: _json(nodes) if s.method == "GET" else _json({})
    with api_client(kubeconfig) as api:
        bench._untaint(api, ["a", "b"])
        assert bench._gpu_allocatable(api) == {"a": 4, "b": 0, "c": 0}
    patches = [s for s in rec.seen if s.method == "PATCH"]
    assert [(s.path, s.content_type, s.body) for s in patches] == [
        ("/api/v1/nodes/a", "application/merge-patch+json", {"spec": {"taints": None}})
    ]


def test_webhook_configurations_have_their_collections() -> None:
    assert cluster._webhook_configurations("MutatingWebhookConfiguration").endswith(
        "/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    )
    assert cluster._webhook_configurations("ValidatingWebhookConfiguration").endswith(
        "/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    )


def api_client(kubeconfig: Path) -> Any:
    return api_client_from(str(kubeconfig))
