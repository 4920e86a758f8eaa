"""Topology: the shared vocabulary (``model``), the per-node ``GPUNode`` CR, InfiniBand fabric
parsing, the HyperNode tree builder, the cluster controller and exports for other schedulers.

Pure cores (no I/O, no clock): ``model``, ``nvlink`` (a node's NVLink domain), ``names`` (stable names),
``gpunode`` (object, parser, CRD), ``labels`` (node labels), ``ibnet`` (ibnetdiscover -> switch tree),
``sources`` (GPUNodes, labels, fabric, mapping -> builder input), ``builder`` (tree and diff),
``exports`` (Kueue, topograph labels, Slurm). Adapters: ``kube`` (REST over an injected ``ApiClient``,
Lease elector), ``controller`` (reflectors, debounced reconcile), ``controller_command`` (the CLI).

Must not import ``agent``, ``deviceplugin`` or ``scheduler_plugin`` (``bench`` may use
``agent.benchmarks.machine``); ``topology.model`` imports nothing of ours.
"""
