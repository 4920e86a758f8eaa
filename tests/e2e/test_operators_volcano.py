"""KubeRay and Volcano Jobs through the real operators, on hollow GB200 nodes with our HyperNodes (issue 19).

What runs: the shared control plane; hollow ``gb200-nvl72`` trays (a real kubelet each, with one
``gpu-node-agent run`` publishing its GPUs, labels and GPUNode) plus one CPU-only hollow node; HyperNodes
made by ``gpu-node-agent controller --once`` from the agents' GPUNodes and the racks' fabric; vc-scheduler
(gang + network-topology-aware, session fixture ``volcano``); vc-controller-manager (job, pg, queue, gc
controllers); the KubeRay operator v1.5 with ``--batch-scheduler=volcano``.

What KubeRay v1.5 lets a user express to Volcano (its ``volcano`` batch scheduler, built against
``volcano.sh/apis`` v1.12.1): the queue (RayCluster label ``volcano.sh/queue-name``), a priority class, and
a network topology for the *whole* cluster (labels ``volcano.sh/network-topology-mode`` and
``volcano.sh/network-topology-highest-tier-allowed``, copied into the PodGroup's ``spec.networkTopology``).
It cannot express a topology per worker group: it creates the PodGroup ``ray-<cluster>-pg`` without
``subGroupPolicy``, and its PodGroup updates (minMember/minResources) are written with a type that lacks
the field, so they would drop one. The label ``ray.io/scheduler-name`` is not read by v1.5 (every
RayCluster gets a PodGroup when the operator runs with Volcano). What the tests show works: the user
creates ``ray-<cluster>-pg`` first with ``subGroupPolicy`` (one subgroup per ``ray.io/group`` of the
workers, hard inside tier 1 = one NVLink domain); KubeRay adopts it; a ``MutatingAdmissionPolicy`` puts
``subGroupPolicy`` back whenever an update drops it. Those manifests are in ``docs/integrations.md``.

Shapes: 2 racks x 4 trays (8 trays, 32 GPUs) in the default run, worker groups of 3 (trays - 1) so that
one tray per rack stays free and the second cluster fits by count but not inside one domain; 2 x 18
(worker groups of 17 x 4 GPUs) marked slow: ``.venv/bin/pytest -m slow tests/e2e/test_operators_volcano.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agent import localcluster as cluster
from tests.e2e.conftest import CPU_ONLY_LABEL, GpuRacks, run_topology_controller_once, start_gpu_racks
from tests.e2e.test_hollow_scheduling import assert_running_with_devices, held, settled
from topology.builder import SOURCE_LABEL, SOURCE_VALUE
from topology.kube import HYPERNODES, Kube

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # starting the racks is part of the first test

WAIT_S = 180.0  # generous: 2 cores shared by a dozen processes
GPU = "nvidia.com/gpu"
RAY_IMAGE = "rayproject/ray:2.46.0"
PODGROUPS = ("scheduling.volcano.sh", "v1beta1", "podgroups")
QUEUES = ("scheduling.volcano.sh", "v1beta1", "queues")
RAYCLUSTERS = ("ray.io", "v1", "rayclusters")
VCJOBS = ("batch.volcano.sh", "v1alpha1", "jobs")
POLICY = "keep-volcano-subgroup-policy"
QUEUE = "llm"

SHAPES = [
    pytest.param((2, 4), id="2x4"),
    pytest.param((2, 18), id="2x18", marks=[pytest.mark.slow, pytest.mark.timeout(1800)]),
]


@pytest.fixture(scope="module", params=SHAPES)
def racks(
    request: pytest.FixtureRequest,
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    api_client: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GpuRacks]:
    n_racks, trays = request.param
    yield from start_gpu_racks(
        request,
        counterparts,
        control_plane.apiserver,
        api_client,
        tmp_path_factory.mktemp("op-vc"),
        prefix="opvc",
        racks=n_racks,
        trays=trays,
    )


@pytest.fixture(scope="module")
def domains(
    control_plane: cluster.ControlPlane, api_client: Any, racks: GpuRacks, volcano_crds: list[str]
) -> Iterator[dict[str, set[str]]]:
    """``gpu-node-agent controller --once`` builds the HyperNodes; yields the nvlink ones' members."""
    kube = Kube(api_client)
    run_topology_controller_once(control_plane.apiserver.kubeconfig, racks)
    try:
        got = nvlink_domains(kube)
        want = sorted(sorted(racks.names(r)) for r in range(len(racks.racks)))
        assert sorted(sorted(m) for m in got.values()) == want, got
        yield got
    finally:
        items, _ = kube.list(HYPERNODES, label_selector=f"{SOURCE_LABEL}={SOURCE_VALUE}")
        for o in items:
            kube.delete(f"{HYPERNODES}/{o['metadata']['name']}")


def nvlink_domains(kube: Kube) -> dict[str, set[str]]:
    items, _ = kube.list(HYPERNODES, label_selector=f"{SOURCE_LABEL}={SOURCE_VALUE}")
    return {
        o["metadata"]["name"]: {m["selector"]["exactMatch"]["name"] for m in o["spec"]["members"]}
        for o in items
        if o["spec"]["tierName"] == "nvlink"
    }


# The policy a user applies so that KubeRay's PodGroup updates keep the subgroups (docs/integrations.md).
KEEP_SUBGROUPS_POLICY: dict[str, Any] = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "MutatingAdmissionPolicy",
    "metadata": {"name": POLICY},
    "spec": {
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": ["scheduling.volcano.sh"],
                    "apiVersions": ["v1beta1"],
                    "operations": ["UPDATE"],
                    "resources": ["podgroups"],
                }
            ]
        },
        "matchConditions": [
            {
                "name": "an-update-dropped-the-subgroups",
                "expression": "has(oldObject.spec.subGroupPolicy) && !has(object.spec.subGroupPolicy)",
            }
        ],
        "failurePolicy": "Fail",
        "reinvocationPolicy": "Never",
        "mutations": [
            {
                "patchType": "JSONPatch",
                "jsonPatch": {
                    "expression": (
                        '[JSONPatch{op: "add", path: "/spec/subGroupPolicy", '
                        "value: oldObject.spec.subGroupPolicy}]"
                    )
                },
            }
        ],
    },
}
KEEP_SUBGROUPS_BINDING: dict[str, Any] = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "MutatingAdmissionPolicyBinding",
    "metadata": {"name": POLICY},
    "spec": {"policyName": POLICY},
}


@pytest.fixture(scope="module")
def keep_subgroups(api_client: Any) -> Iterator[None]:
    """The MutatingAdmissionPolicy (and binding) that restores a PodGroup's dropped ``subGroupPolicy``."""
    from kubernetes import client, utils

    utils.create_from_dict(api_client, KEEP_SUBGROUPS_POLICY)
    utils.create_from_dict(api_client, KEEP_SUBGROUPS_BINDING)
    adm = client.AdmissionregistrationV1Api(api_client)
    try:
        yield
    finally:
        adm.delete_mutating_admission_policy_binding(POLICY)
        adm.delete_mutating_admission_policy(POLICY)


def queue_manifest(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"weight": 1, "reclaimable": False},
    }


@pytest.fixture(scope="module")
def queue(
    api_client: Any, volcano: cluster.Scheduler, volcano_controllers: cluster.Operator
) -> Iterator[str]:
    """A Volcano Queue that vc-controller-manager's queue controller opens."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)
    custom.create_cluster_custom_object(*QUEUES[:2], QUEUES[2], queue_manifest(QUEUE))
    try:
        cluster.wait_until(
            lambda: (
                (custom.get_cluster_custom_object(*QUEUES[:2], QUEUES[2], QUEUE).get("status") or {}).get(
                    "state"
                )
                == "Open"
            ),
            what=f"queue {QUEUE} Open (vc-controller-manager's queue controller)",
            process=volcano_controllers.process,
            timeout_s=WAIT_S,
        )
        yield QUEUE
    finally:
        custom.delete_cluster_custom_object(*QUEUES[:2], QUEUES[2], QUEUE)


@pytest.fixture
def trays_idle(racks: GpuRacks) -> None:
    """Before a test: no GPU held on any tray (the kubelets have let go of an earlier test's pods)."""
    for node in racks.by_name().values():
        cluster.wait_until(
            settled(lambda node=node: not held(node)),
            what=f"no devices held on {node.name}",
            timeout_s=WAIT_S,
        )


# ----------------------------------------------------------------------------------------------- manifests


def ray_cluster(name: str, *, label: str, groups: dict[str, int]) -> dict[str, Any]:
    """A RayCluster for Volcano: a CPU head on the CPU-only node, GPU worker groups of 4-GPU workers."""

    def template(container: str, resources: dict[str, str], selector: dict[str, str]) -> dict[str, Any]:
        return {
            "spec": {
                "nodeSelector": {"gpuagent.dev/e2e-test": label, **selector},
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": container,
                        "image": RAY_IMAGE,
                        "resources": {"requests": resources, "limits": resources},
                    }
                ],
            }
        }

    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": name,
            "labels": {"ray.io/scheduler-name": "volcano", "volcano.sh/queue-name": QUEUE},
        },
        "spec": {
            "rayVersion": "2.46.0",
            "headGroupSpec": {
                "rayStartParams": {},
                "template": template("ray-head", {"cpu": "1", "memory": "2Gi"}, {CPU_ONLY_LABEL: "true"}),
            },
            "workerGroupSpecs": [
                {
                    "groupName": group,
                    "replicas": n,
                    "minReplicas": n,
                    "maxReplicas": n,
                    "rayStartParams": {},
                    "template": template("main", {"cpu": "100m", "memory": "256Mi", GPU: "4"}, {}),
                }
                for group, n in groups.items()
            ],
        },
    }


def ray_podgroup(cluster_name: str, *, workers_per_group: int, groups: int) -> dict[str, Any]:
    """The PodGroup KubeRay would make (``ray-<cluster>-pg``), made first by the user with one subgroup per
    worker group (``ray.io/group``), each hard inside one tier-1 HyperNode (one NVLink domain)."""
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": f"ray-{cluster_name}-pg"},
        "spec": {
            "minMember": 1 + groups * workers_per_group,
            "queue": QUEUE,
            "subGroupPolicy": [
                {
                    "name": "worker-groups",
                    "subGroupSize": workers_per_group,
                    "labelSelector": {"matchLabels": {"ray.io/node-type": "worker"}},
                    "matchLabelKeys": ["ray.io/group"],
                    "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
                }
            ],
        },
    }


# ------------------------------------------------------------------------------------------------- helpers


def pods(api: Any, ns: str, selector: str) -> list[Any]:
    from kubernetes import client

    return list(client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=selector).items)


def placement(api: Any, ns: str, selector: str) -> dict[str, str]:
    return {p.metadata.name: p.spec.node_name for p in pods(api, ns, selector) if p.spec.node_name}


def podgroup(api: Any, ns: str, name: str) -> dict[str, Any]:
    from kubernetes import client

    return dict(
        client.CustomObjectsApi(api).get_namespaced_custom_object(*PODGROUPS[:2], ns, PODGROUPS[2], name)
    )


def unschedulable(api: Any, ns: str, name: str) -> bool:
    conditions = (podgroup(api, ns, name).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Unschedulable" and c.get("status") == "True" for c in conditions)


def delete_ray_cluster(api: Any, ns: str, name: str) -> None:
    """Delete the RayCluster, then its pods (no garbage collector runs here) and its PodGroup."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    custom = client.CustomObjectsApi(api)
    for call in (
        lambda: custom.delete_namespaced_custom_object(*RAYCLUSTERS[:2], ns, RAYCLUSTERS[2], name),
        lambda: client.CoreV1Api(api).delete_collection_namespaced_pod(
            ns, label_selector=f"ray.io/cluster={name}", grace_period_seconds=0
        ),
        lambda: custom.delete_namespaced_custom_object(*PODGROUPS[:2], ns, PODGROUPS[2], f"ray-{name}-pg"),
    ):
        try:
            call()
        except ApiException as e:
            if e.status != 404:
                raise


def in_one_domain(nodes: set[str], domains: dict[str, set[str]]) -> str | None:
    """The nvlink HyperNode holding every node of ``nodes``, or None."""
    return next((name for name, members in domains.items() if nodes <= members), None)


def assert_cpu_pod_running(api: Any, ns: str, pod: str, racks: GpuRacks) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    cluster.wait_until(
        lambda: core.read_namespaced_pod(pod, ns).status.phase == "Running",
        what=f"{ns}/{pod} Running on {racks.cpu_node.name}",
        timeout_s=WAIT_S,
    )
    records = racks.cpu_node.records(pod=pod, namespace=ns)
    assert records, f"no CreateContainer for {pod} on {racks.cpu_node.name}"
    assert "NVIDIA_VISIBLE_DEVICES" not in records[-1]["envs"]


# --------------------------------------------------------------------------------------------------- tests


@pytest.fixture
def ray_clusters(api_client: Any, namespace: str) -> Iterator[list[str]]:
    """Names of RayClusters a test made; each is deleted (cluster, pods, PodGroup) after the test."""
    made: list[str] = []
    yield made
    for name in made:
        delete_ray_cluster(api_client, namespace, name)


@pytest.mark.usefixtures("trays_idle", "keep_subgroups")
def test_raycluster_on_volcano_all_or_nothing_each_worker_group_in_one_nvlink_domain(
    api_client: Any,
    namespace: str,
    racks: GpuRacks,
    *,
    domains: dict[str, set[str]],
    queue: str,
    ray_clusters: list[str],
    kuberay_volcano: cluster.Operator,
    volcano_controllers: cluster.Operator,
) -> None:
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)
    n = racks.trays - 1  # one tray per rack stays free: room for 2 workers, never inside one domain
    groups = {"gpu-a": n, "gpu-b": n}
    custom.create_namespaced_custom_object(
        *PODGROUPS[:2], namespace, PODGROUPS[2], ray_podgroup("llm", workers_per_group=n, groups=2)
    )
    ray_clusters.append("llm")
    custom.create_namespaced_custom_object(
        *RAYCLUSTERS[:2], namespace, RAYCLUSTERS[2], ray_cluster("llm", label=racks.label, groups=groups)
    )
    want = 1 + 2 * n
    cluster.wait_until(
        lambda: len(placement(api_client, namespace, "ray.io/cluster=llm")) == want,
        what=f"all {want} pods of RayCluster llm bound by vc-scheduler",
        timeout_s=WAIT_S,
    )
    where = placement(api_client, namespace, "ray.io/cluster=llm")
    by_pod = {p.metadata.name: p for p in pods(api_client, namespace, "ray.io/cluster=llm")}
    assert all(p.spec.scheduler_name == "volcano" for p in by_pod.values())
    heads = [name for name, p in by_pod.items() if p.metadata.labels["ray.io/node-type"] == "head"]
    assert len(heads) == 1
    assert where[heads[0]] == racks.cpu_node.name
    used: set[str] = set()
    for group in groups:
        members = {name for name, p in by_pod.items() if p.metadata.labels["ray.io/group"] == group}
        nodes = {where[m] for m in members}
        assert len(members) == n
        assert len(nodes) == n, (group, members, nodes)  # one 4-GPU worker per tray
        domain = in_one_domain(nodes, domains)
        assert domain is not None, f"worker group {group} spans NVLink domains: {sorted(nodes)}"
        assert domain not in used  # n + n > trays: the groups cannot share a rack
        used.add(domain)
    # KubeRay adopted the user's PodGroup (it set minResources) and the policy kept the subgroups
    pg = podgroup(api_client, namespace, "ray-llm-pg")
    assert pg["spec"]["minMember"] == want
    assert (pg["spec"].get("minResources") or {}).get(GPU) == str(8 * n)
    assert pg["spec"]["subGroupPolicy"][0]["matchLabelKeys"] == ["ray.io/group"]
    assert_cpu_pod_running(api_client, namespace, heads[0], racks)
    workers = {m: node for m, node in where.items() if m != heads[0]}
    assert_running_with_devices(api_client, namespace, workers, racks)  # type: ignore[arg-type]

    # A second RayCluster whose one worker group of 2 fits by count (one free tray per rack) but not
    # inside one NVLink domain: it waits whole.
    custom.create_namespaced_custom_object(
        *PODGROUPS[:2], namespace, PODGROUPS[2], ray_podgroup("small", workers_per_group=2, groups=1)
    )
    ray_clusters.append("small")
    custom.create_namespaced_custom_object(
        *RAYCLUSTERS[:2], namespace, RAYCLUSTERS[2], ray_cluster("small", label=racks.label, groups={"g": 2})
    )
    cluster.wait_until(
        lambda: len(pods(api_client, namespace, "ray.io/cluster=small")) == 3,
        what="KubeRay made the 3 pods of RayCluster small",
        timeout_s=WAIT_S,
    )
    cluster.wait_until(
        lambda: unschedulable(api_client, namespace, "ray-small-pg"),
        what="vc-scheduler marks PodGroup ray-small-pg Unschedulable",
        timeout_s=WAIT_S,
    )
    assert placement(api_client, namespace, "ray.io/cluster=small") == {}  # not even its head

    # The first cluster goes: the second is placed whole, its workers inside one domain.
    delete_ray_cluster(api_client, namespace, "llm")
    cluster.wait_until(
        lambda: len(placement(api_client, namespace, "ray.io/cluster=small")) == 3,
        what="RayCluster small bound once llm is gone",
        timeout_s=WAIT_S,
    )
    where = placement(api_client, namespace, "ray.io/cluster=small")
    by_pod = {p.metadata.name: p for p in pods(api_client, namespace, "ray.io/cluster=small")}
    head = next(name for name, p in by_pod.items() if p.metadata.labels["ray.io/node-type"] == "head")
    assert where[head] == racks.cpu_node.name
    workers = {m: node for m, node in where.items() if m != head}
    assert in_one_domain(set(workers.values()), domains) is not None, workers
    assert_cpu_pod_running(api_client, namespace, head, racks)
    for node in racks.by_name().values():  # llm's workers are gone from the kubelets
        cluster.wait_until(
            settled(
                lambda node=node: (
                    not any(r.pod.startswith("llm-") for r in node.node.pod_resources().assignments)
                )
            ),
            what=f"llm gone from {node.name}",
            timeout_s=WAIT_S,
        )
    assert_running_with_devices(api_client, namespace, workers, racks)  # type: ignore[arg-type]
    report_memory(kuberay_volcano, volcano_controllers)


def report_memory(*operators: cluster.Operator) -> None:
    """Each operator is still running; its process group's VmRSS is printed (``-s``) for the record."""
    for op in operators:
        assert op.process.alive(), f"{op.name} exited; log {op.process.log_path}"
        print(f"{op.name}: VmRSS {op.rss_bytes() / 2**20:.0f} MiB")


@pytest.fixture
def vcjobs(api_client: Any, namespace: str) -> Iterator[list[str]]:
    """Names of Volcano Jobs a test made; each is deleted, then its pods, after the test."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    made: list[str] = []
    yield made
    custom = client.CustomObjectsApi(api_client)
    for name in made:
        try:
            custom.delete_namespaced_custom_object(*VCJOBS[:2], namespace, VCJOBS[2], name)
        except ApiException as e:
            if e.status != 404:
                raise
        client.CoreV1Api(api_client).delete_collection_namespaced_pod(
            namespace, label_selector=f"volcano.sh/job-name={name}", grace_period_seconds=0
        )


def volcano_job(name: str, *, label: str, tasks: dict[str, int]) -> dict[str, Any]:
    """A Volcano Job: each task's pods one partition that must sit inside one NVLink domain (tier 1); the
    fields the admission webhook would default (queue, schedulerName, maxRetry) set explicitly."""
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "volcano",
            "queue": QUEUE,
            "minAvailable": sum(tasks.values()),
            "maxRetry": 3,
            "tasks": [
                {
                    "name": task,
                    "replicas": n,
                    "minAvailable": n,
                    "partitionPolicy": {
                        "totalPartitions": 1,
                        "partitionSize": n,
                        "minPartitions": 1,
                        "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
                    },
                    "template": {
                        "spec": {
                            "nodeSelector": {"gpuagent.dev/e2e-test": label},
                            "terminationGracePeriodSeconds": 0,
                            "restartPolicy": "OnFailure",
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"limits": {GPU: "4"}},
                                }
                            ],
                        }
                    },
                }
                for task, n in tasks.items()
            ],
        },
    }


@pytest.mark.usefixtures("trays_idle")
def test_volcano_job_two_tasks_each_in_one_nvlink_domain_through_vc_controller_manager(
    api_client: Any,
    namespace: str,
    racks: GpuRacks,
    *,
    domains: dict[str, set[str]],
    queue: str,
    volcano_controllers: cluster.Operator,
    vcjobs: list[str],
) -> None:
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)
    n = racks.trays - 1
    tasks = {"prefill": n, "decode": n}
    vcjobs.append("serve")
    custom.create_namespaced_custom_object(
        *VCJOBS[:2], namespace, VCJOBS[2], volcano_job("serve", label=racks.label, tasks=tasks)
    )
    selector = "volcano.sh/job-name=serve"
    cluster.wait_until(
        lambda: len(placement(api_client, namespace, selector)) == 2 * n,
        what=f"all {2 * n} pods of Volcano Job serve bound",
        process=volcano_controllers.process,
        timeout_s=WAIT_S,
    )
    # the PodGroup is vc-controller-manager's: one subgroup policy per task, hard inside tier 1
    pgs = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        *PODGROUPS[:2], namespace, PODGROUPS[2]
    )
    (pg,) = [p for p in pgs["items"] if p["metadata"]["name"].startswith("serve-")]
    assert pg["spec"]["minMember"] == 2 * n
    policies = {p["name"]: p for p in pg["spec"]["subGroupPolicy"]}
    assert set(policies) == set(tasks)
    for p in policies.values():
        assert p["subGroupSize"] == n
        assert p["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
    where = placement(api_client, namespace, selector)
    by_pod = {p.metadata.name: p for p in pods(api_client, namespace, selector)}
    used = set()
    for task in tasks:
        members = {m for m, p in by_pod.items() if p.metadata.labels["volcano.sh/task-spec"] == task}
        nodes = {where[m] for m in members}
        assert len(members) == n
        assert len(nodes) == n, (task, members, nodes)
        domain = in_one_domain(nodes, domains)
        assert domain is not None, f"task {task} spans NVLink domains: {sorted(nodes)}"
        used.add(domain)
    assert len(used) == 2
    assert_running_with_devices(api_client, namespace, where, racks)  # type: ignore[arg-type]

    def phase() -> str:
        job = custom.get_namespaced_custom_object(*VCJOBS[:2], namespace, VCJOBS[2], "serve")
        return str(((job.get("status") or {}).get("state") or {}).get("phase"))

    cluster.wait_until(
        lambda: phase() == "Running",
        what="Volcano Job serve Running (vc-controller-manager's job controller)",
        timeout_s=WAIT_S,
    )
