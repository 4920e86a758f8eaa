"""Async client of the kubelet pod-resources API v1 over its unix socket.

One channel for the client's life (gRPC reconnects by itself when the kubelet restarts and re-creates
the socket). The channel keeps its own connection state (a local subchannel pool): a failed connect
of another channel to the same socket, with its reconnect back-off, does not fail this one. Each call
has a deadline; errors surface as :class:`PodResourcesError` with one line that names the socket and
the gRPC status.
"""

from __future__ import annotations

import grpc
import grpc.aio

from agent.podresources.api import api_pb2, api_pb2_grpc
from agent.podresources.model import AllocatableDevice, Assignment, PodResourcesSnapshot
from deviceplugin.unixgrpc import unix_channel


class PodResourcesError(Exception):
    """A pod-resources call failed (socket missing, kubelet down, deadline, …)."""


class PodResourcesClient:
    def __init__(self, socket_path: str, *, timeout_s: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerAsyncStub | None = None

    def _ensure(self) -> api_pb2_grpc.PodResourcesListerAsyncStub:
        if self._stub is None:
            self._channel = unix_channel(self.socket_path)
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    async def list(self) -> tuple[tuple[Assignment, ...], int]:
        """Every (pod, container, device) row of ``List``, sorted, and the number of pods listed."""
        stub = self._ensure()
        try:
            reply = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise PodResourcesError(self._describe("List", exc)) from None
        rows: list[Assignment] = []
        for pod in reply.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    for device_id in devices.device_ids:
                        rows.append(
                            Assignment(
                                namespace=pod.namespace,
                                pod=pod.name,
                                container=container.name,
                                resource=devices.resource_name,
                                device_id=device_id,
                            )
                        )
                # DRA claims: one row per CDI device, as "<kind>=<id>" names it (ours: the GPU/MIG UUID);
                # the resource is the driver's name
                for dynamic in container.dynamic_resources:
                    for claimed in dynamic.claim_resources:
                        for cdi in claimed.cdi_devices:
                            rows.append(
                                Assignment(
                                    namespace=pod.namespace,
                                    pod=pod.name,
                                    container=container.name,
                                    resource=claimed.driver_name,
                                    device_id=cdi.name.rpartition("=")[2],
                                )
                            )
        return tuple(sorted(set(rows))), len(reply.pod_resources)

    async def allocatable(self) -> tuple[AllocatableDevice, ...] | None:
        """``GetAllocatableResources`` as sorted rows; ``None`` when the kubelet does not implement it."""
        stub = self._ensure()
        try:
            reply = await stub.GetAllocatableResources(
                api_pb2.AllocatableResourcesRequest(), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise PodResourcesError(self._describe("GetAllocatableResources", exc)) from None
        rows = {
            AllocatableDevice(resource=d.resource_name, device_id=device_id)
            for d in reply.devices
            for device_id in d.device_ids
        }
        return tuple(sorted(rows))

    async def snapshot(self) -> PodResourcesSnapshot:
        """``List`` then ``GetAllocatableResources``; a failing second call leaves ``allocatable`` None."""
        assignments, pods = await self.list()
        try:
            allocatable = await self.allocatable()
        except PodResourcesError:
            allocatable = None
        return PodResourcesSnapshot(assignments=assignments, allocatable=allocatable, pods_listed=pods)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)
        self._channel = None
        self._stub = None

    def _describe(self, rpc: str, exc: grpc.aio.AioRpcError) -> str:
        detail = (exc.details() or "").splitlines()[0] if exc.details() else ""
        return f"pod-resources {rpc} on {self.socket_path}: {exc.code().name} {detail}".rstrip()
