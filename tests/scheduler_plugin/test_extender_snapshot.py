"""``ExtenderState.snapshot``: kept while no node's state changes, and after each change equal to the
snapshot a fresh state builds from the same objects (nodes added, removed, their pods changed)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler_plugin.extender import ExtenderState
from tests.integration.fakekube import hypernode, node, pod

RACKS = 2
TRAYS = 4
NAMES = [f"r{r}-t{t}" for r in range(RACKS) for t in range(TRAYS)]


def state(nodes: list[str], pods: list[tuple[str, int, str]]) -> ExtenderState:
    s = ExtenderState()
    s.cache.replace("nodes", [node(n, 4) for n in nodes])
    s.cache.replace(
        "hypernodes",
        [hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t{t}" for t in range(TRAYS)]) for r in range(RACKS)],
    )
    s.cache.replace("pods", [pod(name, g, node_name=n) for name, g, n in pods if n in nodes])
    return s


def test_a_snapshot_is_kept_while_nothing_changes() -> None:
    s = state(NAMES, [("a", 2, "r0-t0")])
    first = s.cache.snapshot()
    assert s.cache.snapshot() is first
    s.cache.apply("nodes", "MODIFIED", node("r0-t1", 4))  # the same node again: no state changes
    assert s.cache.snapshot() is first
    s.cache.apply("pods", "ADDED", pod("b", 1, node_name="r1-t2"))
    after = s.cache.snapshot()
    assert after is not first
    assert {n.name: n.free for n in after.nodes}["r1-t2"] == 3


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add-node", "remove-node", "add-pod", "remove-pod"]),
            st.sampled_from(NAMES),
            st.integers(1, 4),
        ),
        max_size=12,
    )
)
def test_each_snapshot_equals_a_fresh_states(steps: list[tuple[str, str, int]]) -> None:
    nodes = list(NAMES[:5])
    pods: list[tuple[str, int, str]] = []
    s = state(nodes, pods)
    s.cache.snapshot()
    for k, (what, name, g) in enumerate(steps):
        if what == "add-node" and name not in nodes:
            nodes.append(name)
            s.cache.apply("nodes", "ADDED", node(name, 4))
        elif what == "remove-node" and name in nodes:
            nodes.remove(name)
            s.cache.apply("nodes", "DELETED", node(name, 4))
        elif what == "add-pod" and name in nodes:
            pods.append((f"p{k}", g, name))
            s.cache.apply("pods", "ADDED", pod(f"p{k}", g, node_name=name))
        elif what == "remove-pod" and pods:
            gone = pods.pop(0)
            s.cache.apply("pods", "DELETED", pod(gone[0], gone[1], node_name=gone[2]))
        assert s.cache.snapshot() == state(nodes, pods).cache.snapshot()
