"""The gang + topology planner: where every pod of a gang goes, or why it cannot go anywhere.

Pure and deterministic: no I/O, no clock, no randomness, no module-global state; ties are broken by
domain and node name. Imports nothing but ``scheduler_plugin.snapshot`` (the input and output types).

Model
-----
A gang has roles; a role has ``pods`` identical pods of ``gpus_per_pod`` GPUs (plus other resources).
A role with ``subgroup_size`` is cut into consecutive blocks of pods by index (the last block may be
smaller); with ``subgroup_tier`` each block must sit inside one domain of that tier. ``min_subgroups``
makes a role elastic: the planner places as many blocks as fit, at least that many, always a prefix
(blocks 0..c-1) so ranks stay dense. The gang's own ``tier`` puts every pod inside one domain of that
tier. ``soft`` turns the tier constraints into preferences: if the hard plan is impossible, both
tiers climb one level at a time (``relaxed_tiers`` in the score) until the constraint disappears.
Fit is per node: a pod needs ``gpus_per_pod`` free GPUs (and each tracked resource) on ONE node.
Resources a node does not report (absent from ``free_resources``) are not limiting. Domains are
assumed to nest: the nodes of one tier-1 domain share their domain at every higher tier (as HyperNode
trees do). A plan maps each placed pod (``PodSlot``: role and index) to a node.

Modules (each owns one thing)
-----------------------------
``objective``  the figures a plan is judged by, their lexicographic order, the block programme's
               weights and prices derived from that order, the greedy node orders, the score, and a
               reference evaluation of any placement. Nothing else states the order.
``roles``      a role's shape and blocks.
``prepared``   a snapshot's indexes and capacity caches, derived from an earlier snapshot's when only
               free capacity changed; ``SnapshotCache``, owned by whoever plans repeatedly.
``attempt``    one attempt inside one scope: the block programme, the greedy fill, the figures.
``search``     scopes, tighter tiers, bounds that skip scopes, soft relaxation; ``plan``.

What the planner guarantees
---------------------------
For a gang of **one role** whose blocks are placed by the block programme (the role has a subgroup
tier, or the gang has a tier, which then holds the role's one block or is the measuring tier), the
plan has the smallest ``objective.Figures.key`` of every feasible placement, and the planner says
infeasible exactly when there is none, provided no two domains the plan opens lie under one wholly
free higher-tier domain unless the plan fits inside that domain: the programme prices ``upper`` per
opened domain, while a plan's figures count each broken ancestor once, and only the scope search
over tighter tiers corrects for that. ``tests/scheduler_plugin/test_planner_optimality.py`` checks
this against brute force and pins both gaps: that one, and a role with neither a subgroup nor a gang
tier, which is placed greedily in the objective's node order (best fit by node, not by domain).

For **several roles**, placed one after the other in each scope (subgroup roles first, then by total
GPUs), the plan is not optimal over joint placements. What holds and is tested: all or nothing;
every pod within its tiers and every node within its capacity; and the first role placed (one with a
subgroup tier) has the smallest figures through ``leftover``, measured for it alone at its subgroup
tier, among all its placements inside the domain the whole plan occupies; the later roles take the
capacity it leaves, nodes the gang already uses first.
"""

from __future__ import annotations

from scheduler_plugin.planner.objective import STANDARD_SUBGROUP_GPUS, Figures, useful_block
from scheduler_plugin.planner.prepared import PreparedSnapshot, SnapshotCache, prepare
from scheduler_plugin.planner.roles import role_subgroups
from scheduler_plugin.planner.search import plan

__all__ = [
    "STANDARD_SUBGROUP_GPUS",
    "Figures",
    "PreparedSnapshot",
    "SnapshotCache",
    "plan",
    "prepare",
    "role_subgroups",
    "useful_block",
]
