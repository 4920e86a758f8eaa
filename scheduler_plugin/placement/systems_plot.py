"""The PNG of ``bench cluster --systems``: GPU allocation over time per scheduling system, and its figures
as bars. Here because matplotlib is this subpackage's extra (the import-linter contract keeps it inside);
it reads the benchmark's JSON document only, so it knows nothing of the systems themselves."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

_BARS: tuple[tuple[str, str], ...] = (
    ("nvlink_local_ratio", "subgroups inside one NVLink domain"),
    ("allocation_ratio", "GPU allocation (mean over the window)"),
    ("stranded_gpus_mean", "stranded GPUs (mean)"),
    ("half_placed_gangs", "half-placed gangs"),
)


def plot_systems(doc: Mapping[str, Any], path: Path) -> None:
    """``doc``: ``{"cluster": {"gpus", "nodes", ...}, "systems": {name: figures | {"skipped": ...}},
    "timelines": {name: [[t, gpus], ...]}, "machine": str}``."""
    ran = [n for n, row in doc["systems"].items() if "skipped" not in row and "error" not in row]
    total = doc["cluster"]["gpus"] or 1
    fig = Figure(figsize=(13, 8.5))
    FigureCanvasAgg(fig)  # the Agg backend, without pyplot's global state
    axes = fig.subplots(2, 3)
    ax = axes[0][0]
    for name in ran:
        tl = doc["timelines"].get(name) or []
        if tl:
            ax.plot(
                [t for t, _ in tl],
                [a / total for _, a in tl],
                label=name,
                linewidth=0.9,
                drawstyle="steps-post",
            )
    ax.set_title("GPU allocation over time")
    ax.set_xlabel("seconds from the first job")
    ax.set_ylabel("allocated / total")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    xs = list(range(len(ran)))
    ax = axes[0][1]
    width = 0.4
    ax.bar(
        [x - width / 2 for x in xs],
        [doc["systems"][n].get("wait_mean_s") or 0 for n in ran],
        width,
        label="mean",
    )
    ax.bar(
        [x + width / 2 for x in xs],
        [doc["systems"][n].get("wait_p95_s") or 0 for n in ran],
        width,
        label="p95",
    )
    ax.set_xticks(xs, ran)
    ax.set_title("job wait: creation to last pod bound (s)")
    ax.legend(fontsize=8)
    ax = axes[0][2]
    ax.bar(
        [x - width / 2 for x in xs],
        [doc["systems"][n].get("to_running_mean_s") or 0 for n in ran],
        width,
        label="mean",
    )
    ax.bar(
        [x + width / 2 for x in xs],
        [doc["systems"][n].get("to_running_p95_s") or 0 for n in ran],
        width,
        label="p95",
    )
    ax.set_xticks(xs, ran)
    ax.set_title("creation to all pods Running (s)")
    ax.legend(fontsize=8)
    for ax, (key, title) in zip([axes[1][0], axes[1][1], axes[1][2]], _BARS[:3], strict=True):
        ax.bar(xs, [doc["systems"][n].get(key) or 0 for n in ran])
        ax.set_xticks(xs, ran)
        ax.set_title(title)
        if key.endswith("_ratio"):
            ax.set_ylim(0, 1.05)
    half = ", ".join(f"{n}: {doc['systems'][n].get('half_placed_gangs', 0)}" for n in ran)
    skipped = [n for n in doc["systems"] if n not in ran]
    c = doc["cluster"]
    fig.suptitle(
        f"bench cluster --systems: {c['nodes']} hollow trays, {c['gpus']} GPUs; "
        f"half-placed gangs {half or 'n/a'}"
        + (f"; not run: {', '.join(skipped)}" if skipped else "")
        + f"\n{doc.get('machine', '')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
