"""The thin gRPC side of the DRA driver: the ``v1.DRAPlugin`` and ``DRAResourceHealth`` (``v1``, and
``v1alpha1`` for kubelets 1.37-1.39 that negotiate it) services on the service socket
(``<pluginDir>/<driver>/dra.sock``), and the plugin watcher's ``pluginregistration.Registration`` on
the registration socket (``<registryDir>/<driver>-reg.sock``).

Registration works the kubelet's way round: the kubelet's plugin watcher finds the registration socket,
calls ``GetInfo`` (type ``DRAPlugin``, the driver name, the service socket, the services we serve) and
then ``NotifyRegistrationStatus``. Answers come from a :class:`~deviceplugin.dra.prepare.Preparer` and a
:class:`HealthView`; this module decides nothing.

This module is the only hand-written code that imports the DRA stubs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from deviceplugin.dra.api import dra_pb2 as pb
from deviceplugin.dra.api import dra_pb2_grpc as pb_grpc
from deviceplugin.dra.api import health_pb2 as hpb
from deviceplugin.dra.api import health_pb2_grpc as hpb_grpc
from deviceplugin.dra.api import health_v1_pb2 as h1pb
from deviceplugin.dra.api import health_v1_pb2_grpc as h1pb_grpc
from deviceplugin.dra.api import registration_pb2 as rpb
from deviceplugin.dra.api import registration_pb2_grpc as rpb_grpc
from deviceplugin.dra.prepare import ClaimRef, Preparer
from deviceplugin.server import PluginError, check_socket_path

PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICE = "v1.DRAPlugin"
HEALTH_SERVICE = "v1.DRAResourceHealth"
HEALTH_SERVICE_ALPHA = "v1alpha1.DRAResourceHealth"  # the kubelet accepts it from 1.37 to 1.39
SUPPORTED_SERVICES = (DRA_SERVICE, HEALTH_SERVICE, HEALTH_SERVICE_ALPHA)
MAX_CLAIMS_PER_CALL = 4096

DeviceHealthRow = tuple[str, str, bool, str]
"""(pool, device name, healthy, reason) of one published device."""


class HealthView:
    """What the health stream sends: the published devices' health, read from ``rows`` (the driver's
    view of the node) whenever it is sent; :meth:`changed` wakes the streams."""

    def __init__(self, rows: Callable[[], Sequence[DeviceHealthRow]]) -> None:
        self._rows = rows
        self.version = 0
        self.closed = False
        self._event = asyncio.Event()
        self._sent: list[DeviceHealthRow] | None = None

    def rows(self) -> list[DeviceHealthRow]:
        return list(self._rows())

    def changed(self) -> None:
        """Wake the streams when what they would send differs from the last time."""
        rows = self.rows()
        if rows == self._sent:
            return
        self._sent = rows
        self._bump()

    def close(self) -> None:
        self.closed = True
        self._bump()

    async def wait(self, since: int) -> int:
        while self.version == since and not self.closed:
            await self._event.wait()
        return self.version

    def _bump(self) -> None:
        self.version += 1
        event, self._event = self._event, asyncio.Event()
        event.set()


def health_response(rows: Sequence[DeviceHealthRow], now: int, api: Any = hpb) -> Any:
    """The stream message of the health API module ``api`` (v1alpha1 or v1: the same fields)."""
    return api.NodeWatchResourcesResponse(
        devices=[
            api.DeviceHealth(
                device=api.DeviceIdentifier(pool_name=pool, device_name=name),
                health=api.HEALTHY if healthy else api.UNHEALTHY,
                last_updated_time=now,
                message=reason,
            )
            for pool, name, healthy, reason in rows
        ]
    )


def _refs(claims: Sequence[pb.Claim]) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


class DraPluginService(pb_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    async def NodePrepareResources(  # noqa: N802
        self, request: pb.NodePrepareResourcesRequest, context: Any
    ) -> pb.NodePrepareResourcesResponse:
        if len(request.claims) > MAX_CLAIMS_PER_CALL:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"more than {MAX_CLAIMS_PER_CALL} claims in one call"
            )
        out = pb.NodePrepareResourcesResponse()
        refs = [ref for ref in _refs(request.claims) if ref.uid]  # the answer is keyed by UID
        answers = await asyncio.gather(*(self.preparer.prepare(ref) for ref in refs))  # API reads overlap
        for ref, got in zip(refs, answers, strict=True):
            entry = out.claims[ref.uid]
            entry.error = got.error
            for d in got.devices:
                entry.devices.append(
                    pb.Device(
                        request_names=list(d.request_names),
                        pool_name=d.pool_name,
                        device_name=d.device_name,
                        cdi_device_ids=list(d.cdi_device_ids),
                    )
                )
        return out

    async def NodeUnprepareResources(  # noqa: N802
        self, request: pb.NodeUnprepareResourcesRequest, context: Any
    ) -> pb.NodeUnprepareResourcesResponse:
        if len(request.claims) > MAX_CLAIMS_PER_CALL:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"more than {MAX_CLAIMS_PER_CALL} claims in one call"
            )
        out = pb.NodeUnprepareResourcesResponse()
        for ref in _refs(request.claims):
            if ref.uid:
                out.claims[ref.uid].error = await self.preparer.unprepare(ref)
        return out


class _HealthStream:
    """``NodeWatchResources``: the whole set first, then the set again on every change."""

    api: Any = hpb

    def __init__(self, view: HealthView, clock: Callable[[], float] = time.time) -> None:
        self.view = view
        self._clock = clock

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        version = self.view.version
        yield health_response(self.view.rows(), int(self._clock()), self.api)
        while True:
            version = await self.view.wait(version)
            if self.view.closed:
                return
            yield health_response(self.view.rows(), int(self._clock()), self.api)


class DraHealthService(_HealthStream, hpb_grpc.DRAResourceHealthServicer):
    """``v1alpha1.DRAResourceHealth``."""

    api = hpb


class DraHealthServiceV1(_HealthStream, h1pb_grpc.DRAResourceHealthServicer):
    """``v1.DRAResourceHealth``."""

    api = h1pb


class RegistrationService(rpb_grpc.RegistrationServicer):
    def __init__(self, *, driver: str, endpoint: str, on_status: Callable[[bool, str], None]) -> None:
        self._info = rpb.PluginInfo(
            type=PLUGIN_TYPE, name=driver, endpoint=endpoint, supported_versions=list(SUPPORTED_SERVICES)
        )
        self._on_status = on_status

    async def GetInfo(self, request: rpb.InfoRequest, context: Any) -> rpb.PluginInfo:  # noqa: N802
        return self._info

    async def NotifyRegistrationStatus(  # noqa: N802
        self, request: rpb.RegistrationStatus, context: Any
    ) -> rpb.RegistrationStatusResponse:
        self._on_status(bool(request.plugin_registered), request.error)
        return rpb.RegistrationStatusResponse()


class UnixServer:
    """One gRPC server on one unix socket; knows whether its socket file is still the one it made."""

    def __init__(self, socket_path: Path, add: Callable[[grpc.aio.Server], None], *, grace_s: float) -> None:
        check_socket_path(socket_path)
        self.socket_path = socket_path
        self._add = add
        self._grace = grace_s
        self._server: grpc.aio.Server | None = None
        self._inode: int | None = None

    async def start(self) -> None:
        try:
            self.socket_path.parent.mkdir(parents=True, exist_ok=True)
            self.socket_path.unlink(missing_ok=True)
        except OSError as exc:
            raise PluginError(f"cannot prepare {self.socket_path}: {exc.strerror or exc}") from None
        server = grpc.aio.server()
        self._add(server)
        try:
            port = server.add_insecure_port(f"unix://{self.socket_path}")
        except RuntimeError:
            port = 0
        if port == 0:
            await server.stop(0)
            raise PluginError(f"cannot listen on {self.socket_path}")
        await server.start()
        self._server = server
        try:
            self._inode = self.socket_path.stat().st_ino
        except OSError as exc:
            await self.stop(0)
            raise PluginError(f"{self.socket_path} vanished after bind: {exc.strerror or exc}") from None

    def present(self) -> bool:
        try:
            return self.socket_path.stat().st_ino == self._inode
        except OSError:
            return False

    async def stop(self, grace_s: float | None = None) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(self._grace if grace_s is None else grace_s)
        if self.present():
            with contextlib.suppress(OSError):
                self.socket_path.unlink()
        self._inode = None


def service_server(
    socket_path: Path, *, preparer: Preparer, health: HealthView, grace_s: float
) -> UnixServer:
    def add(server: grpc.aio.Server) -> None:
        pb_grpc.add_DRAPluginServicer_to_server(DraPluginService(preparer), server)
        hpb_grpc.add_DRAResourceHealthServicer_to_server(DraHealthService(health), server)
        h1pb_grpc.add_DRAResourceHealthServicer_to_server(DraHealthServiceV1(health), server)

    return UnixServer(socket_path, add, grace_s=grace_s)


def registration_server(
    socket_path: Path, *, driver: str, endpoint: Path, on_status: Callable[[bool, str], None], grace_s: float
) -> UnixServer:
    def add(server: grpc.aio.Server) -> None:
        rpb_grpc.add_RegistrationServicer_to_server(
            RegistrationService(driver=driver, endpoint=str(endpoint), on_status=on_status), server
        )

    return UnixServer(socket_path, add, grace_s=grace_s)
