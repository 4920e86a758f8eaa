"""The one Kubernetes adapter, shared by the topology controller, the node publisher and the extender.

- :mod:`~topology.kube.client`: :func:`api_client_from` (kubeconfig, in-cluster, ~/.kube/config),
  :class:`Kube` (plain-dict get/list/watch, server-side apply with field manager ``gpu-node-agent``,
  create/replace/delete, pod binding, and ``request``/``read`` for any other call), :class:`KubeError`,
  and the collection paths;
- :mod:`~topology.kube.informer`: :class:`Informer` (list then watch one kind into a :class:`Sink`,
  relisting after 410 Gone, a missing CRD counted as empty) and :class:`Store`, the plain sink;
- :mod:`~topology.kube.recorder`: :class:`EventRecorder`, the one Event writer;
- :mod:`~topology.kube.verbs`: the verbs a scheduler carries out (bind, evict with a dry run first,
  merge-patched Node and Pod annotations, pod Events), :class:`~topology.kube.verbs.ClusterVerbs`;
- :mod:`~topology.kube.lease`: :class:`LeaseElector`, Lease-based leader election;
- :mod:`~topology.kube.aio`: :class:`~topology.kube.aio.AsyncKube`, small JSON requests (the extender's
  pod bindings) sent from an event loop over kept-alive connections, with the ``ApiClient``'s server,
  TLS settings and credentials.

Objects are camelCase JSON dicts as the API serves them; the ``kubernetes`` package is imported only to
build the ``ApiClient`` (:func:`api_client_from`), whose serializer and auth every request goes through.
This package is the program's one way to the API server: an import-linter contract keeps ``kubernetes``
out of every other module of ``agent``, ``deviceplugin``, ``scheduler_plugin`` and ``topology`` (the
local cluster and the benchmarks included).
Imports nothing of ours but :mod:`topology.logs`.
"""

from topology.kube.client import (
    APPLY_CONTENT_TYPE,
    FIELD_MANAGER,
    GPUNODES,
    HYPERNODES,
    NODES,
    PODGROUPS,
    PODS,
    RESOURCESLICES,
    Kube,
    KubeError,
    Watch,
    api_client_from,
    binding,
    configmaps,
    events,
    leases,
    resourceclaims,
)
from topology.kube.informer import Informer, Sink, Store, object_key
from topology.kube.lease import LeaseElector, micro_time
from topology.kube.recorder import EVENT_NAMESPACE, EventRecorder, ObjectRef, RecordedEvent

__all__ = [
    "APPLY_CONTENT_TYPE",
    "EVENT_NAMESPACE",
    "FIELD_MANAGER",
    "GPUNODES",
    "HYPERNODES",
    "NODES",
    "PODGROUPS",
    "PODS",
    "RESOURCESLICES",
    "EventRecorder",
    "Informer",
    "Kube",
    "KubeError",
    "LeaseElector",
    "ObjectRef",
    "RecordedEvent",
    "Sink",
    "Store",
    "Watch",
    "api_client_from",
    "binding",
    "configmaps",
    "events",
    "leases",
    "micro_time",
    "object_key",
    "resourceclaims",
]
