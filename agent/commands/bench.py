"""``gpu-node-agent bench TARGET``: each package owns its benchmark; this picks one.

Every benchmark prints its figures and the machine it ran on (see ``agent.benchmarks.machine``).
"""

from __future__ import annotations

import importlib
import sys

TARGETS: dict[str, tuple[str, str]] = {
    "discovery": ("agent.benchmarks.discovery", "full discovery time per simulated profile"),
    "simulator": ("agent.benchmarks.simulator", "NVML simulator: fault-file to event latency, per-call cost"),
    "deviceplugin": ("agent.benchmarks.deviceplugin", "Allocate, health propagation, re-registration"),
    "metrics": ("agent.benchmarks.metrics", "scrape latency, RSS and CPU of the exporter"),
    "topology": ("agent.benchmarks.topology", "HyperNode build and diff for 10,000 nodes"),
    "planner": ("agent.benchmarks.planner", "plan latency and extender throughput"),
    "placement": ("agent.benchmarks.placement", "our planner against the anchors"),
    "extender": (
        "agent.benchmarks.extender",
        "the extender's core fed in process: pass, filter, lock, events, RSS; growth in N",
    ),
    "cluster": (
        "agent.benchmarks.cluster",
        "gang to Running on hollow nodes: extender vs Volcano; cost per pod",
    ),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        width = max(len(t) for t in TARGETS)
        print("usage: gpu-node-agent bench TARGET [options]\n\ntargets:")
        for name, (_, help_) in TARGETS.items():
            print(f"  {name:<{width}}  {help_}")
        return 0 if argv else 2
    name = argv[0]
    if name not in TARGETS:
        print(f"bench: unknown target {name!r}; valid: {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(TARGETS[name][0])
    code: int = module.main(argv[1:])
    return code
