"""The simulator's queues of their own: ``core`` drives ``scheduler_plugin.queue.decide`` (the extender's
queue), ``greedy`` holds nothing back, and preemption (``core``, ``kai``) evicts whole gangs only."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler_plugin import queue as gang_queue
from scheduler_plugin.placement import metrics, workloads
from scheduler_plugin.placement import shapes as clusters
from scheduler_plugin.placement.policies import OWN_QUEUE, POLICIES
from scheduler_plugin.placement.sim import SimResult, simulate
from scheduler_plugin.placement.workloads import Job

from .test_sim import fake_clock, job


def run_q(
    jobs: list[Job],
    policy: str,
    queue: str,
    preempt: str = "none",
    *,
    racks: int = 2,
    config: gang_queue.QueueConfig | None = None,
) -> SimResult:
    cl = clusters.nvl72(racks, racks_per_leaf=2)
    return simulate(
        cl,
        jobs,
        POLICIES[policy](),
        clock=fake_clock(),  # type: ignore[arg-type]
        warmup=0.0,
        queue=queue,
        preempt=preempt,
        queue_config=config,
    )


def starts(result: SimResult) -> dict[str, float | None]:
    return {r.name: r.start_s for r in result.records}


def blocked_stream() -> list[Job]:
    """Rack 0 busy until 100 with 16 trays, rack 1 until 300; the head needs a whole rack at 100.5."""
    return [
        job("a", 0.0, 100, 16, subgroup=16),
        job("b", 0.0, 300, 18, subgroup=18),
        job("head", 100.5 - 100, 50, 18, subgroup=18),
        job("short", 1.0, 60, 1),
        job("long", 2.0, 5000, 1),
    ]


def test_core_queue_reserves_for_the_head_and_backfills_by_time_limit() -> None:
    got = starts(run_q(blocked_stream(), "ours", "core"))
    assert got["head"] == 100  # rack 0 is reserved for it from t=0.5
    assert got["short"] == 1.0  # ends at 61, before the head's start: uses rack 0's idle trays
    assert got["long"] == 150  # outlives the reservation: waits for the head to end on rack 0


def test_greedy_queue_holds_nothing_back() -> None:
    got = starts(run_q(blocked_stream(), "kueue", "greedy"))
    assert got["long"] == 2.0  # takes a tray of rack 0 at once ...
    assert got["head"] == 300  # ... so the head waits for rack 1


def test_core_queue_is_the_same_code_as_the_extenders() -> None:
    """The simulator's decisions are ``decide``'s: replacing it changes them."""
    base = starts(run_q(blocked_stream(), "ours", "core"))
    original = gang_queue.decide
    calls: list[float] = []

    def spy(now: float, *args: object, **kwargs: object) -> gang_queue.Decision:
        calls.append(now)
        return original(now, *args, **kwargs)  # type: ignore[arg-type]

    gang_queue.decide = spy  # type: ignore[assignment]
    try:
        again = starts(run_q(blocked_stream(), "ours", "core"))
    finally:
        gang_queue.decide = original
    assert again == base
    assert calls
    assert calls == sorted(calls)


def priority_stream() -> list[Job]:
    """Two low-priority gangs fill both racks; a high-priority rack-sized gang arrives at 10."""
    low_a = job("low-a", 0.0, 10_000, 18, subgroup=18)
    low_b = replace(job("low-b", 5.0, 10_000, 9, subgroup=9), priority=0)
    low_c = job("low-c", 5.0, 10_000, 9, subgroup=9)
    high = replace(job("high", 10.0, 100, 18, subgroup=18), priority=workloads.HIGH_PRIORITY)
    return [low_a, low_b, low_c, high]


@pytest.mark.parametrize(("policy", "queue", "preempt"), [("ours", "core", "core"), ("kai", "greedy", "kai")])
def test_preemption_evicts_whole_gangs_and_never_half(policy: str, queue: str, preempt: str) -> None:
    config = gang_queue.QueueConfig(preempt_after_s=60.0)
    result = run_q(priority_stream(), policy, queue, preempt, config=config)
    recs = {r.name: r for r in result.records}
    assert recs["high"].start_s is not None
    assert recs["high"].start_s < 10_000
    assert all(not r.half_preempted for r in result.records)
    evicted = [r for r in result.records if r.preemptions]
    assert evicted
    assert result.released_all
    assert result.max_allocated <= result.total_gpus
    figs = metrics.figures(result)
    assert figs["half_preempted_gangs"] == 0
    assert figs["preempted_gpu_hours"] > 0
    if policy == "ours":
        # after its wait (60 s), the cheapest whole choice inside one rack: low-b and low-c together
        # ran 2 x 9 x 4 GPUs x 65 s; low-a ran 72 GPUs x 70 s
        assert recs["high"].start_s == 70.0
        assert sorted(r.name for r in evicted) == ["low-b", "low-c"]
        assert figs["preempted_gpu_hours"] == pytest.approx(2 * 36 * 65 / 3600)


def test_no_preemption_without_it() -> None:
    result = run_q(priority_stream(), "ours", "core")
    recs = {r.name: r for r in result.records}
    assert recs["high"].start_s == 10_000
    assert all(r.preemptions == 0 for r in result.records)


def test_half_preempted_counts_a_gang_that_lost_only_some_pods() -> None:
    """The figure is measured, not assumed: a record marked half-preempted is counted."""
    result = run_q(priority_stream(), "ours", "core")
    marked = replace(result, records=(replace(result.records[0], half_preempted=True), *result.records[1:]))
    assert metrics.figures(marked)["half_preempted_gangs"] == 1


@pytest.mark.parametrize("policy", sorted(OWN_QUEUE))
def test_every_policy_runs_its_own_queue_on_a_priority_stream_and_conserves_gpus(policy: str) -> None:
    cl = clusters.nvl72(4, racks_per_leaf=2)
    jobs = workloads.build(
        "nvl72",
        count=60,
        seed=3,
        load=0.9,
        capacity=cl.total_gpus,
        nvlink_domain_gpus=cl.tier1_domain_gpus(),
        tier_gpus=cl.largest_domain_gpus(),
        fits=cl.fits_empty,
        high_priority=0.3,
    )
    queue, preempt = OWN_QUEUE[policy]
    result = simulate(cl, jobs, POLICIES[policy](), clock=fake_clock(), queue=queue, preempt=preempt)  # type: ignore[arg-type]
    assert result.released_all
    assert result.max_allocated <= result.total_gpus
    # partly placed gangs can hold each other up for good under kube-scheduler: that is shown, not hidden
    assert not result.deadlocked or not POLICIES[policy]().gang
    figs = metrics.figures(result)
    assert figs["half_preempted_gangs"] == 0
    assert figs["hp_jobs"] == sum(1 for j in jobs if j.priority)


def test_bad_queue_options_are_refused() -> None:
    with pytest.raises(ValueError, match="queue must be one of"):
        run_q(blocked_stream(), "ours", "fifo")
    with pytest.raises(ValueError, match="preempt must be one of"):
        run_q(blocked_stream(), "ours", "core", "always")
    with pytest.raises(ValueError, match="needs queue='core'"):
        run_q(blocked_stream(), "ours", "greedy", "core")
    with pytest.raises(ValueError, match="places pods"):
        run_q(blocked_stream(), "kube-default", "core")


def test_high_priority_share_is_validated_and_keeps_the_stream() -> None:
    cl = clusters.nvl72(4)
    kw = {
        "count": 50,
        "seed": 2,
        "load": 0.9,
        "capacity": cl.total_gpus,
        "nvlink_domain_gpus": cl.tier1_domain_gpus(),
    }
    plain = workloads.build("nvl72", **kw)  # type: ignore[arg-type]
    marked = workloads.build("nvl72", high_priority=0.2, **kw)  # type: ignore[arg-type]
    assert [replace(j, priority=0) for j in marked] == plain
    assert 0 < sum(1 for j in marked if j.priority == workloads.HIGH_PRIORITY) < len(marked)
    with pytest.raises(workloads.WorkloadError, match="--high-priority"):
        workloads.build("nvl72", high_priority=1.5, **kw)  # type: ignore[arg-type]


def thrash_stream() -> list[Job]:
    """Low ``big`` fills rack 0 for 10,000 s, low ``other`` rack 1 for 100,000 s; a high-priority
    one-tray gang of 300 s arrives every 1,000 s."""
    hp = [
        replace(job(f"hp{k}", 500.0 + 1000.0 * k, 300, 1), priority=workloads.HIGH_PRIORITY) for k in range(5)
    ]
    return [job("big", 0.0, 10_000, 18, subgroup=18), job("other", 0.0, 100_000, 18, subgroup=18), *hp]


@pytest.mark.parametrize(
    ("guards", "most"),
    [
        pytest.param({}, 1, id="defaults"),
        pytest.param({"preempt_loss_ratio": None}, 1, id="cap-counted-by-the-simulator"),
    ],
)
def test_the_core_queue_does_not_evict_a_restarted_gang_again_and_again(
    guards: dict[str, object], most: int
) -> None:
    unguarded = gang_queue.QueueConfig(preempt_after_s=60.0, preempt_loss_ratio=None, max_evictions=None)
    before = {r.name: r for r in run_q(thrash_stream(), "ours", "core", "core", config=unguarded).records}
    assert before["big"].preemptions >= 3  # the thrashing
    config = gang_queue.QueueConfig(preempt_after_s=60.0, **guards)  # type: ignore[arg-type]
    result = run_q(thrash_stream(), "ours", "core", "core", config=config)
    recs = {r.name: r for r in result.records}
    assert recs["big"].preemptions <= most
    assert recs["big"].end_s is not None
    assert all(r.start_s is not None for r in result.records if r.priority)
    assert result.released_all
