"""Hostile tenants of a shared cluster against the extender's queue: nobody may hold the cluster.

What a tenant writes (pod annotations, priorities, creation times, Node annotations, time limits) must
neither reorder the queue in its favour nor hold capacity for pods that do not exist. Cluster and
builders as in ``tests/scheduler_plugin/test_extender_queue.py``: two NVLink domains of four 4-GPU
nodes."""

from __future__ import annotations

from scheduler_plugin.queue import QueueConfig
from tests.scheduler_plugin.test_extender_queue import (
    T0,
    busy_cluster,
    make_state,
    member,
    preemption_cluster,
)


def test_a_pod_parked_for_a_day_does_not_move_a_new_gang_ahead() -> None:
    """The queue once ordered gangs by their oldest pod's creation: a pod parked a day before joined a
    gang made later and put it ahead of a gang complete since long."""
    fair = [member("fair", i, at=T0 + 10) for i in range(4)]
    parked = member("late", 0, at=T0 - 86_400)
    late = [parked, *(member("late", i, at=T0 + 50) for i in range(1, 4))]
    s = make_state([*busy_cluster(), *late, *fair])
    s.queue_tick(1.0, T0 + 60)
    assert s._queue_waiting == ["default/fair", "default/late"]
    assert set(s.queue_reservations) == {"default/fair"}  # the head is the gang complete first


def test_one_high_priority_pod_does_not_lift_its_gang_into_preempting() -> None:
    mixed = [member("mixed", i, at=T0 + 10) for i in range(4)]
    mixed[0]["spec"]["priority"] = 1_000_000  # one pod of a high class among low ones
    s = make_state([*preemption_cluster(), *mixed], config=QueueConfig(preempt_after_s=0))
    actions = s.queue_tick(1.0, T0 + 1000)
    assert actions.evictions == ()
    assert not [e for e in actions.events if e.reason == "GangPreempting"]


def test_a_gang_takes_the_lowest_priority_of_its_pods_in_the_queue_order() -> None:
    mixed = [member("mixed", i, at=T0 + 10) for i in range(4)]
    mixed[0]["spec"]["priority"] = 1_000_000
    steady = [member("steady", i, priority=100, at=T0 + 20) for i in range(4)]
    s = make_state([*busy_cluster(), *mixed, *steady])
    s.queue_tick(1.0, T0 + 30)
    assert s._queue_waiting == ["default/steady", "default/mixed"]
