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


def test_cached_render_matches_the_collector_and_renders_devices_once_per_snapshot() -> None:
    from agent.metrics.exporter import CachedRender
    from agent.metrics.exposition import render_text
    from agent.metrics.native import SnapshotCollector, render_native_devices
    from agent.metrics.snapshot import MetricsSnapshot

    snaps = [scenario(), scenario()]
    state: dict[str, MetricsSnapshot] = {"snap": snaps[0]}
    scrapes = [ScrapeStats(3, 0.02)]
    rendered_for: list[MetricsSnapshot] = []

    def devices(snap: MetricsSnapshot) -> Families:
        rendered_for.append(snap)
        return render_native_devices(snap)

    def snapshot() -> MetricsSnapshot:
        return state["snap"]

    def scrape_stats() -> ScrapeStats:
        return scrapes[-1]

    common = {"snapshot": snapshot, "agent_stats": AgentStats, "scrape_stats": scrape_stats, "version": "v"}
    cached = CachedRender(devices=devices, **common)  # type: ignore[arg-type]
    collector = SnapshotCollector(render=render_native, **common)  # type: ignore[arg-type]

    first = cached()
    assert first == render_text(collector.collect())
    scrapes.append(ScrapeStats(4, 0.03))
    second = cached()
    assert second == render_text(collector.collect())
    assert second != first  # the self-metrics follow every scrape
    assert rendered_for == [snaps[0]]  # the device families were rendered once for this snapshot
    state["snap"] = snaps[1]
    assert cached() == render_text(collector.collect())
    assert rendered_for == [snaps[0], snaps[1]]
