"""The device-manager harness: the kubelet's real device manager behind a loopback HTTP API.

A throwaway two-device plugin written here (on the generated ``v1beta1`` stubs) checks the harness
itself, apart from our device plugin (whose own e2e tests are in ``test_deviceplugin_e2e.py``).
"""

from __future__ import annotations

import queue
import stat
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent import localcluster as cluster

pytestmark = pytest.mark.e2e

RESOURCE = "example.com/widget"


def test_harness_serves_kubelet_sock_and_its_api(device_manager: cluster.DeviceManagerHarness) -> None:
    health = device_manager.healthz()
    assert health == {"ok": True, "socket": str(device_manager.kubelet_socket), "restarts": 0}
    assert stat.S_ISSOCK(device_manager.kubelet_socket.stat().st_mode)
    assert device_manager.resources() == {"resources": {}, "deleted": []}


def test_bad_allocate_requests_are_refused_with_a_reason(
    device_manager: cluster.DeviceManagerHarness,
) -> None:
    status, body = device_manager.allocate(RESOURCE, 0)
    assert status == 400
    assert "count" in body["error"]
    status, body = device_manager.delete_pod("no-such-pod")
    assert status == 404
    assert "no-such-pod" in body["error"]


def test_restart_recreates_kubelet_sock(device_manager: cluster.DeviceManagerHarness) -> None:
    def identity() -> tuple[int, int]:
        st = device_manager.kubelet_socket.stat()
        return st.st_ino, st.st_ctime_ns  # the inode number alone may be reused at once

    before = identity()
    assert device_manager.restart() == {"restarts": 1}
    cluster.wait_until(device_manager.kubelet_socket.exists, what="kubelet.sock after restart", timeout_s=30)
    assert identity() != before
    assert device_manager.healthz()["restarts"] == 1


def _stubs() -> tuple[Any, Any]:
    pb2 = pytest.importorskip("deviceplugin.api.deviceplugin_pb2", reason="v1beta1 stubs not generated")
    pb2_grpc = pytest.importorskip(
        "deviceplugin.api.deviceplugin_pb2_grpc", reason="v1beta1 stubs not generated"
    )
    return pb2, pb2_grpc


class ThrowawayPlugin:
    """Two devices, health changed by the test, Allocate answers an env var naming the devices."""

    def __init__(self, socket_dir: Path, name: str = "widget.sock") -> None:
        self.pb2, pb2_grpc = _stubs()
        self.socket_dir = socket_dir
        self.endpoint = name
        self.health = {"w0": "Healthy", "w1": "Healthy"}
        self.updates: queue.Queue[bool] = queue.Queue()
        self.allocate_requests: list[list[str]] = []
        plugin = self

        class Servicer(pb2_grpc.DevicePluginServicer):  # type: ignore[misc,name-defined]
            def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
                return plugin.pb2.DevicePluginOptions()

            def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
                while context.is_active():
                    yield plugin.pb2.ListAndWatchResponse(
                        devices=[plugin.pb2.Device(ID=i, health=h) for i, h in sorted(plugin.health.items())]
                    )
                    while context.is_active():
                        try:
                            plugin.updates.get(timeout=0.2)
                            break
                        except queue.Empty:
                            continue

            def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
                responses = []
                for creq in request.container_requests:
                    ids = sorted(creq.devices_ids)
                    plugin.allocate_requests.append(ids)
                    responses.append(plugin.pb2.ContainerAllocateResponse(envs={"WIDGETS": ",".join(ids)}))
                return plugin.pb2.AllocateResponse(container_responses=responses)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb2_grpc.add_DevicePluginServicer_to_server(Servicer(), self.server)
        self.server.add_insecure_port(f"unix://{socket_dir / name}")
        self.server.start()

    def register(self) -> None:
        _, pb2_grpc = _stubs()
        with grpc.insecure_channel(f"unix://{self.socket_dir / 'kubelet.sock'}") as channel:
            pb2_grpc.RegistrationStub(channel).Register(
                self.pb2.RegisterRequest(version="v1beta1", endpoint=self.endpoint, resource_name=RESOURCE),
                timeout=10,
            )

    def set_health(self, device: str, health: str) -> None:
        self.health[device] = health
        self.updates.put(True)

    def stop(self) -> None:
        self.server.stop(grace=None).wait(5)


@pytest.fixture
def plugin(device_manager: cluster.DeviceManagerHarness) -> Iterator[ThrowawayPlugin]:
    p = ThrowawayPlugin(device_manager.socket_dir)
    try:
        p.register()
        yield p
    finally:
        p.stop()


def widget(device_manager: cluster.DeviceManagerHarness) -> dict[str, Any]:
    return dict(device_manager.resources()["resources"].get(RESOURCE) or {})


def test_registration_list_and_watch_and_allocate(
    device_manager: cluster.DeviceManagerHarness, plugin: ThrowawayPlugin
) -> None:
    cluster.wait_until(lambda: widget(device_manager).get("allocatable") == 2, what="2 widgets allocatable")
    assert widget(device_manager) == {"capacity": 2, "allocatable": 2, "healthy_devices": ["w0", "w1"]}

    status, body = device_manager.allocate(RESOURCE, 1, pod="first", container="c")
    assert status == 200, body
    (chosen,) = body["device_ids"]
    assert body["envs"] == {"WIDGETS": chosen}
    assert (body["pod"], body["container"], body["resource"]) == ("first", "c", RESOURCE)
    assert plugin.allocate_requests == [[chosen]]

    status, body = device_manager.allocate(RESOURCE, 2, pod="second")
    assert status == 409
    assert "requested number of devices unavailable" in body["error"]


def test_unhealthy_device_leaves_allocatable_not_capacity(
    device_manager: cluster.DeviceManagerHarness, plugin: ThrowawayPlugin
) -> None:
    cluster.wait_until(lambda: widget(device_manager).get("allocatable") == 2, what="2 widgets allocatable")
    plugin.set_health("w1", "Unhealthy")
    cluster.wait_until(lambda: widget(device_manager).get("allocatable") == 1, what="w1 unhealthy")
    assert widget(device_manager) == {"capacity": 2, "allocatable": 1, "healthy_devices": ["w0"]}
    status, body = device_manager.allocate(RESOURCE, 1)
    assert status == 200, body
    assert body["device_ids"] == ["w0"]


def test_freed_devices_are_allocated_again(
    device_manager: cluster.DeviceManagerHarness, plugin: ThrowawayPlugin
) -> None:
    cluster.wait_until(lambda: widget(device_manager).get("allocatable") == 2, what="2 widgets allocatable")
    _, first = device_manager.allocate(RESOURCE, 2, pod="holder")
    assert first["device_ids"] == ["w0", "w1"]
    assert device_manager.allocate(RESOURCE, 1, pod="waiting")[0] == 409
    assert device_manager.delete_pod(first["pod_uid"])[0] == 200
    status, body = device_manager.allocate(RESOURCE, 2, pod="next")
    assert status == 200, body
    assert body["device_ids"] == ["w0", "w1"]


def test_restart_drops_plugin_sockets_and_plugin_registers_again(
    device_manager: cluster.DeviceManagerHarness, plugin: ThrowawayPlugin
) -> None:
    cluster.wait_until(lambda: widget(device_manager).get("allocatable") == 2, what="2 widgets allocatable")
    device_manager.restart()
    # As a restarting kubelet does, the new manager removed every socket but its own.
    assert not (device_manager.socket_dir / plugin.endpoint).exists()
    # No healthy device until the plugin registers again. (The new manager lists the resource with zero
    # devices when the old one had checkpointed it; the checkpoint is written just after ListAndWatch
    # updates are applied, so a restart right then may not find it.)
    assert widget(device_manager).get("allocatable", 0) == 0
    assert widget(device_manager).get("healthy_devices", []) == []
    plugin.stop()
    again = ThrowawayPlugin(device_manager.socket_dir)
    try:
        again.register()
        cluster.wait_until(
            lambda: widget(device_manager).get("allocatable") == 2, what="re-registered widgets"
        )
        status, body = device_manager.allocate(RESOURCE, 1)
        assert status == 200, body
    finally:
        again.stop()
