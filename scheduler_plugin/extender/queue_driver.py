"""The queue driver: when a pass of the gang queue runs, its inputs taken from the cache, its decision
(``scheduler_plugin.queue.decide``, pure) committed as holds, Events, node annotations and evictions.

A pass orders the waiting gangs (PriorityClass, then creation), counts the running work and the holds of
earlier passes, and decides which gangs start (their plans start, each holding its nodes, ``extender.holds``),
which gang is the head and holds the nodes it will get (an Event ``GangReserved`` with the expected
start, the node annotation ``gpuagent.dev/reserved-for``), and what is preempted. Other gangs, and pods on
their own, use held nodes only if their time limit ends before the head's start (the backfill rule,
``QueueInputs.caps``). After a restart the queue's holds are rebuilt from the pods and the node
annotations (``queue.rebuild``).

A pass runs only when the cluster changed (its version) or a wait ended; the queue loop takes a pass's
inputs under the lock (``begin``), decides outside it (``PassJob.decide``) and commits against the
cluster's version (``commit``), where a start whose gang or nodes changed meanwhile is left out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from scheduler_plugin.extender.cache import Cache
from scheduler_plugin.extender.holds import Holds
from scheduler_plugin.extender.inputs import Prepared, QueueInputs
from scheduler_plugin.extender.outbox import Outbox, QueueActions
from scheduler_plugin.extender.preempt import Preempt
from scheduler_plugin.planner import SnapshotCache
from scheduler_plugin.queue import (
    Decision,
    QueueConfig,
    Reservation,
    Running,
    Waiting,
    decide,
    order,
    rebuild,
    same_shape,
)
from scheduler_plugin.queueing import QueueMetrics, render_metrics, reserved_for_value
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Plan, PlanResult

QUEUE_RETRY_S = 0.5  # a waiting gang's pods run the queue again at most this often (unless it is new)
# work still running past its declared limit is expected to end soon (its controller ends it, as Slurm's
# OverTimeLimit or a Job's activeDeadlineSeconds do): within as long as it has run over, at least 1 s and
# at most this. Counting it as never ending instead would move a reservation away from the nodes about to
# free the moment their jobs run a little late, and let others take them
OVERDUE_GRACE_S = 30.0
# on a pod of a gang that started after filter refused it: "<n> pod(s) on <m> node(s) at <UTC time>"
GANG_PLANNED = "gpuagent.dev/gang-planned"


@dataclass(frozen=True)
class PassJob:
    """A pass's inputs, taken under the lock (``QueueDriver.begin``): immutable, so ``decide`` runs on
    them outside it; the driver commits the result against ``version``."""

    version: int
    now: float
    snapshot: ClusterSnapshot
    running: dict[str, Running]
    waiting: tuple[Waiting, ...]
    before: Mapping[str, Reservation]
    prepared: Mapping[str, Prepared]
    pending: Mapping[str, list[str]]
    identity: Mapping[str, tuple[str, str | None]]
    place: Callable[[ClusterSnapshot, Gang], PlanResult]
    reasons: dict[str, str]  # filled by ``place`` as it plans
    config: QueueConfig

    def decide(self) -> Decision:
        """The queue's decision on these inputs (pure but for the planner's own cache)."""
        return decide(
            self.now,
            self.snapshot,
            self.running,
            self.waiting,
            self.before,
            place=self.place,
            config=self.config,
        )


def utc(t: float) -> str:
    """Seconds since the epoch as an RFC 3339 UTC time (``never`` for infinity)."""
    if not math.isfinite(t):
        return "never"
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class QueueDriver:
    """The queue's passes (module docstring): ``due`` (a filter's), ``run_pass`` (all under the lock),
    ``begin``/``commit`` (the loop's), ``tick``, and ``take_actions``."""

    def __init__(
        self,
        cache: Cache,
        holds: Holds,
        inputs: QueueInputs,
        preempt: Preempt,
        outbox: Outbox,
        *,
        config: QueueConfig,
        metrics: QueueMetrics,
    ) -> None:
        self.cache = cache
        self.holds = holds
        self.inputs = inputs
        self.preempt = preempt
        self.outbox = outbox
        self.config = config
        self.metrics = metrics
        # the least time between passes the cluster's changes alone start: the caller sets it from how
        # long a pass takes (a pass holds the state lock), so passes never crowd out the verbs
        self.min_gap_s = 0.0
        self.loop = False  # a queue loop passes on the cluster's changes (``due``)
        self.waiting: list[str] = []  # gang names in queue order, at the last pass
        # why each waiting gang waits: the planner's reason in the last pass
        self.reasons: dict[str, str] = {}
        self._never_fit: set[str] = set()  # waiting gangs the queue passed over: they fit nowhere
        self._rebuilt = False
        self._last = -math.inf
        self._wake = math.inf
        # the last pass ran at this version of the cluster and needs no other before a change or its wake
        self._passed_at: int | None = None
        self._loop_snapshots = SnapshotCache()  # the queue loop's, planned on outside the lock

    def due(self, gang: str, now: float, spec: object) -> bool:
        """Whether a filter of ``gang``'s pod should run the queue again: a gang the last pass did not
        see (nor left out as ``spec`` is now, with the reason, ``QueueInputs.skipped_as``), or the
        cluster changed and the last pass is ``QUEUE_RETRY_S`` old. While a queue loop runs (``loop``,
        set by the extender's ``run_queue``), changes are its to pass on, and so is a new gang: the
        filter wakes the loop instead of passing (``FilterOutcome.wake_queue``), answers from the last
        pass and never waits for a pass (its pods are nudged when the loop starts the gang)."""
        if gang not in self.waiting and self.inputs.skipped_as(gang, spec) is None:
            return True
        return not self.loop and self.cache.dirty and now - self._last >= max(QUEUE_RETRY_S, self.min_gap_s)

    def run_pass(self, now: float) -> None:
        """One pass of the queue (module docstring) at ``now``, all of it under the caller's lock. Gangs
        it starts get their plan and its hold at once; what a user should see (Events), and evictions, wait in
        ``take_actions``. A pass that would see what the last one saw (the cluster's version unchanged)
        before any of its waits ends returns at once: it would decide the same."""
        job = self._inputs(now, self.cache.plans)
        if job is not None:
            self._commit(job, job.decide())

    def begin(self, now: float) -> PassJob | None:
        """The queue loop's pass, first part, under the lock: the pass's inputs when one is due
        (``tick``'s rule), else None. ``PassJob.decide`` then runs outside the lock, on the immutable
        inputs alone, and ``commit`` takes its result under the lock again."""
        if not self._pass_due(now):
            return None
        return self._inputs(now, self._loop_snapshots)

    def commit(self, job: PassJob, decision: Decision) -> QueueActions:
        """The queue loop's pass, last part, under the lock: ``decision`` made on ``job``'s inputs
        becomes the queue's. Where the cluster changed meanwhile (its version), a start whose gang or
        nodes changed is left out and the next tick passes again."""
        self._commit(job, decision)
        return self.take_actions()

    def tick(self, now: float) -> QueueActions:
        """The periodic side of the queue: run a pass when the cluster changed or a wait ended, then
        hand over what to carry out (``take_actions``)."""
        if self._pass_due(now):
            self.run_pass(now)  # a reservation whose start came is judged again
        return self.take_actions()

    def _wake_at(self) -> float:
        """When the queue passes again with nothing changed: the last pass's wake, or sooner when a
        victim sitting out may be one again."""
        return min(self._wake, self.preempt.retry_at())

    def _inputs(self, now: float, cache: SnapshotCache) -> PassJob | None:
        if not self.cache.synced:  # a partial listing would misjudge the queue and the nodes' annotations
            return None
        if self._passed_at == self.cache.version and self._rebuilt and now < self._wake_at():
            self.cache.dirty = False
            return None
        self.cache.dirty = False
        self._last = now
        self.inputs.passed_at = now
        self.inputs.repair_waits_over(now)
        self.metrics.passes += 1
        snapshot = self.cache.snapshot()
        pending: dict[str, list[str]] = {}
        for key in self.cache.gang_pending:
            found = self.cache.info[key].gang
            if found is not None and found[1] not in self.holds.started:
                pending.setdefault(found[1], []).append(key)
        for keys in pending.values():
            keys.sort()
        prepared, waiting = self.inputs.waiting(pending, now)
        running_now, _, _ = self.inputs.running_work(now, {w.name for w in waiting})
        reasons: dict[str, str] = {}
        place = self.inputs.place(prepared, cache, reasons)
        if not self._rebuilt:  # after a restart: what the nodes say is held
            reserved_for = {n: v.split(",")[0] for n, v in self.cache.annotated.items() if isinstance(v, str)}
            rebuilt = rebuild(now, snapshot, self.inputs.all_facts(now), waiting, reserved_for, place=place)
            self._rebuilt = True
            self.holds.queue_reservations = dict(rebuilt.reservations)
        top = max((w.priority for w in waiting), default=None)  # only work below it may be a victim
        candidates = {n for n, r in running_now.items() if top is not None and r.priority < top}
        identity, exempt = self.preempt.victims(now, candidates)
        return PassJob(
            version=self.cache.version,
            now=now,
            snapshot=snapshot,
            running=self._judged(running_now, now, identity, exempt),
            waiting=tuple(waiting),
            before=dict(self.holds.queue_reservations),
            prepared=prepared,
            pending=pending,
            identity=identity,
            place=place,
            reasons=reasons,
            config=self.config,
        )

    def _commit(self, job: PassJob, decision: Decision) -> None:
        now, waiting = job.now, job.waiting
        holds, pods = self.holds, self.cache.pods
        moved = job.version != self.cache.version  # the cluster changed while the pass decided
        pending = {g: [k for k in keys if k in pods] for g, keys in job.pending.items()}
        starts = [st for st in decision.starts if not moved or self._still_startable(job, st.gang, st.plan)]
        holds.queue_reservations = dict(decision.reservations)
        # a pass decided for the gangs whose plans were given up before it read the cluster
        holds.given_up = {g: v for g, v in holds.given_up.items() if v.version > job.version}
        for st in decision.starts:  # a start left out holds neither a plan nor a reservation: keep its nodes
            if st not in starts and st.gang in job.prepared:
                spec, gang, members, _, _ = job.prepared[st.gang]
                holds.keep_held(st.gang, holds.plan_from(spec, gang, members, st.plan.placement, now))
        self.inputs.last_running = job.running
        _, declared, keys_of = self.inputs.running_work(now, {w.name for w in waiting})
        self.inputs.keep_repairs(pending)
        self._wake = min(
            decision.wake_s,
            self.inputs.repair_wake(),
            self.preempt.retry_at(),
            self.preempt.enforce_limits(declared, keys_of, now),
            min((r.start_s for r in holds.queue_reservations.values()), default=math.inf),
        )
        started = {st.gang for st in starts}
        self.waiting = [w.name for w in order(waiting) if w.name not in started]
        self._why(job, started)
        self._say_never_fits(decision.never_fits, pending)
        for start in starts:
            spec, gang, members, _, _ = job.prepared[start.gang]
            res = holds.plan_from(spec, gang, members, start.plan.placement, now)
            res.subgroup_sizes = dict(start.plan.subgroup_sizes)
            res.kept_sizes = dict(self.inputs.repair_sizes.get(start.gang, {}))
            holds.started[start.gang] = res
            holds.claims_allocated(res.spec.members, only=res)  # claims still allocated from before
            holds.excluded.pop(start.gang, None)
            self.cache.inputs_gen += 1
            planned = f"{len(res.nodes)} pod(s) on {len(res.hold.claims)} node(s) at {utc(now)}"
            self.outbox.nudge(start.gang, pending.get(start.gang, ()), planned)
        self._say_reserved(job.before, pending)
        self.preempt.run(
            decision.preemptions,
            waiting=waiting,
            running=job.running,
            identity=job.identity,
            pending=pending,
            now=now,
        )
        if len(starts) < len(decision.starts):  # left out: decided again on what the cluster is now
            self.cache.dirty = True
        self.cache.version += 1  # what this pass started and held: filters read it
        # a preemption a budget refused asks for another pass at once (``Preempt._over_budget``)
        self._passed_at = None if self.cache.dirty else self.cache.version

    def _why(self, job: PassJob, started: Collection[str]) -> None:
        """Why each waiting gang waits after ``job``'s pass, for its pods' filters: the planner's reason;
        a gang of a shape that failed is not planned again in a pass (its shape's reason holds); one the
        pass did not plan had too little room."""
        self.reasons = dict(job.reasons)
        shapes = {same_shape(w.gang): self.reasons[w.name] for w in job.waiting if w.name in self.reasons}
        free_in: dict[frozenset[str], int] = {}  # free GPUs per admitted node set (a few distinct sets)
        for w in job.waiting:
            if w.name not in self.reasons and same_shape(w.gang) in shapes:
                self.reasons[w.name] = shapes[same_shape(w.gang)]
            elif w.name not in self.reasons and w.name not in started:  # not planned: too little room
                allowed = job.prepared[w.name][3]
                if allowed not in free_in:
                    free_in[allowed] = sum(
                        n.free for n in job.snapshot.nodes if n.schedulable and n.name in allowed
                    )
                self.reasons[w.name] = (
                    f"{w.gpus} GPU(s) needed; the nodes its pods may use have {free_in[allowed]} free now"
                )

    def _still_startable(self, job: PassJob, gang: str, plan_: Plan) -> bool:
        """Whether a start decided on ``job``'s inputs still holds now: its gang still waits with the
        same spec, nothing else holds it, and every node of its plan still has the GPUs."""
        spec = job.prepared[gang][0]
        found = self.cache.info.get(next(iter(sorted(spec.members)), ""), None)
        if found is None or found.gang is None or self.cache.spec(found.gang) is not spec:
            return False
        if gang in self.holds.started:
            return False
        roles = {r.name: r.gpus_per_pod for r in job.prepared[gang][1].roles}
        need: dict[str, int] = {}
        for slot, node in plan_.placement.items():
            need[node] = need.get(node, 0) + roles.get(slot.role, 0)
        held = self.holds.held_gpus()
        return all(self.cache.free_gpus(n, held) >= g for n, g in need.items())

    def _judged(
        self,
        running: Mapping[str, Running],
        now: float,
        identity: Mapping[str, tuple[str, str | None]],
        exempt: Collection[str],
    ) -> dict[str, Running]:
        """The running work as this pass judges it: work past its limit ends soon (``OVERDUE_GRACE_S``),
        evictions counted before, victims it may not take. Unchanged objects are kept."""
        evicted = {name for name, _ in self.preempt.evicted_times}
        out: dict[str, Running] = {}
        for name, r in running.items():
            overdue = r.ends_s <= now
            times = (
                self.preempt.evictions_before(identity.get(name, (name, None)), r.started_s)
                if name in evicted
                else 0
            )
            if not overdue and not times and name not in exempt:
                out[name] = r
                continue
            out[name] = dataclasses.replace(
                r,
                ends_s=now + min(OVERDUE_GRACE_S, max(1.0, now - r.ends_s)) if overdue else r.ends_s,
                evictions=times,
                preemptible=name not in exempt,
            )
        return out

    def _say_never_fits(self, never_fits: Mapping[str, str], pending: Mapping[str, list[str]]) -> None:
        self._never_fit = {
            g for g in self._never_fit if g in self.waiting and g not in self.holds.queue_reservations
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
                self.outbox.say(self.cache.pods[k], "GangNeverFits", msg)

    def _say_reserved(self, before: Mapping[str, Reservation], pending: Mapping[str, list[str]]) -> None:
        for name, r in sorted(self.holds.queue_reservations.items()):
            old = before.get(name)
            if old is not None and dict(old.claims) == dict(r.claims):
                continue  # the same nodes (its start may be re-judged each pass): said already
            where = f" in {r.domain}" if r.domain else ""
            waits = f"; waits for {len(r.waits_for)} running job(s) to end" if r.waits_for else ""
            msg = (
                f"gang {name} is next in the queue: {sum(r.claims.values())} GPU(s) on {len(r.claims)} "
                f"node(s){where} reserved, expected start {utc(r.start_s)}{waits}"
            )
            for k in pending.get(name, ()):
                self.outbox.say(self.cache.pods[k], "GangReserved", msg, warning=False)

    def _idle(self) -> bool:
        """Nothing for a pass to decide: no gang's pod waits, nothing is held or being preempted for, and
        declared time limits are enforced only on held nodes (with ``all``, a pod that started may be
        one to evict later: the pass that sees it sets the wake)."""
        return (
            not self.cache.gang_pending
            and not self.holds.queue_reservations
            and not self.holds.given_up
            and not self.preempt.preempting
            and self.inputs.enforce_time_limits != "all"
        )

    def _pass_due(self, now: float) -> bool:
        due = min((r.start_s for r in self.holds.queue_reservations.values()), default=math.inf)
        changed = self.cache.dirty and now - self._last >= self.min_gap_s
        if changed and self._rebuilt and self._idle():
            self.cache.dirty = False  # the cluster changed, but no gang waits: a pass decides nothing
            changed = False
        return changed or now >= min(self._wake_at(), due) or not self._rebuilt

    def take_actions(self) -> QueueActions:
        """What the queue's passes decided that the caller carries out: Events, the node annotations
        that differ from what the nodes show (node -> ``gpuagent.dev/reserved-for`` value, None to
        remove), evictions (whole gangs) and nudges."""
        events, evictions, nudges = self.outbox.take(self.cache.pods)
        if not self._rebuilt:  # the nodes' annotations are still to be read back
            return QueueActions(events=events, evictions=evictions, nudges=nudges)
        wanted: dict[str, set[str]] = {}
        for name, r in self.holds.queue_reservations.items():
            for node in r.claims:
                wanted.setdefault(node, set()).add(name)
        annotate: dict[str, str | None] = {}
        annotated = self.cache.annotated
        # only nodes annotated now or wanted: found by the annotation index, not by reading every node
        for node_name in sorted({n for n in wanted if n in self.cache.nodes} | set(annotated)):
            have = annotated.get(node_name)
            want = reserved_for_value(wanted[node_name]) if node_name in wanted else None
            if (have or None) != want:
                annotate[node_name] = want
        return QueueActions(events=events, annotate=annotate, evictions=evictions, nudges=nudges)

    def position(self, gang: str) -> str:
        """Where ``gang`` stands in the queue, in words, for filter's message."""
        if not self.cache.synced:
            return "the extender's informers have not listed the cluster yet"
        if gang not in self.waiting:
            return "not in the queue yet"
        r = self.holds.queue_reservations.get(gang)
        if r is not None:
            return f"next in the queue, nodes reserved, expected start {utc(r.start_s)}"
        at, of = self.waiting.index(gang) + 1, len(self.waiting)
        return f"waits in the queue at position {at} of {of}"

    def metrics_text(self) -> bytes:
        """The queue's metrics in the Prometheus text format."""
        held = self.holds.queue_reservations
        nodes = {n for r in held.values() for n in r.claims}
        return render_metrics(
            self.metrics,
            reservations=len(held),
            reserved_gpus=sum(sum(r.claims.values()) for r in held.values()),
            reserved_nodes=len(nodes),
            waiting_gangs=len(self.waiting),
            never_fitting_gangs=len(self._never_fit),
        )
