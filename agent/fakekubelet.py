"""An in-process stand-in for kubelet's device manager, for benchmarks and tests.

It serves the real ``v1beta1.Registration`` service on ``<dir>/kubelet.sock`` and, like kubelet, opens
``ListAndWatch`` on every plugin that registers and keeps the latest device list per resource. It can
restart the way kubelet does (stop, remove every socket in the directory, serve a new kubelet.sock).
It is not kubelet: the e2e tests run the real device manager; this is for fast, exact measurements.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc


@dataclass(frozen=True, slots=True)
class Registration:
    resource_name: str
    endpoint: str
    version: str
    preferred: bool
    at: float  # time.perf_counter() when it arrived


@dataclass
class FakeKubelet:
    directory: Path
    reject: bool = False
    registrations: list[Registration] = field(default_factory=list)
    devices: dict[str, dict[str, str]] = field(default_factory=dict)  # resource -> device ID -> health
    numa: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    listeners: list[Callable[[str, dict[str, str]], None]] = field(default_factory=list)
    on_register: list[Callable[[Registration], None]] = field(default_factory=list)  # called on arrival
    _server: grpc.aio.Server | None = None
    _watchers: list[asyncio.Task[None]] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def socket(self) -> Path:
        return self.directory / "kubelet.sock"

    async def start(self) -> None:
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    def registered(self, request: pb.RegisterRequest) -> None:
        """Record a registration and start watching the plugin (as kubelet does)."""
        registration = Registration(
            request.resource_name,
            request.endpoint,
            request.version,
            request.options.get_preferred_allocation_available,
            time.perf_counter(),
        )
        self.registrations.append(registration)
        for listener in list(self.on_register):
            listener(registration)
        self._watchers.append(asyncio.create_task(self._watch(request.resource_name, request.endpoint)))
        self._bump()

    async def _watch(self, resource: str, endpoint: str) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async with grpc.aio.insecure_channel(f"unix://{self.directory / endpoint}") as channel:
                stub = pb_grpc.DevicePluginStub(channel)
                async for reply in stub.ListAndWatch(pb.Empty()):
                    devices = {d.ID: d.health for d in reply.devices}
                    self.devices[resource] = devices
                    self.numa[resource] = {d.ID: [n.ID for n in d.topology.nodes] for d in reply.devices}
                    for listener in list(self.listeners):
                        listener(resource, devices)
                    self._bump()

    def _bump(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until ``predicate()`` holds (checked on every change); TimeoutError after ``timeout``."""
        async with asyncio.timeout(timeout):
            while not predicate():
                await self._changed.wait()

    async def stop(self) -> None:
        watchers, self._watchers = self._watchers, []
        for task in watchers:
            task.cancel()
        for task in watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
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


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    async def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:  # noqa: N802
        if self._kubelet.reject:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "registration rejected")
        self._kubelet.registered(request)
        return pb.Empty()


@contextlib.asynccontextmanager
async def running_kubelet(directory: Path) -> AsyncIterator[FakeKubelet]:
    kubelet = FakeKubelet(directory)
    await kubelet.start()
    try:
        yield kubelet
    finally:
        await kubelet.stop()
