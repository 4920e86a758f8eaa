"""Render snapshots to text and read them back, and run promtool on them."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from agent.metrics.exposition import render_text


class _Fixed(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def to_text(families: Iterable[Metric]) -> str:
    """The text the exporter serves (``agent.metrics.exposition``)."""
    return render_text(families).decode()


def to_text_reference(families: Iterable[Metric]) -> str:
    """The same families through prometheus_client's own writer."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families))
    return generate_latest(registry).decode()


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples
    ]


def value(text: str, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    found = [v for n, ls, v in samples(text) if n == name and all(ls.get(k) == x for k, x in labels.items())]
    if len(found) != 1:
        raise AssertionError(f"{name}{labels}: {len(found)} samples")
    return found[0]


def promtool(text: str) -> tuple[int, str]:
    """``promtool check metrics`` on ``text``: exit code and combined output."""
    exe = shutil.which("promtool")
    if exe is None:
        raise AssertionError(
            "promtool not found: install the Debian package 'prometheus' (.ci/system-packages.txt)"
        )
    done = subprocess.run(
        [exe, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60, check=False
    )
    return done.returncode, done.stdout + done.stderr
