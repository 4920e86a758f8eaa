"""Gang and topology scheduling end to end on hollow GB200 nodes (issue 17, item 4).

Every node here is a real kubelet (``counterparts/hollownode``: kubemark's hollow kubelet with the
kubelet's real device manager) with one ``gpu-node-agent run --simulate gb200-nvl72:rack=R,tray=T`` on
its folders, as the DaemonSet runs it. Nothing about a node is made by hand: ``nvidia.com/gpu`` in
``Node.status`` came from our plugin through the kubelet, the NVLink-domain labels and the ``GPUNode``
from the agent's publisher, and the ``HyperNode`` tree from our topology controller (running, watching
the agents' GPUNodes, with the simulator's ``ibnetdiscover`` fabric). Then:

- kube-scheduler + our extender: a gang that needs a whole NVLink domain lands in one (the other rack
  has a tray taken), an impossible gang binds nothing, two gangs competing for one domain never end
  half-bound;
- vc-scheduler on our HyperNodes: each subgroup inside one NVLink domain;
- and every bound pod is admitted by its kubelet and ``Running`` with the node's GPUs: the container's
  CRI ``CreateContainer`` carried ``NVIDIA_VISIBLE_DEVICES`` with exactly the devices pod-resources
  says the pod holds;
- the agents' ``/metrics`` label each allocated GPU with pod, namespace and container (from the real
  pod-resources API), and a real Prometheus scraping every agent answers a PromQL query by pod.

Shapes: 2 racks x 4 trays (8 nodes, 32 GPUs) in the default run -- the smallest that still proves
each claim (a gang needs a whole rack; a scheduler filling trays in name order would split it) -- and
the real 2 racks x 18 trays (36 nodes, 144 GPUs, an 18 x 4-GPU gang) marked ``slow``:
``.venv/bin/pytest -m slow tests/e2e/test_hollow_scheduling.py``.

The hand-made-``Node`` versions stay in ``test_extender_e2e.py`` and ``test_volcano.py``: they test the
schedulers' decisions on topologies that no simulated machine makes (domains of 2 and 3 nodes, a
PodGroup source, ``plan --from-cluster``) and cost a fraction of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent import localcluster as cluster
from agent.nvml.sim_sysfs import ibnetdiscover_sample
from agent.nvml.simulate import parse_spec
from agent.podresources.client import PodResourcesError
from tests.agent.metrics.running import prometheus_query
from tests.e2e.conftest import _require, _unavailable
from tests.e2e.test_extender_e2e import RunningExtender
from topology.builder import SOURCE_LABEL, SOURCE_VALUE
from topology.controller import ControllerSettings, TopologyController
from topology.kube import HYPERNODES, Kube, configmaps

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
SCHEDULER = "gpu-topology-scheduler"
PODGROUPS = ("scheduling.volcano.sh", "v1beta1", "podgroups")
WAIT_S = 120.0  # generous: the CI machine has 2 cores shared by every process here


# ------------------------------------------------------------------------------------------------ the racks


@dataclass
class Racks:
    """Hollow GB200 trays, ``nodes[rack][tray]``, with their agents; ``label`` selects them."""

    shape: str
    label: str
    nodes: list[list[cluster.HollowGpuNode]]

    @property
    def trays(self) -> int:
        return len(self.nodes[0])

    def names(self, rack: int) -> list[str]:
        return [n.name for n in self.nodes[rack]]

    def by_name(self) -> dict[str, cluster.HollowGpuNode]:
        return {n.name: n for rack in self.nodes for n in rack}


SHAPES = [
    pytest.param((2, 4), id="2x4"),
    pytest.param((2, 18), id="2x18", marks=[pytest.mark.slow, pytest.mark.timeout(900)]),
]


@pytest.fixture(scope="module", params=SHAPES)
def racks(
    request: pytest.FixtureRequest,
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    api_client: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Racks]:
    """``gb200-nvl72:rack=R,tray=T`` hollow nodes, one rack per NVLink domain; stopped, and their Node and
    GPUNode objects deleted, when the shape's tests are done."""
    _require(counterparts, "hollownode")
    if os.geteuid() != 0:
        _unavailable("hollow nodes need root: each bind-mounts its device-plugin folder in its own namespace")
    request.getfixturevalue("gpunode_crd_installed")  # the agents publish their GPUNode into it
    n_racks, trays = request.param
    shape = f"{n_racks}x{trays}"
    label = f"hollow-sched-{shape}"
    specs = [
        cluster.GpuNodeSpec(f"hs{shape}-r{r}-t{t:02d}", f"gb200-nvl72:rack={r},tray={t}")
        for r in range(n_racks)
        for t in range(trays)
    ]
    nodes: list[cluster.HollowGpuNode] = []
    try:
        nodes = cluster.start_hollow_gpu_nodes(
            counterparts,
            tmp_path_factory.mktemp(f"hollow-sched-{shape}"),
            apiserver=control_plane.apiserver,
            specs=specs,
            labels={"gpuagent.dev/e2e-test": label, "gpuagent.dev/hollow": "true"},
            timeout_s=WAIT_S,
        )
        out = Racks(shape, label, [nodes[r * trays : (r + 1) * trays] for r in range(n_racks)])
        # what a node offers, as the kubelet and the agent put it on the Node
        try:
            cluster.wait_until(
                lambda: not _short_of_offer(nodes),
                what=f"{len(nodes)} hollow trays with nvidia.com/gpu 4 and their NVLink clique label",
                timeout_s=WAIT_S * max(1, len(nodes) // 8),
            )
        except cluster.StartupError as e:
            raise cluster.StartupError(f"{e}; still short: {_short_of_offer(nodes)}") from None
        yield out
    finally:
        _stop_and_delete(api_client, nodes, [s.name for s in specs])


def _short_of_offer(nodes: list[cluster.HollowGpuNode]) -> dict[str, str]:
    """Trays whose Node lacks 4 allocatable GPUs or the agent's NVLink labels, with what it has."""
    out: dict[str, str] = {}
    for node in nodes:
        obj = node.node.node() or {}
        labels = (obj.get("metadata") or {}).get("labels") or {}
        alloc = (obj.get("status") or {}).get("allocatable") or {}
        if alloc.get(GPU) != "4" or "gpuagent.dev/nvlink-domain" not in labels:
            out[node.name] = (
                f"{GPU}={alloc.get(GPU)} nvlink-domain={labels.get('gpuagent.dev/nvlink-domain')}"
            )
    return out


def _stop_and_delete(api_client: Any, nodes: list[cluster.HollowGpuNode], names: list[str]) -> None:
    """Stop what started; delete every spec's GPUNode and Node (a failed start may have registered some)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    for node in reversed(nodes):
        node.stop()
    custom = client.CustomObjectsApi(api_client)
    for name in names:
        try:
            custom.delete_cluster_custom_object("topology.gpuagent.dev", "v1alpha1", "gpunodes", name)
        except ApiException as e:
            if e.status != 404:
                raise
    cluster.delete_nodes(api_client, names)


@pytest.fixture(scope="module")
def domains(api_client: Any, racks: Racks, volcano_crds: list[str]) -> Iterator[dict[str, set[str]]]:
    """Our topology controller, running, turns the agents' GPUNodes (and the racks' fabric) into
    HyperNodes; yields the ``nvlink`` HyperNodes' members by name once there is one per rack."""
    from kubernetes import client

    kube = Kube(api_client)
    core = client.CoreV1Api(api_client)
    # a name of its own per module using this fixture: a namespace deleted by an earlier module stays
    # Terminating here (no namespace controller runs), and creating it again would conflict
    ns = f"hollow-topo-{racks.shape}-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": ns}})
    specs = [parse_spec(n.spec.simulate) for rack in racks.nodes for n in rack]
    kube.apply(
        f"{configmaps(ns)}/fabric",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "fabric", "namespace": ns, "labels": {"gpuagent.dev/fabric": "ib"}},
            "data": {"cluster.ibnetdiscover": ibnetdiscover_sample(specs)},
        },
    )
    controller = TopologyController(
        kube=kube,
        settings=ControllerSettings(
            namespace=ns, identity=f"hollow-{racks.shape}", debounce_s=0.2, watch_timeout_s=5
        ),
    )
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(controller.run(stop)), daemon=True)
    thread.start()
    want = sorted(sorted(racks.names(r)) for r in range(len(racks.nodes)))
    try:
        cluster.wait_until(
            lambda: sorted(sorted(m) for m in _nvlink_domains(kube).values()) == want,
            what="one nvlink HyperNode per rack from the agents' GPUNodes",
            timeout_s=WAIT_S,
        )
        yield _nvlink_domains(kube)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()
        items, _ = kube.list(HYPERNODES, label_selector=f"{SOURCE_LABEL}={SOURCE_VALUE}")
        for o in items:
            kube.delete(f"{HYPERNODES}/{o['metadata']['name']}")
        core.delete_namespace(ns)


def _nvlink_domains(kube: Kube) -> dict[str, set[str]]:
    items, _ = kube.list(HYPERNODES, label_selector=f"{SOURCE_LABEL}={SOURCE_VALUE}")
    return {
        o["metadata"]["name"]: {m["selector"]["exactMatch"]["name"] for m in o["spec"]["members"]}
        for o in items
        if o["spec"]["tierName"] == "nvlink"
    }


@contextlib.contextmanager
def extender_behind_scheduler(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    sched_dir: Path,
    sees: Callable[[Any], bool],
    *,
    what: str,
) -> Iterator[RunningExtender]:
    """``gpu-node-agent extender`` behind a kube-scheduler named ``gpu-topology-scheduler``, started once
    the extender's state ``sees`` what the test needs (``what`` names it); both stopped after."""
    _require(counterparts, "kube-scheduler")
    ext = RunningExtender(str(control_plane.apiserver.kubeconfig))
    sched: cluster.Scheduler | None = None
    try:
        cluster.wait_until(lambda: ext.state(sees), what=what, timeout_s=WAIT_S)
        sched = cluster.start_kube_scheduler(
            counterparts,
            sched_dir,
            apiserver=control_plane.apiserver,
            scheduler_name=SCHEDULER,
            extenders=[cluster.extender_entry(ext.url, managed_resource=GPU)],
        )
        yield ext
    finally:
        if sched is not None:
            sched.stop()
        ext.stop()


@pytest.fixture(scope="module")
def extender(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    racks: Racks,
    domains: dict[str, set[str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningExtender]:
    """The extender behind its kube-scheduler, once it has every tray and every nvlink HyperNode."""
    names = set(racks.by_name())
    with extender_behind_scheduler(
        counterparts,
        control_plane,
        tmp_path_factory.mktemp("sched-ext"),
        lambda s: names <= set(s.cache.nodes) and set(domains) <= set(s.cache.hypernodes),
        what="the extender sees every tray and HyperNode",
    ) as ext:
        yield ext


@pytest.fixture(autouse=True)
def idle_trays(request: pytest.FixtureRequest) -> None:
    """Before each test: no pod of an earlier test holds a GPU on any tray (the kubelets have let go of
    the pods the ``namespace`` fixture force-deleted), so admission sees every device free."""
    if "racks" not in request.fixturenames:
        return
    racks: Racks = request.getfixturevalue("racks")
    for node in racks.by_name().values():
        cluster.wait_until(
            settled(lambda node=node: not held(node)),
            what=f"no devices held on {node.name}",
            timeout_s=WAIT_S,
        )


# ----------------------------------------------------------------------------------------------- helpers


def gpu_pod(
    name: str, *, scheduler: str, label: str, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {"gpuagent.dev/e2e-test": label},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {GPU: "4"}},
                }
            ],
        },
    }


def gang(name: str, n: int, label: str) -> list[dict[str, Any]]:
    """``n`` 4-GPU pods of one gang whose one subgroup must sit inside one NVLink domain."""
    return [
        gpu_pod(
            f"{name}-{i}",
            scheduler=SCHEDULER,
            label=label,
            annotations={
                "gpuagent.dev/gang": name,
                "gpuagent.dev/gang-size": str(n),
                "gpuagent.dev/subgroup-size": str(n),
                "gpuagent.dev/subgroup-tier": "nvlink",
                "gpuagent.dev/rank": str(i),
            },
        )
        for i in range(n)
    ]


def occupy(api: Any, ns: str, node: str, name: str) -> None:
    """A pod bound straight to ``node`` (no scheduler): its kubelet admits it with all 4 GPUs."""
    pod = gpu_pod(name, scheduler="none", label="")
    pod["spec"] = {k: v for k, v in pod["spec"].items() if k not in ("schedulerName", "nodeSelector")}
    pod["spec"]["nodeName"] = node
    create(api, ns, [pod])


def create(api: Any, ns: str, pods: list[dict[str, Any]]) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    for p in pods:
        core.create_namespaced_pod(ns, p)


def pods_of(api: Any, ns: str, prefix: str) -> dict[str, Any]:
    from kubernetes import client

    return {
        p.metadata.name: p
        for p in client.CoreV1Api(api).list_namespaced_pod(ns).items
        if p.metadata.name.startswith(prefix + "-")
    }


def bound(api: Any, ns: str, prefix: str) -> dict[str, str]:
    return {name: p.spec.node_name for name, p in pods_of(api, ns, prefix).items() if p.spec.node_name}


def events(api: Any, ns: str, reason: str) -> list[Any]:
    from kubernetes import client

    return [e for e in client.CoreV1Api(api).list_namespaced_event(ns).items if e.reason == reason]


def held(node: cluster.HollowGpuNode, *, pod: str | None = None, namespace: str | None = None) -> set[str]:
    """GPU device IDs pod-resources ``List`` shows held on ``node`` (by one pod, or by any)."""
    return {
        row.device_id
        for row in node.node.pod_resources().assignments
        if row.resource == GPU
        and (pod is None or row.pod == pod)
        and (namespace is None or row.namespace == namespace)
    }


def settled(predicate: Callable[[], bool]) -> Callable[[], bool]:
    """``predicate`` for ``wait_until``: a failing pod-resources call (a busy kubelet) counts as not yet."""

    def check() -> bool:
        try:
            return predicate()
        except PodResourcesError:
            return False

    return check


def node_gpus(node: cluster.HollowGpuNode) -> set[str]:
    """Every GPU the kubelet's device manager has for ``node`` (pod-resources GetAllocatableResources)."""
    return {row.device_id for row in node.node.pod_resources().allocatable or () if row.resource == GPU}


def visible_devices(node: cluster.HollowGpuNode, namespace: str, pod: str) -> set[str]:
    """``NVIDIA_VISIBLE_DEVICES`` of the last CRI CreateContainer of the pod's container ``main``."""
    records = [r for r in node.node.records(pod=pod, namespace=namespace) if r["container"] == "main"]
    assert records, f"no CreateContainer recorded for {namespace}/{pod} on {node.name}"
    return {v for v in records[-1]["envs"].get("NVIDIA_VISIBLE_DEVICES", "").split(",") if v}


def assert_running_with_devices(api: Any, ns: str, placement: dict[str, str], racks: Racks) -> None:
    """Every pod of ``placement`` is admitted and Running on its node, and its container was created
    with all 4 of that node's GPUs -- the very IDs the kubelet's pod-resources lists for the pod."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    nodes = racks.by_name()
    for pod, node in sorted(placement.items()):
        cluster.wait_until(
            lambda pod=pod: core.read_namespaced_pod(pod, ns).status.phase == "Running",
            what=f"pod {ns}/{pod} Running on {node}",
            process=nodes[node].node.process,
            timeout_s=WAIT_S,
        )
    seen: set[str] = set()
    for pod, node in sorted(placement.items()):
        visible = visible_devices(nodes[node], ns, pod)
        assert visible == node_gpus(nodes[node]), (pod, node, visible)
        assert held(nodes[node], pod=pod, namespace=ns) == visible
        assert not visible & seen  # no GPU given to two pods
        seen |= visible


# ------------------------------------------------------------------------------------ kube-scheduler + ours


def test_gang_lands_in_one_nvlink_domain_and_runs(
    api_client: Any, namespace: str, racks: Racks, extender: RunningExtender
) -> None:
    occupy(api_client, namespace, racks.names(0)[racks.trays // 2], "busy")  # rack 0 cannot take it whole
    cluster.wait_until(
        lambda: extender.state(lambda s: f"{namespace}/busy" in s.cache.pods),
        what="extender sees the busy pod",
    )
    create(api_client, namespace, gang("train", racks.trays, racks.label))
    cluster.wait_until(
        lambda: len(bound(api_client, namespace, "train")) == racks.trays,
        what=f"all {racks.trays} gang pods bound",
        timeout_s=WAIT_S,
    )
    placement = bound(api_client, namespace, "train")
    assert set(placement.values()) == set(racks.names(1))
    assert [placement[f"train-{i}"] for i in range(racks.trays)] == sorted(racks.names(1))  # ranks in order
    assert_running_with_devices(
        api_client, namespace, {"busy": racks.names(0)[racks.trays // 2], **placement}, racks
    )


def test_impossible_gang_binds_nothing(
    api_client: Any, namespace: str, racks: Racks, extender: RunningExtender
) -> None:
    create(api_client, namespace, gang("huge", racks.trays + 1, racks.label))  # one tray more than a rack
    cluster.wait_until(
        lambda: events(api_client, namespace, "GangUnschedulable"),
        what="GangUnschedulable Event",
        timeout_s=WAIT_S,
    )
    assert bound(api_client, namespace, "huge") == {}
    assert "nvlink" in events(api_client, namespace, "GangUnschedulable")[0].message
    # nothing reached a kubelet either
    assert all(not n.node.records(namespace=namespace) for n in racks.by_name().values())


def test_competing_gangs_never_half_bound(
    api_client: Any, namespace: str, racks: Racks, extender: RunningExtender
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    fill = dict(zip((f"fill-{t}" for t in range(racks.trays)), racks.names(1), strict=True))
    for pod, node in fill.items():  # rack 1 is full: both gangs compete for rack 0
        occupy(api_client, namespace, node, pod)
    cluster.wait_until(
        lambda: (
            extender.state(lambda s: sum(k.startswith(f"{namespace}/fill-") for k in s.cache.pods))
            == racks.trays
        ),
        what="extender sees rack 1 full",
    )
    size = racks.trays // 2 + 1  # two of them never fit one rack together
    a, b = gang("ga", size, racks.label), gang("gb", size, racks.label)
    create(api_client, namespace, [p for pair in zip(a, b, strict=True) for p in pair])  # interleaved
    cluster.wait_until(
        lambda: max(len(bound(api_client, namespace, "ga")), len(bound(api_client, namespace, "gb"))) == size,
        what="one gang bound",
        timeout_s=WAIT_S,
    )
    first, second = ("ga", "gb") if len(bound(api_client, namespace, "ga")) == size else ("gb", "ga")
    cluster.wait_until(
        lambda: any(
            e.involved_object.name.startswith(second + "-")
            for e in events(api_client, namespace, "GangUnschedulable")
        ),
        what=f"GangUnschedulable Event for {second}",
        timeout_s=WAIT_S,
    )
    assert bound(api_client, namespace, second) == {}
    assert_running_with_devices(api_client, namespace, {**fill, **bound(api_client, namespace, first)}, racks)
    for i in range(size):
        core.delete_namespaced_pod(f"{first}-{i}", namespace, grace_period_seconds=0)
    cluster.wait_until(
        lambda: (
            not extender.state(lambda s: [k for k in s.cache.pods if k.startswith(f"{namespace}/{first}-")])
        ),
        what="extender sees the first gang gone",
    )
    for node in racks.nodes[0]:  # its kubelets let its GPUs go (the second gang may hold them already)
        cluster.wait_until(
            settled(
                lambda node=node: (
                    not any(r.pod.startswith(first + "-") for r in node.node.pod_resources().assignments)
                )
            ),
            what=f"{first} gone from {node.name}'s pod-resources",
            timeout_s=WAIT_S,
        )
    # a cluster event after that makes kube-scheduler retry the waiting pods now, not after a back-off
    for i in range(size):
        core.patch_namespaced_pod(f"{second}-{i}", namespace, {"metadata": {"labels": {"retry": "1"}}})
    cluster.wait_until(
        lambda: len(bound(api_client, namespace, second)) == size,
        what=f"{second} bound after {first} left",
        timeout_s=WAIT_S,
    )
    placement = bound(api_client, namespace, second)
    assert set(placement.values()) <= set(racks.names(0))
    assert_running_with_devices(api_client, namespace, placement, racks)


# --------------------------------------------------------------------------------- Volcano on our HyperNodes


@pytest.fixture
def cleanup_podgroups(api_client: Any, namespace: str) -> Iterator[None]:
    yield
    from kubernetes import client

    client.CustomObjectsApi(api_client).delete_collection_namespaced_custom_object(
        *PODGROUPS[:2], namespace, PODGROUPS[2]
    )


@pytest.mark.usefixtures("cleanup_podgroups")
def test_volcano_keeps_each_subgroup_in_one_of_our_nvlink_domains_and_pods_run(
    api_client: Any, namespace: str, racks: Racks, domains: dict[str, set[str]], volcano: cluster.Scheduler
) -> None:
    from kubernetes import client

    # Rack 0 loses a tray: it has room for one subgroup of trays/2 pods, not two. A scheduler filling
    # trays in name order would put the second subgroup partly on rack 0 and partly on rack 1.
    busy = racks.names(0)[0]
    occupy(api_client, namespace, busy, "busy")
    half = racks.trays // 2
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        *PODGROUPS[:2],
        namespace,
        PODGROUPS[2],
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "train"},
            "spec": {
                "minMember": 2 * half,
                "queue": "default",
                "subGroupPolicy": [
                    {
                        "name": "w",
                        "subGroupSize": half,
                        "minSubGroups": 2,
                        "labelSelector": {"matchLabels": {"app": "train"}},
                        "matchLabelKeys": ["volcano.sh/partition-id"],
                        "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
                    }
                ],
            },
        },
    )
    pods = []
    for i in range(2 * half):
        pod = gpu_pod(
            f"vc-{i}",
            scheduler="volcano",
            label=racks.label,
            annotations={"scheduling.k8s.io/group-name": "train"},
        )
        pod["metadata"]["labels"] = {"app": "train", "volcano.sh/partition-id": str(i // half)}
        pods.append(pod)
    create(api_client, namespace, pods)
    cluster.wait_until(
        lambda: len(bound(api_client, namespace, "vc")) == 2 * half,
        what=f"all {2 * half} pods bound by vc-scheduler",
        timeout_s=WAIT_S,
    )
    where = bound(api_client, namespace, "vc")
    for part in range(2):
        nodes = {where[f"vc-{i}"] for i in range(part * half, (part + 1) * half)}
        assert len(nodes) == half  # one 4-GPU pod per tray
        assert any(nodes <= members for members in domains.values()), (
            f"subgroup {part} spans domains: {nodes}"
        )
    assert busy not in where.values()
    assert_running_with_devices(api_client, namespace, {"busy": busy, **where}, racks)


# ------------------------------------------------------------------------------------ metrics and Prometheus


@pytest.fixture
def prometheus(racks: Racks, tmp_path: Path) -> Iterator[int]:
    """A real Prometheus (Debian package ``prometheus``) scraping every tray's agent each second; yields
    its port once every agent is ``up``."""
    if shutil.which("prometheus") is None:
        _unavailable("needs the Debian package 'prometheus' (.ci/system-packages.txt)")
    targets = ", ".join(f"'127.0.0.1:{n.agent.metrics_port}'" for n in racks.by_name().values())
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: gpu-node-agent\n    static_configs: [{{targets: [{targets}]}}]\n"
    )
    port = cluster.free_port()
    proc = cluster.ManagedProcess(
        "prometheus",
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        tmp_path / "prometheus.log",
    ).start()
    try:

        def all_up() -> bool:
            try:
                up = prometheus_query(port, "sum(up)")
            except (OSError, AssertionError):
                return False
            return bool(up) and float(up[0]["value"][1]) == len(racks.by_name())

        cluster.wait_until(all_up, what="Prometheus scrapes every agent", process=proc, timeout_s=WAIT_S)
        yield port
    finally:
        proc.stop()


def test_metrics_label_each_allocated_gpu_with_its_pod_and_prometheus_answers_by_pod(
    api_client: Any, namespace: str, racks: Racks, extender: RunningExtender, prometheus: int
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    create(api_client, namespace, gang("m", 2, racks.label))
    cluster.wait_until(
        lambda: len(bound(api_client, namespace, "m")) == 2, what="both pods bound", timeout_s=WAIT_S
    )
    placement = bound(api_client, namespace, "m")
    assert_running_with_devices(api_client, namespace, placement, racks)
    nodes = racks.by_name()
    want = {pod: visible_devices(nodes[node], namespace, pod) for pod, node in placement.items()}

    def labelled(node: cluster.HollowGpuNode) -> dict[str, set[str]]:
        """pod -> GPU UUIDs whose allocation series on this agent carry that pod of our namespace."""
        out: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(node.agent.metrics()):
            for s in family.samples:
                if s.name == "gpuagent_device_allocation_info" and s.labels.get("namespace") == namespace:
                    assert s.labels["container"] == "main"
                    out.setdefault(s.labels["pod"], set()).add(s.labels["uuid"])
        return out

    for pod, node in placement.items():
        cluster.wait_until(
            lambda pod=pod, node=node: labelled(nodes[node]) == {pod: want[pod]},
            what=f"{node}'s /metrics label its 4 GPUs with {pod}",
            process=nodes[node].agent.process,
            timeout_s=WAIT_S,
        )

    query = f'count by (pod) (gpuagent_device_allocation_info{{namespace="{namespace}", container="main"}})'

    def by_pod() -> dict[str, float]:
        return {r["metric"]["pod"]: float(r["value"][1]) for r in prometheus_query(prometheus, query)}

    cluster.wait_until(lambda: by_pod() == {"m-0": 4.0, "m-1": 4.0}, what=f"PromQL {query}", timeout_s=WAIT_S)
    for pod in placement:
        rows = prometheus_query(
            prometheus, f'gpuagent_device_allocation_info{{namespace="{namespace}", pod="{pod}"}}'
        )
        assert {r["metric"]["uuid"] for r in rows} == want[pod]
        # the GPUs' own series, joined to the pod through the allocation info, answer by pod as well
        temps = prometheus_query(
            prometheus,
            "gpuagent_gpu_temperature_celsius * on (instance, uuid) group_left (pod) "
            f'gpuagent_device_allocation_info{{namespace="{namespace}", pod="{pod}"}}',
        )
        assert {r["metric"]["uuid"] for r in temps} == want[pod]
        assert {r["metric"]["pod"] for r in temps} == {pod}
