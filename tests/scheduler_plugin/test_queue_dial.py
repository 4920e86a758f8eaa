"""The queue's dial (``QueueConfig.reserve_after_s``, ``reserve_after_limits`` and ``reserve_idle_ratio``):
when a waiting gang starts to hold capacity back, in seconds, in multiples of its own time limit, and
at once when its hold is cheap against the work it will run."""

from __future__ import annotations

import pytest

from scheduler_plugin.queue import (
    Decision,
    QueueConfig,
    QueueError,
    Reservation,
    Waiting,
    decide,
    planner_place,
)
from tests.scheduler_plugin.test_queue import busy, empty, nodes_of, run, wait


def head_and_long(limit: float | None) -> tuple[Waiting, Waiting]:
    """A 4-node head that fits only when ``a`` ends at 100, and a 1-node gang behind it that runs long."""
    return wait("head", 4, created=0.0, subgroup=4, limit=limit), wait("long", 1, created=1.0, limit=500.0)


def test_a_head_waits_a_multiple_of_its_limit_before_it_holds_back() -> None:
    running = {"a": run("a", nodes_of(0, 2, 3), ends=100.0)}
    snap = busy(empty(4), running)
    head, long = head_and_long(limit=40.0)
    config = QueueConfig(preempt_after_s=None, reserve_after_limits=2.0)
    young = decide(50.0, snap, running, [head, long], {}, place=planner_place(), config=config)
    assert [s.gang for s in young.starts] == ["long"]  # passes the head: 50 s < 2 x 40 s
    assert young.reservations == {}
    assert young.wake_s == 80.0
    old = decide(80.0, snap, running, [head, long], {}, place=planner_place(), config=config)
    assert old.starts == ()  # "long" would run past the head's start on its nodes
    assert old.reservations["head"].start_s == 100.0


def test_the_later_of_seconds_and_multiple_holds() -> None:
    running = {"a": run("a", nodes_of(0, 2, 3), ends=100.0)}
    snap = busy(empty(4), running)
    head, long = head_and_long(limit=10.0)  # 2 x 10 s = 20 s, but 60 s are asked besides
    config = QueueConfig(preempt_after_s=None, reserve_after_s=60.0, reserve_after_limits=2.0)
    d = decide(30.0, snap, running, [head, long], {}, place=planner_place(), config=config)
    assert [s.gang for s in d.starts] == ["long"]
    assert d.wake_s == 60.0


def test_a_gang_without_a_limit_waits_the_seconds_only() -> None:
    """No limit counts as never ending; a multiple of it would starve the gang, so it is not applied."""
    running = {"a": run("a", nodes_of(0, 2, 3), ends=100.0)}
    snap = busy(empty(4), running)
    head, long = head_and_long(limit=None)
    config = QueueConfig(preempt_after_s=None, reserve_after_s=5.0, reserve_after_limits=3.0)
    d = decide(5.0, snap, running, [head, long], {}, place=planner_place(), config=config)
    assert d.starts == ()
    assert d.reservations["head"].start_s == 100.0


def test_off_by_default_holds_at_once() -> None:
    assert QueueConfig().reserve_after_limits is None
    running = {"a": run("a", nodes_of(0, 2, 3), ends=100.0)}
    snap = busy(empty(4), running)
    head, long = head_and_long(limit=40.0)
    d = decide(0.0, snap, running, [head, long], {}, place=planner_place(), config=QueueConfig())
    assert d.starts == ()
    assert "head" in d.reservations


@pytest.mark.parametrize("value", [float("nan"), -1.0, float("inf")], ids=["nan", "negative", "inf"])
def test_a_bad_multiple_is_refused_naming_the_field(value: float) -> None:
    with pytest.raises(QueueError, match="reserve_after_limits"):
        QueueConfig(reserve_after_limits=value)


# -- reserve_idle_ratio: a young gang holds at once when its hold is cheap ----------------------------
# The head needs all 4 nodes; "a" holds two of them until 100, so a hold from 50 keeps the other two
# nodes' 8 GPUs idle for 50 s: 400 GPU-seconds, against the head's own 16 GPUs x 40 s = 640 (0.625).


def young_head_at_50(ratio: float | None, limit: float | None = 40.0) -> Decision:
    running = {"a": run("a", nodes_of(0, 2, 3), ends=100.0)}
    snap = busy(empty(4), running)
    head, long = head_and_long(limit=limit)
    config = QueueConfig(preempt_after_s=None, reserve_after_s=1000.0, reserve_idle_ratio=ratio)
    return decide(50.0, snap, running, [head, long], {}, place=planner_place(), config=config)


def test_a_young_head_whose_hold_is_cheap_enough_holds_at_once() -> None:
    d = young_head_at_50(ratio=0.7)
    assert d.starts == ()  # "long" would run past the head's start on its nodes
    held: Reservation = d.reservations["head"]
    assert (held.start_s, held.held_idle_gpu_s) == (100.0, 400.0)


def test_a_young_head_whose_hold_costs_more_is_passed_until_its_age() -> None:
    d = young_head_at_50(ratio=0.6)
    assert [s.gang for s in d.starts] == ["long"]
    assert d.reservations == {}
    assert d.wake_s == 1000.0


def test_a_young_gang_without_a_limit_never_holds_for_cheapness() -> None:
    """Without a limit its own work is unbounded: no ratio is judged, it waits its age."""
    d = young_head_at_50(ratio=1e9, limit=None)
    assert [s.gang for s in d.starts] == ["long"]
    assert d.reservations == {}


def test_an_expensive_young_gang_lets_a_cheap_one_behind_it_be_the_head() -> None:
    # "big" needs all 8 nodes of two racks and waits for "a" (ends 1000) on rack 1, holding rack 0
    # idle for 950 s; "small" needs rack 0's 4 nodes, where "b" ends at 60: a hold of 10 s
    running = {
        "a": run("a", nodes_of(1, 0, 1, 2, 3), ends=1000.0),
        "b": run("b", nodes_of(0, 0), ends=60.0),
    }
    snap = busy(empty(4, 4), running)
    big = wait("big", 8, created=0.0, limit=100.0)
    small = wait("small", 4, created=1.0, subgroup=4, limit=100.0)
    config = QueueConfig(preempt_after_s=None, reserve_after_s=5000.0, reserve_idle_ratio=0.1)
    d = decide(50.0, snap, running, [big, small], {}, place=planner_place(), config=config)
    assert set(d.reservations) == {"small"}
    assert d.reservations["small"].start_s == 60.0


def test_off_by_default() -> None:
    assert QueueConfig().reserve_idle_ratio is None
    d = young_head_at_50(ratio=None)
    assert [s.gang for s in d.starts] == ["long"]
    assert d.reservations == {}


@pytest.mark.parametrize("value", [float("nan"), -0.5, float("inf")], ids=["nan", "negative", "inf"])
def test_a_bad_idle_ratio_is_refused_naming_the_field(value: float) -> None:
    with pytest.raises(QueueError, match="reserve_idle_ratio") as err:
        QueueConfig(reserve_idle_ratio=value)
    assert err.value.field == "reserve_idle_ratio"
