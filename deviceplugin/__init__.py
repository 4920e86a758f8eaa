"""Kubelet device plugin (API v1beta1): the resource manager (which devices back which resource,
health, preferred allocation) and the thin gRPC servers that speak to kubelet.

Pure decisions (no I/O, no clock; an import-linter contract keeps them so):
``config`` (the ``version: v1`` plugin sections ``flags``, ``sharing``, ``cdi``), ``resources`` (MIG
strategies, sharing, device IDs), ``preferred`` (NVLink-aware preferred allocation, exact),
``container`` (what a container gets from Allocate, and refusals), ``cdi`` (the CDI spec; its writer is
the one file operation).
Adapters: ``server`` (one gRPC server per resource, ``Register``), ``manager`` (the component that keeps
servers and registrations true while the node and kubelet change), ``unixgrpc`` (the unix-socket
channel to kubelet).

The node arrives through ``node``: Protocols this package defines (``NodeState`` — inventory, device
health, change notifications); the agent's inventory store satisfies them. Device health is the node's
(``agent.healthbook`` decides it); the servers read it when they answer and keep no copy.

The DRA kubelet plugin (``resource.k8s.io/v1``) is the subpackage ``dra``, over the same resource plan.
Owns ``deviceplugin/api`` (our ``.proto`` and generated stubs; only ``server`` imports them here).
Imports ``topology`` only: nothing of ``agent`` (not even lazily) nor ``scheduler_plugin``.
"""
