"""The program: the CLI (``agent.cli``), every subcommand's composition root (``agent.commands``), the
benchmark harnesses (``agent.benchmarks``), the demo and the local cluster, and the node-side adapters.

Node side: NVML access (``agent.nvml``: the protocol, the pynvml backend, the simulator and its fault
file), the simulated node (``agent.simnode``, which owns its fault follower), discovery, the node
runtime (``agent.runtime``: the component lifecycle and the inventory store), device health
(``agent.healthbook`` decides it, the one owner; ``agent.health`` feeds it from NVML), metrics,
pod-resources and publishing. ``agent.config`` is the ``run`` settings file, including its ``health``
section. ``agent.files`` is the node side's name for ``topology.files``, the one bounded reader of files
from outside the program (sysfs, procfs, the MPS pid file, the config file; the controller's and
``plan``'s files): regular files only, with a size cap.

The top layer: it may import ``deviceplugin``, ``scheduler_plugin`` and ``topology``; none of them
imports it. The device plugin receives the store through its own Protocols (``deviceplugin.node``).
Only ``agent.nvml.real`` imports ``pynvml``.
"""
