"""Job streams for the placement simulator, deterministic per seed.

``philly``: jobs of the Philly trace (``philly-jobs-seed0.tsv``: arrival and GPU count), the first
``count`` in arrival order over all virtual clusters. The trace has no runtimes joined to jobs, so each
job's runtime is **sampled** (seeded) from ``philly-runtimes.csv``, clamped to [60 s, 1 day]. GPU
counts become pods of at most 4 GPUs (the largest of 4, 2, 1 that divides the count); a job of several
pods is one subgroup that must share a tier-1 (NVLink) domain when it fits in one, else a leaf domain.

``nvl72``: a synthetic NVL72-era training mix (no public trace exists). Parameters:

========================  ======  =================================================================
gang (GPUs)               share   pods x GPUs, subgroups
========================  ======  =================================================================
8                         22 %    2 x 4, none (single nodes)
16                        16 %    4 x 4, none (single nodes)
32                        14 %    8 x 4, 4-node segments, tier ``nvlink``
64                        12 %    16 x 4, 4-node segments, tier ``nvlink``
k x 64 or k x 72          36 %    k subgroups of 16 or 18 nodes (even odds), tier ``nvlink``;
                                  k = 1, 2, 4, 8, 16, 32 with shares 11, 9, 7, 5, 3, 1 %;
                                  the whole gang inside one ``leaf`` (k = 2, 4) or ``spine``
                                  (k = 8, 16) domain when the cluster has one that large
========================  ======  =================================================================

Runtimes are log-normal: median 3,600 s x (GPUs / 64) ** 0.25, sigma 1.0, clamped to [120 s, 7 days].
On a cluster whose NVLink domain is smaller than a subgroup (DGX H100: 8 GPUs) the subgroup's tier
becomes ``leaf``.

``mixed``: both streams, each at half the target load, cut to the shorter arrival span.

Priorities (``high_priority``, default 0): that share of the jobs, drawn per job from a seeded stream of
its own (the jobs, runtimes and arrivals stay those of the same seed without it), get the PriorityClass
value ``HIGH_PRIORITY`` (a non-preemptible class in KAI's defaults, where 100 and above is not
preemptible); the rest 0 (preemptible).

Arrivals: the stream's own gaps (Philly) or unit exponential gaps (nvl72) are scaled so that the
offered load, sum(GPUs x runtime) / (cluster GPUs x arrival span), equals ``load``.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from scheduler_plugin.snapshot import Gang, Role

WORKLOADS: tuple[str, ...] = ("philly", "nvl72", "mixed")
JOBS_FILE = "philly-jobs-seed0.tsv"
RUNTIMES_FILE = "philly-runtimes.csv"
PHILLY_RUNTIME_CLAMP = (60.0, 86400.0)
NVL72_RUNTIME_CLAMP = (120.0, 7 * 86400.0)
HIGH_PRIORITY = 1000

# (gpus, share, subgroup nodes or 0) for the small classes of the nvl72 mix
NVL72_SMALL: tuple[tuple[int, float, int], ...] = ((8, 0.22, 0), (16, 0.16, 0), (32, 0.14, 4), (64, 0.12, 4))
NVL72_LARGE: tuple[tuple[int, float], ...] = (
    (1, 0.11),
    (2, 0.09),
    (4, 0.07),
    (8, 0.05),
    (16, 0.03),
    (32, 0.01),
)


class WorkloadError(ValueError):
    """Bad workload input: the message names the file and line or the option."""


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    arrival_s: float
    runtime_s: float
    gang: Gang
    source: str  # "philly" or "nvl72"
    priority: int = 0  # PriorityClass value: HIGH_PRIORITY for the high class, 0 otherwise

    @property
    def gpus(self) -> int:
        return sum(r.pods * r.gpus_per_pod for r in self.gang.roles)


@dataclass(frozen=True, slots=True)
class PhillyJob:
    arrival_s: float
    gpus: int


@dataclass(frozen=True, slots=True)
class PhillyData:
    jobs: tuple[PhillyJob, ...]  # in arrival order
    runtimes: tuple[float, ...]


def load_philly(data_dir: Path) -> PhillyData:
    """Read the two Philly files; a bad line raises ``WorkloadError`` naming file and line."""
    jobs_path = data_dir / JOBS_FILE
    rt_path = data_dir / RUNTIMES_FILE
    for p in (jobs_path, rt_path):
        if not p.is_file():
            raise WorkloadError(f"{p}: not found (set --data-dir to the folder holding {JOBS_FILE})")
    rows: list[tuple[float, str, int, int]] = []
    with jobs_path.open(encoding="utf-8") as fh:
        header = fh.readline().rstrip("\n").split("\t")
        try:
            i_vc, i_arr, i_gpu = header.index("vc"), header.index("arrival_s"), header.index("gpus")
        except ValueError:
            raise WorkloadError(f"{jobs_path}:1: header must name vc, arrival_s and gpus") from None
        for lineno, line in enumerate(fh, start=2):
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            try:
                arrival, gpus = float(cols[i_arr]), int(cols[i_gpu])
            except (ValueError, IndexError):
                raise WorkloadError(
                    f"{jobs_path}:{lineno}: bad arrival_s or gpus in {line.strip()!r}"
                ) from None
            if gpus < 1 or arrival < 0 or not math.isfinite(arrival):
                raise WorkloadError(f"{jobs_path}:{lineno}: gpus must be >= 1 and arrival_s >= 0")
            rows.append((arrival, cols[i_vc], lineno, gpus))
    rows.sort()
    runtimes: list[float] = []
    with rt_path.open(encoding="utf-8") as fh:
        if fh.readline().strip() != "runtime":
            raise WorkloadError(f"{rt_path}:1: header must be 'runtime'")
        for lineno, line in enumerate(fh, start=2):
            if not line.strip():
                continue
            try:
                value = float(line)
            except ValueError:
                raise WorkloadError(f"{rt_path}:{lineno}: not a number: {line.strip()!r}") from None
            if value < 0 or not math.isfinite(value):
                raise WorkloadError(f"{rt_path}:{lineno}: runtime must be >= 0")
            runtimes.append(value)
    if not rows or not runtimes:
        raise WorkloadError(f"{data_dir}: no jobs or no runtimes")
    return PhillyData(jobs=tuple(PhillyJob(a, g) for a, _, _, g in rows), runtimes=tuple(runtimes))


def make_gang(
    name: str,
    *,
    pods: int,
    gpus_per_pod: int,
    subgroup_nodes: int,
    nvlink_domain_gpus: int,
    gang_tier: str | None = None,
) -> Gang:
    """One role ``worker``; ``subgroup_nodes`` consecutive pods share a tier-1 domain (0: no subgroups)."""
    if subgroup_nodes <= 0:
        return Gang(
            name=name, roles=(Role(name="worker", pods=pods, gpus_per_pod=gpus_per_pod),), tier=gang_tier
        )
    tier = "nvlink" if subgroup_nodes * gpus_per_pod <= nvlink_domain_gpus else "leaf"
    if gang_tier == "leaf" and tier == "leaf":
        gang_tier = "spine"
    role = Role(
        name="worker", pods=pods, gpus_per_pod=gpus_per_pod, subgroup_size=subgroup_nodes, subgroup_tier=tier
    )
    return Gang(name=name, roles=(role,), tier=gang_tier)


def _scale_arrivals(jobs: list[Job], offsets: Sequence[float], *, load: float, capacity: int) -> list[Job]:
    """Scale arrival offsets so that the offered load over the span equals ``load``."""
    if load <= 0:
        raise WorkloadError(f"--load must be > 0, got {load}")
    work = sum(j.gpus * j.runtime_s for j in jobs)
    span = max(offsets[-1], 1e-9)
    target_span = work / (capacity * load)
    k = target_span / span
    return [replace(j, arrival_s=round(o * k, 3)) for j, o in zip(jobs, offsets, strict=True)]


def philly_jobs(
    data: PhillyData,
    *,
    count: int,
    seed: int,
    load: float,
    capacity: int,
    nvlink_domain_gpus: int,
    prefix: str = "p",
) -> list[Job]:
    if count < 1:
        raise WorkloadError(f"--jobs must be >= 1, got {count}")
    rng = random.Random(f"philly-{seed}")
    picked = [j for j in data.jobs if j.gpus <= capacity][:count]
    base = picked[0].arrival_s
    jobs: list[Job] = []
    for i, pj in enumerate(picked):
        per_pod = next(p for p in (4, 2, 1) if pj.gpus % p == 0)
        pods = pj.gpus // per_pod
        gang = make_gang(
            f"{prefix}{i:05d}",
            pods=pods,
            gpus_per_pod=per_pod,
            subgroup_nodes=pods if pods > 1 else 0,
            nvlink_domain_gpus=nvlink_domain_gpus,
        )
        lo, hi = PHILLY_RUNTIME_CLAMP
        runtime = min(hi, max(lo, rng.choice(data.runtimes)))
        jobs.append(Job(name=gang.name, arrival_s=0.0, runtime_s=runtime, gang=gang, source="philly"))
    offsets = [pj.arrival_s - base for pj in picked]
    if offsets[-1] <= 0:  # all at one instant: spread them evenly
        offsets = [float(i) for i in range(len(picked))]
    return _scale_arrivals(jobs, offsets, load=load, capacity=capacity)


def nvl72_jobs(
    *,
    count: int,
    seed: int,
    load: float,
    capacity: int,
    nvlink_domain_gpus: int,
    tier_gpus: Mapping[str, int] | None = None,
    fits: Callable[[Gang], bool] | None = None,
    prefix: str = "n",
) -> list[Job]:
    """``tier_gpus``: GPUs of the largest domain per tier (gang tiers are set only where one fits);
    ``fits``: whether a gang fits the empty cluster (classes that do not are left out, the others'
    shares renormalised)."""
    sizes = tier_gpus or {}
    if count < 1:
        raise WorkloadError(f"--jobs must be >= 1, got {count}")
    rng = random.Random(f"nvl72-{seed}")
    classes: list[tuple[float, int, int, int]] = []  # (share, pods, gpus per pod, subgroup nodes)
    for gpus, share, seg in NVL72_SMALL:
        classes.append((share, gpus // 4, 4, seg))
    for k, share in NVL72_LARGE:
        for nodes in (16, 18):
            classes.append((share / 2, k * nodes, 4, nodes))
    shaped: list[tuple[float, Gang]] = []
    for share, pods, per_pod, seg in classes:
        gpus = pods * per_pod
        k = pods // seg if seg >= 16 else 0
        want = "leaf" if k in (2, 4) else "spine" if k in (8, 16) else None
        gang_tier = want if want is not None and sizes.get(want, 0) >= gpus else None
        template = make_gang(
            "",
            pods=pods,
            gpus_per_pod=per_pod,
            subgroup_nodes=seg,
            nvlink_domain_gpus=nvlink_domain_gpus,
            gang_tier=gang_tier,
        )
        if gpus <= capacity and (fits is None or fits(template)):
            shaped.append((share, template))
    if not shaped:
        raise WorkloadError("no class of the nvl72 mix fits this cluster")
    cumulative: list[float] = []
    acc = 0.0
    for share, _ in shaped:
        acc += share
        cumulative.append(acc)
    jobs: list[Job] = []
    offsets: list[float] = []
    t = 0.0
    for i in range(count):
        _, template = shaped[min(len(shaped) - 1, bisect.bisect_right(cumulative, rng.random() * acc))]
        gpus = sum(r.pods * r.gpus_per_pod for r in template.roles)
        median = 3600.0 * (gpus / 64) ** 0.25
        lo, hi = NVL72_RUNTIME_CLAMP
        runtime = round(min(hi, max(lo, rng.lognormvariate(math.log(median), 1.0))), 1)
        gang = replace(template, name=f"{prefix}{i:05d}")
        jobs.append(Job(name=gang.name, arrival_s=0.0, runtime_s=runtime, gang=gang, source="nvl72"))
        offsets.append(t)
        t += rng.expovariate(1.0)
    return _scale_arrivals(jobs, offsets, load=load, capacity=capacity)


def build(
    workload: str,
    *,
    count: int,
    seed: int,
    load: float,
    capacity: int,
    nvlink_domain_gpus: int,
    tier_gpus: Mapping[str, int] | None = None,
    fits: Callable[[Gang], bool] | None = None,
    philly: PhillyData | None = None,
    high_priority: float = 0.0,
) -> list[Job]:
    """The job stream, sorted by (arrival, name); ``high_priority``: the share of jobs in the high class."""
    if not 0.0 <= high_priority <= 1.0:
        raise WorkloadError(f"--high-priority must be in [0, 1], got {high_priority}")
    if workload == "nvl72":
        jobs = nvl72_jobs(
            count=count,
            seed=seed,
            load=load,
            capacity=capacity,
            nvlink_domain_gpus=nvlink_domain_gpus,
            tier_gpus=tier_gpus,
            fits=fits,
        )
    elif workload in ("philly", "mixed"):
        if philly is None:
            raise WorkloadError(f"workload {workload!r} needs the Philly data (--data-dir)")
        if workload == "philly":
            jobs = philly_jobs(
                philly,
                count=count,
                seed=seed,
                load=load,
                capacity=capacity,
                nvlink_domain_gpus=nvlink_domain_gpus,
            )
        else:
            a = philly_jobs(
                philly,
                count=count,
                seed=seed,
                load=load / 2,
                capacity=capacity,
                nvlink_domain_gpus=nvlink_domain_gpus,
            )
            b = nvl72_jobs(
                count=max(1, count // 4),
                seed=seed,
                load=load / 2,
                capacity=capacity,
                nvlink_domain_gpus=nvlink_domain_gpus,
                tier_gpus=tier_gpus,
                fits=fits,
            )
            end = min(a[-1].arrival_s, b[-1].arrival_s)
            jobs = [j for j in a + b if j.arrival_s <= end]
    else:
        raise WorkloadError(f"--workload: unknown {workload!r}; valid: {', '.join(WORKLOADS)}")
    ordered = sorted(jobs, key=lambda j: (j.arrival_s, j.name))
    if high_priority > 0:
        rng = random.Random(f"priority-{seed}")
        ordered = [replace(j, priority=HIGH_PRIORITY if rng.random() < high_priority else 0) for j in ordered]
    return ordered
