"""Topology: the shared vocabulary (``model``), the per-node ``GPUNode`` CR, InfiniBand fabric
parsing, the HyperNode tree builder, the cluster controller and exports for other schedulers.

Must not import ``agent``, ``deviceplugin`` or ``scheduler_plugin``; ``topology.model`` imports
nothing of ours.
"""
