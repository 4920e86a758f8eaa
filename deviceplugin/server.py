"""The thin gRPC side: one ``v1beta1.DevicePlugin`` server per resource on a unix socket, and the
``Register`` call to kubelet. Everything it answers comes from a :class:`PluginState` the manager keeps
current, and from the node's device health read when answering (never copied); decisions (allocation,
preferred allocation) are the pure functions of this package.

This module and :mod:`deviceplugin.manager` are the only hand-written code that imports the stubs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc
from deviceplugin.config import PluginConfig
from deviceplugin.container import AllocationError, allocate
from deviceplugin.node import DeviceHealthSource
from deviceplugin.preferred import PreferenceError, Topology, preferred_allocation
from deviceplugin.resources import Resource
from deviceplugin.unixgrpc import unix_channel
from topology import logs
from topology.model import Health

API_VERSION = "v1beta1"
MAX_UNIX_PATH = 107  # sun_path holds 108 bytes including the terminating NUL


class PluginError(RuntimeError):
    """A plugin could not start or register (one line, says what and where)."""


class PluginState:
    """What one resource's server answers from. Updated on the event loop by the manager; each update
    that changes the advertised list wakes every ListAndWatch stream.

    Health is read from ``health`` (the node) each time it is needed, never kept here; the manager calls
    :meth:`refresh` when the node says health changed, which wakes the streams if the list moved.
    """

    def __init__(
        self,
        *,
        resource: Resource,
        topology: Topology,
        config: PluginConfig,
        health: DeviceHealthSource,
    ) -> None:
        self.resource = resource
        self.topology = topology
        self.config = config
        self._health = health
        self.version = 0
        self.closed = False
        self._changed = asyncio.Event()
        self._advertised = self.devices()  # the list the streams were last woken for
        self.allocations = 0
        self.allocation_errors = 0

    @property
    def unhealthy(self) -> dict[str, str]:
        """The resource's devices the node reports unhealthy now, with the reason."""
        out: dict[str, str] = {}
        for d in self.resource.devices:
            status = self._health.device_health(d.health_keys)
            if not status.healthy:
                out[d.id] = status.reason or "unhealthy"
        return out

    def update(self, *, resource: Resource | None = None, topology: Topology | None = None) -> bool:
        """Replace what changed; returns True (and wakes the streams) when the advertised list changed."""
        if resource is not None:
            self.resource = resource
        if topology is not None:
            self.topology = topology
        return self.refresh()

    def refresh(self) -> bool:
        """Wake the streams when the advertised list (IDs, health, NUMA) differs from the last one they
        were woken for; returns whether it did."""
        devices = self.devices()
        if devices == self._advertised:
            return False
        self._advertised = devices
        self._bump()
        return True

    def close(self) -> None:
        self.closed = True
        self._bump()

    def devices(self) -> list[tuple[str, Health, int | None]]:
        unhealthy = self.unhealthy
        return [
            (d.id, Health.UNHEALTHY if d.id in unhealthy else Health.HEALTHY, d.numa_node)
            for d in self.resource.devices
        ]

    async def wait(self, since: int) -> int:
        while self.version == since and not self.closed:
            await self._changed.wait()
        return self.version

    def _bump(self) -> None:
        self.version += 1
        event, self._changed = self._changed, asyncio.Event()
        event.set()


def list_response(state: PluginState) -> pb.ListAndWatchResponse:
    devices = []
    for device_id, health, numa in state.devices():
        topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)]) if numa is not None and numa >= 0 else None
        devices.append(pb.Device(ID=device_id, health=health.value, topology=topo))
    return pb.ListAndWatchResponse(devices=devices)


class DevicePluginService(pb_grpc.DevicePluginServicer):
    def __init__(self, state: PluginState) -> None:
        self.state = state
        self._log = logs.get_logger("deviceplugin.server").bind(resource=state.resource.name)

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:  # noqa: N802
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(  # noqa: N802
        self, request: pb.Empty, context: Any
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        version = self.state.version
        yield list_response(self.state)
        while True:
            version = await self.state.wait(version)
            if self.state.closed:
                return
            yield list_response(self.state)

    async def GetPreferredAllocation(  # noqa: N802
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        """Health is read here, on the event loop; the choice itself runs in a worker thread, so a
        request for thousands of devices never holds the loop (health probes, other plugins)."""
        state = self.state
        unhealthy = state.unhealthy
        healthy = {d.id: d.id not in unhealthy for d in state.resource.devices}
        candidates = state.resource.candidates(healthy)
        topology, policy = state.topology, state.config.allocation_policy
        asks = [
            (list(req.available_deviceIDs), list(req.must_include_deviceIDs), int(req.allocation_size))
            for req in request.container_requests
        ]

        def choose() -> list[tuple[str, ...]]:
            return [
                preferred_allocation(
                    candidates=candidates,
                    topology=topology,
                    available=available,
                    must_include=must,
                    size=size,
                    policy=policy,
                )
                for available, must, size in asks
            ]

        try:
            chosen = await asyncio.to_thread(choose)
        except PreferenceError as exc:
            shown = ", ".join(exc.unknown[:5]) + (
                f" and {len(exc.unknown) - 5} more" if len(exc.unknown) > 5 else ""
            )
            message = f"must_include names devices {state.resource.name} does not have: {shown}"
            self._log.warning("preferred_allocation_refused", reason=message)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
            raise  # abort raises; this keeps type checkers and readers sure of it
        responses = [pb.ContainerPreferredAllocationResponse(deviceIDs=list(ids)) for ids in chosen]
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:  # noqa: N802
        state = self.state
        responses = []
        for req in request.container_requests:
            try:
                got = allocate(
                    state.resource, list(req.devices_ids), unhealthy=state.unhealthy, config=state.config
                )
            except AllocationError as exc:
                state.allocation_errors += 1
                self._log.warning("allocate_refused", device=exc.device, reason=str(exc))
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                raise  # abort raises; this keeps type checkers and readers sure of it
            responses.append(
                pb.ContainerAllocateResponse(
                    envs=got.envs,
                    mounts=[
                        pb.Mount(
                            container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
                        )
                        for m in got.mounts
                    ],
                    annotations=got.annotations,
                    cdi_devices=[pb.CDIDevice(name=n) for n in got.cdi_devices],
                    devices=[
                        pb.DeviceSpec(
                            container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
                        )
                        for d in got.devices
                    ],
                )
            )
        state.allocations += 1
        return pb.AllocateResponse(container_responses=responses)

    async def PreStartContainer(  # noqa: N802
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def check_socket_path(path: Path) -> None:
    if len(os.fsencode(path)) > MAX_UNIX_PATH:
        raise PluginError(
            f"socket path {path} is longer than {MAX_UNIX_PATH} bytes; use a shorter --kubelet-dir"
        )


class PluginServer:
    """One resource's gRPC server on ``socket_path``."""

    def __init__(self, *, state: PluginState, socket_path: Path, grace_s: float = 1.0) -> None:
        check_socket_path(socket_path)
        self.state = state
        self.socket_path = socket_path
        self.grace_s = grace_s
        self._server: grpc.aio.Server | None = None
        self._inode: int | None = None

    async def start(self, *, check_timeout_s: float = 5.0) -> None:
        """Serve, then prove the socket answers (a GetDevicePluginOptions call over it)."""
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise PluginError(f"cannot replace {self.socket_path}: {exc.strerror or exc}") from None
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(DevicePluginService(self.state), server)
        try:
            port = server.add_insecure_port(f"unix://{self.socket_path}")
        except RuntimeError:  # grpcio raises where older releases returned 0
            port = 0
        if port == 0:
            await server.stop(0)
            raise PluginError(
                f"cannot listen on {self.socket_path}: "
                + ("no such directory" if not self.socket_path.parent.is_dir() else "bind failed")
            )
        await server.start()
        self._server = server
        try:
            self._inode = self.socket_path.stat().st_ino
            async with unix_channel(self.socket_path) as channel:
                stub = pb_grpc.DevicePluginStub(channel)
                await stub.GetDevicePluginOptions(pb.Empty(), timeout=check_timeout_s, wait_for_ready=True)
        except (OSError, grpc.aio.AioRpcError) as exc:
            await self.stop()
            raise PluginError(f"plugin socket {self.socket_path} does not answer: {_one_line(exc)}") from None

    def socket_present(self) -> bool:
        """True while our socket file is in place (kubelet removes it when it restarts)."""
        try:
            return self.socket_path.stat().st_ino == self._inode
        except OSError:
            return False

    async def stop(self, grace_s: float | None = None) -> None:
        self.state.close()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(self.grace_s if grace_s is None else grace_s)
        if self.socket_present():
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        self._inode = None


async def register(
    kubelet_socket: Path, *, endpoint: str, resource_name: str, timeout_s: float = 5.0
) -> None:
    """``Register`` with kubelet; raises :class:`PluginError` naming the socket and the reason."""
    request = pb.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
    )
    try:
        async with unix_channel(kubelet_socket) as channel:
            stub = pb_grpc.RegistrationStub(channel)
            await stub.Register(request, timeout=timeout_s, wait_for_ready=True)
    except grpc.aio.AioRpcError as exc:
        raise PluginError(
            f"registering {resource_name} with {kubelet_socket} failed: {_one_line(exc)}"
        ) from None


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        detail = (exc.details() or "").splitlines()
        return f"{exc.code().name} {detail[0] if detail else ''}".strip()
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
