"""The offline optimum on small instances: which gangs of a batch to place, and where, to allocate the
most GPUs, as an integer program solved by HiGHS (``highspy``).

Model (per instance: a snapshot with free GPUs per node, and a batch of gangs):

- ``y[j]`` in {0, 1}: gang j is placed (all or nothing).
- ``x[u, n]`` integer >= 0: pods of unit u (a subgroup, or a role's unconstrained pods) on node n.
- ``sum_n x[u, n] = pods(u) * y[j]``; node capacity ``sum_u gpus_per_pod(u) * x[u, n] <= free(n)``.
- A subgroup with a tier: ``z[u, d]`` in {0, 1} picks one domain d of that tier,
  ``sum_d z[u, d] = y[j]`` and ``sum_{n in d} x[u, n] <= pods(u) * z[u, d]``.
- A gang with a tier: ``w[j, D]`` the same way for all its pods.
- Maximise ``sum_j gpus(j) * y[j]``.

This bounds what any policy can allocate on the batch, whatever order it takes the jobs in. The study
(``small_instances``) compares each policy, taking the batch in order and skipping what it cannot place,
against it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import highspy
import numpy as np

from scheduler_plugin.placement.policies.base import Policy, Unit, gang_gpus, gang_pods, units
from scheduler_plugin.placement.shapes import Cluster, nvl72
from scheduler_plugin.placement.workloads import make_gang
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, NodeState, PodSlot


@dataclass(frozen=True, slots=True)
class Optimum:
    placed: tuple[str, ...]  # gang names
    gpus: int  # GPUs of the placed gangs
    bound: float  # the solver's upper bound (equals gpus when proven optimal)
    optimal: bool
    placement: dict[str, dict[PodSlot, str]]  # gang -> pod -> node


def solve(snapshot: ClusterSnapshot, gangs: Sequence[Gang], *, time_limit_s: float = 20.0) -> Optimum:
    """Maximise placed GPUs over the batch ``gangs`` on ``snapshot``."""
    nodes = sorted(snapshot.nodes, key=lambda n: n.name)
    free = [n.free if n.schedulable else 0 for n in nodes]
    cost: list[float] = []
    upper: list[float] = []
    integral: list[int] = []
    rows: list[tuple[float, float, dict[int, float]]] = []

    def var(ub: float, c: float = 0.0) -> int:
        cost.append(c)
        upper.append(ub)
        integral.append(len(cost) - 1)
        return len(cost) - 1

    y: list[int] = []
    xs: list[list[tuple[Unit, dict[int, int]]]] = []
    node_load: list[dict[int, float]] = [{} for _ in nodes]
    for gang in gangs:
        yj = var(1.0, float(gang_gpus(gang)))
        y.append(yj)
        per_unit: list[tuple[Unit, dict[int, int]]] = []
        for u in units(gang):
            x: dict[int, int] = {}
            for n, f in enumerate(free):
                cap = min(u.pods, f // u.gpus_per_pod)
                if cap > 0:
                    x[n] = var(float(cap))
                    node_load[n][x[n]] = float(u.gpus_per_pod)
            row = dict.fromkeys(x.values(), 1.0)
            row[yj] = -float(u.pods)
            rows.append((0.0, 0.0, row))
            if u.tier is not None:
                _one_domain(rows=rows, var=var, yj=yj, x=x, nodes=nodes, tier=u.tier, pods=u.pods)
            per_unit.append((u, x))
        if gang.tier is not None:
            merged: dict[int, list[int]] = {}
            for _, x in per_unit:
                for n, v in x.items():
                    merged.setdefault(n, []).append(v)
            _one_domain_multi(
                rows=rows, var=var, yj=yj, x=merged, nodes=nodes, tier=gang.tier, pods=gang_pods(gang)
            )
        xs.append(per_unit)
    for n, load in enumerate(node_load):
        if load:
            rows.append((-highspy.kHighsInf, float(free[n]), load))

    h = new_solver()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    num = len(cost)
    h.addVars(num, [0.0] * num, upper)
    h.changeColsCost(num, list(range(num)), cost)
    h.changeColsIntegrality(
        num, np.arange(num, dtype=np.int32), np.full(num, highspy.HighsVarType.kInteger.value, dtype=np.uint8)
    )
    for lo, hi, coefs in rows:
        idx = list(coefs)
        h.addRow(lo, hi, len(idx), idx, [coefs[i] for i in idx])
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    h.run()
    status = h.getModelStatus()
    values = list(h.getSolution().col_value) if num else []
    info = h.getInfo()
    optimal = status == highspy.HighsModelStatus.kOptimal
    placed: list[str] = []
    placement: dict[str, dict[PodSlot, str]] = {}
    gpus = 0
    for gang, yj, per_unit in zip(gangs, y, xs, strict=True):
        if values and values[yj] > 0.5:
            placed.append(gang.name)
            gpus += gang_gpus(gang)
            pods: dict[PodSlot, str] = {}
            for u, x in per_unit:
                names = iter(u.pod_slots())
                for n, v in sorted(x.items()):
                    for _ in range(round(values[v])):
                        pods[next(names)] = nodes[n].name
            placement[gang.name] = pods
    bound = float(info.mip_dual_bound) if not optimal else float(gpus)
    return Optimum(
        placed=tuple(placed), gpus=gpus, bound=max(bound, float(gpus)), optimal=optimal, placement=placement
    )


def new_solver() -> highspy.Highs:
    """A HiGHS instance (the first one in a process prints HiGHS's banner on stdout)."""
    return highspy.Highs()  # type: ignore[no-untyped-call]


def _one_domain(
    *,
    rows: list[tuple[float, float, dict[int, float]]],
    var: Callable[[float], int],
    yj: int,
    x: dict[int, int],
    nodes: Sequence[NodeState],
    tier: str,
    pods: int,
) -> None:
    _one_domain_multi(
        rows=rows, var=var, yj=yj, x={n: [v] for n, v in x.items()}, nodes=nodes, tier=tier, pods=pods
    )


def _one_domain_multi(
    *,
    rows: list[tuple[float, float, dict[int, float]]],
    var: Callable[[float], int],
    yj: int,
    x: dict[int, list[int]],
    nodes: Sequence[NodeState],
    tier: str,
    pods: int,
) -> None:
    """All pods counted by ``x`` (node -> pod variables) inside one domain of ``tier``, if ``yj``."""
    by_domain: dict[str, list[int]] = {}
    for n, vs in x.items():
        d = nodes[n].domains.get(tier)
        if d is not None:
            by_domain.setdefault(d, []).extend(vs)
    choose = {yj: -1.0}
    for d in sorted(by_domain):
        z = var(1.0)
        choose[z] = 1.0
        row = dict.fromkeys(by_domain[d], 1.0)
        row[z] = -float(pods)
        rows.append((-highspy.kHighsInf, 0.0, row))
    rows.append((0.0, 0.0, choose))
    # pods on nodes without a domain of this tier cannot be used
    for n, vs in x.items():
        if nodes[n].domains.get(tier) is None:
            for v in vs:
                rows.append((0.0, 0.0, {v: 1.0}))


@dataclass(frozen=True, slots=True)
class Instance:
    snapshot: ClusterSnapshot
    gangs: tuple[Gang, ...]
    free_gpus: int


def small_instance(seed: int, *, racks: int = 4) -> Instance:
    """A small cluster (``racks`` NVL72 racks, 2 per leaf) where about half the racks are busy (20, 40
    or 60 % of their nodes hold 1-4 GPUs), and a batch of gangs asking for about 1.5 x its free GPUs:
    30 % of 1-4 single-node pods, 30 % of 8 or 16 nodes in 4-node NVLink segments, 40 % of one or
    two 16- or 18-node NVLink subgroups (two inside one leaf). Seeded."""
    rng = random.Random(f"optimum-{seed}")
    cluster: Cluster = nvl72(racks, racks_per_leaf=2, leaves_per_spine=2)
    busy = {d for d in cluster.domains("nvlink") if rng.random() < 0.5}
    share = {d: rng.choice((0.2, 0.4, 0.6)) for d in sorted(busy)}  # sorted: set order varies by process
    free = []
    for n in cluster.nodes:
        d = n.domains["nvlink"]
        used = rng.choice((1, 2, 3, 4)) if d in busy and rng.random() < share[d] else 0
        free.append(n.gpus - used)
    snap = cluster.snapshot(free)
    total_free = sum(free)
    tier_gpus = cluster.largest_domain_gpus()
    gangs: list[Gang] = []
    demand = 0
    k = 0
    while demand < 1.5 * total_free:
        kind = rng.random()
        if kind < 0.3:
            gang = make_gang(
                f"g{k:02d}",
                pods=rng.choice((1, 2, 4)),
                gpus_per_pod=4,
                subgroup_nodes=0,
                nvlink_domain_gpus=72,
            )
        elif kind < 0.6:
            pods = rng.choice((8, 16))
            gang = make_gang(f"g{k:02d}", pods=pods, gpus_per_pod=4, subgroup_nodes=4, nvlink_domain_gpus=72)
        else:
            seg = rng.choice((16, 18))
            count = rng.choice((1, 1, 2))
            tier = "leaf" if count > 1 and tier_gpus["leaf"] >= seg * count * 4 else None
            gang = make_gang(
                f"g{k:02d}",
                pods=seg * count,
                gpus_per_pod=4,
                subgroup_nodes=seg,
                nvlink_domain_gpus=72,
                gang_tier=tier,
            )
        gangs.append(gang)
        demand += gang_gpus(gang)
        k += 1
    return Instance(snapshot=snap, gangs=tuple(gangs), free_gpus=total_free)


def keeps_constraints(snapshot: ClusterSnapshot, gang: Gang, placement: Mapping[PodSlot, str]) -> bool:
    """Every pod placed, each subgroup inside one domain of its tier, the gang inside one of its tier."""
    if len(placement) != gang_pods(gang):
        return False
    domains = {n.name: n.domains for n in snapshot.nodes}
    for unit in units(gang):
        nodes = [placement.get(pod) for pod in unit.pod_slots()]
        if any(n is None for n in nodes):
            return False
        if unit.tier is not None and len({domains[n].get(unit.tier) for n in nodes if n}) != 1:
            return False
    return gang.tier is None or len({domains[n].get(gang.tier) for n in placement.values()}) == 1


def greedy_in_order(policy: Policy, instance: Instance) -> int:
    """GPUs of the gangs ``policy`` places taking the batch in order (skipping what it cannot place).

    A gang counts only when all its pods are placed within its tier constraints; pods a non-gang
    policy places for a gang it cannot finish, or outside those constraints, hold their GPUs but
    count for nothing.
    """
    state = {n.name: n for n in instance.snapshot.nodes}
    placed = 0
    for gang in instance.gangs:
        snap = ClusterSnapshot(tiers=instance.snapshot.tiers, nodes=tuple(state.values()))
        result = policy.place(snap, gang)
        if isinstance(result, Infeasible):
            continue
        per = {r.name: r.gpus_per_pod for r in gang.roles}
        for pod, node in result.placement.items():
            old = state[node]
            g = per[pod.role]
            if old.free < g:
                raise ValueError(f"{policy.name}: over-allocates {node} placing {gang.name}")
            state[node] = NodeState(name=old.name, gpus=old.gpus, free=old.free - g, domains=old.domains)
        if keeps_constraints(snap, gang, result.placement):
            placed += gang_gpus(gang)
    return placed
