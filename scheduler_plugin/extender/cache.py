"""The extender's cache: the one table of watched kinds, what is kept of each object, and per-pod facts.

Informers hand over whole API objects; the extender reads a small part of each. ``project`` keeps that
part (``PROJECTIONS``, one function per kind that needs one), so a 60,000-pod cluster costs the fields
the decisions read, not every container's environment and ``managedFields``. Two projected objects are
equal when nothing the extender reads changed: a kubelet heartbeat or a pod's status condition leaves
the projection as it was, and the state treats that event as no change at all.

``PodInfo`` is what the queue and the verbs read of one pod, parsed once per change of the pod:
its gang (``gangs.gang_key_of``), the node it is bound to, its requests, the name the queue runs it under
(``running_name``), its priority and its times. ``gpus_of`` is the one way to a pod's GPU count.

Pure: no client, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler_plugin import claims
from scheduler_plugin.claims import ClaimBook, claimed
from scheduler_plugin.cluster import GPU, holds_resources, pod_requests
from scheduler_plugin.gangs import gang_key_of
from scheduler_plugin.queue import RESERVED_FOR
from scheduler_plugin.queueing import pod_priority, timestamp, victim_group

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
