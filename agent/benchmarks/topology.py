"""``gpu-node-agent bench topology``: HyperNode build and diff for a 10,000-node cluster.

The cluster: 555 GB200 NVL72 racks (18 trays each, one clique per rack, 9,990 nodes) plus 10 HGX
H100 nodes; rail-optimised InfiniBand: two racks share one leaf per rail (4 rails), 8 leaf groups
share a spine set, spine sets hang under 2 core switches. Figures:

- build: builder input -> tree (``topology.builder.build_tree``);
- objects + diff: HyperNode objects and the diff against an identical cluster (no writes expected);
- one change: one tray's fabric turns unhealthy -> rebuild, diff, and the writes it issues;
- reconcile input: GPUNode objects -> builder input, cold (every object parsed) and warm (the
  controller's parse cache, one object changed).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from agent.benchmarks.machine import describe_ms, machine_summary
from topology.builder import NodeFacts, TopologyInput, build_tree, desired_objects, diff
from topology.controller import Inputs, ParseCache, build_from
from topology.gpunode import gpunode_object
from topology.model import (
    ConnectivityMatrix,
    Driver,
    FabricHealth,
    FabricHealthSummary,
    FabricInfo,
    FabricState,
    Gpu,
    Host,
    NodeInventory,
)
from topology.nvlink import CliqueKey, FabricStatus

RAILS = 4
RACKS_PER_LEAF_GROUP = 2
LEAF_GROUPS_PER_SPINE_SET = 8


def cluster_uuid(rack: int) -> str:
    return f"7b968a6d-c8aa-45e1-9e07-{rack:012x}"


def synthetic_input(racks: int, hgx: int) -> TopologyInput:
    nodes: list[NodeFacts] = []
    uplinks: dict[str, frozenset[str]] = {}
    for r in range(racks):
        group = r // RACKS_PER_LEAF_GROUP
        leaves = frozenset(f"leaf-g{group:04d}-r{k}" for k in range(RAILS))
        spine_set = group // LEAF_GROUPS_PER_SPINE_SET
        for leaf in leaves:
            uplinks[leaf] = frozenset(f"spine-s{spine_set:03d}-r{k}" for k in range(RAILS))
        for t in range(18):
            nodes.append(
                NodeFacts(
                    name=f"r{r:03d}-t{t:02d}",
                    fabric=FabricStatus.OK,
                    clique=CliqueKey(cluster_uuid(r), 32766),
                    leaves=leaves,
                    fabric_source="ibnetdiscover",
                )
            )
    for s in range((racks // RACKS_PER_LEAF_GROUP) // LEAF_GROUPS_PER_SPINE_SET + 1):
        for k in range(RAILS):
            uplinks[f"spine-s{s:03d}-r{k}"] = frozenset({f"core-{s % 2}"})
    hgx_leaves = frozenset(f"leaf-hgx-r{k}" for k in range(RAILS))
    for k in range(RAILS):
        uplinks[f"leaf-hgx-r{k}"] = frozenset(f"spine-s000-r{j}" for j in range(RAILS))
    for i in range(hgx):
        nodes.append(NodeFacts(name=f"hgx-{i:02d}", leaves=hgx_leaves, fabric_source="gpunode"))
    return TopologyInput(tuple(nodes), uplinks)


def tray_inventory(rack: int, tray: int) -> NodeInventory:
    gpus = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{rack:04x}{tray:02x}{i:02x}-0000-4000-8000-000000000000",
            name="NVIDIA GB200",
            serial=None,
            pci_bus_id=f"00000008:0{i + 1}:00.0",
            minor_number=i,
            memory_total_bytes=189471 * 2**20,
            compute_capability=(10, 0),
            architecture="blackwell",
            numa_node=i // 2,
            cpu_affinity=None,
            persistence_mode=True,
            compute_mode="DEFAULT",
        )
        for i in range(4)
    )
    fabric = tuple(
        FabricInfo(
            gpu_index=i,
            cluster_uuid=cluster_uuid(rack),
            clique_id=32766,
            state=FabricState.COMPLETED,
            status="SUCCESS",
            health_mask=0x1AA,
            health=FabricHealth(degraded_bandwidth=False),
            health_summary=FabricHealthSummary.HEALTHY,
        )
        for i in range(4)
    )
    cells = tuple(tuple("X" if a == b else "NV18" for b in range(4)) for a in range(4))
    return NodeInventory(
        host=Host(name=f"r{rack:03d}-t{tray:02d}", cpu_count=144, memory_bytes=2**39),
        driver=Driver("580.126.20", "13.580.126.20", 13000),
        gpus=gpus,
        matrix=ConnectivityMatrix((0, 1, 2, 3), cells),
        fabric=fabric,
    )


def timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    samples: list[float] = []
    out: Any = None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        samples.append(time.perf_counter() - start)
    return samples, out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu-node-agent bench topology", description=__doc__.split("\n\n")[0])
    p.add_argument("--racks", type=int, default=555, help="NVL72 racks (18 nodes each)")
    p.add_argument("--hgx", type=int, default=10, help="8-GPU HGX nodes besides the racks")
    p.add_argument("--repeat", type=int, default=5, help="repetitions per figure")
    p.add_argument(
        "--gpunodes",
        type=int,
        default=None,
        help="GPUNode objects for the reconcile-input figure (default: all trays)",
    )
    args = p.parse_args(argv)
    if args.gpunodes is None:
        args.gpunodes = args.racks * 18
    if args.racks < 1 or args.repeat < 1 or args.hgx < 0 or args.gpunodes < 1:
        print("bench topology: --racks, --repeat, --gpunodes must be >= 1 and --hgx >= 0")
        return 2

    data = synthetic_input(args.racks, args.hgx)
    print(f"topology bench: {len(data.nodes)} nodes ({args.racks} NVL72 racks + {args.hgx} HGX)")
    print(machine_summary())

    build_s, tree = timed(lambda: build_tree(data), args.repeat)
    tiers: dict[str, int] = {}
    for h in tree.hypernodes.values():
        tiers[h.tier_name] = tiers.get(h.tier_name, 0) + 1
    print(f"tree: {len(tree.hypernodes)} HyperNodes {tiers}")
    print(f"build:             {describe_ms(build_s)}")

    observed = desired_objects(tree)
    diff_s, same = timed(lambda: diff(desired_objects(tree), observed), args.repeat)
    print(f"objects + diff:    {describe_ms(diff_s)}; writes against an identical cluster: {same.writes}")

    victim = data.nodes[len(data.nodes) // 2]
    sick = replace(victim, fabric=FabricStatus.UNHEALTHY, reason="fabric health UNHEALTHY on GPU 0")
    changed_input = TopologyInput(
        tuple(sick if n.name == victim.name else n for n in data.nodes), data.uplinks
    )
    change_s, change = timed(lambda: diff(desired_objects(build_tree(changed_input)), observed), args.repeat)
    names = sorted(o["metadata"]["name"] for o in change.apply) + [f"-{n}" for n in change.delete]
    print(f"one node changes:  {describe_ms(change_s)} (build + objects + diff)")
    print(f"  writes issued: {change.writes} of {len(tree.hypernodes)} HyperNodes: {', '.join(names)}")

    n = min(args.gpunodes, args.racks * 18)
    objs: dict[str, dict[str, Any]] = {}
    for i in range(n):
        r, t = divmod(i, 18)
        obj = gpunode_object(tray_inventory(r, t), node_name=f"r{r:03d}-t{t:02d}")
        obj["metadata"]["resourceVersion"] = str(i + 1)
        objs[obj["metadata"]["name"]] = obj
    cold_s, _ = timed(lambda: build_from(Inputs(gpunodes=objs, nodes=None), policy=tree_policy()), 1)
    cache: ParseCache = {}
    build_from(Inputs(gpunodes=objs, nodes=None), policy=tree_policy(), cache=cache)
    first = next(iter(objs))
    objs[first] = {**objs[first], "metadata": {**objs[first]["metadata"], "resourceVersion": "changed"}}
    warm_s, _ = timed(
        lambda: build_from(Inputs(gpunodes=objs, nodes=None), policy=tree_policy(), cache=cache), args.repeat
    )
    per_node_ms = cold_s[0] * 1000 / n
    print(
        f"reconcile input ({n} GPUNodes): cold {cold_s[0] * 1000:.1f} ms ({per_node_ms:.3f} ms/node, "
        f"~{per_node_ms * len(data.nodes) / 1000:.1f} s for {len(data.nodes)}), warm {describe_ms(warm_s)}"
    )
    return 0


def tree_policy() -> Any:
    from topology.builder import FabricPolicy  # noqa: PLC0415

    return FabricPolicy.ISOLATE
