"""``demo`` publishes to the locally built control plane: GPUNodes by the agents, HyperNodes by the
controller, and the sample job planned from what the API server then holds; on hollow nodes (real
kubelets) the sample job's pods are bound by our extender, admitted and ``Running`` with their devices,
and the agents' metrics carry the pods' labels."""

from __future__ import annotations

import asyncio
import io
import os
import re
from pathlib import Path

import pytest

from agent import localcluster
from agent.commands.demo import DemoOptions, run_demo

pytestmark = pytest.mark.e2e


def test_demo_publishes_to_the_local_control_plane(
    counterparts: localcluster.Counterparts, tmp_path: Path
) -> None:
    try:
        counterparts.check(("etcd", "kube-apiserver"))
        counterparts.volcano_crds()
    except localcluster.MissingCounterpartError as exc:
        pytest.fail(f"control plane not built: {exc}")
    out = io.StringIO()
    options = DemoOptions(racks=1, dgx=1, once=True, out=tmp_path / "out", control_plane="on", hollow="off")
    code = asyncio.run(run_demo(options, stop=asyncio.Event(), out=out))
    text = out.getvalue()
    assert code == 0, text
    assert "Published to the local kube-apiserver https://127.0.0.1:" in text
    assert "19 GPUNodes and node labels by the agents" in text
    # one NVL72 rack and one DGX: two nvlink domains under a leaf each, spines, one core
    assert "HyperNodes by the controller" in text
    assert "nvlink nvl-node-dgx-h100-0: 1 nodes, 8 GPUs" in text
    # the busy trays of rack 0 leave no whole NVL72 domain: the planner says why
    assert "not placed:" in text
    assert "nvlink" in text.split("not placed:")[1]


def test_demo_runs_the_sample_job_on_hollow_nodes(
    counterparts: localcluster.Counterparts, tmp_path: Path
) -> None:
    try:
        counterparts.check(("etcd", "kube-apiserver", "kube-scheduler", localcluster.HOLLOW_NODE))
        counterparts.volcano_crds()
    except localcluster.MissingCounterpartError as exc:
        pytest.fail(f"control plane or hollow node not built: {exc}")
    if os.geteuid() != 0:
        pytest.skip("hollow nodes need root (a mount namespace per node)")
    out = io.StringIO()
    # 2 racks of 2 trays: the job (2 pods x 4 GPUs) fits one rack; no busy tray (t03) exists
    options = DemoOptions(racks=2, dgx=0, trays=2, once=True, out=tmp_path / "out", control_plane="on")
    code = asyncio.run(run_demo(options, stop=asyncio.Event(), out=out))
    text = out.getvalue()
    assert code == 0, text
    assert "Cluster: 4 hollow nodes (4 gb200-nvl72 trays in 2 NVL72 racks, 0 dgx-h100)" in text
    assert "nvidia.com/gpu allocatable 16 on 4 Nodes, advertised by our device plugins" in text
    assert "4 GPUNodes and node labels by the agents" in text
    rows = [line.split() for line in text.splitlines() if re.match(r"\s+llm-pretrain-\d\s", line)]
    assert [r[0] for r in rows] == ["llm-pretrain-0", "llm-pretrain-1"]
    assert all(r[1] == "Running" for r in rows)
    racks = {r[2].rsplit("-t", 1)[0] for r in rows}
    assert len(racks) == 1, rows  # one NVLink domain
    devices = [r[3].split(",") for r in rows]
    assert all(len(d) == 4 and all(x.startswith("GPU-") for x in d) for d in devices)
    assert "Metrics: 8 GPUs of the job carry their pod's labels" in text
    assert re.search(r'pod="llm-pretrain-\d"', text)
