"""What every placement policy shares: the ``Policy`` protocol, an index of the snapshot (kept by
each policy's ``IndexCache``), a ledger of free GPUs with rollback for dry runs, and the split of a
gang into placement units.

The re-implemented anchors count whole GPUs only (the simulated jobs request nothing else) and treat a
node with ``schedulable=False`` as full. Where an anchor breaks ties at random, ours break them by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from scheduler_plugin.snapshot import (
    ClusterSnapshot,
    Gang,
    Plan,
    PlanResult,
    PodSlot,
    SubgroupPlacement,
    changed_nodes,
    name_order,
)

ROOT = "<cluster>"  # the virtual domain over every node (Volcano's cluster-top HyperNode)


class Policy(Protocol):
    """A placement algorithm. ``gang`` False means it may return a ``Plan`` that places only some pods."""

    name: str
    gang: bool

    def place(self, snapshot: ClusterSnapshot, gang: Gang) -> PlanResult: ...


class TierBlind:
    """``inner`` placing every gang with its tier constraints dropped (subgroup and gang tiers): a
    topology-blind gang scheduler, to measure what the constraints cost. The simulator still counts
    locality against the job's own subgroups."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.gang = inner.gang

    def place(self, snapshot: ClusterSnapshot, gang: Gang) -> PlanResult:
        return self.inner.place(snapshot, without_tiers(gang))


def without_tiers(gang: Gang) -> Gang:
    """``gang`` with no gang tier and no subgroup tier (subgroup sizes kept, now unconstrained)."""
    roles = tuple(replace(r, subgroup_tier=None) for r in gang.roles)
    return Gang(name=gang.name, roles=roles, tier=None, soft=gang.soft)


@dataclass(frozen=True, slots=True)
class Unit:
    """Pods that must land together: one subgroup (``tier`` set) or a role's unconstrained pods."""

    role: str
    subgroup: int | None  # subgroup index inside the role, None for unconstrained pods
    first_pod: int
    pods: int
    gpus_per_pod: int
    tier: str | None

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod

    def pod_slots(self) -> list[PodSlot]:
        return [PodSlot(self.role, i) for i in range(self.first_pod, self.first_pod + self.pods)]


def units(gang: Gang) -> list[Unit]:
    """Subgroups of ``subgroup_size`` consecutive pods per role (the last may be smaller), else one unit."""
    out: list[Unit] = []
    for role in gang.roles:
        if role.subgroup_tier is None or not role.subgroup_size:
            out.append(Unit(role.name, None, 0, role.pods, role.gpus_per_pod, None))
            continue
        size = role.subgroup_size
        for k, first in enumerate(range(0, role.pods, size)):
            out.append(
                Unit(role.name, k, first, min(size, role.pods - first), role.gpus_per_pod, role.subgroup_tier)
            )
    return out


def gang_gpus(gang: Gang) -> int:
    return sum(r.pods * r.gpus_per_pod for r in gang.roles)


def gang_pods(gang: Gang) -> int:
    return sum(r.pods for r in gang.roles)


class IndexCache:
    """The last few snapshots' ``Index``, newest first, owned by one policy instance: an index is
    reused while the same snapshot object is planned against again, and built from the previous one
    when only free capacity changed. Our planner keeps its prepared snapshots the same way (a
    ``SnapshotCache`` per policy), so plan times compare like for like."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._kept: list[tuple[ClusterSnapshot, Index]] = []

    def index_for(self, snapshot: ClusterSnapshot) -> Index:
        for snap, idx in self._kept:
            if snap is snapshot:
                return idx
        idx = Index(snapshot, like=self._kept[0] if self._kept else None)
        self._kept.insert(0, (snapshot, idx))
        del self._kept[self.size :]
        return idx


class Index:
    """Nodes in name order with their free GPUs, and each tier's domains (name -> node indices).

    Read-only once built: policies copy ``free`` into a ``Ledger`` before changing anything.
    """

    def __init__(self, snapshot: ClusterSnapshot, like: tuple[ClusterSnapshot, Index] | None = None) -> None:
        if like is not None and self._reuse(snapshot, *like):
            return
        order, self.position = name_order(snapshot)
        nodes = [snapshot.nodes[k] for k in order]
        self.tiers = snapshot.tiers
        self.names = [n.name for n in nodes]
        self.gpus = [n.gpus for n in nodes]
        self.free = [n.free if n.schedulable else 0 for n in nodes]
        self.domains: dict[str, dict[str, list[int]]] = {t: {} for t in self.tiers}
        self.node_domain: list[dict[str, str]] = []
        for i, n in enumerate(nodes):
            self.node_domain.append(dict(n.domains))
            for t in self.tiers:
                d = n.domains.get(t)
                if d is not None:
                    self.domains[t].setdefault(d, []).append(i)
        for t in self.tiers:
            self.domains[t] = dict(sorted(self.domains[t].items()))
        self.all_nodes = list(range(len(nodes)))

    def _reuse(self, snapshot: ClusterSnapshot, old_snap: ClusterSnapshot, old: Index) -> bool:
        """Take ``old``'s topology when only free capacity changed (same nodes in the same order)."""
        changed = changed_nodes(old_snap, snapshot)
        if changed is None:
            return False
        self.tiers, self.names, self.gpus = old.tiers, old.names, old.gpus
        self.domains, self.node_domain, self.all_nodes = old.domains, old.node_domain, old.all_nodes
        self.position = old.position
        self.free = list(old.free)
        for k in changed:
            n = snapshot.nodes[k]
            self.free[self.position[k]] = n.free if n.schedulable else 0
        return True

    def level(self, tier: str) -> int:
        """1-based tier number; raises ValueError for a tier the snapshot lacks."""
        try:
            return self.tiers.index(tier) + 1
        except ValueError:
            raise ValueError(f"tier {tier!r} is not in the snapshot's tiers {self.tiers}") from None

    def nodes_of(self, tier: str | None, domain: str) -> list[int]:
        if tier is None or domain == ROOT:
            return self.all_nodes
        return self.domains[tier][domain]

    def subdomains(self, tier: str, parent_tier: str | None, parent: str) -> list[str]:
        """Domains of ``tier`` inside ``parent`` (a domain of ``parent_tier``; ROOT for all)."""
        if parent_tier is None or parent == ROOT:
            return list(self.domains[tier])
        if parent_tier == tier:
            return [parent]
        return [
            d
            for d, members in self.domains[tier].items()
            if self.node_domain[members[0]].get(parent_tier) == parent
        ]


class Ledger:
    """Free GPUs per node with a change log, so dry runs roll back in O(changes)."""

    def __init__(self, free: list[int]) -> None:
        self.free = list(free)
        self._log: list[tuple[int, int]] = []

    def take(self, node: int, gpus: int) -> None:
        self.free[node] -= gpus
        self._log.append((node, gpus))

    def mark(self) -> int:
        return len(self._log)

    def rollback(self, mark: int) -> None:
        while len(self._log) > mark:
            node, gpus = self._log.pop()
            self.free[node] += gpus

    def fit_pods(self, nodes: Iterable[int], gpus_per_pod: int) -> int:
        """How many pods of ``gpus_per_pod`` fit on these nodes (whole pods per node)."""
        free = self.free
        return sum(free[i] // gpus_per_pod for i in nodes)

    def free_gpus(self, nodes: Iterable[int]) -> int:
        free = self.free
        return sum(free[i] for i in nodes)


def fill_most_allocated(idx: Index, ledger: Ledger, nodes: list[int], unit: Unit) -> list[int] | None:
    """Per pod, the fitting node with the highest (used + request) / allocatable (bin-pack), ties by name.

    A node that just took a pod only gets more allocated, so it keeps taking pods while it fits; that
    makes the per-pod choice one sort. Takes from the ledger; None (and nothing taken) if not all fit.
    """
    g = unit.gpus_per_pod
    free = ledger.free
    mark = ledger.mark()
    fitting = [i for i in nodes if free[i] >= g]
    fitting.sort(key=lambda i: (-(idx.gpus[i] - free[i] + g) / idx.gpus[i], i))
    chosen: list[int] = []
    for i in fitting:
        while free[i] >= g and len(chosen) < unit.pods:
            chosen.append(i)
            ledger.take(i, g)
        if len(chosen) == unit.pods:
            return chosen
    ledger.rollback(mark)
    return None


def make_plan(
    idx: Index, assigned: list[tuple[Unit, list[int], str | None]], score: dict[str, float] | None = None
) -> Plan:
    """A ``Plan`` from (unit, node per pod, domain) triples."""
    placement: dict[PodSlot, str] = {}
    subgroups: list[SubgroupPlacement] = []
    for unit, nodes, domain in assigned:
        for pod, node in zip(unit.pod_slots(), nodes, strict=False):
            placement[pod] = idx.names[node]
        if unit.subgroup is not None:
            subgroups.append(SubgroupPlacement(role=unit.role, index=unit.subgroup, domain=domain))
    return Plan(placement=placement, subgroups=tuple(subgroups), score=score or {})
