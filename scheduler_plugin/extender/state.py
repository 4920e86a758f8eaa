"""The extender's view of the cluster and its decisions: filter, prioritize, the bind barrier. Pure.

Fed by informer events (plain API dicts) and by the scheduler's calls; the clock is an argument
(``now``, seconds) so every decision can be replayed in a test. Kinds kept: ``nodes``, ``pods``,
``hypernodes``, and the gang sources (``scheduler_plugin.gangs``) ``podgroups`` (Volcano),
``rayclusters`` (KubeRay), ``workloads`` and ``workload_podgroups`` (``scheduling.k8s.io``).
Nothing here talks to the network: the decisions come back as values (which nodes pass, which pods
to bind, which Events to record) and ``scheduler_plugin.extender`` carries them out.

Gangs: the first pod of a gang to reach filter runs the queue (``queue.decide``, fed by
``queue_pass``: running gangs from bound pods, waiting gangs in PriorityClass-then-creation order, the
reservations of earlier passes). A gang the queue starts gets a plan on the nodes its pods'
``nodeSelector`` allows, and the plan becomes a reservation: its nodes' GPUs are held for the gang and
every pod of the gang is filtered to its planned node. A gang that does not start waits: the head of
the queue holds the nodes it will get (``queue_reservations``, an Event ``GangReserved`` with the
expected start, the node annotation ``gpuagent.dev/reserved-for``); other gangs, and pods on their own,
use those nodes only if their time limit ends before that start (a limit only declared counts only
where the extender enforces it: ``enforce_time_limits``, the queue pass evicting work past it). A gang
of higher priority that has waited ``QueueConfig.preempt_after_s`` evicts whole lower-priority gangs
inside one domain (``take_actions`` hands the evictions to the caller). After a restart the queue's
reservations are rebuilt from the pods and the node annotations (``queue.rebuild``).

Bind waits at a barrier until every planned pod has arrived, then all are bound together; on
``barrier_timeout_s`` the pods bind only if at least the gang minimum arrived, otherwise nothing
binds and the plan is given up. A plan no pod has reached bind for in ``reservation_ttl_s``
expires. A plan given up (those two, a failed bind, a changed gang, a planned node kube-scheduler keeps
ruling out for ``EXCLUDE_CONFIRM_S``) and a start the queue loop left out keep their nodes held for the
gang until the next queue pass decides again (``_give_up``): a pod on its own filtered in between would
otherwise take the nodes the gang was about to get. A restart rebuilds everything from the API: bound
pods count as used; plans are made afresh.

Readiness and repair (issue 29): a gang's ``gpuagent.dev/mnnvl`` mode (``extender.policy``; by default
``required`` for NVLink subgroups on fabric-attached nodes) goes into its ``Gang`` and the planner
places it on ready trays (``planner.readiness``); such a gang's barrier also waits, at most to its
deadline, until every chosen tray's ``gpuagent.dev/imex`` is ready (``cluster.imex_ready``, read from
the watched Node labels, the one readiness rule of ``cluster.node_ready``). A running gang's unbound
pods are planned with each subgroup's replacements pinned to the domain the rest of it runs in
(``extender.repair``); after ``repair_wait_s`` of waiting, ``gpuagent.dev/repair: any`` lifts the pin.
A waiting replacement's Event is ``GangRepairWaiting``; one bound inside its domain gets ``GangRepaired``
(``BindDecision.bound_events``, recorded once its binding succeeded).

Pods on their own pass filter wherever the GPUs not reserved for a gang cover their request, and get
a fragmentation-aware priority (0..10, kube-scheduler's extender range; it scales by weight x 10):
half the score goes to not breaking a wholly free tier-1 domain, the rest to how full the domain and
the node end up, so wholly free domains stay whole for gangs.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import repeat
from typing import Any, NamedTuple, TypeVar

from scheduler_plugin.claims import KINDS as CLAIM_KINDS
from scheduler_plugin.claims import ClaimBook, with_gpus
from scheduler_plugin.cluster import (
    GPU,
    base_state,
    fabric_attached,
    imex_ready,
    node_state,
    pod_key,
    pod_requests,
    snapshot_from_objects,
)
from scheduler_plugin.extender.cache import KINDS, SOLO, PodInfo, gpus_of, object_key, pod_info, project
from scheduler_plugin.extender.policy import ANN_REPAIR, gang_policy, resolve_mnnvl
from scheduler_plugin.extender.repair import unbound_part
from scheduler_plugin.gangs import GangError, GangIncompleteError, GangSpec, gang_for_pod, gang_key_of
from scheduler_plugin.planner import SnapshotCache, plan
from scheduler_plugin.planner.objective import open_cost, price
from scheduler_plugin.queue import (
    RESERVED_FOR,
    TIME_LIMIT,
    Decision,
    PodFacts,
    Preemption,
    QueueConfig,
    QueueError,
    Running,
    Waiting,
    decide,
    order,
    rebuild,
    same_shape,
)
from scheduler_plugin.queue import Reservation as QueueReservation
from scheduler_plugin.queueing import (
    Limits,
    QueueMetrics,
    VictimSet,
    budgets_from,
    held_back_caps,
    never_victim,
    over_budget,
    owner_uid,
    pod_limits,
    pod_priority,
    preempt_answer,
    render_metrics,
    reserved_for_value,
    timestamp,
    victim_group,
)
from scheduler_plugin.snapshot import (
    MAX_GANG_PODS,
    ClusterSnapshot,
    Gang,
    Infeasible,
    NodeState,
    Plan,
    PlanResult,
    PodSlot,
)

MAX_PRIORITY = 10  # kube-scheduler's MaxExtenderPriority
QUEUE_RETRY_S = 0.5  # a waiting gang's pods run the queue again at most this often (unless it is new)
EVICTION_RETRY_S = 10.0  # an eviction asked for is not asked again before this
EVICTION_MEMORY = 10_000  # gangs whose evictions are remembered (max_evictions)
FIT_MEMORY = 16  # requested GPU counts whose fitting nodes filter keeps per usage state
ADMITTED_MEMORY = 1_000  # (nodeSelector, tolerations) sets whose admitted nodes are kept
BLOCKED_RETRY_S = 60.0  # victims whose evictions the API would refuse are no victims for this long
# a planned node missing from kube-scheduler's candidates this long is ruled out (before: its cache may lag)
EXCLUDE_CONFIRM_S = 5.0
# work still running past its declared limit is expected to end soon (its controller ends it, as Slurm's
# OverTimeLimit or a Job's activeDeadlineSeconds do): within as long as it has run over, at least 1 s and
# at most this. Counting it as never ending instead would move a reservation away from the nodes about to
# free the moment their jobs run a little late, and let others take them
OVERDUE_GRACE_S = 30.0
SCHEDULER_NAME = "gpu-topology-scheduler"  # ARCHITECTURE.md: the second kube-scheduler that calls us
# which declared time limits the extender enforces (evicts past the limit plus a grace): those of work on
# nodes held for a waiting gang (``held``: what backfilled there, and what the hold waits for), all, none
ENFORCE_MODES = ("held", "all", "off")
# a gang that needs multi-node NVLink (``Gang.mnnvl`` required or preferred) whose pods all reached bind
# while a chosen tray's IMEX is not ``ready`` looks at the trays' labels again this often, until its
# barrier's deadline
IMEX_RECHECK_S = 0.5
# how long a running gang's replacement pod waits for a ready tray in the domain the rest of its subgroup
# runs in before ``gpuagent.dev/repair: any`` lets it go to another domain (the extender's
# ``--repair-wait``): ``bench placement --tray-failures`` measured the GPU-hours a bounded wait saves
DEFAULT_REPAIR_WAIT_S = 1800.0


# on a pod of a gang that started after filter refused it: "<n> pod(s) on <m> node(s) at <UTC time>"
GANG_PLANNED = "gpuagent.dev/gang-planned"
# on each pod of a role of subgroup-size auto, written with its binding: the size the planner chose, so
# the launcher can read its data-parallel layout (the API server copies a Binding's annotations to the pod)
SUBGROUP_SIZE_CHOSEN = "gpuagent.dev/subgroup-size-chosen"


@dataclass(frozen=True)
class EventRecord:
    """A Kubernetes Event to record on a pod."""

    pod: Mapping[str, Any]
    reason: str
    message: str
    warning: bool = True


@dataclass
class FilterOutcome:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    error: str = ""
    events: list[EventRecord] = field(default_factory=list)
    unseen: bool = False  # the informer does not have this pod (or its uid) yet: worth asking again


@dataclass
class Reservation:
    spec: GangSpec
    nodes: dict[PodSlot, str]  # the plan: each pod's place in the gang -> node
    held: dict[str, dict[str, int]]  # node -> resources held for pods not bound yet
    expires_at: float
    arrived: dict[str, str] = field(default_factory=dict)  # pod key -> node, at the bind barrier
    barrier_deadline: float | None = None
    bound: set[str] = field(default_factory=set)  # pod keys already bound
    announced: bool = False  # its GangPlanned Event is recorded (once, on the first pod filtered)
    subgroup_sizes: dict[str, int] = field(default_factory=dict)  # role -> size chosen (subgroup-size auto)
    mnnvl: str = "off"  # the gang's ``Gang.mnnvl``: required/preferred wait at bind for the trays' IMEX
    # role -> the size a subgroup-size auto role's replacements keep (``repair.Unbound.sizes``): written
    # on their Bindings like ``subgroup_sizes``, without a SubgroupSizeChosen Event (nothing was chosen)
    kept_sizes: dict[str, int] = field(default_factory=dict)
    # pod key -> GPUs its claims are allocated on its planned node before it bound: taken off ``held``
    # (the allocation counts them as used already; ``ClusterState._claims_allocated``)
    allocated: dict[str, int] = field(default_factory=dict)
    # planned node -> when a filter call first came without it (``EXCLUDE_CONFIRM_S``)
    missed: dict[str, float] = field(default_factory=dict)

    @property
    def target(self) -> int:
        """Pods that must arrive before the gang binds: every planned pod."""
        return len(self.nodes)


def _repaired(
    res: Reservation, pods: Sequence[tuple[str, str, str]], known: Mapping[str, Mapping[str, Any]]
) -> tuple[EventRecord, ...]:
    """A ``GangRepaired`` Event for each pod of ``pods`` that is a repair's replacement pinned to the
    NVLink domain the rest of its subgroup runs in (``Role.domain``, set by ``extender.repair``; a
    replacement let go to another domain has none)."""
    roles = {r.name: r for r in res.spec.gang.roles}
    out = []
    for key, _, node in pods:
        role = roles.get(res.spec.members[key].role)
        if role is None or role.domain is None or key not in known:
            continue
        out.append(
            EventRecord(
                pod=known[key],
                reason="GangRepaired",
                message=f"gang {res.spec.key}: replacement pod {key} bound on {node}, a ready tray of NVLink "
                f"domain {role.domain} where the rest of its subgroup runs; no other pod of the gang moved",
                warning=False,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class Eviction:
    """A pod to evict for a preemption, or (``reason`` ``TimeLimitExceeded``) for running past its
    declared time limit: it belongs to ``victim`` (a whole gang or workload, or ``pod:<key>``);
    ``preemptor``: the gang it is evicted for. ``check_first``: the first asking of that preemption: every
    eviction of it is tried as a dry run first and none is made if any is refused."""

    pod: Mapping[str, Any]
    victim: str
    message: str
    preemptor: str = ""
    check_first: bool = False
    reason: str = "Preempted"  # the Event's reason once evicted


@dataclass(frozen=True)
class QueueActions:
    """What a pass of the queue leaves to the caller (``ClusterState.take_actions``)."""

    events: tuple[EventRecord, ...] = ()
    annotate: Mapping[str, str | None] = field(default_factory=dict)
    evictions: tuple[Eviction, ...] = ()
    # pods to annotate ``gpuagent.dev/gang-planned`` (pod -> value): pods of a gang that started after
    # filter refused them. kube-scheduler keeps a pod an extender refused among its unschedulable pods
    # until a cluster event moves it (or its 5-minute flush); an update of the pod itself is such an event
    nudges: tuple[tuple[Mapping[str, Any], str], ...] = ()


@dataclass(frozen=True)
class BindDecision:
    """What to do with a bind call.

    ``action``: ``bind`` (bind ``pods`` now: a pod on its own, or a whole gang whose barrier
    completed), ``wait`` (hold the call until the gang completes or ``deadline``), ``error``.
    """

    action: str
    pods: tuple[tuple[str, str, str], ...] = ()  # (pod key, uid, node)
    gang: str = ""
    deadline: float = 0.0
    error: str = ""
    events: tuple[EventRecord, ...] = ()
    annotations: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # pod key -> on its Binding
    # recorded for each pod once its binding succeeded (``GangRepaired``), not before
    bound_events: tuple[EventRecord, ...] = ()


@dataclass(frozen=True)
class PassJob:
    """A pass's inputs, taken under the lock (``ClusterState.queue_begin``): immutable, so ``decide``
    runs on them outside it; the state commits the result against ``version``."""

    version: int
    now: float
    wall: float
    snapshot: ClusterSnapshot
    running: dict[str, Running]
    waiting: tuple[Waiting, ...]
    before: Mapping[str, QueueReservation]
    prepared: Mapping[
        str, tuple[GangSpec, Gang, dict[str, PodSlot], frozenset[str], dict[str, dict[str, str]]]
    ]
    pending: Mapping[str, list[str]]
    identity: Mapping[str, tuple[str, str | None]]
    place: Callable[[ClusterSnapshot, Gang], PlanResult]
    reasons: dict[str, str]  # filled by ``place`` as it plans
    config: QueueConfig

    def decide(self) -> Decision:
        """The queue's decision on these inputs (pure but for the planner's own cache)."""
        return decide(
            self.wall,
            self.snapshot,
            self.running,
            self.waiting,
            self.before,
            place=self.place,
            config=self.config,
        )


@dataclass(frozen=True)
class _DomainIndex:
    """The domain tiers, and per tier-1 (NVLink) domain: each node's, and each one's nodes."""

    tiers: tuple[str, ...]
    of: dict[str, str]  # node -> its tier-1 domain (nodes without one are absent)
    members: dict[str, list[str]]
    domains: dict[str, dict[str, str]]  # node -> its domain per tier


def _labels(obj: Mapping[str, Any]) -> Any:
    return (obj.get("metadata") or {}).get("labels")


def _allocatable(obj: Mapping[str, Any]) -> Any:
    return (obj.get("status") or {}).get("allocatable")


class _GivenUp(NamedTuple):
    """A started gang's plan given up before its pods bound: its nodes held for it (``hold``, from now
    on) until a pass that read the cluster after ``version`` decides again, or its ``members`` are gone."""

    version: int
    hold: QueueReservation
    members: frozenset[str]


class ClusterState:
    def __init__(
        self,
        *,
        reservation_ttl_s: float = 120.0,
        barrier_timeout_s: float = 20.0,
        scheduler_name: str = SCHEDULER_NAME,
        queue: QueueConfig | None = None,
        preempt_namespaces: Collection[str] | None = None,
        enforce_time_limits: str = "held",
        time_limit_grace_s: float = 60.0,
        repair_wait_s: float = DEFAULT_REPAIR_WAIT_S,
    ) -> None:
        if enforce_time_limits not in ENFORCE_MODES:
            raise QueueError(
                f"enforce_time_limits must be one of {', '.join(ENFORCE_MODES)}, got {enforce_time_limits!r}"
            )
        if not (0 <= time_limit_grace_s < math.inf):
            raise QueueError(f"time_limit_grace_s must be a finite number >= 0, got {time_limit_grace_s}")
        if not (0 <= repair_wait_s < math.inf):
            raise QueueError(f"repair_wait_s must be a finite number >= 0, got {repair_wait_s}")
        self.repair_wait_s = repair_wait_s
        # repairs (``extender.repair``): gang -> when its replacement pods were first seen waiting for a
        # tray in their subgroup's domain (the queue's clock), the gangs whose wait is over, and what
        # their pods' filter says about it
        self._repair_since: dict[str, float] = {}
        self._repair_over: set[str] = set()
        self._repair_notes: dict[str, str] = {}
        self._repair_sizes: dict[str, dict[str, int]] = {}  # gang -> ``Reservation.kept_sizes`` for it
        self._wall = -math.inf  # the queue's clock at its last pass
        # declared limits (``queueing.Limits``) count, plus the grace, only where they are enforced
        self.enforce_time_limits = enforce_time_limits
        self.time_limit_grace_s = time_limit_grace_s
        self.reservation_ttl_s = reservation_ttl_s
        self.barrier_timeout_s = barrier_timeout_s
        self.scheduler_name = scheduler_name
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.hypernodes: dict[str, dict[str, Any]] = {}
        self.podgroups: dict[str, dict[str, Any]] = {}
        # gang sources beside Volcano's PodGroups: KubeRay RayClusters, native scheduling.k8s.io ones
        self.rayclusters: dict[str, dict[str, Any]] = {}
        self.workloads: dict[str, dict[str, Any]] = {}
        self.workload_podgroups: dict[str, dict[str, Any]] = {}
        # DRA (``scheduler_plugin.claims``): the objects, and the book of GPUs pods get through them
        self.resourceclaims: dict[str, dict[str, Any]] = {}
        self.resourceclaimtemplates: dict[str, dict[str, Any]] = {}
        self.deviceclasses: dict[str, dict[str, Any]] = {}
        self.resourceslices: dict[str, dict[str, Any]] = {}
        self.claims = ClaimBook()
        self.reservations: dict[str, Reservation] = {}
        # the cache's indexes, kept by informer events (``_index_pod``, ``_node_changed``): each pod's
        # facts, what is used per node and which pods hold it, each gang's pods, the running work per
        # queue name (its pods holding resources) and how many pods carry each name at all
        self._info: dict[str, PodInfo] = {}
        self._node_used: dict[str, dict[str, int]] = {}
        self._node_pods: dict[str, set[str]] = {}
        self._gang_members: dict[tuple[str, str], set[str]] = {}
        self._running_members: dict[str, set[str]] = {}
        self._named: dict[str, int] = {}
        self._annotated: dict[str, Any] = {}  # node -> its gpuagent.dev/reserved-for value (not empty)
        # what is worked out from them once and kept until an event changes its inputs: each gang's spec
        # (or why it has none), each running work's ``Running``, the pods' time limits, the nodes each
        # (nodeSelector, tolerations) set admits, the snapshot's node states
        self._specs: dict[tuple[str, str], GangSpec | GangError | None] = {}
        self._run_all: dict[str, Running] = {}
        self._declared_all: dict[str, tuple[float, float]] = {}  # name -> (latest start, declared limit)
        self._keys_all: dict[str, list[str]] = {}  # name (with a declared limit) -> its pods
        self._running_dirty: set[str] = set()
        # each waiting gang's queue entry (or why it has none), valid while its spec is the same object
        # and ``_inputs_gen`` (admitted nodes, Jobs' limits, nodes kube-scheduler ruled out) unchanged
        self._waiting_cache: dict[str, tuple[object, int, object]] = {}
        self._inputs_gen = 0
        # the nodes whose usage changed (a pod bound or gone, a node changed), in order: filter's verdicts
        # per requested GPU count (with the log position and holds they are up to date with) and
        # prioritize's ranks follow them node by node (``_fits``, ``_ranks``)
        self._usage_log: list[str] = []
        self._fit: dict[int, tuple[dict[str, str], int, dict[str, int]]] = {}
        self._fit_answers: dict[int, tuple[Any, ...]] = {}  # ``_filter_alone``'s last answer per count
        self._state_log: list[str] = []
        self._state_names: list[str] | None = None  # ``_states``' names in order, while none comes or goes
        self._rank_cache: dict[int, tuple[dict[str, tuple[int, int]], int]] = {}
        self._rank_places: dict[int, tuple[object, dict[str, int]]] = {}  # ``_rank_order``, per entry
        self._ranks_index: _DomainIndex | None = None  # the domains the ranks were worked out on
        self._room: dict[tuple[str, int], tuple[int, int, int]] = {}
        self._limit_cache: dict[str, Limits | str] = {}
        self._allowed: dict[tuple[object, ...], frozenset[str]] = {}
        self._states: dict[str, NodeState] = {}
        self._snap_dirty: set[str] = set()
        self._snapshot: ClusterSnapshot | None = None
        self._last_holds: dict[str, dict[str, int]] = {}
        self._tiers_seen: tuple[str, ...] = ()
        # the cluster's version: every change a decision may read bumps it; the queue's last pass ran
        # at ``_passed_at`` and needs no other before a change or its wake (``queue_pass``)
        self._version = 0
        self._passed_at: int | None = None
        self._skipped: dict[str, str] = {}  # waiting gangs the last pass could not queue -> why
        # why each waiting gang waits: the planner's reason in the last pass, else (a gang the pass did not
        # plan) gang -> (the pass, its spec and the plan inputs' generation it was planned on, why)
        self._reasons: dict[str, str] = {}
        self._gang_reason: dict[str, tuple[int, GangSpec, int, str]] = {}
        self._domains_cache: _DomainIndex | None = None
        # the last snapshot planned on: the next one reuses its unchanged node objects, so the
        # planner prepares it from the last one (``self._snapshots``)
        self._last_snapshot: ClusterSnapshot | None = None
        self._snapshots = SnapshotCache()
        self._loop_snapshots = SnapshotCache()  # the queue loop's, planned on outside the lock
        self._last_event: dict[str, tuple[str, str]] = {}
        self._uids: dict[str, str] = {}  # pod key -> uid the scheduler gave at bind
        self._alloc: dict[str, int] = {}  # node -> allocatable GPUs, parsed once
        self._excluded: dict[str, set[str]] = {}  # gang -> nodes kube-scheduler ruled out for it
        # pod key -> (uid, valid until): pods on their own this extender passed in filter, for bind
        self._filtered: dict[str, tuple[str, float]] = {}
        self._next_prune = 0.0
        # the queue (module docstring): its config, what its last pass held and saw, and what the
        # caller still has to carry out (Events, node annotations, evictions; ``take_actions``)
        self.queue_config = queue if queue is not None else QueueConfig()
        self.jobs: dict[str, dict[str, Any]] = {}
        # preemption's victims: the namespaces it may take from (None: every one), the disruption
        # budgets it honours, and victims whose evictions the API would refuse -> until when they sit out
        self.preempt_namespaces = None if preempt_namespaces is None else frozenset(preempt_namespaces)
        self.pdbs: dict[str, dict[str, Any]] = {}
        self._blocked: dict[str, float] = {}
        self.queue_reservations: dict[str, QueueReservation] = {}
        # a started gang's plan given up before its pods bound (barrier timeout, failed bind, expiry):
        # its nodes stay held for it, from now on, until a pass that saw it decides again (``_give_up``);
        # each with the cluster's version once it was given up
        self._given_up: dict[str, _GivenUp] = {}
        self.queue_metrics = QueueMetrics()
        self.synced = True  # the composition root clears it until every informer has listed once
        # the least time between passes the cluster's changes alone start: the caller sets it from how
        # long a pass takes (a pass holds the state lock), so passes never crowd out the verbs
        self.queue_min_gap_s = 0.0
        self.queue_loop = False  # a queue loop passes on the cluster's changes (``queue_due``)
        self._queue_rebuilt = False
        self._queue_dirty = True
        self._queue_last = -math.inf
        self._queue_wake = math.inf
        self._queue_waiting: list[str] = []  # gang names in queue order, at the last pass
        self._queue_running: dict[str, Running] = {}
        self._first_seen: dict[str, float] = {}
        self._evicting: dict[str, float] = {}  # pod key -> when its eviction was asked for
        self._preempting: dict[str, tuple[str, ...]] = {}  # gang -> the victims it last evicts
        self._pending_events: list[EventRecord] = []
        self._pending_evictions: list[Eviction] = []
        self._gang_pending: set[str] = set()  # keys of the gangs' pods waiting for this scheduler
        # gang -> times this extender evicted it (QueueConfig.max_evictions) and when the evicted run
        # started; the gang outlives its pods, which their controller makes again, so it is keyed by its
        # name and the uid of what made it (None: no controller; ``_victims``); in memory only, the
        # newest EVICTION_MEMORY gangs
        self._evicted_times: dict[tuple[str, str | None], tuple[int, float]] = {}
        self._refused: dict[str, str] = {}  # pod key -> gang: filter refused it while its gang waited
        self._pending_nudges: dict[str, str] = {}  # pod key -> the gang-planned value to annotate
        self._overrun: set[str] = set()  # pods asked to go for running past their declared limit
        self._never_fit: set[str] = set()  # waiting gangs the queue passed over: they fit nowhere

    # -- informer side ---------------------------------------------------------------------------
    @staticmethod
    def _key(kind: str, obj: Mapping[str, Any]) -> str:
        return object_key(kind, obj)

    def _store(self, kind: str) -> dict[str, dict[str, Any]]:
        if kind not in KINDS:
            raise KeyError(f"kind {kind!r} is not watched by the extender (one of {', '.join(KINDS)})")
        store: dict[str, dict[str, Any]] = getattr(self, kind)
        return store

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        """A fresh listing of one kind replaces what was known (each object projected, ``cache``)."""
        fresh = {}
        for obj in items:
            fresh[self._key(kind, obj)] = project(kind, obj, self.claims)
        store = self._store(kind)
        for key in [k for k in store if k not in fresh]:
            self.apply(kind, "DELETED", store[key])
        for key, obj in fresh.items():
            if store.get(key) != obj:
                self._put(kind, key, obj)
        self._queue_dirty = True
        self._version += 1

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED / MODIFIED / DELETED). An object whose projection did not change (a
        kubelet heartbeat, a status condition) is no change: nothing is marked for the queue."""
        store = self._store(kind)
        key = self._key(kind, obj)
        if event_type != "DELETED":
            kept = project(kind, obj, self.claims)
            if store.get(key) == kept:
                return
            self._put(kind, key, kept)
            return
        if key not in store:
            return
        before = store.pop(key)
        self._changed(kind, key, before, None)
        if kind == "pods":  # nothing is kept for a pod that is gone; nor a reservation for a gang all gone
            self._forget(key)
            for gang in [g for g, r in self.reservations.items() if key in r.spec.members]:
                if not any(k in self.pods for k in self.reservations[gang].spec.members):
                    self.reservations.pop(gang)
                    self._excluded.pop(gang, None)
                    self._inputs_gen += 1
            for gang in [g for g, v in self._given_up.items() if key in v.members]:
                if not any(k in self.pods for k in self._given_up[gang].members):
                    del self._given_up[gang]

    def _put(self, kind: str, key: str, obj: dict[str, Any]) -> None:
        store = self._store(kind)
        before = store.get(key)
        store[key] = obj
        self._changed(kind, key, before, obj)

    def _changed(
        self, kind: str, key: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
    ) -> None:
        """Keep the indexes of ``kind`` in step with one object's change (``after`` None: deleted)."""
        self._version += 1
        if kind in ("pods", "nodes", "jobs", "pdbs"):
            self._queue_dirty = True
        if kind == "pods":
            self._index_pod(key, after)
            if after is None:
                self.claims.forget_pod(key)
                if any(key in r.allocated for r in self.reservations.values()):
                    self._claims_allocated({key})  # its slot is held again in full
        elif kind in CLAIM_KINDS:
            self._claims_changed(kind, key, after)
        elif kind == "nodes":
            self._node_changed(key, before, after)
        elif kind == "hypernodes":
            self._domains_cache = None
            self._specs.clear()  # tiers may change
        elif kind == "jobs":
            self._limit_cache.clear()
            self._inputs_gen += 1
        elif kind in ("podgroups", "rayclusters", "workload_podgroups"):
            source = {"podgroups": "podgroup", "rayclusters": "raycluster", "workload_podgroups": "workload"}
            self._specs.pop((source[kind], key), None)
        elif kind == "workloads":
            for found in [f for f in self._specs if f[0] == "workload"]:
                del self._specs[found]

    def _node_changed(
        self, key: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
    ) -> None:
        self._snap_dirty.add(key)
        self._usage_changed(key)
        if before is None or after is None or _labels(before) != _labels(after):
            self._domains_cache = None
            self._allowed.clear()
            self._inputs_gen += 1
        elif (before.get("spec") or {}).get("taints") != (after.get("spec") or {}).get("taints"):
            self._allowed.clear()
            self._inputs_gen += 1
        if before is None or after is None or _allocatable(before) != _allocatable(after):
            self._alloc.pop(key, None)
        have = ((after or {}).get("metadata") or {}).get("annotations") or {}
        value = have.get(RESERVED_FOR)
        if value:
            self._annotated[key] = value
        else:
            self._annotated.pop(key, None)

    def _claims_changed(self, kind: str, key: str, after: Mapping[str, Any] | None) -> None:
        """A DRA object changed: GPUs nodes have and use through claims, and the pods that ask through
        it, follow (``claims.ClaimBook``)."""
        change = self.claims.update(kind, key, after)
        for node, (_has, used) in change.nodes.items():
            self._alloc.pop(node, None)
            self._snap_dirty.add(node)
            self._usage_changed(node)
            if used:
                counts = self._node_used.setdefault(node, {})
                counts[GPU] = counts.get(GPU, 0) + used
        if change.nodes:
            self._queue_dirty = True
            if kind == "resourceclaims":
                self._claims_allocated(self.claims.readers(key))
        for pod_key_ in sorted(change.pods):
            pod = self.pods.get(pod_key_)
            if pod is not None:
                fresh = self.claims.with_claims(pod_key_, pod)
                if fresh != pod:
                    self._put("pods", pod_key_, fresh)

    def _index_pod(self, key: str, pod: Mapping[str, Any] | None) -> None:
        """The pod's facts (``cache.PodInfo``) and every index they are in: node usage, gang members,
        running work per name, the gangs' pods waiting for this scheduler."""
        old = self._info.pop(key, None)
        self._limit_cache.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        self._gang_pending.discard(key)
        if pod is None:
            return
        info = pod_info(key, pod)
        self._info[key] = info
        if info.gang is not None:
            self._gang_members.setdefault(info.gang, set()).add(key)
            self._specs.pop(info.gang, None)
            if self._waits(pod):
                self._gang_pending.add(key)
        self._named[info.running] = self._named.get(info.running, 0) + 1
        if info.node:
            self._running_members.setdefault(info.running, set()).add(key)
            self._running_dirty.add(info.running)
            self._node_pods.setdefault(info.node, set()).add(key)
            self._snap_dirty.add(info.node)
            self._usage_changed(info.node)
            used = self._node_used.setdefault(info.node, {})
            for r, v in info.uses.items():
                used[r] = used.get(r, 0) + v
            for res in self.reservations.values():  # a reserved pod that got bound no longer needs its hold
                if key in res.spec.members and key not in res.bound:
                    res.bound.add(key)
                    self._release_hold(res, key, info.node)
        elif self.reservations and (pod.get("spec") or {}).get("resourceClaims"):
            self._claims_allocated({key})  # its claims (status.resourceClaimStatuses) may be known now

    def _unindex(self, key: str, old: PodInfo) -> None:
        if old.gang is not None:
            _discard(self._gang_members, old.gang, key)
            self._specs.pop(old.gang, None)
        left = self._named.get(old.running, 0) - 1
        if left > 0:
            self._named[old.running] = left
        else:
            self._named.pop(old.running, None)
        if not old.node:
            return
        _discard(self._running_members, old.running, key)
        self._running_dirty.add(old.running)
        _discard(self._node_pods, old.node, key)
        self._snap_dirty.add(old.node)
        self._usage_changed(old.node)
        used = self._node_used.get(old.node, {})
        for r, v in old.uses.items():
            used[r] = used.get(r, 0) - v

    def _waits(self, pod: Mapping[str, Any]) -> bool:
        """Whether ``pod`` is a gang's pod waiting for this scheduler: not bound, not going, not done."""
        return (
            not (pod.get("spec") or {}).get("nodeName")
            and not (pod.get("metadata") or {}).get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and _scheduler_of(pod) == self.scheduler_name
            and gang_key_of(pod) is not None
        )

    def _forget(self, key: str) -> None:
        """Every per-pod map lets go of a pod that is gone."""
        self._evicting.pop(key, None)  # a pod made again under this name is evicted afresh
        self._overrun.discard(key)
        self._last_event.pop(key, None)
        self._refused.pop(key, None)
        self._pending_nudges.pop(key, None)
        self._uids.pop(key, None)
        self._filtered.pop(key, None)
        self._first_seen.pop(key, None)
        self._limit_cache.pop(key, None)

    def pod_maps(self) -> dict[str, int]:
        """How many pods each per-pod map holds (a test's and an operator's check that none grows)."""
        return {
            "info": len(self._info),
            "evicting": len(self._evicting),
            "overrun": len(self._overrun),
            "last_event": len(self._last_event),
            "refused": len(self._refused),
            "nudges": len(self._pending_nudges),
            "uids": len(self._uids),
            "filtered": len(self._filtered),
            "first_seen": len(self._first_seen),
            "limits": len(self._limit_cache),
        }

    # -- capacity --------------------------------------------------------------------------------
    def _allocatable_gpus(self, node: str) -> int:
        cached = self._alloc.get(node)
        if cached is None:
            alloc = ((self.nodes.get(node) or {}).get("status") or {}).get("allocatable") or {}
            try:
                cached = int(str(alloc.get(GPU, 0)))
            except ValueError:
                cached = 0
            cached += self.claims.capacity(node)
            if node in self.nodes:
                self._alloc[node] = cached
        return cached

    def held_gpus(self, *, except_gang: str | None = None) -> dict[str, int]:
        """GPUs held per node for gangs (other than ``except_gang``) that are planned, not bound."""
        out: dict[str, int] = {}
        for k, r in self.reservations.items():
            if k == except_gang:
                continue
            for node, res in r.held.items():
                out[node] = out.get(node, 0) + res.get(GPU, 0)
        return out

    def free_gpus(
        self,
        node: str,
        *,
        except_gang: str | None = None,
        holds: bool = True,
        held: Mapping[str, int] | None = None,
    ) -> int:
        """GPUs of ``node`` neither used by bound pods nor held for a gang (other than ``except_gang``):
        the one free-GPU formula (filter, prioritize and bind read it)."""
        used = self._node_used.get(node, {}).get(GPU, 0)
        if not holds:
            taken = 0
        elif held is not None:
            taken = held.get(node, 0)
        else:
            taken = self.held_gpus(except_gang=except_gang).get(node, 0)
        return self._allocatable_gpus(node) - used - taken

    def _domains(self) -> _DomainIndex:
        if self._domains_cache is None:
            snap = snapshot_from_objects(self.nodes.values(), (), self.hypernodes.values())
            first = snap.tiers[0] if snap.tiers else None
            of = {n.name: n.domains[first] for n in snap.nodes if first is not None and first in n.domains}
            members: dict[str, list[str]] = {}
            for n, d in of.items():
                members.setdefault(d, []).append(n)
            self._domains_cache = _DomainIndex(
                snap.tiers, of, members, {n.name: dict(n.domains) for n in snap.nodes}
            )
            self._snap_dirty.update(self.nodes)
            if self._tiers_seen != snap.tiers:
                self._tiers_seen = snap.tiers
                self._specs.clear()
        return self._domains_cache

    def domains_known(self) -> bool:
        """Whether the tier-1 domains are worked out (else the next prioritize reads every node)."""
        return self._domains_cache is not None

    def tiers(self) -> tuple[str, ...]:
        return self._domains().tiers

    def snapshot(self) -> ClusterSnapshot:
        """The cluster as the planner sees it, free of what bound pods use and gangs hold: kept from
        pass to pass, only the nodes that changed since (``_snap_dirty``: their pods, their objects,
        holds on them) are worked out again, and those equal to before keep their old object."""
        index = self._domains()
        holds = self._holds()
        for node in set(holds) | set(self._last_holds):
            if holds.get(node) != self._last_holds.get(node):
                self._snap_dirty.add(node)
        self._last_holds = holds
        if self._snapshot is not None and not self._snap_dirty:
            return self._snapshot
        states = self._states
        logged = len(self._state_log)
        for name in self._snap_dirty:
            obj = self.nodes.get(name)
            if obj is None:
                if states.pop(name, None) is not None:
                    self._state_log.append(name)
                    self._state_names = None
                continue
            base = with_gpus(base_state(obj, index.domains.get(name, {})), self.claims.capacity(name))
            state = node_state(base, self._node_used.get(name, {}), holds.get(name))
            old = states.get(name)
            if old is None or old != state:
                if old is None:
                    self._state_names = None
                states[name] = state
                self._state_log.append(name)
        changed = len(self._state_log) != logged
        if len(self._state_log) > max(64, len(states)):  # more changes than nodes: ranks start afresh
            self._state_log, self._rank_cache, self._room = [], {}, {}
        self._snap_dirty = set()
        if self._snapshot is not None and not changed and index.tiers == self._snapshot.tiers:
            return self._snapshot  # every node worked out again equals its state before
        if self._state_names is None:  # sorted again only when a node comes or goes
            self._state_names = sorted(states)
        nodes = tuple(map(states.__getitem__, self._state_names))
        if self._snapshot is None or nodes != self._snapshot.nodes or index.tiers != self._snapshot.tiers:
            self._snapshot = ClusterSnapshot(tiers=index.tiers, nodes=nodes)
        return self._snapshot

    # -- reservations ----------------------------------------------------------------------------
    def expire(self, now: float) -> list[str]:
        """Drop reservations past their time that no pod waits on; returns the gangs dropped."""
        expired = [
            k
            for k, r in self.reservations.items()
            if r.expires_at <= now and not r.arrived and len(r.bound) == 0
        ]
        done = [k for k, r in self.reservations.items() if r.bound and len(r.bound) >= r.target]
        for k in expired:
            self._give_up(k)
        for k in done:
            self.reservations.pop(k, None)
            self._version += 1
        gone = expired + done
        if now >= self._next_prune:  # decisions of pods that never reached bind (bind checks its own)
            self._next_prune = now + 10.0
            for k in [k for k, (_, until) in self._filtered.items() if until <= now]:
                del self._filtered[k]
        return gone

    def _give_up(self, gang: str) -> Reservation | None:
        """Drop ``gang``'s started plan before its pods bound. Its nodes stay held for it, starting now,
        until the next queue pass decides again (it starts the gang afresh or makes it the head): a pod on
        its own filtered in between would otherwise take the nodes the gang was about to get."""
        res = self.reservations.pop(gang, None)
        if res is None:
            return None
        self._version += 1
        self._queue_dirty = True
        self._keep_held(gang, res)
        return res

    def _keep_held(self, gang: str, res: Reservation) -> None:
        """Hold ``res``'s nodes for ``gang`` from now until the next pass decides (``_give_up``)."""
        claims = {n: h.get(GPU, 0) for n, h in res.held.items() if h.get(GPU, 0) > 0}
        if claims and any(k in self.pods for k in res.spec.members):
            hold = QueueReservation(gang, -math.inf, claims)
            self._given_up[gang] = _GivenUp(self._version, hold, frozenset(res.spec.members))

    def _release_hold(self, res: Reservation, key: str, node: str) -> None:
        planned = res.spec.members[key]
        held_node = res.nodes.get(planned)
        if held_node is None:
            return
        role = next((r for r in res.spec.gang.roles if planned.role == r.name), None)
        if role is None:
            return
        hold = res.held.get(held_node)
        allocated = res.allocated.pop(key, 0)  # already off the hold
        if hold is not None:
            hold[GPU] = max(0, hold.get(GPU, 0) - max(0, role.gpus_per_pod - allocated))
            for r, v in role.resources_per_pod.items():
                hold[r] = max(0, hold.get(r, 0) - v)

    def _claims_allocated(self, pods: Iterable[str], *, only: Reservation | None = None) -> None:
        """Gang pods not bound yet whose claims are allocated on their planned node (kube-scheduler's
        PreBind, before our bind barrier binds them): those GPUs count as used through the allocation,
        so they leave the gang's hold (at most the pod's share of it); an allocation withdrawn puts
        them back. ``only``: just that reservation's pods (one made now)."""
        for key in pods:
            for res in (only,) if only is not None else self.reservations.values():
                planned = res.spec.members.get(key)
                node = res.nodes.get(planned) if planned is not None else None
                if planned is None or node is None or key in res.bound:
                    continue
                role = next((r for r in res.spec.gang.roles if planned.role == r.name), None)
                share = role.gpus_per_pod if role is not None else 0
                now = min(self.claims.allocated_on(key, node), share)
                before = res.allocated.get(key, 0)
                hold = res.held.get(node)
                if now == before or hold is None:
                    continue
                hold[GPU] = max(0, hold.get(GPU, 0) - (now - before))
                if now:
                    res.allocated[key] = now
                else:
                    res.allocated.pop(key, None)
                self._snap_dirty.add(node)
                self._usage_changed(node)
                self._version += 1

    def _holds(self, *, except_gang: str | None = None) -> dict[str, dict[str, int]]:
        """Resources held per node for gangs planned but not bound (other than ``except_gang``)."""
        others: dict[str, dict[str, int]] = {}
        for k, r in self.reservations.items():
            if k == except_gang:
                continue
            for node, res in r.held.items():
                acc = others.setdefault(node, {})
                for name, v in res.items():
                    acc[name] = acc.get(name, 0) + v
        return others

    def _plan_gang(self, spec: GangSpec, now: float) -> Reservation | str:
        inputs = self._gang_inputs(spec)
        if isinstance(inputs, str):
            return inputs
        gang, members, allowed, by_role = inputs
        snapshot = self.snapshot()
        if len(allowed) < len(snapshot.nodes):
            snapshot = dataclasses.replace(
                snapshot, nodes=tuple(n for n in snapshot.nodes if n.name in allowed)
            )
        planned_gang = gang
        if len({tuple(sorted(sel.items())) for sel in by_role.values()}) > 1:
            snapshot, planned_gang = _per_role_selectors(snapshot, gang, by_role, self.nodes)
        result = plan(snapshot, planned_gang, cache=self._snapshots)
        if isinstance(result, Infeasible):
            return result.reason
        res = self._reservation_from(spec, gang, members, result.placement, now)
        res.subgroup_sizes = dict(result.subgroup_sizes)
        return res

    def _reservation_from(
        self,
        spec: GangSpec,
        gang: Gang,
        members: dict[str, PodSlot],
        placement: Mapping[PodSlot, str],
        now: float,
    ) -> Reservation:
        roles = {r.name: r for r in gang.roles}
        held: dict[str, dict[str, int]] = {}
        for planned, node in placement.items():
            role = roles[planned.role]
            acc = held.setdefault(node, {})
            acc[GPU] = acc.get(GPU, 0) + role.gpus_per_pod
            for rname, v in role.resources_per_pod.items():
                acc[rname] = acc.get(rname, 0) + v
        respec = GangSpec(
            key=spec.key, gang=gang, members=members, min_member=spec.min_member, source=spec.source
        )
        return Reservation(
            spec=respec,
            nodes=dict(placement),
            held=held,
            expires_at=now + self.reservation_ttl_s,
            mnnvl=gang.mnnvl,
        )

    def _gang_inputs(
        self, spec: GangSpec
    ) -> tuple[Gang, dict[str, PodSlot], frozenset[str], dict[str, dict[str, str]]] | str:
        """What a plan of ``spec`` needs: the gang left to place (its unbound part), its pods' places,
        the nodes its pods may go to (nodeSelector, tolerations, not ruled out by kube-scheduler) and
        each role's nodeSelector; or why it cannot be planned."""
        try:
            policy = gang_policy(spec.key, [self.pods[k] for k in sorted(spec.members) if k in self.pods])
        except GangError as exc:
            return str(exc)
        index = self._domains()
        over = spec.key in self._repair_over and policy.repair == "any"
        unbound = unbound_part(spec, self.pods, index.domains, index.tiers, unpin=over)
        gang, members = unbound.gang, unbound.members
        if gang is None:
            return "every pod of the gang is already bound"
        self._note_repair(spec.key, unbound.pinned, policy.repair, over)
        if unbound.sizes:
            self._repair_sizes[spec.key] = dict(unbound.sizes)
        else:
            self._repair_sizes.pop(spec.key, None)
        by_role: dict[str, dict[str, str]] = {}  # each role's nodeSelector (its pods' together)
        for k, slot in sorted(spec.members.items()):
            selector = by_role.setdefault(slot.role, {})
            for label, value in (
                ((self.pods.get(k) or {}).get("spec") or {}).get("nodeSelector") or {}
            ).items():
                if selector.setdefault(label, value) != value:
                    return (
                        f"the pods of role {slot.role} disagree on nodeSelector {label} "
                        f"({selector[label]!r}, {value!r})"
                    )
        selectors = {tuple(sorted(sel.items())) for sel in by_role.values()}
        mates = [self.pods[k] for k in sorted(spec.members) if k in self.pods]
        allowed = self._admitted(selectors, mates)
        excluded = self._excluded.get(spec.key)
        if excluded:
            allowed = allowed - excluded
        if not allowed:
            shown = " or ".join(str(dict(sel)) for sel in sorted(selectors)) or "{}"
            return f"no node matches the gang's nodeSelector {shown} and tolerations"
        mode = resolve_mnnvl(
            policy,
            spec.gang,
            index.tiers,
            fabric_attached=lambda: any(
                fabric_attached(_labels(self.nodes[n]) or {}) for n in allowed if n in self.nodes
            ),
        )
        if mode != gang.mnnvl:
            gang = dataclasses.replace(gang, mnnvl=mode)
        return gang, members, allowed, by_role

    def _note_repair(
        self, gang: str, pinned: Mapping[str, tuple[str, int, str]], repair: str, over: bool
    ) -> None:
        """Keep when ``gang``'s replacement pods began to wait for their subgroups' domains, and what
        their filter says about it (``_repair_notes``)."""
        if not pinned and not over:
            self._repair_since.pop(gang, None)
            self._repair_notes.pop(gang, None)
            return
        if gang not in self._repair_since and math.isfinite(self._wall):  # the queue's clock, once it passed
            self._repair_since[gang] = self._wall
        wait = f"{self.repair_wait_s:g}s"
        if over:
            self._repair_notes[gang] = (
                f"; repair: no ready tray freed in the replacement's own NVLink domain within {wait}, and "
                f"{ANN_REPAIR}=any lets it go to another domain"
            )
            return
        where = ", ".join(f"role {r} subgroup {b} in {d}" for r, b, d in sorted(pinned.values()))
        then = (
            f"after {wait} of waiting ({ANN_REPAIR}=any) it may go to another domain"
            if repair == "any"
            else f"{ANN_REPAIR}=same-domain: it keeps waiting there"
            + (" (its wait is over)" if gang in self._repair_over else "")
        )
        self._repair_notes[gang] = (
            f"; repair: the replacement waits for a free ready tray of its subgroup's NVLink domain "
            f"({where}), where the rest of the gang keeps running; no other pod of the gang moves; {then}"
        )

    def _admitted(
        self, selectors: Collection[tuple[tuple[str, str], ...]], pods: Sequence[Mapping[str, Any]]
    ) -> frozenset[str]:
        """The nodes matching one of ``selectors`` whose taints every pod of ``pods`` tolerates; kept per
        (selectors, tolerations) until a node comes, goes or changes its labels or taints."""
        tolerating: dict[str, Mapping[str, Any]] = {}  # one pod per distinct tolerations
        for p in pods:
            tolerating.setdefault(
                json.dumps((p.get("spec") or {}).get("tolerations"), sort_keys=True, default=str), p
            )
        key = (tuple(sorted(selectors)), tuple(sorted(tolerating)))
        found = self._allowed.get(key)
        if found is None:
            wanted = [dict(sel) for sel in sorted(selectors)] or [{}]
            found = frozenset(
                name
                for name, n in self.nodes.items()
                if any(_matches(n, sel) for sel in wanted)
                and all(_tolerates(p, n) for p in tolerating.values())
            )
            if len(self._allowed) >= ADMITTED_MEMORY:  # tenants choose the keys: the oldest goes
                del self._allowed[next(iter(self._allowed))]
            self._allowed[key] = found
        return found

    def _event_once(
        self, pod: Mapping[str, Any], reason: str, message: str, *, warning: bool = True
    ) -> list[EventRecord]:
        key = pod_key(pod)
        if self._last_event.get(key) == (reason, message):
            return []
        self._last_event[key] = (reason, message)
        return [EventRecord(pod=pod, reason=reason, message=message, warning=warning)]

    # -- the queue -------------------------------------------------------------------------------
    def _pod_time(self, pod: Mapping[str, Any], path: str, wall: float) -> float:
        meta = pod.get("metadata") or {}
        t = timestamp(
            (pod.get("status") or {}).get("startTime") if path == "start" else meta.get("creationTimestamp")
        )
        if t is not None:
            return t
        return self._first_seen.setdefault(pod_key(pod), wall)  # no time in the API object: first seen

    def _limits(self, pod: Mapping[str, Any]) -> Limits:
        """The pod's time limits; the declared one only while the extender enforces declared limits
        (``enforce_time_limits``), whichever scheduler placed the pod: a pod declaring
        ``gpuagent.dev/time-limit`` agrees to be evicted past it where a waiting gang needs its node."""
        key = pod_key(pod)
        found = self._limit_cache.get(key)  # read once per change of the pod or of the Jobs
        if found is None:
            try:
                found = pod_limits(pod, self.jobs)
            except QueueError as exc:
                found = str(exc)
            self._limit_cache[key] = found
        if isinstance(found, str):  # said once on the pod; it counts as never ending
            self._pending_events += self._event_once(pod, "InvalidTimeLimit", f"{found}; counted as no limit")
            return Limits()
        if self.enforce_time_limits == "off":
            return Limits(found.enforced, None)
        return found

    def _limit(self, pod: Mapping[str, Any]) -> float | None:
        """The time limit the queue counts: the pod runs at most this long. A declared limit counts with
        the grace the extender gives before it evicts, since that is when the pod is gone at the latest
        (on a node held for a gang; ``queue_pass`` enforces it there, or everywhere)."""
        found = self._limits(pod)
        declared = found.declared + self.time_limit_grace_s if found.declared is not None else None
        if found.enforced is None:
            return declared
        return found.enforced if declared is None else min(found.enforced, declared)

    def _queue_place(
        self,
        prepared: Mapping[
            str, tuple[GangSpec, Gang, dict[str, PodSlot], frozenset[str], dict[str, dict[str, str]]]
        ],
        cache: SnapshotCache,
        reasons: dict[str, str],
    ) -> Callable[[ClusterSnapshot, Gang], PlanResult]:
        """The planner as the queue calls it: each gang on the nodes its pods may use (others count as
        full), roles with different nodeSelectors each on their own nodes (their labels read now, so
        the planner may run outside the lock); why each gang did not fit goes to ``reasons``."""
        zeros: dict[str, NodeState] = {}
        selective = any(
            len({tuple(sorted(sel.items())) for sel in p[4].values()}) > 1 for p in prepared.values()
        )
        labelled = dict(self.nodes) if selective else {}

        def place(snapshot: ClusterSnapshot, gang: Gang) -> PlanResult:
            _, _, _, allowed, by_role = prepared[gang.name]
            if len(allowed) < len(snapshot.nodes):
                nodes = []
                for n in snapshot.nodes:
                    if n.name in allowed or n.free == 0:
                        nodes.append(n)
                        continue
                    z = zeros.get(n.name)
                    if z is None or z.gpus != n.gpus or z.domains != n.domains:
                        z = zeros[n.name] = dataclasses.replace(n, free=0)
                    nodes.append(z)
                snapshot = dataclasses.replace(snapshot, nodes=tuple(nodes))
            name = gang.name
            if len({tuple(sorted(sel.items())) for sel in by_role.values()}) > 1:
                snapshot, gang = _per_role_selectors(snapshot, gang, by_role, labelled)
            result = plan(snapshot, gang, cache=cache)
            if isinstance(result, Infeasible):  # why it waits, for its pods' filters (``_why_waits``)
                reasons.setdefault(name, result.reason)  # the first: on the cluster as it is now
            return result

        return place

    def queue_due(self, gang: str, now: float) -> bool:
        """Whether a filter of ``gang``'s pod should run the queue again: a gang the last pass did not
        see (nor left out, with the reason, ``_skipped``), or the cluster changed and the last pass is
        ``QUEUE_RETRY_S`` old. While a queue loop runs (``queue_loop``, set by the extender's
        ``run_queue``), changes are its to pass on: a filter of a gang already in the queue answers from
        the last pass and never waits for a pass (its pods are nudged when the loop starts the gang)."""
        if gang not in self._queue_waiting and gang not in self._skipped:
            return True
        return (
            not self.queue_loop
            and self._queue_dirty
            and now - self._queue_last >= max(QUEUE_RETRY_S, self.queue_min_gap_s)
        )

    def queue_pass(self, now: float, wall: float) -> None:
        """One pass of the queue (module docstring) at ``wall`` (seconds since the epoch; ``now`` is the
        clock of reservations and barriers), all of it under the caller's lock. Gangs it starts get
        their plan as a reservation at once; what a user should see (Events), and evictions, wait in
        ``take_actions``. A pass that would see what the last one saw (the cluster's version unchanged)
        before any of its waits ends returns at once: it would decide the same."""
        job = self._pass_inputs(now, wall, self._snapshots)
        if job is not None:
            self._pass_commit(job, job.decide())

    def queue_begin(self, now: float, wall: float) -> PassJob | None:
        """The queue loop's pass, first part, under the lock: the pass's inputs when one is due
        (``queue_tick``'s rule), else None. ``PassJob.decide`` then runs outside the lock, on the
        immutable inputs alone, and ``queue_commit`` takes its result under the lock again."""
        if not self._pass_due(now, wall):
            return None
        return self._pass_inputs(now, wall, self._loop_snapshots)

    def queue_commit(self, job: PassJob, decision: Decision) -> QueueActions:
        """The queue loop's pass, last part, under the lock: ``decision`` made on ``job``'s inputs
        becomes the queue's. Where the cluster changed meanwhile (its version), a start whose gang or
        nodes changed is left out and the next tick passes again."""
        self._pass_commit(job, decision)
        return self.take_actions()

    def _pass_inputs(self, now: float, wall: float, cache: SnapshotCache) -> PassJob | None:
        if not self.synced:  # a partial listing would misjudge the queue and the nodes' annotations
            return None
        if self._passed_at == self._version and self._queue_rebuilt and wall < self._queue_wake:
            self._queue_dirty = False
            return None
        self._queue_dirty = False
        self._queue_last = now
        self._wall = wall
        self._repair_waits_over(wall)
        self.queue_metrics.passes += 1
        snapshot = self.snapshot()
        self._last_snapshot = snapshot
        pending: dict[str, list[str]] = {}
        for key in self._gang_pending:
            found = self._info[key].gang
            if found is not None and found[1] not in self.reservations:
                pending.setdefault(found[1], []).append(key)
        for keys in pending.values():
            keys.sort()
        prepared, waiting = self._waiting(pending, wall)
        running_now, _, _ = self._running_work(wall, {w.name for w in waiting})
        reasons: dict[str, str] = {}
        place = self._queue_place(prepared, cache, reasons)
        if not self._queue_rebuilt:  # after a restart: what the nodes say is held
            reserved_for = {n: v.split(",")[0] for n, v in self._annotated.items() if isinstance(v, str)}
            rebuilt = rebuild(wall, snapshot, self._all_facts(wall), waiting, reserved_for, place=place)
            self._queue_rebuilt = True
            self.queue_reservations = dict(rebuilt.reservations)
        top = max((w.priority for w in waiting), default=None)  # only work below it may be a victim
        candidates = {n for n, r in running_now.items() if top is not None and r.priority < top}
        _, identity, exempt = self._victims(wall, candidates)
        return PassJob(
            version=self._version,
            now=now,
            wall=wall,
            snapshot=snapshot,
            running=self._judged(running_now, wall, identity, exempt),
            waiting=tuple(waiting),
            before=dict(self.queue_reservations),
            prepared=prepared,
            pending=pending,
            identity=identity,
            place=place,
            reasons=reasons,
            config=self.queue_config,
        )

    def _pass_commit(self, job: PassJob, decision: Decision) -> None:
        now, wall, waiting = job.now, job.wall, job.waiting
        moved = job.version != self._version  # the cluster changed while the pass decided
        pending = {g: [k for k in keys if k in self.pods] for g, keys in job.pending.items()}
        starts = [st for st in decision.starts if not moved or self._still_startable(job, st.gang, st.plan)]
        self.queue_reservations = dict(decision.reservations)
        # a pass decided for the gangs whose plans were given up before it read the cluster
        self._given_up = {g: v for g, v in self._given_up.items() if v.version > job.version}
        for st in decision.starts:  # a start left out holds neither a plan nor a reservation: keep its nodes
            if st not in starts and st.gang in job.prepared:
                spec, gang, members, _, _ = job.prepared[st.gang]
                self._keep_held(st.gang, self._reservation_from(spec, gang, members, st.plan.placement, now))
        self._queue_running = job.running
        self._reasons = dict(job.reasons)
        _, declared, keys_of = self._running_work(wall, {w.name for w in waiting})
        self._repair_since = {g: t for g, t in self._repair_since.items() if g in pending}
        self._repair_over &= set(self._repair_since)
        self._repair_notes = {g: v for g, v in self._repair_notes.items() if g in pending}
        self._repair_sizes = {g: v for g, v in self._repair_sizes.items() if g in pending}
        self._queue_wake = min(
            decision.wake_s,
            self._repair_wake(),
            min(self._blocked.values(), default=math.inf),
            self._enforce_limits(declared, keys_of, now, wall),
            min((r.start_s for r in self.queue_reservations.values()), default=math.inf),
        )
        started = {st.gang for st in starts}
        self._queue_waiting = [w.name for w in order(waiting) if w.name not in started]
        shapes = {same_shape(w.gang): self._reasons[w.name] for w in waiting if w.name in self._reasons}
        free_in: dict[frozenset[str], int] = {}  # free GPUs per admitted node set (a few distinct sets)
        for w in waiting:  # a shape that failed is not planned again in a pass: its reason holds
            if w.name not in self._reasons and same_shape(w.gang) in shapes:
                self._reasons[w.name] = shapes[same_shape(w.gang)]
            elif w.name not in self._reasons and w.name not in started:  # not planned: too little room
                allowed = job.prepared[w.name][3]
                if allowed not in free_in:
                    free_in[allowed] = sum(
                        n.free for n in job.snapshot.nodes if n.schedulable and n.name in allowed
                    )
                self._reasons[w.name] = (
                    f"{w.gpus} GPU(s) needed; the nodes its pods may use have {free_in[allowed]} free now"
                )
        self._say_never_fits(decision.never_fits, pending)
        for start in starts:
            spec, gang, members, _, _ = job.prepared[start.gang]
            res = self._reservation_from(spec, gang, members, start.plan.placement, now)
            res.subgroup_sizes = dict(start.plan.subgroup_sizes)
            res.kept_sizes = dict(self._repair_sizes.get(start.gang, {}))
            self.reservations[start.gang] = res
            self._claims_allocated(res.spec.members, only=res)  # claims still allocated from before
            self._excluded.pop(start.gang, None)
            self._inputs_gen += 1
            planned = f"{len(res.nodes)} pod(s) on {len(res.held)} node(s) at {_utc(wall)}"
            for k in pending.get(start.gang, ()):
                if self._refused.pop(k, None) == start.gang:  # waits among kube-scheduler's unschedulable
                    self._pending_nudges[k] = planned
        self._say_reserved(job.before, pending)
        self._preempt(
            decision.preemptions,
            waiting=waiting,
            running=job.running,
            by_gang=self._running_members,
            identity=job.identity,
            pending=pending,
            now=now,
            wall=wall,
        )
        if len(starts) < len(decision.starts):  # left out: decided again on what the cluster is now
            self._queue_dirty = True
        self._version += 1  # what this pass started and held: filters read it
        # a preemption a budget refused asks for another pass at once (``_over_budget``)
        self._passed_at = None if self._queue_dirty else self._version
        self._gang_reason = {g: v for g, v in self._gang_reason.items() if g in pending}

    def _repair_waits_over(self, wall: float) -> None:
        """Repairs whose wait ended by ``wall``: their gangs are planned again (unpinned where their
        ``gpuagent.dev/repair`` allows)."""
        for gang, since in self._repair_since.items():
            if gang not in self._repair_over and wall - since >= self.repair_wait_s:
                self._repair_over.add(gang)
                self._inputs_gen += 1

    def _repair_wake(self) -> float:
        """When the next repair wait ends (the queue passes then)."""
        return min(
            (t + self.repair_wait_s for g, t in self._repair_since.items() if g not in self._repair_over),
            default=math.inf,
        )

    def _still_startable(self, job: PassJob, gang: str, plan_: Plan) -> bool:
        """Whether a start decided on ``job``'s inputs still holds now: its gang still waits with the
        same spec, nothing else holds it, and every node of its plan still has the GPUs."""
        spec = job.prepared[gang][0]
        found = self._info.get(next(iter(sorted(spec.members)), ""), None)
        if found is None or found.gang is None or self._specs.get(found.gang) is not spec:
            return False
        if gang in self.reservations:
            return False
        roles = {r.name: r.gpus_per_pod for r in job.prepared[gang][1].roles}
        need: dict[str, int] = {}
        for slot, node in plan_.placement.items():
            need[node] = need.get(node, 0) + roles.get(slot.role, 0)
        held = self.held_gpus()
        return all(self.free_gpus(n, held=held) >= g for n, g in need.items())

    def _running_work(
        self, wall: float, waiting: Collection[str]
    ) -> tuple[dict[str, Running], Mapping[str, tuple[float, float]], Mapping[str, list[str]]]:
        """The running work by queue name, kept from pass to pass and worked out again only for the
        names an event touched (``_running_dirty``); the ones with a declared limit (name -> (latest
        start, least declared limit)) and their pods. A gang still ``waiting`` (part of it bound, after a
        restart mid-gang) is not running work."""
        for name in sorted(self._running_dirty):
            members = self._running_members.get(name)
            found = self._one_running(name, members, wall) if members else None
            if found is None:
                self._run_all.pop(name, None)
                self._declared_all.pop(name, None)
                self._keys_all.pop(name, None)
                continue
            self._run_all[name], limit, keys = found
            if limit is None:
                self._declared_all.pop(name, None)
                self._keys_all.pop(name, None)
            else:
                self._declared_all[name], self._keys_all[name] = limit, keys
        self._running_dirty = set()
        running = dict(self._run_all)
        for name in waiting:
            running.pop(name, None)
        return running, self._declared_all, self._keys_all

    def _one_running(
        self, name: str, members: Collection[str], wall: float
    ) -> tuple[Running, tuple[float, float] | None, list[str]] | None:
        """``Running`` of one name from its pods (as ``queue.rebuild`` counts it), its declared limit and
        the pods counted; pods on their own that hold no GPU are not (a node's DaemonSet pods: nothing to
        queue), None when no pod is left."""
        infos = [self._info[k] for k in sorted(members)]
        infos = [i for i in infos if i.gang is not None or gpus_of(i) > 0]
        if not infos:
            return None
        claims: dict[str, int] = {}
        uses: dict[str, dict[str, int]] = {}
        starts: list[float] = []
        limits: list[float] = []
        began, least = -math.inf, math.inf
        for info in infos:
            pod = self.pods[info.key]
            claims[info.node] = claims.get(info.node, 0) + gpus_of(info)
            rest = {k: v for k, v in info.requests.items() if k != GPU and v}
            if rest:
                acc = uses.setdefault(info.node, {})
                for k, v in rest.items():
                    acc[k] = acc.get(k, 0) + v
            start = self._pod_time(pod, "start", wall)
            starts.append(start)
            limit = self._limit(pod)
            if limit is not None:
                limits.append(limit)
            lim = self._limits(pod).declared
            if lim is not None:
                began, least = max(began, start), min(least, lim)
        ends = max(starts) + min(limits) if limits else math.inf
        run = Running(name, min(i.priority for i in infos), min(starts), ends, claims, uses=uses)
        return run, ((began, least) if least < math.inf else None), [i.key for i in infos]

    def _all_facts(self, wall: float) -> list[PodFacts]:
        """Every running pod as ``queue.rebuild`` reads it (once, after a restart)."""
        facts: list[PodFacts] = []
        for members in self._running_members.values():
            for key in sorted(members):
                info, pod = self._info[key], self.pods[key]
                if info.gang is None and gpus_of(info) <= 0:
                    continue
                facts.append(
                    PodFacts(
                        gang=info.running,
                        priority=info.priority,
                        created_s=self._pod_time(pod, "created", wall),
                        limit_s=self._limit(pod),
                        node=info.node,
                        gpus=gpus_of(info),
                        started_s=self._pod_time(pod, "start", wall),
                        resources={k: v for k, v in info.requests.items() if k != GPU and v},
                    )
                )
        return facts

    def _spec(self, found: tuple[str, str]) -> GangSpec | GangError | None:
        """The gang ``found`` (source, name) as its source and its pods describe it, or why not; kept
        until one of its pods, its source object or the tiers change."""
        if found not in self._specs:
            keys = sorted(self._gang_members.get(found, ()))
            if not keys:
                return None
            mates = [self.pods[k] for k in keys]
            try:
                self._specs[found] = gang_for_pod(
                    mates[0],
                    mates,
                    self.podgroups,
                    self.tiers(),
                    rayclusters=self.rayclusters,
                    workload_podgroups=self.workload_podgroups,
                    workloads=self.workloads,
                )
                gang_policy(found[1], mates)  # a bad gpuagent.dev/mnnvl or /repair refuses the gang
            except GangError as exc:
                self._specs[found] = exc
        return self._specs[found]

    def _waiting(
        self, pending: Mapping[str, list[str]], wall: float
    ) -> tuple[
        dict[str, tuple[GangSpec, Gang, dict[str, PodSlot], frozenset[str], dict[str, dict[str, str]]]],
        list[Waiting],
    ]:
        """The waiting gangs the queue orders, and what their plans need; a gang left out is remembered
        with the reason (``_skipped``), so its filters do not ask for passes it would not be in."""
        prepared: dict[
            str, tuple[GangSpec, Gang, dict[str, PodSlot], frozenset[str], dict[str, dict[str, str]]]
        ] = {}
        waiting: list[Waiting] = []
        self._skipped = {}
        self._waiting_cache = {n: v for n, v in self._waiting_cache.items() if n in pending}
        for name, keys in sorted(pending.items()):
            found = self._info[keys[0]].gang
            assert found is not None
            spec = self._spec(found)
            cached = self._waiting_cache.get(name)
            if cached is not None and cached[0] is spec and cached[1] == self._inputs_gen:
                entry = cached[2]
            else:
                entry = self._waiting_entry(name, spec, wall)
                self._waiting_cache[name] = (spec, self._inputs_gen, entry)
            if isinstance(entry, str):
                self._skipped[name] = entry
                continue
            assert isinstance(entry, tuple)
            prepared[name], one = entry
            waiting.append(one)
        return prepared, waiting

    def _waiting_entry(
        self, name: str, spec: GangSpec | GangError | None, wall: float
    ) -> (
        tuple[tuple[GangSpec, Gang, dict[str, PodSlot], frozenset[str], dict[str, dict[str, str]]], Waiting]
        | str
    ):
        """One waiting gang's plan inputs and queue entry, or why the queue leaves it out."""
        if not isinstance(spec, GangSpec):  # incomplete or invalid: its pods' filter says why
            return str(spec) if spec is not None else "no gang"
        inputs = self._gang_inputs(spec)
        if isinstance(inputs, str):
            return inputs
        gang, members, allowed, by_role = inputs
        mates = [self.pods[k] for k in sorted(spec.members) if k in self.pods]
        limits = [lim for lim in (self._limit(p) for p in mates) if lim is not None]
        one = Waiting(
            name=name,
            gang=dataclasses.replace(gang, name=name),
            # the lowest: one pod of a higher class does not lift a gang of low ones into
            # preempting; the newest pod: a pod parked long ago does not move a new gang ahead
            priority=min(pod_priority(p) for p in mates),
            created_s=max(self._pod_time(p, "created", wall) for p in mates),
            limit_s=min(limits) if limits else None,
        )
        return (spec, gang, members, allowed, by_role), one

    def _judged(
        self,
        running: Mapping[str, Running],
        wall: float,
        identity: Mapping[str, tuple[str, str | None]],
        exempt: Collection[str],
    ) -> dict[str, Running]:
        """The running work as this pass judges it: work past its limit ends soon (``OVERDUE_GRACE_S``),
        evictions counted before, victims it may not take. Unchanged objects are kept."""
        evicted = {name for name, _ in self._evicted_times}
        out: dict[str, Running] = {}
        for name, r in running.items():
            overdue = r.ends_s <= wall
            times = (
                self._evictions_before(identity.get(name, (name, None)), r.started_s)
                if name in evicted
                else 0
            )
            if not overdue and not times and name not in exempt:
                out[name] = r
                continue
            out[name] = dataclasses.replace(
                r,
                ends_s=wall + min(OVERDUE_GRACE_S, max(1.0, wall - r.ends_s)) if overdue else r.ends_s,
                evictions=times,
                preemptible=name not in exempt,
            )
        return out

    def _say_never_fits(self, never_fits: Mapping[str, str], pending: Mapping[str, list[str]]) -> None:
        self._never_fit = {
            g for g in self._never_fit if g in self._queue_waiting and g not in self.queue_reservations
        }
        for name, why in sorted(never_fits.items()):
            if name in self._never_fit:
                continue  # said once
            self._never_fit.add(name)
            msg = (
                f"gang {name} fits nowhere even with every node free ({why}); nothing is held for it and "
                "the gangs behind it in the queue go first"
            )
            for k in pending.get(name, ()):
                self._pending_events += self._event_once(self.pods[k], "GangNeverFits", msg)

    def _say_reserved(self, before: Mapping[str, QueueReservation], pending: Mapping[str, list[str]]) -> None:
        for name, r in sorted(self.queue_reservations.items()):
            old = before.get(name)
            if old is not None and dict(old.claims) == dict(r.claims):
                continue  # the same nodes (its start may be re-judged each pass): said already
            where = f" in {r.domain}" if r.domain else ""
            waits = f"; waits for {len(r.waits_for)} running job(s) to end" if r.waits_for else ""
            msg = (
                f"gang {name} is next in the queue: {sum(r.claims.values())} GPU(s) on {len(r.claims)} "
                f"node(s){where} reserved, expected start {_utc(r.start_s)}{waits}"
            )
            for k in pending.get(name, ()):
                self._pending_events += self._event_once(self.pods[k], "GangReserved", msg, warning=False)

    def _preempt(
        self,
        preemptions: Sequence[Preemption],
        *,
        waiting: Sequence[Waiting],
        running: Mapping[str, Running],
        by_gang: Mapping[str, Collection[str]],
        identity: Mapping[str, tuple[str, str | None]],
        pending: Mapping[str, list[str]],
        now: float,
        wall: float,
    ) -> None:
        """The pass's preemptions: Events on the preemptor's pods, evictions of every victim's pods."""
        self._preempting = {g: v for g, v in self._preempting.items() if g in pending}
        for pre in preemptions:
            # the victims are still going (fewer of them as their pods leave): the same preemption
            again = set(pre.victims) <= set(self._preempting.get(pre.gang, ()))
            if not again and self._over_budget(pre, by_gang, pending, wall):
                continue
            if not again:
                self._preempting[pre.gang] = pre.victims
                self.queue_metrics.preemptions += 1
                for victim in pre.victims:  # max_evictions counts these when the gang runs again
                    ident = identity.get(victim, (victim, None))
                    times, _ = self._evicted_times.pop(ident, (0, 0.0))
                    gone = running.get(victim)
                    self._evicted_times[ident] = (times + 1, gone.started_s if gone else math.nan)
                while len(self._evicted_times) > EVICTION_MEMORY:  # the gangs evicted longest ago go
                    del self._evicted_times[next(iter(self._evicted_times))]
            msg = (
                f"gang {pre.gang} (priority {next((w.priority for w in waiting if w.name == pre.gang), 0)}) "
                f"preempts whole gang(s) {', '.join(pre.victims)} in {pre.tier} domain {pre.domain} "
                f"({pre.lost_gpu_s / 3600:.2f} GPU-hours of work lost)"
            )
            for k in pending.get(pre.gang, ()) if not again else ():
                self._pending_events += self._event_once(self.pods[k], "GangPreempting", msg)
            for victim in pre.victims:
                for k in sorted(by_gang.get(victim, ())):
                    asked = self._evicting.get(k)
                    if asked is not None and now - asked < EVICTION_RETRY_S:
                        continue
                    if (self.pods[k].get("metadata") or {}).get("deletionTimestamp"):
                        continue
                    self._evicting[k] = now
                    self._pending_evictions.append(
                        Eviction(
                            pod=self.pods[k],
                            victim=victim,
                            message=msg,
                            preemptor=pre.gang,
                            check_first=not again,
                        )
                    )

    def _victims(
        self, wall: float, candidates: Collection[str]
    ) -> tuple[Mapping[str, Collection[str]], dict[str, tuple[str, str | None]], set[str]]:
        """Per running gang or workload (the queue's name, ``cache.running_name``): the keys of its pods
        that hold resources; the identity its evictions are counted under (``max_evictions``: its name and
        the uid of what made it, so a new job under an old name starts from none), for the names
        evictions were counted for and the ``candidates``; and, of ``candidates``, the ones that may not
        be victims (a pod ``queueing.never_victim`` names, a disruption budget it alone would break, or a
        refusal of the API not long ago). A count kept for a gang no controller owns is forgotten once all
        its pods are gone: nothing makes them again, a gang of that name later is another job."""
        by_gang = self._running_members
        identity: dict[str, tuple[str, str | None]] = {}
        for name in {n for n, _ in self._evicted_times} | set(candidates):
            keys = by_gang.get(name)
            if keys:
                owners = [u for u in (owner_uid(self.pods[k]) for k in sorted(keys)) if u is not None]
                identity[name] = (name, min(owners) if owners else None)
        for ident in [i for i in self._evicted_times if i[1] is None and i[0] not in self._named]:
            del self._evicted_times[ident]
        self._blocked = {v: until for v, until in self._blocked.items() if until > wall and v in by_gang}
        exempt: set[str] = set()
        if not candidates or self.queue_config.preempt_after_s is None:
            return by_gang, identity, exempt
        budgets = budgets_from(self.pdbs.values())
        for name in candidates:
            ordered = sorted(by_gang.get(name, ()))
            if (
                name in self._blocked
                or any(never_victim(self.pods[k], self.preempt_namespaces) for k in ordered)
                or (budgets and over_budget(self._leaving_not(ordered), budgets))
            ):
                exempt.add(name)
        return by_gang, identity, exempt

    def _leaving_not(self, keys: Iterable[str]) -> list[Mapping[str, Any]]:
        """The pods of ``keys`` an eviction still has to take (not already being deleted)."""
        return [
            self.pods[k]
            for k in keys
            if k in self.pods and not (self.pods[k].get("metadata") or {}).get("deletionTimestamp")
        ]

    def _over_budget(
        self,
        pre: Preemption,
        by_gang: Mapping[str, Collection[str]],
        pending: Mapping[str, list[str]],
        wall: float,
    ) -> bool:
        """Whether evicting all of ``pre``'s victims together would break a disruption budget (each alone
        keeps within its budgets, together they may not): then nothing is evicted, the preemptor's pods
        say which budget, its hold goes, and the victims sit out ``BLOCKED_RETRY_S``."""
        budgets = budgets_from(self.pdbs.values()) if self.pdbs else {}
        if not budgets:
            return False
        over = over_budget(
            self._leaving_not(k for v in pre.victims for k in sorted(by_gang.get(v, ()))), budgets
        )
        if not over:
            return False
        name, n, allowed = over[0]
        msg = (
            f"gang {pre.gang} does not preempt {', '.join(pre.victims)}: PodDisruptionBudget {name} allows "
            f"{allowed} disruption(s) and evicting them all takes {n}; nothing evicted, other victims are "
            f"sought (these sit out {BLOCKED_RETRY_S:.0f} s)"
        )
        for k in pending.get(pre.gang, ()):
            self._pending_events += self._event_once(self.pods[k], "PreemptionBlocked", msg)
        self.queue_reservations.pop(pre.gang, None)
        for v in pre.victims:
            self._blocked[v] = wall + BLOCKED_RETRY_S
        self._queue_dirty = True  # the next pass seeks other victims
        self._version += 1
        self._queue_wake = min(self._queue_wake, wall + BLOCKED_RETRY_S)
        return True

    def preemption_blocked(self, preemptor: str, victims: Sequence[str], wall: float, why: str = "") -> None:
        """The API refused a dry run of one of ``preemptor``'s evictions (``why``), so none was made: its
        victims sit out ``BLOCKED_RETRY_S``, the next pass seeks others (the preemption is not going on)
        and the preemptor's waiting pods say so."""
        msg = (
            f"gang {preemptor} does not preempt {', '.join(victims)}: {why}; nothing evicted, other victims "
            f"are sought (these sit out {BLOCKED_RETRY_S:.0f} s)"
        )
        for k in sorted(self._gang_pending):
            found = gang_key_of(self.pods[k]) if k in self.pods else None
            if found is not None and found[1] == preemptor:
                self._pending_events += self._event_once(self.pods[k], "PreemptionBlocked", msg)
        for v in victims:
            self._blocked[v] = wall + BLOCKED_RETRY_S
        if self._preempting.pop(preemptor, None) is not None:
            self.queue_reservations.pop(preemptor, None)
        self._queue_dirty = True
        self._version += 1
        self._queue_wake = min(self._queue_wake, wall + BLOCKED_RETRY_S)

    def _enforce_limits(
        self,
        declared: Mapping[str, tuple[float, float]],
        keys_of: Mapping[str, Sequence[str]],
        now: float,
        wall: float,
    ) -> float:
        """Evict whole the running work (``keys_of``: its pods) past its declared limit plus the grace,
        where the extender enforces it: on nodes held for a waiting gang (``held``), or everywhere
        (``all``). Returns when the next such eviction is due (``math.inf``: none)."""
        if self.enforce_time_limits == "off" or not declared:
            return math.inf
        held: dict[str, str] = {}
        for gang, r in sorted(self.queue_reservations.items(), reverse=True):
            held.update(dict.fromkeys(r.claims, gang))
        wake = math.inf
        names: Collection[str] = declared.keys()
        if self.enforce_time_limits == "held":  # only the work on held nodes: found by node, not all
            names = {self._info[k].running for n in held for k in self._node_pods.get(n, ())} & set(names)
        for name in sorted(names):
            started, limit = declared[name]
            keys = keys_of.get(name, [])
            nodes = sorted({str((self.pods[k].get("spec") or {}).get("nodeName")) for k in keys})
            on = next((n for n in nodes if n in held), None)
            if self.enforce_time_limits == "held" and on is None:
                continue  # not where a waiting gang needs it: its limit holds nobody back
            due = started + limit + self.time_limit_grace_s
            if wall < due:
                wake = min(wake, due)
                continue
            what = f"gang {name}" if not name.startswith(SOLO) else f"pod {name[len(SOLO) :]}"
            where = (
                f"on node {on}, held for gang {held[on]}"
                if on is not None
                else "and declared limits are enforced everywhere (--enforce-time-limits=all)"
            )
            msg = (
                f"{what} ran {wall - started:.0f}s, past its declared time limit of {limit:g}s plus a grace "
                f"of {self.time_limit_grace_s:g}s, {where}; evicted ({TIME_LIMIT} counts only where the "
                "extender enforces it)"
            )
            for k in keys:
                asked = self._evicting.get(k)
                if asked is not None and now - asked < EVICTION_RETRY_S:
                    continue
                if (self.pods[k].get("metadata") or {}).get("deletionTimestamp"):
                    continue
                self._evicting[k] = now
                self._overrun.add(k)
                self._pending_evictions.append(
                    Eviction(pod=self.pods[k], victim=name, message=msg, reason="TimeLimitExceeded")
                )
        return wake

    def _queue_idle(self) -> bool:
        """Nothing for a pass to decide: no gang's pod waits, nothing is held or being preempted for, and
        declared time limits are enforced only on held nodes (with ``all``, a pod that started may be
        one to evict later: the pass that sees it sets the wake)."""
        return (
            not self._gang_pending
            and not self.queue_reservations
            and not self._given_up
            and not self._preempting
            and self.enforce_time_limits != "all"
        )

    def _evictions_before(self, gang: tuple[str, str | None], started_s: float) -> int:
        """Times ``gang`` was evicted before this run of it; a run still leaving after its eviction is
        not counted against itself (the same preemption goes on, no other victims are sought)."""
        times, evicted_run = self._evicted_times.get(gang, (0, math.nan))
        return times - 1 if times and started_s == evicted_run else times

    def queue_tick(self, now: float, wall: float) -> QueueActions:
        """The periodic side of the queue: run a pass when the cluster changed or a wait ended, then
        hand over what to carry out (``take_actions``)."""
        if self._pass_due(now, wall):
            self.queue_pass(now, wall)  # a reservation whose start came is judged again
        return self.take_actions()

    def _pass_due(self, now: float, wall: float) -> bool:
        due = min((r.start_s for r in self.queue_reservations.values()), default=math.inf)
        changed = self._queue_dirty and now - self._queue_last >= self.queue_min_gap_s
        if changed and self._queue_rebuilt and self._queue_idle():
            self._queue_dirty = False  # the cluster changed, but no gang waits: a pass decides nothing
            changed = False
        return changed or wall >= min(self._queue_wake, due) or not self._queue_rebuilt

    def take_actions(self) -> QueueActions:
        """What the queue's passes decided that the caller carries out: Events, the node annotations
        that differ from what the nodes show (node -> ``gpuagent.dev/reserved-for`` value, None to
        remove), and evictions (whole gangs)."""
        events, self._pending_events = self._pending_events, []
        evictions, self._pending_evictions = self._pending_evictions, []
        nudges = tuple((self.pods[k], v) for k, v in sorted(self._pending_nudges.items()) if k in self.pods)
        self._pending_nudges = {}
        if not self._queue_rebuilt:  # the nodes' annotations are still to be read back
            return QueueActions(events=tuple(events), evictions=tuple(evictions), nudges=nudges)
        wanted: dict[str, set[str]] = {}
        for name, r in self.queue_reservations.items():
            for node in r.claims:
                wanted.setdefault(node, set()).add(name)
        annotate: dict[str, str | None] = {}
        # only nodes annotated now or wanted: found by the annotation index, not by reading every node
        for node_name in sorted({n for n in wanted if n in self.nodes} | set(self._annotated)):
            have = self._annotated.get(node_name)
            want = reserved_for_value(wanted[node_name]) if node_name in wanted else None
            if (have or None) != want:
                annotate[node_name] = want
        return QueueActions(
            events=tuple(events), annotate=annotate, evictions=tuple(evictions), nudges=nudges
        )

    def eviction_refused(self, key: str) -> None:
        """The API refused to evict ``key`` (a PodDisruptionBudget): counted; asked again later."""
        self.queue_metrics.evictions_refused += 1

    def eviction_done(self, key: str) -> None:
        if key in self._overrun:  # past its declared time limit, not a preemption
            self._overrun.discard(key)
            self.queue_metrics.time_limit_evictions += 1
            return
        self.queue_metrics.evictions += 1

    def queue_position(self, gang: str) -> str:
        """Where ``gang`` stands in the queue, in words, for filter's message."""
        if not self.synced:
            return "the extender's informers have not listed the cluster yet"
        if gang not in self._queue_waiting:
            return "not in the queue yet"
        r = self.queue_reservations.get(gang)
        if r is not None:
            return f"next in the queue, nodes reserved, expected start {_utc(r.start_s)}"
        at, of = self._queue_waiting.index(gang) + 1, len(self._queue_waiting)
        return f"waits in the queue at position {at} of {of}"

    def metrics_text(self) -> bytes:
        """The queue's metrics in the Prometheus text format."""
        nodes = {n for r in self.queue_reservations.values() for n in r.claims}
        return render_metrics(
            self.queue_metrics,
            reservations=len(self.queue_reservations),
            reserved_gpus=sum(sum(r.claims.values()) for r in self.queue_reservations.values()),
            reserved_nodes=len(nodes),
            waiting_gangs=len(self._queue_waiting),
            never_fitting_gangs=len(self._never_fit),
        )

    def _queue_caps(self, pod: Mapping[str, Any], wall: float) -> dict[str, int]:
        """GPUs a pod on its own may use per reserved node (the queue's backfill rule)."""
        held = [*self.queue_reservations.values(), *(v.hold for v in self._given_up.values())]
        if not held:
            return {}
        limit = self._limit(pod)
        end = wall + limit if limit is not None else math.inf
        alloc = {n: self._allocatable_gpus(n) for r in held for n in r.claims}
        # only the running work on reserved nodes counts: found by node, not by reading all of it
        names = {self._info[k].running for n in alloc for k in self._node_pods.get(n, ())}
        running = [self._queue_running[name] for name in sorted(names) if name in self._queue_running]
        return held_back_caps(held, running, alloc, end)

    # -- preempt ---------------------------------------------------------------------------------
    def preempt(
        self, pod: Mapping[str, Any], victims: Mapping[str, VictimSet], wall: float
    ) -> dict[str, Any]:
        """kube-scheduler's ``preempt`` verb: the victim sets it proposes, kept only where they take whole
        gangs (``queueing.preempt_answer``). A pod of a gang gets none (the queue preempts for gangs,
        whole gangs inside one domain), nor a pod the informer does not know; a pod on its own loses
        the nodes it could not use anyway because they are reserved for a gang starting before it ends."""
        known, _ = self.known_pod(pod)
        if known is None or gang_key_of(known) is not None or not victims:
            return {}
        gang_of_uid: dict[str, str | None] = {}
        members: dict[str, list[str]] = {}
        for name, keys in self._running_members.items():  # the pods holding resources
            for k in sorted(keys):
                p = self.pods[k]
                uid = _uid(p)
                if not uid or never_victim(p, self.preempt_namespaces) is not None:
                    continue  # its GPUs do not free, or it is not preemption's to take: unknown here
                group = None if self._info[k].gang is None and name.startswith(SOLO) else name
                gang_of_uid[uid] = group
                if group is not None:
                    members.setdefault(group, []).append(uid)
        need = pod_requests(known).get(GPU, 0)
        caps = self._queue_caps(known, wall) if need else {}
        refused = [n for n, cap in caps.items() if cap < need]
        return preempt_answer(victims, gang_of_uid=gang_of_uid, gang_members=members, refused_nodes=refused)

    # -- filter ----------------------------------------------------------------------------------
    def known_pod(self, pod: Mapping[str, Any]) -> tuple[Mapping[str, Any] | None, str]:
        """The informer's copy of the pod a request names, or None and why it gets no decision: unknown
        to the informer (not seen yet, deleted, or forged), another uid, or another scheduler's pod."""
        key = pod_key(pod)
        known = self.pods.get(key)
        if known is None:
            return None, (
                f"pod {key} is not known to the extender's informer (not seen yet, deleted or never "
                "created); nothing reserved"
            )
        asked, have = _uid(pod), _uid(known)
        if asked and have and asked != have:
            return (
                None,
                f"pod {key} has uid {asked}, the extender's informer knows uid {have}; nothing reserved",
            )
        name = _scheduler_of(known)
        if name != self.scheduler_name:
            return None, f"pod {key} names scheduler {name!r}, not {self.scheduler_name!r}; nothing reserved"
        return known, ""

    def may_plan(self, pod: Mapping[str, Any]) -> bool:
        """Whether ``filter`` of this pod may plan a gang (seconds, for a large one): a gang pod the
        informer knows whose gang has no reservation holding a place for it. Otherwise filter costs
        one pass over the candidate nodes."""
        known, _ = self.known_pod(pod)
        found = gang_key_of(known) if known is not None else None
        if found is None:
            return False
        res = self.reservations.get(found[1])
        return res is None or pod_key(pod) not in res.spec.members

    def filter(
        self, pod: Mapping[str, Any], node_names: Sequence[str], now: float, wall: float | None = None
    ) -> FilterOutcome:
        """``now``: the clock of reservations and barriers; ``wall``: seconds since the epoch, the
        queue's clock (API times and time limits); ``now`` when not given."""
        wall = now if wall is None else wall
        self.expire(now)
        out = FilterOutcome()
        known, why = self.known_pod(pod)
        if known is None:  # no decision and no state for a pod the informer cannot vouch for
            out.unresolvable = dict.fromkeys(node_names, why)
            out.unseen = pod_key(pod) not in self.pods or _uid(self.pods[pod_key(pod)]) != _uid(pod)
            return out
        pod = known  # decide on the cluster's copy, not the request's
        key = pod_key(pod)
        found = gang_key_of(pod)
        if found is None:
            need = gpus_of(self._info[key])
            held = self.held_gpus()
            caps = self._queue_caps(pod, wall) if need else {}
            passed = self._filter_alone(need, held, caps, node_names, out)
            if passed:  # the decision bind asks for
                self._filtered[key] = (_uid(pod), now + self.reservation_ttl_s)
            return out
        self._refused.pop(key, None)  # this very call is kube-scheduler trying it
        out = self._filter_gang(pod, key, found[1], node_names, now=now, wall=wall, out=out)
        if out.passed:
            self._refused.pop(key, None)
        else:  # kube-scheduler keeps it among its unschedulable pods: nudged when its gang starts
            self._refused[key] = found[1]
        return out

    def _filter_alone(
        self,
        need: int,
        held: Mapping[str, int],
        caps: Mapping[str, int],
        node_names: Sequence[str],
        out: FilterOutcome,
    ) -> list[str]:
        """Filter's answer for a pod on its own, into ``out``: the hot path of the extender (kube-scheduler
        sends every candidate, ~10,000 names). The last answer per requested count is kept with what it
        was worked out from (``_fits``' verdicts and their log position, the holds, the queue's caps, the
        candidates): the same call again is answered by copying it (C-level compares and copies), any
        other by the loop over the candidates, plain dict look-ups only."""
        fails = self._fits(need, held)
        kept = self._fit_answers.get(need)
        if (
            kept is not None
            and kept[0] is fails
            and kept[1] == len(self._usage_log)
            and kept[2] == held
            and kept[3] == caps
            and kept[4] == node_names
        ):
            out.passed.extend(kept[5])
            out.failed.update(kept[6])
            return out.passed
        nodes, passed, failed = self.nodes, out.passed, out.failed
        for n in node_names:  # plain dict look-ups only
            verdict = fails.get(n)
            if verdict is not None:
                failed[n] = verdict
            elif n not in nodes:
                failed[n] = "node unknown to the extender (informer not synced yet)"
            elif n in caps and caps[n] < need:
                failed[n] = (
                    f"{need} GPU(s) requested; reserved for queued gang(s) starting before this pod's "
                    f"time limit ends ({RESERVED_FOR}); {max(caps[n], 0)} usable"
                )
            else:
                passed.append(n)
        if len(self._fit_answers) >= FIT_MEMORY and need not in self._fit_answers:
            self._fit_answers.clear()
        self._fit_answers[need] = (
            fails,
            len(self._usage_log),
            dict(held),
            dict(caps),
            list(node_names),
            list(passed),
            dict(failed),
        )
        return passed

    def _filter_gang(
        self,
        pod: Mapping[str, Any],
        key: str,
        gang_name: str,
        node_names: Sequence[str],
        *,
        now: float,
        wall: float,
        out: FilterOutcome,
    ) -> FilterOutcome:
        res = self.reservations.get(gang_name)
        spec: GangSpec | None = None
        if res is None or key not in res.spec.members:
            found = self._info[key].gang
            assert found is not None
            got = self._spec(found)  # kept per gang until its pods or its source change
            if isinstance(got, GangIncompleteError):  # more pods to come: not a placement failure yet
                msg = f"waiting for the rest of the gang: {got}"
                out.failed = dict.fromkeys(node_names, msg)
                out.events += self._event_once(pod, "GangIncomplete", msg, warning=False)
                return out
            if isinstance(got, GangError):
                msg = f"invalid gang: {got}"
                out.unresolvable = dict.fromkeys(node_names, msg)
                out.events += self._event_once(pod, "InvalidGang", msg)
                return out
            assert got is not None
            spec = got
            if res is not None and spec.gang == res.spec.gang and key in spec.members:
                # a pod created after the plan: the plan already holds a place for its index
                res.spec = dataclasses.replace(res.spec, members={**res.spec.members, key: spec.members[key]})
                spec = None
            elif res is not None and res.arrived:
                msg = f"gang {gang_name} changed while its pods wait at bind; retry after its barrier"
                out.failed = dict.fromkeys(node_names, msg)
                return out
        if res is None or spec is not None:
            assert spec is not None
            # changed or new: the queue decides when it starts (a plan it had holds its nodes till then)
            self._give_up(gang_name)
            if self.queue_due(gang_name, now):
                self.queue_pass(now, wall)
            out.events += self._pending_events
            self._pending_events = []
            started = self.reservations.get(gang_name)
            if started is None or key not in started.spec.members:
                repair = self._repair_notes.get(gang_name)
                reason = self._why_waits(spec, now) + (repair or "")
                msg = f"gang {gang_name} does not fit: {reason}; {self.queue_position(gang_name)}"
                out.failed = dict.fromkeys(node_names, msg)
                # a running gang's replacement waiting for its domain has a reason of its own
                out.events += self._event_once(
                    pod, "GangRepairWaiting" if repair else "GangUnschedulable", msg
                )
                return out
            res = started
        if not res.announced:  # on the first pod filtered, whichever pass started the gang
            res.announced = True
            out.events += self._event_once(
                pod,
                "GangPlanned",
                f"gang {gang_name}: {len(res.nodes)} pod(s) planned on {len(res.held)} node(s)",
                warning=False,
            )
            for role, size in sorted(res.subgroup_sizes.items()):
                out.events.append(
                    EventRecord(
                        pod=pod,
                        reason="SubgroupSizeChosen",
                        message=f"gang {gang_name}: role {role} runs in subgroups of {size} pod(s), "
                        "the largest that divides its pods and that every chosen domain holds on its "
                        f"ready trays; {SUBGROUP_SIZE_CHOSEN}={size} is written on its pods as they bind",
                        warning=False,
                    )
                )
        planned_slot = res.spec.members.get(key)
        node = res.nodes.get(planned_slot) if planned_slot is not None else None
        if node is None:
            msg = f"pod {key} has no place in gang {gang_name}'s plan (an elastic subgroup left out)"
            out.failed = dict.fromkeys(node_names, msg)
            return out
        if node not in node_names and self._elsewhere(node, node_names):
            # kube-scheduler is trying another part of the cluster: its pod-group cycle (Kubernetes 1.37
            # TopologyPlacementGenerator) filters one domain's nodes at a time. No evidence against the plan.
            out.failed = dict.fromkeys(
                node_names, f"gang {gang_name} is planned on {node}, outside this call's candidate domain"
            )
            return out
        if node not in node_names:
            # kube-scheduler ruled the planned node out (a taint, a port, its own view of the node). Its
            # view lags the API's (a pod deleted a moment ago may still count there), so the plan stands
            # until the node has been missing for ``EXCLUDE_CONFIRM_S``; then, unless pods already wait at
            # bind, the plan is given up (its nodes held until the queue decides) and made without it
            first = res.missed.setdefault(node, now)
            msg = f"planned node {node} of gang {gang_name} was not among the scheduler's candidates"
            if now - first < EXCLUDE_CONFIRM_S:
                out.failed = dict.fromkeys(node_names, f"{msg}; the plan stands while that may be a lag")
                return out
            out.failed = dict.fromkeys(node_names, msg)
            out.events += self._event_once(pod, "GangNodeFiltered", msg)
            if not res.arrived:
                self._excluded.setdefault(gang_name, set()).add(node)
                self._inputs_gen += 1
                self._give_up(gang_name)
            return out
        res.missed.pop(node, None)
        res.expires_at = max(res.expires_at, now + self.reservation_ttl_s)
        out.passed.extend(repeat(node, node_names.count(node)))
        out.failed.update(dict.fromkeys(node_names, f"gang {gang_name} planned this pod on {node}"))
        del out.failed[node]
        return out

    def _fits(self, need: int, held: Mapping[str, int]) -> dict[str, str]:
        """The nodes a pod of ``need`` GPUs does not fit on, and why (free GPUs, or held for a gang):
        kept per requested count (a few; tenants choose them) and brought up to date for the nodes whose
        usage or holds changed since (``_usage_log``), not worked out again for every node."""
        cached = self._fit.get(need)
        if cached is None:
            found = {n: why for n in self.nodes if (why := self._fit_verdict(n, need, held)) is not None}
        else:
            found, seen, was_held = cached
            for n in {
                *self._usage_log[seen:],
                *(n for n in {*held, *was_held} if held.get(n) != was_held.get(n)),
            }:
                why = self._fit_verdict(n, need, held) if n in self.nodes else None
                if why is None:
                    found.pop(n, None)
                else:
                    found[n] = why
        if cached is None and len(self._fit) >= FIT_MEMORY:
            self._fit.clear()
        self._fit[need] = (found, len(self._usage_log), dict(held))
        return found

    def _usage_changed(self, node: str) -> None:
        self._usage_log.append(node)
        if len(self._usage_log) > max(64, len(self.nodes)):  # more changes than nodes: start afresh
            self._usage_log, self._fit = [], {}

    def _fit_verdict(self, n: str, need: int, held: Mapping[str, int]) -> str | None:
        u = self._node_used.get(n)
        unheld = self._allocatable_gpus(n) - (u.get(GPU, 0) if u else 0)
        free = unheld - held.get(n, 0)
        if free >= need:
            return None
        if unheld >= need:
            return f"{need} GPU(s) requested; {max(free, 0)} not reserved for a gang"
        return f"{need} GPU(s) requested; {max(free, 0)} free"

    def _why_waits(self, spec: GangSpec, now: float) -> str:
        """Why a gang the queue did not start waits, for its filter's message: why the last pass left it
        out or why the planner could not place it in that pass (its shape's reason where the pass did
        not plan it again), else the planner's reason on what is free now, kept per gang and pass: the
        filters of its pods never plan it more than once a pass."""
        skipped = self._skipped.get(spec.key)
        if skipped is not None:
            return skipped
        said = self._reasons.get(spec.key)
        if said is not None:
            return said
        passes = self.queue_metrics.passes
        known = self._gang_reason.get(spec.key)
        if known is not None and known[0] == passes and known[1] == spec and known[2] == self._inputs_gen:
            return known[3]
        planned = self._plan_gang(spec, now)
        reason = (
            planned
            if isinstance(planned, str)
            else "the capacity it fits on is held for gangs before it in the queue"
        )
        self._gang_reason[spec.key] = (passes, spec, self._inputs_gen, reason)
        return reason

    def _elsewhere(self, node: str, node_names: Sequence[str]) -> bool:
        """Whether no candidate shares the planned node's tier-1 domain: the call covers another part
        of the cluster, so the node's absence says nothing about the node."""
        of = self._domains().of
        domain = of.get(node)
        if domain is None:
            return False
        return all(of.get(n) != domain for n in node_names)

    # -- prioritize ------------------------------------------------------------------------------
    def prioritize(
        self, pod: Mapping[str, Any], node_names: Sequence[str], now: float
    ) -> list[tuple[str, int]]:
        """A gang's pod: its planned node only. A pod on its own: the nodes it fits ranked by the
        planner's objective (``planner.objective.price`` of its tier-1 domain taking it: not opening a
        wholly free domain first, then the fullest domain, then the fullest node), best 10, the last of
        the fitting ones 1, a node it does not fit 0 (kube-scheduler's extender range)."""
        self.expire(now)
        known, _ = self.known_pod(pod)
        if known is None:
            return [(n, 0) for n in node_names]
        info = self._info[pod_key(known)]
        if info.gang is not None:
            res = self.reservations.get(info.gang[1])
            planned = res.spec.members.get(info.key) if res else None
            node = res.nodes.get(planned) if res and planned is not None else None
            return list(zip(node_names, map({node: MAX_PRIORITY}.get, node_names, repeat(0)), strict=True))
        need = gpus_of(info)
        ranks = self._ranks(need)
        keys = list(map(self._rank_order(need, ranks).get, node_names, repeat(-1)))  # -1: no fit; in C
        distinct = set(keys)  # the scores: per distinct rank among the candidates (a few)
        distinct.discard(-1)
        span = max(1, len(distinct) - 1)
        score = {k: MAX_PRIORITY - (MAX_PRIORITY - 1) * i // span for i, k in enumerate(sorted(distinct))}
        return list(zip(node_names, map(score.get, keys, repeat(0)), strict=True))

    def _ranks(self, need: int) -> dict[str, tuple[int, int]]:
        """``_rank_key`` of every node a pod of ``need`` GPUs fits on: kept per requested count (a few)
        and brought up to date for the tier-1 domains whose nodes changed since (``_state_log``)."""
        self.snapshot()
        index = self._domains()
        if self._ranks_index is not index:
            self._ranks_index, self._rank_cache, self._room, self._state_log = index, {}, {}, []
        cached = self._rank_cache.get(need)
        if cached is not None and cached[1] == len(self._state_log):
            return cached[0]
        changed = self._state_log[cached[1] :] if cached is not None else []
        domains = {index.of[n] for n in changed if n in index.of}
        for d in domains:
            self._room.pop((d, need), None)
        if cached is None:
            redo: Iterable[str] = self._states
            found: dict[str, tuple[int, int]] = {}
            self._room = {k: v for k, v in self._room.items() if k[1] != need}
        else:
            redo = {*changed, *(m for d in domains for m in index.members.get(d, ()))}
            found = cached[0]
        for n in redo:
            key = self._rank_key(n, need)
            if key is None:
                found.pop(n, None)
            else:
                found[n] = key
        if cached is None and len(self._rank_cache) >= FIT_MEMORY:
            self._rank_cache.clear()
        self._rank_cache[need] = (found, len(self._state_log))
        return found

    def _rank_order(self, need: int, ranks: Mapping[str, tuple[int, int]]) -> dict[str, int]:
        """Each ranked node's place among the distinct ``_ranks`` keys (the same order, small ints
        that hash at once), kept while ``_ranks`` answers from the same cache entry."""
        entry = self._rank_cache.get(need)
        kept = self._rank_places.get(need)
        if kept is not None and entry is not None and kept[0] is entry:
            return kept[1]
        place = {k: i for i, k in enumerate(sorted(set(ranks.values())))}
        found = dict(zip(ranks, map(place.__getitem__, ranks.values()), strict=True))
        if entry is not None:
            if len(self._rank_places) >= FIT_MEMORY:
                self._rank_places.clear()
            self._rank_places[need] = (entry, found)
        return found

    def _rank_key(self, node: str, need: int) -> tuple[int, int] | None:
        """Where placing ``need`` GPUs on ``node`` ranks under the objective (smaller is better), or
        None when they do not fit there."""
        state = self._states.get(node)
        if state is None or state.free < need or state.gpus <= 0:
            return None
        if need <= 0:
            return (0, 0)
        domain = self._domains().of.get(node)
        if domain is None:
            free, total, cap = state.free, state.gpus, state.free // need
        else:
            free, total, cap = self._domain_room(domain, need)
        opens = open_cost(0) if free == total else 0
        return price(opens, cap, free, 1, g=need, useful=1), state.free - need

    def _domain_room(self, domain: str, need: int) -> tuple[int, int, int]:
        """A tier-1 domain's free GPUs, its GPUs, and its room in pods of ``need`` GPUs, now (summed once
        per change of its nodes)."""
        found = self._room.get((domain, need))
        if found is None:
            states = [self._states[m] for m in self._domains().members.get(domain, ()) if m in self._states]
            found = (
                sum(s.free for s in states),
                sum(s.gpus for s in states),
                sum(s.free // need for s in states),
            )
            self._room[(domain, need)] = found
        return found

    # -- bind ------------------------------------------------------------------------------------
    def bind(self, namespace: str, name: str, uid: str, node: str, now: float) -> BindDecision:
        """Bind only a pod the informer knows, that names our scheduler, to a node the informer knows,
        after this extender filtered it (a gang's reservation, or a pod's own filter decision)."""
        key = f"{namespace or 'default'}/{name}"
        pod = self.pods.get(key)
        if pod is None:
            return _refuse(f"pod {key} is not known to the extender's informer; not bound")
        have = _uid(pod)
        if uid and have and uid != have:
            return _refuse(f"pod {key} has uid {have}, not {uid}; not bound")
        uid = uid or have
        sched = _scheduler_of(pod)
        if sched != self.scheduler_name:
            return _refuse(f"pod {key} names scheduler {sched!r}, not {self.scheduler_name!r}; not bound")
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to:
            return _refuse(f"pod {key} is already bound to {bound_to}; not bound again")
        if node not in self.nodes:
            return _refuse(f"node {node} is not known to the extender's informer; {key} not bound")
        found = gang_key_of(pod)
        if found is None:
            decided = self._filtered.pop(key, None)
            if decided is None or decided[1] <= now or (decided[0] and decided[0] != uid):
                return _refuse(
                    f"pod {key} was not passed by this extender's filter (or too long ago); not bound"
                )
            need = pod_requests(pod).get(GPU, 0)
            free = self.free_gpus(node)
            if need > free:
                return _refuse(f"pod {key} needs {need} GPU(s); {max(free, 0)} free on {node} now; not bound")
            return BindDecision(action="bind", pods=((key, uid, node),))
        gang_name = found[1]
        res = self.reservations.get(gang_name)
        planned = res.spec.members.get(key) if res else None
        if res is None or planned is None:
            return BindDecision(
                action="error", gang=gang_name, error=f"gang {gang_name} has no reservation for {key}"
            )
        if res.nodes.get(planned) != node:
            return BindDecision(
                action="error",
                gang=gang_name,
                error=f"pod {key} planned on {res.nodes.get(planned)}, asked to bind on {node}",
            )
        res.arrived[key] = node
        self._uids[key] = uid
        if res.barrier_deadline is None:
            res.barrier_deadline = now + self.barrier_timeout_s
        if len(res.arrived) + len(res.bound) >= res.target:
            return self._complete_ready(gang_name, res, now)
        return BindDecision(action="wait", gang=gang_name, deadline=res.barrier_deadline)

    def _imex_held(self, res: Reservation) -> list[str]:
        """The trays of ``res``'s pods at the barrier whose IMEX is not ready now (their Node labels,
        ``cluster.imex_ready``), for a gang that needs multi-node NVLink; none for one that does not."""
        if res.mnnvl == "off":
            return []
        return sorted(
            {n for n in res.arrived.values() if not imex_ready(_labels(self.nodes.get(n) or {}) or {})}
        )

    def _complete_ready(self, gang_name: str, res: Reservation, now: float) -> BindDecision:
        """Every pod arrived: bind them once every chosen tray's IMEX is ready, else look again in
        ``IMEX_RECHECK_S`` until the barrier's deadline (``barrier_timeout`` says which trays held it)."""
        if not self._imex_held(res):
            return self._complete(gang_name, res)
        deadline = res.barrier_deadline if res.barrier_deadline is not None else now
        if now >= deadline:
            return self._imex_timeout(gang_name, res)
        return BindDecision(action="wait", gang=gang_name, deadline=min(deadline, now + IMEX_RECHECK_S))

    def _imex_timeout(self, gang_name: str, res: Reservation) -> BindDecision:
        """The barrier's deadline passed while trays' IMEX was not ready: a ``required`` gang binds
        nothing and its reservation is released; a ``preferred`` one binds, and says where IMEX was not
        ready. The Event names the trays."""
        held = self._imex_held(res)
        shown = ", ".join(held[:10]) + (f" and {len(held) - 10} more" if len(held) > 10 else "")
        keys = sorted(k for k in res.arrived if k in self.pods)
        if res.mnnvl == "preferred":
            msg = (
                f"gang {gang_name}: IMEX not ready on tray(s) {shown} after {self.barrier_timeout_s:g}s at "
                "the bind barrier; bound anyway (gpuagent.dev/mnnvl: preferred)"
            )
            done = self._complete(gang_name, res)
            events = tuple(
                EventRecord(pod=self.pods[k], reason="GangImexNotReady", message=msg) for k in keys
            )
            return dataclasses.replace(done, events=done.events + events)
        self._give_up(gang_name)
        msg = (
            f"gang {gang_name}: IMEX not ready on tray(s) {shown} within {self.barrier_timeout_s:g}s at the "
            "bind barrier (gpuagent.dev/imex is not ready there); nothing bound, reservation released"
        )
        events = tuple(EventRecord(pod=self.pods[k], reason="GangImexNotReady", message=msg) for k in keys)
        return BindDecision(action="error", gang=gang_name, error=msg, events=events)

    def _complete(self, gang_name: str, res: Reservation) -> BindDecision:
        pods = tuple((k, self._uids.get(k, ""), n) for k, n in sorted(res.arrived.items()))
        res.arrived.clear()
        for k, n in pods_nodes(pods):
            res.bound.add(k)
            self._assume_bound(k, n)
            self._release_hold(res, k, n)
        res.barrier_deadline = None
        if self.reservations.pop(gang_name, None) is not None:
            self._version += 1
        self._excluded.pop(gang_name, None)
        self._inputs_gen += 1
        sizes = {**res.kept_sizes, **res.subgroup_sizes}
        annotations = {
            k: {SUBGROUP_SIZE_CHOSEN: str(sizes[res.spec.members[k].role])}
            for k, _, _ in pods
            if res.spec.members[k].role in sizes
        }
        return BindDecision(
            action="bind",
            pods=pods,
            gang=gang_name,
            annotations=annotations,
            bound_events=_repaired(res, pods, self.pods),
        )

    def _assume_bound(self, key: str, node: str) -> None:
        pod = self.pods.get(key)
        if pod is None:
            return
        pod = dict(pod)
        pod["spec"] = {**(pod.get("spec") or {}), "nodeName": node}
        self._put("pods", key, pod)

    def assume_bound(self, key: str, node: str) -> None:
        """A pod on its own was bound: count it until the informer reports it."""
        self._assume_bound(key, node)

    def barrier_timeout(self, gang_name: str, now: float) -> BindDecision:
        """The barrier's deadline passed: bind what arrived if it meets the minimum, else release."""
        res = self.reservations.get(gang_name)
        if res is None or res.barrier_deadline is None:
            return BindDecision(
                action="error", gang=gang_name, error=f"gang {gang_name} is no longer waiting"
            )
        if len(res.arrived) + len(res.bound) >= res.target:  # only the trays' IMEX held it
            return self._complete_ready(gang_name, res, now)
        if now < res.barrier_deadline:
            return BindDecision(action="wait", gang=gang_name, deadline=res.barrier_deadline)
        if len(res.arrived) + len(res.bound) >= res.spec.min_member:
            if self._imex_held(res):
                return self._imex_timeout(gang_name, res)
            return self._complete(gang_name, res)
        arrived = len(res.arrived)
        self._give_up(gang_name)
        msg = (
            f"gang {gang_name}: only {arrived} of {res.target} pod(s) reached bind within "
            f"{self.barrier_timeout_s:g}s (minimum {res.spec.min_member}); nothing bound, "
            "reservation released"
        )
        events = tuple(
            EventRecord(pod=self.pods[k], reason="GangBarrierTimeout", message=msg)
            for k in sorted(res.arrived)
            if k in self.pods
        )
        return BindDecision(action="error", gang=gang_name, error=msg, events=events)

    def bind_failed(self, gang_name: str, keys: Iterable[str]) -> None:
        """Binding some pods failed at the API: forget the assumption so the informer's truth wins."""
        for k in keys:
            pod = self.pods.get(k)
            if pod is not None and (pod.get("spec") or {}).get("nodeName"):
                pod = dict(pod)
                pod["spec"] = {**(pod.get("spec") or {}), "nodeName": None}
                self._put("pods", k, pod)
        self._give_up(gang_name)


def _utc(t: float) -> str:
    """Seconds since the epoch as an RFC 3339 UTC time (``never`` for infinity)."""
    if not math.isfinite(t):
        return "never"
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _refuse(error: str) -> BindDecision:
    return BindDecision(action="error", error=error)


def _uid(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) else ""


def _scheduler_of(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) and name else "default-scheduler"


def _running_name(key: str, pod: Mapping[str, Any], found: tuple[str, str] | None) -> str:
    """The queue's name of the running work ``pod`` belongs to: its gang, else the workload it is part of
    (``queueing.victim_group``: preempted whole), else ``pod:<key>``."""
    if found is not None:
        return found[1]
    group = victim_group(pod)
    return group if group is not None else SOLO + key


def _matches(node: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _tolerates(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether ``pod`` tolerates every NoSchedule/NoExecute taint of ``node``."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates_one(t, taint) for t in tolerations):
            return False
    return True


def _tolerates_one(tol: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if tol.get("effect") and tol.get("effect") != taint.get("effect"):
        return False
    key = tol.get("key")
    if tol.get("operator") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or "")


def _per_role_selectors(
    snapshot: ClusterSnapshot,
    gang: Gang,
    by_role: Mapping[str, Mapping[str, str]],
    nodes: Mapping[str, Mapping[str, Any]],
) -> tuple[ClusterSnapshot, Gang]:
    """Roles whose pods select different nodes, for the planner, which knows one node set per gang: each
    distinct nodeSelector becomes a resource every pod of its roles asks one of, plentiful on the nodes it
    matches and absent (zero) elsewhere. Only the plan sees these; the reservation keeps the gang."""
    names: dict[tuple[tuple[str, str], ...], str] = {}
    for sel in sorted({tuple(sorted(s.items())) for s in by_role.values()}):
        names[sel] = "nodeSelector " + (",".join(f"{k}={v}" for k, v in sel) or "(none)")
    roles = []
    for role in gang.roles:
        sel = tuple(sorted((by_role.get(role.name) or {}).items()))
        if sel not in names:  # no pod of the role exists yet: nothing known to keep it anywhere
            roles.append(role)
            continue
        roles.append(dataclasses.replace(role, resources_per_pod={**role.resources_per_pod, names[sel]: 1}))
    states = []
    for n in snapshot.nodes:
        labelled = {
            res: (MAX_GANG_PODS if _matches(nodes[n.name], dict(sel)) else 0) for sel, res in names.items()
        }
        states.append(
            dataclasses.replace(
                n,
                resources={**n.resources, **labelled},
                free_resources={**n.free_resources, **labelled},
            )
        )
    return dataclasses.replace(snapshot, nodes=tuple(states)), dataclasses.replace(gang, roles=tuple(roles))


def pods_nodes(pods: Iterable[tuple[str, str, str]]) -> list[tuple[str, str]]:
    return [(k, n) for k, _, n in pods]


__all__ = [
    "BindDecision",
    "ClusterState",
    "EventRecord",
    "Eviction",
    "FilterOutcome",
    "QueueActions",
    "Reservation",
]


_K = TypeVar("_K")


def _discard(index: dict[_K, set[str]], name: _K, key: str) -> None:
    """Take ``key`` out of ``index[name]``; an emptied entry goes, so the index holds only what exists."""
    members = index.get(name)
    if members is not None:
        members.discard(key)
        if not members:
            del index[name]
