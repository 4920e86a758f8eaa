"""The one Event writer of the adapter: core/v1 Events about Nodes and Pods, as one component.

Each :meth:`EventRecorder.record` creates one Event (``count`` 1, first and last timestamp now). What is
news is decided by the caller, which knows what it last said: the topology controller reports a node
leaving or rejoining its NVLink domain once per change (and, after a restart, reads what it said before
with :meth:`EventRecorder.latest`); the extender's state reports a pod's reason once until it changes.
Events about cluster-scoped objects (Nodes) go to the ``default`` namespace, where the API server keeps
its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from topology.kube.client import Kube, events

EVENT_NAMESPACE = "default"  # Events about cluster-scoped objects
MAX_MESSAGE = 1024


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about (``involvedObject``); empty ``namespace``: cluster-scoped."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"

    def as_dict(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid  # kubectl describe matches Events by uid
        return out


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """The latest Event this component recorded about one object."""

    reason: str
    message: str
    type: str
    timestamp: str


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


class EventRecorder:
    """Events as ``component`` (``source.component`` and ``reportingComponent``) from ``instance``."""

    def __init__(
        self, kube: Kube, *, component: str, instance: str = "", clock: Callable[[], float] = time.time
    ) -> None:
        self.kube = kube
        self.component = component
        self.instance = instance
        self.clock = clock

    def record(self, about: ObjectRef, *, reason: str, message: str, warning: bool = False) -> None:
        """Create one Event; raises :class:`topology.kube.KubeError` when the API refuses it."""
        namespace = about.namespace or EVENT_NAMESPACE
        now = _stamp(self.clock())
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{about.name}.", "namespace": namespace},
            "involvedObject": about.as_dict(),
            "type": "Warning" if warning else "Normal",
            "reason": reason,
            "message": message[:MAX_MESSAGE],
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        if self.instance:
            body["reportingInstance"] = self.instance
        self.kube.create(events(namespace), body)

    def latest(self, namespace: str = EVENT_NAMESPACE) -> dict[str, RecordedEvent]:
        """This component's latest Event per involved object name in ``namespace`` (what it said last,
        e.g. before a restart). Raises :class:`topology.kube.KubeError` when the list is refused."""
        items, _ = self.kube.list(events(namespace))
        latest: dict[str, RecordedEvent] = {}
        for e in items:
            if not self._ours(e):
                continue
            name = str((e.get("involvedObject") or {}).get("name", ""))
            stamp = str(e.get("lastTimestamp") or e.get("eventTime") or "")
            if name and (name not in latest or stamp >= latest[name].timestamp):
                latest[name] = RecordedEvent(
                    str(e.get("reason")), str(e.get("message")), str(e.get("type")), stamp
                )
        return latest

    def _ours(self, event: Mapping[str, Any]) -> bool:
        return (
            event.get("reportingComponent") == self.component
            or (event.get("source") or {}).get("component") == self.component
        )
