"""End to end on a hollow GB200 NVL72 tray (issue 27, the health half): a real kubelet whose device
manager talks to ``gpu-node-agent run --simulate gb200-nvl72`` (see ``test_hollow_nodes.py`` for the
setup). Checked through ``Node.status`` and pod-resources, as a user's cluster sees it:

- a GPU that answers GPU_IS_LOST to every query without any event leaves the Node's allocatable, while
  the pod holding other GPUs keeps them (never re-created), and returns after a reset;
- after Xid 79, a GPU that answers again while its volatile uncorrectable ECC count keeps rising stays out
  well past the quiet period, and returns once a reset set the counters back to zero.

Needs root, like every hollow-node test.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from agent import localcluster as cluster
from tests.e2e.test_hollow_nodes import GPU, Pods, Simulated, held, pods, wait_idle, wait_status

pytestmark = pytest.mark.e2e

__all__ = ["pods"]  # the fixture, used by name

QUIET_S = 2  # health.recoveryQuietSeconds of the tray
TRAY = cluster.GpuNodeSpec(
    "hn-gb200-health",
    "gb200-nvl72:rack=5,tray=3",
    config={"health": {"recoveryQuietSeconds": QUIET_S, "probeIntervalSeconds": 0.2}},
    faults=(),
)


@pytest.fixture(scope="module")
def tray(hollow_gpu_nodes: Callable[..., list[cluster.HollowGpuNode]]) -> cluster.HollowGpuNode:
    (node,) = hollow_gpu_nodes(TRAY)
    wait_status(node, {GPU: 4})
    return node


def _bystander(tray: cluster.HollowGpuNode, pods: Pods) -> tuple[dict[str, set[str]], int, int]:
    """A pod holding two of the tray's GPUs; what it holds, its CreateContainer count, a GPU it does not
    hold (NVML index)."""
    wait_idle(tray)
    pods.create("bystander", tray, {GPU: 2})
    pods.wait_running("bystander", tray)
    before = held(tray, pod="bystander", namespace=pods.namespace)
    index = {g.uuid: g.index for g in Simulated(TRAY).inventory.gpus}
    free = min(set(index.values()) - {index[u] for u in before[GPU]})
    return before, len(tray.node.records(pod="bystander")), free


def _kept(tray: cluster.HollowGpuNode, pods: Pods, before: dict[str, set[str]], records: int) -> None:
    assert pods.phase("bystander") == "Running"
    assert held(tray, pod="bystander", namespace=pods.namespace) == before
    assert len(tray.node.records(pod="bystander")) == records  # never re-created


def test_a_gpu_lost_without_any_event_leaves_allocatable_and_the_other_pods_keep_theirs(
    tray: cluster.HollowGpuNode, pods: Pods
) -> None:
    before, records, bad = _bystander(tray, pods)
    tray.agent.fault(event="gpu_lost_silent", gpu=bad)
    wait_status(tray, {GPU: 3}, allocatable_only=True)
    assert tray.node.capacity()[GPU] == "4"  # still advertised, as Unhealthy
    _kept(tray, pods, before, records)
    time.sleep(2 * QUIET_S + 1)  # well past the quiet period: still out while it answers GPU_IS_LOST
    assert tray.node.allocatable()[GPU] == "3"
    tray.agent.fault(event="reset", gpu=bad)
    wait_status(tray, {GPU: 4})
    _kept(tray, pods, before, records)


def test_xid_79_with_rising_ecc_stays_out_past_the_quiet_period_and_returns_after_reset(
    tray: cluster.HollowGpuNode, pods: Pods
) -> None:
    before, records, bad = _bystander(tray, pods)
    tray.agent.fault(event="xid", gpu=bad, xid=79)
    wait_status(tray, {GPU: 3}, allocatable_only=True)
    tray.agent.fault(event="recover", gpu=bad)  # it answers again, without a reset
    deadline = time.monotonic() + 2 * QUIET_S + 2
    while time.monotonic() < deadline:  # the uncorrectable count keeps rising, no event says so
        tray.agent.fault(event="ecc_rising", gpu=bad)
        time.sleep(0.5)
    assert tray.node.allocatable()[GPU] == "3"
    _kept(tray, pods, before, records)
    tray.agent.fault(event="reset", gpu=bad)
    wait_status(tray, {GPU: 4})
    _kept(tray, pods, before, records)
