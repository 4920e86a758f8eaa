"""Trays that fail and return: what each system loses when a tray fails under a running gang.

A simulator of its own beside ``sim`` (whose queue rules it leaves alone): one policy, one cluster, one
job stream, and one outage schedule per tray, the same for every policy of a seed (each tray draws its
up and down times from a stream seeded by the seed and its index alone, so the schedule does not depend
on what the policy did). Deterministic; no wall clock.

Failure model
-------------
- Each tray is up for an exponential time of mean ``mtbf_h``, then down for an exponential time of mean
  ``repair_h``, independently. A down tray holds no pod and takes none (``schedulable=False``).
- A job checkpoints every ``checkpoint_s`` of progress since it (re)started. A tray failing under a
  running job rolls the whole job back to its last checkpoint: **lost to failures** is the job's GPUs x
  the progress since that checkpoint (a data-parallel step needs every rank).
- **Lost to waiting**: the job's GPUs x the time from the failure until it runs again (the job's side:
  its GPUs make no progress meanwhile, held or not). **Held idle** is the part of it its own GPUs sat
  idle, held for it (capacity nobody else could use).

What each system does when a tray fails under a running gang (``BEHAVIOUR``):

- ``ours`` (issue 29 item 5, repair inside the domain): each lost pod is re-placed on a free, up tray of
  the same NVLink (tier-1) domain, best fit, the rest of the gang staying where it is; if there is none
  the gang keeps its other pods and waits, first in line for the next tray that frees in that domain
  (a job ending there, or a repair). ``FailureConfig.ours_wait_h`` bounds that wait (the extender's
  ``--repair-wait``, default ``DEFAULT_OURS_WAIT_H``); what follows is ``ours_after_wait``: ``afresh``
  (the gang's own controller restarts it, placed afresh as the restarting systems do: the extender
  keeps a ``gpuagent.dev/repair: same-domain`` replacement waiting and says so in an Event, it never
  moves the other pods itself), ``any`` (``gpuagent.dev/repair: any``: the lost pods go to free trays
  of any domain, best fit, so the subgroup runs across domains) or ``wait`` (for ever: nothing
  restarts the gang).
- ``kueue``: ``TASFailedNodeReplacement`` (beta, on): the lost pods go to free nodes inside the
  podset's required domain (the gang tier; the whole cluster without one), best fit and blind to the
  NVLink level, so a subgroup may end across racks; with none free, ``TASFailedNodeReplacementFailFast``
  (beta, on) evicts the workload, which queues again.
- ``volcano``: a Volcano Job's ``PodFailed``/``PodEvicted`` -> ``RestartJob`` policy, the one its
  distributed-training examples use: the whole gang is torn down and queued again, then placed afresh.
- ``kai``: KAI has no replacement; the job's controller (JobSet, PyTorchJob) restarts the whole job,
  which KAI places afresh as one gang.
- ``slurm``: a job on a failed node is requeued (``--requeue``) and placed afresh; the node is drained
  until repaired.
- ``kube-default``: not a gang scheduler; not modelled here.

Queue: the same for every system, so the comparison is about what happens at a failure: jobs in
arrival order, every job the policy places now starts (a requeued job keeps its arrival time);
jobs waiting for a spare tray (ours) go first. A job records whether every subgroup of it sat inside
one NVLink domain for all the time it ran.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler_plugin.placement.policies.base import Policy
from scheduler_plugin.placement.shapes import Cluster
from scheduler_plugin.placement.workloads import Job
from scheduler_plugin.snapshot import ClusterSnapshot, Infeasible, NodeState, PodSlot

BEHAVIOUR: dict[str, str] = {
    "ours": "repair inside the NVLink domain at once, else wait for a tray there (bounded), then afresh",
    "kueue": "replace the node inside the podset's domain (NVLink-blind), else evict and requeue",
    "volcano": "RestartJob: the whole gang requeued and placed afresh",
    "kai": "the job's controller restarts the whole gang; placed afresh",
    "slurm": "requeue (--requeue): placed afresh; the node drained until repaired",
}

# Meta's Llama 3 paper (Dubey et al., 2024, section 3.3.4): 419 unexpected interruptions in 54 days of
# 16,384 H100 GPUs, about 78 % of them hardware: 16,384 x 54 x 24 / (0.78 x 419) = 64,900 GPU-hours
# between hardware interruptions, 16,200 hours for a tray of 4 GPUs.
DEFAULT_MTBF_H = 16_200.0
# The paper gives no repair time; a tray swapped within a working day is our assumption, not a figure.
DEFAULT_REPAIR_H = 24.0
DEFAULT_CHECKPOINT_S = 1800.0
# ours: hours a gang waits for a tray in its domain (the extender's --repair-wait default, 1800 s):
# ``bench placement --tray-failures --ours-repair-wait-h`` over 0..8 h (README, issue 29) lost the least
# GPU-hours between 0.1 and 1 h at both MTBFs; a tray that frees inside half an hour is the common case
# worth waiting for (a job ending there), a repair (a day) is not
DEFAULT_OURS_WAIT_H = 0.5
AFTER_WAIT = ("afresh", "any", "wait")


@dataclass(frozen=True, slots=True)
class FailureConfig:
    mtbf_h: float = DEFAULT_MTBF_H
    repair_h: float = DEFAULT_REPAIR_H
    checkpoint_s: float = DEFAULT_CHECKPOINT_S
    # ours: hours a gang waits for a tray in its domain before it is placed afresh (None: for ever, as
    # issue 29 item 5 says; 0: at once). A variant to measure, not the extender's behaviour
    ours_wait_h: float | None = DEFAULT_OURS_WAIT_H
    ours_after_wait: str = "afresh"  # one of AFTER_WAIT (module docstring)
    seed: int = 1

    def __post_init__(self) -> None:
        if self.ours_after_wait not in AFTER_WAIT:
            raise ValueError(
                f"ours_after_wait must be one of {', '.join(AFTER_WAIT)}, got {self.ours_after_wait!r}"
            )
        wait = self.ours_wait_h
        if wait is not None and not (isinstance(wait, int | float) and math.isfinite(wait) and wait >= 0):
            raise ValueError(f"ours_wait_h must be a non-negative number, got {wait!r}")
        for name in ("mtbf_h", "repair_h", "checkpoint_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")


@dataclass(slots=True)
class FailureRecord:
    name: str
    gpus: int
    subgroups: int  # tier-1 subgroups it asks for
    started: bool = False
    end_s: float | None = None
    hits: int = 0  # tray failures under it while it ran
    lost_gpu_s: float = 0.0  # progress rolled back x GPUs
    waiting_gpu_s: float = 0.0  # GPUs x time from a failure until it ran again
    held_idle_gpu_s: float = 0.0  # its own GPUs held idle meanwhile
    split: bool = False  # some subgroup ran across NVLink domains at some time


@dataclass(frozen=True, slots=True)
class FailureResult:
    policy: str
    records: tuple[FailureRecord, ...]
    outages: int  # tray failures in the run
    end_s: float

    def summary(self) -> dict[str, float]:
        started = [r for r in self.records if r.started]
        grouped = [r for r in started if r.subgroups]
        return {
            "jobs": len(self.records),
            "finished": sum(1 for r in self.records if r.end_s is not None),
            "outages": self.outages,
            "jobs_hit": sum(1 for r in started if r.hits),
            "hits": sum(r.hits for r in started),
            "grouped_jobs": len(grouped),
            "grouped_in_domain": sum(1 for r in grouped if not r.split),
            "lost_gpu_h": sum(r.lost_gpu_s for r in started) / 3600,
            "waiting_gpu_h": sum(r.waiting_gpu_s for r in started) / 3600,
            "held_idle_gpu_h": sum(r.held_idle_gpu_s for r in started) / 3600,
            "makespan_h": self.end_s / 3600,
        }


@dataclass(slots=True)
class _Job:
    job: Job
    record: FailureRecord
    pods: dict[PodSlot, int] = field(default_factory=dict)  # placed pod -> node
    lost: list[PodSlot] = field(default_factory=list)  # pods to re-place (ours: waiting for a tray)
    done_s: float = 0.0  # progress at the last checkpoint it resumed from
    since: float | None = None  # when it (re)started running; None: not running
    stopped_at: float = 0.0  # when its last failure stopped it
    seq: int = 0  # its completion entry's number (stale entries are skipped)


class _Outages:
    """Each tray's up and down times, drawn from a stream of its own (seed, index)."""

    def __init__(self, count: int, cfg: FailureConfig) -> None:
        self.cfg = cfg
        self.rng = [random.Random(f"tray-{cfg.seed}-{k}") for k in range(count)]

    def up_for(self, k: int) -> float:
        return self.rng[k].expovariate(1.0 / (self.cfg.mtbf_h * 3600))

    def down_for(self, k: int) -> float:
        return self.rng[k].expovariate(1.0 / (self.cfg.repair_h * 3600))


def simulate_failures(  # noqa: C901 - one event loop; to be split with sim.simulate
    cluster: Cluster,
    jobs: list[Job],
    policy: Policy,
    cfg: FailureConfig,
    *,
    schedule: Mapping[int, tuple[float, float]] | None = None,
) -> FailureResult:
    """Run ``jobs`` (sorted by arrival) through ``policy`` on ``cluster`` with trays failing as ``cfg``
    says, until every job has ended. ``schedule``: instead, exactly these outages (node index ->
    (down at, up at), once each)."""
    if policy.name not in BEHAVIOUR:
        raise ValueError(f"no failure behaviour for policy {policy.name!r}; valid: {', '.join(BEHAVIOUR)}")
    tier1 = cluster.tiers[0]
    nodes = cluster.nodes
    index = {n.name: i for i, n in enumerate(nodes)}
    free = [n.gpus for n in nodes]
    down = [False] * len(nodes)
    states = [NodeState(name=n.name, gpus=n.gpus, free=n.gpus, domains=n.domains) for n in nodes]
    cached: list[ClusterSnapshot | None] = [None]
    outages = _Outages(len(nodes), cfg)
    events: list[tuple[float, int, int, str, int]] = []  # (time, order, seq, kind, node or job)
    counter = 0

    def push(at: float, kind: str, what: int, seq: int = 0) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(events, (at, counter, seq, kind, what))

    def set_free(k: int, value: int) -> None:
        free[k] = value
        states[k] = NodeState(
            name=nodes[k].name,
            gpus=nodes[k].gpus,
            free=value,
            domains=nodes[k].domains,
            schedulable=not down[k],
        )
        cached[0] = None

    def snapshot() -> ClusterSnapshot:
        snap = cached[0]
        if snap is None:
            snap = cached[0] = ClusterSnapshot(tiers=cluster.tiers, nodes=tuple(states))
        return snap

    live: list[_Job] = []
    for job in jobs:
        subgroups = sum(
            -(-r.pods // r.subgroup_size)
            for r in job.gang.roles
            if r.subgroup_tier == tier1 and r.subgroup_size
        )
        live.append(_Job(job=job, record=FailureRecord(job.name, job.gpus, subgroups)))
        push(job.arrival_s, "arrive", len(live) - 1)
    for k in range(len(nodes)):
        if schedule is None:
            push(outages.up_for(k), "fail", k)
        elif k in schedule:
            push(schedule[k][0], "fail", k)
    queue: list[int] = []  # waiting to be placed, in arrival order
    waiting: list[int] = []  # ours: holding pods, waiting for a tray in their domain
    running: dict[int, _Job] = {}
    on_node: list[set[int]] = [set() for _ in nodes]
    per_pod = [{r.name: r.gpus_per_pod for r in lj.job.gang.roles} for lj in live]
    t = 0.0
    count_outages = 0
    remaining = len(jobs)

    def split(j: int) -> bool:
        lj = live[j]
        for role in lj.job.gang.roles:
            if role.subgroup_tier != tier1 or not role.subgroup_size:
                continue
            blocks: dict[int, set[str]] = {}
            for pod, k in lj.pods.items():
                if pod.role == role.name:
                    blocks.setdefault(pod.index // role.subgroup_size, set()).add(nodes[k].domains[tier1])
            if any(len(d) > 1 for d in blocks.values()):
                return True
        return False

    def run(j: int, now: float) -> None:
        lj = live[j]
        lj.since = now
        lj.record.started = True
        lj.record.split = lj.record.split or split(j)
        lj.seq += 1
        running[j] = lj
        push(now + lj.job.runtime_s - lj.done_s, "end", j, lj.seq)

    def take(j: int, pod: PodSlot, k: int) -> None:
        set_free(k, free[k] - per_pod[j][pod.role])
        live[j].pods[pod] = k
        on_node[k].add(j)

    def release(j: int) -> None:
        lj = live[j]
        for pod, k in lj.pods.items():
            on_node[k].discard(j)
            if not down[k]:
                set_free(k, free[k] + per_pod[j][pod.role])
        lj.pods.clear()

    def resumed(j: int, now: float) -> None:
        lj = live[j]
        gpus = lj.record.gpus
        lj.record.waiting_gpu_s += gpus * (now - lj.stopped_at)
        run(j, now)

    def best_fit(need: int, allowed: set[int] | None) -> int | None:
        fits = [
            (free[k], nodes[k].name, k)
            for k in (allowed if allowed is not None else range(len(nodes)))
            if not down[k] and free[k] >= need
        ]
        return min(fits)[2] if fits else None

    def replace(j: int, allowed_of: Mapping[PodSlot, set[int] | None]) -> bool:
        """Place the job's lost pods, each within its allowed nodes; all or none."""
        lj = live[j]
        chosen: list[tuple[PodSlot, int]] = []
        for pod in lj.lost:
            k = best_fit(per_pod[j][pod.role], allowed_of[pod])
            if k is None:
                for p, kk in chosen:  # undo
                    set_free(kk, free[kk] + per_pod[j][p.role])
                    del lj.pods[p]
                    on_node[kk].discard(j)
                return False
            take(j, pod, k)
            chosen.append((pod, k))
        lj.lost.clear()
        return True

    domain_nodes = cluster.domains(tier1)
    gang_nodes = {tier: cluster.domains(tier) for tier in cluster.tiers}

    lost_domain: dict[int, dict[PodSlot, str]] = {}

    def strike(k: int, now: float) -> None:
        for j in sorted(on_node[k]):
            lj = live[j]
            if j in running:
                del running[j]
                assert lj.since is not None
                ran = now - lj.since
                kept = math.floor(ran / cfg.checkpoint_s) * cfg.checkpoint_s
                lj.record.lost_gpu_s += lj.record.gpus * (ran - kept)
                lj.done_s += kept
                lj.since = None
                lj.stopped_at = now
                lj.record.hits += 1
            mine = [pod for pod, node in lj.pods.items() if node == k]
            for pod in mine:
                del lj.pods[pod]
                lj.lost.append(pod)
                lost_domain.setdefault(j, {})[pod] = nodes[k].domains[tier1]
            on_node[k].discard(j)
            name = policy.name
            if name == "ours":
                allowed = {pod: set(domain_nodes[lost_domain[j][pod]]) for pod in lj.lost}
                if replace(j, allowed):
                    lost_domain.pop(j, None)
                    resumed(j, now)
                elif cfg.ours_wait_h == 0 and cfg.ours_after_wait == "afresh":
                    requeue(j)
                elif j not in waiting:
                    waiting.append(j)
                    if cfg.ours_wait_h is not None and cfg.ours_after_wait != "wait":
                        push(now + cfg.ours_wait_h * 3600, "give up", j)
            elif name == "kueue":
                tier = lj.job.gang.tier
                scope: set[int] | None = None
                if tier is not None:
                    here = next(iter(lj.pods.values()), k)
                    scope = set(gang_nodes[tier][nodes[here].domains[tier]])
                if replace(j, dict.fromkeys(lj.lost, scope)):
                    lost_domain.pop(j, None)
                    resumed(j, now)
                else:
                    requeue(j)
            else:
                requeue(j)

    def requeue(j: int) -> None:
        lj = live[j]
        release(j)
        lj.lost.clear()
        lost_domain.pop(j, None)
        queue.append(j)
        queue.sort(key=lambda q: (live[q].job.arrival_s, live[q].job.name))

    def place_queued(now: float) -> None:
        for j in list(waiting):  # ours: the first tray that frees in the domain is theirs
            allowed = {pod: set(domain_nodes[lost_domain[j][pod]]) for pod in live[j].lost}
            if replace(j, allowed):
                waiting.remove(j)
                lost_domain.pop(j, None)
                resumed(j, now)
            elif (
                cfg.ours_wait_h is not None
                and cfg.ours_after_wait != "wait"
                and now >= live[j].stopped_at + cfg.ours_wait_h * 3600
            ):
                if cfg.ours_after_wait == "any":  # gpuagent.dev/repair: any — any domain, best fit
                    if replace(j, dict.fromkeys(live[j].lost)):
                        waiting.remove(j)
                        lost_domain.pop(j, None)
                        resumed(j, now)
                    continue
                waiting.remove(j)
                requeue(j)
        failed: set[object] = set()
        total_free = sum(f for f, d in zip(free, down, strict=True) if not d)
        for j in list(queue):
            lj = live[j]
            shape = (
                lj.job.gpus,
                lj.job.gang.tier,
                tuple((r.pods, r.subgroup_size) for r in lj.job.gang.roles),
            )
            if shape in failed or lj.job.gpus > total_free:
                continue
            result = policy.place(snapshot(), lj.job.gang)
            if isinstance(result, Infeasible):
                failed.add(shape)
                continue
            for pod, node_name in sorted(result.placement.items()):
                take(j, pod, index[node_name])
            total_free -= lj.job.gpus
            queue.remove(j)
            if lj.record.hits:
                resumed(j, now)
            else:
                run(j, now)

    while events and remaining:
        at, _, seq, kind, what = heapq.heappop(events)
        for j in waiting:  # their own GPUs sat idle since the last event
            live[j].record.held_idle_gpu_s += sum(per_pod[j][p.role] for p in live[j].pods) * (at - t)
        t = at
        if kind == "arrive":
            queue.append(what)
        elif kind == "end":
            lj = live[what]
            if what not in running or lj.seq != seq:
                continue
            del running[what]
            release(what)
            lj.record.end_s = t
            remaining -= 1
        elif kind == "fail":
            count_outages += 1
            down[what] = True
            set_free(what, 0)
            strike(what, t)
            back = schedule[what][1] if schedule is not None else t + outages.down_for(what)
            push(max(t, back), "repair", what)
        elif kind == "repair":
            down[what] = False
            set_free(what, nodes[what].gpus)  # its pods left it when it failed
            if schedule is None:
                push(t + outages.up_for(what), "fail", what)
        if kind in ("arrive", "end", "repair", "fail", "give up"):
            place_queued(t)
    return FailureResult(
        policy=policy.name, records=tuple(lj.record for lj in live), outages=count_outages, end_s=t
    )


def report(
    rows: Mapping[str, list[dict[str, float]]],
    *,
    seeds: list[int],
    racks: int,
    jobs: int,
    cfg: FailureConfig,
    machine: str,
) -> str:
    """The study's Markdown: means over the seeds per system, ours paired with each anchor seed by
    seed, and the two aims with whether they held."""

    def mean(name: str, key: str) -> float:
        return sum(r[key] for r in rows[name]) / len(rows[name])

    def cost(r: Mapping[str, float]) -> float:
        return r["lost_gpu_h"] + r["waiting_gpu_h"]

    lines = [
        f"## bench placement --tray-failures: NVL72 mix, {racks} racks, {jobs} jobs, seeds "
        f"{seeds[0]}..{seeds[-1]}",
        "",
        machine,
        f"trays: MTBF {cfg.mtbf_h:g} h, repair {cfg.repair_h:g} h (exponential); checkpoint every "
        f"{cfg.checkpoint_s / 60:g} min of progress; queue: arrival order, every job that fits starts; "
        + (
            "ours waits for a tray in its domain for ever"
            if cfg.ours_wait_h is None or cfg.ours_after_wait == "wait"
            else f"ours waits for a tray in its domain at most {cfg.ours_wait_h:g} h, then "
            + (
                "is placed afresh (its controller restarts it)"
                if cfg.ours_after_wait == "afresh"
                else "its lost pods go to any domain (gpuagent.dev/repair: any)"
            )
        ),
        "",
        "| system | at a tray failure | outages | jobs hit | hits | lost to failures GPU-h | "
        "waiting GPU-h | of it held idle GPU-h | lost + waiting GPU-h | jobs with every subgroup in one "
        "domain | makespan h |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in rows:
        grouped = sum(r["grouped_jobs"] for r in rows[name])
        local = sum(r["grouped_in_domain"] for r in rows[name])
        lines.append(
            f"| {name} | {BEHAVIOUR[name]} | {mean(name, 'outages'):.1f} | {mean(name, 'jobs_hit'):.1f} | "
            f"{mean(name, 'hits'):.1f} | {mean(name, 'lost_gpu_h'):.0f} | "
            f"{mean(name, 'waiting_gpu_h'):.0f} | {mean(name, 'held_idle_gpu_h'):.0f} | "
            f"{sum(cost(r) for r in rows[name]) / len(rows[name]):.0f} | "
            f"{local}/{grouped} | {mean(name, 'makespan_h'):.1f} |"
        )
    lines += [
        "",
        "Paired by seed, ours minus the anchor (lost + waiting GPU-h; negative: ours loses less):",
        "",
    ]
    fewest = True
    for name in rows:
        if name == "ours":
            continue
        diffs = [cost(a) - cost(b) for a, b in zip(rows["ours"], rows[name], strict=True)]
        wins = sum(1 for d in diffs if d <= 0)
        fewest = fewest and sum(diffs) <= 0
        shown = ", ".join(f"{d:+.0f}" for d in diffs)
        lines.append(
            f"- {name}: mean {sum(diffs) / len(diffs):+.0f} ({shown}); ours no worse in {wins}/{len(diffs)}"
        )
    across = sum(r["grouped_jobs"] - r["grouped_in_domain"] for r in rows["ours"])
    lines += [
        "",
        f"aim: ours loses the fewest GPU-hours (lost + waiting, mean over seeds): "
        f"{'holds' if fewest else 'does NOT hold'}",
        f"aim: ours never runs a subgroup across NVLink domains: "
        f"{'holds' if across == 0 else f'does NOT hold ({across:g} jobs)'}",
    ]
    return "\n".join(lines) + "\n"
