"""Cluster shapes for the placement simulator: nodes, their GPUs and their domains per tier.

Shapes (``--cluster``):

- ``nvl72``: GB200 NVL72 racks of 18 compute trays x 4 GPUs; one rack is one NVLink domain (tier 1);
  ``racks_per_leaf`` racks share an InfiniBand leaf domain (tier 2); ``leaves_per_spine`` leaf domains
  share a spine (tier 3). Default 64 racks (1,152 nodes, 4,608 GPUs), 4 racks per leaf, 4 leaves per spine.
- ``dgx-h100``: DGX H100 nodes of 8 GPUs; the NVLink domain is the node itself (NVSwitch inside one
  chassis); 32 nodes per scalable unit share their rail leaves (tier 2); 4 units per spine.
- ``mixed``: half the racks as NVL72 and the same GPU count again as DGX H100 scalable units, under
  separate leaves and spines.

Pure: a shape is a function of its parameters. Node names sort in rack/tray order so that ties broken
by name follow the physical order (Slurm's block adjacency uses it too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scheduler_plugin.snapshot import ClusterSnapshot, Gang, NodeState

TIERS: tuple[str, ...] = ("nvlink", "leaf", "spine")
SHAPES: tuple[str, ...] = ("nvl72", "dgx-h100", "mixed")

NVL72_TRAYS = 18
NVL72_GPUS_PER_TRAY = 4
DGX_H100_GPUS = 8
DGX_SU_NODES = 32


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: int
    domains: Mapping[str, str]  # tier name -> domain name


@dataclass(frozen=True, slots=True)
class Cluster:
    """A static cluster: the nodes in name order and the tiers (tier 1 first)."""

    shape: str
    tiers: tuple[str, ...]
    nodes: tuple[NodeSpec, ...]

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def domains(self, tier: str) -> dict[str, list[int]]:
        """Domain name -> indices of its nodes, for one tier (domains in name order)."""
        out: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            out.setdefault(node.domains[tier], []).append(i)
        return dict(sorted(out.items()))

    def tier1_domain_gpus(self) -> int:
        """GPUs of the largest tier-1 (NVLink) domain."""
        return max(sum(self.nodes[i].gpus for i in idx) for idx in self.domains(self.tiers[0]).values())

    def largest_domain_gpus(self) -> dict[str, int]:
        """Tier name -> GPUs of its largest domain."""
        return {
            t: max(sum(self.nodes[i].gpus for i in idx) for idx in self.domains(t).values())
            for t in self.tiers
        }

    def fits_empty(self, gang: Gang) -> bool:
        """Whether ``gang`` fits this cluster when it is empty: whole pods per node, each subgroup inside
        one domain of its tier, the gang inside one domain of its tier. Roles are checked one by one."""
        everything = list(range(len(self.nodes)))
        scopes = list(self.domains(gang.tier).values()) if gang.tier else [everything]
        for scope in scopes:
            ok = True
            for role in gang.roles:
                g = role.gpus_per_pod
                if role.subgroup_tier and role.subgroup_size:
                    pods_in: dict[str, int] = {}
                    for i in scope:
                        d = self.nodes[i].domains[role.subgroup_tier]
                        pods_in[d] = pods_in.get(d, 0) + self.nodes[i].gpus // g
                    blocks = sum(p // role.subgroup_size for p in pods_in.values())
                    ok = ok and blocks >= -(-role.pods // role.subgroup_size)
                else:
                    ok = ok and sum(self.nodes[i].gpus // g for i in scope) >= role.pods
            if ok:
                return True
        return False

    def gpus_per_node(self) -> int:
        return min(n.gpus for n in self.nodes)

    def snapshot(self, free: list[int] | None = None) -> ClusterSnapshot:
        """The planner's view with ``free[i]`` free GPUs on node ``i`` (all free by default)."""
        frees = free if free is not None else [n.gpus for n in self.nodes]
        return ClusterSnapshot(
            tiers=self.tiers,
            nodes=tuple(
                NodeState(name=n.name, gpus=n.gpus, free=f, domains=n.domains)
                for n, f in zip(self.nodes, frees, strict=True)
            ),
        )


def nvl72(
    racks: int = 64, *, racks_per_leaf: int = 4, leaves_per_spine: int = 4, prefix: str = ""
) -> Cluster:
    if racks < 1 or racks_per_leaf < 1 or leaves_per_spine < 1:
        raise ValueError(f"nvl72: racks ({racks}), racks_per_leaf and leaves_per_spine must be >= 1")
    nodes = []
    for r in range(racks):
        leaf = r // racks_per_leaf
        spine = leaf // leaves_per_spine
        domains = {
            "nvlink": f"{prefix}nvl-r{r:03d}",
            "leaf": f"{prefix}leaf-{leaf:02d}",
            "spine": f"{prefix}spine-{spine}",
        }
        for t in range(NVL72_TRAYS):
            nodes.append(
                NodeSpec(name=f"{prefix}r{r:03d}-t{t:02d}", gpus=NVL72_GPUS_PER_TRAY, domains=domains)
            )
    return Cluster(shape="nvl72", tiers=TIERS, nodes=tuple(nodes))


def dgx_h100(units: int = 18, *, units_per_spine: int = 4, prefix: str = "") -> Cluster:
    if units < 1 or units_per_spine < 1:
        raise ValueError(f"dgx-h100: units ({units}) and units_per_spine must be >= 1")
    nodes = []
    for su in range(units):
        spine = su // units_per_spine
        for k in range(DGX_SU_NODES):
            name = f"{prefix}su{su:02d}-n{k:02d}"
            domains = {
                "nvlink": f"{prefix}nv-{name}",
                "leaf": f"{prefix}leaf-su{su:02d}",
                "spine": f"{prefix}spine-{spine}",
            }
            nodes.append(NodeSpec(name=name, gpus=DGX_H100_GPUS, domains=domains))
    return Cluster(shape="dgx-h100", tiers=TIERS, nodes=tuple(nodes))


def build(shape: str, racks: int = 64) -> Cluster:
    """A named shape sized by ``racks`` NVL72-rack equivalents (72 GPUs each)."""
    if shape == "nvl72":
        return nvl72(racks)
    if shape == "dgx-h100":
        # 72 GPUs per rack-equivalent; a scalable unit holds 256 GPUs
        return dgx_h100(max(1, racks * 72 // (DGX_SU_NODES * DGX_H100_GPUS)))
    if shape == "mixed":
        half = max(1, racks // 2)
        a = nvl72(half, prefix="a-")
        b = dgx_h100(max(1, half * 72 // (DGX_SU_NODES * DGX_H100_GPUS)), prefix="b-")
        return Cluster(shape="mixed", tiers=TIERS, nodes=a.nodes + b.nodes)
    raise ValueError(f"--cluster: unknown shape {shape!r}; valid: {', '.join(SHAPES)}")
