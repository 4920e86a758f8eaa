"""What the extender's decisions leave the caller to carry out, gathered until the queue loop takes them.

Events (``EventRecord``: each said once per pod and reason/message, ``Outbox.once``), evictions
(``Eviction``: whole gangs for a preemption, or work past its declared time limit), and the nudges of
pods kube-scheduler parked among its unschedulable pods after filter refused them while their gang
waited (``gpuagent.dev/gang-planned``, written once their gang starts). ``QueueActions`` is what a pass
hands over (``QueueDriver.take_actions``). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler_plugin.cluster import pod_key


@dataclass(frozen=True)
class EventRecord:
    """A Kubernetes Event to record on a pod."""

    pod: Mapping[str, Any]
    reason: str
    message: str
    warning: bool = True


@dataclass(frozen=True)
class Eviction:
    """A pod to evict for a preemption, or (``reason`` ``TimeLimitExceeded``) for running past its
    declared time limit: it belongs to ``victim`` (a whole gang or workload, or ``pod:<key>``);
    ``preemptor``: the gang it is evicted for. ``check_first``: the first asking of that preemption: every
    eviction of it is tried as a dry run first and none is made if any is refused."""

    pod: Mapping[str, Any]
    victim: str
    message: str
    preemptor: str = ""
    check_first: bool = False
    reason: str = "Preempted"  # the Event's reason once evicted


@dataclass(frozen=True)
class QueueActions:
    """What a pass of the queue leaves to the caller (``QueueDriver.take_actions``)."""

    events: tuple[EventRecord, ...] = ()
    annotate: Mapping[str, str | None] = field(default_factory=dict)
    evictions: tuple[Eviction, ...] = ()
    # pods to annotate ``gpuagent.dev/gang-planned`` (pod -> value): pods of a gang that started after
    # filter refused them. kube-scheduler keeps a pod an extender refused among its unschedulable pods
    # until a cluster event moves it (or its 5-minute flush); an update of the pod itself is such an event
    nudges: tuple[tuple[Mapping[str, Any], str], ...] = ()


class Outbox:
    """The Events, evictions and nudges waiting for the caller, and what is remembered per pod to say
    each once: the last Event said on it, and the gang whose pod filter refused while it waited."""

    def __init__(self) -> None:
        self.last_event: dict[str, tuple[str, str]] = {}
        self.events: list[EventRecord] = []
        self.evictions: list[Eviction] = []
        self.refused: dict[str, str] = {}  # pod key -> gang: filter refused it while its gang waited
        self.nudges: dict[str, str] = {}  # pod key -> the gang-planned value to annotate

    def once(
        self, pod: Mapping[str, Any], reason: str, message: str, *, warning: bool = True
    ) -> list[EventRecord]:
        """An Event on ``pod``, unless the last one said on it was the same."""
        key = pod_key(pod)
        if self.last_event.get(key) == (reason, message):
            return []
        self.last_event[key] = (reason, message)
        return [EventRecord(pod=pod, reason=reason, message=message, warning=warning)]

    def say(self, pod: Mapping[str, Any], reason: str, message: str, *, warning: bool = True) -> None:
        """``once``, kept for the caller (``take``)."""
        self.events += self.once(pod, reason, message, warning=warning)

    def nudge(self, gang: str, keys: Iterable[str], planned: str) -> None:
        """``gang`` started: each of its pods ``keys`` that filter refused is nudged (``planned``)."""
        for k in keys:
            if self.refused.pop(k, None) == gang:  # waits among kube-scheduler's unschedulable
                self.nudges[k] = planned

    def take(
        self, pods: Mapping[str, Mapping[str, Any]]
    ) -> tuple[tuple[EventRecord, ...], tuple[Eviction, ...], tuple[tuple[Mapping[str, Any], str], ...]]:
        """The Events, evictions and nudges (of the ``pods`` still there) kept so far, handed over once."""
        events, self.events = self.events, []
        evictions, self.evictions = self.evictions, []
        nudges = tuple((pods[k], v) for k, v in sorted(self.nudges.items()) if k in pods)
        self.nudges = {}
        return tuple(events), tuple(evictions), nudges

    def forget(self, key: str) -> None:
        """Let go of a pod that is gone."""
        self.last_event.pop(key, None)
        self.refused.pop(key, None)
        self.nudges.pop(key, None)
