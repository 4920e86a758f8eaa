"""The extender's cache: projected informer stores, per-pod facts and indexes kept by events, and a queue
whose work follows what changed (a pass without a change returns at once; gangs are found by index, not
by reading every pod; skipped gangs remembered with their reason; per-pod maps pruned)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from scheduler_plugin.extender import ExtenderState, gpus_of, project
from scheduler_plugin.extender import cache as cache_module
from scheduler_plugin.extender.cache import pod_info
from tests.integration.fakekube import hypernode, node, pod

NODES = [f"r{r}-t{t}" for r in range(2) for t in range(4)]
T0 = 1_800_000_000.0


def gang_pod(name: str, rank: int, *, gang: str = "g", size: int = 4, gpus: int = 4) -> dict[str, Any]:
    return pod(
        name,
        gpus,
        annotations={
            "gpuagent.dev/gang": gang,
            "gpuagent.dev/gang-size": str(size),
            "gpuagent.dev/subgroup-size": "2",
            "gpuagent.dev/subgroup-tier": "nvlink",
            "gpuagent.dev/rank": str(rank),
        },
    )


def make_state(pods: list[dict[str, Any]]) -> ExtenderState:
    s = ExtenderState()
    s.cache.replace("nodes", [node(n, 4) for n in NODES])
    s.cache.replace(
        "hypernodes",
        [hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t{t}" for t in range(4)]) for r in range(2)],
    )
    s.cache.replace("pods", pods)
    return s


def busy() -> list[dict[str, Any]]:
    """Every node but one half used: a gang of 4 x 4 GPUs waits."""
    return [pod(f"run-{n}", 2, node_name=n) for n in NODES[1:]]


def test_the_pod_projection_keeps_what_decisions_read_and_drops_the_rest() -> None:
    full = pod("p", 2, annotations={"gpuagent.dev/gang": "g"}, node_name="r0-t0")
    full["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    full["spec"]["containers"][0]["env"] = [{"name": "X", "value": "y" * 1000}]
    full["spec"]["volumes"] = [{"name": "data"}]
    full["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    kept = project("pods", full)
    assert "managedFields" not in kept["metadata"]
    assert "env" not in kept["spec"]["containers"][0]
    assert "volumes" not in kept["spec"]
    assert "conditions" not in kept.get("status", {})
    assert kept["metadata"]["annotations"] == {"gpuagent.dev/gang": "g"}
    assert gpus_of(pod_info("default/p", kept)) == 2 == gpus_of(pod_info("default/p", full))


def test_a_node_heartbeat_is_no_change_and_starts_no_pass() -> None:
    s = make_state([*busy(), *(gang_pod(f"g-{i}", i) for i in range(4))])
    s.queue.tick(T0)
    passes = s.queue.metrics.passes
    beat = node("r0-t0", 4)
    beat["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastHeartbeatTime": "later"}]
    s.cache.apply("nodes", "MODIFIED", beat)
    s.queue.tick(T0 + 1)
    assert s.queue.metrics.passes == passes


def test_a_pass_without_a_change_returns_at_once_and_one_after_a_change_runs() -> None:
    s = make_state([*busy(), *(gang_pod(f"g-{i}", i) for i in range(4))])
    s.queue.run_pass(T0)
    passes = s.queue.metrics.passes
    s.queue.run_pass(T0 + 0.5)
    assert s.queue.metrics.passes == passes  # nothing changed, no wait ended
    s.cache.apply("pods", "DELETED", s.cache.pods["default/run-r0-t1"])
    s.queue.run_pass(T0 + 1)
    assert s.queue.metrics.passes == passes + 1


def test_a_pass_after_one_change_reads_only_the_gangs_it_touches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gangs' specs are kept until one of their pods changes: a pod of another gang or a pod on its
    own ending re-derives no waiting gang."""
    gangs = [gang_pod(f"{g}-{i}", i, gang=g) for g in ("a", "b", "c") for i in range(4)]
    s = make_state([*busy(), *gangs])
    s.queue.run_pass(T0)
    calls: list[str] = []
    real = cache_module.gang_for_pod

    def counting(p: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(p["metadata"]["name"])
        return real(p, *args, **kwargs)

    monkeypatch.setattr(cache_module, "gang_for_pod", counting)
    s.cache.apply("pods", "DELETED", s.cache.pods["default/run-r1-t3"])
    s.queue.run_pass(T0 + 1)
    assert calls == []
    changed = dict(s.cache.pods["default/b-0"])
    changed["metadata"] = {**changed["metadata"], "labels": {"team": "x"}}
    s.cache.apply("pods", "MODIFIED", changed)
    s.queue.run_pass(T0 + 2)
    assert calls == ["b-0"]


def test_a_gang_whose_selector_matches_nothing_is_remembered_and_its_filters_start_no_pass() -> None:
    pods = [gang_pod(f"g-{i}", i) for i in range(4)]
    for p in pods:
        p["spec"]["nodeSelector"] = {"pool": "nowhere"}
    s = make_state(pods)
    out = s.filter(s.cache.pods["default/g-0"], NODES, T0)
    assert "no node matches the gang's nodeSelector" in next(iter(out.failed.values()))
    passes = s.queue.metrics.passes
    for i in range(1, 4):
        out = s.filter(s.cache.pods[f"default/g-{i}"], NODES, T0 + i / 100)
        assert "no node matches the gang's nodeSelector" in next(iter(out.failed.values()))
    assert s.queue.metrics.passes == passes


def test_every_per_pod_map_lets_go_of_pods_that_are_gone() -> None:
    undated = [gang_pod(f"g-{i}", i) for i in range(4)]  # no creationTimestamp: first seen counts
    solo = pod("solo", 1)
    s = make_state([*busy(), *undated, solo])
    s.filter(s.cache.pods["default/g-0"], NODES, T0)
    s.filter(s.cache.pods["default/solo"], NODES, T0)
    s.queue.tick(T0 + 1)
    assert s.pod_maps()["first_seen"] > 0
    s.cache.replace("pods", [])
    assert s.pod_maps() == dict.fromkeys(s.pod_maps(), 0)


def test_a_relisting_equal_to_what_is_known_changes_nothing() -> None:
    pods = [*busy(), *(gang_pod(f"g-{i}", i) for i in range(4))]
    s = make_state(pods)
    s.queue.run_pass(T0)
    passes = s.queue.metrics.passes
    s.cache.replace("pods", pods)
    s.cache.replace("nodes", [node(n, 4) for n in NODES])
    s.queue.run_pass(T0 + 1)
    assert s.queue.metrics.passes == passes + 1  # a relisting asks for a pass, which decides the same
    assert s.cache.free_gpus("r0-t1") == 2


def test_filter_and_prioritize_kept_up_to_date_by_events_answer_as_a_fresh_state() -> None:
    """The verdicts and ranks follow events node by node: after every change they equal what a state
    listed afresh from the same objects answers."""
    rng = random.Random(28)
    running: dict[str, dict[str, Any]] = {}
    s = make_state([])
    probes = [pod(f"probe-{g}", g) for g in (1, 2, 4)]
    for p in probes:
        s.cache.apply("pods", "ADDED", p)
    for step in range(60):
        if running and rng.random() < 0.4:
            gone = running.pop(rng.choice(sorted(running)))
            s.cache.apply("pods", "DELETED", gone)
        else:
            p = pod(f"run-{step}", rng.choice((1, 2)), node_name=rng.choice(NODES))
            running[p["metadata"]["name"]] = p
            s.cache.apply("pods", "ADDED", p)
        fresh = make_state([*running.values(), *probes])
        for p in probes:
            got, want = s.filter(p, NODES, T0), fresh.filter(p, NODES, T0)
            assert (got.passed, got.failed) == (want.passed, want.failed), step
            assert s.prioritize(p, NODES, 1.0) == fresh.prioritize(p, NODES, 1.0), step


def test_a_decision_made_outside_the_lock_is_committed_against_what_changed_meanwhile() -> None:
    """The queue loop decides on the inputs it took under the lock; a start whose nodes were taken
    while it decided is left out and the next tick decides again on what the cluster is now."""
    s = make_state([gang_pod(f"g-{i}", i) for i in range(4)])
    job = s.queue.begin(T0)
    assert job is not None
    decision = job.decide()
    assert [st.gang for st in decision.starts] == ["default/g"]
    taken = sorted(set(decision.starts[0].plan.placement.values()))[0]
    s.cache.apply("pods", "ADDED", pod("late", 4, node_name=taken))  # bound by another scheduler meanwhile
    s.queue.commit(job, decision)
    assert "default/g" not in s.holds.started
    s.queue.tick(T0 + 1)
    assert taken not in s.holds.started["default/g"].nodes.values()


def test_a_decision_on_inputs_nothing_changed_is_committed_as_made() -> None:
    s = make_state([gang_pod(f"g-{i}", i) for i in range(4)])
    job = s.queue.begin(T0)
    assert job is not None
    decision = job.decide()
    s.queue.commit(job, decision)
    assert dict(s.holds.started["default/g"].nodes) == dict(decision.starts[0].plan.placement)
    assert s.queue.begin(T0 + 0.5) is None  # nothing changed since: no pass due


def test_while_a_queue_loop_runs_a_filter_answers_from_the_last_pass_and_the_loop_starts_the_gang() -> None:
    s = make_state([*busy(), pod("full", 2, node_name="r0-t0"), *(gang_pod(f"g-{i}", i) for i in range(4))])
    s.queue.loop = True
    assert not s.filter(s.cache.pods["default/g-0"], NODES, T0).passed  # a new gang: its own pass
    passes = s.queue.metrics.passes
    for p in [p for p in s.cache.pods.values() if str(p["spec"].get("nodeName")).startswith("r0-")]:
        s.cache.apply("pods", "DELETED", p)  # rack 0 frees
    assert not s.filter(s.cache.pods["default/g-1"], NODES, T0 + 4).passed  # no pass in a filter
    assert s.queue.metrics.passes == passes
    actions = s.queue.tick(T0 + 5)
    assert "default/g" in s.holds.started
    assert sorted(p["metadata"]["name"] for p, _ in actions.nudges) == ["g-0", "g-1"]
