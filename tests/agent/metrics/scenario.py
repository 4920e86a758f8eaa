"""One node with every case the renderings must handle, as a snapshot built by the real code path."""

from __future__ import annotations

from agent.metrics.attribution import DeviceResolver, PodOfProcess, attribute
from agent.metrics.cache import Reads, XidCounter, build_snapshot
from agent.metrics.snapshot import MetricsSnapshot, RefreshStats
from agent.nvml.fabric import decode_health_mask
from agent.nvml.protocol import EventKind, NvmlEvent, ProcessInfo, ProcessUtilization
from agent.podresources.model import AllocatableDevice, Assignment, PodResourcesSnapshot
from tests.agent.metrics.builders import GIB, gpu_uuid, make_inventory, make_mig_sample, make_sample, mig_uuid
from topology.model import FabricHealthSummary, FabricInfo, FabricState

INVENTORY = make_inventory(gpus=4, mig={3: [(1, "3g.40gb"), (2, "1g.10gb")]})


def _row(pod: str, device_id: str, resource: str = "nvidia.com/gpu") -> Assignment:
    return Assignment(namespace="ml", pod=pod, container="main", resource=resource, device_id=device_id)


PODRESOURCES = PodResourcesSnapshot(
    assignments=(
        _row("train-0", gpu_uuid(0)),
        _row("infer-a", f"{gpu_uuid(1)}::0"),
        _row("infer-b", f"{gpu_uuid(1)}::1"),
        _row("mig-pod", mig_uuid(3, 1), "nvidia.com/mig-3g.40gb"),
    ),
    allocatable=tuple(AllocatableDevice("nvidia.com/gpu", f"{gpu_uuid(1)}::{n}") for n in range(4)),
    pods_listed=4,
)


def scenario(*, pids_visible: bool = True, fabric_mask: int = 0x1A6) -> MetricsSnapshot:
    """GPU 0 held by one pod, with fabric and XIDs; GPU 1 shared by two pods (4 replicas); GPU 2's read
    failed and it is unhealthy; GPU 3 in MIG mode with one MIG device held by a pod."""
    shared_procs = (
        ProcessInfo(pid=100, used_memory_bytes=3 * GIB),
        ProcessInfo(pid=200, used_memory_bytes=5 * GIB),
    )
    reads = Reads(
        samples={
            0: make_sample(
                index=0, util=97, used=70 * GIB, processes=(ProcessInfo(pid=50, used_memory_bytes=70 * GIB),)
            ),
            1: make_sample(index=1, util=60, used=8 * GIB, processes=shared_procs),
            3: make_sample(index=3, util=0, used=0),
        },
        errors={2: "GPU_IS_LOST: GPU is lost"},
        fabric={
            0: FabricInfo(
                gpu_index=0,
                cluster_uuid="5a8d3c1e-0000-4000-8000-000000000001",
                clique_id=7,
                state=FabricState.COMPLETED,
                status="SUCCESS",
                health_mask=fabric_mask,  # by default a route recovery in progress, nothing else
                health=decode_health_mask(fabric_mask),
                health_summary=FabricHealthSummary.HEALTHY,
            )
        },
        migs={
            mig_uuid(3, 1): make_mig_sample(
                uuid=mig_uuid(3, 1),
                used=2 * GIB,
                total=40 * GIB,
                processes=(ProcessInfo(pid=300, used_memory_bytes=2 * GIB),),
            ),
            mig_uuid(3, 2): make_mig_sample(uuid=mig_uuid(3, 2), used=0, total=10 * GIB),
        },
        utilization={1: (ProcessUtilization(100, 45, 10), ProcessUtilization(200, 15, 2))},
        pods_of_pids={
            100: PodOfProcess("ml", "infer-a", "uid-a"),
            200: PodOfProcess("ml", "infer-b", "uid-b"),
        }
        if pids_visible
        else {},
    )
    xids = XidCounter()
    for xid in (48, 48, 94):
        xids.record(NvmlEvent(EventKind.XID, 0, gpu_uuid(0), xid=xid))
    xids.record(NvmlEvent(EventKind.ECC_DBE, 0, gpu_uuid(0)))  # not an XID: not counted
    return build_snapshot(
        hostname="node-a",
        inventory=INVENTORY,
        reads=reads,
        attribution=attribute(PODRESOURCES, DeviceResolver(INVENTORY)),
        health={
            gpu_uuid(0): True,
            gpu_uuid(1): True,
            gpu_uuid(2): False,
            gpu_uuid(3): True,
            mig_uuid(3, 1): True,
            mig_uuid(3, 2): True,
        }.get,
        xids=xids,
        refresh=RefreshStats(
            refreshes=3,
            last_duration_seconds=0.004,
            last_unix=1_700_000_000.0,
            nvml_errors=(("GPU_IS_LOST", 2),),
            podresources_up=True,
            podresources_errors=1,
            podresources_last_success_unix=1_700_000_000.0,
            pods_listed=4,
        ),
    )
