"""Hostile tenants of a shared cluster against the extender's queue: nobody may hold the cluster.

What a tenant writes (pod annotations, priorities, creation times, Node annotations, time limits) must
neither reorder the queue in its favour nor hold capacity for pods that do not exist. Cluster and
builders as in ``tests/scheduler_plugin/test_extender_queue.py``: two NVLink domains of four 4-GPU
nodes."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from scheduler_plugin.extender import Extender
from scheduler_plugin.queue import PodFacts, QueueConfig, Running, Waiting, decide, planner_place, rebuild
from scheduler_plugin.queueing import Limits, pod_limits
from tests.integration.fakekube import node
from tests.scheduler_plugin.placement.builders import gang, racks
from tests.scheduler_plugin.test_extender_queue import (
    DOMAIN0,
    NODES,
    T0,
    FakeQueueCluster,
    big_gang,
    busy_cluster,
    iso,
    make_state,
    member,
    preemption_cluster,
    solo,
)


def test_a_pod_parked_for_a_day_does_not_move_a_new_gang_ahead() -> None:
    """The queue once ordered gangs by their oldest pod's creation: a pod parked a day before joined a
    gang made later and put it ahead of a gang complete since long."""
    fair = [member("fair", i, at=T0 + 10) for i in range(4)]
    parked = member("late", 0, at=T0 - 86_400)
    late = [parked, *(member("late", i, at=T0 + 50) for i in range(1, 4))]
    s = make_state([*busy_cluster(), *late, *fair])
    s.queue.tick(T0 + 60)
    assert s.queue.waiting == ["default/fair", "default/late"]
    assert set(s.holds.queue_reservations) == {"default/fair"}  # the head is the gang complete first


def test_one_high_priority_pod_does_not_lift_its_gang_into_preempting() -> None:
    mixed = [member("mixed", i, at=T0 + 10) for i in range(4)]
    mixed[0]["spec"]["priority"] = 1_000_000  # one pod of a high class among low ones
    s = make_state([*preemption_cluster(), *mixed], config=QueueConfig(preempt_after_s=0))
    actions = s.queue.tick(T0 + 1000)
    assert actions.evictions == ()
    assert not [e for e in actions.events if e.reason == "GangPreempting"]


def test_a_gang_takes_the_lowest_priority_of_its_pods_in_the_queue_order() -> None:
    mixed = [member("mixed", i, at=T0 + 10) for i in range(4)]
    mixed[0]["spec"]["priority"] = 1_000_000
    steady = [member("steady", i, priority=100, at=T0 + 20) for i in range(4)]
    s = make_state([*busy_cluster(), *mixed, *steady])
    s.queue.tick(T0 + 30)
    assert s.queue.waiting == ["default/steady", "default/mixed"]


def test_a_head_gang_that_can_never_fit_lets_the_next_gang_be_the_head() -> None:
    """A gang of five 4-GPU pods inside one NVLink domain of four nodes fits nowhere, ever: it once
    stayed the head with no reservation, so no gang behind it was ever reserved."""
    impossible = [member("huge", i, size=5, at=T0 + 5) for i in range(5)]
    s = make_state([*busy_cluster(), *impossible, *(member("next", i, at=T0 + 10) for i in range(4))])
    actions = s.queue.tick(T0 + 20)
    assert set(s.holds.queue_reservations) == {"default/next"}  # the next gang is the head
    said = [e for e in actions.events if e.reason == "GangNeverFits"]
    assert {e.pod["metadata"]["name"] for e in said} == {f"huge-{i}" for i in range(5)}
    assert "fits nowhere even with every node free" in said[0].message
    assert "gpuagent_extender_never_fitting_gangs 1" in s.queue.metrics_text().decode()
    s.cache.dirty = True
    again = s.queue.tick(T0 + 30)
    assert not [e for e in again.events if e.reason == "GangNeverFits"]  # said once
    assert set(s.holds.queue_reservations) == {"default/next"}


def test_a_head_waiting_for_endless_work_still_holds_the_queue() -> None:
    """Only a gang that could never fit is passed over; one that waits for work without a limit to end
    stays the head (the order is kept), holding nothing until then."""
    endless = [member("run", i, size=2, on=f"r{r}-t{i + 2 * r}", at=T0) for r in range(2) for i in range(2)]
    for i, p in enumerate(endless):  # two gangs of 2 pods: one on each domain, no limits
        p["metadata"]["name"] = f"run{i // 2}-{i % 2}"
        p["metadata"]["annotations"]["gpuagent.dev/gang"] = f"run{i // 2}"
        p["metadata"]["annotations"]["gpuagent.dev/rank"] = str(i % 2)
    s = make_state([*endless, *(member("head", i, at=T0 + 5) for i in range(4))])
    s.cache.apply("pods", "ADDED", member("next", 0, size=1, at=T0 + 10))
    s.queue.tick(T0 + 20)
    assert "default/head" in s.queue.waiting
    assert s.holds.queue_reservations == {}
    assert "gpuagent_extender_never_fitting_gangs 0" in s.queue.metrics_text().decode()


def test_a_forged_reserved_for_does_not_reorder_the_queue_after_a_restart() -> None:
    """``gpuagent.dev/reserved-for: default/second`` written on nodes while the extender was down: the
    rebuilt hold would put the second gang ahead of the first; it is kept only where the queue would
    grant it now."""
    first = [member("first", i, at=T0 + 10) for i in range(4)]
    second = [member("second", i, at=T0 + 20) for i in range(4)]
    annotated = dict.fromkeys(DOMAIN0, "default/second")
    s = make_state([*busy_cluster(), *first, *second], annotated=annotated)
    actions = s.queue.tick(T0 + 30)
    assert set(s.holds.queue_reservations) == {"default/first"}
    head = s.holds.queue_reservations["default/first"]
    assert (sorted(head.claims), head.start_s) == (DOMAIN0, T0 + 100)  # the domain that frees first
    assert actions.annotate == dict.fromkeys(DOMAIN0, "default/first")


def test_a_rebuilt_hold_of_the_head_is_kept_after_a_restart() -> None:
    first = [member("first", i, at=T0 + 10) for i in range(4)]
    second = [member("second", i, at=T0 + 20) for i in range(4)]
    nvl1 = [n for n in NODES if n not in DOMAIN0]
    s = make_state([*busy_cluster(), *first, *second], annotated=dict.fromkeys(nvl1, "default/first"))
    actions = s.queue.tick(T0 + 30)
    held = s.holds.queue_reservations["default/first"]
    assert (sorted(held.claims), held.start_s) == (nvl1, T0 + 300)  # the head's, as the nodes say
    assert actions.annotate == {}


def _requesting(p: dict[str, Any], cpu: str, memory: str) -> dict[str, Any]:
    p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu, "memory": memory}
    return p


def test_a_gang_requesting_cpu_and_memory_is_reserved_on_a_full_cluster() -> None:
    """Trays of 144 CPUs and 1000 GiB; every pod, running or waiting, requests 4 GPUs, 136 CPUs and
    800 GiB as real training pods do. The queue's view of the future once freed only GPUs, so the gang
    never fitted on what will free and was never reserved."""
    running = [
        _requesting(solo(f"job-{n}", 4, on=n, limit=100 if n in DOMAIN0 else 300), "136", "800Gi")
        for n in NODES
    ]
    waiting = [_requesting(member("train", i, at=T0 + 10), "136", "800Gi") for i in range(4)]
    s = make_state([*running, *waiting])
    trays = []
    for n in NODES:
        tray = node(n, 4)
        tray["status"]["allocatable"].update({"cpu": "144", "memory": "1000Gi"})
        trays.append(tray)
    s.cache.replace("nodes", trays)
    s.queue.tick(T0 + 20)
    held = s.holds.queue_reservations["default/train"]
    assert (sorted(held.claims), held.start_s) == (DOMAIN0, T0 + 100)


# -- declared time limits count only where something enforces them ----------------------------------
def _bound(s: Any, p: dict[str, Any], node_name: str, at: float) -> None:
    p = dict(p, spec={**p["spec"], "nodeName": node_name}, status={"phase": "Running", "startTime": iso(at)})
    s.cache.apply("pods", "MODIFIED", p)


def test_a_pod_that_backfilled_onto_held_nodes_is_evicted_past_its_limit_and_the_start_stays() -> None:
    """A pod on its own declaring ``time-limit: 50`` backfilled onto a node held for the head gang and
    ran forever, the head's expected start sliding forward on every pass. The extender now evicts it at
    its limit plus the grace (an Event says why) and counts it as gone by then, so the start holds."""
    s = make_state([*busy_cluster(), *big_gang()], grace=30)
    s.queue.tick(T0 + 20)
    start = s.holds.queue_reservations["default/big"].start_s
    assert start == T0 + 130  # r0-t0's job: its limit of 100 s plus the grace
    sneak = solo("sneak", 4, limit=50, at=T0 + 30)  # ends by T0+110 at the latest: before the start
    s.cache.apply("pods", "ADDED", sneak)
    assert "r0-t1" in s.filter(s.cache.pods["default/sneak"], NODES, T0 + 30).passed
    _bound(s, s.cache.pods["default/sneak"], "r0-t1", T0 + 31)
    for t in (T0 + 90, T0 + 105):  # past its limit (T0+81), within the grace: it may finish
        s.cache.dirty = True
        assert s.queue.tick(t).evictions == ()
        assert s.holds.queue_reservations["default/big"].start_s == start  # the start does not slide
    fake = FakeQueueCluster()
    ext = Extender(state=s, cluster=fake, queue_cluster=fake, clock=lambda: T0 + 112)

    async def run() -> None:
        actions = await ext.queue_once()  # a pass is due at T0+111: the eviction's time
        assert [(e.pod["metadata"]["name"], e.reason) for e in actions.evictions] == [
            ("sneak", "TimeLimitExceeded")
        ]
        await asyncio.sleep(0.05)  # Events are recorded in the background
        _, metrics = await ext.dispatch_health("GET", "/metrics", b"")
        assert b"gpuagent_extender_time_limit_evictions_total 1" in metrics.body
        assert b"gpuagent_extender_evicted_pods_total 0" in metrics.body  # no preemption
        await ext.drain()

    asyncio.run(run())
    assert fake.evicted == ["sneak"]
    said = [e for e in fake.events if e[1] == "TimeLimitExceeded"]
    assert len(said) == 1
    assert "declared time limit of 50s plus a grace of 30s" in said[0][2]
    assert "held for gang default/big" in said[0][2]
    assert s.holds.queue_reservations["default/big"].start_s == start


def test_a_declared_limit_off_held_nodes_is_left_alone_by_default() -> None:
    s = make_state([solo("free", 4, on="r1-t3", limit=50, at=T0)], grace=30)
    assert s.queue.tick(T0 + 1000).evictions == ()  # no gang waits for its node
    everywhere = make_state([solo("free", 4, on="r1-t3", limit=50, at=T0)], grace=30, enforce="all")
    evicted = everywhere.queue.tick(T0 + 1000).evictions
    assert [(e.pod["metadata"]["name"], e.reason) for e in evicted] == [("free", "TimeLimitExceeded")]
    everywhere.cache.apply("pods", "DELETED", everywhere.cache.pods["default/free"])  # the API evicted it
    # with nothing queued, a pod that starts later is still seen, and evicted when its time comes
    later = solo("later", 4, on="r0-t3", limit=50, at=T0 + 1000)
    everywhere.cache.apply("pods", "ADDED", later)
    assert everywhere.queue.tick(T0 + 1001).evictions == ()
    evicted = everywhere.queue.tick(T0 + 1080).evictions
    assert [e.pod["metadata"]["name"] for e in evicted] == ["later"]


def test_with_enforcement_off_a_declared_limit_does_not_let_a_pod_onto_held_nodes() -> None:
    """Nothing would end it: a pod declaring a short limit counts as never ending."""
    s = make_state([*busy_cluster(), *big_gang()], enforce="off")
    s.queue.tick(T0 + 20)
    assert "default/big" not in s.holds.queue_reservations  # the running jobs' limits count no more
    s = make_state([*busy_cluster(), *big_gang()])
    s.queue.tick(T0 + 20)
    sneak = solo("sneak", 4, limit=50, at=T0 + 30)
    s.inputs.enforce_time_limits = "off"
    s.cache.apply("pods", "ADDED", sneak)
    out = s.filter(s.cache.pods["default/sneak"], NODES, T0 + 30)
    assert "r0-t1" not in out.passed
    assert "r1-t1" in out.passed


def _deadline(p: dict[str, Any], seconds: int) -> dict[str, Any]:
    p["spec"]["activeDeadlineSeconds"] = seconds  # the kubelet ends it
    return p


def test_a_pod_with_kueues_labels_and_no_kueue_is_evicted_past_its_limit_on_held_nodes() -> None:
    """Any tenant writes ``kueue.x-k8s.io/queue-name`` and Kueue's limit on a lone pod no Kueue ever sees:
    the limit counts only as declared, so the pod backfills onto a held node only where the extender
    ends it, and it does, past its limit plus the grace."""
    s = make_state([*busy_cluster(), *big_gang()], grace=30)
    s.queue.tick(T0 + 20)
    sneak = solo("sneak", 4, at=T0 + 30)
    sneak["metadata"]["labels"] = {
        "kueue.x-k8s.io/queue-name": "team",
        "kueue.x-k8s.io/max-exec-time-seconds": "50",
    }
    assert pod_limits(sneak, {}) == Limits(declared=50.0)
    s.cache.apply("pods", "ADDED", sneak)
    assert "r0-t1" in s.filter(s.cache.pods["default/sneak"], NODES, T0 + 30).passed
    _bound(s, s.cache.pods["default/sneak"], "r0-t1", T0 + 31)
    s.cache.dirty = True
    evicted = s.queue.tick(T0 + 112).evictions
    assert [(e.pod["metadata"]["name"], e.reason) for e in evicted] == [("sneak", "TimeLimitExceeded")]


def test_only_limits_others_enforce_count_when_the_extender_enforces_none() -> None:
    deadline = _deadline(solo("deadline", 4, at=T0), 50)
    kueue = solo("kueue", 4, at=T0)
    kueue["metadata"]["labels"] = {
        "kueue.x-k8s.io/queue-name": "team",
        "kueue.x-k8s.io/max-exec-time-seconds": "50",
    }
    forged = solo("forged", 4, at=T0)
    forged["metadata"]["labels"] = {"kueue.x-k8s.io/max-exec-time-seconds": "50"}  # no Kueue admits it
    assert pod_limits(deadline, {}) == Limits(enforced=50.0)
    assert pod_limits(kueue, {}) == Limits(declared=50.0)  # the queue-name label is a tenant's word
    assert pod_limits(forged, {}) == Limits(declared=50.0)
    assert pod_limits(solo("ours", 4, limit=50, at=T0), {}) == Limits(declared=50.0)
    busy = [_deadline(solo("a", 4, on="r0-t0"), 100), _deadline(solo("b", 4, on="r1-t0"), 300)]
    s = make_state([*busy, *big_gang()], enforce="off")
    s.queue.tick(T0 + 20)
    assert s.holds.queue_reservations["default/big"].start_s == T0 + 100
    for p, held_ok in ((deadline, True), (kueue, False), (forged, False)):
        p["metadata"]["creationTimestamp"] = iso(T0 + 30)
        s.cache.apply("pods", "ADDED", p)
        passed = s.filter(s.cache.pods[f"default/{p['metadata']['name']}"], NODES, T0 + 30).passed
        assert ("r0-t1" in passed) is held_ok, p["metadata"]["name"]


# -- the same, on the pure queue core ----------------------------------------------------------------
def test_the_core_frees_what_ending_work_holds_besides_gpus() -> None:
    snap = racks([0, 0, 0, 0], [0, 0, 0, 0])
    cpu = 136_000  # millicores per pod, of 144 CPUs per node
    snap = dataclasses.replace(
        snap,
        nodes=tuple(
            dataclasses.replace(n, resources={"cpu": 144_000}, free_resources={"cpu": 8_000})
            for n in snap.nodes
        ),
    )
    running = {
        f"job-{n.name}": Running(
            f"job-{n.name}",
            0,
            0.0,
            100.0 if n.name.startswith("r0") else 300.0,
            {n.name: 4},
            uses={n.name: {"cpu": cpu}},
        )
        for n in snap.nodes
    }
    g = gang(4, subgroup=4)
    g = dataclasses.replace(g, roles=(dataclasses.replace(g.roles[0], resources_per_pod={"cpu": cpu}),))
    d = decide(10.0, snap, running, [Waiting("train", g, 0, 1.0)], {}, place=planner_place())
    assert d.reservations["train"].start_s == 100.0
    assert sorted(d.reservations["train"].claims) == [n.name for n in snap.nodes[:4]]


def test_the_core_rebuilds_only_the_hold_the_queue_would_grant() -> None:
    snap = racks([0, 4, 4, 4], [0, 4, 4, 4])
    running = {
        "a": Running("a", 0, 0.0, 100.0, {"r0-n00": 4}),
        "b": Running("b", 0, 0.0, 300.0, {"r1-n00": 4}),
    }
    pods = [PodFacts("a", 0, 0.0, 100.0, "r0-n00", 4, 0.0), PodFacts("b", 0, 0.0, 300.0, "r1-n00", 4, 0.0)]
    first = Waiting("first", gang(4, subgroup=4), 0, 1.0)
    second = Waiting("second", gang(4, subgroup=4), 0, 2.0)
    urgent = Waiting("urgent", gang(4, subgroup=4), 5, 3.0)  # ahead of both; lower holds do not delay it
    r0 = [n.name for n in snap.nodes[:4]]
    r1 = [n.name for n in snap.nodes[4:]]
    forged = dict.fromkeys(r0, "second") | dict.fromkeys(r1, "first")
    state = rebuild(10.0, snap, pods, [first, second, urgent], forged, place=planner_place())
    assert set(state.reservations) == {"first"}  # the first of its class; the second's would delay it
    assert running.keys() == state.running.keys()
