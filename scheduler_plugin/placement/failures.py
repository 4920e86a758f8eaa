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
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler_plugin.placement.policies.base import Policy
from scheduler_plugin.placement.shapes import Cluster, NodeSpec
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


class _Trays:
    """The trays' side of a run: free GPUs, which trays are down, and the snapshot policies see."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.nodes = cluster.nodes
        self.index = {n.name: i for i, n in enumerate(self.nodes)}
        self.free = [n.gpus for n in self.nodes]
        self.down = [False] * len(self.nodes)
        self.states = [
            NodeState(name=n.name, gpus=n.gpus, free=n.gpus, domains=n.domains) for n in self.nodes
        ]
        self.on_node: list[set[int]] = [set() for _ in self.nodes]  # jobs holding pods there
        self._snapshot: ClusterSnapshot | None = None

    def set_free(self, k: int, value: int) -> None:
        node = self.nodes[k]
        self.free[k] = value
        self.states[k] = NodeState(
            name=node.name, gpus=node.gpus, free=value, domains=node.domains, schedulable=not self.down[k]
        )
        self._snapshot = None

    def snapshot(self) -> ClusterSnapshot:
        if self._snapshot is None:
            self._snapshot = ClusterSnapshot(tiers=self.cluster.tiers, nodes=tuple(self.states))
        return self._snapshot

    def best_fit(self, need: int, allowed: set[int] | None) -> int | None:
        """The up tray among ``allowed`` (None: any) with the fewest free GPUs that still hold
        ``need``, then by name."""
        free, down, nodes = self.free, self.down, self.nodes
        fits = [
            (free[k], nodes[k].name, k)
            for k in (allowed if allowed is not None else range(len(nodes)))
            if not down[k] and free[k] >= need
        ]
        return min(fits)[2] if fits else None

    def free_up(self) -> int:
        """Free GPUs on the trays that are up."""
        return sum(f for f, d in zip(self.free, self.down, strict=True) if not d)


def _split(lj: _Job, nodes: Sequence[NodeSpec], tier1: str) -> bool:
    """Whether some tier-1 subgroup of the job has pods in more than one tier-1 domain now."""
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


class _FailureRun:
    """One run of ``simulate_failures``: the event loop, one handler per event kind, and what each
    system does when a tray fails under a running job (``BEHAVIOUR``)."""

    def __init__(
        self,
        cluster: Cluster,
        jobs: list[Job],
        policy: Policy,
        cfg: FailureConfig,
        schedule: Mapping[int, tuple[float, float]] | None,
    ) -> None:
        self.policy = policy
        self.cfg = cfg
        self.schedule = schedule
        self.tier1 = cluster.tiers[0]
        self.trays = _Trays(cluster)
        self.outages = _Outages(len(cluster.nodes), cfg)
        self.events: list[tuple[float, int, int, str, int]] = []  # (time, order, seq, kind, node or job)
        self.counter = 0
        self.domain_nodes = cluster.domains(self.tier1)
        self.gang_nodes = {tier: cluster.domains(tier) for tier in cluster.tiers}
        self.live: list[_Job] = []
        self.queue: list[int] = []  # waiting to be placed, in arrival order
        self.waiting: list[int] = []  # ours: holding pods, waiting for a tray in their domain
        self.running: dict[int, _Job] = {}
        self.lost_domain: dict[int, dict[PodSlot, str]] = {}  # per job: each lost pod's tier-1 domain
        self.t = 0.0
        self.count_outages = 0
        self.remaining = len(jobs)
        for job in jobs:
            subgroups = sum(
                -(-r.pods // r.subgroup_size)
                for r in job.gang.roles
                if r.subgroup_tier == self.tier1 and r.subgroup_size
            )
            self.live.append(_Job(job=job, record=FailureRecord(job.name, job.gpus, subgroups)))
            self.push(job.arrival_s, "arrive", len(self.live) - 1)
        for k in range(len(cluster.nodes)):
            if schedule is None:
                self.push(self.outages.up_for(k), "fail", k)
            elif k in schedule:
                self.push(schedule[k][0], "fail", k)
        self.per_pod = [{r.name: r.gpus_per_pod for r in lj.job.gang.roles} for lj in self.live]

    def push(self, at: float, kind: str, what: int, seq: int = 0) -> None:
        self.counter += 1
        heapq.heappush(self.events, (at, self.counter, seq, kind, what))

    def run(self) -> FailureResult:
        handlers: dict[str, Callable[[int, int], bool]] = {
            "arrive": self._on_arrive,
            "end": self._on_end,
            "fail": self._on_fail,
            "repair": self._on_repair,
            "give up": lambda _j, _seq: True,  # ours: the bounded wait is over (``_serve_waiting``)
        }
        live, per_pod = self.live, self.per_pod
        while self.events and self.remaining:
            at, _, seq, kind, what = heapq.heappop(self.events)
            for j in self.waiting:  # their own GPUs sat idle since the last event
                live[j].record.held_idle_gpu_s += sum(per_pod[j][p.role] for p in live[j].pods) * (
                    at - self.t
                )
            self.t = at
            if handlers[kind](what, seq):
                self._serve_waiting(self.t)
                self._place_queue(self.t)
        return FailureResult(
            policy=self.policy.name,
            records=tuple(lj.record for lj in live),
            outages=self.count_outages,
            end_s=self.t,
        )

    # -- events: whether the queue gets a pass after them ---------------------------------------
    def _on_arrive(self, j: int, _seq: int) -> bool:
        self.queue.append(j)
        return True

    def _on_end(self, j: int, seq: int) -> bool:
        lj = self.live[j]
        if j not in self.running or lj.seq != seq:
            return False  # a stale entry: the job stopped since
        del self.running[j]
        self._release(j)
        lj.record.end_s = self.t
        self.remaining -= 1
        return True

    def _on_fail(self, k: int, _seq: int) -> bool:
        t, trays = self.t, self.trays
        self.count_outages += 1
        trays.down[k] = True
        trays.set_free(k, 0)
        for j in sorted(trays.on_node[k]):
            self._strike(j, k, t)
        back = self.schedule[k][1] if self.schedule is not None else t + self.outages.down_for(k)
        self.push(max(t, back), "repair", k)
        return True

    def _on_repair(self, k: int, _seq: int) -> bool:
        trays = self.trays
        trays.down[k] = False
        trays.set_free(k, trays.nodes[k].gpus)  # its pods left it when it failed
        if self.schedule is None:
            self.push(self.t + self.outages.up_for(k), "fail", k)
        return True

    # -- jobs ------------------------------------------------------------------------------------
    def _start(self, j: int, now: float) -> None:
        lj = self.live[j]
        lj.since = now
        lj.record.started = True
        lj.record.split = lj.record.split or _split(lj, self.trays.nodes, self.tier1)
        lj.seq += 1
        self.running[j] = lj
        self.push(now + lj.job.runtime_s - lj.done_s, "end", j, lj.seq)

    def _resumed(self, j: int, now: float) -> None:
        """The job runs again after a failure stopped it (none of its pods is lost any more)."""
        self.lost_domain.pop(j, None)
        lj = self.live[j]
        lj.record.waiting_gpu_s += lj.record.gpus * (now - lj.stopped_at)
        self._start(j, now)

    def _take(self, j: int, pod: PodSlot, k: int) -> None:
        trays = self.trays
        trays.set_free(k, trays.free[k] - self.per_pod[j][pod.role])
        self.live[j].pods[pod] = k
        trays.on_node[k].add(j)

    def _release(self, j: int) -> None:
        lj, trays = self.live[j], self.trays
        for pod, k in lj.pods.items():
            trays.on_node[k].discard(j)
            if not trays.down[k]:
                trays.set_free(k, trays.free[k] + self.per_pod[j][pod.role])
        lj.pods.clear()

    def _replace(self, j: int, allowed_of: Mapping[PodSlot, set[int] | None]) -> bool:
        """Place the job's lost pods, each within its allowed nodes; all or none."""
        lj, trays = self.live[j], self.trays
        chosen: list[tuple[PodSlot, int]] = []
        for pod in lj.lost:
            k = trays.best_fit(self.per_pod[j][pod.role], allowed_of[pod])
            if k is None:
                for p, kk in chosen:  # undo
                    trays.set_free(kk, trays.free[kk] + self.per_pod[j][p.role])
                    del lj.pods[p]
                    trays.on_node[kk].discard(j)
                return False
            self._take(j, pod, k)
            chosen.append((pod, k))
        lj.lost.clear()
        return True

    def _in_domain(self, j: int) -> dict[PodSlot, set[int] | None]:
        """Each lost pod's allowed trays for ours: those of the tier-1 domain it was lost from."""
        lost = self.lost_domain[j]
        return {pod: set(self.domain_nodes[lost[pod]]) for pod in self.live[j].lost}

    def _requeue(self, j: int) -> None:
        lj = self.live[j]
        self._release(j)
        lj.lost.clear()
        self.lost_domain.pop(j, None)
        self.queue.append(j)
        self.queue.sort(key=lambda q: (self.live[q].job.arrival_s, self.live[q].job.name))

    # -- a tray fails under a job -----------------------------------------------------------------
    def _strike(self, j: int, k: int, now: float) -> None:
        """Tray ``k`` failed under job ``j``: roll it back if it ran, mark its pods there lost, and
        do what its system does (``BEHAVIOUR``)."""
        lj = self.live[j]
        if j in self.running:
            self._stop(j, now)
        domain = self.trays.nodes[k].domains[self.tier1]
        for pod in [pod for pod, node in lj.pods.items() if node == k]:
            del lj.pods[pod]
            lj.lost.append(pod)
            self.lost_domain.setdefault(j, {})[pod] = domain
        self.trays.on_node[k].discard(j)
        if self.policy.name == "ours":
            self._ours_struck(j, now)
        elif self.policy.name == "kueue":
            self._kueue_struck(j, k, now)
        else:
            self._requeue(j)

    def _stop(self, j: int, now: float) -> None:
        """Stop a running job: the progress since its last checkpoint is lost."""
        lj, checkpoint = self.live[j], self.cfg.checkpoint_s
        del self.running[j]
        assert lj.since is not None
        ran = now - lj.since
        kept = math.floor(ran / checkpoint) * checkpoint
        lj.record.lost_gpu_s += lj.record.gpus * (ran - kept)
        lj.done_s += kept
        lj.since = None
        lj.stopped_at = now
        lj.record.hits += 1

    def _ours_struck(self, j: int, now: float) -> None:
        """Ours: repair inside the domain at once, else wait for a tray there (bounded), or (no wait,
        afresh) be placed afresh."""
        cfg = self.cfg
        if self._replace(j, self._in_domain(j)):
            self._resumed(j, now)
        elif cfg.ours_wait_h == 0 and cfg.ours_after_wait == "afresh":
            self._requeue(j)
        elif j not in self.waiting:
            self.waiting.append(j)
            if cfg.ours_wait_h is not None and cfg.ours_after_wait != "wait":
                self.push(now + cfg.ours_wait_h * 3600, "give up", j)

    def _kueue_struck(self, j: int, k: int, now: float) -> None:
        """Kueue: the lost pods to free trays inside the podset's required domain, else requeue."""
        lj, nodes = self.live[j], self.trays.nodes
        tier = lj.job.gang.tier
        scope: set[int] | None = None
        if tier is not None:
            here = next(iter(lj.pods.values()), k)
            scope = set(self.gang_nodes[tier][nodes[here].domains[tier]])
        if self._replace(j, dict.fromkeys(lj.lost, scope)):
            self._resumed(j, now)
        else:
            self._requeue(j)

    # -- the queue ---------------------------------------------------------------------------------
    def _serve_waiting(self, now: float) -> None:
        """Ours: the first tray that frees in a waiting job's domain is its; a job whose wait is over
        goes on as ``ours_after_wait`` says."""
        cfg = self.cfg
        for j in list(self.waiting):
            if self._replace(j, self._in_domain(j)):
                self.waiting.remove(j)
                self._resumed(j, now)
            elif (
                cfg.ours_wait_h is not None
                and cfg.ours_after_wait != "wait"
                and now >= self.live[j].stopped_at + cfg.ours_wait_h * 3600
            ):
                if cfg.ours_after_wait == "any":  # gpuagent.dev/repair: any — any domain, best fit
                    if self._replace(j, dict.fromkeys(self.live[j].lost)):
                        self.waiting.remove(j)
                        self._resumed(j, now)
                    continue
                self.waiting.remove(j)
                self._requeue(j)

    def _place_queue(self, now: float) -> None:
        """Jobs in arrival order, each placed by the policy if it can be now."""
        failed: set[object] = set()
        total_free = self.trays.free_up()
        for j in list(self.queue):
            lj = self.live[j]
            shape = (
                lj.job.gpus,
                lj.job.gang.tier,
                tuple((r.pods, r.subgroup_size) for r in lj.job.gang.roles),
            )
            if shape in failed or lj.job.gpus > total_free:
                continue
            result = self.policy.place(self.trays.snapshot(), lj.job.gang)
            if isinstance(result, Infeasible):
                failed.add(shape)
                continue
            for pod, node_name in sorted(result.placement.items()):
                self._take(j, pod, self.trays.index[node_name])
            total_free -= lj.job.gpus
            self.queue.remove(j)
            if lj.record.hits:
                self._resumed(j, now)
            else:
                self._start(j, now)


def simulate_failures(
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
    return _FailureRun(cluster, jobs, policy, cfg, schedule).run()


def paired_mean(diffs: list[float]) -> tuple[float, float | None]:
    """The mean of paired differences and its standard error (None with fewer than two pairs)."""
    mean = sum(diffs) / len(diffs)
    if len(diffs) < 2:
        return mean, None
    return mean, statistics.stdev(diffs) / math.sqrt(len(diffs))


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
        "Paired by seed, ours minus the anchor (lost + waiting GPU-h; negative: ours loses less; ± the "
        "standard error of the mean difference; 'within noise' where the mean lies inside two of them):",
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
        mean_diff, error = paired_mean(diffs)
        noise = " (within noise)" if error is not None and abs(mean_diff) < 2 * error else ""
        lines.append(
            f"- {name}: mean {mean_diff:+.0f}"
            + (f" ± {error:.0f}{noise}" if error is not None else "")
            + f" ({shown}); ours no worse in {wins}/{len(diffs)}"
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
