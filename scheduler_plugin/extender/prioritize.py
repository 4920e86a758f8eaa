"""The prioritize verb: a score per candidate node (0..10, kube-scheduler's extender range; it scales by
weight x 10). Pure.

A gang's pod: its planned node only. A pod on its own: the nodes it fits ranked by the planner's
objective (``planner.objective.price`` of its tier-1 domain taking it: not opening a wholly free domain
first, then the fullest domain, then the fullest node), so wholly free domains stay whole for gangs.
The ranks are kept per requested GPU count and brought up to date for the tier-1 domains whose nodes
changed (``Cache.state_log``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from typing import Any

from scheduler_plugin.cluster import pod_key
from scheduler_plugin.extender.cache import Cache, DomainIndex, gpus_of
from scheduler_plugin.extender.holds import Holds
from scheduler_plugin.planner.objective import open_cost, price

MAX_PRIORITY = 10  # kube-scheduler's MaxExtenderPriority
RANK_MEMORY = 16  # requested GPU counts whose ranks prioritize keeps


class Prioritize:
    """The prioritize verb (``state.prioritize(pod, node_names, now)``) and the ranks it keeps."""

    def __init__(self, cache: Cache, holds: Holds) -> None:
        self.cache = cache
        self.holds = holds
        # per requested count: each fitting node's rank and the state log position it is up to date with;
        # each ranked node's place among the distinct ranks; per (tier-1 domain, count) its room
        self._rank_cache: dict[int, tuple[dict[str, tuple[int, int]], int]] = {}
        self._rank_places: dict[int, tuple[object, dict[str, int]]] = {}
        self._room: dict[tuple[str, int], tuple[int, int, int]] = {}
        self._index: DomainIndex | None = None  # the domains the ranks were worked out on
        self._epoch = -1  # the state log's epoch they follow

    def __call__(
        self, pod: Mapping[str, Any], node_names: Sequence[str], now: float
    ) -> list[tuple[str, int]]:
        """The candidates' scores (module docstring): best 10, the last of the fitting ones 1, a node it
        does not fit 0."""
        self.holds.expire(now)
        known, _ = self.cache.known_pod(pod)
        if known is None:
            return [(n, 0) for n in node_names]
        info = self.cache.info[pod_key(known)]
        if info.gang is not None:
            res = self.holds.started.get(info.gang[1])
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
        and brought up to date for the tier-1 domains whose nodes changed since (``Cache.state_log``)."""
        self.cache.snapshot()
        index = self.cache.domains()
        log = self.cache.state_log
        if self._index is not index or self._epoch != self.cache.state_epoch:
            self._index, self._epoch, self._rank_cache, self._room = index, self.cache.state_epoch, {}, {}
        cached = self._rank_cache.get(need)
        if cached is not None and cached[1] == len(log):
            return cached[0]
        changed = log[cached[1] :] if cached is not None else []
        domains = {index.of[n] for n in changed if n in index.of}
        for d in domains:
            self._room.pop((d, need), None)
        if cached is None:
            redo: Iterable[str] = self.cache.states
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
        if cached is None and len(self._rank_cache) >= RANK_MEMORY:
            self._rank_cache.clear()
        self._rank_cache[need] = (found, len(log))
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
            if len(self._rank_places) >= RANK_MEMORY:
                self._rank_places.clear()
            self._rank_places[need] = (entry, found)
        return found

    def _rank_key(self, node: str, need: int) -> tuple[int, int] | None:
        """Where placing ``need`` GPUs on ``node`` ranks under the objective (smaller is better), or
        None when they do not fit there."""
        state = self.cache.states.get(node)
        if state is None or state.free < need or state.gpus <= 0:
            return None
        if need <= 0:
            return (0, 0)
        domain = self.cache.domains().of.get(node)
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
            states = self.cache.states
            members = [states[m] for m in self.cache.domains().members.get(domain, ()) if m in states]
            found = (
                sum(s.free for s in members),
                sum(s.gpus for s in members),
                sum(s.free // need for s in members),
            )
            self._room[(domain, need)] = found
        return found
