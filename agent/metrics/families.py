"""A small builder of Prometheus metric families with per-sample label sets.

Both renderings go through it: families are created on first use, in a stable order, and every label
value is a string. Counters are named without ``_total`` here and get it on their samples, as the text
format wants. Label dicts are stored as given (callers share one dict between samples and never
mutate it afterwards).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample


def _sample(name: str, labels: dict[str, str], value: float) -> Sample:
    # tuple.__new__ skips the NamedTuple's Python-level __new__ (half the cost on a hot path)
    return tuple.__new__(Sample, (name, labels, value, None, None, None))


class Families:
    def __init__(self) -> None:
        self._families: dict[str, tuple[Metric, str]] = {}  # name -> (family, its samples' name)

    def _family(self, name: str, help_: str, typ: str) -> tuple[Metric, str]:
        entry = self._families.get(name)
        if entry is None:
            if typ == "counter" and name.endswith("_total"):
                raise ValueError(f"counter family {name!r}: give the name without _total")
            entry = (Metric(name, help_, typ), name + "_total" if typ == "counter" else name)
            self._families[name] = entry
        return entry

    def gauge(self, name: str, help_: str, labels: dict[str, str], value: float | None) -> None:
        """Adds one sample; ``None`` (not supported) adds nothing but still declares the family."""
        family, sample_name = self._family(name, help_, "gauge")
        if value is not None:
            family.samples.append(_sample(sample_name, labels, float(value)))

    def counter(self, name: str, help_: str, labels: dict[str, str], value: float | None) -> None:
        family, sample_name = self._family(name, help_, "counter")
        if value is not None:
            family.samples.append(_sample(sample_name, labels, float(value)))

    def untyped(self, name: str, help_: str, labels: dict[str, str], value: float | None) -> None:
        family, sample_name = self._family(name, help_, "unknown")
        if value is not None:
            family.samples.append(_sample(sample_name, labels, float(value)))

    def summary(self, name: str, help_: str, labels: dict[str, str], count: int, total: float) -> None:
        family, _ = self._family(name, help_, "summary")
        family.samples.append(_sample(name + "_count", labels, float(count)))
        family.samples.append(_sample(name + "_sum", labels, float(total)))

    def __iter__(self) -> Iterator[Metric]:
        """Families that have at least one sample (an empty family says nothing to Prometheus)."""
        return (f for f, _ in self._families.values() if f.samples)
