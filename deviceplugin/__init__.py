"""Kubelet device plugin (API v1beta1): the resource manager (which devices back which resource,
health, preferred allocation) and the thin gRPC servers that speak to kubelet.

Pure decisions (no I/O, no clock; an import-linter contract keeps them so):
``config`` (the ``version: v1`` plugin sections), ``resources`` (MIG strategies, sharing, device IDs),
``preferred`` (NVLink-aware preferred allocation, exact), ``container`` (Allocate responses and refusals),
``cdi`` (the CDI spec; its writer is the one file operation).
Adapters: ``server`` (one gRPC server per resource, ``Register``), ``manager`` (the component that keeps
servers and registrations true while the node and kubelet change), ``fakekubelet`` (a kubelet stand-in
for benchmarks and tests), ``bench``.

Owns ``deviceplugin/api`` (our ``.proto`` and generated stubs; only ``server``, ``bench`` and
``fakekubelet`` import them). Must not import ``scheduler_plugin`` or ``topology.controller``; receives
NVML and the inventory through the node runtime (``agent.runtime``), never a global.
"""
