from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.metrics.cache import MetricsCache, XidCounter
from agent.nvml.errors import NVMLError, NVMLError_GpuIsLost, NVMLError_LibRmVersionMismatch
from agent.nvml.protocol import GpuSample, MigSample, NvmlCounters, ProcessInfo, ProcessUtilization
from agent.podresources.cache import PodResourcesStats
from agent.podresources.model import Assignment, PodResourcesSnapshot
from tests.agent.metrics.builders import GIB, gpu_uuid, make_inventory, make_sample, mig_uuid

INV = make_inventory(gpus=3, mig={2: [(1, "3g.40gb")]})


class StubBackend:
    """Just the calls the cache makes, with per-GPU failures and a call log."""

    def __init__(self) -> None:
        self.fail: dict[int, NVMLError] = {}
        self.calls: list[tuple[str, Any]] = []
        self.processes: dict[int, tuple[ProcessInfo, ...]] = {}

    def sample(self, index: int) -> GpuSample:
        self.calls.append(("sample", index))
        if index in self.fail:
            raise self.fail[index]
        return make_sample(index=index, processes=self.processes.get(index, ()))

    def mig_sample(self, uuid: str) -> MigSample:
        self.calls.append(("mig_sample", uuid))
        return MigSample(uuid=uuid, memory_used_bytes=GIB, memory_total_bytes=40 * GIB)

    def fabric(self, index: int) -> None:
        self.calls.append(("fabric", index))

    def process_utilization(self, index: int) -> tuple[ProcessUtilization, ...]:
        self.calls.append(("process_utilization", index))
        return tuple(ProcessUtilization(p.pid, 10, 1) for p in self.processes.get(index, ()))

    def counters(self) -> NvmlCounters:
        return NvmlCounters(calls=len(self.calls), errors_by_code={"GPU_IS_LOST": len(self.fail)})


def _cache(backend: StubBackend, **kwargs: Any) -> MetricsCache:
    return MetricsCache(backend=backend, inventory=lambda: INV, hostname="node-a", **kwargs)  # type: ignore[arg-type]


def test_refresh_reads_every_gpu_and_mig_device_once_and_skips_process_utilization_of_unshared_gpus() -> None:
    backend = StubBackend()
    snap = asyncio.run(_cache(backend).refresh())
    assert sorted(c for c in backend.calls if c[0] == "sample") == [
        ("sample", 0),
        ("sample", 1),
        ("sample", 2),
    ]
    assert [c for c in backend.calls if c[0] == "mig_sample"] == [("mig_sample", mig_uuid(2, 1))]
    assert not [c for c in backend.calls if c[0] in ("process_utilization", "fabric")]
    assert [g.sample is not None for g in snap.gpus] == [True, True, True]
    assert snap.gpus[2].migs[0].sample is not None
    assert snap.refresh.refreshes == 1
    assert snap.refresh.podresources_up is None


def test_a_lost_gpu_marks_only_that_gpu_and_readiness_stays_fine() -> None:
    backend = StubBackend()
    backend.fail[1] = NVMLError_GpuIsLost()
    cache = _cache(backend)
    assert cache.nvml_problem() == "waiting for the first NVML refresh"
    snap = asyncio.run(cache.refresh())
    assert snap.gpus[1].sample is None
    assert snap.gpus[1].error == "GPU_IS_LOST: GPU is lost"
    assert cache.nvml_problem() is None
    assert snap.refresh.nvml_errors == (("GPU_IS_LOST", 1),)


def test_driver_upgrade_mismatch_fails_readiness_loudly_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = StubBackend()
    for i in range(3):
        backend.fail[i] = NVMLError_LibRmVersionMismatch()
    cache = _cache(backend)
    snap = asyncio.run(cache.refresh())
    problem = cache.nvml_problem()
    assert problem is not None
    assert "LIB_RM_VERSION_MISMATCH" in problem
    assert "restart the agent pod" in problem
    assert snap.refresh.nvml_problem == problem
    assert any(
        "nvml_unusable" in r.getMessage() or getattr(r, "gna_event", "") == "nvml_unusable"
        for r in caplog.records
    )
    backend.fail.clear()
    asyncio.run(cache.refresh())
    assert cache.nvml_problem() is None


def test_shared_gpu_processes_are_read_and_mapped_to_pods() -> None:
    backend = StubBackend()
    backend.processes[0] = (ProcessInfo(pid=42, used_memory_bytes=GIB),)
    pr = PodResourcesSnapshot(
        assignments=(Assignment("ml", "a", "main", "nvidia.com/gpu", f"{gpu_uuid(0)}::0"),), pods_listed=1
    )

    class Mapper:
        def map(self, pids: Any) -> dict[int, Any]:
            from agent.metrics.attribution import PodOfProcess

            return {p: PodOfProcess("ml", "a", "uid") for p in pids}

    cache = _cache(
        backend,
        podresources=lambda: (pr, PodResourcesStats(refreshes=1, last_success_unix=5.0)),
        pid_mapper=Mapper(),
    )
    snap = asyncio.run(cache.refresh())
    assert ("process_utilization", 0) in backend.calls
    sh = snap.gpus[0].sharing
    assert sh is not None
    assert sh.split
    assert [(s.owner.pod, s.utilization_percent, s.memory_used_bytes) for s in sh.shares] == [("a", 10, GIB)]
    assert snap.refresh.podresources_up is True
    assert snap.refresh.pods_listed == 1


def test_xid_counter_counts_per_gpu_and_remembers_the_last() -> None:
    from agent.nvml.protocol import EventKind, NvmlEvent

    xids = XidCounter()
    for xid in (79, 48, 79):
        xids.record(NvmlEvent(EventKind.XID, 0, gpu_uuid(0), xid=xid))
    xids.record(NvmlEvent(EventKind.GPU_LOST, 1, gpu_uuid(1)))
    assert xids.of(gpu_uuid(0)) == (((48, 1), (79, 2)), 79)
    assert xids.of(gpu_uuid(1)) == ((), None)


def test_run_refreshes_until_stopped() -> None:
    backend = StubBackend()
    cache = _cache(backend, interval_s=0.01)

    async def main() -> int:
        stop = asyncio.Event()
        task = asyncio.create_task(cache.run(stop))
        for _ in range(500):
            if cache.snapshot().refresh.refreshes >= 3:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, timeout=5)
        return cache.snapshot().refresh.refreshes

    assert asyncio.run(main()) >= 3


def test_bad_interval_is_rejected() -> None:
    with pytest.raises(ValueError, match="metrics refresh interval must be > 0 s"):
        _cache(StubBackend(), interval_s=0)


def test_counts_xids_infers_the_last_xid_from_what_grew() -> None:
    from agent.metrics.cache import CountsXids

    table: dict[tuple[str, int], int] = {}
    xids = CountsXids(lambda: table)
    xids.refresh()
    assert xids.of(gpu_uuid(0)) == ((), None)
    table[(gpu_uuid(0), 48)] = 1
    xids.refresh()
    assert xids.of(gpu_uuid(0)) == (((48, 1),), 48)
    table[(gpu_uuid(0), 79)] = 1
    xids.refresh()
    assert xids.of(gpu_uuid(0)) == (((48, 1), (79, 1)), 79)
    xids.refresh()  # nothing grew: the last XID stays
    assert xids.of(gpu_uuid(0))[1] == 79
    table[(gpu_uuid(0), 48)] = 4
    table[(gpu_uuid(0), 79)] = 2
    xids.refresh()
    assert xids.of(gpu_uuid(0))[1] == 48  # grew by 3 against 1


def test_a_gpu_lost_after_discovery_keeps_its_identity_and_is_unhealthy() -> None:
    import dataclasses

    from agent.metrics.cache import CountsXids

    placeholder = dataclasses.replace(
        INV.gpus[1], uuid="", name="", pci_bus_id="", lost=True, error="identity: GPU is lost"
    )
    lost_inv = dataclasses.replace(INV, gpus=(INV.gpus[0], placeholder, INV.gpus[2]))
    current = {"inv": INV}
    counts = {(gpu_uuid(1), 79): 1}
    cache = MetricsCache(
        backend=StubBackend(),  # type: ignore[arg-type]
        inventory=lambda: current["inv"],
        hostname="node-a",
        device_health=lambda uuid: True,
        xids=CountsXids(lambda: counts),
    )
    asyncio.run(cache.refresh())
    current["inv"] = lost_inv  # rediscovery after XID 79
    snap = asyncio.run(cache.refresh())
    view = snap.gpus[1]
    assert view.gpu.uuid == gpu_uuid(1)
    assert view.gpu.lost
    assert view.healthy is False
    assert view.sample is None
    assert view.error == "GPU lost at discovery"
    assert view.xid_counts == ((79, 1),)
    assert snap.gpus[0].healthy is True
