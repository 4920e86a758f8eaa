"""The extender's state: the parts wired together (``ExtenderState``). Pure.

Fed by informer events (plain API dicts, ``state.cache.replace``/``apply``) and by the scheduler's calls
(``state.filter``, ``state.prioritize``, ``state.bind``, ``state.preempt``); the clock is an argument
(``now``, one clock for every part: seconds since the epoch, what pod timestamps and time limits are
written in, never stepping back; ``extender.clock.ApiClock`` in production) so every decision can be
replayed in a test. Nothing here talks to the network: the
decisions come back as values (which nodes pass, which pods to bind, which Events to record, which pods
to evict) and ``scheduler_plugin.extender.http`` carries them out.

The parts, each the owner of its own state:

- ``cache`` (``extender.cache.Cache``): the informer store and its indexes, the one free-GPU formula,
  the planner's snapshot;
- ``holds`` (``extender.holds.Holds``): the holds of started gangs, of the queue's head and of plans
  given up, all of one type (``queue.Reservation``);
- ``outbox`` (``extender.outbox.Outbox``): Events, evictions and nudges for the caller;
- ``inputs`` (``extender.inputs.QueueInputs``): what the queue and a gang's plan read, time limits,
  repairs;
- ``queue`` (``extender.queue_driver.QueueDriver``): the queue's passes;
- ``filter``, ``prioritize``, ``bind``, ``preempt``: the verbs, one module each.

Every part that keeps something per pod lets go of it when the pod is gone (``Cache.on_gone``;
``pod_maps`` counts them).
"""

from __future__ import annotations

from scheduler_plugin.extender.bind import Bind
from scheduler_plugin.extender.cache import SCHEDULER_NAME, Cache
from scheduler_plugin.extender.filter import Filter
from scheduler_plugin.extender.holds import Holds
from scheduler_plugin.extender.inputs import QueueInputs
from scheduler_plugin.extender.outbox import Outbox
from scheduler_plugin.extender.preempt import Preempt
from scheduler_plugin.extender.prioritize import Prioritize
from scheduler_plugin.extender.queue_driver import QueueDriver
from scheduler_plugin.queue import QueueConfig
from scheduler_plugin.queueing import QueueMetrics


class ExtenderState:
    """The extender's parts (module docstring), wired once."""

    def __init__(self, *, scheduler_name: str = SCHEDULER_NAME, queue: QueueConfig | None = None) -> None:
        """``queue``: the queue's and the extender's settings, checked there (default ``QueueConfig()``)."""
        config = queue if queue is not None else QueueConfig()
        metrics = QueueMetrics()
        self.cache = Cache(scheduler_name=scheduler_name)
        self.outbox = Outbox()
        self.holds = Holds(self.cache, ttl_s=config.reservation_ttl_s)
        self.inputs = QueueInputs(self.cache, self.holds, self.outbox, config=config)
        self.preempt = Preempt(
            self.cache, self.holds, self.inputs, self.outbox, config=config, metrics=metrics
        )
        self.queue = QueueDriver(
            self.cache, self.holds, self.inputs, self.preempt, self.outbox, config=config, metrics=metrics
        )
        self.filter = Filter(self.cache, self.holds, self.inputs, self.queue, self.outbox)
        self.prioritize = Prioritize(self.cache, self.holds)
        self.bind = Bind(self.cache, self.holds, timeout_s=config.barrier_timeout_s)
        self.cache.holder = self.holds
        self.cache.on_gone = [
            self.preempt.forget,
            self.outbox.forget,
            self.bind.forget,
            self.holds.forget,
            self.inputs.forget,
        ]

    def pod_maps(self) -> dict[str, int]:
        """How many pods each per-pod map holds (a test's and an operator's check that none grows)."""
        return {
            "info": len(self.cache.info),
            "evicting": len(self.preempt.evicting),
            "overrun": len(self.preempt.overrun),
            "last_event": len(self.outbox.last_event),
            "refused": len(self.outbox.refused),
            "nudges": len(self.outbox.nudges),
            "uids": len(self.bind.uids),
            "filtered": len(self.holds.filtered),
            "first_seen": len(self.inputs.first_seen),
            "limits": len(self.cache.limits),
        }
