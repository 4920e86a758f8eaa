from __future__ import annotations

from tests.topology.test_builder import CASES
from topology.builder import TopologyInput, build_tree
from topology.exports import block_sizes, hostlist, kueue_objects, labels_objects, slurm_topology
from topology.names import fnv64a, topograph_value


def tree_of(case: str):  # type: ignore[no-untyped-def]
    c = CASES[case]
    return build_tree(TopologyInput(tuple(c.nodes), c.uplinks))


def test_hostlist() -> None:
    assert hostlist(["gpu001", "gpu002", "gpu003", "gpu007"]) == "gpu[001-003,007]"
    assert hostlist(["n9", "n10", "n11", "login"]) == "login,n[9-11]"
    assert hostlist(["r0-t00"]) == "r0-t00"


def test_block_sizes_follow_topograph() -> None:
    assert block_sizes([18, 18, 18]) == [18, 36]
    assert block_sizes([18] * 8) == [18, 36, 72, 144]
    assert block_sizes([9, 18]) == [9, 18]
    assert block_sizes([]) == []


def test_slurm_block_and_tree() -> None:
    tree = tree_of("nvl72-racks-under-leaves-and-spines")
    block = slurm_topology(tree, form="block").splitlines()
    assert block[1].startswith("BlockName=nvl-9c6f5af3-0000-4000-8000-000000000000-32766 Nodes=r0-t[00-17]")
    assert block[-1] == "BlockSizes=18,36"
    # blocks under the same spine are adjacent (r0 and r1 share spine-a/b; r2 is under spine-c)
    assert [line.split()[1] for line in block[1:4]] == [
        "Nodes=r0-t[00-17]",
        "Nodes=r1-t[00-17]",
        "Nodes=r2-t[00-17]",
    ]
    tree_form = slurm_topology(tree, form="tree")
    assert "Nodes=r2-t[00-17]" in tree_form
    assert "SwitchName=core-core-0 Switches=spine-" in tree_form


def test_kueue_topology_and_labels() -> None:
    tree = tree_of("nvl72-racks-under-leaves-and-spines")
    topo, *nodes = kueue_objects(tree)
    assert topo["kind"] == "Topology"
    assert [lv["nodeLabel"] for lv in topo["spec"]["levels"]] == [
        "gpuagent.dev/topology-core",
        "gpuagent.dev/topology-spine",
        "gpuagent.dev/topology-leaf",
        "gpuagent.dev/nvlink-domain",  # the agent's own label: what users and the other gang APIs name
        "kubernetes.io/hostname",
    ]
    assert len(nodes) == 54
    assert nodes[0]["metadata"]["labels"]["gpuagent.dev/topology-core"] == "core-core-0"


def test_topograph_labels() -> None:
    tree = tree_of("nvl72-racks-under-leaves-and-spines")
    first = labels_objects(tree)[0]["metadata"]["labels"]
    assert first["accelerator.topograph.run/domain"] == "9c6f5af3-0000-4000-8000-000000000000.32766"
    assert first["fabric.topograph.run/tier-2"] == "core-core-0"
    assert first["fabric.topograph.run/tier-0"].startswith("leaf-")
    assert topograph_value("a" * 64) == f"x{fnv64a('a' * 64):016x}"
    assert fnv64a("") == 0xCBF29CE484222325
