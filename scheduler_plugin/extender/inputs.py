"""The queue's inputs, worked out from the cache's indexes: what a gang's plan needs (``gang_inputs``:
its unbound part, the nodes its pods may use, each role's nodeSelector, its mode and repair), the waiting
gangs' queue entries (``waiting``), the running work (``running_work``, kept from pass to pass and worked
out again only for the names an event touched), the pods' times and time limits, the planner as the
queue calls it (``place``) and the backfill caps of a pod on its own (``caps``). Pure.

Time limits: a declared one (``gpuagent.dev/time-limit``) counts only where the extender enforces it
(``enforce_time_limits``: on nodes held for a waiting gang, everywhere, or nowhere), with the grace the
extender gives before it evicts. Repairs (``extender.repair``): a running gang's replacement pods wait
for a tray in the domain the rest of their subgroup runs in, at most ``repair_wait_s`` where
``gpuagent.dev/repair: any`` lets them go to another domain then.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

from scheduler_plugin.cluster import GPU, fabric_attached, pod_key
from scheduler_plugin.extender.cache import Cache, gpus_of, labels_of, matches
from scheduler_plugin.extender.holds import Holds
from scheduler_plugin.extender.outbox import Outbox
from scheduler_plugin.extender.policy import ANN_REPAIR, gang_policy, resolve_mnnvl
from scheduler_plugin.extender.repair import unbound_part
from scheduler_plugin.gangs import GangError, GangSpec
from scheduler_plugin.planner import SnapshotCache, plan
from scheduler_plugin.queue import PodFacts, QueueConfig, Running, Waiting
from scheduler_plugin.queueing import Limits, held_back_caps, pod_priority, timestamp
from scheduler_plugin.snapshot import (
    MAX_GANG_PODS,
    ClusterSnapshot,
    Gang,
    Infeasible,
    NodeState,
    PlanResult,
    PodSlot,
)

# which declared time limits the extender enforces (evicts past the limit plus a grace): those of work on
# nodes held for a waiting gang (``held``: what backfilled there, and what the hold waits for), all, none

# a gang's plan inputs: its spec, the gang left to place, its pods' places, the nodes its pods may use,
# each role's nodeSelector
Prepared = tuple[GangSpec, Gang, dict[str, PodSlot], frozenset[str], dict[str, dict[str, str]]]
# the same without the spec (``gang_inputs``), or why the gang cannot be planned
Inputs = tuple[Gang, dict[str, PodSlot], frozenset[str], dict[str, dict[str, str]]]


class QueueInputs:
    """The queue's inputs (module docstring), and what is kept of them from pass to pass."""

    def __init__(
        self,
        cache: Cache,
        holds: Holds,
        outbox: Outbox,
        config: QueueConfig,
    ) -> None:
        self.cache = cache
        self.holds = holds
        self.outbox = outbox
        # declared limits (``queueing.Limits``) count, plus the grace, only where they are enforced
        self.enforce_time_limits = config.enforce_time_limits
        self.time_limit_grace_s = config.time_limit_grace_s
        self.repair_wait_s = config.repair_wait_s
        self.passed_at = -math.inf  # when the queue last passed
        # repairs: gang -> when its replacement pods were first seen waiting for a tray in their subgroup's
        # domain, the gangs whose wait is over, what their pods' filter says about it,
        # and ``StartedPlan.kept_sizes`` for it
        self.repair_since: dict[str, float] = {}
        self.repair_over: set[str] = set()
        self.repair_notes: dict[str, str] = {}
        self.repair_sizes: dict[str, dict[str, int]] = {}
        self.first_seen: dict[str, float] = {}  # pod key -> when first seen without a time
        # each waiting gang's queue entry (or why it has none), valid while its spec is the same object
        # and ``cache.inputs_gen`` unchanged
        self._waiting_cache: dict[str, tuple[object, int, object]] = {}
        # waiting gangs the last pass could not queue -> why, and the spec (or error) it judged
        self.skipped: dict[str, tuple[str, object]] = {}
        # each running work's ``Running``; the ones with a declared limit: (latest start, declared limit)
        # and their pods
        self._run_all: dict[str, Running] = {}
        self._declared_all: dict[str, tuple[float, float]] = {}
        self._keys_all: dict[str, list[str]] = {}
        self.last_running: dict[str, Running] = {}  # the running work as the last pass judged it

    # -- a gang's plan inputs ----------------------------------------------------------------------
    def gang_inputs(self, spec: GangSpec) -> Inputs | str:
        """What a plan of ``spec`` needs: the gang left to place (its unbound part), its pods' places,
        the nodes its pods may go to (nodeSelector, tolerations, not ruled out by kube-scheduler) and
        each role's nodeSelector; or why it cannot be planned."""
        pods = self.cache.pods
        try:
            policy = gang_policy(spec.key, [pods[k] for k in sorted(spec.members) if k in pods])
        except GangError as exc:
            return str(exc)
        index = self.cache.domains()
        over = spec.key in self.repair_over and policy.repair == "any"
        unbound = unbound_part(spec, pods, index.domains, index.tiers, unpin=over)
        gang, members = unbound.gang, unbound.members
        if gang is None:
            return "every pod of the gang is already bound"
        self._note_repair(spec.key, unbound.pinned, policy.repair, over)
        if unbound.sizes:
            self.repair_sizes[spec.key] = dict(unbound.sizes)
        else:
            self.repair_sizes.pop(spec.key, None)
        by_role: dict[str, dict[str, str]] = {}  # each role's nodeSelector (its pods' together)
        for k, slot in sorted(spec.members.items()):
            selector = by_role.setdefault(slot.role, {})
            for label, value in (((pods.get(k) or {}).get("spec") or {}).get("nodeSelector") or {}).items():
                if selector.setdefault(label, value) != value:
                    return (
                        f"the pods of role {slot.role} disagree on nodeSelector {label} "
                        f"({selector[label]!r}, {value!r})"
                    )
        selectors = {tuple(sorted(sel.items())) for sel in by_role.values()}
        mates = [pods[k] for k in sorted(spec.members) if k in pods]
        allowed = self.cache.admitted(selectors, mates)
        excluded = self.holds.excluded.get(spec.key)
        if excluded:
            allowed = allowed - excluded
        if not allowed:
            shown = " or ".join(str(dict(sel)) for sel in sorted(selectors)) or "{}"
            return f"no node matches the gang's nodeSelector {shown} and tolerations"
        nodes = self.cache.nodes
        mode = resolve_mnnvl(
            policy,
            spec.gang,
            index.tiers,
            fabric_attached=lambda: any(
                fabric_attached(labels_of(nodes[n]) or {}) for n in allowed if n in nodes
            ),
        )
        if mode != gang.mnnvl:
            gang = dataclasses.replace(gang, mnnvl=mode)
        return gang, members, allowed, by_role

    def _note_repair(
        self, gang: str, pinned: Mapping[str, tuple[str, int, str]], repair: str, over: bool
    ) -> None:
        """Keep when ``gang``'s replacement pods began to wait for their subgroups' domains, and what
        their filter says about it (``repair_notes``)."""
        if not pinned and not over:
            self.repair_since.pop(gang, None)
            self.repair_notes.pop(gang, None)
            return
        if gang not in self.repair_since and math.isfinite(self.passed_at):  # once the queue passed
            self.repair_since[gang] = self.passed_at
        wait = f"{self.repair_wait_s:g}s"
        if over:
            self.repair_notes[gang] = (
                f"; repair: no ready tray freed in the replacement's own NVLink domain within {wait}, and "
                f"{ANN_REPAIR}=any lets it go to another domain"
            )
            return
        where = ", ".join(f"role {r} subgroup {b} in {d}" for r, b, d in sorted(pinned.values()))
        then = (
            f"after {wait} of waiting ({ANN_REPAIR}=any) it may go to another domain"
            if repair == "any"
            else f"{ANN_REPAIR}=same-domain: it keeps waiting there"
            + (" (its wait is over)" if gang in self.repair_over else "")
        )
        self.repair_notes[gang] = (
            f"; repair: the replacement waits for a free ready tray of its subgroup's NVLink domain "
            f"({where}), where the rest of the gang keeps running; no other pod of the gang moves; {then}"
        )

    def repair_waits_over(self, now: float) -> None:
        """Repairs whose wait ended by ``now``: their gangs are planned again (unpinned where their
        ``gpuagent.dev/repair`` allows)."""
        for gang, since in self.repair_since.items():
            if gang not in self.repair_over and now - since >= self.repair_wait_s:
                self.repair_over.add(gang)
                self.cache.inputs_gen += 1

    def repair_wake(self) -> float:
        """When the next repair wait ends (the queue passes then)."""
        return min(
            (t + self.repair_wait_s for g, t in self.repair_since.items() if g not in self.repair_over),
            default=math.inf,
        )

    def keep_repairs(self, pending: Collection[str]) -> None:
        """Only the repairs of gangs still waiting are remembered."""
        self.repair_since = {g: t for g, t in self.repair_since.items() if g in pending}
        self.repair_over &= set(self.repair_since)
        self.repair_notes = {g: v for g, v in self.repair_notes.items() if g in pending}
        self.repair_sizes = {g: v for g, v in self.repair_sizes.items() if g in pending}

    # -- times and limits --------------------------------------------------------------------------
    def pod_time(self, pod: Mapping[str, Any], path: str, now: float) -> float:
        meta = pod.get("metadata") or {}
        t = timestamp(
            (pod.get("status") or {}).get("startTime") if path == "start" else meta.get("creationTimestamp")
        )
        if t is not None:
            return t
        return self.first_seen.setdefault(pod_key(pod), now)  # no time in the API object: first seen

    def limits(self, pod: Mapping[str, Any]) -> Limits:
        """The pod's time limits; the declared one only while the extender enforces declared limits
        (``enforce_time_limits``), whichever scheduler placed the pod: a pod declaring
        ``gpuagent.dev/time-limit`` agrees to be evicted past it where a waiting gang needs its node."""
        found = self.cache.declared_limits(pod)  # read once per change of the pod or of the Jobs
        if isinstance(found, str):  # said once on the pod; it counts as never ending
            self.outbox.say(pod, "InvalidTimeLimit", f"{found}; counted as no limit")
            return Limits()
        if self.enforce_time_limits == "off":
            return Limits(found.enforced, None)
        return found

    def limit(self, pod: Mapping[str, Any]) -> float | None:
        """The time limit the queue counts: the pod runs at most this long. A declared limit counts with
        the grace the extender gives before it evicts, since that is when the pod is gone at the latest
        (on a node held for a gang; the queue pass enforces it there, or everywhere)."""
        found = self.limits(pod)
        declared = found.declared + self.time_limit_grace_s if found.declared is not None else None
        if found.enforced is None:
            return declared
        return found.enforced if declared is None else min(found.enforced, declared)

    def caps(self, pod: Mapping[str, Any], now: float) -> dict[str, int]:
        """GPUs a pod on its own may use per reserved node (the queue's backfill rule)."""
        held = self.holds.head_holds()
        if not held:
            return {}
        limit = self.limit(pod)
        end = now + limit if limit is not None else math.inf
        alloc = {n: self.cache.allocatable(n) for r in held for n in r.claims}
        # only the running work on reserved nodes counts: found by node, not by reading all of it
        info, node_pods = self.cache.info, self.cache.node_pods
        names = {info[k].running for n in alloc for k in node_pods.get(n, ())}
        running = [self.last_running[name] for name in sorted(names) if name in self.last_running]
        return held_back_caps(held, running, alloc, end)

    # -- running and waiting work ------------------------------------------------------------------
    def running_work(
        self, now: float, waiting: Collection[str]
    ) -> tuple[dict[str, Running], Mapping[str, tuple[float, float]], Mapping[str, list[str]]]:
        """The running work by queue name, kept from pass to pass and worked out again only for the
        names an event touched (``cache.running_dirty``); the ones with a declared limit (name -> (latest
        start, least declared limit)) and their pods. A gang still ``waiting`` (part of it bound, after a
        restart mid-gang) is not running work."""
        for name in sorted(self.cache.running_dirty):
            members = self.cache.running_members.get(name)
            found = self._one_running(name, members, now) if members else None
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
        self.cache.running_dirty = set()
        running = dict(self._run_all)
        for name in waiting:
            running.pop(name, None)
        return running, self._declared_all, self._keys_all

    def _one_running(
        self, name: str, members: Collection[str], now: float
    ) -> tuple[Running, tuple[float, float] | None, list[str]] | None:
        """``Running`` of one name from its pods (as ``queue.rebuild`` counts it), its declared limit and
        the pods counted; pods on their own that hold no GPU are not (a node's DaemonSet pods: nothing to
        queue), None when no pod is left."""
        infos = [self.cache.info[k] for k in sorted(members)]
        infos = [i for i in infos if i.gang is not None or gpus_of(i) > 0]
        if not infos:
            return None
        claims: dict[str, int] = {}
        uses: dict[str, dict[str, int]] = {}
        starts: list[float] = []
        limits: list[float] = []
        began, least = -math.inf, math.inf
        for info in infos:
            pod = self.cache.pods[info.key]
            claims[info.node] = claims.get(info.node, 0) + gpus_of(info)
            rest = {k: v for k, v in info.requests.items() if k != GPU and v}
            if rest:
                acc = uses.setdefault(info.node, {})
                for k, v in rest.items():
                    acc[k] = acc.get(k, 0) + v
            start = self.pod_time(pod, "start", now)
            starts.append(start)
            limit = self.limit(pod)
            if limit is not None:
                limits.append(limit)
            lim = self.limits(pod).declared
            if lim is not None:
                began, least = max(began, start), min(least, lim)
        ends = max(starts) + min(limits) if limits else math.inf
        run = Running(name, min(i.priority for i in infos), min(starts), ends, claims, uses=uses)
        return run, ((began, least) if least < math.inf else None), [i.key for i in infos]

    def all_facts(self, now: float) -> list[PodFacts]:
        """Every running pod as ``queue.rebuild`` reads it (once, after a restart)."""
        facts: list[PodFacts] = []
        for members in self.cache.running_members.values():
            for key in sorted(members):
                info, pod = self.cache.info[key], self.cache.pods[key]
                if info.gang is None and gpus_of(info) <= 0:
                    continue
                facts.append(
                    PodFacts(
                        gang=info.running,
                        priority=info.priority,
                        created_s=self.pod_time(pod, "created", now),
                        limit_s=self.limit(pod),
                        node=info.node,
                        gpus=gpus_of(info),
                        started_s=self.pod_time(pod, "start", now),
                        resources={k: v for k, v in info.requests.items() if k != GPU and v},
                    )
                )
        return facts

    def waiting(
        self, pending: Mapping[str, list[str]], now: float
    ) -> tuple[dict[str, Prepared], list[Waiting]]:
        """The waiting gangs the queue orders, and what their plans need; a gang left out is remembered
        with the reason (``skipped``), so its filters do not ask for passes it would not be in."""
        prepared: dict[str, Prepared] = {}
        waiting: list[Waiting] = []
        self.skipped = {}
        self._waiting_cache = {n: v for n, v in self._waiting_cache.items() if n in pending}
        for name, keys in sorted(pending.items()):
            found = self.cache.info[keys[0]].gang
            assert found is not None
            spec = self.cache.spec(found)
            cached = self._waiting_cache.get(name)
            if cached is not None and cached[0] is spec and cached[1] == self.cache.inputs_gen:
                entry = cached[2]
            else:
                entry = self._waiting_entry(name, spec, now)
                self._waiting_cache[name] = (spec, self.cache.inputs_gen, entry)
            if isinstance(entry, str):
                self.skipped[name] = (entry, spec)
                continue
            assert isinstance(entry, tuple)
            prepared[name], one = entry
            waiting.append(one)
        return prepared, waiting

    def skipped_as(self, gang: str, spec: object) -> str | None:
        """Why the last pass left ``gang`` out, while ``spec`` (its gang as the cache has it now) is
        what that pass judged; None otherwise (not left out, or changed since: the next pass decides)."""
        skipped = self.skipped.get(gang)
        return skipped[0] if skipped is not None and skipped[1] is spec else None

    def _waiting_entry(
        self, name: str, spec: GangSpec | GangError | None, now: float
    ) -> tuple[Prepared, Waiting] | str:
        """One waiting gang's plan inputs and queue entry, or why the queue leaves it out."""
        if not isinstance(spec, GangSpec):  # incomplete or invalid: its pods' filter says why
            return str(spec) if spec is not None else "no gang"
        inputs = self.gang_inputs(spec)
        if isinstance(inputs, str):
            return inputs
        gang, members, allowed, by_role = inputs
        mates = [self.cache.pods[k] for k in sorted(spec.members) if k in self.cache.pods]
        limits = [lim for lim in (self.limit(p) for p in mates) if lim is not None]
        one = Waiting(
            name=name,
            gang=dataclasses.replace(gang, name=name),
            # the lowest: one pod of a higher class does not lift a gang of low ones into
            # preempting; the newest pod: a pod parked long ago does not move a new gang ahead
            priority=min(pod_priority(p) for p in mates),
            created_s=max(self.pod_time(p, "created", now) for p in mates),
            limit_s=min(limits) if limits else None,
        )
        return (spec, gang, members, allowed, by_role), one

    def place(
        self, prepared: Mapping[str, Prepared], cache: SnapshotCache, reasons: dict[str, str]
    ) -> Callable[[ClusterSnapshot, Gang], PlanResult]:
        """The planner as the queue calls it: each gang on the nodes its pods may use (others count as
        full), roles with different nodeSelectors each on their own nodes (their labels read now, so
        the planner may run outside the lock); why each gang did not fit goes to ``reasons``."""
        zeros: dict[str, NodeState] = {}
        selective = any(
            len({tuple(sorted(sel.items())) for sel in p[4].values()}) > 1 for p in prepared.values()
        )
        labelled = dict(self.cache.nodes) if selective else {}

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
                snapshot, gang = per_role_selectors(snapshot, gang, by_role, labelled)
            result = plan(snapshot, gang, cache=cache)
            if isinstance(result, Infeasible):  # why it waits, for its pods' filters
                reasons.setdefault(name, result.reason)  # the first: on the cluster as it is now
            return result

        return place

    def forget(self, key: str) -> None:
        """Let go of a pod that is gone."""
        self.first_seen.pop(key, None)


def per_role_selectors(
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
            res: (MAX_GANG_PODS if matches(nodes[n.name], dict(sel)) else 0) for sel, res in names.items()
        }
        states.append(
            dataclasses.replace(
                n,
                resources={**n.resources, **labelled},
                free_resources={**n.free_resources, **labelled},
            )
        )
    return dataclasses.replace(snapshot, nodes=tuple(states)), dataclasses.replace(gang, roles=tuple(roles))


__all__ = ["Prepared", "QueueInputs", "per_role_selectors"]
