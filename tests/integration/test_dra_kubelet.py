"""The DRA driver over real gRPC unix sockets, driven the kubelet's way: a plugin watcher stand-in finds
the registration socket and speaks ``pluginregistration`` (GetInfo, NotifyRegistrationStatus), then
dials the endpoint it was given and calls ``v1.DRAPlugin`` and ``v1alpha1.DRAResourceHealth``.

The calls use the kubelet's wire paths spelled out here (``/pluginregistration.Registration/GetInfo``,
``/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources``, ...), so a proto package written
wrongly fails these tests even though our own stubs would agree with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest

from agent.dra import health_faults
from agent.healthbook import DeviceHealth, HealthBook, HealthConfig
from agent.runtime import InventoryStore
from deviceplugin.config import PluginConfig, parse_plugin_config
from deviceplugin.dra.api import dra_pb2 as pb
from deviceplugin.dra.api import health_pb2, health_v1_pb2
from deviceplugin.dra.api import registration_pb2 as rpb
from deviceplugin.dra.config import DraConfig
from deviceplugin.dra.driver import DraDriver
from deviceplugin.dra.slices import device_name
from deviceplugin.manager import PluginManager
from tests.deviceplugin.helpers import running_kubelet, sim_node
from topology.fabrichealth import DEFAULT_FABRIC_POLICY
from topology.model import FabricHealthSummary, Health

T = TypeVar("T")
DRIVER = "gpu.gpuagent.dev"
NODE = "node-a"

GET_INFO = "/pluginregistration.Registration/GetInfo"
NOTIFY = "/pluginregistration.Registration/NotifyRegistrationStatus"
PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
WATCH = {
    "v1": "/v1.DRAResourceHealth/NodeWatchResources",
    "v1alpha1": "/v1alpha1.DRAResourceHealth/NodeWatchResources",
}


def run(coro: Awaitable[T], timeout: float = 30.0) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


@pytest.fixture
def short_dir() -> Any:
    with tempfile.TemporaryDirectory(prefix="dra", dir="/tmp") as d:
        yield Path(d)


class Claims:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.reads = 0

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.reads += 1
        return self.objects.get((namespace, name))


class Slices:
    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []
        self.deleted: list[str] = []

    def node_uid(self, name: str) -> str | None:
        return "node-uid"

    def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        return []

    def apply_slice(self, obj: Mapping[str, Any]) -> None:
        self.applied.append(dict(obj))

    def delete_slice(self, name: str) -> None:
        self.deleted.append(name)


@dataclass
class Node:
    directory: Path
    store: InventoryStore
    driver: DraDriver
    claims: Claims
    slices: Slices
    config: DraConfig


def _driver(
    directory: Path, store: InventoryStore, claims: Claims, slices: Slices, config: DraConfig, **kw: Any
) -> DraDriver:
    plugin = parse_plugin_config({"cdi": {"specDir": str(directory / "cdi")}})
    return DraDriver(
        store=store,
        config=config,
        plugin_config=plugin,
        node_name=NODE,
        claims=claims,
        slices=slices,
        poll_s=0.02,
        grace_s=0.1,
        **kw,
    )


@contextlib.asynccontextmanager
async def running(driver: DraDriver) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(driver.run(stop))
    waiter = asyncio.create_task(driver.started.wait())
    done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        task.result()
    try:
        yield
    finally:
        stop.set()
        await task


@contextlib.asynccontextmanager
async def dra_node(directory: Path, profile: str = "dgx-h100") -> AsyncIterator[Node]:
    sim = sim_node(profile)
    store = InventoryStore(sim.discover())
    config = DraConfig(
        enabled=True, plugin_dir=str(directory / "plugins"), registry_dir=str(directory / "registry")
    )
    claims, slices = Claims(), Slices()
    driver = _driver(directory, store, claims, slices, config)
    async with running(driver):
        yield Node(directory, store, driver, claims, slices, config)


async def call(socket: Path, method: str, request: Any, reply: Any) -> Any:
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        fn = channel.unary_unary(
            method, request_serializer=type(request).SerializeToString, response_deserializer=reply.FromString
        )
        return await fn(request, timeout=5)


async def plugin_watcher(registry: Path) -> rpb.PluginInfo:
    """What the kubelet's plugin watcher does with a new socket in its directory."""
    (socket,) = sorted(registry.glob("*.sock"))
    info = await call(socket, GET_INFO, rpb.InfoRequest(), rpb.PluginInfo)
    await call(socket, NOTIFY, rpb.RegistrationStatus(plugin_registered=True), rpb.RegistrationStatusResponse)
    return info


def _claim(name: str, uid: str, devices: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d} for d in devices
                    ]
                }
            }
        },
    }


def test_registers_through_the_plugin_watcher_with_the_kubelets_names(short_dir: Path) -> None:
    async def body() -> None:
        async with dra_node(short_dir) as node:
            assert not node.driver.registered
            assert "not registered with the kubelet yet" in (node.driver.problem() or "")
            socket = short_dir / "registry" / f"{DRIVER}-reg.sock"
            refused = rpb.RegistrationStatus(plugin_registered=False, error="unsupported versions")
            await call(socket, NOTIFY, refused, rpb.RegistrationStatusResponse)
            assert node.driver.problem() == "the kubelet refused the registration: unsupported versions"
            info = await plugin_watcher(short_dir / "registry")
            assert info.type == "DRAPlugin"
            assert info.name == DRIVER
            assert info.endpoint == str(short_dir / "plugins" / DRIVER / "dra.sock")
            assert list(info.supported_versions) == [
                "v1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth",
            ]
            assert node.driver.registered
            assert node.driver.problem() is None
        assert not (short_dir / "registry" / f"{DRIVER}-reg.sock").exists()  # removed on stop
        assert not (short_dir / "plugins" / DRIVER / "dra.sock").exists()

    run(body())


def test_prepare_unprepare_idempotent_and_kept_across_an_agent_restart(short_dir: Path) -> None:
    async def body() -> None:
        async with dra_node(short_dir) as node:
            info = await plugin_watcher(short_dir / "registry")
            endpoint = Path(info.endpoint)
            names = sorted(node.driver.devices)
            node.claims.objects[("ns", "c1")] = _claim("c1", "uid-1", names[:2])
            node.claims.objects[("ns", "bad")] = _claim("bad", "uid-bad", ["gpu-nope"])
            request = pb.NodePrepareResourcesRequest(
                claims=[
                    pb.Claim(namespace="ns", uid="uid-1", name="c1"),
                    pb.Claim(namespace="ns", uid="uid-bad", name="bad"),
                ]
            )
            first = await call(endpoint, PREPARE, request, pb.NodePrepareResourcesResponse)
            ok = first.claims["uid-1"]
            assert ok.error == ""
            assert [d.device_name for d in ok.devices] == names[:2]
            uuid = node.driver.devices[names[0]].device.base_uuid
            assert list(ok.devices[0].cdi_device_ids) == [f"{DRIVER}/gpu={uuid}"]
            assert ok.devices[0].pool_name == NODE
            assert "not published by this node" in first.claims["uid-bad"].error
            again = await call(endpoint, PREPARE, request, pb.NodePrepareResourcesResponse)
            assert again.claims["uid-1"] == ok
            # the CDI spec the runtime resolves those names with
            spec = (short_dir / "cdi" / f"{DRIVER}-gpu.json").read_text()
            assert uuid in spec
        # the agent restarts (a new driver over the same directories) and the API is gone
        store = InventoryStore(sim_node("dgx-h100").discover())
        claims = Claims()
        driver = _driver(short_dir, store, claims, Slices(), node.config)
        async with running(driver):
            endpoint = short_dir / "plugins" / DRIVER / "dra.sock"
            request = pb.NodePrepareResourcesRequest(
                claims=[pb.Claim(namespace="ns", uid="uid-1", name="c1")]
            )
            after = await call(endpoint, PREPARE, request, pb.NodePrepareResourcesResponse)
            assert after.claims["uid-1"] == ok
            assert claims.reads == 0
            unprepare = pb.NodeUnprepareResourcesRequest(
                claims=[pb.Claim(namespace="ns", uid="uid-1", name="c1")]
            )
            for _ in range(2):
                done = await call(endpoint, UNPREPARE, unprepare, pb.NodeUnprepareResourcesResponse)
                assert done.claims["uid-1"].error == ""
            assert driver.checkpoint.claims == {}

    run(body())


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
def test_health_stream_reports_a_fault_and_the_recovery(short_dir: Path, version: str) -> None:
    hpb: Any = health_v1_pb2 if version == "v1" else health_pb2

    async def body() -> None:
        async with dra_node(short_dir) as node:
            endpoint = short_dir / "plugins" / DRIVER / "dra.sock"
            async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
                watch = channel.unary_stream(
                    WATCH[version],
                    request_serializer=hpb.NodeWatchResourcesRequest.SerializeToString,
                    response_deserializer=hpb.NodeWatchResourcesResponse.FromString,
                )
                stream = watch(hpb.NodeWatchResourcesRequest())
                first = await stream.read()
                assert len(first.devices) == 8
                assert {d.health for d in first.devices} == {hpb.HEALTHY}
                assert {d.device.pool_name for d in first.devices} == {NODE}
                gpu = node.store.inventory.gpus[3]
                node.store.set_health({gpu.uuid: DeviceHealth(Health.UNHEALTHY, "xid 79")})
                second = await stream.read()
                bad = [d for d in second.devices if d.health == hpb.UNHEALTHY]
                assert [d.device.device_name for d in bad] == [gpu.uuid.lower()]
                assert bad[0].message == "xid 79"
                node.store.set_health({})
                third = await stream.read()
                assert {d.health for d in third.devices} == {hpb.HEALTHY}
                stream.cancel()

    run(body())


def test_slices_are_published_once_and_again_only_on_change(short_dir: Path) -> None:
    async def body() -> None:
        async with dra_node(short_dir, "gb200-nvl72:rack=1,tray=2") as node:
            await _until(lambda: len(node.slices.applied) == 1)
            (obj,) = node.slices.applied
            assert obj["spec"]["pool"]["generation"] == 1
            assert len(obj["spec"]["devices"]) == 4
            # a health change that changes nothing in the slices writes nothing
            gpu = node.store.inventory.gpus[0]
            node.store.set_health({gpu.uuid: DeviceHealth(Health.UNHEALTHY, "xid 79")})
            await asyncio.sleep(0.2)
            assert len(node.slices.applied) == 1
            # an inventory change that does (a GPU gone) writes the next generation
            inv = node.store.inventory
            node.store.set_inventory(
                type(inv)(**{**{f: getattr(inv, f) for f in inv.__dataclass_fields__}, "gpus": inv.gpus[1:]})
            )
            await _until(lambda: len(node.slices.applied) == 2)
            assert node.slices.applied[1]["spec"]["pool"]["generation"] == 2
            assert len(node.slices.applied[1]["spec"]["devices"]) == 3

    run(body())


def test_health_book_decisions_become_taints_and_recovery_removes_them(short_dir: Path) -> None:
    """Health as device taints, one owner: the health book's decision (GPU lost) becomes a
    NoSchedule ``/lost`` taint on that GPU, a degraded fabric an informational ``/fabric`` taint (effect
    None), and both go when the node says the device recovered; every change is one pool write."""

    async def body() -> None:
        sim = sim_node("gb200-nvl72:rack=1,tray=2")
        store = InventoryStore(sim.discover())
        book = HealthBook(config=HealthConfig(recovery_quiet_s=1))
        book.set_inventory(store.inventory, 0.0)
        config = DraConfig(enabled=True, plugin_dir=str(short_dir / "p"), registry_dir=str(short_dir / "r"))
        slices = Slices()
        faults = health_faults(store, DEFAULT_FABRIC_POLICY)
        driver = _driver(short_dir, store, Claims(), slices, config, faults=faults)
        async with running(driver):
            await _until(lambda: len(slices.applied) >= 1)
            assert len(slices.applied) == 1
            assert not any("taints" in d for d in slices.applied[0]["spec"]["devices"])
            gpu = store.inventory.gpus[2]
            book.on_probe(gpu.uuid, answered=False, lost=True, now=1.0)
            store.set_health(book.table())
            await _until(lambda: len(slices.applied) >= 2)
            assert len(slices.applied) == 2
            tainted = {d["name"]: d["taints"] for d in slices.applied[1]["spec"]["devices"] if "taints" in d}
            assert tainted == {
                device_name(gpu.uuid): [
                    {
                        "key": "gpu.gpuagent.dev/lost",
                        "effect": "NoSchedule",
                        "value": "GPU-lost-not-answering-NVML",
                    }
                ]
            }
            # a degraded fabric on another GPU: told, not withdrawn
            other = store.inventory.gpus[0]
            inv = store.inventory
            degraded = [
                dataclasses.replace(f, health_summary=FabricHealthSummary.LIMITED_CAPACITY)
                if f.gpu_index == other.index
                else f
                for f in inv.fabric
            ]
            store.set_inventory(dataclasses.replace(inv, fabric=tuple(degraded)))
            await _until(lambda: len(slices.applied) >= 3)
            assert len(slices.applied) == 3
            tainted = {d["name"]: d["taints"] for d in slices.applied[2]["spec"]["devices"] if "taints" in d}
            assert tainted[device_name(other.uuid)] == [
                {
                    "key": "gpu.gpuagent.dev/fabric",
                    "effect": "None",
                    "value": "fabric-degraded-limited_capacity",
                }
            ]
            assert set(tainted) == {device_name(gpu.uuid), device_name(other.uuid)}
            # the GPU answers again (re-enumerated: a reset) and stays quiet: the book clears it, the
            # taint goes
            book.on_probe(gpu.uuid, answered=True, lost=False, now=2.0)
            book.on_probe(gpu.uuid, answered=True, lost=False, now=5.0)
            store.set_health(book.table())
            await _until(lambda: len(slices.applied) >= 4)
            assert len(slices.applied) == 4
            tainted = {d["name"] for d in slices.applied[3]["spec"]["devices"] if "taints" in d}
            assert tainted == {device_name(other.uuid)}

    run(body())


def test_registration_socket_removed_under_the_driver_is_served_again(short_dir: Path) -> None:
    async def body() -> None:
        async with dra_node(short_dir) as node:
            await plugin_watcher(short_dir / "registry")
            socket = short_dir / "registry" / f"{DRIVER}-reg.sock"
            socket.unlink()
            await _until(socket.exists)
            assert not node.driver.registered
            await plugin_watcher(short_dir / "registry")
            assert node.driver.registered

    run(body())


def test_unusable_registry_dir_is_reported_and_retried_without_stopping(short_dir: Path) -> None:
    async def body() -> None:
        sim = sim_node("dgx-h100")
        store = InventoryStore(sim.discover())
        (short_dir / "r").write_text("not a directory")
        config = DraConfig(enabled=True, plugin_dir=str(short_dir / "p"), registry_dir=str(short_dir / "r"))
        driver = _driver(short_dir, store, Claims(), Slices(), config)
        async with running(driver):
            problem = driver.problem() or ""
            assert f"cannot prepare {short_dir / 'r'}" in problem
            assert driver.service_socket.exists()  # the rest keeps serving
            (short_dir / "r").unlink()
            await _until((short_dir / "r" / f"{DRIVER}-reg.sock").exists)
            await _until(lambda: "not registered with the kubelet yet" in (driver.problem() or ""))

    run(body())


def test_device_plugin_leaves_dra_resources_alone(short_dir: Path) -> None:
    """Each device is served by one API: with DRA serving the GPUs, the device plugin advertises none."""

    async def body() -> None:
        sim = sim_node("dgx-h100")
        store = InventoryStore(sim.discover())
        config = DraConfig(enabled=True)
        async with running_kubelet(short_dir / "dp") as kubelet:
            manager = PluginManager(
                store=store,
                config=PluginConfig(),
                kubelet_dir=short_dir / "dp",
                served_elsewhere=config.serves,
            )
            assert manager.plan().resources == ()
            stop = asyncio.Event()
            task = asyncio.create_task(manager.run(stop))
            await manager.started.wait()
            await asyncio.sleep(0.2)
            assert kubelet.registrations == []
            stop.set()
            await task

    (short_dir / "dp").mkdir()
    run(body())


async def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


class HeldSlices(Slices):
    """Slices whose first write waits until the test lets it finish (a write under way)."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.release = threading.Event()

    def apply_slice(self, obj: Mapping[str, Any]) -> None:
        if not self.applied:
            self.writing.set()
            self.release.wait(10)
        super().apply_slice(obj)


def test_a_health_change_while_the_pool_is_written_is_published_next(short_dir: Path) -> None:
    """The change that arrives while a write is under way is not lost when that write ends."""

    async def body() -> None:
        sim = sim_node("dgx-h100")
        store = InventoryStore(sim.discover())
        book = HealthBook(config=HealthConfig(recovery_quiet_s=1))
        book.set_inventory(store.inventory, 0.0)
        config = DraConfig(enabled=True, plugin_dir=str(short_dir / "p"), registry_dir=str(short_dir / "r"))
        slices = HeldSlices()
        driver = _driver(
            short_dir, store, Claims(), slices, config, faults=health_faults(store, DEFAULT_FABRIC_POLICY)
        )
        async with running(driver):
            await asyncio.to_thread(slices.writing.wait, 10)
            gpu = store.inventory.gpus[1]
            book.on_probe(gpu.uuid, answered=False, lost=True, now=1.0)
            store.set_health(book.table())
            slices.release.set()
            await _until(lambda: any("taints" in d for s in slices.applied for d in s["spec"]["devices"]))

    run(body())


def test_imex_channel_holds_a_lost_checkpoint_left_are_given_back_once_the_driver_runs(
    short_dir: Path,
) -> None:
    """Issue 31: an agent that starts with its checkpoint gone gives back the holds the domain's record
    keeps for its node that no claim accounts for any more; other nodes' holds stay."""
    from deviceplugin.dra.channelbook import KubeChannelBook
    from deviceplugin.dra.channels import ChannelRequest, ClaimIdentity, parse_record
    from deviceplugin.dra.imexchannel import ImexChannels
    from tests.deviceplugin.test_dra_channels import DOMAIN, FakeConfigMaps

    api = FakeConfigMaps()
    book = KubeChannelBook(api, namespace="gpu-system")  # type: ignore[arg-type]
    gone = ClaimIdentity("team-a", "w-0", "uid-w0")
    book.acquire(DOMAIN, ChannelRequest(gang="team-a/gone", claim=gone), NODE)
    book.acquire(
        DOMAIN, ChannelRequest(gang="team-b/runs", claim=ClaimIdentity("team-b", "r-0", "u")), "node-b"
    )
    proc = short_dir / "proc-devices"
    proc.write_text("Character devices:\n510 nvidia-caps-imex-channels\n")
    channels = ImexChannels(
        book=book,
        node_name=NODE,
        driver=DRIVER,
        domain=lambda: DOMAIN,
        dev_root=short_dir / "dev",
        proc_devices=proc,
        cdi_dir=short_dir / "cdi",
        allow_stand_in=True,
        claim_get=lambda namespace, name: None,  # the claim the record names for this node is gone
    )
    store = InventoryStore(sim_node("gb200-nvl72").discover())
    config = DraConfig(
        enabled=True, plugin_dir=str(short_dir / "plugins"), registry_dir=str(short_dir / "registry")
    )
    driver = _driver(short_dir, store, Claims(), Slices(), config, channels=channels)

    def holders() -> dict[int, Any]:
        found, _, _ = parse_record(next(iter(api.objects.values()))["data"])
        return {c: h.nodes for c, h in found.items()}

    async def body() -> None:
        assert holders() == {1: (NODE,), 2: ("node-b",)}
        async with running(driver):
            await _until(lambda: holders() == {2: ("node-b",)})
            writes = api.writes
            await asyncio.sleep(0.1)  # polls go on: it is given back once, not looked at again
            assert api.writes == writes

    run(body())


def test_a_failed_reconcile_gives_nothing_back_and_is_tried_again_with_a_doubling_back_off(
    short_dir: Path,
) -> None:
    """A GET of a claim the record names that fails (not a 404: the API down, or RBAC) releases nothing;
    the driver tries again after 1 s, then 2 s (its back-off), and releases once a GET says the claim is
    gone."""
    from deviceplugin.dra.channelbook import KubeChannelBook
    from deviceplugin.dra.channels import ChannelRequest, ClaimIdentity, parse_record
    from deviceplugin.dra.imexchannel import ImexChannels
    from tests.deviceplugin.test_dra_channels import DOMAIN, FakeConfigMaps
    from topology.kube import KubeError

    api = FakeConfigMaps()
    book = KubeChannelBook(api, namespace="gpu-system")  # type: ignore[arg-type]
    book.acquire(DOMAIN, ChannelRequest(gang="team-a/gone", claim=ClaimIdentity("team-a", "w-0", "u0")), NODE)
    gets: list[str] = []

    def claim_get(namespace: str, name: str) -> Any:
        gets.append(name)
        if len(gets) < 3:
            raise KubeError(503, "the API server is unavailable")
        return None

    proc = short_dir / "proc-devices"
    proc.write_text("Character devices:\n510 nvidia-caps-imex-channels\n")
    channels = ImexChannels(
        book=book,
        node_name=NODE,
        driver=DRIVER,
        domain=lambda: DOMAIN,
        dev_root=short_dir / "dev",
        proc_devices=proc,
        cdi_dir=short_dir / "cdi",
        allow_stand_in=True,
        claim_get=claim_get,
    )
    now = [0.0]
    store = InventoryStore(sim_node("gb200-nvl72").discover())
    config = DraConfig(
        enabled=True, plugin_dir=str(short_dir / "plugins"), registry_dir=str(short_dir / "registry")
    )
    driver = _driver(short_dir, store, Claims(), Slices(), config, channels=channels, clock=lambda: now[0])

    def held() -> set[int]:
        return set(parse_record(next(iter(api.objects.values()))["data"])[0])

    seen = []
    for t in (0.0, 0.5, 1.0, 2.9, 3.0, 10.0):
        now[0] = t
        asyncio.run(driver._reconcile())
        seen.append((len(gets), held()))
    assert seen == [(1, {1}), (1, {1}), (2, {1}), (2, {1}), (3, set()), (3, set())]
