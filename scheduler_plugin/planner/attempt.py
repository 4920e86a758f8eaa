"""One attempt: the gang's roles placed in turn inside one scope, and the attempt's figures.

Blocks of a role with a subgroup tier are assigned to that tier's domains jointly by a dynamic
programme (``_place_tiered``; state: how many full blocks and whether the short last block are
placed; cost: each domain's ``objective.price``, summed), then filled onto nodes in name order. The
programme is exact for its price; the price counts the ``upper`` figure per opened domain, so two
domains opened under one free leaf count that leaf twice there, while the figures of a whole plan
count it once. When the role is one block, or every domain holds at most one block and there is no
short block, domain prices are independent and the cheapest domains are taken directly (the
programme's choice, the earlier domain on ties). A role without a subgroup tier is put greedily in
the node order the objective defines (``objective.node_key``). ``_measure`` gives the attempt's
``Figures`` from the capacity caches.

A one-role GPU-only gang whose blocks go to tier-1 domains is searched on per-domain counts
(``_State.defer``); only the chosen plan is put on nodes (``place_deferred``). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler_plugin.planner.objective import (
    Figures,
    clean_first,
    degraded_pods,
    open_cost,
    price,
    room_change,
    upper_step,
    useful_block,
)
from scheduler_plugin.planner.prepared import PreparedSnapshot, ScopeKey
from scheduler_plugin.planner.roles import RoleKey, block_ranges, min_blocks, role_key, role_subgroups
from scheduler_plugin.snapshot import Gang, PodSlot, Role, SubgroupPlacement

__all__ = ["Candidate", "Failure", "attempt", "place_deferred", "role_order"]


@dataclass
class Failure:
    role: str
    needed: int  # blocks (or pods) needed
    got: int
    message: str


@dataclass(frozen=True)
class _Deferred:
    role: Role
    base: list[int]
    domains: list[tuple[str, list[int], list[int]]]  # as ``_blocks_by_domain`` gives them


@dataclass
class _State:
    """What the gang has taken so far in one attempt (deltas against the snapshot)."""

    used_gpus: dict[int, int] = field(default_factory=dict)
    used_res: dict[int, dict[str, int]] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)  # nodes in first-use order
    pods: list[tuple[str, int, int]] = field(default_factory=list)  # (role, pod index, node) placed
    subgroups: list[SubgroupPlacement] = field(default_factory=list)
    placed_pods: int = 0
    # One GPU-only role whose blocks go to tier-0 domains: the attempt records pods per domain
    # (``by_domain``) and the arguments of the fill (``deferred``); only the chosen plan is put on
    # nodes (``place_deferred``). Each pod then takes one pod of room and ``gpus_per_pod`` GPUs from
    # its domain, so the figures of ``_measure`` and ``_span`` follow from the counts.
    defer: bool = False
    deferred: _Deferred | None = None
    by_domain: dict[str, int] = field(default_factory=dict)


def _fit_now(p: PreparedSnapshot, st: _State, i: int, key: RoleKey, base: list[int]) -> int:
    if i not in st.used_gpus:
        return base[i]
    return p._fit_one(i, key, st.used_gpus[i], st.used_res.get(i))


def _fill(
    p: PreparedSnapshot,
    st: _State,
    role: Role,
    key: RoleKey,
    *,
    pod_range: range,
    nodes: Iterable[int],
    base: list[int],
) -> bool:
    """Put the pods of ``pod_range`` (consecutive indices) on ``nodes`` in order, as many per node as fit."""
    pod, stop = pod_range.start, pod_range.stop
    pods, name, used, order = st.pods, role.name, st.used_gpus, st.order
    g, reqs = key
    for i in nodes:
        if pod >= stop:
            break
        u = used.get(i)
        room = base[i] if u is None else p._fit_one(i, key, u, st.used_res.get(i))
        if room <= 0:
            continue
        n = room if room < stop - pod else stop - pod
        if n == 1:
            pods.append((name, pod, i))
        else:
            pods.extend([(name, k, i) for k in range(pod, pod + n)])
        pod += n
        if u is None:
            used[i] = g * n
            order.append(i)
        else:
            used[i] = u + g * n
        if reqs:
            res = st.used_res.setdefault(i, {})
            for r, q in reqs:
                res[r] = res.get(r, 0) + q * n
    st.placed_pods += pod - pod_range.start
    return pod >= stop


@dataclass(frozen=True)
class _TierRoom:
    """The domains of one tier inside the scope as the blocks of one role see them, after what the
    gang has taken so far: those that can hold its smallest block, and the roomiest of all."""

    caps: list[tuple[int, int, int]]  # (group index, pods, free gpus) where the smallest block fits
    cleans: list[int | None]  # per caps entry: room on clean nodes (None: no degraded node there)
    opens_at: list[int]  # per caps entry: cost of opening it (0 unless the gang breaks a free one)
    most: tuple[int, int] | None  # (pods, -group index) of the roomiest group, for the reason


def _touched(p: PreparedSnapshot, st: _State, groups: list[tuple[str, list[int]]], tier: int) -> set[int]:
    """Indices of ``groups`` (domains of ``tier``) holding a node the gang uses already."""
    if not st.used_gpus:
        return set()
    gidx = {d: k for k, (d, _) in enumerate(groups)}
    dom_t = p.dom[tier]
    return {k for i in st.used_gpus if (d := dom_t[i]) is not None and (k := gidx.get(d)) is not None}


def _tier_room(
    p: PreparedSnapshot,
    st: _State,
    key: RoleKey,
    *,
    scope: ScopeKey,
    tier: int,
    smallest: int,
    base: list[int],
) -> _TierRoom:
    groups = p.groups(scope, tier)
    touched = _touched(p, st, groups, tier)
    whole = p.whole(tier)
    caps: list[tuple[int, int, int]] = []
    cleans: list[int | None] = []
    most: tuple[int, int] | None = None
    for k, (cap0, free0) in enumerate(p.group_caps(key, scope, tier)):
        cap, freeg = cap0, free0
        if k in touched:
            nodes = groups[k][1]
            cap = sum(_fit_now(p, st, i, key, base) for i in nodes)
            freeg = sum(p.free[i] - st.used_gpus.get(i, 0) for i in nodes)
        if most is None or (cap, -k) > most:
            most = (cap, -k)
        if cap >= smallest:
            caps.append((k, cap, freeg))
            if p.any_degraded:
                fit_k = (lambda i: _fit_now(p, st, i, key, base)) if k in touched else None
                cleans.append(p.clean_room(key, groups[k][1], fit_k))
            else:
                cleans.append(None)
    opens_at = [
        open_cost(p.upper_opened(tier, groups[k][0])) if k not in touched and whole[groups[k][0]] else 0
        for k, _, _ in caps
    ]
    return _TierRoom(caps=caps, cleans=cleans, opens_at=opens_at, most=most)


def _place_tiered(
    p: PreparedSnapshot, st: _State, role: Role, key: RoleKey, *, scope: ScopeKey, tier: int, shortcuts: bool
) -> Failure | None:
    """Assign the role's blocks to domains of ``tier`` jointly (DP), then fill nodes in name order."""
    size, full, rem = role_subgroups(role)
    need = min_blocks(role)
    groups = p.groups(scope, tier)
    base = p.base_fit(key)
    room = _tier_room(p, st, key, scope=scope, tier=tier, smallest=rem if rem else size, base=base)
    caps = room.caps
    # full blocks are alike, so at most this many fit; when that is short of both all the blocks and
    # the minimum, the programme below would find exactly this count and fail
    most_full = min(full, sum(cap // size for _, cap, _ in caps))
    if shortcuts and most_full < full and most_full < need:
        return _tiered_failure(p, role, key, tier=tier, groups=groups, most=room.most, count=most_full)
    prices = _BlockPrices(room, size=size, rem=rem, g=key[0], useful=useful_block(role))
    if (
        shortcuts
        and not rem
        and most_full == full
        and (full == 1 or all(cap < 2 * size for _, cap, _ in caps))
    ):
        # one block, or every domain holds at most one block and the blocks are alike: a domain's
        # cost does not depend on the others, so the programme below picks the cheapest ``full``
        # domains, the earlier on ties
        per_group, count = prices.cheapest(full), full
    else:
        chosen = prices.programme(full)
        if chosen is None or chosen[1] < need or (chosen[1] == 0 and need > 0):
            count = chosen[1] if chosen is not None else 0
            return _tiered_failure(p, role, key, tier=tier, groups=groups, most=room.most, count=count)
        per_group, count = chosen
    return _fill_blocks(
        p, st, role, key, groups=groups, caps=caps, per_group=per_group, count=count, base=base, need=need
    )


def _tiered_failure(
    p: PreparedSnapshot,
    role: Role,
    key: RoleKey,
    *,
    tier: int,
    groups: list[tuple[str, list[int]]],
    most: tuple[int, int] | None,
    count: int,
) -> Failure:
    tier_name = p.snapshot.tiers[tier]
    size, need = role_subgroups(role)[0], min_blocks(role)
    where = (
        f"; most room: {min(most[0], role.pods)} pods in {tier_name} domain {groups[-most[1]][0]}"
        if most is not None
        else f"; no node of the scope has a {tier_name} domain"
    )
    return Failure(
        role.name,
        need,
        count,
        f"role {role.name!r} needs {need} subgroup(s) of {size} pod(s) x {key[0]} GPU(s), each inside one "
        f"{tier_name} domain; only {count} fit{where}",
    )


@dataclass(frozen=True)
class _BlockPrices:
    """What it costs to put a role's blocks (``size`` pods each, and a short one of ``rem`` pods) in
    the domains of a ``_TierRoom``: each domain's ``objective.price``, summed over domains."""

    room: _TierRoom
    size: int
    rem: int
    g: int  # GPUs per pod
    useful: int

    def price(self, gi: int, used: int) -> int:
        _, cap, freeg = self.room.caps[gi]
        return price(
            self.room.opens_at[gi], cap, freeg, used, g=self.g, useful=self.useful, clean=self.room.cleans[gi]
        )

    def cheapest(self, full: int) -> list[tuple[int, int]]:
        """One full block in each of the ``full`` cheapest domains that hold one, the earlier on ties."""
        caps = self.room.caps
        priced = sorted(
            (self.price(gi, self.size), gi) for gi, (_, cap, _) in enumerate(caps) if cap >= self.size
        )
        per_group: list[tuple[int, int]] = [(0, 0)] * len(caps)
        for _, gi in priced[:full]:
            per_group[gi] = (1, 0)
        return per_group

    def _row_prices(self, gi: int, full: int) -> list[list[int]]:
        """This domain's cost of holding x full blocks and y short ones, the same from every state."""
        cap, has_rem = self.room.caps[gi][1], 1 if self.rem else 0
        max_x = min(full, cap // self.size)
        priced_xy: list[list[int]] = []
        for y in range(has_rem + 1):
            row: list[int] = []
            for x in range(max_x + 1):
                used = x * self.size + y * self.rem
                if used > cap:
                    break
                row.append(self.price(gi, used))
            priced_xy.append(row)
        return priced_xy

    def programme(self, full: int) -> tuple[list[tuple[int, int]], int] | None:
        """The dynamic programme over domains (state = a * 2 + b: a full blocks, b short block
        placed): (full blocks, short block) per domain and the blocks placed, for all the blocks at
        least cost, else the most full blocks; None when no block fits."""
        has_rem = 1 if self.rem else 0
        n_states = (full + 1) * 2
        cost: list[int | None] = [None] * n_states
        cost[0] = 0
        choices: list[list[tuple[int, int] | None]] = []
        for gi in range(len(self.room.caps)):
            priced_xy = self._row_prices(gi, full)
            new = list(cost)
            choice: list[tuple[int, int] | None] = [None] * n_states
            for s_idx, c0 in enumerate(cost):
                if c0 is None:
                    continue
                a, b = divmod(s_idx, 2)
                for y in range(0, (1 - b) * has_rem + 1):
                    row = priced_xy[y]
                    for x in range(0, min(len(row) - 1, full - a) + 1):
                        if x == 0 and y == 0:
                            continue
                        c = c0 + row[x]
                        t_idx = (a + x) * 2 + b + y
                        cur = new[t_idx]
                        if cur is None or c < cur:
                            new[t_idx] = c
                            choice[t_idx] = (x, y)
            cost = new
            choices.append(choice)
        # best count: all blocks, else the most full blocks down to the minimum
        if has_rem and cost[full * 2 + 1] is not None:
            final, count = full * 2 + 1, full + 1
        else:
            found = next((a for a in range(full, -1, -1) if cost[a * 2] is not None), None)
            if found is None:
                return None
            final, count = found * 2, found
        return _walk_back(choices, final), count


def _walk_back(choices: list[list[tuple[int, int] | None]], final: int) -> list[tuple[int, int]]:
    """The programme's choice per domain, read back from its final state."""
    per_group = [(0, 0)] * len(choices)
    s_idx = final
    for gi in range(len(choices) - 1, -1, -1):
        ch = choices[gi][s_idx]
        if ch is not None:
            per_group[gi] = ch
            s_idx -= ch[0] * 2 + ch[1]
    return per_group


def _fill_blocks(
    p: PreparedSnapshot,
    st: _State,
    role: Role,
    key: RoleKey,
    *,
    groups: list[tuple[str, list[int]]],
    caps: list[tuple[int, int, int]],
    per_group: list[tuple[int, int]],
    count: int,
    base: list[int],
    need: int,
) -> Failure | None:
    """Fill the blocks the search gave each domain ((full blocks, short block) per group of caps)."""
    domains = _blocks_by_domain(groups, caps, per_group, role_subgroups(role)[1])
    ranges = block_ranges(role, count)
    if (
        st.defer
        and st.deferred is None
        and all(len(nodes) == len(p.members[0].get(d, ())) for d, nodes, _ in domains)
    ):  # every chosen group is a whole tier-0 domain: count now, fill if chosen
        st.deferred = _Deferred(role, base, domains)
        for d, _, blocks in domains:
            n = sum(len(ranges[b]) for b in blocks)
            st.by_domain[d] = n
            st.placed_pods += n
        return None
    for dname, nodes, blocks in domains:
        order = clean_first(nodes, p.degraded) if p.any_degraded else nodes
        for b in blocks:
            if not _fill(
                p, st, role, key, pod_range=ranges[b], nodes=order, base=base
            ):  # pragma: no cover - DP counted room
                return Failure(role.name, need, b, f"role {role.name!r}: domain {dname} lost room")
            st.subgroups.append(SubgroupPlacement(role=role.name, index=b, domain=dname))
    return None


def _blocks_by_domain(
    groups: list[tuple[str, list[int]]],
    caps: list[tuple[int, int, int]],
    per_group: list[tuple[int, int]],
    full: int,
) -> list[tuple[str, list[int], list[int]]]:
    """(domain, its nodes, block indices) of each domain the search gave blocks, in group order: full
    blocks numbered on from one domain to the next, the short block (index ``full``) last in its."""
    out: list[tuple[str, list[int], list[int]]] = []
    next_full = 0
    for gi, (x, y) in enumerate(per_group):
        if x or y:
            dname, nodes = groups[caps[gi][0]]
            out.append((dname, nodes, [*range(next_full, next_full + x), *([full] if y else [])]))
            next_full += x
    return out


def _place_free(
    p: PreparedSnapshot, st: _State, role: Role, key: RoleKey, scope: ScopeKey, *, measure: int | None
) -> Failure | None:
    """Place a role without a subgroup tier: nodes the gang already uses first, then best fit.

    Its blocks have no domain, and its pods are alike, so the whole blocks that fit are the longest
    prefix whose pods the scope has room for; one pass fills them. Where one domain of the measuring
    tier holds the whole scope, every figure but ``degraded`` follows from the pod count alone, so the
    scope's clean nodes are filled first (``objective.clean_first``), each part in that order.
    """
    _, full, rem = role_subgroups(role)
    total = full + (1 if rem else 0)
    need = min_blocks(role)
    base = p.base_fit(key)
    scope_dom = p.dom[scope[0]] if scope is not None else None
    used_first = [i for i in st.order if scope_dom is None or scope_dom[i] == scope[1]]  # type: ignore[index]
    useful = useful_block(role)
    ranges = block_ranges(role, total)

    def candidates() -> Iterable[int]:
        return _chain(
            used_first, (p.free_nodes(key, useful) if scope is None else p.free_order(key, scope, useful))
        )

    one_measured = scope is not None and measure is not None and measure >= scope[0]
    clean = clean_first(list(candidates()), p.degraded) if p.any_degraded and one_measured else None
    room = 0
    for i in clean if clean is not None else candidates():
        room += _fit_now(p, st, i, key, base)
        if room >= role.pods:
            break
    count = pods = 0
    for r in ranges:
        if pods + len(r) > room:
            break
        pods += len(r)
        count += 1
    if count < need or count == 0:
        pods_needed = sum(len(r) for r in ranges[:need])
        unit = f"{key[0]} GPU(s)" + "".join(f", {q} {res}" for res, q in key[1])
        return Failure(
            role.name,
            need,
            count,
            f"role {role.name!r} needs {pods_needed} pod(s) of {unit}; room for {min(room, pods_needed - 1)}"
            + (f" in {p.snapshot.tiers[scope[0]]} domain {scope[1]}" if scope is not None else ""),
        )
    _fill(
        p, st, role, key, pod_range=range(pods), nodes=clean if clean is not None else candidates(), base=base
    )
    st.subgroups.extend(SubgroupPlacement(role=role.name, index=b, domain=None) for b in range(count))
    return None


def _chain(first: Sequence[int], rest: Iterable[int]) -> Iterable[int]:
    seen = set(first)
    yield from first
    for i in rest:
        if i not in seen:
            yield i


@dataclass(frozen=True)
class Candidate:
    """One attempt's plan: its figures, the scope it was planned in, and what it took."""

    figures: Figures
    scope_name: str
    state: _State

    def rank(self) -> tuple[int | str, ...]:
        """``figures.key()``, then the scope's name (ties go to the earlier-named scope)."""
        return (*self.figures.key(), self.scope_name)


def role_order(gang: Gang, sub_tiers: Mapping[str, int | None]) -> list[Role]:
    return sorted(
        gang.roles,
        key=lambda r: (0 if sub_tiers[r.name] is not None else 1, -r.pods * r.gpus_per_pod, r.name),
    )


def attempt(
    p: PreparedSnapshot,
    roles: Sequence[Role],
    *,
    sub_tiers: Mapping[str, int | None],
    scope: ScopeKey,
    measure: int | None,
    main: Role,
    shortcuts: bool,
) -> Candidate | Failure:
    """Place ``roles`` in order inside ``scope`` and measure the result, or say which role failed."""
    st = _State()
    only_key = role_key(roles[0])
    st.defer = (
        shortcuts
        and len(roles) == 1
        and sub_tiers[roles[0].name] == 0
        and measure == 0
        and only_key[0] > 0
        and not only_key[1]
    )
    for role in roles:
        key = role_key(role)
        t = sub_tiers[role.name]
        fail = (
            _place_tiered(p, st, role, key, scope=scope, tier=t, shortcuts=shortcuts)
            if t is not None
            else _place_free(p, st, role, key, scope, measure=measure)
        )
        if fail is not None:
            return fail
    return Candidate(_measure(p, st, measure, main), "" if scope is None else scope[1], st)


def _measure(p: PreparedSnapshot, st: _State, tier: int | None, main: Role) -> Figures:
    """The attempt's ``Figures`` (as ``objective.evaluate`` defines them), from the per-domain
    capacity caches and what the attempt took: only the touched domains are summed."""
    span = _span(p, st)
    key = role_key(main)
    degraded = _degraded(p, st, key)
    if tier is None or not (st.used_gpus or st.by_domain):
        return Figures(
            placed=st.placed_pods,
            opened=0,
            upper=0,
            stranded=0,
            lost=0,
            leftover=0,
            span=span,
            degraded=degraded,
        )
    useful = useful_block(main)
    base = p.base_fit(key)
    dom_t = p.dom[tier]
    whole = p.whole(tier)
    g, free = key[0], p.free
    gpu_only = g > 0 and not key[1]
    used = st.used_gpus
    totals = p.domain_totals(key, tier) if gpu_only else {}
    delta: dict[str, list[int]] = {}
    if st.by_domain:  # deferred (one GPU-only role at tier 0): each pod takes one pod of room
        touched = sorted(st.by_domain)
        delta = {d: [n, n * g] for d, n in st.by_domain.items()}
    else:
        touched = sorted({d for i in st.used_gpus if (d := dom_t[i]) is not None})
    opened = stranded = leftover = lost = 0
    if gpu_only and not st.by_domain:  # the change per domain, from the nodes the gang uses
        for i, u in used.items():
            dd = delta.setdefault(dom_t[i], [0, 0])  # type: ignore[arg-type]
            dd[0] += base[i] - (free[i] - u) // g
            dd[1] += u
    for d in touched:
        if gpu_only:
            cap_before, free_before = totals[d]
            cap_after, free_after = cap_before - delta[d][0], free_before - delta[d][1]
        else:
            nodes = p.members[tier][d]
            cap_before = sum(base[i] for i in nodes)
            free_before = sum(free[i] for i in nodes)
            cap_after = sum(_fit_now(p, st, i, key, base) for i in nodes)
            free_after = sum(free[i] - used.get(i, 0) for i in nodes)
        opened += whole[d]
        leftover += free_after
        stranded_d, lost_d = room_change(cap_before, free_before, cap_after, free_after, useful)
        stranded += stranded_d
        lost += lost_d
    upper = 0
    top = len(p.members) - 1
    for t in range(tier + 1, top + 1):
        whole_t = p.whole(t)
        broken = {p.paths[tier][d][top - t] for d in touched if whole[d]}
        upper += sum(1 for a in broken if whole_t.get(a, False)) * upper_step(t - tier - 1)
    return Figures(
        placed=st.placed_pods,
        opened=opened,
        upper=upper,
        stranded=stranded,
        lost=lost,
        leftover=leftover,
        span=span,
        degraded=degraded,
    )


def _degraded(p: PreparedSnapshot, st: _State, key: RoleKey) -> int:
    """Pods the attempt put on degraded nodes (deferred: each domain filled clean nodes first)."""
    if not p.any_degraded:
        return 0
    if st.by_domain:
        members = p.members[0]
        total = 0
        for d, n in st.by_domain.items():
            clean = p.clean_room(key, members[d])
            total += 0 if clean is None else degraded_pods(n, clean)
        return total
    bad = p.degraded
    return sum(1 for _, _, i in st.pods if bad[i])


def _span(p: PreparedSnapshot, st: _State) -> int:
    if st.by_domain:  # deferred: tier-0 domains, whose ancestors are their paths
        doms = list(st.by_domain)
        if len(doms) == 1:
            return 0
        top = len(p.dom) - 1
        paths = p.paths[0]
        for ti in range(1, top + 1):
            anc = paths[doms[0]][top - ti]
            if anc and all(paths[d][top - ti] == anc for d in doms):
                return ti
        return len(p.dom)
    used = list(st.used_gpus)
    for ti, dom_t in enumerate(p.dom):
        first = dom_t[used[0]]
        if first is not None and all(dom_t[i] == first for i in used):
            return ti
    return len(p.dom)


def place_deferred(
    p: PreparedSnapshot, d: _Deferred
) -> tuple[dict[PodSlot, str], list[SubgroupPlacement], int]:
    """(placement, subgroups, nodes used) of deferred blocks, as ``_fill_blocks`` would have put
    them: per domain, its blocks' pods in order over its nodes in name order, as many per node as
    fit (each block starts on the node where the one before stopped, if it has room left)."""
    size = role_subgroups(d.role)[0]
    name, total, base = d.role.name, d.role.pods, d.base
    node_of = [-1] * total
    subgroups: list[SubgroupPlacement] = []
    used = 0
    for dname, nodes, blocks in d.domains:
        free_nodes = iter(clean_first(nodes, p.degraded) if p.any_degraded else nodes)
        node = room = 0
        for b in blocks:
            for k in range(b * size, min((b + 1) * size, total)):
                while room <= 0:  # the search counted the room: the domain does not run out
                    node = next(free_nodes)
                    room = base[node]
                    used += room > 0
                node_of[k] = node
                room -= 1
            subgroups.append(SubgroupPlacement(role=name, index=b, domain=dname))
    names = p.names
    placement = {PodSlot(name, k): names[i] for k, i in enumerate(node_of) if i >= 0}
    return placement, subgroups, used
