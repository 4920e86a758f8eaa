"""The queue's dial (``QueueConfig.reserve_after_s`` and ``reserve_after_limits``): when a waiting gang
starts to hold capacity back, in seconds and in multiples of its own time limit."""

from __future__ import annotations

import pytest

from scheduler_plugin.queue import QueueConfig, QueueError, Waiting, decide, planner_place
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
