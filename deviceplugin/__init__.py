"""Kubelet device plugin (API v1beta1): the resource manager (which devices back which resource,
health, preferred allocation) and the thin gRPC servers that speak to kubelet.

Owns ``deviceplugin/api`` (our ``.proto`` and generated stubs). Must not import ``scheduler_plugin``
or ``topology.controller``; receives NVML through constructor arguments.
"""
