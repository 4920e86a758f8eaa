"""``gpu-node-agent bench placement --frontier``: ours at each setting of the queue's dial, every other
policy at its own queue, per workload and seed; the aim judged per anchor; JSON, Markdown and PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.benchmarks import placement as bench

SMALL = ["--quick", "--workers", "1", "--seeds", "2"]


def test_frontier_runs_every_setting_and_anchor_on_both_workloads(philly_dir: Path, tmp_path: Path) -> None:
    out = {k: tmp_path / f"frontier.{k}" for k in ("json", "md", "png")}
    argv = [
        *SMALL,
        "--frontier",
        "--data-dir",
        str(philly_dir),
        "--policies",
        "ours,volcano,slurm,kube-default",
    ]
    argv += ["--frontier-settings", "0,3600/0.5i,1x"]
    argv += ["--json", str(out["json"]), "--markdown", str(out["md"]), "--plot", str(out["png"])]
    assert bench.main(argv) == 0
    doc = json.loads(out["json"].read_text())
    assert doc["benchmark"] == "placement-frontier"
    assert doc["settings"] == ["0", "3600/0.5i", "1x"]
    assert doc["default_setting"] == "0"  # the extender's default dial
    assert doc["seeds"] == [1, 2]
    assert set(doc["workloads"]) == {"nvl72", "philly"}
    for wl, part in doc["workloads"].items():
        assert list(part["rows"]) == [
            "ours 0",
            "ours 3600/0.5i",
            "ours 1x",
            "volcano",
            "slurm",
            "kube-default",
        ], wl
        assert (
            part["rows"]["ours 3600/0.5i"]["queue"] == "core (reserve_after_s=3600, reserve_idle_ratio=0.5)"
        )
        assert part["rows"]["ours 1x"]["queue"] == "core (reserve_after_s=0, reserve_after_limits=1)"
        assert part["rows"]["volcano"]["queue"] == "greedy/none"
        for row, figs in part["rows"].items():
            assert figs["gpus_conserved"] is True, (wl, row)
            assert [s["seed"] for s in figs["per_seed"]] == [1, 2]
            assert 0 < figs["allocation_ratio"]["mean"] <= 1
            assert figs["wait_max_s"]["mean"] >= figs["wait_mean_s"]["mean"] >= 0
            assert figs["wait_mean_s"]["se"] is not None
            assert figs["wait_mean_by_class_s"]
        assert set(part["aims"]) == {"volcano", "slurm", "kube-default"}
        for verdict in part["aims"].values():
            assert verdict["setting"] in doc["settings"]
            assert set(verdict["paired"]) == {"allocation_ratio", "wait_mean_s", "wait_max_s"}
    # the NVL72 mix has gangs of every class on 4 racks; Philly's are small there
    assert set(doc["workloads"]["nvl72"]["rows"]["volcano"]["wait_mean_by_class_s"]) == {
        "small",
        "one domain",
        "several domains",
    }
    assert doc["aim_anchors"] == ["volcano", "slurm"]  # kube-default places pods, not gangs
    assert doc["aim_holds"] == all(
        p["aims"][a]["holds"] for p in doc["workloads"].values() for a in ("volcano", "slurm")
    )
    md = out["md"].read_text()
    assert "### Queue frontier: workload `nvl72`" in md
    assert "| ours 0 (default) |" in md
    assert "| anchor | ours at |" in md
    assert "| kube-default (no gang scheduler: not in the aim) |" in md
    assert "wait several domains s" in md
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_workload_and_the_dial_reaches_the_queue(tmp_path: Path) -> None:
    """A setting changes what our queue does: holding back at once and never (in practice) differ."""
    path = tmp_path / "f.json"
    argv = [*SMALL, "--frontier", "nvl72", "--policies", "ours,kueue", "--frontier-settings", "0,1000000"]
    assert bench.main([*argv, "--racks", "4", "--jobs", "120", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert set(doc["workloads"]) == {"nvl72"}
    rows = doc["workloads"]["nvl72"]["rows"]
    assert rows["ours 0"]["per_seed"] != rows["ours 1000000"]["per_seed"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--frontier", "nvl72,nope"], "--frontier: 'nvl72,nope'"),
        (["--frontier", "nvl72,nvl72"], "--frontier"),
        (["--frontier", ","], "--frontier"),
        (["--frontier", "--frontier-settings", "0,abc"], "--frontier-settings: setting 2 ('abc')"),
        (["--frontier", "--frontier-settings", ""], "--frontier-settings"),
        (["--frontier", "--policies", "volcano,slurm"], "--policies must include ours"),
        (["--frontier", "--seeds", "0"], "--seeds"),
    ],
)
def test_bad_frontier_options_exit_2_naming_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--quick", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert message in err[0]


def test_the_multiple_of_the_limit_reaches_the_tables_too(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    md = tmp_path / "k.md"
    argv = ["--quick", "--racks", "4", "--jobs", "40", "--workers", "1", "--policies", "ours"]
    argv += ["--optimum-instances", "0", "--tables", "own", "--reserve-after-limits", "2"]
    assert bench.main([*argv, "--json", str(path), "--markdown", str(md)]) == 0
    assert json.loads(path.read_text())["reserve_after_limits"] == 2.0
    assert "and 2 x its time limit" in md.read_text()


@pytest.mark.parametrize("value", ["-1", "inf", "nan"])
def test_a_bad_multiple_exits_2_naming_the_option(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick", "--reserve-after-limits", value]) == 2
    assert "--reserve-after-limits" in capsys.readouterr().err.strip().splitlines()[-1]
