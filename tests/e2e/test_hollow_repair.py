"""Placement on ready trays and repair inside the domain, end to end on hollow GB200 trays (issue 29,
items 3, 5 and 6).

Two racks of three ``gb200-nvl72`` hollow trays, each a real kubelet (``counterparts/hollownode``) with
one ``gpu-node-agent run --simulate gb200-nvl72:rack=R,tray=T --simulate-faults F`` managing its
simulated IMEX daemon (``imex.manage: true``: the daemon is READY only when every tray of its clique
answers), behind kube-scheduler with our extender. Checked:

- IMEX not ready: one tray's agent stops, so its rack's other trays say ``gpuagent.dev/imex=not-ready``;
  with the other rack full, a 2-pod NVLink subgroup (``gpuagent.dev/mnnvl`` by default ``required``: an
  ``nvlink`` subgroup tier on fabric-attached trays) binds nowhere and its Event says why; the agent
  back, the quorum forms and the gang binds in that rack. (The barrier's own wait, a tray whose IMEX
  drops between plan and bind, is timed by the unit tests: here it would be a race.)
- Repair: a 4-pod gang in subgroups of 2 runs one subgroup per rack, each rack keeping one spare tray;
  a route fault takes one tray of the rack whose domain sorts last out of its NVLink domain, its pod is
  deleted and made again (what the job's controller does), and the replacement binds on the spare tray of
  that same rack (a plan blind to where the rest of the subgroup runs takes the other rack's spare,
  first by name); no other pod of the gang moves.
"""

from __future__ import annotations

import os
import socket
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
    events,
    extender_behind_scheduler,
    gang,
    gpu_pod,
    held,
    settled,
)

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
SCHEDULER = "gpu-topology-scheduler"
DOMAIN = "gpuagent.dev/nvlink-domain"
IMEX = "gpuagent.dev/imex"
WAIT_S = 120.0  # generous: the CI machine has 2 cores shared by every process here
LABEL = "hollow-repair"
RACKS, TRAYS = 2, 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    ports = [_free_port() for _ in range(RACKS)]
    specs = [
        cluster.GpuNodeSpec(
            f"hr-r{r}-t{t}",
            f"gb200-nvl72:rack={r},tray={t}",
            config={
                "imex": {"manage": True, "address": f"127.79.{r}.{t + 1}", "port": ports[r]},
                "health": {"probeIntervalSeconds": 0.2},
            },
            faults=(),
        )
        for r in range(RACKS)
        for t in range(TRAYS)
    ]
    nodes: list[cluster.HollowGpuNode] = []
    try:
        nodes = cluster.start_hollow_gpu_nodes(
            counterparts,
            tmp_path_factory.mktemp("hollow-repair"),
            apiserver=control_plane.apiserver,
            specs=specs,
            labels={"gpuagent.dev/e2e-test": LABEL, "gpuagent.dev/hollow": "true"},
            timeout_s=WAIT_S,
        )
        racks = [nodes[r * TRAYS : (r + 1) * TRAYS] for r in range(RACKS)]
        _all_ready(nodes)
        yield racks
    finally:
        _stop_and_delete(api_client, nodes, [s.name for s in specs])


def _labels(node: cluster.HollowGpuNode) -> dict[str, str]:
    return dict(((node.node.node() or {}).get("metadata") or {}).get("labels") or {})


def _all_ready(nodes: list[cluster.HollowGpuNode]) -> None:
    cluster.wait_until(
        lambda: all(
            _labels(n).get(DOMAIN)
            and _labels(n).get(IMEX) == "ready"
            and n.node.allocatable().get(GPU) == "4"
            for n in nodes
        ),
        what=f"{len(nodes)} hollow trays with 4 GPUs, their NVLink domain and IMEX ready",
        timeout_s=WAIT_S,
    )


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
        tmp_path_factory.mktemp("sched-repair"),
        lambda s: names <= set(s.cache.nodes),
        what="the extender sees every tray",
    ) as ext:
        yield ext


def _occupy(api_client: Any, namespace: str, name: str, node: cluster.HollowGpuNode) -> None:
    pod = gpu_pod(name, scheduler="none", label="")
    pod["spec"] = {k: v for k, v in pod["spec"].items() if k not in ("schedulerName", "nodeSelector")}
    pod["spec"]["nodeName"] = node.name
    create(api_client, namespace, [pod])


def _sorted_by_domain(trays: list[list[cluster.HollowGpuNode]]) -> list[list[cluster.HollowGpuNode]]:
    return sorted(trays, key=lambda rack: _labels(rack[0])[DOMAIN])


def test_a_gang_binds_only_once_its_racks_imex_is_ready(
    api_client: Any, namespace: str, trays: list[list[cluster.HollowGpuNode]], extender: RunningExtender
) -> None:
    full, flaky = _sorted_by_domain(trays)
    for i, node in enumerate(full[:2]):  # the other rack keeps one free tray: no room for 2 pods there
        _occupy(api_client, namespace, f"busy-{i}", node)
    gone = flaky[-1]
    gone.agent.stop()
    try:
        cluster.wait_until(
            lambda: {_labels(n).get(IMEX) for n in flaky[:-1]} == {"not-ready"},
            what="the rack's other trays gpuagent.dev/imex=not-ready",
            timeout_s=WAIT_S,
        )
        cluster.wait_until(
            lambda: extender.state(
                lambda s: all(
                    ((s.cache.nodes.get(n.name) or {}).get("metadata") or {}).get("labels", {}).get(IMEX)
                    == "not-ready"
                    for n in flaky[:-1]
                )
            ),
            what="the extender sees the unready trays",
            timeout_s=WAIT_S,
        )
        create(api_client, namespace, gang("mn", 2, LABEL))
        cluster.wait_until(
            lambda: any(
                "not ready" in (e.message or "") for e in events(api_client, namespace, "GangUnschedulable")
            ),
            what="a GangUnschedulable Event naming the unready trays",
            timeout_s=WAIT_S,
        )
        assert bound(api_client, namespace, "mn") == {}
    finally:
        gone.agent.start()
    _all_ready(flaky)
    cluster.wait_until(
        lambda: len(bound(api_client, namespace, "mn")) == 2,
        what="both pods bound once the quorum formed",
        timeout_s=WAIT_S,
    )
    assert set(bound(api_client, namespace, "mn").values()) <= {n.name for n in flaky}


def test_a_failed_trays_replacement_goes_to_the_spare_tray_of_the_same_rack(
    api_client: Any, namespace: str, trays: list[list[cluster.HollowGpuNode]], extender: RunningExtender
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    everything = [n for rack in trays for n in rack]
    for node in everything:  # the kubelets let go of the earlier test's pods
        cluster.wait_until(
            settled(lambda node=node: not held(node)),
            what=f"no devices held on {node.name}",
            timeout_s=WAIT_S,
        )
    _all_ready(everything)
    pods = {p["metadata"]["name"]: p for p in _subgroups_of_two("rp", 4)}
    create(api_client, namespace, list(pods.values()))
    cluster.wait_until(
        lambda: len(bound(api_client, namespace, "rp")) == 4, what="the 4-pod gang bound", timeout_s=WAIT_S
    )
    before = bound(api_client, namespace, "rp")
    _, last = _sorted_by_domain(trays)
    on_last = sorted(p for p, n in before.items() if n in {t.name for t in last})
    assert len(on_last) == 2  # one subgroup per rack, one spare tray each
    victim = on_last[0]
    sick = next(t for t in last if t.name == before[victim])
    spare = next(t for t in last if t.name not in before.values())
    sick.agent.fault(event="fabric", gpu=1, conditions=["route_unhealthy"])
    try:
        cluster.wait_until(
            lambda: DOMAIN not in _labels(sick),
            what=f"{sick.name} leaves its NVLink domain",
            process=sick.agent.process,
            timeout_s=WAIT_S,
        )
        # the job's controller: the pod on the failed tray goes and is made again, same rank
        core.delete_namespaced_pod(victim, namespace, grace_period_seconds=0)
        cluster.wait_until(
            lambda: victim not in bound(api_client, namespace, "rp"),
            what="the lost pod gone",
            timeout_s=WAIT_S,
        )
        create(api_client, namespace, [pods[victim]])
        cluster.wait_until(
            lambda: victim in bound(api_client, namespace, "rp"),
            what="the replacement bound",
            timeout_s=WAIT_S,
        )
        cluster.wait_until(
            lambda: any(
                f"/{victim} bound on" in (e.message or "")
                for e in events(api_client, namespace, "GangRepaired")
            ),
            what="a GangRepaired Event for the replacement",
            timeout_s=WAIT_S,
        )
        after = bound(api_client, namespace, "rp")
        assert after[victim] == spare.name  # the same rack's spare, not the other rack's (first by name)
        assert {p: n for p, n in after.items() if p != victim} == {
            p: n for p, n in before.items() if p != victim
        }
    finally:
        sick.agent.fault(event="fabric", gpu=1, conditions=[])
        cluster.wait_until(
            lambda: DOMAIN in _labels(sick),
            what=f"{sick.name} back in its NVLink domain",
            process=sick.agent.process,
            timeout_s=WAIT_S,
        )


def _subgroups_of_two(name: str, n: int) -> list[dict[str, Any]]:
    """``gang`` with subgroups of 2 pods (``n`` pods): one subgroup per rack of 3 trays."""
    pods = gang(name, n, LABEL)
    for p in pods:
        p["metadata"]["annotations"]["gpuagent.dev/subgroup-size"] = "2"
    return pods
