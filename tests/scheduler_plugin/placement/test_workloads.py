"""Job streams are deterministic per seed, hit the target load, and reject bad data with file:line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler_plugin.placement import shapes as clusters
from scheduler_plugin.placement import workloads
from scheduler_plugin.placement.workloads import PhillyData, PhillyJob, WorkloadError


def offered_load(jobs: list[workloads.Job], capacity: int) -> float:
    return sum(j.gpus * j.runtime_s for j in jobs) / (capacity * jobs[-1].arrival_s)


def test_nvl72_mix_is_deterministic_per_seed_and_scaled_to_the_load() -> None:
    a = workloads.nvl72_jobs(count=300, seed=5, load=0.9, capacity=4608, nvlink_domain_gpus=72)
    b = workloads.nvl72_jobs(count=300, seed=5, load=0.9, capacity=4608, nvlink_domain_gpus=72)
    c = workloads.nvl72_jobs(count=300, seed=6, load=0.9, capacity=4608, nvlink_domain_gpus=72)
    assert a == b
    assert a != c
    assert offered_load(a, 4608) == pytest.approx(0.9, rel=1e-3)
    sizes = {j.gpus for j in a}
    assert min(sizes) == 8
    assert sizes <= {8, 16, 32, 64} | {k * n * 4 for k in (1, 2, 4, 8, 16, 32) for n in (16, 18)}


@pytest.mark.parametrize(
    ("gpus", "pods", "per_pod", "subgroup", "tier"),
    [
        pytest.param(32, 8, 4, 4, "nvlink", id="32-gpus-4-node-segments"),
        pytest.param(16, 4, 4, None, None, id="16-gpus-single-nodes"),
        pytest.param(576, 144, 4, 18, "nvlink", id="8x72-subgroups-of-18"),
    ],
)
def test_nvl72_mix_shapes(gpus: int, pods: int, per_pod: int, subgroup: int | None, tier: str | None) -> None:
    jobs = workloads.nvl72_jobs(count=3000, seed=1, load=1, capacity=4608, nvlink_domain_gpus=72)
    role = next(j.gang.roles[0] for j in jobs if j.gpus == gpus and j.gang.roles[0].subgroup_size == subgroup)
    assert (role.pods, role.gpus_per_pod, role.subgroup_size, role.subgroup_tier) == (
        pods,
        per_pod,
        subgroup,
        tier,
    )


def test_large_gangs_get_a_leaf_or_spine_tier_only_where_the_cluster_has_one_that_large() -> None:
    cl = clusters.nvl72(64)
    jobs = workloads.nvl72_jobs(
        count=2000,
        seed=1,
        load=1,
        capacity=cl.total_gpus,
        nvlink_domain_gpus=72,
        tier_gpus=cl.largest_domain_gpus(),
    )
    tiers = {(j.gpus, j.gang.tier) for j in jobs if j.gang.roles[0].subgroup_size in (16, 18)}
    assert (288, "leaf") in tiers
    assert (1152, "spine") in tiers
    assert all(t is None for g, t in tiers if g > 1152)


def test_subgroups_wider_than_the_nvlink_domain_use_the_leaf_tier() -> None:
    g = workloads.make_gang("x", pods=16, gpus_per_pod=4, subgroup_nodes=4, nvlink_domain_gpus=8)
    assert g.roles[0].subgroup_tier == "leaf"


def test_philly_jobs_split_into_pods_of_at_most_four_gpus() -> None:
    data = PhillyData(
        jobs=(PhillyJob(0, 1), PhillyJob(10, 2), PhillyJob(20, 8), PhillyJob(30, 6), PhillyJob(40, 64)),
        runtimes=(100.0, 1000.0),
    )
    jobs = workloads.philly_jobs(data, count=5, seed=1, load=0.5, capacity=4608, nvlink_domain_gpus=72)
    shapes = [
        (j.gang.roles[0].pods, j.gang.roles[0].gpus_per_pod, j.gang.roles[0].subgroup_size) for j in jobs
    ]
    assert shapes == [(1, 1, None), (1, 2, None), (2, 4, 2), (3, 2, 3), (16, 4, 16)]
    assert all(j.runtime_s in (100.0, 1000.0) for j in jobs)
    assert offered_load(jobs, 4608) == pytest.approx(0.5, rel=1e-3)


def test_the_real_philly_files_load_and_the_mixed_stream_has_both_sources(philly_dir: Path) -> None:
    data = workloads.load_philly(philly_dir)
    assert len(data.jobs) == 15264
    jobs = workloads.build(
        "mixed", count=800, seed=1, load=0.9, capacity=4608, nvlink_domain_gpus=72, philly=data
    )
    assert {j.source for j in jobs} == {"philly", "nvl72"}
    assert jobs == sorted(jobs, key=lambda j: (j.arrival_s, j.name))


@pytest.mark.parametrize(
    ("tsv", "message"),
    [
        pytest.param(
            "vc\tarrival_s\tgpus\nx\tsoon\t1\n", "philly-jobs-seed0.tsv:2: bad arrival_s", id="bad-number"
        ),
        pytest.param(
            "vc\tarrival_s\tgpus\nx\t1\t0\n", "philly-jobs-seed0.tsv:2: gpus must be >= 1", id="zero-gpus"
        ),
        pytest.param("vc\twhen\tgpus\n", "philly-jobs-seed0.tsv:1: header", id="bad-header"),
    ],
)
def test_bad_philly_data_names_file_and_line(tmp_path: Path, tsv: str, message: str) -> None:
    (tmp_path / "philly-jobs-seed0.tsv").write_text(tsv)
    (tmp_path / "philly-runtimes.csv").write_text("runtime\n5\n")
    with pytest.raises(WorkloadError, match=message):
        workloads.load_philly(tmp_path)


def test_missing_data_dir_says_which_option_to_set(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="--data-dir"):
        workloads.load_philly(tmp_path)


@pytest.mark.parametrize(
    ("shape", "gpus", "tier1_gpus"),
    [pytest.param("nvl72", 4608, 72, id="nvl72"), pytest.param("dgx-h100", 4608, 8, id="dgx-h100")],
)
def test_cluster_shapes(shape: str, gpus: int, tier1_gpus: int) -> None:
    cl = clusters.build(shape, 64)
    assert cl.total_gpus == gpus
    assert cl.tier1_domain_gpus() == tier1_gpus
    assert len(cl.domains("leaf")) == 16 if shape == "nvl72" else 18


def test_mixed_cluster_has_both_kinds_of_nvlink_domain() -> None:
    cl = clusters.build("mixed", 64)
    sizes = {sum(cl.nodes[i].gpus for i in idx) for idx in cl.domains("nvlink").values()}
    assert sizes == {8, 72}


def test_fits_empty_keeps_only_gangs_the_cluster_can_ever_hold() -> None:
    mixed = clusters.build("mixed", 8)  # 4 NVL72 racks and one DGX H100 unit
    four = workloads.make_gang("a", pods=64, gpus_per_pod=4, subgroup_nodes=16, nvlink_domain_gpus=72)
    eight = workloads.make_gang("b", pods=128, gpus_per_pod=4, subgroup_nodes=16, nvlink_domain_gpus=72)
    assert mixed.fits_empty(four)
    assert not mixed.fits_empty(eight)
    stream = workloads.nvl72_jobs(
        count=300, seed=1, load=1, capacity=mixed.total_gpus, nvlink_domain_gpus=72, fits=mixed.fits_empty
    )
    assert all(mixed.fits_empty(j.gang) for j in stream)


def test_streams_and_small_instances_are_the_same_in_every_process() -> None:
    code = (
        "import hashlib;"
        "from scheduler_plugin.placement import optimum, workloads;"
        "jobs = workloads.nvl72_jobs(count=200, seed=4, load=1, capacity=4608, nvlink_domain_gpus=72);"
        "print(hashlib.sha256(repr((jobs, optimum.small_instance(4))).encode()).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        for hash_seed in ("1", "2")
    }
    assert len(digests) == 1
