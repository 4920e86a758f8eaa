"""Builders for placement tests: small snapshots and gangs with keyword arguments."""

from __future__ import annotations

from collections.abc import Mapping

from scheduler_plugin.snapshot import ClusterSnapshot, Gang, NodeState, PodSlot, Role

TIERS = ("nvlink", "leaf", "spine")


def racks(*free_per_rack: list[int], racks_per_leaf: int = 2, gpus: int = 4) -> ClusterSnapshot:
    """One NVLink domain per list; each number is one node's free GPUs."""
    nodes = []
    for r, frees in enumerate(free_per_rack):
        domains = {"nvlink": f"nvl-{r}", "leaf": f"leaf-{r // racks_per_leaf}", "spine": "spine-0"}
        for t, free in enumerate(frees):
            nodes.append(NodeState(name=f"r{r}-n{t:02d}", gpus=gpus, free=free, domains=domains))
    return ClusterSnapshot(tiers=TIERS, nodes=tuple(nodes))


def gang(
    pods: int,
    *,
    gpus_per_pod: int = 4,
    subgroup: int | None = None,
    subgroup_tier: str | None = "nvlink",
    tier: str | None = None,
    name: str = "g",
) -> Gang:
    role = Role(
        name="worker",
        pods=pods,
        gpus_per_pod=gpus_per_pod,
        subgroup_size=subgroup,
        subgroup_tier=subgroup_tier if subgroup else None,
    )
    return Gang(name=name, roles=(role,), tier=tier)


def domains_of(snapshot: ClusterSnapshot, placement: Mapping[PodSlot, str], tier: str) -> list[str]:
    """The ``tier`` domain of each pod, in pod index order."""
    by_name = {n.name: n for n in snapshot.nodes}
    pods = sorted(placement, key=lambda p: p.index)
    return [by_name[placement[p]].domains[tier] for p in pods]
