from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.metrics.attribution import (
    DeviceRef,
    DeviceResolver,
    PodOfProcess,
    attribute,
    parse_cgroup,
    parse_pod_log_dir,
    sharing,
)
from agent.metrics.snapshot import Owner
from agent.nvml.protocol import ProcessInfo, ProcessUtilization
from agent.podresources.model import AllocatableDevice, Assignment, PodResourcesSnapshot
from tests.agent.metrics.builders import GIB, gpu_uuid, make_inventory, mig_uuid

INV = make_inventory(gpus=3, mig={2: [(1, "3g.40gb"), (2, "1g.10gb")]})


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        pytest.param(gpu_uuid(0), DeviceRef(gpu_uuid(0), 0, mig=False, replica=None), id="gpu-uuid"),
        pytest.param(mig_uuid(2, 1), DeviceRef(mig_uuid(2, 1), 2, mig=True, replica=None), id="mig-uuid"),
        pytest.param(f"{gpu_uuid(1)}::3", DeviceRef(gpu_uuid(1), 1, mig=False, replica=3), id="gpu-replica"),
        pytest.param(
            f"{mig_uuid(2, 2)}::0", DeviceRef(mig_uuid(2, 2), 2, mig=True, replica=0), id="mig-replica"
        ),
        pytest.param("GPU-not-ours", None, id="unknown-uuid"),
        pytest.param(f"{gpu_uuid(0)}::x", None, id="bad-replica-suffix"),
        pytest.param(f"{gpu_uuid(0)}::\u00b2", None, id="superscript-replica"),
        pytest.param(f"{gpu_uuid(0)}::\u0663", None, id="arabic-digit-replica"),
        pytest.param(f"{gpu_uuid(0)}::{'9' * 5000}", None, id="5000-digit-replica"),
        pytest.param(f"{gpu_uuid(0)}::-1", None, id="negative-replica"),
        pytest.param("nvidia0/gi1", None, id="gke-style"),
        pytest.param("", None, id="empty"),
    ],
)
def test_resolver_resolves_device_ids(device_id: str, expected: DeviceRef | None) -> None:
    assert DeviceResolver(INV).resolve(device_id) == expected


def test_strange_replica_ids_in_pod_resources_are_unknown_and_the_rest_attributed() -> None:
    """Issue 26 item 19: one pod naming ``<uuid>::²`` (``int`` refuses it though ``isdigit`` takes it)
    or a 5,000-digit replica does not stop attribution; those IDs count as unknown."""
    snap = PodResourcesSnapshot(
        assignments=(
            _row("good", f"{gpu_uuid(1)}::2"),
            _row("sup", f"{gpu_uuid(1)}::\u00b2"),
            _row("long", f"{gpu_uuid(1)}::{'7' * 5000}"),
        ),
        allocatable=(AllocatableDevice("nvidia.com/gpu", f"{gpu_uuid(1)}::\u00b2"),),
    )
    att = attribute(snap, DeviceResolver(INV))
    assert [(a.owner.pod, a.device_id) for a in att.allocations] == [("good", f"{gpu_uuid(1)}::2")]
    assert att.replicas_total == {}


def test_resolver_memo_is_bounded() -> None:
    resolver = DeviceResolver(INV, memo_limit=8)
    for n in range(100):
        assert resolver.resolve(f"other-vendor-{n}") is None
        assert resolver.misses <= 8
    assert resolver.resolve(f"{gpu_uuid(1)}::3") == DeviceRef(gpu_uuid(1), 1, mig=False, replica=3)


def test_resolver_caches_negative_answers() -> None:
    resolver = DeviceResolver(INV)
    for _ in range(3):
        assert resolver.resolve("MIG-gone") is None
        assert resolver.resolve("other-vendor-0") is None
    assert resolver.resolve(gpu_uuid(0)) is not None
    assert resolver.misses == 2


def _row(
    pod: str, device_id: str, *, container: str = "main", resource: str = "nvidia.com/gpu"
) -> Assignment:
    return Assignment(namespace="ml", pod=pod, container=container, resource=resource, device_id=device_id)


def test_attribute_splits_exclusive_and_replica_holders_and_counts_allocatable() -> None:
    snap = PodResourcesSnapshot(
        assignments=(
            _row("train-0", gpu_uuid(0)),
            _row("infer-a", f"{gpu_uuid(1)}::0"),
            _row("infer-b", f"{gpu_uuid(1)}::1"),
            _row("mig-pod", mig_uuid(2, 1), resource="nvidia.com/mig-3g.40gb"),
            _row("cpu-only", "intel.com/qat-0", resource="intel.com/qat"),
        ),
        allocatable=(
            *(AllocatableDevice("nvidia.com/gpu", f"{gpu_uuid(1)}::{n}") for n in range(4)),
            AllocatableDevice("nvidia.com/gpu", gpu_uuid(0)),
        ),
        pods_listed=5,
    )
    att = attribute(snap, DeviceResolver(INV))
    assert att.owners == {
        gpu_uuid(0): (Owner("ml", "train-0", "main"),),
        mig_uuid(2, 1): (Owner("ml", "mig-pod", "main"),),
    }
    assert att.replica_holders[gpu_uuid(1)] == (
        (Owner("ml", "infer-a", "main"), 0),
        (Owner("ml", "infer-b", "main"), 1),
    )
    assert att.replicas_total == {gpu_uuid(1): 4}
    assert [a.device_id for a in att.allocations] == [
        gpu_uuid(0),
        f"{gpu_uuid(1)}::0",
        f"{gpu_uuid(1)}::1",
        mig_uuid(2, 1),
    ]


def test_attribute_without_allocatable_leaves_replica_total_unknown() -> None:
    snap = PodResourcesSnapshot(assignments=(_row("a", f"{gpu_uuid(0)}::0"),), allocatable=None)
    assert attribute(snap, DeviceResolver(INV)).replicas_total is None


def _shared_attribution(pods: int):  # type: ignore[no-untyped-def]
    rows = tuple(_row(f"p{i}", f"{gpu_uuid(0)}::{i}") for i in range(pods))
    return attribute(PodResourcesSnapshot(assignments=rows), DeviceResolver(INV))


def test_sharing_splits_per_process_and_gives_idle_pods_zero() -> None:
    att = _shared_attribution(3)
    procs = (
        ProcessInfo(pid=100, used_memory_bytes=2 * GIB),
        ProcessInfo(pid=101, used_memory_bytes=1 * GIB),
        ProcessInfo(pid=200, used_memory_bytes=4 * GIB),
        ProcessInfo(pid=999, used_memory_bytes=8 * GIB),  # not in any pod
    )
    util = (ProcessUtilization(100, 30, 5), ProcessUtilization(101, 10, 1), ProcessUtilization(200, 25, 3))
    pods = {
        100: PodOfProcess("ml", "p0", "uid-0"),
        101: PodOfProcess("ml", "p0", "uid-0"),
        200: PodOfProcess("ml", "p1", "uid-1"),
    }
    sh = sharing(uuid=gpu_uuid(0), attribution=att, processes=procs, utilization=util, pods_of_pids=pods)
    assert sh is not None
    assert sh.split
    assert sh.allocated == 3
    by_pod = {s.owner.pod: s for s in sh.shares}
    assert (by_pod["p0"].utilization_percent, by_pod["p0"].memory_used_bytes, by_pod["p0"].processes) == (
        40,
        3 * GIB,
        2,
    )
    assert (by_pod["p1"].utilization_percent, by_pod["p1"].memory_used_bytes) == (25, 4 * GIB)
    assert (by_pod["p2"].utilization_percent, by_pod["p2"].memory_used_bytes) == (0, 0)


def test_sharing_without_visible_pids_lists_pods_but_does_not_split() -> None:
    att = _shared_attribution(2)
    procs = (ProcessInfo(pid=100, used_memory_bytes=GIB),)
    sh = sharing(uuid=gpu_uuid(0), attribution=att, processes=procs, utilization=(), pods_of_pids={})
    assert sh is not None
    assert not sh.split
    assert [s.owner.pod for s in sh.shares] == ["p0", "p1"]
    assert all(s.utilization_percent is None and s.memory_used_bytes is None for s in sh.shares)


def test_sharing_ignores_a_process_of_a_pod_that_holds_no_replica_of_this_gpu() -> None:
    att = _shared_attribution(1)
    procs = (ProcessInfo(pid=7, used_memory_bytes=GIB),)
    pods = {7: PodOfProcess("kube-system", "gpu-agent-xyz", "uid-agent")}
    sh = sharing(uuid=gpu_uuid(0), attribution=att, processes=procs, utilization=(), pods_of_pids=pods)
    assert sh is not None
    assert not sh.split  # the only process belongs to nobody who shares this GPU


def test_sharing_is_none_for_an_unshared_device() -> None:
    att = _shared_attribution(1)
    assert sharing(uuid=gpu_uuid(2), attribution=att, processes=(), utilization=(), pods_of_pids={}) is None


@given(
    mems=st.lists(st.integers(min_value=0, max_value=80 * GIB), min_size=1, max_size=12),
    owners=st.lists(st.integers(min_value=0, max_value=3), min_size=12, max_size=12),
)
def test_sharing_never_attributes_more_memory_than_the_processes_use(
    mems: list[int], owners: list[int]
) -> None:
    att = _shared_attribution(3)
    procs = tuple(ProcessInfo(pid=1000 + i, used_memory_bytes=m) for i, m in enumerate(mems))
    pods = {1000 + i: PodOfProcess("ml", f"p{owners[i]}", f"u{owners[i]}") for i in range(len(mems))}
    sh = sharing(uuid=gpu_uuid(0), attribution=att, processes=procs, utilization=(), pods_of_pids=pods)
    assert sh is not None
    total = sum(s.memory_used_bytes or 0 for s in sh.shares)
    assert total <= sum(mems)
    # pod "p3" holds no replica: exactly its processes are left out
    assert total == sum(m for i, m in enumerate(mems) if owners[i] != 3)


UID = "0f6b1c2d-3e4f-4a5b-8c7d-9e0f1a2b3c4d"
CID = "a" * 64


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n11:cpu:/kubepods/burstable/pod{UID}/{CID}\n",
            (UID, CID),
            id="v1-cgroupfs-burstable",
        ),
        pytest.param(f"4:devices:/kubepods/pod{UID}/{CID}\n", (UID, CID), id="v1-cgroupfs-guaranteed"),
        pytest.param(
            "0::/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
            (UID, CID),
            id="v2-systemd-containerd",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
            (UID, CID),
            id="v2-systemd-crio-guaranteed",
        ),
        pytest.param(
            "9:pids:/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/docker-{CID}.scope\n",
            (UID, CID),
            id="v1-systemd-docker",
        ),
        pytest.param(f"0::/kubepods/besteffort/pod{UID}\n", (UID, None), id="pod-level-only"),
        pytest.param("0::/system.slice/sshd.service\n", None, id="not-a-pod"),
        pytest.param("", None, id="empty"),
    ],
)
def test_parse_cgroup(text: str, expected: tuple[str, str | None] | None) -> None:
    assert parse_cgroup(text) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param(f"ml_train-0_{UID}", ("ml", "train-0", UID), id="pod"),
        pytest.param("ml_train-0", None, id="missing-uid"),
        pytest.param(f"a_b_c_{UID}", None, id="too-many-parts"),
        pytest.param(f"_x_{UID}", None, id="empty-namespace"),
    ],
)
def test_parse_pod_log_dir(name: str, expected: tuple[str, str, str] | None) -> None:
    assert parse_pod_log_dir(name) == expected
