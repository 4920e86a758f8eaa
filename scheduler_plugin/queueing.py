"""What the extender's queue reads from API objects and answers kube-scheduler's ``preempt`` verb. Pure.

``scheduler_plugin.queue`` decides (order, reservations, backfill, whole-gang preemption); this module
turns the informer's plain API dicts into its inputs and its decisions into what a user sees:

- a pod's priority (``spec.priority``, which the API server fills from the pod's PriorityClass), its
  creation and start times (RFC 3339 in the API, seconds since the epoch here) and its time limits
  (``gpuagent.dev/time-limit``, Kueue's ``kueue.x-k8s.io/max-exec-time-seconds``, as annotations or
  labels of the pod or its Job, the pod's own ``activeDeadlineSeconds`` and its Job's; the smallest
  wins), told apart by who ends the pod (``pod_limits``): ``activeDeadlineSeconds`` (the kubelet, the
  Job controller) is enforced elsewhere; the rest, Kueue's too, are only declared, and count only where
  the extender enforces them (the ``kueue.x-k8s.io/queue-name`` label that would say Kueue admits the
  object is a tenant's word; where Kueue does admit it, Kueue ends it at its limit first);
- the capacity a pod that is not part of a gang may use on a reserved node (``held_back_caps``, the
  queue's backfill rule: a reservation whose expected start comes before the pod's end keeps its claim
  plus what running work still holds at that start);
- the answer to ``preempt`` (``preempt_answer``): kube-scheduler proposes victims per node for a pod
  on its own; a node is kept only when every gang with a pod among its victims is there whole (all its
  pods that hold resources are victims on that node), so kube-scheduler's preemption never takes part of
  a gang. Gang pods get no victims at all: the queue preempts for them, whole gangs inside one domain;
- who may be a victim, and as part of what (``victim_group``, ``never_victim``, ``owner_uid``): pods of a
  workload the extender does not know as a gang are one victim together (a JobSet, a training-operator
  job such as an MPIJob, a Kueue pod group, a coscheduling PodGroup, else their controller owner), so
  preemption never takes part of one; a DaemonSet's pods and static (mirror) pods are never victims,
  since their GPUs do not free, nor pods outside the namespaces preemption may take from;
- the PodDisruptionBudgets a set of evictions would break (``over_budget``), read before anything is
  evicted, so a victim set is evicted whole or not at all;
- the node annotation ``gpuagent.dev/reserved-for`` naming the gangs a node is held for;
- the Prometheus text of the extender's queue metrics (``render_metrics``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from scheduler_plugin.cluster import get_in
from scheduler_plugin.queue import (
    LIMIT_ANNOTATIONS,
    QueueError,
    Reservation,
    Running,
    held_back_gpus,
    time_limit,
)

__all__ = [
    "MAX_VICTIM_PODS",
    "Limits",
    "QueueMetrics",
    "VictimSet",
    "held_back_caps",
    "parse_victims",
    "pod_limit",
    "pod_limits",
    "pod_priority",
    "preempt_answer",
    "render_metrics",
    "reserved_for_value",
    "timestamp",
]

MAX_VICTIM_PODS = 100_000  # victims one preempt call may name, over all nodes
_INT32 = 2**31 - 1


class VictimsError(ValueError):
    """A ``preempt`` request that cannot be read; the message names the field."""


def timestamp(value: Any) -> float | None:
    """An API time (RFC 3339, ``2026-12-02T00:36:58Z``) in seconds since the epoch; None if absent or bad."""
    if not isinstance(value, str) or not value or len(value) > 64:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def pod_priority(pod: Mapping[str, Any]) -> int:
    """``spec.priority`` (the PriorityClass value the API server filled in); 0 when unset or not an
    int32."""
    value = get_in(pod, "spec", "priority")
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT32 - 1 <= value <= _INT32:
        return 0
    return value


def owning_job(pod: Mapping[str, Any]) -> str | None:
    """``<namespace>/<name>`` of the Job that owns ``pod`` (its controller ownerReference), or None."""
    refs = get_in(pod, "metadata", "ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if isinstance(ref, Mapping) and ref.get("kind") == "Job" and isinstance(ref.get("name"), str):
            ns = get_in(pod, "metadata", "namespace") or "default"
            return f"{ns}/{ref['name']}"
    return None


def _strings(value: Any) -> dict[str, str]:
    return {k: v for k, v in value.items() if isinstance(v, str)} if isinstance(value, Mapping) else {}


def pod_limit(pod: Mapping[str, Any], jobs: Mapping[str, Mapping[str, Any]]) -> float | None:
    """The pod's smallest time limit in seconds, whoever enforces it (``pod_limits``), or None: the limit
    annotations (or labels: Kueue's is a label on the Job) on the pod and on the Job that owns it, and
    both ``activeDeadlineSeconds``. Raises ``QueueError`` naming the object and the field for a bad
    value."""
    found = pod_limits(pod, jobs)  # who enforces it does not change the smallest
    return _least(found.enforced, found.declared)


@dataclass(frozen=True)
class Limits:
    """A pod's time limits in seconds (None: none), by who ends the pod when they pass: ``enforced``
    by someone else (``activeDeadlineSeconds``), ``declared`` by nobody this extender can be sure of
    (``gpuagent.dev/time-limit``; Kueue's ``max-exec-time-seconds``, since any tenant can write the
    label that would say Kueue admits the object)."""

    enforced: float | None = None
    declared: float | None = None


def _least(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def pod_limits(pod: Mapping[str, Any], jobs: Mapping[str, Mapping[str, Any]]) -> Limits:
    """The pod's time limits (``Limits``) from the pod and the Job that owns it. Raises ``QueueError``
    naming the object and the field for a bad value."""
    meta = get_in(pod, "metadata") or {}
    where = f"pod {meta.get('namespace') or 'default'}/{meta.get('name', '')}"
    sources: list[tuple[str, Mapping[str, Any]]] = [(where, pod)]
    job = owning_job(pod)
    if job is not None and job in jobs:
        sources.append((f"job {job}", jobs[job]))
    out = Limits()
    for what, obj in sources:
        deadline = get_in(obj, "spec", "activeDeadlineSeconds")
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, int)):
            raise QueueError(f"{what}: activeDeadlineSeconds={str(deadline)[:40]!r} is not an integer")
        labels = _strings(get_in(obj, "metadata", "labels"))
        out = Limits(_least(out.enforced, time_limit({}, deadline, where=what)), out.declared)
        for kind, values in (
            ("labels", labels),
            ("annotations", _strings(get_in(obj, "metadata", "annotations"))),
        ):
            for key in LIMIT_ANNOTATIONS:
                if key not in values:
                    continue
                limit = time_limit({key: values[key]}, where=f"{what} {kind}")
                out = Limits(out.enforced, _least(out.declared, limit))
    return out


# -- who may be a victim, and as part of what --------------------------------------------------------
# labels that make pods the extender does not know as a gang one workload, the outermost first (a JobSet's
# Jobs and an MPIJob's launcher and workers carry their top owner's name)
GROUP_LABELS: tuple[tuple[str, str], ...] = (
    ("jobset.sigs.k8s.io/jobset-name", "jobset"),
    ("training.kubeflow.org/job-name", "training-job"),
    ("kueue.x-k8s.io/pod-group-name", "kueue-pod-group"),
    ("scheduling.x-k8s.io/pod-group", "pod-group"),
    ("pod-group.scheduling.sigs.k8s.io", "pod-group"),
)
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
# controllers whose pods are independent replicas, each evicted on its own (a Deployment's one replica)
INDEPENDENT_REPLICAS = frozenset({"ReplicaSet", "ReplicationController"})
MIRROR = "kubernetes.io/config.mirror"  # the kubelet's annotation on the API copy of a static pod
_NAME_CHARS = 253  # longest object name; longer values are not names and are cut


def _controller(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = get_in(pod, "metadata", "ownerReferences")
    if not isinstance(refs, list):
        return None
    return next((r for r in refs if isinstance(r, Mapping) and r.get("controller") is True), None)


def victim_group(pod: Mapping[str, Any]) -> str | None:
    """The workload ``pod`` belongs to when the extender does not know it as a gang, evicted whole or
    not at all: ``<word>:<namespace>/<name>`` from the first of ``GROUP_LABELS`` it carries, else
    ``<kind>:<namespace>/<name>`` of its controller owner (kind in lower case; not a ReplicaSet's, whose
    pods are independent replicas); None for a pod on its own."""
    ns = get_in(pod, "metadata", "namespace") or "default"
    labels = _strings(get_in(pod, "metadata", "labels"))
    for label, word in GROUP_LABELS:
        value = labels.get(label)
        if value:
            return f"{word}:{ns}/{value[:_NAME_CHARS]}"
    ref = _controller(pod)
    kind = ref.get("kind") if ref is not None else None
    if (
        ref is not None
        and isinstance(kind, str)
        and kind not in INDEPENDENT_REPLICAS
        and isinstance(ref.get("name"), str)
    ):
        return f"{str(ref['kind'])[:_NAME_CHARS].lower()}:{ns}/{str(ref['name'])[:_NAME_CHARS]}"
    return None


def owner_uid(pod: Mapping[str, Any]) -> str | None:
    """The uid of the workload that made ``pod`` (its JobSet's, by label, else its controller owner's):
    a job made again under the same name has another one. None for a pod no controller owns."""
    uid = _strings(get_in(pod, "metadata", "labels")).get(JOBSET_UID)
    if uid:
        return uid[:_NAME_CHARS]
    ref = _controller(pod)
    value = ref.get("uid") if ref is not None else None
    return value[:_NAME_CHARS] if isinstance(value, str) and value else None


def never_victim(pod: Mapping[str, Any], namespaces: Collection[str] | None) -> str | None:
    """Why ``pod`` is never evicted for a preemption, or None: a DaemonSet's pod (its controller makes
    it again on the same node) and a static pod (the API shows a mirror of what the kubelet runs from
    a file) free no GPU; a pod outside ``namespaces`` (None: every namespace) is not preemption's to
    take."""
    ref = _controller(pod)
    kind = ref.get("kind") if ref is not None else None
    if kind == "DaemonSet":
        return f"owned by DaemonSet {str(ref.get('name') if ref else '')[:_NAME_CHARS]}"
    annotations = get_in(pod, "metadata", "annotations")
    if kind == "Node" or (isinstance(annotations, Mapping) and MIRROR in annotations):
        return "a static pod of its node"
    ns = get_in(pod, "metadata", "namespace") or "default"
    if namespaces is not None and ns not in namespaces:
        return f"namespace {str(ns)[:_NAME_CHARS]} is not one preemption may take from"
    return None


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget as eviction reads it: ``<namespace>/<name>``, its selector, and how many of
    its pods may be disrupted now (0 while its status is older than its spec: the API refuses then)."""

    name: str
    namespace: str
    selector: Mapping[str, Any] | None
    allowed: int


def budgets_from(pdbs: Iterable[Mapping[str, Any]]) -> dict[str, list[Budget]]:
    """The budgets by namespace (``policy/v1`` PodDisruptionBudgets as the API lists them)."""
    out: dict[str, list[Budget]] = {}
    for obj in pdbs:
        ns = str(get_in(obj, "metadata", "namespace") or "default")
        name = str(get_in(obj, "metadata", "name") or "")
        allowed = get_in(obj, "status", "disruptionsAllowed")
        if isinstance(allowed, bool) or not isinstance(allowed, int):
            allowed = 0
        seen, generation = get_in(obj, "status", "observedGeneration"), get_in(obj, "metadata", "generation")
        if isinstance(seen, int) and isinstance(generation, int) and seen < generation:
            allowed = 0
        selector = get_in(obj, "spec", "selector")
        out.setdefault(ns, []).append(
            Budget(f"{ns}/{name}", ns, selector if isinstance(selector, Mapping) else None, max(0, allowed))
        )
    return out


def _selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """policy/v1's label selector: None selects nothing, ``{}`` every pod of the namespace; an
    expression this reader does not know selects (the budget is kept, not ignored)."""
    if selector is None:
        return False
    match = selector.get("matchLabels")
    if isinstance(match, Mapping) and any(labels.get(k) != v for k, v in match.items()):
        return False
    exprs = selector.get("matchExpressions")
    for expr in exprs if isinstance(exprs, list) else ():
        if not isinstance(expr, Mapping):
            continue
        op, key, values = expr.get("operator"), expr.get("key"), expr.get("values")
        values = [v for v in values if isinstance(v, str)] if isinstance(values, list) else []
        has = isinstance(key, str) and key in labels
        ok = {
            "In": has and labels.get(str(key)) in values,
            "NotIn": not has or labels.get(str(key)) not in values,
            "Exists": has,
            "DoesNotExist": not has,
        }.get(str(op), True)
        if not ok:
            return False
    return True


def over_budget(
    pods: Iterable[Mapping[str, Any]], budgets: Mapping[str, Sequence[Budget]]
) -> list[tuple[str, int, int]]:
    """The budgets evicting all of ``pods`` together would break: (budget, pods of the set it covers,
    disruptions it allows now), by name."""
    need: dict[str, int] = {}
    allowed: dict[str, int] = {}
    for pod in pods:
        ns = str(get_in(pod, "metadata", "namespace") or "default")
        if ns not in budgets:
            continue
        labels = _strings(get_in(pod, "metadata", "labels"))
        for b in budgets[ns]:
            if _selects(b.selector, labels):
                need[b.name] = need.get(b.name, 0) + 1
                allowed[b.name] = b.allowed
    return sorted((name, n, allowed[name]) for name, n in need.items() if n > allowed[name])


def reserved_for_value(gangs: Iterable[str]) -> str:
    """The ``gpuagent.dev/reserved-for`` value for a node held for ``gangs`` (comma-separated, sorted)."""
    return ",".join(sorted(set(gangs)))


def held_back_caps(
    reservations: Iterable[Reservation],
    running: Iterable[Running],
    allocatable: Mapping[str, int],
    end: float,
) -> dict[str, int]:
    """GPUs a pod ending at ``end`` may use at most on each reserved node (nodes absent: no limit): on
    every node of a reservation that starts before ``end``, what is left at the earliest such start once
    the claims and the running work still there then are counted (``queue``'s backfill rule)."""
    claims: dict[str, int] = {}
    first: dict[str, float] = {}
    for r in reservations:
        if r.start_s >= end:
            continue
        for node, g in r.claims.items():
            claims[node] = claims.get(node, 0) + g
            first[node] = min(first.get(node, math.inf), r.start_s)
    if not claims:
        return {}
    busy: dict[str, list[tuple[float, int]]] = {}
    for run in running:
        for node, g in run.claims.items():
            if node in claims:
                busy.setdefault(node, []).append((run.ends_s, g))
    return {
        node: held_back_gpus(
            allocatable.get(node, 0), sum(g for e, g in busy.get(node, ()) if e > first[node]), g
        )
        for node, g in claims.items()
    }


# -- the preempt verb ------------------------------------------------------------------------------
@dataclass(frozen=True)
class VictimSet:
    """The victims kube-scheduler proposes on one node: pod UIDs and its count of PDB violations."""

    uids: tuple[str, ...]
    pdb_violations: int


def parse_victims(args: Mapping[str, Any]) -> dict[str, VictimSet]:
    """``ExtenderPreemptionArgs``'s victims per node: ``NodeNameToMetaVictims`` (``{"Pods": [{"UID"}],
    "NumPDBViolations"}``, sent when the extender is ``nodeCacheCapable``) or ``NodeNameToVictims``
    (full pods). Raises ``VictimsError`` naming the field; at most ``MAX_VICTIM_PODS`` pods in all."""
    meta = args.get("NodeNameToMetaVictims")
    full = args.get("NodeNameToVictims")
    field, given = ("NodeNameToMetaVictims", meta) if meta is not None else ("NodeNameToVictims", full)
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise VictimsError(f"{field}: expected an object of node name -> victims")
    out: dict[str, VictimSet] = {}
    total = 0
    for node, victims in given.items():
        where = f"{field}[{node[:100]!r}]"
        if victims is None:
            continue
        if not isinstance(victims, dict):
            raise VictimsError(f"{where}: expected an object with Pods and NumPDBViolations")
        pods = victims.get("Pods") or []
        if not isinstance(pods, list):
            raise VictimsError(f"{where}.Pods: expected a list")
        total += len(pods)
        if total > MAX_VICTIM_PODS:
            raise VictimsError(f"{field}: more than {MAX_VICTIM_PODS} victim pods")
        uids: list[str] = []
        for i, p in enumerate(pods):
            uid = (
                (p.get("UID") if field == "NodeNameToMetaVictims" else get_in(p, "metadata", "uid"))
                if (isinstance(p, dict))
                else None
            )
            if not isinstance(uid, str) or not uid:
                raise VictimsError(f"{where}.Pods[{i}]: expected a pod with a UID")
            uids.append(uid)
        pdb = victims.get("NumPDBViolations", 0)
        if isinstance(pdb, bool) or not isinstance(pdb, int) or pdb < 0:
            raise VictimsError(f"{where}.NumPDBViolations: expected a non-negative integer")
        out[node] = VictimSet(tuple(uids), pdb)
    return out


def preempt_answer(
    victims: Mapping[str, VictimSet],
    *,
    gang_of_uid: Mapping[str, str | None],
    gang_members: Mapping[str, Sequence[str]],
    refused_nodes: Iterable[str] = (),
) -> dict[str, dict[str, Any]]:
    """``ExtenderPreemptionResult.NodeNameToMetaVictims``: the nodes whose victim set takes only whole
    gangs (``gang_of_uid``: uid -> gang name, None for a pod on its own; a uid missing there is unknown
    and its node is dropped; ``gang_members``: gang -> UIDs of its pods that hold resources), minus
    ``refused_nodes``."""
    refused = set(refused_nodes)
    out: dict[str, dict[str, Any]] = {}
    for node, vs in sorted(victims.items()):
        if node in refused:
            continue
        chosen = set(vs.uids)
        whole = True
        for uid in vs.uids:
            if uid not in gang_of_uid:
                whole = False  # a pod this extender does not know: it cannot vouch for it
                break
            gang = gang_of_uid[uid]
            if gang is not None and not set(gang_members.get(gang, ())) <= chosen:
                whole = False
                break
        if whole:
            out[node] = {"Pods": [{"UID": u} for u in vs.uids], "NumPDBViolations": vs.pdb_violations}
    return out


# -- metrics ---------------------------------------------------------------------------------------
@dataclass
class QueueMetrics:
    """Counters of what the queue did; gauges are read from the state at each scrape."""

    preemptions: int = 0
    evictions: int = 0
    evictions_refused: int = 0
    passes: int = 0
    time_limit_evictions: int = 0


def render_metrics(
    metrics: QueueMetrics,
    *,
    reservations: int,
    reserved_gpus: int,
    reserved_nodes: int,
    waiting_gangs: int,
    never_fitting_gangs: int = 0,
) -> bytes:
    """The extender's queue metrics in the Prometheus text format (version 0.0.4)."""
    rows = (
        ("gpuagent_extender_reservations", "gauge", "Gangs holding a reservation now.", reservations),
        (
            "gpuagent_extender_reserved_gpus",
            "gauge",
            "GPUs held by reservations for waiting gangs.",
            reserved_gpus,
        ),
        (
            "gpuagent_extender_reserved_nodes",
            "gauge",
            "Nodes annotated gpuagent.dev/reserved-for.",
            reserved_nodes,
        ),
        ("gpuagent_extender_waiting_gangs", "gauge", "Gangs waiting in the extender's queue.", waiting_gangs),
        (
            "gpuagent_extender_never_fitting_gangs",
            "gauge",
            "Waiting gangs that fit nowhere even with every node free (passed over as the queue's head).",
            never_fitting_gangs,
        ),
        (
            "gpuagent_extender_queue_passes_total",
            "counter",
            "Scheduling passes of the queue.",
            metrics.passes,
        ),
        (
            "gpuagent_extender_preemptions_total",
            "counter",
            "Gang preemptions decided (each evicts whole lower-priority gangs).",
            metrics.preemptions,
        ),
        (
            "gpuagent_extender_evicted_pods_total",
            "counter",
            "Pods evicted for preemption.",
            metrics.evictions,
        ),
        (
            "gpuagent_extender_time_limit_evictions_total",
            "counter",
            "Pods evicted for running past their declared time limit plus the grace.",
            metrics.time_limit_evictions,
        ),
        (
            "gpuagent_extender_evictions_refused_total",
            "counter",
            "Evictions the API refused (PodDisruptionBudget, HTTP 429).",
            metrics.evictions_refused,
        ),
    )
    lines: list[str] = []
    for name, kind, text, value in rows:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
    return ("\n".join(lines) + "\n").encode()


__all__ += ["QueueError", "VictimsError", "owning_job"]
__all__ += [
    "GROUP_LABELS",
    "Budget",
    "budgets_from",
    "never_victim",
    "over_budget",
    "owner_uid",
    "victim_group",
]
