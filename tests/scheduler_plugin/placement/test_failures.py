"""Trays that fail and return (``scheduler_plugin.placement.failures``): each system's behaviour at a
failure under a running gang, the accounting of what it loses, and determinism."""

from __future__ import annotations

import statistics

import pytest

from scheduler_plugin.placement import shapes, workloads
from scheduler_plugin.placement.failures import (
    BEHAVIOUR,
    FailureConfig,
    paired_mean,
    report,
    simulate_failures,
)
from scheduler_plugin.placement.policies import POLICIES
from scheduler_plugin.placement.workloads import Job
from scheduler_plugin.snapshot import Gang, Role

H = 3600.0


def rack_job(pods: int = 18) -> Job:
    """One whole NVL72 rack (or ``pods`` of its trays): pods of 4 GPUs in one subgroup of tier nvlink,
    10 hours."""
    role = Role("worker", pods=pods, gpus_per_pod=4, subgroup_size=pods, subgroup_tier="nvlink")
    return Job(name="train", arrival_s=0.0, runtime_s=10 * H, gang=Gang("train", (role,)), source="nvl72")


def run(name: str, cfg: FailureConfig | None = None, pods: int = 18) -> tuple[dict[str, float], bool]:
    """Two racks; the job fills one (or ``pods`` trays of it); its first tray fails at 1.25 h and is
    repaired at 3 h."""
    cluster = shapes.nvl72(2)
    probe = POLICIES[name]().place(shapes.nvl72(2).snapshot(), rack_job(pods).gang)
    first = min(getattr(probe, "placement", {}).values())
    tray = next(i for i, n in enumerate(cluster.nodes) if n.name == first)
    result = simulate_failures(
        cluster,
        [rack_job(pods)],
        POLICIES[name](),
        cfg or FailureConfig(),
        schedule={tray: (1.25 * H, 3 * H)},
    )
    (record,) = result.records
    return result.summary(), record.split


def test_ours_replaces_the_lost_tray_inside_the_rack_at_once() -> None:
    summary, split = run("ours", pods=17)  # the rack keeps one tray free
    assert not split
    assert summary["hits"] == 1
    assert summary["waiting_gpu_h"] == 0
    assert summary["makespan_h"] == pytest.approx(1.25 + 9)


def test_ours_waiting_for_ever_waits_inside_the_rack_and_holds_the_rest() -> None:
    summary, split = run("ours", FailureConfig(ours_after_wait="wait"))
    assert not split
    assert summary["hits"] == 1
    assert summary["lost_gpu_h"] == pytest.approx(72 * 0.25)  # since the 1 h checkpoint
    assert summary["waiting_gpu_h"] == pytest.approx(72 * 1.75)  # until the tray is back at 3 h
    assert summary["held_idle_gpu_h"] == pytest.approx(68 * 1.75)
    assert summary["makespan_h"] == pytest.approx(3 + 9)  # 1 h kept, 9 h left


@pytest.mark.parametrize(("wait_h", "restart_h"), [(0.0, 1.25), (0.5, 1.75), (None, 1.75)])
def test_ours_with_a_bounded_wait_places_the_gang_afresh_after_it(
    wait_h: float | None, restart_h: float
) -> None:
    cfg = FailureConfig() if wait_h is None else FailureConfig(ours_wait_h=wait_h)  # None: the default, 0.5 h
    summary, split = run("ours", cfg)
    assert not split
    assert summary["waiting_gpu_h"] == pytest.approx(72 * (restart_h - 1.25))
    assert summary["held_idle_gpu_h"] == pytest.approx(68 * (restart_h - 1.25))
    assert summary["makespan_h"] == pytest.approx(restart_h + 9)


def test_ours_with_repair_any_moves_the_lost_pod_to_another_rack_after_the_wait() -> None:
    summary, split = run("ours", FailureConfig(ours_wait_h=0.5, ours_after_wait="any"))
    assert split  # what gpuagent.dev/repair: any allows
    assert summary["waiting_gpu_h"] == pytest.approx(72 * 0.5)
    assert summary["makespan_h"] == pytest.approx(1.75 + 9)  # resumed from the 1 h checkpoint


def test_kueue_replaces_the_node_across_racks() -> None:
    summary, split = run("kueue")
    assert split  # its subgroup now spans two NVLink domains
    assert summary["grouped_in_domain"] == 0
    assert summary["waiting_gpu_h"] == 0
    assert summary["lost_gpu_h"] == pytest.approx(72 * 0.25)


@pytest.mark.parametrize("name", ["volcano", "kai", "slurm"])
def test_restarting_systems_place_the_whole_gang_afresh(name: str) -> None:
    summary, split = run(name)
    assert not split  # placed afresh in the other rack, whole
    assert summary["waiting_gpu_h"] == 0
    assert summary["held_idle_gpu_h"] == 0
    assert summary["lost_gpu_h"] == pytest.approx(72 * 0.25)
    assert summary["makespan_h"] == pytest.approx(1.25 + 9)


def test_the_outage_schedule_is_the_same_for_every_system_and_seeded() -> None:
    cluster = shapes.nvl72(4)
    jobs = workloads.build(
        "nvl72",
        count=40,
        seed=3,
        load=0.9,
        capacity=cluster.total_gpus,
        nvlink_domain_gpus=cluster.tier1_domain_gpus(),
        tier_gpus=cluster.largest_domain_gpus(),
        fits=cluster.fits_empty,
    )
    cfg = FailureConfig(mtbf_h=300.0, repair_h=5.0, seed=3)
    runs = {n: simulate_failures(cluster, jobs, POLICIES[n](), cfg) for n in BEHAVIOUR}
    again = simulate_failures(cluster, jobs, POLICIES["ours"](), cfg)
    assert again.summary() == runs["ours"].summary()
    assert all(r.summary()["finished"] == 40 for r in runs.values())
    # a tray's failures depend on the seed and the tray only: equal up to where each run stopped
    assert runs["ours"].summary()["outages"] > 0
    text = report(
        {n: [r.summary()] for n, r in runs.items()}, seeds=[3], racks=4, jobs=40, cfg=cfg, machine="m"
    )
    assert "aim: ours never runs a subgroup across NVLink domains: holds" in text


@pytest.mark.parametrize("field", ["mtbf_h", "repair_h", "checkpoint_s", "ours_wait_h"])
@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf")])
def test_bad_failure_parameters_name_the_field(field: str, value: float) -> None:
    if field == "ours_wait_h" and value == 0:
        assert FailureConfig(ours_wait_h=0).ours_wait_h == 0  # no wait at all is a setting
        return
    with pytest.raises(ValueError, match=field):
        FailureConfig(**{field: value})  # type: ignore[arg-type]


def test_a_policy_without_a_failure_behaviour_is_refused() -> None:
    with pytest.raises(ValueError, match="kube-default"):
        simulate_failures(shapes.nvl72(1), [rack_job()], POLICIES["kube-default"](), FailureConfig())


def test_an_unknown_after_wait_names_the_field() -> None:
    with pytest.raises(ValueError, match="ours_after_wait"):
        FailureConfig(ours_after_wait="later")


def test_paired_differences_carry_their_standard_error() -> None:
    assert paired_mean([4.0]) == (4.0, None)
    mean, error = paired_mean([1.0, 3.0, 5.0, 7.0])
    assert mean == 4.0
    assert error == pytest.approx(statistics.stdev([1.0, 3.0, 5.0, 7.0]) / 2)
