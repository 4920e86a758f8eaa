"""The planner benchmark runs end to end (few iterations) and prints figures with the machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.benchmarks.planner import gb200_cluster, main, write_cluster_file
from agent.commands.plan import read_cluster


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
    assert "plan --cluster of 2,000 GB200 trays (112 NVL72 racks, 14 leaves, 2 spines" in out
    assert "feasible: 36 pods, 2 subgroup(s)" in out
    assert "peak RSS" in out


def test_bench_plan_file_case_alone_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--only-plan-file", "--plan-file-nodes", "360", "--plan-file-format", "json"]) == 0
    out = capsys.readouterr().out
    assert "72-GPU gang" not in out
    assert "plan --cluster of 360 GB200 trays (20 NVL72 racks, 3 leaves, 1 spines" in out
    assert "in JSON of" in out
    assert "feasible: 36 pods, 2 subgroup(s)" in out


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_the_cluster_file_reads_back_as_the_snapshot_it_was_written_from(tmp_path: Path, fmt: str) -> None:
    snapshot = gb200_cluster(40, busy_share=0.3, seed=5)
    path = tmp_path / f"c.{fmt}"
    assert write_cluster_file(str(path), snapshot, fmt=fmt) == path.stat().st_size
    assert read_cluster(str(path)) == snapshot
    if fmt == "yaml":  # the block YAML yaml.safe_dump writes for the same data
        data = {
            "tiers": list(snapshot.tiers),
            "nodes": [
                {"name": n.name, "gpus": n.gpus, "free": n.free, "domains": dict(n.domains)}
                for n in snapshot.nodes
            ],
        }
        assert path.read_text(encoding="utf-8") == yaml.safe_dump(data, sort_keys=False)


def test_peak_rss_is_this_process_own() -> None:
    """The plan-file child reports its own peak (``VmHWM``: Linux carries ``ru_maxrss`` over ``exec``
    from the process that started it): at least what it holds now, a large allocation included."""
    import resource

    from agent.benchmarks.planner import _peak_rss_bytes

    block = bytearray(64 * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    with open("/proc/self/statm", encoding="ascii") as fh:
        now = int(fh.read().split()[1]) * resource.getpagesize()
    assert _peak_rss_bytes() >= now > 64 * 2**20
