"""The Kubernetes verbs a scheduler carries out for its decisions: bind a pod, evict one (a dry run
first where asked), merge-patch an annotation on a Node or a Pod, record an Event on a pod.

Each verb goes through the one adapter (:class:`~topology.kube.client.Kube`, or
:class:`~topology.kube.aio.AsyncKube` on an event loop) and says what the API answered in the terms its
caller needs: an eviction the API refuses (HTTP 429, a PodDisruptionBudget) comes back as its reason, a
pod gone meanwhile (404) or replaced by another of the same name (409 on the uid precondition) as
nothing left to do. :class:`ClusterVerbs` bundles them for one component (the extender's ``Cluster``
and ``QueueCluster``), with the annotation keys it owns given by the caller, since this layer knows no
scheduler's vocabulary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from topology.kube.aio import AsyncKube
from topology.kube.client import NODES, Kube, KubeError
from topology.kube.recorder import EventRecorder, ObjectRef

MERGE_PATCH = "application/merge-patch+json"
MAX_REFUSAL_CHARS = 300  # of the API's answer kept in an eviction's refusal


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def annotate_node(kube: Kube, node: str, key: str, value: str | None) -> None:
    """Merge-patch annotation ``key`` of Node ``node`` to ``value`` (None removes it)."""
    kube.request(
        "PATCH", f"{NODES}/{node}", body={"metadata": {"annotations": {key: value}}}, content_type=MERGE_PATCH
    )


def annotate_pod(kube: Kube, namespace: str, name: str, *, uid: str, key: str, value: str | None) -> bool:
    """Merge-patch annotation ``key`` of a pod; ``uid``, when known, makes the API refuse the patch (409)
    for another pod of that name. Returns False when the pod is gone or is another one now (nothing
    patched); other refusals raise :class:`KubeError`."""
    meta: dict[str, Any] = {"annotations": {key: value}}
    if uid:
        meta["uid"] = uid
    try:
        kube.request("PATCH", pod_path(namespace, name), body={"metadata": meta}, content_type=MERGE_PATCH)
    except KubeError as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True


def evict(kube: Kube, namespace: str, name: str, uid: str, *, dry_run: bool = False) -> str | None:
    """A ``policy/v1`` Eviction of the pod (its uid as a precondition): None when done or the pod is gone
    (or another now), the API's reason when it refuses (429: a PodDisruptionBudget). ``dry_run``: the
    API checks it, budgets included, and evicts nothing. Other failures raise :class:`KubeError`."""
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    options: dict[str, Any] = {}
    if uid:
        options["preconditions"] = {"uid": uid}
    if dry_run:
        options["dryRun"] = ["All"]
    if options:
        body["deleteOptions"] = options
    try:
        kube.create(f"{pod_path(namespace, name)}/eviction", body)
    except KubeError as exc:
        if exc.status in (404, 409):  # gone, or another pod of that name now: nothing to evict
            return None
        if exc.status == 429:
            return f"the API refused the eviction (PodDisruptionBudget): {str(exc)[:MAX_REFUSAL_CHARS]}"
        raise
    return None


async def bind(
    kube: Kube,
    namespace: str,
    name: str,
    uid: str,
    node: str,
    *,
    aio: AsyncKube | None,
    annotations: Mapping[str, str] | None = None,
) -> None:
    """Bind a pod to a node (``annotations`` ride on the Binding; the API server copies them onto the
    pod): on the event loop over kept-alive connections (``aio``); without one (a configuration it does
    not speak) through the synchronous client in a worker thread."""
    if aio is not None:
        await aio.bind(namespace, name, uid, node, annotations)
    else:
        await asyncio.to_thread(kube.bind, namespace, name, uid, node, annotations)


def pod_ref(pod: Mapping[str, Any]) -> ObjectRef:
    """The Event's ``involvedObject`` for a pod given as an API object."""
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return ObjectRef(
        "Pod",
        str(meta.get("name") or "pod"),
        namespace=str(meta.get("namespace") or "default"),
        uid=str(meta.get("uid") or ""),
    )


class ClusterVerbs:
    """The verbs for one component: bindings (``aio`` when given), Events as ``component``, the Node
    annotation ``node_annotation`` and the Pod annotation ``pod_annotation`` it writes, evictions."""

    def __init__(
        self,
        kube: Kube,
        aio: AsyncKube | None = None,
        *,
        component: str,
        node_annotation: str,
        pod_annotation: str,
    ) -> None:
        self.kube = kube
        self.aio = aio
        self.recorder = EventRecorder(kube, component=component)
        self.node_annotation = node_annotation
        self.pod_annotation = pod_annotation

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        await bind(self.kube, namespace, name, uid, node, aio=self.aio, annotations=annotations)

    def event(self, pod: Mapping[str, Any], *, reason: str, message: str, warning: bool) -> None:
        self.recorder.record(pod_ref(pod), reason=reason, message=message, warning=warning)

    def annotate_node(self, node: str, value: str | None) -> None:
        annotate_node(self.kube, node, self.node_annotation, value)

    def annotate_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        annotate_pod(self.kube, namespace, name, uid=uid, key=self.pod_annotation, value=value)

    def evict(self, namespace: str, name: str, uid: str, *, dry_run: bool = False) -> str | None:
        return evict(self.kube, namespace, name, uid, dry_run=dry_run)
