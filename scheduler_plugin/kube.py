"""The thin Kubernetes adapter of the scheduler side: list/watch, bind, record events.

Objects travel as plain dicts exactly as the API serves them (camelCase JSON), so the pure modules
(``cluster``, ``gangs``, ``state``) never see client model classes. The ``ApiClient`` is passed in.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

VOLCANO_TOPOLOGY = ("topology.volcano.sh", "v1alpha1", "hypernodes")
VOLCANO_SCHEDULING = ("scheduling.volcano.sh", "v1beta1", "podgroups")
KINDS = ("nodes", "pods", "hypernodes", "podgroups")
COMPONENT = "gpu-topology-extender"


@dataclass(frozen=True)
class Listing:
    items: list[dict[str, Any]]
    resource_version: str
    missing: bool = False  # the kind's CRD is not installed


class KubeApi:
    """The calls the extender and ``plan --from-cluster`` make, over an injected ``ApiClient``."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    # -- reading ---------------------------------------------------------------------------------
    def _list_fn(self, kind: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        if kind == "nodes":
            return self.core.list_node, ()
        if kind == "pods":
            return self.core.list_pod_for_all_namespaces, ()
        if kind == "hypernodes":
            return self.custom.list_cluster_custom_object, VOLCANO_TOPOLOGY
        if kind == "podgroups":
            return self.custom.list_cluster_custom_object, VOLCANO_SCHEDULING
        raise ValueError(f"unknown kind {kind!r}")

    def list_objects(self, kind: str) -> Listing:
        """All objects of a kind; an uninstalled CRD (404) lists as empty."""
        fn, args = self._list_fn(kind)
        try:
            resp = fn(*args, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404 and kind in ("hypernodes", "podgroups"):
                return Listing([], "", missing=True)
            raise
        try:
            body = json.loads(resp.data)
        finally:
            resp.release_conn()
        return Listing(
            list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion", ""))
        )

    def watch(
        self, kind: str, resource_version: str, timeout_s: int, stopper: list[watch.Watch]
    ) -> Iterator[dict[str, Any]]:
        """Events (``{"type", "object"}``) after ``resource_version`` until the server ends the watch."""
        fn, args = self._list_fn(kind)
        w = watch.Watch()  # type: ignore[no-untyped-call]
        stopper.append(w)
        kwargs: dict[str, Any] = {
            "timeout_seconds": timeout_s,
            "deserialize": False,
            "allow_watch_bookmarks": True,
        }
        if resource_version:
            kwargs["resource_version"] = resource_version
        for event in w.stream(fn, *args, **kwargs):  # type: ignore[no-untyped-call]
            yield {"type": event.get("type"), "object": event.get("object")}

    # -- writing ---------------------------------------------------------------------------------
    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        # the generated client fails to parse the Status the API returns for bindings
        self.core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)

    def event(self, pod: Mapping[str, Any], *, reason: str, message: str, warning: bool) -> None:
        meta = pod.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        now = datetime.now(UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta.get('name', 'pod')}.", namespace=ns),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Pod", name=meta.get("name"), namespace=ns, uid=meta.get("uid")
            ),
            reason=reason,
            message=message[:1024],
            type="Warning" if warning else "Normal",
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self.core.create_namespaced_event(ns, body, _preload_content=False)


class Informer:
    """List then watch one kind in a thread, handing every change to ``on_event(kind, type, obj)``.

    ``on_list(kind, items)`` replaces the kind wholesale after each (re)list; a watch that expires
    (410 Gone) or fails relists after ``retry_s``; a kind whose CRD is not installed is listed again
    every ``missing_retry_s``. ``stop()`` ends the thread within ``watch_timeout_s``.
    """

    def __init__(
        self,
        api: KubeApi,
        kind: str,
        *,
        on_list: Callable[[str, list[dict[str, Any]]], None],
        on_event: Callable[[str, str, dict[str, Any]], None],
        on_error: Callable[[str, BaseException], None] = lambda kind, exc: None,
        watch_timeout_s: int = 30,
        retry_s: float = 1.0,
        missing_retry_s: float = 30.0,
    ) -> None:
        self.api, self.kind = api, kind
        self.missing_retry_s = missing_retry_s
        self.on_list, self.on_event, self.on_error = on_list, on_event, on_error
        self.watch_timeout_s, self.retry_s = watch_timeout_s, retry_s
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._watches: list[watch.Watch] = []
        self._thread = threading.Thread(target=self._run, name=f"informer-{kind}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop_soon(self) -> None:
        """Ask the thread to end after the current watch event (or the watch's time-out)."""
        self._stop.set()
        for w in list(self._watches):
            w.stop()  # type: ignore[no-untyped-call]

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stop_soon()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listing = self.api.list_objects(self.kind)
                self.on_list(self.kind, listing.items)
                self.synced.set()
                if listing.missing:  # no CRD: nothing to watch; look again now and then
                    self._stop.wait(self.missing_retry_s)
                    continue
                rv = listing.resource_version
                while not self._stop.is_set():
                    self._watches.clear()
                    for ev in self.api.watch(self.kind, rv, self.watch_timeout_s, self._watches):
                        obj = ev.get("object") or {}
                        new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                        if new_rv:
                            rv = str(new_rv)
                        if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                            self.on_event(self.kind, str(ev["type"]), obj)
                        if self._stop.is_set():
                            break
            except Exception as exc:  # any failure relists; the error is reported
                if self._stop.is_set():
                    return
                self.on_error(self.kind, exc)
                self._stop.wait(self.retry_s)
