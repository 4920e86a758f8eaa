"""The planner's objective: the figures a plan is judged by, their order, and what derives from them.

This module is the one place the objective is written. The search (``scheduler_plugin.planner.search``
and ``.attempt``) ranks candidates with ``Figures.key``, prices domains in the block programme with
``price`` / ``open_cost`` (weights derived from ``ORDER``), prunes scopes with ``at_least`` and orders
nodes for roles without a subgroup tier with ``node_key`` / ``remainder_key``; the plan's ``score``
is ``score``. ``evaluate`` computes the figures of any placement straight from their definitions,
slowly: the reference the planner's incremental measurement and the brute-force optimality test are
checked against.

Figures, best first in ``ORDER`` (lexicographic), over the *touched* domains of the *measuring tier*
(``measuring_tier``: the lowest subgroup tier, else the gang tier, else tier 1):

``placed``   pods placed (more is better; elastic roles may place fewer than all);
``opened``   wholly free domains touched (every schedulable node has all its GPUs free, and some);
             consuming any part of one costs more than anything below, so a gang tops up partly used
             domains whenever they can hold it;
``upper``    wholly free higher-tier domains the opened ones break into, one figure in which a higher
             tier weighs more than all lower ones (``UPPER_BITS`` per tier): a gang that must open a
             domain takes one under a leaf (spine) already in use;
``stranded`` free GPUs added in touched domains whose room (pods of the main role's shape they can
             host) is smaller than a *useful block* (``useful_block``), minus those already stranded;
``lost``     useful blocks of room the touched domains lose (room ``c`` holds ``c // useful``);
``leftover`` free GPUs left in the touched domains (best fit: the fullest domains);
``span``     the lowest tier where one domain holds every placed pod (0 = tier 1; the number of tiers
             = the whole cluster);
``degraded`` pods placed on nodes whose NVLink fabric is degraded (``NodeState.degraded``): last, so
             it never changes which domains a plan takes, only which nodes inside them — a domain's
             clean nodes are filled first (``clean_first``), and among domains otherwise equal the one
             with more clean room wins. A domain of ``cap`` pods of room, ``clean`` of them on clean
             nodes, that takes ``used`` pods adds ``max(0, used - clean)`` (``degraded_pods``).

Ties after these are broken by names (scope, then domains in path order, then nodes), which the
search carries, not the figures.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter, mul
from typing import cast

from scheduler_plugin.planner.roles import role_key, role_subgroups
from scheduler_plugin.snapshot import ClusterSnapshot, PodSlot, Role

__all__ = [
    "ORDER",
    "PRICED",
    "STANDARD_SUBGROUP_GPUS",
    "UPPER_BITS",
    "WEIGHT",
    "Figures",
    "at_least",
    "clean_first",
    "degraded_pods",
    "evaluate",
    "measuring_tier",
    "node_key",
    "node_key_columns",
    "open_cost",
    "price",
    "remainder_key",
    "room_change",
    "score",
    "upper_step",
    "useful_block",
]

# -- the figures and their order ------------------------------------------------------------------

# Figures, the first deciding: a plan is better than another when its ``Figures.key`` is smaller.
ORDER: tuple[str, ...] = ("placed", "opened", "upper", "stranded", "lost", "leftover", "span", "degraded")
_MORE_IS_BETTER = frozenset({"placed"})
# the plan's score: each figure under its name there, in ``ORDER``; ``span`` shows 1-based
_SCORE_NAME = {
    "placed": "placed_pods",
    "opened": "opened_domains",
    "upper": "opened_upper",
    "stranded": "stranded_gpus",
    "lost": "lost_blocks",
    "leftover": "leftover_gpus",
    "span": "span_tier",
    "degraded": "degraded_pods",
}

# The figures the block programme sums per domain, in ``ORDER``: ``placed`` is the programme's state
# (how many blocks), ``span`` is found by planning inside ever tighter scopes. ``degraded`` comes after
# ``span`` in ``ORDER`` and last in the price: inside one scope the programme breaks ties by it, and a
# plan with a better span is found in the tighter scope that holds it.
PRICED: tuple[str, ...] = tuple(f for f in ORDER if f not in ("placed", "span"))
# Bits a priced figure's sum over one plan's domains takes in the price: the figure before it in
# ``PRICED`` weighs ``2**bits`` times this one, so the weighted sum orders plans as ``ORDER`` does
# while every sum stays inside its bits. The first priced figure is unbounded.
_PRICE_BITS = {"upper": 42, "stranded": 42, "lost": 21, "leftover": 21, "degraded": 21}


def _weights() -> dict[str, int]:
    weight, out = 1, {}
    for f in reversed(PRICED):
        out[f] = weight
        weight <<= _PRICE_BITS.get(f, 0)
    return out


WEIGHT: Mapping[str, int] = _weights()
_W_OPENED, _W_UPPER = WEIGHT["opened"], WEIGHT["upper"]
_W_STRANDED, _W_LOST, _W_LEFTOVER = WEIGHT["stranded"], WEIGHT["lost"], WEIGHT["leftover"]
_W_DEGRADED = WEIGHT["degraded"]

# per tier above the measuring one in the ``upper`` figure: a higher tier's wholly free domains weigh
# more than every lower tier's together
UPPER_BITS = 16
# The smallest subgroup a cluster typically needs, in GPUs: a 4-node segment of 4-GPU NVL72 trays
# (16 GPUs; NVL72 gangs are cut into segments of 4, 16 or 18 trays). Free room smaller than this and
# than the gang's own block counts as stranded, whatever the gang being placed.
STANDARD_SUBGROUP_GPUS = 16

_SIGN = tuple(-1 if f in _MORE_IS_BETTER else 1 for f in ORDER)
_GET = attrgetter(*ORDER)


@dataclass(frozen=True, slots=True)
class Figures:
    """One plan's figures (see the module docstring)."""

    placed: int
    opened: int
    upper: int
    stranded: int
    lost: int
    leftover: int
    span: int
    degraded: int = 0

    def key(self, through: str | None = None) -> tuple[int, ...]:
        """The figures in ``ORDER``, signed so that smaller is better; with ``through``, only up to
        and including that figure."""
        key = tuple(map(mul, _SIGN, _GET(self)))
        return key if through is None else key[: ORDER.index(through) + 1]


def at_least(**known: int) -> tuple[float, ...]:
    """A lower bound on the ``Figures.key`` of plans of which only some figures are bounded: each
    given value is a lower bound of that figure (an upper bound for ``placed``), each figure not
    given may be anything. A scope whose bound exceeds the best key found cannot beat that plan."""
    unknown = set(known) - set(ORDER)
    if unknown:
        raise ValueError(f"not figures of the objective: {sorted(unknown)}")
    return tuple(s * known[f] if f in known else float("-inf") for s, f in zip(_SIGN, ORDER, strict=True))


def score(figures: Figures, *, relaxed: int, nodes_used: int) -> dict[str, float]:
    """The plan's ``score``: its figures under their score names, in ``ORDER`` (``span`` 1-based),
    then the tiers a soft gang relaxed and the nodes it uses."""
    out = {_SCORE_NAME[f]: float(v) for f, v in zip(ORDER, _GET(figures), strict=True)}
    out["span_tier"] += 1
    out["relaxed_tiers"] = float(relaxed)
    out["nodes_used"] = float(nodes_used)
    return out


# -- per-domain terms ------------------------------------------------------------------------------


def useful_block(role: Role) -> int:
    """Pods of ``role``'s shape below which a domain's free room counts as stranded.

    The smaller of the role's own block and the standard subgroup (``STANDARD_SUBGROUP_GPUS``) in
    pods of this shape: room that holds either is still useful to the cluster.
    """
    size, _, _ = role_subgroups(role)
    if role.gpus_per_pod <= 0:
        return size
    return max(1, min(size, -(-STANDARD_SUBGROUP_GPUS // role.gpus_per_pod)))


def room_change(cap: int, free: int, cap_after: int, free_after: int, useful: int) -> tuple[int, int]:
    """(``stranded`` added, ``lost`` blocks) when a domain's room goes from ``cap`` pods and ``free``
    GPUs to ``cap_after`` and ``free_after``: room under a useful block strands its GPUs."""
    stranded = (free_after if cap_after < useful else 0) - (free if cap < useful else 0)
    return stranded, cap // useful - cap_after // useful


def upper_step(levels: int) -> int:
    """What one wholly free domain ``levels + 1`` tiers above the measuring tier adds to ``upper``."""
    return 1 << (UPPER_BITS * levels)


def open_cost(upper: int) -> int:
    """A wholly free domain's price for being opened, ``upper`` being its wholly free ancestors as
    ``upper_step`` counts them."""
    return _W_OPENED + _W_UPPER * upper


def degraded_pods(used: int, clean: int) -> int:
    """Pods on degraded nodes when ``used`` pods go to a domain with ``clean`` pods of room on clean
    nodes, filled clean nodes first."""
    return used - clean if used > clean else 0


def clean_first(nodes: Sequence[int], degraded: Sequence[bool]) -> Sequence[int]:
    """A domain's nodes in the order its pods fill them: clean nodes first, each part in name order."""
    if not any(degraded[i] for i in nodes):
        return nodes
    return [*(i for i in nodes if not degraded[i]), *(i for i in nodes if degraded[i])]


def price(
    opens: int, cap: int, free: int, used: int, *, g: int, useful: int, clean: int | None = None
) -> int:
    """A domain's price in the block programme when ``used`` pods of ``g`` GPUs go to it: the priced
    figures it adds, weighted by ``WEIGHT`` (``opens``: its ``open_cost``, 0 unless wholly free;
    ``clean``: its room on clean nodes, ``None`` when it has no degraded node)."""
    after = free - used * g
    stranded, lost = room_change(cap, free, cap - used, after, useful)
    bad = 0 if clean is None else degraded_pods(used, clean)
    return opens + stranded * _W_STRANDED + lost * _W_LOST + after * _W_LEFTOVER + bad * _W_DEGRADED


def measuring_tier(
    n_tiers: int, sub_tiers: Iterable[int | None], gang_tier: int | None, *, one_block: bool
) -> int | None:
    """The tier (index) whose touched domains the figures count: the lowest subgroup tier, else the
    gang tier, else tier 1; None without tiers. A one-role gang whose pods form one block counts the
    gang tier as that block's subgroup tier (the lower of the two when both are set)."""
    if n_tiers == 0:
        return None
    subs = [t for t in sub_tiers if t is not None]
    if one_block and gang_tier is not None:
        subs = [min([*subs, gang_tier])]
    if subs:
        return min(subs)
    return gang_tier if gang_tier is not None else 0


# -- node orders for roles without a subgroup tier -------------------------------------------------
# Their pods are put greedily: nodes the gang already uses first (nothing opened, nothing new touched),
# then the room partly used tier-1 domains hold beyond their whole useful blocks (no ``lost`` block;
# ``remainder_key``), then every other node by ``node_key``: the figures one pod's node decides, in
# ``ORDER`` (``opened``: its tier-1 domain is wholly free; ``leftover``: best fit, its room in pods).

_NODE_FIGURES = ("opened", "leftover", "degraded")
_NODE_PICK: Callable[[Sequence[object]], tuple[object, ...]] = itemgetter(
    *(_NODE_FIGURES.index(f) for f in ORDER if f in _NODE_FIGURES)
)


def node_key(opens: bool, room: int, degraded: bool, node: int) -> tuple[int, ...]:
    """A node's place in the greedy order: by the figures it decides in ``ORDER``, then its index
    (name order). Every key ends with the node."""
    return (*cast("tuple[int, ...]", _NODE_PICK((opens, room, degraded))), node)


def node_key_columns(
    opens: Sequence[bool], room: Sequence[int], degraded: Sequence[bool]
) -> Iterable[tuple[int, ...]]:
    """``node_key`` of every node (index = position), zipped in C from per-node columns."""
    columns = cast("tuple[Sequence[int], ...]", _NODE_PICK((opens, room, degraded)))
    return zip(*columns, range(len(room)), strict=True)


def remainder_key(domain_free: int, room: int, node: int) -> tuple[int, int, int]:
    """Order of the nodes holding partly used tier-1 domains' room beyond whole useful blocks: least
    ``leftover`` first, the fullest domains, then best fit, then the node."""
    return (domain_free, room, node)


# -- the reference ---------------------------------------------------------------------------------


def evaluate(
    snapshot: ClusterSnapshot,
    placement: Mapping[PodSlot, str],
    roles: Collection[Role],
    *,
    main: Role,
    measure: int | None,
) -> Figures:
    """The figures of ``placement`` straight from their definitions (slow; for tests and checks).

    ``main``: the role whose shape and useful block measure room (the planner's first role);
    ``measure``: the measuring tier (``measuring_tier``).
    """
    nodes = {n.name: n for n in snapshot.nodes}
    by_role = {r.name: r for r in roles}
    used_gpus: dict[str, int] = {}
    used_res: dict[str, dict[str, int]] = {}
    for pod, name in placement.items():
        role = by_role[pod.role]
        used_gpus[name] = used_gpus.get(name, 0) + role.gpus_per_pod
        acc = used_res.setdefault(name, {})
        for res, qty in role.resources_per_pod.items():
            acc[res] = acc.get(res, 0) + qty

    def free_of(name: str) -> int:
        n = nodes[name]
        return max(0, min(n.free, n.gpus))

    gpus, reqs = role_key(main)

    def fit(name: str, used: int, res_used: Mapping[str, int]) -> int:
        n = nodes[name]
        if not n.schedulable:
            return 0
        room = (free_of(name) - used) // gpus if gpus > 0 else 1 << 40
        for res, qty in reqs:
            if res in n.free_resources:
                room = min(room, (n.free_resources[res] - res_used.get(res, 0)) // qty)
        return max(0, room)

    def wholly_free(members: list[str]) -> bool:
        live = [m for m in members if nodes[m].schedulable]
        return all(free_of(m) == nodes[m].gpus for m in live) and any(free_of(m) > 0 for m in live)

    def members(tier: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in snapshot.nodes:
            d = n.domains.get(tier)
            if d is not None:
                out.setdefault(d, []).append(n.name)
        return out

    opened = upper = stranded = lost = leftover = 0
    if measure is not None and used_gpus:
        tier = snapshot.tiers[measure]
        doms = members(tier)
        useful = useful_block(main)
        touched = sorted({d for m in used_gpus if (d := nodes[m].domains.get(tier)) is not None})
        for d in touched:
            ms = doms[d]
            cap = sum(fit(m, 0, {}) for m in ms)
            cap_after = sum(fit(m, used_gpus.get(m, 0), used_res.get(m, {})) for m in ms)
            free = sum(free_of(m) for m in ms)
            free_after = free - sum(used_gpus.get(m, 0) for m in ms)
            opened += wholly_free(ms)
            leftover += free_after
            s, lost_d = room_change(cap, free, cap_after, free_after, useful)
            stranded += s
            lost += lost_d
        for above in range(measure + 1, len(snapshot.tiers)):
            up = snapshot.tiers[above]
            up_doms = members(up)
            broken = {nodes[doms[d][0]].domains.get(up) for d in touched if wholly_free(doms[d])}
            upper += upper_step(above - measure - 1) * sum(
                1 for a in broken if a is not None and wholly_free(up_doms[a])
            )
    span = len(snapshot.tiers)
    for ti, tier in enumerate(snapshot.tiers):
        held = {nodes[m].domains.get(tier) for m in used_gpus}
        if len(held) == 1 and None not in held:
            span = ti
            break
    degraded = sum(1 for name in placement.values() if nodes[name].degraded)
    return Figures(len(placement), opened, upper, stranded, lost, leftover, span, degraded)
