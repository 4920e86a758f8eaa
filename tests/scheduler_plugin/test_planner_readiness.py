"""``Gang.mnnvl`` (ready trays only, ready first, or readiness ignored) and roles pinned to a domain
(a repair's replacements): the planner's part of issue 29 items 3 and 5."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_plugin.planner import plan
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, NodeState, Plan, Role


def rack(
    r: int, trays: int = 4, *, unready: tuple[int, ...] = (), degraded: tuple[int, ...] = ()
) -> list[NodeState]:
    return [
        NodeState(
            name=f"r{r}-t{t}",
            gpus=4,
            free=4,
            domains={"nvlink": f"nvl-{r}"},
            ready=t not in unready,
            degraded=t in degraded,
        )
        for t in range(trays)
    ]


def snap(*racks: list[NodeState]) -> ClusterSnapshot:
    return ClusterSnapshot(tiers=("nvlink",), nodes=tuple(n for r in racks for n in r))


def gang(pods: int, size: int, mnnvl: str) -> Gang:
    return Gang(
        name="g",
        roles=(Role("w", pods=pods, gpus_per_pod=4, subgroup_size=size, subgroup_tier="nvlink"),),
        mnnvl=mnnvl,
    )


def nodes_of(result: object) -> set[str]:
    assert isinstance(result, Plan), result
    return set(result.placement.values())


def test_required_places_on_ready_trays_only() -> None:
    s = snap(rack(0, unready=(0,)))
    assert nodes_of(plan(s, gang(3, 3, "required"))) == {"r0-t1", "r0-t2", "r0-t3"}
    assert "r0-t0" in nodes_of(plan(s, gang(3, 3, "off")))  # ``off``: name order, readiness unread


def test_required_is_infeasible_when_the_ready_trays_do_not_hold_it() -> None:
    result = plan(snap(rack(0, unready=(0, 1))), gang(3, 3, "required"))
    assert isinstance(result, Infeasible)
    assert "2 node(s) whose NVLink fabric or IMEX is not ready left out" in result.reason


def test_preferred_takes_ready_trays_first_then_unready_ones() -> None:
    s = snap(rack(0, unready=(0,)), rack(1, unready=(3,)))
    assert nodes_of(plan(s, gang(3, 3, "preferred"))) == {"r0-t1", "r0-t2", "r0-t3"}
    # 4 per domain: no domain holds 4 ready trays, so the unready ones come in, as few as possible
    got = nodes_of(plan(s, gang(4, 4, "preferred")))
    assert len(got) == 4
    assert len({n[:2] for n in got}) == 1
    assert isinstance(plan(s, gang(4, 4, "required")), Infeasible)


def test_degraded_ready_trays_rank_after_clean_ones() -> None:
    s = snap(rack(0, unready=(3,), degraded=(0,)))
    assert nodes_of(plan(s, gang(2, 2, "required"))) == {"r0-t1", "r0-t2"}
    assert nodes_of(plan(s, gang(3, 3, "required"))) == {"r0-t0", "r0-t1", "r0-t2"}


def test_an_unknown_mode_is_infeasible_naming_it() -> None:
    result = plan(snap(rack(0)), gang(1, 1, "sometimes"))
    assert isinstance(result, Infeasible)
    assert "'sometimes'" in result.reason
    assert "required, preferred, off" in result.reason


def test_a_pinned_role_goes_inside_its_domain_or_nowhere() -> None:
    busy = [dataclasses.replace(n, free=0) if n.name != "r1-t3" else n for n in rack(1)]
    s = snap(rack(0), busy)
    pinned = Gang(
        name="g", roles=(Role("w#1", pods=1, gpus_per_pod=4, subgroup_tier="nvlink", domain="nvl-1"),)
    )
    assert nodes_of(plan(s, pinned)) == {"r1-t3"}
    two = dataclasses.replace(pinned, roles=(dataclasses.replace(pinned.roles[0], pods=2),))
    result = plan(s, two)
    assert isinstance(result, Infeasible)
    assert "inside nvlink domain nvl-1" in result.reason  # rack 0 is free, but not the subgroup's domain


@pytest.mark.parametrize("mnnvl", ["required", "off"])
def test_a_pinned_role_honours_readiness(mnnvl: str) -> None:
    s = snap(rack(0, unready=(0,)))
    pinned = Gang(
        name="g",
        roles=(Role("w#0", pods=1, gpus_per_pod=4, subgroup_tier="nvlink", domain="nvl-0"),),
        mnnvl=mnnvl,
    )
    assert nodes_of(plan(s, pinned)) == ({"r0-t1"} if mnnvl == "required" else {"r0-t0"})


def test_pinned_and_free_roles_plan_together_without_overlap() -> None:
    s = snap(rack(0, trays=2), rack(1, trays=2))
    g = Gang(
        name="g",
        roles=(
            Role("w#0", pods=2, gpus_per_pod=4, subgroup_tier="nvlink", domain="nvl-1"),
            Role("w", pods=2, gpus_per_pod=4, subgroup_size=2, subgroup_tier="nvlink"),
        ),
    )
    result = plan(s, g)
    assert isinstance(result, Plan)
    on = {str(k): v for k, v in result.placement.items()}
    assert {on["w#0-0"], on["w#0-1"]} == {"r1-t0", "r1-t1"}
    assert {on["w-0"], on["w-1"]} == {"r0-t0", "r0-t1"}
