"""A gang of DRA pods placed by NVLink domain through our extender, with the REAL kube-scheduler (its DRA
plugin allocating the devices) and kube-apiserver (issue 31, item 5).

Two NVL72 racks of 18 trays are hand-made ``Node`` objects (as in ``test_extender_e2e.py``: no kubelet, so
the pods stay unstarted once bound) whose GPUs exist only as the driver's ResourceSlices (allocatable
``nvidia.com/gpu`` is 0). 36 pods ask 4 GPUs each through a ResourceClaimTemplate of the DeviceClass
``gpu.gpuagent.dev``, as one gang of two 18-pod subgroups, each inside one NVLink domain. The extender
counts each pod's 4 GPUs from the template and each tray's 4 from its pool; kube-scheduler's DRA plugin
then allocates each pod's claim on the node the extender chose.

The same path on real kubelets at a size this machine runs: 2 racks x 2 GB200 trays on hollow kubelets
with the real DRA manager and the agent's DRA driver, a 2x2-pod gang whose pods run with the CDI devices
of their tray's 4 GPUs (the 2x18 gang on 36 hollow trays and agents is beyond a 2-core machine). The
NVLink domains are given as node labels here (the label the extender reads first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import localcluster as cluster
from tests.e2e.conftest import _operator
from tests.e2e.test_dra_hollow_e2e import release_claims
from tests.e2e.test_extender_e2e import SCHEDULER, RunningExtender, bound, create
from topology.kube import RESOURCESLICES, Kube, resourceclaims

pytestmark = pytest.mark.e2e

DRIVER = "gpu.gpuagent.dev"
REPO = Path(__file__).resolve().parents[2]
DEVICECLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
RACKS, TRAYS, GPUS = 2, 18, 4


def _slice(node: str, rack: int, tray: int) -> dict[str, Any]:
    domain = f"00000000-0000-4000-8000-00000000000{rack}.0"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-0"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": f"GPU-{rack:02d}{tray:02d}{i:02d}-0000-0000-0000-000000000000"},
                        "nvlinkDomain": {"string": domain},
                    },
                }
                for i in range(GPUS)
            ],
        },
    }


@pytest.fixture(scope="module")
def claim_controller(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[cluster.Operator]:
    """kube-controller-manager with only the ResourceClaim controller: each pod's claim is made from its
    ResourceClaimTemplate (and named in the pod's status)."""
    yield from _operator(
        lambda: cluster.start_kube_controller_manager(
            counterparts,
            tmp_path_factory.mktemp("kcm-claims"),
            apiserver=control_plane.apiserver,
            controllers=("resourceclaim-controller",),
        )
    )


@pytest.fixture
def dra_racks(
    api_client: Any, gpu_nodes: Callable[..., list[str]], e2e_test_label: str
) -> Iterator[list[list[str]]]:
    """Two racks of DRA-only trays (their NVLink domain by the node label the extender reads), their
    pools, and the DeviceClass."""
    from kubernetes import client

    kube = Kube(api_client)
    for doc in yaml.safe_load_all((REPO / "daemonset" / "dra" / "deviceclass.yaml").read_text()):
        kube.apply(f"{DEVICECLASSES}/{doc['metadata']['name']}", doc)
    core = client.CoreV1Api(api_client)
    racks: list[list[str]] = []
    slices: list[str] = []
    try:
        for r in range(RACKS):
            domain = f"nvl-{r}-{e2e_test_label}"[:63].rstrip("-")
            names = gpu_nodes(
                [f"{e2e_test_label}-d{r}-t{t:02d}"[-63:] for t in range(TRAYS)],
                gpus=0,
                labels={"gpuagent.dev/nvlink-domain": domain},
            )
            for t, n in enumerate(names):
                core.patch_node(n, {"spec": {"taints": None}})
                obj = _slice(n, r, t)
                kube.create(RESOURCESLICES, obj)
                slices.append(obj["metadata"]["name"])
            racks.append(names)
        yield racks
    finally:
        release_claims(kube, {n for rack in racks for n in rack})
        for name in slices:
            kube.delete(f"{RESOURCESLICES}/{name}")


@pytest.fixture
def extender(
    control_plane: cluster.ControlPlane,
    dra_racks: list[list[str]],
    kube_scheduler_factory: Callable[..., cluster.Scheduler],
) -> Iterator[RunningExtender]:
    ext = RunningExtender(str(control_plane.apiserver.kubeconfig))
    try:
        kube_scheduler_factory(scheduler_name=SCHEDULER, extenders=[cluster.extender_entry(ext.url)])
        yield ext
    finally:
        ext.stop()


def dra_gang(ns: str, gang: str, n: int, subgroup: int, label: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{gang}-{i}",
                "namespace": ns,
                "annotations": {
                    "gpuagent.dev/gang": gang,
                    "gpuagent.dev/gang-size": str(n),
                    "gpuagent.dev/subgroup-size": str(subgroup),
                    "gpuagent.dev/subgroup-tier": "nvlink",
                    "gpuagent.dev/rank": str(i),
                },
            },
            "spec": {
                "schedulerName": SCHEDULER,
                "nodeSelector": {"gpuagent.dev/e2e-test": label},
                "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "four-gpus"}],
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.invalid/none:0",
                        "resources": {"claims": [{"name": "gpus"}]},
                    }
                ],
            },
        }
        for i in range(n)
    ]


@pytest.mark.usefixtures("claim_controller")
def test_a_2x18_pod_dra_gang_places_each_subgroup_in_one_nvlink_domain(
    api_client: Any,
    namespace: str,
    dra_racks: list[list[str]],
    extender: RunningExtender,
    e2e_test_label: str,
) -> None:
    kube = Kube(api_client)
    kube.create(
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "four-gpus"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": GPUS}}]
                    }
                }
            },
        },
    )
    trays = [n for rack in dra_racks for n in rack]
    cluster.wait_until(
        lambda: extender.state(lambda s: all(s.cache.free_gpus(n) == GPUS for n in trays)),
        what="the extender counts every tray's pool",
    )
    pods = dra_gang(namespace, "train", RACKS * TRAYS, TRAYS, e2e_test_label)
    create(api_client, pods)
    cluster.wait_until(
        lambda: len(bound(api_client, namespace, "train")) == len(pods),
        what="all 36 pods bound",
        timeout_s=180,
    )
    placement = bound(api_client, namespace, "train")
    assert len(set(placement.values())) == len(pods)  # 4 GPUs each: one whole tray per pod
    subgroups = [{placement[f"train-{i}"] for i in range(s * TRAYS, (s + 1) * TRAYS)} for s in range(RACKS)]
    assert sorted(map(sorted, subgroups)) == sorted(map(sorted, dra_racks))  # each subgroup one rack
    # kube-scheduler's DRA plugin allocated each pod's claim on the node the extender chose
    claims, _ = kube.list(resourceclaims(namespace))
    on: dict[str, set[str]] = {}
    for c in claims:
        results = c["status"]["allocation"]["devices"]["results"]
        (owner,) = [o["name"] for o in c["metadata"]["ownerReferences"] if o["kind"] == "Pod"]
        assert len(results) == GPUS
        on[owner] = {r["pool"] for r in results}
    assert on == {p: {n} for p, n in placement.items()}
    cluster.wait_until(
        lambda: extender.state(lambda s: all(s.cache.free_gpus(n) == 0 for n in trays)),
        what="the extender counts the allocations as used",
    )


@pytest.fixture
def hollow_trays(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    api_client: Any,
    e2e_test_label: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[list[tuple[cluster.HollowNode, cluster.NodeAgent]]]]:
    """2 racks x 2 GB200 trays on hollow kubelets with the real DRA manager, each with its agent's DRA
    driver serving all 4 GPUs (nothing as nvidia.com/gpu)."""
    import os
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("hollow nodes need root")
    kube = Kube(api_client)
    for doc in yaml.safe_load_all((REPO / "daemonset" / "dra" / "deviceclass.yaml").read_text()):
        kube.apply(f"{DEVICECLASSES}/{doc['metadata']['name']}", doc)
    racks: list[list[tuple[cluster.HollowNode, cluster.NodeAgent]]] = []
    started: list[tuple[cluster.HollowNode, cluster.NodeAgent]] = []
    with tempfile.TemporaryDirectory(prefix="drag", dir="/tmp") as tmp:  # unix socket paths stay short
        try:
            for r in range(RACKS):
                racks.append([])
                for t in range(2):
                    node = cluster.start_hollow_node(
                        counterparts,
                        Path(tmp) / f"r{r}t{t}",
                        apiserver=control_plane.apiserver,
                        name=f"dra-gang-r{r}t{t}",
                        labels={"gpuagent.dev/e2e-test": e2e_test_label},
                    )
                    agent = cluster.new_node_agent(
                        node,
                        simulate=f"gb200-nvl72:rack={r + 6},tray={t}",
                        kubeconfig=control_plane.apiserver.kubeconfig,
                        config={
                            "cdi": {"specDir": str(node.workdir / "cdi")},
                            "dra": {
                                "enabled": True,
                                "pluginDir": str(node.root_dir / "plugins"),
                                "registryDir": str(node.root_dir / "plugins_registry"),
                            },
                        },
                        faults=[],
                    )
                    started.append((node, agent))
                    agent.start()
                    racks[-1].append((node, agent))
            yield racks
        finally:
            names = {node.name for node, _ in started}
            for node, agent in started:
                agent.stop()
                node.stop()
            release_claims(kube, names)
            for name in names:
                for s in kube.list(RESOURCESLICES, field_selector=f"spec.nodeName={name}")[0]:
                    kube.delete(f"{RESOURCESLICES}/{s['metadata']['name']}")
            cluster.delete_nodes(api_client, sorted(names))


@pytest.fixture
def hollow_extender(
    control_plane: cluster.ControlPlane,
    hollow_trays: list[list[tuple[cluster.HollowNode, cluster.NodeAgent]]],
    kube_scheduler_factory: Callable[..., cluster.Scheduler],
) -> Iterator[RunningExtender]:
    ext = RunningExtender(str(control_plane.apiserver.kubeconfig))
    try:
        kube_scheduler_factory(scheduler_name=SCHEDULER, extenders=[cluster.extender_entry(ext.url)])
        yield ext
    finally:
        ext.stop()


@pytest.mark.usefixtures("claim_controller")
def test_a_dra_gang_on_hollow_trays_runs_each_subgroup_in_one_rack_with_its_cdi_devices(
    api_client: Any,
    namespace: str,
    hollow_trays: list[list[tuple[cluster.HollowNode, cluster.NodeAgent]]],
    hollow_extender: RunningExtender,
    e2e_test_label: str,
) -> None:
    """The same path with real kubelets: the pods run, each with the CDI devices of its tray's 4 GPUs."""
    kube = Kube(api_client)
    names = [[n.name for n, _ in rack] for rack in hollow_trays]
    by_name = {n.name: n for rack in hollow_trays for n, _ in rack}

    from kubernetes import client

    core = client.CoreV1Api(api_client)
    for r, rack in enumerate(names):  # each rack its NVLink domain, named the way the extender reads it
        for n in rack:
            core.patch_node(n, {"metadata": {"labels": {"gpuagent.dev/nvlink-domain": f"dra-gang-rack-{r}"}}})
    ext = hollow_extender
    cluster.wait_until(
        lambda: ext.state(lambda s: all(s.cache.free_gpus(n) == GPUS for rack in names for n in rack)),
        what="the extender counts every tray's pool",
        timeout_s=60,
    )
    kube.create(
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "four-gpus"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": GPUS}}]
                    }
                }
            },
        },
    )
    pods = dra_gang(namespace, "hg", 4, 2, e2e_test_label)
    for p in pods:
        p["spec"]["containers"][0]["image"] = "pause"
    create(api_client, pods)

    def running() -> int:
        items, _ = kube.list(f"/api/v1/namespaces/{namespace}/pods")
        return sum((p.get("status") or {}).get("phase") == "Running" for p in items)

    cluster.wait_until(lambda: running() == 4, what="the 4 gang pods Running", timeout_s=120)
    placement = bound(api_client, namespace, "hg")
    subgroups = [{placement["hg-0"], placement["hg-1"]}, {placement["hg-2"], placement["hg-3"]}]
    assert sorted(map(sorted, subgroups)) == sorted(map(sorted, names))
    for pod, node_name in placement.items():
        (record,) = [
            r for r in by_name[node_name].records(pod=pod, namespace=namespace) if r["container"] == "c"
        ]
        assert len(record["cdi_devices"]) == GPUS
        assert all(d.startswith(f"{DRIVER}/gpu=GPU-") for d in record["cdi_devices"])
