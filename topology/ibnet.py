"""``ibnetdiscover`` topology files into a switch tree (leaf, spine, core). Pure: text in, data out.

Reads the default topology-file format (``ibnetdiscover`` without ``-p``), and the one-line-per-port
``--ports`` format (see :func:`_parse_ports`). The default format has node blocks with
``vendid=``/``devid=``/``sysimgguid=``/``switchguid=``/``caguid=`` headers, a ``Switch``/``Ca``/``Rt``
line and one line per connected port. Switch tiers are assigned by distance from the hosts: a switch
with a host port is a *leaf*, one hop above the leaves a *spine*, above the spines *core* (anything
higher counts as core). SHARP aggregation nodes and routers are not hosts.

A CA's host name comes from its node description (``"<hostname> <device>"``); an HCA whose description
was never set (``"MT4129 ConnectX7   Mellanox Technologies"``) has none and is matched to a node by
GUID from that node's ``GPUNode`` instead (see :func:`topology.sources.fabric_from_ibnet`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from topology.names import normalize_guid

LEAF, SPINE, CORE = 1, 2, 3
TIER_OF_LEVEL = {LEAF: "leaf", SPINE: "spine", CORE: "core"}

_NODE = re.compile(r'^(Switch|Ca|Rt)\s+(\d+)\s+"([SHR])-([0-9a-fA-F]+)"\s*(?:#\s*"([^"]*)"(.*))?$')
_PORT = re.compile(
    r'^\[(\d+)\](?:\(([0-9a-fA-F]+)\))?\s*"([SHR])-([0-9a-fA-F]+)"\[(\d+)\](?:\(([0-9a-fA-F]+)\))?\s*'
    r"(?:#\s*(.*))?$"
)
_HEADER = re.compile(r"^(vendid|devid|sysimgguid|switchguid|caguid|routerguid)=\S+$")
_QUOTED = re.compile(r'"([^"]*)"')


MAX_PORT_DIGITS = 6  # a switch has at most a few hundred ports


class IbnetError(ValueError):
    """A line that is not ibnetdiscover output; the message names the source and line."""


@dataclass(frozen=True, slots=True)
class IbNode:
    guid: str  # 16 lowercase hex digits
    kind: str  # "switch", "ca", "router"
    description: str
    ports: int = 0

    @property
    def host(self) -> str | None:
        """The host name in a CA's description, ``None`` for switches and unset descriptions."""
        if self.kind != "ca":
            return None
        desc = self.description.strip()
        if not desc or "Mellanox Technologies" in desc or re.match(r"^MT\d+\b", desc):
            return None
        return desc.split()[0]


@dataclass(slots=True)
class IbFabric:
    """Nodes by GUID and undirected links between them (port numbers are not needed for the tree)."""

    nodes: dict[str, IbNode] = field(default_factory=dict)
    links: set[tuple[str, str]] = field(default_factory=set)

    def neighbours(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {g: set() for g in self.nodes}
        for a, b in self.links:
            out.setdefault(a, set()).add(b)
            out.setdefault(b, set()).add(a)
        return out

    def merge(self, other: IbFabric) -> None:
        for guid, node in other.nodes.items():
            mine = self.nodes.get(guid)
            if mine is None or (not mine.description and node.description):
                self.nodes[guid] = node
        self.links |= other.links


@dataclass(frozen=True, slots=True)
class SwitchTree:
    """What the HyperNode builder needs from a fabric.

    ``host_leaves`` maps a CA GUID to the leaf switches it cables to; ``uplinks`` maps a switch to the
    switches one tier above it; ``tier`` gives each switch its level (1 leaf, 2 spine, 3 core);
    ``hosts`` maps a CA GUID to the host name in its description (where set); ``descriptions`` keeps
    switch descriptions for readable reports.
    """

    host_leaves: Mapping[str, frozenset[str]]
    uplinks: Mapping[str, frozenset[str]]
    tier: Mapping[str, int]
    hosts: Mapping[str, str]
    descriptions: Mapping[str, str]


_PORTS_LINE = re.compile(
    r"^(CA|SW|RT)\s+(\d+)\s+(\d+)\s+(0x[0-9a-fA-F]+)\s+\S+\s+\S+"
    r"(?:\s+-\s+(CA|SW|RT)\s+(\d+)\s+(\d+)\s+(0x[0-9a-fA-F]+)\s+\(\s*'([^']*)'\s+-\s+'([^']*)'\s*\))?"
    r"(?:\s+'([^']*)')?\s*$"
)
_PORTS_KIND = {"CA": "ca", "SW": "switch", "RT": "router"}


def _parse_ports(text: str, source: str) -> IbFabric:
    """``ibnetdiscover -p``: one line per port, ``<type> <lid> <port> <guid> <width> <speed> - <peer
    type> <lid> <port> <guid> ( '<desc>' - '<peer desc>' )``; unconnected ports end in ``'<desc>'``.
    Port GUIDs stand for their nodes (a CA port GUID equals its node GUID on single-port HCAs)."""
    fabric = IbFabric()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _PORTS_LINE.match(line)
        if m is None:
            raise IbnetError(f"{source}:{lineno}: not ibnetdiscover --ports output: {line[:80]!r}")
        guid = _guid(m.group(4), source, lineno)
        desc = m.group(9) if m.group(5) else (m.group(11) or "")
        if guid not in fabric.nodes or (desc and not fabric.nodes[guid].description):
            fabric.nodes[guid] = IbNode(guid, _PORTS_KIND[m.group(1)], desc)
        if m.group(5):
            peer = _guid(m.group(8), source, lineno)
            if peer not in fabric.nodes or not fabric.nodes[peer].description:
                fabric.nodes[peer] = IbNode(peer, _PORTS_KIND[m.group(5)], m.group(10))
            a, b = sorted((guid, peer))
            fabric.links.add((a, b))
    return fabric


def parse_ibnetdiscover(text: str, *, source: str = "<ibnetdiscover>") -> IbFabric:
    """Either format: the default topology file, or ``--ports`` (``-p``) output."""
    first = next(
        (ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")), ""
    )
    if first[:3] in ("CA ", "SW ", "RT "):
        return _parse_ports(text, source)
    fabric = IbFabric()
    current: IbNode | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if _HEADER.match(line):
            current = None if line.startswith("vendid=") else current
            continue
        m = _NODE.match(line)
        if m:
            kind = {"Switch": "switch", "Ca": "ca", "Rt": "router"}[m.group(1)]
            guid = _guid(m.group(4), source, lineno)
            ports = m.group(2)
            if len(ports) > MAX_PORT_DIGITS:
                raise IbnetError(
                    f"{source}:{lineno}: port count of {len(ports)} digits (the limit is {MAX_PORT_DIGITS})"
                )
            current = IbNode(guid, kind, m.group(5) or "", int(ports))
            fabric.merge(IbFabric(nodes={guid: current}))
            continue
        m = _PORT.match(line)
        if m:
            if current is None:
                raise IbnetError(f"{source}:{lineno}: port line before any Switch/Ca line: {line[:80]!r}")
            peer_kind = {"S": "switch", "H": "ca", "R": "router"}[m.group(3)]
            peer = _guid(m.group(4), source, lineno)
            comment = m.group(7) or ""
            quoted = _QUOTED.findall(comment)
            # switch port lines describe the peer first; CA port lines the peer switch after "lid N lmc M"
            desc = quoted[0] if quoted else ""
            if peer not in fabric.nodes or (desc and not fabric.nodes[peer].description):
                fabric.nodes[peer] = IbNode(peer, peer_kind, desc)
            a, b = sorted((current.guid, peer))
            fabric.links.add((a, b))
            continue
        raise IbnetError(f"{source}:{lineno}: not ibnetdiscover topology output: {line[:80]!r}")
    return fabric


def _guid(text: str, source: str, lineno: int) -> str:
    if len(text) > 40:
        raise IbnetError(
            f"{source}:{lineno}: not an InfiniBand GUID: {text[:40]!r}... ({len(text)} characters)"
        )
    try:
        return normalize_guid(text)
    except ValueError as exc:
        raise IbnetError(f"{source}:{lineno}: {exc}") from None


def switch_tree(fabric: IbFabric) -> SwitchTree:
    """Levels by breadth-first distance from the hosts; uplinks go one level up only."""
    neighbours = fabric.neighbours()
    hosts = {g: n for g, n in fabric.nodes.items() if n.kind == "ca" and not _aggregation(n)}
    switches = {g for g, n in fabric.nodes.items() if n.kind == "switch"}
    level: dict[str, int] = {}
    frontier = sorted({s for h in hosts for s in neighbours.get(h, ()) if s in switches})
    depth = LEAF
    while frontier:
        for s in frontier:
            level[s] = min(depth, CORE)
        depth += 1
        frontier = sorted({n for s in frontier for n in neighbours[s] if n in switches and n not in level})
    host_leaves = {
        h: frozenset(s for s in neighbours.get(h, ()) if level.get(s) == LEAF) for h in sorted(hosts)
    }
    uplinks: dict[str, frozenset[str]] = {}
    for s in sorted(level):
        if level[s] < CORE:
            ups = frozenset(n for n in neighbours[s] if level.get(n) == level[s] + 1)
            if ups:
                uplinks[s] = ups
    host_names = {g: name for g, n in hosts.items() if (name := n.host) is not None}
    return SwitchTree(
        host_leaves={h: v for h, v in host_leaves.items() if v},
        uplinks=uplinks,
        tier=level,
        hosts=host_names,
        descriptions={g: fabric.nodes[g].description for g in sorted(level)},
    )


def _aggregation(node: IbNode) -> bool:
    return "Aggregation Node" in node.description


def parse_many(sources: Iterable[tuple[str, str]]) -> IbFabric:
    """Merge several files (fabric segments, or the same fabric seen from two places)."""
    fabric = IbFabric()
    for name, text in sources:
        fabric.merge(parse_ibnetdiscover(text, source=name))
    return fabric
