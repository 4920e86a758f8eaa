"""The device plugin over real gRPC unix sockets against an in-test kubelet Registration server.

Each test runs the node runtime (health monitor, rediscovery, plugin manager) on a simulated machine in
a short temporary directory (unix socket paths must stay under 108 bytes), and drives it through the
simulator, the fault file or the fake kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import json
import logging
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest

from agent.config import parse_health_config
from agent.fabricwatch import FabricWatch
from agent.health import HealthMonitor
from agent.runtime import Component, InventoryStore, Rediscovery, run_components
from deviceplugin import dirwatch
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc
from deviceplugin.config import PluginConfig, parse_plugin_config
from deviceplugin.manager import PluginManager
from tests.deviceplugin.helpers import FakeKubelet, SimNode, running_kubelet, sim_node

T = TypeVar("T")

FAST_HEALTH = {"health": {"recoveryQuietSeconds": 0.3, "probeIntervalSeconds": 0.05}}


def run(coro: Awaitable[T], timeout: float = 30.0) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


@pytest.fixture
def short_dir() -> Any:
    with tempfile.TemporaryDirectory(prefix="dp", dir="/tmp") as d:
        yield Path(d)


@dataclass
class Agent:
    node: SimNode
    store: InventoryStore
    manager: PluginManager
    health: HealthMonitor
    rediscovery: Rediscovery
    directory: Path


@contextlib.asynccontextmanager
async def agent(
    directory: Path,
    profile: str = "dgx-h100",
    data: Mapping[str, Any] | None = None,
    *,
    faults: Path | None = None,
    **manager_kw: Any,
) -> AsyncIterator[Agent]:
    file_data = {**FAST_HEALTH, **(data or {})}
    config: PluginConfig = parse_plugin_config(file_data)
    node = sim_node(profile, faults=faults)
    store = InventoryStore(node.discover())
    rediscovery = Rediscovery(store=store, discover=node.discover, interval_s=None, debounce_s=0.01)
    health = HealthMonitor(
        nvml=node.sim,
        store=store,
        config=parse_health_config(file_data),
        on_mig_change=rediscovery.request,
        wait_timeout_ms=20,
    )
    manager_kw.setdefault("poll_s", 0.05)
    manager = PluginManager(store=store, config=config, kubelet_dir=directory, **manager_kw)
    fabric = FabricWatch(nvml=node.sim, store=store, interval_s=0.05)
    components: list[Component] = [health, rediscovery, manager, fabric]
    follower = node.faults
    if follower is not None:
        follower.poll_interval_s = 0.01
        components.append(follower)
    stop = asyncio.Event()
    task = asyncio.create_task(run_components(components, stop))
    try:
        async with asyncio.timeout(10):
            while not (manager.started.is_set() and health.started.is_set()) and not task.done():
                await asyncio.sleep(0.01)
        yield Agent(node, store, manager, health, rediscovery, directory)
    finally:
        stop.set()
        await task
        node.sim.shutdown()


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def all_healthy(kubelet: FakeKubelet, resource: str, count: int) -> Callable[[], bool]:
    def check() -> bool:
        devices = kubelet.devices.get(resource, {})
        return len(devices) == count and all(h == "Healthy" for h in devices.values())

    return check


async def call(directory: Path, socket: str, method: str, request: Any) -> Any:
    async with grpc.aio.insecure_channel(f"unix://{directory / socket}") as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        return await getattr(stub, method)(request, timeout=5)


def test_registers_each_resource_and_lists_devices_with_numa(short_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir) as a:
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 8))
            reg = kubelet.registrations[0]
            assert (reg.resource_name, reg.endpoint, reg.version, reg.preferred) == (
                "nvidia.com/gpu",
                "nvidia-gpu.sock",
                "v1beta1",
                True,
            )
            numa = {g.uuid: g.numa_node for g in a.store.inventory.gpus}
            assert kubelet.numa["nvidia.com/gpu"] == {u: [n] for u, n in numa.items()}
            assert a.manager.ready()
            options = await call(short_dir, "nvidia-gpu.sock", "GetDevicePluginOptions", pb.Empty())
            assert options.get_preferred_allocation_available
            assert not options.pre_start_required

    run(body())


def test_allocate_and_preferred_allocation_over_grpc(short_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir, "dgx1-v100") as a:
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 8))
            uuid = {g.index: g.uuid for g in a.store.inventory.gpus}
            request = pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=list(uuid.values()),
                        must_include_deviceIDs=[uuid[0]],
                        allocation_size=2,
                    )
                ]
            )
            reply = await call(short_dir, "nvidia-gpu.sock", "GetPreferredAllocation", request)
            assert set(reply.container_responses[0].deviceIDs) == {uuid[0], uuid[3]}  # the NV2 neighbour
            alloc = await call(
                short_dir,
                "nvidia-gpu.sock",
                "Allocate",
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=[uuid[0], uuid[3]])]
                ),
            )
            assert alloc.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == f"{uuid[0]},{uuid[3]}"
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(
                    short_dir,
                    "nvidia-gpu.sock",
                    "Allocate",
                    pb.AllocateRequest(
                        container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-nope"])]
                    ),
                )
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "GPU-nope" in (err.value.details() or "")

    run(body())


def test_fault_marks_one_gpu_unhealthy_then_it_recovers(short_dir: Path) -> None:
    faults = short_dir / "faults.jsonl"
    faults.write_text("")

    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir, faults=faults) as a:
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 8))
            bad = a.store.inventory.gpu(3).uuid
            with faults.open("a") as fh:  # double-bit ECC: the DBE event, Xid 48, a row remap pending
                fh.write(json.dumps({"event": "ecc_dbe", "gpu": 3}) + "\n")
            await kubelet.wait_for(lambda: kubelet.devices["nvidia.com/gpu"][bad] == "Unhealthy")
            others = {k: v for k, v in kubelet.devices["nvidia.com/gpu"].items() if k != bad}
            assert set(others.values()) == {"Healthy"}
            # an Allocate naming it now fails, saying why
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(
                    short_dir,
                    "nvidia-gpu.sock",
                    "Allocate",
                    pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[bad])]),
                )
            details = err.value.details() or ""
            assert "unhealthy (XID 48 (double-bit ECC error): needs a GPU reset" in details
            await asyncio.sleep(0.5)  # longer than the quiet period: a double-bit error needs a reset
            assert kubelet.devices["nvidia.com/gpu"][bad] == "Unhealthy"
            with faults.open("a") as fh:
                fh.write(json.dumps({"event": "reset", "gpu": 3}) + "\n")
            # the reset is seen (volatile ECC back to zero, remap applied), then it stays quiet: Healthy
            # again without a restart
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 8))

    run(body())


def test_ignored_xid_and_failing_event_wait_leave_devices_healthy(short_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir) as a:
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 8))
            a.node.sim.inject_xid(1, 13)
            a.node.sim.inject_error(999, call="event_set_wait", times=3)
            await wait_until(lambda: a.health.wait_failures >= 1 and a.health.events_seen >= 1)
            assert a.store.xid_counts()[(a.store.inventory.gpu(1).uuid, 13)] == 1
            assert set(kubelet.devices["nvidia.com/gpu"].values()) == {"Healthy"}

    run(body())


def test_lost_gpu_stays_unhealthy_until_it_reappears(short_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir) as a:
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 8))
            lost = a.store.inventory.gpu(2).uuid
            a.node.sim.lose_gpu(2)
            await kubelet.wait_for(lambda: kubelet.devices["nvidia.com/gpu"][lost] == "Unhealthy")
            await asyncio.sleep(0.5)  # longer than the quiet period: still lost
            assert kubelet.devices["nvidia.com/gpu"][lost] == "Unhealthy"
            a.node.sim.recover_gpu(2)
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 8))

    run(body())


def test_kubelet_restart_reregisters(short_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir) as a:
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 1)
            await kubelet.restart()
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 2, timeout=3)
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 8))
            assert a.manager.kubelet_restarts_seen + a.manager.restarts >= 1

    run(body())


def test_kubelet_restart_is_seen_through_inotify_not_the_poll(short_dir: Path) -> None:
    """With the folder watched, the manager looks only when woken (or once an hour here): kubelet's
    restart (sockets removed, a new kubelet.sock) wakes it, and it registers again at once."""

    async def body() -> None:
        async with (
            running_kubelet(short_dir) as kubelet,
            agent(short_dir, watched_poll_s=3600.0) as a,
        ):
            assert a.manager.watching
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 1)
            for n in (2, 3):
                await kubelet.restart()
                await kubelet.wait_for(lambda n=n: len(kubelet.registrations) == n, timeout=3)
                await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 8))
            (short_dir / "nvidia-gpu.sock").unlink()  # our socket removed: served again and registered
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 4, timeout=3)
            assert a.manager.restarts == 3

    run(body())


class _NoInotify:
    """The C library's inotify calls failing as they do at the per-user instance limit."""

    def init1(self, flags: int) -> int:
        ctypes.set_errno(errno.EMFILE)
        return -1

    def add_watch(self, fd: int, path: bytes, mask: int) -> int:
        raise AssertionError("no instance, no watch")


def test_without_inotify_the_folder_is_polled_and_says_so(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(dirwatch, "_libc", _NoInotify())

    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir, watched_poll_s=3600.0) as a:
            assert not a.manager.watching
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 1)
            await kubelet.restart()
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 2, timeout=3)
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 8))

    with caplog.at_level(logging.WARNING, logger="deviceplugin.manager"):
        run(body())
    warnings = [r for r in caplog.records if r.getMessage() == "kubelet_dir_watch_unavailable"]
    assert len(warnings) == 1
    fields = warnings[0].__dict__
    assert any("max_user_instances" in str(v) for v in fields.values())


def test_the_folder_removed_and_made_again_is_watched_again(short_dir: Path) -> None:
    """Kubelet (or an operator) may remove the whole device-plugin folder: the plugin is served again
    in the new folder, whose changes wake the manager as the old one's did."""

    async def body() -> None:
        plugin_dir = short_dir / "dp"
        plugin_dir.mkdir()
        async with agent(plugin_dir, watched_poll_s=3600.0) as a:
            await wait_until((plugin_dir / "nvidia-gpu.sock").exists)
            shutil.rmtree(plugin_dir)
            await wait_until((plugin_dir / "nvidia-gpu.sock").exists)  # the retry makes it again
            assert a.manager.watching
            async with running_kubelet(plugin_dir) as kubelet:  # only the new folder's watch sees this
                await kubelet.wait_for(lambda: len(kubelet.registrations) == 1, timeout=3)

    run(body())


def test_a_kubelet_socket_nobody_listens_on_fails_at_once_and_its_successor_is_registered_with(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Mid-restart, kubelet.sock may still be the old kubelet's, bound but no longer listening. Register
    over it fails at once (not after gRPC's reconnect back-off nor the call's time-out, an hour here, during
    which the manager would see nothing else), and the new kubelet.sock is registered with."""

    async def body() -> None:
        dead = socket.socket(socket.AF_UNIX)
        dead.bind(str(short_dir / "kubelet.sock"))  # bound, never listening: connect is refused
        try:
            async with agent(short_dir, register_timeout_s=3600.0, watched_poll_s=3600.0) as a:
                await wait_until(
                    lambda: any(r.getMessage() == "registration_failed" for r in caplog.records), 10
                )
                assert not a.manager.ready()
                dead.close()
                (short_dir / "kubelet.sock").unlink()
                async with running_kubelet(short_dir) as kubelet:
                    await kubelet.wait_for(lambda: len(kubelet.registrations) == 1, timeout=10)
                    await wait_until(a.manager.ready)
        finally:
            dead.close()

    with caplog.at_level(logging.WARNING, logger="deviceplugin.manager"):
        run(body())


def test_deleted_plugin_socket_restarts_and_reregisters(short_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir):
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 1)
            (short_dir / "nvidia-gpu.sock").unlink()
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 2, timeout=3)
            assert (short_dir / "nvidia-gpu.sock").exists()

    run(body())


def test_registers_once_kubelet_appears_and_retries_rejections(short_dir: Path) -> None:
    async def body() -> None:
        async with agent(short_dir) as a:
            await wait_until((short_dir / "nvidia-gpu.sock").exists)
            assert not a.manager.ready()
            kubelet = FakeKubelet(short_dir, reject=True)
            await kubelet.start()
            try:
                await asyncio.sleep(0.3)
                assert not a.manager.ready()
                kubelet.reject = False
                await kubelet.wait_for(lambda: len(kubelet.registrations) == 1, timeout=8)
                await wait_until(a.manager.ready)
            finally:
                await kubelet.stop()

    run(body())


def test_mig_reconfiguration_adds_and_withdraws_resources(short_dir: Path) -> None:
    async def body() -> None:
        async with (
            running_kubelet(short_dir) as kubelet,
            agent(short_dir, "dgx-a100-mig", {"flags": {"migStrategy": "mixed"}}) as a,
        ):
            before = set(a.manager.registered())
            await kubelet.wait_for(lambda: {r.resource_name for r in kubelet.registrations} == before)
            assert "nvidia.com/mig-7g.80gb" not in before
            four_g = [
                i
                for i, s in enumerate(a.store.inventory.mig)
                if any(d.profile == "4g.40gb" for d in s.devices)
            ]
            gpu = a.store.inventory.mig[four_g[0]].gpu_index
            a.node.sim.reconfigure_mig(gpu, ["7g.80gb"])
            await kubelet.wait_for(
                lambda: any(r.resource_name == "nvidia.com/mig-7g.80gb" for r in kubelet.registrations),
                timeout=5,
            )
            await wait_until(lambda: "nvidia.com/mig-4g.40gb" not in a.manager.registered())
            assert not (short_dir / "nvidia-mig-4g.40gb.sock").exists()
            assert a.rediscovery.runs >= 1

    run(body())


def test_kubelet_missing_our_devices_triggers_reregistration(short_dir: Path) -> None:
    listed: dict[str, frozenset[str]] = {}

    async def check() -> Mapping[str, frozenset[str]] | None:
        return listed

    async def body() -> None:
        async with (
            running_kubelet(short_dir) as kubelet,
            agent(short_dir, allocatable_check=check, check_interval_s=0.1),
        ):
            await kubelet.wait_for(lambda: len(kubelet.registrations) >= 2, timeout=3)

    run(body())


def test_a_fresh_registration_gets_a_check_interval_before_it_counts_as_lost(short_dir: Path) -> None:
    """Kubelet lists devices only after ListAndWatch delivered them; a check right after registering must
    not register again (kubelet 1.37 refuses a second registration of a connected socket, forever)."""
    checks = 0

    async def check() -> Mapping[str, frozenset[str]] | None:
        nonlocal checks
        checks += 1
        return {}  # not listed yet

    async def body() -> None:
        async with (
            running_kubelet(short_dir) as kubelet,
            agent(short_dir, allocatable_check=check, check_interval_s=60.0) as a,
        ):
            await kubelet.wait_for(lambda: len(kubelet.registrations) >= 1, timeout=3)
            await wait_until(lambda: checks >= 1 and a.manager.ready())
            await asyncio.sleep(0.3)
            assert len(kubelet.registrations) == 1

    run(body())


def test_stop_removes_sockets(short_dir: Path) -> None:
    async def body() -> None:
        async with (
            running_kubelet(short_dir) as kubelet,
            agent(short_dir, "dgx-a100-mig", {"flags": {"migStrategy": "mixed"}}),
        ):
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 5)
            assert len(list(short_dir.glob("nvidia-*.sock"))) == 5
        assert list(short_dir.glob("nvidia-*.sock")) == []

    run(body())


def test_time_sliced_replicas_advertised_and_allocated(short_dir: Path) -> None:
    data = {
        "sharing": {
            "timeSlicing": {
                "renameByDefault": True,
                "failRequestsGreaterThanOne": True,
                "resources": [{"name": "nvidia.com/gpu", "replicas": 2}],
            }
        }
    }

    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir, "pcie-l40s", data):
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu.shared", 8))
            ids = sorted(kubelet.devices["nvidia.com/gpu.shared"])
            assert all("::" in i for i in ids)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(
                    short_dir,
                    "nvidia-gpu.shared.sock",
                    "Allocate",
                    pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids[:2])]),
                )
            assert "at most 1" in (err.value.details() or "")

    run(body())


def test_hotplug_removal_keeps_the_lost_gpu_advertised_unhealthy(short_dir: Path) -> None:
    from agent.commands.run import HotplugTrigger
    from agent.udev import simulated_source

    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir) as a:
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 8))
            trigger = HotplugTrigger(source=simulated_source(a.node.sim), rediscovery=a.rediscovery)
            stop = asyncio.Event()
            task = asyncio.create_task(trigger.run(stop))
            try:
                await asyncio.sleep(0)
                lost = a.store.inventory.gpu(5).uuid
                runs = a.rediscovery.runs
                a.node.sim.lose_gpu(5)
                await wait_until(lambda: a.rediscovery.runs > runs)
                assert a.store.inventory.gpu(5).lost
                assert a.store.inventory.gpu(5).uuid == lost
                await kubelet.wait_for(lambda: kubelet.devices["nvidia.com/gpu"].get(lost) == "Unhealthy")
                assert len(kubelet.devices["nvidia.com/gpu"]) == 8  # still counted in capacity
                a.node.sim.recover_gpu(5)
                await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 8))
            finally:
                stop.set()
                await task

    run(body())


def test_fabric_unhealthy_marks_the_gpu_when_configured(short_dir: Path) -> None:
    data = {
        "health": {"fabricUnhealthyMarksGpu": True, "recoveryQuietSeconds": 0.2, "probeIntervalSeconds": 0.05}
    }

    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir, "gb200-nvl72", data) as a:
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 4))
            gpu = a.store.inventory.gpu(1).uuid
            a.node.sim.set_fabric_health(1, "UNHEALTHY")
            await kubelet.wait_for(lambda: kubelet.devices["nvidia.com/gpu"][gpu] == "Unhealthy")
            assert (a.store.health_of(gpu).reason or "").startswith(
                "fabric unhealthy: route_unhealthy, summary_unhealthy"
            )
            a.node.sim.set_fabric_health(1, "HEALTHY")
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 4))

    run(body())


def test_a_plugin_that_cannot_start_is_retried_not_fatal(short_dir: Path) -> None:
    blocker = short_dir / "nvidia-gpu.sock"
    blocker.mkdir()
    (blocker / "keep").write_text("x")

    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir) as a:
            await asyncio.sleep(0.2)
            assert a.manager.registered() == {"nvidia.com/gpu": False}
            assert not a.manager.ready()
            (blocker / "keep").unlink()
            blocker.rmdir()
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 8), timeout=5)
            await wait_until(a.manager.ready)

    run(body())


def test_a_socket_path_too_long_stops_the_manager_with_one_line(short_dir: Path) -> None:
    deep = short_dir / ("d" * 90)

    async def body() -> None:
        async with agent(deep) as a:
            await asyncio.sleep(0)
            del a

    with pytest.raises(ExceptionGroup) as err:
        run(body())
    assert "longer than 107 bytes" in str(err.value.exceptions[0])


def test_cdi_spec_written_and_cdi_devices_allocated(short_dir: Path) -> None:
    spec_dir = short_dir / "cdi"
    data = {
        "flags": {"plugin": {"deviceListStrategy": ["envvar", "cdi-cri"]}},
        "cdi": {"specDir": str(spec_dir)},
    }

    async def body() -> None:
        async with running_kubelet(short_dir) as kubelet, agent(short_dir, "pcie-l40s", data) as a:
            await kubelet.wait_for(all_healthy(kubelet, "nvidia.com/gpu", 4))
            spec = json.loads((spec_dir / "gpuagent.dev-gpu.json").read_text())
            assert sorted(d["name"] for d in spec["devices"]) == sorted(
                g.uuid for g in a.store.inventory.gpus
            )
            uuid = a.store.inventory.gpu(2).uuid
            reply = await call(
                short_dir,
                "nvidia-gpu.sock",
                "Allocate",
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[uuid])]),
            )
            response = reply.container_responses[0]
            assert [c.name for c in response.cdi_devices] == [f"gpuagent.dev/gpu={uuid}"]
            assert response.envs["NVIDIA_VISIBLE_DEVICES"] == uuid

    run(body())
