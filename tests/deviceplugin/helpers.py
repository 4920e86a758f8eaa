"""Builders shared by the device-plugin tests: simulated nodes and a kubelet Registration server."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio

from agent.discovery import discover
from agent.nvml.fake import SimulatedNvml
from agent.nvml.simulate import build_simulator, parse_spec
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc
from topology.model import Host, NodeInventory


@dataclass
class SimNode:
    sim: SimulatedNvml
    sysfs: Path
    host: Host

    def discover(self) -> NodeInventory:
        return discover(nvml=self.sim, sysfs_root=self.sysfs, host=self.host)


def sim_node(profile: str, *, faults: Path | None = None, sysfs: Path | None = None) -> SimNode:
    spec = parse_spec(profile)
    sim = build_simulator(spec, faults_path=faults)
    sim.init()
    machine = spec.machine()
    host = Host(
        name=machine.hostname,
        cpu_count=machine.cpu_count,
        memory_bytes=machine.memory_bytes,
        numa_nodes=machine.numa_nodes,
    )
    return SimNode(sim=sim, sysfs=sysfs or Path(tempfile.gettempdir()) / "gna-empty-sysfs", host=host)


def inventory(profile: str) -> NodeInventory:
    return sim_node(profile).discover()


@dataclass
class Registration:
    resource_name: str
    endpoint: str
    version: str
    preferred: bool


@dataclass
class FakeKubelet:
    """A real gRPC ``v1beta1.Registration`` server on ``<dir>/kubelet.sock`` that, like kubelet, opens
    ListAndWatch on every registered plugin and keeps the latest device list per resource."""

    directory: Path
    registrations: list[Registration] = field(default_factory=list)
    devices: dict[str, dict[str, str]] = field(default_factory=dict)  # resource -> id -> health
    numa: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    reject: bool = False
    _server: grpc.aio.Server | None = None
    _watchers: list[asyncio.Task[None]] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def socket(self) -> Path:
        return self.directory / "kubelet.sock"

    async def start(self) -> None:
        kubelet = self

        class Service(pb_grpc.RegistrationServicer):
            async def Register(self, request: pb.RegisterRequest, context: object) -> pb.Empty:  # noqa: N802
                if kubelet.reject:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "rejected by test")  # type: ignore[attr-defined]
                kubelet.registrations.append(
                    Registration(
                        request.resource_name,
                        request.endpoint,
                        request.version,
                        request.options.get_preferred_allocation_available,
                    )
                )
                kubelet._watchers.append(
                    asyncio.create_task(kubelet._watch(request.resource_name, request.endpoint))
                )
                kubelet._bump()
                return pb.Empty()

        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(Service(), server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def _watch(self, resource: str, endpoint: str) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async with grpc.aio.insecure_channel(f"unix://{self.directory / endpoint}") as channel:
                stub = pb_grpc.DevicePluginStub(channel)
                async for reply in stub.ListAndWatch(pb.Empty()):
                    self.devices[resource] = {d.ID: d.health for d in reply.devices}
                    self.numa[resource] = {d.ID: [n.ID for n in d.topology.nodes] for d in reply.devices}
                    self._bump()

    def _bump(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until ``predicate()`` holds (re-checked on every change), failing after ``timeout``."""
        async with asyncio.timeout(timeout):
            while not predicate():
                await self._changed.wait()

    async def stop(self) -> None:
        for task in self._watchers:
            task.cancel()
        for task in self._watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._watchers.clear()
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    async def restart(self) -> None:
        """As kubelet does: stop, remove every socket in the directory, serve a new kubelet.sock."""
        await self.stop()
        for path in self.directory.glob("*.sock"):
            path.unlink()
        self.devices.clear()
        await self.start()


@contextlib.asynccontextmanager
async def running_kubelet(directory: Path) -> AsyncIterator[FakeKubelet]:
    kubelet = FakeKubelet(directory)
    await kubelet.start()
    try:
        yield kubelet
    finally:
        await kubelet.stop()


async def plugin_stub(socket: Path) -> tuple[grpc.aio.Channel, pb_grpc.DevicePluginAsyncStub]:
    channel = grpc.aio.insecure_channel(f"unix://{socket}")
    return channel, pb_grpc.DevicePluginStub(channel)
