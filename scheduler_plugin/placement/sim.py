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


def simulate(  # noqa: C901 -- 99 branches in closures sharing the run state; to become a class (issue 28)
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
    topological = mode == "reserve" and policy.gang
    greedy = mode == "greedy"
    config = queue_config or gang_queue.QueueConfig()
    if preempt != "core":
        config = replace(config, preempt_after_s=None)
    state = _Cluster(cluster)
    tier1 = cluster.tiers[0]
    window_end = jobs[-1].arrival_s if jobs else 0.0
    window_start = warmup * window_end
    window = window_end - window_start
    records: list[JobRecord] = []
    pending: list[_Live] = []
    running: list[tuple[float, int, _Live]] = []
    plan_times: list[float] = []
    seq = 0
    acc = {"alloc": 0.0, "sat": 0.0, "sat_s": 0.0, "stranded": 0.0, "free_dom": 0.0}
    timeline: list[tuple[float, int, int]] = []
    max_alloc = 0
    stranded_now = 0
    t = 0.0
    next_arrival = 0
    finished = 0
    deadlocked = False
    free_domains_at_start = state.free_domains
    upper_acc: dict[str, float] = {}
    waiting_by_name: dict[str, _Live] = {}
    running_by_name: dict[str, _Live] = {}
    core_running: dict[str, gang_queue.Running] = {}
    core_waiting: dict[str, gang_queue.Waiting] = {}
    core_resv: Mapping[str, gang_queue.Reservation] = {}
    wake = math.inf

    def rank(live: _Live) -> tuple[float, float, str]:
        return (-live.job.priority, live.job.arrival_s, live.job.name)

    def enqueue(live: _Live) -> None:
        """Into the queue in priority order (then arrival), and into the core queue's view."""
        bisect.insort(pending, live, key=rank)
        waiting_by_name[live.job.name] = live
        if mode == "core":
            job = live.job
            core_waiting[job.name] = gang_queue.Waiting(
                job.name, job.gang, job.priority, job.arrival_s, job.runtime_s
            )

    def release(live: _Live) -> None:
        for node, g in live.held:
            state.change(node, g)
        live.held.clear()

    def start(live: _Live, now: float) -> None:
        nonlocal seq
        live.record.start_s = now
        waiting_by_name.pop(live.job.name, None)
        running_by_name[live.job.name] = live
        if mode == "core":
            core_waiting.pop(live.job.name, None)
            claims: dict[str, int] = {}
            for node, g in live.held:
                name = state.spec.nodes[node].name
                claims[name] = claims.get(name, 0) + g
            core_running[live.job.name] = gang_queue.Running(
                live.job.name,
                live.job.priority,
                now,
                now + live.job.runtime_s,
                claims,
                evictions=live.record.preemptions,
            )
        rec = live.record
        for role in live.job.gang.roles:
            if role.subgroup_tier != tier1 or not role.subgroup_size:
                continue
            placed = live.nodes_by_role.get(role.name, [])
            for first in range(0, role.pods, role.subgroup_size):
                chunk = placed[first : first + role.subgroup_size]
                rec.tier1_subgroups += 1
                if len({state.domain[n] for n in chunk}) == 1:
                    rec.tier1_local += 1
        end = now + live.job.runtime_s
        seq += 1
        live.seq = seq
        heapq.heappush(running, (end, seq, live))

    def finish(live: _Live) -> None:
        running_by_name.pop(live.job.name, None)
        core_running.pop(live.job.name, None)
        live.seq = -1

    def evict(live: _Live, now: float) -> None:
        """Evict every pod of a running job (a whole gang) and queue it again under its arrival time."""
        rec = live.record
        held_pods = len(live.held)
        all_pods = sum(r.pods for r in live.job.gang.roles)
        rec.preemptions += 1
        rec.preempted_gpu_s += sum(g for _, g in live.held) * max(0.0, now - (rec.start_s or now))
        rec.half_preempted = rec.half_preempted or 0 < held_pods < all_pods
        release(live)
        finish(live)  # its heap entry is skipped when it comes up
        rec.start_s = None
        live.left = {r.name: r.pods for r in live.job.gang.roles}
        live.nodes_by_role.clear()
        enqueue(live)

    def apply(live: _Live, placement: Mapping[PodSlot, str]) -> int:
        """Take the GPUs of a plan's pods (in pod order); returns pods placed."""
        per = {r.name: r.gpus_per_pod for r in live.job.gang.roles}
        placed = 0
        for pod, node_name in sorted(placement.items(), key=itemgetter(0)):
            role = pod.role
            if role not in per or live.left.get(role, 0) <= 0:
                raise SimulationError(
                    f"{policy.name}: plan for {live.job.name} names unknown or extra pod {str(pod)!r}"
                )
            node = state.index.get(node_name)
            if node is None:
                raise SimulationError(
                    f"{policy.name}: plan for {live.job.name} names unknown node {node_name!r}"
                )
            state.change(node, -per[role])
            live.held.append((node, per[role]))
            live.nodes_by_role.setdefault(role, []).append(node)
            live.left[role] -= 1
            placed += 1
        return placed

    def remaining_gang(live: _Live) -> Gang:
        if all(live.left[r.name] == r.pods for r in live.job.gang.roles):
            return live.job.gang
        roles = tuple(
            Role(name=r.name, pods=live.left[r.name], gpus_per_pod=r.gpus_per_pod)
            for r in live.job.gang.roles
            if live.left[r.name] > 0
        )
        return Gang(name=live.job.gang.name, roles=roles)

    def shadow(head: _Live, now: float) -> tuple[float, int]:
        need = head.gpus_left
        free = state.free_total
        if free >= need:
            return now, free - need
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

    reservations: dict[str, Reservation | None] = {}

    def with_free(free: list[int]) -> ClusterSnapshot:
        """The current snapshot with other free GPUs; nodes whose count is unchanged keep their
        ``NodeState`` object, so planners that diff snapshots see only the nodes that differ."""
        nodes = tuple(
            o if o.free == f else NodeState(name=o.name, gpus=o.gpus, free=f, domains=o.domains)
            for o, f in zip(state.states, free, strict=True)
        )
        return ClusterSnapshot(tiers=cluster.tiers, nodes=nodes)

    def reserve(head: _Live, now: float) -> Reservation | None:
        """The head's reservation: its policy's plan at the first completion time it exists."""
        cached = reservations.get(head.job.name)
        if cached is not None and cached[0] > now:
            return cached
        points: list[tuple[float, list[int]]] = []  # (completion time, free GPUs per node after it)
        free = list(state.free)
        total = state.free_total
        ends = sorted(running)
        k = 0
        while k < len(ends):
            at = ends[k][0]
            while k < len(ends) and ends[k][0] == at:
                for node, g in ends[k][2].held:
                    free[node] += g
                    total += g
                k += 1
            if total >= head.gpus_left:
                points.append((at, list(free)))
        gang = remaining_gang(head)
        per = {r.name: r.gpus_per_pod for r in gang.roles}
        lo, hi = 0, len(points)
        found: Reservation | None = None
        while lo < hi:
            mid = (lo + hi) // 2
            at, after = points[mid]
            result = policy.place(with_free(after), gang)
            if isinstance(result, Infeasible):
                lo = mid + 1
                continue
            claims: dict[int, int] = {}
            for pod, node_name in result.placement.items():
                node = state.index[node_name]
                claims[node] = claims.get(node, 0) + per[pod.role]
            found, hi = (at, claims), mid
        reservations[head.job.name] = found
        return found

    held_view: list[tuple[Reservation, ClusterSnapshot, ClusterSnapshot]] = []  # (reservation, from, view)

    def held_back(resv: Reservation) -> ClusterSnapshot:
        """The cluster as a job running past the reservation time may use it (one view per state)."""
        current = state.snapshot()
        if held_view and held_view[0][0] is resv and held_view[0][1] is current:
            return held_view[0][2]
        at, claims = resv
        busy_then = dict.fromkeys(claims, 0)
        for end, _, live in running:
            if end > at:
                for node, g in live.held:
                    if node in busy_then:
                        busy_then[node] += g
        free = list(state.free)
        for node, claim in claims.items():
            free[node] = gang_queue.held_back_gpus(
                state.capacity[node], busy_then[node], claim, free=free[node]
            )
        view = with_free(free)
        held_view[:] = [(resv, current, view)]
        return view

    def schedule(now: float, fresh: set[str] | None) -> None:
        """One pass; ``fresh`` None tries every queued job, else only those names."""
        failed: set[tuple[object, ...]] = set()
        shadow_t, spare = math.inf, 0
        head_seen = False
        resv: Reservation | None = None
        kept: list[_Live] = []
        for live in pending:
            tried = fresh is None or live.job.name in fresh
            started = False
            need = live.gpus_left
            min_pod = min(r.gpus_per_pod for r in live.job.gang.roles if live.left[r.name] > 0)
            held: Reservation | None = None  # the reservation this job must leave alone
            shape_key: tuple[object, ...] = live.shape
            if greedy:
                allowed = True
            elif resv is not None:
                allowed = True
                if now + live.job.runtime_s > resv[0]:
                    held = resv
                    shape_key = (live.shape, "held back")
            else:
                allowed = not head_seen or now + live.job.runtime_s <= shadow_t or need <= spare
            enough = state.free_total >= (need if policy.gang else min_pod)
            if tried and allowed and enough and shape_key not in failed:
                snapshot = held_back(held) if held is not None else state.snapshot()
                t0 = clock()
                result = policy.place(snapshot, remaining_gang(live))
                plan_times.append(max(0.0, clock() - t0))
                if isinstance(result, Infeasible):
                    failed.add(shape_key)
                else:
                    placed = apply(live, result.placement)
                    if placed == 0:
                        failed.add(shape_key)
                    if sum(live.left.values()) == 0:
                        start(live, now)
                        started = True
                        if head_seen and now + live.job.runtime_s > shadow_t:
                            spare -= need
                        reservations.pop(live.job.name, None)
                    elif not policy.gang:
                        live.record.partial = live.record.partial or placed > 0
                    else:
                        raise SimulationError(
                            f"{policy.name}: gang plan for {live.job.name} left pods unplaced"
                        )
            if not started:
                kept.append(live)
                if not head_seen and not greedy:
                    head_seen = True
                    shadow_t, spare = shadow(live, now)
                    if topological and running:
                        resv = reserve(live, now)
        pending[:] = kept

    def timed_place(snapshot: ClusterSnapshot, gang: Gang) -> PlanResult:
        t0 = clock()
        result = policy.place(snapshot, gang)
        plan_times.append(max(0.0, clock() - t0))
        return result

    def schedule_core(now: float, fresh: set[str] | None) -> None:
        """One pass of the extender's queue (``scheduler_plugin.queue.decide``), applied here."""
        nonlocal core_resv, wake
        decision = gang_queue.decide(
            now,
            state.snapshot(),
            core_running,
            core_waiting.values(),
            core_resv,
            place=timed_place,
            config=config,
            only=fresh,
        )
        core_resv = decision.reservations
        wake = decision.wake_s
        for st in decision.starts:
            live = waiting_by_name[st.gang]
            apply(live, st.plan.placement)
            if sum(live.left.values()):
                raise SimulationError(f"{policy.name}: queue start of {st.gang} left pods unplaced")
            start(live, now)
        for pre in decision.preemptions:
            for victim in pre.victims:
                evict(running_by_name[victim], now)
            live = waiting_by_name[pre.gang]
            apply(live, pre.plan.placement)
            if sum(live.left.values()):
                raise SimulationError(f"{policy.name}: preemption plan of {pre.gang} left pods unplaced")
            start(live, now)
        if decision.starts or decision.preemptions:
            pending[:] = [lv for lv in pending if lv.job.name in waiting_by_name]

    def preempt_kai(now: float) -> None:
        """KAI's preempt action (module docstring): for each waiting job in order, whole lower-priority
        jobs, lowest priority and latest started first, until its policy places it."""
        failed: set[tuple[object, ...]] = set()  # shapes no eviction placed in this pass
        for live in list(pending):
            if live.job.name not in waiting_by_name or (live.shape, live.job.priority) in failed:
                continue
            prio = live.job.priority
            victims = sorted(
                (v for v in running_by_name.values() if v.job.priority < prio),
                key=lambda v: (v.job.priority, -(v.record.start_s or 0.0), v.job.name),
            )
            if not victims:
                continue
            free = list(state.free)
            total = state.free_total
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
                    break
                result = policy.place(with_free(free), remaining_gang(live))
                if isinstance(result, Infeasible):
                    continue
                for victim in chosen:
                    evict(victim, now)
                apply(live, result.placement)
                if sum(live.left.values()):
                    raise SimulationError(f"{policy.name}: preemption plan of {live.job.name} left pods")
                start(live, now)
                break
            else:
                failed.add((live.shape, prio))
        pending[:] = [lv for lv in pending if lv.job.name in waiting_by_name]

    def account(until: float) -> None:
        nonlocal max_alloc
        lo, hi = max(t, window_start), min(until, window_end)
        allocated = state.total - state.free_total
        max_alloc = max(max_alloc, allocated)
        if hi > lo:
            dt = hi - lo
            acc["alloc"] += allocated * dt
            acc["free_dom"] += state.free_domains * dt
            for tier, count in state.upper_free.items():
                upper_acc[tier] = upper_acc.get(tier, 0.0) + count * dt
            if pending:
                acc["sat"] += allocated * dt
                acc["sat_s"] += dt
                acc["stranded"] += stranded_now * dt

    while True:
        t_arr = jobs[next_arrival].arrival_s if next_arrival < len(jobs) else math.inf
        t_end = running[0][0] if running else math.inf
        t_next = min(t_arr, t_end, wake)
        if t_next == math.inf:
            deadlocked = bool(pending)
            break
        account(t_next)
        t = t_next
        released = t >= wake
        wake = math.inf
        while running and running[0][0] <= t:
            _, entry, live = heapq.heappop(running)
            if live.seq != entry:
                continue  # evicted: its GPUs went back then
            finish(live)
            release(live)
            live.record.end_s = t
            finished += 1
            released = True
        fresh: set[str] = set()
        while next_arrival < len(jobs) and jobs[next_arrival].arrival_s <= t:
            job = jobs[next_arrival]
            next_arrival += 1
            rec = JobRecord(
                name=job.name,
                source=job.source,
                gpus=job.gpus,
                arrival_s=job.arrival_s,
                priority=job.priority,
            )
            records.append(rec)
            unit_list = units(job.gang)
            smallest = min(unit_list, key=lambda u: (u.gpus, u.pods))
            enqueue(
                _Live(
                    job=job,
                    record=rec,
                    left={r.name: r.pods for r in job.gang.roles},
                    min_unit=(smallest.pods, smallest.gpus_per_pod),
                    shape=gang_queue.same_shape(job.gang),
                )
            )
            fresh.add(job.name)
        if mode == "core":
            schedule_core(t, None if released else fresh)
        else:
            schedule(t, None if released else fresh)
            if preempt == "kai" and pending:
                preempt_kai(t)
        if pending:
            unit = min((lv.min_unit for lv in pending), key=lambda u: (u[0] * u[1], u[0]))
            stranded_now = state.stranded(unit)
        else:
            stranded_now = 0
        max_alloc = max(max_alloc, state.total - state.free_total)
        timeline.append((t, state.total - state.free_total, state.free_domains))
        if progress is not None:
            progress(finished, len(jobs))
    for live in pending:  # deadlock: give back what partial gangs held
        release(live)
    released_all = state.free == state.capacity and state.free_total == state.total
    if len(timeline) > timeline_points:
        step = len(timeline) / timeline_points
        timeline = [timeline[int(k * step)] for k in range(timeline_points)] + [timeline[-1]]
    return SimResult(
        policy=policy.name,
        total_gpus=state.total,
        window_s=window,
        end_s=t,
        records=tuple(records),
        plan_times_s=tuple(plan_times),
        allocated_gpu_s=acc["alloc"],
        saturated_gpu_s=acc["sat"],
        saturated_s=acc["sat_s"],
        stranded_gpu_s=acc["stranded"],
        free_domain_s=acc["free_dom"],
        timeline=tuple(timeline),
        max_allocated=max_alloc,
        released_all=released_all,
        deadlocked=deadlocked,
        free_domains_at_start=free_domains_at_start,
        free_upper_domain_s=upper_acc,
    )
