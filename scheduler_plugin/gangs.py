"""Gangs from Kubernetes objects: a Volcano ``PodGroup`` or our CRD-free pod annotations. Pure.

Two sources, both plain dicts as the API serves them:

- **Volcano PodGroup** (``scheduling.volcano.sh/v1beta1``), joined to pods by the pod annotation
  ``scheduling.k8s.io/group-name`` (same namespace). ``minMember`` is the gang minimum;
  ``networkTopology{mode, highestTierAllowed | highestTierName}`` bounds the whole gang;
  each ``subGroupPolicy`` entry becomes a role: its pods (by ``labelSelector``) are cut into
  subgroups of ``subGroupSize`` (instances by ``matchLabelKeys`` values when given, else
  consecutive ranks), with ``minSubGroups`` and its own ``networkTopology``. Pods no policy selects
  form the role ``default``.
- **Annotations** on each pod: ``gpuagent.dev/gang`` (name, namespaced), ``gpuagent.dev/gang-size``,
  optional ``gpuagent.dev/subgroup-size``, ``gpuagent.dev/subgroup-tier``, ``gpuagent.dev/gang-tier``,
  ``gpuagent.dev/min-subgroups``, ``gpuagent.dev/topology-mode`` (``hard``/``soft``) and
  ``gpuagent.dev/role``; the rank comes from ``batch.kubernetes.io/job-completion-index`` (label or
  annotation) or ``gpuagent.dev/rank``.

Tiers are given by name or by number (1 = the first tier of the cluster). Every contradiction raises
``GangError`` with a message that names the object and the field. Sizes are bounded: no count (gang
size, subgroup size, minimum, rank) may exceed ``MAX_GANG_PODS``, nor may a gang's roles together, so a
hostile annotation (``gang-size: "1000000000"``) is an error naming the field and the limit, never a plan
the planner would spend minutes and gigabytes on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler_plugin.cluster import CPU, GPU, MEMORY, pod_key, pod_requests
from scheduler_plugin.snapshot import MAX_GANG_PODS, Gang, PodSlot, Role

GROUP_NAME = "scheduling.k8s.io/group-name"
ANN_GANG = "gpuagent.dev/gang"
ANN_GANG_SIZE = "gpuagent.dev/gang-size"
ANN_SUBGROUP_SIZE = "gpuagent.dev/subgroup-size"
ANN_SUBGROUP_TIER = "gpuagent.dev/subgroup-tier"
ANN_GANG_TIER = "gpuagent.dev/gang-tier"
ANN_MIN_SUBGROUPS = "gpuagent.dev/min-subgroups"
ANN_MODE = "gpuagent.dev/topology-mode"
ANN_ROLE = "gpuagent.dev/role"
ANN_RANK = "gpuagent.dev/rank"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
DEFAULT_ROLE = "default"


class GangError(ValueError):
    """A gang that cannot be understood; the message names the object and the field."""


class GangIncompleteError(GangError):
    """The gang's pods that exist so far describe fewer pods than it needs: wait for the rest."""


@dataclass(frozen=True)
class GangSpec:
    """A gang with the pods that exist now mapped to their places in the plan (role and index)."""

    key: str  # "<namespace>/<name>"
    gang: Gang
    members: Mapping[str, PodSlot]  # pod key "<ns>/<name>" -> its role and index
    min_member: int  # pods that must bind together (the gang barrier)
    source: str  # "podgroup" or "annotations"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    ann = _meta(obj).get("annotations")
    return ann if isinstance(ann, Mapping) else {}


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    lab = _meta(obj).get("labels")
    return lab if isinstance(lab, Mapping) else {}


def gang_key_of(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(source, "<ns>/<name>")`` of the gang a pod belongs to, or None for a pod on its own."""
    ns = _meta(pod).get("namespace") or "default"
    ann = _annotations(pod)
    if ann.get(GROUP_NAME):
        return "podgroup", f"{ns}/{ann[GROUP_NAME]}"
    if ann.get(ANN_GANG):
        return "annotations", f"{ns}/{ann[ANN_GANG]}"
    return None


def tier_of(value: Any, tiers: Sequence[str], where: str) -> str:
    """A tier by name or number (1-based, as HyperNode ``spec.tier`` counts)."""
    if isinstance(value, bool):
        raise GangError(f"{where}: expected a tier name or number, got {value!r}")
    if isinstance(value, str) and _digits(value.strip()):
        if len(value.strip()) > _MAX_DIGITS:
            raise GangError(f"{where}: tier {value.strip()[:12]}... is not a cluster tier (1..{len(tiers)})")
        value = int(value.strip())
    if isinstance(value, int):
        if not 1 <= value <= len(tiers):
            raise GangError(f"{where}: tier {value} is not a cluster tier (1..{len(tiers)})")
        return tiers[value - 1]
    if isinstance(value, str) and value in tiers:
        return value
    raise GangError(f"{where}: unknown tier {value!r}; cluster tiers: {', '.join(tiers) or 'none'}")


_MAX_DIGITS = len(str(MAX_GANG_PODS))  # a count with more digits is over the limit, whatever it is


def _digits(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` also accepts ``"²"``, which ``int`` refuses)."""
    return text.isascii() and text.isdigit()


def _over(where: str, shown: str) -> GangError:
    return GangError(f"{where}: {shown} is over the limit of {MAX_GANG_PODS} pods per gang")


def _shown(digits: str) -> str:
    return digits if len(digits) <= 20 else f"{digits[:12]}... ({len(digits)} digits)"


def _int(value: Any, where: str, *, minimum: int) -> int:
    """An integer in ``minimum..MAX_GANG_PODS``: a JSON integer, or a string of ASCII digits (more digits
    than the limit has never reach ``int()``)."""
    bad = GangError(f"{where}: expected an integer >= {minimum}, got {_repr(value)}")
    if isinstance(value, str):
        text = value.strip().removeprefix("+")
        if not _digits(text):
            raise bad
        if len(text.lstrip("0")) > _MAX_DIGITS:
            raise _over(where, _shown(text))
        n = int(text)
    elif isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        raise bad
    if n < minimum:
        raise GangError(f"{where}: expected an integer >= {minimum}, got {n}")
    if n > MAX_GANG_PODS:
        raise _over(where, _shown(str(n)) if n.bit_length() < 10_000 else "a number")
    return n


def _repr(value: Any) -> str:
    return f"{value[:40]!r}..." if isinstance(value, str) and len(value) > 40 else repr(value)[:60]


def pod_rank(pod: Mapping[str, Any]) -> int | None:
    """The pod's rank: the Job completion index (label or annotation), else ``gpuagent.dev/rank``."""
    for source in (_labels(pod), _annotations(pod)):
        for key in (COMPLETION_INDEX, ANN_RANK):
            raw = source.get(key)
            text = str(raw).strip() if raw is not None else ""
            if _digits(text):
                if len(text.lstrip("0")) > _MAX_DIGITS:  # no gang has that many pods
                    raise _over(f"pod {pod_key(pod)}: {key}", f"rank {_shown(text)}")
                return int(text)
    return None


def _shape(pods: Sequence[Mapping[str, Any]], where: str) -> tuple[int, dict[str, int]]:
    """GPUs and other requests per pod; the pods of one role must agree."""
    shapes: dict[tuple[int, tuple[tuple[str, int], ...]], str] = {}
    for pod in pods:
        req = pod_requests(pod)
        shape = (req.get(GPU, 0), tuple(sorted((k, v) for k, v in req.items() if k in (CPU, MEMORY) and v)))
        shapes.setdefault(shape, pod_key(pod))
    if len(shapes) > 1:
        (a, pa), (b, pb) = list(shapes.items())[:2]
        raise GangError(
            f"{where}: pods request different resources ({pa}: {a[0]} GPU(s), {pb}: {b[0]} GPU(s)); "
            "split them into separate roles"
        )
    if not shapes:
        return 0, {}
    gpus, rest = next(iter(shapes))
    return gpus, dict(rest)


def _order(pods: Iterable[Mapping[str, Any]], size: int, where: str) -> list[tuple[int, Mapping[str, Any]]]:
    """Index each pod: ranked pods at their rank, the rest (by name) in the free indices."""
    ranked: dict[int, Mapping[str, Any]] = {}
    unranked: list[Mapping[str, Any]] = []
    for pod in pods:
        r = pod_rank(pod)
        if r is None:
            unranked.append(pod)
            continue
        if r >= size:
            raise GangError(f"{where}: pod {pod_key(pod)} has rank {r}, outside 0..{size - 1}")
        if r in ranked:
            raise GangError(f"{where}: pods {pod_key(ranked[r])} and {pod_key(pod)} share rank {r}")
        ranked[r] = pod
    unranked.sort(key=pod_key)
    free = (i for i in range(size) if i not in ranked)
    out = sorted(ranked.items(), key=lambda kv: kv[0])
    for pod in unranked:
        idx = next(free, None)
        if idx is None:
            raise GangError(f"{where}: {len(ranked) + len(unranked)} pods for a gang of {size}")
        out.append((idx, pod))
    return sorted(out, key=lambda kv: kv[0])


# -- annotations ---------------------------------------------------------------------------------


def _agree(pods: Sequence[Mapping[str, Any]], key: str, gang: str) -> str | None:
    values: dict[str, str] = {}
    for pod in pods:
        v = _annotations(pod).get(key)
        if v is not None:
            values.setdefault(str(v), pod_key(pod))
    if len(values) > 1:
        (va, pa), (vb, pb) = list(values.items())[:2]
        raise GangError(f"gang {gang}: pods disagree on {key} ({pa}: {va!r}, {pb}: {vb!r})")
    return next(iter(values), None)


def gang_from_annotations(key: str, pods: Sequence[Mapping[str, Any]], tiers: Sequence[str]) -> GangSpec:
    """The gang ``key`` ("<ns>/<name>") described by the ``gpuagent.dev/*`` annotations of its pods."""
    if not pods:
        raise GangError(f"gang {key}: no pods")
    size_raw = _agree(pods, ANN_GANG_SIZE, key)
    size = _int(size_raw, f"gang {key}: {ANN_GANG_SIZE}", minimum=1) if size_raw is not None else len(pods)
    mode = _agree(pods, ANN_MODE, key) or "hard"
    if mode not in ("hard", "soft"):
        raise GangError(f"gang {key}: {ANN_MODE}: expected hard or soft, got {mode!r}")
    gang_tier_raw = _agree(pods, ANN_GANG_TIER, key)
    gang_tier = tier_of(gang_tier_raw, tiers, f"gang {key}: {ANN_GANG_TIER}") if gang_tier_raw else None
    by_role: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        by_role.setdefault(_annotations(pod).get(ANN_ROLE) or "worker", []).append(pod)
    roles: list[Role] = []
    members: dict[str, PodSlot] = {}
    for rname in sorted(by_role):
        rpods = by_role[rname]
        where = f"gang {key} role {rname}"
        role_size = size if len(by_role) == 1 else len(rpods)
        if len(rpods) > role_size:
            raise GangError(f"gang {key}: {len(rpods)} pods but {ANN_GANG_SIZE} is {size}")
        sg_raw = _agree(rpods, ANN_SUBGROUP_SIZE, key)
        sg = _int(sg_raw, f"{where}: {ANN_SUBGROUP_SIZE}", minimum=1) if sg_raw is not None else None
        st_raw = _agree(rpods, ANN_SUBGROUP_TIER, key)
        st = tier_of(st_raw, tiers, f"{where}: {ANN_SUBGROUP_TIER}") if st_raw else None
        ms_raw = _agree(rpods, ANN_MIN_SUBGROUPS, key)
        ms = _int(ms_raw, f"{where}: {ANN_MIN_SUBGROUPS}", minimum=0) if ms_raw is not None else None
        if ms is not None and ms > -(-role_size // (sg or role_size)):
            raise GangError(f"{where}: {ANN_MIN_SUBGROUPS} {ms} is more than the gang's subgroups")
        gpus, res = _shape(rpods, where)
        roles.append(
            Role(
                name=rname,
                pods=role_size,
                gpus_per_pod=gpus,
                subgroup_size=sg,
                subgroup_tier=st,
                min_subgroups=ms,
                resources_per_pod=res,
            )
        )
        for idx, pod in _order(rpods, role_size, where):
            members[pod_key(pod)] = PodSlot(rname, idx)
    _bounded(roles, f"gang {key}")
    gang = Gang(name=key, roles=tuple(roles), tier=gang_tier, soft=mode == "soft")
    return GangSpec(key=key, gang=gang, members=members, min_member=_min_member(gang), source="annotations")


def _bounded(roles: Sequence[Role], where: str) -> None:
    total = sum(r.pods for r in roles)
    if total > MAX_GANG_PODS:
        raise _over(where, f"its roles' {total} pods")


def _min_member(gang: Gang) -> int:
    total = 0
    for r in gang.roles:
        if r.min_subgroups is not None and r.subgroup_size:
            total += min(r.pods, r.min_subgroups * r.subgroup_size)
        else:
            total += r.pods
    return total


# -- Volcano PodGroup ----------------------------------------------------------------------------


def _selects(selector: Any, labels: Mapping[str, str], where: str) -> bool:
    """A ``metav1.LabelSelector`` match (matchLabels and matchExpressions In/NotIn/Exists/DoesNotExist)."""
    if selector is None:
        return True
    if not isinstance(selector, Mapping):
        raise GangError(f"{where}: expected a label selector")
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for i, expr in enumerate(selector.get("matchExpressions") or []):
        op, k = expr.get("operator"), expr.get("key")
        values = expr.get("values") or []
        if op == "In":
            ok = labels.get(k) in values
        elif op == "NotIn":
            ok = labels.get(k) not in values
        elif op == "Exists":
            ok = k in labels
        elif op == "DoesNotExist":
            ok = k not in labels
        else:
            raise GangError(f"{where}.matchExpressions[{i}].operator: unknown operator {op!r}")
        if not ok:
            return False
    return True


def _network_topology(nt: Any, tiers: Sequence[str], where: str) -> tuple[str | None, bool]:
    """(tier or None, soft) of a ``networkTopology`` block."""
    if nt is None:
        return None, False
    if not isinstance(nt, Mapping):
        raise GangError(f"{where}: expected a mapping")
    mode = nt.get("mode") or "hard"
    if mode not in ("hard", "soft"):
        raise GangError(f"{where}.mode: expected hard or soft, got {mode!r}")
    by_num, by_name = nt.get("highestTierAllowed"), nt.get("highestTierName")
    if by_num is not None and by_name:
        raise GangError(f"{where}: set only one of highestTierAllowed and highestTierName")
    if by_name:
        return tier_of(str(by_name), tiers, f"{where}.highestTierName"), mode == "soft"
    if by_num is not None:
        return tier_of(
            _int(by_num, f"{where}.highestTierAllowed", minimum=0), tiers, f"{where}.highestTierAllowed"
        ), (mode == "soft")
    return None, mode == "soft"


def gang_from_podgroup(
    podgroup: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], tiers: Sequence[str]
) -> GangSpec:
    """The gang of a Volcano PodGroup and the pods (already joined by annotation) that belong to it."""
    ns = _meta(podgroup).get("namespace") or "default"
    key = f"{ns}/{_meta(podgroup).get('name', '')}"
    where = f"PodGroup {key}"
    spec = podgroup.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise GangError(f"{where}: spec: expected a mapping")
    min_member = _int(spec.get("minMember", 0), f"{where}: spec.minMember", minimum=0)
    gang_tier, soft = _network_topology(spec.get("networkTopology"), tiers, f"{where}: spec.networkTopology")
    policies = spec.get("subGroupPolicy") or []
    if not isinstance(policies, list):
        raise GangError(f"{where}: spec.subGroupPolicy: expected a list")
    assigned: dict[str, str] = {}
    by_policy: dict[str, list[Mapping[str, Any]]] = {}
    roles: list[Role] = []
    members: dict[str, PodSlot] = {}
    seen_names: set[str] = set()
    for i, pol in enumerate(policies):
        pwhere = f"{where}: spec.subGroupPolicy[{i}]"
        if not isinstance(pol, Mapping):
            raise GangError(f"{pwhere}: expected a mapping")
        name = str(pol.get("name") or f"subgroup-{i}")
        if name in seen_names or name == DEFAULT_ROLE:
            raise GangError(f"{pwhere}.name: duplicate or reserved name {name!r}")
        seen_names.add(name)
        chosen = []
        for pod in pods:
            if _selects(pol.get("labelSelector"), _labels(pod), f"{pwhere}.labelSelector"):
                pk = pod_key(pod)
                if pk in assigned:
                    raise GangError(
                        f"{where}: pod {pk} matches both subGroupPolicy {assigned[pk]!r} and {name!r}"
                    )
                assigned[pk] = name
                chosen.append(pod)
        by_policy[name] = chosen
        size = _int(pol.get("subGroupSize", 1), f"{pwhere}.subGroupSize", minimum=1)
        min_sg = _int(pol.get("minSubGroups", 0), f"{pwhere}.minSubGroups", minimum=0)
        sub_tier, sub_soft = _network_topology(pol.get("networkTopology"), tiers, f"{pwhere}.networkTopology")
        soft = soft or sub_soft
        keys = pol.get("matchLabelKeys") or []
        if not chosen:
            continue
        if keys:
            instances: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
            for pod in chosen:
                labels = _labels(pod)
                values = tuple(labels.get(k) for k in keys)
                if any(v is None for v in values):
                    raise GangError(f"{pwhere}.matchLabelKeys: pod {pod_key(pod)} lacks label(s) {keys}")
                instances.setdefault(values, []).append(pod)  # type: ignore[arg-type]
            order = sorted(
                instances, key=lambda vs: tuple((0, int(v)) if v.isdigit() else (1, v) for v in vs)
            )
            count = len(order) * size
            if count > MAX_GANG_PODS:
                raise _over(f"{pwhere}.subGroupSize", f"{len(order)} subgroup(s) x {size} = {count} pods")
            for n, values in enumerate(order):
                inst = instances[values]
                if len(inst) > size:
                    raise GangError(
                        f"{pwhere}: subgroup {dict(zip(keys, values, strict=True))} has {len(inst)} pods, "
                        f"more than subGroupSize {size}"
                    )
                for idx, pod in _order(inst, size, f"{pwhere} subgroup {n}"):
                    members[pod_key(pod)] = PodSlot(name, n * size + idx)
        else:
            count = max(len(chosen), size)
            for idx, pod in _order(chosen, count, pwhere):
                members[pod_key(pod)] = PodSlot(name, idx)
        if min_sg > -(-count // size):
            raise GangError(
                f"{pwhere}.minSubGroups: {min_sg} is more than the {-(-count // size)} subgroup(s)"
            )
        gpus, res = _shape(chosen, pwhere)
        roles.append(
            Role(
                name=name,
                pods=count,
                gpus_per_pod=gpus,
                subgroup_size=size,
                subgroup_tier=sub_tier,
                min_subgroups=min_sg or None,
                resources_per_pod=res,
            )
        )
    rest = [p for p in pods if pod_key(p) not in assigned]
    placed = sum(r.pods for r in roles)
    if rest or not roles:
        count = max(len(rest), min_member - placed, 1 if not roles else 0)
        if count > 0:
            gpus, res = _shape(rest, f"{where} role {DEFAULT_ROLE}")
            need = max(0, min_member - placed) if min_member else count
            elastic = need < count  # minMember below the pod count: the rest start when they fit
            roles.append(
                Role(
                    name=DEFAULT_ROLE,
                    pods=count,
                    gpus_per_pod=gpus,
                    subgroup_size=1 if elastic else None,
                    min_subgroups=need if elastic else None,
                    resources_per_pod=res,
                )
            )
            for idx, pod in _order(rest, count, f"{where} role {DEFAULT_ROLE}"):
                members[pod_key(pod)] = PodSlot(DEFAULT_ROLE, idx)
    _bounded(roles, where)
    gang = Gang(name=key, roles=tuple(roles), tier=gang_tier, soft=soft)
    total = sum(r.pods for r in roles)
    if min_member > total:
        # the policies count the pods that exist (and the subgroup instances they open): more may come
        raise GangIncompleteError(
            f"{where}: spec.minMember {min_member} is more than the {total} pods its policies describe so far"
        )
    return GangSpec(
        key=key,
        gang=gang,
        members=members,
        min_member=max(min_member, _min_member(gang)),
        source="podgroup",
    )


def gang_for_pod(
    pod: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    podgroups: Mapping[str, Mapping[str, Any]],
    tiers: Sequence[str],
) -> GangSpec | None:
    """The gang of ``pod`` (None for a pod on its own); ``podgroups`` is keyed ``"<ns>/<name>"``."""
    found = gang_key_of(pod)
    if found is None:
        return None
    source, key = found
    mates = [p for p in pods if gang_key_of(p) == found]
    if pod_key(pod) not in {pod_key(p) for p in mates}:
        mates.append(pod)
    if source == "podgroup":
        pg = podgroups.get(key)
        if pg is None:
            raise GangError(f"pod {pod_key(pod)}: PodGroup {key} ({GROUP_NAME}) does not exist")
        return gang_from_podgroup(pg, mates, tiers)
    return gang_from_annotations(key, mates, tiers)
