"""Prepared snapshots: the indexes of one cluster snapshot, built once and derived from the last one.

``prepare(snapshot)`` indexes nodes (in name order) and domains per tier; a ``PreparedSnapshot`` then
builds capacity caches per pod shape on demand (pods each node and domain can host, wholly free
domains, the node orders of ``objective.node_key``). A new snapshot with the same topology as an
earlier one (same nodes, GPUs and domains in the same order: the usual case between two scheduling
cycles) is prepared from it: the topology indexes are shared, and each capacity cache is copied from
the nearest of the last ``_CHAIN`` snapshots that built it, with only the entries of nodes changed
since then (and their domains) recomputed; once an eighth of the nodes has changed, building it afresh
(in C-level passes) is cheaper and is done instead.

``SnapshotCache`` keeps the last few prepared snapshots by identity for a caller that plans again and
again (the extender's state, a simulated policy); whoever composes the planner owns one. Nothing here
is module-global. Pure: no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, repeat
from operator import itemgetter
from typing import cast

from scheduler_plugin.planner.objective import node_key, node_key_columns, remainder_key, upper_step
from scheduler_plugin.planner.roles import RoleKey
from scheduler_plugin.snapshot import ClusterSnapshot, changed_nodes, name_order

__all__ = ["UNLIMITED", "PreparedSnapshot", "ScopeKey", "SnapshotCache", "prepare"]

UNLIMITED = 1 << 40  # pods a node can host when nothing about it limits the role
ScopeKey = tuple[int, str] | None  # (tier index, domain) or None for the whole cluster


def _one_picker(i: int) -> Callable[[Sequence[int]], tuple[int, ...]]:
    return lambda values: (values[i],)


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
    degraded: list[bool] = field(default_factory=list)  # per node: fabric degraded (part of the topology)
    any_degraded: bool = False
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
    _order_keys: dict[tuple[RoleKey, ScopeKey], list[tuple[int, ...]]] = field(default_factory=dict)
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
    def clean_room(
        self, key: RoleKey, nodes: Iterable[int], fit: Callable[[int], int] | None = None
    ) -> int | None:
        """Pods of this shape the clean nodes among ``nodes`` can host (``fit``: each node's room, default
        ``base_fit``); ``None`` when none of them is degraded (no ``degraded`` figure to price)."""
        if not self.any_degraded:
            return None
        degraded = self.degraded
        nodes = list(nodes)
        if not any(degraded[i] for i in nodes):
            return None
        room = fit if fit is not None else self.base_fit(key).__getitem__
        return sum(room(i) for i in nodes if not degraded[i])

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
        n = (self.free[i] - used_gpus) // gpus if gpus > 0 else UNLIMITED
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
        higher tier weighs more than every lower one (``objective.upper_step``); 0 if ``d`` is not
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
                        cached += upper_step(t - tier - 1)
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
                        cached[d] = _whole_bit(self, self.members[tier][d]) == (True, True)
            self._whole[tier] = cached
        return cached

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
                cached[d] = _whole_bit(self, self.members[0][d])
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
                        cached[k] = (min(UNLIMITED, sum(fit[i] for i in nodes)), sum(free[i] for i in nodes))
            elif scope is not None and tier == 0:  # whole tier-1 domains take the cluster's figures
                totals = self.domain_totals(key, 0)
                members = self.members[0]
                cached = [
                    totals[d]
                    if len(nodes) == len(members[d])
                    else (min(UNLIMITED, sum(fit[i] for i in nodes)), sum(free[i] for i in nodes))
                    for d, nodes in self.groups(scope, tier)
                ]
            else:  # every group: its nodes' entries picked in C
                cached = [
                    (min(UNLIMITED, sum(pick(fit))), sum(pick(free))) for pick in self._pickers(scope, tier)
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
            elif prev is not None and prev < UNLIMITED and o.src is not None:
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
                cached = min(UNLIMITED, total)
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
                cached = min(UNLIMITED, sum(fit[i] for i in self.scope_nodes(scope)))
            self._scope_cap[ck] = cached
        return cached

    def free_order(self, key: RoleKey, scope: ScopeKey, useful: int) -> list[int]:
        """Where a role without a subgroup tier looks for room: ``remainder_order``, then the nodes
        that can host this shape in ``objective.node_key`` order (those of wholly free tier-1 domains
        last, then best fit, then name). A domain scope takes the cluster's order restricted to its
        nodes (both orders are per node and per tier-1 domain, and tier-1 domains nest in every
        scope)."""
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
            return map(itemgetter(-1), keys)
        taken = set(first)
        return chain(first, (k[-1] for k in keys if k[-1] not in taken))

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
                        found.append(remainder_key(free, fit[i], i))
                        left -= fit[i]
                cached = [k[-1] for k in sorted(found)]
            self._remainder[ck] = cached
        return cached

    def _scope_order_keys(self, key: RoleKey, scope: ScopeKey) -> list[tuple[int, ...]]:
        """The nodes of the scope that can host this shape as sorted ``objective.node_key`` keys (from
        whether the node's tier-1 domain is wholly free and its pods of room; the node last). Derived
        from an earlier snapshot's when one has them: only changed nodes and the nodes of tier-1 domains
        whose wholeness changed can move."""
        ck = (key, scope)
        cached = self._order_keys.get(ck)
        if cached is not None:
            return cached
        fit = self.base_fit(key)
        whole = self.whole(0) if self.dom else {}
        dom0 = self.dom[0] if self.dom else None
        degraded = self.degraded

        def sort_key(i: int) -> tuple[int, ...]:
            d = dom0[i] if dom0 is not None else None
            return node_key(whole.get(d, False) if d is not None else False, fit[i], degraded[i], i)

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
            kept: list[tuple[int, ...]] | None = None
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
                    was_whole = (old_whole or {}).get(d, False) if d is not None else False
                    old = node_key(was_whole, old_fit[i], degraded[i], i)  # degraded: topology, unchanged
                    at = bisect.bisect_left(kept, old)
                    if at == len(kept) or kept[at] != old:  # pragma: no cover - src's keys are these
                        kept = None
                        break
                    del kept[at]
            cached = kept if kept is not None else [k for k in prev if k[-1] not in moved]
            for i in sorted(moved):
                if fit[i] > 0 and (in_scope is None or i in in_scope):
                    bisect.insort(cached, sort_key(i))
        elif scope is None:  # every node: the keys zipped and sorted in C
            # a node without a tier-1 domain (None) is in none that is wholly free
            by_dom = cast("dict[str | None, bool]", whole)
            opens = list(map(by_dom.get, dom0, repeat(False))) if dom0 else [False] * len(fit)
            cached = sorted(compress(node_key_columns(opens, fit, degraded), fit))
        else:
            cached = sorted(sort_key(i) for i in self.scope_nodes(scope) if fit[i] > 0)
        self._order_keys[ck] = cached
        return cached


def _whole_bit(p: PreparedSnapshot, nodes: list[int]) -> tuple[bool, bool]:
    """Over ``nodes`` of ``p``: (every schedulable node has all its GPUs free, some schedulable node
    has a free GPU). A fact of the node arrays alone, so not one of the snapshot's cached views."""
    schedulable, free, gpus = p.schedulable, p.free, p.gpus
    live = [i for i in nodes if schedulable[i]]
    return all(free[i] == gpus[i] for i in live), any(free[i] > 0 for i in live)


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
            degraded=like.degraded,
            any_degraded=like.any_degraded,
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
        degraded=[n.degraded for n in nodes],
        any_degraded=any(n.degraded for n in nodes),
        order=order,
        position=position,
    )


class SnapshotCache:
    """The last ``size`` prepared snapshots, newest first, found by the snapshot object's identity.

    A snapshot not seen yet is prepared from the newest one (``prepare(..., like=...)``), so a caller
    that plans on one snapshot after another recomputes only what changed. Owned by the caller; one
    per planning loop (the extender's state, a simulated policy).
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._kept: list[PreparedSnapshot] = []

    def prepared(self, snapshot: ClusterSnapshot | PreparedSnapshot) -> PreparedSnapshot:
        """``snapshot`` prepared: kept from before, or prepared now (and kept)."""
        if isinstance(snapshot, PreparedSnapshot):
            return snapshot
        for p in self._kept:
            if p.snapshot is snapshot:
                return p
        p = prepare(snapshot, like=self._kept[0] if self._kept else None)
        self._kept.insert(0, p)
        del self._kept[self.size :]
        return p
