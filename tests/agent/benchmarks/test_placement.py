"""``gpu-node-agent bench placement`` end to end: JSON, Markdown and PNG, and clear errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agent.benchmarks import placement as bench
from scheduler_plugin.placement.metrics import FIGURES, paired

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


def test_paired_figures_compare_seed_by_seed_in_each_figures_own_direction() -> None:
    ours: list[dict[str, object]] = [
        {"allocation_ratio": 0.80, "wait_mean_s": 100.0, "plan_p99_ms": None},
        {"allocation_ratio": 0.70, "wait_mean_s": 300.0, "plan_p99_ms": 1.0},
        {"allocation_ratio": 0.90, "wait_mean_s": 200.0, "plan_p99_ms": 1.0},
    ]
    other: list[dict[str, object]] = [
        {"allocation_ratio": 0.78, "wait_mean_s": 200.0, "plan_p99_ms": 2.0},
        {"allocation_ratio": 0.66, "wait_mean_s": 300.0, "plan_p99_ms": 2.0},
        {"allocation_ratio": 0.90, "wait_mean_s": 400.0, "plan_p99_ms": 2.0},
    ]
    out = paired(ours, other)
    assert set(out) == {"allocation_ratio", "wait_mean_s"}  # a seed without plan_p99_ms: not compared
    alloc = out["allocation_ratio"]
    assert isinstance(alloc, dict)
    assert alloc["diff_mean"] == pytest.approx(0.02)
    assert alloc["diff_se"] == pytest.approx(math.sqrt(((0.0) ** 2 + 0.02**2 + 0.02**2) / 2 / 3))
    assert (alloc["better_seeds"], alloc["worse_seeds"], alloc["seeds"]) == (2, 0, 3)
    assert alloc["significant"] is False  # 0.02 against a standard error of 0.0115
    wait = out["wait_mean_s"]
    assert isinstance(wait, dict)
    assert wait["diff_mean"] == pytest.approx(-100.0)  # lower wait: better
    assert wait["relative"] == pytest.approx(-100.0 / 300.0)
    assert (wait["better_seeds"], wait["worse_seeds"]) == (2, 0)
    one = paired(ours[:1], other[:1])["allocation_ratio"]
    assert isinstance(one, dict)
    assert one["diff_se"] is None
    assert one["significant"] is False
    with pytest.raises(ValueError, match="3 seeds against 2"):
        paired(ours, other[:2])


def test_several_seeds_compare_ours_with_each_gang_anchor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "paired.json"
    argv = ["--quick", "--seeds", "2", "--policies", "ours,kueue,kube-default", "--workers", "1"]
    assert bench.main([*argv, "--optimum-instances", "0", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert set(doc["paired"]) == {"kueue"}  # kube-default places pods, not gangs: no pairing
    alloc = doc["paired"]["kueue"]["allocation_ratio"]
    per_seed = [
        o["allocation_ratio"] - k["allocation_ratio"]
        for o, k in zip(
            doc["policies"]["ours"]["per_seed"], doc["policies"]["kueue"]["per_seed"], strict=True
        )
    ]
    assert alloc["diff_mean"] == pytest.approx(sum(per_seed) / 2)
    assert alloc["seeds"] == 2
    out = capsys.readouterr().out
    assert "Ours against each gang anchor, seed by seed (seeds 1..2" in out
    assert "| kueue | " in out.split("Ours against")[1]
    one = tmp_path / "one.json"
    assert bench.main([*argv[:1], "--policies", "ours,kueue", "--workers", "1", "--json", str(one)]) == 0
    assert "paired" not in json.loads(one.read_text())  # one seed: nothing to pair


def test_own_queues_first_like_for_like_second_with_the_priority_figures(tmp_path: Path) -> None:
    path = tmp_path / "queues.json"
    md = tmp_path / "queues.md"
    argv = ["--quick", "--racks", "4", "--jobs", "60", "--seeds", "2", "--workers", "1"]
    argv += ["--policies", "ours,kai,slurm", "--optimum-instances", "0", "--high-priority", "0.3"]
    code = bench.main(
        [*argv, "--preempt-after", "300", "--reserve-after", "60", "--json", str(path), "--markdown", str(md)]
    )
    assert code == 0
    doc = json.loads(path.read_text())
    assert doc["reserve_after_s"] == 60.0
    assert "holding back for a gang after 60 s" in md.read_text()
    assert doc["tables"] == ["own", "like"]
    assert doc["high_priority"] == 0.3
    assert doc["preempt_after_s"] == 300.0
    assert {n: doc["policies"][n]["queue"] for n in ("ours", "kai", "slurm")} == {
        "ours": "core/core",
        "kai": "greedy/kai",
        "slurm": "reserve/none",
    }
    like = doc["like_for_like"]
    assert {f["queue"] for f in like["policies"].values()} == {"count/none"}
    for part in (doc, like):
        assert set(part["paired"]) == {"kai", "slurm"}
        for name, figs in part["policies"].items():
            assert figs["half_preempted_gangs"] == 0, name
            assert figs["hp_jobs"] > 0
            assert figs["hp_wait_p95_s"] >= figs["hp_wait_p50_s"] >= 0
            assert figs["wait_max_s"] >= figs["wait_p95_s"]
    assert like["policies"]["ours"]["preempted_gpu_hours"] == 0
    text = md.read_text()
    assert "Each policy with its own queue" in text
    assert "Like for like: the same queue for every policy" in text
    assert "half-preempted gangs" in text


def test_like_for_like_alone_keeps_the_single_table(tmp_path: Path) -> None:
    path = tmp_path / "like.json"
    argv = ["--quick", "--racks", "4", "--jobs", "40", "--workers", "1", "--policies", "ours"]
    assert bench.main([*argv, "--optimum-instances", "0", "--tables", "like", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert "like_for_like" not in doc
    assert doc["policies"]["ours"]["queue"] == "count/none"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tables", "mine"], "--tables"),
        (["--tables", "own,own"], "--tables"),
        (["--preempt-after", "-1"], "--preempt-after"),
        (["--reserve-after", "-1"], "--reserve-after"),
        (["--reserve-after", "inf"], "--reserve-after"),
        (["--high-priority", "2"], "--high-priority"),
    ],
)
def test_bad_queue_options_exit_2_naming_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--quick", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1
    assert message in err[-1]


@pytest.mark.parametrize(
    ("after", "said"),
    [
        ("afresh", "at most 0.5 h, then is placed afresh"),
        ("any", "at most 0.5 h, then its lost pods go to any domain"),
        ("wait", "waits for a tray in its domain for ever"),
    ],
)
def test_tray_failures_report_ours_repair_wait_and_what_follows(
    tmp_path: Path, after: str, said: str
) -> None:
    md = tmp_path / "failures.md"
    argv = ["--tray-failures", "--quick", "--racks", "2", "--jobs", "12", "--policies", "ours,volcano"]
    assert bench.main([*argv, "--tray-mtbf-h", "50", "--ours-after-wait", after, "--markdown", str(md)]) == 0
    assert said in md.read_text()


def test_tray_failures_refuse_a_negative_repair_wait(capfd: pytest.CaptureFixture[str]) -> None:
    argv = ["--tray-failures", "--quick", "--policies", "ours,volcano", "--ours-repair-wait-h", "-1"]
    assert bench.main(argv) == 2
    assert "ours_wait_h" in capfd.readouterr().err
