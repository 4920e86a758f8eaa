"""The planner benchmark runs end to end (few iterations) and prints figures with the machine."""

from __future__ import annotations

import pytest

from agent.benchmarks.planner import main


def test_bench_planner_quick(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--clients", "1", "--extender-nodes", "50"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: ")
    assert "72-GPU gang" in out
    assert "feasible: 18 pods" in out
    assert "1,000-pod gang" in out
    assert "feasible: 1000 pods, 100 subgroup(s)" in out
    assert "requests/s" in out
    assert ", 0 failed)" in out
