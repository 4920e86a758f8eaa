"""Exports of one HyperNode tree for other schedulers. Pure: a :class:`~topology.builder.Tree` in, text
or plain objects out.

- **Kueue**: a ``Topology`` CR whose levels are node labels, top tier first and ``kubernetes.io/hostname``
  last: ``gpuagent.dev/topology-<tier>`` for the switch tiers, and for the NVLink tier the agent's own
  ``gpuagent.dev/nvlink-domain`` (the key users write in ``podset-required-topology``, the same one the
  extender and kube-scheduler's native gang API read), plus the ``gpuagent.dev/topology-<tier>`` labels for
  every node (partial ``Node`` objects that ``kubectl apply --server-side`` can apply). Tiers no node
  reaches are left out of the levels.
- **labels**: the same ``gpuagent.dev/topology-<tier>`` labels and topograph-compatible ones:
  ``accelerator.topograph.run/domain`` (``<clusterUuid>.<cliqueId>`` for a clique, else the tier-1
  name) and ``fabric.topograph.run/tier-N`` (tier 0 = the leaf domain, then spine, core).
- **Slurm** ``topology.conf``: *block* form (one ``BlockName`` per NVLink domain, blocks ordered so that
  neighbours share switches, ``BlockSizes`` = smallest block times powers of two up to the block count,
  as topograph infers it) or *tree* form (one ``SwitchName`` per HyperNode; tier-1 domains list Nodes).

A node that hangs under a common switch rather than a leaf simply lacks the leaf-level label; Kueue
then leaves it out of that level's domains.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from topology.builder import LEAF, NVLINK, Tree
from topology.labels import LABEL_NVLINK_DOMAIN
from topology.model import TIERS
from topology.names import topograph_value

TOPOLOGY_LABEL_PREFIX = "gpuagent.dev/topology-"
HOSTNAME = "kubernetes.io/hostname"
KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"
TOPOGRAPH_DOMAIN = "accelerator.topograph.run/domain"
TOPOGRAPH_TIER = "fabric.topograph.run/tier-"

_TAIL = re.compile(r"^(.*?)(\d+)$")


def topology_label(tier: str) -> str:
    return f"{TOPOLOGY_LABEL_PREFIX}{tier}"


def tiers_used(tree: Tree) -> tuple[str, ...]:
    present = {h.tier_name for h in tree.hypernodes.values()}
    return tuple(t for t in TIERS if t in present)


def topology_labels(tree: Tree) -> dict[str, dict[str, str]]:
    """``{node: {gpuagent.dev/topology-<tier>: HyperNode name}}`` for every node in the tree."""
    return {
        node: {topology_label(tier): name for tier, name in tree.ancestors(node).items()}
        for node in sorted(tree.node_domain)
    }


def topograph_labels(tree: Tree) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for node in sorted(tree.node_domain):
        path = tree.ancestors(node)
        labels: dict[str, str] = {}
        t1 = tree.hypernodes[path[NVLINK]]
        domain = t1.identity.removeprefix("clique ") if t1.identity.startswith("clique ") else t1.name
        labels[TOPOGRAPH_DOMAIN] = topograph_value(domain)
        for i, tier in enumerate(TIERS[TIERS.index(LEAF) :]):
            if tier in path:
                labels[f"{TOPOGRAPH_TIER}{i}"] = topograph_value(path[tier])
        out[node] = labels
    return out


def node_label_objects(labels: Mapping[str, Mapping[str, str]]) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": dict(sorted(ls.items()))}}
        for node, ls in sorted(labels.items())
    ]


def kueue_objects(
    tree: Tree, *, name: str = "gpu-node-agent", api_version: str = KUEUE_API_VERSION
) -> list[dict[str, Any]]:
    levels = [
        {"nodeLabel": LABEL_NVLINK_DOMAIN if t == NVLINK else topology_label(t)}
        for t in reversed(tiers_used(tree))
    ]
    levels.append({"nodeLabel": HOSTNAME})
    topology = {
        "apiVersion": api_version,
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": levels},
    }
    return [topology, *node_label_objects(topology_labels(tree))]


def labels_objects(tree: Tree) -> list[dict[str, Any]]:
    ours = topology_labels(tree)
    theirs = topograph_labels(tree)
    return node_label_objects({n: {**ours[n], **theirs[n]} for n in ours})


def yaml_stream(objects: Iterable[Mapping[str, Any]]) -> str:
    return yaml.safe_dump_all([dict(o) for o in objects], sort_keys=False, width=120)


# --------------------------------------------------------------------------- Slurm


def hostlist(names: Iterable[str]) -> str:
    """Slurm hostlist expression: ``gpu001,gpu002,gpu003,gpu007`` -> ``gpu[001-003,007]``."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    split: list[tuple[str, str]] = []
    for name in sorted(set(names)):
        m = _TAIL.match(name)
        if m is None:
            plain.append(name)
        else:
            split.append((m.group(1), m.group(2)))
    padded = {p for p, d in split if d.startswith("0") and len(d) > 1}
    for prefix, digits in split:
        width = len(digits) if prefix in padded else 0
        groups.setdefault((prefix, width), []).append(int(digits))
    parts: list[str] = list(plain)
    for (prefix, width), numbers in sorted(groups.items()):
        numbers.sort()
        runs: list[tuple[int, int]] = []
        for n in numbers:
            if runs and n == runs[-1][1] + 1:
                runs[-1] = (runs[-1][0], n)
            else:
                runs.append((n, n))

        def fmt(n: int, width: int = width) -> str:
            return str(n).zfill(width) if width else str(n)

        if len(numbers) == 1:
            parts.append(f"{prefix}{fmt(numbers[0])}")
            continue
        body = ",".join(fmt(a) if a == b else f"{fmt(a)}-{fmt(b)}" for a, b in runs)
        parts.append(f"{prefix}[{body}]")
    return ",".join(sorted(parts))


def _domain_order(tree: Tree) -> list[str]:
    """Tier-1 domains in tree order (depth-first from the roots, children by name)."""
    children: dict[str | None, list[str]] = {}
    for name in tree.hypernodes:
        children.setdefault(tree.parent.get(name), []).append(name)
    order: list[str] = []

    def walk(name: str) -> None:
        if tree.hypernodes[name].tier_name == NVLINK:
            order.append(name)
        for child in sorted(children.get(name, ()), key=first_node):
            walk(child)

    def first_node(name: str) -> tuple[str, str]:
        return (min(tree.nodes_under(name), default=""), name)

    for root in sorted(children.get(None, ()), key=first_node):
        walk(root)
    return order


def block_sizes(sizes: Iterable[int]) -> list[int]:
    sizes = list(sizes)
    if not sizes:
        return []
    base = min(sizes)
    out = [base]
    while out[-1] * 2 <= base * len(sizes):
        out.append(out[-1] * 2)
    return out


def slurm_topology(tree: Tree, *, form: str = "block") -> str:
    if form not in ("block", "tree"):
        raise ValueError(f"slurm form {form!r}: valid: block, tree")
    lines = [f"# topology.conf ({form} form) generated by gpu-node-agent from its HyperNode tree"]
    if form == "block":
        order = _domain_order(tree)
        for name in order:
            lines.append(f"BlockName={name} Nodes={hostlist(tree.hypernodes[name].members)}")
        sizes = block_sizes(len(tree.hypernodes[n].members) for n in order)
        if sizes:
            lines.append(f"BlockSizes={','.join(str(s) for s in sizes)}")
        return "\n".join(lines) + "\n"
    for name, h in sorted(tree.hypernodes.items(), key=lambda kv: (kv[1].tier, kv[0])):
        kind = "Nodes" if h.tier_name == NVLINK else "Switches"
        lines.append(f"SwitchName={name} {kind}={hostlist(h.members)}")
    return "\n".join(lines) + "\n"
