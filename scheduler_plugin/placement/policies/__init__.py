"""Placement policies compared by the benchmark: ours and faithful re-implementations of the anchors'
published algorithms (each module's header names the source file and function it follows).

``POLICIES`` maps the benchmark's policy key to a factory. ``optimum`` is not a per-gang policy: it is
the integer program of ``optimum.py`` that bounds what any policy can place on a small instance.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler_plugin.placement.policies.base import Policy
from scheduler_plugin.placement.policies.kai import Kai
from scheduler_plugin.placement.policies.kube_default import KubeDefault
from scheduler_plugin.placement.policies.kueue import Kueue
from scheduler_plugin.placement.policies.ours import Ours
from scheduler_plugin.placement.policies.slurm import Slurm
from scheduler_plugin.placement.policies.volcano import Volcano

# Each policy's queue in its default configuration, as (sim queue, sim preemption); each module's
# header says what it follows, with the upstream source file.
OWN_QUEUE: dict[str, tuple[str, str]] = {
    "ours": ("core", "core"),
    "volcano": ("greedy", "none"),
    "kueue": ("greedy", "none"),
    "kai": ("greedy", "kai"),
    "slurm": ("reserve", "none"),
    "kube-default": ("greedy", "none"),
}

POLICIES: dict[str, Callable[[], Policy]] = {
    "ours": Ours,
    "volcano": Volcano,
    "kueue": Kueue,
    "kai": Kai,
    "slurm": Slurm,
    "kube-default": KubeDefault,
}
