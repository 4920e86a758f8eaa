"""``Gang.mnnvl``: how a gang's placement reads the trays' readiness (``NodeState.ready``). Pure.

- ``required``: planned on ready nodes only (``autosize.ready_view``: the others unschedulable);
  infeasible names how many nodes were left out.
- ``preferred``: planned on ready nodes only when they hold the gang; else on every node, the unready
  ones counted as degraded (``unready_last``), so the objective's ``degraded`` figure fills ready
  clean nodes first and ranks unready and degraded ones after them. Degraded ready nodes already rank
  after clean ones in the first plan.
- ``off``: readiness is not read (the planner's plain search).

The extender resolves a gang's mode (its ``gpuagent.dev/mnnvl`` annotation, or the default from its
subgroup tier and the nodes' fabric labels); the planner only applies it, so the ``plan`` command,
the simulator and the extender share one rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from scheduler_plugin.planner.autosize import ready_view
from scheduler_plugin.planner.prepared import PreparedSnapshot, SnapshotCache
from scheduler_plugin.snapshot import MNNVL_MODES, ClusterSnapshot, Gang, Infeasible, Plan, PlanResult

__all__ = ["plan_ready", "unready_last"]

Place = Callable[[ClusterSnapshot | PreparedSnapshot, Gang, SnapshotCache | None], PlanResult]


def unready_last(snapshot: ClusterSnapshot) -> ClusterSnapshot:
    """``snapshot`` with every unready node counted as degraded (ranked after clean nodes)."""
    if all(n.ready or n.degraded for n in snapshot.nodes):
        return snapshot
    nodes = tuple(
        n if n.ready or n.degraded else dataclasses.replace(n, degraded=True) for n in snapshot.nodes
    )
    return ClusterSnapshot(tiers=snapshot.tiers, nodes=nodes)


def plan_ready(
    snapshot: ClusterSnapshot | PreparedSnapshot, gang: Gang, *, cache: SnapshotCache | None, place: Place
) -> PlanResult:
    """The plan of ``gang`` under its ``mnnvl`` mode; ``place`` plans a gang of mode ``off``."""
    if gang.mnnvl not in MNNVL_MODES:
        return Infeasible(
            f"gang {gang.name!r}: mnnvl must be one of {', '.join(MNNVL_MODES)}, got {gang.mnnvl!r}"
        )
    plain = dataclasses.replace(gang, mnnvl="off")
    if gang.mnnvl == "off":
        return place(snapshot, plain, cache)
    raw = snapshot.snapshot if isinstance(snapshot, PreparedSnapshot) else snapshot
    view = ready_view(raw)
    first = place(snapshot if view is raw else view, plain, cache)
    if isinstance(first, Plan) or view is raw:
        return first
    unready = sum(1 for n in raw.nodes if not n.ready and n.schedulable)
    if gang.mnnvl == "required":
        return Infeasible(
            f"{first.reason}; {unready} node(s) whose NVLink fabric or IMEX is not ready left out "
            "(gpuagent.dev/mnnvl: required)"
        )
    second = place(unready_last(raw), plain, cache)
    if isinstance(second, Infeasible):
        return Infeasible(f"{second.reason} (mnnvl preferred: not even with {unready} unready node(s))")
    return second
