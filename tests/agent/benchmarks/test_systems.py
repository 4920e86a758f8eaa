"""``bench cluster --systems``: the stream, the figures from a synthetic record, the manifests each system
gets, the options; and one small run on hollow nodes (e2e, slow)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from agent import localcluster
from agent.benchmarks import cluster as bench
from agent.benchmarks import systems as s

# ------------------------------------------------------------------------------------------ the stream


def test_stream_is_deterministic_per_seed_and_differs_between_seeds() -> None:
    a = s.make_stream(seed=7, jobs=40, racks=4, trays=18, load=0.9)
    assert a == s.make_stream(seed=7, jobs=40, racks=4, trays=18, load=0.9)
    assert a != s.make_stream(seed=8, jobs=40, racks=4, trays=18, load=0.9)
    assert [j.name for j in a] == [f"j{i:03d}-{j.kind}" for i, j in enumerate(a)]


def test_stream_shapes_fit_the_cluster_and_keep_subgroups_whole() -> None:
    for racks, trays in ((4, 18), (1, 4), (1, 1), (2, 3)):
        jobs = s.make_stream(seed=3, jobs=200, racks=racks, trays=trays, load=0.9)
        assert {j.kind for j in jobs} == set(s.KINDS)
        for j in jobs:
            assert 1 <= j.pods <= racks * trays
            assert s.RUNTIME_CLAMP_S[0] <= j.runtime_s <= s.RUNTIME_CLAMP_S[1]
            if j.kind == "small":
                assert (j.pods, j.subgroup_size, j.subgroups) == (1, 0, 0)
                assert j.gpus_per_pod in (1, 2, 4)
            else:
                assert j.gpus_per_pod == 4
                assert 1 <= j.subgroup_size <= trays  # one subgroup fits one NVLink domain (a rack)
                assert j.pods % j.subgroup_size == 0
                assert j.subgroups in (1, 2)
        arrivals = [j.arrival_s for j in jobs]
        assert arrivals[0] == 0.0
        assert arrivals == sorted(arrivals)


def test_stream_arrivals_give_the_offered_load() -> None:
    jobs = s.make_stream(seed=5, jobs=60, racks=2, trays=18, load=0.5)
    work = sum(j.gpus * j.runtime_s for j in jobs)
    span = max(j.arrival_s for j in jobs)
    assert work / (2 * 18 * 4 * span) == pytest.approx(0.5, rel=0.02)
    double = s.make_stream(seed=5, jobs=60, racks=2, trays=18, load=1.0)
    assert max(j.arrival_s for j in double) == pytest.approx(span / 2, rel=0.02)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        pytest.param({"jobs": 0}, "jobs must be at least 1", id="no-jobs"),
        pytest.param({"racks": 0}, "racks must be", id="no-racks"),
        pytest.param({"load": 0.0}, "load must be", id="zero-load"),
        pytest.param({"load": 9.0}, "load must be", id="huge-load"),
        pytest.param({"runtime_median_s": -1.0}, "runtime median", id="negative-runtime"),
    ],
)
def test_stream_refuses_bad_arguments(kwargs: dict[str, float], words: str) -> None:
    args: dict[str, float] = {"seed": 1, "jobs": 5, "racks": 1, "trays": 4, "load": 1.0, **kwargs}
    with pytest.raises(ValueError, match=words):
        s.make_stream(**args)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ the figures


def _job(
    name: str, *, pods: int, sub: int, arrival: float = 0.0, runtime: float = 10.0, gpus: int = 4
) -> s.JobSpec:
    return s.JobSpec(name, "gang" if sub else "small", arrival, runtime, pods, gpus, sub)


def _record() -> s.Record:
    """Two NVLink domains of two 4-GPU nodes (A: a1 a2, B: b1 b2; 16 GPUs), a window of 10 s:

    - ``g``: 2 subgroups of 2 pods x 2 GPUs, submitted at 0, bound at 1, Running at 2, deleted at 6;
      subgroup 0 on a1 twice (inside A), subgroup 1 on a2 and b2 (across A and B);
    - ``h``: 2 pods x 4 GPUs in one subgroup, submitted at 2: one pod bound at 3 on b1 (held to the end of
      the window), the other never: a half-placed gang that never started;
    - ``s``: 1 pod x 4 GPUs, submitted at 4, bound at 7 on a1, Running at 7.5, deleted at 9.
    """
    jobs = [
        _job("g", pods=4, sub=2, gpus=2),
        _job("h", pods=2, sub=2, arrival=2),
        _job("s", pods=1, sub=0, arrival=4),
    ]
    pods = [
        s.PodRecord("g", 0, 2, "a1", 1.0, 2.0, 6.0),
        s.PodRecord("g", 0, 2, "a1", 1.0, 2.0, 6.0),
        s.PodRecord("g", 1, 2, "a2", 1.0, 2.0, 6.0),
        s.PodRecord("g", 1, 2, "b2", 1.0, 2.0, 6.0),
        s.PodRecord("h", 0, 4, "b1", 3.0, None, None),
        s.PodRecord("h", 0, 4, None, None, None, None),
        s.PodRecord("s", 0, 4, "a1", 7.0, 7.5, 9.0),
        s.PodRecord("t", 0, 4, "a2", 8.0, None, 8.0, "UnexpectedAdmissionError"),  # not a job of the stream
    ]
    return s.Record(
        system="x",
        jobs=jobs,
        submitted={"g": 0.0, "h": 2.0, "s": 4.0},
        started={"g": 2.0, "s": 7.5},
        ended={"g": 6.0, "s": 9.0},
        pods=pods,
        window_s=10.0,
        node_gpus={"a1": 4, "a2": 4, "b1": 4, "b2": 4},
        domain_of={"a1": "A", "a2": "A", "b1": "B", "b2": "B"},
    )


def test_allocation_timeline_steps_at_binds_and_deletions() -> None:
    assert s.allocation_timeline(_record()) == [
        (0.0, 0),
        (1.0, 8),
        (3.0, 12),
        (6.0, 4),
        (7.0, 8),
        (9.0, 4),
        (10.0, 0),
    ]


def test_figures_from_a_synthetic_record() -> None:
    f = s.figures(_record())
    assert f["jobs"] == 3
    assert (f["started"], f["unstarted"]) == (2, 1)
    assert f["subgroups_placed"] == 2  # g's two; h's only subgroup never had both pods bound
    assert f["nvlink_local_ratio"] == 0.5  # g/0 inside A, g/1 across A and B
    # GPU-seconds held: 8 x 2 (1..3) + 12 x 3 (3..6) + 4 x 1 (6..7) + 8 x 2 (7..9) + 4 x 1 (9..10) = 76
    assert f["allocation_ratio"] == pytest.approx(76 / 160, abs=1e-3)
    # waits to the last pod bound: g 1, h never (censored: 10 - 2 = 8), s 3; to Running: g 2, s 3.5
    assert f["wait_mean_s"] == pytest.approx(4.0)
    assert f["wait_p95_s"] == 8.0
    assert (f["to_running_mean_s"], f["to_running_p95_s"]) == (2.75, 3.5)
    assert f["half_placed_gangs"] == 1
    assert (f["failed_pods"], f["failed_reasons"]) == (1, ["UnexpectedAdmissionError"])
    # stranded (free GPUs of domains that cannot host the smallest waiting unit):
    # 0..1 g waits, unit (2, 2): both domains can -> 0; 1..2 nobody waits -> 0;
    # 2..3 h (2, 4): A 2 free (room 0) + B 6 free (room 1) -> 8; 3..4 h: A 2 + B 2 -> 4;
    # 4..6 s is the smaller unit (1, 4): A 2 (room 0) + B 2 (room 0) -> 4 x 2 s;
    # 6..7 g gone: A room 2, B room 1 >= 1 -> 0; 7..9 h alone, (2, 4): A 4 (room 1) + B 4 (room 1) -> 8 x 2 s;
    # 9..10 s gone: A room 2 -> 0, B 4 (room 1) -> 4. In all 40 GPU-s over 10 s.
    assert f["stranded_gpus_mean"] == pytest.approx(4.0)
    assert f["window_s"] == 10.0


def test_figures_with_nothing_placed_say_none_not_zero() -> None:
    rec = _record()
    rec.pods = []
    rec.started, rec.ended = {}, {}
    f = s.figures(rec)
    assert f["nvlink_local_ratio"] is None
    assert f["to_running_mean_s"] is None
    assert f["allocation_ratio"] == 0.0
    assert f["unstarted"] == 3
    assert f["half_placed_gangs"] == 0


# ------------------------------------------------------------------------------------------ manifests


def test_each_system_expresses_the_subgroups() -> None:
    job = _job("j1", pods=8, sub=4)
    pg = s.volcano_podgroup(job)
    assert pg["spec"]["minMember"] == 8
    (policy,) = pg["spec"]["subGroupPolicy"]
    assert policy["subGroupSize"] == 4
    assert policy["matchLabelKeys"] == [s.SUBGROUP_LABEL]
    assert policy["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
    assert "subGroupPolicy" not in s.volcano_podgroup(_job("x", pods=1, sub=0))["spec"]
    objs = s.native_objects(job)
    assert [p for p, _ in objs] == ["workloads", "podgroups", "podgroups"]
    for _, pg_ in objs[1:]:
        assert pg_["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}
        assert pg_["spec"]["schedulingConstraints"] == {"topology": [{"key": s.NVLINK_LABEL}]}
    sliced = s.kueue_job(job, level="gpuagent.dev/nvlink-domain")
    ann = sliced["spec"]["template"]["metadata"]["annotations"]
    assert ann == {
        f"{s.KUEUE}/podset-slice-required-topology": "gpuagent.dev/nvlink-domain",
        f"{s.KUEUE}/podset-slice-size": "4",
    }
    assert sliced["spec"]["completionMode"] == "Indexed"
    assert sliced["spec"]["suspend"] is True
    whole = s.kueue_job(_job("j2", pods=4, sub=4), level="L")["spec"]["template"]["metadata"]["annotations"]
    assert whole == {f"{s.KUEUE}/podset-required-topology": "L"}
    assert s.job_labels(job, 5) == {s.JOB_LABEL: "j1", s.SUBGROUP_LABEL: "1"}


def test_kueue_pods_get_their_subgroup_from_the_completion_index() -> None:
    k = s.Kueue.__new__(s.Kueue)
    k.jobs = [_job("j1", pods=8, sub=4)]
    pod = {"metadata": {"labels": {s.JOB_LABEL: "j1", s.INDEX_LABEL: "6"}}}
    assert k.identify(pod) == ("j1", 1)
    assert k.identify({"metadata": {}}) == ("", 0)


def test_render_names_skipped_systems_with_their_reason() -> None:
    doc = {
        "machine": "machine: test",
        "cluster": {"nodes": 4, "racks": 1, "trays": 4, "gpus": 16, "nvlink_domains": 1, "resident_mib": 1},
        "stream": {"jobs": 3, "seed": 1, "load": 0.9, "kinds": "1 gang", "runtime_s": [5, 9]},
        "systems": {"ours": s.figures(_record()), "kueue": {"skipped": "kueue-manager: no executable"}},
    }
    text = "\n".join(s.render(doc))
    assert "kueue     skipped: kueue-manager: no executable" in text
    assert "0.500" in text  # ours' NVL-local
    assert "4 hollow GB200 trays" in text


def test_plot_writes_a_png(tmp_path: Path) -> None:
    from scheduler_plugin.placement.systems_plot import plot_systems

    rec = _record()
    doc = {
        "machine": "machine: test",
        "cluster": {"nodes": 4, "gpus": 16},
        "systems": {"ours": s.figures(rec), "kueue": {"skipped": "not built"}},
        "timelines": {"ours": [list(p) for p in s.allocation_timeline(rec)]},
    }
    out = tmp_path / "p.png"
    plot_systems(doc, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------ options


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--systems", "ours,slurm"], id="unknown-system"),
        pytest.param(["--systems", ""], id="empty-systems"),
        pytest.param(["--systems", "ours,ours"], id="twice"),
        pytest.param(["--systems", "ours", "--racks", "0"], id="no-racks"),
        pytest.param(["--systems", "ours", "--jobs", "many"], id="jobs-not-a-number"),
        pytest.param(["--systems", "ours", "--load", "-1"], id="negative-load"),
        pytest.param(["--systems", "ours", "--window", "nan"], id="nan-window"),
    ],
)
def test_bad_options_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    assert "--systems" in capsys.readouterr().err


def test_a_load_the_stream_refuses_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--systems=ours", "--load", "5"]) == 2
    assert "load must be in (0, 4]" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ e2e


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(1500)  # four systems in turn, each up to its 120 s window, on a shared 2-CPU machine
def test_small_comparison_on_hollow_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One rack of 4 trays, 5 jobs, every system (those not built are skipped with the build command).
    Run with ``.venv/bin/pytest -m slow tests/agent/benchmarks/test_systems.py``."""
    why = bench.unavailable_reason(localcluster.locate_counterparts(), volcano=False)
    if why is not None:
        pytest.skip(why)
    plot = tmp_path / "systems.png"
    argv = ["--systems", ",".join(s.SYSTEMS), "--racks", "1", "--trays", "4", "--jobs", "5"]
    argv += ["--runtime", "6", "--window", "120", "--json", "--plot", str(plot)]
    assert bench.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cluster"]["nodes"] == 4
    assert doc["cluster"]["gpus"] == 16
    assert doc["machine"].startswith("machine:")
    assert set(doc["systems"]) == set(s.SYSTEMS)
    ran = [n for n, row in doc["systems"].items() if "skipped" not in row]
    assert "ours" in ran
    for name, row in doc["systems"].items():
        if "skipped" in row:
            assert bench.BUILD_COMMAND in row["skipped"]
            continue
        assert "error" not in row, (name, row)
        assert row["jobs"] == 5
        assert row["started"] >= 1, (name, row)
        assert row["allocation_ratio"] > 0
    ours = doc["systems"]["ours"]
    assert ours["started"] == 5
    assert ours["nvlink_local_ratio"] in (None, 1.0)  # the extender keeps every subgroup in its domain
    assert ours["half_placed_gangs"] == 0
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_pod_log_keeps_first_bind_first_running_failure_and_deletion() -> None:
    log = s.PodLog.__new__(s.PodLog)
    log.__dict__.update(_lock=threading.Lock(), t0=0.0, pods={}, _identify=s._by_label)
    clock = iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    log.now = lambda: next(clock)  # type: ignore[method-assign]

    def pod(name: str, node: str | None, phase: str, reason: str | None = None) -> dict[str, object]:
        limits = {bench.GPU: "4"}
        return {
            "metadata": {"name": name, "labels": {s.JOB_LABEL: "j", s.SUBGROUP_LABEL: "1"}},
            "spec": {"nodeName": node, "containers": [{"resources": {"limits": limits}}, {}]},
            "status": {"phase": phase, **({"reason": reason} if reason else {})},
        }

    log._event("ADDED", pod("p", None, "Pending"))  # 1
    log._event("MODIFIED", pod("p", "n1", "Pending"))  # 2: bound
    log._event("MODIFIED", pod("p", "n1", "Running"))  # 3: Running
    log._event("MODIFIED", pod("p", "n1", "Running"))  # 4: nothing new
    log._event("DELETED", pod("p", "n1", "Running"))  # 5: gone
    log._event("MODIFIED", pod("q", "n2", "Failed", "UnexpectedAdmissionError"))  # 6
    log._event("MODIFIED", pod("r", "n2", "Running"))  # 7
    log._event("MODIFIED", pod("r", "n2", "Succeeded"))  # 8: stopped on deletion, not a failure
    assert log.records() == [
        s.PodRecord("j", 1, 4, "n1", 2.0, 3.0, 5.0, None),
        s.PodRecord("j", 1, 4, "n2", 6.0, None, 6.0, "UnexpectedAdmissionError"),
        s.PodRecord("j", 1, 4, "n2", 7.0, 7.0, 8.0, None),
    ]
    assert log.running("j") == 0
    assert log.live() == 0
