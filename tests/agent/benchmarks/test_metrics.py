"""``gpu-node-agent bench metrics`` runs end to end on a tiny setting (figures are not asserted)."""

from __future__ import annotations

import re

import pytest

from agent.benchmarks import metrics as bench


def test_bench_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    code = bench.main(
        [
            "--pods",
            "2",
            "--other-pods",
            "0,5",
            "--detail-pods",
            "2",
            "--scrapes",
            "3",
            "--idle-seconds",
            "0.2",
            "--leak-scrapes",
            "5",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("machine: ")
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+\d+\s+\d+\s+\d+\s", line)]
    assert [r[0] for r in rows] == ["2", "2", "7"]  # pods listed: 2; then 2 + 0 and 2 + 5 without GPUs
    assert all(r[1] == "2" for r in rows)  # attributed pods
    assert len({r[2] for r in rows}) == 1  # pods without GPUs add no series
    assert "idle 0.2 s, 2 pods" in out
    assert "memory over 5 back-to-back scrapes" in out
    assert "targets: render p99" in out


def test_bench_rejects_bad_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--pods", "ten"]) == 2
    assert "--pods" in capsys.readouterr().err


def test_plan_places_mig_pods_first_then_replicas(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan = bench.plan_node("dgx-a100-mig", 20, tmp_path, others=3)
    resources = [p["resource"] for p in plan["pods"]]
    assert all(r.startswith("nvidia.com/mig-") for r in resources[:15])  # the 15 MIG devices
    assert resources[15:] == ["nvidia.com/gpu"] * 5
    assert [p["device"].split("::")[1] for p in plan["pods"][15:]] == ["0", "0", "0", "0", "1"]
    assert len(plan["processes"]) == 5
    assert len(bench.fake_pods(plan)) == 23
    pid = plan["processes"][0]["pid"]
    assert (tmp_path / "proc" / str(pid) / "cgroup").read_text().startswith("0::/kubepods/burstable/pod")
