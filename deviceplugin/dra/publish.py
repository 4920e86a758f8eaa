"""Publishing the node's ResourceSlice pool: server-side apply (field manager ``gpu-node-agent``) through
the one Kubernetes adapter (:mod:`topology.kube`), written when what the slices say changes, never on a
timer.

- First publish: the pool's slices already in the API (this node, this driver; a field-selected list)
  give the next pool generation (their highest + 1), so the scheduler never mixes an old agent's slices
  with ours; slices of the pool we no longer write are deleted after ours are applied.
- Later publishes: only when the content (devices, attributes, taints, slice count) differs from the
  last one applied; the generation then rises by one.
- A refusal (API down, RBAC) is retried with back-off by the driver; what was applied is kept.
- Every ``verify`` interval (minutes) the pool is listed once: a slice deleted or rewritten by someone
  else is written again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol
from urllib.parse import quote

from deviceplugin.dra.slices import content
from topology.kube import NODES, RESOURCESLICES, Kube, KubeError, resourceclaims

Desired = Callable[[int, str | None], list[dict[str, Any]]]
"""The pool's slices for a generation and the Node's UID."""


class SliceApi(Protocol):
    def node_uid(self, name: str) -> str | None: ...

    def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]: ...

    def apply_slice(self, obj: Mapping[str, Any]) -> None: ...

    def delete_slice(self, name: str) -> None: ...


class KubeDraApi:
    """:class:`SliceApi` and the claim reader over :class:`~topology.kube.Kube`."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def node_uid(self, name: str) -> str | None:
        try:
            node = self.kube.get(f"{NODES}/{quote(name)}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        uid = (node.get("metadata") or {}).get("uid")
        return str(uid) if uid else None

    def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        items, _ = self.kube.list(RESOURCESLICES, field_selector=f"spec.nodeName={node},spec.driver={driver}")
        return items

    def apply_slice(self, obj: Mapping[str, Any]) -> None:
        self.kube.apply(f"{RESOURCESLICES}/{quote(obj['metadata']['name'])}", obj)

    def delete_slice(self, name: str) -> None:
        self.kube.delete(f"{RESOURCESLICES}/{quote(name)}")

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return self.kube.get(f"{resourceclaims(namespace)}/{quote(name)}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise


class SlicePublisher:
    """Keeps the pool in the API equal to ``desired``; :meth:`publish_once` is blocking (run it in a
    worker thread)."""

    def __init__(self, *, api: SliceApi, node_name: str, driver: str, desired: Desired) -> None:
        self.api = api
        self.node_name = node_name
        self.driver = driver
        self._desired = desired
        self.generation: int | None = None
        self._uid: str | None = None
        self._applied: list[Any] | None = None
        self._names: set[str] = set()
        self.writes = 0

    def publish_once(self) -> int:
        """Write the pool if it changed; returns the number of slices written (0: nothing to do).
        Raises :class:`KubeError` when the API refuses."""
        stale: set[str] = set()
        if self.generation is None:
            if self._uid is None:
                self._uid = self.api.node_uid(self.node_name)
            existing = self.api.list_slices(self.node_name, self.driver)
            generations = [
                int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0) for s in existing
            ]
            self.generation = max(generations, default=0)
            self._names = {str((s.get("metadata") or {}).get("name")) for s in existing}
        want = self._desired(self.generation, self._uid)
        if self._applied is not None and content(want) == self._applied:
            return 0
        generation = self.generation + 1
        want = self._desired(generation, self._uid)
        for obj in want:
            self.api.apply_slice(obj)
        names = {str(obj["metadata"]["name"]) for obj in want}
        stale = self._names - names
        for name in sorted(stale):
            self.api.delete_slice(name)
        self.generation = generation
        self._names = names
        self._applied = content(want)
        self.writes += len(want)
        return len(want)

    def verify(self) -> bool:
        """Whether the pool in the API is still what was last applied (same slice names, same
        generation); when not (a slice deleted or rewritten by hand), the next publish writes it
        again. Blocking; raises :class:`KubeError`."""
        if self.generation is None or self._applied is None:
            return True
        existing = self.api.list_slices(self.node_name, self.driver)
        names = {str((s.get("metadata") or {}).get("name")) for s in existing}
        generations = {
            int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0) for s in existing
        }
        if names == self._names and generations == {self.generation}:
            return True
        self.forget()
        return False

    def forget(self) -> None:
        """Read the pool from the API again at the next publish (after a refusal mid-write)."""
        self.generation = None
        self._applied = None
