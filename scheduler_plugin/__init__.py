"""Topology-aware gang scheduling: the pure planner, the ``plan`` command, the kube-scheduler
extender (filter / prioritize / bind with a gang barrier) and the placement benchmark.

The planner (``planner``, ``snapshot``) does no I/O. Nothing here imports ``agent`` or
``deviceplugin``.
"""
