"""Topology: the shared vocabulary (``model``), the per-node ``GPUNode`` CR, InfiniBand fabric
parsing, the HyperNode tree builder, the cluster controller and exports for other schedulers, and the
one Kubernetes adapter and structured logging every package uses.

Pure cores (no I/O, no clock): ``model``, ``nvlink`` (a node's NVLink domain), ``names`` (stable names),
``gpunode`` (object, parser, CRD), ``labels`` (node labels), ``ibnet`` (ibnetdiscover -> switch tree),
``sources`` (GPUNodes, labels, fabric, mapping -> builder input), ``builder`` (tree and diff),
``exports`` (Kueue, topograph labels, Slurm). Adapters: ``kube`` (the one Kubernetes adapter: plain-dict
REST over an injected ``ApiClient``, server-side apply, the list/watch ``Informer``, the Event writer,
pod binding, the Lease elector; used by the controller, ``agent.publisher`` and the extender),
``controller`` (informers into stores, debounced reconcile). ``logs`` is the one logging style
(bound loggers, snake_case events; configured once by each command's composition root); ``lifecycle``
the stop-aware waits every long-running component uses; ``httpserver`` the one hardened HTTP/1.1 server
(bounded heads and bodies, timeouts, a connection cap that evicts idle clients, optional TLS) under the
metrics and health listeners and the extender; ``safeyaml`` the bounded loader for untrusted YAML/JSON;
``files`` the one bounded reader of files from outside the program (regular files only, a size cap).

Must not import ``agent``, ``deviceplugin`` or ``scheduler_plugin``; ``topology.model`` imports nothing
of ours.
"""
