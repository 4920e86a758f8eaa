"""The kube-scheduler extender, in the shape of scheduler-plugins' ``noderesourcetopology``: a cache
apart, the decisions over it, the HTTP face.

- ``cache``: the one table of watched kinds (``KINDS``, DRA's among them), what is kept of each object
  (``project``: a projection per kind; a pod's with what it asks through DRA claims written in, by
  ``scheduler_plugin.claims``), the per-pod facts parsed once per event (``PodInfo``, ``gpus_of``);
- ``state``: ``ClusterState``, fed by the informers through the cache, with the indexes the queue reads
  (gang members, running work per name, node usage, the nodes each selector and toleration set
  admits), the verbs' decisions (filter, prioritize, bind with the barrier, preempt) and the queue
  driver (a pass runs only when the cluster changed or a wait ended);
- ``policy``: a gang's ``gpuagent.dev/mnnvl`` and ``gpuagent.dev/repair`` annotations and its mode;
- ``repair``: the part of a running gang left to place, replacements pinned to their subgroup's domain;
- ``http``: the extender API over it (``Extender``, ``ExtenderServer``).

Pure but for ``http`` (an import-linter contract): decisions come back as values that
``agent.commands.extender`` carries out through ``topology.kube``'s verbs.
"""

from scheduler_plugin.extender.cache import KINDS, PodInfo, gpus_of, project
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
from scheduler_plugin.extender.state import (
    DEFAULT_REPAIR_WAIT_S,
    ENFORCE_MODES,
    GANG_PLANNED,
    SCHEDULER_NAME,
    BindDecision,
    ClusterState,
    EventRecord,
    Eviction,
    FilterOutcome,
    QueueActions,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_REPAIR_WAIT_S",
    "ENFORCE_MODES",
    "GANG_PLANNED",
    "KINDS",
    "MAX_JSON_DEPTH",
    "MAX_NUMBER_CHARS",
    "SCHEDULER_NAME",
    "BadRequestError",
    "BindDecision",
    "Cluster",
    "ClusterState",
    "EventRecord",
    "Eviction",
    "Extender",
    "ExtenderServer",
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
