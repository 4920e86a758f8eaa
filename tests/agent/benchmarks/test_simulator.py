from __future__ import annotations

import pytest

from agent.benchmarks import simulator as sim_bench
from agent.commands import bench


def test_simulator_bench_prints_figures_and_the_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["simulator", "--runs", "3", "--calls", "5", "--interval-ms", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: ")
    assert "fault file -> event (poll 5 ms): median" in out
    assert "(n=3)" in out
    assert "mig_state() (7 devices)" in out
    assert "target: fault file -> event under 200 ms" in out


def test_simulator_bench_rejects_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        sim_bench.main(["--runs", "0"])
