"""What a GPU's NVLink fabric facts mean for scheduling: conditions, a level per GPU and per node. Pure.

NVML reports per GPU a fabric ``state``/``status``, a ``healthSummary`` and a ``healthMask``
(decoded into :class:`~topology.model.FabricHealth`). :func:`fabric_conditions` names every fault
they show; a :class:`FabricPolicy` sorts the conditions into two levels:

- ``unhealthy`` (default: route unhealthy, incorrect configuration, fabric state other than
  ``COMPLETED`` or status other than ``SUCCESS``, summary ``UNHEALTHY``): the GPU is out of its NVLink
  domain — the node's ``nvidia.com/gpu.clique`` and ``gpuagent.dev/nvlink-domain`` labels are withdrawn —
  and, with ``health.fabricUnhealthyMarksGpu``, out of kubelet (the health book decides that);
- ``degraded`` (default: degraded bandwidth, route recovery in progress, access-timeout recovery in
  progress, summary ``LIMITED_CAPACITY``): still schedulable; the node is labelled ``degraded`` and the
  planner ranks it after clean nodes of the same domain.

A condition in neither set is reported (metrics, ``GPUNode``) and changes nothing. The mask's partition
flag (``FabricHealth.partition_assigned``) is no condition: it is information, exported as the metric
``gpuagent_fabric_partition_assigned`` and never judged. The node's level
(label ``gpuagent.dev/fabric-health``) is its worst GPU's; a node without multi-node fabric info has
none.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from topology.model import FabricHealthSummary, FabricInfo, FabricState, NodeInventory

LABEL_FABRIC_HEALTH = "gpuagent.dev/fabric-health"


class FabricCondition(enum.StrEnum):
    DEGRADED_BANDWIDTH = "degraded_bandwidth"
    ROUTE_RECOVERY = "route_recovery"
    ROUTE_UNHEALTHY = "route_unhealthy"
    ACCESS_TIMEOUT_RECOVERY = "access_timeout_recovery"
    INCORRECT_CONFIGURATION = "incorrect_configuration"
    NOT_COMPLETED = "not_completed"  # state other than COMPLETED, or status other than SUCCESS
    SUMMARY_UNHEALTHY = "summary_unhealthy"
    LIMITED_CAPACITY = "limited_capacity"


class FabricLevel(enum.StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"


_RANK = {FabricLevel.HEALTHY: 0, FabricLevel.DEGRADED: 1, FabricLevel.UNHEALTHY: 2}

DEFAULT_UNHEALTHY: frozenset[FabricCondition] = frozenset(
    {
        FabricCondition.ROUTE_UNHEALTHY,
        FabricCondition.INCORRECT_CONFIGURATION,
        FabricCondition.NOT_COMPLETED,
        FabricCondition.SUMMARY_UNHEALTHY,
    }
)
DEFAULT_DEGRADED: frozenset[FabricCondition] = frozenset(
    {
        FabricCondition.DEGRADED_BANDWIDTH,
        FabricCondition.ROUTE_RECOVERY,
        FabricCondition.ACCESS_TIMEOUT_RECOVERY,
        FabricCondition.LIMITED_CAPACITY,
    }
)


@dataclass(frozen=True, slots=True)
class FabricPolicy:
    """Which conditions make a GPU's fabric unhealthy and which degraded (disjoint sets)."""

    unhealthy: frozenset[FabricCondition] = DEFAULT_UNHEALTHY
    degraded: frozenset[FabricCondition] = DEFAULT_DEGRADED

    def __post_init__(self) -> None:
        both = self.unhealthy & self.degraded
        if both:
            names = ", ".join(sorted(c.value for c in both))
            raise ValueError(f"fabric condition(s) {names} cannot be both unhealthy and degraded")

    def level(self, conditions: Iterable[FabricCondition]) -> FabricLevel:
        found = frozenset(conditions)
        if found & self.unhealthy:
            return FabricLevel.UNHEALTHY
        if found & self.degraded:
            return FabricLevel.DEGRADED
        return FabricLevel.HEALTHY


DEFAULT_FABRIC_POLICY = FabricPolicy()


@dataclass(frozen=True, slots=True)
class GpuFabricVerdict:
    """One GPU's fabric: the conditions seen and the level the policy gives them."""

    gpu_index: int
    level: FabricLevel
    conditions: tuple[FabricCondition, ...] = field(default=())

    @property
    def reason(self) -> str:
        """For the operator: the level and the conditions, e.g. ``fabric unhealthy: route_unhealthy``."""
        if not self.conditions:
            return f"fabric {self.level.value}"
        return f"fabric {self.level.value}: {', '.join(c.value for c in self.conditions)}"


def fabric_conditions(info: FabricInfo) -> tuple[FabricCondition, ...]:
    """Every fault the GPU's fabric info shows, in ``FabricCondition`` order. A GPU without a
    multi-node fabric (state ``NOT_SUPPORTED``) has none."""
    if info.state is FabricState.NOT_SUPPORTED:
        return ()
    h = info.health
    found = {
        FabricCondition.DEGRADED_BANDWIDTH: h.degraded_bandwidth is True,
        FabricCondition.ROUTE_RECOVERY: h.route_recovery_in_progress is True,
        FabricCondition.ROUTE_UNHEALTHY: h.route_unhealthy is True,
        FabricCondition.ACCESS_TIMEOUT_RECOVERY: h.access_timeout_recovery is True,
        FabricCondition.INCORRECT_CONFIGURATION: h.incorrect_configuration not in (None, "NONE"),
        FabricCondition.NOT_COMPLETED: info.state is not FabricState.COMPLETED or info.status != "SUCCESS",
        FabricCondition.SUMMARY_UNHEALTHY: info.health_summary is FabricHealthSummary.UNHEALTHY,
        FabricCondition.LIMITED_CAPACITY: info.health_summary is FabricHealthSummary.LIMITED_CAPACITY,
    }
    return tuple(c for c in FabricCondition if found[c])


def gpu_fabric_verdict(info: FabricInfo, policy: FabricPolicy = DEFAULT_FABRIC_POLICY) -> GpuFabricVerdict:
    conditions = fabric_conditions(info)
    return GpuFabricVerdict(info.gpu_index, policy.level(conditions), conditions)


def fabric_verdicts(
    inventory: NodeInventory, policy: FabricPolicy = DEFAULT_FABRIC_POLICY
) -> tuple[GpuFabricVerdict, ...]:
    """A verdict per GPU with fabric info (state other than ``NOT_SUPPORTED``), by index."""
    entries = sorted(
        (f for f in inventory.fabric if f.state is not FabricState.NOT_SUPPORTED), key=lambda f: f.gpu_index
    )
    return tuple(gpu_fabric_verdict(f, policy) for f in entries)


def node_fabric_level(
    inventory: NodeInventory, policy: FabricPolicy = DEFAULT_FABRIC_POLICY
) -> FabricLevel | None:
    """The node's level: its worst GPU's; ``None`` when no GPU has fabric info."""
    verdicts = fabric_verdicts(inventory, policy)
    if not verdicts:
        return None
    return max((v.level for v in verdicts), key=_RANK.__getitem__)


def parse_conditions(values: object, where: str) -> frozenset[FabricCondition]:
    """A config list of condition names; ``ValueError`` naming ``where`` and the valid names."""
    if not isinstance(values, list | tuple):
        raise ValueError(f"{where}: expected a list of fabric conditions, got {values!r}")
    out: set[FabricCondition] = set()
    for value in values:
        try:
            out.add(FabricCondition(value))
        except ValueError:
            valid = ", ".join(c.value for c in FabricCondition)
            raise ValueError(f"{where}: {value!r} is not a fabric condition; valid: {valid}") from None
    return frozenset(out)
