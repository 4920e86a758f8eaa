"""The manifests meet the real API server: every object passes server-side dry-run, and the admission
policies let an agent (a real pod-bound service-account token, so the node name is bound into it) write
only its own node's GPUNode, only the labels it publishes on its own Node (no taints, no
``unschedulable``, no labels of other owners) and Events only about its own Node, and let the scheduler
pod's service account (the extender's) change only ``gpuagent.dev/reserved-for`` on Nodes and
``gpuagent.dev/gang-planned`` on pods of ``gpu-topology-scheduler``."""

from __future__ import annotations

import base64
import contextlib
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import dynamic
from kubernetes.client.rest import ApiException

from agent import localcluster as cluster
from agent.commands.extender import KubeCluster
from agent.simnode import open_simulated_node
from scheduler_plugin.extender import GANG_PLANNED, SCHEDULER_NAME
from scheduler_plugin.queue import RESERVED_FOR
from topology.gpunode import gpunode_object
from topology.kube import EventRecorder, Kube, KubeError, ObjectRef
from topology.labels import node_labels

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "gpu-system"
MANAGER = "gpu-node-agent"


def kustomize_objects() -> list[dict[str, Any]]:
    done = subprocess.run(
        ["bash", str(REPO / "tests" / "e2e" / "deploytools" / "build.sh")],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tools = Path(done.stdout.strip().splitlines()[-1])
    out = subprocess.run(
        [str(tools / "kustomize"), "build", str(REPO / "daemonset" / "base")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def apply(dyn: dynamic.DynamicClient, obj: dict[str, Any], *, dry_run: bool = False) -> Any:
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    kwargs: dict[str, Any] = {"field_manager": MANAGER, "force_conflicts": True}
    if dry_run:
        kwargs["dry_run"] = "All"
    return dyn.server_side_apply(resource, body=obj, namespace=obj["metadata"].get("namespace"), **kwargs)


def delete(dyn: dynamic.DynamicClient, obj: dict[str, Any]) -> None:
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    try:
        resource.delete(name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace"))
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    return kustomize_objects()


@pytest.fixture(scope="module")
def installed(api_client: Any, manifests: list[dict[str, Any]]) -> Iterator[dynamic.DynamicClient]:
    """The namespace, our CRD, the agent's RBAC and the admission policy, really applied."""
    dyn = dynamic.DynamicClient(api_client)
    first = ("Namespace", "CustomResourceDefinition")
    agent_side = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    policy = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    objs = [o for o in manifests if o["kind"] in first]
    objs += [o for o in manifests if o["kind"] in agent_side and o["metadata"]["name"] == MANAGER]
    objs += [o for o in manifests if o["kind"] in policy]
    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    cluster.apply_crds(api_client, crds)
    for obj in objs:
        if obj["kind"] != "CustomResourceDefinition":
            apply(dyn, obj)
    try:
        yield dyn
    finally:
        for obj in reversed(objs):
            if obj["kind"] not in ("Namespace", "CustomResourceDefinition"):
                delete(dyn, obj)


def test_every_manifest_passes_server_side_dry_run(
    installed: dynamic.DynamicClient, manifests: list[dict[str, Any]]
) -> None:
    kinds = set()
    for obj in manifests:
        reply = apply(installed, obj, dry_run=True)
        assert reply.metadata.name == obj["metadata"]["name"]
        kinds.add(obj["kind"])
    assert {
        "DaemonSet",
        "Deployment",
        "ValidatingAdmissionPolicy",
        "CustomResourceDefinition",
    } <= kinds
    assert "Service" not in kinds  # the extender is a loopback sidecar of kube-scheduler: nothing exposes it


def simulated_gpunode(node_name: str) -> dict[str, Any]:
    with open_simulated_node(f"gb200-nvl72:rack=0,tray=1,hostname={node_name}") as node:
        node.nvml.init()
        inventory = node.discover()
    return gpunode_object(inventory, node_name=node_name)


def published_labels(spec: str, node_name: str, **settings: Any) -> dict[str, str]:
    """The labels the agent's publisher writes for a simulated machine."""
    with open_simulated_node(spec) as node:
        node.nvml.init()
        inventory = node.discover()
    return node_labels(inventory, node_name=node_name, **settings)


def agent_client(api_client: Any, *, pod: str, uid: str) -> k8s.ApiClient:
    """An ApiClient holding the agent ServiceAccount's token bound to ``pod`` (so it carries the node)."""
    core = k8s.CoreV1Api(api_client)
    request = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(
            audiences=["https://kubernetes.default.svc"],
            expiration_seconds=600,
            bound_object_ref=k8s.V1BoundObjectReference(kind="Pod", api_version="v1", name=pod, uid=uid),
        )
    )
    token = core.create_namespaced_service_account_token(MANAGER, NAMESPACE, request).status.token
    claims = yaml.safe_load(base64.urlsafe_b64decode(token.split(".")[1] + "==").decode())
    assert claims["kubernetes.io"]["node"]["name"], claims
    cfg = k8s.Configuration()
    cfg.host = api_client.configuration.host
    cfg.ssl_ca_cert = api_client.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return k8s.ApiClient(cfg)


@contextlib.contextmanager
def agent_on(api_client: Any, node: str, test_label: str) -> Iterator[k8s.ApiClient]:
    """A pod of the agent's ServiceAccount bound to ``node`` and an ApiClient with its token."""
    core = k8s.CoreV1Api(api_client)
    pod = core.create_namespaced_pod(
        NAMESPACE,
        k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=f"agent-{node}", labels={"gpuagent.dev/e2e-test": test_label}),
            spec=k8s.V1PodSpec(
                node_name=node,
                service_account_name=MANAGER,
                containers=[k8s.V1Container(name="agent", image="gpu-node-agent:0.1.0")],
            ),
        ),
    )
    agent = agent_client(api_client, pod=pod.metadata.name, uid=pod.metadata.uid)
    try:
        yield agent
    finally:
        agent.close()
        core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)


def status_of(call: Callable[[], Any]) -> tuple[int, str]:
    try:
        call()
    except ApiException as exc:
        return exc.status, str(exc.body)
    return 200, ""


def test_admission_policy_pins_an_agent_to_its_own_node(
    installed: dynamic.DynamicClient,
    api_client: Any,
    gpu_nodes: Callable[..., list[str]],
    e2e_test_label: str,
) -> None:
    mine, other = gpu_nodes(["adm-a", "adm-b"], gpus=4)
    core = k8s.CoreV1Api(api_client)
    pod = core.create_namespaced_pod(
        NAMESPACE,
        k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=f"agent-{mine}", labels={"gpuagent.dev/e2e-test": e2e_test_label}),
            spec=k8s.V1PodSpec(
                node_name=mine,
                service_account_name=MANAGER,
                containers=[k8s.V1Container(name="agent", image="gpu-node-agent:0.1.0")],
            ),
        ),
    )
    agent = agent_client(api_client, pod=pod.metadata.name, uid=pod.metadata.uid)
    agent_dyn = dynamic.DynamicClient(agent)
    try:
        own = simulated_gpunode(mine)
        foreign = simulated_gpunode(other)

        def denied() -> bool:
            code, _ = status_of(lambda: apply(agent_dyn, foreign, dry_run=True))
            return code == 403

        # the policy takes effect once the API server has compiled it
        cluster.wait_until(denied, what="the admission policy to deny a foreign GPUNode", timeout_s=60)
        code, body = status_of(lambda: apply(agent_dyn, foreign))
        assert code == 403
        assert f"node {mine} may not modify {other}" in body
        assert status_of(lambda: apply(agent_dyn, own))[0] == 200

        label = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": mine, "labels": {"gpuagent.dev/nvlink-domain": "nvl-1"}},
        }
        assert status_of(lambda: apply(agent_dyn, label))[0] == 200
        foreign_label = {
            **label,
            "metadata": {"name": other, "labels": {"gpuagent.dev/nvlink-domain": "nvl-1"}},
        }
        code, body = status_of(lambda: apply(agent_dyn, foreign_label))
        assert code == 403
        assert "may not modify" in body
        # the admin (no node claim, not the agent's account) is not restricted by the policy
        assert status_of(lambda: apply(installed, foreign))[0] == 200
    finally:
        agent.close()
        core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)
        for name in (mine, other):
            delete(
                installed,
                {
                    "apiVersion": "topology.gpuagent.dev/v1alpha1",
                    "kind": "GPUNode",
                    "metadata": {"name": name},
                },
            )


def node_apply(name: str, *, labels: Mapping[str, str] | None = None, **metadata: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **metadata}
    if labels is not None:
        meta["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta}


def core_event(about: Mapping[str, str], *, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "e2e.", "namespace": namespace},
        "involvedObject": dict(about),
        "reason": "E2E",
        "message": "admission policy test",
        "type": "Normal",
        "source": {"component": MANAGER},
    }


def test_admission_policy_limits_an_agent_to_its_own_labels_and_events(
    installed: dynamic.DynamicClient,
    api_client: Any,
    gpu_nodes: Callable[..., list[str]],
    e2e_test_label: str,
) -> None:
    mine, other = gpu_nodes(["adm-c", "adm-d"], gpus=4)
    with agent_on(api_client, mine, e2e_test_label) as agent:
        agent_dyn = dynamic.DynamicClient(agent)
        core = k8s.CoreV1Api(agent)
        events_v1 = agent_dyn.resources.get(api_version="events.k8s.io/v1", kind="Event")

        def ssa(obj: dict[str, Any]) -> tuple[int, str]:
            return status_of(lambda: apply(agent_dyn, obj))

        def patch(name: str, body: dict[str, Any]) -> tuple[int, str]:
            return status_of(lambda: core.patch_node(name, body))

        def taint_denied() -> bool:
            return patch(mine, {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}})[0] == 403

        # the policy takes effect once the API server has compiled it
        cluster.wait_until(taint_denied, what="the admission policy to deny a taint", timeout_s=60)

        def denied(result: tuple[int, str], *needles: str) -> None:
            code, body = result
            assert code == 403, body
            for needle in needles:
                assert needle in body, body

        # --- its own Node: only the labels it publishes
        denied(
            patch(mine, {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}),
            f"node {mine} may not change the taints of its Node",
        )
        denied(patch(mine, {"spec": {"unschedulable": True}}), "may not change spec.unschedulable")
        denied(patch(mine, {"spec": {"podCIDR": "10.9.0.0/24"}}), "may not change the spec of its Node")
        denied(
            ssa(node_apply(mine, labels={"fabric.topograph.run/x": "leaf-9"})),
            "may change only the labels it publishes, not fabric.topograph.run/x",
        )
        for key in (
            "node-role.kubernetes.io/control-plane",
            "nvidia.com/gpu.deploy.driver",
            "gpuagent.dev/x",
        ):
            denied(patch(mine, {"metadata": {"labels": {key: "true"}}}), f"not {key}")
        denied(
            patch(mine, {"metadata": {"labels": {"kubernetes.io/hostname": None}}}),
            "not kubernetes.io/hostname",
        )
        denied(
            patch(mine, {"metadata": {"labels": {"gpuagent.dev/e2e-test": "moved"}}}),
            "not gpuagent.dev/e2e-test",
        )
        denied(
            patch(mine, {"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "0"}}}),
            "may not change the annotations node.alpha.kubernetes.io/ttl",
        )
        denied(
            patch(mine, {"metadata": {"finalizers": ["example.com/hold"]}}), "ownerReferences or finalizers"
        )
        owner = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": other,
            "uid": "6f2b1e33-0000-4000-8000-000000000001",
        }
        denied(patch(mine, {"metadata": {"ownerReferences": [owner]}}), "ownerReferences or finalizers")
        # --- other Nodes, and no new Nodes
        denied(
            ssa(node_apply(other, labels={"gpuagent.dev/nvlink-domain": "x"})),
            f"node {mine} may not modify {other}",
        )
        denied(patch(other, {"spec": {"unschedulable": True}}), "may not modify")
        denied(ssa(node_apply(f"{mine}-twin", labels={})), "forbidden")  # RBAC first; the policy too
        # --- what the publisher writes is allowed: every label of a MIG machine and of an NVL72 tray,
        # then (server-side apply drops what the manager stops sending) the switch between them
        mig = published_labels(
            "dgx-a100-mig", mine, mig_strategy="mixed", sharing_strategy="time-slicing", replicas=2
        )
        tray = published_labels(f"gb200-nvl72:rack=0,tray=2,hostname={mine}", mine)
        for labels in (mig, tray, {}):
            assert ssa(node_apply(mine, labels=labels)) == (200, ""), labels
        assert patch(mine, {"metadata": {"labels": {"gpuagent.dev/nvlink-domain": "nvl-x"}}})[0] == 200
        node = k8s.CoreV1Api(api_client).read_node(mine)
        assert node.metadata.labels["gpuagent.dev/nvlink-domain"] == "nvl-x"
        assert not node.spec.taints
        assert not node.spec.unschedulable

        # --- Events: only about its own Node (or its GPUNode), in namespace default
        own = {"apiVersion": "v1", "kind": "Node", "name": mine}
        assert status_of(lambda: core.create_namespaced_event("default", core_event(own)))[0] == 200
        denied(
            status_of(lambda: core.create_namespaced_event("default", core_event({**own, "name": other}))),
            f"may record Events only about its own Node or GPUNode, not Node {other}",
        )
        related = {**core_event(own), "related": {**own, "name": other}}
        denied(
            status_of(lambda: core.create_namespaced_event("default", related)), "Events only about its own"
        )
        pod_ref = {"apiVersion": "v1", "kind": "Pod", "name": "victim", "namespace": "kube-system"}
        denied(
            status_of(
                lambda: core.create_namespaced_event(
                    "kube-system", core_event(pod_ref, namespace="kube-system")
                )
            ),
            "not Pod victim",
        )
        # an Event about a cluster-scoped object lives in namespace default: the API server's own validation
        code, body = status_of(
            lambda: core.create_namespaced_event(NAMESPACE, core_event(own, namespace=NAMESPACE))
        )
        assert code == 422, body
        # events.k8s.io/v1 is the same resource: checked the same way
        new_api = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"generateName": "e2e-", "namespace": "default"},
            "eventTime": "2025-01-01T00:00:00.000000Z",
            "reportingController": "gpuagent.dev/agent",
            "reportingInstance": mine,
            "action": "Test",
            "reason": "E2E",
            "type": "Normal",
        }
        created = status_of(lambda: events_v1.create(body={**new_api, "regarding": own}, namespace="default"))
        assert created == (200, ""), created
        denied(
            status_of(
                lambda: events_v1.create(
                    body={**new_api, "regarding": {**own, "name": other}}, namespace="default"
                )
            ),
            f"not Node {other}",
        )
        # the product's one Event writer, with the agent's credentials
        recorder = EventRecorder(Kube(agent), component=MANAGER)
        recorder.record(ObjectRef("Node", mine), reason="E2E", message="own node")
        with pytest.raises(KubeError) as refused:
            recorder.record(ObjectRef("Node", other), reason="E2E", message="another node")
        assert refused.value.status == 403
    # the admin is not restricted by the policies
    assert (
        status_of(lambda: k8s.CoreV1Api(api_client).patch_node(mine, {"spec": {"unschedulable": True}}))[0]
        == 200
    )


EXTENDER_SA = "gpu-topology-scheduler"  # the scheduler pod's service account: kube-scheduler and the extender


@pytest.fixture(scope="module")
def extender_installed(
    installed: dynamic.DynamicClient, manifests: list[dict[str, Any]]
) -> Iterator[dynamic.DynamicClient]:
    """The scheduler pod's service account with the extender's role and kube-scheduler's (the policies
    are applied by ``installed``)."""
    names = {"gpu-topology-extender", EXTENDER_SA, "gpu-topology-scheduler-as-kube-scheduler"}
    kinds = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    objs = [o for o in manifests if o["kind"] in kinds and o["metadata"]["name"] in names]
    assert {o["kind"] for o in objs} == set(kinds)
    for obj in objs:
        apply(installed, obj)
    try:
        yield installed
    finally:
        for obj in reversed(objs):
            delete(installed, obj)


def extender_client(api_client: Any) -> k8s.ApiClient:
    """An ApiClient holding a token of the scheduler pod's service account."""
    request = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(audiences=["https://kubernetes.default.svc"], expiration_seconds=600)
    )
    core = k8s.CoreV1Api(api_client)
    token = core.create_namespaced_service_account_token(EXTENDER_SA, NAMESPACE, request).status.token
    cfg = k8s.Configuration()
    cfg.host = api_client.configuration.host
    cfg.ssl_ca_cert = api_client.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return k8s.ApiClient(cfg)


def unscheduled_pod(name: str, *, scheduler: str | None, label: str) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, labels={"gpuagent.dev/e2e-test": label}),
        spec=k8s.V1PodSpec(
            scheduler_name=scheduler,
            containers=[k8s.V1Container(name="main", image="registry.example/train:1")],
        ),
    )


def test_admission_policy_limits_the_extender_to_its_two_annotations(
    extender_installed: dynamic.DynamicClient,
    api_client: Any,
    gpu_nodes: Callable[..., list[str]],
    namespace: str,
    e2e_test_label: str,
) -> None:
    """Issue 26 item 11: the extender's role may patch every Node and Pod; with a real token of its
    service account the API server lets through only gpuagent.dev/reserved-for on Nodes and
    gpuagent.dev/gang-planned on pods of gpu-topology-scheduler, written by the product's own adapter."""
    (node,) = gpu_nodes(["ext-adm-a"], gpus=4)
    admin = k8s.CoreV1Api(api_client)
    ours = admin.create_namespaced_pod(
        namespace, unscheduled_pod("ours", scheduler=SCHEDULER_NAME, label=e2e_test_label)
    )
    theirs = admin.create_namespaced_pod(
        namespace, unscheduled_pod("theirs", scheduler=None, label=e2e_test_label)
    )
    client = extender_client(api_client)
    try:
        core = k8s.CoreV1Api(client)
        ext_dyn = dynamic.DynamicClient(client)
        kube = Kube(client)
        adapter = KubeCluster(kube)

        def patch_node(body: dict[str, Any]) -> tuple[int, str]:
            return status_of(lambda: core.patch_node(node, body))

        def patch_pod(name: str, body: dict[str, Any]) -> tuple[int, str]:
            return status_of(lambda: core.patch_namespaced_pod(name, namespace, body))

        def denied(result: tuple[int, str], *needles: str) -> None:
            code, body = result
            assert code == 403, body
            for needle in needles:
                assert needle in body, body

        def label_denied() -> bool:
            return patch_node({"metadata": {"labels": {"gpuagent.dev/nvlink-domain": "x"}}})[0] == 403

        # the policy takes effect once the API server has compiled it
        cluster.wait_until(
            label_denied, what="the extender's admission policy to deny a Node label", timeout_s=60
        )

        # --- Nodes: the reservation annotation, through the product's adapter; set, changed, removed
        adapter.annotate_node(node, f"{namespace}/gang-a")
        assert admin.read_node(node).metadata.annotations[RESERVED_FOR] == f"{namespace}/gang-a"
        adapter.annotate_node(node, f"{namespace}/gang-b")
        adapter.annotate_node(node, None)
        assert RESERVED_FOR not in (admin.read_node(node).metadata.annotations or {})
        who = f"the {EXTENDER_SA} service account"
        denied(
            patch_node({"metadata": {"labels": {"gpuagent.dev/nvlink-domain": "x"}}}),
            f"{who} may not change the labels of Node {node}",
        )
        denied(
            patch_node({"metadata": {"labels": {"gpuagent.dev/e2e-test": None}}}), "may not change the labels"
        )
        denied(
            patch_node({"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}),
            f"may not change the spec of Node {node}",
        )
        denied(patch_node({"spec": {"unschedulable": True}}), "may not change the spec")
        denied(
            patch_node({"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "0"}}}),
            f"may change only the annotation {RESERVED_FOR} of Node {node}, not node.alpha.kubernetes.io/ttl",
        )
        denied(  # the allowed annotation does not carry another change with it
            patch_node({"metadata": {"annotations": {RESERVED_FOR: "x/y"}, "labels": {"a.example/b": "c"}}}),
            "may not change the labels",
        )
        denied(
            patch_node({"metadata": {"finalizers": ["example.com/hold"]}}), "ownerReferences or finalizers"
        )
        # a server-side apply patch that would create a Node: RBAC asks for create; the policy refuses too
        code, body = status_of(lambda: apply(ext_dyn, node_apply(f"{node}-twin", labels={})))
        assert code == 403, body
        node_after = admin.read_node(node)
        assert not node_after.spec.taints
        assert not node_after.spec.unschedulable
        assert node_after.metadata.labels["gpuagent.dev/e2e-test"] == e2e_test_label

        # --- Pods: gang-planned on pods of this scheduler only, through the product's adapter
        planned = "2 pod(s) on 1 node(s) at 2026-01-01T00:00:00Z"
        adapter.annotate_pod(namespace, "ours", ours.metadata.uid, planned)
        assert admin.read_namespaced_pod("ours", namespace).metadata.annotations[GANG_PLANNED] == planned
        with pytest.raises(KubeError) as refused:
            adapter.annotate_pod(namespace, "theirs", theirs.metadata.uid, planned)
        assert refused.value.status == 403
        assert (
            f"may annotate only pods of scheduler {SCHEDULER_NAME}, not Pod {namespace}/theirs "
            "(scheduler default-scheduler)" in str(refused.value)
        )
        denied(patch_pod("theirs", {"metadata": {"labels": {"a.example/b": "c"}}}), "only pods of scheduler")
        denied(
            patch_pod("ours", {"metadata": {"labels": {"a.example/b": "c"}}}),
            f"may not change the labels of Pod {namespace}/ours",
        )
        denied(
            patch_pod(
                "ours", {"spec": {"containers": [{"name": "main", "image": "registry.example/evil:1"}]}}
            ),
            f"may not change the spec of Pod {namespace}/ours",
        )
        denied(patch_pod("ours", {"spec": {"activeDeadlineSeconds": 5}}), "may not change the spec")
        denied(
            patch_pod("ours", {"metadata": {"annotations": {"gpuagent.dev/time-limit": "1"}}}),
            f"may change only the annotation {GANG_PLANNED} of Pod {namespace}/ours, not "
            "gpuagent.dev/time-limit",
        )
        denied(
            patch_pod("ours", {"metadata": {"finalizers": ["example.com/hold"]}}),
            "ownerReferences or finalizers",
        )
        twin = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "twin", "namespace": namespace},
            "spec": {
                "schedulerName": SCHEDULER_NAME,
                "containers": [{"name": "main", "image": "registry.example/evil:1"}],
            },
        }
        # a server-side apply patch that would create: RBAC asks for create first; the policy refuses too
        code, body = status_of(lambda: apply(ext_dyn, twin))
        assert code == 403, body
        pod_after = admin.read_namespaced_pod("ours", namespace)
        assert pod_after.spec.containers[0].image == "registry.example/train:1"
        assert pod_after.spec.active_deadline_seconds is None

        # --- what kube-scheduler and the extender write besides stays open: pod status, binding, eviction
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "e2e"}
        assert (
            status_of(
                lambda: core.patch_namespaced_pod_status(
                    "ours", namespace, {"status": {"conditions": [condition]}}
                )
            )[0]
            == 200
        )
        kube.bind(namespace, "ours", ours.metadata.uid, node)
        assert admin.read_namespaced_pod("ours", namespace).spec.node_name == node
        assert adapter.evict(namespace, "ours", str(ours.metadata.uid)) is None
    finally:
        client.close()
    # the admin is not restricted by the policy
    assert status_of(lambda: admin.patch_node(node, {"metadata": {"labels": {"a.example/b": "c"}}}))[0] == 200
