"""The node's GPU metrics exporter: ``/metrics`` (native or dcgm-exporter names), ``/healthz``, ``/readyz``.

Layers, pure first:

- ``snapshot``: frozen data of one refresh (per gpu, per mig device, per pod share, agent stats);
- ``attribution``: which pod/container holds which device, per-process shares of shared GPUs, cgroup
  path parsing (pure);
- ``native`` and ``dcgm``: two renderings of the same snapshot as Prometheus metric families
  (built with ``families``), written as text by ``exposition``;
- ``procmap``: thin adapter from host PIDs to pods (``/proc/<pid>/cgroup``, ``/var/log/pods``);
- ``cache``: the background refresher (bulk NVML reads in a worker thread, never during a scrape);
- ``server``: the asyncio HTTP listeners (metrics, and health alone on ``--health-addr`` for kubelet's
  probes), bounded against slow, idle and malformed clients; ``exporter``: the component; ``wiring``:
  builds both listeners from the ``run`` command's context;
- ``bench``: ``gpu-node-agent bench metrics``.

A scrape only renders the last snapshot: it never calls NVML or the kubelet. Must not import the
device plugin, ``scheduler_plugin`` or ``pynvml``; pod-resources comes from ``agent.podresources``.
"""
