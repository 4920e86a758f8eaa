"""The node agent: NVML access (``agent.nvml``), discovery, health, metrics, publishing and the
subcommands' composition roots (``agent.commands``, ``agent.cli``).

Owns everything that touches the node's hardware. Must not import ``scheduler_plugin`` except
lazily from the CLI dispatcher; only ``agent.nvml.real`` imports ``pynvml``.
"""
