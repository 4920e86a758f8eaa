"""The extender's cache: the one table of watched kinds, what is kept of each object, per-pod facts, and
the informer store with its indexes (``Cache``).

Informers hand over whole API objects; the extender reads a small part of each. ``project`` keeps that
part (``PROJECTIONS``, one function per kind that needs one), so a 60,000-pod cluster costs the fields
the decisions read, not every container's environment and ``managedFields``. Two projected objects are
equal when nothing the extender reads changed: a kubelet heartbeat or a pod's status condition leaves
the projection as it was, and the state treats that event as no change at all.

``PodInfo`` is what the queue and the verbs read of one pod, parsed once per change of the pod:
its gang (``gangs.gang_key_of``), the node it is bound to, its requests, the name the queue runs it under
(``running_name``), its priority and its times. ``gpus_of`` is the one way to a pod's GPU count.

``Cache`` keeps the projected objects of every kind and the indexes their events keep (gang members,
running work per name, node usage, the nodes each selector and toleration set admits), the one free-GPU
formula (``Cache.free_gpus``) and the planner's snapshot built from the running counts. What gangs hold
it asks of its ``holder`` (``extender.holds``), which it tells of the pods it indexes.

Pure: no client, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from scheduler_plugin import claims
from scheduler_plugin.claims import ClaimBook, claimed, with_gpus
from scheduler_plugin.cluster import (
    GPU,
    base_state,
    holds_resources,
    node_state,
    pod_key,
    pod_requests,
    snapshot_from_objects,
)
from scheduler_plugin.extender.policy import gang_policy
from scheduler_plugin.gangs import GangError, GangSpec, gang_for_pod, gang_key_of
from scheduler_plugin.planner import SnapshotCache
from scheduler_plugin.queue import RESERVED_FOR, QueueError
from scheduler_plugin.queueing import Limits, pod_limits, pod_priority, timestamp, victim_group
from scheduler_plugin.snapshot import ClusterSnapshot, NodeState

SCHEDULER_NAME = "gpu-topology-scheduler"  # ARCHITECTURE.md: the second kube-scheduler that calls us
ADMITTED_MEMORY = 1_000  # (nodeSelector, tolerations) sets whose admitted nodes are kept
SOLO = "pod:"  # the queue's name of a running pod on its own: "pod:<namespace>/<name>"

# kind -> namespaced: the objects the extender watches. Namespaced kinds are keyed "<namespace>/<name>",
# the others (nodes, hypernodes) by name
KINDS: Mapping[str, bool] = {
    "nodes": False,
    "pods": True,
    "hypernodes": False,
    "podgroups": True,
    "rayclusters": True,
    "workloads": True,
    "workload_podgroups": True,
    "jobs": True,
    "pdbs": True,
    **claims.KINDS,  # DRA: GPUs pods get through claims (scheduler_plugin.claims)
}

_POD_META = (
    "name",
    "namespace",
    "uid",
    "labels",
    "annotations",
    "creationTimestamp",
    "deletionTimestamp",
    "ownerReferences",
)
_POD_SPEC = (
    "nodeName",
    "schedulerName",
    "nodeSelector",
    "tolerations",
    "priority",
    "schedulingGroup",
    "activeDeadlineSeconds",
    "resourceClaims",
)


def _pick(obj: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(obj, Mapping):
        return {}
    return {k: obj[k] for k in keys if k in obj}


def _containers(value: Any) -> Any:
    """Each container's name and resources; anything not a list is kept as it came (``pod_requests``
    and the gang sources judge a malformed value, not this)."""
    if not isinstance(value, list):
        return value
    return [_pick(c, ("name", "resources")) if isinstance(c, Mapping) else c for c in value]


def project_pod(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the extender reads of a Pod: identity, labels and annotations (gang sources, time limits,
    victims), owners, times; the spec's placement fields and each container's resources; phase and
    start time."""
    out: dict[str, Any] = {"metadata": _pick(obj.get("metadata"), _POD_META)}
    spec = obj.get("spec")
    if isinstance(spec, Mapping):
        kept = _pick(spec, _POD_SPEC)
        for field in ("containers", "initContainers"):
            if field in spec:
                kept[field] = _containers(spec[field])
        out["spec"] = kept
    status = _pick(obj.get("status"), ("phase", "startTime", "resourceClaimStatuses"))
    if status:
        out["status"] = status
    return out


def project_node(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the extender reads of a Node: name and labels (domains, selectors, fabric health), the
    reservation annotation it writes, taints and ``unschedulable``, allocatable and the Ready
    condition (not its heartbeat times)."""
    meta = obj.get("metadata")
    kept_meta = _pick(meta, ("name", "labels"))
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if isinstance(annotations, Mapping) and RESERVED_FOR in annotations:
        kept_meta["annotations"] = {RESERVED_FOR: annotations[RESERVED_FOR]}
    out: dict[str, Any] = {"metadata": kept_meta}
    spec = _pick(obj.get("spec"), ("taints", "unschedulable"))
    if spec:
        out["spec"] = spec
    status = obj.get("status")
    if isinstance(status, Mapping):
        kept: dict[str, Any] = _pick(status, ("allocatable",))
        conditions = status.get("conditions")
        if isinstance(conditions, list):
            kept["conditions"] = [
                _pick(c, ("type", "status"))
                for c in conditions
                if isinstance(c, Mapping) and c.get("type") == "Ready"
            ]
        out["status"] = kept
    return out


def _without_managed_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Small kinds (gang sources, Jobs, budgets, HyperNodes) are read in many places: kept whole but
    for ``managedFields``, the server's bookkeeping of who wrote which field."""
    out = dict(obj)
    meta = obj.get("metadata")
    if isinstance(meta, Mapping) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return out


def project_claim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the extender reads of a ResourceClaim: identity and annotations, what it asks, and where it
    is allocated (not whom it is reserved for, nor the devices' status)."""
    out: dict[str, Any] = {
        "metadata": _pick(obj.get("metadata"), ("name", "namespace", "annotations")),
        "spec": obj.get("spec"),
    }
    allocation = _pick(obj.get("status"), ("allocation",))
    if allocation:
        out["status"] = allocation
    return out


def project_template(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the extender reads of a ResourceClaimTemplate: its name and the claim spec it makes."""
    spec = obj.get("spec")
    return {
        "metadata": _pick(obj.get("metadata"), ("name", "namespace")),
        "spec": _pick(spec, ("spec",)),
    }


def project_deviceclass(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the extender reads of a DeviceClass: its name and the extended resource name it serves."""
    return {
        "metadata": _pick(obj.get("metadata"), ("name",)),
        "spec": _pick(obj.get("spec"), ("extendedResourceName",)),
    }


_DEVICE_ATTRIBUTES = ("type", "uuid", "parentUUID")


def project_slice(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the extender reads of a ResourceSlice: driver, node, pool and each device's name, kind
    (``type``, ``uuid``, ``parentUUID``) and taints; not the other attributes nor the counters."""
    spec = obj.get("spec")
    kept = _pick(spec, ("driver", "nodeName", "pool"))
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    if isinstance(devices, list):
        kept["devices"] = [
            {
                **_pick(d, ("name", "taints")),
                "attributes": _pick(d.get("attributes"), _DEVICE_ATTRIBUTES),
            }
            for d in devices
            if isinstance(d, Mapping)
        ]
    return {"metadata": _pick(obj.get("metadata"), ("name",)), "spec": kept}


PROJECTIONS: Mapping[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "pods": project_pod,
    "nodes": project_node,
    "resourceclaims": project_claim,
    "resourceclaimtemplates": project_template,
    "deviceclasses": project_deviceclass,
    "resourceslices": project_slice,
}


def project(kind: str, obj: Mapping[str, Any], book: ClaimBook | None = None) -> dict[str, Any]:
    """The part of ``obj`` (of ``kind``) the extender keeps; a pod's with what it asks through DRA
    written in (``ClaimBook.with_claims``) when ``book`` is given."""
    kept = PROJECTIONS.get(kind, _without_managed_fields)(obj)
    if kind == "pods" and book is not None:
        return book.with_claims(object_key(kind, kept), kept)
    return kept


def object_key(kind: str, obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    if KINDS.get(kind, True):
        return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
    return str(meta.get("name", ""))


@dataclass(frozen=True, slots=True)
class PodInfo:
    """One pod as the queue and the verbs read it (module docstring). ``node``: the node it holds
    resources on ("" when it holds none: pending, or finished); ``running``: the queue's name of the
    work it belongs to while it holds resources."""

    key: str
    gang: tuple[str, str] | None
    node: str
    requests: Mapping[str, int]
    uses: Mapping[str, int]  # what it uses of its node while it holds one: requests but those via claims
    running: str
    priority: int
    created_s: float | None
    started_s: float | None
    deleting: bool


def running_name(key: str, pod: Mapping[str, Any], found: tuple[str, str] | None) -> str:
    """The queue's name of the running work ``pod`` belongs to: its gang, else the workload it is part of
    (``queueing.victim_group``: preempted whole), else ``pod:<key>``."""
    if found is not None:
        return found[1]
    group = victim_group(pod)
    return group if group is not None else SOLO + key


def pod_info(key: str, pod: Mapping[str, Any]) -> PodInfo:
    """``pod``'s facts, parsed once per event of the pod."""
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    status = pod.get("status")
    status = status if isinstance(status, Mapping) else {}
    found = gang_key_of(pod)
    holds = holds_resources(pod)
    requests = _requests(pod)
    through_claims = claimed(pod)
    uses = dict(requests)
    if through_claims:
        uses[GPU] = max(0, uses.get(GPU, 0) - through_claims)
    return PodInfo(
        key=key,
        gang=found,
        node=str(spec.get("nodeName")) if holds else "",
        requests=requests,
        uses=uses,
        running=running_name(key, pod, found),
        priority=pod_priority(pod),
        created_s=timestamp(meta.get("creationTimestamp")),
        started_s=timestamp(status.get("startTime")),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def _requests(pod: Mapping[str, Any]) -> Mapping[str, int]:
    """``cluster.pod_requests``; a container list of another shape than the API's (the API server
    refuses one; a stand-in might not) requests nothing here, and the gang sources name it."""
    try:
        return pod_requests(pod)
    except (AttributeError, TypeError):
        return {}


def gpus_of(info: PodInfo) -> int:
    """The GPUs a pod asks for: the one count every decision reads (whole ``nvidia.com/gpu``, with what it
    asks through DRA claims and mapped extended resources written in by ``project``)."""
    return info.requests.get(GPU, 0)


def uid_of(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) else ""


def scheduler_of(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) and name else "default-scheduler"


def waits(pod: Mapping[str, Any], scheduler_name: str) -> bool:
    """Whether ``pod`` is a gang's pod waiting for ``scheduler_name``: not bound, not going, not done."""
    return (
        not (pod.get("spec") or {}).get("nodeName")
        and not (pod.get("metadata") or {}).get("deletionTimestamp")
        and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and scheduler_of(pod) == scheduler_name
        and gang_key_of(pod) is not None
    )


def labels_of(obj: Mapping[str, Any]) -> Any:
    return (obj.get("metadata") or {}).get("labels")


def _allocatable(obj: Mapping[str, Any]) -> Any:
    return (obj.get("status") or {}).get("allocatable")


def matches(node: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _tolerates(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether ``pod`` tolerates every NoSchedule/NoExecute taint of ``node``."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates_one(t, taint) for t in tolerations):
            return False
    return True


def _tolerates_one(tol: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if tol.get("effect") and tol.get("effect") != taint.get("effect"):
        return False
    key = tol.get("key")
    if tol.get("operator") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or "")


_K = TypeVar("_K")


def _discard(index: dict[_K, set[str]], name: _K, key: str) -> None:
    """Take ``key`` out of ``index[name]``; an emptied entry goes, so the index holds only what exists."""
    members = index.get(name)
    if members is not None:
        members.discard(key)
        if not members:
            del index[name]


@dataclass(frozen=True)
class DomainIndex:
    """The domain tiers, and per tier-1 (NVLink) domain: each node's, and each one's nodes."""

    tiers: tuple[str, ...]
    of: dict[str, str]  # node -> its tier-1 domain (nodes without one are absent)
    members: dict[str, list[str]]
    domains: dict[str, dict[str, str]]  # node -> its domain per tier


class Holder(Protocol):
    """What the cache asks of the holds (``extender.holds``) and tells them: what gangs hold per node,
    a pod indexed (a reserved pod bound no longer needs its hold), claims allocated or withdrawn."""

    def held(self) -> dict[str, dict[str, int]]: ...

    def held_gpus(self) -> dict[str, int]: ...

    def pod_indexed(self, key: str, info: PodInfo, pod: Mapping[str, Any]) -> None: ...

    def claims_allocated(self, pods: Iterable[str]) -> None: ...


class _NothingHeld:
    """The holder of a cache on its own: nothing is held."""

    def held(self) -> dict[str, dict[str, int]]:
        return {}

    def held_gpus(self) -> dict[str, int]:
        return {}

    def pod_indexed(self, key: str, info: PodInfo, pod: Mapping[str, Any]) -> None:
        return None

    def claims_allocated(self, pods: Iterable[str]) -> None:
        return None


class Cache:
    """The informer store: every watched kind's projected objects (``KINDS``), and the indexes kept by
    their events (each pod's facts, what is used per node and which pods hold it, each gang's pods, the
    running work per queue name and how many pods carry each name, the gangs' pods waiting for this
    scheduler, the nodes' reserved-for annotations), with what is worked out from them once and kept
    until an event changes its inputs (each gang's spec, allocatable GPUs, the domains, the nodes each
    (nodeSelector, tolerations) set admits, the pods' declared limits, the snapshot's node states).

    ``version`` is the cluster's: every change a decision may read bumps it; ``inputs_gen`` the plan
    inputs' (admitted nodes, Jobs' limits, nodes ruled out, repairs); ``dirty``: the cluster changed
    since the queue's last pass. ``holder`` (the holds) says what gangs hold; ``on_gone`` lets go of a
    pod that is gone in every part that keeps something per pod."""

    def __init__(self, *, scheduler_name: str = SCHEDULER_NAME) -> None:
        self.scheduler_name = scheduler_name
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.hypernodes: dict[str, dict[str, Any]] = {}
        self.podgroups: dict[str, dict[str, Any]] = {}
        # gang sources beside Volcano's PodGroups: KubeRay RayClusters, native scheduling.k8s.io ones
        self.rayclusters: dict[str, dict[str, Any]] = {}
        self.workloads: dict[str, dict[str, Any]] = {}
        self.workload_podgroups: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.pdbs: dict[str, dict[str, Any]] = {}
        # DRA (``scheduler_plugin.claims``): the objects, and the book of GPUs pods get through them
        self.resourceclaims: dict[str, dict[str, Any]] = {}
        self.resourceclaimtemplates: dict[str, dict[str, Any]] = {}
        self.deviceclasses: dict[str, dict[str, Any]] = {}
        self.resourceslices: dict[str, dict[str, Any]] = {}
        self.claims = ClaimBook()
        self.holder: Holder = _NothingHeld()
        self.on_gone: list[Callable[[str], None]] = []
        self.synced = True  # the composition root clears it until every informer has listed once
        # the indexes, kept by informer events (``_index_pod``, ``_node_changed``)
        self.info: dict[str, PodInfo] = {}
        self.node_used: dict[str, dict[str, int]] = {}
        self.node_pods: dict[str, set[str]] = {}
        self.gang_members: dict[tuple[str, str], set[str]] = {}
        self.running_members: dict[str, set[str]] = {}
        self.named: dict[str, int] = {}
        self.annotated: dict[str, Any] = {}  # node -> its gpuagent.dev/reserved-for value (not empty)
        self.gang_pending: set[str] = set()  # keys of the gangs' pods waiting for this scheduler
        self.running_dirty: set[str] = set()  # running work names an event touched (the queue reads them)
        # what is worked out from them once
        self._specs: dict[tuple[str, str], GangSpec | GangError | None] = {}
        self._tiers_seen: tuple[str, ...] = ()
        self._alloc: dict[str, int] = {}  # node -> allocatable GPUs, parsed once
        self._domains: DomainIndex | None = None
        self._allowed: dict[tuple[object, ...], frozenset[str]] = {}
        self.limits: dict[str, Limits | str] = {}
        # the snapshot's node states, kept from pass to pass (``snapshot``)
        self.states: dict[str, NodeState] = {}
        self._snap_dirty: set[str] = set()
        self._snapshot: ClusterSnapshot | None = None
        self._last_holds: dict[str, dict[str, int]] = {}
        self._state_names: list[str] | None = None  # ``states``' names in order, while none comes or goes
        # the nodes whose usage changed (a pod bound or gone, a node changed, a hold), in order, and the
        # nodes whose snapshot state changed: filter's verdicts and prioritize's ranks follow them node by
        # node; each log starts afresh (its epoch bumps) when it has more changes than there are nodes
        self.usage_log: list[str] = []
        self.usage_epoch = 0
        self.state_log: list[str] = []
        self.state_epoch = 0
        self.plans = SnapshotCache()  # the planner's, for plans made under the lock
        self.version = 0
        self.inputs_gen = 0
        self.dirty = True

    # -- informer side ---------------------------------------------------------------------------
    def replace(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        """A fresh listing of one kind replaces what was known (each object projected)."""
        fresh = {}
        for obj in items:
            fresh[object_key(kind, obj)] = project(kind, obj, self.claims)
        store = _store(self, kind)
        for key in [k for k in store if k not in fresh]:
            self.apply(kind, "DELETED", store[key])
        for key, obj in fresh.items():
            if store.get(key) != obj:
                self._put(kind, key, obj)
        self.dirty = True
        self.version += 1

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED / MODIFIED / DELETED). An object whose projection did not change (a
        kubelet heartbeat, a status condition) is no change: nothing is marked for the queue."""
        store = _store(self, kind)
        key = object_key(kind, obj)
        if event_type != "DELETED":
            kept = project(kind, obj, self.claims)
            if store.get(key) == kept:
                return
            self._put(kind, key, kept)
            return
        if key not in store:
            return
        before = store.pop(key)
        self._changed(kind, key, before, None)
        if kind == "pods":  # nothing is kept for a pod that is gone (``on_gone``)
            for forget in self.on_gone:
                forget(key)

    def _put(self, kind: str, key: str, obj: dict[str, Any]) -> None:
        store = _store(self, kind)
        before = store.get(key)
        store[key] = obj
        self._changed(kind, key, before, obj)

    def set_node(self, key: str, node: str | None) -> None:
        """Count pod ``key`` on ``node`` (None: on none) until the informer reports it: a pod this
        extender bound, or one whose binding failed."""
        pod = self.pods.get(key)
        if pod is None:
            return
        pod = dict(pod)
        pod["spec"] = {**(pod.get("spec") or {}), "nodeName": node}
        self._put("pods", key, pod)

    def _changed(
        self, kind: str, key: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
    ) -> None:
        """Keep the indexes of ``kind`` in step with one object's change (``after`` None: deleted)."""
        self.version += 1
        if kind in ("pods", "nodes", "jobs", "pdbs"):
            self.dirty = True
        if kind == "pods":
            self._index_pod(key, after)
            if after is None:
                self.claims.forget_pod(key)
        elif kind in claims.KINDS:
            self._claims_changed(kind, key, after)
        elif kind == "nodes":
            self._node_changed(key, before, after)
        elif kind == "hypernodes":
            self._domains = None
            self._specs.clear()  # tiers may change
        elif kind == "jobs":
            self.limits.clear()
            self.inputs_gen += 1
        elif kind in ("podgroups", "rayclusters", "workload_podgroups"):
            source = {"podgroups": "podgroup", "rayclusters": "raycluster", "workload_podgroups": "workload"}
            self._specs.pop((source[kind], key), None)
        elif kind == "workloads":
            for found in [f for f in self._specs if f[0] == "workload"]:
                del self._specs[found]

    def _node_changed(
        self, key: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
    ) -> None:
        self.touched(key)
        if before is None or after is None or labels_of(before) != labels_of(after):
            self._domains = None
            self._allowed.clear()
            self.inputs_gen += 1
        elif (before.get("spec") or {}).get("taints") != (after.get("spec") or {}).get("taints"):
            self._allowed.clear()
            self.inputs_gen += 1
        if before is None or after is None or _allocatable(before) != _allocatable(after):
            self._alloc.pop(key, None)
        have = ((after or {}).get("metadata") or {}).get("annotations") or {}
        value = have.get(RESERVED_FOR)
        if value:
            self.annotated[key] = value
        else:
            self.annotated.pop(key, None)

    def _claims_changed(self, kind: str, key: str, after: Mapping[str, Any] | None) -> None:
        """A DRA object changed: GPUs nodes have and use through claims, and the pods that ask through
        it, follow (``claims.ClaimBook``)."""
        change = self.claims.update(kind, key, after)
        for node, (_has, used) in change.nodes.items():
            self._alloc.pop(node, None)
            self.touched(node)
            if used:
                counts = self.node_used.setdefault(node, {})
                counts[GPU] = counts.get(GPU, 0) + used
        if change.nodes:
            self.dirty = True
            if kind == "resourceclaims":
                self.holder.claims_allocated(self.claims.readers(key))
        for pod_key_ in sorted(change.pods):
            pod = self.pods.get(pod_key_)
            if pod is not None:
                fresh = self.claims.with_claims(pod_key_, pod)
                if fresh != pod:
                    self._put("pods", pod_key_, fresh)

    def _index_pod(self, key: str, pod: Mapping[str, Any] | None) -> None:
        """The pod's facts (``PodInfo``) and every index they are in: node usage, gang members, running
        work per name, the gangs' pods waiting for this scheduler; then the holds hear of it."""
        old = self.info.pop(key, None)
        self.limits.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        self.gang_pending.discard(key)
        if pod is None:
            return
        info = pod_info(key, pod)
        self.info[key] = info
        if info.gang is not None:
            self.gang_members.setdefault(info.gang, set()).add(key)
            self._specs.pop(info.gang, None)
            if waits(pod, self.scheduler_name):
                self.gang_pending.add(key)
        self.named[info.running] = self.named.get(info.running, 0) + 1
        if info.node:
            self.running_members.setdefault(info.running, set()).add(key)
            self.running_dirty.add(info.running)
            self.node_pods.setdefault(info.node, set()).add(key)
            self.touched(info.node)
            used = self.node_used.setdefault(info.node, {})
            for r, v in info.uses.items():
                used[r] = used.get(r, 0) + v
        self.holder.pod_indexed(key, info, pod)

    def _unindex(self, key: str, old: PodInfo) -> None:
        if old.gang is not None:
            _discard(self.gang_members, old.gang, key)
            self._specs.pop(old.gang, None)
        left = self.named.get(old.running, 0) - 1
        if left > 0:
            self.named[old.running] = left
        else:
            self.named.pop(old.running, None)
        if not old.node:
            return
        _discard(self.running_members, old.running, key)
        self.running_dirty.add(old.running)
        _discard(self.node_pods, old.node, key)
        self.touched(old.node)
        used = self.node_used.get(old.node, {})
        for r, v in old.uses.items():
            used[r] = used.get(r, 0) - v

    def touched(self, node: str) -> None:
        """``node``'s usage or holds changed: its snapshot state is worked out again, and filter's
        verdicts follow it (``usage_log``)."""
        self._snap_dirty.add(node)
        self.usage_log.append(node)
        if len(self.usage_log) > max(64, len(self.nodes)):  # more changes than nodes: start afresh
            self.usage_log = []
            self.usage_epoch += 1

    def known_pod(self, pod: Mapping[str, Any]) -> tuple[Mapping[str, Any] | None, str]:
        """The informer's copy of the pod a request names, or None and why it gets no decision: unknown
        to the informer (not seen yet, deleted, or forged), another uid, or another scheduler's pod."""
        key = pod_key(pod)
        known = self.pods.get(key)
        if known is None:
            return None, (
                f"pod {key} is not known to the extender's informer (not seen yet, deleted or never "
                "created); nothing reserved"
            )
        asked, have = uid_of(pod), uid_of(known)
        if asked and have and asked != have:
            return (
                None,
                f"pod {key} has uid {asked}, the extender's informer knows uid {have}; nothing reserved",
            )
        name = scheduler_of(known)
        if name != self.scheduler_name:
            return None, f"pod {key} names scheduler {name!r}, not {self.scheduler_name!r}; nothing reserved"
        return known, ""

    # -- capacity --------------------------------------------------------------------------------
    def allocatable(self, node: str) -> int:
        """``node``'s allocatable GPUs (with those it has through DRA), parsed once per change."""
        cached = self._alloc.get(node)
        if cached is None:
            alloc = ((self.nodes.get(node) or {}).get("status") or {}).get("allocatable") or {}
            try:
                cached = int(str(alloc.get(GPU, 0)))
            except ValueError:
                cached = 0
            cached += self.claims.capacity(node)
            if node in self.nodes:
                self._alloc[node] = cached
        return cached

    def free_gpus(self, node: str, held: Mapping[str, int] | None = None) -> int:
        """GPUs of ``node`` neither used by bound pods nor held for a gang (``held``: GPUs held per node,
        by default what the holds hold now; ``{}`` for the GPUs not used at all): the one free-GPU
        formula (filter, prioritize, bind and the queue read it)."""
        used = self.node_used.get(node, {}).get(GPU, 0)
        taken = (held if held is not None else self.holder.held_gpus()).get(node, 0)
        return self.allocatable(node) - used - taken

    def domains(self) -> DomainIndex:
        """The tiers and the tier-1 domains, worked out again only when a node's labels or a HyperNode
        change."""
        if self._domains is None:
            snap = snapshot_from_objects(self.nodes.values(), (), self.hypernodes.values())
            first = snap.tiers[0] if snap.tiers else None
            of = {n.name: n.domains[first] for n in snap.nodes if first is not None and first in n.domains}
            members: dict[str, list[str]] = {}
            for n, d in of.items():
                members.setdefault(d, []).append(n)
            self._domains = DomainIndex(
                snap.tiers, of, members, {n.name: dict(n.domains) for n in snap.nodes}
            )
            self._snap_dirty.update(self.nodes)
            if self._tiers_seen != snap.tiers:
                self._tiers_seen = snap.tiers
                self._specs.clear()
        return self._domains

    def domains_known(self) -> bool:
        """Whether the tier-1 domains are worked out (else the next prioritize reads every node)."""
        return self._domains is not None

    def snapshot(self) -> ClusterSnapshot:
        """The cluster as the planner sees it, free of what bound pods use and gangs hold: kept from
        pass to pass, only the nodes that changed since (their pods, their objects, holds on them) are
        worked out again, and those equal to before keep their old object."""
        index = self.domains()
        holds = self.holder.held()
        for node in set(holds) | set(self._last_holds):
            if holds.get(node) != self._last_holds.get(node):
                self._snap_dirty.add(node)
        self._last_holds = holds
        if self._snapshot is not None and not self._snap_dirty:
            return self._snapshot
        states = self.states
        logged = len(self.state_log)
        for name in self._snap_dirty:
            obj = self.nodes.get(name)
            if obj is None:
                if states.pop(name, None) is not None:
                    self.state_log.append(name)
                    self._state_names = None
                continue
            base = with_gpus(base_state(obj, index.domains.get(name, {})), self.claims.capacity(name))
            state = node_state(base, self.node_used.get(name, {}), holds.get(name))
            old = states.get(name)
            if old is None or old != state:
                if old is None:
                    self._state_names = None
                states[name] = state
                self.state_log.append(name)
        changed = len(self.state_log) != logged
        if len(self.state_log) > max(64, len(states)):  # more changes than nodes: ranks start afresh
            self.state_log = []
            self.state_epoch += 1
        self._snap_dirty = set()
        if self._snapshot is not None and not changed and index.tiers == self._snapshot.tiers:
            return self._snapshot  # every node worked out again equals its state before
        if self._state_names is None:  # sorted again only when a node comes or goes
            self._state_names = sorted(states)
        nodes = tuple(map(states.__getitem__, self._state_names))
        if self._snapshot is None or nodes != self._snapshot.nodes or index.tiers != self._snapshot.tiers:
            self._snapshot = ClusterSnapshot(tiers=index.tiers, nodes=nodes)
        return self._snapshot

    # -- what is worked out per gang, selector and pod -------------------------------------------
    def spec(self, found: tuple[str, str]) -> GangSpec | GangError | None:
        """The gang ``found`` (source, name) as its source and its pods describe it, or why not; kept
        until one of its pods, its source object or the tiers change."""
        if found not in self._specs:
            keys = sorted(self.gang_members.get(found, ()))
            if not keys:
                return None
            mates = [self.pods[k] for k in keys]
            try:
                self._specs[found] = gang_for_pod(
                    mates[0],
                    mates,
                    self.podgroups,
                    self.domains().tiers,
                    rayclusters=self.rayclusters,
                    workload_podgroups=self.workload_podgroups,
                    workloads=self.workloads,
                )
                gang_policy(found[1], mates)  # a bad gpuagent.dev/mnnvl or /repair refuses the gang
            except GangError as exc:
                self._specs[found] = exc
        return self._specs[found]

    def admitted(
        self, selectors: Collection[tuple[tuple[str, str], ...]], pods: Sequence[Mapping[str, Any]]
    ) -> frozenset[str]:
        """The nodes matching one of ``selectors`` whose taints every pod of ``pods`` tolerates; kept per
        (selectors, tolerations) until a node comes, goes or changes its labels or taints."""
        tolerating: dict[str, Mapping[str, Any]] = {}  # one pod per distinct tolerations
        for p in pods:
            tolerating.setdefault(
                json.dumps((p.get("spec") or {}).get("tolerations"), sort_keys=True, default=str), p
            )
        key = (tuple(sorted(selectors)), tuple(sorted(tolerating)))
        found = self._allowed.get(key)
        if found is None:
            wanted = [dict(sel) for sel in sorted(selectors)] or [{}]
            found = frozenset(
                name
                for name, n in self.nodes.items()
                if any(matches(n, sel) for sel in wanted)
                and all(_tolerates(p, n) for p in tolerating.values())
            )
            if len(self._allowed) >= ADMITTED_MEMORY:  # tenants choose the keys: the oldest goes
                del self._allowed[next(iter(self._allowed))]
            self._allowed[key] = found
        return found

    def declared_limits(self, pod: Mapping[str, Any]) -> Limits | str:
        """The pod's time limits as it and its Job declare them (``queueing.pod_limits``), or why they
        are invalid: read once per change of the pod or of the Jobs."""
        key = pod_key(pod)
        found = self.limits.get(key)
        if found is None:
            try:
                found = pod_limits(pod, self.jobs)
            except QueueError as exc:
                found = str(exc)
            self.limits[key] = found
        return found


def _store(cache: Cache, kind: str) -> dict[str, dict[str, Any]]:
    if kind not in KINDS:
        raise KeyError(f"kind {kind!r} is not watched by the extender (one of {', '.join(KINDS)})")
    store: dict[str, dict[str, Any]] = getattr(cache, kind)
    return store
