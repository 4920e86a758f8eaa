"""The HyperNode tree from nodes' facts, and the diff against what the cluster holds. Pure.

Tiers (ARCHITECTURE.md): 1 ``nvlink``, 2 ``leaf``, 3 ``spine``, 4 ``core``.

- **nvlink**: an NVL72 clique keyed by ``(clusterUuid, cliqueId)``; a node without a multi-node fabric
  (an 8-GPU NVSwitch board, a PCIe box) is its own domain. Members are Nodes by exact name.
- **leaf**: the nodes that share the same *set* of leaf switches (rail-optimised fabrics cable NIC *k*
  of every node in a group to the group's rail-*k* leaf, so the set, not one switch, is the domain).
  Leaves with identical node sets therefore merge into one domain. A node that lost links (its set is a
  strict subset of exactly one other, larger set) stays in that larger domain.
- **spine** / **core**: a leaf domain's spine set is the union of its leaves' uplinks; leaf domains with
  the same spine set merge into one spine domain, and spines merge into core domains the same way.

Every HyperNode has at most one parent. A tier-1 domain whose members sit under different leaf domains
hangs under their lowest common switch domain (spine, then core); when there is none (or some member
has no fabric information) it is a root. A leaf domain without uplinks is a root, and so on up.

Nodes whose fabric is not ``COMPLETED``, whose GPUs disagree, or whose fabric is ``UNHEALTHY`` are
left out of their NVLink domain; :class:`FabricPolicy` decides whether they become a domain of their
own (``isolate``, the default: they stay under their leaf), leave the tree (``exclude``) or stay
(``keep``). The reason is in :attr:`Tree.excluded`.

Names are derived from identity (:mod:`topology.names`), members are sorted, ties are broken by name,
so the same facts in any order give the same tree.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from topology.model import TIERS
from topology.names import bounded, clique_domain_name, node_domain_name, switch_set_name
from topology.nvlink import CliqueKey, FabricStatus

HYPERNODE_API_VERSION = "topology.volcano.sh/v1alpha1"
HYPERNODE_KIND = "HyperNode"
SOURCE_LABEL = "volcano.sh/network-topology-source"
SOURCE_VALUE = "gpu-node-agent"
IDENTITY_ANNOTATION = "gpuagent.dev/identity"
TIER_LABEL = "gpuagent.dev/tier"

NVLINK, LEAF, SPINE, CORE = TIERS  # "nvlink", "leaf", "spine", "core"
TIER_NUMBER = {name: i + 1 for i, name in enumerate(TIERS)}


class FabricPolicy(enum.StrEnum):
    ISOLATE = "isolate"  # own tier-1 domain; still under its leaf
    EXCLUDE = "exclude"  # not in the tree at all
    KEEP = "keep"  # stays in its clique (only possible when the clique is known)


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the builder knows about one node."""

    name: str
    fabric: FabricStatus = FabricStatus.NONE
    clique: CliqueKey | None = None  # agreed clique (OK or UNHEALTHY)
    domain_label: str | None = None  # NVLink domain from a label (topograph), when no GPUNode says more
    reason: str | None = None  # why the fabric is not OK
    leaves: frozenset[str] = frozenset()  # leaf switches its ports cable to; empty = unknown
    fabric_source: str = "none"  # where ``leaves`` came from: ibnetdiscover, gpunode, mapping, labels


@dataclass(frozen=True, slots=True)
class TopologyInput:
    nodes: tuple[NodeFacts, ...]
    uplinks: Mapping[str, frozenset[str]] = field(default_factory=dict)  # switch -> switches above


@dataclass(frozen=True, slots=True)
class HyperNode:
    name: str
    tier_name: str
    members: tuple[str, ...]  # sorted; Nodes for tier 1, HyperNodes above
    identity: str  # what the name stands for, for the operator

    @property
    def tier(self) -> int:
        return TIER_NUMBER[self.tier_name]

    @property
    def member_type(self) -> str:
        return "Node" if self.tier_name == NVLINK else "HyperNode"


@dataclass(frozen=True, slots=True)
class Tree:
    hypernodes: Mapping[str, HyperNode]  # by name, tier 1 first then by name
    parent: Mapping[str, str]  # HyperNode -> its parent HyperNode
    node_domain: Mapping[str, str]  # Node -> its tier-1 HyperNode
    excluded: Mapping[str, str]  # Node -> why it is not in its NVLink domain (or not in the tree)
    notes: tuple[str, ...] = ()  # irregularities worth a log line (domains hung under a common switch)

    def ancestors(self, node: str) -> dict[str, str]:
        """``{tier name: HyperNode}`` from the node's tier-1 domain up to its root."""
        out: dict[str, str] = {}
        current = self.node_domain.get(node)
        while current is not None:
            out[self.hypernodes[current].tier_name] = current
            current = self.parent.get(current)
        return out

    def nodes_under(self, name: str) -> tuple[str, ...]:
        h = self.hypernodes[name]
        if h.tier_name == NVLINK:
            return h.members
        return tuple(sorted(n for m in h.members for n in self.nodes_under(m)))


# --------------------------------------------------------------------------- build


def build_tree(data: TopologyInput, *, policy: FabricPolicy = FabricPolicy.ISOLATE) -> Tree:
    nodes = sorted(data.nodes, key=lambda n: n.name)
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"node(s) listed twice: {', '.join(dup[:5])}")

    notes: list[str] = []
    leaf_key = _leaf_keys(nodes, notes)

    # tier 1
    t1_members: dict[str, list[NodeFacts]] = {}
    t1_identity: dict[str, str] = {}
    node_domain: dict[str, str] = {}
    excluded: dict[str, str] = {}
    for n in nodes:
        domain: str | None
        if n.fabric is FabricStatus.NONE and n.domain_label is None:
            domain, ident = node_domain_name(n.name), f"node {n.name}"
        elif n.fabric is FabricStatus.NONE and n.domain_label is not None:
            domain, ident = bounded("nvl", n.domain_label), f"label {n.domain_label}"
        elif n.fabric is FabricStatus.OK and n.clique is not None:
            domain, ident = clique_domain_name(n.clique), f"clique {n.clique}"
        elif policy is FabricPolicy.KEEP and n.clique is not None:
            domain, ident = clique_domain_name(n.clique), f"clique {n.clique}"
            excluded[n.name] = f"{n.reason or n.fabric.value}; kept in its clique (policy keep)"
        elif policy is FabricPolicy.EXCLUDE:
            excluded[n.name] = f"{n.reason or n.fabric.value}; left out of the tree (policy exclude)"
            continue
        else:
            domain, ident = node_domain_name(n.name), f"node {n.name} (isolated)"
            excluded[n.name] = f"{n.reason or n.fabric.value}; isolated in its own NVLink domain"
        t1_members.setdefault(domain, []).append(n)
        t1_identity[domain] = ident
        node_domain[n.name] = domain

    hypernodes: dict[str, HyperNode] = {}
    parent: dict[str, str] = {}
    children: dict[tuple[str, frozenset[str]], set[str]] = {}  # (tier, switch set) -> child names

    def up(switches: Iterable[str]) -> frozenset[str]:
        return frozenset(s for sw in switches for s in data.uplinks.get(sw, ()))

    for domain in sorted(t1_members):
        members = t1_members[domain]
        hypernodes[domain] = HyperNode(domain, NVLINK, tuple(m.name for m in members), t1_identity[domain])
        leaf_sets = {leaf_key[m.name] for m in members}
        if frozenset() in leaf_sets:
            if len(leaf_sets) > 1:
                notes.append(f"{domain}: some members have no fabric information; left as a root")
            continue
        if len(leaf_sets) == 1:
            children.setdefault((LEAF, next(iter(leaf_sets))), set()).add(domain)
            continue
        # members under several leaf domains: hang it under the lowest common switch domain
        level_sets: set[frozenset[str]] = set(leaf_sets)
        placed = False
        for tier in (SPINE, CORE):
            level_sets = {up(s) for s in level_sets}
            if frozenset() in level_sets:
                break
            if len(level_sets) == 1:
                children.setdefault((tier, next(iter(level_sets))), set()).add(domain)
                notes.append(f"{domain}: members span {len(leaf_sets)} leaf domains; hung under {tier}")
                placed = True
                break
        if not placed:
            notes.append(f"{domain}: members span {len(leaf_sets)} leaf domains with no common switch; root")

    for tier, above in ((LEAF, SPINE), (SPINE, CORE), (CORE, None)):
        for tkey in sorted((k for k in children if k[0] == tier), key=lambda k: sorted(k[1])):
            name = switch_set_name(tier, tkey[1])
            kids = children[tkey]
            hypernodes[name] = HyperNode(
                name, tier, tuple(sorted(kids)), f"{tier} switches {','.join(sorted(tkey[1]))}"
            )
            for kid in kids:
                parent[kid] = name
            if above is not None:
                ups = up(tkey[1])
                if ups:
                    children.setdefault((above, ups), set()).add(name)

    ordered = dict(sorted(hypernodes.items(), key=lambda kv: (kv[1].tier, kv[0])))
    return Tree(
        ordered, dict(sorted(parent.items())), node_domain, dict(sorted(excluded.items())), tuple(notes)
    )


def _leaf_keys(nodes: list[NodeFacts], notes: list[str]) -> dict[str, frozenset[str]]:
    """Each node's leaf-domain key: its set of leaf switches, except that a node which lost links (its
    set is a strict subset of exactly one larger set other nodes have) stays in that larger domain, so
    one dead cable does not pull a node, and its NVLink domain, out of its leaf."""
    keys = {n.leaves for n in nodes if n.leaves}
    maximal = [k for k in keys if not any(k < other for other in keys)]
    by_switch: dict[str, list[frozenset[str]]] = {}
    for k in maximal:
        for sw in k:
            by_switch.setdefault(sw, []).append(k)
    out: dict[str, frozenset[str]] = {}
    for n in nodes:
        key = n.leaves
        if key and key not in maximal:
            candidates = {k for sw in key for k in by_switch.get(sw, ()) if key < k}
            if len(candidates) == 1:
                (key,) = candidates
                missing = ", ".join(sorted(key - n.leaves))
                notes.append(f"{n.name}: no link to leaf switch(es) {missing}; kept in their leaf domain")
        out[n.name] = key
    return out


# --------------------------------------------------------------------------- objects and diff


def hypernode_object(h: HyperNode) -> dict[str, Any]:
    return {
        "apiVersion": HYPERNODE_API_VERSION,
        "kind": HYPERNODE_KIND,
        "metadata": {
            "name": h.name,
            "labels": {SOURCE_LABEL: SOURCE_VALUE, TIER_LABEL: h.tier_name},
            "annotations": {IDENTITY_ANNOTATION: h.identity},
        },
        "spec": {
            "tier": h.tier,
            "tierName": h.tier_name,
            "members": [{"type": h.member_type, "selector": {"exactMatch": {"name": m}}} for m in h.members],
        },
    }


def desired_objects(tree: Tree) -> dict[str, dict[str, Any]]:
    return {name: hypernode_object(h) for name, h in tree.hypernodes.items()}


def is_ours(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(SOURCE_LABEL) == SOURCE_VALUE)


@dataclass(frozen=True, slots=True)
class Diff:
    apply: tuple[dict[str, Any], ...]  # to create or update, lower tiers first
    delete: tuple[str, ...]  # our HyperNodes no longer wanted, higher tiers first
    conflicts: tuple[str, ...]  # wanted names held by HyperNodes that are not ours: left alone
    unchanged: int

    @property
    def writes(self) -> int:
        return len(self.apply) + len(self.delete)


def _managed(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """The fields we own: spec and our label/annotation keys (other writers' additions are ignored)."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    spec = obj.get("spec") or {}
    members = tuple(
        (
            m.get("type"),
            ((m.get("selector") or {}).get("exactMatch") or {}).get("name"),
            len(m.get("selector") or {}),
        )
        for m in spec.get("members") or ()
    )
    return (
        spec.get("tier"),
        spec.get("tierName"),
        members,
        labels.get(SOURCE_LABEL),
        labels.get(TIER_LABEL),
        annotations.get(IDENTITY_ANNOTATION),
    )


def diff(desired: Mapping[str, Mapping[str, Any]], observed: Mapping[str, Mapping[str, Any]]) -> Diff:
    """Writes that bring ``observed`` to ``desired``, touching only HyperNodes labelled as ours."""
    apply: list[dict[str, Any]] = []
    conflicts: list[str] = []
    unchanged = 0
    for name in sorted(desired, key=lambda n: (desired[n]["spec"]["tier"], n)):
        want = desired[name]
        have = observed.get(name)
        if have is None:
            apply.append(dict(want))
        elif not is_ours(have):
            conflicts.append(name)
        elif _managed(want) != _managed(have):
            apply.append(dict(want))
        else:
            unchanged += 1
    stale = [n for n, obj in observed.items() if n not in desired and is_ours(obj)]
    stale.sort(key=lambda n: (-int((observed[n].get("spec") or {}).get("tier") or 0), n))
    return Diff(tuple(apply), tuple(stale), tuple(conflicts), unchanged)
