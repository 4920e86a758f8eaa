"""The fabric policy: each health-mask condition, the fabric state and the summary, judged per GPU and per
node, and what the node labels make of it (GFD's clique withdrawn, ``gpuagent.dev/fabric-health``)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.topology.factories import hgx_node, nvl72_tray
from topology.fabrichealth import (
    LABEL_FABRIC_HEALTH,
    FabricCondition,
    FabricLevel,
    FabricPolicy,
    fabric_conditions,
    fabric_verdicts,
    gpu_fabric_verdict,
    node_fabric_level,
    parse_conditions,
)
from topology.labels import LABEL_CLIQUE, LABEL_NVLINK_DOMAIN, node_labels
from topology.model import FabricHealth, FabricHealthSummary, FabricState, NodeInventory
from topology.nvlink import FabricStatus, nvlink_facts

CLEAN = FabricHealth(
    degraded_bandwidth=False,
    route_recovery_in_progress=False,
    route_unhealthy=False,
    access_timeout_recovery=False,
    incorrect_configuration="NONE",
    partition_assigned=True,
)


def with_gpu(inv: NodeInventory, index: int, **changes: object) -> NodeInventory:
    """``inv`` with GPU ``index``'s fabric entry changed (``health=`` takes FabricHealth field changes)."""
    health = changes.pop("health", None)
    fabric = []
    for entry in inv.fabric:
        if entry.gpu_index == index:
            mine = dataclasses.replace(CLEAN, **health or {})  # type: ignore[arg-type]
            fabric.append(dataclasses.replace(entry, health=mine, **changes))  # type: ignore[arg-type]
        else:
            fabric.append(dataclasses.replace(entry, health=CLEAN))
    return dataclasses.replace(inv, fabric=tuple(fabric))


# condition on GPU 2 -> (conditions, level, clique label kept)
CASES = {
    "clean": ({}, (), FabricLevel.HEALTHY, True),
    "degraded-bandwidth": (
        {"health": {"degraded_bandwidth": True}},
        (FabricCondition.DEGRADED_BANDWIDTH,),
        FabricLevel.DEGRADED,
        True,
    ),
    "route-recovery": (
        {"health": {"route_recovery_in_progress": True}},
        (FabricCondition.ROUTE_RECOVERY,),
        FabricLevel.DEGRADED,
        True,
    ),
    "route-unhealthy": (
        {"health": {"route_unhealthy": True}},
        (FabricCondition.ROUTE_UNHEALTHY,),
        FabricLevel.UNHEALTHY,
        False,
    ),
    "access-timeout-recovery": (
        {"health": {"access_timeout_recovery": True}},
        (FabricCondition.ACCESS_TIMEOUT_RECOVERY,),
        FabricLevel.DEGRADED,
        True,
    ),
    "incorrect-configuration": (
        {"health": {"incorrect_configuration": "INSUFFICIENT_NVLINKS"}},
        (FabricCondition.INCORRECT_CONFIGURATION,),
        FabricLevel.UNHEALTHY,
        False,
    ),
    "partition-assigned-false-is-no-fault": (
        {"health": {"partition_assigned": False}},
        (),
        FabricLevel.HEALTHY,
        True,
    ),
    "in-progress": (
        {"state": FabricState.IN_PROGRESS},
        (FabricCondition.NOT_COMPLETED,),
        FabricLevel.UNHEALTHY,
        False,
    ),
    "status-failed": (
        {"status": "INSUFFICIENT_RESOURCES"},
        (FabricCondition.NOT_COMPLETED,),
        FabricLevel.UNHEALTHY,
        False,
    ),
    "summary-unhealthy": (
        {"health_summary": FabricHealthSummary.UNHEALTHY},
        (FabricCondition.SUMMARY_UNHEALTHY,),
        FabricLevel.UNHEALTHY,
        False,
    ),
    "limited-capacity": (
        {"health_summary": FabricHealthSummary.LIMITED_CAPACITY, "health": {"degraded_bandwidth": True}},
        (FabricCondition.DEGRADED_BANDWIDTH, FabricCondition.LIMITED_CAPACITY),
        FabricLevel.DEGRADED,
        True,
    ),
}


@pytest.mark.parametrize(("change", "conditions", "level", "clique"), CASES.values(), ids=CASES.keys())
def test_each_condition_of_one_gpu_judges_the_gpu_and_the_tray(
    change: dict[str, object], conditions: tuple[FabricCondition, ...], level: FabricLevel, clique: bool
) -> None:
    inv = with_gpu(nvl72_tray("t"), 2, **dict(change))
    verdicts = fabric_verdicts(inv)
    assert [v.gpu_index for v in verdicts] == [0, 1, 2, 3]
    assert verdicts[2].conditions == conditions
    assert verdicts[2].level is level
    assert all(v.level is FabricLevel.HEALTHY for v in verdicts if v.gpu_index != 2)
    assert node_fabric_level(inv) is level
    labels = node_labels(inv, node_name="t")
    assert labels[LABEL_FABRIC_HEALTH] == level.value
    assert (LABEL_CLIQUE in labels) is clique  # the tray leaves its NVLink domain ...
    assert (LABEL_NVLINK_DOMAIN in labels) is clique
    facts = nvlink_facts(inv)
    assert (facts.status is FabricStatus.OK) is clique
    if level is FabricLevel.UNHEALTHY and facts.status is FabricStatus.UNHEALTHY:
        assert "on GPU 2: " in (facts.reason or "")  # ... and says which GPU and why


def test_the_reason_names_the_level_and_conditions() -> None:
    inv = with_gpu(nvl72_tray("t"), 1, health={"route_unhealthy": True, "degraded_bandwidth": True})
    verdict = gpu_fabric_verdict(inv.fabric[1])
    assert verdict.reason == "fabric unhealthy: degraded_bandwidth, route_unhealthy"
    assert gpu_fabric_verdict(inv.fabric[0]).reason == "fabric healthy"


def test_the_policy_is_configurable() -> None:
    inv = with_gpu(nvl72_tray("t"), 0, health={"degraded_bandwidth": True})
    strict = FabricPolicy(
        unhealthy=frozenset({FabricCondition.DEGRADED_BANDWIDTH, FabricCondition.NOT_COMPLETED}),
        degraded=frozenset(),
    )
    assert node_fabric_level(inv, strict) is FabricLevel.UNHEALTHY
    assert LABEL_CLIQUE not in node_labels(inv, node_name="t", fabric_policy=strict)
    lenient = FabricPolicy(unhealthy=frozenset(), degraded=frozenset())
    routed = with_gpu(nvl72_tray("t"), 0, health={"route_unhealthy": True})
    assert node_fabric_level(routed, lenient) is FabricLevel.HEALTHY
    assert node_labels(routed, node_name="t", fabric_policy=lenient)[LABEL_CLIQUE]


def test_a_condition_cannot_be_both_unhealthy_and_degraded() -> None:
    both = frozenset({FabricCondition.ROUTE_RECOVERY})
    with pytest.raises(ValueError, match="route_recovery cannot be both"):
        FabricPolicy(unhealthy=both, degraded=both)


def test_bad_condition_names_are_refused_naming_the_field() -> None:
    assert parse_conditions(["route_unhealthy"], "f") == {FabricCondition.ROUTE_UNHEALTHY}
    with pytest.raises(
        ValueError, match=r"fabric.x: 'nope' is not a fabric condition; valid: degraded_bandwidth"
    ):
        parse_conditions(["nope"], "fabric.x")
    with pytest.raises(ValueError, match="expected a list"):
        parse_conditions("route_unhealthy", "fabric.x")


def test_no_fabric_info_no_label_and_not_supported_has_no_conditions() -> None:
    assert LABEL_FABRIC_HEALTH not in node_labels(hgx_node("h"), node_name="h")
    assert node_fabric_level(hgx_node("h")) is None
    tray = nvl72_tray("t", state=FabricState.NOT_SUPPORTED)
    assert fabric_conditions(tray.fabric[0]) == ()
    assert fabric_verdicts(tray) == ()
