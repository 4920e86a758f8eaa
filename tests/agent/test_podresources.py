"""The pod-resources client and cache against a fake kubelet over a real unix socket."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator

import grpc
import pytest

from agent.podresources.cache import PodResourcesCache
from agent.podresources.client import PodResourcesClient, PodResourcesError
from agent.podresources.fake import FakeContainer, FakePod, FakePodResourcesServer
from agent.podresources.model import AllocatableDevice, Assignment

PODS = (
    FakePod(
        "ml",
        "train-0",
        (
            FakeContainer("main", {"nvidia.com/gpu": ["GPU-a", "GPU-b"]}),
            FakeContainer("sidecar", {}),
        ),
    ),
    FakePod(
        "ml",
        "infer-0",
        (FakeContainer("srv", {"nvidia.com/gpu": ["GPU-c::1"], "example.com/nic": ["nic0"]}),),
    ),
    FakePod("kube-system", "dns", (FakeContainer("coredns"),)),
)


@pytest.fixture
def socket_path() -> Iterator[str]:
    """A short directory: unix socket paths are limited to 107 bytes."""
    d = tempfile.mkdtemp(prefix="pr-", dir="/tmp")
    try:
        yield os.path.join(d, "kubelet.sock")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_list_and_allocatable_over_a_real_socket(socket_path: str) -> None:
    async def main() -> None:
        async with FakePodResourcesServer(
            socket_path, pods=PODS, allocatable={"nvidia.com/gpu": ["GPU-c::0", "GPU-c::1"]}
        ):
            client = PodResourcesClient(socket_path)
            try:
                rows, pods = await client.list()
                assert pods == 3
                assert rows == (
                    Assignment("ml", "infer-0", "srv", "example.com/nic", "nic0"),
                    Assignment("ml", "infer-0", "srv", "nvidia.com/gpu", "GPU-c::1"),
                    Assignment("ml", "train-0", "main", "nvidia.com/gpu", "GPU-a"),
                    Assignment("ml", "train-0", "main", "nvidia.com/gpu", "GPU-b"),
                )
                assert await client.allocatable() == (
                    AllocatableDevice("nvidia.com/gpu", "GPU-c::0"),
                    AllocatableDevice("nvidia.com/gpu", "GPU-c::1"),
                )
                snap = await client.snapshot()
                assert snap.for_resources(("nvidia.com/",)) == rows[1:]
            finally:
                await client.close()

    asyncio.run(main())


def test_allocatable_is_none_when_the_kubelet_does_not_serve_it(socket_path: str) -> None:
    async def main() -> None:
        async with FakePodResourcesServer(socket_path, pods=PODS, allocatable=None):
            client = PodResourcesClient(socket_path)
            try:
                snap = await client.snapshot()
                assert snap.allocatable is None
                assert snap.pods_listed == 3
            finally:
                await client.close()

    asyncio.run(main())


def test_errors_name_the_socket_and_the_status(socket_path: str) -> None:
    async def main() -> None:
        client = PodResourcesClient(socket_path, timeout_s=10)
        try:
            with pytest.raises(PodResourcesError, match=rf"pod-resources List on {socket_path}: UNAVAILABLE"):
                await client.list()
        finally:
            await client.close()
        async with FakePodResourcesServer(socket_path, pods=PODS) as kubelet:
            kubelet.fail_with = grpc.StatusCode.PERMISSION_DENIED
            client = PodResourcesClient(socket_path, timeout_s=10)
            try:
                with pytest.raises(
                    PodResourcesError, match=r"List on .*: PERMISSION_DENIED fake kubelet told to fail"
                ):
                    await client.list()
            finally:
                await client.close()

    asyncio.run(main())


def test_cache_keeps_the_last_good_snapshot_through_a_kubelet_restart(socket_path: str) -> None:
    async def main() -> None:
        cache = PodResourcesCache(client=PodResourcesClient(socket_path, timeout_s=10), interval_s=60)
        kubelet = FakePodResourcesServer(socket_path, pods=PODS)
        await kubelet.start()
        try:
            assert await cache.refresh()
            first = cache.snapshot()
            assert len(first.assignments) == 4
            assert cache.stats().generation == 1
            assert await cache.refresh()
            assert cache.stats().generation == 1  # unchanged content, same generation
            await kubelet.stop()
            assert not await cache.refresh()
            assert cache.snapshot() is first
            assert cache.stats().errors == 1
            assert cache.stats().last_error is not None
            # the kubelet comes back on a new socket at the same path with one pod fewer
            kubelet.set_pods(PODS[1:])
            await kubelet.start()
            ok = False
            for _ in range(50):  # gRPC reconnects with backoff; bounded wait
                if await cache.refresh():
                    ok = True
                    break
                await asyncio.sleep(0.1)
            assert ok
            assert cache.stats().last_error is None
            assert len(cache.snapshot().assignments) == 2
            assert cache.stats().generation == 2
        finally:
            await kubelet.stop()
            await cache._client.close()

    asyncio.run(main())


def test_cache_run_refreshes_until_stopped_and_closes_the_client(socket_path: str) -> None:
    async def main() -> None:
        async with FakePodResourcesServer(socket_path, pods=PODS) as kubelet:
            cache = PodResourcesCache(client=PodResourcesClient(socket_path), interval_s=0.01)
            stop = asyncio.Event()
            task = asyncio.create_task(cache.run(stop))
            for _ in range(500):
                if kubelet.calls.get("List", 0) >= 3:
                    break
                await asyncio.sleep(0.01)
            stop.set()
            await asyncio.wait_for(task, timeout=5)
            assert kubelet.calls["List"] >= 3

    asyncio.run(main())


def test_bad_interval_is_rejected() -> None:
    with pytest.raises(ValueError, match="pod-resources refresh interval"):
        PodResourcesCache(client=PodResourcesClient("/nonexistent"), interval_s=0)
