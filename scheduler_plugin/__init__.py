"""Topology-aware gang scheduling: the pure planner, the ``plan`` command, the kube-scheduler
extender (filter / prioritize / bind with a gang barrier) and the placement benchmark.

Owns: the planner's types (``snapshot``) and algorithm (``planner``), the gang sources (``gangs``),
API objects to snapshots (``cluster``), the extender's pure state (``state``), its HTTP server
(``extender``), the Kubernetes adapter (``kube``) and the commands. The planner and snapshot import
no I/O library (an import-linter contract). Nothing here imports ``agent`` or ``deviceplugin``,
except the benchmark, which prints ``agent.benchmarks.machine``'s machine summary.
"""
