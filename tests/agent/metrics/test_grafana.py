"""The Grafana dashboard in daemonset/grafana queries only metrics the native rendering publishes, and
every query is valid PromQL (checked by promtool)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.metrics.native import ScrapeStats, render_native
from agent.metrics.snapshot import AgentStats
from tests.agent.metrics.render_helpers import samples, to_text
from tests.agent.metrics.scenario import scenario

DASHBOARD = Path(__file__).resolve().parents[3] / "daemonset" / "grafana" / "gpu-node-agent.json"


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _exprs() -> list[str]:
    d = _dashboard()
    out = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    out += [v["definition"] for v in d["templating"]["list"] if "definition" in v]
    return out


def _published_families() -> set[str]:
    agent = AgentStats(
        discovery_duration_seconds=1, registrations=1, registered=(("r", True),), kubelet_restarts=0
    )
    text = to_text(render_native(scenario(), agent, ScrapeStats(1, 0.1), "v"))
    names = {n for n, _, _ in samples(text)}
    return names | {n.removesuffix("_count").removesuffix("_sum") for n in names}


def test_panels_are_well_formed() -> None:
    d = _dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    assert d["uid"] == "gpuagent-node"
    for p in d["panels"]:
        assert set(p["gridPos"]) == {"h", "w", "x", "y"}
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] != "row":
            assert p["targets"], p["title"]
            assert p["datasource"]["uid"] == "${datasource}"


def test_every_query_uses_published_native_metrics() -> None:
    published = _published_families()
    used = {m for e in _exprs() for m in re.findall(r"\b(gpuagent_[a-z0-9_]+)\b", e)}
    assert used, "the dashboard queries nothing"
    assert used <= published, sorted(used - published)


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.fail("promtool not found: install the Debian package 'prometheus' (.ci/system-packages.txt)")
    rules = [
        {"record": f"dashboard:query_{i}", "expr": re.sub(r"\$\{?\w+\}?", ".*", e)}
        for i, e in enumerate(_exprs())
        if not e.startswith("label_values(")
    ]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
