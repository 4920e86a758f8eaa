"""The gang + topology planner: where every pod of a gang goes, or why it cannot go anywhere.

Pure and deterministic: no I/O, no clock, no randomness; ties are broken by domain and node name.

Model
-----
A gang has roles; a role has ``pods`` identical pods of ``gpus_per_pod`` GPUs (plus other resources).
A role with ``subgroup_size`` is cut into consecutive blocks of pods by index (the last block may be
smaller); with ``subgroup_tier`` each block must sit inside one domain of that tier. ``min_subgroups``
makes a role elastic: the planner places as many blocks as fit, at least that many, always a prefix
(blocks 0..c-1) so ranks stay dense. The gang's own ``tier`` puts every pod inside one domain of that
tier. ``soft`` turns the tier constraints into preferences: if the hard plan is impossible, both
tiers climb one level at a time (``relaxed_tiers`` in the score) until the constraint disappears.

Fit is per node: a pod needs ``gpus_per_pod`` free GPUs (and each tracked resource) on ONE node; a
domain's room for a block is the number of pods its nodes can host, not its aggregate free GPUs.
Resources a node does not report (absent from ``free_resources``) are not limiting.

Objective (lexicographic, documented in the plan's ``score``)
------------------------------------------------------------
Measured over the touched domains of the measuring tier (the lowest subgroup tier, else the gang
tier, else tier 1; for NVLink subgroups, the NVLink domains):

1. feasibility, then most pods placed (elastic roles);
2. keep large free blocks intact: ``opened_domains`` = wholly free domains touched (every
   schedulable node with all its GPUs free). Consuming any part of one costs more than anything
   below, so a gang tops up partly used domains whenever they can hold it, and opens an empty
   domain only when they cannot;
3. keep free blocks of the higher tiers intact: ``opened_upper`` counts the wholly free domains of
   each higher tier that the opened domains break into, a higher tier weighing more than all lower
   ones (``_UPPER_BITS`` per tier). A gang that must open an NVLink domain takes one under a leaf
   (spine) that is already in use, keeping whole leaves and spines for the gangs that need them;
4. least stranded capacity added: ``stranded_gpus`` = free GPUs left in touched domains whose room
   is smaller than a *useful block*, minus what was already stranded there. Useful is judged against
   what the cluster typically needs, not only this gang: the smaller of the gang's block and the
   standard subgroup (``STANDARD_SUBGROUP_GPUS``, a 4-tray NVL72 segment) in pods of the gang's
   shape (``useful_block``). Room for a standard segment stays useful to later gangs;
5. fewest useful blocks of room lost: ``lost_blocks`` = over the touched domains, how many fewer
   useful blocks their room holds (room ``c`` holds ``c // useful`` of them). Pods that fit in the
   room left over beyond a domain's whole blocks cost nothing, so a small gang fills those gaps
   before it cuts into room a later segment could use;
6. best fit: ``leftover_gpus`` = free GPUs left in the touched domains (fewer means the gang went
   into the fullest domains);
7. tightest tier: ``span_tier`` = the lowest tier where one domain holds every placed pod;
8. names (domain paths, then node names).

Search
------
Blocks of one role are assigned to domains jointly by a dynamic programme over the domains of its
subgroup tier (state: how many full blocks and whether the short last block are placed; cost: the
opened/upper/stranded/lost/leftover figures of each domain, summed; the upper figure is counted per
opened domain, so two domains opened under one free leaf count that leaf twice in the programme, while the
ranking of whole plans counts it once). This is exact for one role; when the role is one block, or
every domain holds at most one block and there is no short block, domain costs are independent and
the cheapest domains are taken directly (the programme's choice, the earlier domain on ties).
Several roles are placed one after the other, the most constrained first (subgroup roles, then by
total GPUs). The gang-tier
constraint is handled by planning inside each candidate scope (a domain of that tier, or the whole
cluster), pre-filtered by pod capacity; lower-tier scopes are then tried from tier 1 up, and the
first tier whose scopes give a better plan (one as good on the figures above but tighter, or better
on them) gives the best of its plans. Scopes that cannot beat the best plan found are skipped without
planning: lower bounds on the domains any plan there must open (the main role's full-size blocks
beyond what partly used domains hold), on the GPUs it strands (it can fill at most the stranded GPUs
there, and at most the gang's GPUs) and on the blocks it must lose (pods beyond the room left over
after whole blocks); a tier none of whose domains has enough GPUs is not searched; within a tier, a
scope whose best conceivable plan only ties with the one found in an earlier-named scope is skipped;
and, for one GPU-only role placed whole at the measuring tier, the figures of each
one-domain scope follow from its room and free GPUs, so only the best such scope is planned. A
one-role gang whose pods form one block is searched as a block of the gang tier, in one pass.
Roles without a subgroup tier go to nodes the gang already uses first, then to the room partly used
tier-1 domains hold beyond their whole useful blocks (fullest domains first), then to nodes outside
wholly free tier-1 domains, best fit (fewest pods of room) first. Domains are assumed to nest: the
nodes of one tier-1 domain share their domain at every higher tier (as HyperNode trees do).

``prepare(snapshot)`` indexes nodes and domains once; ``plan`` keeps the last few prepared snapshots
by identity, so repeated plans against one snapshot skip the indexing. A new snapshot with the same
topology as the last one (same nodes, GPUs and domains in the same order: the usual case between
two scheduling cycles) is prepared from it: the topology indexes are shared, and each per-shape
capacity cache is copied from the nearest of the last 16 snapshots that built it, with only the
entries of nodes changed since then (and their domains) recomputed; once an eighth of the nodes has
changed, building it afresh (in C-level passes) is cheaper and is done instead. A one-role GPU-only gang whose
blocks go to tier-1 domains is searched on per-domain counts; only the chosen plan is put on nodes.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, repeat
from operator import itemgetter
from typing import cast

from scheduler_plugin.snapshot import (
    ClusterSnapshot,
    Gang,
    Infeasible,
    Plan,
    PlanResult,
    Role,
    SubgroupPlacement,
    changed_nodes,
    name_order,
)

__all__ = ["STANDARD_SUBGROUP_GPUS", "PreparedSnapshot", "plan", "prepare", "role_subgroups", "useful_block"]

_UNLIMITED = 1 << 40  # pods a node can host when nothing about it limits the role
_STRANDED_WEIGHT = 1 << 42  # stranded GPUs dominate lost blocks in the combined DP cost
_LOST_WEIGHT = 1 << 21  # useful blocks of room lost dominate leftover GPUs
_UPPER_WEIGHT = 1 << 84  # breaking into wholly free higher-tier domains dominates stranded GPUs
_OPENED_WEIGHT = 1 << 126  # opening a wholly free domain dominates everything below in the DP cost
_UPPER_BITS = 16  # per tier in the upper figure: a higher tier's wholly free domains weigh more
# Skip work whose outcome is known (see Search); tests turn it off to check plans do not change.
_SHORTCUTS = True
# The smallest subgroup a cluster typically needs, in GPUs: a 4-node segment of 4-GPU NVL72 trays
# (16 GPUs; NVL72 gangs are cut into segments of 4, 16 or 18 trays). Free room smaller than this and
# than the gang's own block counts as stranded, whatever the gang being placed.
STANDARD_SUBGROUP_GPUS = 16

RoleKey = tuple[int, tuple[tuple[str, int], ...]]
ScopeKey = tuple[int, str] | None  # (tier index, domain) or None for the whole cluster


def _one_picker(i: int) -> Callable[[Sequence[int]], tuple[int, ...]]:
    return lambda values: (values[i],)


def _role_key(role: Role) -> RoleKey:
    return (role.gpus_per_pod, tuple(sorted((k, v) for k, v in role.resources_per_pod.items() if v > 0)))


def useful_block(role: Role) -> int:
    """Pods of ``role``'s shape below which a domain's free room counts as stranded.

    The smaller of the role's own block and the standard subgroup (``STANDARD_SUBGROUP_GPUS``) in
    pods of this shape: room that holds either is still useful to the cluster.
    """
    size, _, _ = role_subgroups(role)
    if role.gpus_per_pod <= 0:
        return size
    return max(1, min(size, -(-STANDARD_SUBGROUP_GPUS // role.gpus_per_pod)))


def role_subgroups(role: Role) -> tuple[int, int, int]:
    """``(block size, number of full blocks, size of the short last block or 0)`` of a role.

    A role without ``subgroup_size`` is one block of all its pods.
    """
    size = role.subgroup_size if role.subgroup_size else role.pods
    size = max(1, min(size, role.pods)) if role.pods > 0 else 1
    return size, role.pods // size, role.pods % size


@dataclass(frozen=True)
class _Origin:
    src: PreparedSnapshot | None
    dirty: Collection[int]  # nodes (name order) changed since ``src``
    dirty_dom: list[set[str]]  # per tier: domains holding them


_DERIVE_SHARE = 8  # a cache is derived from an older snapshot's while under 1/8 of the nodes changed since
_CHAIN = 16  # snapshots kept behind a prepared one, to derive the caches it lacks from


@dataclass
class PreparedSnapshot:
    """Indexes of one snapshot, built once: node arrays, domain members per tier, capacity caches."""

    snapshot: ClusterSnapshot
    names: list[str]
    free: list[int]
    gpus: list[int]
    schedulable: list[bool]
    free_resources: list[Mapping[str, int]]
    tier_index: dict[str, int]
    dom: list[list[str | None]]  # per tier index: each node's domain
    members: list[dict[str, list[int]]]  # per tier index: domain -> node indices (name order)
    paths: list[dict[str, tuple[str, ...]]]  # per tier index: domain -> its ancestors' names, top first
    order: list[int] = field(default_factory=list)  # snapshot.nodes index of each node in name order
    position: list[int] = field(default_factory=list)  # name-order index of each snapshot.nodes entry
    _fit: dict[RoleKey, list[int]] = field(default_factory=dict)
    # topology only, so shared by every snapshot prepared from this one's topology
    _groups: dict[tuple[ScopeKey, int], list[tuple[str, list[int]]]] = field(default_factory=dict)
    _children: dict[tuple[int, str], list[str] | None] = field(default_factory=dict)
    _most_gpus: dict[int, int] = field(default_factory=dict)
    _picks: dict[tuple[ScopeKey, int], list[Callable[[Sequence[int]], tuple[int, ...]]]] = field(
        default_factory=dict
    )
    _group_caps: dict[tuple[RoleKey, ScopeKey, int], list[tuple[int, int]]] = field(default_factory=dict)
    _order_keys: dict[tuple[RoleKey, ScopeKey], list[tuple[bool, int, int]]] = field(default_factory=dict)
    _remainder: dict[tuple[RoleKey, ScopeKey, int], list[int]] = field(default_factory=dict)
    _upper: dict[tuple[int, str], int] = field(default_factory=dict)
    _totals: dict[tuple[RoleKey, int], dict[str, tuple[int, int]]] = field(default_factory=dict)
    _free_order: dict[tuple[RoleKey, ScopeKey, int], list[int]] = field(default_factory=dict)
    _free_split: dict[tuple[RoleKey, int, int], dict[str | None, list[int]]] = field(default_factory=dict)
    _scope_cap: dict[tuple[RoleKey, ScopeKey], int] = field(default_factory=dict)
    _tier_cap: dict[tuple[RoleKey, int], dict[str, int]] = field(default_factory=dict)
    _whole: dict[int, dict[str, bool]] = field(default_factory=dict)
    _bits: dict[str, tuple[bool, bool]] | None = None
    # the snapshot this one was prepared from, and the nodes (name order) whose state differs from it:
    # caches are derived from earlier snapshots' by recomputing only what changed (see _origin)
    _prev: PreparedSnapshot | None = None
    _dirty: list[int] = field(default_factory=list)
    _dirty_dom: list[set[str]] = field(default_factory=list)  # per tier: domains holding dirty nodes
    _walk: list[_Origin] = field(default_factory=list)  # see _origin

    def _origin(self, has: Callable[[PreparedSnapshot], bool]) -> _Origin:
        """The nearest snapshot this one was prepared from that ``has`` a cache (up to ``_CHAIN``
        steps back, while under 1/``_DERIVE_SHARE`` of the nodes changed), with the nodes and domains
        changed since; ``src`` None when there is none: the cache is then built afresh."""
        src = self._prev
        if src is None or has(src):
            return _Origin(src, self._dirty, self._dirty_dom)
        walk = self._walk  # origins one, two, ... steps back, merged once per snapshot
        if not walk:
            walk.append(_Origin(src, self._dirty, self._dirty_dom))
        for o in walk:
            if has(o.src):  # type: ignore[arg-type]
                return o
        last = walk[-1]
        while last.src is not None and (back := last.src._prev) is not None:
            if len(last.dirty) * _DERIVE_SHARE > len(self.names):
                break  # so much changed that building the cache afresh is cheaper
            step = last.src
            dirty = set(last.dirty).union(step._dirty)
            doms = [a | b for a, b in zip(last.dirty_dom, step._dirty_dom, strict=True)]
            last = _Origin(back, dirty, doms)
            walk.append(last)
            if has(back):
                return last
        return _Origin(None, [], [])

    # -- capacity -------------------------------------------------------------------------------
    def base_fit(self, key: RoleKey) -> list[int]:
        """Pods of this shape each node can host with nothing of the gang placed yet."""
        cached = self._fit.get(key)
        if cached is None:
            o = self._origin(lambda a: key in a._fit)
            if o.src is not None:
                cached = list(o.src._fit[key])
                gpus, reqs = key
                if reqs or gpus <= 0:
                    for i in o.dirty:
                        cached[i] = self._fit_one(i, key, 0, None)
                else:
                    free, schedulable = self.free, self.schedulable
                    for i in o.dirty:
                        cached[i] = free[i] // gpus if schedulable[i] else 0
                self._fit[key] = cached
        if cached is None:
            gpus, reqs = key
            if reqs or gpus <= 0:
                cached = [self._fit_one(i, key, 0, None) for i in range(len(self.names))]
            else:  # the common case, GPUs only: one pass without a call per node
                cached = [f // gpus if s else 0 for f, s in zip(self.free, self.schedulable, strict=True)]
            self._fit[key] = cached
        return cached

    def _fit_one(self, i: int, key: RoleKey, used_gpus: int, used_res: Mapping[str, int] | None) -> int:
        if not self.schedulable[i]:
            return 0
        gpus, reqs = key
        n = (self.free[i] - used_gpus) // gpus if gpus > 0 else _UNLIMITED
        fres = self.free_resources[i]
        for res, qty in reqs:
            avail = fres.get(res)
            if avail is None:
                continue
            if used_res:
                avail -= used_res.get(res, 0)
            n = min(n, avail // qty)
        return max(0, n)

    def children(self, scope: tuple[int, str]) -> list[str] | None:
        """The tier-1 domains that make up a domain, or None when some of its nodes have no tier-1
        domain (topology only, shared by snapshots prepared from one another)."""
        if scope not in self._children:
            members = self.members[scope[0]].get(scope[1], [])
            dom0 = self.dom[0]
            names = sorted({d for i in members if (d := dom0[i]) is not None})
            whole = sum(len(self.members[0][d]) for d in names) == len(members)
            self._children[scope] = names if whole else None
        return self._children[scope]

    def most_gpus(self, tier: int) -> int:
        """The most GPUs one domain of ``tier`` has, free or not (topology only)."""
        if tier not in self._most_gpus:
            gpus = self.gpus
            self._most_gpus[tier] = max(
                (sum(gpus[i] for i in nodes) for nodes in self.members[tier].values()), default=0
            )
        return self._most_gpus[tier]

    def domain_totals(self, key: RoleKey, tier: int) -> dict[str, tuple[int, int]]:
        """Per domain of ``tier``: (pods of this shape it can host, free GPUs), as ``group_caps``."""
        ck = (key, tier)
        cached = self._totals.get(ck)
        if cached is None:
            cached = {
                d: caps
                for (d, _), caps in zip(
                    self.groups(None, tier), self.group_caps(key, None, tier), strict=True
                )
            }
            self._totals[ck] = cached
        return cached

    def upper_opened(self, tier: int, d: str) -> int:
        """For a wholly free domain ``d`` of ``tier``: its wholly free ancestors, as one figure where a
        higher tier weighs more than every lower one (``_UPPER_BITS`` per tier); 0 if ``d`` is not
        wholly free."""
        ck = (tier, d)
        cached = self._upper.get(ck)
        if cached is None:
            cached = 0
            if self.whole(tier).get(d, False):
                path = self.paths[tier][d]  # top tier first
                top = len(self.members) - 1
                for t in range(tier + 1, top + 1):
                    if self.whole(t).get(path[top - t], False):
                        cached += 1 << (_UPPER_BITS * (t - tier - 1))
            self._upper[ck] = cached
        return cached

    def whole(self, tier: int) -> dict[str, bool]:
        """Per domain of ``tier``: wholly free (every schedulable node has all its GPUs free, and some)."""
        cached = self._whole.get(tier)
        if cached is None:
            bits = self._whole_bits()
            if tier == 0:
                cached = {d: b == (True, True) for d, b in bits.items()}
            else:
                o = self._origin(lambda a: tier in a._whole)
                if o.src is not None:
                    cached = dict(o.src._whole[tier])
                    todo: Iterable[str] = o.dirty_dom[tier]
                else:
                    cached = {}
                    todo = self.members[tier]
                for d in todo:
                    kids = self.children((tier, d))
                    if kids is not None:  # from its tier-1 domains
                        cached[d] = all(bits[k][0] for k in kids) and any(bits[k][1] for k in kids)
                    else:
                        cached[d] = self._whole_bit(self.members[tier][d]) == (True, True)
            self._whole[tier] = cached
        return cached

    def _whole_bit(self, nodes: list[int]) -> tuple[bool, bool]:
        """(every schedulable node has all its GPUs free, some schedulable node has a free GPU)."""
        live = [i for i in nodes if self.schedulable[i]]
        return all(self.free[i] == self.gpus[i] for i in live), any(self.free[i] > 0 for i in live)

    def _whole_bits(self) -> dict[str, tuple[bool, bool]]:
        """``_whole_bit`` per tier-1 domain: a higher domain made of tier-1 domains is wholly free
        when all of them are free and one has a free GPU."""
        cached = self._bits
        if cached is None:
            o = self._origin(lambda a: a._bits is not None)
            prev = o.src._bits if o.src is not None else None
            todo: Iterable[str] = o.dirty_dom[0] if prev is not None else self.members[0]
            cached = dict(prev) if prev is not None else {}
            for d in todo:
                cached[d] = self._whole_bit(self.members[0][d])
            self._bits = cached
        return cached

    def scope_nodes(self, scope: ScopeKey) -> list[int]:
        if scope is None:
            return list(range(len(self.names)))
        return self.members[scope[0]].get(scope[1], [])

    def groups(self, scope: ScopeKey, tier: int) -> list[tuple[str, list[int]]]:
        """Domains of ``tier`` inside ``scope`` (node lists intersected with it), in path order."""
        ck = (scope, tier)
        cached = self._groups.get(ck)
        if cached is None:
            if scope is None:
                cached = [(d, nodes) for d, nodes in self.members[tier].items()]
            else:
                by_dom: dict[str, list[int]] = {}
                dom_t = self.dom[tier]
                for i in self.scope_nodes(scope):
                    d = dom_t[i]
                    if d is not None:
                        by_dom.setdefault(d, []).append(i)
                cached = list(by_dom.items())
            paths = self.paths[tier]
            cached.sort(key=lambda item: (paths[item[0]], item[0]))
            self._groups[ck] = cached
        return cached

    def group_caps(self, key: RoleKey, scope: ScopeKey, tier: int) -> list[tuple[int, int]]:
        """Per group of ``groups(scope, tier)``: (pods of this shape it can host, free GPUs)."""
        ck = (key, scope, tier)
        cached = self._group_caps.get(ck)
        if cached is None:
            fit = self.base_fit(key)
            free = self.free
            o = self._origin(lambda a: ck in a._group_caps)
            if o.src is not None:
                dirty = o.dirty_dom[tier]
                cached = list(o.src._group_caps[ck])
                for k, (d, nodes) in enumerate(self.groups(scope, tier)):
                    if d in dirty:
                        cached[k] = (min(_UNLIMITED, sum(fit[i] for i in nodes)), sum(free[i] for i in nodes))
            elif scope is not None and tier == 0:  # whole tier-1 domains take the cluster's figures
                totals = self.domain_totals(key, 0)
                members = self.members[0]
                cached = [
                    totals[d]
                    if len(nodes) == len(members[d])
                    else (min(_UNLIMITED, sum(fit[i] for i in nodes)), sum(free[i] for i in nodes))
                    for d, nodes in self.groups(scope, tier)
                ]
            else:  # every group: its nodes' entries picked in C
                cached = [
                    (min(_UNLIMITED, sum(pick(fit))), sum(pick(free))) for pick in self._pickers(scope, tier)
                ]
            self._group_caps[ck] = cached
        return cached

    def _pickers(self, scope: ScopeKey, tier: int) -> list[Callable[[Sequence[int]], tuple[int, ...]]]:
        """Per group of ``groups(scope, tier)``: a function taking its nodes' entries out of a
        per-node list, as a tuple (topology only)."""
        ck = (scope, tier)
        cached = self._picks.get(ck)
        if cached is None:
            cached = [
                itemgetter(*nodes) if len(nodes) > 1 else _one_picker(nodes[0])
                for _, nodes in self.groups(scope, tier)
            ]
            self._picks[ck] = cached
        return cached

    def tier_capacity(self, key: RoleKey, tier: int) -> dict[str, int]:
        """``scope_capacity`` of every domain of ``tier``; for a GPU-only shape, from the tier-1
        domains' totals in one pass."""
        ck = (key, tier)
        cached = self._tier_cap.get(ck)
        if cached is None:
            kids = {d: self.children((tier, d)) for d in self.members[tier]} if tier > 0 else {}
            if key[0] > 0 and not key[1] and all(k is not None for k in kids.values()):
                totals = self.domain_totals(key, 0)
                if tier == 0:
                    cached = {d: caps[0] for d, caps in totals.items()}
                else:
                    cached = {d: sum(totals[k][0] for k in ks or ()) for d, ks in kids.items()}
            else:
                cached = {d: self.scope_capacity(key, (tier, d)) for d in self.members[tier]}
            self._tier_cap[ck] = cached
        return cached

    def scope_capacity(self, key: RoleKey, scope: ScopeKey) -> int:
        ck = (key, scope)
        cached = self._scope_cap.get(ck)
        if cached is None:
            o = self._origin(lambda a: ck in a._scope_cap)
            prev = o.src._scope_cap[ck] if o.src is not None else None
            if prev is not None and scope is not None and scope[1] not in o.dirty_dom[scope[0]]:
                cached = prev
            elif prev is not None and prev < _UNLIMITED and o.src is not None:
                fit, before = self.base_fit(key), o.src.base_fit(key)
                total = prev
                if scope is None:
                    for i in o.dirty:
                        total += fit[i] - before[i]
                else:
                    dom, name = self.dom[scope[0]], scope[1]
                    for i in o.dirty:
                        if dom[i] == name:
                            total += fit[i] - before[i]
                cached = min(_UNLIMITED, total)
            elif (
                scope is not None
                and key[0] > 0
                and not key[1]
                and (racks := self.children(scope)) is not None
            ):
                totals = self.domain_totals(key, 0)  # GPU-only: the sum of its tier-1 domains' room
                cached = sum(totals[r][0] for r in racks)
            else:
                fit = self.base_fit(key)
                cached = min(_UNLIMITED, sum(fit[i] for i in self.scope_nodes(scope)))
            self._scope_cap[ck] = cached
        return cached

    def free_order(self, key: RoleKey, scope: ScopeKey, useful: int) -> list[int]:
        """Where a role without a subgroup tier looks for room: ``remainder_order``, then the nodes
        that can host this shape, those of wholly free tier-1 domains last, then best fit (fewest
        pods), then name. A domain scope takes the cluster's order restricted to its nodes (both
        orders are per node and per tier-1 domain, and tier-1 domains nest in every scope)."""
        ck = (key, scope, useful)
        cached = self._free_order.get(ck)
        if cached is None:
            if scope is None:
                cached = list(self.free_nodes(key, useful))
            else:
                split = self._free_split.get((key, useful, scope[0]))
                if split is None:  # the cluster's order cut by domain of the scope's tier, in one pass
                    split = {}
                    dom_t = self.dom[scope[0]]
                    for i in self.free_order(key, None, useful):
                        split.setdefault(dom_t[i], []).append(i)
                    self._free_split[(key, useful, scope[0])] = split
                cached = split.get(scope[1], [])
            self._free_order[ck] = cached
        return cached

    def free_nodes(self, key: RoleKey, useful: int) -> Iterable[int]:
        """The cluster's ``free_order``, read lazily while it is not built: a small role reads only
        its first nodes, so the cluster-wide list is not made for it."""
        cached = self._free_order.get((key, None, useful))
        if cached is not None:
            return cached
        first = self.remainder_order(key, None, useful)
        keys = self._scope_order_keys(key, None)
        if not first:
            return map(itemgetter(2), keys)
        taken = set(first)
        return chain(first, (k[2] for k in keys if k[2] not in taken))

    def remainder_order(self, key: RoleKey, scope: ScopeKey, useful: int) -> list[int]:
        """Nodes holding the room of partly used tier-1 domains beyond their whole useful blocks
        (room ``c`` holds ``c // useful`` blocks; the ``c % useful`` pods left over): pods put there
        cost no block. Fullest domains first, then best fit, then name."""
        ck = (key, scope, useful)
        cached = self._remainder.get(ck)
        if cached is None:
            cached = []
            if self.dom and key[0] > 0 and not key[1] and useful > 1:
                fit, whole = self.base_fit(key), self.whole(0)
                found: list[tuple[int, int, int]] = []
                for (d, nodes), (cap, free) in zip(
                    self.groups(scope, 0), self.group_caps(key, scope, 0), strict=True
                ):
                    left = cap % useful
                    if whole[d] or left == 0:
                        continue
                    for i in sorted((i for i in nodes if fit[i] > 0), key=lambda i: (fit[i], i)):
                        if left <= 0:
                            break
                        found.append((free, fit[i], i))
                        left -= fit[i]
                cached = [i for _, _, i in sorted(found)]
            self._remainder[ck] = cached
        return cached

    def _scope_order_keys(self, key: RoleKey, scope: ScopeKey) -> list[tuple[bool, int, int]]:
        """The nodes of the scope that can host this shape as sorted (in a wholly free tier-1 domain,
        pods of room, node) keys: best fit first, wholly free domains last. Derived from an earlier
        snapshot's when one has them: only changed nodes and the nodes of tier-1 domains whose wholeness
        changed can move."""
        ck = (key, scope)
        cached = self._order_keys.get(ck)
        if cached is not None:
            return cached
        fit = self.base_fit(key)
        whole = self.whole(0) if self.dom else {}
        dom0 = self.dom[0] if self.dom else None

        def sort_key(i: int) -> tuple[bool, int, int]:
            d = dom0[i] if dom0 is not None else None
            return (whole.get(d, False) if d is not None else False, fit[i], i)

        o = self._origin(lambda a: ck in a._order_keys)
        if o.src is not None:
            src, prev = o.src, o.src._order_keys[ck]
            old_fit, old_whole = src._fit.get(key), src._whole.get(0)
            # a node's key moves when its own room changed, or its tier-1 domain's wholeness did
            moved = set(o.dirty)
            if dom0 is not None:
                members0 = self.members[0]
                for flipped in o.dirty_dom[0]:
                    if old_whole is None or whole.get(flipped, False) != old_whole.get(flipped, False):
                        moved.update(members0[flipped])
            in_scope = set(self.scope_nodes(scope)) if scope is not None else None
            kept: list[tuple[bool, int, int]] | None = None
            if (
                old_fit is not None
                and (old_whole is not None or dom0 is None)
                and _DERIVE_SHARE * len(moved) < len(prev)
            ):
                # few moved: take their old keys out (as ``src`` sorted them) instead of a pass over all
                kept = list(prev)
                for i in moved:
                    if old_fit[i] <= 0 or (in_scope is not None and i not in in_scope):
                        continue
                    d = dom0[i] if dom0 is not None else None
                    old = ((old_whole or {}).get(d, False) if d is not None else False, old_fit[i], i)
                    at = bisect.bisect_left(kept, old)
                    if at == len(kept) or kept[at] != old:  # pragma: no cover - src's keys are these
                        kept = None
                        break
                    del kept[at]
            cached = kept if kept is not None else [k for k in prev if k[2] not in moved]
            for i in sorted(moved):
                if fit[i] > 0 and (in_scope is None or i in in_scope):
                    bisect.insort(cached, sort_key(i))
        elif scope is None:  # every node: the keys zipped and sorted in C
            # a node without a tier-1 domain (None) is in none that is wholly free
            by_dom = cast("dict[str | None, bool]", whole)
            opens = list(map(by_dom.get, dom0, repeat(False))) if dom0 else [False] * len(fit)
            cached = sorted(compress(zip(opens, fit, range(len(fit)), strict=True), fit))
        else:
            cached = sorted(sort_key(i) for i in self.scope_nodes(scope) if fit[i] > 0)
        self._order_keys[ck] = cached
        return cached


def prepare(snapshot: ClusterSnapshot, like: PreparedSnapshot | None = None) -> PreparedSnapshot:
    """Index a snapshot: nodes in name order, domain members and ancestor paths per tier.

    ``like``: a snapshot prepared before; when the topology is unchanged (same nodes in the same
    order, same GPUs and domains: the usual case between two scheduling cycles) its indexes are
    reused and only the free capacity is read again.
    """
    changed = changed_nodes(like.snapshot, snapshot) if like is not None else None
    if like is not None and changed is not None:
        free, schedulable, free_resources = list(like.free), list(like.schedulable), list(like.free_resources)
        dirty = sorted(like.position[k] for k in changed)
        for k in changed:
            n, i = snapshot.nodes[k], like.position[k]
            free[i] = max(0, min(n.free, n.gpus))
            schedulable[i] = n.schedulable
            free_resources[i] = n.free_resources
        prepared = PreparedSnapshot(
            snapshot=snapshot,
            names=like.names,
            free=free,
            gpus=like.gpus,
            schedulable=schedulable,
            free_resources=free_resources,
            tier_index=like.tier_index,
            dom=like.dom,
            members=like.members,
            paths=like.paths,
            order=like.order,
            position=like.position,
            _groups=like._groups,
            _children=like._children,
            _most_gpus=like._most_gpus,
            _picks=like._picks,
            _prev=like,
            _dirty=dirty,
            _dirty_dom=[
                {d for i in dirty if (d := like.dom[t][i]) is not None} for t in range(len(like.dom))
            ],
        )
        like._walk = []  # its merged origins would keep snapshots past the chain alive
        older = like
        for _ in range(_CHAIN - 1):  # keep a few steps back; older snapshots can go
            if older._prev is None:
                break
            older = older._prev
        older._prev = None
        return prepared
    order, position = name_order(snapshot)
    nodes = [snapshot.nodes[k] for k in order]
    tiers = snapshot.tiers
    dom: list[list[str | None]] = [[n.domains.get(t) for n in nodes] for t in tiers]
    members: list[dict[str, list[int]]] = []
    paths: list[dict[str, tuple[str, ...]]] = []
    for ti in range(len(tiers)):
        m: dict[str, list[int]] = {}
        p: dict[str, tuple[str, ...]] = {}
        for i, d in enumerate(dom[ti]):
            if d is None:
                continue
            if d not in m:
                m[d] = []
                # ancestors from the top tier down, as the first member node sees them
                p[d] = tuple(dom[tj][i] or "" for tj in range(len(tiers) - 1, ti, -1))
            m[d].append(i)
        members.append(m)
        paths.append(p)
    return PreparedSnapshot(
        snapshot=snapshot,
        names=[n.name for n in nodes],
        free=[max(0, min(n.free, n.gpus)) for n in nodes],
        gpus=[n.gpus for n in nodes],
        schedulable=[n.schedulable for n in nodes],
        free_resources=[n.free_resources for n in nodes],
        tier_index={t: i for i, t in enumerate(tiers)},
        dom=dom,
        members=members,
        paths=paths,
        order=order,
        position=position,
    )


_CACHE: list[PreparedSnapshot] = []
_CACHE_SIZE = 4


def _prepared(snapshot: ClusterSnapshot | PreparedSnapshot) -> PreparedSnapshot:
    if isinstance(snapshot, PreparedSnapshot):
        return snapshot
    for p in _CACHE:
        if p.snapshot is snapshot:
            return p
    p = prepare(snapshot, like=_CACHE[0] if _CACHE else None)
    _CACHE.insert(0, p)
    del _CACHE[_CACHE_SIZE:]
    return p


# -- one attempt ----------------------------------------------------------------------------------


@dataclass
class _Failure:
    role: str
    needed: int  # blocks (or pods) needed
    got: int
    message: str


@dataclass(frozen=True)
class _Deferred:
    role: Role
    base: list[int]
    domains: list[tuple[str, list[int], list[int]]]  # as ``_blocks_by_domain`` gives them


@dataclass
class _State:
    """What the gang has taken so far in one attempt (deltas against the snapshot)."""

    used_gpus: dict[int, int] = field(default_factory=dict)
    used_res: dict[int, dict[str, int]] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)  # nodes in first-use order
    pods: list[tuple[str, int, int]] = field(default_factory=list)  # (role, pod index, node) placed
    subgroups: list[SubgroupPlacement] = field(default_factory=list)
    placed_pods: int = 0
    # One GPU-only role whose blocks go to tier-0 domains: the attempt records pods per domain
    # (``by_domain``) and the arguments of the fill (``deferred``); only the chosen plan is put on
    # nodes (``_place_deferred``). Each pod then takes one pod of room and ``gpus_per_pod`` GPUs from
    # its domain, so the figures of ``_measure`` and ``_span`` follow from the counts.
    defer: bool = False
    deferred: _Deferred | None = None
    by_domain: dict[str, int] = field(default_factory=dict)


def _fit_now(p: PreparedSnapshot, st: _State, i: int, key: RoleKey, base: list[int]) -> int:
    if i not in st.used_gpus:
        return base[i]
    return p._fit_one(i, key, st.used_gpus[i], st.used_res.get(i))


def _fill(
    p: PreparedSnapshot,
    st: _State,
    role: Role,
    key: RoleKey,
    *,
    pod_range: range,
    nodes: Iterable[int],
    base: list[int],
) -> bool:
    """Put the pods of ``pod_range`` (consecutive indices) on ``nodes`` in order, as many per node as fit."""
    pod, stop = pod_range.start, pod_range.stop
    pods, name, used, order = st.pods, role.name, st.used_gpus, st.order
    g, reqs = key
    for i in nodes:
        if pod >= stop:
            break
        u = used.get(i)
        room = base[i] if u is None else p._fit_one(i, key, u, st.used_res.get(i))
        if room <= 0:
            continue
        n = room if room < stop - pod else stop - pod
        if n == 1:
            pods.append((name, pod, i))
        else:
            pods.extend([(name, k, i) for k in range(pod, pod + n)])
        pod += n
        if u is None:
            used[i] = g * n
            order.append(i)
        else:
            used[i] = u + g * n
        if reqs:
            res = st.used_res.setdefault(i, {})
            for r, q in reqs:
                res[r] = res.get(r, 0) + q * n
    st.placed_pods += pod - pod_range.start
    return pod >= stop


def _block_ranges(role: Role, count: int) -> list[range]:
    size, _, _ = role_subgroups(role)
    return [range(k * size, min((k + 1) * size, role.pods)) for k in range(count)]


def _min_blocks(role: Role) -> int:
    _, full, rem = role_subgroups(role)
    total = full + (1 if rem else 0)
    if role.min_subgroups is None or role.subgroup_size is None:
        return total
    return max(1, min(total, role.min_subgroups))  # a role places at least one block


def _room_change(cap: int, free: int, cap_after: int, free_after: int, useful: int) -> tuple[int, int]:
    """(stranded GPUs added, useful blocks lost) when a domain's room goes from ``cap`` pods and
    ``free`` GPUs to ``cap_after`` and ``free_after``: room under a useful block strands its GPUs."""
    stranded = (free_after if cap_after < useful else 0) - (free if cap < useful else 0)
    return stranded, cap // useful - cap_after // useful


def _price(opens: int, cap: int, free: int, used: int, *, g: int, useful: int) -> int:
    """A domain's cost in the block search when ``used`` pods of ``g`` GPUs go to it (``opens``: its
    cost of being opened, 0 if it is not wholly free)."""
    after = free - used * g
    stranded, lost = _room_change(cap, free, cap - used, after, useful)
    return opens + stranded * _STRANDED_WEIGHT + lost * _LOST_WEIGHT + after


def _place_tiered(
    p: PreparedSnapshot, st: _State, role: Role, key: RoleKey, *, scope: ScopeKey, tier: int
) -> _Failure | None:
    """Assign the role's blocks to domains of ``tier`` jointly (DP), then fill nodes in name order."""
    size, full, rem = role_subgroups(role)
    total = full + (1 if rem else 0)
    need = _min_blocks(role)
    tier_name = p.snapshot.tiers[tier]
    groups = p.groups(scope, tier)
    base_caps = p.group_caps(key, scope, tier)
    base = p.base_fit(key)
    g = key[0]
    touched: dict[int, int] = {}
    if st.used_gpus:
        gidx = {d: k for k, (d, _) in enumerate(groups)}
        dom_t = p.dom[tier]
        for i in st.used_gpus:
            d = dom_t[i]
            k2 = gidx.get(d) if d is not None else None
            if k2 is not None:
                touched[k2] = 0
    whole = p.whole(tier)
    useful = useful_block(role)
    caps: list[tuple[int, int, int]] = []  # (group index, pods, free gpus)
    most: tuple[int, int] | None = None  # (pods, -group index) of the roomiest group, for the reason
    smallest = rem if rem else size
    for k, (cap0, free0) in enumerate(base_caps):
        cap, freeg = cap0, free0
        if k in touched:
            nodes = groups[k][1]
            cap = sum(_fit_now(p, st, i, key, base) for i in nodes)
            freeg = sum(p.free[i] - st.used_gpus.get(i, 0) for i in nodes)
        if most is None or (cap, -k) > most:
            most = (cap, -k)
        if cap >= smallest:
            caps.append((k, cap, freeg))

    def failure(count: int) -> _Failure:
        where = (
            f"; most room: {min(most[0], role.pods)} pods in {tier_name} domain {groups[-most[1]][0]}"
            if most is not None
            else f"; no node of the scope has a {tier_name} domain"
        )
        return _Failure(
            role.name,
            need,
            count,
            f"role {role.name!r} needs {need} subgroup(s) of {size} pod(s) x {g} GPU(s), each inside one "
            f"{tier_name} domain; only {count} fit{where}",
        )

    # full blocks are alike, so at most this many fit; when that is short of both all the blocks and
    # the minimum, the programme below would find exactly this count and fail
    most_full = min(full, sum(cap // size for _, cap, _ in caps))
    if _SHORTCUTS and most_full < full and most_full < need:
        return failure(most_full)
    has_rem = 1 if rem else 0
    # each candidate domain's cost of being opened (0 unless the gang would break a wholly free one)
    opens_at = [
        _OPENED_WEIGHT + _UPPER_WEIGHT * p.upper_opened(tier, groups[k][0])
        if k not in touched and whole[groups[k][0]]
        else 0
        for k, _, _ in caps
    ]
    if (
        _SHORTCUTS
        and not has_rem
        and most_full == full
        and (full == 1 or all(cap < 2 * size for _, cap, _ in caps))
    ):
        # one block, or every domain holds at most one block and the blocks are alike: a domain's
        # cost does not depend on the others, so the programme below picks the cheapest ``full``
        # domains, the earlier on ties
        priced = sorted(
            (_price(opens_at[gi], cap, freeg, size, g=g, useful=useful), gi)
            for gi, (_, cap, freeg) in enumerate(caps)
            if cap >= size
        )
        per_group: list[tuple[int, int]] = [(0, 0)] * len(caps)
        for _, gi in priced[:full]:
            per_group[gi] = (1, 0)
        return _fill_blocks(
            p, st, role, key, groups=groups, caps=caps, per_group=per_group, count=full, base=base, need=need
        )
    # DP over groups; state = a * 2 + b (a full blocks, b short block placed)
    n_states = (full + 1) * 2
    inf = None
    cost: list[int | None] = [inf] * n_states
    cost[0] = 0
    choices: list[list[tuple[int, int] | None]] = []
    for gi, (_, cap, freeg) in enumerate(caps):
        new = list(cost)
        choice: list[tuple[int, int] | None] = [None] * n_states
        max_x = min(full, cap // size)
        # this domain's cost of holding x full blocks and y short ones, the same from every state
        priced_xy: list[list[int]] = []
        for y in range(has_rem + 1):
            row: list[int] = []
            for x in range(max_x + 1):
                used = x * size + y * rem
                if used > cap:
                    break
                row.append(_price(opens_at[gi], cap, freeg, used, g=g, useful=useful))
            priced_xy.append(row)
        for s_idx in range(n_states):
            c0 = cost[s_idx]
            if c0 is None:
                continue
            a, b = divmod(s_idx, 2)
            for y in range(0, (1 - b) * has_rem + 1):
                row = priced_xy[y]
                for x in range(0, min(len(row) - 1, full - a) + 1):
                    if x == 0 and y == 0:
                        continue
                    c = c0 + row[x]
                    t_idx = (a + x) * 2 + b + y
                    cur = new[t_idx]
                    if cur is None or c < cur:
                        new[t_idx] = c
                        choice[t_idx] = (x, y)
        cost = new
        choices.append(choice)
    # best count: all blocks, else the most full blocks down to the minimum
    final: int | None = None
    count = 0
    if has_rem and cost[full * 2 + 1] is not None:
        final, count = full * 2 + 1, total
    else:
        for a in range(full, -1, -1):
            if cost[a * 2] is not None:
                final, count = a * 2, a
                break
    if final is None or count < need or (count == 0 and need > 0):
        return failure(count if final is not None else 0)
    # walk back the choices
    per_group = [(0, 0)] * len(caps)
    s_idx = final
    for gi in range(len(caps) - 1, -1, -1):
        ch = choices[gi][s_idx]
        if ch is not None:
            per_group[gi] = ch
            s_idx -= ch[0] * 2 + ch[1]
    return _fill_blocks(
        p, st, role, key, groups=groups, caps=caps, per_group=per_group, count=count, base=base, need=need
    )


def _fill_blocks(
    p: PreparedSnapshot,
    st: _State,
    role: Role,
    key: RoleKey,
    *,
    groups: list[tuple[str, list[int]]],
    caps: list[tuple[int, int, int]],
    per_group: list[tuple[int, int]],
    count: int,
    base: list[int],
    need: int,
) -> _Failure | None:
    """Fill the blocks the search gave each domain ((full blocks, short block) per group of caps)."""
    domains = _blocks_by_domain(groups, caps, per_group, role_subgroups(role)[1])
    ranges = _block_ranges(role, count)
    if (
        st.defer
        and st.deferred is None
        and all(len(nodes) == len(p.members[0].get(d, ())) for d, nodes, _ in domains)
    ):  # every chosen group is a whole tier-0 domain: count now, fill if chosen
        st.deferred = _Deferred(role, base, domains)
        for d, _, blocks in domains:
            n = sum(len(ranges[b]) for b in blocks)
            st.by_domain[d] = n
            st.placed_pods += n
        return None
    for dname, nodes, blocks in domains:
        for b in blocks:
            if not _fill(
                p, st, role, key, pod_range=ranges[b], nodes=nodes, base=base
            ):  # pragma: no cover - DP counted room
                return _Failure(role.name, need, b, f"role {role.name!r}: domain {dname} lost room")
            st.subgroups.append(SubgroupPlacement(role=role.name, index=b, domain=dname))
    return None


def _blocks_by_domain(
    groups: list[tuple[str, list[int]]],
    caps: list[tuple[int, int, int]],
    per_group: list[tuple[int, int]],
    full: int,
) -> list[tuple[str, list[int], list[int]]]:
    """(domain, its nodes, block indices) of each domain the search gave blocks, in group order: full
    blocks numbered on from one domain to the next, the short block (index ``full``) last in its."""
    out: list[tuple[str, list[int], list[int]]] = []
    next_full = 0
    for gi, (x, y) in enumerate(per_group):
        if x or y:
            dname, nodes = groups[caps[gi][0]]
            out.append((dname, nodes, [*range(next_full, next_full + x), *([full] if y else [])]))
            next_full += x
    return out


def _place_free(
    p: PreparedSnapshot, st: _State, role: Role, key: RoleKey, scope: ScopeKey
) -> _Failure | None:
    """Place a role without a subgroup tier: nodes the gang already uses first, then best fit.

    Its blocks have no domain, and its pods are alike, so the whole blocks that fit are the longest
    prefix whose pods the scope has room for; one pass fills them.
    """
    _, full, rem = role_subgroups(role)
    total = full + (1 if rem else 0)
    need = _min_blocks(role)
    base = p.base_fit(key)
    scope_dom = p.dom[scope[0]] if scope is not None else None
    used_first = [i for i in st.order if scope_dom is None or scope_dom[i] == scope[1]]  # type: ignore[index]
    useful = useful_block(role)
    ranges = _block_ranges(role, total)
    room = 0
    for i in _chain(
        used_first, (p.free_nodes(key, useful) if scope is None else p.free_order(key, scope, useful))
    ):
        room += _fit_now(p, st, i, key, base)
        if room >= role.pods:
            break
    count = pods = 0
    for r in ranges:
        if pods + len(r) > room:
            break
        pods += len(r)
        count += 1
    if count < need or count == 0:
        pods_needed = sum(len(r) for r in ranges[:need])
        unit = f"{key[0]} GPU(s)" + "".join(f", {q} {res}" for res, q in key[1])
        return _Failure(
            role.name,
            need,
            count,
            f"role {role.name!r} needs {pods_needed} pod(s) of {unit}; room for {min(room, pods_needed - 1)}"
            + (f" in {p.snapshot.tiers[scope[0]]} domain {scope[1]}" if scope is not None else ""),
        )
    nodes = _chain(
        used_first, (p.free_nodes(key, useful) if scope is None else p.free_order(key, scope, useful))
    )
    _fill(p, st, role, key, pod_range=range(pods), nodes=nodes, base=base)
    st.subgroups.extend(SubgroupPlacement(role=role.name, index=b, domain=None) for b in range(count))
    return None


def _chain(first: Sequence[int], rest: Iterable[int]) -> Iterable[int]:
    seen = set(first)
    yield from first
    for i in rest:
        if i not in seen:
            yield i


@dataclass(frozen=True)
class _Candidate:
    placed_pods: int
    opened: int
    upper: int
    stranded: int
    lost: int
    span: int
    leftover: int
    scope_name: str
    state: _State

    def rank(self) -> tuple[int, int, int, int, int, int, int, str]:
        return (
            -self.placed_pods,
            self.opened,
            self.upper,
            self.stranded,
            self.lost,
            self.leftover,
            self.span,
            self.scope_name,
        )


def _role_order(gang: Gang, sub_tiers: Mapping[str, int | None]) -> list[Role]:
    return sorted(
        gang.roles,
        key=lambda r: (0 if sub_tiers[r.name] is not None else 1, -r.pods * r.gpus_per_pod, r.name),
    )


def _attempt(
    p: PreparedSnapshot,
    roles: Sequence[Role],
    *,
    sub_tiers: Mapping[str, int | None],
    scope: ScopeKey,
    measure: int | None,
    main: Role,
) -> _Candidate | _Failure:
    st = _State()
    only_key = _role_key(roles[0])
    st.defer = (
        _SHORTCUTS
        and len(roles) == 1
        and sub_tiers[roles[0].name] == 0
        and measure == 0
        and only_key[0] > 0
        and not only_key[1]
    )
    for role in roles:
        key = _role_key(role)
        t = sub_tiers[role.name]
        fail = (
            _place_tiered(p, st, role, key, scope=scope, tier=t)
            if t is not None
            else _place_free(p, st, role, key, scope)
        )
        if fail is not None:
            return fail
    opened, upper, stranded, lost, leftover = _measure(p, st, measure, main)
    span = _span(p, st)
    scope_name = "" if scope is None else scope[1]
    return _Candidate(st.placed_pods, opened, upper, stranded, lost, span, leftover, scope_name, st)


def _measure(p: PreparedSnapshot, st: _State, tier: int | None, main: Role) -> tuple[int, int, int, int, int]:
    """(wholly free domains opened, wholly free higher-tier domains they break into, stranded GPUs
    added, useful blocks of room lost, free GPUs left) over the touched domains of the measuring
    tier. The second is one figure per tier, a higher tier weighing more (see
    ``PreparedSnapshot.upper_opened``)."""
    if tier is None or not (st.used_gpus or st.by_domain):
        return 0, 0, 0, 0, 0
    key = _role_key(main)
    useful = useful_block(main)
    base = p.base_fit(key)
    dom_t = p.dom[tier]
    whole = p.whole(tier)
    g, free = key[0], p.free
    gpu_only = g > 0 and not key[1]
    used = st.used_gpus
    totals = p.domain_totals(key, tier) if gpu_only else {}
    delta: dict[str, list[int]] = {}
    if st.by_domain:  # deferred (one GPU-only role at tier 0): each pod takes one pod of room
        touched = sorted(st.by_domain)
        delta = {d: [n, n * g] for d, n in st.by_domain.items()}
    else:
        touched = sorted({d for i in st.used_gpus if (d := dom_t[i]) is not None})
    opened = stranded = leftover = lost = 0
    if gpu_only and not st.by_domain:  # the change per domain, from the nodes the gang uses
        for i, u in used.items():
            dd = delta.setdefault(dom_t[i], [0, 0])  # type: ignore[arg-type]
            dd[0] += base[i] - (free[i] - u) // g
            dd[1] += u
    for d in touched:
        if gpu_only:
            cap_before, free_before = totals[d]
            cap_after, free_after = cap_before - delta[d][0], free_before - delta[d][1]
        else:
            nodes = p.members[tier][d]
            cap_before = sum(base[i] for i in nodes)
            free_before = sum(free[i] for i in nodes)
            cap_after = sum(_fit_now(p, st, i, key, base) for i in nodes)
            free_after = sum(free[i] - used.get(i, 0) for i in nodes)
        opened += whole[d]
        leftover += free_after
        stranded_d, lost_d = _room_change(cap_before, free_before, cap_after, free_after, useful)
        stranded += stranded_d
        lost += lost_d
    upper = 0
    top = len(p.members) - 1
    for t in range(tier + 1, top + 1):
        whole_t = p.whole(t)
        broken = {p.paths[tier][d][top - t] for d in touched if whole[d]}
        upper += sum(1 for a in broken if whole_t.get(a, False)) << (_UPPER_BITS * (t - tier - 1))
    return opened, upper, stranded, lost, leftover


def _span(p: PreparedSnapshot, st: _State) -> int:
    if st.by_domain:  # deferred: tier-0 domains, whose ancestors are their paths
        doms = list(st.by_domain)
        if len(doms) == 1:
            return 0
        top = len(p.dom) - 1
        paths = p.paths[0]
        for ti in range(1, top + 1):
            anc = paths[doms[0]][top - ti]
            if anc and all(paths[d][top - ti] == anc for d in doms):
                return ti
        return len(p.dom)
    used = list(st.used_gpus)
    for ti, dom_t in enumerate(p.dom):
        first = dom_t[used[0]]
        if first is not None and all(dom_t[i] == first for i in used):
            return ti
    return len(p.dom)


# -- the entry point -------------------------------------------------------------------------------


def _validate(p: PreparedSnapshot, gang: Gang) -> str | None:
    if not gang.roles:
        return f"gang {gang.name!r} has no roles"
    seen: set[str] = set()
    for role in gang.roles:
        if role.name in seen:
            return f"gang {gang.name!r}: duplicate role name {role.name!r}"
        seen.add(role.name)
        if role.pods <= 0:
            return f"role {role.name!r}: pods must be positive"
        if role.gpus_per_pod < 0:
            return f"role {role.name!r}: gpus_per_pod must not be negative"
        if role.subgroup_size is not None and role.subgroup_size <= 0:
            return f"role {role.name!r}: subgroup_size must be positive"
        for res, qty in role.resources_per_pod.items():
            if qty < 0:
                return f"role {role.name!r}: {res} must not be negative"
        if role.subgroup_tier is not None and role.subgroup_tier not in p.tier_index:
            tiers = list(p.tier_index)
            return f"role {role.name!r}: unknown subgroup_tier {role.subgroup_tier!r}; tiers: {tiers}"
    if gang.tier is not None and gang.tier not in p.tier_index:
        return f"gang {gang.name!r}: unknown tier {gang.tier!r}; tiers: {list(p.tier_index)}"
    return None


def _per_node_reason(p: PreparedSnapshot, roles: Sequence[Role]) -> str | None:
    """The binding constraint when no single node (or the whole cluster) can hold a role."""
    for role in roles:
        key = _role_key(role)
        fit = p.base_fit(key)
        if not any(fit):
            most = max((f for f, s in zip(p.free, p.schedulable, strict=True) if s), default=0)
            extra = "".join(f", {q} {res}" for res, q in key[1])
            return (
                f"role {role.name!r}: no schedulable node has room for one pod "
                f"({role.gpus_per_pod} GPU(s){extra}); most free GPUs on one node: {most}"
            )
    return None


def _sub_tier(role: Role, p: PreparedSnapshot, relax: int) -> int | None:
    if role.subgroup_tier is None:
        return None
    t = p.tier_index[role.subgroup_tier] + relax
    return t if t < len(p.snapshot.tiers) else None


def _plan_once(p: PreparedSnapshot, gang: Gang, relax: int) -> _Candidate | _Failure | str:
    sub_tiers = {r.name: _sub_tier(r, p, relax) for r in gang.roles}
    gang_tier: int | None = None
    if gang.tier is not None:
        gang_tier = p.tier_index[gang.tier] + relax
        if gang_tier >= len(p.snapshot.tiers):
            gang_tier = None
    if gang_tier is not None and len(gang.roles) == 1:
        # one role whose pods form one block: "the gang in one domain of T" is "the block in one
        # domain of T", which the subgroup search answers in a single pass over the domains
        only = gang.roles[0]
        _, full, rem = role_subgroups(only)
        if full + (1 if rem else 0) == 1:
            t = sub_tiers[only.name]
            sub_tiers[only.name] = gang_tier if t is None else min(t, gang_tier)  # domains nest
            gang_tier = None
    roles = _role_order(gang, sub_tiers)
    main = roles[0]
    sub_levels = [t for t in sub_tiers.values() if t is not None]
    measure: int | None = None  # no tiers: nothing to strand
    if p.snapshot.tiers:
        measure = min(sub_levels) if sub_levels else (gang_tier if gang_tier is not None else 0)
    main_key = _role_key(main)
    main_need = sum(len(r) for r in _block_ranges(main, _min_blocks(main)))

    def scopes_at(ti: int) -> list[ScopeKey]:
        if _SHORTCUTS and main_key[0] > 0 and main_need * main_key[0] > p.most_gpus(ti):
            return []  # no domain of the tier has that many GPUs at all
        caps = p.tier_capacity(main_key, ti)
        return [(ti, d) for d in p.members[ti] if caps[d] >= main_need]

    top: list[ScopeKey]
    if gang_tier is None:
        top = [None]
        top_name = "the cluster"
    else:
        top = scopes_at(gang_tier)
        top_name = f"one {p.snapshot.tiers[gang_tier]} domain"
        if not top:
            cap = max(
                ((p.scope_capacity(main_key, (gang_tier, d)), d) for d in p.members[gang_tier]),
                key=lambda c: (c[0], c[1]),
                default=None,
            )
            most = f"; most room: {cap[0]} pods in {cap[1]}" if cap else ""
            return (
                f"gang {gang.name!r} must fit inside {top_name}: role {main.name!r} needs {main_need} pod(s) "
                f"of {main.gpus_per_pod} GPU(s) there{most}"
            )
    best: _Candidate | None = None
    fail: _Failure | None = None
    all_pods = sum(r.pods for r in gang.roles)
    for scope in top:
        if (
            _SHORTCUTS
            and best is not None
            and best.placed_pods == all_pods  # a plan placing more pods would rank first whatever it opens
            and _opened_at_least(p, main, sub_tiers[main.name], scope, measure) > best.opened
        ):
            continue  # its plan would rank below best: more wholly free domains opened
        res = _attempt(p, roles, sub_tiers=sub_tiers, scope=scope, measure=measure, main=main)
        if isinstance(res, _Failure):
            if fail is None or res.got > fail.got:
                fail = res
            continue
        if best is None or res.rank() < best.rank():
            best = res
    if best is None:
        assert fail is not None
        if gang_tier is not None:
            return f"gang {gang.name!r} must fit inside {top_name}: best try: {fail.message}"
        return fail
    # a tighter scope may do better: try lower tiers, the first tier with a better plan wins
    upper = len(p.snapshot.tiers) if gang_tier is None else gang_tier
    gang_gpus = sum(r.pods * r.gpus_per_pod for r in gang.roles)
    # the tier whose plans all span it: set when no single domain of the tier below (the measuring
    # tier) can do as well as best, so a plan that fits in one of them is rejected anyway
    span_floor: int | None = None
    for ti in range(min(upper, best.span)):
        found: _Candidate | None = None
        applies, quick = _one_domain_choice(p, roles, best, ti, measure) if _SHORTCUTS else (False, None)
        if quick is not None:
            res = _attempt(p, roles, sub_tiers=sub_tiers, scope=quick, measure=measure, main=main)
            if isinstance(res, _Candidate) and res.rank() < best.rank():
                return res
        if applies:
            span_floor = ti + 1
            continue  # no domain of this tier does better than best
        useful = useful_block(main)
        room = (
            _partial_room(p, main_key, measure, ti, useful)
            if _SHORTCUTS and best.opened == 0 and measure is not None and best.placed_pods == all_pods
            else None
        )
        # one GPU-only role placed whole: a plan that opens nothing loses at least the blocks its pods
        # need beyond the room left over after whole blocks
        whole_role = len(roles) == 1 and main_key[0] > 0 and not main_key[1] and best.placed_pods == main.pods
        for scope in scopes_at(ti):
            if room is not None:
                partly, left_over, stranded_now = room.get(scope[1], (0, 0, 0))  # type: ignore[index]
                if partly < main_need:
                    continue  # every plan there opens a wholly free domain, which best does not
                # a plan fills at most the stranded GPUs there, and at most as many as the gang holds
                can_fill = min(stranded_now, gang_gpus)
                if best.stranded + can_fill < 0:
                    continue  # it still strands more than best
                if (
                    whole_role
                    and best.stranded + can_fill <= 0  # it cannot strand less than best ...
                    and -(-(main.pods - left_over) // useful) > best.lost  # ... and loses more blocks
                ):
                    continue
                if (
                    found is not None
                    and span_floor == ti
                    and scope[1] > found.scope_name  # type: ignore[index]
                    and found.rank()[:7] <= (-all_pods, 0, 0, -can_fill, 0, 0, ti)
                ):
                    continue  # its best conceivable plan ties with found, whose scope name is first
            res = _attempt(p, roles, sub_tiers=sub_tiers, scope=scope, measure=measure, main=main)
            if isinstance(res, _Failure):
                continue
            if res.rank() >= best.rank():
                continue
            if found is None or res.rank() < found.rank():
                found = res
        if found is not None:
            return found
    return best


def _one_domain_choice(
    p: PreparedSnapshot, roles: Sequence[Role], best: _Candidate, ti: int, measure: int | None
) -> tuple[bool, ScopeKey]:
    """The tier-``ti`` domain the scope search below would pick, found from domain totals alone.

    Exact in the common case: one role asking GPUs only, all of its pods placed by ``best``, and
    ``ti`` the measuring tier. A domain that holds every pod is then one touched domain whose
    opened / stranded / leftover figures follow from its room and free GPUs before the plan (each
    pod takes one pod's worth of room). Returns (whether the case applies, the domain or None when
    no domain of the tier qualifies).
    """
    if len(roles) != 1 or ti != measure:
        return False, None
    role = roles[0]
    key = _role_key(role)
    g = key[0]
    if key[1] or g <= 0 or best.placed_pods != role.pods:
        return False, None
    useful = useful_block(role)
    whole = p.whole(ti)
    bound = best.rank()[1:4]
    pick: tuple[int, int, int, int, int, str] | None = None
    for (d, _), (cap, free) in zip(p.groups(None, ti), p.group_caps(key, None, ti), strict=True):
        if cap < role.pods:
            continue
        after = free - role.pods * g
        stranded, lost = _room_change(cap, free, cap - role.pods, after, useful)
        item = (int(whole[d]), p.upper_opened(ti, d), stranded, lost, after, d)
        if item[:3] <= bound and (pick is None or item < pick):
            pick = item
    return True, (None if pick is None else (ti, pick[5]))


def _opened_at_least(
    p: PreparedSnapshot, main: Role, sub_tier: int | None, scope: ScopeKey, measure: int | None
) -> int:
    """A lower bound on the wholly free measuring-tier domains any plan inside ``scope`` opens: the
    main role's minimum full-size blocks (pods, for a role without a subgroup tier) that do not fit
    in the partly used domains go to wholly free ones, the roomiest first. A short last block is left
    out: it may fit in the room a full block leaves over."""
    if measure is None or (sub_tier is not None and sub_tier != measure):
        return 0
    key = _role_key(main)
    size, full, _ = role_subgroups(main)
    if sub_tier is None:
        size, need = 1, sum(len(r) for r in _block_ranges(main, _min_blocks(main)))
    else:
        need = min(_min_blocks(main), full)
    whole = p.whole(measure)
    fresh: list[int] = []
    for (d, _), (cap, _) in zip(p.groups(scope, measure), p.group_caps(key, scope, measure), strict=True):
        if whole[d]:
            fresh.append(cap // size)
        else:
            need -= cap // size
    opened = 0
    for room in sorted(fresh, reverse=True):
        if need <= 0:
            break
        need -= room
        opened += 1
    return opened


def _partial_room(
    p: PreparedSnapshot, key: RoleKey, measure: int, ti: int, useful: int
) -> dict[str, tuple[int, int, int]] | None:
    """Per domain of tier ``ti`` above ``measure``, over its measuring-tier domains that are not
    wholly free: (pods of this shape they can host, the part of that room left over beyond whole
    useful blocks, the free GPUs stranded in them now). None when ``ti`` is not above ``measure``."""
    if ti <= measure:
        return None
    whole = p.whole(measure)
    up = len(p.snapshot.tiers) - 1 - ti  # position of tier ti in a path (top tier first)
    paths = p.paths[measure]
    out: dict[str, tuple[int, int, int]] = {}
    for (d, _), (cap, free) in zip(p.groups(None, measure), p.group_caps(key, None, measure), strict=True):
        if not whole[d]:
            anc = paths[d][up]
            total, left, stranded = out.get(anc, (0, 0, 0))
            out[anc] = (total + cap, left + cap % useful, stranded + (free if cap < useful else 0))
    return out


def plan(snapshot: ClusterSnapshot | PreparedSnapshot, gang: Gang) -> PlanResult:
    """Place every pod of ``gang`` on ``snapshot`` (all or nothing), or say what binds."""
    p = _prepared(snapshot)
    invalid = _validate(p, gang)
    if invalid is not None:
        return Infeasible(invalid)
    per_node = _per_node_reason(p, gang.roles)
    if per_node is not None:
        return Infeasible(per_node)
    levels = len(p.snapshot.tiers) + 1 if gang.soft else 1
    first_reason: str | None = None
    for relax in range(levels):
        res = _plan_once(p, gang, relax)
        if isinstance(res, _Candidate):
            return _to_plan(p, res, relax)
        reason = res if isinstance(res, str) else res.message
        if first_reason is None:
            first_reason = reason
    assert first_reason is not None
    if gang.soft:
        first_reason += " (soft: no placement even with tier constraints dropped)"
    return Infeasible(first_reason)


def _place_deferred(p: PreparedSnapshot, d: _Deferred) -> tuple[dict[str, str], list[SubgroupPlacement], int]:
    """(placement, subgroups, nodes used) of deferred blocks, as ``_fill_blocks`` would have put
    them: per domain, its blocks' pods in order over its nodes in name order, as many per node as
    fit (each block starts on the node where the one before stopped, if it has room left)."""
    size = role_subgroups(d.role)[0]
    name, total, base = d.role.name, d.role.pods, d.base
    node_of = [-1] * total
    subgroups: list[SubgroupPlacement] = []
    used = 0
    for dname, nodes, blocks in d.domains:
        free_nodes = iter(nodes)
        node = room = 0
        for b in blocks:
            for k in range(b * size, min((b + 1) * size, total)):
                while room <= 0:  # the search counted the room: the domain does not run out
                    node = next(free_nodes)
                    room = base[node]
                    used += room > 0
                node_of[k] = node
                room -= 1
            subgroups.append(SubgroupPlacement(role=name, index=b, domain=dname))
    names = p.names
    placement = {f"{name}-{k}": names[i] for k, i in enumerate(node_of) if i >= 0}
    return placement, subgroups, used


def _to_plan(p: PreparedSnapshot, c: _Candidate, relax: int) -> Plan:
    st = c.state
    if st.deferred is not None:
        placement, found, nodes_used = _place_deferred(p, st.deferred)
    else:
        names = p.names
        placement = {f"{role}-{pod}": names[i] for role, pod, i in sorted(st.pods)}
        found, nodes_used = st.subgroups, len(st.used_gpus)
    subgroups = tuple(sorted(found, key=lambda s: (s.role, s.index)))
    score: dict[str, float] = {
        "placed_pods": float(c.placed_pods),
        "opened_domains": float(c.opened),
        "opened_upper": float(c.upper),
        "stranded_gpus": float(c.stranded),
        "lost_blocks": float(c.lost),
        "span_tier": float(c.span + 1),
        "leftover_gpus": float(c.leftover),
        "relaxed_tiers": float(relax),
        "nodes_used": float(nodes_used),
    }
    return Plan(placement=placement, subgroups=subgroups, score=score)
