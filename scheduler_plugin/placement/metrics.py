"""Figures of one simulation run (pure arithmetic over a ``SimResult``).

- ``allocation_ratio``: allocated GPUs / cluster GPUs, time-weighted over the arrival window (GPUs held
  by partly placed gangs count as allocated; they are idle, which is the point of showing them).
- ``allocation_ratio_saturated``: the same over the part of the window when at least one job waited.
- ``wait_mean_s``, ``wait_p95_s``: start minus arrival; a job that never started counts with the wait
  it had when the run ended (a lower bound), and ``unstarted_jobs`` says how many did.
- ``jct_mean_s``: completion minus arrival, over jobs that completed.
- ``nvlink_local_ratio``: subgroups that require one tier-1 domain and got one, over all such subgroups
  of started jobs (a hard constraint: anything under 1.0 is a broken placement).
- ``stranded_gpus_mean``: time-weighted free GPUs in tier-1 domains that cannot host the smallest
  waiting subgroup (0 while nobody waits).
- ``free_domains_mean``: time-weighted count of wholly free tier-1 domains (``free_<tier>_domains_mean``
  the same for the higher tiers).
- ``plan_p50_ms``, ``plan_p99_ms``: wall time of the policy's placement calls (nearest rank).
- ``partial_gangs``: jobs that held some pods while waiting for the rest.
- ``wait_mean_by_gpus_s``: mean wait per gang size (GPUs), to see which jobs a policy makes wait.
- ``wait_mean_by_class_s`` and ``jobs_by_class`` (given ``domain_gpus``, the GPUs of a tier-1 domain):
  the same per size class (``size_class``): ``small`` (at most half a domain), ``one domain`` (more
  than half a domain, at most one) and ``several domains``; a class without jobs is left out.
- ``wait_max_s`` and ``wait_max_ratio`` (the largest wait over the mean): starvation shows here.
- ``hp_wait_p50_s``, ``hp_wait_p95_s``: the same waits over the high-priority jobs only (None when the
  stream has none); ``preempted_gpu_hours``: GPU-time evictions threw away; ``preemptions``: evictions;
  ``half_preempted_gangs``: jobs that lost some of their pods but not all in an eviction.

``paired`` compares two policies seed by seed (the same job stream per seed), which is what tells a
difference between policies from the spread between seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from scheduler_plugin.placement.sim import SimResult

SIZE_CLASSES: tuple[str, ...] = ("small", "one domain", "several domains")

FIGURES: tuple[str, ...] = (
    "allocation_ratio",
    "wait_mean_s",
    "wait_p95_s",
    "jct_mean_s",
    "nvlink_local_ratio",
    "stranded_gpus_mean",
    "free_domains_mean",
    "plan_p50_ms",
    "plan_p99_ms",
    "partial_gangs",
)

# figures compared seed by seed: +1 where higher is better, -1 where lower is
BETTER: Mapping[str, int] = {
    "allocation_ratio": 1,
    "wait_mean_s": -1,
    "wait_p95_s": -1,
    "jct_mean_s": -1,
    "stranded_gpus_mean": -1,
    "free_domains_mean": 1,
    "plan_p99_ms": -1,
    "wait_max_s": -1,
    "hp_wait_p95_s": -1,
    "preempted_gpu_hours": -1,
}


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (pct in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(pct / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def size_class(gpus: int, domain_gpus: int) -> str:
    """``gpus``' class of ``SIZE_CLASSES`` on a cluster whose tier-1 domains hold ``domain_gpus``."""
    if domain_gpus < 1:
        raise ValueError(f"domain_gpus must be >= 1, got {domain_gpus}")
    if gpus > domain_gpus:
        return SIZE_CLASSES[2]
    return SIZE_CLASSES[1] if 2 * gpus > domain_gpus else SIZE_CLASSES[0]


def figures(result: SimResult, *, domain_gpus: int | None = None) -> dict[str, object]:
    window = result.window_s
    capacity = result.total_gpus
    waits = [(r.start_s if r.start_s is not None else result.end_s) - r.arrival_s for r in result.records]
    jcts = [r.end_s - r.arrival_s for r in result.records if r.end_s is not None]
    sub_total = sum(r.tier1_subgroups for r in result.records)
    sub_local = sum(r.tier1_local for r in result.records)
    plan_ms = [t * 1000 for t in result.plan_times_s]
    high = [w for r, w in zip(result.records, waits, strict=True) if r.priority > 0]
    mean_wait = sum(waits) / len(waits) if waits else None
    by_gpus: dict[int, list[float]] = {}
    for r, w in zip(result.records, waits, strict=True):
        by_gpus.setdefault(r.gpus, []).append(w)
    by_class: dict[str, list[float]] = {}
    if domain_gpus is not None:
        for r, w in zip(result.records, waits, strict=True):
            by_class.setdefault(size_class(r.gpus, domain_gpus), []).append(w)
    classes = [c for c in SIZE_CLASSES if c in by_class]
    return {
        "allocation_ratio": result.allocated_gpu_s / (capacity * window) if window > 0 else None,
        "allocation_ratio_saturated": (
            result.saturated_gpu_s / (capacity * result.saturated_s) if result.saturated_s > 0 else None
        ),
        "saturated_share": result.saturated_s / window if window > 0 else None,
        "wait_mean_s": sum(waits) / len(waits) if waits else None,
        "wait_p95_s": percentile(waits, 95) if waits else None,
        "jct_mean_s": sum(jcts) / len(jcts) if jcts else None,
        "nvlink_local_ratio": sub_local / sub_total if sub_total else None,
        "stranded_gpus_mean": result.stranded_gpu_s / window if window > 0 else None,
        "free_domains_mean": result.free_domain_s / window if window > 0 else None,
        **{
            f"free_{tier}_domains_mean": v / window
            for tier, v in result.free_upper_domain_s.items()
            if window > 0
        },
        "plan_p50_ms": percentile(plan_ms, 50) if plan_ms else None,
        "plan_p99_ms": percentile(plan_ms, 99) if plan_ms else None,
        "plan_calls": len(plan_ms),
        "partial_gangs": sum(1 for r in result.records if r.partial),
        "jobs": len(result.records),
        "unstarted_jobs": sum(1 for r in result.records if r.start_s is None),
        "deadlocked": result.deadlocked,
        "wait_mean_by_gpus_s": {str(g): sum(v) / len(v) for g, v in sorted(by_gpus.items())},
        **(
            {
                "wait_mean_by_class_s": {c: sum(by_class[c]) / len(by_class[c]) for c in classes},
                "jobs_by_class": {c: len(by_class[c]) for c in classes},
            }
            if domain_gpus is not None
            else {}
        ),
        "wait_max_s": max(waits) if waits else None,
        "wait_max_ratio": max(waits) / mean_wait if waits and mean_wait else None,
        "hp_jobs": len(high),
        "hp_wait_p50_s": percentile(high, 50) if high else None,
        "hp_wait_p95_s": percentile(high, 95) if high else None,
        "preempted_gpu_hours": sum(r.preempted_gpu_s for r in result.records) / 3600,
        "preemptions": sum(r.preemptions for r in result.records),
        "half_preempted_gangs": sum(1 for r in result.records if r.half_preempted),
    }


def paired(ours: Sequence[Mapping[str, object]], other: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """``ours`` against ``other``, seed by seed (the two lists in the same seed order), per figure of
    ``BETTER`` both have on every seed: the mean of ours minus other, its standard error (None for one
    seed), that mean relative to other's mean, and the seeds where ours is better and worse (equal
    counts as neither). ``significant`` when the mean is at least two standard errors from zero."""
    if len(ours) != len(other):
        raise ValueError(f"paired: {len(ours)} seeds against {len(other)}")
    out: dict[str, object] = {}
    for key, sign in BETTER.items():
        xs, ys = _numbers(ours, key), _numbers(other, key)
        if not xs or not ys:
            continue
        diffs = [x - y for x, y in zip(xs, ys, strict=True)]
        n = len(diffs)
        mean = sum(diffs) / n
        se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else None
        base = sum(ys) / n
        out[key] = {
            "diff_mean": mean,
            "diff_se": se,
            "relative": mean / abs(base) if base else None,
            "better_seeds": sum(1 for d in diffs if d * sign > 0),
            "worse_seeds": sum(1 for d in diffs if d * sign < 0),
            "seeds": n,
            "significant": se is not None and abs(mean) >= 2 * se and mean != 0,
        }
    return out


def _numbers(rows: Sequence[Mapping[str, object]], key: str) -> list[float] | None:
    """``key`` of every row as a float, or None if a row lacks a finite number there."""
    out: list[float] = []
    for row in rows:
        value = row.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            return None
        out.append(float(value))
    return out
