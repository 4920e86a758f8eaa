"""The search: which scopes to plan a gang in, which tiers to relax, and the plan it returns.

The gang-tier constraint is handled by planning inside each candidate scope (a domain of that tier,
or the whole cluster), pre-filtered by pod capacity; lower-tier scopes are then tried from tier 1 up,
and the first tier whose scopes give a better plan (one as good on the figures but tighter, or better
on them) gives the best of its plans. Several roles are placed one after the other in each scope, the
most constrained first (subgroup roles, then by total GPUs). A one-role gang whose pods form one block
is searched as a block of the gang tier, in one pass.

Scopes that cannot beat the best plan found are skipped without planning, by comparing
``objective.at_least`` bounds with the best plan's ``Figures.key``: the domains any plan there must
open (the main role's full-size blocks beyond what partly used domains hold), the GPUs it can un-strand
(at most the stranded GPUs there, and at most the gang's GPUs) and the blocks it must lose (pods beyond
the room left over after whole blocks); a tier none of whose domains has enough GPUs is not searched;
within a tier, a scope whose best conceivable plan only ties with the one found in an earlier-named
scope is skipped; and, for one GPU-only role placed whole at the measuring tier, the figures of each
one-domain scope follow from its room and free GPUs, so only the best such scope is planned
(``_one_domain_choice``). ``shortcuts=False`` turns every such skip off (and the direct paths of
``attempt``), to check that they change no plan.

Soft gangs: if the hard plan is impossible, both tiers climb one level at a time until the constraint
disappears (``relaxed_tiers`` in the score). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler_plugin.planner.attempt import Candidate, Failure, attempt, place_deferred, role_order
from scheduler_plugin.planner.autosize import auto_role, plan_auto
from scheduler_plugin.planner.objective import (
    Figures,
    at_least,
    degraded_pods,
    measuring_tier,
    room_change,
    score,
    useful_block,
)
from scheduler_plugin.planner.pinned import plan_pinned
from scheduler_plugin.planner.prepared import PreparedSnapshot, ScopeKey, SnapshotCache, prepare
from scheduler_plugin.planner.readiness import plan_ready
from scheduler_plugin.planner.roles import RoleKey, block_ranges, min_blocks, role_key, role_subgroups
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, Plan, PlanResult, PodSlot, Role

__all__ = ["plan"]


def plan(
    snapshot: ClusterSnapshot | PreparedSnapshot,
    gang: Gang,
    *,
    cache: SnapshotCache | None = None,
    shortcuts: bool = True,
) -> PlanResult:
    """Place every pod of ``gang`` on ``snapshot`` (all or nothing), or say what binds.

    ``cache``: the caller's prepared snapshots, to prepare ``snapshot`` from (None: prepared afresh
    unless it is a ``PreparedSnapshot`` already). ``shortcuts``: skip work whose outcome is known;
    False only to check that the skips change no plan. A gang with a role of ``subgroup_size: auto``
    is planned by ``autosize`` at the largest size that has a plan, each size by this search; a gang
    of ``mnnvl`` other than ``off`` on the nodes its mode allows (``readiness``); roles pinned to a
    domain (a repair's) each inside its domain (``pinned``).
    """
    if gang.mnnvl != "off":
        return plan_ready(
            snapshot,
            gang,
            cache=cache,
            place=lambda snap, g, c: plan(snap, g, cache=c, shortcuts=shortcuts),
        )
    if any(r.domain is not None for r in gang.roles):
        return plan_pinned(
            snapshot,
            gang,
            cache=cache,
            place=lambda snap, g, c: plan(snap, g, cache=c, shortcuts=shortcuts),
        )
    if auto_role(gang) is not None:
        return plan_auto(
            snapshot,
            gang,
            cache=cache,
            place=lambda snap, fixed, c: plan(snap, fixed, cache=c, shortcuts=shortcuts),
        )
    if isinstance(snapshot, PreparedSnapshot):
        p = snapshot
    else:
        p = cache.prepared(snapshot) if cache is not None else prepare(snapshot)
    invalid = _validate(p, gang)
    if invalid is not None:
        return Infeasible(invalid)
    per_node = _per_node_reason(p, gang.roles)
    if per_node is not None:
        return Infeasible(per_node)
    levels = len(p.snapshot.tiers) + 1 if gang.soft else 1
    first_reason: str | None = None
    for relax in range(levels):
        res = _plan_once(p, gang, relax, shortcuts=shortcuts)
        if isinstance(res, Candidate):
            return _to_plan(p, res, relax)
        reason = res if isinstance(res, str) else res.message
        if first_reason is None:
            first_reason = reason
    assert first_reason is not None
    if gang.soft:
        first_reason += " (soft: no placement even with tier constraints dropped)"
    return Infeasible(first_reason)


def _to_plan(p: PreparedSnapshot, c: Candidate, relax: int) -> Plan:
    st = c.state
    placement: dict[PodSlot, str]
    if st.deferred is not None:
        placement, found, nodes_used = place_deferred(p, st.deferred)
    else:
        names = p.names
        placement = {PodSlot(role, pod): names[i] for role, pod, i in sorted(st.pods)}
        found, nodes_used = st.subgroups, len(st.used_gpus)
    subgroups = tuple(sorted(found, key=lambda s: (s.role, s.index)))
    return Plan(
        placement=placement, subgroups=subgroups, score=score(c.figures, relaxed=relax, nodes_used=nodes_used)
    )


def _validate(p: PreparedSnapshot, gang: Gang) -> str | None:
    if not gang.roles:
        return f"gang {gang.name!r} has no roles"
    seen: set[str] = set()
    for role in gang.roles:
        if role.name in seen:
            return f"gang {gang.name!r}: duplicate role name {role.name!r}"
        seen.add(role.name)
        if role.pods <= 0:
            return f"role {role.name!r}: pods must be positive"
        if role.gpus_per_pod < 0:
            return f"role {role.name!r}: gpus_per_pod must not be negative"
        if role.subgroup_size is not None and role.subgroup_size <= 0:
            return f"role {role.name!r}: subgroup_size must be positive"
        for res, qty in role.resources_per_pod.items():
            if qty < 0:
                return f"role {role.name!r}: {res} must not be negative"
        if role.subgroup_tier is not None and role.subgroup_tier not in p.tier_index:
            tiers = list(p.tier_index)
            return f"role {role.name!r}: unknown subgroup_tier {role.subgroup_tier!r}; tiers: {tiers}"
    if gang.tier is not None and gang.tier not in p.tier_index:
        return f"gang {gang.name!r}: unknown tier {gang.tier!r}; tiers: {list(p.tier_index)}"
    return None


def _per_node_reason(p: PreparedSnapshot, roles: Sequence[Role]) -> str | None:
    """The binding constraint when no single node (or the whole cluster) can hold a role."""
    for role in roles:
        key = role_key(role)
        fit = p.base_fit(key)
        if not any(fit):
            most = max((f for f, s in zip(p.free, p.schedulable, strict=True) if s), default=0)
            extra = "".join(f", {q} {res}" for res, q in key[1])
            return (
                f"role {role.name!r}: no schedulable node has room for one pod "
                f"({role.gpus_per_pod} GPU(s){extra}); most free GPUs on one node: {most}"
            )
    return None


def _sub_tier(role: Role, p: PreparedSnapshot, relax: int) -> int | None:
    if role.subgroup_tier is None:
        return None
    t = p.tier_index[role.subgroup_tier] + relax
    return t if t < len(p.snapshot.tiers) else None


def _plan_once(p: PreparedSnapshot, gang: Gang, relax: int, *, shortcuts: bool) -> Candidate | Failure | str:
    search = _Search.at(p, gang, relax, shortcuts=shortcuts)
    best = search.best_on_top()
    if not isinstance(best, Candidate):
        return best
    # a tighter scope may do better: try lower tiers, the first tier with a better plan wins
    return search.tighter(best)


@dataclass(frozen=True)
class _Search:
    """One pass of the search at one relaxation: the tiers it works with, and its main role (the
    most constrained, placed first), whose capacity decides which scopes are worth an attempt."""

    p: PreparedSnapshot
    gang: Gang
    shortcuts: bool
    sub_tiers: dict[str, int | None]
    gang_tier: int | None
    measure: int | None
    roles: list[Role]
    main_key: RoleKey
    main_need: int  # pods of the main role any plan places: its minimum blocks'
    all_pods: int

    @classmethod
    def at(cls, p: PreparedSnapshot, gang: Gang, relax: int, *, shortcuts: bool) -> _Search:
        sub_tiers = {r.name: _sub_tier(r, p, relax) for r in gang.roles}
        gang_tier: int | None = None
        if gang.tier is not None:
            gang_tier = p.tier_index[gang.tier] + relax
            if gang_tier >= len(p.snapshot.tiers):
                gang_tier = None
        one_block = len(gang.roles) == 1 and _blocks(gang.roles[0]) == 1
        measure = measuring_tier(len(p.snapshot.tiers), sub_tiers.values(), gang_tier, one_block=one_block)
        if gang_tier is not None and one_block:
            # one role whose pods form one block: "the gang in one domain of T" is "the block in one
            # domain of T", which the subgroup search answers in a single pass over the domains
            only = gang.roles[0]
            t = sub_tiers[only.name]
            sub_tiers[only.name] = gang_tier if t is None else min(t, gang_tier)  # domains nest
            gang_tier = None
        roles = role_order(gang, sub_tiers)
        main = roles[0]
        return cls(
            p=p,
            gang=gang,
            shortcuts=shortcuts,
            sub_tiers=sub_tiers,
            gang_tier=gang_tier,
            measure=measure,
            roles=roles,
            main_key=role_key(main),
            main_need=sum(len(r) for r in block_ranges(main, min_blocks(main))),
            all_pods=sum(r.pods for r in gang.roles),
        )

    @property
    def main(self) -> Role:
        return self.roles[0]

    def scopes_at(self, ti: int) -> list[ScopeKey]:
        """The domains of tier ``ti`` with room for the main role's minimum."""
        p, key, need = self.p, self.main_key, self.main_need
        if self.shortcuts and key[0] > 0 and need * key[0] > p.most_gpus(ti):
            return []  # no domain of the tier has that many GPUs at all
        caps = p.tier_capacity(key, ti)
        return [(ti, d) for d in p.members[ti] if caps[d] >= need]

    def try_scope(self, scope: ScopeKey) -> Candidate | Failure:
        return attempt(
            self.p,
            self.roles,
            sub_tiers=self.sub_tiers,
            scope=scope,
            measure=self.measure,
            main=self.main,
            shortcuts=self.shortcuts,
        )

    def _top_name(self) -> str:
        return (
            "the cluster" if self.gang_tier is None else f"one {self.p.snapshot.tiers[self.gang_tier]} domain"
        )

    def _no_top_scope(self, gang_tier: int) -> str:
        """Why no domain of the gang tier is worth an attempt: the main role's room in the roomiest."""
        p, main = self.p, self.main
        cap = max(
            ((p.scope_capacity(self.main_key, (gang_tier, d)), d) for d in p.members[gang_tier]),
            key=lambda c: (c[0], c[1]),
            default=None,
        )
        most = f"; most room: {cap[0]} pods in {cap[1]}" if cap else ""
        return (
            f"gang {self.gang.name!r} must fit inside {self._top_name()}: role {main.name!r} needs "
            f"{self.main_need} pod(s) of {main.gpus_per_pod} GPU(s) there{most}"
        )

    def best_on_top(self) -> Candidate | Failure | str:
        """The best plan in the scopes the gang tier allows (the cluster without one), or why none."""
        top: list[ScopeKey] = [None]
        if self.gang_tier is not None:
            top = self.scopes_at(self.gang_tier)
            if not top:
                return self._no_top_scope(self.gang_tier)
        best: Candidate | None = None
        fail: Failure | None = None
        for scope in top:
            if best is not None and self._opens_too_many(scope, best):
                continue
            res = self.try_scope(scope)
            if isinstance(res, Failure):
                if fail is None or res.got > fail.got:
                    fail = res
            elif best is None or res.rank() < best.rank():
                best = res
        if best is not None:
            return best
        assert fail is not None
        if self.gang_tier is not None:
            return f"gang {self.gang.name!r} must fit inside {self._top_name()}: best try: {fail.message}"
        return fail

    def _opens_too_many(self, scope: ScopeKey, best: Candidate) -> bool:
        """Whether every plan in ``scope`` opens so many wholly free domains that it ranks below
        ``best`` (unless it places more)."""
        if not self.shortcuts:
            return False
        main = self.main
        opened = _opened_at_least(self.p, main, self.sub_tiers[main.name], scope, self.measure)
        return at_least(placed=self.all_pods, opened=opened) > best.figures.key()

    def tighter(self, best: Candidate) -> Candidate:
        """A plan in a domain of a tier below the gang tier (the first such tier, from tier 1 up,
        with a plan that ranks above ``best``), else ``best``."""
        p = self.p
        upper = len(p.snapshot.tiers) if self.gang_tier is None else self.gang_tier
        # the tier whose plans all span it: set when no single domain of the tier below (the measuring
        # tier) can do as well as best, so a plan that fits in one of them is rejected anyway
        span_floor: int | None = None
        for ti in range(min(upper, best.figures.span)):
            applies, quick = (
                _one_domain_choice(p, self.roles, best.figures, ti, self.measure)
                if self.shortcuts
                else (False, None)
            )
            if quick is not None:
                res = self.try_scope(quick)
                if isinstance(res, Candidate) and res.rank() < best.rank():
                    return res
            if applies:
                span_floor = ti + 1
                continue  # no domain of this tier does better than best
            found = self._best_in_tier(ti, best, span_floor)
            if found is not None:
                return found
        return best

    def _best_in_tier(self, ti: int, best: Candidate, span_floor: int | None) -> Candidate | None:
        """The best plan in one domain of tier ``ti`` that ranks above ``best``, if any."""
        bounds = _TierBounds.of(self, ti, best)
        found: Candidate | None = None
        for scope in self.scopes_at(ti):
            if bounds is not None and bounds.skip(scope, found, tied_floor=span_floor == ti):
                continue
            res = self.try_scope(scope)
            if isinstance(res, Failure) or res.rank() >= best.rank():
                continue
            if found is None or res.rank() < found.rank():
                found = res
        return found


@dataclass(frozen=True)
class _TierBounds:
    """Bounds on the plans in each domain of one tier above the measuring tier, against a best plan
    that places every pod and opens nothing: a domain none of whose plans can rank above it (or
    above the plan found in an earlier-named domain) is skipped."""

    ti: int
    best_key: tuple[int, ...]
    room: dict[str, tuple[int, int, int]]  # as ``_partial_room``
    all_pods: int
    main_need: int
    gang_gpus: int
    # one GPU-only role placed whole: (its pods, pods of a useful block); a plan that opens nothing
    # loses at least the blocks its pods need beyond the room left over after whole blocks
    whole_role: tuple[int, int] | None

    @classmethod
    def of(cls, search: _Search, ti: int, best: Candidate) -> _TierBounds | None:
        bf, main, measure = best.figures, search.main, search.measure
        if not search.shortcuts or bf.opened != 0 or measure is None or bf.placed != search.all_pods:
            return None
        useful = useful_block(main)
        key = search.main_key
        room = _partial_room(search.p, key, measure, ti, useful)
        if room is None:
            return None
        whole = len(search.roles) == 1 and key[0] > 0 and not key[1] and bf.placed == main.pods
        return cls(
            ti=ti,
            best_key=bf.key(),
            room=room,
            all_pods=search.all_pods,
            main_need=search.main_need,
            gang_gpus=sum(r.pods * r.gpus_per_pod for r in search.gang.roles),
            whole_role=(main.pods, useful) if whole else None,
        )

    def skip(self, scope: ScopeKey, found: Candidate | None, *, tied_floor: bool) -> bool:
        """Whether ``scope`` can be left out: every plan there ranks below best, or (``tied_floor``:
        every plan in the tier spans it) its best conceivable plan only ties with ``found``, whose
        scope name comes first."""
        name = scope[1]  # type: ignore[index]
        partly, left_over, stranded_now = self.room.get(name, (0, 0, 0))
        # a plan there opens a wholly free domain unless the partly used ones hold the main
        # role; it un-strands at most the stranded GPUs there, and at most the gang's GPUs
        can_fill = min(stranded_now, self.gang_gpus)
        lost: dict[str, int] = {}
        if self.whole_role is not None:
            pods, useful = self.whole_role
            lost = {"lost": -(-(pods - left_over) // useful)}
        bound = at_least(
            placed=self.all_pods,
            opened=0 if partly >= self.main_need else 1,
            upper=0,
            stranded=-can_fill,
            **lost,
        )
        if bound > self.best_key:
            return True  # every plan there ranks below best
        return (
            found is not None
            and tied_floor
            and name > found.scope_name
            and found.figures.key()
            <= at_least(
                placed=self.all_pods,
                opened=0,
                upper=0,
                stranded=-can_fill,
                lost=0,
                leftover=0,
                span=self.ti,
                degraded=0,
            )
        )


def _blocks(role: Role) -> int:
    _, full, rem = role_subgroups(role)
    return full + (1 if rem else 0)


def _one_domain_choice(
    p: PreparedSnapshot, roles: Sequence[Role], best: Figures, ti: int, measure: int | None
) -> tuple[bool, ScopeKey]:
    """The tier-``ti`` domain the scope search below would pick, found from domain totals alone.

    Exact in the common case: one role asking GPUs only, all of its pods placed by ``best``, and
    ``ti`` the measuring tier. A domain that holds every pod is then one touched domain whose
    figures follow from its room and free GPUs before the plan (each pod takes one pod's worth of
    room); domains worse than ``best`` through ``stranded`` are left out, the best of the rest by
    the figures (through ``leftover``, then ``degraded``: the same ``span`` for all), then name, is the
    choice. Returns (whether the case applies,
    the domain or None when no domain of the tier qualifies).
    """
    if len(roles) != 1 or ti != measure:
        return False, None
    role = roles[0]
    key = role_key(role)
    g = key[0]
    if key[1] or g <= 0 or best.placed != role.pods:
        return False, None
    useful = useful_block(role)
    whole = p.whole(ti)
    bound = best.key(through="stranded")
    pick: tuple[int | str, ...] | None = None
    for (d, nodes), (cap, free) in zip(p.groups(None, ti), p.group_caps(key, None, ti), strict=True):
        if cap < role.pods:
            continue
        after = free - role.pods * g
        stranded, lost = room_change(cap, free, cap - role.pods, after, useful)
        clean = p.clean_room(key, nodes)
        figures = Figures(
            placed=role.pods,
            opened=int(whole[d]),
            upper=p.upper_opened(ti, d),
            stranded=stranded,
            lost=lost,
            leftover=after,
            span=ti,
            degraded=0 if clean is None else degraded_pods(role.pods, clean),
        )
        item: tuple[int | str, ...] = (*figures.key(), d)
        if figures.key(through="stranded") <= bound and (pick is None or item < pick):
            pick = item
    return True, (None if pick is None else (ti, str(pick[-1])))


def _opened_at_least(
    p: PreparedSnapshot, main: Role, sub_tier: int | None, scope: ScopeKey, measure: int | None
) -> int:
    """A lower bound on the wholly free measuring-tier domains any plan inside ``scope`` opens: the
    main role's minimum full-size blocks (pods, for a role without a subgroup tier) that do not fit
    in the partly used domains go to wholly free ones, the roomiest first. A short last block is left
    out: it may fit in the room a full block leaves over."""
    if measure is None or (sub_tier is not None and sub_tier != measure):
        return 0
    key = role_key(main)
    size, full, _ = role_subgroups(main)
    if sub_tier is None:
        size, need = 1, sum(len(r) for r in block_ranges(main, min_blocks(main)))
    else:
        need = min(min_blocks(main), full)
    whole = p.whole(measure)
    fresh: list[int] = []
    for (d, _), (cap, _) in zip(p.groups(scope, measure), p.group_caps(key, scope, measure), strict=True):
        if whole[d]:
            fresh.append(cap // size)
        else:
            need -= cap // size
    opened = 0
    for room in sorted(fresh, reverse=True):
        if need <= 0:
            break
        need -= room
        opened += 1
    return opened


def _partial_room(
    p: PreparedSnapshot, key: RoleKey, measure: int, ti: int, useful: int
) -> dict[str, tuple[int, int, int]] | None:
    """Per domain of tier ``ti`` above ``measure``, over its measuring-tier domains that are not
    wholly free: (pods of this shape they can host, the part of that room left over beyond whole
    useful blocks, the free GPUs stranded in them now). None when ``ti`` is not above ``measure``."""
    if ti <= measure:
        return None
    whole = p.whole(measure)
    up = len(p.snapshot.tiers) - 1 - ti  # position of tier ti in a path (top tier first)
    paths = p.paths[measure]
    out: dict[str, tuple[int, int, int]] = {}
    for (d, _), (cap, free) in zip(p.groups(None, measure), p.group_caps(key, None, measure), strict=True):
        if not whole[d]:
            anc = paths[d][up]
            total, left, stranded = out.get(anc, (0, 0, 0))
            out[anc] = (total + cap, left + cap % useful, stranded + (free if cap < useful else 0))
    return out
