"""The filter verb: which of kube-scheduler's candidate nodes a pod may go to. Pure.

A pod on its own passes wherever the GPUs not held for a gang cover its request, and, on nodes the
queue holds for a waiting gang, only if its time limit ends before that gang's start (the backfill
rule, ``QueueInputs.caps``): the hot path of the extender, answered from verdicts kept per requested
GPU count and brought up to date node by node (``Cache.usage_log``).

A pod of a gang: a gang the queue started has a plan and each of its pods passes on its planned node
only; one that waits is refused everywhere with why it waits and where it stands in the queue. While
the extender's queue loop runs (``QueueDriver.loop``), filter never runs a pass nor plans: a gang new
to the queue is refused with that said and wakes the loop (``FilterOutcome.wake_queue``), whose pass
starts it and nudges its refused pods back to kube-scheduler. Without a loop (the pure state driven
by hand), the first of its pods to reach filter runs the queue (``QueueDriver.due``). A planned node
missing from the candidates is ruled out only once it stays missing for ``EXCLUDE_CONFIRM_S``
(kube-scheduler's cache lags the API's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from scheduler_plugin.cluster import pod_key
from scheduler_plugin.extender.bind import SUBGROUP_SIZE_CHOSEN
from scheduler_plugin.extender.cache import Cache, gpus_of, uid_of
from scheduler_plugin.extender.holds import Holds, StartedPlan
from scheduler_plugin.extender.inputs import QueueInputs, per_role_selectors
from scheduler_plugin.extender.outbox import EventRecord, Outbox
from scheduler_plugin.extender.queue_driver import QueueDriver
from scheduler_plugin.gangs import GangError, GangIncompleteError, GangSpec, gang_key_of
from scheduler_plugin.planner import plan
from scheduler_plugin.queue import RESERVED_FOR
from scheduler_plugin.snapshot import Infeasible

FIT_MEMORY = 16  # requested GPU counts whose fitting nodes filter keeps per usage state
# a planned node missing from kube-scheduler's candidates this long is ruled out (before: its cache may lag)
EXCLUDE_CONFIRM_S = 5.0


@dataclass
class FilterOutcome:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    error: str = ""
    events: list[EventRecord] = field(default_factory=list)
    unseen: bool = False  # the informer does not have this pod (or its uid) yet: worth asking again
    wake_queue: bool = False  # a gang the queue loop has not seen: its pass should come at once


class Filter:
    """The filter verb (``state.filter(pod, node_names, now)``) and what it keeps: the nodes a pod
    of each requested GPU count does not fit on, its last answer per count, why each waiting gang waits
    (planned at most once a pass)."""

    def __init__(
        self, cache: Cache, holds: Holds, inputs: QueueInputs, queue: QueueDriver, outbox: Outbox
    ) -> None:
        self.cache = cache
        self.holds = holds
        self.inputs = inputs
        self.queue = queue
        self.outbox = outbox
        # per requested count: the nodes it does not fit on, with the usage log's epoch and position and
        # the holds they are up to date with; the last answer per count
        self._fit: dict[int, tuple[dict[str, str], int, int, dict[str, int]]] = {}
        self._fit_answers: dict[int, tuple[Any, ...]] = {}
        # gang -> (its spec and the plan inputs' generation it was planned on, why), for this pass only
        self._gang_reason: dict[str, tuple[GangSpec, int, str]] = {}
        self._reason_pass = -1

    def __call__(self, pod: Mapping[str, Any], node_names: Sequence[str], now: float) -> FilterOutcome:
        """``now``: the state's clock (seconds since the epoch, ``ExtenderState``)."""
        self.holds.expire(now)
        out = FilterOutcome()
        known, why = self.cache.known_pod(pod)
        if known is None:  # no decision and no state for a pod the informer cannot vouch for
            out.unresolvable = dict.fromkeys(node_names, why)
            pods = self.cache.pods
            out.unseen = pod_key(pod) not in pods or uid_of(pods[pod_key(pod)]) != uid_of(pod)
            return out
        pod = known  # decide on the cluster's copy, not the request's
        key = pod_key(pod)
        found = gang_key_of(pod)
        if found is None:
            need = gpus_of(self.cache.info[key])
            held = self.holds.held_gpus()
            caps = self.inputs.caps(pod, now) if need else {}
            passed = self._alone(need, held, caps, node_names, out)
            if passed:  # the decision bind asks for
                self.holds.filtered[key] = (uid_of(pod), now + self.holds.ttl_s)
            return out
        refused = self.outbox.refused
        refused.pop(key, None)  # this very call is kube-scheduler trying it
        out = self._gang(pod, key, found[1], node_names, now=now, out=out)
        if out.passed:
            refused.pop(key, None)
        else:  # kube-scheduler keeps it among its unschedulable pods: nudged when its gang starts
            refused[key] = found[1]
        return out

    def may_take_long(self, pod: Mapping[str, Any]) -> bool:
        """Whether filtering this pod may take long: a gang pod the informer knows whose gang has no
        started plan holding a place for it. Without a queue loop its filter may plan the gang (seconds,
        for a large one); with one it plans nothing but may work out the gang afresh from its pods and
        say why it waits, which at 9,216 trays cost the other verbs' p99 5x when done on the event loop
        (``bench extender``). Otherwise filter costs one pass over the candidate nodes."""
        known, _ = self.cache.known_pod(pod)
        found = gang_key_of(known) if known is not None else None
        if found is None:
            return False
        res = self.holds.started.get(found[1])
        return res is None or pod_key(pod) not in res.spec.members

    def _alone(
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
            and kept[1] == len(self.cache.usage_log)
            and kept[2] == held
            and kept[3] == caps
            and kept[4] == node_names
        ):
            out.passed.extend(kept[5])
            out.failed.update(kept[6])
            return out.passed
        nodes, passed, failed = self.cache.nodes, out.passed, out.failed
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
            len(self.cache.usage_log),
            dict(held),
            dict(caps),
            list(node_names),
            list(passed),
            dict(failed),
        )
        return passed

    def _gang(
        self,
        pod: Mapping[str, Any],
        key: str,
        gang_name: str,
        node_names: Sequence[str],
        *,
        now: float,
        out: FilterOutcome,
    ) -> FilterOutcome:
        res = self.holds.started.get(gang_name)
        spec: GangSpec | None = None
        if res is None or key not in res.spec.members:
            found = self.cache.info[key].gang
            assert found is not None
            got = self.cache.spec(found)  # kept per gang until its pods or its source change
            if isinstance(got, GangIncompleteError):  # more pods to come: not a placement failure yet
                msg = f"waiting for the rest of the gang: {got}"
                out.failed = dict.fromkeys(node_names, msg)
                out.events += self.outbox.once(pod, "GangIncomplete", msg, warning=False)
                return out
            if isinstance(got, GangError):
                msg = f"invalid gang: {got}"
                out.unresolvable = dict.fromkeys(node_names, msg)
                out.events += self.outbox.once(pod, "InvalidGang", msg)
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
            self.holds.give_up(gang_name)
            if self.queue.due(gang_name, now, spec):
                if self.queue.loop:  # the loop's pass decides; its pods are nudged if it starts the gang
                    out.wake_queue = True
                else:
                    self.queue.run_pass(now)
            out.events += self.outbox.events
            self.outbox.events = []
            if out.wake_queue:
                msg = f"gang {gang_name} is new to the queue: the queue loop's next pass decides"
                out.failed = dict.fromkeys(node_names, msg)
                out.events += self.outbox.once(pod, "GangQueued", msg, warning=False)
                return out
            started = self.holds.started.get(gang_name)
            if started is None or key not in started.spec.members:
                repair = self.inputs.repair_notes.get(gang_name)
                reason = self._why_waits(spec, now) + (repair or "")
                msg = f"gang {gang_name} does not fit: {reason}; {self.queue.position(gang_name)}"
                out.failed = dict.fromkeys(node_names, msg)
                # a running gang's replacement waiting for its domain has a reason of its own
                out.events += self.outbox.once(
                    pod, "GangRepairWaiting" if repair else "GangUnschedulable", msg
                )
                return out
            res = started
        if not res.announced:  # on the first pod filtered, whichever pass started the gang
            res.announced = True
            out.events += self._announce(pod, gang_name, res)
        return self._on_plan(pod, key, gang_name, res, node_names, now=now, out=out)

    def _announce(self, pod: Mapping[str, Any], gang_name: str, res: StartedPlan) -> list[EventRecord]:
        """The Events of a started gang, on its first pod filtered: its plan, and each subgroup size the
        planner chose."""
        events = self.outbox.once(
            pod,
            "GangPlanned",
            f"gang {gang_name}: {len(res.nodes)} pod(s) planned on {len(res.hold.claims)} node(s)",
            warning=False,
        )
        for role, size in sorted(res.subgroup_sizes.items()):
            events.append(
                EventRecord(
                    pod=pod,
                    reason="SubgroupSizeChosen",
                    message=f"gang {gang_name}: role {role} runs in subgroups of {size} pod(s), "
                    "the largest that divides its pods and that every chosen domain holds on its "
                    f"ready trays; {SUBGROUP_SIZE_CHOSEN}={size} is written on its pods as they bind",
                    warning=False,
                )
            )
        return events

    def _on_plan(
        self,
        pod: Mapping[str, Any],
        key: str,
        gang_name: str,
        res: StartedPlan,
        node_names: Sequence[str],
        *,
        now: float,
        out: FilterOutcome,
    ) -> FilterOutcome:
        """A started gang's pod: its planned node passes, if among the candidates."""
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
            out.events += self.outbox.once(pod, "GangNodeFiltered", msg)
            if not res.arrived:
                self.holds.excluded.setdefault(gang_name, set()).add(node)
                self.cache.inputs_gen += 1
                self.holds.give_up(gang_name)
            return out
        res.missed.pop(node, None)
        if now + self.holds.ttl_s > res.hold.expires_s:  # a pod came: the hold lasts ``ttl_s`` from now
            res.hold = dataclasses.replace(res.hold, expires_s=now + self.holds.ttl_s)
        out.passed.extend(repeat(node, node_names.count(node)))
        out.failed.update(dict.fromkeys(node_names, f"gang {gang_name} planned this pod on {node}"))
        del out.failed[node]
        return out

    def _fits(self, need: int, held: Mapping[str, int]) -> dict[str, str]:
        """The nodes a pod of ``need`` GPUs does not fit on, and why (free GPUs, or held for a gang):
        kept per requested count (a few; tenants choose them) and brought up to date for the nodes whose
        usage or holds changed since (``Cache.usage_log``), not worked out again for every node."""
        log, epoch = self.cache.usage_log, self.cache.usage_epoch
        cached = self._fit.get(need)
        if cached is not None and cached[1] != epoch:  # the log started afresh: so do the verdicts
            self._fit, cached = {}, None
        if cached is None:
            found = {n: why for n in self.cache.nodes if (why := self._verdict(n, need, held)) is not None}
        else:
            found, _, seen, was_held = cached
            for n in {*log[seen:], *(n for n in {*held, *was_held} if held.get(n) != was_held.get(n))}:
                why = self._verdict(n, need, held) if n in self.cache.nodes else None
                if why is None:
                    found.pop(n, None)
                else:
                    found[n] = why
        if cached is None and len(self._fit) >= FIT_MEMORY:
            self._fit.clear()
        self._fit[need] = (found, epoch, len(log), dict(held))
        return found

    def _verdict(self, n: str, need: int, held: Mapping[str, int]) -> str | None:
        unheld = self.cache.free_gpus(n, {})
        free = self.cache.free_gpus(n, held)
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
        skipped = self.inputs.skipped_as(spec.key, spec)
        if skipped is not None:
            return skipped
        said = self.queue.reasons.get(spec.key)
        if said is not None:
            return said
        if self.queue.loop:  # filter never plans while the loop runs: its next pass says
            return "the queue has not decided on it yet (the queue loop's next pass does)"
        passes = self.queue.metrics.passes
        if passes != self._reason_pass:  # what earlier passes planned holds no more
            self._gang_reason, self._reason_pass = {}, passes
        known = self._gang_reason.get(spec.key)
        if known is not None and known[0] == spec and known[1] == self.cache.inputs_gen:
            return known[2]
        planned = self._plan_gang(spec, now)
        reason = (
            planned
            if isinstance(planned, str)
            else "the capacity it fits on is held for gangs before it in the queue"
        )
        self._gang_reason[spec.key] = (spec, self.cache.inputs_gen, reason)
        return reason

    def _plan_gang(self, spec: GangSpec, now: float) -> StartedPlan | str:
        inputs = self.inputs.gang_inputs(spec)
        if isinstance(inputs, str):
            return inputs
        gang, members, allowed, by_role = inputs
        snapshot = self.cache.snapshot()
        if len(allowed) < len(snapshot.nodes):
            snapshot = dataclasses.replace(
                snapshot, nodes=tuple(n for n in snapshot.nodes if n.name in allowed)
            )
        planned_gang = gang
        if len({tuple(sorted(sel.items())) for sel in by_role.values()}) > 1:
            snapshot, planned_gang = per_role_selectors(snapshot, gang, by_role, self.cache.nodes)
        result = plan(snapshot, planned_gang, cache=self.cache.plans)
        if isinstance(result, Infeasible):
            return result.reason
        res = self.holds.plan_from(spec, gang, members, result.placement, now)
        res.subgroup_sizes = dict(result.subgroup_sizes)
        return res

    def _elsewhere(self, node: str, node_names: Sequence[str]) -> bool:
        """Whether no candidate shares the planned node's tier-1 domain: the call covers another part
        of the cluster, so the node's absence says nothing about the node."""
        of = self.cache.domains().of
        domain = of.get(node)
        if domain is None:
            return False
        return all(of.get(n) != domain for n in node_names)
