"""``gpu-node-agent bench placement`` end to end: JSON, Markdown and PNG, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler_plugin.placement import bench
from scheduler_plugin.placement.metrics import FIGURES

POLICY_KEYS = {"ours", "volcano", "kueue", "kai", "slurm", "kube-default", "optimum"}


def test_quick_run_writes_json_markdown_and_png(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    out = {k: tmp_path / f"place.{k}" for k in ("json", "md", "png")}
    code = bench.main(
        ["--quick", "--json", str(out["json"]), "--markdown", str(out["md"]), "--plot", str(out["png"])]
    )
    assert code == 0
    doc = json.loads(out["json"].read_text())
    assert set(doc["policies"]) == POLICY_KEYS
    for name, figs in doc["policies"].items():
        assert set(FIGURES) <= set(figs), name
    for name in POLICY_KEYS - {"optimum"}:
        assert doc["policies"][name]["gpus_conserved"] is True
        assert doc["policies"][name]["plan_p99_ms"] >= doc["policies"][name]["plan_p50_ms"] > 0
    assert doc["policies"]["ours"]["nvlink_local_ratio"] == 1.0
    assert 0 < doc["policies"]["optimum"]["allocation_ratio"] <= 1
    assert doc["machine"].startswith("machine: ")
    md = out["md"].read_text()
    assert "| kube-default |" in md
    assert "FIFO with EASY backfill" in md
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert doc["seeds"] == [1]
    assert doc["policies"]["ours"]["per_seed"][0]["seed"] == 1
    captured = capfd.readouterr()  # fd level: the simulations run in worker processes
    assert "| ours |" in captured.out
    assert "simulating ours" in captured.err
    assert "machine: " in captured.err


def test_philly_workload_says_runtimes_are_sampled(
    philly_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = bench.main(
        [
            "--quick",
            "--workload",
            "philly",
            "--data-dir",
            str(philly_dir),
            "--policies",
            "ours,kube-default",
            "--optimum-instances",
            "0",
            "--seeds",
            "2",
            "--workers",
            "1",
            "--jobs",
            "300",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "runtimes SAMPLED" in out
    assert "means over seeds 1..2" in out


def test_reserve_backfill_is_recorded_and_explained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "reserve.json"
    argv = ["--quick", "--backfill", "reserve", "--policies", "ours,kueue", "--workers", "1"]
    code = bench.main([*argv, "--optimum-instances", "1", "--json", str(path)])
    assert code == 0
    doc = json.loads(path.read_text())
    assert doc["backfill"] == "reserve"
    assert any("node-based reservation" in n for n in doc["notes"])
    for name in ("ours", "kueue"):
        assert doc["policies"][name]["gpus_conserved"] is True
        assert 0 < doc["policies"][name]["optimum_set_ratio_mean"] <= 1
    assert "optimum's set placed" in capsys.readouterr().out


def test_no_tiers_runs_every_policy_topology_blind_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "blind.json"
    argv = ["--quick", "--no-tiers", "--policies", "ours,kai", "--workers", "1", "--optimum-instances", "0"]
    assert bench.main([*argv, "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert doc["no_tiers"] is True
    assert any("tiers dropped" in n for n in doc["notes"])
    for name in ("ours", "kai"):
        figs = doc["policies"][name]
        assert figs["gpus_conserved"] is True
        assert figs["nvlink_local_ratio"] < 1  # nothing keeps the NVLink subgroups together now


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--policies", "ours,borg"], "--policies: unknown ['borg']", id="unknown-policy"),
        pytest.param(["--workload", "philly", "--data-dir", "/nonexistent"], "--data-dir", id="no-data"),
        pytest.param(["--load", "0"], "--load must be > 0", id="bad-load"),
    ],
)
def test_bad_options_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--quick", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert message in err[0]


def test_figures_are_averaged_over_seeds_key_by_key() -> None:
    runs: list[dict[str, object]] = [
        {"alloc": 0.5, "ok": True, "wait_by": {"8": 10.0}, "p99": None},
        {"alloc": 0.7, "ok": False, "wait_by": {"8": 30.0, "64": 5.0}, "p99": 2.0},
    ]
    assert bench._mean(runs) == {"alloc": 0.6, "ok": False, "wait_by": {"8": 20.0, "64": 5.0}, "p99": 2.0}
