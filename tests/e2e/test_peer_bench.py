"""``gpu-node-agent bench deviceplugin --peer nvidia`` at a tiny size: both plugins measured in one run on
the same machine, the JSON report carries every figure, and what the run must show holds (ours returns a
GPU after Xid 79 and a reset, NVIDIA's does not; ours' preferred allocations are NVLink-optimal)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from agent import localcluster as cluster
from agent.peer import PEER_PLUGIN
from tests.e2e.conftest import REPO_ROOT, _require, _unavailable

pytestmark = pytest.mark.e2e

TINY = [
    "--peer", "nvidia", "--allocations", "10", "--preferred", "20", "--faults", "3", "--restarts", "2",
    "--idle-s", "0.5", "--storm-s", "0.5", "--storm-rate", "200", "--recovery-wait-s", "5", "--json",
]  # fmt: skip


def test_bench_peer_nvidia_runs_both_and_reports_every_figure(counterparts: cluster.Counterparts) -> None:
    _require(counterparts, PEER_PLUGIN)
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        _unavailable("NVIDIA's device plugin needs root and unshare (a mount namespace of its own)")
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "bench", "deviceplugin", *TINY],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["machine"].startswith("machine: ")
    assert report["profile"] == "dgx1-v100"
    ours, theirs = report["figures"]["ours"], report["figures"]["nvidia"]
    for figures in (ours, theirs):
        assert figures["registration_ms"] > 0
        assert figures["registration_cpu_ms"] is not None
        assert figures["registration_cpu_ms"] >= 0
        assert figures["idle"]["rss_bytes"] > 0
        assert figures["allocate"]["n"] == 10
        assert figures["preferred"]["total"] == 20
        assert figures["preferred"]["invalid"] == 0
        assert figures["reregister"]["n"] == 2
        assert figures["fault_unhealthy"]["n"] == 3
        assert figures["storm"]["events"] >= 50  # 200 a second for half a second, in 50 ms ticks
    assert ours["preferred"]["optimal"] == 20
    assert report["aims"]["preferred_optimal_ours"] is True
    # recovery: ours returns the reset GPU (all 8 Healthy); NVIDIA's keeps every GPU Unhealthy
    assert ours["recovery_ms"] is not None
    assert ours["healthy_after_xid79_reset"] == 8
    assert theirs["recovery_ms"] is None
    assert theirs["healthy_after_xid79_reset"] == 0
    assert report["aims"]["recovery"] is True
    assert set(report["aims"]) >= {
        "registration",
        "fault_unhealthy_p99",
        "reregister_p99",
        "allocate_p99",
        "rss",
    }
