"""Topology publishing against the real control plane: kube-apiserver + etcd and Volcano's scheduler.

- our GPUNode CRD installs, and the API server rejects malformed GPUNodes;
- the agent's publisher writes its GPUNode and node labels;
- the controller's HyperNodes pass Volcano's real HyperNode CRD validation; a second controller (a
  restart) writes nothing; the running controller follows a fabric change through real watches;
- Volcano's scheduler places a gang whose subgroups must each stay in one ``nvlink`` HyperNode onto
  simulated NVL72 nodes accordingly.

The nodes are simulated GB200 trays (``discover --simulate gb200-nvl72:rack=R,tray=T``), registered as
``topo-rR-tT``; the fabric is the simulator's ``ibnetdiscover`` output for the same trays, matched to
the nodes by HCA GUID (the host names in it are the simulator's, not the node names).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import pytest

from agent import localcluster as cluster
from agent.commands import discover
from agent.nvml.sim_sysfs import ibnetdiscover_sample
from agent.nvml.simulate import parse_spec
from agent.publisher import KubeNodeApi, Publisher, PublisherSettings
from agent.runtime import InventoryStore
from tests.e2e.conftest import REPO_ROOT
from topology.builder import SOURCE_LABEL, SOURCE_VALUE
from topology.controller import ControllerSettings, TopologyController
from topology.gpunode import gpunode_object, inventory_from_gpunode
from topology.kube import GPUNODES, HYPERNODES, NODES, Kube, KubeError, configmaps
from topology.model import FabricHealthSummary, NodeInventory
from topology.names import node_domain_name

pytestmark = pytest.mark.e2e

RACKS, TRAYS = 3, 4
SPECS = {f"topo-r{r}-t{t}": f"gb200-nvl72:rack={r},tray={t}" for r in range(RACKS) for t in range(TRAYS)}


@cache
def inventory(name: str) -> NodeInventory:
    return discover.run(discover.parse_options(["--simulate", SPECS[name], "--node-name", name]))


def rack_of(name: str) -> int:
    return int(name.split("-")[1][1:])


class Topo:
    """One test's view: the API, its namespace (Lease, fabric ConfigMap, Events) and node label."""

    def __init__(self, api_client: Any, namespace: str, label: str) -> None:
        self.kube = Kube(api_client)
        self.namespace = namespace
        self.label = label

    def publish_all(self, *, sick: str | None = None) -> None:
        """What every node's agent does: its GPUNode (with status) and its labels."""
        api = KubeNodeApi(self.kube)
        for name in SPECS:
            inv = inventory(name)
            if name == sick:
                inv = _unhealthy(inv)
            store = InventoryStore(inv)
            Publisher(source=store, api=api, settings=PublisherSettings(node_name=name)).publish_once()

    def fabric_configmap(self) -> None:
        self.kube.apply(
            f"{configmaps(self.namespace)}/fabric",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": "fabric",
                    "namespace": self.namespace,
                    "labels": {"gpuagent.dev/fabric": "ib"},
                },
                "data": {
                    "cluster.ibnetdiscover": ibnetdiscover_sample([parse_spec(s) for s in SPECS.values()])
                },
            },
        )

    def settings(self, identity: str, **kw: Any) -> ControllerSettings:
        return ControllerSettings(namespace=self.namespace, identity=identity, debounce_s=0.1, **kw)

    def reconcile_once(self, identity: str) -> TopologyController:
        c = TopologyController(kube=self.kube, settings=self.settings(identity))
        c.reconcile_once()
        return c

    def hypernodes(self) -> dict[str, dict[str, Any]]:
        items, _ = self.kube.list(HYPERNODES, label_selector=f"{SOURCE_LABEL}={SOURCE_VALUE}")
        return {o["metadata"]["name"]: o for o in items}


def _unhealthy(inv: NodeInventory) -> NodeInventory:
    import dataclasses

    fabric = tuple(dataclasses.replace(f, health_summary=FabricHealthSummary.UNHEALTHY) for f in inv.fabric)
    return dataclasses.replace(inv, fabric=fabric)


@pytest.fixture(scope="module")
def gpunode_crd(api_client: Any) -> list[str]:
    return cluster.apply_crds(
        api_client, cluster.load_yaml_documents([REPO_ROOT / "daemonset/crds/gpunode.yaml"])
    )


@pytest.fixture
def topo(
    api_client: Any,
    gpunode_crd: list[str],
    namespace: str,
    gpu_nodes: Callable[..., list[str]],
    e2e_test_label: str,
) -> Iterator[Topo]:
    gpu_nodes(list(SPECS), gpus=4)
    t = Topo(api_client, namespace, e2e_test_label)
    try:
        yield t
    finally:
        # no controller manager here: remove what our components created ourselves
        for name in t.hypernodes() if _has_hypernodes(t) else ():
            t.kube.delete(f"{HYPERNODES}/{name}")
        for name in SPECS:
            t.kube.delete(f"{GPUNODES}/{name}")


def _has_hypernodes(t: Topo) -> bool:
    try:
        t.kube.list(HYPERNODES)
    except KubeError:
        return False
    return True


def open_default_queue(t: Topo) -> None:
    """vc-controller-manager is not running here: open the default queue as it would."""
    t.kube.apply(
        "/apis/scheduling.volcano.sh/v1beta1/queues/default/status",
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": {"name": "default"},
            "status": {"state": "Open"},
        },
    )


def test_gpunode_crd_rejects_malformed_objects(topo: Topo) -> None:
    inv = inventory("topo-r0-t0")
    good = gpunode_object(inv, node_name="topo-r0-t0")
    topo.kube.apply(f"{GPUNODES}/topo-r0-t0", {k: v for k, v in good.items() if k != "status"})
    topo.kube.apply(f"{GPUNODES}/topo-r0-t0/status", good)
    bad = gpunode_object(inv, node_name="topo-r0-t0")
    bad["status"]["summary"]["gpus"] = "four"
    with pytest.raises(KubeError) as info:
        topo.kube.apply(f"{GPUNODES}/topo-r0-t0/status", bad)
    assert info.value.status >= 400
    assert "gpus" in str(info.value)
    bad = gpunode_object(inv, node_name="topo-r0-t0")
    bad["status"]["inventory"]["fabric"][0]["state"] = "BROKEN"
    with pytest.raises(KubeError, match="BROKEN"):
        topo.kube.apply(f"{GPUNODES}/topo-r0-t0/status", bad)
    mismatch = {k: v for k, v in gpunode_object(inv, node_name="topo-r0-t1").items() if k != "status"}
    mismatch["metadata"]["name"] = "topo-mismatch"
    with pytest.raises(KubeError, match=r"spec\.nodeName"):
        topo.kube.apply(f"{GPUNODES}/topo-mismatch", mismatch)


def test_agent_publishes_gpunode_and_labels(topo: Topo) -> None:
    topo.publish_all()
    obj = topo.kube.get(f"{GPUNODES}/topo-r1-t2")
    name, inv, health = inventory_from_gpunode(obj)
    assert name == "topo-r1-t2"
    assert inv == inventory("topo-r1-t2")
    assert health is not None
    node = topo.kube.get(f"{NODES}/topo-r1-t2")
    assert obj["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    labels = node["metadata"]["labels"]
    clique = f"{inv.fabric[0].cluster_uuid}.{inv.fabric[0].clique_id}"
    assert labels["nvidia.com/gpu.clique"] == clique
    assert labels["gpuagent.dev/nvlink-domain"] == f"nvl-{clique.replace('.', '-')}"
    assert labels["gpuagent.dev/e2e-test"] == topo.label  # others' labels untouched


def test_controller_hypernodes_pass_volcano_validation_and_restart_writes_nothing(
    topo: Topo, volcano_crds: list[str]
) -> None:
    topo.publish_all()
    topo.fabric_configmap()
    first = topo.reconcile_once("first")
    assert first.stats.failed_writes == 0
    objs = topo.hypernodes()
    tiers = {name: o["spec"]["tierName"] for name, o in objs.items()}
    assert sorted(set(tiers.values())) == ["leaf", "nvlink", "spine"]
    nvlink = [o for o in objs.values() if o["spec"]["tierName"] == "nvlink"]
    assert sorted(len(o["spec"]["members"]) for o in nvlink) == [TRAYS] * RACKS
    versions = {name: o["metadata"]["resourceVersion"] for name, o in objs.items()}

    again = topo.reconcile_once("restarted")
    assert again.stats.last_diff is not None
    assert again.stats.last_diff.writes == 0
    assert {name: o["metadata"]["resourceVersion"] for name, o in topo.hypernodes().items()} == versions


def test_running_controller_follows_a_fabric_change(topo: Topo, volcano_crds: list[str]) -> None:
    topo.publish_all()
    topo.fabric_configmap()
    c = TopologyController(
        kube=topo.kube, settings=topo.settings("live", leader_elect=True, watch_timeout_s=5)
    )
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(c.run(stop)), daemon=True)
    thread.start()
    try:
        cluster.wait_until(lambda: c.stats.reconciles >= 1, what="first reconcile")
        topo.publish_all(sick="topo-r2-t3")
        isolated = node_domain_name("topo-r2-t3")
        cluster.wait_until(lambda: isolated in topo.hypernodes(), what="isolated NVLink domain")

        def excluded_event() -> bool:  # the Event is written after the HyperNodes, by the recorder
            events, _ = topo.kube.list("/api/v1/namespaces/default/events")
            return any(
                e["reason"] == "NvlinkDomainExcluded" and e["involvedObject"]["name"] == "topo-r2-t3"
                for e in events
            )

        cluster.wait_until(excluded_event, what="NvlinkDomainExcluded Event on topo-r2-t3")
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()
    assert not thread.is_alive()


def test_volcano_keeps_each_subgroup_in_one_nvlink_domain(
    topo: Topo, volcano: cluster.Scheduler, namespace: str
) -> None:
    topo.publish_all()
    topo.fabric_configmap()
    topo.reconcile_once("before-scheduling")
    open_default_queue(topo)
    domains = {
        name: {m["selector"]["exactMatch"]["name"] for m in o["spec"]["members"]}
        for name, o in topo.hypernodes().items()
        if o["spec"]["tierName"] == "nvlink"
    }
    gpus = {"limits": {"nvidia.com/gpu": "4"}, "requests": {"nvidia.com/gpu": "4"}}
    # topo-r0-t0 is taken by a pod bound by hand: rack 0 has room for 3 pods only, so a scheduler
    # that fills nodes in name order would split the first subgroup across racks 0 and 1
    topo.kube.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "occupant", "namespace": namespace},
            "spec": {
                "nodeName": "topo-r0-t0",
                "containers": [{"name": "c", "image": "none", "resources": gpus}],
            },
        },
    )
    topo.kube.create(
        f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{namespace}/podgroups",
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": namespace},
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
        topo.kube.create(
            f"/api/v1/namespaces/{namespace}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"train-{i}",
                    "namespace": namespace,
                    "labels": {"app": "train", "volcano.sh/partition-id": str(i // 4)},
                    "annotations": {"scheduling.k8s.io/group-name": "train"},
                },
                "spec": {
                    "schedulerName": "volcano",
                    "nodeSelector": {"gpuagent.dev/e2e-test": topo.label},
                    "containers": [{"name": "c", "image": "none", "resources": gpus}],
                },
            },
        )

    def placement() -> dict[str, str]:
        pods, _ = topo.kube.list(f"/api/v1/namespaces/{namespace}/pods", label_selector="app=train")
        return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods}

    cluster.wait_until(lambda: len(placement()) == 8 and all(placement().values()), what="all 8 pods bound")
    where = placement()
    assert not any(rack_of(n) == 0 for n in where.values())  # rack 0 cannot hold a whole subgroup
    for part in range(2):
        nodes = {where[f"train-{i}"] for i in range(part * 4, part * 4 + 4)}
        assert len(nodes) == 4  # one pod per 4-GPU tray
        assert any(nodes <= members for members in domains.values()), (
            f"subgroup {part} spans domains: {nodes}"
        )
