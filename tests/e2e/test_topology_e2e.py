"""Topology publishing against the real control plane: kube-apiserver + etcd and Volcano's scheduler.

- our GPUNode CRD installs, and the API server rejects malformed GPUNodes;
- the agent's publisher writes its GPUNode and node labels;
- the controller's HyperNodes pass Volcano's real HyperNode CRD validation; a second controller (a
  restart) writes nothing; the running controller follows a fabric change through real watches;
- Volcano's scheduler places a gang whose subgroups must each stay in one ``nvlink`` HyperNode onto
  simulated NVL72 nodes accordingly.
"""

from __future__ import annotations

import asyncio
import pathlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent.nvml.sim_sysfs import ibnetdiscover_sample
from agent.nvml.simulate import parse_spec
from agent.publisher import KubeNodeApi, Publisher, PublisherSettings
from agent.runtime import InventoryStore
from tests.e2e import cluster
from tests.topology.factories import nvl72_tray
from topology.controller import ControllerSettings, TopologyController
from topology.gpunode import gpunode_object, inventory_from_gpunode
from topology.kube import GPUNODES, HYPERNODES, NODES, Kube, KubeError, configmaps
from topology.model import FabricHealthSummary
from topology.names import node_domain_name

pytestmark = pytest.mark.e2e

ROOT = pathlib.Path(__file__).resolve().parents[2]
RACKS, TRAYS = 3, 4
NODE_NAMES = [f"rack{r}-tray{t}" for r in range(RACKS) for t in range(TRAYS)]


def rack_uuid(r: int) -> str:
    return f"7b968a6d-c8aa-45e1-9e07-{r:012x}"


def wait_for(check: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Plane:
    def __init__(self, cp: cluster.ControlPlane, api: Any) -> None:
        self.cp = cp
        self.api_client = api
        self.kube = Kube(api)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    """kube-apiserver + etcd with our CRD and the simulated Nodes."""
    counterparts = cluster.locate_counterparts()
    try:
        counterparts.check(("etcd", "kube-apiserver"))
    except cluster.MissingCounterpartError as exc:
        pytest.skip(f"real counterparts not built: {exc}")
    workdir = tmp_path_factory.mktemp("topology-e2e")
    cp = cluster.start_control_plane(counterparts, workdir)
    api = cp.apiserver.api_client()
    try:
        cluster.apply_crds(api, cluster.load_yaml_documents([ROOT / "daemonset/crds/gpunode.yaml"]))
        cluster.register_nodes(api, [cluster.fake_gpu_node(n, gpus=4) for n in NODE_NAMES])
        yield Plane(cp, api)
    finally:
        api.close()
        cp.stop()


@pytest.fixture(scope="module")
def volcano_crds(plane: Plane) -> Plane:
    """Volcano's own CRDs (HyperNode, PodGroup, Queue), as its release ships them."""
    try:
        files = cluster.locate_counterparts().volcano_crds()
    except cluster.MissingCounterpartError as exc:
        pytest.skip(f"Volcano CRDs not built: {exc}")
    cluster.apply_crds(plane.api_client, cluster.load_yaml_documents(files))
    return plane


@pytest.fixture(scope="module")
def volcano(volcano_crds: Plane) -> Iterator[Plane]:
    counterparts = cluster.locate_counterparts()
    try:
        counterparts.check(("vc-scheduler",))
    except cluster.MissingCounterpartError as exc:
        pytest.skip(f"Volcano scheduler not built: {exc}")
    sched = cluster.start_volcano_scheduler(
        counterparts, volcano_crds.cp.workdir, apiserver=volcano_crds.cp.apiserver
    )
    try:
        # vc-controller-manager is not running here: open the default queue as it would
        volcano_crds.kube.apply(
            "/apis/scheduling.volcano.sh/v1beta1/queues/default/status",
            {
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "Queue",
                "metadata": {"name": "default"},
                "status": {"state": "Open"},
            },
        )
        yield volcano_crds
    finally:
        sched.stop()


def publish_all(plane: Plane) -> None:
    """What every node's agent does: its GPUNode (with status) and its labels."""
    api = KubeNodeApi(plane.kube)
    for name in NODE_NAMES:
        r = int(name[4])
        store = InventoryStore(nvl72_tray(name, cluster_uuid=rack_uuid(r)))
        Publisher(source=store, api=api, settings=PublisherSettings(node_name=name)).publish_once()


def fabric_configmap(plane: Plane) -> None:
    specs = [parse_spec(f"gb200-nvl72:rack={r},tray={t}") for r in range(RACKS) for t in range(TRAYS)]
    plane.kube.apply(
        f"{configmaps('default')}/fabric",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "fabric", "namespace": "default", "labels": {"gpuagent.dev/fabric": "ib"}},
            "data": {"cluster.ibnetdiscover": ibnetdiscover_sample(specs)},
        },
    )


def reconcile_once(plane: Plane, identity: str) -> TopologyController:
    c = TopologyController(
        kube=plane.kube, settings=ControllerSettings(namespace="default", identity=identity, debounce_s=0.1)
    )
    for r in c.reflectors:
        items, _ = plane.kube.list(r.path, label_selector=r.label_selector)
        r.store = {str(o["metadata"]["name"]): o for o in items}
    c.reconcile()
    return c


def test_gpunode_crd_rejects_malformed_objects(plane: Plane) -> None:
    inv = nvl72_tray("rack0-tray0", cluster_uuid=rack_uuid(0))
    good = gpunode_object(inv, node_name="probe")
    plane.kube.apply(f"{GPUNODES}/probe", {k: v for k, v in good.items() if k != "status"})
    plane.kube.apply(f"{GPUNODES}/probe/status", good)
    bad = gpunode_object(inv, node_name="probe")
    bad["status"]["summary"]["gpus"] = "four"
    with pytest.raises(KubeError) as info:
        plane.kube.apply(f"{GPUNODES}/probe/status", bad)
    assert info.value.status >= 400
    assert "gpus" in str(info.value)
    bad = gpunode_object(inv, node_name="probe")
    bad["status"]["inventory"]["fabric"][0]["state"] = "BROKEN"
    with pytest.raises(KubeError, match="BROKEN"):
        plane.kube.apply(f"{GPUNODES}/probe/status", bad)
    mismatch = {k: v for k, v in gpunode_object(inv, node_name="other").items() if k != "status"}
    mismatch["metadata"]["name"] = "mismatch"
    with pytest.raises(KubeError, match=r"spec\.nodeName"):
        plane.kube.apply(f"{GPUNODES}/mismatch", mismatch)
    plane.kube.delete(f"{GPUNODES}/probe")


def test_agent_publishes_gpunode_and_labels(plane: Plane) -> None:
    publish_all(plane)
    obj = plane.kube.get(f"{GPUNODES}/rack1-tray2")
    name, inv, health = inventory_from_gpunode(obj)
    assert name == "rack1-tray2"
    assert inv == nvl72_tray("rack1-tray2", cluster_uuid=rack_uuid(1))
    assert health is not None
    node = plane.kube.get(f"{NODES}/rack1-tray2")
    assert obj["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.clique"] == f"{rack_uuid(1)}.32766"
    assert labels["gpuagent.dev/nvlink-domain"] == f"nvl-{rack_uuid(1)}-32766"
    assert labels["kubernetes.io/hostname"] == "rack1-tray2"  # others' labels untouched


def test_controller_hypernodes_pass_volcano_validation_and_restart_writes_nothing(
    volcano_crds: Plane,
) -> None:
    plane = volcano_crds
    publish_all(plane)
    fabric_configmap(plane)
    first = reconcile_once(plane, "first")
    assert first.stats.last_diff is not None
    assert first.stats.failed_writes == 0
    items, _ = plane.kube.list(HYPERNODES)
    tiers = {o["metadata"]["name"]: o["spec"]["tierName"] for o in items}
    assert sorted(set(tiers.values())) == ["leaf", "nvlink", "spine"]
    assert sum(1 for t in tiers.values() if t == "nvlink") == RACKS
    versions = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in items}

    again = reconcile_once(plane, "restarted")
    assert again.stats.last_diff is not None
    assert again.stats.last_diff.writes == 0
    items, _ = plane.kube.list(HYPERNODES)
    assert {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in items} == versions


def test_running_controller_follows_a_fabric_change(volcano_crds: Plane) -> None:
    plane = volcano_crds
    publish_all(plane)
    fabric_configmap(plane)
    c = TopologyController(
        kube=plane.kube,
        settings=ControllerSettings(
            namespace="default", identity="live", leader_elect=True, debounce_s=0.2, watch_timeout_s=5
        ),
    )
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(c.run(stop)), daemon=True)
    thread.start()
    try:
        wait_for(lambda: c.stats.reconciles >= 1, "first reconcile")
        sick = gpunode_object(
            nvl72_tray("rack2-tray3", cluster_uuid=rack_uuid(2), summary=FabricHealthSummary.UNHEALTHY),
            node_name="rack2-tray3",
        )
        plane.kube.apply(f"{GPUNODES}/rack2-tray3/status", sick)
        isolated = node_domain_name("rack2-tray3")
        wait_for(
            lambda: isolated in {o["metadata"]["name"] for o in plane.kube.list(HYPERNODES)[0]}, "isolation"
        )
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()
    assert not thread.is_alive()
    # heal it again for the scheduling test
    publish_all(plane)
    reconcile_once(plane, "heal")


def test_volcano_keeps_each_subgroup_in_one_nvlink_domain(volcano: Plane) -> None:
    plane = volcano
    publish_all(plane)
    fabric_configmap(plane)
    reconcile_once(plane, "before-scheduling")
    domains = {
        o["metadata"]["name"]: {m["selector"]["exactMatch"]["name"] for m in o["spec"]["members"]}
        for o in plane.kube.list(HYPERNODES)[0]
        if o["spec"]["tierName"] == "nvlink"
    }
    # rack0-tray0 is taken by a pod bound by hand: rack 0 has room for 3 pods only, so a scheduler
    # that fills nodes in name order would split the first subgroup across racks 0 and 1
    plane.kube.create(
        "/api/v1/namespaces/default/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "occupant", "namespace": "default"},
            "spec": {
                "nodeName": "rack0-tray0",
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox",
                        "resources": {"limits": {"nvidia.com/gpu": "4"}, "requests": {"nvidia.com/gpu": "4"}},
                    }
                ],
            },
        },
    )
    plane.kube.create(
        "/apis/scheduling.volcano.sh/v1beta1/namespaces/default/podgroups",
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": "default"},
            "spec": {
                "minMember": 8,
                "queue": "default",
                "subGroupPolicy": [
                    {
                        "name": "w",
                        "subGroupSize": 4,
                        "minSubGroups": 2,
                        "labelSelector": {"matchLabels": {"app": "train"}},
                        "matchLabelKeys": ["volcano.sh/partition-id"],
                        "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
                    }
                ],
            },
        },
    )
    for i in range(8):
        plane.kube.create(
            "/api/v1/namespaces/default/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"train-{i}",
                    "namespace": "default",
                    "labels": {"app": "train", "volcano.sh/partition-id": str(i // 4)},
                    "annotations": {"scheduling.k8s.io/group-name": "train"},
                },
                "spec": {
                    "schedulerName": "volcano",
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox",
                            "resources": {
                                "limits": {"nvidia.com/gpu": "4"},
                                "requests": {"nvidia.com/gpu": "4"},
                            },
                        }
                    ],
                },
            },
        )

    def placement() -> dict[str, str]:
        pods, _ = plane.kube.list("/api/v1/namespaces/default/pods", label_selector="app=train")
        return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods}

    wait_for(lambda: all(placement().values()) and len(placement()) == 8, "all 8 pods bound", limit_s=120)
    where = placement()
    assert not any(n.startswith("rack0-") for n in where.values())  # rack 0 cannot hold a whole subgroup
    for part in range(2):
        nodes = {where[f"train-{i}"] for i in range(part * 4, part * 4 + 4)}
        assert len(nodes) == 4  # one pod per 4-GPU tray
        assert any(nodes <= members for members in domains.values()), (
            f"subgroup {part} spans domains: {nodes}"
        )
