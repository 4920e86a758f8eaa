"""End to end on hollow GPU nodes: real kubelets whose device manager talks to our agent (issue 17).

Each node is ``counterparts/hollownode`` (kubemark's hollow kubelet with the kubelet's real device
manager) plus one ``gpu-node-agent run --simulate PROFILE`` on that node's folders, publishing to the
shared API server, as the DaemonSet runs it. What is checked is the path a user's cluster runs: our
plugins register with the kubelet, capacity reaches ``Node.status``, kube-scheduler binds a pod, the
kubelet admits it through ``GetPreferredAllocation``/``Allocate`` and hands the runtime our environment
(the node records every CRI ``CreateContainer``), pod-resources tells the agent who holds what, and
health, kubelet restarts and agent restarts keep every allocation.

The nodes are module-scoped (one start for the module): ``dgx1-v100`` (whole GPUs, faults, restarts,
metrics), ``dgx-a100-mig`` with MIG ``mixed``, ``pcie-l40s`` time-sliced (4 replicas, packed), and for
one test ``dgx-a100-mig`` reconfigured to one profile with MIG ``single``. Tests that change a node
(faults, restarts) put it back as they found it. Each pod test first waits until the node holds no
devices, so the preferred allocation it checks is the answer with every device free.

Needs root (each hollow node bind-mounts its own device-plugin folder in a private mount namespace).
The default run takes about 45 s on 2 idle cores; ``pytest -m slow tests/e2e/test_hollow_nodes.py`` runs
the heavier case (eight nodes side by side).
"""

from __future__ import annotations

import itertools
import json
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent import localcluster as cluster
from agent.simnode import open_simulated_node
from deviceplugin.config import parse_plugin_config
from deviceplugin.preferred import preferred_allocation, topology_from_inventory
from deviceplugin.resources import Resource, build_plan
from topology.gpunode import inventory_from_gpunode
from topology.model import LinkLevel, NodeInventory

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
GPUNODES = ("topology.gpuagent.dev", "v1alpha1", "gpunodes")
QUIET_S = 2  # health.recoveryQuietSeconds of the v100 node
WAIT_S = 90.0  # generous: the CI machine has 2 cores shared by everything here

V100 = cluster.GpuNodeSpec(
    "hn-v100",
    "dgx1-v100",
    config={"health": {"recoveryQuietSeconds": QUIET_S, "probeIntervalSeconds": 0.2}},
    faults=(),
)
MIG_MIXED = cluster.GpuNodeSpec("hn-a100-mixed", "dgx-a100-mig", config={"flags": {"migStrategy": "mixed"}})
TIME_SLICED = cluster.GpuNodeSpec(
    "hn-l40s-shared",
    "pcie-l40s",
    config={
        "flags": {"plugin": {"sharedDevicesAllocationPolicy": "packed"}},
        "sharing": {"timeSlicing": {"resources": [{"name": GPU, "replicas": 4}]}},
    },
)
MIG_SINGLE = cluster.GpuNodeSpec(
    "hn-a100-single",
    "dgx-a100-mig",
    config={"flags": {"migStrategy": "single"}},
    # one profile on every GPU (the preset's layout is mixed), applied before the agent first looks
    faults=tuple({"event": "mig_reconfig", "gpu": g, "profiles": ["3g.40gb", "3g.40gb"]} for g in range(8)),
)


# ------------------------------------------------------------------------------------ what the agent offers


class Simulated:
    """The node an agent of ``spec`` sees: the same simulator, fault lines, discovery and resource plan."""

    def __init__(self, spec: cluster.GpuNodeSpec) -> None:
        with tempfile.TemporaryDirectory(prefix="hollow-expect-") as d:
            faults = None
            if spec.faults is not None:
                faults = Path(d) / "faults.jsonl"
                faults.write_text("".join(json.dumps(dict(e)) + "\n" for e in spec.faults))
            with open_simulated_node(spec.simulate, faults_path=faults, hostname=spec.name) as sim:
                sim.nvml.init()
                try:
                    self.inventory: NodeInventory = sim.discover(strict=True)
                    live = sorted(g.index for g in self.inventory.gpus if not g.lost)
                    levels = {(a, b): sim.nvml.pcie_level(a, b) for a, b in itertools.combinations(live, 2)}
                finally:
                    sim.nvml.shutdown()
        self.pcie: dict[tuple[int, int], LinkLevel] = {k: v for k, v in levels.items() if v is not None}
        plan = build_plan(self.inventory, parse_plugin_config(dict(spec.config or {})))
        self.resources: dict[str, Resource] = {r.name: r for r in plan.resources}

    def advertised(self) -> dict[str, frozenset[str]]:
        """Device IDs by resource name, as the plugins list them to the kubelet."""
        return {name: frozenset(d.id for d in r.devices) for name, r in self.resources.items()}

    def preferred(self, resource: str, size: int) -> set[str]:
        """Our preferred allocation of ``size`` devices of ``resource`` with every device free."""
        res = self.resources[resource]
        ids = [d.id for d in res.devices]
        return set(
            preferred_allocation(
                candidates=res.candidates(dict.fromkeys(ids, True)),
                topology=topology_from_inventory(self.inventory, pcie_levels=self.pcie),
                available=ids,
                must_include=[],
                size=size,
            )
        )


# ------------------------------------------------------------------------------------------------ helpers


def wait_status(
    node: cluster.HollowGpuNode, counts: Mapping[str, int], *, allocatable_only: bool = False
) -> None:
    """Until Node.status lists exactly ``counts`` for these resources (capacity too unless told)."""
    want = {k: str(v) for k, v in counts.items()}

    def matches() -> bool:
        alloc = node.node.allocatable()
        if any(alloc.get(k) != v for k, v in want.items()):
            return False
        return allocatable_only or all(node.node.capacity().get(k) == v for k, v in want.items())

    cluster.wait_until(
        matches,
        what=f"Node {node.name} status {want}",
        process=node.agent.process,
        timeout_s=WAIT_S,
        interval_s=0.2,
    )


def gpu_pod(name: str, node: str, resources: Mapping[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {k: str(v) for k, v in resources.items()}},
                }
            ],
        },
    }


class Pods:
    """Pods of one test's namespace on hollow nodes (the ``namespace`` fixture deletes them)."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace

    def create(self, name: str, node: cluster.HollowGpuNode, resources: Mapping[str, int]) -> str:
        body: Any = gpu_pod(name, node.name, resources)  # the client takes plain dicts too
        self.core.create_namespaced_pod(self.namespace, body)
        return name

    def get(self, name: str) -> Any:
        return self.core.read_namespaced_pod(name, self.namespace)

    def phase(self, name: str) -> str | None:
        return self.get(name).status.phase  # type: ignore[no-any-return]

    def wait_running(self, name: str, node: cluster.HollowGpuNode) -> Any:
        cluster.wait_until(
            lambda: self.phase(name) == "Running",
            what=f"pod {self.namespace}/{name} Running on {node.name}",
            process=node.node.process,
            timeout_s=WAIT_S,
        )
        pod = self.get(name)
        assert pod.spec.node_name == node.name
        return pod

    def unschedulable(self, name: str) -> bool:
        conds = self.get(name).status.conditions or []
        return any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable" for c in conds
        )


def held(
    node: cluster.HollowGpuNode, *, pod: str | None = None, namespace: str | None = None
) -> dict[str, set[str]]:
    """Device IDs by resource that pod-resources ``List`` shows held (by one pod, or by any)."""
    out: dict[str, set[str]] = {}
    for row in node.node.pod_resources().assignments:
        if (pod is None or row.pod == pod) and (namespace is None or row.namespace == namespace):
            out.setdefault(row.resource, set()).add(row.device_id)
    return out


def wait_idle(node: cluster.HollowGpuNode) -> None:
    """Until no pod holds a device on ``node`` (earlier tests' pods are deleted at their end)."""
    cluster.wait_until(lambda: not held(node), what=f"no devices held on {node.name}", timeout_s=WAIT_S)


def visible_devices(node: cluster.HollowGpuNode, namespace: str, pod: str) -> list[str]:
    """``NVIDIA_VISIBLE_DEVICES`` of the last CreateContainer of the pod's container ``main``."""
    records = [r for r in node.node.records(pod=pod, namespace=namespace) if r["container"] == "main"]
    assert records, f"no CreateContainer recorded for {namespace}/{pod}"
    value = records[-1]["envs"].get("NVIDIA_VISIBLE_DEVICES", "")
    return [v for v in value.split(",") if v]


def advertised_in_kubelet(node: cluster.HollowGpuNode) -> dict[str, frozenset[str]]:
    """Device IDs by resource the kubelet's device manager holds (pod-resources GetAllocatableResources)."""
    out: dict[str, set[str]] = {}
    for row in node.node.pod_resources().allocatable or ():
        out.setdefault(row.resource, set()).add(row.device_id)
    return {k: frozenset(v) for k, v in out.items()}


# ----------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def v100(hollow_gpu_nodes: Callable[..., list[cluster.HollowGpuNode]]) -> cluster.HollowGpuNode:
    (node,) = hollow_gpu_nodes(V100)
    wait_status(node, {GPU: 8})
    return node


@pytest.fixture(scope="module")
def mig_mixed(hollow_gpu_nodes: Callable[..., list[cluster.HollowGpuNode]]) -> cluster.HollowGpuNode:
    (node,) = hollow_gpu_nodes(MIG_MIXED)
    return node


@pytest.fixture(scope="module")
def time_sliced(hollow_gpu_nodes: Callable[..., list[cluster.HollowGpuNode]]) -> cluster.HollowGpuNode:
    (node,) = hollow_gpu_nodes(TIME_SLICED)
    return node


@pytest.fixture
def mig_single(
    hollow_gpu_nodes: Callable[..., list[cluster.HollowGpuNode]],
) -> Iterator[cluster.HollowGpuNode]:
    """Only for its test: stopped right after (the module's finalizer deletes its Node)."""
    (node,) = hollow_gpu_nodes(MIG_SINGLE)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def pods(api_client: Any, namespace: str, module_kube_scheduler: cluster.Scheduler) -> Pods:
    return Pods(api_client, namespace)


# ---------------------------------------------------------------------------------------- Node.status


@pytest.mark.parametrize(
    ("fixture", "spec"),
    [("v100", V100), ("mig_mixed", MIG_MIXED), ("time_sliced", TIME_SLICED), ("mig_single", MIG_SINGLE)],
    ids=["gpu-dgx1-v100", "mig-mixed", "time-sliced", "mig-single"],
)
def test_node_status_is_exactly_what_the_plugins_advertise(
    request: pytest.FixtureRequest, fixture: str, spec: cluster.GpuNodeSpec
) -> None:
    node: cluster.HollowGpuNode = request.getfixturevalue(fixture)
    advertised = Simulated(spec).advertised()
    counts = {name: len(ids) for name, ids in advertised.items()}
    wait_status(node, counts)
    # nothing else of ours: the kubelet lists exactly the plugins' resources ...
    status = node.node.node() or {}
    ours = {k for k in status["status"]["capacity"] if k.startswith("nvidia.com/")}
    assert ours == set(advertised)
    # ... with the very device IDs each plugin's ListAndWatch sent
    assert advertised_in_kubelet(node) == advertised
    # the figures the issue names, literally
    expected = {
        "v100": {GPU: 8},
        "mig_mixed": {
            GPU: 4,
            "nvidia.com/mig-1g.10gb": 9,
            "nvidia.com/mig-2g.20gb": 2,
            "nvidia.com/mig-3g.40gb": 3,
            "nvidia.com/mig-4g.40gb": 1,
        },
        "time_sliced": {GPU: 16},
        "mig_single": {GPU: 16},
    }[fixture]
    assert counts == expected


def test_agent_publishes_labels_and_gpunode_for_the_hollow_node(
    v100: cluster.HollowGpuNode, api_client: Any
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    custom = client.CustomObjectsApi(api_client)

    def gpunode() -> Any:
        try:
            return custom.get_cluster_custom_object(GPUNODES[0], GPUNODES[1], GPUNODES[2], v100.name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def published() -> bool:
        labels = ((v100.node.node() or {}).get("metadata") or {}).get("labels") or {}
        return labels.get("nvidia.com/gpu.count") == "8" and gpunode() is not None

    cluster.wait_until(
        published, what="labels and GPUNode of the hollow node", process=v100.agent.process, timeout_s=WAIT_S
    )
    node = v100.node.node() or {}
    labels = node["metadata"]["labels"]
    assert "V100" in labels["nvidia.com/gpu.product"]
    assert labels["kubernetes.io/hostname"] == v100.name  # the kubelet's own labels are untouched
    assert labels["gpuagent.dev/hollow"] == "true"
    obj = gpunode()
    assert obj["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    name, inventory, _ = inventory_from_gpunode(obj)
    assert name == v100.name
    assert inventory == Simulated(V100).inventory


# ------------------------------------------------------------------------------------------- admission


def test_two_gpu_pod_runs_on_an_nvlinked_pair_we_preferred(v100: cluster.HollowGpuNode, pods: Pods) -> None:
    sim = Simulated(V100)
    wait_idle(v100)
    pods.create("pair", v100, {GPU: 2})
    pods.wait_running("pair", v100)
    visible = visible_devices(v100, pods.namespace, "pair")
    assert len(visible) == 2
    # the runtime got exactly the two devices the kubelet records as the pod's
    assert held(v100, pod="pair", namespace=pods.namespace) == {GPU: set(visible)}
    index = {g.uuid: g.index for g in sim.inventory.gpus}
    a, b = sorted(index[u] for u in visible)
    assert sim.inventory.matrix is not None
    assert sim.inventory.matrix.connection(a, b).nvlinks == 2  # an NV2 pair of the hybrid cube-mesh
    # the kubelet asked us: its own fallback takes devices in no topology order
    assert set(visible) == sim.preferred(GPU, 2)


def test_mig_pod_gets_two_slices_of_one_gpu(mig_mixed: cluster.HollowGpuNode, pods: Pods) -> None:
    resource = "nvidia.com/mig-1g.10gb"
    sim = Simulated(MIG_MIXED)
    wait_idle(mig_mixed)
    pods.create("mig", mig_mixed, {resource: 2})
    pods.wait_running("mig", mig_mixed)
    visible = visible_devices(mig_mixed, pods.namespace, "mig")
    assert len(visible) == 2
    assert all(v.startswith("MIG-") for v in visible)
    assert held(mig_mixed, pod="mig", namespace=pods.namespace) == {resource: set(visible)}
    parents = {m.uuid: m.parent_index for m in sim.inventory.mig_devices()}
    assert {parents[v] for v in visible} == {0}  # GPU 0 is the one whose 1g.10gb slices can hold both
    assert set(visible) == sim.preferred(resource, 2)


def test_two_pods_share_one_time_sliced_gpu(time_sliced: cluster.HollowGpuNode, pods: Pods) -> None:
    wait_idle(time_sliced)
    pods.create("share-a", time_sliced, {GPU: 1})
    pods.wait_running("share-a", time_sliced)
    pods.create("share-b", time_sliced, {GPU: 1})
    pods.wait_running("share-b", time_sliced)
    (gpu_a,) = visible_devices(time_sliced, pods.namespace, "share-a")
    (gpu_b,) = visible_devices(time_sliced, pods.namespace, "share-b")
    assert gpu_a == gpu_b  # packed: the second replica goes to the GPU already in use
    assert gpu_a.startswith("GPU-")
    (replica_a,) = held(time_sliced, pod="share-a", namespace=pods.namespace)[GPU]
    (replica_b,) = held(time_sliced, pod="share-b", namespace=pods.namespace)[GPU]
    assert replica_a != replica_b
    assert replica_a.split("::")[0] == replica_b.split("::")[0] == gpu_a


# ----------------------------------------------------------------------------------------------- metrics


def test_metrics_label_allocated_gpus_with_their_pod(v100: cluster.HollowGpuNode, pods: Pods) -> None:
    wait_idle(v100)
    pods.create("watched", v100, {GPU: 2})
    pods.wait_running("watched", v100)
    allocated = set(visible_devices(v100, pods.namespace, "watched"))
    owner = {"namespace": pods.namespace, "pod": "watched", "container": "main"}

    def labelled() -> dict[str, set[str]]:
        """GPU UUID -> metric names whose samples carry this pod's labels."""
        out: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(v100.agent.metrics()):
            for sample in family.samples:
                if all(sample.labels.get(k) == v for k, v in owner.items()) and "uuid" in sample.labels:
                    out.setdefault(sample.labels["uuid"], set()).add(sample.name)
        return out

    cluster.wait_until(
        lambda: set(labelled()) == allocated,
        what="the pod's labels on its GPUs' metrics",
        process=v100.agent.process,
        timeout_s=WAIT_S,
    )
    names = labelled()
    for uuid in allocated:
        assert "gpuagent_device_allocation_info" in names[uuid]
        assert len(names[uuid]) > 1  # the GPU's own series carry the owner too, not only the allocation info


# ------------------------------------------------------------------------------------------------ health


def test_lost_gpu_leaves_allocatable_and_comes_back_after_recovery(
    v100: cluster.HollowGpuNode, pods: Pods
) -> None:
    sim = Simulated(V100)
    wait_idle(v100)
    pods.create("bystander", v100, {GPU: 2})
    pods.wait_running("bystander", v100)
    before = held(v100, pod="bystander", namespace=pods.namespace)
    records_before = len(v100.node.records(pod="bystander"))
    index = {g.uuid: g.index for g in sim.inventory.gpus}
    bad = min(set(index.values()) - {index[u] for u in before[GPU]})  # a GPU the pod does not hold
    v100.agent.fault(event="xid", gpu=bad, xid=79)
    wait_status(v100, {GPU: 7}, allocatable_only=True)
    # a lost GPU stays out while it does not answer, well past the quiet period
    time.sleep(2 * QUIET_S + 2)
    assert v100.node.allocatable()[GPU] == "7"
    assert v100.node.capacity()[GPU] == "8"  # still advertised, as Unhealthy
    v100.agent.fault(event="recover", gpu=bad)
    wait_status(v100, {GPU: 8})
    # the pod holding other GPUs kept them, and was never re-created
    assert pods.phase("bystander") == "Running"
    assert held(v100, pod="bystander", namespace=pods.namespace) == before
    assert len(v100.node.records(pod="bystander")) == records_before


# ---------------------------------------------------------------------------------------------- restarts


def _nothing_allocated_twice(
    node: cluster.HollowGpuNode, pods: Pods, first: str, held_first: set[str]
) -> None:
    """The rest of the node goes to a new pod, disjoint from ``first``'s; one more GPU does not fit."""
    pods.create("rest", node, {GPU: 8 - len(held_first)})
    pods.wait_running("rest", node)
    rest = held(node, pod="rest", namespace=pods.namespace)[GPU]
    assert not rest & held_first
    assert set(visible_devices(node, pods.namespace, "rest")) == rest
    assert len(rest | held_first) == 8
    pods.create("one-too-many", node, {GPU: 1})
    cluster.wait_until(lambda: pods.unschedulable("one-too-many"), what="a ninth GPU is unschedulable")
    assert held(node, pod=first, namespace=pods.namespace) == {GPU: held_first}


def test_kubelet_restart_keeps_the_running_pod_s_devices(v100: cluster.HollowGpuNode, pods: Pods) -> None:
    wait_idle(v100)
    pods.create("survivor", v100, {GPU: 2})
    pods.wait_running("survivor", v100)
    before = held(v100, pod="survivor", namespace=pods.namespace)[GPU]
    records_before = len(v100.node.records(pod="survivor"))
    v100.node.restart()
    # the plugin registers again with the new kubelet: its devices are back in the device manager
    cluster.wait_until(
        lambda: advertised_in_kubelet(v100).get(GPU, frozenset()) == Simulated(V100).advertised()[GPU],
        what="nvidia.com/gpu registered again after the kubelet restart",
        process=v100.node.process,
        timeout_s=WAIT_S,
    )
    wait_status(v100, {GPU: 8})
    # the new kubelet lists the pod's devices once it has synced the pod again (admitted from the checkpoint)
    cluster.wait_until(
        lambda: GPU in held(v100, pod="survivor", namespace=pods.namespace),
        what="the survivor's devices in pod-resources after the restart",
        process=v100.node.process,
        timeout_s=WAIT_S,
    )
    assert held(v100, pod="survivor", namespace=pods.namespace)[GPU] == before
    assert pods.phase("survivor") == "Running"
    # the fake runtime forgets its containers, so the kubelet creates the container again: same devices
    cluster.wait_until(
        lambda: len(v100.node.records(pod="survivor")) > records_before,
        what="the survivor's container created again",
        process=v100.node.process,
        timeout_s=WAIT_S,
    )
    for record in v100.node.records(pod="survivor")[records_before:]:
        assert set(record["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")) == before
    _nothing_allocated_twice(v100, pods, "survivor", before)


def test_agent_restart_keeps_the_running_pod_s_devices(v100: cluster.HollowGpuNode, pods: Pods) -> None:
    wait_idle(v100)
    pods.create("steady", v100, {GPU: 2})
    pods.wait_running("steady", v100)
    before = held(v100, pod="steady", namespace=pods.namespace)[GPU]
    records_before = len(v100.node.records(pod="steady"))
    v100.agent.restart()  # waits for /readyz: every plugin registered again
    wait_status(v100, {GPU: 8})
    assert pods.phase("steady") == "Running"
    assert held(v100, pod="steady", namespace=pods.namespace)[GPU] == before
    assert len(v100.node.records(pod="steady")) == records_before  # the container was left alone
    _nothing_allocated_twice(v100, pods, "steady", before)


# ------------------------------------------------------------------------------------------ many nodes


@pytest.mark.slow
def test_eight_trays_side_by_side_each_offer_only_their_own_gpus(
    hollow_gpu_nodes: Callable[..., list[cluster.HollowGpuNode]],
) -> None:
    """Eight hollow nodes on one host (``pytest -m slow tests/e2e/test_hollow_nodes.py``, ~1.5 GiB): each
    kubelet's device manager sees only its own agent (its own device-plugin folder in its own mount
    namespace), so every Node offers exactly its tray's four GPUs and carries its own NVLink clique."""
    specs = [cluster.GpuNodeSpec(f"hn-tray-{t}", f"gb200-nvl72:rack=0,tray={t}") for t in range(8)]
    nodes = hollow_gpu_nodes(*specs)
    assert len({n.node.kubelet_port for n in nodes}) == len(nodes)
    for spec, node in zip(specs, nodes, strict=True):
        wait_status(node, {GPU: 4})
        assert advertised_in_kubelet(node) == Simulated(spec).advertised()
    cluster.wait_until(
        lambda: all("nvidia.com/gpu.clique" in ((n.node.node() or {})["metadata"]["labels"]) for n in nodes),
        what="clique labels on every tray",
        timeout_s=WAIT_S,
    )
    cliques = {(n.node.node() or {})["metadata"]["labels"]["nvidia.com/gpu.clique"] for n in nodes}
    assert len(cliques) == 1  # one rack: one NVLink domain
