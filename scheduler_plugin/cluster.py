"""From Kubernetes API objects (plain dicts, as the API serves them) to a planner ``ClusterSnapshot``.

Pure: no client, no I/O. Nodes give allocatable ``nvidia.com/gpu`` (and cpu, memory); bound pods that
still hold resources give the used part; Volcano ``HyperNode`` CRs give the domain tree by tier. Where
no HyperNode covers a node at some tier, our node labels stand in (``gpuagent.dev/nvlink-domain``, else
GFD's ``nvidia.com/gpu.clique``; ``gpuagent.dev/ib-leaf``; ``gpuagent.dev/<tier>-domain``). A node
labelled ``gpuagent.dev/fabric-health=degraded`` (its agent's fabric policy: degraded bandwidth or a
recovery in progress) is ``degraded``: the planner ranks it after clean nodes of the same domain.

A node is ``ready`` for a multi-node NVLink subgroup (what ``subgroup_size: auto`` sizes and places by)
unless its agent says otherwise: ``gpuagent.dev/fabric-health=unhealthy``; a fabric-attached node (one
with a ``gpuagent.dev/fabric-health`` label) without GFD's ``nvidia.com/gpu.clique`` (withdrawn while
any GPU's fabric is not ``COMPLETED``/``SUCCESS``); or ``gpuagent.dev/imex`` other than ``ready`` or
``absent`` (no IMEX daemon installed: not an error).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from scheduler_plugin.snapshot import ClusterSnapshot, NodeState
from topology.model import GPU_RESOURCE

if TYPE_CHECKING:
    from scheduler_plugin.claims import ClaimBook

GPU = GPU_RESOURCE
CPU = "cpu"
MEMORY = "memory"
TRACKED = (CPU, MEMORY)
LABEL_FABRIC_HEALTH = "gpuagent.dev/fabric-health"  # topology.fabrichealth's label, read here as a string
LABEL_CLIQUE = "nvidia.com/gpu.clique"  # topology.labels' (GFD's) clique label
LABEL_IMEX = "gpuagent.dev/imex"  # topology.labels' IMEX label: ready, not-ready or absent

DEFAULT_TIER_NAMES = ("nvlink", "leaf", "spine", "core")  # ARCHITECTURE.md: tier 1..4
LABEL_FALLBACK: dict[str, tuple[str, ...]] = {
    "nvlink": ("gpuagent.dev/nvlink-domain", LABEL_CLIQUE),
    "leaf": ("gpuagent.dev/ib-leaf", "gpuagent.dev/leaf-domain"),
    "spine": ("gpuagent.dev/spine-domain",),
    "core": ("gpuagent.dev/core-domain",),
}

_SUFFIX: dict[str, Decimal | int] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes resource quantity (``"500m"``, ``"64Gi"``, ``4``) as a number; ``ValueError`` if bad."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str):
        raise ValueError(f"not a quantity: {value!r}")
    m = _QUANTITY.match(value.strip())
    if not m:
        raise ValueError(f"not a quantity: {value!r}")
    try:
        number = Decimal(m.group(1))
    except InvalidOperation:
        raise ValueError(f"not a quantity: {value!r}") from None
    return number * Decimal(_SUFFIX[m.group(2) or ""])


def _amount(resource: str, value: object) -> int:
    """Whole units: GPUs, cpu millicores, memory bytes (rounded up, as the scheduler counts them)."""
    if isinstance(value, str) and len(value) <= 18 and value.isascii() and value.isdigit():
        whole = int(value)  # "1", "4": most quantities, read on every watch event of a pod
        return whole * 1000 if resource == CPU else whole
    q = parse_quantity(value)
    if resource == CPU:
        q = q * 1000
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def get_in(obj: Mapping[str, Any], *path: str) -> Any:
    """``obj[path[0]][path[1]]...``, or ``None`` where a step is missing or not a mapping."""
    cur: Any = obj
    for p in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(p)
    return cur


def pod_key(pod: Mapping[str, Any]) -> str:
    return f"{get_in(pod, 'metadata', 'namespace') or 'default'}/{get_in(pod, 'metadata', 'name') or ''}"


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """Effective requests of a pod: max(sum of containers, largest init container) per resource.

    For extended resources such as ``nvidia.com/gpu`` a limit alone counts as the request.
    """

    def one(container: Mapping[str, Any]) -> dict[str, int]:
        res = container.get("resources") or {}
        out: dict[str, int] = {}
        limits = res.get("limits") or {}
        requests = res.get("requests") or {}
        for name in (GPU, *TRACKED):
            raw = requests.get(name)
            if raw is None and name == GPU:
                raw = limits.get(name)
            if raw is not None:
                try:
                    out[name] = _amount(name, raw)
                except ValueError:
                    continue
        return out

    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        for k, v in one(c).items():
            total[k] = total.get(k, 0) + v
    for c in spec.get("initContainers") or []:
        for k, v in one(c).items():
            total[k] = max(total.get(k, 0), v)
    return total


def holds_resources(pod: Mapping[str, Any]) -> bool:
    """A pod bound to a node that has not finished (Succeeded/Failed pods free their resources)."""
    return bool(get_in(pod, "spec", "nodeName")) and get_in(pod, "status", "phase") not in (
        "Succeeded",
        "Failed",
    )


def node_schedulable(node: Mapping[str, Any]) -> bool:
    if get_in(node, "spec", "unschedulable"):
        return False
    for cond in get_in(node, "status", "conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") != "True":
            return False
    return True


def fabric_attached(labels: Mapping[str, str]) -> bool:
    """Whether the node reports a multi-node NVLink fabric (its agent labels its fabric health)."""
    return LABEL_FABRIC_HEALTH in labels


def imex_ready(labels: Mapping[str, str]) -> bool:
    """Whether the node's IMEX label lets a multi-node NVLink job start there: ``ready``, or no IMEX
    daemon at all (``absent``, or no label). What the bind barrier waits for on every chosen tray."""
    return labels.get(LABEL_IMEX, "absent") in ("ready", "absent")


def node_ready(labels: Mapping[str, str]) -> bool:
    """Whether a node's labels say its NVLink fabric can carry a multi-node NVLink subgroup now: the one
    readiness rule (the snapshot's ``NodeState.ready``, which planning reads, and, through
    :func:`imex_ready`, the bind barrier)."""
    health = labels.get(LABEL_FABRIC_HEALTH)
    if health == "unhealthy":
        return False
    if health is not None and not labels.get(LABEL_CLIQUE):
        return False
    return imex_ready(labels)


def _tier_name(number: int, names: Mapping[int, str]) -> str:
    if number in names:
        return names[number]
    if 1 <= number <= len(DEFAULT_TIER_NAMES):
        return DEFAULT_TIER_NAMES[number - 1]
    return f"tier-{number}"


def hypernode_domains(
    hypernodes: Iterable[Mapping[str, Any]],
    node_names: Sequence[str],
    node_labels: Mapping[str, Mapping[str, str]],
) -> tuple[tuple[str, ...], dict[str, dict[str, str]]]:
    """Tier names (tier 1 first) and each node's domain per tier, from HyperNode CRs.

    Members: ``Node`` by ``exactMatch``/``regexMatch``/``labelMatch.matchLabels``; ``HyperNode`` by
    ``exactMatch`` (Volcano ignores the other selectors for HyperNode members).
    """
    hns = {str(get_in(h, "metadata", "name")): h for h in hypernodes if get_in(h, "metadata", "name")}
    tier_names: dict[int, str] = {}
    tiers_of: dict[str, int] = {}
    for name, h in hns.items():
        tier = get_in(h, "spec", "tier")
        if not isinstance(tier, int) or isinstance(tier, bool):
            continue
        tiers_of[name] = tier
        tn = get_in(h, "spec", "tierName")
        if isinstance(tn, str) and tn and tier not in tier_names:
            tier_names[tier] = tn

    resolved: dict[str, set[str]] = {}

    def nodes_of(name: str, stack: tuple[str, ...]) -> set[str]:
        if name in resolved:
            return resolved[name]
        if name in stack:  # a cycle: Volcano rejects it; we ignore the back edge
            return set()
        out: set[str] = set()
        for member in get_in(hns[name], "spec", "members") or []:
            sel = member.get("selector") or {}
            if member.get("type") == "HyperNode":
                child = get_in(sel, "exactMatch", "name")
                if isinstance(child, str) and child in hns:
                    out |= nodes_of(child, (*stack, name))
                continue
            exact = get_in(sel, "exactMatch", "name")
            if isinstance(exact, str):
                if exact in node_labels:
                    out.add(exact)
                continue
            pattern = get_in(sel, "regexMatch", "pattern")
            if isinstance(pattern, str):
                try:
                    rx = re.compile(pattern)
                except re.error:
                    continue
                out |= {n for n in node_names if rx.match(n)}
                continue
            match_labels = get_in(sel, "labelMatch", "matchLabels")
            if isinstance(match_labels, Mapping) and match_labels:
                out |= {
                    n for n in node_names if all(node_labels[n].get(k) == v for k, v in match_labels.items())
                }
        resolved[name] = out
        return out

    domains: dict[str, dict[str, str]] = {n: {} for n in node_names}
    for name in sorted(hns):
        if name not in tiers_of:
            continue
        tname = _tier_name(tiers_of[name], tier_names)
        for n in nodes_of(name, ()):
            domains[n].setdefault(tname, name)
    numbers = sorted(set(tiers_of.values()))
    return tuple(_tier_name(t, tier_names) for t in numbers), domains


def base_state(node: Mapping[str, Any], domains: Mapping[str, str]) -> NodeState:
    """A Node object as the planner sees it with nothing used: allocatable GPUs, CPU and memory (a value
    that is no quantity counts as none), its ``domains``, whether it is schedulable, whether its fabric
    is degraded."""
    alloc = get_in(node, "status", "allocatable") or {}
    res_alloc: dict[str, int] = {}
    for r in (GPU, *TRACKED):
        if r in alloc:
            try:
                res_alloc[r] = _amount(r, alloc[r])
            except ValueError:
                res_alloc[r] = 0
    gpus = res_alloc.pop(GPU, 0)
    labels = get_in(node, "metadata", "labels") or {}
    return NodeState(
        name=str(get_in(node, "metadata", "name")),
        gpus=gpus,
        free=gpus,
        domains=dict(domains),
        resources=res_alloc,
        free_resources=res_alloc,
        schedulable=node_schedulable(node),
        degraded=labels.get(LABEL_FABRIC_HEALTH) == "degraded",
        ready=node_ready(labels),
    )


def node_state(base: NodeState, used: Mapping[str, int], held: Mapping[str, int] | None = None) -> NodeState:
    """``base`` (a node with nothing used) less what bound pods ``used`` and gangs ``held`` there: the
    one free-resources formula of a node (never below zero)."""
    held = held or {}
    gpus = used.get(GPU, 0) + held.get(GPU, 0)
    free_resources = {r: max(0, v - used.get(r, 0) - held.get(r, 0)) for r, v in base.resources.items()}
    if not gpus and free_resources == base.free_resources and base.free == base.gpus:
        return base
    return replace(base, free=max(0, base.gpus - gpus), free_resources=free_resources)


def snapshot_from_objects(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    hypernodes: Iterable[Mapping[str, Any]] = (),
    *,
    reserved: Mapping[str, Mapping[str, int]] | None = None,
    previous: ClusterSnapshot | None = None,
    claims: ClaimBook | None = None,
) -> ClusterSnapshot:
    """A snapshot of the cluster: free = allocatable - requests of bound, unfinished pods - ``reserved``.

    ``reserved`` maps a node name to resources held for gangs that are planned but not bound yet.
    ``previous``: an earlier snapshot whose ``NodeState`` objects are reused where a node's state is
    equal, so the planner, which diffs snapshots by object identity, recomputes only what changed.
    ``claims``: the DRA objects (:mod:`scheduler_plugin.claims`, a book of them), counted as the extender
    counts them: a node has its pool's GPUs besides allocatable, uses its claims' allocations, and a
    bound pod uses its requests (mapped extended resources as GPUs) less what it gets through claims.
    """
    if claims is not None:  # claims imports this module: read here, not at import
        from scheduler_plugin.claims import claimed, with_gpus  # noqa: PLC0415
    node_list = [n for n in nodes if get_in(n, "metadata", "name")]
    names = sorted(str(get_in(n, "metadata", "name")) for n in node_list)
    labels = {
        str(get_in(n, "metadata", "name")): dict(get_in(n, "metadata", "labels") or {}) for n in node_list
    }
    used: dict[str, dict[str, int]] = {}
    for pod in pods:
        if not holds_resources(pod):
            continue
        u = used.setdefault(str(get_in(pod, "spec", "nodeName")), {})
        requests = pod_requests(pod)
        if claims is not None:
            key = f"{get_in(pod, 'metadata', 'namespace') or 'default'}/{get_in(pod, 'metadata', 'name')}"
            projected = claims.with_claims(key, pod)
            requests = pod_requests(projected)
            through = claimed(projected)
            if through:
                requests[GPU] = max(0, requests.get(GPU, 0) - through)
        for k, v in requests.items():
            u[k] = u.get(k, 0) + v
    if claims is not None:
        for name in names:
            if claims.used(name):
                u = used.setdefault(name, {})
                u[GPU] = u.get(GPU, 0) + claims.used(name)
    for node_name, res in (reserved or {}).items():
        u = used.setdefault(node_name, {})
        for k, v in res.items():
            u[k] = u.get(k, 0) + v
    tiers, hn_domains = hypernode_domains(hypernodes, names, labels)
    tier_list = list(tiers)
    # label fallback for tiers no HyperNode covers on some node
    for tname in DEFAULT_TIER_NAMES:
        keys = LABEL_FALLBACK[tname]
        for n in names:
            if tname in hn_domains[n]:
                continue
            for key in keys:
                value = labels[n].get(key)
                if value:
                    hn_domains[n][tname] = value
                    if tname not in tier_list:
                        tier_list.append(tname)
                    break
    order = {t: i for i, t in enumerate(DEFAULT_TIER_NAMES)}
    if not tiers:
        tier_list.sort(key=lambda t: order.get(t, len(order)))
    before = {n.name: n for n in previous.nodes} if previous is not None else {}
    states: list[NodeState] = []
    for node in node_list:
        name = str(get_in(node, "metadata", "name"))
        base = base_state(node, hn_domains.get(name, {}))
        if claims is not None:
            base = with_gpus(base, claims.capacity(name))
        state = node_state(base, used.get(name, {}))
        old = before.get(name)
        states.append(old if old is not None and old == state else state)
    return ClusterSnapshot(tiers=tuple(tier_list), nodes=tuple(sorted(states, key=lambda s: s.name)))
