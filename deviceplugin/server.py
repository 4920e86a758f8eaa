"""The thin gRPC side: one ``v1beta1.DevicePlugin`` server per resource on a unix socket, and the
``Register`` call to kubelet. Everything it answers comes from a :class:`PluginState` the manager keeps
current, and from the node's device health read when answering (never copied); decisions (allocation,
preferred allocation) are the pure functions of this package.

The plugin's server is gRPC's thread-pool server, not ``grpc.aio``: kubelet's calls are short and answered
from state that is only read, and the pool server answers a unary call with about a third less CPU and
a shorter tail than the asyncio one (``bench deviceplugin --peer nvidia``, Allocate). The manager and the
rest of the agent stay on the event loop: they replace the state's fields whole, and a change wakes the
ListAndWatch streams (each in a pool thread) through a condition variable as well as the loop's event.
The client call (``Register``) stays on ``grpc.aio``.

This module and :mod:`deviceplugin.manager` are the only hand-written code that imports the stubs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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
SERVER_THREADS = 8
"""Pool threads of one resource's server: kubelet holds one ListAndWatch stream (two for a moment after
it restarts) and makes one call at a time to a plugin; threads start only as calls need them."""
STREAM_CHECK_S = 1.0
"""How often an idle ListAndWatch stream checks that kubelet is still connected (it ends when not)."""
MAX_STREAMS = 2
"""ListAndWatch streams one server keeps: a newer one ends the oldest (kubelet's current connection is
the newest), so streams never take the threads that Allocate needs."""


class PluginError(RuntimeError):
    """A plugin could not start or register (one line, says what and where)."""


class PluginState:
    """What one resource's server answers from. Updated on the event loop by the manager (fields
    replaced whole, so the server's threads read one value or the other); each update that changes the
    advertised list wakes every ListAndWatch stream, in a thread (:meth:`wait_blocking`) or a coroutine
    (:meth:`wait`).

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
        self._condition = threading.Condition()
        self._advertised = self.devices()  # the list the streams were last woken for
        self._counts = threading.Lock()
        self.allocations = 0
        self.allocation_errors = 0

    def count(self, *, error: bool) -> None:
        """One Allocate answered (``error``: refused); called from the server's threads."""
        with self._counts:
            if error:
                self.allocation_errors += 1
            else:
                self.allocations += 1

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

    def wait_blocking(self, since: int, timeout_s: float, *, ended: threading.Event | None = None) -> int:
        """From a thread: the version once it differs from ``since`` (or the state closed, or ``ended``
        set and :meth:`wake_threads` called), or after ``timeout_s`` whatever it is."""
        with self._condition:
            self._condition.wait_for(
                lambda: self.version != since or self.closed or (ended is not None and ended.is_set()),
                timeout_s,
            )
            return self.version

    def wake_threads(self) -> None:
        """Make every :meth:`wait_blocking` look again (a stream was told to end)."""
        with self._condition:
            self._condition.notify_all()

    def _bump(self) -> None:
        with self._condition:
            self.version += 1
            self._condition.notify_all()
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
        self._streams: list[threading.Event] = []  # one per live ListAndWatch, oldest first; set: end it
        self._streams_lock = threading.Lock()

    def _open_stream(self) -> threading.Event:
        ended = threading.Event()
        with self._streams_lock:
            self._streams.append(ended)
            excess = self._streams[:-MAX_STREAMS]
            for old in excess:
                old.set()
        if excess:
            self._log.info("stream_replaced", streams=MAX_STREAMS + len(excess), ended=len(excess))
            self.state.wake_threads()
        return ended

    def _close_stream(self, ended: threading.Event) -> None:
        with self._streams_lock:
            if ended in self._streams:
                self._streams.remove(ended)

    # Each method runs in one of the server's pool threads (never on the event loop).

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:  # noqa: N802
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:  # noqa: N802
        """The list now, then again each time it changes, until the state closes, kubelet goes, or
        :data:`MAX_STREAMS` newer streams are open."""
        state = self.state
        ended = self._open_stream()
        try:
            version = state.version
            yield list_response(state)
            while context.is_active() and not ended.is_set():
                now = state.wait_blocking(version, STREAM_CHECK_S, ended=ended)
                if state.closed or ended.is_set():
                    return
                if now != version:
                    version = now
                    yield list_response(state)
        finally:
            self._close_stream(ended)

    def GetPreferredAllocation(  # noqa: N802
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        state = self.state
        resource = state.resource
        unhealthy = state.unhealthy
        healthy = {d.id: d.id not in unhealthy for d in resource.devices}
        candidates = resource.candidates(healthy)
        topology, policy = state.topology, state.config.allocation_policy
        try:
            chosen = [
                preferred_allocation(
                    candidates=candidates,
                    topology=topology,
                    available=list(req.available_deviceIDs),
                    must_include=list(req.must_include_deviceIDs),
                    size=int(req.allocation_size),
                    policy=policy,
                )
                for req in request.container_requests
            ]
        except PreferenceError as exc:
            shown = ", ".join(exc.unknown[:5]) + (
                f" and {len(exc.unknown) - 5} more" if len(exc.unknown) > 5 else ""
            )
            message = f"must_include names devices {resource.name} does not have: {shown}"
            self._log.warning("preferred_allocation_refused", reason=message)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
            raise  # abort raises; this keeps type checkers and readers sure of it
        responses = [pb.ContainerPreferredAllocationResponse(deviceIDs=list(ids)) for ids in chosen]
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:  # noqa: N802
        state = self.state
        resource, config = state.resource, state.config
        responses = []
        for req in request.container_requests:
            try:
                got = allocate(resource, list(req.devices_ids), unhealthy=state.unhealthy, config=config)
            except AllocationError as exc:
                state.count(error=True)
                self._log.warning("allocate_refused", device=exc.device, reason=str(exc))
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
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
        state.count(error=False)
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(  # noqa: N802
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
        self._server: grpc.Server | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._inode: int | None = None

    async def start(self, *, check_timeout_s: float = 5.0) -> None:
        """Serve, then prove the socket takes connections (a unix-socket connect, microseconds: a gRPC call
        over a fresh channel took milliseconds, and every kubelet restart waits for it)."""
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise PluginError(f"cannot replace {self.socket_path}: {exc.strerror or exc}") from None
        name = self.state.resource.name.rpartition("/")[2]
        pool = ThreadPoolExecutor(max_workers=SERVER_THREADS, thread_name_prefix=f"plugin-{name}")
        server = grpc.server(pool)
        pb_grpc.add_DevicePluginServicer_to_server(DevicePluginService(self.state), server)
        try:
            port = server.add_insecure_port(f"unix://{self.socket_path}")
        except RuntimeError:  # grpcio raises where older releases returned 0
            port = 0
        if port == 0:
            server.stop(0)
            pool.shutdown(wait=False)
            raise PluginError(
                f"cannot listen on {self.socket_path}: "
                + ("no such directory" if not self.socket_path.parent.is_dir() else "bind failed")
            )
        server.start()
        self._server, self._pool = server, pool
        try:
            self._inode = self.socket_path.stat().st_ino
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(check_timeout_s)
                probe.connect(os.fsencode(self.socket_path))
        except OSError as exc:
            await self.stop()
            raise PluginError(f"plugin socket {self.socket_path} does not answer: {_one_line(exc)}") from None

    def socket_present(self) -> bool:
        """True while our socket file is in place (kubelet removes it when it restarts)."""
        try:
            return self.socket_path.stat().st_ino == self._inode
        except OSError:
            return False

    async def stop(self, grace_s: float | None = None) -> None:
        self.state.close()  # the streams end at once
        server, self._server = self._server, None
        pool, self._pool = self._pool, None
        if server is not None:
            stopped = server.stop(self.grace_s if grace_s is None else grace_s)
            await asyncio.to_thread(stopped.wait)
        if pool is not None:
            pool.shutdown(wait=False)  # its threads end once their calls have (the server cancelled them)
        if self.socket_present():
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        self._inode = None


async def register(
    kubelet_socket: Path, *, endpoint: str, resource_name: str, timeout_s: float = 5.0
) -> None:
    """``Register`` with kubelet; raises :class:`PluginError` naming the socket and the reason. A socket
    nobody listens on (kubelet stopping, or not serving yet) fails at once instead of waiting out gRPC's
    reconnect back-off (a second): the manager tries again when the folder changes or after its own
    back-off."""
    request = pb.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
    )
    try:
        async with unix_channel(kubelet_socket) as channel:
            stub = pb_grpc.RegistrationStub(channel)
            await stub.Register(request, timeout=timeout_s, wait_for_ready=False)
    except grpc.aio.AioRpcError as exc:
        raise PluginError(
            f"registering {resource_name} with {kubelet_socket} failed: {_one_line(exc)}"
        ) from None


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        detail = (exc.details() or "").splitlines()
        return f"{exc.code().name} {detail[0] if detail else ''}".strip()
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
