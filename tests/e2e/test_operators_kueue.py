"""Kueue's topology-aware scheduling on our exported Topology, through the real Kueue (issue 19).

What runs: the shared control plane; hollow ``gb200-nvl72`` trays with their agents (2 racks x 4 trays,
one NVLink domain per rack); ``gpu-node-agent controller --once --export kueue --output FILE`` (the
HyperNodes, and the Kueue ``Topology`` plus the ``gpuagent.dev/topology-<tier>`` node labels it writes,
applied as a user applies the file); Kueue v0.17's controller manager with its webhooks served on
127.0.0.1 (frameworks ``batch/job`` and ``ray.io/raycluster``); kube-controller-manager's Job controller
(a batch Job's pods); the KubeRay operator without a batch scheduler; a plain kube-scheduler.

A pod set asks for one NVLink domain with
``kueue.x-k8s.io/podset-required-topology: gpuagent.dev/nvlink-domain``: the exported Topology's NVLink level
is the agent's own label, the key the extender and kube-scheduler's native gang API read too.

Default run only (2x4, about a minute and a half of scheduling after the racks are up); the objects a user
applies are in ``docs/integrations.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from agent import localcluster as cluster
from tests.e2e.conftest import GpuRacks, run_topology_controller_once, start_gpu_racks
from tests.e2e.test_hollow_scheduling import assert_running_with_devices, held, settled
from topology.builder import SOURCE_LABEL, SOURCE_VALUE
from topology.kube import HYPERNODES, Kube
from topology.labels import LABEL_NVLINK_DOMAIN

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # starting the racks is part of the first test

WAIT_S = 180.0
GPU = "nvidia.com/gpu"
NVLINK_LEVEL = LABEL_NVLINK_DOMAIN  # gpuagent.dev/nvlink-domain, the export's NVLink level
KUEUE = "kueue.x-k8s.io"
TOPOLOGY = "gb200-e2e"
FLAVOR = "gb200"
CLUSTER_QUEUE = "gpu-cq"
LOCAL_QUEUE = "gpu"
RAYCLUSTERS = ("ray.io", "v1", "rayclusters")
WORKLOADS = (KUEUE, "v1beta2", "workloads")


@pytest.fixture(scope="module")
def racks(
    request: pytest.FixtureRequest,
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    api_client: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GpuRacks]:
    yield from start_gpu_racks(
        request,
        counterparts,
        control_plane.apiserver,
        api_client,
        tmp_path_factory.mktemp("op-kueue"),
        prefix="opkq",
        racks=2,
        trays=4,
    )


@pytest.fixture(scope="module")
def exported(
    control_plane: cluster.ControlPlane,
    api_client: Any,
    racks: GpuRacks,
    *,
    volcano_crds: list[str],
    kueue: cluster.Operator,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, str]]:
    """Run the export, apply it (the Topology through Kueue's webhooks; node labels by server-side
    apply), then a ResourceFlavor on that Topology, a ClusterQueue and a LocalQueue; yields each tray's
    NVLink level value. Removed after the module, while Kueue still runs (its finalizers)."""
    from kubernetes import client

    out = tmp_path_factory.mktemp("export") / "kueue.yaml"
    run_topology_controller_once(
        control_plane.apiserver.kubeconfig,
        racks,
        "--export=kueue",
        f"--output={out}",
        f"--kueue-topology={TOPOLOGY}",
    )
    docs = [d for d in yaml.safe_load_all(out.read_text()) if d]
    topology = next(d for d in docs if d["kind"] == "Topology")
    assert topology["spec"]["levels"][-1] == {"nodeLabel": "kubernetes.io/hostname"}
    assert {"nodeLabel": NVLINK_LEVEL} in topology["spec"]["levels"]
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    for doc in docs:
        if doc["kind"] == "Node":
            core.patch_node(
                doc["metadata"]["name"],
                doc,
                # as `kubectl apply --server-side` does: its own field manager, not the agent's (applying
                # with the agent's would take away the labels the agent owns and this file omits)
                field_manager="kubectl",
                force=True,
                _content_type="application/apply-patch+yaml",
            )
    created: list[tuple[str, str]] = []
    try:
        for plural, body in (
            ("topologies", topology),
            ("resourceflavors", resource_flavor(racks.label)),
            ("clusterqueues", cluster_queue()),
        ):
            custom.create_cluster_custom_object(KUEUE, "v1beta2", plural, body)
            created.append((plural, body["metadata"]["name"]))
        nodes = {n.name: n.node.node() or {} for n in racks.by_name().values()}
        yield {name: obj["metadata"]["labels"][NVLINK_LEVEL] for name, obj in nodes.items()}
    finally:
        for plural, name in reversed(created):
            custom.delete_cluster_custom_object(KUEUE, "v1beta2", plural, name)
        kube = Kube(api_client)
        items, _ = kube.list(HYPERNODES, label_selector=f"{SOURCE_LABEL}={SOURCE_VALUE}")
        for o in items:
            kube.delete(f"{HYPERNODES}/{o['metadata']['name']}")


def resource_flavor(label: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{KUEUE}/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": FLAVOR},
        "spec": {"nodeLabels": {"gpuagent.dev/e2e-test": label}, "topologyName": TOPOLOGY},
    }


def cluster_queue() -> dict[str, Any]:
    return {
        "apiVersion": f"{KUEUE}/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": CLUSTER_QUEUE},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", GPU],
                    "flavors": [
                        {
                            "name": FLAVOR,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "1000"},
                                {"name": "memory", "nominalQuota": "10Ti"},
                                {"name": GPU, "nominalQuota": "1024"},
                            ],
                        }
                    ],
                }
            ],
        },
    }


@pytest.fixture
def local_queue(api_client: Any, namespace: str, exported: dict[str, str]) -> str:
    from kubernetes import client

    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        KUEUE,
        "v1beta2",
        namespace,
        "localqueues",
        {
            "apiVersion": f"{KUEUE}/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    )
    return LOCAL_QUEUE


@pytest.fixture
def trays_idle(racks: GpuRacks) -> None:
    for node in racks.by_name().values():
        cluster.wait_until(
            settled(lambda node=node: not held(node)),
            what=f"no devices held on {node.name}",
            timeout_s=WAIT_S,
        )


def pods(api: Any, ns: str, selector: str) -> list[Any]:
    from kubernetes import client

    return list(client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=selector).items)


def placement(api: Any, ns: str, selector: str) -> dict[str, str]:
    return {p.metadata.name: p.spec.node_name for p in pods(api, ns, selector) if p.spec.node_name}


def workloads(api: Any, ns: str) -> list[dict[str, Any]]:
    from kubernetes import client

    got = client.CustomObjectsApi(api).list_namespaced_custom_object(*WORKLOADS[:2], ns, WORKLOADS[2])
    return list(got["items"])


def admitted(workload: dict[str, Any]) -> bool:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Admitted" and c.get("status") == "True" for c in conditions)


def podset_domains(workload: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per pod set, Kueue's topology assignment (levels and domains with counts)."""
    assignments = ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    return {a["name"]: a.get("topologyAssignment") or {} for a in assignments}


def cleanup_namespace_jobs(api: Any, ns: str) -> None:
    """Jobs, RayClusters, their pods and Workloads go now (no garbage collector runs here)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    batch = client.BatchV1Api(api)
    custom = client.CustomObjectsApi(api)
    for job in batch.list_namespaced_job(ns).items:
        batch.delete_namespaced_job(job.metadata.name, ns, propagation_policy="Orphan")
    for rc in custom.list_namespaced_custom_object(*RAYCLUSTERS[:2], ns, RAYCLUSTERS[2])["items"]:
        custom.delete_namespaced_custom_object(*RAYCLUSTERS[:2], ns, RAYCLUSTERS[2], rc["metadata"]["name"])
    core = client.CoreV1Api(api)
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    for wl in workloads(api, ns):
        try:
            custom.delete_namespaced_custom_object(*WORKLOADS[:2], ns, WORKLOADS[2], wl["metadata"]["name"])
        except ApiException as e:
            if e.status != 404:
                raise
    cluster.wait_until(lambda: not workloads(api, ns), what=f"Kueue released the Workloads of {ns}")


@pytest.fixture
def jobs_cleaned(api_client: Any, namespace: str) -> Iterator[None]:
    yield
    cleanup_namespace_jobs(api_client, namespace)


def gpu_container(name: str, image: str) -> dict[str, Any]:
    resources = {"cpu": "100m", "memory": "256Mi", GPU: "4"}
    return {"name": name, "image": image, "resources": {"requests": resources, "limits": resources}}


def tas_job(name: str, *, queue: str, label: str, pods_: int) -> dict[str, Any]:
    """A batch Job whose pods must share one NVLink domain (Kueue TAS on our exported level)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {f"{KUEUE}/queue-name": queue}},
        "spec": {
            "parallelism": pods_,
            "completions": pods_,
            "suspend": True,
            "template": {
                "metadata": {"annotations": {f"{KUEUE}/podset-required-topology": NVLINK_LEVEL}},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": {"gpuagent.dev/e2e-test": label},
                    "containers": [gpu_container("main", "registry.k8s.io/pause:3.10")],
                },
            },
        },
    }


@pytest.mark.usefixtures("trays_idle", "jobs_cleaned", "module_kube_scheduler")
def test_batch_job_with_required_nvlink_topology_is_admitted_into_one_domain(
    api_client: Any,
    namespace: str,
    racks: GpuRacks,
    *,
    exported: dict[str, str],
    local_queue: str,
    job_controller: cluster.Operator,
) -> None:
    from kubernetes import client

    n = racks.trays - 1
    body: Any = tas_job("tas", queue=local_queue, label=racks.label, pods_=n)
    client.BatchV1Api(api_client).create_namespaced_job(namespace, body)
    cluster.wait_until(
        lambda: any(admitted(w) for w in workloads(api_client, namespace)),
        what="Kueue admits the Job's Workload",
        timeout_s=WAIT_S,
    )
    (wl,) = workloads(api_client, namespace)
    assert podset_domains(wl)["main"].get("levels"), wl["status"]  # Kueue's TAS gave it a topology assignment
    cluster.wait_until(
        lambda: len(placement(api_client, namespace, "job-name=tas")) == n,
        what=f"all {n} pods of Job tas bound",
        process=job_controller.process,
        timeout_s=WAIT_S,
    )
    where = placement(api_client, namespace, "job-name=tas")
    assert len(set(where.values())) == n  # one 4-GPU pod per tray
    assert len({exported[node] for node in where.values()}) == 1, where  # one NVLink domain
    assert_running_with_devices(api_client, namespace, where, racks)  # type: ignore[arg-type]
    assert client.BatchV1Api(api_client).read_namespaced_job("tas", namespace).spec.suspend is False
    assert job_controller.process.alive()
    print(f"{job_controller.name}: VmRSS {job_controller.rss_bytes() / 2**20:.0f} MiB")


def ray_cluster_for_kueue(name: str, *, queue: str, label: str, groups: dict[str, int]) -> dict[str, Any]:
    """A RayCluster queued in Kueue: a CPU head and GPU worker groups, each group's pods required inside
    one NVLink domain."""

    def template(container: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
        return {
            "metadata": {"annotations": annotations},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "nodeSelector": {"gpuagent.dev/e2e-test": label},
                "containers": [container],
            },
        }

    head = {"cpu": "1", "memory": "2Gi"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "labels": {f"{KUEUE}/queue-name": queue}},
        "spec": {
            "rayVersion": "2.46.0",
            "headGroupSpec": {
                "rayStartParams": {},
                "template": template(
                    {
                        "name": "ray-head",
                        "image": "rayproject/ray:2.46.0",
                        "resources": {"requests": head, "limits": head},
                    },
                    {},
                ),
            },
            "workerGroupSpecs": [
                {
                    "groupName": group,
                    "replicas": n,
                    "minReplicas": n,
                    "maxReplicas": n,
                    "rayStartParams": {},
                    "template": template(
                        gpu_container("main", "rayproject/ray:2.46.0"),
                        {f"{KUEUE}/podset-required-topology": NVLINK_LEVEL},
                    ),
                }
                for group, n in groups.items()
            ],
        },
    }


@pytest.mark.usefixtures("trays_idle", "jobs_cleaned", "module_kube_scheduler")
def test_raycluster_through_kueue_each_worker_group_in_one_nvlink_domain(
    api_client: Any,
    namespace: str,
    racks: GpuRacks,
    *,
    exported: dict[str, str],
    local_queue: str,
    kuberay_plain: cluster.Operator,
    kueue: cluster.Operator,
) -> None:
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)
    n = racks.trays - 1
    groups = {"gpu-a": n, "gpu-b": n}
    custom.create_namespaced_custom_object(
        *RAYCLUSTERS[:2],
        namespace,
        RAYCLUSTERS[2],
        ray_cluster_for_kueue("rc", queue=local_queue, label=racks.label, groups=groups),
    )
    cluster.wait_until(
        lambda: any(admitted(w) for w in workloads(api_client, namespace)),
        what="Kueue admits the RayCluster's Workload",
        timeout_s=WAIT_S,
    )
    want = 1 + 2 * n
    cluster.wait_until(
        lambda: len(placement(api_client, namespace, "ray.io/cluster=rc")) == want,
        what=f"all {want} pods of RayCluster rc bound",
        process=kuberay_plain.process,
        timeout_s=WAIT_S,
    )
    where = placement(api_client, namespace, "ray.io/cluster=rc")
    by_pod = {p.metadata.name: p for p in pods(api_client, namespace, "ray.io/cluster=rc")}
    head = next(m for m, p in by_pod.items() if p.metadata.labels["ray.io/node-type"] == "head")
    assert where[head] in exported  # a tray (Kueue's flavor covers the trays)
    for group in groups:
        members = {m for m, p in by_pod.items() if p.metadata.labels.get("ray.io/group") == group}
        nodes = {where[m] for m in members}
        assert len(members) == n
        assert len(nodes) == n, (group, nodes)
        assert len({exported[node] for node in nodes}) == 1, (group, nodes)  # one NVLink domain
    workers = {m: node for m, node in where.items() if m != head}
    assert_running_with_devices(api_client, namespace, workers, racks)  # type: ignore[arg-type]
    core = client.CoreV1Api(api_client)
    cluster.wait_until(
        lambda: core.read_namespaced_pod(head, namespace).status.phase == "Running",
        what=f"head {head} Running",
        timeout_s=WAIT_S,
    )
    for op in (kuberay_plain, kueue):
        assert op.process.alive(), f"{op.name} exited; log {op.process.log_path}"
        print(f"{op.name}: VmRSS {op.rss_bytes() / 2**20:.0f} MiB")
