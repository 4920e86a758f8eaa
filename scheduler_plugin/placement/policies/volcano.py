"""Volcano's network-topology-aware allocate, re-implemented from its published algorithm.

Follows volcano-sh/volcano ``pkg/scheduler/actions/allocate/allocate.go`` (``allocateForJob``,
``allocateForSubJob``) with the scoring of
``pkg/scheduler/plugins/network-topology-aware/network_topology_aware.go``
(``hyperNodeGradientFn``, ``getSubJobHyperNodeBinPackingScore``), v1.14-v1.16:

- Job gradient: with a job-level tier, every HyperNode of tier 1 .. that tier whose aggregate idle GPUs
  cover the job, grouped by tier ascending; without one, the cluster-top HyperNode only.
- For each gradient, **every** candidate HyperNode is dry-run: subjobs (our subgroups, in index order)
  are placed greedily one at a time; each subjob walks its own gradient (tiers 1 .. its tier, inside the
  job's HyperNode, aggregate-idle pre-filter), dry-runs every candidate of the tier and keeps the one with
  the highest bin-pack score ``(used + request) / allocatable`` (x 100). The job's candidate scores the
  sum of its subjobs' scores; the best candidate is replayed. Ties, random in Volcano, go by name.
- Pods inside a chosen HyperNode go node by node with the bin-pack node order (most allocated first).
- Subjobs without a topology constraint are placed on the job HyperNode's nodes and score its bin-pack.

Queue of its own (``OWN_QUEUE``: ``greedy``, no preemption). The default scheduler configuration runs
the actions ``enqueue, allocate, backfill`` (``pkg/scheduler/util/default_conf.go`` /
``installer/helm/chart/volcano/config/volcano-scheduler.conf``): ``allocate`` takes jobs in the order of
the ``priority`` plugin's ``JobOrderFn`` (PriorityClass value, then creation time), gives a gang its
pods only if it reaches ``minAvailable`` (the ``gang`` plugin's ``JobReadyFn``, else the statement is
discarded) and moves on to the next job: nothing is held for a gang that does not fit.  ``backfill``
only places pods that request no resources (BestEffort), none of the GPU jobs here. ``preempt`` is not
in the default actions, and where it is enabled ``pkg/scheduler/actions/preempt/preempt.go`` skips
preemptors that carry a network topology (issue volcano-sh/volcano#4374, open).
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


class Volcano:
    name = "volcano"
    gang = True

    def __init__(self) -> None:
        self._indexes = IndexCache()

    def place(self, snapshot: ClusterSnapshot, gang: Gang) -> PlanResult:
        idx = self._indexes.index_for(snapshot)
        ledger = Ledger(idx.free)
        subjobs = units(gang)
        need = gang_gpus(gang)
        if gang.tier is None:
            gradients: list[list[tuple[str | None, str]]] = [[(None, ROOT)]]
        else:
            top = idx.level(gang.tier)
            gradients = []
            for tier in idx.tiers[:top]:
                layer: list[tuple[str | None, str]] = [
                    (tier, d) for d, m in idx.domains[tier].items() if ledger.free_gpus(m) >= need
                ]
                if layer:
                    gradients.append(layer)
        for gradient in gradients:
            results: list[tuple[float, str, list[tuple[Unit, list[int], str | None]]]] = []
            for job_tier, hn in gradient:
                mark = ledger.mark()
                total = 0.0
                assigned: list[tuple[Unit, list[int], str | None]] = []
                for sj in subjobs:
                    got = self._subjob(idx, ledger, sj, job_tier, hn)
                    if got is None:
                        break
                    score, nodes, domain = got
                    total += score
                    assigned.append((sj, nodes, domain))
                else:
                    results.append((total, hn, assigned))
                ledger.rollback(mark)
            if results:
                best = results[0]  # candidates come in name order: the first of equal scores wins
                for r in results[1:]:
                    if r[0] > best[0]:
                        best = r
                return make_plan(idx, best[2], {"volcano_score": best[0]})
        return Infeasible(reason="volcano: no HyperNode in the job's gradient holds every subjob")

    def _subjob(
        self, idx: Index, ledger: Ledger, sj: Unit, job_tier: str | None, hn: str
    ) -> tuple[float, list[int], str | None] | None:
        """Place one subjob inside the job's HyperNode ``hn``; taken from the ledger on success."""
        if sj.tier is None:
            members = idx.nodes_of(job_tier, hn)
            before = ledger.free_gpus(members)
            nodes = fill_most_allocated(idx, ledger, members, sj)
            if nodes is None:
                return None
            return _binpack(idx, members, before, sj.gpus), nodes, None
        for tier in idx.tiers[: idx.level(sj.tier)]:
            best: tuple[float, str] | None = None
            for d in idx.subdomains(tier, job_tier, hn):
                members = idx.domains[tier][d]
                before = ledger.free_gpus(members)
                if before < sj.gpus:  # aggregate-idle pre-filter of the gradient
                    continue
                mark = ledger.mark()
                nodes = fill_most_allocated(idx, ledger, members, sj)
                ledger.rollback(mark)
                if nodes is None:
                    continue
                score = _binpack(idx, members, before, sj.gpus)
                if best is None or score > best[0]:
                    best = (score, d)
            if best is not None:
                members = idx.domains[tier][best[1]]
                nodes = fill_most_allocated(idx, ledger, members, sj)
                assert nodes is not None  # the dry run of the same state succeeded
                return best[0], nodes, best[1]
        return None


def _binpack(idx: Index, members: list[int], free_before: int, request: int) -> float:
    alloc = sum(idx.gpus[i] for i in members)
    used = alloc - free_before
    if alloc == 0 or used + request > alloc:
        return 0.0
    return 100.0 * (used + request) / alloc
