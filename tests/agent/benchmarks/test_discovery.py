from __future__ import annotations

import pytest

from agent.commands import bench


def test_discovery_bench_prints_figures_and_the_machine(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["discovery", "--runs", "2", "--profile", "dgx-a100-mig", "--profile", "pcie-l40s"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: ")
    for profile in ("dgx-a100-mig", "pcie-l40s"):
        for phase in ("discover", "cold"):
            assert any(line.split()[:2] == [profile, phase] and "median" in line for line in out.splitlines())
    assert "target: dgx-a100-mig discovery under 50 ms:" in out


@pytest.mark.parametrize(
    ("argv", "message"), [(["--runs", "0"], "at least 1"), (["--profile", "x"], "valid:")]
)
def test_discovery_bench_rejects_bad_arguments(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["discovery", *argv]) == 2
    assert message in capsys.readouterr().out
