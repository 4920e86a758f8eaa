"""The manifests meet the real API server: every object passes server-side dry-run, and the admission
policy lets an agent write only its own node's GPUNode and labels (token-bound node name)."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import dynamic
from kubernetes.client.rest import ApiException

from agent import localcluster as cluster
from agent.simnode import open_simulated_node
from topology.gpunode import gpunode_object

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
        "Service",
        "ValidatingAdmissionPolicy",
        "CustomResourceDefinition",
    } <= kinds


def simulated_gpunode(node_name: str) -> dict[str, Any]:
    with open_simulated_node(f"gb200-nvl72:rack=0,tray=1,hostname={node_name}") as node:
        node.nvml.init()
        inventory = node.discover()
    return gpunode_object(inventory, node_name=node_name)


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
            "metadata": {"name": mine, "labels": {"gpuagent.dev/x": "1"}},
        }
        assert status_of(lambda: apply(agent_dyn, label))[0] == 200
        foreign_label = {**label, "metadata": {"name": other, "labels": {"gpuagent.dev/x": "1"}}}
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
