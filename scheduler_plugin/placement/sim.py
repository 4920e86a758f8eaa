"""The event-driven cluster simulator: one policy, one cluster, one job stream.

Pure: no I/O, no randomness, no wall clock except ``clock``, the injected timer that measures each
planning call. Events are arrivals and completions; everything at one instant is handled together,
then one scheduling pass runs.

Queue discipline (the same for every policy, so the comparison is about placement): **FIFO with EASY
backfill**, by default (``backfill="count"``) on GPU counts. Jobs are tried in arrival order. The
first job that cannot start is the head and gets a reservation: its shadow time is the earliest
completion after which the cluster has enough free GPUs for it, and the spare GPUs are what is free
then beyond its need. A later job may start now
if the policy places it and it either ends (runtime known exactly, a common simplification) by the
shadow time or fits in the spare GPUs. The reservation is by GPU count, not by nodes: whether the
head then fits its topology is up to the placement, which is what is compared.

``backfill="reserve"`` makes the reservation topological, the way node-based backfill (Slurm's) does
it, for every gang policy alike: the head's reservation is **its policy's own plan** on the cluster as
it will be when running jobs end, at the first completion time when that plan exists (completion times
are searched by bisection, feasibility being taken as monotone in time), and holds the planned GPUs
on the planned nodes. A later job may start now if it ends by the reservation time (anywhere), or
if the policy places it on the cluster with the reserved GPUs held back: on a reserved node it may
use only what will still be free at the reservation time beyond the head's claim. The head keeps
its reservation until it starts or the reservation time passes. The policy's calls that plan
reservations are not counted in the plan-time figures (those time placement decisions). Non-gang
policies (kube default) keep the count rule: a partly placed job has no whole plan to reserve.

Queues of their own (``queue=``; ``backfill`` above stays the like-for-like choice):

- ``greedy``: jobs in priority order (PriorityClass value, then arrival); every job the policy places
  now starts, and nothing is held for a job that does not fit (Volcano's allocate action with the gang
  plugin, Kueue's BestEffortFIFO, KAI's allocate action, kube-scheduler's queue).
- ``core``: ``scheduler_plugin.queue.decide``, the extender's queue itself, with the policy's ``place``
  as its planner: reservations for the head chosen by what frees earliest and blocks least, backfill
  by time limit, and gang preemption inside one domain (``preempt="core"``). Time limits are the
  runtimes (known exactly). Every planner call the queue makes (placement, reservations, victim
  searches) is timed in the plan-time figures.
- ``count`` and ``reserve`` as above, in priority order.

Preemption (``preempt=``): ``none``; ``core`` (inside ``decide``: whole lower-priority gangs inside one
domain, least GPU-time lost, after ``QueueConfig.preempt_after_s``, with the queue's guards against
thrashing; each running gang is handed over with the number of times it was evicted before, for
``QueueConfig.max_evictions``); ``kai`` (KAI's preempt action:
a waiting job evicts running jobs of lower priority, lowest priority first and the latest started
first, whole jobs, adding victims until its policy places it, anywhere in the cluster). An evicted
job loses the GPU-time it ran (``preempted_gpu_s``) and goes back to the queue under its arrival time;
``half_preempted`` marks a job that lost some of its pods but not all (whole-gang eviction never does).

Bounded work per pass: a job is not offered to the policy when fewer GPUs are free than it needs, or
when a job of the same shape already failed in this pass (placements only remove capacity). After an
arrival only the new jobs are tried; after a completion the whole queue is.

Non-gang policies (kube default) may place some pods of a job: those pods hold their GPUs while the
job waits for the rest (``partial_gangs`` counts such jobs). If nothing runs, nothing arrives and the
queue cannot move, the run stops (``deadlocked``) and held GPUs are released.

Figures are time-weighted over the measured window [warm-up, last arrival], the warm-up being the first
25 % of the arrival span by default (the cluster starts empty).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from operator import itemgetter

from scheduler_plugin import queue as gang_queue
from scheduler_plugin.placement.policies.base import Policy, units
from scheduler_plugin.placement.shapes import Cluster
from scheduler_plugin.placement.workloads import Job
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, NodeState, PlanResult, PodSlot, Role

BACKFILL: tuple[str, ...] = ("count", "reserve")
QUEUES: tuple[str, ...] = ("count", "reserve", "greedy", "core")
PREEMPT: tuple[str, ...] = ("none", "core", "kai")
KAI_PREEMPT_TRIES = 8  # planner calls per waiting job and pass in the KAI preemption model

Reservation = tuple[float, dict[int, int]]  # (time the head can start, GPUs claimed per node index)


class SimulationError(RuntimeError):
    """A policy produced an impossible plan (over-allocation, unknown node or pod)."""


@dataclass(slots=True)
class JobRecord:
    name: str
    source: str
    gpus: int
    arrival_s: float
    start_s: float | None = None
    end_s: float | None = None
    tier1_subgroups: int = 0  # subgroups that require one tier-1 domain
    tier1_local: int = 0  # ... and got one
    partial: bool = False  # held some pods while waiting for the rest
    priority: int = 0
    preemptions: int = 0  # times it was evicted
    preempted_gpu_s: float = 0.0  # GPU-time its evictions threw away
    half_preempted: bool = False  # lost some pods but not all in one eviction


@dataclass(frozen=True, slots=True)
class SimResult:
    policy: str
    total_gpus: int
    window_s: float  # length of the measured window
    end_s: float
    records: tuple[JobRecord, ...]
    plan_times_s: tuple[float, ...]
    allocated_gpu_s: float  # integral of allocated GPUs over the window
    saturated_gpu_s: float  # ... over the part of the window when some job waited
    saturated_s: float
    stranded_gpu_s: float
    free_domain_s: float
    timeline: tuple[tuple[float, int, int], ...]  # (time, allocated GPUs, free tier-1 domains)
    max_allocated: int
    released_all: bool
    deadlocked: bool
    free_domains_at_start: int = 0
    free_upper_domain_s: Mapping[str, float] = field(default_factory=dict)  # tier -> integral


@dataclass(slots=True)
class _Live:
    job: Job
    record: JobRecord
    left: dict[str, int]  # role -> pods not yet placed
    held: list[tuple[int, int]] = field(default_factory=list)  # (node, gpus) per placed pod
    nodes_by_role: dict[str, list[int]] = field(default_factory=dict)  # placed pods in index order
    min_unit: tuple[int, int] = (1, 1)  # (pods, gpus per pod) of its smallest subgroup/unit
    shape: tuple[object, ...] = ()
    seq: int = -1  # its entry in the running heap (-1: not running)

    @property
    def gpus_left(self) -> int:
        per = {r.name: r.gpus_per_pod for r in self.job.gang.roles}
        return sum(per[r] * n for r, n in self.left.items())


class _Cluster:
    """Mutable free-GPU state, the snapshot handed to policies, and tier-1 domain bookkeeping."""

    def __init__(self, cluster: Cluster) -> None:
        self.spec = cluster
        self.index = {n.name: i for i, n in enumerate(cluster.nodes)}
        self.free = [n.gpus for n in cluster.nodes]
        self.capacity = [n.gpus for n in cluster.nodes]
        self.total = sum(self.capacity)
        self.free_total = self.total
        self.states = [
            NodeState(name=n.name, gpus=n.gpus, free=n.gpus, domains=n.domains) for n in cluster.nodes
        ]
        self._snapshot: ClusterSnapshot | None = None
        tier1 = cluster.tiers[0]
        names = sorted({n.domains[tier1] for n in cluster.nodes})
        dom_of = {d: k for k, d in enumerate(names)}
        self.domain = [dom_of[n.domains[tier1]] for n in cluster.nodes]
        self.dom_total = [0] * len(names)
        for i, d in enumerate(self.domain):
            self.dom_total[d] += self.capacity[i]
        self.dom_free = list(self.dom_total)
        top = max(self.capacity)
        self.hist = [[0] * (top + 1) for _ in names]  # domain -> free value -> node count
        for i, d in enumerate(self.domain):
            self.hist[d][self.free[i]] += 1
        self.free_domains = len(names)
        # wholly free domains of the higher tiers: tier -> (domain of each node, used GPUs per domain)
        self.upper: dict[str, tuple[list[int], list[int]]] = {}
        for tier in cluster.tiers[1:]:
            upper_names = sorted({n.domains[tier] for n in cluster.nodes})
            of = {d: k for k, d in enumerate(upper_names)}
            self.upper[tier] = ([of[n.domains[tier]] for n in cluster.nodes], [0] * len(upper_names))
        self.upper_free = {tier: len(used) for tier, (_, used) in self.upper.items()}

    def snapshot(self) -> ClusterSnapshot:
        if self._snapshot is None:
            self._snapshot = ClusterSnapshot(tiers=self.spec.tiers, nodes=tuple(self.states))
        return self._snapshot

    def with_free(self, free: list[int]) -> ClusterSnapshot:
        """The current snapshot with other free GPUs; nodes whose count is unchanged keep their
        ``NodeState`` object, so planners that diff snapshots see only the nodes that differ."""
        nodes = tuple(
            o if o.free == f else NodeState(name=o.name, gpus=o.gpus, free=f, domains=o.domains)
            for o, f in zip(self.states, free, strict=True)
        )
        return ClusterSnapshot(tiers=self.spec.tiers, nodes=nodes)

    def change(self, i: int, delta: int) -> None:
        """Free GPUs of node ``i`` change by ``delta`` (negative: taken)."""
        new = self.free[i] + delta
        if new < 0 or new > self.capacity[i]:
            raise SimulationError(
                f"node {self.spec.nodes[i].name}: free GPUs would be {new} (capacity {self.capacity[i]})"
            )
        d = self.domain[i]
        was_free = self.dom_free[d] == self.dom_total[d]
        self.hist[d][self.free[i]] -= 1
        self.hist[d][new] += 1
        self.free[i] = new
        self.dom_free[d] += delta
        self.free_total += delta
        now_free = self.dom_free[d] == self.dom_total[d]
        self.free_domains += int(now_free) - int(was_free)
        for tier, (of, used) in self.upper.items():
            k = of[i]
            before = used[k] == 0
            used[k] -= delta
            self.upper_free[tier] += int(used[k] == 0) - int(before)
        old = self.states[i]
        self.states[i] = NodeState(name=old.name, gpus=old.gpus, free=new, domains=old.domains)
        self._snapshot = None

    def stranded(self, unit: tuple[int, int]) -> int:
        """Free GPUs in tier-1 domains that cannot host ``unit`` = (pods, GPUs per pod)."""
        pods, g = unit
        out = 0
        for d, hist in enumerate(self.hist):
            if self.dom_free[d] == 0:
                continue
            room = sum(count * (f // g) for f, count in enumerate(hist) if f >= g)
            if room < pods:
                out += self.dom_free[d]
        return out


def simulate(
    cluster: Cluster,
    jobs: list[Job],
    policy: Policy,
    *,
    clock: Callable[[], float],
    progress: Callable[[int, int], None] | None = None,
    timeline_points: int = 1500,
    warmup: float = 0.25,
    backfill: str = "count",
    queue: str | None = None,
    preempt: str = "none",
    queue_config: gang_queue.QueueConfig | None = None,
) -> SimResult:
    """Run ``jobs`` (sorted by arrival) through ``policy`` on ``cluster``.

    Time-weighted figures cover [``warmup`` x last arrival, last arrival]: the cluster starts empty,
    and the first part of the window measures the ramp, not the policy.
    """
    mode = _queue_mode(policy, warmup=warmup, backfill=backfill, queue=queue, preempt=preempt)
    config = queue_config or gang_queue.QueueConfig()
    if preempt != "core":
        config = replace(config, preempt_after_s=None)
    run = _Run(cluster, jobs, policy, clock=clock, mode=mode, preempt=preempt, config=config, warmup=warmup)
    run.run(progress)
    return run.result(timeline_points)


def _queue_mode(policy: Policy, *, warmup: float, backfill: str, queue: str | None, preempt: str) -> str:
    """The queue the run uses (one of ``QUEUES``), after checking the arguments that choose it."""
    if not 0 <= warmup < 1:
        raise ValueError(f"warmup must be in [0, 1), got {warmup}")
    if backfill not in BACKFILL:
        raise ValueError(f"backfill must be one of {', '.join(BACKFILL)}, got {backfill!r}")
    mode = backfill if queue is None else queue
    if mode not in QUEUES:
        raise ValueError(f"queue must be one of {', '.join(QUEUES)}, got {mode!r}")
    if preempt not in PREEMPT:
        raise ValueError(f"preempt must be one of {', '.join(PREEMPT)}, got {preempt!r}")
    if preempt == "core" and mode != "core":
        raise ValueError("preempt='core' is the core queue's own preemption: it needs queue='core'")
    if mode == "core" and not policy.gang:
        raise ValueError(f"queue 'core' plans whole gangs; policy {policy.name} places pods")
    return mode


def _rank(live: _Live) -> tuple[float, float, str]:
    return (-live.job.priority, live.job.arrival_s, live.job.name)


def _remaining_gang(live: _Live) -> Gang:
    """The pods of the job not placed yet, as a gang (the job's own gang when none is)."""
    if all(live.left[r.name] == r.pods for r in live.job.gang.roles):
        return live.job.gang
    roles = tuple(
        Role(name=r.name, pods=live.left[r.name], gpus_per_pod=r.gpus_per_pod)
        for r in live.job.gang.roles
        if live.left[r.name] > 0
    )
    return Gang(name=live.job.gang.name, roles=roles)


class _Jobs:
    """The jobs of one run and what they hold: the queue in priority order (then arrival), the
    running heap in end order, and the core queue's view of both."""

    def __init__(self, state: _Cluster, policy: Policy, *, core: bool) -> None:
        self.state = state
        self.policy = policy
        self.core = core  # keep the core queue's view (queue "core")
        self.pending: list[_Live] = []
        self.running: list[tuple[float, int, _Live]] = []  # (end, seq, job): a heap
        self.seq = 0
        self.waiting_by_name: dict[str, _Live] = {}
        self.running_by_name: dict[str, _Live] = {}
        self.core_running: dict[str, gang_queue.Running] = {}
        self.core_waiting: dict[str, gang_queue.Waiting] = {}

    def enqueue(self, live: _Live) -> None:
        """Into the queue in priority order (then arrival), and into the core queue's view."""
        bisect.insort(self.pending, live, key=_rank)
        self.waiting_by_name[live.job.name] = live
        if self.core:
            job = live.job
            self.core_waiting[job.name] = gang_queue.Waiting(
                job.name, job.gang, job.priority, job.arrival_s, job.runtime_s
            )

    def release(self, live: _Live) -> None:
        for node, g in live.held:
            self.state.change(node, g)
        live.held.clear()

    def apply(self, live: _Live, placement: Mapping[PodSlot, str]) -> int:
        """Take the GPUs of a plan's pods (in pod order); returns pods placed."""
        per = {r.name: r.gpus_per_pod for r in live.job.gang.roles}
        name = self.policy.name
        placed = 0
        for pod, node_name in sorted(placement.items(), key=itemgetter(0)):
            role = pod.role
            if role not in per or live.left.get(role, 0) <= 0:
                raise SimulationError(
                    f"{name}: plan for {live.job.name} names unknown or extra pod {str(pod)!r}"
                )
            node = self.state.index.get(node_name)
            if node is None:
                raise SimulationError(f"{name}: plan for {live.job.name} names unknown node {node_name!r}")
            self.state.change(node, -per[role])
            live.held.append((node, per[role]))
            live.nodes_by_role.setdefault(role, []).append(node)
            live.left[role] -= 1
            placed += 1
        return placed

    def start_whole(self, live: _Live, placement: Mapping[PodSlot, str], now: float, what: str) -> None:
        """Apply a plan that places every pod left (the queue's ``what``) and start the job."""
        self.apply(live, placement)
        if sum(live.left.values()):
            raise SimulationError(f"{self.policy.name}: {what} left pods unplaced")
        self.start(live, now)

    def start(self, live: _Live, now: float) -> None:
        live.record.start_s = now
        self.waiting_by_name.pop(live.job.name, None)
        self.running_by_name[live.job.name] = live
        if self.core:
            self.core_waiting.pop(live.job.name, None)
            claims: dict[str, int] = {}
            for node, g in live.held:
                name = self.state.spec.nodes[node].name
                claims[name] = claims.get(name, 0) + g
            self.core_running[live.job.name] = gang_queue.Running(
                live.job.name,
                live.job.priority,
                now,
                now + live.job.runtime_s,
                claims,
                evictions=live.record.preemptions,
            )
        self._count_local(live)
        end = now + live.job.runtime_s
        self.seq += 1
        live.seq = self.seq
        heapq.heappush(self.running, (end, self.seq, live))

    def _count_local(self, live: _Live) -> None:
        """Record the job's tier-1 subgroups, and those placed inside one tier-1 domain."""
        rec, tier1 = live.record, self.state.spec.tiers[0]
        for role in live.job.gang.roles:
            if role.subgroup_tier != tier1 or not role.subgroup_size:
                continue
            placed = live.nodes_by_role.get(role.name, [])
            for first in range(0, role.pods, role.subgroup_size):
                chunk = placed[first : first + role.subgroup_size]
                rec.tier1_subgroups += 1
                if len({self.state.domain[n] for n in chunk}) == 1:
                    rec.tier1_local += 1

    def finish(self, live: _Live) -> None:
        self.running_by_name.pop(live.job.name, None)
        self.core_running.pop(live.job.name, None)
        live.seq = -1

    def evict(self, live: _Live, now: float) -> None:
        """Evict every pod of a running job (a whole gang) and queue it again under its arrival time."""
        rec = live.record
        held_pods = len(live.held)
        all_pods = sum(r.pods for r in live.job.gang.roles)
        rec.preemptions += 1
        rec.preempted_gpu_s += sum(g for _, g in live.held) * max(0.0, now - (rec.start_s or now))
        rec.half_preempted = rec.half_preempted or 0 < held_pods < all_pods
        self.release(live)
        self.finish(live)  # its heap entry is skipped when it comes up
        rec.start_s = None
        live.left = {r.name: r.pods for r in live.job.gang.roles}
        live.nodes_by_role.clear()
        self.enqueue(live)

    def drop_started(self) -> None:
        """Take the jobs that started out of the queue."""
        self.pending[:] = [lv for lv in self.pending if lv.job.name in self.waiting_by_name]


class _Reservations:
    """The head's reservation under the FIFO queues: its shadow time by GPU count, or (``reserve``)
    its policy's own plan at the first completion time it exists, and the cluster held back for it."""

    def __init__(self, jobs: _Jobs) -> None:
        self.jobs = jobs
        self.state = jobs.state
        self.policy = jobs.policy
        self.cached: dict[str, Reservation | None] = {}
        self.view: list[tuple[Reservation, ClusterSnapshot, ClusterSnapshot]] = []  # (resv, from, view)

    def shadow(self, head: _Live, now: float) -> tuple[float, int]:
        """(the earliest completion after which enough GPUs are free for the head, the GPUs free
        then beyond its need)."""
        need = head.gpus_left
        free = self.state.free_total
        if free >= need:
            return now, free - need
        running = self.jobs.running
        # walk the running heap in end order lazily: a frontier heap of positions in it
        frontier = [(running[0][0], running[0][1], 0)] if running else []
        while frontier:
            end, _, pos = heapq.heappop(frontier)
            free += sum(g for _, g in running[pos][2].held)
            if free >= need:
                return end, free - need
            for child in (2 * pos + 1, 2 * pos + 2):
                if child < len(running):
                    heapq.heappush(frontier, (running[child][0], running[child][1], child))
        return math.inf, 0

    def _completions(self, need: int) -> list[tuple[float, list[int]]]:
        """(completion time, free GPUs per node after it) of each completion after which at least
        ``need`` GPUs are free, in time order."""
        points: list[tuple[float, list[int]]] = []
        free = list(self.state.free)
        total = self.state.free_total
        ends = sorted(self.jobs.running)
        k = 0
        while k < len(ends):
            at = ends[k][0]
            while k < len(ends) and ends[k][0] == at:
                for node, g in ends[k][2].held:
                    free[node] += g
                    total += g
                k += 1
            if total >= need:
                points.append((at, list(free)))
        return points

    def reserve(self, head: _Live, now: float) -> Reservation | None:
        """The head's reservation: its policy's plan at the first completion time it exists."""
        cached = self.cached.get(head.job.name)
        if cached is not None and cached[0] > now:
            return cached
        points = self._completions(head.gpus_left)
        gang = _remaining_gang(head)
        per = {r.name: r.gpus_per_pod for r in gang.roles}
        lo, hi = 0, len(points)
        found: Reservation | None = None
        while lo < hi:
            mid = (lo + hi) // 2
            at, after = points[mid]
            result = self.policy.place(self.state.with_free(after), gang)
            if isinstance(result, Infeasible):
                lo = mid + 1
                continue
            claims: dict[int, int] = {}
            for pod, node_name in result.placement.items():
                node = self.state.index[node_name]
                claims[node] = claims.get(node, 0) + per[pod.role]
            found, hi = (at, claims), mid
        self.cached[head.job.name] = found
        return found

    def forget(self, name: str) -> None:
        self.cached.pop(name, None)

    def held_back(self, resv: Reservation) -> ClusterSnapshot:
        """The cluster as a job running past the reservation time may use it (one view per state)."""
        state = self.state
        current = state.snapshot()
        if self.view and self.view[0][0] is resv and self.view[0][1] is current:
            return self.view[0][2]
        at, claims = resv
        busy_then = dict.fromkeys(claims, 0)
        for end, _, live in self.jobs.running:
            if end > at:
                for node, g in live.held:
                    if node in busy_then:
                        busy_then[node] += g
        free = list(state.free)
        for node, claim in claims.items():
            free[node] = gang_queue.held_back_gpus(
                state.capacity[node], busy_then[node], claim, free=free[node]
            )
        view = state.with_free(free)
        self.view[:] = [(resv, current, view)]
        return view


@dataclass(slots=True)
class _Pass:
    """One pass of the FIFO and greedy queues: the shapes that failed in it, and the head (the first
    job that did not start) with its shadow time, spare GPUs and reservation once it is seen."""

    failed: set[tuple[object, ...]] = field(default_factory=set)
    head_seen: bool = False
    shadow_t: float = math.inf
    spare: int = 0
    resv: Reservation | None = None


class _Run:
    """One simulation: the event loop over arrivals, completions and the core queue's wake-ups, one
    scheduling pass per instant, and the time-weighted figures."""

    def __init__(
        self,
        cluster: Cluster,
        jobs: list[Job],
        policy: Policy,
        *,
        clock: Callable[[], float],
        mode: str,
        preempt: str,
        config: gang_queue.QueueConfig,
        warmup: float,
    ) -> None:
        self.jobs_in = jobs
        self.policy = policy
        self.clock = clock
        self.mode = mode
        self.preempt = preempt
        self.config = config
        self.topological = mode == "reserve" and policy.gang
        self.greedy = mode == "greedy"
        self.state = _Cluster(cluster)
        self.jobs = _Jobs(self.state, policy, core=mode == "core")
        self.resv = _Reservations(self.jobs)
        self.window_end = jobs[-1].arrival_s if jobs else 0.0
        self.window_start = warmup * self.window_end
        self.records: list[JobRecord] = []
        self.plan_times: list[float] = []
        self.acc = {"alloc": 0.0, "sat": 0.0, "sat_s": 0.0, "stranded": 0.0, "free_dom": 0.0}
        self.upper_acc: dict[str, float] = {}
        self.timeline: list[tuple[float, int, int]] = []
        self.max_alloc = 0
        self.stranded_now = 0
        self.t = 0.0
        self.next_arrival = 0
        self.finished = 0
        self.deadlocked = False
        self.free_domains_at_start = self.state.free_domains
        self.core_resv: Mapping[str, gang_queue.Reservation] = {}
        self.wake = math.inf

    def run(self, progress: Callable[[int, int], None] | None) -> None:
        jobs, pending = self.jobs_in, self.jobs.pending
        while True:
            t_arr = jobs[self.next_arrival].arrival_s if self.next_arrival < len(jobs) else math.inf
            t_end = self.jobs.running[0][0] if self.jobs.running else math.inf
            t_next = min(t_arr, t_end, self.wake)
            if t_next == math.inf:
                self.deadlocked = bool(pending)
                break
            self.account(t_next)
            self.t = t_next
            woken = self.t >= self.wake
            self.wake = math.inf
            released = self._complete() or woken
            fresh = self._arrive()
            self._pass(None if released else fresh)
            self._observe()
            if progress is not None:
                progress(self.finished, len(jobs))
        for live in pending:  # deadlock: give back what partial gangs held
            self.jobs.release(live)

    def _complete(self) -> bool:
        """End the jobs due by now; whether any did (their GPUs came back)."""
        running, released = self.jobs.running, False
        while running and running[0][0] <= self.t:
            _, entry, live = heapq.heappop(running)
            if live.seq != entry:
                continue  # evicted: its GPUs went back then
            self.jobs.finish(live)
            self.jobs.release(live)
            live.record.end_s = self.t
            self.finished += 1
            released = True
        return released

    def _arrive(self) -> set[str]:
        """Queue the jobs that arrived by now; their names."""
        jobs, fresh = self.jobs_in, set()
        while self.next_arrival < len(jobs) and jobs[self.next_arrival].arrival_s <= self.t:
            job = jobs[self.next_arrival]
            self.next_arrival += 1
            rec = JobRecord(
                name=job.name,
                source=job.source,
                gpus=job.gpus,
                arrival_s=job.arrival_s,
                priority=job.priority,
            )
            self.records.append(rec)
            smallest = min(units(job.gang), key=lambda u: (u.gpus, u.pods))
            self.jobs.enqueue(
                _Live(
                    job=job,
                    record=rec,
                    left={r.name: r.pods for r in job.gang.roles},
                    min_unit=(smallest.pods, smallest.gpus_per_pod),
                    shape=gang_queue.same_shape(job.gang),
                )
            )
            fresh.add(job.name)
        return fresh

    def _pass(self, fresh: set[str] | None) -> None:
        """The scheduling pass of the run's queue (``fresh`` None: every queued job)."""
        if self.mode == "core":
            self.schedule_core(self.t, fresh)
            return
        self.schedule(self.t, fresh)
        if self.preempt == "kai" and self.jobs.pending:
            self.preempt_kai(self.t)

    def _observe(self) -> None:
        """The state after the pass: stranded GPUs (for the smallest waiting unit), the timeline."""
        state, pending = self.state, self.jobs.pending
        if pending:
            unit = min((lv.min_unit for lv in pending), key=lambda u: (u[0] * u[1], u[0]))
            self.stranded_now = state.stranded(unit)
        else:
            self.stranded_now = 0
        self.max_alloc = max(self.max_alloc, state.total - state.free_total)
        self.timeline.append((self.t, state.total - state.free_total, state.free_domains))

    def timed_place(self, snapshot: ClusterSnapshot, gang: Gang) -> PlanResult:
        t0 = self.clock()
        result = self.policy.place(snapshot, gang)
        self.plan_times.append(max(0.0, self.clock() - t0))
        return result

    def schedule(self, now: float, fresh: set[str] | None) -> None:
        """One pass; ``fresh`` None tries every queued job, else only those names."""
        ps = _Pass()
        kept: list[_Live] = []
        for live in self.jobs.pending:
            tried = fresh is None or live.job.name in fresh
            if tried and self._offer(live, now, ps):
                continue
            kept.append(live)
            if not ps.head_seen and not self.greedy:
                ps.head_seen = True
                ps.shadow_t, ps.spare = self.resv.shadow(live, now)
                if self.topological and self.jobs.running:
                    ps.resv = self.resv.reserve(live, now)
        self.jobs.pending[:] = kept

    def _rule(self, live: _Live, now: float, ps: _Pass) -> tuple[bool, Reservation | None]:
        """(whether the queue lets the job start now, the reservation it must leave alone if so)."""
        if self.greedy:
            return True, None
        ends = now + live.job.runtime_s
        if ps.resv is not None:
            return True, (ps.resv if ends > ps.resv[0] else None)
        return not ps.head_seen or ends <= ps.shadow_t or live.gpus_left <= ps.spare, None

    def _offer(self, live: _Live, now: float, ps: _Pass) -> bool:
        """Offer one queued job to the policy if the pass's rules allow; whether it started."""
        need = live.gpus_left
        min_pod = min(r.gpus_per_pod for r in live.job.gang.roles if live.left[r.name] > 0)
        allowed, held = self._rule(live, now, ps)
        shape_key: tuple[object, ...] = live.shape if held is None else (live.shape, "held back")
        enough = self.state.free_total >= (need if self.policy.gang else min_pod)
        if not (allowed and enough and shape_key not in ps.failed):
            return False
        snapshot = self.resv.held_back(held) if held is not None else self.state.snapshot()
        result = self.timed_place(snapshot, _remaining_gang(live))
        if isinstance(result, Infeasible):
            ps.failed.add(shape_key)
            return False
        placed = self.jobs.apply(live, result.placement)
        if placed == 0:
            ps.failed.add(shape_key)
        if sum(live.left.values()) == 0:
            self.jobs.start(live, now)
            if ps.head_seen and now + live.job.runtime_s > ps.shadow_t:
                ps.spare -= need
            self.resv.forget(live.job.name)
            return True
        if not self.policy.gang:
            live.record.partial = live.record.partial or placed > 0
            return False
        raise SimulationError(f"{self.policy.name}: gang plan for {live.job.name} left pods unplaced")

    def schedule_core(self, now: float, fresh: set[str] | None) -> None:
        """One pass of the extender's queue (``scheduler_plugin.queue.decide``), applied here."""
        jobs = self.jobs
        decision = gang_queue.decide(
            now,
            self.state.snapshot(),
            jobs.core_running,
            jobs.core_waiting.values(),
            self.core_resv,
            place=self.timed_place,
            config=self.config,
            only=fresh,
        )
        self.core_resv = decision.reservations
        self.wake = decision.wake_s
        for st in decision.starts:
            jobs.start_whole(
                jobs.waiting_by_name[st.gang], st.plan.placement, now, f"queue start of {st.gang}"
            )
        for pre in decision.preemptions:
            for victim in pre.victims:
                jobs.evict(jobs.running_by_name[victim], now)
            live = jobs.waiting_by_name[pre.gang]
            jobs.start_whole(live, pre.plan.placement, now, f"preemption plan of {pre.gang}")
        if decision.starts or decision.preemptions:
            jobs.drop_started()

    def preempt_kai(self, now: float) -> None:
        """KAI's preempt action (module docstring): for each waiting job in order, whole lower-priority
        jobs, lowest priority and latest started first, until its policy places it."""
        jobs = self.jobs
        failed: set[tuple[object, ...]] = set()  # shapes no eviction placed in this pass
        for live in list(jobs.pending):
            prio = live.job.priority
            if live.job.name not in jobs.waiting_by_name or (live.shape, prio) in failed:
                continue
            victims = sorted(
                (v for v in jobs.running_by_name.values() if v.job.priority < prio),
                key=lambda v: (v.job.priority, -(v.record.start_s or 0.0), v.job.name),
            )
            if victims and not self._kai_preempt_for(live, victims, now):
                failed.add((live.shape, prio))
        jobs.drop_started()

    def _kai_preempt_for(self, live: _Live, victims: list[_Live], now: float) -> bool:
        """Add victims in order until the policy places ``live`` on what they free, then evict them
        and start it. False when every victim was added without a plan (up to ``KAI_PREEMPT_TRIES``
        planner calls: then True, the shape not marked as failed)."""
        free = list(self.state.free)
        total = self.state.free_total
        need = live.gpus_left
        chosen: list[_Live] = []
        tries = 0
        for v in victims:
            chosen.append(v)
            for node, g in v.held:
                free[node] += g
                total += g
            if total < need:
                continue
            tries += 1
            if tries > KAI_PREEMPT_TRIES:
                return True
            result = self.policy.place(self.state.with_free(free), _remaining_gang(live))
            if isinstance(result, Infeasible):
                continue
            for victim in chosen:
                self.jobs.evict(victim, now)
            self.jobs.apply(live, result.placement)
            if sum(live.left.values()):
                raise SimulationError(f"{self.policy.name}: preemption plan of {live.job.name} left pods")
            self.jobs.start(live, now)
            return True
        return False

    def account(self, until: float) -> None:
        """Add the state since the last event, up to ``until``, to the time-weighted figures."""
        state, acc = self.state, self.acc
        lo, hi = max(self.t, self.window_start), min(until, self.window_end)
        allocated = state.total - state.free_total
        self.max_alloc = max(self.max_alloc, allocated)
        if hi <= lo:
            return
        dt = hi - lo
        acc["alloc"] += allocated * dt
        acc["free_dom"] += state.free_domains * dt
        for tier, count in state.upper_free.items():
            self.upper_acc[tier] = self.upper_acc.get(tier, 0.0) + count * dt
        if self.jobs.pending:
            acc["sat"] += allocated * dt
            acc["sat_s"] += dt
            acc["stranded"] += self.stranded_now * dt

    def result(self, timeline_points: int) -> SimResult:
        state, acc, timeline = self.state, self.acc, self.timeline
        released_all = state.free == state.capacity and state.free_total == state.total
        if len(timeline) > timeline_points:
            step = len(timeline) / timeline_points
            timeline = [timeline[int(k * step)] for k in range(timeline_points)] + [timeline[-1]]
        return SimResult(
            policy=self.policy.name,
            total_gpus=state.total,
            window_s=self.window_end - self.window_start,
            end_s=self.t,
            records=tuple(self.records),
            plan_times_s=tuple(self.plan_times),
            allocated_gpu_s=acc["alloc"],
            saturated_gpu_s=acc["sat"],
            saturated_s=acc["sat_s"],
            stranded_gpu_s=acc["stranded"],
            free_domain_s=acc["free_dom"],
            timeline=tuple(timeline),
            max_allocated=self.max_alloc,
            released_all=released_all,
            deadlocked=self.deadlocked,
            free_domains_at_start=self.free_domains_at_start,
            free_upper_domain_s=self.upper_acc,
        )
