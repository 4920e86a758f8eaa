"""The device plugin against the kubelet's REAL device manager (``dmharness``).

``gpu-node-agent run --simulate ...`` runs as its own process on the harness's socket folder, exactly
as in a cluster (its own plugin sockets next to ``kubelet.sock``). The harness's device manager does
the registration, ListAndWatch, GetPreferredAllocation and Allocate calls a kubelet makes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import localcluster as cluster
from tests.deviceplugin.helpers import inventory

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
GPU = "nvidia.com/gpu"


class Agent:
    """Our agent as a process, with its fault file."""

    def __init__(self, harness: cluster.DeviceManagerHarness, workdir: Path, *args: str) -> None:
        self.faults = workdir / "faults.jsonl"
        self.faults.write_text("")
        config = workdir / "agent.yaml"
        config.write_text(
            "version: v1\nhealth:\n  recoveryQuietSeconds: 1\n  probeIntervalSeconds: 0.2\n", encoding="utf-8"
        )
        argv = [
            sys.executable,
            "-m",
            "agent.cli",
            "run",
            "--kubelet-dir",
            str(harness.socket_dir),
            "--simulate-faults",
            str(self.faults),
            "--config",
            str(config),
            "--no-kube",
            "--metrics-addr",
            "",
            "--health-addr",
            "",
            "--log-format",
            "json",
            *args,
        ]
        self.process = cluster.ManagedProcess(
            "gpu-node-agent",
            argv,
            workdir / "logs" / "agent.log",
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        ).start()

    def fault(self, **event: Any) -> None:
        with self.faults.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(event) + "\n")

    def stop(self) -> None:
        self.process.stop()


def resource(harness: cluster.DeviceManagerHarness, name: str) -> dict[str, Any]:
    return dict(harness.resources()["resources"].get(name) or {})


def wait_allocatable(harness: cluster.DeviceManagerHarness, agent: Agent, name: str, count: int) -> None:
    cluster.wait_until(
        lambda: resource(harness, name).get("allocatable") == count,
        what=f"{name} allocatable {count} in the device manager",
        process=agent.process,
        timeout_s=60,
    )


@pytest.fixture
def h100_agent(device_manager: cluster.DeviceManagerHarness, tmp_path: Path) -> Iterator[Agent]:
    agent = Agent(device_manager, tmp_path, "--simulate", "dgx-h100")
    try:
        wait_allocatable(device_manager, agent, GPU, 8)
        yield agent
    finally:
        agent.stop()


def test_registration_counts_and_allocate(
    device_manager: cluster.DeviceManagerHarness, h100_agent: Agent
) -> None:
    uuids = {g.uuid for g in inventory("dgx-h100").gpus}
    state = resource(device_manager, GPU)
    assert state["capacity"] == 8
    assert set(state["healthy_devices"]) == uuids
    status, body = device_manager.allocate(GPU, 2, pod="train")
    assert status == 200, body
    assert len(body["device_ids"]) == 2
    assert set(body["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")) == set(body["device_ids"])
    assert resource(device_manager, GPU)["allocatable"] == 8  # allocatable counts healthy devices


def test_preferred_allocation_picks_nvlink_neighbours(
    device_manager: cluster.DeviceManagerHarness, tmp_path: Path
) -> None:
    inv = inventory("dgx1-v100")
    agent = Agent(device_manager, tmp_path, "--simulate", "dgx1-v100")
    try:
        wait_allocatable(device_manager, agent, GPU, 8)
        status, body = device_manager.allocate(GPU, 2, pod="pair")
        assert status == 200, body
        index = {g.uuid: g.index for g in inv.gpus}
        a, b = sorted(index[u] for u in body["device_ids"])
        assert inv.matrix is not None
        assert inv.matrix.connection(a, b).nvlinks == 2  # the best pair on the cube-mesh is an NV2 pair
    finally:
        agent.stop()


def test_health_propagates_and_recovers(
    device_manager: cluster.DeviceManagerHarness, h100_agent: Agent
) -> None:
    bad = inventory("dgx-h100").gpu(4).uuid
    h100_agent.fault(event="ecc_dbe", gpu=4)  # the DBE event and Xid 48: it needs a GPU reset
    cluster.wait_until(
        lambda: bad not in resource(device_manager, GPU)["healthy_devices"],
        what="GPU 4 unhealthy in the device manager",
        process=h100_agent.process,
    )
    state = resource(device_manager, GPU)
    assert (state["capacity"], state["allocatable"]) == (8, 7)
    h100_agent.fault(event="reset", gpu=4)
    wait_allocatable(device_manager, h100_agent, GPU, 8)  # reset seen, quiet for the recovery period: back


def test_kubelet_restart_reregisters(device_manager: cluster.DeviceManagerHarness, h100_agent: Agent) -> None:
    restarts = device_manager.restart()["restarts"]
    assert restarts >= 1
    wait_allocatable(device_manager, h100_agent, GPU, 8)
    status, body = device_manager.allocate(GPU, 1, pod="after-restart")
    assert status == 200, body


def test_mig_mixed_resources(device_manager: cluster.DeviceManagerHarness, tmp_path: Path) -> None:
    inv = inventory("dgx-a100-mig")
    per_profile: dict[str, int] = {}
    for mig in inv.mig_devices():
        name = f"nvidia.com/mig-{mig.profile}"
        per_profile[name] = per_profile.get(name, 0) + 1
    agent = Agent(device_manager, tmp_path, "--simulate", "dgx-a100-mig", "--mig-strategy", "mixed")
    try:
        for name, count in per_profile.items():
            wait_allocatable(device_manager, agent, name, count)
        status, body = device_manager.allocate("nvidia.com/mig-1g.10gb", 2, pod="mig")
        assert status == 200, body
        assert all(v.startswith("MIG-") for v in body["envs"]["NVIDIA_VISIBLE_DEVICES"].split(","))
        parents = {m.uuid: m.parent_uuid for m in inv.mig_devices()}
        assert len({parents[d] for d in body["device_ids"]}) == 1  # one parent GPU preferred
    finally:
        agent.stop()
