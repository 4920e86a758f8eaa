"""Our planner (``scheduler_plugin.planner.plan``) as a placement policy, called as the extender calls
it: with a ``SnapshotCache`` of its own, so one simulation's consecutive snapshots are prepared from
each other.

Queue of its own (``OWN_QUEUE``: ``core`` with ``core`` preemption): ``scheduler_plugin.queue.decide``,
the extender's queue, with this planner as its ``place``."""

from __future__ import annotations

from scheduler_plugin.planner import SnapshotCache, plan
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, PlanResult


class Ours:
    name = "ours"
    gang = True

    def __init__(self) -> None:
        self._snapshots = SnapshotCache()

    def place(self, snapshot: ClusterSnapshot, gang: Gang) -> PlanResult:
        return plan(snapshot, gang, cache=self._snapshots)
