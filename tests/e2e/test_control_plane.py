"""The real kube-apiserver (and kube-scheduler) accept, validate and schedule what our code produces."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import localcluster as cluster

pytestmark = pytest.mark.e2e

HYPERNODES = ("topology.volcano.sh", "v1alpha1", "hypernodes")


def hypernode(name: str, *, tier: int, tier_name: str, nodes: list[str]) -> dict[str, Any]:
    """A HyperNode as a plain dict, the shape our topology controller writes."""
    return {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpu-node-agent"}},
        "spec": {
            "tier": tier,
            "tierName": tier_name,
            "members": [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes],
        },
    }


def test_apiserver_serves_the_pinned_release(control_plane: cluster.ControlPlane) -> None:
    status, body = control_plane.apiserver.get("/version")
    assert status == 200
    assert json.loads(body)["gitVersion"] == cluster.versions()["K8S_VERSION"]


def test_volcano_crds_install_and_serve_their_versions(api_client: Any, volcano_crds: list[str]) -> None:
    from kubernetes import client

    wanted = {
        "hypernodes.topology.volcano.sh": ("v1alpha1", "Cluster"),
        "podgroups.scheduling.volcano.sh": ("v1beta1", "Namespaced"),
        "queues.scheduling.volcano.sh": ("v1beta1", "Cluster"),
        "jobs.batch.volcano.sh": ("v1alpha1", "Namespaced"),
    }
    assert set(wanted) <= set(volcano_crds)
    ext = client.ApiextensionsV1Api(api_client)
    for name, (version, scope) in wanted.items():
        crd = ext.read_custom_resource_definition(name)
        assert version in [v.name for v in crd.spec.versions if v.served], name
        assert crd.spec.scope == scope, name


def test_gpunode_crd_installs(api_client: Any, gpunode_crd_path: Path) -> None:
    if not gpunode_crd_path.exists():
        pytest.skip(f"{gpunode_crd_path.relative_to(gpunode_crd_path.parents[2])} does not exist yet")
    docs = cluster.load_yaml_documents([gpunode_crd_path])
    names = cluster.apply_crds(api_client, docs)
    assert "gpunodes.topology.gpuagent.dev" in names
    from kubernetes import client

    crd = client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
        "gpunodes.topology.gpuagent.dev"
    )
    assert crd.spec.scope == "Cluster"
    assert crd.spec.names.kind == "GPUNode"
    assert "v1alpha1" in [v.name for v in crd.spec.versions if v.served]


GPUNODES = ("topology.gpuagent.dev", "v1alpha1", "gpunodes")
SIMULATED_PROFILES = ("dgx-h100", "hgx-h200", "gb200-nvl72", "dgx-a100-mig", "dgx1-v100", "pcie-l40s")


@pytest.mark.parametrize("profile", SIMULATED_PROFILES)
def test_gpunode_of_a_simulated_node_is_stored_whole(
    api_client: Any, gpunode_crd_path: Path, profile: str
) -> None:
    """What the agent publishes passes the real schema, and pruning drops nothing of it."""
    if not gpunode_crd_path.exists():
        pytest.skip("daemonset/crds/gpunode.yaml does not exist yet")
    from kubernetes import client

    from tests.deviceplugin.helpers import inventory
    from topology.gpunode import gpunode_object

    cluster.apply_crds(api_client, cluster.load_yaml_documents([gpunode_crd_path]))
    api = client.CustomObjectsApi(api_client)
    name = f"e2e-{profile}"
    obj = gpunode_object(inventory(profile), node_name=name)
    api.create_cluster_custom_object(*GPUNODES, {k: v for k, v in obj.items() if k != "status"})
    try:
        status_patch = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": {"name": name}}
        status_patch["status"] = obj["status"]
        api.patch_cluster_custom_object_status(
            *GPUNODES, name, status_patch, field_manager=cluster.FIELD_MANAGER, force=True,
            _content_type="application/apply-patch+yaml",
        )  # fmt: skip
        stored = api.get_cluster_custom_object(*GPUNODES, name)
        assert stored["spec"] == obj["spec"]
        assert stored["status"] == obj["status"]
    finally:
        api.delete_cluster_custom_object(*GPUNODES, name)


def test_hypernode_dict_passes_real_validation(
    api_client: Any, volcano_crds: list[str], e2e_test_label: str
) -> None:
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    name = f"nvl-{e2e_test_label}"[:63]
    created = api.create_cluster_custom_object(
        *HYPERNODES, hypernode(name, tier=1, tier_name="nvlink", nodes=["a", "b"])
    )
    try:
        assert created["spec"]["tier"] == 1
        assert [m["selector"]["exactMatch"]["name"] for m in created["spec"]["members"]] == ["a", "b"]
    finally:
        api.delete_cluster_custom_object(*HYPERNODES, name)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        pytest.param(
            lambda hn: hn["spec"]["members"][0]["selector"].update({"regexMatch": {"pattern": "a.*"}}),
            "Only one of ExactMatch, RegexMatch, or LabelMatch",
            id="two-selectors",
        ),
        pytest.param(lambda hn: hn["spec"].update({"tier": -1}), "spec.tier", id="negative-tier"),
        pytest.param(lambda hn: hn["spec"].update({"members": []}), "spec.members", id="no-members"),
        pytest.param(
            lambda hn: hn["spec"]["members"][0].update({"type": "Rack"}),
            "spec.members[0].type",
            id="unknown-type",
        ),
    ],
)
def test_invalid_hypernode_is_rejected_by_the_real_schema(
    api_client: Any, volcano_crds: list[str], mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    body = hypernode("invalid-hn", tier=1, tier_name="nvlink", nodes=["a"])
    mutate(body)
    with pytest.raises(ApiException) as info:
        client.CustomObjectsApi(api_client).create_cluster_custom_object(*HYPERNODES, body)
    assert info.value.status == 422
    assert message in info.value.body


def test_server_side_apply_twice_changes_nothing(
    api_client: Any, volcano_crds: list[str], e2e_test_label: str
) -> None:
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    name = f"leaf-{e2e_test_label}"[:63]
    body = hypernode(name, tier=2, tier_name="leaf", nodes=["x", "y"])

    def apply() -> dict[str, Any]:
        # The client maps only HTTP 200 to a body; the first apply creates (201) and returns None.
        api.patch_cluster_custom_object(
            *HYPERNODES, name, body, field_manager=cluster.FIELD_MANAGER, force=True,
            _content_type="application/apply-patch+yaml",
        )  # fmt: skip
        current: dict[str, Any] = api.get_cluster_custom_object(*HYPERNODES, name)
        return current

    try:
        first = apply()
        second = apply()
        assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        managers = {m["manager"] for m in second["metadata"]["managedFields"]}
        assert managers == {cluster.FIELD_MANAGER}
        body["spec"]["members"].append({"type": "Node", "selector": {"exactMatch": {"name": "z"}}})
        third = apply()
        assert third["metadata"]["resourceVersion"] != second["metadata"]["resourceVersion"]
        assert len(third["spec"]["members"]) == 3
    finally:
        api.delete_cluster_custom_object(*HYPERNODES, name)


def test_fake_gpu_nodes_are_ready_with_gpus(api_client: Any, gpu_nodes: Callable[..., list[str]]) -> None:
    from kubernetes import client

    names = gpu_nodes(
        ["cp-node-0", "cp-node-1"], gpus=4, labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    )
    core = client.CoreV1Api(api_client)
    for name in names:
        node = core.read_node(name)
        assert node.status.allocatable["nvidia.com/gpu"] == "4"
        assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert [(c.type, c.status) for c in node.status.conditions] == [("Ready", "True")]


def gpu_pod(name: str, *, gpus: int, scheduler: str, node_selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": node_selector,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/none:0",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def node_of(api_client: Any, namespace: str, pod: str) -> str | None:
    from kubernetes import client

    return client.CoreV1Api(api_client).read_namespaced_pod(pod, namespace).spec.node_name  # type: ignore[no-any-return]


@pytest.mark.parametrize("kube_scheduler", [{"scheduler_name": "e2e-second-scheduler"}], indirect=True)
def test_kube_scheduler_binds_by_gpu_capacity(
    api_client: Any,
    kube_scheduler: cluster.Scheduler,
    gpu_nodes: Callable[..., list[str]],
    namespace: str,
    e2e_test_label: str,
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    gpu_nodes(["ks-node-0", "ks-node-1"], gpus=4)
    sel = {"gpuagent.dev/e2e-test": e2e_test_label}
    core.create_namespaced_pod(
        namespace, gpu_pod("fits", gpus=4, scheduler=kube_scheduler.name, node_selector=sel)
    )
    core.create_namespaced_pod(
        namespace, gpu_pod("too-big", gpus=5, scheduler=kube_scheduler.name, node_selector=sel)
    )

    cluster.wait_until(lambda: node_of(api_client, namespace, "fits") is not None, what="pod 'fits' bound")
    assert node_of(api_client, namespace, "fits") in {"ks-node-0", "ks-node-1"}

    def too_big_unschedulable() -> bool:
        conds = core.read_namespaced_pod("too-big", namespace).status.conditions or []
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conds)

    cluster.wait_until(too_big_unschedulable, what="pod 'too-big' reported Unschedulable")
    pod = core.read_namespaced_pod("too-big", namespace)
    assert pod.spec.node_name is None
    assert "nvidia.com/gpu" in next(c.message for c in pod.status.conditions if c.type == "PodScheduled")


class FilterExtender:
    """An in-test HTTP extender: keeps only nodes named in ``allowed``, records what it was asked."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed
        self.calls: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                args = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.calls.append({"path": self.path, "args": args})
                names = args.get("NodeNames") or []
                body = {
                    "NodeNames": [n for n in names if n in outer.allowed],
                    "FailedNodes": {
                        n: "not allowed by the e2e extender" for n in names if n not in outer.allowed
                    },
                    "Error": "",
                }
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/scheduler"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FilterExtender:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def filter_extender() -> Iterator[FilterExtender]:
    with FilterExtender({"ext-node-1"}) as ext:
        yield ext


@pytest.fixture
def scheduler_with_extender(
    kube_scheduler_factory: Callable[..., cluster.Scheduler], filter_extender: FilterExtender
) -> tuple[cluster.Scheduler, FilterExtender, list[dict[str, Any]]]:
    extenders = [{"urlPrefix": filter_extender.url, "filterVerb": "filter", "nodeCacheCapable": True,
                  "managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]}]  # fmt: skip
    sched = kube_scheduler_factory(scheduler_name="gpu-topology-scheduler", extenders=extenders)
    return sched, filter_extender, extenders


def test_kube_scheduler_calls_the_configured_extender(
    api_client: Any,
    scheduler_with_extender: tuple[cluster.Scheduler, FilterExtender, list[dict[str, Any]]],
    gpu_nodes: Callable[..., list[str]],
    namespace: str,
    e2e_test_label: str,
) -> None:
    from kubernetes import client

    sched, filter_extender, extenders = scheduler_with_extender
    assert yaml.safe_load(sched.config_path.read_text())["extenders"] == extenders

    gpu_nodes(["ext-node-0", "ext-node-1"], gpus=4)
    sel = {"gpuagent.dev/e2e-test": e2e_test_label}
    client.CoreV1Api(api_client).create_namespaced_pod(
        namespace, gpu_pod("via-extender", gpus=2, scheduler=sched.name, node_selector=sel)
    )
    cluster.wait_until(lambda: node_of(api_client, namespace, "via-extender") is not None, what="pod bound")
    assert node_of(api_client, namespace, "via-extender") == "ext-node-1"
    assert filter_extender.calls
    assert filter_extender.calls[0]["path"] == "/scheduler/filter"
    assert sorted(filter_extender.calls[0]["args"]["NodeNames"]) == ["ext-node-0", "ext-node-1"]
