"""``bench extender`` at a tiny size: the cluster it builds, the report's shape, and figures that come
from real work (the passes it times ran, the calls it counts were answered)."""

from __future__ import annotations

import ast
import copy
import inspect
import json
import math
import time
from typing import Any

import pytest

from agent.benchmarks import extender as bench
from agent.commands import bench as bench_command

PARAMS: dict[str, Any] = {"busy": 0.7, "waiting_gangs": 2, "events_per_s": 40.0, "seconds": 0.5, "clients": 2}


@pytest.fixture(scope="module")
def tiny() -> dict[str, Any]:
    return bench.run([20, 40], PARAMS, fresh_process=False)


def test_the_cluster_is_busy_racks_with_waiting_gangs_and_the_controllers_hypernodes() -> None:
    c = bench.build_cluster(40, busy=0.7, waiting_gangs=3, now=time.time())
    assert c.racks == 3  # 18 + 18 + a short rack of 4
    assert len(c.node_names()) == 40
    per_rack: dict[str, int] = {}
    for d in (*c.running, *c.other):
        if d.gpus and d.node is not None:
            rack = d.node.split("-")[0]
            per_rack[rack] = per_rack.get(rack, 0) + d.gpus
    assert set(per_rack) == {"r000", "r001", "r002"}  # no rack wholly free: the gangs wait
    busy = sum(per_rack.values()) / (40 * bench.GPUS_PER_TRAY)
    assert 0.6 <= busy <= 0.8
    assert any(d.gang is not None for d in c.other)  # running gangs beside pods on their own
    assert len(c.waiting) == 3 * bench.GANG_PODS
    assert all(d.node is None and d.gpus == 4 for d in c.waiting)
    tiers = {h["spec"]["tierName"] for h in c.hypernodes}
    assert "nvlink" in tiers
    nvlink = [h for h in c.hypernodes if h["spec"]["tierName"] == "nvlink"]
    assert len(nvlink) == 3


def test_the_report_has_every_figure_per_size_with_growth_and_aims(tiny: dict[str, Any]) -> None:
    assert tiny["machine"].startswith("machine:")
    assert [s["trays"] for s in tiny["sizes"]] == [20, 40]
    for s in tiny["sizes"]:
        assert s["waiting_gangs"] == 2  # the state itself says the gangs wait
        for label, path, _ in bench.FIGURES:
            value = bench.figure(s, path)
            assert value is not None, label
            assert value >= 0, label
        for phase in ("passes", "events"):
            assert s[phase]["filter_gang"]["n"] > 0
            assert s[phase]["filter_pod"]["n"] > 0
            assert s[phase]["prioritize"]["n"] > 0
            assert s[phase]["events"] > 0
    assert set(tiny["exponents"]) >= {label for label, _, _ in bench.FIGURES} | {"filter p99"}
    assert all(v is None or math.isfinite(v) for v in tiny["exponents"].values())
    assert [a["aim"] for a in tiny["aims"]] == [
        "filter p99 < 50 ms",
        "pass after one change < 100 ms",
        "pass with no change < 5 ms",
        "extender RSS < 1 GiB",
        "growth of filter p99 in N < 1",
    ]
    assert all(a["trays"] == 40 and not a["at_aim_size"] for a in tiny["aims"])
    json.dumps(tiny)  # --json prints it


def test_the_passes_it_times_ran_and_the_phases_ran_passes(tiny: dict[str, Any]) -> None:
    for s in tiny["sizes"]:
        assert s["pass_no_change_passes"] == 0  # nothing changed, no wait ended: it returns at once
        assert s["pass_after_change_passes"] >= 1  # after a change the driver's tick does a pass
        assert s["pass_after_change_s"] > 0
        assert s["pass_no_change_s"] > 0
        assert s["passes"]["passes"] >= 1  # the queue loop passed: the 1,000 events before made it due
        assert s["events"]["lock_held"]["n"] > s["events"]["events"]  # every event held the lock


def test_the_table_names_the_machine_every_size_and_judges_each_aim(tiny: dict[str, Any]) -> None:
    text = "\n".join(bench.render(tiny))
    assert "machine:" in text
    for words in ("20 trays", "40 trays", "pass after one change", "growth"):
        assert words in text
    assert text.count("PASS") + text.count("FAIL") == 5
    assert "judged at 40 trays, below the aim's size" in text


def test_growth_is_the_log_log_slope() -> None:
    assert bench.growth([(100, 1.0), (1000, 10.0), (10000, 100.0)]) == pytest.approx(1.0)
    assert bench.growth([(100, 4.0), (400, 8.0)]) == pytest.approx(0.5)
    assert bench.growth([(100, 1.0)]) is None
    assert bench.growth([(100, 1.0), (200, None), (300, 0.0)]) is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--trays", "0"],
        ["--trays", "a,b"],
        ["--busy", "1"],
        ["--waiting-gangs", "0"],
        ["--events-per-s", "-1"],
        ["--seconds", "0"],
        ["--clients", "0"],
    ],
    ids=["trays-zero", "trays-words", "busy-one", "no-gangs", "negative-rate", "no-seconds", "no-clients"],
)
def test_bad_options_exit_2_with_the_flag_named(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert argv[0] in err


def test_the_bench_command_lists_the_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_command.main(["--help"]) == 0
    assert "extender" in capsys.readouterr().out


def test_only_the_adapter_touches_the_extenders_state_and_verbs() -> None:
    """The harness re-points by changing one class: nothing else names the state or the verbs' owner."""
    tree = ast.parse(inspect.getsource(bench))
    outside: list[str] = []

    def visit(node: ast.AST, owner: str | None) -> None:
        if isinstance(node, ast.ClassDef):
            owner = node.name
        if owner != "StateAdapter" and not isinstance(node, ast.ImportFrom):
            if isinstance(node, ast.Attribute) and node.attr in ("state", "extender"):
                outside.append(f"{owner}: .{node.attr} (line {node.lineno})")
            if isinstance(node, ast.Name) and node.id in ("ExtenderState", "Extender"):
                outside.append(f"{owner}: {node.id} (line {node.lineno})")
        for child in ast.iter_child_nodes(node):
            visit(child, owner)

    visit(tree, None)
    assert outside == []


def test_the_growth_aim_is_not_judged_on_a_handful_of_calls(tiny: dict[str, Any]) -> None:
    sizes = copy.deepcopy(tiny["sizes"])
    for s in sizes:
        s["events"]["filter_gang"]["n"] = 3
    rep = bench.report(sizes, PARAMS)
    growth_aim = rep["aims"][-1]
    assert growth_aim["aim"] == "growth of filter p99 in N < 1"
    assert growth_aim["passed"] is False
    assert "not judged: 3 filter call(s)" in growth_aim["note"]
    assert "not judged" in "\n".join(bench.render(rep))
