"""The topology controller's ``/metrics``: each NVLink domain's status (``topology.nvlinkdomain``) and
the controller's own counters, built fresh on every scrape from the controller's latest reconcile.

One label, ``domain`` (the domain's name, as its ``NVLinkDomain`` and tier-1 ``HyperNode`` are named):
a few hundred series per family at 10,000 nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from agent.metrics.exposition import render_text
from agent.metrics.families import Families
from topology.nvlinkdomain import DomainStatus

PREFIX = "gpuagent_nvlink_domain_"


def domain_families(domains: Mapping[str, DomainStatus]) -> Families:
    fam = Families()
    for name in sorted(domains):
        s = domains[name]
        labels = {"domain": name}
        fam.gauge(PREFIX + "gpus", "GPUs of the domain's trays", labels, s.gpus)
        fam.gauge(PREFIX + "healthy_gpus", "GPUs that kubelet may allocate (health)", labels, s.healthy_gpus)
        fam.gauge(PREFIX + "free_gpus", "healthy GPUs no running pod holds", labels, s.free_gpus)
        fam.gauge(
            PREFIX + "stranded_gpus",
            "free GPUs on trays that are not ready for multi-node NVLink (fabric, IMEX or Node)",
            labels,
            s.stranded_gpus,
        )
        fam.gauge(
            PREFIX + "fragmentation_ratio",
            "share of free GPUs on ready trays that are not on a wholly free tray",
            labels,
            s.fragmentation,
        )
        fam.gauge(PREFIX + "trays", "trays (nodes) of the domain", labels, len(s.members))
        fam.gauge(PREFIX + "ready_trays", "trays ready for multi-node NVLink work", labels, len(s.ready))
        fam.gauge(PREFIX + "imex_ready_trays", "trays whose IMEX daemon is READY", labels, s.imex_ready)
        fam.gauge(
            PREFIX + "largest_subgroup_trays",
            "ready trays whose GPUs are all healthy and free: the largest whole-tray subgroup now",
            labels,
            s.largest_subgroup,
        )
    return fam


def controller_render(
    domains: Callable[[], Mapping[str, DomainStatus]], counters: Callable[[], Mapping[str, float]]
) -> Callable[[], bytes]:
    """The ``render`` of a :class:`agent.metrics.server.MetricsServer`: the domains plus the controller's
    counters (``reconciles``, ``writes``, ``failed_writes``) as ``gpuagent_topology_controller_*_total``."""

    def render() -> bytes:
        fam = domain_families(domains())
        for key, value in counters().items():
            fam.counter(
                f"gpuagent_topology_controller_{key}", f"the controller's {key.replace('_', ' ')}", {}, value
            )
        return render_text(fam)

    return render
