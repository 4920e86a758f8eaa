"""Host-managed IMEX and the NVLinkDomain end to end on hollow GB200 trays (issue 29, items 1, 2, 6).

One rack of three ``gb200-nvl72`` hollow trays, each a real kubelet with one ``gpu-node-agent run
--simulate gb200-nvl72:rack=7,tray=T`` with ``imex.manage: true``: each agent watches its clique's
GPUNodes, writes its simulated daemon's peer list (its own loopback address first) and restarts it; the
simulated daemon listens on its address and is READY only when every listed peer answers. Our topology
controller runs against the same API server with Volcano's HyperNode CRD and our NVLinkDomain CRD. Checked:

- the quorum forms: every tray's ``gpuagent.dev/imex`` is ``ready``, the NVLinkDomain shows ``3/3`` and
  three ready trays, the tier-1 HyperNode carries ``gpuagent.dev/NVLinkDomainReady=True``;
- one tray's agent stops: within seconds the other trays' label says ``not-ready``, the NVLinkDomain's
  quorum and ready trays drop and the HyperNode's condition turns ``False`` naming the trays; the agent
  back, the quorum forms again.

Volcano's scheduler runs meanwhile against these HyperNodes (its CRD validates our condition).
Needs root, like every hollow-node test.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent import localcluster as cluster
from tests.e2e.conftest import REPO_ROOT
from topology.builder import SOURCE_LABEL, SOURCE_VALUE
from topology.controller import ControllerSettings, TopologyController
from topology.kube import HYPERNODES, NODES, Kube
from topology.nvlinkdomain import CONDITION_TYPE, NVLINKDOMAINS

pytestmark = pytest.mark.e2e

IMEX_LABEL = "gpuagent.dev/imex"
WAIT_S = 120.0  # generous: the CI machine has 2 cores shared by every process here
TRAYS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PORT = _free_port()  # the simulated daemons' SERVER_PORT, one for the rack (each on its own address)


def _spec(t: int) -> cluster.GpuNodeSpec:
    return cluster.GpuNodeSpec(
        f"hi-r7-t{t}",
        f"gb200-nvl72:rack=7,tray={t}",
        config={
            "imex": {"manage": True, "address": f"127.77.0.{t + 1}", "port": PORT},
            "health": {"probeIntervalSeconds": 0.2},
        },
        faults=(),
    )


@pytest.fixture(scope="module")
def rack(
    hollow_gpu_nodes: Callable[..., list[cluster.HollowGpuNode]], api_client: Any
) -> list[cluster.HollowGpuNode]:
    cluster.apply_crds(
        api_client, cluster.load_yaml_documents([REPO_ROOT / "daemonset" / "crds" / "nvlinkdomain.yaml"])
    )
    return hollow_gpu_nodes(*(_spec(t) for t in range(TRAYS)))


@pytest.fixture(scope="module")
def controller(
    rack: list[cluster.HollowGpuNode], api_client: Any, volcano_crds: list[str]
) -> Iterator[TopologyController]:
    kube = Kube(api_client)
    c = TopologyController(
        kube=kube,
        settings=ControllerSettings(
            identity="hollow-imex", debounce_s=0.2, max_delay_s=1.0, watch_timeout_s=5
        ),
    )
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(c.run(stop)), daemon=True)
    thread.start()
    try:
        yield c
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()
        items, _ = kube.list(HYPERNODES, label_selector=f"{SOURCE_LABEL}={SOURCE_VALUE}")
        for o in items:
            kube.delete(f"{HYPERNODES}/{o['metadata']['name']}")
        for o in kube.list(NVLINKDOMAINS)[0]:
            kube.delete(f"{NVLINKDOMAINS}/{o['metadata']['name']}")


def _labels(kube: Kube, rack: list[cluster.HollowGpuNode]) -> dict[str, str | None]:
    return {
        n.name: (kube.get(f"{NODES}/{n.name}")["metadata"].get("labels") or {}).get(IMEX_LABEL) for n in rack
    }


def _domain(kube: Kube, rack: list[cluster.HollowGpuNode]) -> dict[str, Any] | None:
    names = {n.name for n in rack}
    for o in kube.list(NVLINKDOMAINS)[0]:
        if set((o.get("status") or {}).get("members") or ()) == names:
            return o
    return None


def _condition(kube: Kube, name: str) -> dict[str, Any] | None:
    try:
        hn = kube.get(f"{HYPERNODES}/{name}")
    except Exception:
        return None
    return next(
        (c for c in (hn.get("status") or {}).get("conditions") or () if c["type"] == CONDITION_TYPE), None
    )


def _quorum_formed(kube: Kube, rack: list[cluster.HollowGpuNode]) -> None:
    cluster.wait_until(
        lambda: set(_labels(kube, rack).values()) == {"ready"},
        what="every tray's gpuagent.dev/imex=ready",
        timeout_s=WAIT_S,
    )
    cluster.wait_until(
        lambda: (
            ((_domain(kube, rack) or {}).get("status") or {}).get("imex", {}).get("quorum")
            == f"{TRAYS}/{TRAYS}"
        ),
        what=f"the NVLinkDomain's IMEX quorum {TRAYS}/{TRAYS}",
        timeout_s=WAIT_S,
    )
    d = _domain(kube, rack)
    assert d is not None
    cluster.wait_until(
        lambda: (_condition(kube, d["metadata"]["name"]) or {}).get("status") == "True",
        what="the HyperNode's NVLinkDomainReady condition True",
        timeout_s=WAIT_S,
    )


@pytest.mark.usefixtures("controller", "volcano")  # Volcano's scheduler runs against these HyperNodes
def test_imex_quorum_forms_on_a_rack_and_breaks_when_one_trays_agent_stops(
    rack: list[cluster.HollowGpuNode], api_client: Any
) -> None:
    kube = Kube(api_client)
    _quorum_formed(kube, rack)
    domain = _domain(kube, rack)
    assert domain is not None
    st = domain["status"]
    assert (st["trays"], st["readyTrays"], st["largestSubgroup"], st["phase"]) == (
        TRAYS,
        TRAYS,
        TRAYS,
        "Ready",
    )
    assert st["gpus"] == {"total": 4 * TRAYS, "healthy": 4 * TRAYS, "free": 4 * TRAYS, "stranded": 0}
    # the peer list each agent applied last: its own address first, then the others sorted
    for t, n in enumerate(rack):
        applied = [
            json.loads(x) for x in n.agent.log_path.read_text().splitlines() if "imex_peers_applied" in x
        ]
        own = f"127.77.0.{t + 1}"
        assert applied[-1]["peer_list"] == [own, *sorted({f"127.77.0.{i + 1}" for i in range(TRAYS)} - {own})]

    gone = rack[-1]
    started = time.monotonic()
    gone.agent.stop()
    others = rack[:-1]
    cluster.wait_until(
        lambda: {_labels(kube, rack)[n.name] for n in others} == {"not-ready"},
        what="the other trays' gpuagent.dev/imex=not-ready",
        timeout_s=WAIT_S,
    )
    labels_s = time.monotonic() - started
    cluster.wait_until(
        lambda: (_condition(kube, domain["metadata"]["name"]) or {}).get("status") == "False",
        what="the HyperNode's condition False",
        timeout_s=WAIT_S,
    )
    survivors = {n.name for n in others}

    def survivors_unready() -> bool:  # each survivor's GPUNode reaches the controller on its own publish
        status = (_domain(kube, rack) or {}).get("status") or {}
        return {d["node"] for d in status.get("degraded") or () if not d["ready"]} >= survivors

    cluster.wait_until(survivors_unready, what="every other tray unready in the domain", timeout_s=WAIT_S)
    st = (_domain(kube, rack) or {})["status"]
    domain_s = time.monotonic() - started
    print(
        f"one agent stopped: labels after {labels_s:.1f} s, NVLinkDomain and HyperNode after {domain_s:.1f} s"
    )
    assert st["imex"]["quorum"] != f"{TRAYS}/{TRAYS}"
    assert st["readyTrays"] < TRAYS
    assert {d["node"] for d in st["degraded"] if not d["ready"]} >= survivors
    assert "IMEX WAITING_FOR_PEERS" in (_condition(kube, domain["metadata"]["name"]) or {})["message"]

    gone.agent.start()
    _quorum_formed(kube, rack)
