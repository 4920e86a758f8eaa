"""The gang queue: which waiting gang starts, what is held back for the head, and gang preemption.

Pure: no I/O, no clock (``now`` is passed in), no randomness; ties broken by name. The planner
(``scheduler_plugin.planner.plan``, or any function of the same shape passed as ``place``) decides
where a gang goes; this module decides *when* and *what is held for whom*. The extender calls
``decide`` once per scheduling pass with what the API shows; the placement simulator
(``scheduler_plugin.placement.sim``, queue ``core``) calls the very same function.

Order
    Waiting gangs are taken by PriorityClass value (higher first), then the time the gang became
    complete, then name (``order``). The extender gives a gang the lowest priority of its pods and the
    creation time of its newest pod: one pod of a higher class does not lift a gang of low ones, and a
    pod parked for a day does not move a gang made of new ones ahead.

Reservation
    The first gang in that order that cannot start now (the *head*) gets a reservation if it has none:
    the nodes it will get and the time it is expected to start. The time is the first moment, judged
    from the running work's time limits (work without one counts as never ending), at which the planner
    places the gang on the cluster as it will be then (completion times are searched by bisection;
    feasibility grows with time since only running work is counted). Among the domains of the gang's
    scope tier (its gang tier, else its highest subgroup tier) where the planner places it at that
    time, the reservation takes the one whose holding blocks the least other work: the fewest
    GPU-seconds of capacity that is free before that time and held idle for the gang
    (``Reservation.held_idle_gpu_s``); ties go to the planner's own choice on the whole cluster, then
    to the domain name.
    A gang that fits nowhere even with every node free (no domain of its tier could ever hold it,
    or no node its pods may use is large enough) holds nothing and is not the head: the next gang is
    (``Decision.never_fits`` says which and why), so one impossible gang cannot switch reservations
    off for everyone behind it. A gang that waits only for running work without a limit stays the
    head, holding nothing until that work ends.

Backfill
    Any other gang may start now on the cluster with every reservation it could delay held back: a
    reservation whose expected start is before the gang's own end (now + its time limit; never for a
    gang without one) keeps, on each of its nodes, its claim plus what running work still holds at that
    start. A gang that ends before a reservation's start may use its nodes freely, and is first offered
    them alone (``QueueConfig.fill_holes``): capacity held for the head is otherwise idle until its
    start, while capacity outside any reservation is what gangs running longer can use.

Following the cluster
    Each pass re-checks every reservation (``_still_valid``): it is dropped and planned again when a
    node it holds is gone, unschedulable or too small, when running work it waited for ended early
    (an earlier start may now exist), or when its start has passed and the gang still cannot start.
    A reservation is released when its gang starts or is no longer waiting (deleted).

No starvation, by design
    A reservation is never given away: no gang of the same or lower priority may use reserved capacity
    unless it ends before the reservation's start, so the head's start is bounded by the time limits
    of the work running when it was planned; then the next gang becomes the head. Within one priority
    class every gang therefore starts after finitely many others. A gang of higher priority is held
    back only by reservations of its own class or higher: a reservation of a lower class gives way to
    it (dropped when the higher gang starts on its capacity or reserves its nodes, and planned again
    when its gang is the head), as a strict priority order requires; running work of a lower class
    is taken only by preemption (below).

Preemption
    A gang that has waited ``QueueConfig.preempt_after_s`` since its creation and still cannot start
    evicts **whole** running gangs of lower priority, never part of one, all inside one domain of its
    scope tier (tier 1 when it has none): per domain, the set of victims whose eviction lets the
    planner place the gang there with the least GPU-time lost (GPUs x time run since the victim last
    started, the work a restart loses); exactly by enumeration in cost order when a domain has at
    most ``exact_victims`` candidates, else greedily (cheapest per GPU first) and then pruned. The
    domain with the least loss wins. The preemptor then holds the planned nodes (a reservation
    starting now) until the victims' pods are gone and it starts.

    Three guards keep preemption from thrashing (an evicted gang is queued again, restarts, and the
    least-loss rule, which favours what started last, would pick it again and again). *Worth it*: a
    preemption goes ahead only when the GPU-time its victims lose is at most
    ``QueueConfig.preempt_loss_ratio`` times the GPU-time the preemptor would otherwise spend waiting,
    its GPUs x (its expected start - now), the start being its reservation's (planned for it when it
    holds none; never, so any loss is worth it, when it never fits on what will free). An 8-GPU gang
    whose reservation starts in ten minutes no longer evicts a 1,152-GPU gang that has run ten minutes;
    it waits. *Interrupted at most so often*: a gang already evicted ``QueueConfig.max_evictions``
    times (``Running.evictions``, as its caller counts them) is no victim again, so a gang of a lower
    class is interrupted at most that often and then runs to its end (LSF's ``MAX_JOB_PREEMPT``);
    without the cap a gang that restarts where high-priority gangs keep arriving is evicted each time
    cheaply and never finishes. *Exempt while young*: a gang that has run less than
    ``QueueConfig.min_run_before_preempt_s`` since it (re)started is no victim (Slurm's
    ``PreemptExemptTime``): its loss in GPU-time undercounts what a restart costs it (start-up,
    loading its checkpoint), which is why the least-loss rule is otherwise drawn to it. Off by default,
    since it can hold a high-priority gang back for that long; an operator whose jobs checkpoint every
    N minutes sets it near N. What may not be a victim at all (``Running.preemptible`` False: what an
    eviction cannot free, or a disruption budget would refuse) is judged by the caller.

Restart-safe
    The only state between passes is the reservations, and each is visible on its nodes
    (``gpuagent.dev/reserved-for``). ``rebuild`` turns pods and node annotations back into the inputs
    of ``decide`` after an extender restart, keeping a hold only where the queue would grant it now
    (anyone who may write a Node annotation could have written it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from typing import ClassVar

from scheduler_plugin.planner import SnapshotCache, plan
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, NodeState, Plan, PlanResult, PodSlot

__all__ = [
    "KUEUE_MAX_EXEC",
    "LIMIT_ANNOTATIONS",
    "RESERVED_FOR",
    "TIME_LIMIT",
    "Decision",
    "PodFacts",
    "Preemption",
    "QueueConfig",
    "QueueError",
    "QueueState",
    "Reservation",
    "Running",
    "Start",
    "Waiting",
    "decide",
    "order",
    "planner_place",
    "rebuild",
    "time_limit",
]

RESERVED_FOR = "gpuagent.dev/reserved-for"
TIME_LIMIT = "gpuagent.dev/time-limit"
KUEUE_MAX_EXEC = "kueue.x-k8s.io/max-exec-time-seconds"
LIMIT_ANNOTATIONS: tuple[str, ...] = (TIME_LIMIT, KUEUE_MAX_EXEC)
_SHOWN = 40  # characters of a bad value an error message shows

Place = Callable[[ClusterSnapshot, Gang], PlanResult]


class QueueError(ValueError):
    """Bad queue input; the message names the field and the object. ``field``: the
    :class:`QueueConfig` field at fault, when it is one."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Waiting:
    """A gang not yet started. ``name`` is ``<namespace>/<gang>``; ``created_s`` when it became complete
    (its newest pod's creation); ``limit_s`` its time limit (None: none, it counts as never ending)."""

    name: str
    gang: Gang
    priority: int
    created_s: float
    limit_s: float | None = None

    @property
    def gpus(self) -> int:
        return sum(r.pods * r.gpus_per_pod for r in self.gang.roles)


@dataclass(frozen=True, slots=True)
class Running:
    """A started gang: GPUs it holds per node, when it (last) started and when its limit ends
    (``math.inf`` without a limit), how often it was evicted before (0 when unknown), and whether it
    may be evicted at all (``preemptible``: False for what an eviction cannot free or may not take,
    as its caller judges: a DaemonSet's or a node's own pods, a namespace not allowed, a disruption
    budget that refuses), and the other resources it holds per node (``uses``: CPU millicores, memory
    bytes, as ``NodeState.resources``), freed with its GPUs when it ends."""

    name: str
    priority: int
    started_s: float
    ends_s: float
    claims: Mapping[str, int]
    evictions: int = 0
    preemptible: bool = True
    uses: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return sum(self.claims.values())


@dataclass(frozen=True, slots=True)
class Reservation:
    """Nodes held for a gang, the one hold type (``extender.holds``): GPUs claimed per node, the expected
    start, the domain of its scope tier (None without one), the running work it waits for (name -> the end
    it was judged from) and the GPU-seconds of free capacity the hold keeps idle until the start. A started
    gang's hold besides holds other resources per node (``resources``) and ends at ``expires_s`` when no
    pod of it comes; the queue reads neither."""

    gang: str
    start_s: float
    claims: Mapping[str, int]
    domain: str | None = None
    waits_for: Mapping[str, float] = field(default_factory=dict)
    held_idle_gpu_s: float = 0.0
    resources: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # node -> resource -> amount
    expires_s: float = math.inf


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """The queue's and the extender's queue settings, each default written here once: the extender
    command's flags, the Helm chart's ``extender`` values and the kustomize base's arguments take theirs
    from these (tests/daemonset/test_manifests.py compares them). A bad value is a :class:`QueueError`
    naming the field (``QueueError.field``).

    ``preempt_after_s``: how long a gang waits before it may evict lower-priority gangs (None:
    never); ``exact_victims``: candidates per domain up to which the victim choice is exact;
    ``max_plans``: planner calls the exact victim search may make per domain before it falls back
    to the greedy choice; ``fill_holes``: a gang that ends before a reservation's start is first
    offered that reservation's idle capacity (module docstring, Backfill); ``reserve_after_s``: how
    long a gang waits before it may hold anything back (0: at once; Slurm's ``bf_min_age_reserve``
    is the same idea): until then later gangs pass it freely, after that it is the head as above, so
    its wait stays bounded by this plus the limits of the work it waits for; ``reserve_after_limits``:
    besides, how many times its own time limit a gang waits before it may hold anything back (None:
    off; a gang without a limit waits ``reserve_after_s`` only), so a short gang does not hold a
    large share of the cluster idle for long while a long one waits in proportion to its length;
    ``reserve_idle_ratio``: a gang those two still keep from holding holds at once all the same when
    its reservation is cheap: when the capacity it keeps idle until its start
    (``Reservation.held_idle_gpu_s``) is at most this times the GPU-time the gang itself will run
    (its GPUs x its time limit; None: off; never for a gang without a limit), so a large gang is held
    for when the running work happens to end together and waits for its age otherwise;
    ``preempt_loss_ratio``: a preemption goes ahead only when its victims lose at most this times the
    GPU-time the preemptor would otherwise wait (module docstring, Preemption; None: any loss);
    ``min_run_before_preempt_s``: a gang that has run less than this since it (re)started is no
    victim (0: every running gang may be); ``max_evictions``: a gang already evicted this many times
    (``Running.evictions``) is no victim again (None: no cap).

    Read by the extender around the pure queue: ``interval_s``: seconds between its own queue passes;
    ``preempt_namespaces``: the namespaces whose pods preemption may evict (None: every namespace);
    ``enforce_time_limits``: where work past its declared time limit plus ``time_limit_grace_s`` seconds
    is evicted (one of ``ENFORCE_MODES``: on nodes held for a waiting gang, everywhere, never);
    ``reservation_ttl_s``: how long a started gang's plan holds its nodes while no pod of it comes;
    ``barrier_timeout_s``: how long a gang's bind calls wait for the rest of the gang;
    ``repair_wait_s``: how long a running gang's replacement pod waits for a ready tray of its
    subgroup's NVLink domain before ``gpuagent.dev/repair: any`` lets it go to another domain."""

    ENFORCE_MODES: ClassVar[tuple[str, ...]] = ("held", "all", "off")
    MAX_EVICTIONS_CAP: ClassVar[int] = 1_000_000
    INTERVAL_BOUNDS_S: ClassVar[tuple[float, float]] = (0.05, 3600.0)
    _NAMESPACE: ClassVar[re.Pattern[str]] = re.compile(
        r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
    )  # DNS-1123 label

    preempt_after_s: float | None = 600.0
    exact_victims: int = 10
    max_plans: int = 64
    fill_holes: bool = True
    reserve_after_s: float = 0.0
    reserve_after_limits: float | None = None
    reserve_idle_ratio: float | None = None
    preempt_loss_ratio: float | None = 1.0
    min_run_before_preempt_s: float = 0.0
    max_evictions: int | None = 1
    interval_s: float = 1.0
    preempt_namespaces: frozenset[str] | None = None
    enforce_time_limits: str = "held"
    time_limit_grace_s: float = 60.0
    reservation_ttl_s: float = 120.0
    barrier_timeout_s: float = 20.0
    # the bench placement --tray-failures study chose it (scheduler_plugin/placement/failures.py)
    repair_wait_s: float = 1800.0

    def __post_init__(self) -> None:
        def finite(name: str, value: float | None, *, optional: bool = False) -> None:
            if value is None and optional:
                return
            if value is None or not (0 <= value < math.inf):
                rule = "a finite number >= 0" + (" or None" if optional else "")
                raise QueueError(f"{name} must be {rule}, got {value}", field=name)

        finite("preempt_after_s", self.preempt_after_s, optional=True)
        finite("reserve_after_s", self.reserve_after_s)
        finite("reserve_after_limits", self.reserve_after_limits, optional=True)
        finite("reserve_idle_ratio", self.reserve_idle_ratio, optional=True)
        finite("preempt_loss_ratio", self.preempt_loss_ratio, optional=True)
        finite("min_run_before_preempt_s", self.min_run_before_preempt_s)
        finite("time_limit_grace_s", self.time_limit_grace_s)
        finite("repair_wait_s", self.repair_wait_s)
        for name in ("reservation_ttl_s", "barrier_timeout_s"):
            value = getattr(self, name)
            if not (0 < value < math.inf):
                raise QueueError(f"{name} must be a finite number > 0, got {value}", field=name)
        if self.max_evictions is not None and not 0 <= self.max_evictions <= self.MAX_EVICTIONS_CAP:
            raise QueueError(
                f"max_evictions must be between 0 and {self.MAX_EVICTIONS_CAP} or None, "
                f"got {self.max_evictions}",
                field="max_evictions",
            )
        if self.exact_victims < 0:
            raise QueueError(f"exact_victims must be >= 0, got {self.exact_victims}", field="exact_victims")
        if self.max_plans < 1:
            raise QueueError(f"max_plans must be >= 1, got {self.max_plans}", field="max_plans")
        low, high = self.INTERVAL_BOUNDS_S
        if not low <= self.interval_s <= high:
            raise QueueError(
                f"interval_s must be between {low:g} and {high:g} seconds, got {self.interval_s}",
                field="interval_s",
            )
        if self.enforce_time_limits not in self.ENFORCE_MODES:
            raise QueueError(
                f"enforce_time_limits must be one of {', '.join(self.ENFORCE_MODES)}, "
                f"got {self.enforce_time_limits[:_SHOWN]!r}",
                field="enforce_time_limits",
            )
        if self.preempt_namespaces is not None:
            bad = next(
                (n for n in sorted(self.preempt_namespaces) if not self._NAMESPACE.fullmatch(n)),
                None if self.preempt_namespaces else "",
            )
            if bad is not None:
                raise QueueError(
                    "preempt_namespaces must be namespace names (DNS-1123 labels), at least one, or None "
                    f"(every namespace), got {bad[:_SHOWN]!r}",
                    field="preempt_namespaces",
                )


@dataclass(frozen=True, slots=True)
class Start:
    gang: str
    plan: Plan


@dataclass(frozen=True, slots=True)
class Preemption:
    """Evict every pod of each victim (whole gangs), then place ``gang`` by ``plan`` inside ``domain``
    of ``tier``; ``lost_gpu_s`` is the GPU-time the victims lose."""

    gang: str
    victims: tuple[str, ...]
    tier: str
    domain: str
    lost_gpu_s: float
    plan: Plan


@dataclass(frozen=True, slots=True)
class Decision:
    """One pass: gangs to start (in order, each plan on the cluster as the earlier starts left it),
    gangs to preempt for, the reservations held after the pass (new, kept or planned again), the gangs
    whose reservation of the previous pass is not held any more (started, deleted, or dropped as no
    longer valid and not planned again), when to run the next pass at the latest (a preemption
    wait ending; ``math.inf``: on events only), and the gangs passed over as the head because they
    fit nowhere even with every node free (gang -> the planner's reason)."""

    starts: tuple[Start, ...]
    preemptions: tuple[Preemption, ...]
    reservations: Mapping[str, Reservation]
    released: tuple[str, ...]
    wake_s: float = math.inf
    never_fits: Mapping[str, str] = field(default_factory=dict)


def planner_place(cache: SnapshotCache | None = None) -> Place:
    """Our planner as ``place``, with a snapshot cache of its own (consecutive snapshots of one cluster
    are prepared from each other)."""
    own = cache if cache is not None else SnapshotCache()

    def place(snapshot: ClusterSnapshot, gang: Gang) -> PlanResult:
        return plan(snapshot, gang, cache=own)

    return place


def order(waiting: Iterable[Waiting]) -> list[Waiting]:
    """The queue order: PriorityClass value (higher first), then when complete (``created_s``), then name."""
    return sorted(waiting, key=_order_key)


def _order_key(w: Waiting) -> tuple[float, float, str]:
    return (-w.priority, w.created_s, w.name)


def scope_tier(snapshot: ClusterSnapshot, gang: Gang) -> str | None:
    """The tier inside one domain of which the whole gang must sit: its gang tier, else the highest
    subgroup tier of its roles (None without either)."""
    if gang.tier is not None:
        return gang.tier
    subs = [r.subgroup_tier for r in gang.roles if r.subgroup_tier and r.subgroup_size]
    if not subs:
        return None
    tiers = snapshot.tiers
    known = [t for t in subs if t in tiers]
    if not known:
        return None
    one_block = all(r.subgroup_size and r.subgroup_size >= r.pods for r in gang.roles if r.subgroup_tier)
    return max(known, key=tiers.index) if one_block else None


def _uses(gang: Gang, placement: Mapping[PodSlot, str]) -> dict[str, dict[str, int]]:
    """Resources other than GPUs per node a plan of ``gang`` takes (its pods' requests)."""
    per = {r.name: r.resources_per_pod for r in gang.roles}
    out: dict[str, dict[str, int]] = {}
    for pod, node in placement.items():
        if per[pod.role]:
            acc = out.setdefault(node, {})
            for k, v in per[pod.role].items():
                acc[k] = acc.get(k, 0) + v
    return out


def _claims(gang: Gang, placement: Mapping[PodSlot, str]) -> dict[str, int]:
    """GPUs per node a plan of ``gang`` takes."""
    per = {r.name: r.gpus_per_pod for r in gang.roles}
    out: dict[str, int] = {}
    for pod, node in placement.items():
        out[node] = out.get(node, 0) + per[pod.role]
    return out


class _Cluster:
    """The pass's working view: free GPUs per node (changed as gangs start) and what running work holds
    per node, with snapshots that keep unchanged ``NodeState`` objects (planner caches diff by them)."""

    def __init__(self, snapshot: ClusterSnapshot, running: Mapping[str, Running]) -> None:
        self.snapshot = snapshot
        self.tiers = snapshot.tiers
        self.index = {n.name: i for i, n in enumerate(snapshot.nodes)}
        self.nodes = list(snapshot.nodes)
        self.running = dict(running)
        self._held: dict[str, list[tuple[float, int]]] | None = None

    def free(self, i: int) -> int:
        n = self.nodes[i]
        return max(0, min(n.free, n.gpus)) if n.schedulable else 0

    def held(self) -> dict[str, list[tuple[float, int]]]:
        """node -> (end, GPUs) of the running work on it."""
        if self._held is None:
            out: dict[str, list[tuple[float, int]]] = {}
            for r in self.running.values():
                for node, g in r.claims.items():
                    out.setdefault(node, []).append((r.ends_s, g))
            self._held = out
        return self._held

    def busy_at(self, node: str, t: float) -> int:
        """GPUs of ``node`` running work still holds at ``t`` (its limit ends after ``t``)."""
        return sum(g for end, g in self.held().get(node, ()) if end > t)

    def take(self, w: Waiting, p: Plan, now: float) -> None:
        """``w`` starts by ``p``: its GPUs and every other resource its pods request are taken."""
        claims = _claims(w.gang, p.placement)
        uses = _uses(w.gang, p.placement)
        for node, g in claims.items():
            i = self.index[node]
            n = self.nodes[i]
            u = uses.get(node, {})
            rest = {r: max(0, v - u.get(r, 0)) for r, v in n.free_resources.items()}
            self.nodes[i] = replace(n, free=n.free - g, free_resources=rest if u else n.free_resources)
        self.snapshot = ClusterSnapshot(tiers=self.tiers, nodes=tuple(self.nodes))
        ends = now + w.limit_s if w.limit_s is not None else math.inf
        self.running[w.name] = Running(w.name, w.priority, now, ends, claims, uses=uses)
        self._held = None

    def with_free(
        self,
        free: Mapping[int, int],
        base: Sequence[NodeState] | None = None,
        freed: Mapping[int, Mapping[str, int]] | None = None,
    ) -> ClusterSnapshot:
        """The nodes (``base``, else the pass's) with ``free`` GPUs by index, and ``freed`` other
        resources given back by index (up to each node's allocatable)."""
        nodes = list(self.nodes if base is None else base)
        for i, f in free.items():
            n = nodes[i]
            if n.free != f:
                nodes[i] = _node_with(n, f, n.free_resources)
        for i, back in (freed or {}).items():
            n = nodes[i]
            rest = {r: min(n.resources.get(r, v), v + back.get(r, 0)) for r, v in n.free_resources.items()}
            if rest != n.free_resources:
                nodes[i] = _node_with(n, n.free, rest)
        return ClusterSnapshot(tiers=self.tiers, nodes=tuple(nodes))


def _node_with(n: NodeState, free: int, free_resources: Mapping[str, int]) -> NodeState:
    """``n`` with other free GPUs and resources: ``dataclasses.replace`` without its field walk (a pass
    makes tens of thousands of these for the futures a reservation is planned on)."""
    return NodeState(
        n.name, n.gpus, free, n.domains, n.resources, free_resources, n.schedulable, n.degraded, n.ready
    )


def held_back_gpus(capacity: int, busy_then: int, claim: int, *, free: int | None = None) -> int:
    """The backfill rule, the one place it is written (the queue, the extender's filter and preempt
    verbs, and the placement simulator read it): on a node reserved for a gang starting at ``t``, work
    that may still run at ``t`` may use what is free now (``free``; None: no bound) but no more than
    what is left at ``t`` beyond the ``claim`` and the running work still there then (``busy_then``)."""
    left = capacity - busy_then - claim
    return max(0, left if free is None else min(free, left))


def _held_back(cl: _Cluster, resvs: Sequence[Reservation]) -> ClusterSnapshot:
    """The cluster as a gang that may delay ``resvs`` sees it: on each reserved node, only what is left
    at the earliest of their starts beyond the claims and what running work still holds then."""
    if not resvs:
        return cl.snapshot
    claims: dict[str, int] = {}
    first: dict[str, float] = {}
    for r in resvs:
        for node, g in r.claims.items():
            claims[node] = claims.get(node, 0) + g
            first[node] = min(first.get(node, math.inf), r.start_s)
    free: dict[int, int] = {}
    for node, g in claims.items():
        i = cl.index.get(node)
        if i is None:
            continue
        n = cl.nodes[i]
        free[i] = held_back_gpus(n.gpus, cl.busy_at(node, first[node]), g, free=cl.free(i))
    return cl.with_free(free)


def _drop_overrun(
    held: dict[str, Reservation], prio: Mapping[str, int], w: Waiting, cl: _Cluster, now: float
) -> None:
    """After ``w`` started: drop the reservations of lower priority it made unkeepable (planned again
    when their gang is the head)."""
    for n in [n for n in held if prio[n] < w.priority]:
        if not _still_valid(held[n], cl, now):
            del held[n]


def _ends(w: Waiting, now: float) -> float:
    return now + w.limit_s if w.limit_s is not None else math.inf


def _still_valid(r: Reservation, cl: _Cluster, now: float) -> bool:
    if r.start_s <= now:
        return False  # its start has come and the gang did not start: plan again
    for name, end in r.waits_for.items():
        if name not in cl.running and now < end:
            return False  # ended early: an earlier start may exist
    for node, g in r.claims.items():
        i = cl.index.get(node)
        if i is None:
            return False
        n = cl.nodes[i]
        if not n.schedulable or n.gpus - cl.busy_at(node, r.start_s) < g:
            return False
    return True


def _restricted(
    cl: _Cluster,
    base: Sequence[NodeState],
    members: Collection[int],
    zeros: dict[int, NodeState] | None = None,
) -> ClusterSnapshot:
    """``base`` with every node outside ``members`` full (``zeros``: full copies made so far, reused)."""
    inside = set(members)
    made = zeros if zeros is not None else {}
    nodes = []
    for i, n in enumerate(base):
        if i in inside or n.free == 0:
            nodes.append(n)
            continue
        z = made.get(i)
        if z is None or z.name != n.name or z.gpus != n.gpus:
            z = made[i] = replace(n, free=0)
        nodes.append(z)
    return ClusterSnapshot(tiers=cl.tiers, nodes=tuple(nodes))


def _domains(cl: _Cluster, tier: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, n in enumerate(cl.nodes):
        d = n.domains.get(tier)
        if d is not None:
            out.setdefault(d, []).append(i)
    return dict(sorted(out.items()))


class _Futures:
    """The cluster as it will be once the first ``upto`` of ``ends`` (running work, in the order it
    ends) ended: their GPUs and every other resource they hold (CPU, memory) free again, on the nodes
    ``usable`` admits, less what ``held`` (other reservations, by node index) keeps. Built from the
    last one asked for: moving from one ``upto`` to another costs the work that ends between them and
    the nodes it holds, not the whole cluster, and a node in a state seen before is the very
    ``NodeState`` object it was then (the planner's cache diffs snapshots by identity). Equal, node
    for node, to the same future built from scratch (tests/scheduler_plugin/test_queue_futures.py)."""

    def __init__(
        self,
        cl: _Cluster,
        ends: Sequence[Running],
        base: Sequence[int],
        held: Mapping[int, int],
        usable: Callable[[int], bool],
    ) -> None:
        self.cl = cl
        self.ends = ends
        self.base = base
        self.held = held
        self.usable = usable
        self.upto = 0
        self.gpus: dict[int, int] = {}  # node index -> GPUs the ended work gives back (not capped)
        self.back: dict[int, dict[str, int]] = {}  # node index -> other resources given back
        self.claimed: dict[int, int] = {}  # node index -> ended work whose ``claims`` name it
        self.touching: dict[int, int] = {}  # node index -> ended work whose ``uses`` name it
        # GPUs given back are capped at the node's one claim after another: with none negative that is
        # the capped sum, which can be taken back; else each future is built from scratch
        self.additive = all(g >= 0 for r in ends for g in r.claims.values())
        self.made: dict[tuple[int, int, tuple[tuple[str, int], ...] | None], NodeState] = {}
        self.resolved: list[tuple[list[tuple[int, int]], list[tuple[int, Mapping[str, int]]]] | None] = [
            None
        ] * len(ends)
        self.nodes = list(cl.nodes)
        for i, b in enumerate(base):  # before any work ends: unusable nodes full, others' holds taken
            if held.get(i, 0) or b != cl.nodes[i].free:
                self.nodes[i] = self._node(i)

    def _net(self, i: int, f: int) -> int:
        return max(0, f - self.held.get(i, 0))

    def _resolve(self, k: int) -> tuple[list[tuple[int, int]], list[tuple[int, Mapping[str, int]]]]:
        """The ``k``-th ended work's GPUs and other resources by usable node index."""
        got = self.resolved[k]
        if got is None:
            r, index, usable = self.ends[k], self.cl.index, self.usable
            claims = [
                (i, g) for node, g in r.claims.items() if (i := index.get(node)) is not None and usable(i)
            ]
            uses = [(i, u) for node, u in r.uses.items() if (i := index.get(node)) is not None and usable(i)]
            got = self.resolved[k] = (claims, uses)
        return got

    def _node(self, i: int) -> NodeState:
        """Node ``i`` as the work ended so far leaves it (the object made before for the same state)."""
        n = self.cl.nodes[i]
        given = (
            self.base[i] if not self.claimed.get(i, 0) else min(n.gpus, self.base[i] + self.gpus.get(i, 0))
        )
        free = self._net(i, given)
        rest: dict[str, int] | None = None
        if self.touching.get(i, 0):
            back = self.back.get(i, {})
            rest = {r: min(n.resources.get(r, v), v + back.get(r, 0)) for r, v in n.free_resources.items()}
            if rest == n.free_resources:
                rest = None
        if free == n.free and rest is None:
            return n
        key = (i, free, tuple(sorted(rest.items())) if rest is not None else None)
        made = self.made.get(key)
        if made is None:
            made = self.made[key] = _node_with(n, free, n.free_resources if rest is None else rest)
        return made

    def _move(self, k: int, sign: int, touched: set[int]) -> None:
        claims, uses = self._resolve(k)
        gpus, back, touching = self.gpus, self.back, self.touching
        for i, g in claims:
            gpus[i] = gpus.get(i, 0) + sign * g
            self.claimed[i] = self.claimed.get(i, 0) + sign
            touched.add(i)
        for i, u in uses:
            touching[i] = touching.get(i, 0) + sign
            acc = back.setdefault(i, {})
            for res, v in u.items():
                acc[res] = acc.get(res, 0) + sign * v
            touched.add(i)

    def at(self, upto: int) -> ClusterSnapshot:
        """The cluster once the first ``upto`` of ``ends`` ended."""
        if not self.additive:
            return _future_from_scratch(self.cl, self.ends, upto, self.base, self.held, self.usable)
        touched: set[int] = set()
        while self.upto < upto:
            self._move(self.upto, 1, touched)
            self.upto += 1
        while self.upto > upto:
            self.upto -= 1
            self._move(self.upto, -1, touched)
        for i in touched:
            self.nodes[i] = self._node(i)
        return ClusterSnapshot(tiers=self.cl.tiers, nodes=tuple(self.nodes))


def _future_from_scratch(  # noqa: PLR0917 -- the reference ``_Futures`` is held to
    cl: _Cluster,
    ends: Sequence[Running],
    upto: int,
    base: Sequence[int],
    held: Mapping[int, int],
    usable: Callable[[int], bool],
) -> ClusterSnapshot:
    """What ``_Futures.at(upto)`` answers, built from the pass's cluster alone: each claim of the ended
    work given back in turn (capped at the node's GPUs), the other resources summed and given back at
    once (capped at the node's allocatable), ``held`` taken off every node."""

    def net(i: int, f: int) -> int:
        return max(0, f - held.get(i, 0))

    fr: dict[int, int] = {}  # the nodes whose GPUs the ended work gives back (the rest: ``base``)
    back: dict[int, dict[str, int]] = {}
    for r in ends[:upto]:
        for node, g in r.claims.items():
            i = cl.index.get(node)
            if i is not None and usable(i):
                fr[i] = min(cl.nodes[i].gpus, fr.get(i, base[i]) + g)
        for node, u in r.uses.items():
            i = cl.index.get(node)
            if i is not None and usable(i):
                acc = back.setdefault(i, {})
                for k, v in u.items():
                    acc[k] = acc.get(k, 0) + v
    free = {i: f for i, f in ((i, net(i, b)) for i, b in enumerate(base)) if f != cl.nodes[i].free}
    free.update({i: net(i, f) for i, f in fr.items()})
    return cl.with_free(free, freed=back)


def _reserve(  # noqa: PLR0917 -- private helper, called in two places
    w: Waiting,
    cl: _Cluster,
    others: Sequence[Reservation],
    now: float,
    place: Place,
    allowed: Collection[int] | None = None,
) -> Reservation | None:
    """The head's reservation (module docstring), or None when it never fits on what will free.
    ``allowed``: only these nodes (by index) may be reserved (rebuilding a reservation)."""
    need = w.gpus
    n_nodes = len(cl.nodes)
    inside = set(allowed) if allowed is not None else None
    held_by_others: dict[int, int] = {}
    for r in others:  # other reservations stay held, conservatively from now on
        for node, g in r.claims.items():
            i = cl.index.get(node)
            if i is not None:
                held_by_others[i] = held_by_others.get(i, 0) + g

    def usable(i: int) -> bool:
        return (inside is None or i in inside) and cl.nodes[i].schedulable

    base = [cl.free(i) if usable(i) else 0 for i in range(n_nodes)]
    ends = sorted(
        (r for r in cl.running.values() if math.isfinite(r.ends_s) and r.ends_s > now),
        key=lambda r: (r.ends_s, r.name),
    )

    def net(i: int, f: int) -> int:
        return max(0, f - held_by_others.get(i, 0))

    points: list[tuple[float, int]] = []  # (time, running gangs ended by then, in ``ends`` order)
    free = list(base)
    total = sum(net(i, f) for i, f in enumerate(free))
    if total >= need:
        points.append((now, 0))
    k = 0
    while k < len(ends):
        at = ends[k].ends_s
        while k < len(ends) and ends[k].ends_s == at:
            for node, g in ends[k].claims.items():
                i = cl.index.get(node)
                if i is None or not usable(i):
                    continue
                before = net(i, free[i])
                free[i] = min(cl.nodes[i].gpus, free[i] + g)
                total += net(i, free[i]) - before
            k += 1
        if total >= need:
            points.append((at, k))

    futures = _Futures(cl, ends, base, held_by_others, usable)
    lo, hi = 0, len(points)
    found: tuple[float, ClusterSnapshot, Plan] | None = None
    while lo < hi:
        mid = (lo + hi) // 2
        at, upto = points[mid]
        snap = futures.at(upto)
        tried = place(snap, w.gang)
        if isinstance(tried, Infeasible):
            lo = mid + 1
        else:
            found, hi = (at, snap, tried), mid
    if found is None:
        return None
    at, snap, first_plan = found
    idle, dom, chosen = _least_idle(w, cl, snap, first_plan, at, now, place)
    claims = _claims(w.gang, chosen.placement)
    waits = {
        r.name: r.ends_s
        for r in cl.running.values()
        if now < r.ends_s <= at and any(n in claims for n in r.claims)
    }
    return Reservation(w.name, at, claims, dom, waits, idle)


def _least_idle(  # noqa: PLR0917 -- private helper of ``_reserve``, called once
    w: Waiting, cl: _Cluster, snap: ClusterSnapshot, first_plan: Plan, at: float, now: float, place: Place
) -> tuple[float, str | None, Plan]:
    """Of the domains of the gang's scope tier that can hold it at ``at``, the plan whose hold keeps
    the least capacity idle until then (ties: the first plan's domain, then by name); the first plan
    without a scope tier. Returns (idle GPU-seconds, domain, plan)."""
    tier = scope_tier(cl.snapshot, w.gang)
    candidates: list[tuple[float, int, str | None, Plan]] = []
    first_domain: str | None = None
    if tier is not None:
        first_domain = _domain_of(cl, first_plan, tier)
        zeros: dict[int, NodeState] = {}
        for name, members in _domains(cl, tier).items():
            if sum(snap.nodes[i].free for i in members) < w.gpus:
                continue
            if name == first_domain:
                res: PlanResult = first_plan
            else:
                res = place(_restricted(cl, snap.nodes, members, zeros), w.gang)
            if isinstance(res, Infeasible):
                continue
            idle = _held_idle(cl, w.gang, res, at, now)
            candidates.append((idle, 0 if name == first_domain else 1, name, res))
    if candidates:
        idle, _, dom, chosen = min(candidates, key=lambda c: (c[0], c[1], c[2] or ""))
        return idle, dom, chosen
    return _held_idle(cl, w.gang, first_plan, at, now), first_domain, first_plan


def _domain_of(cl: _Cluster, p: Plan, tier: str) -> str | None:
    doms = {cl.nodes[cl.index[n]].domains.get(tier) for n in p.placement.values()}
    return doms.pop() if len(doms) == 1 else None


def _held_idle(cl: _Cluster, gang: Gang, p: Plan, at: float, now: float) -> float:
    """GPU-seconds of capacity a hold of ``p`` until ``at`` keeps idle: per node, each claimed GPU from
    the time it frees (now if free now) until ``at``."""
    out = 0.0
    for node, g in _claims(gang, p.placement).items():
        i = cl.index[node]
        avail = cl.free(i)
        take_now = min(avail, g)
        out += take_now * (at - now)
        left = g - take_now
        for end, held in sorted(cl.held().get(node, ())):
            if left <= 0 or end > at:
                break
            used = min(left, held)
            out += used * (at - end)
            left -= used
    return out


def _preempt(  # noqa: PLR0917 -- private helper, called once
    w: Waiting, cl: _Cluster, view: ClusterSnapshot, now: float, place: Place, config: QueueConfig
) -> Preemption | None:
    """The cheapest whole-gang eviction inside one domain of ``w``'s scope tier (module docstring)."""
    tier = scope_tier(cl.snapshot, w.gang) or (cl.tiers[0] if cl.tiers else None)
    if tier is None:
        return None
    need = w.gpus
    domains = _domains(cl, tier)
    dom_of = {cl.nodes[i].name: d for d, members in domains.items() for i in members}
    by_domain: dict[str, list[Running]] = {}
    for r in cl.running.values():
        if _may_evict(r, w, now, config):
            for d in sorted({dom_of[n] for n in r.claims if n in dom_of}):
                by_domain.setdefault(d, []).append(r)
    best: Preemption | None = None
    zeros: dict[int, NodeState] = {}
    for dom, victims in sorted(by_domain.items()):
        members = domains[dom]
        victims.sort(key=lambda r: (_lost(r, now), r.name))
        room = sum(view.nodes[i].free for i in members if view.nodes[i].schedulable)
        freed = {r.name: sum(g for n, g in r.claims.items() if dom_of.get(n) == dom) for r in victims}
        if room + sum(freed.values()) < need:
            continue

        def feasible(chosen: Sequence[Running], members: list[int] = members) -> Plan | None:
            add: dict[int, int] = {}
            for r in chosen:
                for node, g in r.claims.items():
                    i = cl.index.get(node)
                    if i is not None:
                        add[i] = add.get(i, 0) + g
            snap = cl.with_free(
                {i: min(view.nodes[i].gpus, view.nodes[i].free + a) for i, a in add.items()}, view.nodes
            )
            res = place(_restricted(cl, snap.nodes, members, zeros), w.gang)
            return None if isinstance(res, Infeasible) else res

        found = _choose_victims(victims, freed, room, need, feasible, now, config)
        if found is None:
            continue
        chosen, p = found
        lost = sum(_lost(r, now) for r in chosen)
        cand = Preemption(w.name, tuple(sorted(r.name for r in chosen)), tier, dom, lost, p)
        if best is None or (lost, len(cand.victims), dom) < (best.lost_gpu_s, len(best.victims), best.domain):
            best = cand
    return best


def _worth_it(  # noqa: PLR0917 -- private helper of ``decide``, called once
    pre: Preemption,
    w: Waiting,
    own: Reservation | None,
    cl: _Cluster,
    held: Mapping[str, Reservation],
    ahead: Collection[str],
    now: float,
    place: Place,
    config: QueueConfig,
) -> bool:
    """Whether ``pre`` loses at most ``preempt_loss_ratio`` times the GPU-time ``w`` would otherwise
    wait: its GPUs x (its expected start - now), from ``own`` or a reservation planned now around the
    others of ``ahead`` held (never fitting: an endless wait, any loss is worth it)."""
    ratio = config.preempt_loss_ratio
    if ratio is None or pre.lost_gpu_s <= 0:
        return True
    if own is not None and own.start_s > now:
        start = own.start_s
    else:
        made = _reserve(w, cl, [held[n] for n in ahead if n in held], now, place)
        start = made.start_s if made is not None else math.inf
    return pre.lost_gpu_s <= ratio * w.gpus * (start - now)


def _may_evict(r: Running, w: Waiting, now: float, config: QueueConfig) -> bool:
    """``r`` may be a victim of ``w``: preemptible, lower priority, run long enough, not evicted too
    often."""
    return (
        r.preemptible
        and r.priority < w.priority
        and now - r.started_s >= config.min_run_before_preempt_s
        and (config.max_evictions is None or r.evictions < config.max_evictions)
    )


def _lost(r: Running, now: float) -> float:
    return r.gpus * max(0.0, now - r.started_s)


def _choose_victims(  # noqa: PLR0917 -- private helper, called once
    victims: Sequence[Running],
    freed: Mapping[str, int],
    room: int,
    need: int,
    feasible: Callable[[Sequence[Running]], Plan | None],
    now: float,
    config: QueueConfig,
) -> tuple[list[Running], Plan] | None:
    """The victims (whole gangs) of least lost GPU-time whose eviction lets the gang be placed."""
    if len(victims) <= config.exact_victims:
        subsets: list[tuple[float, int, tuple[str, ...], tuple[Running, ...]]] = []
        for k in range(1, len(victims) + 1):
            for combo in combinations(victims, k):
                if room + sum(freed[r.name] for r in combo) < need:
                    continue
                cost = sum(_lost(r, now) for r in combo)
                subsets.append((cost, k, tuple(r.name for r in combo), combo))
        subsets.sort(key=lambda s: (s[0], s[1], s[2]))
        for _, _, _, combo in subsets[: config.max_plans]:
            exact = feasible(combo)
            if exact is not None:
                return list(combo), exact
        if len(subsets) <= config.max_plans:
            return None
    # greedy: cheapest per GPU freed here first, until the gang fits; then drop what is not needed
    ranked = sorted(victims, key=lambda r: (_lost(r, now) / max(1, freed[r.name]), r.name))
    chosen: list[Running] = []
    got = room
    p: Plan | None = None
    for r in ranked:
        chosen.append(r)
        got += freed[r.name]
        if got >= need:
            p = feasible(chosen)
            if p is not None:
                break
    if p is None:
        return None
    for r in sorted(chosen, key=lambda r: (-_lost(r, now), r.name)):
        trial = [x for x in chosen if x is not r]
        if trial and room + sum(freed[x.name] for x in trial) >= need:
            q = feasible(trial)
            if q is not None:
                chosen, p = trial, q
    return chosen, p


def _fill_hole(  # noqa: PLR0917 -- private helper of ``decide``, called once
    w: Waiting,
    cl: _Cluster,
    held: Mapping[str, Reservation],
    blocking: tuple[str, ...],
    end: float,
    shape: tuple[object, ...],
    holes: dict[tuple[str, ...], tuple[ClusterSnapshot, int]],
    failed: set[tuple[object, ...]],
    place: Place,
) -> Plan | None:
    """``w`` placed on the reserved capacity that stays idle until its reservation starts, when ``w``
    ends before that start: such a gang delays no reservation there, and it leaves the unreserved
    capacity to gangs that run longer. None when it does not end before any start or does not fit."""
    fitting = tuple(
        sorted(n for n, r in held.items() if n != w.name and n not in blocking and end <= r.start_s)
    )
    if not fitting:
        return None
    hkey = ("hole", shape, fitting, blocking)
    if hkey in failed:
        return None
    if fitting not in holes:
        members = sorted({cl.index[n] for name in fitting for n in held[name].claims if n in cl.index})
        snap = _restricted(cl, _held_back(cl, [held[n] for n in blocking]).nodes, members)
        holes[fitting] = (snap, sum(snap.nodes[i].free for i in members if snap.nodes[i].schedulable))
    snap, room = holes[fitting]
    if room < w.gpus:
        failed.add(hkey)
        return None
    res = place(snap, w.gang)
    if isinstance(res, Infeasible):
        failed.add(hkey)
        return None
    return res


def _reserve_age(w: Waiting, config: QueueConfig) -> float:
    """How long ``w`` waits before it may hold anything back (``QueueConfig.reserve_after_s`` and
    ``reserve_after_limits``)."""
    k = config.reserve_after_limits
    if k is None or w.limit_s is None or not math.isfinite(w.limit_s):
        return config.reserve_after_s
    return max(config.reserve_after_s, k * w.limit_s)


def _cheap_hold(
    w: Waiting, *, cl: _Cluster, others: Sequence[Reservation], now: float, place: Place, config: QueueConfig
) -> Reservation | None:
    """The reservation of ``w``, too young to hold by its age, when it is cheap enough to hold all the
    same (``QueueConfig.reserve_idle_ratio``), else None."""
    ratio = config.reserve_idle_ratio
    if ratio is None or w.limit_s is None or not math.isfinite(w.limit_s):
        return None
    made = _reserve(w, cl, others, now, place)
    if made is None or made.held_idle_gpu_s > ratio * w.gpus * w.limit_s:
        return None
    return made


def same_shape(g: Gang) -> tuple[object, ...]:
    """The same-shape key: gangs with equal keys place alike on one snapshot (a shape that failed
    fails again within a pass, in the queue and in the simulator)."""
    return (
        g.tier,
        g.soft,
        g.mnnvl,
        tuple(
            (
                r.pods,
                r.gpus_per_pod,
                r.subgroup_size,
                r.subgroup_tier,
                r.min_subgroups,
                tuple(r.resources_per_pod.items()),
                r.domain,
            )
            for r in g.roles
        ),
    )


def decide(
    now: float,
    snapshot: ClusterSnapshot,
    running: Mapping[str, Running],
    waiting: Iterable[Waiting],
    reservations: Mapping[str, Reservation],
    *,
    place: Place,
    config: QueueConfig = QueueConfig(),
    only: Collection[str] | None = None,
) -> Decision:
    """One scheduling pass (module docstring).

    ``snapshot``: the cluster now (free GPUs per node); ``running``: started gangs by name;
    ``waiting``: gangs not started (any order); ``reservations``: what the previous pass held (by gang
    name); ``place``: the planner. ``only``: try only these gangs (None: all) -- a caller that knows
    nothing but new arrivals changed since the last pass may pass their names; reservations are kept
    and checked either way, and the head is always tried when it holds none.
    """
    cl = _Cluster(snapshot, running)
    queue = order(waiting)
    names = {w.name for w in queue}
    held: dict[str, Reservation] = {}
    for name, r in sorted(reservations.items()):
        if name in names and _still_valid(r, cl, now):
            held[name] = r  # else started, deleted, or planned again below
    starts: list[Start] = []
    preemptions: list[Preemption] = []
    failed: set[tuple[object, ...]] = set()
    views: dict[tuple[str, ...], tuple[ClusterSnapshot, int]] = {}
    holes: dict[tuple[str, ...], tuple[ClusterSnapshot, int]] = {}
    head_seen = False
    wake = math.inf
    never: dict[str, str] = {}
    prio = {w.name: w.priority for w in queue}
    wait_s = config.preempt_after_s
    lowest = min((r.priority for r in cl.running.values()), default=None)
    for w in queue:
        tried = only is None or w.name in only or (not head_seen and w.name not in held)
        own = held.get(w.name)
        end = _ends(w, now)
        # only reservations of gangs of this priority or higher hold capacity back from it
        ahead = [n for n in held if n != w.name and prio[n] >= w.priority]
        blocking = tuple(sorted(n for n in ahead if held[n].start_s < end))
        if tried:
            if blocking not in views:
                snap = _held_back(cl, [held[n] for n in blocking])
                views[blocking] = (snap, sum(n.free for n in snap.nodes if n.schedulable))
            view, room = views[blocking]
            shape = same_shape(w.gang)
            fkey = (shape, blocking)
            if room >= w.gpus and fkey not in failed:
                hole = (
                    _fill_hole(w, cl, held, blocking, end, shape, holes, failed, place)
                    if config.fill_holes
                    else None
                )
                res = hole if hole is not None else place(view, w.gang)
                if isinstance(res, Infeasible):
                    failed.add(fkey)  # capacity only shrinks within a pass: the shape fails again
                else:
                    starts.append(Start(w.name, res))
                    cl.take(w, res, now)
                    _drop_overrun(held, prio, w, cl, now)
                    lowest = w.priority if lowest is None else min(lowest, w.priority)
                    views.clear()
                    holes.clear()
                    held.pop(w.name, None)
                    continue
        if wait_s is not None and lowest is not None and lowest < w.priority:
            due = w.created_s + wait_s
            if now < due:
                wake = min(wake, due)
            elif tried and (own is None or own.start_s > now):
                view = _held_back(cl, [held[n] for n in blocking])
                pre = _preempt(w, cl, view, now, place, config)
                if pre is not None and not _worth_it(pre, w, own, cl, held, ahead, now, place, config):
                    pre = None
                if pre is not None:
                    preemptions.append(pre)
                    for v in pre.victims:
                        cl.running.pop(v, None)
                    cl._held = None
                    lowest = min((r.priority for r in cl.running.values()), default=None)
                    held[w.name] = Reservation(w.name, now, _claims(w.gang, pre.plan.placement), pre.domain)
                    views.clear()
                    holes.clear()
                    failed.clear()
                    head_seen = True
                    continue
        if not head_seen:
            # the same sum decides and wakes: "now - created < after" can hold where "created + after"
            # rounds to now, and a wake at now is a pass that never lets time advance
            age = _reserve_age(w, config)
            grown = w.created_s + age
            cheap: Reservation | None = None
            if age > 0 and w.name not in held and now < grown:
                wake = min(wake, grown)
                if tried and config.reserve_idle_ratio is not None:  # the dial on: a cheap hold goes
                    others = [held[n] for n in ahead if n in held]
                    cheap = _cheap_hold(w, cl=cl, others=others, now=now, place=place, config=config)
                if cheap is None:
                    continue  # too young to hold anything back: later gangs may pass it freely
            head_seen = True
            if w.name not in held and tried:
                others = [held[n] for n in ahead if n in held]
                made = cheap if cheap is not None else _reserve(w, cl, others, now, place)
                if made is not None:
                    held[w.name] = made
                    for n in [n for n, r in held.items() if prio[n] < w.priority]:
                        if not set(held[n].claims).isdisjoint(made.claims):
                            del held[n]  # a lower class gives way; planned again when it is the head
                    views.clear()
                    holes.clear()
                else:
                    why = _never_fits(w, cl, place)
                    if why is not None:  # it could hold nothing ever: the next gang is the head
                        never[w.name] = why
                        head_seen = False
    gone = tuple(sorted(n for n in reservations if n not in held))
    return Decision(tuple(starts), tuple(preemptions), held, gone, wake, never)


def _never_fits(w: Waiting, cl: _Cluster, place: Place) -> str | None:
    """The planner's reason when ``w`` fits nowhere even with every schedulable node wholly free (no
    domain of its tier could ever hold it), else None (it waits for work that never ends)."""
    empty = [
        n
        if n.free == n.gpus and n.free_resources == n.resources
        else replace(n, free=n.gpus, free_resources=n.resources)
        for n in cl.nodes
    ]
    res = place(ClusterSnapshot(tiers=cl.tiers, nodes=tuple(empty)), w.gang)
    return res.reason if isinstance(res, Infeasible) else None


# -- rebuilding after a restart --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What the API shows of one gang pod: its gang (``<namespace>/<gang>``), priority, creation time,
    time limit (``time_limit``), the node it is bound to (None: pending) and its GPUs, and when it
    started (None: not yet)."""

    gang: str
    priority: int
    created_s: float
    limit_s: float | None
    node: str | None
    gpus: int
    started_s: float | None = None
    resources: Mapping[str, int] = field(default_factory=dict)  # its other requests (CPU, memory)


@dataclass(frozen=True, slots=True)
class QueueState:
    """``decide``'s inputs rebuilt from the API: running gangs, reservations, and the node annotations
    that name no waiting gang any more (to clear)."""

    running: Mapping[str, Running]
    reservations: Mapping[str, Reservation]
    stale_nodes: tuple[str, ...]


def time_limit(
    annotations: Mapping[str, str], active_deadline_s: int | None = None, *, where: str = "pod"
) -> float | None:
    """A pod's declared time limit in seconds: the smallest of ``gpuagent.dev/time-limit``, Kueue's
    ``kueue.x-k8s.io/max-exec-time-seconds`` and a Job's ``activeDeadlineSeconds``; None when none is set.
    A bad value raises ``QueueError`` naming the key and ``where``."""
    found: list[float] = []
    for key in LIMIT_ANNOTATIONS:
        raw = annotations.get(key)
        if raw is None:
            continue
        shown = repr(raw) if len(raw) <= _SHOWN else repr(raw[:_SHOWN]) + f"... ({len(raw)} characters)"
        try:
            value = float(raw.strip())
        except ValueError:
            raise QueueError(f"{where}: annotation {key}={shown} is not a number of seconds") from None
        if not math.isfinite(value) or value <= 0:
            raise QueueError(f"{where}: annotation {key}={shown} must be a positive number of seconds")
        found.append(value)
    if active_deadline_s is not None:
        if active_deadline_s <= 0:
            raise QueueError(f"{where}: activeDeadlineSeconds={active_deadline_s} must be positive")
        found.append(float(active_deadline_s))
    return min(found) if found else None


def rebuild(
    now: float,
    snapshot: ClusterSnapshot,
    pods: Iterable[PodFacts],
    waiting: Iterable[Waiting],
    reserved_for: Mapping[str, str],
    *,
    place: Place,
) -> QueueState:
    """Running gangs from their bound pods (a gang whose pods are all bound and started runs from its
    latest pod's start; its limit from its first pod's), and each waiting gang's reservation from the
    nodes annotated ``reserved-for`` it: the gang planned on those nodes alone at the first time it
    fits there. A reservation that no longer fits is left out (the next ``decide`` plans a new one), and
    so is one the queue would not grant now: only the first waiting gang of its priority class keeps
    its hold (the head's, or one that delays nobody ahead of it), so a forged annotation cannot move a
    gang ahead; annotations naming no waiting gang come back as ``stale_nodes``."""
    by_gang: dict[str, list[PodFacts]] = {}
    for pod in pods:
        if pod.node is not None:
            by_gang.setdefault(pod.gang, []).append(pod)
    waiting_by = {w.name: w for w in waiting}
    running: dict[str, Running] = {}
    for name, bound in sorted(by_gang.items()):
        if name in waiting_by:
            continue
        claims: dict[str, int] = {}
        uses: dict[str, dict[str, int]] = {}
        for pod in bound:
            assert pod.node is not None
            claims[pod.node] = claims.get(pod.node, 0) + pod.gpus
            if pod.resources:
                acc = uses.setdefault(pod.node, {})
                for k, v in pod.resources.items():
                    acc[k] = acc.get(k, 0) + v
        starts = [p.started_s if p.started_s is not None else now for p in bound]
        started = max(starts)
        limits = [p.limit_s for p in bound if p.limit_s is not None]
        ends = started + min(limits) if limits else math.inf
        running[name] = Running(name, min(p.priority for p in bound), min(starts), ends, claims, uses=uses)
    nodes_of: dict[str, list[str]] = {}
    stale: list[str] = []
    for node, gang in sorted(reserved_for.items()):
        if gang in waiting_by:
            nodes_of.setdefault(gang, []).append(node)
        else:
            stale.append(node)
    # the first waiting gang of each class: only its hold delays nobody ahead of it (a hold holds back
    # gangs of its class and lower; gangs of a higher class pass it). Any other came from a forged or
    # outdated annotation and would reorder the queue: left out, ``decide`` plans the head afresh
    firsts: dict[int, str] = {}
    for w in sorted(waiting_by.values(), key=_order_key):
        firsts.setdefault(w.priority, w.name)
    cl = _Cluster(snapshot, running)
    out: dict[str, Reservation] = {}
    for gang in sorted(nodes_of, key=lambda g: _order_key(waiting_by[g])):
        if firsts[waiting_by[gang].priority] != gang:
            continue
        members = [cl.index[n] for n in nodes_of[gang] if n in cl.index]
        if not members:
            continue
        r = _reserve(waiting_by[gang], cl, list(out.values()), now, place, allowed=members)
        if r is not None:
            out[gang] = r
    return QueueState(running, out, tuple(stale))
