"""Planner input and output: a cluster snapshot, a gang, a pod slot and a plan. Pure data, no I/O.

Shapes follow ARCHITECTURE.md's ``plan`` formats (``C.yaml`` / ``G.yaml``); the YAML/JSON adapters
live in ``agent.commands.plan``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import compress
from operator import is_not

MAX_GANG_PODS = 10_000
"""The most pods one gang may have, all its roles together. The planner's time and memory grow with the
pods (with one pod per subgroup, 10,000 pods take seconds), so every gang source (the ``plan`` files,
the extender's pod annotations and PodGroups) refuses more with an error naming the field and this
limit."""


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    gpus: int  # allocatable whole GPUs
    free: int  # free whole GPUs now
    domains: Mapping[str, str] = field(default_factory=dict)  # tier name -> domain name
    # other requested resources (cpu millicores, memory bytes, …): allocatable and free; a resource
    # absent from free_resources does not limit the node
    resources: Mapping[str, int] = field(default_factory=dict)
    free_resources: Mapping[str, int] = field(default_factory=dict)
    schedulable: bool = True
    # the node's NVLink fabric is degraded (label gpuagent.dev/fabric-health=degraded): still schedulable,
    # ranked after clean nodes of the same domain (the objective's ``degraded`` figure)
    degraded: bool = False
    # the tray's NVLink fabric is ready for a multi-node NVLink subgroup (``scheduler_plugin.cluster``:
    # GFD's clique label present where the fabric is reported, fabric not unhealthy, IMEX not
    # ``not-ready``). Only ``subgroup_size: auto`` roles read it: they are sized from, and placed on,
    # ready nodes alone
    ready: bool = True


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    tiers: tuple[str, ...]  # tier 1 first, e.g. ("nvlink", "leaf", "spine")
    nodes: tuple[NodeState, ...]


@dataclass(frozen=True, slots=True)
class Role:
    name: str
    pods: int
    gpus_per_pod: int
    subgroup_size: int | None = None  # consecutive pods by index that share one domain
    subgroup_tier: str | None = None  # tier of that domain
    min_subgroups: int | None = None  # elastic: at least this many subgroups start
    resources_per_pod: Mapping[str, int] = field(default_factory=dict)
    # ``subgroup_size: auto``: the planner chooses the size (``subgroup_size`` stays None), the largest
    # divisor of ``pods`` of at least this many pods that every chosen domain holds on its ready nodes
    subgroup_auto_min: int | None = None
    # every pod of the role inside this one domain of ``subgroup_tier`` (the first tier without one):
    # a repair's replacement pods go where the rest of their subgroup runs (``planner.pinned``)
    domain: str | None = None


MNNVL_MODES = ("required", "preferred", "off")
"""How a gang's placement reads the trays' readiness (``NodeState.ready``): ``required`` places it on
ready nodes only; ``preferred`` on ready nodes when they hold it, else on every node with the unready
ones ranked after the ready ones (as degraded nodes are); ``off`` ignores readiness."""


@dataclass(frozen=True, slots=True)
class Gang:
    name: str
    roles: tuple[Role, ...]
    tier: str | None = None  # the whole gang inside one domain of this tier
    soft: bool = False  # soft: tier constraints are preferences, fall back across domains
    mnnvl: str = "off"  # one of MNNVL_MODES (``planner.readiness``)


@dataclass(frozen=True, slots=True, order=True)
class PodSlot:
    """One pod of a gang as the planner places it: its role and its index (rank) in the role.

    Ordered by role, then index. ``str()`` gives the ``<role>-<index>`` form the ``plan`` command's
    JSON and the messages show; nothing parses it back.
    """

    role: str
    index: int

    def __str__(self) -> str:
        return f"{self.role}-{self.index}"


@dataclass(frozen=True, slots=True)
class SubgroupPlacement:
    role: str
    index: int
    domain: str | None  # None when the role has no subgroup tier


@dataclass(frozen=True, slots=True)
class Plan:
    """A feasible plan: every placed pod mapped to a node, in pod order.

    ``subgroup_sizes``: the size chosen for each role of ``subgroup_size: auto``.
    ``score`` (defined in ``scheduler_plugin.planner.objective``, in the objective's order):
    ``placed_pods``, ``opened_domains`` (wholly free domains the plan breaks into), ``opened_upper``
    (wholly free higher-tier domains those break into, higher tiers weighing more), ``stranded_gpus``,
    ``lost_blocks`` (useful blocks of room the touched domains lose), ``leftover_gpus``, ``span_tier``
    (1 = the first tier; one past the last = the whole cluster), ``degraded_pods`` (pods on nodes whose
    fabric is degraded), then ``relaxed_tiers`` (soft gangs) and ``nodes_used``.
    """

    placement: Mapping[PodSlot, str]
    subgroups: tuple[SubgroupPlacement, ...]
    score: Mapping[str, float]
    # the subgroup size the planner chose for each ``subgroup_size: auto`` role (role name -> pods)
    subgroup_sizes: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Infeasible:
    """No placement: ``reason`` names the binding constraint for the operator."""

    reason: str


PlanResult = Plan | Infeasible


def changed_nodes(before: ClusterSnapshot, after: ClusterSnapshot) -> list[int] | None:
    """Positions in ``after.nodes`` whose state is not the very object ``before`` had there, or None
    when the topology differs (tiers, or node by node in the same order: names, GPU counts, domains,
    degraded fabric — rare, and it reorders the nodes inside their domains).

    Snapshots of one cluster taken one after the other keep the unchanged ``NodeState`` objects, so
    the diff costs one identity comparison per node.
    """
    if before.tiers != after.tiers or len(before.nodes) != len(after.nodes):
        return None
    old, new = before.nodes, after.nodes
    changed = list(compress(range(len(new)), map(is_not, old, new)))
    for k in changed:
        x, y = old[k], new[k]
        if x.name != y.name or x.gpus != y.gpus or not (x.domains is y.domains or x.domains == y.domains):
            return None
        if x.degraded != y.degraded:
            return None
    return changed


def name_order(snapshot: ClusterSnapshot) -> tuple[list[int], list[int]]:
    """(the ``snapshot.nodes`` index of each node in name order, the name-order position of each
    ``snapshot.nodes`` entry): the indexes planners keep to diff snapshots node by node."""
    order = sorted(range(len(snapshot.nodes)), key=lambda k: snapshot.nodes[k].name)
    position = [0] * len(order)
    for i, k in enumerate(order):
        position[k] = i
    return order, position
