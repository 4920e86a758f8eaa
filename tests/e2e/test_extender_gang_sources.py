"""Our extender's gang sources end to end (issue 19, deliverable 2): a KubeRay ``RayCluster`` and the native
``scheduling.k8s.io`` Workload / PodGroup, placed by the real kube-scheduler calling ``gpu-node-agent
extender`` onto hollow GB200 trays (real kubelets with our agent each, as in ``test_hollow_scheduling.py``).

- **RayCluster** with ``schedulerName: gpu-topology-scheduler`` on its pod templates: a CPU head (its own
  nodeSelector: a CPU-only hollow node) and two GPU worker groups of 4-GPU workers, each group annotated
  ``gpuagent.dev/subgroup-tier: nvlink``. The extender
  reads the RayCluster (``ray.io/v1``) for the gang's shape and its pods by ``ray.io/cluster`` /
  ``ray.io/group``: every pod binds at once, each worker group inside one NVLink domain (the groups on
  different racks), all ``Running`` with their node's GPUs; a second RayCluster that does not fit binds
  nothing (``GangUnschedulable``) while the first runs. The pods come from the real KubeRay operator
  (``counterparts/kuberay-operator``, no batch scheduler) when ``agent.localcluster`` has its launcher and
  the binary is built; otherwise the test creates them as KubeRay v1.5 would (same names, labels,
  annotations, owner) and says so in the test's output.
- **Native Workload / PodGroup** (Kubernetes 1.37, ``GenericWorkload`` + ``TopologyAwareWorkloadScheduling``):
  a Workload with a gang template whose topology constraint is ``gpuagent.dev/nvlink-domain``, its PodGroup,
  and pods naming it in ``spec.schedulingGroup.podGroupName`` -- the objects kube-scheduler's own gang
  plugins read -- are placed by our extender inside one NVLink domain (one rack has a tray taken). This
  needs a kube-apiserver with those gates and ``scheduling.k8s.io/v1beta1`` served: the module starts its
  own control plane with them when ``agent.localcluster`` offers the option
  (``start_control_plane(feature_gates=...)``); otherwise it runs on the shared control plane and the
  native test SKIPS, naming what is missing.

Shape: 2 racks x 2 trays (4 nodes, 16 GPUs) and a CPU node -- the smallest where a gang must choose its
domains: each worker group needs a whole rack, so a scheduler spreading or filling by name would split
one. Cost: one control plane (when gated), four hollow nodes with agents and a plain one, one extender
and one kube-scheduler for the module.
"""

from __future__ import annotations

import inspect
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent import localcluster as cluster
from scheduler_plugin.extender import GANG_PLANNED
from tests.e2e.conftest import REPO_ROOT, _require, _unavailable
from tests.e2e.test_extender_e2e import RunningExtender
from tests.e2e.test_hollow_scheduling import held, node_gpus, settled

# the module starts a control plane, five hollow nodes and four agents: room for a loaded machine
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

GPU = "nvidia.com/gpu"
SCHEDULER = "gpu-topology-scheduler"
NVLINK_LABEL = "gpuagent.dev/nvlink-domain"
WAIT_S = 120.0
UNSCHEDULABLE_FLUSH_S = 330.0  # kube-scheduler moves unschedulable pods back after 5 minutes at most
RAY = ("ray.io", "v1", "rayclusters")
NATIVE_PODGROUPS = ("scheduling.k8s.io", "v1beta1", "podgroups")
WORKLOADS = ("scheduling.k8s.io", "v1beta1", "workloads")
RACKS, TRAYS = 2, 2
LABEL = "gang-sources"
CPU_NODE = "gs-cpu"
CPU_ONLY = "gpuagent.dev/cpu-only"


@dataclass
class Setup:
    plane: cluster.ControlPlane
    api: Any
    native: str  # "" when scheduling.k8s.io/v1beta1 is served, else why not
    racks: list[list[cluster.HollowGpuNode]]
    cpu: cluster.HollowNode  # no GPUs, no agent: where the Ray heads go (their own nodeSelector)
    ext: RunningExtender
    operator: Any  # the real KubeRay operator, or None: pods are made here as it would

    def names(self, rack: int) -> list[str]:
        return [n.name for n in self.racks[rack]]

    def by_name(self) -> dict[str, cluster.HollowGpuNode]:
        return {n.name: n for rack in self.racks for n in rack}


def _gated_plane(counterparts: cluster.Counterparts, workdir: Path) -> cluster.ControlPlane | None:
    """A control plane with the native gang API on, when ``agent.localcluster`` can start one."""
    gates = getattr(cluster, "WORKLOAD_FEATURE_GATES", None)
    runtime = getattr(cluster, "WORKLOAD_RUNTIME_CONFIG", None)
    if gates is None or runtime is None:
        return None
    if "feature_gates" not in inspect.signature(cluster.start_control_plane).parameters:
        return None
    start: Callable[..., cluster.ControlPlane] = cluster.start_control_plane
    return start(counterparts, workdir, feature_gates=gates, runtime_config=runtime)


def _served(api: Any, collection: str) -> bool:
    from topology.kube import Kube, KubeError

    try:
        Kube(api).list(collection)
    except KubeError as e:
        if e.status == 404:
            return False
        raise
    return True


def _ray_crd_files(counterparts: cluster.Counterparts) -> list[Path]:
    """KubeRay's CRDs (RayCluster, RayJob, RayService: the operator watches all three)."""
    crds = getattr(counterparts, "crds", None)
    if crds is not None:
        try:
            return list(crds("kuberay"))
        except cluster.MissingCounterpartError:
            pass
    # the module the counterparts build from: its CRDs as released (KUBERAY_VERSION, else v1.5.0)
    version = cluster.versions().get("KUBERAY_VERSION", "v1.5.0")
    gomodcache = Path(os.environ.get("GOMODCACHE") or Path.home() / "go" / "pkg" / "mod")
    bases = gomodcache / f"github.com/ray-project/kuberay/ray-operator@{version}/config/crd/bases"
    files = sorted(bases.glob("ray.io_*.yaml"))
    if not files:
        _unavailable(f"the RayCluster CRD: not built into the counterparts and not in {bases}")
    return files


def _kuberay_operator(counterparts: cluster.Counterparts, workdir: Path, plane: cluster.ControlPlane) -> Any:
    start = getattr(cluster, "start_kuberay_operator", None)
    if start is None:
        return None
    try:
        counterparts.check(["kuberay-operator"])
    except cluster.MissingCounterpartError:
        return None
    options: dict[str, Any] = {"apiserver": plane.apiserver, "batch_scheduler": None}
    if "init_containers" in inspect.signature(start).parameters:
        options["init_containers"] = False
    return start(counterparts, workdir, **options)


def _short_of_offer(nodes: list[cluster.HollowGpuNode]) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in nodes:
        obj = node.node.node() or {}
        labels = (obj.get("metadata") or {}).get("labels") or {}
        alloc = (obj.get("status") or {}).get("allocatable") or {}
        if alloc.get(GPU) != "4" or NVLINK_LABEL not in labels:
            out[node.name] = f"{GPU}={alloc.get(GPU)} {NVLINK_LABEL}={labels.get(NVLINK_LABEL)}"
    return out


@pytest.fixture(scope="module")
def setup(
    request: pytest.FixtureRequest,
    counterparts: cluster.Counterparts,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Setup]:
    _require(counterparts, "etcd", "kube-apiserver", "kube-scheduler", "hollownode")
    if os.geteuid() != 0:
        _unavailable("hollow nodes need root: each bind-mounts its device-plugin folder in its own namespace")
    workdir = tmp_path_factory.mktemp("gang-sources")
    from kubernetes import client

    own = _gated_plane(counterparts, workdir)
    plane = own if own is not None else request.getfixturevalue("control_plane")
    api = plane.apiserver.api_client()
    nodes: list[cluster.HollowGpuNode] = []
    names = [f"gs-r{r}-t{t}" for r in range(RACKS) for t in range(TRAYS)] + [CPU_NODE]
    cpu: cluster.HollowNode | None = None
    ext: RunningExtender | None = None
    sched: cluster.Scheduler | None = None
    operator: Any = None
    try:
        cluster.apply_crds(
            api, cluster.load_yaml_documents([REPO_ROOT / "daemonset" / "crds" / "gpunode.yaml"])
        )
        cluster.apply_crds(api, cluster.load_yaml_documents(_ray_crd_files(counterparts)))
        native = ""
        if not _served(api, "/apis/scheduling.k8s.io/v1beta1/podgroups"):
            native = (
                "scheduling.k8s.io/v1beta1 Workload/PodGroup is not served by this kube-apiserver: it "
                "needs --feature-gates=GenericWorkload=true,TopologyAwareWorkloadScheduling=true and "
                "--runtime-config=scheduling.k8s.io/v1beta1=true, and agent.localcluster has no "
                "start_control_plane(feature_gates=...) yet"
            )
        specs = [
            cluster.GpuNodeSpec(f"gs-r{r}-t{t}", f"gb200-nvl72:rack={6 + r},tray={t}")
            for r in range(RACKS)
            for t in range(TRAYS)
        ]
        nodes = cluster.start_hollow_gpu_nodes(
            counterparts,
            workdir,
            apiserver=plane.apiserver,
            specs=specs,
            labels={"gpuagent.dev/e2e-test": LABEL, "gpuagent.dev/hollow": "true"},
            timeout_s=WAIT_S,
            cpus=8,
            memory="32Gi",
        )
        cpu = cluster.start_hollow_node(
            counterparts,
            workdir,
            apiserver=plane.apiserver,
            name=CPU_NODE,
            labels={"gpuagent.dev/e2e-test": LABEL, CPU_ONLY: "true"},
            timeout_s=WAIT_S,
            cpus=8,
            memory="32Gi",
        )
        cluster.wait_until(
            lambda: not _short_of_offer(nodes),
            what="every tray offers 4 GPUs and its NVLink-domain label",
            timeout_s=WAIT_S,
        )
        ext = RunningExtender(str(plane.apiserver.kubeconfig))
        cluster.wait_until(
            lambda: ext is not None and ext.state(lambda s: set(names) <= set(s.cache.nodes)),
            what="the extender sees every tray",
            timeout_s=WAIT_S,
        )
        # with the native API on, our kube-scheduler gets the same gates as a cluster would give every
        # scheduler: its GangScheduling and TopologyPlacementGenerator run beside our extender (the latter
        # filters one domain's nodes at a time, which the extender must not read as a node ruled out)
        sched_options: dict[str, Any] = {}
        if own is not None:
            sched_options["feature_gates"] = cluster.WORKLOAD_FEATURE_GATES
        sched = cluster.start_kube_scheduler(
            counterparts,
            workdir / "sched",
            apiserver=plane.apiserver,
            scheduler_name=SCHEDULER,
            # every pod of this scheduler reaches the extender: with managedResources a RayCluster's CPU
            # head would be bound by kube-scheduler alone, outside its gang's barrier
            extenders=[cluster.extender_entry(ext.url, managed_resource=None)],
            **sched_options,
        )
        operator = _kuberay_operator(counterparts, workdir, plane)
        rack_nodes = [nodes[r * TRAYS : (r + 1) * TRAYS] for r in range(RACKS)]
        yield Setup(plane, api, native, rack_nodes, cpu, ext, operator)
    finally:
        if operator is not None:
            operator.stop()
        if sched is not None:
            sched.stop()
        if ext is not None:
            ext.stop()
        for n in reversed(nodes):
            n.stop()
        if cpu is not None:
            cpu.stop()
        custom = client.CustomObjectsApi(api)
        from kubernetes.client.exceptions import ApiException

        for name in names:
            try:
                custom.delete_cluster_custom_object("topology.gpuagent.dev", "v1alpha1", "gpunodes", name)
            except ApiException as e:
                if e.status != 404:
                    raise
        cluster.delete_nodes(api, names)
        api.close()
        if own is not None:
            own.stop()


@pytest.fixture
def ns(setup: Setup, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace on the module's control plane; at the end its RayClusters and pods are deleted and every
    tray's kubelet has let go of their GPUs."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(setup.api)
    name = f"gs-{request.node.name.lower().replace('_', '-')}"[:50].rstrip("-") + f"-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        custom = client.CustomObjectsApi(setup.api)
        for group, version, plural in (RAY, NATIVE_PODGROUPS, WORKLOADS):
            try:
                custom.delete_collection_namespaced_custom_object(group, version, name, plural)
            except ApiException as e:
                if e.status != 404:
                    raise
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        core.delete_namespace(name)
        for node in setup.by_name().values():
            cluster.wait_until(
                settled(lambda node=node: not held(node)),
                what=f"no devices held on {node.name}",
                timeout_s=WAIT_S,
            )


# ----------------------------------------------------------------------------------------------- helpers


def _template(gpus: int, *, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    resources = (
        {"limits": {GPU: str(gpus)}}
        if gpus
        else {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "1Gi"}}
    )
    selector = {"gpuagent.dev/e2e-test": LABEL, **({} if gpus else {CPU_ONLY: "true"})}  # heads: CPU node
    return {
        "metadata": {"annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": selector,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "ray-worker" if gpus else "ray-head",
                    "image": "rayproject/ray:2.46.0",
                    "resources": resources,
                }
            ],
        },
    }


def raycluster(name: str, groups: dict[str, int]) -> dict[str, Any]:
    """A RayCluster: a CPU head, and per group ``replicas`` 4-GPU workers inside one NVLink domain."""
    nvlink = {"gpuagent.dev/subgroup-tier": "nvlink"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": _template(0)},
            "workerGroupSpecs": [
                {
                    "groupName": group,
                    "replicas": replicas,
                    "minReplicas": replicas,
                    "maxReplicas": replicas,
                    "rayStartParams": {},
                    "template": _template(4, annotations=nvlink),
                }
                for group, replicas in groups.items()
            ],
        },
    }


def _suffix() -> str:
    return uuid.uuid4().hex[:5]


def pods_as_kuberay_makes_them(rc: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    """The head and worker pods KubeRay v1.5 creates for ``rc`` (labels of ``labelPod``, the template's
    annotations and spec, owned by the RayCluster): what the extender sees either way."""
    name, uid = rc["metadata"]["name"], rc["metadata"]["uid"]
    owner = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": name, "uid": uid, "controller": True}
    out = []

    def pod(pod_name: str, node_type: str, group: str, template: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": namespace,
                "labels": {
                    "ray.io/cluster": name,
                    "ray.io/node-type": node_type,
                    "ray.io/group": group,
                    "ray.io/is-ray-node": "yes",
                    "ray.io/identifier": f"{name}-{node_type}",
                    "app.kubernetes.io/name": "kuberay",
                    "app.kubernetes.io/created-by": "kuberay-operator",
                },
                "annotations": dict(template["metadata"].get("annotations") or {}),
                "ownerReferences": [owner],
            },
            "spec": template["spec"],
        }

    out.append(pod(f"{name}-head-{_suffix()}", "head", "headgroup", rc["spec"]["headGroupSpec"]["template"]))
    for group in rc["spec"]["workerGroupSpecs"]:
        for _ in range(group["replicas"]):
            out.append(
                pod(
                    f"{name}-{group['groupName']}-worker-{_suffix()}",
                    "worker",
                    group["groupName"],
                    group["template"],
                )
            )
    return out


def create_raycluster(setup: Setup, namespace: str, rc: dict[str, Any]) -> None:
    from kubernetes import client

    made = client.CustomObjectsApi(setup.api).create_namespaced_custom_object(*RAY[:2], namespace, RAY[2], rc)
    if setup.operator is None:
        core = client.CoreV1Api(setup.api)
        for p in pods_as_kuberay_makes_them(made, namespace):
            core.create_namespaced_pod(namespace, p)


def ray_pods(setup: Setup, namespace: str, cluster_name: str) -> list[Any]:
    from kubernetes import client

    return (
        client.CoreV1Api(setup.api)
        .list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={cluster_name}")
        .items
    )


def events(setup: Setup, namespace: str, reason: str) -> list[Any]:
    from kubernetes import client

    return [
        e for e in client.CoreV1Api(setup.api).list_namespaced_event(namespace).items if e.reason == reason
    ]


def rack_of(setup: Setup, node: str) -> int:
    return next(r for r in range(RACKS) if node in setup.names(r))


def visible_devices(node: cluster.HollowGpuNode, namespace: str, pod: str) -> set[str]:
    """``NVIDIA_VISIBLE_DEVICES`` of the pod's last CRI CreateContainer that carried it (any container)."""
    records = [
        r for r in node.node.records(pod=pod, namespace=namespace) if "NVIDIA_VISIBLE_DEVICES" in r["envs"]
    ]
    assert records, (
        f"no CreateContainer with NVIDIA_VISIBLE_DEVICES recorded for {namespace}/{pod} on {node.name}"
    )
    return {v for v in records[-1]["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",") if v}


def assert_running_with_devices(setup: Setup, namespace: str, placement: dict[str, str]) -> None:
    """Each pod Running on its node; a GPU pod's container created with its node's 4 GPUs, the very IDs
    the kubelet's pod-resources lists for it; no GPU given twice."""
    from kubernetes import client

    core = client.CoreV1Api(setup.api)
    nodes = setup.by_name()
    for pod, node in sorted(placement.items()):
        cluster.wait_until(
            lambda pod=pod: core.read_namespaced_pod(pod, namespace).status.phase == "Running",
            what=f"pod {namespace}/{pod} Running on {node}",
            process=nodes[node].node.process if node in nodes else setup.cpu.process,
            timeout_s=WAIT_S,
        )
    seen: set[str] = set()
    for pod, node in sorted(placement.items()):
        if node not in nodes:
            continue  # the CPU head on the CPU node
        visible = visible_devices(nodes[node], namespace, pod)
        assert visible == node_gpus(nodes[node]), (pod, node, visible)
        assert held(nodes[node], pod=pod, namespace=namespace) == visible
        assert not visible & seen
        seen |= visible


# ------------------------------------------------------------------------------------------------- tests


def test_raycluster_is_one_gang_each_worker_group_in_one_nvlink_domain(
    setup: Setup, ns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    maker = "the KubeRay operator" if setup.operator else "this test, as KubeRay v1.5 makes them"
    with capsys.disabled():
        print(f"\n[gang sources] RayCluster pods made by {maker}")
    create_raycluster(setup, ns, raycluster("train", {"gpu-a": TRAYS, "gpu-b": TRAYS}))
    want = 1 + 2 * TRAYS
    try:
        # the operator makes the pods one at a time: a pod the extender refused while its gang was
        # incomplete waits in kube-scheduler's unschedulable pool until a cluster event (or its 5-minute
        # flush) moves it, so this wait covers the flush
        cluster.wait_until(
            lambda: sum(1 for p in ray_pods(setup, ns, "train") if p.spec.node_name) == want,
            what=f"all {want} pods of RayCluster train bound",
            timeout_s=UNSCHEDULABLE_FLUSH_S,
        )
    except cluster.StartupError:
        from kubernetes import client

        for e in client.CoreV1Api(setup.api).list_namespaced_event(ns).items:
            print(f"event {e.involved_object.name}: {e.reason}: {e.message}")
        raise
    pods = ray_pods(setup, ns, "train")
    placement = {p.metadata.name: p.spec.node_name for p in pods}
    by_group: dict[str, set[int]] = {}
    for p in pods:
        if p.metadata.labels["ray.io/node-type"] == "head":
            assert p.spec.node_name == CPU_NODE  # the head's own nodeSelector, inside the gang's plan
            continue
        by_group.setdefault(p.metadata.labels["ray.io/group"], set()).add(rack_of(setup, p.spec.node_name))
    assert by_group["gpu-a"] != by_group["gpu-b"], placement
    assert len(by_group["gpu-a"]) == 1, placement  # each group in one rack
    assert len(by_group["gpu-b"]) == 1, placement
    planned = events(setup, ns, "GangPlanned")
    assert planned
    assert f"gang {ns}/train: {want} pod(s) planned" in planned[0].message  # the CPU head inside the gang
    # the pods refused before the gang started (incomplete, or waiting) were nudged (annotated) then, so
    # kube-scheduler tried them again at once instead of at its unschedulable pods' flush
    refused = {
        e.involved_object.name
        for reason in ("GangIncomplete", "GangUnschedulable")
        for e in events(setup, ns, reason)
    }
    with capsys.disabled():
        print(
            f"[gang sources] {len(refused)} pod(s) refused while the gang was incomplete, nudged at its start"
        )
    cluster.wait_until(
        lambda: (
            refused
            <= {
                p.metadata.name
                for p in ray_pods(setup, ns, "train")
                if GANG_PLANNED in (p.metadata.annotations or {})
            }
        ),
        what=f"{GANG_PLANNED} on the pods refused before the gang started ({sorted(refused)})",
        timeout_s=WAIT_S,
    )
    assert setup.ext.state(lambda s: f"{ns}/train" in s.cache.rayclusters)
    assert_running_with_devices(setup, ns, placement)

    # a second RayCluster cannot fit while the first runs: it waits whole
    create_raycluster(setup, ns, raycluster("late", {"gpu": 1}))
    cluster.wait_until(
        lambda: any(
            e.involved_object.name.startswith("late-") for e in events(setup, ns, "GangUnschedulable")
        ),
        what="GangUnschedulable Event for RayCluster late",
        timeout_s=WAIT_S,
    )
    late = ray_pods(setup, ns, "late")
    assert late
    assert not any(p.spec.node_name for p in late)


def test_native_workload_podgroup_read_by_our_extender(setup: Setup, ns: str) -> None:
    if setup.native:
        pytest.skip(setup.native)
    from kubernetes import client

    core = client.CoreV1Api(setup.api)
    custom = client.CustomObjectsApi(setup.api)
    busy = setup.names(0)[0]  # rack 0 keeps one free tray: two 4-GPU pods fit only rack 1 together
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "busy"},
            "spec": {
                "nodeName": busy,
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"limits": {GPU: "4"}},
                    }
                ],
            },
        },
    )
    cluster.wait_until(
        lambda: setup.ext.state(lambda s: f"{ns}/busy" in s.cache.pods), what="extender sees busy"
    )
    topology = {"topology": [{"key": NVLINK_LABEL}]}
    gang = {"gang": {"minCount": TRAYS}}
    custom.create_namespaced_custom_object(
        *WORKLOADS[:2],
        ns,
        WORKLOADS[2],
        {
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "Workload",
            "metadata": {"name": "train"},
            "spec": {
                "podGroupTemplates": [
                    {"name": "workers", "schedulingPolicy": gang, "schedulingConstraints": topology}
                ]
            },
        },
    )
    custom.create_namespaced_custom_object(
        *NATIVE_PODGROUPS[:2],
        ns,
        NATIVE_PODGROUPS[2],
        {
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "train-workers"},
            "spec": {
                "workloadRef": {"workloadName": "train", "templateName": "workers"},
                "schedulingPolicy": gang,
                "schedulingConstraints": topology,
            },
        },
    )
    for i in range(TRAYS):
        core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": f"w-{i}"},
                "spec": {
                    "schedulerName": SCHEDULER,
                    "schedulingGroup": {"podGroupName": "train-workers"},
                    "nodeSelector": {"gpuagent.dev/e2e-test": LABEL},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {GPU: "4"}},
                        }
                    ],
                },
            },
        )
    assert core.read_namespaced_pod("w-0", ns).spec.scheduling_group.pod_group_name == "train-workers"

    def bound() -> dict[str, str]:
        return {
            p.metadata.name: p.spec.node_name
            for p in core.list_namespaced_pod(ns).items
            if p.spec.node_name and p.metadata.name.startswith("w-")
        }

    cluster.wait_until(
        lambda: len(bound()) == TRAYS, what=f"{TRAYS} pods of the native PodGroup bound", timeout_s=WAIT_S
    )
    placement = bound()
    assert set(placement.values()) == set(setup.names(1)), placement
    assert setup.ext.state(
        lambda s: f"{ns}/train-workers" in s.cache.workload_podgroups and f"{ns}/train" in s.cache.workloads
    )
    planned = [e for e in events(setup, ns, "GangPlanned") if f"gang {ns}/train-workers" in e.message]
    assert planned
    assert_running_with_devices(setup, ns, {"busy": busy, **placement})


def test_native_podgroup_of_subgroup_size_auto(setup: Setup, ns: str) -> None:
    """A native PodGroup annotated ``gpuagent.dev/subgroup-size: auto`` (issue 29 follow-up): our extender
    chooses the size from the ready trays -- 2, both pods in one rack's 2 trays -- says so in a
    ``SubgroupSizeChosen`` Event and the API server copies ``gpuagent.dev/subgroup-size-chosen`` from the
    Bindings onto the pods."""
    if setup.native:
        pytest.skip(setup.native)
    from kubernetes import client

    core = client.CoreV1Api(setup.api)
    custom = client.CustomObjectsApi(setup.api)
    custom.create_namespaced_custom_object(
        *NATIVE_PODGROUPS[:2],
        ns,
        NATIVE_PODGROUPS[2],
        {
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "PodGroup",
            "metadata": {
                "name": "auto",
                "annotations": {"gpuagent.dev/subgroup-size": "auto", "gpuagent.dev/subgroup-size-min": "1"},
            },
            "spec": {"schedulingPolicy": {"gang": {"minCount": TRAYS}}},
        },
    )
    for i in range(TRAYS):
        core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": f"a-{i}"},
                "spec": {
                    "schedulerName": SCHEDULER,
                    "schedulingGroup": {"podGroupName": "auto"},
                    "nodeSelector": {"gpuagent.dev/e2e-test": LABEL},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {GPU: "4"}},
                        }
                    ],
                },
            },
        )

    def pods() -> list[Any]:
        return [p for p in core.list_namespaced_pod(ns).items if p.spec.node_name]

    cluster.wait_until(
        lambda: len(pods()) == TRAYS, what=f"{TRAYS} pods of the auto PodGroup bound", timeout_s=WAIT_S
    )
    placement = {p.metadata.name: p.spec.node_name for p in pods()}
    assert set(placement.values()) in ({*setup.names(0)}, {*setup.names(1)}), placement
    for p in pods():
        assert (p.metadata.annotations or {}).get("gpuagent.dev/subgroup-size-chosen") == str(TRAYS), (
            p.metadata
        )
    cluster.wait_until(
        lambda: any(
            f"gang {ns}/auto: role default runs in subgroups of {TRAYS} pod(s)" in (e.message or "")
            for e in events(setup, ns, "SubgroupSizeChosen")
        ),
        what="a SubgroupSizeChosen Event",
        timeout_s=WAIT_S,
    )
    assert_running_with_devices(setup, ns, placement)


def test_raycluster_worker_group_of_subgroup_size_auto(
    setup: Setup, ns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A RayCluster whose worker group's template says ``gpuagent.dev/subgroup-size: auto`` (issue 29
    follow-up), 4 workers on 2 racks of 2 ready trays: our extender chooses subgroups of 2, one per rack,
    and the API server copies ``gpuagent.dev/subgroup-size-chosen`` from the Bindings onto the workers."""
    maker = "the KubeRay operator" if setup.operator else "this test, as KubeRay v1.5 makes them"
    with capsys.disabled():
        print(f"\n[gang sources] auto RayCluster pods made by {maker}")
    rc = raycluster("auto", {"gpu": 2 * TRAYS})
    worker_ann = rc["spec"]["workerGroupSpecs"][0]["template"]["metadata"]["annotations"]
    worker_ann.clear()
    worker_ann.update({"gpuagent.dev/subgroup-size": "auto", "gpuagent.dev/subgroup-size-min": "1"})
    create_raycluster(setup, ns, rc)
    want = 1 + 2 * TRAYS
    cluster.wait_until(
        lambda: sum(1 for p in ray_pods(setup, ns, "auto") if p.spec.node_name) == want,
        what=f"all {want} pods of RayCluster auto bound",
        timeout_s=UNSCHEDULABLE_FLUSH_S,
    )
    workers = [p for p in ray_pods(setup, ns, "auto") if p.metadata.labels["ray.io/node-type"] == "worker"]
    racks = sorted(rack_of(setup, p.spec.node_name) for p in workers)
    assert racks == [0] * TRAYS + [1] * TRAYS, racks
    for p in workers:
        assert (p.metadata.annotations or {}).get("gpuagent.dev/subgroup-size-chosen") == str(TRAYS)
    cluster.wait_until(
        lambda: any(
            f"gang {ns}/auto: role gpu runs in subgroups of {TRAYS} pod(s)" in (e.message or "")
            for e in events(setup, ns, "SubgroupSizeChosen")
        ),
        what="a SubgroupSizeChosen Event",
        timeout_s=WAIT_S,
    )
