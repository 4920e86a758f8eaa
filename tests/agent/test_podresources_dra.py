"""Devices a container got through a DRA claim reach the pod-resources rows (``dynamic_resources``, one
row per CDI device) and our metrics attribute them to the pod like device-plugin devices."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from agent.metrics.attribution import DeviceResolver, Owner, attribute
from agent.podresources.client import PodResourcesClient
from agent.podresources.fake import FakeContainer, FakePod, FakePodResourcesServer
from agent.podresources.model import Assignment
from tests.deviceplugin.helpers import inventory


@pytest.fixture
def socket_path() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="pr-", dir="/tmp")
    try:
        yield os.path.join(d, "kubelet.sock")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_dra_claims_are_listed_and_attributed(socket_path: str) -> None:
    inv = inventory("dgx-h100")
    dra_gpu, plugin_gpu = inv.gpus[1].uuid, inv.gpus[2].uuid
    pods = (
        FakePod(
            "ml",
            "train-0",
            (
                FakeContainer(
                    "main",
                    {"nvidia.com/gpu": [plugin_gpu]},
                    claims={
                        "gpu.gpuagent.dev": [f"gpu.gpuagent.dev/gpu={dra_gpu}"],
                        "net.example.com": ["x/y=nic0"],
                    },
                ),
            ),
        ),
    )

    async def main() -> None:
        async with FakePodResourcesServer(socket_path, pods=pods, allocatable={}):
            client = PodResourcesClient(socket_path)
            try:
                snapshot = await client.snapshot()
            finally:
                await client.close()
        assert snapshot.assignments == (
            Assignment("ml", "train-0", "main", "gpu.gpuagent.dev", dra_gpu),
            Assignment("ml", "train-0", "main", "net.example.com", "nic0"),
            Assignment("ml", "train-0", "main", "nvidia.com/gpu", plugin_gpu),
        )
        owners = attribute(snapshot, DeviceResolver(inv)).owners
        owner = Owner(namespace="ml", pod="train-0", container="main")
        assert owners == {dra_gpu: (owner,), plugin_gpu: (owner,)}

    asyncio.run(main())
