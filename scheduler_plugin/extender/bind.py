"""The bind verb with the gang barrier. Pure: decisions come back as values (``BindDecision``).

A pod on its own binds only after this extender's filter passed it (``Holds.filtered``) and while its
GPUs are still free on the node. A gang's pods wait at a barrier until every planned pod has arrived,
then all bind together; on ``timeout_s`` they bind only if at least the gang minimum arrived, otherwise
nothing binds and the plan is given up (its nodes held until the queue decides, ``Holds.give_up``). A
gang that needs multi-node NVLink (``Gang.mnnvl`` required or preferred) also waits, at most to its
deadline, until every chosen tray's ``gpuagent.dev/imex`` is ready (``cluster.imex_ready``). A repair's
replacement bound inside its subgroup's domain gets ``GangRepaired`` once its binding succeeded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler_plugin.cluster import GPU, imex_ready, pod_requests
from scheduler_plugin.extender.cache import Cache, labels_of, scheduler_of, uid_of
from scheduler_plugin.extender.holds import Holds, StartedPlan
from scheduler_plugin.extender.outbox import EventRecord
from scheduler_plugin.gangs import gang_key_of

# on each pod of a role of subgroup-size auto, written with its binding: the size the planner chose, so
# the launcher can read its data-parallel layout (the API server copies a Binding's annotations to the pod)
SUBGROUP_SIZE_CHOSEN = "gpuagent.dev/subgroup-size-chosen"
# a gang that needs multi-node NVLink whose pods all reached bind while a chosen tray's IMEX is not
# ``ready`` looks at the trays' labels again this often, until its barrier's deadline
IMEX_RECHECK_S = 0.5


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


class Bind:
    """The bind verb (``state.bind(namespace, name, uid, node, now)``), its barrier's timeouts and what
    follows a binding (``assume_bound``, ``failed``)."""

    def __init__(self, cache: Cache, holds: Holds, *, timeout_s: float = 20.0) -> None:
        self.cache = cache
        self.holds = holds
        self.timeout_s = timeout_s  # the barrier's
        self.uids: dict[str, str] = {}  # pod key -> uid the scheduler gave at bind

    def __call__(self, namespace: str, name: str, uid: str, node: str, now: float) -> BindDecision:
        """Bind only a pod the informer knows, that names our scheduler, to a node the informer knows,
        after this extender filtered it (a gang's reservation, or a pod's own filter decision)."""
        key = f"{namespace or 'default'}/{name}"
        pod = self.cache.pods.get(key)
        if pod is None:
            return _refuse(f"pod {key} is not known to the extender's informer; not bound")
        have = uid_of(pod)
        if uid and have and uid != have:
            return _refuse(f"pod {key} has uid {have}, not {uid}; not bound")
        uid = uid or have
        sched = scheduler_of(pod)
        if sched != self.cache.scheduler_name:
            return _refuse(
                f"pod {key} names scheduler {sched!r}, not {self.cache.scheduler_name!r}; not bound"
            )
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to:
            return _refuse(f"pod {key} is already bound to {bound_to}; not bound again")
        if node not in self.cache.nodes:
            return _refuse(f"node {node} is not known to the extender's informer; {key} not bound")
        found = gang_key_of(pod)
        if found is None:
            decided = self.holds.filtered.pop(key, None)
            if decided is None or decided[1] <= now or (decided[0] and decided[0] != uid):
                return _refuse(
                    f"pod {key} was not passed by this extender's filter (or too long ago); not bound"
                )
            need = pod_requests(pod).get(GPU, 0)
            free = self.cache.free_gpus(node)
            if need > free:
                return _refuse(f"pod {key} needs {need} GPU(s); {max(free, 0)} free on {node} now; not bound")
            return BindDecision(action="bind", pods=((key, uid, node),))
        gang_name = found[1]
        res = self.holds.started.get(gang_name)
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
        self.uids[key] = uid
        if res.barrier_deadline is None:
            res.barrier_deadline = now + self.timeout_s
        if len(res.arrived) + len(res.bound) >= res.target:
            return self._complete_ready(gang_name, res, now)
        return BindDecision(action="wait", gang=gang_name, deadline=res.barrier_deadline)

    def _imex_held(self, res: StartedPlan) -> list[str]:
        """The trays of ``res``'s pods at the barrier whose IMEX is not ready now (their Node labels,
        ``cluster.imex_ready``), for a gang that needs multi-node NVLink; none for one that does not."""
        if res.mnnvl == "off":
            return []
        nodes = self.cache.nodes
        return sorted(
            {n for n in res.arrived.values() if not imex_ready(labels_of(nodes.get(n) or {}) or {})}
        )

    def _complete_ready(self, gang_name: str, res: StartedPlan, now: float) -> BindDecision:
        """Every pod arrived: bind them once every chosen tray's IMEX is ready, else look again in
        ``IMEX_RECHECK_S`` until the barrier's deadline (``barrier_timeout`` says which trays held it)."""
        if not self._imex_held(res):
            return self._complete(gang_name, res)
        deadline = res.barrier_deadline if res.barrier_deadline is not None else now
        if now >= deadline:
            return self._imex_timeout(gang_name, res)
        return BindDecision(action="wait", gang=gang_name, deadline=min(deadline, now + IMEX_RECHECK_S))

    def _imex_timeout(self, gang_name: str, res: StartedPlan) -> BindDecision:
        """The barrier's deadline passed while trays' IMEX was not ready: a ``required`` gang binds
        nothing and its reservation is released; a ``preferred`` one binds, and says where IMEX was not
        ready. The Event names the trays."""
        held = self._imex_held(res)
        shown = ", ".join(held[:10]) + (f" and {len(held) - 10} more" if len(held) > 10 else "")
        pods = self.cache.pods
        keys = sorted(k for k in res.arrived if k in pods)
        if res.mnnvl == "preferred":
            msg = (
                f"gang {gang_name}: IMEX not ready on tray(s) {shown} after {self.timeout_s:g}s at "
                "the bind barrier; bound anyway (gpuagent.dev/mnnvl: preferred)"
            )
            done = self._complete(gang_name, res)
            events = tuple(EventRecord(pod=pods[k], reason="GangImexNotReady", message=msg) for k in keys)
            return dataclasses.replace(done, events=done.events + events)
        self.holds.give_up(gang_name)
        msg = (
            f"gang {gang_name}: IMEX not ready on tray(s) {shown} within {self.timeout_s:g}s at the "
            "bind barrier (gpuagent.dev/imex is not ready there); nothing bound, reservation released"
        )
        events = tuple(EventRecord(pod=pods[k], reason="GangImexNotReady", message=msg) for k in keys)
        return BindDecision(action="error", gang=gang_name, error=msg, events=events)

    def _complete(self, gang_name: str, res: StartedPlan) -> BindDecision:
        pods = tuple((k, self.uids.get(k, ""), n) for k, n in sorted(res.arrived.items()))
        res.arrived.clear()
        for k, _, n in pods:
            res.bound.add(k)
            self.cache.set_node(k, n)
        self.holds.release(res, [k for k, _, _ in pods])
        res.barrier_deadline = None
        if self.holds.started.pop(gang_name, None) is not None:
            self.cache.version += 1
        self.holds.excluded.pop(gang_name, None)
        self.cache.inputs_gen += 1
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
            bound_events=_repaired(res, pods, self.cache.pods),
        )

    def assume_bound(self, key: str, node: str) -> None:
        """A pod on its own was bound: count it until the informer reports it."""
        self.cache.set_node(key, node)

    def barrier_timeout(self, gang_name: str, now: float) -> BindDecision:
        """The barrier's deadline passed: bind what arrived if it meets the minimum, else release."""
        res = self.holds.started.get(gang_name)
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
        self.holds.give_up(gang_name)
        msg = (
            f"gang {gang_name}: only {arrived} of {res.target} pod(s) reached bind within "
            f"{self.timeout_s:g}s (minimum {res.spec.min_member}); nothing bound, "
            "reservation released"
        )
        pods = self.cache.pods
        events = tuple(
            EventRecord(pod=pods[k], reason="GangBarrierTimeout", message=msg)
            for k in sorted(res.arrived)
            if k in pods
        )
        return BindDecision(action="error", gang=gang_name, error=msg, events=events)

    def failed(self, gang_name: str, keys: Iterable[str]) -> None:
        """Binding some pods failed at the API: forget the assumption so the informer's truth wins."""
        for k in keys:
            pod = self.cache.pods.get(k)
            if pod is not None and (pod.get("spec") or {}).get("nodeName"):
                self.cache.set_node(k, None)
        self.holds.give_up(gang_name)

    def forget(self, key: str) -> None:
        """Let go of a pod that is gone."""
        self.uids.pop(key, None)


def _refuse(error: str) -> BindDecision:
    return BindDecision(action="error", error=error)


def _repaired(
    res: StartedPlan, pods: Sequence[tuple[str, str, str]], known: Mapping[str, Mapping[str, Any]]
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
