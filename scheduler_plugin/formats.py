"""The ``plan`` file formats (ARCHITECTURE.md): plain data <-> snapshot, gang and plan. Pure.

Every error is a ``FormatError`` whose message starts with the path of the bad field, for example
``gang.roles[0].pods: expected a positive integer``.

Limits: a gang has at most :data:`~scheduler_plugin.snapshot.MAX_GANG_PODS` pods, all its roles
together (the planner's time and memory grow with them); the error names the role's ``pods`` field and
the limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from scheduler_plugin.snapshot import (
    MAX_GANG_PODS,
    MNNVL_MODES,
    ClusterSnapshot,
    Gang,
    Infeasible,
    NodeState,
    PlanResult,
    Role,
)

_EMPTY: Mapping[str, Any] = MappingProxyType({})  # one read-only empty mapping for every node without one
_NODE_KEYS = {
    "name",
    "gpus",
    "free",
    "domains",
    "resources",
    "free_resources",
    "schedulable",
    "degraded",
    "ready",
}
_ROLE_KEYS = {
    "name",
    "pods",
    "gpus_per_pod",
    "subgroup_size",
    "subgroup_size_min",
    "subgroup_tier",
    "min_subgroups",
    "resources",
}
_GANG_KEYS = {"name", "tier", "mode", "soft", "mnnvl", "roles"}


class FormatError(ValueError):
    """Invalid input; the message names the field."""


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if type(value) is not dict and not isinstance(value, Mapping):
        raise FormatError(f"{path}: expected a mapping")
    for k in value:
        if type(k) is not str:
            raise FormatError(f"{path}: keys must be strings, got {repr(k)[:60]}")
    return value


def _list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise FormatError(f"{path}: expected a list")
    return value


def _str(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise FormatError(f"{path}: expected a non-empty string")
    return value


def _int(value: Any, path: str, *, minimum: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise FormatError(f"{path}: expected {what}")
    return value


def _pos(value: Any, path: str) -> int:
    return _int(value, path, minimum=1, what="a positive integer")


def _nonneg(value: Any, path: str) -> int:
    return _int(value, path, minimum=0, what="a non-negative integer")


def _unknown(data: Mapping[str, Any], allowed: set[str], path: str) -> None:
    extra = sorted(set(data) - allowed)
    if extra:
        raise FormatError(f"{path}.{extra[0][:60]}: unknown field; valid: {', '.join(sorted(allowed))}")


def _resources(value: Any, path: str) -> dict[str, int]:
    data = _mapping(value, path)
    return {k: _nonneg(v, f"{path}.{k}") for k, v in data.items()}


def _tier(value: Any, path: str, tiers: tuple[str, ...] | None) -> str:
    """A tier by name, or by number (1 = the first tier) when the tiers are known."""
    if isinstance(value, int) and not isinstance(value, bool):
        if tiers is None or not 1 <= value <= len(tiers):
            raise FormatError(f"{path}: tier number {value} out of range 1..{len(tiers or ())}")
        return tiers[value - 1]
    name = _str(value, path)
    if tiers is not None and name not in tiers:
        raise FormatError(f"{path}: unknown tier {name[:60]!r}; cluster tiers: {', '.join(tiers) or 'none'}")
    return name


def snapshot_from_data(data: Any, path: str = "cluster") -> ClusterSnapshot:
    """The snapshot in ``data``; every node's fields checked in one pass (work in proportion to the
    nodes: a node of plain fields costs a few dictionary reads, a field of another type the checks
    that name it)."""
    doc = _mapping(data, path)
    _unknown(doc, {"tiers", "nodes"}, path)
    tiers_raw = _list(doc.get("tiers", []), f"{path}.tiers")
    tiers = tuple(_str(t, f"{path}.tiers[{i}]") for i, t in enumerate(tiers_raw))
    if len(set(tiers)) != len(tiers):
        raise FormatError(f"{path}.tiers: tier names must be unique")
    known = frozenset(tiers)
    nodes: list[NodeState] = []
    seen: set[str] = set()
    for i, raw in enumerate(_list(doc.get("nodes"), f"{path}.nodes")):
        nodes.append(_node(raw, f"{path}.nodes[{i}]", tiers=tiers, known=known, seen=seen))
    return ClusterSnapshot(tiers=tiers, nodes=tuple(nodes))


def _node(
    raw: Any, npath: str, *, tiers: tuple[str, ...], known: frozenset[str], seen: set[str]
) -> NodeState:
    n = _mapping(raw, npath)
    if not n.keys() <= _NODE_KEYS:
        _unknown(n, _NODE_KEYS, npath)
    name = _str(n.get("name"), f"{npath}.name")
    if name in seen:
        raise FormatError(f"{npath}.name: duplicate node {name[:60]!r}")
    seen.add(name)
    gpus = _nonneg(n.get("gpus"), f"{npath}.gpus")
    free = _nonneg(n.get("free", gpus), f"{npath}.free")
    if free > gpus:
        raise FormatError(f"{npath}.free: {free} is more than gpus ({gpus})")
    domains_raw = _mapping(n.get("domains", _EMPTY), f"{npath}.domains")
    domains = {}
    for t, d in domains_raw.items():
        if t not in known:
            raise FormatError(
                f"{npath}.domains.{t}: unknown tier; cluster tiers: {', '.join(tiers) or 'none'}"
            )
        domains[t] = d if type(d) is str and d else _str(d, f"{npath}.domains.{t}")
    resources = _resources(n["resources"], f"{npath}.resources") if "resources" in n else _EMPTY
    free_resources = (
        _resources(n["free_resources"], f"{npath}.free_resources") if "free_resources" in n else resources
    )
    schedulable = n.get("schedulable", True)
    if not isinstance(schedulable, bool):
        raise FormatError(f"{npath}.schedulable: expected true or false")
    degraded = n.get("degraded", False)
    if not isinstance(degraded, bool):
        raise FormatError(f"{npath}.degraded: expected true or false")
    ready = n.get("ready", True)
    if not isinstance(ready, bool):
        raise FormatError(f"{npath}.ready: expected true or false")
    return NodeState(
        name=name,
        gpus=gpus,
        free=free,
        domains=domains,
        resources=resources,
        free_resources=free_resources,
        schedulable=schedulable,
        degraded=degraded,
        ready=ready,
    )


def gang_from_data(data: Any, tiers: tuple[str, ...] | None = None, path: str = "gang") -> Gang:
    doc = _mapping(data, path)
    _unknown(doc, _GANG_KEYS, path)
    name = _str(doc.get("name", "gang"), f"{path}.name")
    tier = _tier(doc["tier"], f"{path}.tier", tiers) if doc.get("tier") is not None else None
    mode = doc.get("mode", "hard")
    if mode not in ("hard", "soft"):
        raise FormatError(f"{path}.mode: expected hard or soft")
    soft = doc.get("soft", mode == "soft")
    if not isinstance(soft, bool):
        raise FormatError(f"{path}.soft: expected true or false")
    mnnvl = doc.get("mnnvl", "off")
    if not isinstance(mnnvl, str) or mnnvl not in MNNVL_MODES:
        shown = repr(mnnvl)[:60] if isinstance(mnnvl, (str, int, float, bool)) else type(mnnvl).__name__
        raise FormatError(
            f"{path}.mnnvl: expected {', '.join(MNNVL_MODES[:-1])} or {MNNVL_MODES[-1]}, got {shown}"
        )
    roles: list[Role] = []
    names: set[str] = set()
    total_pods = 0
    roles_raw = _list(doc.get("roles"), f"{path}.roles")
    if not roles_raw:
        raise FormatError(f"{path}.roles: expected at least one role")
    for i, raw in enumerate(roles_raw):
        rpath = f"{path}.roles[{i}]"
        r = _mapping(raw, rpath)
        _unknown(r, _ROLE_KEYS, rpath)
        rname = _str(r.get("name", "worker" if len(roles_raw) == 1 else None), f"{rpath}.name")
        if rname in names:
            raise FormatError(f"{rpath}.name: duplicate role {rname[:60]!r}")
        names.add(rname)
        pods = _pos(r.get("pods"), f"{rpath}.pods")
        if pods > MAX_GANG_PODS:
            raise FormatError(
                f"{rpath}.pods: {pods} is more than {MAX_GANG_PODS}, the most pods one gang may have"
            )
        total_pods += pods
        if total_pods > MAX_GANG_PODS:
            raise FormatError(
                f"{rpath}.pods: the gang's roles have {total_pods} pods together, more than "
                f"{MAX_GANG_PODS}, the most pods one gang may have"
            )
        gpus = _nonneg(r.get("gpus_per_pod"), f"{rpath}.gpus_per_pod")
        size, auto_min = _subgroup_size(r, rpath, pods)
        stier = _tier(r["subgroup_tier"], f"{rpath}.subgroup_tier", tiers) if r.get("subgroup_tier") else None
        min_sg = (
            _nonneg(r["min_subgroups"], f"{rpath}.min_subgroups")
            if r.get("min_subgroups") is not None
            else None
        )
        if min_sg is not None and auto_min is not None:
            raise FormatError(
                f"{rpath}.min_subgroups: a role of subgroup_size auto cannot be elastic (its subgroups' "
                "size is chosen by the plan)"
            )
        if min_sg is not None:
            blocks = -(-pods // (size or pods))
            if min_sg > blocks:
                raise FormatError(
                    f"{rpath}.min_subgroups: {min_sg} is more than the role's {blocks} subgroup(s)"
                )
        roles.append(
            Role(
                name=rname,
                pods=pods,
                gpus_per_pod=gpus,
                subgroup_size=size,
                subgroup_tier=stier,
                min_subgroups=min_sg,
                resources_per_pod=_resources(r.get("resources", {}), f"{rpath}.resources"),
                subgroup_auto_min=auto_min,
            )
        )
    autos = [i for i, r in enumerate(roles) if r.subgroup_auto_min is not None]
    if len(autos) > 1:
        raise FormatError(
            f"{path}.roles[{autos[1]}].subgroup_size: auto in two roles ({roles[autos[0]].name!r} and "
            f"{roles[autos[1]].name!r}); at most one role of a gang may choose its size"
        )
    return Gang(name=name, roles=tuple(roles), tier=tier, soft=soft, mnnvl=mnnvl)


def _subgroup_size(r: Mapping[str, Any], rpath: str, pods: int) -> tuple[int | None, int | None]:
    """``(subgroup_size, subgroup_auto_min)`` of a role: a positive size, or ``auto`` with
    ``subgroup_size_min`` (default 1, at most the role's pods)."""
    raw = r.get("subgroup_size")
    if raw != "auto":
        if "subgroup_size_min" in r:
            raise FormatError(f"{rpath}.subgroup_size_min: only with subgroup_size: auto")
        if raw is None:
            return None, None
        return _int(raw, f"{rpath}.subgroup_size", minimum=1, what="a positive integer or auto"), None
    minimum = _pos(r.get("subgroup_size_min", 1), f"{rpath}.subgroup_size_min")
    if minimum > pods:
        raise FormatError(f"{rpath}.subgroup_size_min: {minimum} is more than the role's {pods} pods")
    return None, minimum


def result_to_data(result: PlanResult, tiers: tuple[str, ...] = ()) -> dict[str, Any]:
    """The JSON shape of ARCHITECTURE.md: feasible with placement (pods as ``<role>-<index>``),
    subgroups and score, or a reason."""
    if isinstance(result, Infeasible):
        return {"feasible": False, "reason": result.reason}
    score: dict[str, Any] = {k: (int(v) if float(v).is_integer() else v) for k, v in result.score.items()}
    span = int(result.score.get("span_tier", 0))
    if span:
        score["span_tier_name"] = tiers[span - 1] if span <= len(tiers) else "cluster"
    out: dict[str, Any] = {
        "feasible": True,
        "placement": {str(pod): node for pod, node in result.placement.items()},
        "subgroups": [{"role": s.role, "index": s.index, "domain": s.domain} for s in result.subgroups],
        "score": score,
    }
    if result.subgroup_sizes:  # the sizes chosen for roles of subgroup_size: auto
        out["subgroup_sizes"] = dict(result.subgroup_sizes)
    return out
