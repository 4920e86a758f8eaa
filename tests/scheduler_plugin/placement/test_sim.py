"""The simulator conserves GPUs, is pure given its clock, and follows FIFO with EASY backfill."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_plugin.placement import metrics, workloads
from scheduler_plugin.placement import shapes as clusters
from scheduler_plugin.placement.policies import POLICIES
from scheduler_plugin.placement.sim import SimResult, simulate
from scheduler_plugin.placement.workloads import Job

from .builders import gang


def ticking() -> Iterator[float]:
    t = 0.0
    while True:
        t += 0.001
        yield t


def fake_clock() -> object:
    it = ticking()
    return lambda: next(it)


def job(name: str, arrival: float, runtime: float, pods: int, *, subgroup: int | None = None) -> Job:
    return Job(
        name=name,
        arrival_s=arrival,
        runtime_s=runtime,
        gang=gang(pods, subgroup=subgroup, name=name),
        source="t",
    )


def run(jobs: list[Job], policy: str = "volcano", racks: int = 1) -> SimResult:
    cl = clusters.nvl72(racks, racks_per_leaf=2)
    return simulate(cl, jobs, POLICIES[policy](), clock=fake_clock(), warmup=0.0)  # type: ignore[arg-type]


def starts(result: SimResult) -> dict[str, float | None]:
    return {r.name: r.start_s for r in result.records}


def test_easy_backfill_lets_a_short_job_pass_the_blocked_head_but_not_a_long_one() -> None:
    jobs = [
        job("a", 0, 100, 16),  # 64 of 72 GPUs until t=100
        job("b", 1, 10, 18),  # the head: needs the whole rack, shadow time 100
        job("c", 2, 50, 2),  # ends at 52 < 100: backfills
        job("d", 3, 500, 2),  # would delay the head: waits
    ]
    got = starts(run(jobs))
    assert got == {"a": 0, "b": 100, "c": 2, "d": 110}


def test_fifo_head_starts_before_later_jobs_that_would_delay_it() -> None:
    jobs = [job("a", 0, 100, 18), job("b", 1, 100, 18), job("c", 2, 1000, 1)]
    got = starts(run(jobs))
    assert got["b"] == 100
    assert got["c"] == 200  # 'c' ends after b's shadow time and no GPU is spare then


def test_kube_default_holds_partial_gangs_until_the_rest_fits() -> None:
    jobs = [job("a", 0, 100, 12), job("b", 1, 10, 12)]
    result = run(jobs, "kube-default")
    figs = metrics.figures(result)
    assert figs["partial_gangs"] == 1  # b held 6 nodes from t=1 until a ended
    assert starts(result) == {"a": 0, "b": 100}
    assert result.released_all
    gang_run = run(jobs, "kueue")
    assert metrics.figures(gang_run)["partial_gangs"] == 0


@pytest.mark.parametrize("policy", ["kube-default", "ours"])
def test_a_job_that_can_never_fit_stops_the_run_and_everything_is_released(policy: str) -> None:
    result = run([job("a", 0, 10, 4), job("big", 1, 10, 20)], policy)
    assert result.deadlocked
    assert result.released_all
    assert metrics.figures(result)["unstarted_jobs"] == 1
    assert metrics.figures(result)["partial_gangs"] == (1 if policy == "kube-default" else 0)


def test_kube_default_breaks_nvlink_subgroups_that_gang_policies_keep() -> None:
    jobs = [job("a", 0, 100, 10), job("b", 1, 100, 16, subgroup=16)]
    spread = metrics.figures(run(jobs, "kube-default", racks=2))
    kept = metrics.figures(run(jobs, "slurm", racks=2))
    assert kept["nvlink_local_ratio"] == 1.0
    assert spread["nvlink_local_ratio"] == 0.0


def test_time_weighted_allocation_and_free_domains() -> None:
    jobs = [job("a", 0, 50, 18), job("b", 100, 1, 1)]
    figs = metrics.figures(run(jobs, "kai", racks=2))
    # window [0, 100]: one of two racks busy for 50 s
    assert figs["allocation_ratio"] == pytest.approx(72 * 50 / (144 * 100))
    assert figs["free_domains_mean"] == pytest.approx((1 * 50 + 2 * 50) / 100)


def test_the_simulation_is_pure_apart_from_plan_times() -> None:
    cl = clusters.nvl72(4)
    stream = workloads.nvl72_jobs(count=60, seed=3, load=1.2, capacity=cl.total_gpus, nvlink_domain_gpus=72)
    a = simulate(cl, stream, POLICIES["kueue"](), clock=fake_clock())  # type: ignore[arg-type]
    b = simulate(cl, stream, POLICIES["kueue"](), clock=fake_clock())  # type: ignore[arg-type]
    assert a == b


@st.composite
def streams(draw: st.DrawFn) -> list[Job]:
    out = []
    t = 0.0
    for i in range(draw(st.integers(1, 25))):
        t += draw(st.floats(0, 50))
        pods = draw(st.integers(1, 36))
        sub = draw(st.sampled_from([None, 4, 9, 18]))
        out.append(
            job(f"j{i:02d}", t, draw(st.floats(1, 300)), pods, subgroup=sub if sub and sub <= pods else None)
        )
    return out


@settings(max_examples=25)
@given(jobs=streams(), policy=st.sampled_from(sorted(POLICIES)))
def test_gpus_are_conserved_for_every_policy(jobs: list[Job], policy: str) -> None:
    result = run(jobs, policy, racks=2)
    assert result.max_allocated <= result.total_gpus
    assert result.released_all
    figs = metrics.figures(result)
    # every started job finished; gang policies never hold part of a gang and keep subgroups local
    assert all(r.end_s is not None for r in result.records if r.start_s is not None)
    if POLICIES[policy]().gang:
        assert figs["partial_gangs"] == 0
        assert figs["nvlink_local_ratio"] in (None, 1.0)


@pytest.mark.parametrize("shape", ["dgx-h100", "mixed"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_other_cluster_shapes_run_and_conserve_gpus(shape: str, policy: str) -> None:
    cl = clusters.build(shape, 8)
    stream = workloads.nvl72_jobs(
        count=40,
        seed=2,
        load=1.0,
        capacity=cl.total_gpus,
        nvlink_domain_gpus=cl.tier1_domain_gpus(),
        tier_gpus=cl.largest_domain_gpus(),
        fits=cl.fits_empty,
    )
    result = simulate(cl, stream, POLICIES[policy](), clock=fake_clock())  # type: ignore[arg-type]
    assert result.released_all
    assert result.max_allocated <= result.total_gpus
    assert all(r.end_s is not None for r in result.records if r.start_s is not None)
    assert not result.deadlocked  # the stream keeps only jobs that fit the empty cluster


def topology_blocked_stream() -> list[Job]:
    """Two racks, each half freed at t=100; the whole-rack head fits only when rack 1 empties at
    t=300. By GPU count it could start at t=100, so count-based EASY holds everything back from then."""
    return [
        job("a1", 0.0, 100, 9, subgroup=9),
        job("a2", 0.0, 2000, 9, subgroup=9),
        job("b1", 0.0, 100, 9, subgroup=9),
        job("b2", 0.0, 300, 9, subgroup=9),
        job("head", 100.5, 10, 18, subgroup=18),
        job("long", 101, 500, 2),
        job("short", 102, 50, 2),
    ]


def run_with(jobs: list[Job], policy: str, backfill: str) -> SimResult:
    cl = clusters.nvl72(2, racks_per_leaf=2)
    return simulate(
        cl,
        jobs,
        POLICIES[policy](),  # type: ignore[arg-type]
        clock=fake_clock(),  # type: ignore[arg-type]
        warmup=0.0,
        backfill=backfill,
    )


@pytest.mark.parametrize("policy", ["ours", "kueue", "kai", "volcano", "slurm"])
def test_reserve_backfill_runs_a_long_job_outside_the_heads_planned_nodes(policy: str) -> None:
    placed = {r.name: r for r in run_with(topology_blocked_stream(), policy, "reserve").records}
    assert placed["head"].start_s == 300  # not delayed by the backfill
    assert placed["long"].start_s == 101  # on rack 0, outside the reservation on rack 1
    assert placed["short"].start_s == 102  # ends by t=300: may use any free GPU
    by_count = {r.name: r.start_s for r in run_with(topology_blocked_stream(), policy, "count").records}
    assert by_count["head"] == 300
    assert by_count["long"] == 300  # count-based EASY: shadow at t=100, no spare GPUs


def test_reserved_gpus_are_never_used_by_a_job_that_outlives_the_reservation() -> None:
    # the only free GPUs at t=101 are rack 1's, reserved for the head at t=300: a long job waits,
    # a job ending by t=300 runs there
    jobs = [
        job("a", 0.0, 2000, 18, subgroup=18),
        job("b1", 0.0, 100, 9, subgroup=9),
        job("b2", 0.0, 300, 9, subgroup=9),
        job("head", 100.5, 10, 18, subgroup=18),
        job("long", 101, 500, 2),
        job("short", 102, 150, 2),
    ]
    got = {r.name: r.start_s for r in run_with(jobs, "ours", "reserve").records}
    assert got["head"] == 300
    assert got["short"] == 102
    assert got["long"] == 310  # after the head (which ends at 310 and gives rack 1 back)


def test_reserve_keeps_the_count_rule_for_non_gang_policies_and_conserves_gpus() -> None:
    a = run_with(topology_blocked_stream(), "kube-default", "reserve")
    b = run_with(topology_blocked_stream(), "kube-default", "count")
    assert [(r.name, r.start_s) for r in a.records] == [(r.name, r.start_s) for r in b.records]
    for policy in ("ours", "kueue"):
        result = run_with(topology_blocked_stream(), policy, "reserve")
        assert result.released_all
        assert result.max_allocated <= result.total_gpus


def test_unknown_backfill_is_refused() -> None:
    with pytest.raises(ValueError, match="backfill must be one of count, reserve"):
        run_with(topology_blocked_stream(), "ours", "nodes")
