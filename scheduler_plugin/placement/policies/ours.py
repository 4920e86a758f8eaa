"""Our planner (``scheduler_plugin.planner.plan``) as a placement policy, called as the extender calls it."""

from __future__ import annotations

from scheduler_plugin import planner
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, PlanResult


class Ours:
    name = "ours"
    gang = True

    def place(self, snapshot: ClusterSnapshot, gang: Gang) -> PlanResult:
        return planner.plan(snapshot, gang)
