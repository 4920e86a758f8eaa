"""Preferred allocation: which devices to hand a container, as a pure function.

No I/O, no clock, no randomness; ties are broken by device name. The gRPC server asks
:func:`preferred_allocation` and sends its answer as kubelet's ``GetPreferredAllocation`` reply.

**The score of a set of whole GPUs** (documented, compared lexicographically, higher is better):

1. the sum over every pair in the set of the pair's NVLink count (direct links, or the links each GPU
   has into the NVSwitch fabric, as ``nvidia-smi topo -m`` prints ``NV<n>``);
2. then the sum over pairs of PCIe closeness: ``PIX`` 4, ``PXB`` 3, ``PHB`` 2, ``NODE`` 1, ``SYS`` 0;
3. then the number of pairs whose GPUs sit on the same NUMA node.

Among sets of equal score the one whose sorted device names compare smallest wins. The search is exact:
a depth-first walk over combinations in name order with branch-and-bound pruning (an upper bound from
each candidate's links to the chosen set plus half its best possible links to the rest), so the answer is
the optimum for the score on any node (tests prove it against brute force up to 16 GPUs).

**Shared devices** (replicas ``<uuid>::<n>``) are spread across GPUs by default — each pick goes to the
GPU with the fewest replicas in use, counting this request's picks, ties by GPU name — or packed onto the
GPUs already most used (``pack``). **MIG devices** prefer one parent GPU: the parent that can hold the
whole request (the one already named in ``must_include``, else the one with the fewest free slices, else
by name); otherwise parents with the most free devices first.

Unknown and unhealthy devices among the available ones are skipped, never an error; a ``must_include``
device the resource does not have is an error (:class:`PreferenceError`, naming it).

Work is linear in the devices for shared and MIG devices (each pick costs the number of GPUs), so a
request for thousands of replicas answers in milliseconds.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from topology.model import Connection, LinkLevel, NodeInventory

PCIE_CLOSENESS: Mapping[LinkLevel, int] = {
    LinkLevel.PIX: 4,
    LinkLevel.PXB: 3,
    LinkLevel.PHB: 2,
    LinkLevel.NODE: 1,
    LinkLevel.SYS: 0,
}


class PreferenceError(ValueError):
    """A request that cannot be answered (``must_include`` names devices the resource does not have)."""

    def __init__(self, message: str, *, unknown: Sequence[str]) -> None:
        super().__init__(message)
        self.unknown = tuple(unknown)


class Policy(enum.StrEnum):
    """How shared devices (replicas) are placed on GPUs."""

    SPREAD = "spread"
    PACK = "pack"


class DeviceKind(enum.StrEnum):
    GPU = "gpu"
    MIG = "mig"
    REPLICA = "replica"


@dataclass(frozen=True, slots=True)
class Candidate:
    """What preferred allocation needs to know about one kubelet device."""

    id: str
    gpu: str  # the physical GPU's UUID (the parent for MIG devices and replicas)
    kind: DeviceKind
    healthy: bool = True
    slices: int = 1  # MIG: GPU slices; used to prefer the tightest parent


@dataclass(frozen=True, slots=True)
class Score:
    nvlinks: int
    pcie: int
    numa_pairs: int

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.nvlinks, self.pcie, self.numa_pairs)


@dataclass(frozen=True, slots=True)
class Topology:
    """Pair facts between the node's GPUs, keyed by GPU UUID, with names in sorted order."""

    gpus: tuple[str, ...]
    nvlinks: tuple[tuple[int, ...], ...]
    pcie: tuple[tuple[int, ...], ...]  # PCIe closeness per pair (see PCIE_CLOSENESS)
    numa: tuple[int | None, ...]

    def index(self, gpu: str) -> int:
        return self.gpus.index(gpu)

    def score(self, gpus: Iterable[str]) -> Score:
        idx = [self.index(g) for g in gpus]
        nv = pc = nu = 0
        for a, b in itertools.combinations(idx, 2):
            nv += self.nvlinks[a][b]
            pc += self.pcie[a][b]
            nu += 1 if self.numa[a] is not None and self.numa[a] == self.numa[b] else 0
        return Score(nv, pc, nu)

    @classmethod
    def build(
        cls,
        gpus: Sequence[str],
        *,
        nvlinks: Mapping[tuple[str, str], int] | None = None,
        pcie: Mapping[tuple[str, str], LinkLevel] | None = None,
        numa: Mapping[str, int | None] | None = None,
    ) -> Topology:
        """From pair maps (either order of a pair is accepted); missing pairs have 0 links, ``SYS``."""
        names = tuple(sorted(set(gpus)))
        n = len(names)
        nv = [[0] * n for _ in range(n)]
        pc = [[0] * n for _ in range(n)]
        for (a, b), count in (nvlinks or {}).items():
            if a in names and b in names and a != b:
                i, j = names.index(a), names.index(b)
                nv[i][j] = nv[j][i] = count
        for (a, b), level in (pcie or {}).items():
            if a in names and b in names and a != b:
                i, j = names.index(a), names.index(b)
                pc[i][j] = pc[j][i] = PCIE_CLOSENESS.get(level, 0)
        numa_map = numa or {}
        return cls(
            gpus=names,
            nvlinks=tuple(tuple(r) for r in nv),
            pcie=tuple(tuple(r) for r in pc),
            numa=tuple(numa_map.get(g) for g in names),
        )


def topology_from_inventory(
    inventory: NodeInventory, *, pcie_levels: Mapping[tuple[int, int], LinkLevel] | None = None
) -> Topology:
    """Preferred allocation's view of a node: NVLink counts from the connectivity matrix, PCIe levels from the
    matrix where a pair is not NVLinked (or from ``pcie_levels``, NVML's common-ancestor answers by GPU
    index, where given), NUMA from each GPU. An NVLinked pair whose PCIe level is unknown counts as
    ``NODE`` on one NUMA node and ``SYS`` across nodes."""
    by_index = {g.index: g for g in inventory.gpus}
    nv: dict[tuple[str, str], int] = {}
    pc: dict[tuple[str, str], LinkLevel] = {}
    matrix = inventory.matrix
    for a, b in itertools.combinations(sorted(by_index), 2):
        ga, gb = by_index[a], by_index[b]
        key = (ga.uuid, gb.uuid)
        conn: Connection | None = None
        if matrix is not None and a in matrix.gpu_indices and b in matrix.gpu_indices:
            conn = matrix.connection(a, b)
        level: LinkLevel | None = None
        if pcie_levels is not None:
            level = pcie_levels.get((a, b)) or pcie_levels.get((b, a))
        if conn is not None and conn.level is LinkLevel.NVLINK:
            nv[key] = conn.nvlinks
        elif conn is not None and level is None:
            level = conn.level
        if level is None:
            same = ga.numa_node is not None and ga.numa_node == gb.numa_node
            level = LinkLevel.NODE if same else LinkLevel.SYS
        pc[key] = level
    return Topology.build(
        [g.uuid for g in inventory.gpus],
        nvlinks=nv,
        pcie=pc,
        numa={g.uuid: g.numa_node for g in inventory.gpus},
    )


# --------------------------------------------------------------------------- whole GPUs


def _weights(topology: Topology) -> list[list[int]]:
    """One integer per pair whose sums compare exactly like the lexicographic score tuples."""
    n = len(topology.gpus)
    pairs = n * (n - 1) // 2 + 1
    w_pcie = pairs  # numa sum < pairs
    w_nv = 5 * pairs * pairs  # pcie sum * w_pcie + numa sum < 5 * pairs * pairs
    out = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i != j:
                same = topology.numa[i] is not None and topology.numa[i] == topology.numa[j]
                out[i][j] = topology.nvlinks[i][j] * w_nv + topology.pcie[i][j] * w_pcie + int(same)
    return out


def best_gpu_set(
    topology: Topology, *, available: Iterable[str], must_include: Iterable[str] = (), size: int
) -> tuple[str, ...]:
    """The highest-scoring set of ``size`` GPUs from ``available`` that contains ``must_include``,
    sorted by name; fewer than ``size`` when not enough are available. Exact (see module doc)."""
    known = set(topology.gpus)
    must = sorted({g for g in must_include if g in known})
    pool = sorted({g for g in available if g in known} - set(must))
    if size <= len(must):
        return tuple(must[:size]) if size > 0 else ()
    need = size - len(must)
    if need >= len(pool):
        return tuple(sorted(must + pool))
    w = _weights(topology)
    must_i = [topology.index(g) for g in must]
    pool_i = [topology.index(g) for g in pool]
    base = sum(w[a][b] for a, b in itertools.combinations(must_i, 2))
    # each pool GPU's gain from the fixed part, and its best pair values within the pool, best first
    gain0 = [sum(w[c][m] for m in must_i) for c in pool_i]
    top = [sorted((w[c][d] for d in pool_i if d != c), reverse=True) for c in pool_i]
    prefix = [[0, *itertools.accumulate(t)] for t in top]
    best_value = -1
    best: tuple[int, ...] = ()
    chosen: list[int] = []
    m = len(pool_i)

    def walk(start: int, value: int, gains: list[int]) -> None:
        nonlocal best_value, best
        left = need - len(chosen)
        if left == 0:
            if value > best_value:
                best_value = value
                best = tuple(chosen)
            return
        if m - start < left:
            return
        # upper bound (doubled to stay in integers): each remaining candidate adds its links to the
        # chosen set plus at most half of its best left-1 links among the pool
        bounds = sorted(
            (2 * gains[k] + prefix[k][left - 1] for k in range(start, m)),
            reverse=True,
        )
        if 2 * value + sum(bounds[:left]) <= 2 * best_value:
            return
        for k in range(start, m - left + 1):
            chosen.append(k)
            ck = pool_i[k]
            walk(k + 1, value + gains[k], [g + w[pool_i[j]][ck] for j, g in enumerate(gains)])
            chosen.pop()

    walk(0, base, gain0)
    return tuple(sorted(must + [pool[k] for k in best]))


def brute_force_best(
    topology: Topology, *, available: Iterable[str], must_include: Iterable[str] = (), size: int
) -> tuple[str, ...]:
    """Reference answer by enumerating every combination (for tests and the benchmark)."""
    must = sorted(set(must_include) & set(topology.gpus))
    pool = sorted(set(available) & set(topology.gpus) - set(must))
    need = size - len(must)
    if need <= 0:
        return tuple(must[: max(size, 0)])
    if need >= len(pool):
        return tuple(sorted(must + pool))
    best: tuple[str, ...] = ()
    best_score: tuple[int, int, int] | None = None
    for combo in itertools.combinations(pool, need):
        names = tuple(sorted(must + list(combo)))
        score = topology.score(names).as_tuple()
        if best_score is None or score > best_score or (score == best_score and names < best):
            best, best_score = names, score
    return best


# --------------------------------------------------------------------------- any devices


def preferred_allocation(
    *,
    candidates: Mapping[str, Candidate],
    topology: Topology,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    policy: Policy = Policy.SPREAD,
    in_use: Mapping[str, int] | None = None,
) -> tuple[str, ...]:
    """The devices to prefer for one container.

    ``candidates`` describes every device of the resource; ``in_use`` counts devices already allocated
    per GPU (for replicas; defaults to the resource's devices that are not ``available``).
    The answer contains every ``must_include`` device first, then the chosen ones, and never an unknown
    or unhealthy device from ``available``.
    """
    must = list(dict.fromkeys(must_include))
    unknown = [d for d in must if d not in candidates]
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise PreferenceError(
            f"must_include names devices this resource does not have: {shown}", unknown=unknown
        )
    if size <= len(must):
        return tuple(must[: max(size, 0)])
    held = set(must)
    avail = [
        d for d in dict.fromkeys(available) if d in candidates and candidates[d].healthy and d not in held
    ]
    need = size - len(must)
    kinds = {candidates[d].kind for d in avail} | {candidates[d].kind for d in must if d in candidates}
    if kinds <= {DeviceKind.GPU}:
        by_gpu = {candidates[d].gpu: d for d in avail}
        must_gpus = [candidates[d].gpu for d in must if d in candidates]
        gpus = best_gpu_set(topology, available=by_gpu, must_include=must_gpus, size=len(must_gpus) + need)
        chosen = [by_gpu[g] for g in gpus if g in by_gpu]
        return tuple(must + sorted(chosen)[:need])
    if kinds <= {DeviceKind.MIG}:
        return tuple(must + _mig_pick(candidates, avail, must, need))
    used = dict(in_use) if in_use is not None else _in_use(candidates, available)
    return tuple(
        must
        + _replica_pick(
            candidates, avail=avail, must=must, need=need, used=used, policy=policy, topology=topology
        )
    )


def _in_use(candidates: Mapping[str, Candidate], available: Sequence[str]) -> dict[str, int]:
    free = set(available)
    used: dict[str, int] = {}
    for c in candidates.values():
        if c.id not in free:
            used[c.gpu] = used.get(c.gpu, 0) + 1
    return used


def _mig_pick(candidates: Mapping[str, Candidate], avail: list[str], must: list[str], need: int) -> list[str]:
    parents: dict[str, list[str]] = {}
    for d in sorted(avail):
        parents.setdefault(candidates[d].gpu, []).append(d)
    must_parents = {candidates[d].gpu for d in must if d in candidates}
    fits = [p for p, ds in parents.items() if len(ds) >= need]
    if fits:

        def fit_key(p: str) -> tuple[int, int, str]:
            free_slices = sum(candidates[d].slices for d in parents[p])
            return (0 if p in must_parents else 1, free_slices, p)

        parent = min(fits, key=fit_key)
        return parents[parent][:need]
    out: list[str] = []
    for p in sorted(parents, key=lambda p: (0 if p in must_parents else 1, -len(parents[p]), p)):
        out.extend(parents[p][: need - len(out)])
        if len(out) == need:
            break
    return out


def _replica_pick(
    candidates: Mapping[str, Candidate],
    *,
    avail: list[str],
    must: list[str],
    need: int,
    used: dict[str, int],
    policy: Policy,
    topology: Topology,
) -> list[str]:
    free: dict[str, deque[str]] = {}
    for d in sorted(avail):
        free.setdefault(candidates[d].gpu, deque()).append(d)
    picked_gpus = [candidates[d].gpu for d in must if d in candidates]
    load = dict(used)
    for g in picked_gpus:
        load[g] = load.get(g, 0) + 1
    # each GPU's NVLinks to the GPUs this request holds so far (one count per device held), kept up to
    # date per pick instead of summed again over every pick
    links = {g: _links_to(topology, g, picked_gpus) for g in free}
    index = {g: topology.index(g) for g in free if g in topology.gpus}
    out: list[str] = []
    while len(out) < need:
        options = [g for g, ds in free.items() if ds]
        if not options:
            break
        if policy is Policy.SPREAD:
            # fewest in use first; among equals, the GPU best linked to what this request already has
            gpu = min(options, key=lambda g: (load.get(g, 0), -links[g], g))
        else:
            gpu = min(options, key=lambda g: (-load.get(g, 0), g))
        out.append(free[gpu].popleft())
        load[gpu] = load.get(gpu, 0) + 1
        if gpu in topology.gpus:
            row = topology.nvlinks[topology.index(gpu)]
            for g, i in index.items():
                if g != gpu:
                    links[g] += row[i]
    return out


def _links_to(topology: Topology, gpu: str, others: Iterable[str]) -> int:
    if gpu not in topology.gpus:
        return 0
    i = topology.index(gpu)
    return sum(topology.nvlinks[i][topology.index(o)] for o in others if o in topology.gpus and o != gpu)
