from __future__ import annotations

import math

import pytest

from agent.metrics.dcgm import render_dcgm
from agent.metrics.families import Families
from agent.metrics.native import ScrapeStats, render_native
from agent.metrics.snapshot import AgentStats
from tests.agent.metrics.render_helpers import samples, to_text, to_text_reference
from tests.agent.metrics.scenario import scenario


def _norm(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return sorted((n, tuple(sorted(ls.items())), v) for n, ls, v in samples(text))


@pytest.mark.parametrize("render", [render_native, render_dcgm], ids=["native", "dcgm"])
def test_fast_writer_says_what_prometheus_client_says(render) -> None:  # type: ignore[no-untyped-def]
    snap = scenario()
    ours = to_text(render(snap, AgentStats(), ScrapeStats(2, 0.5), "v"))
    reference = to_text_reference(render(snap, AgentStats(), ScrapeStats(2, 0.5), "v"))
    assert _norm(ours) == _norm(reference)
    type_lines = sorted(line for line in ours.splitlines() if line.startswith("# TYPE"))
    assert type_lines == sorted(line for line in reference.splitlines() if line.startswith("# TYPE"))


def test_label_values_are_escaped_and_special_values_written() -> None:
    f = Families()
    f.gauge("odd", "help with \\ and\nnewline", {"a": 'quote " back \\ nl \n end'}, 1)
    f.gauge("odd", "", {"a": "inf"}, math.inf)
    f.gauge("odd", "", {"a": "-inf"}, -math.inf)
    f.gauge("odd", "", {"a": "nan"}, math.nan)
    f.counter("events", "a counter", {}, 3)
    text = to_text(f)
    got = {ls.get("a", n): v for n, ls, v in samples(text)}
    assert got['quote " back \\ nl \n end'] == 1
    assert got["inf"] == math.inf
    assert got["-inf"] == -math.inf
    assert math.isnan(got["nan"])
    assert got["events_total"] == 3
    assert "# TYPE events_total counter" in text


def test_counter_names_must_not_end_in_total() -> None:
    with pytest.raises(ValueError, match="without _total"):
        Families().counter("x_total", "", {}, 1)
