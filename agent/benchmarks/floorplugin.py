"""The least a device plugin in Python can be: ``bench deviceplugin --peer nvidia --floor`` runs it beside
ours and NVIDIA's, so the figures a Python plugin cannot go below are measured, not guessed.

It is the interpreter, ``grpc`` and our generated v1beta1 stubs, nothing else: it lists the GPUs it is
given Healthy once, answers ``Allocate`` with ``NVIDIA_VISIBLE_DEVICES``, ``GetPreferredAllocation`` with
the first devices it may take, and registers with the kubelet once. No NVML, no health, no config, no
asyncio, no logging, no metrics, no re-registration: whatever ours spends above it is ours to cut; what it
spends itself is the runtime's.

Run: ``python -m agent.benchmarks.floorplugin KUBELET_DIR RESOURCE ID [ID ...]``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc

ENDPOINT = "floor.sock"


class FloorPlugin(pb_grpc.DevicePluginServicer):
    def __init__(self, ids: list[str], stop: threading.Event) -> None:
        self.ids = ids
        self.stop = stop

    def GetDevicePluginOptions(  # noqa: N802
        self, request: pb.Empty, context: Any
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:  # noqa: N802
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health="Healthy") for i in self.ids])
        self.stop.wait()  # nothing ever changes; the stream stays open as the kubelet expects

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:  # noqa: N802
        return pb.AllocateResponse(
            container_responses=[
                pb.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(r.devices_ids)})
                for r in request.container_requests
            ]
        )

    def GetPreferredAllocation(  # noqa: N802
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        answers = []
        for r in request.container_requests:
            chosen = list(r.must_include_deviceIDs)
            chosen += [d for d in r.available_deviceIDs if d not in chosen][: r.allocation_size - len(chosen)]
            answers.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return pb.PreferredAllocationResponse(container_responses=answers)

    def PreStartContainer(  # noqa: N802
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def serve(kubelet_dir: Path, resource: str, ids: list[str]) -> None:
    stop = threading.Event()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_DevicePluginServicer_to_server(FloorPlugin(ids, stop), server)
    socket = kubelet_dir / ENDPOINT
    socket.unlink(missing_ok=True)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    with grpc.insecure_channel(f"unix://{kubelet_dir / 'kubelet.sock'}") as channel:
        pb_grpc.RegistrationStub(channel).Register(
            pb.RegisterRequest(
                version="v1beta1",
                endpoint=ENDPOINT,
                resource_name=resource,
                options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
            ),
            timeout=10,
        )
    try:
        server.wait_for_termination()
    finally:
        stop.set()


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(
            "usage: python -m agent.benchmarks.floorplugin KUBELET_DIR RESOURCE ID [ID ...]", file=sys.stderr
        )
        return 2
    serve(Path(argv[0]), argv[1], argv[2:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
