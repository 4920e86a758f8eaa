"""Builder input from what the cluster offers: GPUNodes, Node labels, ibnetdiscover, a mapping file.

Pure: every function takes parsed data (dicts, strings) and returns :class:`~topology.builder.NodeFacts`
and switch uplinks. Where a node's leaf switches come from, first source that knows wins:

1. ``ibnetdiscover`` (cluster-side truth: the subnet's own view), matching the node's HCAs by GUID
   (from its GPUNode) or, failing that, by the host name in the HCA description;
2. the node's GPUNode: the switch GUIDs its ports cable to, where the agent could read them;
3. the static mapping file (``version: v1``; ``nodes: {node: [leaf, ...]}``,
   ``switches: {switch: [switch above, ...]}``);
4. node labels: topograph's ``fabric.topograph.run/tier-N`` (tier 0 = closest switch), its pre-1.0
   ``network.topology.nvidia.com/{leaf,spine,core}``, and cloud provider topology labels.

The NVLink domain comes from the GPUNode; a node without one may still join by its labels
(``nvidia.com/gpu.clique`` or topograph's ``accelerator.topograph.run/domain``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from topology import safeyaml
from topology.builder import NodeFacts, TopologyInput
from topology.fabrichealth import GpuFabricVerdict
from topology.ibnet import SwitchTree
from topology.labels import LABEL_CLIQUE, ib_leaf_switches
from topology.model import NodeInventory
from topology.names import normalize_guid
from topology.nvlink import CliqueKey, FabricStatus, nvlink_facts

TOPOGRAPH_DOMAIN = "accelerator.topograph.run/domain"

# Each scheme lists label keys closest switch first. The first scheme a node carries wins.
LABEL_SCHEMES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "topograph",
        ("fabric.topograph.run/tier-0", "fabric.topograph.run/tier-1", "fabric.topograph.run/tier-2"),
    ),
    (
        "topograph-v0",
        (
            "network.topology.nvidia.com/leaf",
            "network.topology.nvidia.com/spine",
            "network.topology.nvidia.com/core",
        ),
    ),
    (
        "aws",
        (
            "topology.k8s.aws/network-node-layer-3",
            "topology.k8s.aws/network-node-layer-2",
            "topology.k8s.aws/network-node-layer-1",
        ),
    ),
    ("gcp", ("cloud.google.com/gce-topology-subblock", "cloud.google.com/gce-topology-block")),
)

_CLIQUE_RE = re.compile(r"^([0-9a-fA-F-]{36})\.(\d+)$")


class SourceError(ValueError):
    """A fabric source that cannot be read; the message names it and the field."""


@dataclass(frozen=True, slots=True)
class StaticMapping:
    nodes: Mapping[str, frozenset[str]]
    uplinks: Mapping[str, frozenset[str]]


def parse_mapping(text: str, *, source: str = "<mapping>") -> StaticMapping:
    try:
        data = safeyaml.load(text, source=source)
    except safeyaml.InputError as exc:
        raise SourceError(str(exc)) from None
    if not isinstance(data, Mapping):
        raise SourceError(f"{source}: expected a mapping with version, nodes, switches")
    if data.get("version") != "v1":
        raise SourceError(f"{source}: version: expected 'v1', got {data.get('version')!r}")
    unknown = set(data) - {"version", "nodes", "switches"}
    if unknown:
        raise SourceError(f"{source}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")

    def table(key: str) -> dict[str, frozenset[str]]:
        raw = data.get(key) or {}
        if not isinstance(raw, Mapping):
            raise SourceError(f"{source}: {key}: expected a mapping of name -> list of switches")
        out: dict[str, frozenset[str]] = {}
        for name, value in raw.items():
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list) or not items or not all(isinstance(v, str) and v for v in items):
                raise SourceError(
                    f"{source}: {key}.{name}: expected a switch name or a non-empty list of them"
                )
            out[str(name)] = frozenset(items)
        return out

    return StaticMapping(nodes=table("nodes"), uplinks=table("switches"))


def facts_from_inventory(
    name: str, inventory: NodeInventory, verdicts: Sequence[GpuFabricVerdict] | None = None
) -> NodeFacts:
    """The node's facts; ``verdicts`` are its agent's published fabric levels (``GPUNode``
    ``status.fabric``), ``None`` for an older agent's object: then the default fabric policy judges."""
    facts = nvlink_facts(inventory, verdicts=verdicts)
    leaves = ib_leaf_switches(inventory)
    return NodeFacts(
        name=name,
        fabric=facts.status,
        clique=facts.clique,
        reason=facts.reason,
        leaves=leaves,
        fabric_source="gpunode" if leaves else "none",
    )


def facts_from_labels(name: str, labels: Mapping[str, str]) -> NodeFacts | None:
    """A node known only by its labels: its clique or topograph domain (``None`` if it has neither)."""
    clique = labels.get(LABEL_CLIQUE, "")
    m = _CLIQUE_RE.match(clique)
    if m:
        return NodeFacts(
            name=name, fabric=FabricStatus.OK, clique=CliqueKey(m.group(1).lower(), int(m.group(2)))
        )
    domain = labels.get(TOPOGRAPH_DOMAIN)
    if domain:
        return NodeFacts(name=name, domain_label=domain)
    return None


def label_path(labels: Mapping[str, str]) -> tuple[str, tuple[str, ...]] | None:
    """``(scheme, switch ids closest first)`` from the first label scheme the node carries."""
    for scheme, keys in LABEL_SCHEMES:
        path: list[str] = []
        for key in keys:
            value = labels.get(key)
            if not value:
                break
            path.append(f"{scheme}:{value}")
        if path:
            return scheme, tuple(path)
    return None


def host_guids(inventory: NodeInventory) -> set[str]:
    out: set[str] = set()
    for port in inventory.ib:
        for guid in (port.node_guid, port.port_guid, port.sys_image_guid):
            if guid:
                try:
                    out.add(normalize_guid(guid))
                except ValueError:
                    continue
    return out


def assemble(
    *,
    inventories: Mapping[str, NodeInventory],
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
    switch_tree: SwitchTree | None = None,
    mapping: StaticMapping | None = None,
    known_nodes: Iterable[str] | None = None,
    facts: Mapping[str, NodeFacts] | None = None,
) -> TopologyInput:
    """Builder input. ``known_nodes`` (the cluster's Node names) limits the nodes when given: a GPUNode
    whose Node is gone is not a member of anything. ``facts`` are :func:`facts_from_inventory` results
    computed earlier (the controller keeps them per GPUNode resourceVersion)."""
    labels_by_node = node_labels or {}
    allowed = set(known_nodes) if known_nodes is not None else None
    precomputed = facts or {}
    found: dict[str, NodeFacts] = {}
    for name, inv in inventories.items():
        if allowed is None or name in allowed:
            found[name] = precomputed.get(name) or facts_from_inventory(name, inv)
    for name, labels in labels_by_node.items():
        if name not in found and (allowed is None or name in allowed):
            f = facts_from_labels(name, labels)
            if f is not None:
                found[name] = f

    uplinks: dict[str, set[str]] = {}

    def add_up(table: Mapping[str, Iterable[str]]) -> None:
        for sw, ups in table.items():
            uplinks.setdefault(sw, set()).update(ups)

    ib_leaves: dict[str, frozenset[str]] = {}
    if switch_tree is not None:
        add_up(switch_tree.uplinks)
        by_guid: dict[str, str] = {}
        for name, inv in inventories.items():
            for guid in host_guids(inv):
                by_guid[guid] = name
        short = {n.split(".")[0]: n for n in sorted(found, reverse=True)}
        for ca, leaves in switch_tree.host_leaves.items():
            host = switch_tree.hosts.get(ca)
            node = by_guid.get(ca) or (host if host in found else None) or (short.get(host) if host else None)
            if node is not None:
                ib_leaves[node] = ib_leaves.get(node, frozenset()) | leaves
    if mapping is not None:
        add_up(mapping.uplinks)

    label_paths: dict[str, tuple[str, ...]] = {}
    for name, labels in labels_by_node.items():
        scheme_path = label_path(labels)
        if scheme_path is not None:
            path = scheme_path[1]
            label_paths[name] = path
            for lower, upper in itertools.pairwise(path):
                uplinks.setdefault(lower, set()).add(upper)

    out: list[NodeFacts] = []
    for name in sorted(found):
        f = found[name]
        if name in ib_leaves:
            f = replace(f, leaves=ib_leaves[name], fabric_source="ibnetdiscover")
        elif f.leaves:
            pass  # from its GPUNode
        elif mapping is not None and name in mapping.nodes:
            f = replace(f, leaves=mapping.nodes[name], fabric_source="mapping")
        elif name in label_paths:
            f = replace(f, leaves=frozenset({label_paths[name][0]}), fabric_source="labels")
        out.append(f)
    return TopologyInput(tuple(out), {k: frozenset(v) for k, v in sorted(uplinks.items())})


_LABEL_SCALARS = (str, int, float, bool)


def node_labels_of(obj: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """``(name, labels)`` of a Node object; a label whose value is not a scalar is left out (the API
    server never returns one; :func:`node_labels_problem` names it in files read offline)."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return "", {}
    labels = meta.get("labels")
    if not isinstance(labels, Mapping):
        labels = {}
    return str(meta.get("name", "")), {
        str(k): str(v) for k, v in labels.items() if isinstance(v, _LABEL_SCALARS)
    }


def node_labels_problem(obj: Mapping[str, Any]) -> str | None:
    """What is wrong with a Node object's ``metadata.labels`` (one line naming the key), or ``None``."""
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if labels is None:
        return None
    if not isinstance(labels, Mapping):
        return f"metadata.labels: expected a mapping, got {type(labels).__name__}"
    for key, value in labels.items():
        if not isinstance(value, _LABEL_SCALARS):
            return f"metadata.labels.{str(key)[:64]}: expected a string, got {type(value).__name__}"
    return None
