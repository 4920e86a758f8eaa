from __future__ import annotations

import pathlib

import pytest

from tests.topology.factories import UUID_A, hgx_node, ib_port, nvl72_tray
from topology.builder import build_tree
from topology.ibnet import parse_ibnetdiscover, switch_tree
from topology.sources import SourceError, assemble, parse_mapping

SAMPLE = (pathlib.Path(__file__).parent / "data" / "two-racks.ibnetdiscover").read_text(encoding="utf-8")
LEAF1, LEAF2 = "2c5eab0300b87b40", "2c5eab0300b87b41"


def test_ibnetdiscover_matches_by_guid_then_host_name() -> None:
    inventories = {
        "rack0-tray0": nvl72_tray("rack0-tray0"),
        "rack0-tray1.cluster.local": nvl72_tray("rack0-tray1"),  # matched by short host name
        "rack1-tray0": nvl72_tray("rack1-tray0", clique_id=1),
        # HCA description never set: matched by the GUID its GPUNode reports
        "rack1-tray1": nvl72_tray(
            "rack1-tray1",
            clique_id=1,
            ports=(ib_port("mlx5_0", node_guid="e09d:7303:00aa:aa02", switch_guid=None),),
        ),
    }
    data = assemble(inventories=inventories, switch_tree=switch_tree(parse_ibnetdiscover(SAMPLE)))
    by_name = {n.name: n for n in data.nodes}
    assert by_name["rack0-tray0"].leaves == frozenset({LEAF1})
    assert by_name["rack0-tray1.cluster.local"].leaves == frozenset({LEAF1})
    assert by_name["rack1-tray1"].leaves == frozenset({LEAF2})
    assert {n.fabric_source for n in data.nodes} == {"ibnetdiscover"}
    tree = build_tree(data)
    assert {h.tier_name for h in tree.hypernodes.values()} == {"nvlink", "leaf", "spine", "core"}


def test_precedence_gpunode_then_mapping_then_labels() -> None:
    mapping = parse_mapping(
        "version: v1\nnodes:\n  b: [leaf-m]\n  a: leaf-ignored\nswitches:\n  leaf-m: [spine-m]\n",
        source="map.yaml",
    )
    inventories = {
        "a": hgx_node("a", ports=(ib_port("mlx5_0", node_guid="0x01", switch_guid="0xaa"),)),
        "b": hgx_node("b"),
        "c": hgx_node("c"),
    }
    labels = {
        "c": {"fabric.topograph.run/tier-0": "l7", "fabric.topograph.run/tier-1": "s7"},
        "d": {"nvidia.com/gpu.clique": f"{UUID_A}.5", "network.topology.nvidia.com/leaf": "lx"},
        "e": {"kubernetes.io/hostname": "e"},  # no GPU facts at all: not a member
    }
    data = assemble(inventories=inventories, node_labels=labels, mapping=mapping)
    got = {n.name: (n.fabric_source, sorted(n.leaves)) for n in data.nodes}
    assert got == {
        "a": ("gpunode", ["00000000000000aa"]),
        "b": ("mapping", ["leaf-m"]),
        "c": ("labels", ["topograph:l7"]),
        "d": ("labels", ["topograph-v0:lx"]),
    }
    assert data.uplinks["leaf-m"] == frozenset({"spine-m"})
    assert data.uplinks["topograph:l7"] == frozenset({"topograph:s7"})


def test_known_nodes_drop_gpunodes_of_deleted_nodes() -> None:
    data = assemble(inventories={"a": hgx_node("a"), "gone": hgx_node("gone")}, known_nodes=["a"])
    assert [n.name for n in data.nodes] == ["a"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v2\n", r"m.yaml: version: expected 'v1'"),
        ("version: v1\nnodes: [a]\n", r"m.yaml: nodes: expected a mapping"),
        ("version: v1\nnodes:\n  a: []\n", r"m.yaml: nodes.a: expected a switch name"),
        ("version: v1\nextra: 1\n", r"m.yaml: unknown key\(s\) extra"),
        ("version: [\n", r"m.yaml: not YAML"),
    ],
    ids=["version", "nodes-not-mapping", "empty-list", "unknown-key", "not-yaml"],
)
def test_mapping_errors(text: str, message: str) -> None:
    with pytest.raises(SourceError, match=message):
        parse_mapping(text, source="m.yaml")
