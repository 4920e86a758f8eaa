"""API objects to a planner snapshot: quantities, pod requests, HyperNode trees, label fallback."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_plugin.cluster import (
    _amount,
    hypernode_domains,
    parse_quantity,
    pod_requests,
    snapshot_from_objects,
)
from scheduler_plugin.snapshot import changed_nodes
from tests.integration.fakekube import hypernode, node, pod


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4", Decimal(4)),
        ("500m", Decimal("0.5")),
        ("64Gi", Decimal(64 * 2**30)),
        ("1k", Decimal(1000)),
        ("1.5", Decimal("1.5")),
        ("2e3", Decimal(2000)),
        (8, Decimal(8)),
    ],
)
def test_parse_quantity(text: Any, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "four", "4Xi", "--1", True, None, [1]])
def test_parse_quantity_rejects(bad: Any) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(bad)


def test_pod_requests_sum_containers_and_take_the_largest_init() -> None:
    p = {
        "spec": {
            "containers": [
                {
                    "resources": {
                        "limits": {"nvidia.com/gpu": "2"},
                        "requests": {"cpu": "500m", "memory": "1Gi"},
                    }
                },
                {"resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}},
            ],
            "initContainers": [{"resources": {"requests": {"cpu": "4"}}}],
        }
    }
    assert pod_requests(p) == {"nvidia.com/gpu": 3, "cpu": 4000, "memory": 2**30}


def test_hypernode_tree_with_every_selector() -> None:
    names = ["gpu-a0", "gpu-a1", "gpu-b0", "cpu-0"]
    labels = {"gpu-a0": {}, "gpu-a1": {}, "gpu-b0": {"rack": "b"}, "cpu-0": {}}
    hns = [
        {
            "metadata": {"name": "nvl-a"},
            "spec": {
                "tier": 1,
                "tierName": "nvlink",
                "members": [{"type": "Node", "selector": {"regexMatch": {"pattern": "^gpu-a"}}}],
            },
        },
        {
            "metadata": {"name": "nvl-b"},
            "spec": {
                "tier": 1,
                "members": [{"type": "Node", "selector": {"labelMatch": {"matchLabels": {"rack": "b"}}}}],
            },
        },
        hypernode("spine", 3, "", ["nvl-a", "nvl-b"], member_type="HyperNode"),
        {"metadata": {"name": "broken"}, "spec": {"tier": "x"}},
    ]
    tiers, domains = hypernode_domains(hns, names, labels)
    assert tiers == ("nvlink", "spine")  # tier 3 has no tierName: the default name for tier 3
    assert domains["gpu-a1"] == {"nvlink": "nvl-a", "spine": "spine"}
    assert domains["gpu-b0"] == {"nvlink": "nvl-b", "spine": "spine"}
    assert domains["cpu-0"] == {}


def test_hypernode_cycle_is_ignored() -> None:
    hns = [
        hypernode("x", 2, "leaf", ["y"], member_type="HyperNode"),
        {"metadata": {"name": "y"}, "spec": {"tier": 1, "tierName": "nvlink", "members": [
            {"type": "HyperNode", "selector": {"exactMatch": {"name": "x"}}},
            {"type": "Node", "selector": {"exactMatch": {"name": "n"}}},
        ]}},
    ]  # fmt: skip
    _, domains = hypernode_domains(hns, ["n"], {"n": {}})
    assert domains["n"] == {"nvlink": "y", "leaf": "x"}


def test_snapshot_mixes_hypernodes_and_label_fallback() -> None:
    nodes = [
        node("a", 4, labels={"gpuagent.dev/ib-leaf": "leaf-1"}),
        node("b", 4, labels={"nvidia.com/gpu.clique": "uuid.1", "gpuagent.dev/ib-leaf": "leaf-1"}),
    ]
    nodes[0]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    snap = snapshot_from_objects(
        nodes, [pod("p", 1, node_name="b")], [hypernode("nvl-a", 1, "nvlink", ["a"])]
    )
    assert snap.tiers == ("nvlink", "leaf")
    a, b = snap.nodes
    assert dict(a.domains) == {"nvlink": "nvl-a", "leaf": "leaf-1"}
    assert dict(b.domains) == {"nvlink": "uuid.1", "leaf": "leaf-1"}
    assert not a.schedulable
    assert (b.gpus, b.free) == (4, 3)


def test_reserved_resources_reduce_free() -> None:
    snap = snapshot_from_objects([node("a", 8)], [], reserved={"a": {"nvidia.com/gpu": 6, "cpu": 1000}})
    (a,) = snap.nodes
    assert a.free == 2
    assert a.free_resources["cpu"] == 63000


def test_a_snapshot_reuses_the_unchanged_nodes_of_the_previous_one() -> None:
    # the planner diffs snapshots by object identity: nodes whose state did not change keep their
    # NodeState object, the others get a new one
    nodes = [node(name, 4, labels={"nvidia.com/gpu.clique": "uuid.1"}) for name in ("a", "b", "c")]
    first = snapshot_from_objects(nodes, [pod("p", 1, node_name="a")])
    second = snapshot_from_objects(
        nodes, [pod("p", 1, node_name="a"), pod("q", 2, node_name="c")], previous=first
    )
    assert second.nodes[0] is first.nodes[0]
    assert second.nodes[1] is first.nodes[1]
    assert second.nodes[2] is not first.nodes[2]
    assert (second.nodes[2].free, first.nodes[2].free) == (2, 4)
    relabelled = [node("b", 4, labels={"nvidia.com/gpu.clique": "uuid.2"}), *nodes[::2]]
    third = snapshot_from_objects(relabelled, [], previous=second)
    assert dict(third.nodes[1].domains) == {"nvlink": "uuid.2"}
    assert third.nodes[1] is not second.nodes[1]


def test_the_planner_prepares_a_reused_snapshot_from_the_last_one() -> None:
    nodes = [node(f"n{i}", 4, labels={"nvidia.com/gpu.clique": f"uuid.{i // 2}"}) for i in range(6)]
    first = snapshot_from_objects(nodes, [])
    second = snapshot_from_objects(nodes, [pod("p", 4, node_name="n3")], previous=first)
    assert changed_nodes(first, second) == [3]
    fresh = snapshot_from_objects(nodes, [pod("p", 4, node_name="n3")])
    assert changed_nodes(first, fresh) == list(range(6))  # every object new: all count as changed


@given(st.from_regex(r"\A[0-9]{1,25}\Z"), st.sampled_from(["nvidia.com/gpu", "cpu", "memory"]))
def test_whole_number_quantities_read_fast_count_as_the_quantity_parser_says(
    text: str, resource: str
) -> None:
    scale = 1000 if resource == "cpu" else 1
    assert _amount(resource, text) == int(parse_quantity(text) * scale)


@pytest.mark.parametrize("text", ["٤", "²", "4 ", "+4"])
def test_other_digits_take_the_full_parser(text: str) -> None:
    """Unicode digits are not quantities; a sign or a space goes through the parser as before."""
    if text in ("٤", "²"):
        with pytest.raises(ValueError, match="not a quantity"):
            _amount("nvidia.com/gpu", text)
    else:
        assert _amount("nvidia.com/gpu", text) == 4


def test_a_degraded_fabric_label_marks_the_node_degraded_and_changes_the_topology() -> None:
    labels = {"nvidia.com/gpu.clique": "uuid.1"}
    clean = snapshot_from_objects([node("a", 4, labels=labels), node("b", 4, labels=labels)], [])
    assert [n.degraded for n in clean.nodes] == [False, False]
    bad = {**labels, "gpuagent.dev/fabric-health": "degraded"}
    snap = snapshot_from_objects([node("a", 4, labels=bad), node("b", 4, labels=labels)], [], previous=clean)
    assert [n.degraded for n in snap.nodes] == [True, False]
    assert changed_nodes(clean, snap) is None  # the planner prepares it afresh: domains fill clean-first
    unhealthy = {"gpuagent.dev/fabric-health": "unhealthy"}  # the agent withdrew its clique label too
    (n,) = snapshot_from_objects([node("c", 4, labels=unhealthy)], []).nodes
    assert not n.degraded
    assert "nvlink" not in n.domains
