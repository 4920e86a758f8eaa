"""Topology-aware gang scheduling, a library: the pure planner, the kube-scheduler extender (filter /
prioritize / bind with a gang barrier) and the placement simulator.

Owns: the planner's types (``snapshot``, with ``PodSlot``, a pod's role and index) and algorithm (the
``planner`` package; its objective has one owner, ``planner.objective``), the gang sources (``gangs``),
API objects to snapshots (``cluster``), GPUs pods get through DRA claims (``claims``), the extender
(``extender``: its cache, pure state and queue driver, and its HTTP server), the ``plan`` file formats
(``formats``) and the placement simulator with the anchors' policies (``placement``; the only importer of
``highspy`` and ``matplotlib``). The planner, snapshot, queue and the extender's cache and state import
no I/O library (an import-linter contract).

Imports ``topology`` only (the vocabulary, ``topology.logs``); never ``agent`` or ``deviceplugin``. The
Kubernetes adapter it is handed (``topology.kube``) and its composition roots (``agent.commands.extender``,
``agent.commands.plan``, the benchmark harnesses in ``agent.benchmarks``) belong to the layers around it.
"""
