"""Kueue topology-aware scheduling (TAS) with the BestFit algorithm, re-implemented from its design.

Follows kubernetes-sigs/kueue ``pkg/cache/scheduler/tas_flavor_snapshot.go``
(``findTopologyAssignment``: ``fillInCounts``, ``findLevelWithFitDomains``,
``updateCountsToMinimumGeneric``, ``findBestFitDomain``) and KEP 2724:

- Each role is one PodSet, placed in turn. Its subgroups are Kueue slices
  (``podset-slice-required-topology`` = the subgroup tier, ``podset-slice-size`` = the subgroup size).
- Phase 1: a node's pod count is how many pods fit in its free GPUs; counts add up the tree; at the
  slice level a domain's slice count is ``pods // slice size``, above it the sum of its children's.
- Phase 2a, at the requested level (the gang's tier, required; without one, the top tier, preferred):
  domains sorted by slice count descending, then pod count ascending, then name; if the first holds
  every slice, pick the first domain with the smallest slice count that does (best fit). Required and
  none fits: fail; preferred: climb a level; at the top, take sorted domains greedily and best-fit the last.
- Phase 2b: walk down; in each chosen domain sort its children the same way, take them greedily and
  best-fit the last, in units of slices down to the slice level and of pods below it.
- A short last subgroup counts as a whole slice (Kueue only has equal slices), so such a gang can be
  refused where it would fit; the benchmark's workloads have no short subgroups.
- Slices and pods are numbered in the order the domains and nodes were taken (Kueue's ungater assigns
  pods to domains by index).

Queue of its own (``OWN_QUEUE``: ``greedy``, no preemption). A ClusterQueue's default
``queueingStrategy`` is ``BestEffortFIFO`` (``apis/kueue/v1beta1/clusterqueue_types.go``;
``pkg/cache/queue/cluster_queue.go``): workloads are ordered by priority, then creation time, and one
that cannot be admitted (here: TAS finds no assignment) is set aside as inadmissible while later ones
are admitted; nothing is reserved for it. ``preemption.withinClusterQueue`` defaults to ``Never``.
"""

from __future__ import annotations

from scheduler_plugin.placement.policies.base import Index, IndexCache, Ledger, Unit, make_plan, units
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, PlanResult, Role

_Node = int | str  # a node index (level 0) or a domain name (level >= 1)


class Kueue:
    name = "kueue"
    gang = True

    def __init__(self) -> None:
        self._indexes = IndexCache()

    def place(self, snapshot: ClusterSnapshot, gang: Gang) -> PlanResult:
        idx = self._indexes.index_for(snapshot)
        ledger = Ledger(idx.free)
        tree = _Tree(idx)
        assigned: list[tuple[Unit, list[int], str | None]] = []
        role_units = units(gang)
        for role in gang.roles:
            got = self._podset(idx, tree, ledger, role, gang)
            if isinstance(got, Infeasible):
                return got
            nodes_in_order, slice_domains = got
            for u in (u for u in role_units if u.role == role.name):
                nodes = nodes_in_order[u.first_pod : u.first_pod + u.pods]
                for n in nodes:
                    ledger.take(n, role.gpus_per_pod)
                domain = slice_domains[u.subgroup] if u.subgroup is not None else None
                assigned.append((u, nodes, domain))
        return make_plan(idx, assigned)

    def _podset(
        self, idx: Index, tree: _Tree, ledger: Ledger, role: Role, gang: Gang
    ) -> tuple[list[int], list[str]] | Infeasible:
        g = role.gpus_per_pod
        size = role.subgroup_size if role.subgroup_tier and role.subgroup_size else 1
        slice_level = idx.level(role.subgroup_tier) if role.subgroup_tier and role.subgroup_size else 0
        top = len(idx.tiers)
        required = gang.tier is not None and not gang.soft
        level = idx.level(gang.tier) if gang.tier is not None else top
        if level < slice_level:
            return Infeasible(
                reason=f"kueue: slice level {role.subgroup_tier} is above the podset level {gang.tier}"
            )
        pods: dict[int, dict[_Node, int]] = {
            level_: {} for level_ in range(top + 1)
        }  # level -> domain -> pod count
        slices: dict[int, dict[_Node, int]] = {level_: {} for level_ in range(top + 1)}
        for i in idx.all_nodes:
            pods[0][i] = ledger.free[i] // g
        for k in range(1, top + 1):
            for d, kids in tree.children[k].items():
                pods[k][d] = sum(pods[k - 1][c] for c in kids)
        if slice_level == 0:
            slices[0] = dict(pods[0])
        for k in range(max(1, slice_level), top + 1):
            for d, kids in tree.children[k].items():
                slices[k][d] = pods[k][d] // size if k == slice_level else sum(slices[k - 1][c] for c in kids)
        need = -(-role.pods // size)

        def order(level_: int, cands: list[_Node]) -> list[_Node]:
            return sorted(cands, key=lambda d: (-slices[level_][d], pods[level_][d], str(d)))

        chosen: list[tuple[_Node, int]] | None = None
        while chosen is None:
            ranked = order(level, list(tree.children[level]) if level > 0 else list(idx.all_nodes))
            if ranked and slices[level][ranked[0]] >= need:
                chosen = [(_best_fit(ranked, slices[level], need), need)]
            elif required:
                return Infeasible(
                    reason=f"kueue: no {gang.tier} domain fits {need} slices of role {role.name}"
                )
            elif level < top:
                level += 1
            else:
                chosen = _greedy(ranked, slices[level], need)
                if chosen is None:
                    return Infeasible(
                        reason=f"kueue: the cluster does not fit {need} slices of role {role.name}"
                    )
        # walk down to the slice level in units of slices
        while level > slice_level:
            nxt: list[tuple[_Node, int]] = []
            for d, count in chosen:
                kids = order(level - 1, list(tree.children[level][d]))
                part = _greedy(kids, slices[level - 1], count)
                if part is None:
                    return Infeasible(reason=f"kueue: counts do not add up below {d}")
                nxt.extend(part)
            chosen, level = nxt, level - 1
        # below the slice level: pods of each slice-level domain onto its nodes
        nodes_in_order: list[int] = []
        slice_domains: list[str] = []
        left = role.pods
        for d, count in chosen:
            want = min(count * size, left)
            left -= want
            if slice_level == 0:
                nodes_in_order.extend([int(d)] * want)
                continue
            slice_domains.extend([str(d)] * count)
            members = idx.domains[idx.tiers[slice_level - 1]][str(d)]
            ranked_nodes: list[_Node] = sorted(members, key=lambda i: (-pods[0][i], i))
            part = _greedy(ranked_nodes, pods[0], want)
            if part is None:
                return Infeasible(reason=f"kueue: pods do not fit the nodes of {d}")
            for n, c in part:
                nodes_in_order.extend([int(n)] * c)
        return nodes_in_order, slice_domains


def _best_fit(ranked: list[_Node], counts: dict[_Node, int], need: int) -> _Node:
    """The first domain (in ranked order) with the smallest count that still covers ``need``."""
    fits = [d for d in ranked if counts[d] >= need]
    smallest = min(counts[d] for d in fits)
    return next(d for d in fits if counts[d] == smallest)


def _greedy(ranked: list[_Node], counts: dict[_Node, int], need: int) -> list[tuple[_Node, int]] | None:
    """Take domains in ranked order until ``need`` is met; best-fit the last one."""
    out: list[tuple[_Node, int]] = []
    rest = [d for d in ranked if counts[d] > 0]
    while need > 0:
        if not rest:
            return None
        if any(counts[d] >= need for d in rest):
            out.append((_best_fit(rest, counts, need), need))
            return out
        head = rest.pop(0)
        out.append((head, counts[head]))
        need -= counts[head]
    return out


class _Tree:
    """Children per domain: ``children[k][d]`` lists tier-(k-1) domains (node indices for k = 1)."""

    def __init__(self, idx: Index) -> None:
        self.children: dict[int, dict[_Node, list[_Node]]] = {0: {}}
        for k, tier in enumerate(idx.tiers, start=1):
            level: dict[_Node, list[_Node]] = {d: [] for d in idx.domains[tier]}
            if k == 1:
                for d, members in idx.domains[tier].items():
                    level[d] = list(members)
            else:
                below = idx.tiers[k - 2]
                for d, members in idx.domains[below].items():
                    parent = idx.node_domain[members[0]].get(tier)
                    if parent is not None:
                        level[parent].append(d)
            self.children[k] = level
