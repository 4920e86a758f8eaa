"""``demo`` publishes to the locally built control plane: GPUNodes by the agents, HyperNodes by the
controller, and the sample job planned from what the API server then holds."""

from __future__ import annotations

import asyncio
import io
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
    options = DemoOptions(racks=1, dgx=1, once=True, out=tmp_path / "out", control_plane="on")
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
