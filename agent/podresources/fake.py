"""A fake kubelet pod-resources server on a real unix socket, for tests and benchmarks.

It speaks the real v1 wire protocol (our generated stubs), so the client under test cannot tell it from
the kubelet. Pods are set with :meth:`FakePodResourcesServer.set_pods`; ``fail_with`` makes every call
answer a gRPC error (to exercise error paths); ``calls`` counts requests per RPC.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from agent.podresources.api import api_pb2, api_pb2_grpc


@dataclass(frozen=True, slots=True)
class FakeContainer:
    name: str
    devices: Mapping[str, Sequence[str]] = field(default_factory=dict)  # resource -> device IDs
    # DRA: driver -> CDI device names ("<kind>=<id>") of one claim the container holds
    claims: Mapping[str, Sequence[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FakePod:
    namespace: str
    name: str
    containers: tuple[FakeContainer, ...] = ()


def _to_proto(pod: FakePod) -> api_pb2.PodResources:
    return api_pb2.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=[
            api_pb2.ContainerResources(
                name=c.name,
                devices=[
                    api_pb2.ContainerDevices(resource_name=r, device_ids=list(ids))
                    for r, ids in sorted(c.devices.items())
                ],
                dynamic_resources=[
                    api_pb2.DynamicResource(
                        claim_name=f"{c.name}-claim",
                        claim_namespace=pod.namespace,
                        claim_resources=[
                            api_pb2.ClaimResource(
                                driver_name=driver,
                                pool_name="pool",
                                device_name=name.rpartition("=")[2].lower(),
                                cdi_devices=[api_pb2.CDIDevice(name=name)],
                            )
                            for name in names
                        ],
                    )
                    for driver, names in sorted(c.claims.items())
                ],
            )
            for c in pod.containers
        ],
    )


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, owner: FakePodResourcesServer) -> None:
        self._owner = owner

    async def List(  # noqa: N802 - gRPC method name
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.ListPodResourcesResponse:
        self._owner.calls["List"] = self._owner.calls.get("List", 0) + 1
        if self._owner.fail_with is not None:
            await context.abort(self._owner.fail_with, "fake kubelet told to fail")
        return api_pb2.ListPodResourcesResponse(pod_resources=self._owner.pods_proto)

    async def GetAllocatableResources(  # noqa: N802 - gRPC method name
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.AllocatableResourcesResponse:
        self._owner.calls["GetAllocatableResources"] = self._owner.calls.get("GetAllocatableResources", 0) + 1
        if self._owner.fail_with is not None:
            await context.abort(self._owner.fail_with, "fake kubelet told to fail")
        if self._owner.allocatable is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "GetAllocatableResources not served")
        return api_pb2.AllocatableResourcesResponse(
            devices=[
                api_pb2.ContainerDevices(resource_name=r, device_ids=list(ids))
                for r, ids in sorted((self._owner.allocatable or {}).items())
            ]
        )

    async def Get(  # noqa: N802 - gRPC method name
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.GetPodResourcesResponse:
        for pod in self._owner.pods:
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return api_pb2.GetPodResourcesResponse(pod_resources=_to_proto(pod))
        await context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name}")
        raise AssertionError("abort returned")  # pragma: no cover - abort always raises


class FakePodResourcesServer:
    """``async with FakePodResourcesServer(path) as kubelet: ...`` or ``start()`` / ``stop()``."""

    def __init__(
        self,
        socket_path: str,
        *,
        pods: Iterable[FakePod] = (),
        allocatable: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.pods: tuple[FakePod, ...] = ()
        self.pods_proto: list[api_pb2.PodResources] = []
        self.allocatable = allocatable
        self.fail_with: grpc.StatusCode | None = None
        self.calls: dict[str, int] = {}
        self._server: grpc.aio.Server | None = None
        self.set_pods(pods)

    def set_pods(self, pods: Iterable[FakePod]) -> None:
        self.pods = tuple(pods)
        self.pods_proto = [_to_proto(p) for p in self.pods]

    async def start(self) -> None:
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    async def __aenter__(self) -> FakePodResourcesServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
