"""kube-scheduler's default placement for GPU pods: no gang, no topology.

Follows kubernetes/kubernetes ``pkg/scheduler/framework/plugins/noderesources/fit.go`` with the default
``LeastAllocated`` scoring strategy (``least_allocated.go``): each pod independently goes to the fitting
node with the most free share of its GPUs, ties by name (kube-scheduler samples among equal scores).
Pods that do not fit stay pending while the others bind, so a gang can be **partially placed**: the plan
returned may name only some pods, and subgroup constraints are ignored (their domain is not recorded).

Queue of its own (``OWN_QUEUE``: ``greedy``): kube-scheduler's scheduling queue
(``pkg/scheduler/backend/queue/scheduling_queue.go``) pops pods by priority, then creation time, binds
each pod that fits and sends the others to the unschedulable queue; nothing is held back. Its
default preemption (``defaultpreemption``) evicts pods, not gangs; the simulator leaves it out.
"""

from __future__ import annotations

import heapq

from scheduler_plugin.placement.policies.base import IndexCache, Ledger, Unit, make_plan, units
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, PlanResult


class KubeDefault:
    name = "kube-default"
    gang = False

    def __init__(self) -> None:
        self._indexes = IndexCache()

    def place(self, snapshot: ClusterSnapshot, gang: Gang) -> PlanResult:
        idx = self._indexes.index_for(snapshot)
        ledger = Ledger(idx.free)
        assigned: list[tuple[Unit, list[int], str | None]] = []
        for unit in units(gang):
            g = unit.gpus_per_pod
            # max-heap on (free - request) / allocatable, ties by name order
            heap = [(-(ledger.free[i] - g) / idx.gpus[i], i) for i in idx.all_nodes if ledger.free[i] >= g]
            heapq.heapify(heap)
            nodes: list[int] = []
            while heap and len(nodes) < unit.pods:
                _, i = heapq.heappop(heap)
                nodes.append(i)
                ledger.take(i, g)
                if ledger.free[i] >= g:
                    heapq.heappush(heap, (-(ledger.free[i] - g) / idx.gpus[i], i))
            assigned.append((unit, nodes, None))
            if len(nodes) < unit.pods:
                break  # the scheduler keeps trying the rest; nothing more fits now
        if not any(nodes for _, nodes, _ in assigned):
            return Infeasible(reason="kube-default: no node fits a pod")
        return make_plan(idx, assigned)
