from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.topology.factories import UUID_A, UUID_B, tray
from topology.builder import (
    FabricPolicy,
    NodeFacts,
    TopologyInput,
    Tree,
    build_tree,
    desired_objects,
    diff,
    hypernode_object,
)
from topology.names import clique_domain_name, is_valid_name, node_domain_name, switch_set_name
from topology.nvlink import CliqueKey, FabricStatus


def rack(
    r: int, *, cluster: str | None = None, clique: int = 32766, leaves: tuple[str, ...] = ()
) -> list[NodeFacts]:
    uuid = cluster or f"9c6f5af3-0000-4000-8000-{r:012x}"
    return [tray(f"r{r}-t{t:02d}", cluster=uuid, clique=clique, leaves=leaves) for t in range(18)]


def rails(group: int, n: int = 4) -> tuple[str, ...]:
    return tuple(f"leaf-g{group}-rail{k}" for k in range(n))


def spine_uplinks(groups: dict[int, tuple[str, ...]]) -> dict[str, frozenset[str]]:
    return {leaf: frozenset(spines) for g, spines in groups.items() for leaf in rails(g)}


@dataclass
class Case:
    nodes: list[NodeFacts]
    uplinks: dict[str, frozenset[str]] = field(default_factory=dict)
    policy: FabricPolicy = FabricPolicy.ISOLATE
    # expected: tier name -> number of HyperNodes; parent checks (child domain -> parent tier)
    counts: dict[str, int] = field(default_factory=dict)
    roots: int = 0
    excluded: tuple[str, ...] = ()


def shape(tree: Tree) -> dict[str, int]:
    out: dict[str, int] = {}
    for h in tree.hypernodes.values():
        out[h.tier_name] = out.get(h.tier_name, 0) + 1
    return out


def roots(tree: Tree) -> int:
    return sum(1 for n in tree.hypernodes if n not in tree.parent)


CASES = {
    "nvl72-racks-under-leaves-and-spines": Case(
        nodes=rack(0, leaves=rails(0)) + rack(1, leaves=rails(1)) + rack(2, leaves=rails(2)),
        uplinks={
            **spine_uplinks({0: ("spine-a", "spine-b"), 1: ("spine-a", "spine-b"), 2: ("spine-c",)}),
            "spine-a": frozenset({"core-0"}),
            "spine-b": frozenset({"core-0"}),
            "spine-c": frozenset({"core-0"}),
        },
        counts={"nvlink": 3, "leaf": 3, "spine": 2, "core": 1},
        roots=1,
    ),
    "rack-split-into-two-36-gpu-cliques": Case(
        nodes=[
            tray(f"r0-t{t:02d}", cluster=UUID_A, clique=1 if t < 9 else 2, leaves=rails(0)) for t in range(18)
        ],
        counts={"nvlink": 2, "leaf": 1},
        roots=1,
    ),
    "same-clique-id-different-cluster-uuids": Case(
        nodes=rack(0, cluster=UUID_A, clique=32766, leaves=rails(0))
        + rack(1, cluster=UUID_B, clique=32766, leaves=rails(0)),
        counts={"nvlink": 2, "leaf": 1},
        roots=1,
    ),
    "nodes-with-no-ib-information-are-roots": Case(
        nodes=[*rack(0), NodeFacts(name="h100-a"), NodeFacts(name="h100-b", leaves=frozenset({"leaf-x"}))],
        counts={"nvlink": 3, "leaf": 1},
        roots=3,
    ),
    "unhealthy-fabric-isolated": Case(
        nodes=[
            *rack(0, cluster=UUID_A, leaves=rails(0))[:-1],
            tray("r0-t17", cluster=UUID_A, leaves=rails(0), fabric_status=FabricStatus.UNHEALTHY),
        ],
        counts={"nvlink": 2, "leaf": 1},
        roots=1,
        excluded=("r0-t17",),
    ),
    "unhealthy-fabric-excluded": Case(
        nodes=[
            *rack(0, cluster=UUID_A, leaves=rails(0))[:-1],
            tray("r0-t17", cluster=UUID_A, leaves=rails(0), fabric_status=FabricStatus.UNHEALTHY),
        ],
        policy=FabricPolicy.EXCLUDE,
        counts={"nvlink": 1, "leaf": 1},
        roots=1,
        excluded=("r0-t17",),
    ),
    "unhealthy-fabric-kept": Case(
        nodes=[
            *rack(0, cluster=UUID_A, leaves=rails(0))[:-1],
            tray("r0-t17", cluster=UUID_A, leaves=rails(0), fabric_status=FabricStatus.UNHEALTHY),
        ],
        policy=FabricPolicy.KEEP,
        counts={"nvlink": 1, "leaf": 1},
        roots=1,
        excluded=("r0-t17",),
    ),
    "incomplete-fabric-cannot-be-kept": Case(
        nodes=[
            tray("r0-t00", leaves=rails(0)),
            tray("r0-t01", leaves=rails(0), fabric_status=FabricStatus.INCOMPLETE),
        ],
        policy=FabricPolicy.KEEP,
        counts={"nvlink": 2, "leaf": 1},
        roots=1,
        excluded=("r0-t01",),
    ),
    "node-with-a-dead-link-stays-in-its-leaf-domain": Case(
        nodes=[
            *rack(0, leaves=rails(0))[:-1],
            tray("r0-t17", cluster="9c6f5af3-0000-4000-8000-000000000000", leaves=rails(0)[:3]),
        ],
        counts={"nvlink": 1, "leaf": 1},
        roots=1,
    ),
    "irregular-leaf-without-uplinks-is-a-root": Case(
        nodes=rack(0, leaves=rails(0)) + rack(1, leaves=rails(1)),
        uplinks=spine_uplinks({0: ("spine-a",)}),
        counts={"nvlink": 2, "leaf": 2, "spine": 1},
        roots=2,
    ),
    "irregular-domain-spanning-two-leaves-hangs-under-spine": Case(
        nodes=[tray(f"r0-t{t:02d}", cluster=UUID_A, leaves=rails(0 if t < 9 else 1)) for t in range(18)],
        uplinks=spine_uplinks({0: ("spine-a",), 1: ("spine-a",)}),
        counts={"nvlink": 1, "spine": 1},
        roots=1,
    ),
    "irregular-domain-spanning-disjoint-spines-is-a-root": Case(
        nodes=[tray(f"r0-t{t:02d}", cluster=UUID_A, leaves=rails(0 if t < 9 else 1)) for t in range(18)],
        uplinks=spine_uplinks({0: ("spine-a",), 1: ("spine-b",)}),
        counts={"nvlink": 1},
        roots=1,
    ),
    "irregular-uneven-depth-under-one-core": Case(
        nodes=rack(0, leaves=rails(0))
        + rack(1, leaves=rails(1))
        + [NodeFacts("cpu-1", leaves=frozenset({"spine-b"}))],
        uplinks={**spine_uplinks({0: ("spine-a",), 1: ("spine-b",)}), "spine-a": frozenset({"core-0"})},
        counts={"nvlink": 3, "leaf": 3, "spine": 2, "core": 1},
        roots=3,  # core-0, spine-b (no core above it) and the leaf domain of the odd node
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_builder_table(case: Case) -> None:
    tree = build_tree(TopologyInput(tuple(case.nodes), case.uplinks), policy=case.policy)
    assert shape(tree) == case.counts
    assert roots(tree) == case.roots
    assert tuple(tree.excluded) == case.excluded
    assert_tree_invariants(tree)


def test_nvl72_racks_details() -> None:
    case = CASES["nvl72-racks-under-leaves-and-spines"]
    tree = build_tree(TopologyInput(tuple(case.nodes), case.uplinks))
    d0 = clique_domain_name(CliqueKey("9c6f5af3-0000-4000-8000-000000000000", 32766))
    assert tree.hypernodes[d0].members == tuple(f"r0-t{t:02d}" for t in range(18))
    leaf0 = switch_set_name("leaf", rails(0))
    assert tree.parent[d0] == leaf0
    spine_ab = switch_set_name("spine", ("spine-a", "spine-b"))
    assert tree.parent[leaf0] == spine_ab
    assert tree.parent[switch_set_name("leaf", rails(1))] == spine_ab
    assert tree.parent[spine_ab] == "core-core-0"
    assert tree.ancestors("r2-t05") == {
        "nvlink": clique_domain_name(CliqueKey("9c6f5af3-0000-4000-8000-000000000002", 32766)),
        "leaf": switch_set_name("leaf", rails(2)),
        "spine": "spine-spine-c",
        "core": "core-core-0",
    }
    obj = hypernode_object(tree.hypernodes[spine_ab])
    assert obj["spec"]["tier"] == 3
    assert obj["spec"]["tierName"] == "spine"
    assert [m["type"] for m in obj["spec"]["members"]] == ["HyperNode", "HyperNode"]
    assert obj["metadata"]["labels"]["volcano.sh/network-topology-source"] == "gpu-node-agent"
    t1 = hypernode_object(tree.hypernodes[d0])
    assert t1["spec"]["members"][0] == {"type": "Node", "selector": {"exactMatch": {"name": "r0-t00"}}}


def test_same_clique_id_in_two_racks_never_merges() -> None:
    tree = build_tree(TopologyInput(tuple(CASES["same-clique-id-different-cluster-uuids"].nodes)))
    a = tree.node_domain["r0-t00"]
    b = tree.node_domain["r1-t00"]
    assert a != b
    assert UUID_A in a
    assert UUID_B in b


def test_unhealthy_node_reason_and_isolation() -> None:
    case = CASES["unhealthy-fabric-isolated"]
    tree = build_tree(TopologyInput(tuple(case.nodes)))
    assert tree.node_domain["r0-t17"] == node_domain_name("r0-t17")
    assert "isolated" in tree.excluded["r0-t17"]
    assert "unhealthy" in tree.excluded["r0-t17"]


def test_dead_link_is_noted() -> None:
    case = CASES["node-with-a-dead-link-stays-in-its-leaf-domain"]
    tree = build_tree(TopologyInput(tuple(case.nodes)))
    assert tree.notes == ("r0-t17: no link to leaf switch(es) leaf-g0-rail3; kept in their leaf domain",)


def test_domain_spanning_leaves_is_documented_in_notes() -> None:
    case = CASES["irregular-domain-spanning-two-leaves-hangs-under-spine"]
    tree = build_tree(TopologyInput(tuple(case.nodes), case.uplinks))
    assert any("hung under spine" in n for n in tree.notes)


def test_duplicate_node_is_an_error() -> None:
    with pytest.raises(ValueError, match="listed twice: a"):
        build_tree(TopologyInput((NodeFacts("a"), NodeFacts("a"))))


# --------------------------------------------------------------------------- diff


def test_diff_writes_only_what_changed_and_only_ours() -> None:
    case = CASES["nvl72-racks-under-leaves-and-spines"]
    tree = build_tree(TopologyInput(tuple(case.nodes), case.uplinks))
    desired = desired_objects(tree)
    first = diff(desired, {})
    assert first.writes == len(desired)
    assert [o["spec"]["tier"] for o in first.apply] == sorted(o["spec"]["tier"] for o in first.apply)
    observed = {n: {**o, "status": {"nodeCount": 3}} for n, o in desired.items()}
    foreign = {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": "admin-made", "labels": {}},
        "spec": {"tier": 1, "members": []},
    }
    observed["admin-made"] = foreign
    assert diff(desired, observed).writes == 0

    # one tray's fabric goes unhealthy: its clique loses a member, it gets its own domain, the leaf
    # gains that domain; nothing else is written
    nodes = [
        n
        if n.name != "r1-t03"
        else tray(
            "r1-t03",
            cluster=n.clique.cluster_uuid if n.clique else "",
            leaves=rails(1),
            fabric_status=FabricStatus.UNHEALTHY,
        )
        for n in case.nodes
    ]
    changed = diff(desired_objects(build_tree(TopologyInput(tuple(nodes), case.uplinks))), observed)
    assert sorted(o["metadata"]["name"] for o in changed.apply) == sorted(
        [tree.node_domain["r1-t03"], node_domain_name("r1-t03"), switch_set_name("leaf", rails(1))]
    )
    assert changed.delete == ()

    # a name we want but someone else holds is left alone; a stale one of ours is deleted
    observed[node_domain_name("r1-t03")] = {**foreign, "metadata": {"name": node_domain_name("r1-t03")}}
    observed["nvl-stale"] = desired[tree.node_domain["r0-t00"]] | {
        "metadata": {"name": "nvl-stale", "labels": {"volcano.sh/network-topology-source": "gpu-node-agent"}}
    }
    again = diff(desired_objects(build_tree(TopologyInput(tuple(nodes), case.uplinks))), observed)
    assert again.conflicts == (node_domain_name("r1-t03"),)
    assert again.delete == ("nvl-stale",)
    assert "admin-made" not in again.delete


# --------------------------------------------------------------------------- properties


def assert_tree_invariants(tree: Tree) -> None:
    seen_nodes: dict[str, str] = {}
    for name, h in tree.hypernodes.items():
        assert is_valid_name(name), name
        assert h.members, name
        if h.tier_name == "nvlink":
            for m in h.members:
                assert m not in seen_nodes, f"{m} in {seen_nodes[m]} and {name}"
                seen_nodes[m] = name
        else:
            for m in h.members:
                assert tree.parent[m] == name
                assert tree.hypernodes[m].tier < h.tier
    assert seen_nodes == dict(tree.node_domain)
    for child, parent in tree.parent.items():
        assert child in tree.hypernodes[parent].members
        # walking up always ends (no cycles)
        steps, current = 0, child
        while current in tree.parent:
            current = tree.parent[current]
            steps += 1
            assert steps <= 4


@st.composite
def fabrics(draw: st.DrawFn) -> TopologyInput:
    n_spines = draw(st.integers(0, 3))
    n_leaves = draw(st.integers(1, 6))
    leaves = [f"L{i}" for i in range(n_leaves)]
    spines = [f"S{i}" for i in range(n_spines)]
    uplinks: dict[str, frozenset[str]] = {}
    if spines:
        for leaf in leaves:
            ups = draw(st.sets(st.sampled_from(spines), max_size=2))
            if ups:
                uplinks[leaf] = frozenset(ups)
        for s in spines:
            if draw(st.booleans()):
                uplinks[s] = frozenset({draw(st.sampled_from(["C0", "C1"]))})
    nodes = []
    for i in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["clique", "own", "unhealthy", "incomplete"]))
        node_leaves = frozenset(draw(st.sets(st.sampled_from(leaves), max_size=2)))
        cluster = draw(st.sampled_from([UUID_A, UUID_B]))
        clique = draw(st.sampled_from([1, 2, 32766]))
        if kind == "own":
            nodes.append(NodeFacts(f"n{i}", leaves=node_leaves))
        elif kind == "clique":
            nodes.append(NodeFacts(f"n{i}", FabricStatus.OK, CliqueKey(cluster, clique), leaves=node_leaves))
        elif kind == "unhealthy":
            nodes.append(
                NodeFacts(
                    f"n{i}",
                    FabricStatus.UNHEALTHY,
                    CliqueKey(cluster, clique),
                    reason="x",
                    leaves=node_leaves,
                )
            )
        else:
            nodes.append(NodeFacts(f"n{i}", FabricStatus.INCOMPLETE, reason="y", leaves=node_leaves))
    return TopologyInput(tuple(nodes), uplinks)


@given(data=fabrics(), policy=st.sampled_from(list(FabricPolicy)), seed=st.randoms(use_true_random=False))
def test_property_tree_invariants_and_stable_names(
    data: TopologyInput, policy: FabricPolicy, seed: object
) -> None:
    tree = build_tree(data, policy=policy)
    assert_tree_invariants(tree)
    shuffled_nodes = list(data.nodes)
    seed.shuffle(shuffled_nodes)  # type: ignore[attr-defined]
    shuffled_up = dict(reversed(list(data.uplinks.items())))
    again = build_tree(TopologyInput(tuple(shuffled_nodes), shuffled_up), policy=policy)
    assert desired_objects(again) == desired_objects(tree)
    assert again.node_domain == tree.node_domain
    for n in data.nodes:
        if policy is FabricPolicy.EXCLUDE and n.fabric in (FabricStatus.UNHEALTHY, FabricStatus.INCOMPLETE):
            assert n.name not in tree.node_domain
            assert n.name in tree.excluded
        else:
            assert n.name in tree.node_domain


# Volcano's HyperNode CRD constraints (scheduling reference §2.1), checked on every object we build
VOLCANO_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def assert_volcano_valid(obj: dict[str, object]) -> None:
    spec = obj["spec"]
    assert isinstance(spec, dict)
    assert isinstance(spec["tier"], int)
    assert spec["tier"] >= 0
    assert len(spec["tierName"]) <= 253
    assert len(spec["members"]) >= 1
    for m in spec["members"]:
        assert m["type"] in ("Node", "HyperNode")
        # exactly one selector; HyperNode members need exactMatch
        assert list(m["selector"]) == ["exactMatch"]
        name = m["selector"]["exactMatch"]["name"]
        assert 1 <= len(name) <= 253
        assert VOLCANO_NAME.match(name), name
    meta = obj["metadata"]
    assert isinstance(meta, dict)
    assert VOLCANO_NAME.match(meta["name"])
    assert len(meta["name"]) <= 63


@given(data=fabrics(), policy=st.sampled_from(list(FabricPolicy)))
def test_property_objects_pass_volcano_schema(data: TopologyInput, policy: FabricPolicy) -> None:
    for obj in desired_objects(build_tree(data, policy=policy)).values():
        assert_volcano_valid(obj)


def test_long_and_odd_node_names_still_make_valid_names() -> None:
    # Node names are DNS subdomains up to 253 characters; HyperNode names stay within 63
    nodes = (NodeFacts("a" * 240 + ".example.com"), NodeFacts("gpu-node.rack-07.dc1"), NodeFacts("a" * 241))
    tree = build_tree(TopologyInput(nodes))
    for obj in desired_objects(tree).values():
        assert_volcano_valid(obj)
    assert len(set(tree.node_domain.values())) == 3
