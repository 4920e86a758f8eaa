"""Gangs from Kubernetes objects: Volcano and native PodGroups, KubeRay RayClusters, our annotations. Pure.

Four sources, all plain dicts as the API serves them. A pod's gang is the first that applies
(``gang_key_of``), so an explicit declaration wins over KubeRay's labels:

- **Native PodGroup** (``scheduling.k8s.io/v1beta1``, Kubernetes 1.37, gate ``GenericWorkload``): pods
  that name it in ``spec.schedulingGroup.podGroupName`` (same namespace) are the gang. The PodGroup is
  read as kube-scheduler reads it: ``schedulingPolicy.gang.minCount`` is the minimum (``basic``: 1);
  fewer live pods than that wait (as kube-scheduler's PreEnqueue does, also while the PodGroup does not
  exist yet); more start elastically, the minimum all-or-nothing. ``schedulingConstraints.topology[0].key``
  (a node-label key) puts the whole group inside one domain of our tier of that label:
  ``gpuagent.dev/nvlink-domain`` or ``nvidia.com/gpu.clique`` -> ``nvlink``, ``gpuagent.dev/ib-leaf`` ->
  ``leaf``, ``gpuagent.dev/<tier>-domain`` -> ``<tier>``; any other key is an error (the extender
  places by its tiers, not by arbitrary labels). The role is named after ``workloadRef.templateName``; a
  ``Workload`` the extender knows must have that template. Pods of different requests in one group
  become roles ``<template>-0``, ``-1``, ... planned whole, with ``minCount`` as the barrier's minimum.
  A CompositePodGroup parent (v1alpha3) is not read: each PodGroup is its own gang. The API has no
  subgroup field: the PodGroup's annotations ``gpuagent.dev/subgroup-size: auto`` (only ``auto``) and
  ``gpuagent.dev/subgroup-size-min`` size its one role ``auto`` (one pod shape, ``minCount`` = its pods).
- **Volcano PodGroup** (``scheduling.volcano.sh/v1beta1``), joined to pods by the pod annotation
  ``scheduling.k8s.io/group-name`` (same namespace). ``minMember`` is the gang minimum;
  ``networkTopology{mode, highestTierAllowed | highestTierName}`` bounds the whole gang;
  each ``subGroupPolicy`` entry becomes a role: its pods (by ``labelSelector``) are cut into
  subgroups of ``subGroupSize`` (instances by ``matchLabelKeys`` values when given, else
  consecutive ranks), with ``minSubGroups`` and its own ``networkTopology``. Pods no policy selects
  form the role ``default``. ``subGroupSize`` is an integer, so the PodGroup annotation
  ``gpuagent.dev/subgroup-size-auto: <policy name>`` sizes that entry ``auto`` (with the PodGroup's
  ``gpuagent.dev/subgroup-size-min``); the entry keeps ``subGroupSize`` 1 and no ``minSubGroups`` nor
  ``matchLabelKeys``.
- **Annotations** on each pod: ``gpuagent.dev/gang`` (name, namespaced), ``gpuagent.dev/gang-size``,
  optional ``gpuagent.dev/subgroup-size``, ``gpuagent.dev/subgroup-tier``, ``gpuagent.dev/gang-tier``,
  ``gpuagent.dev/min-subgroups``, ``gpuagent.dev/topology-mode`` (``hard``/``soft``) and
  ``gpuagent.dev/role``; the rank comes from ``batch.kubernetes.io/job-completion-index`` (label or
  annotation) or ``gpuagent.dev/rank``.
- **KubeRay RayCluster** (``ray.io/v1``): the head and worker pods KubeRay labels ``ray.io/cluster``
  (with ``ray.io/node-type`` ``head``/``worker`` and ``ray.io/group``) form the gang ``<ns>/<cluster>``.
  The RayCluster object, not its pods, gives the shape: the role ``headgroup`` (one pod) and one role
  per worker group, named by ``groupName``, of replicas x ``numOfHosts`` pods (replicas clamped to
  ``minReplicas..maxReplicas`` as KubeRay does; a suspended group has none). The user writes the
  topology as annotations: on a worker group's pod template (``metadata.annotations``, which KubeRay
  copies to the pods), else on the RayCluster for every worker group, ``gpuagent.dev/subgroup-tier``
  (each subgroup inside one domain of that tier) and ``gpuagent.dev/subgroup-size`` (pods per
  subgroup, or ``auto`` with ``gpuagent.dev/subgroup-size-min``, never with the autoscaler's minimum
  below the replicas; with a tier and no size the whole worker group is one subgroup); on the RayCluster,
  ``gpuagent.dev/gang-tier`` and ``gpuagent.dev/topology-mode`` for the whole cluster. Minimum: every
  desired pod (KubeRay's own Volcano ``minMember``); with ``enableInTreeAutoscaling: true`` the head and
  ``minReplicas`` x ``numOfHosts`` per worker group, in whole subgroups (size 1 without a subgroup
  size; a group that is one subgroup starts whole). A worker's rank is KubeRay's multi-host index
  (``ray.io/worker-group-replica-index`` x hosts + ``ray.io/replica-host-index``) where set, else by
  pod name. A suspended cluster, an unknown RayCluster and more pods than the spec wants (the operator
  scaling down) wait; other pod types (``redis-cleanup``) are pods on their own.

Tiers are given by name or by number (1 = the first tier of the cluster). Every contradiction raises
``GangError`` with a message that names the object and the field; what more pods or objects will
resolve raises ``GangIncompleteError`` (wait). Sizes are bounded: no count (gang size, subgroup size,
minimum, rank, a worker group's replicas x hosts) may exceed ``MAX_GANG_PODS``, nor may a gang's roles
together, so a hostile annotation (``gang-size: "1000000000"``) or ``replicas: 2147483647`` is an error
naming the field and the limit, never a plan the planner would spend minutes and gigabytes on. A gang
has at most ``MAX_GANG_ROLES`` roles and a Volcano PodGroup's selectors at most ``MAX_SELECTOR_TERMS``
terms, both checked before their entries are read, so the work per gang is linear in its pods. A label
selector is read as the API server validates one (a mapping ``matchLabels`` of strings; each expression
a key, a known operator and a list of string values, non-empty for ``In``/``NotIn``, empty otherwise).
Whatever shape no check foresaw is a ``GangError`` of that gang alone (``gang_for_pod``).


``gang_for_pod`` makes an annotation gang and a RayCluster wait (``GangIncompleteError``) until a pod
exists for each of their places: nothing is planned, nor held, for pods that do not exist (one pod may
declare ``gang-size: "8"``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from scheduler_plugin.cluster import CPU, GPU, LABEL_FALLBACK, MEMORY, pod_key, pod_requests
from scheduler_plugin.snapshot import MAX_GANG_PODS, Gang, PodSlot, Role

GROUP_NAME = "scheduling.k8s.io/group-name"
ANN_GANG = "gpuagent.dev/gang"
ANN_GANG_SIZE = "gpuagent.dev/gang-size"
ANN_SUBGROUP_SIZE = "gpuagent.dev/subgroup-size"
ANN_SUBGROUP_SIZE_MIN = "gpuagent.dev/subgroup-size-min"  # with subgroup-size: auto (default 1)
AUTO = "auto"  # gpuagent.dev/subgroup-size: auto — the planner chooses the size from ready trays
# on a Volcano PodGroup (whose subGroupSize is an integer): the subGroupPolicy sized ``auto``, by name
ANN_SUBGROUP_SIZE_AUTO = "gpuagent.dev/subgroup-size-auto"
ANN_SUBGROUP_TIER = "gpuagent.dev/subgroup-tier"
ANN_GANG_TIER = "gpuagent.dev/gang-tier"
ANN_MIN_SUBGROUPS = "gpuagent.dev/min-subgroups"
ANN_MODE = "gpuagent.dev/topology-mode"
ANN_ROLE = "gpuagent.dev/role"
ANN_RANK = "gpuagent.dev/rank"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
DEFAULT_ROLE = "default"

MAX_GANG_ROLES = 100
"""The most roles one gang may have (Volcano ``subGroupPolicy`` entries, RayCluster worker groups with
the head, ``gpuagent.dev/role`` values, native PodGroup pod shapes). Each role costs a pass over the
gang's pods and the cluster's nodes; real jobs have a handful, so more is an invalid gang naming this
limit, found before any of them is read."""

MAX_SELECTOR_TERMS = 256
"""The most label terms one Volcano PodGroup's ``subGroupPolicy`` may have, all entries together: each
``matchLabels`` entry, ``matchExpressions`` entry, value in an expression's ``values`` and
``matchLabelKeys`` entry counts one. Every pod of the gang is matched against them, so this bounds that
work per pod."""


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
    source: str  # "podgroup", "annotations", "raycluster" or "workload"


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
    """``(source, "<ns>/<name>")`` of the gang a pod belongs to, or None for a pod on its own.

    The first that applies: ``spec.schedulingGroup.podGroupName`` (``workload``), the Volcano group
    annotation (``podgroup``), ``gpuagent.dev/gang`` (``annotations``), KubeRay's ``ray.io/cluster`` on a
    head or worker (``raycluster``).
    """
    ns = _meta(pod).get("namespace") or "default"
    spec = pod.get("spec")
    group = spec.get("schedulingGroup") if isinstance(spec, Mapping) else None
    native = group.get("podGroupName") if isinstance(group, Mapping) else None
    if isinstance(native, str) and native:
        return "workload", f"{ns}/{native}"
    ann = _annotations(pod)
    if ann.get(GROUP_NAME):
        return "podgroup", f"{ns}/{ann[GROUP_NAME]}"
    if ann.get(ANN_GANG):
        return "annotations", f"{ns}/{ann[ANN_GANG]}"
    labels = _labels(pod)
    ray = labels.get(RAY_CLUSTER)
    if isinstance(ray, str) and ray and labels.get(RAY_NODE_TYPE) in RAY_NODE_TYPES:
        return "raycluster", f"{ns}/{ray}"
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
    raise GangError(f"{where}: unknown tier {_repr(value)}; cluster tiers: {', '.join(tiers) or 'none'}")


_MAX_DIGITS = len(str(MAX_GANG_PODS))  # a count with more digits is over the limit, whatever it is


def _digits(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` also accepts ``"²"``, which ``int`` refuses)."""
    return text.isascii() and text.isdigit()


def _over(where: str, shown: str) -> GangError:
    return GangError(f"{where}: {shown} is over the limit of {MAX_GANG_PODS} pods per gang")


def _over_roles(where: str, shown: str) -> GangError:
    return GangError(f"{where}: {shown} is over the limit of {MAX_GANG_ROLES} roles per gang")


def _over_terms(where: str, shown: str) -> GangError:
    return GangError(
        f"{where}: {shown} take the PodGroup over the limit of {MAX_SELECTOR_TERMS} label terms "
        "(matchLabels entries, matchExpressions, their values and matchLabelKeys of all its "
        "subGroupPolicy entries together)"
    )


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
        raise GangError(f"{where}: expected an integer >= {minimum}, got {_repr(n)}")
    if n > MAX_GANG_PODS:
        raise _over(where, _shown(str(n)) if n.bit_length() < 10_000 else "a number")
    return n


def _repr(value: Any) -> str:
    """A value for a message: long strings cut, a huge integer not printed (Python refuses to print
    one of more than 4300 digits, and nobody needs to read it)."""
    if isinstance(value, str) and len(value) > 40:
        return f"{value[:40]!r}..."
    if isinstance(value, int) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (Mapping, list)):
        return type(value).__name__  # never render a hostile structure
    return repr(value)[:60]


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
        try:
            req = pod_requests(pod)
        except (AttributeError, TypeError) as exc:  # containers or resources of the wrong type
            raise GangError(f"{where}: pod {pod_key(pod)}: malformed spec.containers ({exc})") from None
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


def _order(
    pods: Iterable[Mapping[str, Any]],
    size: int,
    where: str,
    rank: Callable[[Mapping[str, Any]], int | None] = pod_rank,
) -> list[tuple[int, Mapping[str, Any]]]:
    """Index each pod: ranked pods at their rank, the rest (by name) in the free indices."""
    ranked: dict[int, Mapping[str, Any]] = {}
    unranked: list[Mapping[str, Any]] = []
    for pod in pods:
        r = rank(pod)
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
    if len(by_role) > MAX_GANG_ROLES:
        raise _over_roles(f"gang {key}: {ANN_ROLE}", f"{len(by_role)} different roles")
    roles: list[Role] = []
    members: dict[str, PodSlot] = {}
    for rname in sorted(by_role):
        rpods = by_role[rname]
        where = f"gang {key} role {rname}"
        role_size = size if len(by_role) == 1 else len(rpods)
        if len(rpods) > role_size:
            raise GangError(f"gang {key}: {len(rpods)} pods but {ANN_GANG_SIZE} is {size}")
        sg, auto_min = _annotated_size(rpods, key, where, role_size)
        st_raw = _agree(rpods, ANN_SUBGROUP_TIER, key)
        st = tier_of(st_raw, tiers, f"{where}: {ANN_SUBGROUP_TIER}") if st_raw else None
        ms_raw = _agree(rpods, ANN_MIN_SUBGROUPS, key)
        ms = _int(ms_raw, f"{where}: {ANN_MIN_SUBGROUPS}", minimum=0) if ms_raw is not None else None
        if ms is not None and auto_min is not None:
            raise GangError(
                f"{where}: {ANN_MIN_SUBGROUPS} cannot be combined with {ANN_SUBGROUP_SIZE}: {AUTO} "
                "(the subgroups' size is chosen by the plan)"
            )
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
                subgroup_auto_min=auto_min,
            )
        )
        for idx, pod in _order(rpods, role_size, where):
            members[pod_key(pod)] = PodSlot(rname, idx)
    _one_auto(roles, f"gang {key}")
    _bounded(roles, f"gang {key}")
    gang = Gang(name=key, roles=tuple(roles), tier=gang_tier, soft=mode == "soft")
    return GangSpec(key=key, gang=gang, members=members, min_member=_min_member(gang), source="annotations")


def _annotated_size(
    rpods: Sequence[Mapping[str, Any]], key: str, where: str, role_size: int
) -> tuple[int | None, int | None]:
    """``(subgroup size, auto minimum)`` of a role from ``gpuagent.dev/subgroup-size`` (a count, or
    ``auto`` with ``gpuagent.dev/subgroup-size-min``, default 1, at most the role's pods)."""
    return _size_or_auto(
        _agree(rpods, ANN_SUBGROUP_SIZE, key),
        _agree(rpods, ANN_SUBGROUP_SIZE_MIN, key),
        f"{where}: {ANN_SUBGROUP_SIZE}",
        f"{where}: {ANN_SUBGROUP_SIZE_MIN}",
        role_size,
    )


def _size_or_auto(
    size_raw: str | None, min_raw: str | None, size_field: str, min_field: str, role_size: int
) -> tuple[int | None, int | None]:
    """``(subgroup size, auto minimum)`` from a subgroup-size value (a count, ``auto`` or absent) and a
    subgroup-size-min value (read only with ``auto``: at least 1, default 1, at most ``role_size``).
    Every source that carries ``gpuagent.dev/subgroup-size`` reads it here, so the messages agree."""
    if size_raw is None or size_raw.strip() != AUTO:
        if min_raw is not None:
            raise GangError(f"{min_field} is read only with {ANN_SUBGROUP_SIZE}: {AUTO}")
        return (_int(size_raw, size_field, minimum=1) if size_raw is not None else None), None
    minimum = _int(min_raw, min_field, minimum=1) if min_raw is not None else 1
    if minimum > role_size:
        raise GangError(f"{min_field} {minimum} is more than the role's {role_size} pods")
    return None, minimum


def _one_auto(roles: Sequence[Role], where: str) -> None:
    """At most one role of a gang is sized ``auto`` (the planner sizes one role per plan)."""
    autos = [r.name for r in roles if r.subgroup_auto_min is not None]
    if len(autos) > 1:
        raise GangError(
            f"{where}: roles {autos[0]} and {autos[1]} both have {ANN_SUBGROUP_SIZE}: {AUTO}; "
            "at most one role of a gang may"
        )


def _bounded(roles: Sequence[Role], where: str, total: int | None = None) -> None:
    """At most ``MAX_GANG_ROLES`` roles of ``MAX_GANG_PODS`` pods together (``total``, when the caller
    keeps the sum as it adds roles)."""
    if len(roles) > MAX_GANG_ROLES:
        raise _over_roles(where, f"its {len(roles)} roles")
    total = sum(r.pods for r in roles) if total is None else total
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


_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class _Selector:
    """A validated ``metav1.LabelSelector``: ``matchLabels`` pairs and ``matchExpressions`` as
    (operator, key, values), each values list a set, so one match costs one look-up per requirement."""

    labels: tuple[tuple[str, str], ...]
    expressions: tuple[tuple[str, str, frozenset[str]], ...]

    def matches(self, labels: Mapping[str, Any]) -> bool:
        for k, v in self.labels:
            if labels.get(k) != v:
                return False
        for op, k, values in self.expressions:
            value = labels.get(k)
            if op == "In":
                ok = isinstance(value, str) and value in values
            elif op == "NotIn":
                ok = not (isinstance(value, str) and value in values)
            elif op == "Exists":
                ok = k in labels
            else:
                ok = k not in labels
            if not ok:
                return False
        return True


_ALL = _Selector((), ())


def _label_string(value: Any, where: str, what: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty):
        raise GangError(f"{where}: expected {what}, got {_repr(value)}")
    return value


def _selector(selector: Any, where: str, budget: int) -> tuple[_Selector, int]:
    """A ``metav1.LabelSelector`` read as the API server validates one, and its terms (``matchLabels``
    entries, ``matchExpressions`` and their values): more than ``budget`` is an error, found before
    the entries are read."""
    if selector is None:
        return _ALL, 0
    if not isinstance(selector, Mapping):
        raise GangError(f"{where}: expected a label selector (a mapping), got {_repr(selector)}")
    match_labels = selector.get("matchLabels")
    if match_labels is None:
        match_labels = {}
    if not isinstance(match_labels, Mapping):
        raise GangError(
            f"{where}.matchLabels: expected a mapping of label to value, got {_repr(match_labels)}"
        )
    exprs = selector.get("matchExpressions")
    if exprs is None:
        exprs = []
    if not isinstance(exprs, list):
        raise GangError(f"{where}.matchExpressions: expected a list, got {_repr(exprs)}")
    terms = len(match_labels) + len(exprs)
    if terms > budget:
        raise _over_terms(where, f"{len(match_labels)} matchLabels and {len(exprs)} matchExpressions")
    pairs = []
    for k, v in match_labels.items():
        key = _label_string(k, f"{where}.matchLabels", "label keys that are strings")
        pairs.append((key, _label_string(v, f"{where}.matchLabels[{key[:63]}]", "a string", empty=True)))
    expressions = []
    for i, raw in enumerate(exprs):
        ewhere = f"{where}.matchExpressions[{i}]"
        expr = _mapping(raw, ewhere)
        key = _label_string(expr.get("key"), f"{ewhere}.key", "a label key")
        op = expr.get("operator")
        if op not in _OPERATORS:
            raise GangError(
                f"{ewhere}.operator: unknown operator {_repr(op)} (one of {', '.join(_OPERATORS)})"
            )
        values = expr.get("values")
        if values is None:
            values = []
        if not isinstance(values, list):
            raise GangError(f"{ewhere}.values: expected a list of strings, got {_repr(values)}")
        terms += len(values)
        if terms > budget:
            raise _over_terms(f"{ewhere}.values", f"{len(values)} values")
        if op in ("In", "NotIn") and not values:
            raise GangError(f"{ewhere}.values: operator {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and values:
            raise GangError(f"{ewhere}.values: operator {op} takes no values, got {len(values)}")
        for j, v in enumerate(values):
            _label_string(v, f"{ewhere}.values[{j}]", "a string", empty=True)
        expressions.append((str(op), key, frozenset(values)))
    return _Selector(tuple(pairs), tuple(expressions)), terms


def _label_keys(keys: Any, where: str, budget: int) -> tuple[str, ...]:
    """``matchLabelKeys``: label keys, as strings, at most ``budget`` of them."""
    if keys is None:
        return ()
    if not isinstance(keys, list):
        raise GangError(f"{where}: expected a list of label keys, got {_repr(keys)}")
    if len(keys) > budget:
        raise _over_terms(where, f"{len(keys)} keys")
    return tuple(_label_string(k, f"{where}[{i}]", "a label key") for i, k in enumerate(keys))


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


def _keyed_members(  # noqa: PLR0917 -- private helper of ``gang_from_podgroup``, called once
    chosen: Sequence[Mapping[str, Any]],
    keys: Sequence[str],
    size: int,
    name: str,
    pwhere: str,
    members: dict[str, PodSlot],
) -> int:
    """A subGroupPolicy with ``matchLabelKeys``: one subgroup of ``size`` places per distinct value of
    ``keys`` (numbers in numeric order), each pod's place entered in ``members``; returns the pods the
    role has places for."""
    instances: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for pod in chosen:
        labels = _labels(pod)
        values = tuple(labels.get(k) for k in keys)
        if not all(isinstance(v, str) for v in values):
            raise GangError(f"{pwhere}.matchLabelKeys: pod {pod_key(pod)} lacks label(s) {', '.join(keys)}")
        instances.setdefault(values, []).append(pod)  # type: ignore[arg-type]
    order = sorted(
        instances,
        key=lambda vs: tuple((0, int(v)) if _digits(v) and len(v) <= 20 else (1, v) for v in vs),
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
    return count


def _volcano_auto(
    podgroup: Mapping[str, Any], policies: Sequence[Any], where: str
) -> tuple[str | None, str | None]:
    """The Volcano PodGroup's policy sized ``auto`` (``gpuagent.dev/subgroup-size-auto``, naming one
    ``subGroupPolicy`` entry) and its ``gpuagent.dev/subgroup-size-min``, both raw."""
    ann = _annotations(podgroup)
    named, min_raw = ann.get(ANN_SUBGROUP_SIZE_AUTO), ann.get(ANN_SUBGROUP_SIZE_MIN)
    field = f"{where}: metadata.annotations[{ANN_SUBGROUP_SIZE_AUTO}]"
    if named is None:
        if min_raw is not None:
            raise GangError(
                f"{where}: metadata.annotations[{ANN_SUBGROUP_SIZE_MIN}] is read only with "
                f"{ANN_SUBGROUP_SIZE_AUTO} (the subGroupPolicy sized {AUTO})"
            )
        return None, None
    names = [
        (p.get("name") or f"subgroup-{i}") if isinstance(p, Mapping) else None for i, p in enumerate(policies)
    ]
    if not isinstance(named, str) or named not in names:
        known = ", ".join(_repr(n) for n in names[:10] if isinstance(n, str)) or "none"
        raise GangError(f"{field}: {_repr(named)} names no subGroupPolicy entry (they are: {known})")
    return named, (str(min_raw) if min_raw is not None else None)


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
        raise GangError(f"{where}: spec.subGroupPolicy: expected a list, got {_repr(policies)}")
    if len(policies) > MAX_GANG_ROLES:
        raise _over_roles(f"{where}: spec.subGroupPolicy", f"{len(policies)} entries")
    if len(pods) > MAX_GANG_PODS:  # before matching them: each would take a place of its own
        raise _over(where, f"its {len(pods)} pods")
    auto_policy, auto_min_raw = _volcano_auto(podgroup, policies, where)
    pod_labels = [(pod, _labels(pod)) for pod in pods]
    assigned: dict[str, str] = {}
    roles: list[Role] = []
    members: dict[str, PodSlot] = {}
    seen_names: set[str] = set()
    budget = MAX_SELECTOR_TERMS
    for i, pol in enumerate(policies):
        pwhere = f"{where}: spec.subGroupPolicy[{i}]"
        if not isinstance(pol, Mapping):
            raise GangError(f"{pwhere}: expected a mapping")
        raw_name = pol.get("name")
        if raw_name is not None and raw_name != "" and not isinstance(raw_name, str):
            raise GangError(f"{pwhere}.name: expected a name, got {_repr(raw_name)}")
        name = raw_name or f"subgroup-{i}"
        if name in seen_names or name == DEFAULT_ROLE:
            raise GangError(f"{pwhere}.name: duplicate or reserved name {_repr(name)}")
        seen_names.add(name)
        selector, terms = _selector(pol.get("labelSelector"), f"{pwhere}.labelSelector", budget)
        budget -= terms
        keys = _label_keys(pol.get("matchLabelKeys"), f"{pwhere}.matchLabelKeys", budget)
        budget -= len(keys)
        chosen = []
        for pod, labels in pod_labels:
            if selector.matches(labels):
                pk = pod_key(pod)
                if pk in assigned:
                    both = f"{_repr(assigned[pk])} and {_repr(name)}"
                    raise GangError(f"{where}: pod {pk} matches both subGroupPolicy {both}")
                assigned[pk] = name
                chosen.append(pod)
        size = _int(pol.get("subGroupSize", 1), f"{pwhere}.subGroupSize", minimum=1)
        min_sg = _int(pol.get("minSubGroups", 0), f"{pwhere}.minSubGroups", minimum=0)
        sub_tier, sub_soft = _network_topology(pol.get("networkTopology"), tiers, f"{pwhere}.networkTopology")
        soft = soft or sub_soft
        auto_min = None
        if name == auto_policy:
            awhere = f"{where}: metadata.annotations[{ANN_SUBGROUP_SIZE_AUTO}] ({name})"
            if size != 1 or min_sg or keys:
                raise GangError(
                    f"{awhere}: the policy sized {AUTO} must leave {pwhere}.subGroupSize at 1 (Volcano's "
                    "default) and set no minSubGroups nor matchLabelKeys: the plan chooses its subgroups"
                )
            _, auto_min = _size_or_auto(
                AUTO,
                auto_min_raw,
                awhere,
                f"{where}: metadata.annotations[{ANN_SUBGROUP_SIZE_MIN}]",
                MAX_GANG_PODS,  # against the role's pods once all exist (below)
            )
        if not chosen:
            continue
        if keys:
            count = _keyed_members(chosen, keys, size, name, pwhere, members)
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
                subgroup_size=None if auto_min is not None else size,
                subgroup_tier=sub_tier,
                min_subgroups=min_sg or None,
                resources_per_pod=res,
                subgroup_auto_min=auto_min,
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
    for r in roles:
        if r.subgroup_auto_min is not None and r.subgroup_auto_min > r.pods:
            raise GangError(
                f"{where}: metadata.annotations[{ANN_SUBGROUP_SIZE_MIN}] {r.subgroup_auto_min} is more than "
                f"the {r.pods} pods of subGroupPolicy {r.name!r}"
            )
    return GangSpec(
        key=key,
        gang=gang,
        members=members,
        min_member=max(min_member, _min_member(gang)),
        source="podgroup",
    )


# -- shared by the RayCluster and native PodGroup sources ----------------------------------------


def _mapping(value: Any, where: str, *, optional: bool = False) -> Mapping[str, Any]:
    if value is None and optional:
        return {}
    if not isinstance(value, Mapping):
        raise GangError(f"{where}: expected a mapping, got {_repr(value)}")
    return value


def _live(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pods that still count: not being deleted, not finished (a replacement may already exist)."""
    out = []
    for pod in pods:
        status = pod.get("status")
        phase = status.get("phase") if isinstance(status, Mapping) else None
        if _meta(pod).get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
            continue
        out.append(pod)
    return out


def _template_pod(template: Mapping[str, Any], namespace: str, name: str) -> Mapping[str, Any]:
    """A pod template as a pod, to read its requests before any of its pods exists."""
    return {"metadata": {"namespace": namespace, "name": name}, "spec": template.get("spec")}


def _int32(value: Any, where: str, default: int) -> int:
    """A Kubernetes ``int32`` field: absent gives ``default``; a JSON integer in 0..2^31-1, else an error."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise GangError(f"{where}: expected an integer, got {_repr(value)}")
    if not 0 <= value <= _INT32_MAX:
        shown = str(value) if value.bit_length() < 256 else "a number"
        raise GangError(f"{where}: {shown} is outside 0..{_INT32_MAX}")
    return value


_INT32_MAX = 2**31 - 1


# -- KubeRay RayCluster --------------------------------------------------------------------------

RAY_CLUSTER = "ray.io/cluster"
RAY_GROUP = "ray.io/group"
RAY_NODE_TYPE = "ray.io/node-type"
RAY_HEAD_GROUP = "headgroup"  # the ray.io/group KubeRay gives the head; the head's role
RAY_REPLICA_INDEX = "ray.io/worker-group-replica-index"  # KubeRay's alpha RayMultiHostIndexing
RAY_HOST_INDEX = "ray.io/replica-host-index"
RAY_NODE_TYPES = ("head", "worker")  # other types (redis-cleanup) are pods on their own


def _ray_setting(
    template: Mapping[str, Any], raycluster: Mapping[str, Any], key: str, gwhere: str, where: str
) -> tuple[str | None, str]:
    """An annotation of the worker group's pod template, else of the RayCluster; and where it came from."""
    value = _annotations(template).get(key)
    if value is not None:
        return str(value), f"{gwhere}.template.metadata.annotations[{key}]"
    value = _annotations(raycluster).get(key)
    return (str(value) if value is not None else None), f"{where}: metadata.annotations[{key}]"


def _ray_worker_counts(group: Mapping[str, Any], gwhere: str) -> tuple[int, int, int]:
    """``(pods, minimum pods, hosts per replica)`` of a worker group, replicas clamped as KubeRay does."""
    suspend = group.get("suspend")
    if suspend is not None and not isinstance(suspend, bool):
        raise GangError(f"{gwhere}.suspend: expected true or false, got {_repr(suspend)}")
    replicas_raw = group.get("replicas")
    replicas = None if replicas_raw is None else _int32(replicas_raw, f"{gwhere}.replicas", 0)
    low = _int32(group.get("minReplicas"), f"{gwhere}.minReplicas", 0)
    high = _int32(group.get("maxReplicas"), f"{gwhere}.maxReplicas", _INT32_MAX)
    hosts = _int32(group.get("numOfHosts"), f"{gwhere}.numOfHosts", 1) or 1  # 0 is omitted, then defaulted
    if suspend:
        return 0, 0, hosts
    if low > high:
        desired = high
    elif replicas is None or replicas < low:
        desired = low
    else:
        desired = min(replicas, high)
    pods = desired * hosts
    if pods > MAX_GANG_PODS:
        raise _over(gwhere, f"{desired} replica(s) x {hosts} host(s) = {pods} pods")
    return pods, min(low, high) * hosts, hosts


def _ray_rank(hosts: int) -> Callable[[Mapping[str, Any]], int | None]:
    """A worker's rank from KubeRay's multi-host index labels (replica x hosts + host), else ``pod_rank``."""

    def rank(pod: Mapping[str, Any]) -> int | None:
        labels = _labels(pod)
        rep, host = str(labels.get(RAY_REPLICA_INDEX, "")), str(labels.get(RAY_HOST_INDEX, ""))
        if _digits(rep) and _digits(host) and max(len(rep), len(host)) <= _MAX_DIGITS:
            return int(rep) * hosts + int(host)
        return pod_rank(pod)

    return rank


def gang_from_raycluster(
    raycluster: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], tiers: Sequence[str]
) -> GangSpec:
    """The gang of a KubeRay ``RayCluster`` (``ray.io/v1``) and its live pods (joined by ``ray.io/cluster``).

    Roles: ``headgroup`` (one pod), then one per worker group in spec order, named by ``groupName``, of
    replicas x ``numOfHosts`` pods (replicas clamped to ``minReplicas..maxReplicas`` as KubeRay does; a
    suspended group has none). Requests come from the pods, or from the group's template before any pod
    exists.
    """
    meta = _meta(raycluster)
    ns = meta.get("namespace") or "default"
    key = f"{ns}/{meta.get('name', '')}"
    where = f"RayCluster {key}"
    spec = _mapping(raycluster.get("spec"), f"{where}: spec")
    if spec.get("suspend") is True:
        raise GangIncompleteError(f"{where}: spec.suspend is true; its pods wait until it is resumed")
    auto = spec.get("enableInTreeAutoscaling")
    if auto is not None and not isinstance(auto, bool):
        raise GangError(f"{where}: spec.enableInTreeAutoscaling: expected true or false, got {_repr(auto)}")
    ann = _annotations(raycluster)
    mode = str(ann.get(ANN_MODE) or "hard")
    if mode not in ("hard", "soft"):
        raise GangError(
            f"{where}: metadata.annotations[{ANN_MODE}]: expected hard or soft, got {_repr(mode)}"
        )
    gang_tier_raw = ann.get(ANN_GANG_TIER)
    gang_tier = (
        tier_of(str(gang_tier_raw), tiers, f"{where}: metadata.annotations[{ANN_GANG_TIER}]")
        if gang_tier_raw
        else None
    )
    head = _mapping(spec.get("headGroupSpec"), f"{where}: spec.headGroupSpec")
    head_template = _mapping(head.get("template"), f"{where}: spec.headGroupSpec.template")
    groups = spec.get("workerGroupSpecs")
    if groups is None:
        groups = []
    if not isinstance(groups, list):
        raise GangError(f"{where}: spec.workerGroupSpecs: expected a list, got {_repr(groups)}")
    if len(groups) + 1 > MAX_GANG_ROLES:  # the head is a role too
        raise _over_roles(f"{where}: spec.workerGroupSpecs", f"{len(groups)} worker groups with the head")

    by_group: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        labels = _labels(pod)
        node_type, group = labels.get(RAY_NODE_TYPE), labels.get(RAY_GROUP)
        if node_type == "head" and group != RAY_HEAD_GROUP:
            raise GangError(
                f"{where}: pod {pod_key(pod)} is the head ({RAY_NODE_TYPE}=head) but its {RAY_GROUP} is "
                f"{_repr(group)}, not {RAY_HEAD_GROUP!r}"
            )
        if node_type == "worker" and group == RAY_HEAD_GROUP:
            raise GangError(f"{where}: pod {pod_key(pod)} is a worker with {RAY_GROUP}={RAY_HEAD_GROUP}")
        if not isinstance(group, str) or not group:
            raise GangError(f"{where}: pod {pod_key(pod)} has no {RAY_GROUP} label")
        by_group.setdefault(group, []).append(pod)

    roles: list[Role] = []
    members: dict[str, PodSlot] = {}
    heads = by_group.pop(RAY_HEAD_GROUP, [])
    if len(heads) > 1:
        raise GangIncompleteError(
            f"{where}: {len(heads)} head pods ({', '.join(sorted(pod_key(p) for p in heads))}); "
            "waiting for the operator to keep one"
        )
    hwhere = f"{where} role {RAY_HEAD_GROUP}"
    gpus, res = _shape(heads or [_template_pod(head_template, ns, f"{key} head template")], hwhere)
    roles.append(Role(name=RAY_HEAD_GROUP, pods=1, gpus_per_pod=gpus, resources_per_pod=res))
    total = 1
    for idx, pod in _order(heads, 1, hwhere, rank=lambda _: None):
        members[pod_key(pod)] = PodSlot(RAY_HEAD_GROUP, idx)

    seen = {RAY_HEAD_GROUP}
    for i, raw in enumerate(groups):
        gwhere = f"{where}: spec.workerGroupSpecs[{i}]"
        spec_group = _mapping(raw, gwhere)
        name = spec_group.get("groupName")
        if not isinstance(name, str) or not name:
            raise GangError(f"{gwhere}.groupName: expected a non-empty name, got {_repr(name)}")
        if name in seen:
            raise GangError(f"{gwhere}.groupName: {name!r} is used twice or is the head's ({RAY_HEAD_GROUP})")
        seen.add(name)
        template = _mapping(spec_group.get("template"), f"{gwhere}.template")
        count, minimum, hosts = _ray_worker_counts(spec_group, gwhere)
        gpods = by_group.pop(name, [])
        if len(gpods) > count:
            raise GangIncompleteError(
                f"{where}: worker group {name} has {len(gpods)} pod(s), more than the {count} its spec "
                "wants; waiting for the operator to remove the rest"
            )
        if count == 0:
            continue
        rwhere = f"{where} worker group {name}"
        tier_raw, tier_field = _ray_setting(template, raycluster, ANN_SUBGROUP_TIER, gwhere, where)
        sub_tier = tier_of(tier_raw, tiers, tier_field) if tier_raw else None
        size_raw, size_field = _ray_setting(template, raycluster, ANN_SUBGROUP_SIZE, gwhere, where)
        min_raw, min_field = _ray_setting(template, raycluster, ANN_SUBGROUP_SIZE_MIN, gwhere, where)
        size, auto_min = _size_or_auto(size_raw, min_raw, size_field, min_field, count)
        if sub_tier is not None and size is None and auto_min is None:
            size = count  # the whole worker group inside one domain
        min_sg = None
        if auto_min is not None and auto and minimum < count:
            raise GangError(
                f"{size_field}: {AUTO} cannot be combined with spec.enableInTreeAutoscaling and "
                f"{gwhere}.minReplicas below its replicas (the subgroups' size is chosen by the plan, so "
                "the group starts whole); set minReplicas to replicas or give a subgroup size"
            )
        if auto and minimum < count:  # the autoscaler's minimum: the rest start when they fit
            size = size or 1
            if size < count:
                min_sg = -(-minimum // size)
        gpus, res = _shape(gpods or [_template_pod(template, ns, f"{key} {name} template")], rwhere)
        roles.append(
            Role(
                name=name,
                pods=count,
                gpus_per_pod=gpus,
                subgroup_size=size,
                subgroup_tier=sub_tier,
                min_subgroups=min_sg,
                resources_per_pod=res,
                subgroup_auto_min=auto_min,
            )
        )
        total += count
        _bounded(roles, where, total)
        _one_auto(roles, where)
        for idx, pod in _order(gpods, count, rwhere, rank=_ray_rank(hosts)):
            members[pod_key(pod)] = PodSlot(name, idx)
    for group_name, stray in sorted(by_group.items()):
        raise GangError(
            f"{where}: pod {pod_key(stray[0])} has {RAY_GROUP}={group_name!r}, which is not a worker group "
            "of spec.workerGroupSpecs"
        )
    gang = Gang(name=key, roles=tuple(roles), tier=gang_tier, soft=mode == "soft")
    return GangSpec(key=key, gang=gang, members=members, min_member=_min_member(gang), source="raycluster")


# -- native scheduling.k8s.io Workload / PodGroup ------------------------------------------------


def _label_tier(key: Any, tiers: Sequence[str], where: str) -> str:
    """Our tier for a node-label key: the labels the snapshot reads per tier (``gpuagent.dev/nvlink-domain``,
    ``nvidia.com/gpu.clique``, ``gpuagent.dev/ib-leaf``, ...) or ``gpuagent.dev/<tier>-domain``."""
    if not isinstance(key, str) or not key:
        raise GangError(f"{where}: expected a node-label key, got {_repr(key)}")
    name = next((tier for tier, keys in LABEL_FALLBACK.items() if key in keys), None)
    prefix, suffix = "gpuagent.dev/", "-domain"
    if name is None and key.startswith(prefix) and key.endswith(suffix) and len(key) > len(prefix + suffix):
        name = key[len(prefix) : -len(suffix)]
    if name is None:
        known = sorted({k for keys in LABEL_FALLBACK.values() for k in keys})
        raise GangError(
            f"{where}: node label {_repr(key)} is not a topology label the extender places by "
            f"(one of {', '.join(known)}, or gpuagent.dev/<tier>-domain)"
        )
    return tier_of(name, tiers, f"{where} ({key})")


def _workload_templates(workload: Mapping[str, Any], depth: int = 0) -> set[str]:
    """Names of a Workload's pod-group templates, composite templates included (the API nests <= 4)."""
    spec = workload.get("spec") if depth == 0 else workload
    if not isinstance(spec, Mapping) or depth > 8:
        return set()
    names: set[str] = set()
    for t in spec.get("podGroupTemplates") or []:
        if isinstance(t, Mapping) and isinstance(t.get("name"), str):
            names.add(t["name"])
    for c in spec.get("compositePodGroupTemplates") or []:
        if isinstance(c, Mapping):
            names |= _workload_templates(c, depth + 1)
    return names


def gang_from_workload_podgroup(
    podgroup: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    tiers: Sequence[str],
    workloads: Mapping[str, Mapping[str, Any]] = MappingProxyType({}),
) -> GangSpec:
    """The gang of a native ``scheduling.k8s.io/v1beta1`` PodGroup and the live pods that name it in
    ``spec.schedulingGroup.podGroupName``.

    ``gang.minCount`` is the minimum (``basic``: 1); the pods that exist are the gang (fewer than
    ``minCount``: wait for the rest); ``schedulingConstraints.topology[0].key`` (a node-label key) puts
    the whole group inside one domain of our tier of that label. The role is named after
    ``workloadRef.templateName``; a Workload the extender knows must have that template.
    """
    meta = _meta(podgroup)
    ns = meta.get("namespace") or "default"
    key = f"{ns}/{meta.get('name', '')}"
    where = f"PodGroup {key} (scheduling.k8s.io)"
    spec = _mapping(podgroup.get("spec"), f"{where}: spec")
    policy = _mapping(spec.get("schedulingPolicy"), f"{where}: spec.schedulingPolicy")
    basic, gang_policy = policy.get("basic"), policy.get("gang")
    if (basic is None) == (gang_policy is None):
        raise GangError(f"{where}: spec.schedulingPolicy: set exactly one of basic and gang")
    if gang_policy is not None:
        gang_policy = _mapping(gang_policy, f"{where}: spec.schedulingPolicy.gang")
        min_field = f"{where}: spec.schedulingPolicy.gang.minCount"
        minimum = _int(gang_policy.get("minCount"), min_field, minimum=1)
    else:
        _mapping(basic, f"{where}: spec.schedulingPolicy.basic")
        minimum = 1
    tier = None
    constraints = _mapping(
        spec.get("schedulingConstraints"), f"{where}: spec.schedulingConstraints", optional=True
    )
    topology = constraints.get("topology")
    topo_field = f"{where}: spec.schedulingConstraints.topology"
    if topology is not None:
        if not isinstance(topology, list):
            raise GangError(f"{topo_field}: expected a list, got {_repr(topology)}")
        if len(topology) > 1:
            raise GangError(f"{topo_field}: at most one constraint, got {len(topology)}")
        if topology:
            first = _mapping(topology[0], f"{topo_field}[0]")
            tier = _label_tier(first.get("key"), tiers, f"{topo_field}[0].key")
    role_name = DEFAULT_ROLE
    ref = spec.get("workloadRef")
    if ref is not None:
        ref = _mapping(ref, f"{where}: spec.workloadRef")
        workload_name, template = ref.get("workloadName"), ref.get("templateName")
        ref_field = f"{where}: spec.workloadRef"
        if not isinstance(workload_name, str) or not workload_name:
            raise GangError(f"{ref_field}.workloadName: expected a name, got {_repr(workload_name)}")
        if not isinstance(template, str) or not template:
            raise GangError(f"{ref_field}.templateName: expected a name, got {_repr(template)}")
        role_name = template
        workload = workloads.get(f"{ns}/{workload_name}")
        if workload is not None:
            names = _workload_templates(workload)
            if template not in names:
                raise GangError(
                    f"{ref_field}.templateName: Workload {ns}/{workload_name} has no template "
                    f"{template!r} (it has: {', '.join(sorted(names)) or 'none'})"
                )
    if len(pods) > MAX_GANG_PODS:
        raise _over(where, f"its {len(pods)} pods")
    if len(pods) < minimum:
        raise GangIncompleteError(
            f"{where}: spec.schedulingPolicy.gang.minCount is {minimum}; {len(pods)} pod(s) name it so far"
        )
    by_shape: dict[tuple[int, tuple[tuple[str, int], ...]], list[Mapping[str, Any]]] = {}
    for pod in pods:
        gpus, res = _shape([pod], where)
        by_shape.setdefault((gpus, tuple(sorted(res.items()))), []).append(pod)
    if len(by_shape) > MAX_GANG_ROLES:  # each shape is a role
        raise _over_roles(where, f"pods of {len(by_shape)} different shapes (GPUs and requests)")
    roles: list[Role] = []
    members: dict[str, PodSlot] = {}
    shapes = sorted(by_shape, key=lambda s: (-s[0], s[1]))
    auto_min = _native_auto(podgroup, where, len(shapes), minimum, len(pods))
    for k, shape in enumerate(shapes):
        rpods = by_shape[shape]
        name = role_name if len(shapes) == 1 else f"{role_name}-{k}"
        elastic = len(shapes) == 1 and minimum < len(rpods)  # the rest start when they fit
        roles.append(
            Role(
                name=name,
                pods=len(rpods),
                gpus_per_pod=shape[0],
                subgroup_size=1 if elastic else None,
                min_subgroups=minimum if elastic else None,
                resources_per_pod=dict(shape[1]),
                subgroup_auto_min=auto_min,
            )
        )
        for idx, pod in _order(rpods, len(rpods), f"{where} role {name}"):
            members[pod_key(pod)] = PodSlot(name, idx)
    gang = Gang(name=key, roles=tuple(roles), tier=tier)
    return GangSpec(key=key, gang=gang, members=members, min_member=minimum, source="workload")


def _native_auto(podgroup: Mapping[str, Any], where: str, shapes: int, minimum: int, pods: int) -> int | None:
    """The auto minimum of a native PodGroup annotated ``gpuagent.dev/subgroup-size: auto`` (with
    ``gpuagent.dev/subgroup-size-min``, default 1), else None. The API has no subgroup field, so the
    group's own annotations carry it; only ``auto`` is read there (a fixed size is a Volcano
    ``subGroupSize`` or our pod annotations), on a group of one pod shape that starts whole."""
    ann = _annotations(podgroup)
    size_raw, min_raw = ann.get(ANN_SUBGROUP_SIZE), ann.get(ANN_SUBGROUP_SIZE_MIN)
    size_field = f"{where}: metadata.annotations[{ANN_SUBGROUP_SIZE}]"
    min_field = f"{where}: metadata.annotations[{ANN_SUBGROUP_SIZE_MIN}]"
    if size_raw is not None and (not isinstance(size_raw, str) or size_raw.strip() != AUTO):
        raise GangError(f"{size_field}: only {AUTO!r} is read on a PodGroup, got {_repr(size_raw)}")
    _, auto_min = _size_or_auto(
        size_raw, None if min_raw is None else str(min_raw), size_field, min_field, pods
    )
    if auto_min is None:
        return None
    if shapes > 1:
        raise GangError(
            f"{size_field}: {AUTO} needs every pod of the group to request the same (it has {shapes} shapes)"
        )
    if minimum < pods:
        raise GangError(
            f"{size_field}: {AUTO} cannot be elastic: spec.schedulingPolicy.gang.minCount {minimum} is below "
            f"its {pods} pods (the subgroups' size is chosen by the plan, so the group starts whole)"
        )
    return auto_min


# -- which source ----------------------------------------------------------------------------------


_NONE: Mapping[str, Mapping[str, Any]] = MappingProxyType({})


def gang_for_pod(
    pod: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    podgroups: Mapping[str, Mapping[str, Any]],
    tiers: Sequence[str],
    *,
    rayclusters: Mapping[str, Mapping[str, Any]] = _NONE,
    workload_podgroups: Mapping[str, Mapping[str, Any]] = _NONE,
    workloads: Mapping[str, Mapping[str, Any]] = _NONE,
) -> GangSpec | None:
    """The gang of ``pod`` (None for a pod on its own). The objects are keyed ``"<ns>/<name>"``:
    ``podgroups`` Volcano's, ``workload_podgroups`` and ``workloads`` the native ``scheduling.k8s.io``
    ones, ``rayclusters`` KubeRay's."""
    found = gang_key_of(pod)
    if found is None:
        return None
    source, key = found
    try:
        return _gang_of(
            pod,
            found,
            pods,
            podgroups,
            tiers,
            rayclusters=rayclusters,
            workload_podgroups=workload_podgroups,
            workloads=workloads,
        )
    except GangError:
        raise
    except (AttributeError, TypeError, KeyError, IndexError, ValueError) as exc:
        # a shape no check above foresaw: this gang is invalid, never every gang's queue pass or filter
        raise GangError(
            f"{source} gang {key}: malformed object, not read ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None


def _gang_of(
    pod: Mapping[str, Any],
    found: tuple[str, str],
    pods: Iterable[Mapping[str, Any]],
    podgroups: Mapping[str, Mapping[str, Any]],
    tiers: Sequence[str],
    *,
    rayclusters: Mapping[str, Mapping[str, Any]],
    workload_podgroups: Mapping[str, Mapping[str, Any]],
    workloads: Mapping[str, Mapping[str, Any]],
) -> GangSpec:
    source, key = found
    mates = [p for p in pods if gang_key_of(p) == found]
    if source in ("workload", "raycluster"):
        mates = _live(mates)
    if pod_key(pod) not in {pod_key(p) for p in mates}:
        mates.append(pod)
    if source == "podgroup":
        pg = podgroups.get(key)
        if pg is None:
            raise GangError(f"pod {pod_key(pod)}: PodGroup {key} ({GROUP_NAME}) does not exist")
        return gang_from_podgroup(pg, mates, tiers)
    if source == "workload":
        native = workload_podgroups.get(key)
        if native is None:  # the API lets pods come first; kube-scheduler waits for the group too
            raise GangIncompleteError(
                f"pod {pod_key(pod)}: PodGroup {key} (spec.schedulingGroup.podGroupName) does not exist yet"
            )
        return gang_from_workload_podgroup(native, mates, tiers, workloads)
    if source == "raycluster":
        raycluster = rayclusters.get(key)
        if raycluster is None:
            raise GangIncompleteError(
                f"pod {pod_key(pod)}: RayCluster {key} ({RAY_CLUSTER}) is not known yet (not created, or "
                "the ray.io/v1 API is not served)"
            )
        return _whole(
            gang_from_raycluster(raycluster, mates, tiers), f"RayCluster {key}", "its spec's replicas"
        )
    return _whole(gang_from_annotations(key, mates, tiers), f"gang {key}", ANN_GANG_SIZE)


def _whole(spec: GangSpec, where: str, wanted: str) -> GangSpec:
    """``spec`` once a pod exists for each of its places: these sources describe the gang from what the
    pods declare (``gang-size``) or the RayCluster's replicas, so until then the queue would plan, and
    hold nodes for, pods that do not exist (and may never: one pod can declare a gang of 8). Native
    PodGroups wait for their minimum the same way. Indexed Jobs, JobSets and KubeRay make all of a
    gang's pods at once, so the wait is short."""
    want = sum(r.pods for r in spec.gang.roles)
    if len(spec.members) < want:
        raise GangIncompleteError(
            f"{where}: {len(spec.members)} of its {want} pods ({wanted}) exist so far; nothing is planned or "
            "held for it until all do"
        )
    return spec
