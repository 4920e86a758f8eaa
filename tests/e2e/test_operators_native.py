"""Kubernetes' own gang and topology scheduling (1.37 ``scheduling.k8s.io/v1beta1`` Workload/PodGroup) on
hollow GB200 nodes, placed by kube-scheduler alone (issue 19).

What runs: a control plane of its own for this module, kube-apiserver and kube-scheduler started with
``GenericWorkload``, ``TopologyAwareWorkloadScheduling`` and ``CompositePodGroup`` on and
``scheduling.k8s.io/v1beta1`` (and ``v1alpha3``) served (``localcluster.WORKLOAD_FEATURE_GATES`` /
``WORKLOAD_RUNTIME_CONFIG``; the shared control plane keeps 1.37's defaults, so no other test sees
the gang plugins); hollow ``gb200-nvl72`` trays with their agents, which label each Node with its
``gpuagent.dev/nvlink-domain``. A ``Workload`` with one gang ``PodGroup`` per worker group, each requiring
``gpuagent.dev/nvlink-domain``: kube-scheduler's GangScheduling and TopologyPlacementGenerator plugins place
each group whole inside one domain, and a group that fits only across domains waits whole.

Default run: 2 racks x 4 trays (worker groups of 3); ``-m slow`` adds 2 x 18 (groups of 17).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agent import localcluster as cluster
from tests.e2e.conftest import GpuRacks, _require, _unavailable, start_gpu_racks
from tests.e2e.test_hollow_scheduling import assert_running_with_devices, held, settled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # starting the racks is part of the first test

WAIT_S = 180.0
GPU = "nvidia.com/gpu"
NVLINK_LABEL = "gpuagent.dev/nvlink-domain"
SCHEDULING = ("scheduling.k8s.io", "v1beta1")

SHAPES = [
    pytest.param((2, 4), id="2x4"),
    pytest.param((2, 18), id="2x18", marks=[pytest.mark.slow, pytest.mark.timeout(1800)]),
]


@pytest.fixture(scope="module")
def workload_plane(
    counterparts: cluster.Counterparts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[cluster.ControlPlane]:
    """etcd + kube-apiserver with the Workload API served and its gates on (this module's own)."""
    _require(counterparts, "etcd", "kube-apiserver", "kube-scheduler")
    try:
        plane = cluster.start_control_plane(
            counterparts,
            tmp_path_factory.mktemp("workload-plane"),
            feature_gates=cluster.WORKLOAD_FEATURE_GATES,
            runtime_config=cluster.WORKLOAD_RUNTIME_CONFIG,
        )
    except cluster.MissingCounterpartError as e:
        _unavailable(str(e))
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def api(workload_plane: cluster.ControlPlane) -> Iterator[Any]:
    client = workload_plane.apiserver.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module", params=SHAPES)
def racks(
    request: pytest.FixtureRequest,
    counterparts: cluster.Counterparts,
    workload_plane: cluster.ControlPlane,
    api: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GpuRacks]:
    n_racks, trays = request.param
    yield from start_gpu_racks(
        request,
        counterparts,
        workload_plane.apiserver,
        api,
        tmp_path_factory.mktemp("op-native"),
        prefix="opnat",
        racks=n_racks,
        trays=trays,
    )


@pytest.fixture(scope="module")
def gang_scheduler(
    counterparts: cluster.Counterparts,
    workload_plane: cluster.ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[cluster.Scheduler]:
    """kube-scheduler (default-scheduler) with the Workload gates: GangScheduling, TopologyPlacementGenerator
    and PodGroupPodsCount join its default profile."""
    sched = cluster.start_kube_scheduler(
        counterparts,
        tmp_path_factory.mktemp("gang-sched"),
        apiserver=workload_plane.apiserver,
        feature_gates=cluster.WORKLOAD_FEATURE_GATES,
    )
    try:
        yield sched
    finally:
        sched.stop()


@pytest.fixture
def ns(api: Any, racks: GpuRacks, e2e_test_label: str) -> Iterator[str]:
    """A namespace on this module's API server; the trays are idle before the test and its pods are deleted
    after it."""
    from kubernetes import client

    for node in racks.by_name().values():
        cluster.wait_until(
            settled(lambda node=node: not held(node)),
            what=f"no devices held on {node.name}",
            timeout_s=WAIT_S,
        )
    core = client.CoreV1Api(api)
    name = f"t-{e2e_test_label}"[:63].rstrip("-")
    body: Any = {"metadata": {"name": name}}
    core.create_namespace(body)
    try:
        yield name
    finally:
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)


# ----------------------------------------------------------------------------------------------- manifests


def workload(name: str, groups: dict[str, int]) -> dict[str, Any]:
    """A Workload with one gang pod-group template per worker group, each inside one NVLink domain."""
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {
            "podGroupTemplates": [
                {
                    "name": group,
                    "schedulingPolicy": {"gang": {"minCount": n}},
                    "schedulingConstraints": {"topology": [{"key": NVLINK_LABEL}]},
                }
                for group, n in groups.items()
            ]
        },
    }


def pod_group(workload_name: str, group: str, n: int) -> dict[str, Any]:
    """The PodGroup of one template (what a workload controller makes; here the user does)."""
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": f"{workload_name}-{group}"},
        "spec": {
            "workloadRef": {"workloadName": workload_name, "templateName": group},
            "schedulingPolicy": {"gang": {"minCount": n}},
            "schedulingConstraints": {"topology": [{"key": NVLINK_LABEL}]},
        },
    }


def member_pod(name: str, *, pod_group_name: str, label: str) -> dict[str, Any]:
    resources = {"cpu": "100m", "memory": "256Mi", GPU: "4"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"group": pod_group_name}},
        "spec": {
            "schedulingGroup": {"podGroupName": pod_group_name},
            "nodeSelector": {"gpuagent.dev/e2e-test": label},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
        },
    }


def submit(api: Any, ns: str, name: str, groups: dict[str, int], label: str) -> None:
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(*SCHEDULING, ns, "workloads", workload(name, groups))
    core = client.CoreV1Api(api)
    for group, n in groups.items():
        custom.create_namespaced_custom_object(*SCHEDULING, ns, "podgroups", pod_group(name, group, n))
        for i in range(n):
            body: Any = member_pod(f"{name}-{group}-{i}", pod_group_name=f"{name}-{group}", label=label)
            core.create_namespaced_pod(ns, body)


def placement(api: Any, ns: str, selector: str) -> dict[str, str]:
    from kubernetes import client

    items = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=selector).items
    return {p.metadata.name: p.spec.node_name for p in items if p.spec.node_name}


def unschedulable(api: Any, ns: str, selector: str) -> set[str]:
    """Pods whose PodScheduled condition is False (kube-scheduler tried and could not place them)."""
    from kubernetes import client

    out = set()
    for p in client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=selector).items:
        for c in p.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False":
                out.add(p.metadata.name)
    return out


def domain_of(racks: GpuRacks, node: str) -> str:
    return str((racks.by_name()[node].node.node() or {})["metadata"]["labels"][NVLINK_LABEL])


# --------------------------------------------------------------------------------------------------- tests


@pytest.mark.usefixtures("gang_scheduler")
def test_workload_pod_groups_each_placed_whole_inside_one_nvlink_domain_by_kube_scheduler(
    api: Any, ns: str, racks: GpuRacks
) -> None:
    from kubernetes import client

    n = racks.trays - 1  # one tray per rack stays free
    groups = {"a": n, "b": n}
    submit(api, ns, "train", groups, racks.label)
    cluster.wait_until(
        lambda: len(placement(api, ns, "group in (train-a,train-b)")) == 2 * n,
        what=f"all {2 * n} pods of Workload train bound by kube-scheduler",
        timeout_s=WAIT_S,
    )
    used = set()
    for group in groups:
        where = placement(api, ns, f"group=train-{group}")
        assert len(set(where.values())) == n, where  # one 4-GPU pod per tray
        domains = {domain_of(racks, node) for node in where.values()}
        assert len(domains) == 1, f"pod group {group} spans NVLink domains: {where}"
        used |= domains
    assert len(used) == 2
    assert_running_with_devices(api, ns, placement(api, ns, "group in (train-a,train-b)"), racks)  # type: ignore[arg-type]

    # a group of 2 that fits only across the two racks' free trays waits whole
    submit(api, ns, "small", {"w": 2}, racks.label)
    cluster.wait_until(
        lambda: unschedulable(api, ns, "group=small-w") == {"small-w-0", "small-w-1"},
        what="kube-scheduler reports both pods of small-w unschedulable",
        timeout_s=WAIT_S,
    )
    assert placement(api, ns, "group=small-w") == {}
    # the first Workload's pods go: the group is placed whole, inside one domain
    client.CoreV1Api(api).delete_collection_namespaced_pod(
        ns, label_selector="group in (train-a,train-b)", grace_period_seconds=0
    )
    cluster.wait_until(
        lambda: len(placement(api, ns, "group=small-w")) == 2,
        what="small-w bound once train is gone",
        timeout_s=WAIT_S,
    )
    where = placement(api, ns, "group=small-w")
    assert len({domain_of(racks, node) for node in where.values()}) == 1, where
    for node in racks.by_name().values():
        cluster.wait_until(
            settled(
                lambda node=node: (
                    not any(r.pod.startswith("train-") for r in node.node.pod_resources().assignments)
                )
            ),
            what=f"train gone from {node.name}",
            timeout_s=WAIT_S,
        )
    assert_running_with_devices(api, ns, where, racks)  # type: ignore[arg-type]
