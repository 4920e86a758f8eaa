from __future__ import annotations

import pytest

from agent.benchmarks import topology as bench
from topology.builder import build_tree


def test_synthetic_cluster_shape() -> None:
    data = bench.synthetic_input(racks=4, hgx=2)
    assert len(data.nodes) == 4 * 18 + 2
    tree = build_tree(data)
    tiers = sorted({h.tier_name for h in tree.hypernodes.values()})
    assert tiers == ["core", "leaf", "nvlink", "spine"]


def test_bench_prints_figures_machine_and_writes(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--racks", "4", "--hgx", "2", "--repeat", "1", "--gpunodes", "5"]) == 0
    out = capsys.readouterr().out
    assert "machine:" in out
    assert "writes against an identical cluster: 0" in out
    assert "writes issued: 3 of" in out


def test_bench_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--racks", "0"]) == 2
