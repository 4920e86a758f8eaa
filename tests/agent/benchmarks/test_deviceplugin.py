"""The benchmark runs end to end with small counts and prints every figure and the machine."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from agent.benchmarks import deviceplugin as bench


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The command configures process-wide logging; put it back for the tests that follow."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def test_bench_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    small = (
        "--profile pcie-l40s --allocations 5 --preferred 5 --faults 2 --lost 2 --restarts 1 --optimality 30"
    )
    code = bench.main(small.split())
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("machine: ")
    for label in (
        "Allocate (gRPC",
        "GetPreferredAllocation (gRPC",
        "fault -> kubelet sees Unhealthy",
        "lost, no event: answer -> kubelet Unhealthy",
        "kubelet restart -> registered again",
        "optimality vs brute force",
    ):
        assert label in out
    assert "= 100.0%" in out


def test_bench_rejects_zero_counts() -> None:
    with pytest.raises(SystemExit):
        bench.main(["--faults", "0"])
