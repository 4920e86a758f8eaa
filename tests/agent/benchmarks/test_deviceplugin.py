"""The benchmark runs end to end with small counts and prints every figure and the machine."""

from __future__ import annotations

import json
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


def test_bench_with_dra_prints_both_paths_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    small = (
        "--profile gb200-nvl72:rack=0,tray=0 --allocations 4 --preferred 3 --faults 2 --lost 1 --restarts 1 "
        "--optimality 10 --dra"
    )
    assert bench.main(small.split()) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: ")
    for label in (
        "Allocate (gRPC",
        "NodePrepareResources (gRPC, 1 claim)",
        "NodeUnprepareResources (gRPC, 1 claim)",
        "IMEX channel claim: prepare",
        "XID -> slice with the taint written",
        "recovered -> slice without it written",
        "RSS before the driver / after all calls",
    ):
        assert label in out
    assert bench.main([*small.split(), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["machine"].startswith("machine: ")
    assert figures["deviceplugin"]["allocate"]["n"] == 4
    dra = figures["dra"]
    assert dra["prepare"]["n"] == 4
    assert dra["unprepare"]["n"] == 4
    assert dra["imex_prepare"]["n"] == 4
    assert dra["publish_taint"]["n"] == 2
    assert dra["publish_taint"]["p99_ms"] >= dra["publish_taint"]["p50_ms"] > 0
    assert dra["rss_after_bytes"] > 0
