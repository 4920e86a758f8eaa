"""The reservation's future snapshots built incrementally (``queue._Futures``) against the same futures
built from scratch (``queue._future_from_scratch``), and the queue's decisions with either: equal node
for node, whatever order the bisection asks for them in."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_plugin import queue as q
from scheduler_plugin.queue import QueueConfig, Reservation, Running, Waiting, decide, planner_place
from scheduler_plugin.snapshot import ClusterSnapshot, NodeState
from tests.scheduler_plugin.placement.builders import TIERS, gang

RESOURCES = ("cpu", "memory")


@st.composite
def clusters(draw: st.DrawFn) -> ClusterSnapshot:
    """A few racks of nodes with GPUs, CPU and memory, some free beyond allocatable, some unschedulable
    or not ready."""
    nodes = []
    for r in range(draw(st.integers(1, 4))):
        domains = {"nvlink": f"nvl-{r}", "leaf": f"leaf-{r // 2}", "spine": "spine-0"}
        for t in range(draw(st.integers(1, 5))):
            gpus = draw(st.integers(0, 8))
            resources = {k: draw(st.integers(0, 16)) for k in RESOURCES if draw(st.booleans())}
            nodes.append(
                NodeState(
                    name=f"r{r}-n{t}",
                    gpus=gpus,
                    free=draw(st.integers(-1, gpus + 1)),
                    domains=domains,
                    resources=resources,
                    free_resources={k: draw(st.integers(0, 20)) for k in resources if draw(st.booleans())},
                    schedulable=draw(st.integers(0, 5)) > 0,
                    ready=draw(st.integers(0, 5)) > 0,
                )
            )
    return ClusterSnapshot(tiers=TIERS, nodes=tuple(nodes))


@st.composite
def work(draw: st.DrawFn, snapshot: ClusterSnapshot, *, negative: bool = False) -> dict[str, Running]:
    """Running work on the cluster's nodes (and on a node it does not have), ending at a few shared
    times so that several end at once."""
    names = [n.name for n in snapshot.nodes] + ["gone-node"]
    out: dict[str, Running] = {}
    for k in range(draw(st.integers(0, 10))):
        on = draw(st.lists(st.sampled_from(names), max_size=3, unique=True))
        low = -2 if negative else 0
        claims = {n: draw(st.integers(low, 4)) for n in on}
        uses = {
            n: {res: draw(st.integers(0, 6)) for res in RESOURCES if draw(st.booleans())}
            for n in on
            if draw(st.booleans())
        }
        ends = draw(st.sampled_from([5.0, 10.0, 20.0, 40.0, math.inf]))
        out[f"run-{k}"] = Running(f"run-{k}", 0, 0.0, ends, claims, uses=uses)
    return out


def _setup(
    data: st.DataObject, *, negative: bool = False
) -> tuple[q._Cluster, list[Running], list[int], dict[int, int], Callable[[int], bool]]:
    snapshot = data.draw(clusters())
    running = data.draw(work(snapshot, negative=negative))
    cl = q._Cluster(snapshot, running)
    inside = set(data.draw(st.lists(st.integers(0, len(cl.nodes) - 1), unique=True))) or None
    held = data.draw(st.dictionaries(st.integers(0, len(cl.nodes) - 1), st.integers(0, 4)))

    def usable(i: int) -> bool:
        return (inside is None or i in inside) and cl.nodes[i].schedulable

    base = [cl.free(i) if usable(i) else 0 for i in range(len(cl.nodes))]
    ends = sorted(
        (r for r in running.values() if math.isfinite(r.ends_s) and r.ends_s > 0),
        key=lambda r: (r.ends_s, r.name),
    )
    return cl, ends, base, held, usable


@given(st.data())
def test_futures_equal_the_futures_built_from_scratch_in_any_order(data: st.DataObject) -> None:
    cl, ends, base, held, usable = _setup(data)
    futures = q._Futures(cl, ends, base, held, usable)
    for upto in data.draw(st.lists(st.integers(0, len(ends)), min_size=1, max_size=8)):
        got = futures.at(upto)
        want = q._future_from_scratch(cl, ends, upto, base, held, usable)
        assert got == want, upto
        for i, n in enumerate(got.nodes):
            assert n.ready == cl.nodes[i].ready  # a future keeps every fact it does not change
            if n == cl.nodes[i]:
                assert n is cl.nodes[i]  # unchanged nodes stay the pass's objects (the planner diffs by them)


@given(st.data())
def test_futures_with_a_negative_claim_are_built_from_scratch(data: st.DataObject) -> None:
    cl, ends, base, held, usable = _setup(data, negative=True)
    futures = q._Futures(cl, ends, base, held, usable)
    for upto in data.draw(st.lists(st.integers(0, len(ends)), min_size=1, max_size=4)):
        assert futures.at(upto) == q._future_from_scratch(cl, ends, upto, base, held, usable)


def test_a_state_seen_before_is_the_same_node_object() -> None:
    snapshot = ClusterSnapshot(
        tiers=TIERS,
        nodes=tuple(NodeState(f"n{i}", 4, 0, {"nvlink": "a", "leaf": "l", "spine": "s"}) for i in range(3)),
    )
    running = {f"r{i}": Running(f"r{i}", 0, 0.0, 10.0 * (i + 1), {f"n{i}": 4}) for i in range(3)}
    cl = q._Cluster(snapshot, running)
    ends = sorted(running.values(), key=lambda r: r.ends_s)
    futures = q._Futures(cl, ends, [0, 0, 0], {}, lambda i: True)
    first = futures.at(3)
    assert [n.free for n in first.nodes] == [4, 4, 4]
    assert [n.free for n in futures.at(1).nodes] == [4, 0, 0]
    again = futures.at(3)
    assert all(a is b for a, b in zip(first.nodes, again.nodes, strict=True))
    assert futures.at(0).nodes == snapshot.nodes


def _from_scratch(self: q._Futures, upto: int) -> ClusterSnapshot:
    return q._future_from_scratch(self.cl, self.ends, upto, self.base, self.held, self.usable)


@st.composite
def queues(
    draw: st.DrawFn,
) -> tuple[ClusterSnapshot, dict[str, Running], list[Waiting], dict[str, Reservation]]:
    """A busy cluster of 4-GPU nodes, running work ending at different times, and waiting gangs of
    several sizes (some held already)."""
    nodes = []
    for r in range(draw(st.integers(2, 4))):
        domains = {"nvlink": f"nvl-{r}", "leaf": f"leaf-{r // 2}", "spine": "spine-0"}
        for t in range(4):
            nodes.append(NodeState(f"r{r}-n{t}", 4, 4, domains, {"cpu": 8}, {"cpu": 8}))
    running: dict[str, Running] = {}
    used: dict[str, int] = {}
    for k, n in enumerate(nodes):
        g = draw(st.integers(0, 4))
        if g:
            running[f"run-{k}"] = Running(
                f"run-{k}",
                draw(st.integers(0, 1)),
                0.0,
                draw(st.sampled_from([50.0, 100.0, 150.0, 200.0, math.inf])),
                {n.name: g},
                uses={n.name: {"cpu": draw(st.integers(0, 4))}},
            )
            used[n.name] = g
    snap = ClusterSnapshot(
        tiers=TIERS,
        nodes=tuple(
            NodeState(n.name, 4, 4 - used.get(n.name, 0), n.domains, n.resources, n.free_resources)
            for n in nodes
        ),
    )
    waiting = [
        Waiting(
            f"w{k}",
            gang(draw(st.integers(1, 6)), name=f"w{k}", subgroup=draw(st.sampled_from([None, 2, 4]))),
            draw(st.integers(0, 2)),
            float(k),
            draw(st.sampled_from([None, 30.0, 120.0])),
        )
        for k in range(draw(st.integers(1, 4)))
    ]
    return snap, running, waiting, {}


@given(queues())
def test_decisions_with_incremental_futures_equal_those_from_scratch(
    scenario: tuple[ClusterSnapshot, dict[str, Running], list[Waiting], dict[str, Reservation]],
) -> None:
    snap, running, waiting, held = scenario
    config = QueueConfig(preempt_after_s=None)
    fast = decide(10.0, snap, running, waiting, held, place=planner_place(), config=config)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(q._Futures, "at", _from_scratch)
        slow = decide(10.0, snap, running, waiting, held, place=planner_place(), config=config)
    assert fast == slow
    # and the pass after, from the reservations this one made, with the first running work ended early
    if running:
        first = sorted(running)[0]
        rest = {k: v for k, v in running.items() if k != first}
        fast2 = decide(20.0, snap, rest, waiting, fast.reservations, place=planner_place(), config=config)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(q._Futures, "at", _from_scratch)
            slow2 = decide(20.0, snap, rest, waiting, fast.reservations, place=planner_place(), config=config)
        assert fast2 == slow2
