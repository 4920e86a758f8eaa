"""``run`` with the exporter on: readiness follows plugin registration, XIDs and health reach /metrics."""

from __future__ import annotations

import asyncio
import http.client
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from agent.commands.run import serve
from agent.config import RunSettings
from deviceplugin.api import deviceplugin_pb2, deviceplugin_pb2_grpc
from tests.agent.metrics.render_helpers import samples


class _Registration(deviceplugin_pb2_grpc.RegistrationServicer):
    """The kubelet's Registration service, accepting every plugin."""

    def __init__(self) -> None:
        self.resources: list[str] = []

    async def Register(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        self.resources.append(request.resource_name)
        return deviceplugin_pb2.Empty()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="mr", dir="/tmp") as d:
        yield Path(d)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


async def _until(
    port: int, path: str, ok: Callable[[int, str], bool], timeout: float = 30
) -> tuple[int, str]:
    deadline = asyncio.get_running_loop().time() + timeout
    last: tuple[int, str] = (0, "")
    while asyncio.get_running_loop().time() < deadline:
        try:
            last = await asyncio.to_thread(_get, port, path)
            if ok(*last):
                return last
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(
        f"GET {path}: condition not met in {timeout} s; last answer {last[0]} {last[1][:300]!r}"
    )


def _value(text: str, name: str, **labels: str) -> float | None:
    found = [v for n, ls, v in samples(text) if n == name and all(ls.get(k) == x for k, x in labels.items())]
    return found[0] if len(found) == 1 else None


def test_run_serves_metrics_readiness_and_xids(short_dir: Path) -> None:
    port = _free_port()
    faults = short_dir / "faults.jsonl"
    faults.write_text("")
    settings = RunSettings(
        node_name="node-a",
        kubelet_dir=short_dir,
        pod_resources_socket=short_dir / "pod-resources.sock",  # absent: no pod labels, no failure
        simulate="dgx-h100",
        simulate_faults=faults,
        no_kube=True,
        metrics_addr=f"127.0.0.1:{port}",
        metrics_interval_s=0.2,
    )

    async def body() -> int:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(settings, stop=stop))
        server: grpc.aio.Server | None = None
        try:
            await _until(port, "/healthz", lambda s, _: s == 200)
            status, reasons = await _until(port, "/readyz", lambda s, b: "plugins" in b)
            assert status == 503
            assert "plugins: not registered with kubelet: nvidia.com/gpu" in reasons

            registration = _Registration()
            server = grpc.aio.server()
            deviceplugin_pb2_grpc.add_RegistrationServicer_to_server(registration, server)
            server.add_insecure_port(f"unix://{short_dir / 'kubelet.sock'}")
            await server.start()
            await _until(port, "/readyz", lambda s, _: s == 200)
            assert "nvidia.com/gpu" in registration.resources

            _, text = await _until(
                port,
                "/metrics",
                lambda s, b: (
                    _value(b, "gpuagent_plugin_registrations_total") is not None
                    and (_value(b, "gpuagent_plugin_registrations_total") or 0) >= 1
                ),
            )
            assert _value(text, "gpuagent_plugin_registered", resource="nvidia.com/gpu") == 1
            assert (_value(text, "gpuagent_discovery_duration_seconds") or 0) > 0
            assert len([s for s in samples(text) if s[0] == "gpuagent_gpu_info"]) == 8

            with faults.open("a") as fh:
                fh.write('{"event":"xid","gpu":3,"xid":48}\n')  # double-bit ECC: unhealthy, not lost
            _, text = await _until(
                port,
                "/metrics",
                lambda s, b: _value(b, "gpuagent_gpu_xid_errors_total", gpu="3", xid="48") == 1,
            )
            assert _value(text, "gpuagent_device_healthy", gpu="3") == 0
            assert _value(text, "gpuagent_device_healthy", gpu="2") == 1
            stop.set()
            return await asyncio.wait_for(task, 30)
        finally:
            stop.set()
            if server is not None:
                await server.stop(grace=None)
            if not task.done():
                task.cancel()

    assert asyncio.run(body()) == 0


async def _probe(port: int, path: str) -> tuple[int, str]:
    """kubelet's httpGet probe: a fresh connection, one GET, 1 s for the whole answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = f"GET {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.34\r\nConnection: close\r\n\r\n"
        writer.write(head.encode())
        answer = await asyncio.wait_for(reader.read(), 1.0)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def test_run_health_listener_keeps_passing_probes_while_the_metrics_slots_are_held(short_dir: Path) -> None:
    """D13 on the whole agent: 64 idle and 64 stalled connections to the metrics port; kubelet-style
    probes of --health-addr keep passing, /metrics still answers, /readyz gives the same reasons."""
    metrics_port, health_port = _free_port(), _free_port()
    settings = RunSettings(
        node_name="node-a",
        kubelet_dir=short_dir,
        pod_resources_socket=short_dir / "pod-resources.sock",
        simulate="pcie-l40s",
        no_kube=True,
        metrics_addr=f"127.0.0.1:{metrics_port}",
        health_addr=f"127.0.0.1:{health_port}",
    )

    async def body() -> int:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(settings, stop=stop))
        held: list[asyncio.StreamWriter] = []
        try:
            await _until(metrics_port, "/metrics", lambda s, _: s == 200)
            assert (await _probe(health_port, "/healthz")) == (200, "ok\n")
            assert (await _probe(health_port, "/metrics"))[0] == 404  # health only
            for send in (b"", b"GET /metrics HTTP/1.1\r\nContent-Length: 1000\r\n\r\n"):
                for _ in range(64):
                    _, writer = await asyncio.open_connection("127.0.0.1", metrics_port)
                    writer.write(send)
                    held.append(writer)
            await asyncio.sleep(0.3)
            for _ in range(5):
                assert (await _probe(health_port, "/healthz")) == (200, "ok\n")
                status, reasons = await _probe(health_port, "/readyz")
                assert (status, reasons) == (503, "plugins: not registered with kubelet: nvidia.com/gpu\n")
                assert (await _probe(metrics_port, "/readyz")) == (status, reasons)
                assert (await _probe(metrics_port, "/metrics"))[0] == 200
                await asyncio.sleep(0.2)
            stop.set()
            return await asyncio.wait_for(task, 30)
        finally:
            for writer in held:
                writer.close()
            stop.set()
            if not task.done():
                task.cancel()

    assert asyncio.run(body()) == 0
