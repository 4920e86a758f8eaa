"""What the extender holds for gangs, and for how long. Pure.

Every hold is one type, the queue's ``Reservation`` (``scheduler_plugin.queue``): nodes with the GPUs
(``claims``) and other resources held on each, from ``start_s`` until ``expires_s``, in API time (seconds
since the epoch, the one clock of the extender's state: ``now``). Three things hold nodes, each through
one:

- a started gang (``StartedPlan``): the queue started the gang (or, after a restart, a pass planned
  it); its ``hold`` keeps its nodes' GPUs and other resources for the pods not bound yet, its pods are
  filtered to their planned nodes and wait at the bind barrier (the plan's state besides the hold:
  arrived, bound, deadlines); the hold expires (``expire``) when no pod reached bind for ``ttl_s`` and
  goes once every pod is bound;
- the queue's head (``queue_reservations``): the nodes a waiting gang will get, and when;
- a plan given up before its pods bound (``GivenUp``: barrier timeout, failed bind, expiry, a changed
  gang, a planned node kube-scheduler keeps ruling out) and a start the queue loop left out: its nodes
  stay held for the gang, from now on, until the next pass that read the cluster after it decides
  again (``give_up``), so a pod on its own filtered in between cannot take them.

Filter, prioritize, bind and the snapshot count the started gangs' holds as taken (``held``,
``held_gpus``); a pod on its own uses the head's and the given-up holds only within the backfill rule
(``head_holds``, ``QueueInputs.caps``). Besides, the pods on their own filter passed (``filtered``, for
bind, valid ``ttl_s``) and the nodes kube-scheduler ruled out for a gang's next plan (``excluded``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from scheduler_plugin.cluster import GPU
from scheduler_plugin.extender.cache import Cache, PodInfo
from scheduler_plugin.gangs import GangSpec
from scheduler_plugin.queue import Reservation
from scheduler_plugin.snapshot import Gang, PodSlot


@dataclass
class StartedPlan:
    """A gang the queue started: where each pod goes (``nodes``), what is held for the pods not bound yet
    (``hold``, replaced as they bind or their claims are allocated) and the bind barrier's state."""

    spec: GangSpec
    nodes: dict[PodSlot, str]  # the plan: each pod's place in the gang -> node
    hold: Reservation
    arrived: dict[str, str] = field(default_factory=dict)  # pod key -> node, at the bind barrier
    barrier_deadline: float | None = None
    bound: set[str] = field(default_factory=set)  # pod keys already bound
    announced: bool = False  # its GangPlanned Event is recorded (once, on the first pod filtered)
    subgroup_sizes: dict[str, int] = field(default_factory=dict)  # role -> size chosen (subgroup-size auto)
    mnnvl: str = "off"  # the gang's ``Gang.mnnvl``: required/preferred wait at bind for the trays' IMEX
    # role -> the size a subgroup-size auto role's replacements keep (``repair.Unbound.sizes``): written
    # on their Bindings like ``subgroup_sizes``, without a SubgroupSizeChosen Event (nothing was chosen)
    kept_sizes: dict[str, int] = field(default_factory=dict)
    # pod key -> GPUs its claims are allocated on its planned node before it bound: taken off ``hold``
    # (the allocation counts them as used already; ``Holds.claims_allocated``)
    allocated: dict[str, int] = field(default_factory=dict)
    # planned node -> when a filter call first came without it (``filter.EXCLUDE_CONFIRM_S``)
    missed: dict[str, float] = field(default_factory=dict)

    @property
    def target(self) -> int:
        """Pods that must arrive before the gang binds: every planned pod."""
        return len(self.nodes)


class GivenUp(NamedTuple):
    """A started gang's plan given up before its pods bound: its nodes held for it (``hold``, from now
    on) until a pass that read the cluster after ``version`` decides again, or its ``members`` are gone."""

    version: int
    hold: Reservation
    members: frozenset[str]


def _less(hold: Reservation, taken: Iterable[tuple[str, int, Mapping[str, int]]]) -> Reservation:
    """``hold`` less ``taken`` (each: a node, GPUs (negative: given back), other resources), none below
    zero; a node the hold does not hold is left alone. One copy of the hold for all of them."""
    claims, resources = dict(hold.claims), dict(hold.resources)
    for node, gpus, other in taken:
        if node not in claims:
            continue
        claims[node] = max(0, claims[node] - gpus)
        if other:
            had = resources.get(node, {})
            resources[node] = {**had, **{r: max(0, had.get(r, 0) - v) for r, v in other.items()}}
    return dataclasses.replace(hold, claims=claims, resources=resources)


class Holds:
    """The holds (module docstring), kept in step with the cache's pod events (``cache.Holder``)."""

    def __init__(self, cache: Cache, *, ttl_s: float = 120.0) -> None:
        self.cache = cache
        self.ttl_s = ttl_s
        self.started: dict[str, StartedPlan] = {}
        self.queue_reservations: dict[str, Reservation] = {}
        self.given_up: dict[str, GivenUp] = {}
        self.excluded: dict[str, set[str]] = {}  # gang -> nodes kube-scheduler ruled out for it
        # pod key -> (uid, valid until): pods on their own this extender passed in filter, for bind
        self.filtered: dict[str, tuple[str, float]] = {}
        self._next_prune = 0.0

    def expire(self, now: float) -> list[str]:
        """Drop started plans whose hold expired with no pod waiting on it; returns the gangs dropped."""
        expired = [
            k
            for k, r in self.started.items()
            if r.hold.expires_s <= now and not r.arrived and len(r.bound) == 0
        ]
        done = [k for k, r in self.started.items() if r.bound and len(r.bound) >= r.target]
        for k in expired:
            self.give_up(k)
        for k in done:
            self.started.pop(k, None)
            self.cache.version += 1
        gone = expired + done
        if now >= self._next_prune:  # decisions of pods that never reached bind (bind checks its own)
            self._next_prune = now + 10.0
            for k in [k for k, (_, until) in self.filtered.items() if until <= now]:
                del self.filtered[k]
        return gone

    def give_up(self, gang: str) -> StartedPlan | None:
        """Drop ``gang``'s started plan before its pods bound. Its nodes stay held for it, starting now,
        until the next queue pass decides again (it starts the gang afresh or makes it the head): a pod on
        its own filtered in between would otherwise take the nodes the gang was about to get."""
        res = self.started.pop(gang, None)
        if res is None:
            return None
        self.cache.version += 1
        self.cache.dirty = True
        self.keep_held(gang, res)
        return res

    def keep_held(self, gang: str, res: StartedPlan) -> None:
        """Hold ``res``'s nodes' GPUs for ``gang`` from now until the next pass decides (``give_up``)."""
        claims = {n: g for n, g in res.hold.claims.items() if g > 0}
        if claims and any(k in self.cache.pods for k in res.spec.members):
            hold = Reservation(gang, -math.inf, claims)
            self.given_up[gang] = GivenUp(self.cache.version, hold, frozenset(res.spec.members))

    def release(self, res: StartedPlan, keys: Iterable[str]) -> None:
        """Pods ``keys`` of ``res`` are bound: their shares no longer held."""
        roles = {r.name: r for r in res.spec.gang.roles}
        taken: list[tuple[str, int, Mapping[str, int]]] = []
        for key in keys:
            planned = res.spec.members[key]
            node, role = res.nodes.get(planned), roles.get(planned.role)
            if node is None or role is None:
                continue
            allocated = res.allocated.pop(key, 0)  # already off the hold
            taken.append((node, max(0, role.gpus_per_pod - allocated), role.resources_per_pod))
        if taken:
            res.hold = _less(res.hold, taken)

    def claims_allocated(self, pods: Iterable[str], *, only: StartedPlan | None = None) -> None:
        """Gang pods not bound yet whose claims are allocated on their planned node (kube-scheduler's
        PreBind, before our bind barrier binds them): those GPUs count as used through the allocation,
        so they leave the gang's hold (at most the pod's share of it); an allocation withdrawn puts
        them back. ``only``: just that plan's pods (one made now)."""
        for key in pods:
            for res in (only,) if only is not None else self.started.values():
                planned = res.spec.members.get(key)
                node = res.nodes.get(planned) if planned is not None else None
                if planned is None or node is None or key in res.bound:
                    continue
                role = next((r for r in res.spec.gang.roles if planned.role == r.name), None)
                share = role.gpus_per_pod if role is not None else 0
                now = min(self.cache.claims.allocated_on(key, node), share)
                before = res.allocated.get(key, 0)
                if now == before or node not in res.hold.claims:
                    continue
                res.hold = _less(res.hold, [(node, now - before, {})])
                if now:
                    res.allocated[key] = now
                else:
                    res.allocated.pop(key, None)
                self.cache.touched(node)
                self.cache.version += 1

    def pod_indexed(self, key: str, info: PodInfo, pod: Mapping[str, Any]) -> None:
        """The cache indexed pod ``key``: a started gang's pod that got bound no longer needs its hold; a
        pending one's claims may be allocated now (``status.resourceClaimStatuses``)."""
        if info.node:
            for res in self.started.values():
                if key in res.spec.members and key not in res.bound:
                    res.bound.add(key)
                    self.release(res, (key,))
        elif self.started and (pod.get("spec") or {}).get("resourceClaims"):
            self.claims_allocated({key})

    def forget(self, key: str) -> None:
        """Pod ``key`` is gone: its slot is held again in full; a plan or a given-up hold whose every pod
        is gone goes, and so does a filter decision for it."""
        self.filtered.pop(key, None)
        if any(key in r.allocated for r in self.started.values()):
            self.claims_allocated({key})
        pods = self.cache.pods
        for gang in [g for g, r in self.started.items() if key in r.spec.members]:
            if not any(k in pods for k in self.started[gang].spec.members):
                self.started.pop(gang)
                self.excluded.pop(gang, None)
                self.cache.inputs_gen += 1
        for gang in [g for g, v in self.given_up.items() if key in v.members]:
            if not any(k in pods for k in self.given_up[gang].members):
                del self.given_up[gang]

    def _taken(self) -> Iterator[Reservation]:
        """The holds filter, bind and the snapshot count as taken: the started gangs'."""
        return (r.hold for r in self.started.values())

    def held(self) -> dict[str, dict[str, int]]:
        """Resources held per node (GPUs and the rest) for gangs started but not bound."""
        out: dict[str, dict[str, int]] = {}
        for hold in self._taken():
            for node, gpus in hold.claims.items():
                acc = out.setdefault(node, {})
                acc[GPU] = acc.get(GPU, 0) + gpus
            for node, res in hold.resources.items():
                acc = out.setdefault(node, {})
                for name, v in res.items():
                    acc[name] = acc.get(name, 0) + v
        return out

    def held_gpus(self) -> dict[str, int]:
        """GPUs held per node for gangs started but not bound."""
        out: dict[str, int] = {}
        for hold in self._taken():
            for node, gpus in hold.claims.items():
                out[node] = out.get(node, 0) + gpus
        return out

    def head_holds(self) -> list[Reservation]:
        """What the queue holds for waiting gangs: its head's nodes, and the plans given up."""
        return [*self.queue_reservations.values(), *(v.hold for v in self.given_up.values())]

    def plan_from(
        self,
        spec: GangSpec,
        gang: Gang,
        members: dict[str, PodSlot],
        placement: Mapping[PodSlot, str],
        now: float,
    ) -> StartedPlan:
        """A started plan of ``gang`` (the part of ``spec`` left to place) on ``placement``, from ``now``:
        its hold keeps each node's share until ``ttl_s`` passes with no pod come."""
        roles = {r.name: r for r in gang.roles}
        claims: dict[str, int] = {}
        resources: dict[str, dict[str, int]] = {}
        for planned, node in placement.items():
            role = roles[planned.role]
            claims[node] = claims.get(node, 0) + role.gpus_per_pod
            acc = resources.setdefault(node, {})
            for rname, v in role.resources_per_pod.items():
                acc[rname] = acc.get(rname, 0) + v
        respec = GangSpec(
            key=spec.key, gang=gang, members=members, min_member=spec.min_member, source=spec.source
        )
        hold = Reservation(
            spec.key,
            now,
            claims,
            resources={n: r for n, r in resources.items() if r},
            expires_s=now + self.ttl_s,
        )
        return StartedPlan(spec=respec, nodes=dict(placement), hold=hold, mnnvl=gang.mnnvl)
