"""The kube-scheduler extender, in the shape of scheduler-plugins' ``noderesourcetopology``: a cache
apart, one module per extension point, the HTTP face.

- ``cache``: the one table of watched kinds (``KINDS``, DRA's among them), what is kept of each object
  (``project``: a projection per kind; a pod's with what it asks through DRA claims written in, by
  ``scheduler_plugin.claims``), the per-pod facts parsed once per event (``PodInfo``, ``gpus_of``), and
  the informer store (``Cache``) with the indexes the queue and the verbs read (gang members, running
  work per name, node usage, the nodes each selector and toleration set admits), the one free-GPU
  formula and the planner's snapshot;
- ``holds``: what is held for gangs and for how long, every hold one type (``queue.Reservation``): a
  started gang's (``StartedPlan``, with its bind barrier), the queue's head's, a given-up plan's;
- ``outbox``: the Events, evictions and nudges the decisions leave the caller;
- ``inputs``: the queue's inputs (a gang's plan inputs, waiting and running work, time limits, repairs,
  the backfill caps);
- ``queue_driver``: the queue's passes (a pass runs only when the cluster changed or a wait ended);
- ``filter``, ``prioritize``, ``bind`` (with the barrier), ``preempt``: the verbs, one module each;
- ``state``: ``ExtenderState``, the parts wired together;
- ``policy``: a gang's ``gpuagent.dev/mnnvl`` and ``gpuagent.dev/repair`` annotations and its mode;
- ``repair``: the part of a running gang left to place, replacements pinned to their subgroup's domain;
- ``clock``: the state's one clock (``ApiClock``): seconds since the epoch, the wall clock read once at
  start plus monotonic time, so it never steps back; every state method takes its ``now``;
- ``http``: the extender API over it (``Extender``, ``ExtenderServer``).

Pure but for ``clock`` and ``http`` (an import-linter contract): decisions come back as values that
``agent.commands.extender`` carries out through ``topology.kube``'s verbs.
"""

from scheduler_plugin.extender.bind import BindDecision
from scheduler_plugin.extender.cache import KINDS, SCHEDULER_NAME, PodInfo, gpus_of, project
from scheduler_plugin.extender.filter import FilterOutcome
from scheduler_plugin.extender.http import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_JSON_DEPTH,
    MAX_NUMBER_CHARS,
    BadRequestError,
    Cluster,
    Extender,
    ExtenderServer,
    QueueCluster,
    ServerLimits,
    decode_json,
    json_depth,
    server_tls_context,
)
from scheduler_plugin.extender.outbox import EventRecord, Eviction, QueueActions
from scheduler_plugin.extender.queue_driver import GANG_PLANNED
from scheduler_plugin.extender.state import ExtenderState

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "GANG_PLANNED",
    "KINDS",
    "MAX_JSON_DEPTH",
    "MAX_NUMBER_CHARS",
    "SCHEDULER_NAME",
    "BadRequestError",
    "BindDecision",
    "Cluster",
    "EventRecord",
    "Eviction",
    "Extender",
    "ExtenderServer",
    "ExtenderState",
    "FilterOutcome",
    "PodInfo",
    "QueueActions",
    "QueueCluster",
    "ServerLimits",
    "decode_json",
    "gpus_of",
    "json_depth",
    "project",
    "server_tls_context",
]
