"""Rendering of benchmark results: the JSON document, a Markdown table and a PNG comparison plot."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from scheduler_plugin.placement.metrics import BETTER, SIZE_CLASSES

_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("allocation_ratio", "alloc", "{:.3f}"),
    ("allocation_ratio_saturated", "alloc@sat", "{:.3f}"),
    ("wait_mean_s", "wait mean s", "{:,.0f}"),
    ("wait_p95_s", "wait p95 s", "{:,.0f}"),
    ("jct_mean_s", "JCT mean s", "{:,.0f}"),
    ("nvlink_local_ratio", "NVL-local", "{:.3f}"),
    ("stranded_gpus_mean", "stranded GPUs", "{:.1f}"),
    ("free_domains_mean", "free NVL domains", "{:.2f}"),
    ("plan_p50_ms", "plan p50 ms", "{:.2f}"),
    ("plan_p99_ms", "plan p99 ms", "{:.2f}"),
    ("partial_gangs", "partial gangs", "{:d}"),
    ("unstarted_jobs", "never started", "{:d}"),
)
# the queue's figures: starvation, the high-priority class, preemption
_QUEUE: tuple[tuple[str, str, str], ...] = (
    ("wait_max_s", "wait max s", "{:,.0f}"),
    ("wait_max_ratio", "max / mean wait", "{:.1f}"),
    ("hp_wait_p50_s", "high-prio wait p50 s", "{:,.0f}"),
    ("hp_wait_p95_s", "high-prio wait p95 s", "{:,.0f}"),
    ("preempted_gpu_hours", "preempted GPU-h", "{:,.1f}"),
    ("preemptions", "evictions", "{:d}"),
    ("half_preempted_gangs", "half-preempted gangs", "{:d}"),
)
# the figures compared seed by seed, as signed differences
_PAIRED: tuple[tuple[str, str, str], ...] = tuple(
    (key, label, fmt.replace("{:", "{:+", 1)) for key, label, fmt in _COLUMNS + _QUEUE if key in BETTER
)
_SMALL: tuple[tuple[str, str, str], ...] = (
    ("small_allocation_ratio", "alloc of free GPUs", "{:.3f}"),
    ("optimum_ratio_mean", "of optimum (mean)", "{:.3f}"),
    ("optimum_ratio_min", "of optimum (worst)", "{:.3f}"),
    ("optimum_set_ratio_mean", "optimum's set placed (mean)", "{:.3f}"),
    ("optimum_set_ratio_min", "optimum's set placed (worst)", "{:.3f}"),
)


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return str(value)
    if fmt.endswith("d}") and isinstance(value, float):
        value = round(value)
    return fmt.format(value)


def _paired_cell(pair: Mapping[str, Any] | None, fmt: str) -> str:
    """``+0.004 ± 0.002 (+0.5%) 7/3*``: mean difference, its standard error, relative, seeds better/worse."""
    if not pair:
        return "—"
    text = fmt.format(pair["diff_mean"])
    if pair["diff_se"] is not None:
        text += " ± " + fmt.replace("{:+", "{:").format(pair["diff_se"])
    if pair["relative"] is not None:
        text += f" ({pair['relative']:+.1%})"
    text += f" {pair['better_seeds']}/{pair['worse_seeds']}"
    return text + ("*" if pair["significant"] else "")


def _table(lines: list[str], columns: Sequence[tuple[str, str, str]], policies: Mapping[str, Any]) -> None:
    lines += ["| policy | " + " | ".join(c[1] for c in columns) + " |", "|---|" + "---:|" * len(columns)]
    for name, figs in policies.items():
        if name == "optimum":
            continue
        lines.append(f"| {name} | " + " | ".join(_cell(figs.get(k), f) for k, _, f in columns) + " |")


def _section(lines: list[str], part: Mapping[str, Any], seeds: Sequence[int]) -> None:
    """One queue setting's tables: the figures, the queue figures, and the seed-by-seed comparison."""
    policies: Mapping[str, Mapping[str, Any]] = part["policies"]
    _table(lines, _COLUMNS, policies)
    lines += ["", "Queue figures (starvation, the high-priority class, preemption):", ""]
    _table(lines, _QUEUE, policies)
    pairs: Mapping[str, Mapping[str, Mapping[str, Any]]] = part.get("paired") or {}
    if pairs:
        lines += [
            "",
            f"Ours against each gang anchor, seed by seed (seeds {seeds[0]}..{seeds[-1]}, "
            "the same stream for both): ours minus the anchor, mean ± standard error (relative to the "
            "anchor's mean), seeds where ours is better / worse; * marks a difference of at least two "
            "standard errors:",
            "",
            "| anchor | " + " | ".join(c[1] for c in _PAIRED) + " |",
            "|---|" + "---:|" * len(_PAIRED),
        ]
        for name, figs in pairs.items():
            lines.append(
                f"| {name} | " + " | ".join(_paired_cell(figs.get(k), f) for k, _, f in _PAIRED) + " |"
            )


def markdown(doc: Mapping[str, Any]) -> str:
    policies: Mapping[str, Mapping[str, Any]] = doc["policies"]
    seeds = doc["seeds"]
    lines = [
        f"### Placement: workload `{doc['workload']}` on `{doc['cluster']['shape']}` "
        f"({doc['cluster']['gpus']:,} GPUs, {doc['cluster']['nodes']:,} nodes), {doc['jobs']:,} jobs, "
        f"load {doc['load']}, seed {doc['seed']}",
        "",
    ]
    queues = doc.get("queues")
    if queues:
        lines += [f"Each policy with its own queue ({queues}):", ""]
    _section(lines, doc, seeds)
    like = doc.get("like_for_like")
    if like:
        lines += ["", f"Like for like: the same queue for every policy ({like['queue']}):", ""]
        _section(lines, like, seeds)
    small = doc.get("small_instances")
    if small:
        lines += [
            "",
            f"Small instances ({small['instances']} x {small['cluster']}, batch in order vs the "
            f"integer-program optimum; {small['proven_optimal']} proven optimal):",
            "",
            "| policy | " + " | ".join(c[1] for c in _SMALL) + " |",
            "|---|" + "---:|" * len(_SMALL),
        ]
        for name, figs in policies.items():
            lines.append(f"| {name} | " + " | ".join(_cell(figs.get(k), f) for k, _, f in _SMALL) + " |")
    lines += ["", *[f"- {n}" for n in doc.get("notes", [])], "", doc.get("machine", "")]
    return "\n".join(lines) + "\n"


def plot(
    doc: Mapping[str, Any], timelines: Mapping[str, Sequence[tuple[float, int, int]]], path: Path
) -> None:
    policies = [p for p in doc["policies"] if p != "optimum"]
    figs = doc["policies"]
    total = doc["cluster"]["gpus"]
    fig = Figure(figsize=(13, 8.5))
    FigureCanvasAgg(fig)  # the Agg backend, without pyplot's global state
    axes = fig.subplots(2, 2)
    ax = axes[0][0]
    for p in policies:
        tl = timelines.get(p, ())
        if tl:
            ax.plot(
                [t / 3600 for t, _, _ in tl],
                [a / total for _, a, _ in tl],
                label=p,
                linewidth=0.8,
                drawstyle="steps-post",
            )
    ax.set_title("GPU allocation over time")
    ax.set_xlabel("hours")
    ax.set_ylabel("allocated / total")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    for p in policies:
        tl = timelines.get(p, ())
        if tl:
            ax.plot(
                [t / 3600 for t, _, _ in tl],
                [d for _, _, d in tl],
                label=p,
                linewidth=0.8,
                drawstyle="steps-post",
            )
    ax.set_title("wholly free NVLink domains")
    ax.set_xlabel("hours")
    ax = axes[1][0]
    xs = range(len(policies))
    width = 0.4
    ax.bar(
        [x - width / 2 for x in xs], [figs[p].get("wait_mean_s") or 0 for p in policies], width, label="mean"
    )
    ax.bar(
        [x + width / 2 for x in xs], [figs[p].get("wait_p95_s") or 0 for p in policies], width, label="p95"
    )
    ax.set_xticks(list(xs), policies, rotation=20)
    ax.set_title("job wait (s)")
    ax.legend(fontsize=8)
    ax = axes[1][1]
    ax.bar(
        [x - width / 2 for x in xs],
        [figs[p].get("allocation_ratio") or 0 for p in policies],
        width,
        label="simulation",
    )
    if "optimum" in figs:
        ax.bar(
            [x + width / 2 for x in xs],
            [figs[p].get("optimum_ratio_mean") or 0 for p in policies],
            width,
            label="small instances: share of the optimum",
        )
    ax.set_xticks(list(xs), policies, rotation=20)
    ax.set_ylim(0, 1.05)
    ax.set_title("GPU allocation ratio")
    ax.legend(fontsize=8, loc="lower left")
    fig.suptitle(
        f"placement: {doc['workload']} on {doc['cluster']['shape']}, {doc['jobs']} jobs "
        f"(time series: seed {doc['seeds'][0]}; bars: mean over {len(doc['seeds'])} seed(s))"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- the queue's frontier (bench placement --frontier) ----------------------------------------------

_FRONTIER: tuple[tuple[str, str, str], ...] = (
    ("allocation_ratio", "alloc", "{:.3f}"),
    ("wait_mean_s", "wait mean s", "{:,.0f}"),
    ("wait_max_s", "wait max s", "{:,.0f}"),
)


def _spread_cell(value: Mapping[str, Any] | None, fmt: str) -> str:
    """``0.830 ± 0.004``: mean ± standard error over the seeds."""
    if not value:
        return "—"
    text = fmt.format(value["mean"])
    if value.get("se") is not None:
        text += " ± " + fmt.format(value["se"])
    return text


def frontier_markdown(doc: Mapping[str, Any]) -> str:
    seeds = doc["seeds"]
    lines: list[str] = []
    for wl, part in doc["workloads"].items():
        cl = part["cluster"]
        classes = [
            c for c in SIZE_CLASSES if any(c in r["wait_mean_by_class_s"] for r in part["rows"].values())
        ]
        lines += [
            f"### Queue frontier: workload `{wl}` on `{cl['shape']}` ({cl['gpus']:,} GPUs, {cl['nodes']:,} "
            f"nodes), {part['jobs']:,} jobs, load {doc['load']}, seeds {seeds[0]}..{seeds[-1]}",
            "",
            "| queue | "
            + " | ".join(c[1] for c in _FRONTIER)
            + " | "
            + " | ".join(f"wait {c} s" for c in classes)
            + " |",
            "|---|" + "---:|" * (len(_FRONTIER) + len(classes)),
        ]
        for row, figs in part["rows"].items():
            mark = " (default)" if row == f"ours {doc.get('default_setting')}" else ""
            cells = [_spread_cell(figs.get(k), f) for k, _, f in _FRONTIER]
            cells += [_spread_cell(figs["wait_mean_by_class_s"].get(c), "{:,.0f}") for c in classes]
            lines.append(f"| {row}{mark} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "Aim: per anchor, the setting of ours closest to being at least as good on all three at once; "
            "ours minus the anchor, seed by seed, mean ± standard error (relative), seeds better/worse:",
            "",
            "| anchor | ours at | " + " | ".join(c[1] for c in _FRONTIER) + " | holds | within noise |",
            "|---|---|" + "---:|" * len(_FRONTIER) + "---|---|",
        ]
        for anchor, verdict in part["aims"].items():
            pairs = verdict["paired"]
            shown = (
                anchor if anchor in doc["aim_anchors"] else f"{anchor} (no gang scheduler: not in the aim)"
            )
            cells = [_paired_cell(pairs.get(k), f.replace("{:", "{:+", 1)) for k, _, f in _FRONTIER]
            lines.append(
                f"| {shown} | {verdict['setting'] or '—'} | "
                + " | ".join(cells)
                + f" | {'yes' if verdict['holds'] else 'no'} | {'yes' if verdict['within_noise'] else 'no'} |"
            )
        lines.append("")
    failing = [
        f"{anchor} ({wl})"
        for wl, part in doc["workloads"].items()
        for anchor, verdict in part["aims"].items()
        if anchor in doc["aim_anchors"] and not verdict["holds"]
    ]
    lines.append(
        "Aim holds for every gang anchor."
        if not failing
        else "Aim does not hold for: " + ", ".join(failing) + "."
    )
    lines += ["", *[f"- {n}" for n in doc.get("notes", [])], "", doc.get("machine", "")]
    return "\n".join(lines) + "\n"


def _point(figs: Mapping[str, Any], key: str) -> tuple[float, float, float, float]:
    """(``key`` in hours, allocation, and their standard errors) of one frontier row."""
    x, y = figs[key], figs["allocation_ratio"]
    return x["mean"] / 3600, y["mean"], (x["se"] or 0.0) / 3600, y["se"] or 0.0


def _seconds_only(row: str) -> bool:
    """Whether the frontier row ``ours S`` sets the seconds alone (no ``Kx``, ``Ri`` or ``nofill``)."""
    return row.removeprefix("ours ").replace(".", "", 1).isdigit()


def frontier_plot(doc: Mapping[str, Any], path: Path) -> None:
    """Per workload, allocation against mean wait and against largest wait: ours' settings as one line
    (the frontier), each anchor a point; error bars are standard errors over the seeds."""
    parts = doc["workloads"]
    fig = Figure(figsize=(12, 4.6 * len(parts)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(parts), 2, squeeze=False)
    markers = "osD^vP*X"
    for r, (wl, part) in enumerate(parts.items()):
        rows = part["rows"]
        ours = [k for k in rows if k.startswith("ours ")]
        others = [k for k in rows if not k.startswith("ours ")]
        for c, (key, label) in enumerate(
            (("wait_mean_s", "mean wait (h)"), ("wait_max_s", "largest wait (h)"))
        ):
            ax = axes[r][c]

            # the seconds-only settings in dial order as one line; settings with other parts as points
            line = sorted((k for k in ours if _seconds_only(k)), key=lambda k: float(k.removeprefix("ours ")))
            for group, fmt, name in (
                (line, "-o", "ours: hold back after S s"),
                ([k for k in ours if not _seconds_only(k)], "o", "ours: with Kx, Ri or nofill"),
            ):
                if not group:
                    continue
                pts = [_point(rows[k], key) for k in group]
                ax.errorbar(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    xerr=[p[2] for p in pts],
                    yerr=[p[3] for p in pts],
                    fmt=fmt,
                    color="black",
                    mfc="black" if fmt == "-o" else "white",
                    label=name,
                    capsize=2,
                )
                for k, p in zip(group, pts, strict=True):
                    ax.annotate(
                        k.removeprefix("ours "),
                        (p[0], p[1]),
                        fontsize=7,
                        xytext=(3, 3),
                        textcoords="offset points",
                    )
            for i, k in enumerate(others):
                x, y, xe, ye = _point(rows[k], key)
                ax.errorbar([x], [y], xerr=[xe], yerr=[ye], fmt=markers[i % len(markers)], label=k, capsize=2)
            ax.set_xlabel(label)
            ax.set_ylabel("GPU allocation")
            ax.set_title(f"{wl}: allocation against {label.split(' (')[0]}")
            ax.grid(alpha=0.3)
            if c == 0:
                ax.legend(fontsize=7)
    seeds = doc["seeds"]
    fig.suptitle(
        f"queue frontier: up and left is better; mean ± standard error over seeds {seeds[0]}..{seeds[-1]}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
