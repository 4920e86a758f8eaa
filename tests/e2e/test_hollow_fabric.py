"""GB200 fabric and IMEX end to end on hollow trays (issue 27, item 7, the fabric and IMEX half).

Two racks of two ``gb200-nvl72`` hollow trays, each a real kubelet (``counterparts/hollownode``) with one
``gpu-node-agent run --simulate gb200-nvl72:rack=R,tray=T --simulate-faults F`` publishing its labels
and ``GPUNode`` to the shared API server, ``imex.channelIDs: [0]`` set: rack 0 with the ``envvar``
strategy, rack 1 with ``[envvar, cdi-cri]``. Checked:

- a pod's CRI ``CreateContainer`` carries the IMEX channel: ``NVIDIA_IMEX_CHANNELS=0`` on rack 0, and on
  rack 1 also the CDI device ``gpuagent.dev/imex-channel=0`` beside the GPUs';
- a route fault on one GPU of a tray (a fault line, as the fabric reports it) withdraws that tray's
  ``nvidia.com/gpu.clique`` and ``gpuagent.dev/nvlink-domain`` labels, its ``GPUNode`` says why, and
  kube-scheduler with our extender then places a 2-pod NVLink subgroup in the other rack (the faulty
  tray's rack is the one the tie between two free racks goes to, by domain name, and it has one tray
  left in its domain); the fault cleared, the labels come back.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from agent import localcluster as cluster
from tests.e2e.conftest import _require, _unavailable
from tests.e2e.test_extender_e2e import RunningExtender
from tests.e2e.test_hollow_scheduling import (
    _stop_and_delete,
    bound,
    create,
    extender_behind_scheduler,
    gang,
    gpu_pod,
)

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
SCHEDULER = "gpu-topology-scheduler"
CLIQUE = "nvidia.com/gpu.clique"
DOMAIN = "gpuagent.dev/nvlink-domain"
FABRIC_HEALTH = "gpuagent.dev/fabric-health"
GPUNODES = ("topology.gpuagent.dev", "v1alpha1", "gpunodes")
WAIT_S = 120.0  # generous: the CI machine has 2 cores shared by every process here
LABEL = "hollow-fabric"


@pytest.fixture(scope="module")
def trays(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    api_client: Any,
    tmp_path_factory: pytest.TempPathFactory,
    gpunode_crd_installed: list[str],
) -> Iterator[list[list[cluster.HollowGpuNode]]]:
    _require(counterparts, "hollownode")
    if os.geteuid() != 0:
        _unavailable("hollow nodes need root: each bind-mounts its device-plugin folder in its own namespace")
    cdi_dir = tmp_path_factory.mktemp("hollow-fabric-cdi")
    configs = [
        {"imex": {"channelIDs": [0], "required": True}, "health": {"probeIntervalSeconds": 0.2}},
        {
            "imex": {"channelIDs": [0], "required": True},
            "health": {"probeIntervalSeconds": 0.2},
            "flags": {"plugin": {"deviceListStrategy": ["envvar", "cdi-cri"]}},
            "cdi": {"specDir": str(cdi_dir)},
        },
    ]
    specs = [
        cluster.GpuNodeSpec(f"hf-r{r}-t{t}", f"gb200-nvl72:rack={r},tray={t}", config=configs[r], faults=())
        for r in range(2)
        for t in range(2)
    ]
    nodes: list[cluster.HollowGpuNode] = []
    try:
        nodes = cluster.start_hollow_gpu_nodes(
            counterparts,
            tmp_path_factory.mktemp("hollow-fabric"),
            apiserver=control_plane.apiserver,
            specs=specs,
            labels={"gpuagent.dev/e2e-test": LABEL, "gpuagent.dev/hollow": "true"},
            timeout_s=WAIT_S,
        )
        cluster.wait_until(
            lambda: all(_labels(n).get(DOMAIN) and n.node.allocatable().get(GPU) == "4" for n in nodes),
            what="4 hollow trays with nvidia.com/gpu 4 and their NVLink domain label",
            timeout_s=WAIT_S,
        )
        yield [nodes[0:2], nodes[2:4]]
    finally:
        _stop_and_delete(api_client, nodes, [s.name for s in specs])


def _labels(node: cluster.HollowGpuNode) -> dict[str, str]:
    return dict(((node.node.node() or {}).get("metadata") or {}).get("labels") or {})


def _node_labels(obj: dict[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def _gpunode(api_client: Any, name: str) -> dict[str, Any]:
    from kubernetes import client

    obj: dict[str, Any] = client.CustomObjectsApi(api_client).get_cluster_custom_object(*GPUNODES, name)
    return obj


@pytest.fixture(scope="module")
def extender(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    trays: list[list[cluster.HollowGpuNode]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningExtender]:
    names = {n.name for rack in trays for n in rack}
    with extender_behind_scheduler(
        counterparts,
        control_plane,
        tmp_path_factory.mktemp("sched-fabric"),
        lambda s: names <= set(s.cache.nodes),
        what="the extender sees every tray",
    ) as ext:
        yield ext


def _last_create(node: cluster.HollowGpuNode, namespace: str, pod: str) -> dict[str, Any]:
    records = [r for r in node.node.records(pod=pod, namespace=namespace) if r["container"] == "main"]
    assert records, f"no CreateContainer recorded for {namespace}/{pod} on {node.name}"
    return records[-1]


def _bind(api_client: Any, namespace: str, name: str, node: cluster.HollowGpuNode) -> None:
    pod = gpu_pod(name, scheduler="none", label="")
    pod["spec"] = {k: v for k, v in pod["spec"].items() if k not in ("schedulerName", "nodeSelector")}
    pod["spec"]["nodeName"] = node.name
    create(api_client, namespace, [pod])


def test_the_cri_request_carries_the_imex_channel_by_envvar_and_by_cdi(
    api_client: Any, namespace: str, trays: list[list[cluster.HollowGpuNode]]
) -> None:
    envvar_tray, cdi_tray = trays[0][1], trays[1][1]
    _bind(api_client, namespace, "imex-env", envvar_tray)
    _bind(api_client, namespace, "imex-cdi", cdi_tray)
    for pod, node in (("imex-env", envvar_tray), ("imex-cdi", cdi_tray)):
        cluster.wait_until(
            lambda pod=pod, node=node: bool(node.node.records(pod=pod, namespace=namespace)),
            what=f"CreateContainer of {pod} on {node.name}",
            process=node.node.process,
            timeout_s=WAIT_S,
        )
    env = _last_create(envvar_tray, namespace, "imex-env")
    assert env["envs"]["NVIDIA_IMEX_CHANNELS"] == "0"
    assert not env["cdi_devices"]
    cdi = _last_create(cdi_tray, namespace, "imex-cdi")
    assert "gpuagent.dev/imex-channel=0" in cdi["cdi_devices"]
    assert sum(1 for d in cdi["cdi_devices"] if d.startswith("gpuagent.dev/gpu=")) == 4
    assert cdi["envs"]["NVIDIA_IMEX_CHANNELS"] == "0"
    # the IMEX daemon of each tray is published too
    assert _labels(envvar_tray)["gpuagent.dev/imex"] == "ready"
    assert _gpunode(api_client, envvar_tray.name)["status"]["imex"]["status"] == "READY"


def test_a_route_fault_withdraws_the_clique_and_the_extender_places_nvlink_subgroups_elsewhere(
    api_client: Any, namespace: str, trays: list[list[cluster.HollowGpuNode]], extender: RunningExtender
) -> None:
    for node in (n for rack in trays for n in rack):  # the last test's pods have let go of their GPUs
        cluster.wait_until(
            lambda node=node: not node.node.pod_resources().assignments,
            what=f"no devices held on {node.name}",
            timeout_s=WAIT_S,
        )
    # both racks are wholly free and alike: the planner breaks the tie by domain name, so the rack
    # whose domain sorts first is where the subgroup goes while its fabric is sound; the fault goes there
    first, other = sorted(trays, key=lambda rack: _labels(rack[0])[DOMAIN])
    sick = first[0]
    assert _labels(sick)[FABRIC_HEALTH] == "healthy"
    sick.agent.fault(event="fabric", gpu=1, conditions=["route_unhealthy"])
    try:
        cluster.wait_until(
            lambda: CLIQUE not in _labels(sick) and DOMAIN not in _labels(sick),
            what=f"{sick.name} leaves its NVLink domain",
            process=sick.agent.process,
            timeout_s=WAIT_S,
        )
        assert _labels(sick)[FABRIC_HEALTH] == "unhealthy"
        status = _gpunode(api_client, sick.name)["status"]
        assert {
            "gpu": 1,
            "level": "unhealthy",
            "conditions": ["route_unhealthy", "summary_unhealthy"],
        } in status["fabric"]
        assert "route_unhealthy" in status["summary"]["fabricReason"]
        # every GPU stays with kubelet: fabricUnhealthyMarksGpu is off by default
        assert sick.node.allocatable()[GPU] == "4"
        cluster.wait_until(
            lambda: extender.state(lambda s: CLIQUE not in _node_labels(s.cache.nodes.get(sick.name))),
            what="the extender sees the withdrawn label",
            timeout_s=WAIT_S,
        )
        create(api_client, namespace, gang("nvl", 2, LABEL))
        cluster.wait_until(
            lambda: len(bound(api_client, namespace, "nvl")) == 2,
            what="both pods of the 2-pod NVLink subgroup bound",
            timeout_s=WAIT_S,
        )
        placement = bound(api_client, namespace, "nvl")
        assert set(placement.values()) == {n.name for n in other}  # not the rack first by name
    finally:
        sick.agent.fault(event="fabric", gpu=1, conditions=[])
        cluster.wait_until(
            lambda: CLIQUE in _labels(sick) and DOMAIN in _labels(sick),
            what=f"{sick.name} back in its NVLink domain",
            process=sick.agent.process,
            timeout_s=WAIT_S,
        )
    assert _labels(sick)[FABRIC_HEALTH] == "healthy"
