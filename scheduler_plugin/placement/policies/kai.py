"""KAI-Scheduler's topology-aware allocation, re-implemented from its published algorithm.

Follows kai-scheduler/KAI-Scheduler ``pkg/scheduler/actions/common/allocate.go``
(``allocateSubGroupSet``: first fit over node sets with checkpoint and rollback) and the topology
plugin ``pkg/scheduler/plugins/topology/job_filtering.go`` (``subSetNodesFn``: candidate domains at the
required level that can hold the tasks, sorted most packed first by request / free) and
``node_scoring.go``.

- The gang is the root subgroup set; its node sets are the domains of the gang's required tier that can
  hold it (counted by packing representative pods per node), most packed first; without a required
  tier, one node set of every node.
- Inside a node set, each subgroup (our subgroup, KAI's child subgroup with ``requiredTopologyLevel``)
  takes the first fitting domain of its tier in most-packed-first order; pods go to the most allocated
  fitting node (KAI's default bin-pack). If any child fails, the whole node set is rolled back and the
  next one is tried. There is no backtracking between sibling subgroups.

Queue of its own (``OWN_QUEUE``: ``greedy`` with ``kai`` preemption). The ``allocate`` action
(``pkg/scheduler/actions/allocate/allocate.go``) takes jobs by queue and then priority and creation
time and allocates every job that fits, without reserving nodes for one that does not. The ``preempt``
action (``pkg/scheduler/actions/preempt/preempt.go``, ``attemptToPreemptForPreemptor``) runs every
cycle: for a pending job, victims are the preemptible jobs of its queue with a lower priority and
allocated pods (``buildFilterFuncForPreempt``; PriorityClass values under 100 are preemptible in KAI's
defaults), ordered as a victims queue (lowest priority first, then the latest started); the jobs
solver (``actions/common/solvers``) adds victims job by job until the preemptor fits and evicts the
jobs it took. Modelled in ``sim`` as whole jobs (the gangs here have ``minMember`` = all pods),
anywhere in the cluster, at most ``sim.KAI_PREEMPT_TRIES`` placement tries per job and pass.
"""

from __future__ import annotations

from scheduler_plugin.placement.policies.base import (
    ROOT,
    Index,
    IndexCache,
    Ledger,
    Unit,
    fill_most_allocated,
    gang_gpus,
    make_plan,
    units,
)
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, PlanResult


class Kai:
    name = "kai"
    gang = True

    def __init__(self) -> None:
        self._indexes = IndexCache()

    def place(self, snapshot: ClusterSnapshot, gang: Gang) -> PlanResult:
        idx = self._indexes.index_for(snapshot)
        ledger = Ledger(idx.free)
        children = units(gang)
        request = gang_gpus(gang)
        if gang.tier is None:
            node_sets: list[tuple[str | None, str]] = [(None, ROOT)]
        else:
            fitting = []
            for d, members in idx.domains[gang.tier].items():
                if all_fit(ledger, members, children):
                    fitting.append((d, request / max(1, ledger.free_gpus(members))))
            fitting.sort(key=lambda p: -p[1])  # most packed first; stable sort keeps name order on ties
            node_sets = [(gang.tier, d) for d, _ in fitting]
        for tier, ns in node_sets:
            mark = ledger.mark()
            assigned: list[tuple[Unit, list[int], str | None]] = []
            for child in children:
                got = self._child(idx, ledger, child, tier, ns)
                if got is None:
                    break
                assigned.append((child, got[0], got[1]))
            else:
                return make_plan(idx, assigned)
            ledger.rollback(mark)
        return Infeasible(reason="kai: no domain of the required level holds every subgroup (first fit)")

    def _child(
        self, idx: Index, ledger: Ledger, child: Unit, tier: str | None, ns: str
    ) -> tuple[list[int], str | None] | None:
        if child.tier is None:
            nodes = fill_most_allocated(idx, ledger, idx.nodes_of(tier, ns), child)
            return None if nodes is None else (nodes, None)
        candidates = []
        for d in idx.subdomains(child.tier, tier, ns):
            members = idx.domains[child.tier][d]
            if ledger.fit_pods(members, child.gpus_per_pod) >= child.pods:
                candidates.append((d, child.gpus / max(1, ledger.free_gpus(members))))
        candidates.sort(key=lambda p: -p[1])
        for d, _ in candidates:  # first fit
            nodes = fill_most_allocated(idx, ledger, idx.domains[child.tier][d], child)
            if nodes is not None:
                return nodes, d
        return None


def all_fit(ledger: Ledger, members: list[int], children: list[Unit]) -> bool:
    """Aggregate check KAI runs before trying a domain: every pod fits by representative packing."""
    by_size: dict[int, int] = {}
    for c in children:
        by_size[c.gpus_per_pod] = by_size.get(c.gpus_per_pod, 0) + c.pods
    return all(ledger.fit_pods(members, g) >= n for g, n in by_size.items())
