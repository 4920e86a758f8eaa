"""Slurm's topology/block plugin, re-implemented from its documented algorithm.

Follows SchedMD/slurm ``src/plugins/topology/block/eval_nodes_block.c`` (``eval_nodes_block``) and
``doc/html/topology.shtml`` ("Block Topology"), with ``topology.conf`` semantics from
``doc/man/man5/topology.conf.5``:

- Base blocks are the tier-1 (NVLink) domains in name order; block level k aggregates 2**k adjacent base
  blocks (``BlockSizes`` = base, 2 x base, 4 x base, ... up to the whole cluster).
- 1. Take the smallest block level at which some aggregated block can hold the job; among those blocks,
  the best fit (fewest free GPUs), ties by position.
- 2. Inside it, choose base blocks (llblocks) to minimise their number: if one block is big enough for
  what is left, take the one with the fewest free GPUs; otherwise take the one with the most room.
- 3. Best fit inside each base block: nodes with the fewest free GPUs that fit go first.
- Subgroups are ``--segment`` segments: each lies inside one base block; counting is in segments.
- With a gang tier, only aggregated blocks inside one domain of that tier are candidates.

Queue of its own (``OWN_QUEUE``: ``reserve``, no preemption). ``SchedulerType=sched/backfill``
(``src/plugins/sched/backfill/backfill.c``, ``doc/html/sched_config.shtml``): jobs in priority order;
the main loop stops a partition at the first job that cannot start, and the backfill loop starts a
lower-priority job only if it does not delay the expected start of a higher-priority one, judged
from time limits, by planning the higher-priority job onto the nodes and times it will get (a node
reservation). Modelled as EASY backfill with the head's node reservation from this policy's own plan
(``sim``, ``reserve``): Slurm's backfill plans up to ``bf_max_job_test`` jobs this way, so it holds
for more than the head; here only the head holds. ``PreemptType`` defaults to ``preempt/none``.
"""

from __future__ import annotations

from scheduler_plugin.placement.policies.base import Index, IndexCache, Ledger, Unit, make_plan, units
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, PlanResult


class Slurm:
    name = "slurm"
    gang = True

    def __init__(self) -> None:
        self._indexes = IndexCache()

    def place(self, snapshot: ClusterSnapshot, gang: Gang) -> PlanResult:
        idx = self._indexes.index_for(snapshot)
        ledger = Ledger(idx.free)
        base = list(idx.domains[idx.tiers[0]].values())  # base blocks in name order
        todo = units(gang)
        span = 1
        while True:
            fits: list[tuple[int, int, list[tuple[Unit, list[int], str | None]]]] = []
            for start in range(0, len(base), span):
                block = list(range(start, min(start + span, len(base))))
                if gang.tier is not None and not _inside(idx, base, block, gang.tier):
                    continue
                mark = ledger.mark()
                free_before = sum(ledger.free_gpus(base[b]) for b in block)
                got = self._in_block(idx, ledger, base, block, todo)
                ledger.rollback(mark)
                if got is not None:
                    fits.append((free_before, start, got))
            if fits:
                _, _, assigned = min(fits, key=lambda f: (f[0], f[1]))
                for unit, nodes, _ in assigned:
                    for n in nodes:
                        ledger.take(n, unit.gpus_per_pod)
                return make_plan(idx, assigned, {"block_level": float(span.bit_length() - 1)})
            if span >= len(base):
                return Infeasible(reason="slurm: no block at any level holds the job")
            span *= 2

    def _in_block(
        self, idx: Index, ledger: Ledger, base: list[list[int]], block: list[int], todo: list[Unit]
    ) -> list[tuple[Unit, list[int], str | None]] | None:
        """Place every unit inside ``block`` (base block positions); taken from the ledger on success."""
        tier1 = idx.tiers[0]
        out: list[tuple[Unit, list[int], str | None]] = []
        segments = [u for u in todo if u.tier is not None]
        loose = [u for u in todo if u.tier is None]
        # segments of equal shape are placed together so that the block count is minimised over all
        by_shape: dict[tuple[int, int, str], list[Unit]] = {}
        for u in segments:
            by_shape.setdefault((u.pods, u.gpus_per_pod, str(u.tier)), []).append(u)
        for (pods, g, tier), group in by_shape.items():
            if tier != tier1:  # a segment wider than a base block: one block of the aggregated level
                for u in group:
                    nodes = _best_fit_nodes(ledger, [n for b in block for n in base[b]], u.pods, g)
                    if nodes is None:
                        return None
                    out.append((u, nodes, idx.node_domain[nodes[0]].get(tier)))
                continue
            left = list(group)
            used: set[int] = set()
            while left:
                room = {b: ledger.fit_pods(base[b], g) // pods if pods else 0 for b in block if b not in used}
                room = {b: r for b, r in room.items() if r > 0}
                if not room:
                    return None
                big = [b for b, r in room.items() if r >= len(left)]
                if big:  # one block is enough for the rest: the fullest such block
                    pick = min(big, key=lambda b: (ledger.free_gpus(base[b]), b))
                else:  # otherwise the block with the most room
                    pick = max(room, key=lambda b: (room[b], -b))
                used.add(pick)
                for _ in range(min(room[pick], len(left))):
                    u = left.pop(0)
                    nodes = _best_fit_nodes(ledger, base[pick], u.pods, g)
                    if nodes is None:
                        return None
                    out.append((u, nodes, idx.node_domain[base[pick][0]][tier1]))
        for u in loose:
            left_pods = u.pods
            chosen: list[int] = []
            used_blocks: set[int] = set()
            while left_pods:
                room = {b: ledger.fit_pods(base[b], u.gpus_per_pod) for b in block if b not in used_blocks}
                room = {b: r for b, r in room.items() if r > 0}
                if not room:
                    return None
                big = [b for b, r in room.items() if r >= left_pods]
                if big:
                    pick = min(big, key=lambda b: (ledger.free_gpus(base[b]), b))
                else:
                    pick = max(room, key=lambda b: (room[b], -b))
                used_blocks.add(pick)
                take = min(room[pick], left_pods)
                nodes = _best_fit_nodes(ledger, base[pick], take, u.gpus_per_pod)
                if nodes is None:
                    return None
                chosen.extend(nodes)
                left_pods -= take
            out.append((u, chosen, None))
        return out


def _best_fit_nodes(ledger: Ledger, nodes: list[int], pods: int, g: int) -> list[int] | None:
    """Nodes with the fewest free GPUs that still fit go first; taken from the ledger."""
    free = ledger.free
    order = sorted((i for i in nodes if free[i] >= g), key=lambda i: (free[i], i))
    chosen: list[int] = []
    mark = ledger.mark()
    for i in order:
        while free[i] >= g and len(chosen) < pods:
            chosen.append(i)
            ledger.take(i, g)
        if len(chosen) == pods:
            return chosen
    ledger.rollback(mark)
    return None


def _inside(idx: Index, base: list[list[int]], block: list[int], tier: str) -> bool:
    names = {idx.node_domain[base[b][0]].get(tier) for b in block}
    return len(names) == 1 and None not in names
