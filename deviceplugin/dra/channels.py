"""One IMEX channel per job: which channel a gang holds in its NVLink domain. Pure.

A claim of the DeviceClass ``imex-channel.gpuagent.dev`` is allocated the node's one ``imex-channel``
device (``allowMultipleAllocations``: any number of claims share it); the channel *number* is decided
here, at prepare, per gang and NVLink domain:

- The gang is named by the claim: the opaque config of our driver in the claim (``parameters:
  {gang: <name>}``, from the ResourceClaimTemplate) or else the claim's label ``gpuagent.dev/gang``
  (templates copy their labels to the claims they make). The key is ``<claim namespace>/<gang>``, so
  a claim can only ever join a gang of its own namespace.
- A claim may ask for a number (``parameters: {channel: N}``); one that another gang holds is refused.
- The record of a domain maps each held channel to its gang, the nodes that have it prepared and, for
  each such node, the identity (namespace, name, uid) of the claims it prepared with it. The first
  node of a gang to prepare takes the lowest free channel (or the one asked for); every other node
  of the gang finds it there, so the whole gang gets one channel and every other gang of the domain
  another. A node that unprepares its last claim of the gang leaves the holders; the channel is free
  once no node holds it.

The record lives in the API (:mod:`deviceplugin.dra.channelbook`: one ConfigMap per domain, written
with optimistic concurrency), which makes it the same for every node and survive restarts of any of
them. Channels are ``0 .. limit-1``; the driver's limit is 2048 (the count NVIDIA's driver creates and
its DRA driver assumes). A full domain is a clear error, never a crash. Everything read from the
record or a claim is checked: a malformed entry is reported and left alone (its channel counts as
taken), never trusted; a malformed claim identity is dropped (reported) and the entry kept.

The identities let a node that lost its checkpoint tell, by a GET of each claim the record names for it,
which of its holds a claim still accounts for (no LIST of claims, so the agent needs ``get`` only). An
entry written before identities were recorded (``{gang, nodes}`` alone) still parses; such a hold has no
identity to check and is kept until the node prepares a claim of the gang again (which records it) or
releases it (:mod:`deviceplugin.dra.imexchannel`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CHANNEL_LIMIT = 2048
GANG_LABEL = "gpuagent.dev/gang"
MAX_GANG = 253
MAX_NODES = 1024  # holders of one channel: far above any NVLink domain's node count
MAX_CLAIMS_PER_NODE = 64  # identities kept per node and channel (the newest); one per pod of the gang there
MAX_CLAIMS = 4096  # identities read from one entry at most
KEY_PREFIX = "channel-"
_GANG = re.compile(r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$", re.IGNORECASE)
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # an RFC 1123 label
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # an RFC 1123 subdomain
_UID = re.compile(r"[A-Za-z0-9][-A-Za-z0-9]{0,127}")


class ChannelError(ValueError):
    """A channel cannot be given (one line: the claim or the domain, and why)."""


@dataclass(frozen=True, slots=True)
class ClaimIdentity:
    """A ResourceClaim as the record names it: a GET of ``namespace/name`` finds it, ``uid`` tells a
    claim made again under the same name from it."""

    namespace: str
    name: str
    uid: str


def claim_identity(namespace: Any, name: Any, uid: Any) -> ClaimIdentity:
    """The identity, checked (names as the API allows them, so a GET path is built from nothing
    else); raises :class:`ValueError` naming the field."""
    for field, value, pattern in (
        ("namespace", namespace, _NAMESPACE),
        ("name", name, _NAME),
        ("uid", uid, _UID),
    ):
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise ValueError(f"claim {field}: {value!r:.80} is not a valid {field}")
    return ClaimIdentity(namespace=namespace, name=name, uid=uid)


@dataclass(frozen=True, slots=True)
class Holder:
    gang: str  # "<namespace>/<gang>"
    nodes: tuple[str, ...]
    claims: tuple[tuple[str, ClaimIdentity], ...] = ()  # (node, claim) for the nodes in ``nodes``

    def claims_of(self, node: str) -> list[ClaimIdentity]:
        return [c for n, c in self.claims if n == node]


@dataclass(frozen=True, slots=True)
class ChannelRequest:
    gang: str  # "<namespace>/<gang>"
    channel: int | None = None  # a number the claim asks for
    claim: ClaimIdentity | None = None  # the claim asking, recorded with the node's hold


def channel_request(claim: Mapping[str, Any], *, driver: str, limit: int = CHANNEL_LIMIT) -> ChannelRequest:
    """The gang (and wanted channel) of an imex-channel claim; raises :class:`ChannelError` naming the
    field that is wrong."""
    meta = claim.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    namespace = meta.get("namespace")
    gang: Any = None
    channel: Any = None
    source = ""
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    configs = devices.get("config") if isinstance(devices, Mapping) else None
    for i, config in enumerate(configs if isinstance(configs, list) else []):
        opaque = config.get("opaque") if isinstance(config, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        params = opaque.get("parameters")
        if not isinstance(params, Mapping):
            raise ChannelError(f"status.allocation.devices.config[{i}].opaque.parameters: expected a mapping")
        if "gang" in params:
            gang, source = params["gang"], f"status.allocation.devices.config[{i}].opaque.parameters.gang"
        if "channel" in params:
            channel = params["channel"]
    if gang is None:
        labels = meta.get("labels")
        if isinstance(labels, Mapping):
            gang, source = labels.get(GANG_LABEL), f"metadata.labels[{GANG_LABEL}]"
    if gang is None:
        raise ChannelError(
            f"names no gang: set parameters.gang in the driver's opaque config or the label "
            f"{GANG_LABEL} on its ResourceClaimTemplate"
        )
    if not isinstance(gang, str) or len(gang) > MAX_GANG or not _GANG.match(gang):
        raise ChannelError(f"{source}: {gang!r:.80} is not a name of at most {MAX_GANG} characters")
    if not isinstance(namespace, str) or not namespace:
        raise ChannelError("metadata.namespace is missing")
    if channel is not None and (
        isinstance(channel, bool) or not isinstance(channel, int) or not 0 <= channel < limit
    ):
        raise ChannelError(f"parameters.channel: {channel!r:.40} is not a channel 0..{limit - 1}")
    try:
        identity = claim_identity(namespace, meta.get("name"), meta.get("uid"))
    except ValueError as exc:
        raise ChannelError(f"metadata: {exc}") from None
    return ChannelRequest(gang=f"{namespace}/{gang}", channel=channel, claim=identity)


def parse_record(
    data: Mapping[str, Any] | None, *, limit: int = CHANNEL_LIMIT
) -> tuple[dict[int, Holder], list[str], set[int]]:
    """The holders by channel, the problems found (one line each), and the channels of malformed
    entries (taken: nobody can tell who holds them)."""
    holders: dict[int, Holder] = {}
    problems: list[str] = []
    broken: set[int] = set()
    for key, raw in sorted((data or {}).items()):
        if not key.startswith(KEY_PREFIX):
            continue
        number = key[len(KEY_PREFIX) :]
        if not number.isdigit() or len(number) > 5 or int(number) >= limit:
            problems.append(f"{key}: not a channel 0..{limit - 1}; ignored")
            continue
        channel = int(number)
        try:
            body = json.loads(raw) if isinstance(raw, str) else None
            gang = body.get("gang") if isinstance(body, dict) else None
            nodes = body.get("nodes") if isinstance(body, dict) else None
            if not isinstance(gang, str) or not isinstance(nodes, list) or len(nodes) > MAX_NODES:
                raise ValueError("expected {gang: string, nodes: [string]}")
            if not all(isinstance(n, str) for n in nodes):
                raise ValueError("nodes: expected strings")
            identities = body.get("claims") if isinstance(body, dict) else None
        except ValueError as exc:
            problems.append(f"{key}: {str(exc)[:120]}; the channel stays taken")
            broken.add(channel)
            continue
        unique = tuple(sorted(set(nodes)))
        claims, bad = _parse_claims(identities, gang=gang, nodes=unique)
        problems.extend(f"{key}: {b}; the identity is dropped" for b in bad)
        holders[channel] = Holder(gang=gang, nodes=unique, claims=claims)
    return holders, problems, broken


def _parse_claims(
    raw: Any, *, gang: str, nodes: tuple[str, ...]
) -> tuple[tuple[tuple[str, ClaimIdentity], ...], list[str]]:
    """The (node, claim) identities of an entry and the problems with the rest: each must name a node of
    the entry and a claim of the gang's namespace (a claim only ever joins a gang of its own)."""
    if raw is None:
        return (), []  # an entry of the format before identities
    if not isinstance(raw, list):
        return (), ["claims: expected a list"]
    out: list[tuple[str, ClaimIdentity]] = []
    problems: list[str] = []
    if len(raw) > MAX_CLAIMS:
        problems.append(f"claims: {len(raw)} identities, only the first {MAX_CLAIMS} read")
    namespace = gang.partition("/")[0]
    for i, item in enumerate(raw[:MAX_CLAIMS]):
        try:
            if not isinstance(item, dict):
                raise ValueError("expected {node, namespace, name, uid}")
            node = item.get("node")
            if not isinstance(node, str) or node not in nodes:
                raise ValueError(f"node {node!r:.80} holds no part of the channel")
            identity = claim_identity(item.get("namespace"), item.get("name"), item.get("uid"))
            if identity.namespace != namespace:
                raise ValueError(f"namespace {identity.namespace} is not the gang's")
        except ValueError as exc:
            if len(problems) < 8:
                problems.append(f"claims[{i}]: {str(exc)[:120]}")
            continue
        if (node, identity) not in out:
            out.append((node, identity))
    return tuple(out), problems


def render_record(holders: Mapping[int, Holder]) -> dict[str, str]:
    return {f"{KEY_PREFIX}{channel}": _render(h) for channel, h in sorted(holders.items())}


def _render(holder: Holder) -> str:
    body: dict[str, Any] = {"gang": holder.gang, "nodes": list(holder.nodes)}
    if holder.claims:
        body["claims"] = [
            {"node": n, "namespace": c.namespace, "name": c.name, "uid": c.uid} for n, c in holder.claims
        ]
    return json.dumps(body, separators=(",", ":"))


def acquire(
    holders: Mapping[int, Holder],
    request: ChannelRequest,
    node: str,
    *,
    domain: str,
    taken: set[int] | None = None,
    limit: int = CHANNEL_LIMIT,
) -> tuple[int, dict[int, Holder]]:
    """The gang's channel in the domain with ``node`` among its holders, and the new holders; raises
    :class:`ChannelError` for a channel another gang holds or a full domain."""
    out = dict(holders)
    mine = sorted(c for c, h in holders.items() if h.gang == request.gang)
    if mine:
        channel = mine[0]
        if request.channel is not None and request.channel != channel:
            raise ChannelError(
                f"gang {request.gang} holds IMEX channel {channel} in domain {domain}; "
                f"the claim asks for {request.channel}"
            )
    elif request.channel is not None:
        channel = request.channel
        other = holders.get(channel)
        if other is not None:
            raise ChannelError(f"IMEX channel {channel} in domain {domain} belongs to another gang; refused")
        if channel in (taken or set()):
            raise ChannelError(
                f"IMEX channel {channel} in domain {domain} is reserved (or its record entry is unreadable); "
                "refused"
            )
    else:
        used = set(holders) | (taken or set())
        channel = next((c for c in range(limit) if c not in used), -1)
        if channel < 0:
            raise ChannelError(f"every IMEX channel of domain {domain} (0..{limit - 1}) is held by a gang")
    held = out.get(channel)
    nodes = set(held.nodes) if held is not None else set()
    if node not in nodes and len(nodes) >= MAX_NODES:
        raise ChannelError(f"IMEX channel {channel} in domain {domain} has {MAX_NODES} holders already")
    nodes.add(node)
    claims = list(held.claims) if held is not None else []
    if request.claim is not None and (node, request.claim) not in claims:
        claims.append((node, request.claim))
        mine_here = [i for i, (n, _) in enumerate(claims) if n == node]
        for i in reversed(mine_here[:-MAX_CLAIMS_PER_NODE]):  # the oldest beyond the cap
            del claims[i]
    out[channel] = Holder(gang=request.gang, nodes=tuple(sorted(nodes)), claims=tuple(claims))
    return channel, out


def release(holders: Mapping[int, Holder], *, gang: str, channel: int, node: str) -> dict[int, Holder]:
    """The holders with ``node`` no longer holding the gang's ``channel``; the channel is free once no
    node holds it. A channel that another gang holds now is left alone."""
    out = dict(holders)
    held = out.get(channel)
    if held is None or held.gang != gang:
        return out
    nodes = tuple(n for n in held.nodes if n != node)
    if nodes:
        out[channel] = Holder(gang=gang, nodes=nodes, claims=tuple(c for c in held.claims if c[0] != node))
    else:
        del out[channel]
    return out
