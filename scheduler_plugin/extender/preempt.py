"""Preemption: kube-scheduler's ``preempt`` verb, the queue's preemptions of whole gangs, and evictions of
work past its declared time limit. Pure: evictions come back as values (``outbox.Eviction``).

A gang of higher priority that has waited ``QueueConfig.preempt_after_s`` evicts whole lower-priority
gangs inside one domain (the queue decides it, ``Preempt.run`` asks for the evictions). Victims are the
work ``queueing.never_victim`` does not protect, in the namespaces preemption may take from, whose
evictions keep within their PodDisruptionBudgets (each alone and all together) and that the API did not
refuse to evict a moment ago (``BLOCKED_RETRY_S``). ``QueueConfig.max_evictions`` counts the times a gang
was evicted, under its name and the uid of what made it. Work past its declared limit plus the grace is
evicted where the extender enforces declared limits (``enforce_limits``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from scheduler_plugin.cluster import GPU, pod_requests
from scheduler_plugin.extender.cache import SOLO, Cache, uid_of
from scheduler_plugin.extender.holds import Holds
from scheduler_plugin.extender.inputs import QueueInputs
from scheduler_plugin.extender.outbox import Eviction, Outbox
from scheduler_plugin.gangs import gang_key_of
from scheduler_plugin.queue import TIME_LIMIT, Preemption, QueueConfig, Running, Waiting
from scheduler_plugin.queueing import (
    QueueMetrics,
    VictimSet,
    budgets_from,
    never_victim,
    over_budget,
    owner_uid,
    preempt_answer,
)

EVICTION_RETRY_S = 10.0  # an eviction asked for is not asked again before this
EVICTION_MEMORY = 10_000  # gangs whose evictions are remembered (max_evictions)
BLOCKED_RETRY_S = 60.0  # victims whose evictions the API would refuse are no victims for this long


class Preempt:
    """The preempt verb (``state.preempt(pod, victims, now)``) and what preemption remembers: the
    evictions asked for, the victims sitting out, each preemptor's victims, the gangs evicted before."""

    def __init__(
        self,
        cache: Cache,
        holds: Holds,
        inputs: QueueInputs,
        outbox: Outbox,
        *,
        config: QueueConfig,
        metrics: QueueMetrics,
    ) -> None:
        self.cache = cache
        self.holds = holds
        self.inputs = inputs
        self.outbox = outbox
        self.config = config
        self.metrics = metrics
        # the namespaces preemption may take from (None: every one)
        self.namespaces = config.preempt_namespaces
        self.blocked: dict[
            str, float
        ] = {}  # victims the API would refuse to evict -> until when they sit out
        self.evicting: dict[str, float] = {}  # pod key -> when its eviction was asked for
        self.overrun: set[str] = set()  # pods asked to go for running past their declared limit
        self.preempting: dict[str, tuple[str, ...]] = {}  # gang -> the victims it last evicts
        # gang -> times this extender evicted it (QueueConfig.max_evictions) and when the evicted run
        # started; the gang outlives its pods, which their controller makes again, so it is keyed by its
        # name and the uid of what made it (None: no controller; ``victims``); in memory only, the
        # newest EVICTION_MEMORY gangs
        self.evicted_times: dict[tuple[str, str | None], tuple[int, float]] = {}

    def __call__(
        self, pod: Mapping[str, Any], victims: Mapping[str, VictimSet], now: float
    ) -> dict[str, Any]:
        """kube-scheduler's ``preempt`` verb: the victim sets it proposes, kept only where they take whole
        gangs (``queueing.preempt_answer``). A pod of a gang gets none (the queue preempts for gangs,
        whole gangs inside one domain), nor a pod the informer does not know; a pod on its own loses
        the nodes it could not use anyway because they are reserved for a gang starting before it ends."""
        known, _ = self.cache.known_pod(pod)
        if known is None or gang_key_of(known) is not None or not victims:
            return {}
        gang_of_uid: dict[str, str | None] = {}
        members: dict[str, list[str]] = {}
        for name, keys in self.cache.running_members.items():  # the pods holding resources
            for k in sorted(keys):
                p = self.cache.pods[k]
                uid = uid_of(p)
                if not uid or never_victim(p, self.namespaces) is not None:
                    continue  # its GPUs do not free, or it is not preemption's to take: unknown here
                group = None if self.cache.info[k].gang is None and name.startswith(SOLO) else name
                gang_of_uid[uid] = group
                if group is not None:
                    members.setdefault(group, []).append(uid)
        need = pod_requests(known).get(GPU, 0)
        caps = self.inputs.caps(known, now) if need else {}
        refused = [n for n, cap in caps.items() if cap < need]
        return preempt_answer(victims, gang_of_uid=gang_of_uid, gang_members=members, refused_nodes=refused)

    def run(
        self,
        preemptions: Sequence[Preemption],
        *,
        waiting: Sequence[Waiting],
        running: Mapping[str, Running],
        identity: Mapping[str, tuple[str, str | None]],
        pending: Mapping[str, list[str]],
        now: float,
    ) -> None:
        """A pass's preemptions: Events on the preemptor's pods, evictions of every victim's pods."""
        by_gang = self.cache.running_members
        pods = self.cache.pods
        self.preempting = {g: v for g, v in self.preempting.items() if g in pending}
        for pre in preemptions:
            # the victims are still going (fewer of them as their pods leave): the same preemption
            again = set(pre.victims) <= set(self.preempting.get(pre.gang, ()))
            if not again and self._over_budget(pre, pending, now):
                continue
            if not again:
                self.preempting[pre.gang] = pre.victims
                self.metrics.preemptions += 1
                for victim in pre.victims:  # max_evictions counts these when the gang runs again
                    ident = identity.get(victim, (victim, None))
                    times, _ = self.evicted_times.pop(ident, (0, 0.0))
                    gone = running.get(victim)
                    self.evicted_times[ident] = (times + 1, gone.started_s if gone else math.nan)
                while len(self.evicted_times) > EVICTION_MEMORY:  # the gangs evicted longest ago go
                    del self.evicted_times[next(iter(self.evicted_times))]
            msg = (
                f"gang {pre.gang} (priority {next((w.priority for w in waiting if w.name == pre.gang), 0)}) "
                f"preempts whole gang(s) {', '.join(pre.victims)} in {pre.tier} domain {pre.domain} "
                f"({pre.lost_gpu_s / 3600:.2f} GPU-hours of work lost)"
            )
            for k in pending.get(pre.gang, ()) if not again else ():
                self.outbox.say(pods[k], "GangPreempting", msg)
            for victim in pre.victims:
                for k in sorted(by_gang.get(victim, ())):
                    if not self._ask_eviction(k, pods[k], now):
                        continue
                    self.outbox.evictions.append(
                        Eviction(
                            pod=pods[k], victim=victim, message=msg, preemptor=pre.gang, check_first=not again
                        )
                    )

    def victims(
        self, now: float, candidates: Collection[str]
    ) -> tuple[dict[str, tuple[str, str | None]], set[str]]:
        """The identity evictions of running work (the queue's name, ``cache.running_name``) are counted
        under (``max_evictions``: its name and the uid of what made it, so a new job under an old name
        starts from none), for the names evictions were counted for and the ``candidates``; and, of
        ``candidates``, the ones that may not be victims (a pod ``queueing.never_victim`` names, a
        disruption budget it alone would break, or a refusal of the API not long ago). A count kept for a
        gang no controller owns is forgotten once all its pods are gone: nothing makes them again, a gang
        of that name later is another job."""
        by_gang = self.cache.running_members
        pods = self.cache.pods
        identity: dict[str, tuple[str, str | None]] = {}
        for name in {n for n, _ in self.evicted_times} | set(candidates):
            keys = by_gang.get(name)
            if keys:
                owners = [u for u in (owner_uid(pods[k]) for k in sorted(keys)) if u is not None]
                identity[name] = (name, min(owners) if owners else None)
        for ident in [i for i in self.evicted_times if i[1] is None and i[0] not in self.cache.named]:
            del self.evicted_times[ident]
        self.blocked = {v: until for v, until in self.blocked.items() if until > now and v in by_gang}
        exempt: set[str] = set()
        if not candidates or self.config.preempt_after_s is None:
            return identity, exempt
        budgets = budgets_from(self.cache.pdbs.values())
        for name in candidates:
            ordered = sorted(by_gang.get(name, ()))
            if (
                name in self.blocked
                or any(never_victim(pods[k], self.namespaces) for k in ordered)
                or (budgets and over_budget(self._leaving_not(ordered), budgets))
            ):
                exempt.add(name)
        return identity, exempt

    def _ask_eviction(self, key: str, pod: Mapping[str, Any], now: float) -> bool:
        """Whether to ask for ``pod``'s eviction now (and it is noted as asked): not while an ask of the
        last ``EVICTION_RETRY_S`` is pending, nor for a pod already being deleted."""
        asked = self.evicting.get(key)
        if asked is not None and now - asked < EVICTION_RETRY_S:
            return False
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            return False
        self.evicting[key] = now
        return True

    def _leaving_not(self, keys: Iterable[str]) -> list[Mapping[str, Any]]:
        """The pods of ``keys`` an eviction still has to take (not already being deleted)."""
        pods = self.cache.pods
        return [
            pods[k]
            for k in keys
            if k in pods and not (pods[k].get("metadata") or {}).get("deletionTimestamp")
        ]

    def _over_budget(self, pre: Preemption, pending: Mapping[str, list[str]], now: float) -> bool:
        """Whether evicting all of ``pre``'s victims together would break a disruption budget (each alone
        keeps within its budgets, together they may not): then nothing is evicted, the preemptor's pods
        say which budget, its hold goes, and the victims sit out ``BLOCKED_RETRY_S``."""
        budgets = budgets_from(self.cache.pdbs.values()) if self.cache.pdbs else {}
        if not budgets:
            return False
        by_gang = self.cache.running_members
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
            self.outbox.say(self.cache.pods[k], "PreemptionBlocked", msg)
        self.holds.queue_reservations.pop(pre.gang, None)
        for v in pre.victims:
            self.blocked[v] = now + BLOCKED_RETRY_S
        self.cache.dirty = True  # the next pass seeks other victims
        self.cache.version += 1
        return True

    def blocked_by_api(self, preemptor: str, victims: Sequence[str], now: float, why: str = "") -> None:
        """The API refused a dry run of one of ``preemptor``'s evictions (``why``), so none was made: its
        victims sit out ``BLOCKED_RETRY_S``, the next pass seeks others (the preemption is not going on)
        and the preemptor's waiting pods say so."""
        msg = (
            f"gang {preemptor} does not preempt {', '.join(victims)}: {why}; nothing evicted, other victims "
            f"are sought (these sit out {BLOCKED_RETRY_S:.0f} s)"
        )
        pods = self.cache.pods
        for k in sorted(self.cache.gang_pending):
            found = gang_key_of(pods[k]) if k in pods else None
            if found is not None and found[1] == preemptor:
                self.outbox.say(pods[k], "PreemptionBlocked", msg)
        for v in victims:
            self.blocked[v] = now + BLOCKED_RETRY_S
        if self.preempting.pop(preemptor, None) is not None:
            self.holds.queue_reservations.pop(preemptor, None)
        self.cache.dirty = True
        self.cache.version += 1

    def retry_at(self) -> float:
        """When the first victim sitting out may be one again (the queue passes then)."""
        return min(self.blocked.values(), default=math.inf)

    def enforce_limits(
        self,
        declared: Mapping[str, tuple[float, float]],
        keys_of: Mapping[str, Sequence[str]],
        now: float,
    ) -> float:
        """Evict whole the running work (``keys_of``: its pods) past its declared limit plus the grace,
        where the extender enforces it: on nodes held for a waiting gang (``held``), or everywhere
        (``all``). Returns when the next such eviction is due (``math.inf``: none)."""
        mode, grace = self.inputs.enforce_time_limits, self.inputs.time_limit_grace_s
        if mode == "off" or not declared:
            return math.inf
        held: dict[str, str] = {}
        for gang, r in sorted(self.holds.queue_reservations.items(), reverse=True):
            held.update(dict.fromkeys(r.claims, gang))
        wake = math.inf
        names: Collection[str] = declared.keys()
        pods, info = self.cache.pods, self.cache.info
        if mode == "held":  # only the work on held nodes: found by node, not all
            names = {info[k].running for n in held for k in self.cache.node_pods.get(n, ())} & set(names)
        for name in sorted(names):
            started, limit = declared[name]
            keys = keys_of.get(name, [])
            nodes = sorted({str((pods[k].get("spec") or {}).get("nodeName")) for k in keys})
            on = next((n for n in nodes if n in held), None)
            if mode == "held" and on is None:
                continue  # not where a waiting gang needs it: its limit holds nobody back
            due = started + limit + grace
            if now < due:
                wake = min(wake, due)
                continue
            what = f"gang {name}" if not name.startswith(SOLO) else f"pod {name[len(SOLO) :]}"
            where = (
                f"on node {on}, held for gang {held[on]}"
                if on is not None
                else "and declared limits are enforced everywhere (--enforce-time-limits=all)"
            )
            msg = (
                f"{what} ran {now - started:.0f}s, past its declared time limit of {limit:g}s plus a grace "
                f"of {grace:g}s, {where}; evicted ({TIME_LIMIT} counts only where the extender enforces it)"
            )
            for k in keys:
                if not self._ask_eviction(k, pods[k], now):
                    continue
                self.overrun.add(k)
                self.outbox.evictions.append(
                    Eviction(pod=pods[k], victim=name, message=msg, reason="TimeLimitExceeded")
                )
        return wake

    def evictions_before(self, gang: tuple[str, str | None], started_s: float) -> int:
        """Times ``gang`` was evicted before this run of it; a run still leaving after its eviction is
        not counted against itself (the same preemption goes on, no other victims are sought)."""
        times, evicted_run = self.evicted_times.get(gang, (0, math.nan))
        return times - 1 if times and started_s == evicted_run else times

    def eviction_refused(self, key: str) -> None:
        """The API refused to evict ``key`` (a PodDisruptionBudget): counted; asked again later."""
        self.metrics.evictions_refused += 1

    def eviction_done(self, key: str) -> None:
        if key in self.overrun:  # past its declared time limit, not a preemption
            self.overrun.discard(key)
            self.metrics.time_limit_evictions += 1
            return
        self.metrics.evictions += 1

    def forget(self, key: str) -> None:
        """Let go of a pod that is gone (one made again under its name is evicted afresh)."""
        self.evicting.pop(key, None)
        self.overrun.discard(key)
