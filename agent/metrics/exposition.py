"""The Prometheus text format 0.0.4, written straight from our metric families.

``prometheus_client.generate_latest`` validates and escapes every label name and value of every
sample, which is most of a scrape's cost for the ~1,000-5,000 series of a GPU node. Our families come
from :class:`agent.metrics.families.Families` with fixed, valid label names, so this writer only
escapes label values (and only those that need it) and otherwise produces the same text: ``# HELP``,
``# TYPE`` (``counter`` families named with ``_total``, ``unknown`` as ``untyped``), one line per sample.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric

_TYPES = {
    "counter": "counter",
    "gauge": "gauge",
    "summary": "summary",
    "unknown": "untyped",
    "histogram": "histogram",
}


def _value(v: float) -> str:
    if v - v == 0:  # finite (inf - inf and nan - nan are nan)
        return repr(v)
    if v == math.inf:
        return "+Inf"
    if v == -math.inf:
        return "-Inf"
    return "NaN"


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def render_text(families: Iterable[Metric]) -> bytes:
    out: list[str] = []
    append = out.append
    pairs: dict[tuple[str, str], str] = {}  # 'name="escaped value"' by (name, value), within one scrape
    sets: dict[int, str] = {}  # rendered label sets by dict identity (samples share their label dicts)
    keep: list[object] = []  # the dicts behind ``sets`` stay alive, so identities are not reused
    for family in families:
        name = family.name + "_total" if family.type == "counter" else family.name
        kind = _TYPES.get(family.type, "untyped")
        append(f"# HELP {name} {_help(family.documentation)}\n# TYPE {name} {kind}\n")
        for sample in family.samples:
            sname = sample[0]
            labels = sample[1]
            value = sample[2]
            text = repr(value) if value - value == 0 else _value(value)
            if not labels:
                append(f"{sname} {text}\n")
                continue
            rendered = sets.get(id(labels))
            if rendered is None:
                parts = []
                for item in labels.items():
                    pair = pairs.get(item)
                    if pair is None:
                        pair = f'{item[0]}="{_escape(item[1])}"'
                        pairs[item] = pair
                    parts.append(pair)
                rendered = "{" + ",".join(parts) + "}"
                sets[id(labels)] = rendered
                keep.append(labels)
            append(f"{sname}{rendered} {text}\n")
    return "".join(out).encode()
