"""The DRA driver on a hollow node whose kubelet runs the real DRA manager, with kube-scheduler's DRA plugin
(1.37) allocating: the plugin registers through the plugin watcher, the pool appears, a pod with a claim
runs with its CDI device, two gangs of the NVLink domain get different IMEX channels, an XID taints the
device, the kubelet reports it Unhealthy in the pod's ``allocatedResourcesStatus`` (our health stream,
``ResourceHealthStatus`` on in 1.37) and a new claim avoids it, and an agent restart and a kubelet
restart keep the prepared claims.

Needs root (hollow nodes) and a hollow node built with the DRA manager
(``counterparts/hollownode/containermanager.go``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import localcluster as cluster
from topology.kube import RESOURCESLICES, Kube, KubeError, resourceclaims

pytestmark = pytest.mark.e2e

DRIVER = "gpu.gpuagent.dev"
REPO = Path(__file__).resolve().parents[2]
DEVICECLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


def _pods(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


@pytest.fixture
def dra_node(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    api_client: Any,
) -> Iterator[tuple[cluster.HollowNode, cluster.NodeAgent]]:
    if os.geteuid() != 0:
        pytest.skip("hollow nodes need root")
    with tempfile.TemporaryDirectory(prefix="drah", dir="/tmp") as tmp:  # unix socket paths stay short
        yield from _dra_node(counterparts, control_plane, api_client, Path(tmp))


def _dra_node(
    counterparts: cluster.Counterparts, control_plane: cluster.ControlPlane, api_client: Any, tmp_path: Path
) -> Iterator[tuple[cluster.HollowNode, cluster.NodeAgent]]:
    kube = Kube(api_client)
    for doc in yaml.safe_load_all((REPO / "daemonset" / "dra" / "deviceclass.yaml").read_text()):
        kube.apply(f"{DEVICECLASSES}/{doc['metadata']['name']}", doc)
    node = cluster.start_hollow_node(
        counterparts, tmp_path, apiserver=control_plane.apiserver, name="dra-hollow-r5t3"
    )
    agent = cluster.new_node_agent(
        node,
        simulate="gb200-nvl72:rack=5,tray=3",
        kubeconfig=control_plane.apiserver.kubeconfig,
        config={
            "cdi": {"specDir": str(node.workdir / "cdi")},
            "dra": {
                "enabled": True,
                "pluginDir": str(node.root_dir / "plugins"),
                "registryDir": str(node.root_dir / "plugins_registry"),
                "imexChannels": True,
                "imexNamespace": "default",
            },
        },
        faults=[],
    )
    try:
        agent.start()  # /readyz: the kubelet's plugin watcher registered the DRA driver
        yield node, agent
    finally:
        agent.stop()
        node.stop()
        release_claims(kube, {node.name})
        for s in kube.list(RESOURCESLICES, field_selector=f"spec.nodeName={node.name}")[0]:
            kube.delete(f"{RESOURCESLICES}/{s['metadata']['name']}")
        cluster.delete_nodes(api_client, [node.name])


def release_claims(kube: Kube, pools: set[str]) -> None:
    """Delete every claim allocated from ``pools`` (finalizers dropped first). The e2e control plane runs
    no ResourceClaim controller, garbage collector or namespace controller: without this, a test's claims
    stay allocated after its pods and namespace go, and kube-scheduler counts their devices as taken in
    the next test's pool of the same node name (the same device names): "cannot allocate all claims"."""
    items, _ = kube.list("/apis/resource.k8s.io/v1/resourceclaims")
    for claim in items:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        if not any(r.get("pool") in pools for r in (allocation.get("devices") or {}).get("results") or []):
            continue
        meta = claim["metadata"]
        path = f"{resourceclaims(meta['namespace'])}/{meta['name']}"
        if meta.get("finalizers"):
            kube.replace(path, {**claim, "metadata": {**meta, "finalizers": []}})
        kube.delete(path)


def _slice_devices(kube: Kube, node: str) -> dict[str, dict[str, Any]]:
    items, _ = kube.list(RESOURCESLICES, field_selector=f"spec.nodeName={node},spec.driver={DRIVER}")
    return {d["name"]: d for s in items for d in s["spec"].get("devices", [])}


def _claim_and_pod(
    kube: Kube,
    namespace: str,
    name: str,
    *,
    node: str,
    device_class: str,
    labels: dict[str, str] | None = None,
) -> None:
    kube.create(
        resourceclaims(namespace),
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": device_class}}]}},
        },
    )
    kube.create(
        _pods(namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "resourceClaims": [{"name": "c", "resourceClaimName": name}],
                "containers": [{"name": "main", "image": "pause", "resources": {"claims": [{"name": "c"}]}}],
            },
        },
    )


def _running(kube: Kube, namespace: str, name: str) -> bool:
    try:
        pod = kube.get(f"{_pods(namespace)}/{name}")
    except KubeError:
        return False
    return bool((pod.get("status") or {}).get("phase") == "Running")


def _unhealthy_in_status(kube: Kube, namespace: str, name: str, resource_id: str) -> bool:
    """Whether the kubelet's allocatedResourcesStatus of the pod (from our health stream) names the
    device, by its CDI ID, Unhealthy."""
    pod = kube.get(f"{_pods(namespace)}/{name}")
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for entry in status.get("allocatedResourcesStatus") or []:
            for res in entry.get("resources") or []:
                if res.get("resourceID") == resource_id and res.get("health") == "Unhealthy":
                    return True
    return False


def _allocated(kube: Kube, namespace: str, name: str) -> str:
    claim = kube.get(f"{resourceclaims(namespace)}/{name}")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def test_claims_on_a_hollow_node_with_the_real_dra_manager(
    dra_node: tuple[cluster.HollowNode, cluster.NodeAgent],
    api_client: Any,
    kube_scheduler: cluster.Scheduler,
    namespace: str,
) -> None:
    node, agent = dra_node
    kube = Kube(api_client)
    cluster.wait_until(lambda: len(_slice_devices(kube, node.name)) == 5, what="the pool", timeout_s=60)
    devices = _slice_devices(kube, node.name)
    assert devices["imex-channel"]["attributes"]["type"] == {"string": "imex-channel"}

    # a pod with a claim runs with its CDI device
    _claim_and_pod(kube, namespace, "a", node=node.name, device_class="gpu.gpuagent.dev")
    cluster.wait_until(lambda: _running(kube, namespace, "a"), what="pod a Running", timeout_s=90)
    held = _allocated(kube, namespace, "a")
    uuid = devices[held]["attributes"]["uuid"]["string"]
    (record,) = [r for r in node.records(pod="a", namespace=namespace) if r["container"] == "main"]
    assert record["cdi_devices"] == [f"gpu.gpuagent.dev/gpu={uuid}"]

    # two gangs in the domain: different IMEX channels, each pod sees only its own
    _claim_and_pod(
        kube,
        namespace,
        "ga",
        node=node.name,
        device_class="imex-channel.gpuagent.dev",
        labels={"gpuagent.dev/gang": "ga"},
    )
    _claim_and_pod(
        kube,
        namespace,
        "gb",
        node=node.name,
        device_class="imex-channel.gpuagent.dev",
        labels={"gpuagent.dev/gang": "gb"},
    )
    for name in ("ga", "gb"):
        try:
            cluster.wait_until(
                lambda name=name: _running(kube, namespace, name), what=f"pod {name}", timeout_s=90
            )
        except cluster.StartupError:
            events, _ = kube.list(f"/api/v1/namespaces/{namespace}/events")
            claim = kube.get(f"{resourceclaims(namespace)}/{name}")
            log = agent.log_path.read_text()[-3000:]
            raise AssertionError(
                f"{[e.get('message') for e in events][-6:]} {claim.get('status')} {log}"
            ) from None
    channels = {
        name: [r for r in node.records(pod=name, namespace=namespace) if r["container"] == "main"][-1][
            "cdi_devices"
        ]
        for name in ("ga", "gb")
    }
    assert channels["ga"] != channels["gb"]
    assert all(len(c) == 1 and c[0].startswith(f"{DRIVER}/imex-channel=") for c in channels.values())

    # an XID on that GPU: the device is tainted in the pool, a new claim avoids it
    index = devices[held]["attributes"]["index"]["int"]
    agent.fault(event="xid", gpu=index, xid=79)
    cluster.wait_until(
        lambda: any(
            t["key"] == f"{DRIVER}/lost" for t in _slice_devices(kube, node.name)[held].get("taints", [])
        ),
        what="the XID's taint on the device",
        timeout_s=60,
    )
    # the health stream reaches the pod's status through the kubelet (ResourceHealthStatus, on in 1.37)
    cluster.wait_until(
        lambda: _unhealthy_in_status(kube, namespace, "a", f"{DRIVER}/gpu={uuid}"),
        what="pod a's allocatedResourcesStatus saying Unhealthy",
        timeout_s=60,
    )
    _claim_and_pod(kube, namespace, "b", node=node.name, device_class="gpu.gpuagent.dev")
    cluster.wait_until(lambda: _running(kube, namespace, "b"), what="pod b Running", timeout_s=90)
    assert _allocated(kube, namespace, "b") not in (held, "imex-channel")

    # an agent restart and a kubelet restart keep the prepared claims (the pods stay Running)
    agent.restart()
    node.restart()
    cluster.wait_until(lambda: _running(kube, namespace, "a"), what="pod a Running again", timeout_s=90)
    assert _running(kube, namespace, "b")
    assert _allocated(kube, namespace, "a") == held


def test_a_pod_asking_nvidia_gpu_runs_through_the_deviceclass_extended_resource(
    dra_node: tuple[cluster.HollowNode, cluster.NodeAgent],
    api_client: Any,
    kube_scheduler: cluster.Scheduler,
    namespace: str,
) -> None:
    """``daemonset/dra/extended-resource``: the DeviceClass maps ``nvidia.com/gpu`` (DRAExtendedResource,
    GA in 1.37). A pod that asks ``nvidia.com/gpu: 3`` of a node where only DRA serves GPUs gets a claim
    kube-scheduler makes for it, allocated from our pool, and runs with the CDI devices of those GPUs."""
    node, _agent = dra_node
    kube = Kube(api_client)
    overlay = yaml.safe_load(
        (REPO / "daemonset" / "dra" / "extended-resource" / "kustomization.yaml").read_text()
    )
    (patch,) = yaml.safe_load(overlay["patches"][0]["patch"])
    classes = {
        d["metadata"]["name"]: d
        for d in yaml.safe_load_all((REPO / "daemonset" / "dra" / "deviceclass.yaml").read_text())
    }
    gpu_class = classes[DRIVER]
    kube.apply(
        f"{DEVICECLASSES}/{DRIVER}",
        {**gpu_class, "spec": {**gpu_class["spec"], "extendedResourceName": patch["value"]}},
    )
    try:
        cluster.wait_until(lambda: len(_slice_devices(kube, node.name)) == 5, what="the pool", timeout_s=60)
        devices = _slice_devices(kube, node.name)
        kube.create(
            _pods(namespace),
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "ext"},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node.name},
                    "containers": [
                        {"name": "main", "image": "pause", "resources": {"limits": {"nvidia.com/gpu": "3"}}}
                    ],
                },
            },
        )
        try:
            cluster.wait_until(lambda: _running(kube, namespace, "ext"), what="pod ext Running", timeout_s=90)
        except cluster.StartupError:
            events, _ = kube.list(f"/api/v1/namespaces/{namespace}/events")
            pod = kube.get(f"{_pods(namespace)}/ext")
            raise AssertionError(
                f"{[e.get('message') for e in events][-6:]} {pod.get('status')} "
                f"{kube_scheduler.process.log_path.read_text()[-4000:]}"
            ) from None
        pod = kube.get(f"{_pods(namespace)}/ext")
        claim_name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        claim = kube.get(f"{resourceclaims(namespace)}/{claim_name}")
        held = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
        assert len(held) == 3
        assert "imex-channel" not in held
        (record,) = [r for r in node.records(pod="ext", namespace=namespace) if r["container"] == "main"]
        uuids = sorted(devices[d]["attributes"]["uuid"]["string"] for d in held)
        assert sorted(record["cdi_devices"]) == [f"{DRIVER}/gpu={u}" for u in uuids]
    finally:
        kube.apply(f"{DEVICECLASSES}/{DRIVER}", gpu_class)


def _channel_holders(kube: Kube, domain: str) -> dict[str, tuple[str, ...]]:
    """gang -> the nodes holding its channel, from the domain's record (ConfigMap in ``default``)."""
    from deviceplugin.dra.channelbook import record_name
    from deviceplugin.dra.channels import parse_record

    try:
        record = kube.get(f"/api/v1/namespaces/default/configmaps/{record_name(domain)}")
    except KubeError:
        return {}
    holders, _, _ = parse_record(record.get("data") or {})
    return {h.gang: h.nodes for h in holders.values()}


def test_an_agent_started_without_its_checkpoint_gives_back_channel_holds_no_claim_has(
    dra_node: tuple[cluster.HollowNode, cluster.NodeAgent],
    api_client: Any,
    kube_scheduler: cluster.Scheduler,
    namespace: str,
) -> None:
    """Issue 31: the agent's state is lost (checkpoint gone) while a gang's pod and claim are deleted: the
    restarted agent gives back the channel the record still holds for its node; a gang whose claim is
    still allocated here keeps its channel."""
    node, agent = dra_node
    kube = Kube(api_client)
    cluster.wait_until(lambda: len(_slice_devices(kube, node.name)) == 5, what="the pool", timeout_s=60)
    domain = _slice_devices(kube, node.name)["imex-channel"]["attributes"]["nvlinkDomain"]["string"]
    for name in ("gone", "stays"):
        _claim_and_pod(
            kube,
            namespace,
            name,
            node=node.name,
            device_class="imex-channel.gpuagent.dev",
            labels={"gpuagent.dev/gang": name},
        )
        cluster.wait_until(
            lambda name=name: _running(kube, namespace, name),  # type: ignore[misc]
            what=f"pod {name}",
            timeout_s=90,
        )
    held = _channel_holders(kube, domain)
    assert held[f"{namespace}/gone"] == held[f"{namespace}/stays"] == (node.name,)
    agent.stop()
    (node.root_dir / "plugins" / DRIVER / "checkpoint.json").unlink()
    from kubernetes import client

    client.CoreV1Api(api_client).delete_namespaced_pod("gone", namespace, grace_period_seconds=0)
    release_claims_named(kube, namespace, "gone")
    agent.start()
    cluster.wait_until(
        lambda: f"{namespace}/gone" not in _channel_holders(kube, domain),
        what="the stale hold given back",
        timeout_s=60,
    )
    assert _channel_holders(kube, domain)[f"{namespace}/stays"] == (node.name,)
    assert _running(kube, namespace, "stays")


def release_claims_named(kube: Kube, namespace: str, name: str) -> None:
    path = f"{resourceclaims(namespace)}/{name}"
    claim = kube.get(path)
    if claim["metadata"].get("finalizers"):
        kube.replace(path, {**claim, "metadata": {**claim["metadata"], "finalizers": []}})
    kube.delete(path)
