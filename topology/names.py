"""Stable names derived from identity: HyperNode names, label values, switch ids. Pure.

Every name produced here is at most 63 characters, lowercase, and valid both as a Kubernetes object
name (DNS-1123 subdomain, the pattern Volcano checks on ``exactMatch``) and as a label value, so the
same string can name a HyperNode, fill a node label and appear in Slurm's ``topology.conf``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from topology.nvlink import CliqueKey

MAX_NAME = 63
_FNV64_OFFSET = 0xCBF29CE484222325
_FNV64_PRIME = 0x100000001B3
_BAD = re.compile(r"[^a-z0-9.-]+")
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def fnv64a(text: str) -> int:
    h = _FNV64_OFFSET
    for byte in text.encode("utf-8"):
        h ^= byte
        h = (h * _FNV64_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def topograph_value(value: str) -> str:
    """A label value as topograph writes it: as-is up to 63 characters, else ``x`` + FNV-64a hex."""
    if len(value) <= MAX_NAME:
        return value
    return f"x{fnv64a(value):016x}"


def _digest(text: str, n: int = 10) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


def sanitize(text: str) -> str:
    """Lowercase, characters outside ``[a-z0-9.-]`` to ``-``, ends trimmed to alphanumerics."""
    out = _BAD.sub("-", text.lower())
    out = re.sub(r"-*\.-*", ".", out)
    out = re.sub(r"\.{2,}", ".", out)
    return out.strip(".-")


def bounded(prefix: str, body: str, *, identity: str | None = None) -> str:
    """``<prefix>-<body>`` made valid; when it does not fit (or was changed by sanitizing) a short
    digest of ``identity`` (default: body) keeps distinct identities distinct."""
    clean = sanitize(body)
    name = f"{prefix}-{clean}" if clean else prefix
    if len(name) <= MAX_NAME and clean == body and _NAME_RE.match(name):
        return name
    digest = _digest(identity if identity is not None else body)
    room = MAX_NAME - len(prefix) - len(digest) - 2
    head = clean[: max(room, 0)].strip(".-")
    return f"{prefix}-{head}-{digest}" if head else f"{prefix}-{digest}"


def clique_domain_name(key: CliqueKey) -> str:
    """``nvl-<clusterUuid>-<cliqueId>``: a clique is only unique together with its cluster."""
    return bounded("nvl", f"{key.cluster_uuid.lower()}-{key.clique_id}")


def node_domain_name(node: str) -> str:
    """The NVLink domain of a node that is its own domain (an 8-GPU NVSwitch board, or isolated)."""
    return bounded("nvl-node", node)


def switch_set_name(tier: str, switches: Iterable[str]) -> str:
    """A leaf/spine/core domain named by the set of switches it stands for: one switch keeps its id,
    several get a digest of the sorted ids (so the name is independent of discovery order)."""
    ids = sorted(set(switches))
    if not ids:
        raise ValueError(f"{tier}: a domain needs at least one switch")
    if len(ids) == 1:
        return bounded(tier, ids[0])
    return f"{tier}-{len(ids)}x-{_digest(chr(10).join(ids), 16)}"


def normalize_guid(text: str) -> str:
    """An InfiniBand GUID in any common spelling (``0x58a2…``, ``58a2:e103:…``) as 16 lowercase hex."""
    raw = text.strip().lower()
    raw = raw.removeprefix("0x").replace(":", "")
    if not raw or len(raw) > 16 or any(c not in "0123456789abcdef" for c in raw):
        raise ValueError(f"not an InfiniBand GUID: {text!r}")
    return raw.rjust(16, "0")


def is_valid_name(name: str) -> bool:
    return len(name) <= MAX_NAME and bool(_NAME_RE.match(name))
