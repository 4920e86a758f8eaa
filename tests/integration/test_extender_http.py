"""The extender over real HTTP on loopback, with a fake Kubernetes API server at the HTTP level
(the real ``kubernetes`` client talks to it): filter / prioritize / bind, the gang barrier, bad input,
and a restart that rebuilds state from the API."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes import client

from agent.commands.extender import Service, Settings
from tests.integration.fakekube import FakeKube, hypernode, node, pod
from tests.integration.pki import ExtenderPki, make_extender_pki
from tests.kubeconfig import write_token_kubeconfig

GANG = "gpuagent.dev/gang"


def gang_pod(
    name: str, rank: int, *, gang: str = "g", size: int = 4, gpus: int = 4, **extra: str
) -> dict[str, Any]:
    ann = {
        GANG: gang,
        "gpuagent.dev/gang-size": str(size),
        "gpuagent.dev/subgroup-size": str(size),
        "gpuagent.dev/subgroup-tier": "nvlink",
        "gpuagent.dev/rank": str(rank),
        **extra,
    }
    return pod(name, gpus, annotations=ann)


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Running:
    """The extender service on its own event loop thread."""

    def __init__(
        self,
        fake: FakeKube,
        *,
        barrier_timeout_s: float = 30.0,
        max_body: int = 1 << 20,
        pki: ExtenderPki | None = None,
        health: bool = False,
    ) -> None:
        settings = Settings(
            host="127.0.0.1",
            port=0,
            kubeconfig=None,
            barrier_timeout_s=barrier_timeout_s,
            reservation_ttl_s=60.0,
            max_body_bytes=max_body,
            watch_timeout_s=1,
            tls_cert=pki.server_cert if pki else None,
            tls_key=pki.server_key if pki else None,
            client_ca=pki.ca if pki else None,
            health_host="127.0.0.1" if health else None,
        )
        self.service = Service(settings, client.ApiClient(client.Configuration(host=fake.url)))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.service.start(), self.loop).result(10)
        wait_for(lambda: all(i.synced.is_set() for i in self.service.informers), "informers")
        self.url = f"{'https' if pki else 'http'}://127.0.0.1:{self.service.server.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.service.stop(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    def post(self, verb: str, body: Any, *, raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}/{verb}", data=data, method="POST")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def filter(self, p: dict[str, Any], names: list[str]) -> dict[str, Any]:
        status, out = self.post("filter", {"Pod": p, "Nodes": None, "NodeNames": names})
        assert status == 200
        return out

    def filter_gang(self, p: dict[str, Any], names: list[str], timeout_s: float = 10.0) -> dict[str, Any]:
        """Filter a gang's pod as kube-scheduler does: refused while its gang is new to the queue, tried
        again (the queue loop's pass that starts the gang nudges it) until the queue has decided."""
        deadline = time.monotonic() + timeout_s
        while True:
            out = self.filter(p, names)
            new = any("is new to the queue" in why for why in (out["FailedNodes"] or {}).values())
            if not new or time.monotonic() > deadline:
                return out
            time.sleep(0.05)

    def bind(self, p: dict[str, Any], node_name: str) -> dict[str, Any]:
        meta = p["metadata"]
        status, out = self.post(
            "bind",
            {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": node_name,
            },
        )
        assert status == 200
        return out

    def state(self, fn: Callable[[Any], Any]) -> Any:
        with self.service.lock:
            return fn(self.service.state)


NODES = [f"r{r}-t{t}" for r in range(2) for t in range(4)]


def known(fake: FakeKube, ext: Running, p: dict[str, Any]) -> dict[str, Any]:
    """Create ``p`` in the API and wait until the extender's informer has it (it decides for no other)."""
    fake.put("pods", p)
    key = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
    wait_for(lambda: ext.state(lambda s: key in s.cache.pods), f"informer sees {key}")
    return p


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    kube = FakeKube()
    for n in NODES:
        kube.put("nodes", node(n, 4))
    for r in range(2):
        kube.put("hypernodes", hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t{t}" for t in range(4)]))
    kube.put("hypernodes", hypernode("leaf-0", 2, "leaf", ["nvl-0", "nvl-1"], member_type="HyperNode"))
    kube.start()
    yield kube
    kube.stop()


@pytest.fixture
def ext(fake: FakeKube) -> Iterator[Running]:
    running = Running(fake, barrier_timeout_s=30.0)
    yield running
    running.stop()


def test_single_pod_filter_prioritize_bind(fake: FakeKube, ext: Running) -> None:
    fake.put("pods", pod("busy", 2, node_name="r0-t0"))
    wait_for(lambda: ext.state(lambda s: "default/busy" in s.cache.pods), "informer sees busy pod")
    p = pod("solo", 4)
    fake.put("pods", p)
    out = ext.filter(p, NODES)
    assert "r0-t0" in out["FailedNodes"]
    assert set(out["NodeNames"]) == set(NODES) - {"r0-t0"}
    assert out["Error"] == ""
    status, scores = ext.post("prioritize", {"Pod": p, "Nodes": None, "NodeNames": ["r0-t1", "r1-t0"]})
    assert status == 200
    by_host = {s["Host"]: s["Score"] for s in scores}
    assert set(by_host) == {"r0-t1", "r1-t0"}
    assert all(0 <= v <= 10 for v in by_host.values())
    # r0 is already in use: prefer it and keep rack 1 whole
    assert by_host["r0-t1"] > by_host["r1-t0"]
    assert ext.bind(p, "r0-t1") == {"Error": ""}
    assert fake.bindings == [("default/solo", "r0-t1")]


def test_filter_with_full_node_objects(fake: FakeKube, ext: Running) -> None:
    p = known(fake, ext, pod("solo", 4))
    status, out = ext.post(
        "filter", {"Pod": p, "Nodes": {"items": [node("r0-t0", 4), node("r1-t0", 4)]}, "NodeNames": None}
    )
    assert status == 200
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["r0-t0", "r1-t0"]
    assert out["NodeNames"] is None


def test_gang_barrier_binds_all_together(fake: FakeKube, ext: Running) -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(4)]
    for p in pods:
        fake.put("pods", p)
    wait_for(lambda: ext.state(lambda s: len(s.cache.pods) == 4), "informer sees the gang")
    planned = {}
    for p in pods:
        out = ext.filter_gang(p, NODES)
        assert len(out["NodeNames"]) == 1, out
        planned[p["metadata"]["name"]] = out["NodeNames"][0]
    assert len({n.split("-")[0] for n in planned.values()}) == 1  # one rack (nvlink domain)
    assert len(set(planned.values())) == 4
    with ThreadPoolExecutor(4) as pool:
        first: list[Future[dict[str, Any]]] = [
            pool.submit(ext.bind, p, planned[p["metadata"]["name"]]) for p in pods[:3]
        ]
        wait_for(
            lambda: ext.state(lambda s: len(s.holds.started["default/g"].arrived) == 3),
            "three at the barrier",
        )
        assert fake.bindings == []  # nobody binds before the last pod arrives
        last = ext.bind(pods[3], planned["w3"])
        results = [f.result(20) for f in first] + [last]
    assert results == [{"Error": ""}] * 4
    assert sorted(fake.bindings) == sorted((f"default/{k}", v) for k, v in planned.items())


def test_gang_barrier_timeout_binds_nothing(fake: FakeKube) -> None:
    ext = Running(fake, barrier_timeout_s=0.5)
    try:
        pods = [gang_pod(f"w{i}", i) for i in range(4)]
        for p in pods:
            fake.put("pods", p)
        wait_for(lambda: ext.state(lambda s: len(s.cache.pods) == 4), "informer sees the gang")
        planned = {p["metadata"]["name"]: ext.filter_gang(p, NODES)["NodeNames"][0] for p in pods}
        with ThreadPoolExecutor(2) as pool:
            futs = [pool.submit(ext.bind, p, planned[p["metadata"]["name"]]) for p in pods[:2]]
            results = [f.result(20) for f in futs]
        assert all("nothing bound" in r["Error"] for r in results), results
        assert fake.bindings == []
        wait_for(lambda: any(e.get("reason") == "GangBarrierTimeout" for e in fake.events), "timeout Event")
        # the gang still waits: the nodes it was planned on stay held for it, not given to a pod on its
        # own filtered before the queue decides again
        solo = known(fake, ext, pod("solo", 4))
        assert not set(ext.filter(solo, NODES)["NodeNames"]) & set(planned.values())
        # once the gang is gone the GPUs are free again
        for p in pods:
            fake.delete("pods", f"{p['metadata']['namespace']}/{p['metadata']['name']}")
        wait_for(lambda: set(ext.filter(solo, NODES)["NodeNames"]) == set(NODES), "the planned nodes free")
    finally:
        ext.stop()


def test_impossible_gang_binds_nothing_and_records_why(fake: FakeKube, ext: Running) -> None:
    pods = [gang_pod(f"big{i}", i, gang="big", size=5) for i in range(5)]  # 5 trays in a 4-tray rack
    for p in pods:
        fake.put("pods", p)
    wait_for(lambda: ext.state(lambda s: len(s.cache.pods) == 5), "informer sees the gang")
    out = ext.filter_gang(pods[0], NODES)
    assert out["NodeNames"] == []
    assert set(out["FailedNodes"]) == set(NODES)
    assert "nvlink" in next(iter(out["FailedNodes"].values()))
    wait_for(lambda: any(e.get("reason") == "GangUnschedulable" for e in fake.events), "Event on the pod")
    ev = next(e for e in fake.events if e.get("reason") == "GangUnschedulable")
    assert ev["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "big0",
        "namespace": "default",
        "uid": "uid-default-big0",
    }
    assert ev["type"] == "Warning"
    assert ev["source"] == {"component": "gpu-topology-extender"}
    assert ev["metadata"]["namespace"] == "default"
    assert ev["count"] == 1
    assert ext.bind(pods[0], "r0-t0")["Error"]
    assert fake.bindings == []


def test_competing_gangs_never_half_bound(fake: FakeKube, ext: Running) -> None:
    a = [gang_pod(f"a{i}", i, gang="a") for i in range(4)]
    b = [gang_pod(f"b{i}", i, gang="b") for i in range(4)]
    fake.put("pods", pod("blocker", 4, node_name="r1-t0"))  # rack 1 cannot take a whole gang
    for p in a + b:
        fake.put("pods", p)
    wait_for(lambda: ext.state(lambda s: len(s.cache.pods) == 9), "informer sees both gangs")
    # interleaved: a0, b0, a1, b1, ...
    planned: dict[str, list[str]] = {}
    for pa, pb in zip(a, b, strict=True):
        planned[pa["metadata"]["name"]] = ext.filter_gang(pa, NODES)["NodeNames"]
        planned[pb["metadata"]["name"]] = ext.filter_gang(pb, NODES)["NodeNames"]
    assert all(len(planned[f"a{i}"]) == 1 for i in range(4))
    assert all(planned[f"b{i}"] == [] for i in range(4))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda p: ext.bind(p, planned[p["metadata"]["name"]][0]), a))
    assert results == [{"Error": ""}] * 4
    assert sorted(k for k, _ in fake.bindings) == [f"default/a{i}" for i in range(4)]
    assert ext.bind(b[0], "r1-t1")["Error"]  # b never reached a reservation: nothing of it binds


@pytest.mark.parametrize(
    ("verb", "raw", "status"),
    [
        pytest.param("filter", b"{not json", 400, id="filter-garbage"),
        pytest.param("filter", b"[1, 2]", 200, id="filter-not-an-object"),
        pytest.param("filter", b'{"Pod": 5}', 200, id="filter-pod-not-an-object"),
        pytest.param("filter", b'{"Pod": {"metadata": {}}}', 200, id="filter-pod-without-name"),
        pytest.param(
            "filter", b'{"Pod": {"metadata": {"name": "x"}}, "NodeNames": [1]}', 200, id="filter-bad-names"
        ),
        pytest.param("prioritize", b"\xff\xfe", 400, id="prioritize-not-utf8"),
        pytest.param("bind", b'{"PodName": 3}', 200, id="bind-bad-types"),
        pytest.param(
            "bind",
            b'{"PodName": "ghost", "PodNamespace": "default", "Node": "r0-t0"}',
            200,
            id="bind-unknown-pod",
        ),
    ],
)
def test_garbage_is_answered_with_error_and_serving_goes_on(
    fake: FakeKube, ext: Running, verb: str, raw: bytes, status: int
) -> None:
    code, body = ext.post(verb, None, raw=raw)
    assert code == status
    assert body["Error"]
    ok = ext.filter(known(fake, ext, pod("solo", 1)), NODES)
    assert set(ok["NodeNames"]) == set(NODES)


def test_oversized_and_malformed_requests(fake: FakeKube) -> None:
    ext = Running(fake, max_body=4096)
    try:
        code, body = ext.post("filter", None, raw=b"{" + b" " * 10000 + b"}")
        assert code == 413
        assert "limit" in body["Error"]
        host, port = "127.0.0.1", ext.service.server.port
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(b"NONSENSE\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 400")
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(b"POST /filter HTTP/1.1\r\nContent-Length: abc\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 400")
        with urllib.request.urlopen(f"{ext.url}/healthz", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"{ext.url}/readyz", timeout=5) as resp:
            assert resp.status == 200
    finally:
        ext.stop()


def test_invalid_gang_is_unresolvable_with_an_event(fake: FakeKube, ext: Running) -> None:
    p0 = gang_pod("x0", 0, gang="x", size=2)
    p1 = gang_pod("x1", 1, gang="x", size=3)  # disagrees on the gang size
    fake.put("pods", p0)
    fake.put("pods", p1)
    wait_for(lambda: ext.state(lambda s: len(s.cache.pods) == 2), "informer sees the pods")
    out = ext.filter(p0, NODES)
    assert set(out["FailedAndUnresolvableNodes"]) == set(NODES)
    assert "gpuagent.dev/gang-size" in next(iter(out["FailedAndUnresolvableNodes"].values()))
    wait_for(lambda: any(e.get("reason") == "InvalidGang" for e in fake.events), "InvalidGang Event")


def test_podgroup_gang_over_http(fake: FakeKube, ext: Running) -> None:
    fake.put(
        "podgroups",
        {
            "metadata": {"name": "pg", "namespace": "default"},
            "spec": {"minMember": 4, "networkTopology": {"mode": "hard", "highestTierName": "nvlink"}},
        },
    )
    pods = [
        pod(f"v{i}", 4, annotations={"scheduling.k8s.io/group-name": "pg"}, labels={COMPLETION: str(i)})
        for i in range(4)
    ]
    for p in pods:
        fake.put("pods", p)
    wait_for(
        lambda: ext.state(lambda s: len(s.cache.pods) == 4 and s.cache.podgroups),
        "informer sees the PodGroup",
    )
    nodes = [ext.filter_gang(p, NODES)["NodeNames"] for p in pods]
    assert all(len(n) == 1 for n in nodes)
    assert len({n[0].split("-")[0] for n in nodes}) == 1


COMPLETION = "batch.kubernetes.io/job-completion-index"


def test_restart_rebuilds_state_from_bound_pods(fake: FakeKube) -> None:
    first = Running(fake)
    try:
        pods = [gang_pod(f"w{i}", i) for i in range(4)]
        for p in pods:
            fake.put("pods", p)
        wait_for(lambda: first.state(lambda s: len(s.cache.pods) == 4), "informer sees the gang")
        planned = {p["metadata"]["name"]: first.filter_gang(p, NODES)["NodeNames"][0] for p in pods}
        with ThreadPoolExecutor(4) as pool:
            assert all(
                r == {"Error": ""}
                for r in pool.map(lambda p: first.bind(p, planned[p["metadata"]["name"]]), pods)
            )
    finally:
        first.stop()
    second = Running(fake)
    try:
        used = set(planned.values())
        out = second.filter(known(fake, second, pod("solo", 4)), NODES)
        assert set(out["NodeNames"]) == set(NODES) - used
        assert second.state(lambda s: s.holds.started) == {}
    finally:
        second.stop()


def test_extender_command_serves_and_stops_on_sigterm(fake: FakeKube, tmp_path: Any) -> None:
    import os
    import signal
    import subprocess
    import sys

    kubeconfig = write_token_kubeconfig(tmp_path / "k.yaml", fake.url)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "extender", f"--addr=127.0.0.1:{port}",
         f"--kubeconfig={kubeconfig}", "--watch-timeout=1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                    return bool(resp.status == 200)
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_for(ready, "extender /readyz", timeout_s=30)
        fake.put("pods", pod("solo", 1))
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/filter",
            data=json.dumps({"Pod": pod("solo", 1), "NodeNames": NODES}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert set(json.loads(resp.read())["NodeNames"]) == set(NODES)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        assert proc.stdout is not None
        proc.stdout.close()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        pytest.param(["--addr", "nowhere"], "--addr: expected HOST:PORT", id="addr"),
        pytest.param(
            ["--barrier-timeout", "0"], "--barrier-timeout: must be a finite number > 0", id="barrier"
        ),
        pytest.param(["--max-body-bytes", "10"], "--max-body-bytes", id="body"),
        pytest.param(["--max-connections", "2"], "--max-connections: must be at least 8", id="connections"),
        pytest.param(["--scheduler-name", ""], "--scheduler-name: must not be empty", id="scheduler-name"),
    ],
)
def test_extender_command_rejects_bad_settings(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent.commands.extender import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert err.count("\n") == 1


# -- trust: loopback by default, TLS with client certificates when exposed ------------------------------


def _tls_client(pki: ExtenderPki, cert: Any = None, key: Any = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def _get(url: str, ctx: ssl.SSLContext) -> int:
    with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
        return int(resp.status)


def test_tls_requires_a_client_certificate_signed_by_the_given_ca(fake: FakeKube, tmp_path: Any) -> None:
    pki = make_extender_pki(tmp_path / "pki")
    ext = Running(fake, pki=pki)
    try:
        ours = _tls_client(pki, pki.client_cert, pki.client_key)
        assert _get(f"{ext.url}/readyz", ours) == 200
        p = pod("solo", 1)
        fake.put("pods", p)
        req = urllib.request.Request(
            f"{ext.url}/filter",
            data=json.dumps({"Pod": p, "NodeNames": NODES}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10, context=ours) as resp:
            assert set(json.loads(resp.read())["NodeNames"]) == set(NODES)
        for ctx in (_tls_client(pki), _tls_client(pki, pki.stranger_cert, pki.stranger_key)):
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                _get(f"{ext.url}/readyz", ctx)
        with socket.create_connection(("127.0.0.1", ext.service.server.port), timeout=5) as s:
            s.sendall(b"GET /readyz HTTP/1.1\r\n\r\n")  # plain HTTP to the TLS port: no answer
            assert not s.recv(100).startswith(b"HTTP/1.1 200")
        assert _get(f"{ext.url}/healthz", ours) == 200  # still serving
    finally:
        ext.stop()


def test_health_listener_serves_probes_only(fake: FakeKube) -> None:
    ext = Running(fake, health=True)
    try:
        assert ext.service.health is not None
        url = f"http://127.0.0.1:{ext.service.health.port}"
        for path in ("/healthz", "/livez", "/readyz"):
            with urllib.request.urlopen(url + path, timeout=5) as resp:
                assert resp.status == 200
        req = urllib.request.Request(
            f"{url}/bind",
            data=b'{"PodName": "x", "Node": "r0-t0"}',
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 404
        err.value.close()
    finally:
        ext.stop()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        pytest.param(["--addr", "0.0.0.0:8888"], "is not a loopback address", id="any-address"),
        pytest.param(["--addr", ":8888"], "is not a loopback address", id="empty-host"),
        pytest.param(["--addr", "10.0.0.5:8888"], "requires TLS with client certificates", id="pod-ip"),
        pytest.param(["--addr", "extender.example:8888"], "is not a loopback address", id="a-name"),
        pytest.param(
            ["--addr", "0.0.0.0:8888", "--tls-cert", "c.pem", "--tls-key", "k.pem"],
            "give all three or none",
            id="no-client-ca",
        ),
        pytest.param(["--health-addr", "nowhere"], "--health-addr: expected HOST:PORT", id="health-addr"),
    ],
)
def test_extender_command_refuses_to_listen_exposed_without_tls(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent.commands.extender import parse_settings

    with pytest.raises(SystemExit) as exc:
        parse_settings(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("addr", "tls"),
    [
        pytest.param("127.0.0.1:8888", False, id="loopback-v4"),
        pytest.param("[::1]:8888", False, id="loopback-v6"),
        pytest.param("localhost:8888", False, id="localhost"),
        pytest.param("0.0.0.0:8888", True, id="exposed-with-tls"),
    ],
)
def test_extender_command_accepts_loopback_or_tls(addr: str, tls: bool) -> None:
    from agent.commands.extender import parse_settings

    argv = ["--addr", addr]
    if tls:
        argv += ["--tls-cert", "c.pem", "--tls-key", "k.pem", "--client-ca", "ca.pem"]
    settings = parse_settings(argv)
    assert settings.tls is tls
    assert parse_settings([]).host == "127.0.0.1"  # the default is loopback


def test_extender_command_with_unusable_tls_files_exits_2_with_one_line(
    fake: FakeKube, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent.commands.extender import main

    pki = make_extender_pki(tmp_path / "pki")
    kubeconfig = write_token_kubeconfig(tmp_path / "k.yaml", fake.url)
    cases = [
        (pki.server_cert, pki.client_key, pki.ca, "KEY_VALUES_MISMATCH"),  # a key of another certificate
        (tmp_path / "missing.pem", pki.server_key, pki.ca, "No such file"),
    ]
    for cert, key, ca, needle in cases:
        argv = ["--addr", "127.0.0.1:0", f"--kubeconfig={kubeconfig}"]
        argv += ["--tls-cert", str(cert), "--tls-key", str(key), "--client-ca", str(ca)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert needle in err, err
        assert err.count("\n") == 1
