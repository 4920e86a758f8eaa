"""The one list/watch loop of the adapter: an :class:`Informer` keeps a :class:`Sink` in step with one kind.

An informer lists the kind (``sink.replace``), then watches from the list's resourceVersion, handing every
change to ``sink.apply``; a watch the server ends is reopened from the last version seen. A watch that
expired (410 Gone) relists at once; any other failure is reported (``on_error``, else a ``watch_failed``
log line) and retried with exponential backoff. An ``optional`` kind whose CRD is not installed (404)
counts as empty and synced, and is looked for again with the same backoff.

:class:`Store` is the plain sink: objects by key (``namespace/name``, or ``name`` when cluster-scoped),
thread-safe, calling ``on_change`` after each change. Callers that keep their own state (the extender's
``Cache``) pass a sink of their own instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from topology import logs
from topology.kube.client import Kube, KubeError, Watch

log = logs.get_logger("topology.kube.informer")

CHANGES = ("ADDED", "MODIFIED", "DELETED")


class Sink(Protocol):
    """Where an informer delivers: the whole kind after each (re)list, then one change at a time."""

    def replace(self, items: list[dict[str, Any]]) -> None: ...

    def apply(self, event_type: str, obj: dict[str, Any]) -> None: ...


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace else name


class Store:
    """Objects of one kind by :func:`object_key`; ``on_change`` runs after each delivered change."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self.on_change = on_change
        self.lock = threading.Lock()
        self._items: dict[str, dict[str, Any]] = {}

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        fresh = {object_key(o): o for o in items}
        with self.lock:
            self._items = fresh
        self.on_change()

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        with self.lock:
            if event_type == "DELETED":
                self._items.pop(key, None)
            else:
                self._items[key] = obj
        self.on_change()

    def remember(self, obj: dict[str, Any]) -> None:
        """What a write of ours just made, before its watch event arrives (no ``on_change``)."""
        with self.lock:
            self._items[object_key(obj)] = obj

    def forget(self, key: str) -> None:
        """What a delete of ours just removed, before its watch event arrives (no ``on_change``)."""
        with self.lock:
            self._items.pop(key, None)

    def get(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            return self._items.get(key)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return dict(self._items)


class Informer:
    """List, then watch, one collection (``path``) into ``sink`` on a thread of its own.

    ``start()`` runs it; ``stop_soon()`` asks it to end (the open watch is closed at once) and ``stop()``
    also waits for the thread. ``synced`` is set after the first successful list (or a missing optional
    kind). ``list_once()`` is the list step alone, for one-shot readers.
    """

    def __init__(
        self,
        kube: Kube,
        path: str,
        sink: Sink,
        *,
        label_selector: str | None = None,
        optional: bool = False,
        watch_timeout_s: int = 300,
        retry_s: float = 0.5,
        max_retry_s: float = 30.0,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.kube = kube
        self.path = path
        self.sink = sink
        self.label_selector = label_selector
        self.optional = optional  # a missing CRD lists as empty (and is looked for again)
        self.watch_timeout_s = watch_timeout_s
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.on_error = on_error
        self.synced = threading.Event()
        self.errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=f"informer {self.path}", daemon=True)
        self._thread.start()

    def stop_soon(self) -> None:
        self._stop.set()
        with self._lock:
            watch = self._watch
        if watch is not None:
            watch.close()

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stop_soon()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout_s)

    # -- work ------------------------------------------------------------------------------------
    def list_once(self) -> str | None:
        """List into the sink; returns the resourceVersion, ``None`` for a missing optional kind.
        Raises :class:`KubeError` when the list is refused."""
        try:
            items, rv = self.kube.list(self.path, label_selector=self.label_selector)
        except KubeError as exc:
            if exc.status == 404 and self.optional:
                return None
            raise
        self.sink.replace(items)
        return rv

    def run(self) -> None:
        """The loop ``start()`` runs; ends when ``stop_soon()`` was called."""
        backoff = self.retry_s
        missing = False
        while not self._stop.is_set():
            try:
                rv = self.list_once()
                if rv is None:
                    if not missing:  # the CRD went (or was never there): nothing of the kind exists
                        missing = True
                        self.sink.replace([])
                    self.synced.set()
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, self.max_retry_s)
                    continue
                missing = False
                self.synced.set()
                backoff = self.retry_s
                self._watch_from(rv)
            except KubeError as exc:
                if self._stop.is_set():
                    return
                self.errors += 1
                if exc.status == 410:  # the resource version expired: relist now
                    continue
                self._report(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.max_retry_s)
            except Exception as exc:  # a malformed stream or a lost connection must not end the informer
                if self._stop.is_set():
                    return
                self.errors += 1
                self._report(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.max_retry_s)

    def _watch_from(self, rv: str) -> None:
        while not self._stop.is_set():
            watch = self.kube.watch(
                self.path, rv, timeout_s=self.watch_timeout_s, label_selector=self.label_selector
            )
            with self._lock:
                self._watch = watch
            try:
                if self._stop.is_set():
                    watch.close()
                for event_type, obj in watch:
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if event_type in CHANGES:
                        self.sink.apply(event_type, obj)
            finally:
                with self._lock:
                    self._watch = None

    def _report(self, exc: BaseException) -> None:
        if self.on_error is not None:
            self.on_error(exc)
            return
        error = str(exc) if isinstance(exc, KubeError) else f"{type(exc).__name__}: {exc}"
        log.warning("watch_failed", path=self.path, error=error)
