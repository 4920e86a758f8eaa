"""NVIDIA's device plugin and ours side by side, each on its own hollow node over the same machine (issue 30).

Per case two hollow nodes (real kubelets with the real device manager) join the shared API server: one runs
``gpu-node-agent run`` (no ``--simulate``: its real NVML path), the other NVIDIA's ``nvidia-device-plugin``
v0.19 unmodified; both load the C NVML stand-in with the same machine description and the same plugin config
(``version: v1``: ``flags.migStrategy``, ``sharing.timeSlicing``, ``imex.channelIDs``) — see
:mod:`agent.peer`. Asserted:

- the resources and their counts in ``Node.status`` (capacity and allocatable) are equal, and so are the
  device IDs the kubelet holds for each resource (pod-resources ``GetAllocatableResources``);
- the same ``Allocate`` sent to each plugin's socket answers the same ``NVIDIA_VISIBLE_DEVICES``, and with
  IMEX channel 0 configured the same ``NVIDIA_IMEX_CHANNELS``;
- the same fault script on both (:func:`test_the_same_fault_script_on_both`): what each kubelet then
  allocates, side by side, where ours must be the same or better. The differences are named there
  (:data:`FAULT_SCRIPT`); README.md ("Coming from NVIDIA's device plugin") says which is right and why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent import localcluster as cluster
from agent import peer
from tests.e2e.conftest import _require, _unavailable

pytestmark = pytest.mark.e2e

WAIT_S = 60.0
GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class Case:
    profile: str
    mig_strategy: str = "none"
    replicas: int = 1
    imex_channel: bool = False
    expected: dict[str, int] = field(default_factory=dict)  # resources both must list, with counts


CASES: dict[str, Case] = {
    "dgx-h100": Case("dgx-h100", expected={GPU: 8}),
    "dgx-a100-mig-mixed": Case(
        "dgx-a100-mig",
        mig_strategy="mixed",
        expected={
            GPU: 4,
            "nvidia.com/mig-1g.10gb": 9,
            "nvidia.com/mig-2g.20gb": 2,
            "nvidia.com/mig-3g.40gb": 3,
            "nvidia.com/mig-4g.40gb": 1,
        },
    ),
    "gb200-nvl72-imex": Case("gb200-nvl72:rack=1,tray=3", imex_channel=True, expected={GPU: 4}),
    "dgx1-v100": Case("dgx1-v100", expected={GPU: 8}),
    "pcie-l40s-time-slicing": Case("pcie-l40s", replicas=3, expected={GPU: 12}),
}


@pytest.fixture(scope="module")
def nvidia_plugin(counterparts: cluster.Counterparts) -> Path:
    _require(counterparts, "hollownode", peer.PEER_PLUGIN)
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        _unavailable("hollow nodes and NVIDIA's device plugin need root and unshare (mount namespaces)")
    return counterparts.binary(peer.PEER_PLUGIN)


@pytest.fixture(scope="module")
def stand_in_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return peer.build_stand_in(tmp_path_factory.mktemp("peer-hollow-nvmlstub"))
    except peer.StandInUnavailableError as exc:
        _unavailable(str(exc))
        raise


@dataclass
class Pair:
    """The two hollow nodes of one case, with NVIDIA's plugin on one and our agent on the other."""

    stand_in: peer.StandIn
    ours: cluster.HollowNode
    theirs: cluster.HollowNode
    agent: cluster.NodeAgent
    plugin: cluster.ManagedProcess

    def nvidia_log(self) -> str:
        return self.plugin.log_path.read_text(encoding="utf-8", errors="replace")


def _nvidia_resources(node: cluster.HollowNode, key: str) -> dict[str, int]:
    status = ((node.node() or {}).get("status") or {}).get(key) or {}
    return {k: int(v) for k, v in status.items() if k.startswith("nvidia.com/")}


def _allocatable_is(node: cluster.HollowNode, want: dict[str, int]) -> Callable[[], bool]:
    return lambda: _nvidia_resources(node, "allocatable") == want


@pytest.fixture
def start_pair(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    api_client: Any,
    nvidia_plugin: Path,
    stand_in_library: Path,
) -> Iterator[Callable[[Case], Pair]]:
    """``start(case)`` -> both nodes Ready and both plugins' resources in ``Node.status``; everything is
    stopped and the Nodes deleted at the end of the test."""
    started: list[cluster.ManagedProcess | cluster.NodeAgent | cluster.HollowNode] = []
    names: list[str] = []
    # short: unix socket paths under it must fit in 107 bytes
    tmp_path = Path(tempfile.mkdtemp(prefix="peer", dir="/tmp"))

    def start(case: Case) -> Pair:
        stand_in = peer.StandIn(
            case.profile, library_dir=stand_in_library, directory=tmp_path / "machine",
            imex_channel=case.imex_channel,
        )  # fmt: skip
        tag = re.sub(r"[^a-z0-9]+", "-", case.profile.lower()).strip("-")
        ours_name, theirs_name = f"peer-ours-{tag}", f"peer-nvidia-{tag}"
        names.extend([ours_name, theirs_name])
        labels = {"gpuagent.dev/e2e-test": "peer-hollow"}
        ours, theirs = cluster.start_hollow_nodes(
            counterparts, tmp_path, apiserver=control_plane.apiserver, names=[ours_name, theirs_name],
            labels=labels,
        )  # fmt: skip
        started.extend([ours, theirs])
        config = peer.plugin_config(
            mig_strategy=case.mig_strategy, replicas=case.replicas, imex_channel=case.imex_channel
        )
        port = cluster.free_port()
        argv = peer.our_agent_argv(
            stand_in=stand_in,
            node_name=ours_name,
            plugin_dir=ours.device_plugins_dir,
            config_file=peer.write_config(tmp_path / "ours.json", peer.our_config(config)),
            pod_resources_socket=ours.pod_resources_socket,
            metrics_addr=f"127.0.0.1:{port}",
        )
        agent = cluster.NodeAgent(
            ours_name, tuple(argv), tmp_path / "logs" / "agent.log", port, None, None,
            env=stand_in.env(stand_in.control("ours"), base=cluster.AGENT_ENV),
        )  # fmt: skip
        started.append(agent)
        plugin = cluster.ManagedProcess(
            f"{peer.PEER_PLUGIN}[{theirs_name}]",
            peer.nvidia_plugin_argv(
                nvidia_plugin,
                stand_in=stand_in,
                plugin_dir=theirs.device_plugins_dir,
                config_file=peer.write_config(tmp_path / "nvidia.json", config),
            ),
            tmp_path / "logs" / "nvidia-device-plugin.log",
            stand_in.env(stand_in.control("nvidia")),
        )
        started.append(plugin)
        agent.start(timeout_s=WAIT_S)
        plugin.start()
        for node, process in ((ours, agent.process), (theirs, plugin)):
            cluster.wait_until(
                _allocatable_is(node, case.expected),
                what=f"{node.name}: {case.expected} allocatable",
                process=process,
                timeout_s=WAIT_S,
            )
        return Pair(stand_in, ours, theirs, agent, plugin)

    try:
        yield start
    finally:
        for thing in reversed(started):
            thing.stop()
        cluster.delete_nodes(api_client, names)
        shutil.rmtree(tmp_path, ignore_errors=True)


def _allocatable_ids(node: cluster.HollowNode) -> dict[str, set[str]]:
    snapshot = node.pod_resources()
    out: dict[str, set[str]] = {}
    for device in snapshot.allocatable or ():
        out.setdefault(device.resource, set()).add(device.device_id)
    return out


def _allocate(node: cluster.HollowNode, resource: str, ids: list[str]) -> dict[str, str]:
    """One ``Allocate`` for one container on the plugin's own socket; the container's envs."""
    from deviceplugin.api import deviceplugin_pb2 as pb
    from deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc

    socket = node.device_plugins_dir / f"nvidia-{resource.removeprefix('nvidia.com/')}.sock"
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        reply = pb_grpc.DevicePluginStub(channel).Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=10
        )
    (container,) = reply.container_responses
    return dict(container.envs)


@pytest.mark.parametrize("name", list(CASES))
def test_same_resources_device_ids_and_allocate(start_pair: Callable[[Case], Pair], name: str) -> None:
    case = CASES[name]
    pair = start_pair(case)

    for key in ("capacity", "allocatable"):
        ours, theirs = _nvidia_resources(pair.ours, key), _nvidia_resources(pair.theirs, key)
        assert ours == theirs == case.expected, f"Node.status.{key} (ours, NVIDIA's)"

    ours_ids, theirs_ids = _allocatable_ids(pair.ours), _allocatable_ids(pair.theirs)
    assert ours_ids == theirs_ids, "device IDs the kubelet holds per resource (ours, NVIDIA's)"
    assert {r: len(ids) for r, ids in ours_ids.items() if r in case.expected} == case.expected

    for resource in sorted(case.expected):
        ids = sorted(ours_ids[resource])
        request = ids[:1] if len(ids) < 2 else [ids[-1], ids[0]]  # out of order: neither may sort them
        if case.replicas > 1:  # two replicas of one GPU: one device each way
            request = [i for i in ids if i.endswith("::0")][:1] + [i for i in ids if i.endswith("::1")][:1]
        ours_env, theirs_env = (
            _allocate(pair.ours, resource, request),
            _allocate(pair.theirs, resource, request),
        )
        compared = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_IMEX_CHANNELS")
        ours_seen = {k: ours_env.get(k) for k in compared}
        theirs_seen = {k: theirs_env.get(k) for k in compared}
        assert ours_seen == theirs_seen, f"{resource}: Allocate({request}) envs (ours, NVIDIA's)"
        visible = ours_seen["NVIDIA_VISIBLE_DEVICES"] or ""
        assert visible
        assert set(visible.split(",")) == {i.split("::")[0] for i in request}
        assert ours_seen["NVIDIA_IMEX_CHANNELS"] == ("0" if case.imex_channel else None)


@dataclass(frozen=True)
class Step:
    what: str
    events: tuple[dict[str, Any], ...]
    ours: int  # nvidia.com/gpu allocatable on our node afterwards
    theirs: int  # ... on NVIDIA's


FAULT_SCRIPT: tuple[Step, ...] = (
    Step(
        # the ignored Xid comes first in the same event stream: when the DBE (Xid 48) on GPU 2 has reached
        # a kubelet, so has the Xid 43 on GPU 1 before it, and GPU 1 is still allocatable on both
        "Xid 43 on GPU 1 (ignored by both), then a double-bit ECC error on GPU 2: only GPU 2 leaves",
        ({"event": "xid", "gpu": 1, "xid": 43}, {"event": "ecc_dbe", "gpu": 2}),
        ours=7,
        theirs=7,
    ),
    Step(
        # no event says so; ours probes every GPU; NVIDIA's plugin only waits for events
        "GPU 3 lost without an event: ours withdraws it, NVIDIA's keeps offering it",
        ({"event": "gpu_lost_silent", "gpu": 3},),
        ours=6,
        theirs=7,
    ),
    Step(
        # NVIDIA's event wait answers GPU_IS_LOST after the Xid 79; it marks every device of the resource
        "Xid 79 on GPU 4: ours withdraws GPU 4, NVIDIA's withdraws every GPU of the node",
        ({"event": "xid", "gpu": 4, "xid": 79},),
        ours=5,
        theirs=0,
    ),
    Step(
        # NVIDIA's plugin has no way back from Unhealthy; ours returns a GPU on evidence of a reset
        "GPUs 2, 3 and 4 reset: ours returns all three, NVIDIA's none until it restarts",
        ({"event": "reset", "gpu": 2}, {"event": "reset", "gpu": 3}, {"event": "reset", "gpu": 4}),
        ours=8,
        theirs=0,
    ),
)
"""The fault script and what each kubelet allocates after each step (a dgx-h100, 8 GPUs)."""


def test_the_same_fault_script_on_both(start_pair: Callable[[Case], Pair]) -> None:
    pair = start_pair(Case("dgx-h100", expected={GPU: 8}))
    observed: list[tuple[str, int, int]] = []
    for step in FAULT_SCRIPT:
        for event in step.events:
            pair.stand_in.fault(event)
        for node, process, want in (
            (pair.ours, pair.agent.process, step.ours),
            (pair.theirs, pair.plugin, step.theirs),
        ):
            try:
                cluster.wait_until(
                    _allocatable_is(node, {GPU: want}),
                    what=f"{node.name}: {want} GPUs allocatable after: {step.what}",
                    process=process,
                    timeout_s=WAIT_S,
                )
            except cluster.StartupError as exc:
                pytest.fail(f"{exc}\nso far (step, ours, NVIDIA's): {json.dumps(observed)}")
        ours = _nvidia_resources(pair.ours, "allocatable").get(GPU, 0)
        theirs = _nvidia_resources(pair.theirs, "allocatable").get(GPU, 0)
        observed.append((step.what, ours, theirs))
        assert ours >= theirs or step.theirs > step.ours, step.what  # ours the same or better
        capacity = (_nvidia_resources(pair.ours, "capacity"), _nvidia_resources(pair.theirs, "capacity"))
        assert capacity == ({GPU: 8}, {GPU: 8}), "an unhealthy device leaves allocatable, never capacity"
    log = pair.nvidia_log()
    # NVIDIA's own words for what it did (its log), so the differences above are its decisions
    assert re.search(r"Skipping event .*EventData:43", log), "NVIDIA's plugin did not see the Xid 43"
    assert "Marking all devices as unhealthy" in log
    assert len(observed) == len(FAULT_SCRIPT)


def test_the_stand_in_serves_both_from_one_control_line(stand_in_library: Path, tmp_path: Path) -> None:
    """A fault is one control line appended to every process's control file (nothing else differs)."""
    stand_in = peer.StandIn("dgx-h100", library_dir=stand_in_library, directory=tmp_path)
    ours, theirs = stand_in.control("ours"), stand_in.control("nvidia")
    line = stand_in.fault({"event": "xid", "gpu": 4, "xid": 79})
    assert ours.read_text() == theirs.read_text() == line + "\n"
    assert line.split("\t")[:3] == ["xid", "4", "79"]
    assert (stand_in_library / peer.LIBRARY).is_file()
