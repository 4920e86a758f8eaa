"""The extender's queue (``QueueDriver.run_pass``/``take_actions``, the preempt verb, the queue loop's
actions through ``Extender``): reservations with Events, node annotations and metrics; backfill by time
limit for gangs and pods on their own; release; rebuild after a restart; whole-gang preemption.

Cluster: two NVLink domains (nvl-0: r0-t0..3, nvl-1: r1-t0..3) of four 4-GPU nodes. Times are seconds
since the epoch (``T0``); pods carry creation and start times as the API shows them."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler_plugin.extender import GANG_PLANNED, Extender, ExtenderState
from scheduler_plugin.extender.clock import ApiClock
from scheduler_plugin.queue import RESERVED_FOR, QueueConfig, QueueError
from scheduler_plugin.queueing import VictimSet, parse_victims, pod_limit, timestamp
from tests.integration.fakekube import hypernode, node, pod

NODES = [f"r{r}-t{t}" for r in range(2) for t in range(4)]
DOMAIN0 = NODES[:4]
T0 = 1_800_000_000.0


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def timed(
    p: dict[str, Any], *, created: float, started: float | None = None, priority: int = 0
) -> dict[str, Any]:
    p["metadata"]["creationTimestamp"] = iso(created)
    if started is not None:
        p["status"]["startTime"] = iso(started)
    p["spec"]["priority"] = priority
    return p


def solo(
    name: str, gpus: int, *, on: str | None = None, limit: float | None = None, at: float = T0
) -> dict[str, Any]:
    ann = {"gpuagent.dev/time-limit": str(limit)} if limit is not None else {}
    return timed(pod(name, gpus, annotations=ann, node_name=on), created=at, started=at if on else None)


def member(
    gang: str,
    rank: int,
    *,
    size: int = 4,
    gpus: int = 4,
    on: str | None = None,
    limit: float | None = None,
    priority: int = 0,
    at: float = T0,
) -> dict[str, Any]:
    ann = {
        "gpuagent.dev/gang": gang,
        "gpuagent.dev/gang-size": str(size),
        "gpuagent.dev/gang-tier": "nvlink",
        "gpuagent.dev/rank": str(rank),
    }
    if limit is not None:
        ann["gpuagent.dev/time-limit"] = str(limit)
    p = pod(f"{gang}-{rank}", gpus, annotations=ann, node_name=on)
    return timed(p, created=at, started=at if on else None, priority=priority)


def make_state(
    pods: list[dict[str, Any]],
    *,
    config: QueueConfig | None = None,
    annotated: dict[str, str] | None = None,
    enforce: str = "held",
    grace: float = 0.0,
) -> ExtenderState:
    """``grace``: seconds past a declared time limit before the extender evicts (0 here: a limit's end
    is the limit itself, as the times below are written)."""
    if annotated is None:
        annotated = {}
    queue = dataclasses.replace(
        config or QueueConfig(),
        reservation_ttl_s=30.0,
        barrier_timeout_s=5.0,
        enforce_time_limits=enforce,
        time_limit_grace_s=grace,
    )
    s = ExtenderState(queue=queue)
    nodes = [node(n, 4) for n in NODES]
    for n in nodes:
        if n["metadata"]["name"] in annotated:
            n["metadata"]["annotations"] = {RESERVED_FOR: annotated[n["metadata"]["name"]]}
    s.cache.replace("nodes", nodes)
    s.cache.replace(
        "hypernodes", [hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t{t}" for t in range(4)]) for r in range(2)]
    )
    s.cache.replace("pods", pods)
    return s


def busy_cluster() -> list[dict[str, Any]]:
    """r0-t0 busy until T0+100, r1-t0 busy until T0+300 (pods on their own): no domain is free whole."""
    return [solo("a", 4, on="r0-t0", limit=100), solo("b", 4, on="r1-t0", limit=300)]


def big_gang(at: float = T0 + 10, **kw: Any) -> list[dict[str, Any]]:
    return [member("big", i, at=at, **kw) for i in range(4)]


def test_the_head_gang_reserves_the_domain_that_frees_first_and_shows_it() -> None:
    s = make_state([*busy_cluster(), *big_gang()])
    now = T0 + 20
    out = s.filter(s.cache.pods["default/big-0"], NODES, now)
    assert out.passed == []
    assert "does not fit" in next(iter(out.failed.values()))
    assert "next in the queue" in next(iter(out.failed.values()))
    r = s.holds.queue_reservations["default/big"]
    assert sorted(r.claims) == DOMAIN0
    assert r.start_s == T0 + 100
    assert r.domain == "nvl-0"
    reserved = [e for e in out.events if e.reason == "GangReserved"]
    assert {e.pod["metadata"]["name"] for e in reserved} == {f"big-{i}" for i in range(4)}
    assert iso(T0 + 100) in reserved[0].message
    assert "nvl-0" in reserved[0].message
    actions = s.queue.take_actions()
    assert actions.annotate == dict.fromkeys(DOMAIN0, "default/big")
    text = s.queue.metrics_text().decode()
    assert "gpuagent_extender_reservations 1" in text
    assert "gpuagent_extender_reserved_gpus 16" in text
    assert "gpuagent_extender_waiting_gangs 1" in text


def test_pods_on_their_own_use_reserved_nodes_only_when_they_end_before_its_start() -> None:
    s = make_state([*busy_cluster(), *big_gang()])
    s.filter(s.cache.pods["default/big-0"], NODES, T0 + 20)
    endless = solo("endless", 4, at=T0 + 30)
    short = solo("short", 4, limit=50, at=T0 + 30)  # ends at T0+80, before the start at T0+100
    long = solo("long", 4, limit=500, at=T0 + 30)
    for p in (endless, short, long):
        s.cache.apply("pods", "ADDED", p)
    for p, reserved_ok in ((endless, False), (short, True), (long, False)):
        out = s.filter(p, NODES, T0 + 30)
        assert ("r0-t1" in out.passed) is reserved_ok, (p["metadata"]["name"], out.failed.get("r0-t1"))
        assert "r1-t1" in out.passed  # not reserved
        if not reserved_ok:
            assert RESERVED_FOR in out.failed["r0-t1"]


def test_a_gang_backfills_reserved_nodes_only_when_it_ends_before_the_start() -> None:
    s = make_state([*busy_cluster(), *big_gang()])
    s.filter(s.cache.pods["default/big-0"], NODES, T0 + 20)
    # a 2-pod gang without a limit may not take reserved capacity: it goes to nvl-1
    for p in [member("endless", i, size=2, at=T0 + 30) for i in range(2)]:
        s.cache.apply("pods", "ADDED", p)
    out = s.filter(s.cache.pods["default/endless-0"], NODES, T0 + 30)
    assert out.passed
    assert out.passed[0].startswith("r1-")
    # one with a limit ending before the reservation's start is offered the reserved (idle) capacity
    for p in [member("quick", i, size=2, limit=30, at=T0 + 30) for i in range(2)]:
        s.cache.apply("pods", "ADDED", p)
    out = s.filter(s.cache.pods["default/quick-0"], NODES, T0 + 31)
    assert out.passed
    assert out.passed[0] in DOMAIN0
    assert s.holds.queue_reservations["default/big"].start_s == T0 + 100  # its start is not delayed


def test_the_reservation_is_released_when_the_gang_starts_and_the_annotation_goes() -> None:
    s = make_state([*busy_cluster(), *big_gang()])
    s.filter(s.cache.pods["default/big-0"], NODES, T0 + 20)
    for n in DOMAIN0:  # the annotations as the API now shows them
        obj = dict(s.cache.nodes[n])
        obj["metadata"] = {**obj["metadata"], "annotations": {RESERVED_FOR: "default/big"}}
        s.cache.apply("nodes", "MODIFIED", obj)
    assert s.queue.take_actions().annotate == {}
    s.cache.apply("pods", "DELETED", s.cache.pods["default/a"])  # the job on r0-t0 ended early
    out = s.filter(s.cache.pods["default/big-0"], NODES, T0 + 40)
    assert out.passed
    assert out.passed[0] in DOMAIN0
    assert "default/big" not in s.holds.queue_reservations
    assert s.queue.take_actions().annotate == dict.fromkeys(DOMAIN0)
    assert "gpuagent_extender_reservations 0" in s.queue.metrics_text().decode()


def test_a_gang_the_queue_starts_nudges_the_pods_filter_refused_and_announces_its_plan() -> None:
    """kube-scheduler keeps a pod the extender refused among its unschedulable pods until a cluster
    event: when the queue's own tick starts the gang, the refused pods are annotated (an update of the
    pod moves it), and the first pod filtered afterwards gets the GangPlanned Event."""
    s = make_state([*busy_cluster(), *big_gang()])
    for i in range(4):
        assert not s.filter(s.cache.pods[f"default/big-{i}"], NODES, T0 + 20 + i).passed
    assert not s.queue.take_actions().nudges  # still waiting: nothing to nudge
    s.cache.apply(
        "pods", "DELETED", s.cache.pods["default/a"]
    )  # r0-t0 frees: the tick, not a filter, starts it
    actions = s.queue.tick(T0 + 40)
    assert "default/big" in s.holds.started
    nudged = {p["metadata"]["name"]: v for p, v in actions.nudges}
    assert sorted(nudged) == [f"big-{i}" for i in range(4)]
    assert all(v.startswith("4 pod(s) on 4 node(s) at ") for v in nudged.values())
    assert not s.queue.take_actions().nudges  # each once
    first = s.filter(s.cache.pods["default/big-2"], NODES, T0 + 41)
    assert first.passed
    assert [e.reason for e in first.events] == ["GangPlanned"]
    second = s.filter(s.cache.pods["default/big-0"], NODES, T0 + 42)
    assert second.passed
    assert not second.events  # one GangPlanned for the gang


def test_the_pods_refused_before_are_nudged_when_a_later_filter_starts_the_gang() -> None:
    s = make_state([*busy_cluster(), *big_gang()])
    refused = s.filter(s.cache.pods["default/big-0"], NODES, T0 + 20)
    assert "does not fit" in next(iter(refused.failed.values()))
    s.cache.apply("pods", "DELETED", s.cache.pods["default/a"])
    last = s.filter(s.cache.pods["default/big-3"], NODES, T0 + 21)  # its pass starts the gang
    assert last.passed
    assert [e.reason for e in last.events] == ["GangPlanned"]
    assert [p["metadata"]["name"] for p, _ in s.queue.take_actions().nudges] == ["big-0"]


def test_the_queue_loop_annotates_the_pods_it_nudges() -> None:
    s = make_state([*busy_cluster(), *big_gang()])
    s.filter(s.cache.pods["default/big-1"], NODES, T0 + 20)
    s.cache.apply("pods", "DELETED", s.cache.pods["default/a"])
    fake = FakeQueueCluster()
    ext = Extender(state=s, cluster=fake, queue_cluster=fake, clock=lambda: T0 + 40)

    async def run() -> None:
        await ext.queue_once()
        await ext.drain()

    asyncio.run(run())
    assert [(name, uid) for name, uid, _ in fake.pod_annotations] == [
        ("big-1", s.cache.pods["default/big-1"]["metadata"]["uid"])
    ]
    assert GANG_PLANNED == "gpuagent.dev/gang-planned"


def test_with_the_queue_loop_a_new_gangs_filter_runs_no_pass_and_wakes_the_loop_which_starts_it() -> None:
    """While the queue loop runs, filter never waits for a pass: a gang new to the queue is refused with
    that said (no pass, no plan under the filter), the filter wakes the loop at once (its interval here
    is an hour: without the wake the wait below times out), and the loop's pass starts the gang and
    nudges the pod filter refused."""
    s = make_state([solo("a", 4, on="r0-t0", limit=100)])
    fake = FakeQueueCluster()
    ticks = iter(range(1, 1_000_000))  # the clock moves a second a call: no pass is held back by its gap
    ext = Extender(state=s, cluster=fake, queue_cluster=fake, clock=lambda: T0 + 20 + next(ticks))

    async def started() -> None:
        while "default/g" not in s.holds.started:
            await asyncio.sleep(0.01)

    async def run() -> tuple[dict[str, Any], int]:
        stop = asyncio.Event()
        loop = asyncio.create_task(ext.run_queue(stop, interval_s=3600.0))
        while s.queue.metrics.passes == 0:  # the loop's first tick
            await asyncio.sleep(0.01)
        for i in range(4):  # then the gang comes (the cluster has room for it)
            s.cache.apply("pods", "ADDED", member("g", i, at=T0 + 10))
        passes = s.queue.metrics.passes
        out = await ext.filter({"Pod": s.cache.pods["default/g-0"], "NodeNames": NODES})
        assert s.queue.metrics.passes == passes  # the filter ran no pass
        await asyncio.wait_for(started(), 10.0)
        stop.set()
        await loop
        await ext.drain()
        return out, passes

    out, passes = asyncio.run(run())
    assert out["NodeNames"] == []
    assert all("is new to the queue" in why for why in out["FailedNodes"].values())
    assert s.queue.metrics.passes == passes + 1
    assert [name for name, _, _ in fake.pod_annotations] == ["g-0"]  # nudged back to kube-scheduler
    assert ("g-0", "GangQueued") in {(n, r) for n, r, _ in fake.events}
    again = s.filter(s.cache.pods["default/g-0"], NODES, T0 + 21)
    assert len(again.passed) == 1


def test_a_gang_a_pass_left_out_as_incomplete_is_new_again_once_its_last_pod_comes() -> None:
    """The loop's pass saw 3 of the gang's 4 pods and left it out (incomplete); the 4th comes, and the
    first filter before the next pass neither repeats the stale reason as GangUnschedulable nor
    waits: the gang is new to the queue again and wakes the loop."""
    s = make_state([member("g", i, at=T0 + 10) for i in range(3)])
    s.queue.loop = True
    s.queue.tick(T0 + 20)
    assert "default/g" in s.inputs.skipped  # incomplete: left out with the reason
    s.cache.apply("pods", "ADDED", member("g", 3, at=T0 + 10))
    passes = s.queue.metrics.passes
    out = s.filter(s.cache.pods["default/g-3"], NODES, T0 + 21)
    assert out.wake_queue
    assert s.queue.metrics.passes == passes
    assert all("is new to the queue" in why for why in out.failed.values())
    assert [e.reason for e in out.events] == ["GangQueued"]
    s.queue.tick(T0 + 22)
    assert "default/g" in s.holds.started


def test_the_reservation_is_released_when_the_gang_is_deleted() -> None:
    s = make_state([*busy_cluster(), *big_gang()])
    s.filter(s.cache.pods["default/big-0"], NODES, T0 + 20)
    assert s.holds.queue_reservations
    for i in range(4):
        s.cache.apply("pods", "DELETED", s.cache.pods[f"default/big-{i}"])
    assert s.queue.tick(T0 + 21).annotate == {}  # nothing was annotated yet: nothing to remove
    assert s.holds.queue_reservations == {}


def test_a_lost_node_moves_the_reservation() -> None:
    s = make_state([*busy_cluster(), *big_gang()])
    s.filter(s.cache.pods["default/big-0"], NODES, T0 + 20)
    lost = dict(s.cache.nodes["r0-t2"])
    lost["spec"] = {"unschedulable": True}
    s.cache.apply("nodes", "MODIFIED", lost)
    s.queue.tick(T0 + 21)
    r = s.holds.queue_reservations["default/big"]
    assert r.domain == "nvl-1"
    assert r.start_s == T0 + 300


def test_reservations_are_rebuilt_from_node_annotations_after_a_restart() -> None:
    pods = [*busy_cluster(), *big_gang()]
    first = make_state(pods)
    first.filter(first.cache.pods["default/big-0"], NODES, T0 + 20)
    held = first.holds.queue_reservations["default/big"]
    annotated = dict.fromkeys(held.claims, "default/big") | {"r1-t3": "default/gone"}
    again = make_state(pods, annotated=annotated)
    again.cache.synced = False
    assert again.queue.tick(T0 + 25).annotate == {}  # informers not synced: nothing read or written
    assert again.holds.queue_reservations == {}
    again.cache.synced = True
    actions = again.queue.tick(T0 + 26)
    rebuilt = again.holds.queue_reservations["default/big"]
    assert dict(rebuilt.claims) == dict(held.claims)
    assert rebuilt.start_s == held.start_s
    assert actions.annotate == {"r1-t3": None}  # the stale one goes, the held ones stay


def preemption_cluster() -> list[dict[str, Any]]:
    """nvl-0 runs low-priority gang lo0 (2 pods) and lo1 (2 pods); nvl-1 runs lo2 (4 pods) and a pod."""
    pods = [member("lo0", i, size=2, on=f"r0-t{i}", at=T0) for i in range(2)]
    pods += [member("lo1", i, size=2, on=f"r0-t{2 + i}", at=T0 - 1000) for i in range(2)]
    pods += [member("lo2", i, size=3, on=f"r1-t{i}", at=T0 - 50) for i in range(3)]
    pods.append(solo("lone", 4, on="r1-t3", at=T0))
    return pods


def test_a_high_priority_gang_evicts_whole_gangs_inside_one_domain() -> None:
    hi = [member("hi", i, priority=1000, at=T0 + 10) for i in range(4)]
    s = make_state([*preemption_cluster(), *hi], config=QueueConfig(preempt_after_s=30))
    early = s.filter(s.cache.pods["default/hi-0"], NODES, T0 + 20)
    assert early.passed == []
    assert s.queue.take_actions().evictions == ()
    actions = s.queue.tick(T0 + 41)  # the wait ended (wake time)
    evicted = sorted(e.pod["metadata"]["name"] for e in actions.evictions)
    victims = {e.victim for e in actions.evictions}
    # the least GPU-time lost inside one domain: nvl-0 (lo0 and lo1, 2 pods each, both whole) costs
    # 16 GPUs x their run time; nvl-1 would need lo2 (3 pods, ran 50 s longer) and the lone pod
    assert victims in ({"default/lo0", "default/lo1"}, {"default/lo2", "pod:default/lone"})
    for gang in victims - {"pod:default/lone"}:
        name = gang.split("/")[1]
        size = 3 if name == "lo2" else 2
        assert {f"{name}-{i}" for i in range(size)} <= set(evicted)  # whole gangs only
    assert any(e.reason == "GangPreempting" for e in actions.events)
    assert "gpuagent_extender_preemptions_total 1" in s.queue.metrics_text().decode()
    # the next tick does not ask again while the evictions are under way
    s.cache.dirty = True
    again = s.queue.tick(T0 + 42)
    assert again.evictions == ()
    assert not [e for e in again.events if e.reason == "GangPreempting"]
    assert "gpuagent_extender_preemptions_total 1" in s.queue.metrics_text().decode()  # counted once
    # one victim gang's pods are gone, the other's still terminating: the same preemption, not a new one
    gone = next(iter(victims))
    for e in actions.evictions:
        if e.victim == gone:
            s.cache.apply("pods", "DELETED", e.pod)
    later = s.queue.tick(T0 + 43)
    assert not [e for e in later.events if e.reason == "GangPreempting"]
    assert "gpuagent_extender_preemptions_total 1" in s.queue.metrics_text().decode()


def test_a_gang_evicted_once_runs_again_and_is_no_victim_the_second_time() -> None:
    """``max_evictions`` in the extender: the gang's name outlives its pods, which its controller makes
    again; a later preemptor takes other gangs."""
    hi = [member("hi", i, priority=1000, at=T0 + 10) for i in range(4)]
    s = make_state([*preemption_cluster(), *hi], config=QueueConfig(preempt_after_s=0, max_evictions=1))
    first = s.queue.tick(T0 + 20)
    victims = {e.victim for e in first.evictions} - {"pod:default/lone"}
    assert victims
    for e in first.evictions:
        s.cache.apply("pods", "DELETED", e.pod)
    for p in hi:
        s.cache.apply("pods", "DELETED", s.cache.pods[f"default/{p['metadata']['name']}"])
    for gang in victims:  # made again by its controller, bound and running again
        name = gang.split("/")[1]
        for p in preemption_cluster():
            if p["metadata"]["name"].startswith(f"{name}-"):
                s.cache.apply("pods", "ADDED", timed(p, created=T0 + 30, started=T0 + 31))
    hi2 = [member("hi2", i, priority=1000, at=T0 + 40) for i in range(4)]
    for p in hi2:
        s.cache.apply("pods", "ADDED", p)
    second = s.queue.tick(T0 + 50)
    assert all(s.inputs.last_running[g].evictions == 1 for g in victims)
    assert second.evictions  # it preempts, but not the gangs evicted before
    assert not victims & {e.victim for e in second.evictions}


def test_equal_or_lower_priority_never_preempts() -> None:
    same = [member("same", i, at=T0 + 10) for i in range(4)]
    s = make_state([*preemption_cluster(), *same], config=QueueConfig(preempt_after_s=0))
    assert s.queue.tick(T0 + 1000).evictions == ()


# -- the preempt verb ------------------------------------------------------------------------------
def test_preempt_keeps_only_victim_sets_that_take_whole_gangs() -> None:
    s = make_state([*preemption_cluster(), solo("urgent", 4, at=T0 + 5)])
    urgent = s.cache.pods["default/urgent"]
    uid = {k.split("/")[1]: p["metadata"]["uid"] for k, p in s.cache.pods.items()}
    victims = {
        "r0-t0": VictimSet((uid["lo0-0"],), 0),  # half of gang lo0: refused
        "r1-t3": VictimSet((uid["lone"],), 0),  # a pod on its own: kept
        "r1-t0": VictimSet(("uid-nobody",), 0),  # unknown: refused
    }
    kept = s.preempt(urgent, victims, T0 + 5)
    assert kept == {"r1-t3": {"Pods": [{"UID": uid["lone"]}], "NumPDBViolations": 0}}
    # a gang pod's preemption is the queue's: kube-scheduler gets no victims for it
    hi = member("hi", 0, size=1, priority=10, at=T0)
    s.cache.apply("pods", "ADDED", hi)
    assert s.preempt(hi, {"r1-t3": VictimSet((uid["lone"],), 0)}, T0 + 5) == {}


def test_preempt_takes_a_gang_that_lies_whole_on_the_node() -> None:
    pods = [member("pair", i, size=2, gpus=2, on="r0-t0", at=T0) for i in range(2)]
    s = make_state([*pods, solo("urgent", 4, at=T0 + 5)])
    uids = tuple(p["metadata"]["uid"] for p in pods)
    kept = s.preempt(s.cache.pods["default/urgent"], {"r0-t0": VictimSet(uids, 1)}, T0 + 5)
    assert kept == {"r0-t0": {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 1}}


def test_preempt_refuses_reserved_nodes_a_pod_without_a_limit_could_not_use() -> None:
    s = make_state([*busy_cluster(), *big_gang(), solo("c", 4, on="r0-t1", limit=50, at=T0)])
    s.filter(s.cache.pods["default/big-0"], NODES, T0 + 20)
    s.cache.apply("pods", "ADDED", solo("urgent", 4, at=T0 + 30))
    uid = s.cache.pods["default/c"]["metadata"]["uid"]
    assert s.preempt(s.cache.pods["default/urgent"], {"r0-t1": VictimSet((uid,), 0)}, T0 + 30) == {}


def test_parse_victims_reads_both_forms() -> None:
    meta = parse_victims({"NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 2}}})
    assert meta == {"n": VictimSet(("u1",), 2)}
    full = parse_victims({"NodeNameToVictims": {"n": {"Pods": [{"metadata": {"uid": "u2"}}]}, "m": None}})
    assert full == {"n": VictimSet(("u2",), 0)}
    assert parse_victims({}) == {}


# -- time limits ------------------------------------------------------------------------------------
def test_time_limits_from_annotations_the_pod_and_its_job() -> None:
    p = pod("p", 1, annotations={"kueue.x-k8s.io/max-exec-time-seconds": "900"})
    p["spec"]["activeDeadlineSeconds"] = 1200
    assert pod_limit(p, {}) == 900
    p["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "j", "controller": True}]
    assert pod_limit(p, {"default/j": {"spec": {"activeDeadlineSeconds": 60}}}) == 60
    kueue_job = {"metadata": {"labels": {"kueue.x-k8s.io/max-exec-time-seconds": "30"}}, "spec": {}}
    assert pod_limit(p, {"default/j": kueue_job}) == 30  # Kueue's limit is a label on the Job
    with pytest.raises(QueueError, match="job default/j"):
        pod_limit(p, {"default/j": {"spec": {"activeDeadlineSeconds": "soon"}}})
    assert timestamp("2026-12-02T00:00:00Z") == datetime(2026, 12, 2, tzinfo=UTC).timestamp()
    assert timestamp("yesterday") is None
    assert timestamp(7) is None


def test_a_bad_time_limit_is_said_on_the_pod_and_counts_as_none() -> None:
    s = make_state([*busy_cluster(), *big_gang()])
    s.filter(s.cache.pods["default/big-0"], NODES, T0 + 20)
    bad = solo("bad", 4, at=T0 + 30)
    bad["metadata"]["annotations"]["gpuagent.dev/time-limit"] = "soon"
    s.cache.apply("pods", "ADDED", bad)
    out = s.filter(bad, NODES, T0 + 30)
    assert "r0-t1" not in out.passed  # counted as never ending: not on reserved nodes
    events = s.queue.take_actions().events
    assert [e.reason for e in events] == ["InvalidTimeLimit"]
    assert "gpuagent.dev/time-limit" in events[0].message


# -- the extender carries out the queue's actions ------------------------------------------------------
class FakeQueueCluster:
    def __init__(self, refuse: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.annotations: list[tuple[str, str | None]] = []
        self.pod_annotations: list[tuple[str, str, str]] = []
        self.evicted: list[str] = []
        self.dry_runs: list[str] = []
        self.events: list[tuple[str, str, str]] = []
        self.refuse = refuse

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        raise AssertionError("no binding expected")

    def event(self, pod: Any, *, reason: str, message: str, warning: bool) -> None:
        self.events.append((pod["metadata"]["name"], reason, message))

    def annotate_node(self, node: str, value: str | None) -> None:
        self.annotations.append((node, value))

    def annotate_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        self.pod_annotations.append((name, uid, value))

    def evict(self, namespace: str, name: str, uid: str, *, dry_run: bool = False) -> str | None:
        if dry_run:
            self.dry_runs.append(name)
        if name in self.refuse:
            return "the API refused the eviction (PodDisruptionBudget): Cannot evict pod"
        if not dry_run:
            self.evicted.append(name)
        return None


def test_a_budget_refusing_one_eviction_evicts_none_of_the_set_and_other_victims_are_taken() -> None:
    """All of a preemption's evictions or none: each is tried as a dry run first; the API refusing one
    (a PodDisruptionBudget the extender cannot read) leaves every victim running, each victim pod's Event
    says which pod was refused and why, and the next pass takes other victims whole."""
    hi = [member("hi", i, priority=1000, at=T0) for i in range(4)]
    s = make_state([*preemption_cluster(), *hi], config=QueueConfig(preempt_after_s=0))
    # nvl-1 (lo2 and the lone pod) is the cheaper domain: one of lo2's pods has a budget that refuses
    fake = FakeQueueCluster(refuse={"lo2-1"})
    clock = [T0 + 10]
    ext = Extender(state=s, cluster=fake, queue_cluster=fake, clock=lambda: clock[0])

    async def run() -> None:
        await ext.queue_once()
        await asyncio.sleep(0.05)  # Events are recorded in the background
        status, metrics = await ext.dispatch_health("GET", "/metrics", b"")
        assert status == 200
        assert b"gpuagent_extender_evictions_refused_total 1" in metrics.body
        assert fake.evicted == []  # nothing of the set: no victim half-evicted
        assert "lo2-1" in fake.dry_runs
        blocked = {e[0]: e[2] for e in fake.events if e[1] == "PreemptionBlocked"}
        assert set(blocked) == {"lo2-0", "lo2-1", "lo2-2", "lone"}
        assert all("lo2-1" in m and "PodDisruptionBudget" in m for m in blocked.values())
        assert not [e for e in fake.events if e[1] == "Preempted"]
        clock[0] = T0 + 11
        await ext.queue_once()  # the refused victims sit out: the other domain's gangs go, whole
        await asyncio.sleep(0.05)
        await ext.drain()

    asyncio.run(run())
    assert sorted(fake.evicted) == ["lo0-0", "lo0-1", "lo1-0", "lo1-1"]
    assert {e[1] for e in fake.events} >= {"Preempted", "GangPreempting"}
    said = {e[0]: e[2] for e in fake.events if e[1] == "PreemptionBlocked" and e[0].startswith("hi-")}
    assert set(said) == {f"hi-{i}" for i in range(4)}  # the waiting gang's pods say why it waits on
    assert all("pod default/lo2-1" in m and "PodDisruptionBudget" in m for m in said.values())
    assert set(s.holds.queue_reservations["default/hi"].claims) == set(DOMAIN0)  # it holds the nodes it freed


@pytest.mark.parametrize(
    ("path", "status"),
    [pytest.param("/metrics", 200, id="metrics"), pytest.param("/filter", 404, id="no-verbs-there")],
)
def test_health_listener_serves_metrics(path: str, status: int) -> None:
    ext = Extender(state=make_state([]), cluster=FakeQueueCluster())
    got, _ = asyncio.run(ext.dispatch_health("GET", path, b""))
    assert got == status


def test_overdue_work_keeps_the_reservation_on_the_nodes_about_to_free() -> None:
    s = make_state([*busy_cluster(), *big_gang()])
    s.filter(s.cache.pods["default/big-0"], NODES, T0 + 20)
    assert s.holds.queue_reservations["default/big"].domain == "nvl-0"
    s.queue.tick(T0 + 101)  # the job on r0-t0 is past its limit and still running
    r = s.holds.queue_reservations["default/big"]
    assert r.domain == "nvl-0"  # not moved to nvl-1, which frees only at T0+300
    assert T0 + 101 < r.start_s <= T0 + 131


def test_a_job_a_moment_late_does_not_give_its_domain_away_to_the_stream() -> None:
    """Rack 0's jobs end at T0+6..9, rack 1's at T0+15..18; the job on r0-t0 runs 1.6 s past its limit
    while one on r0-t1 has ended: the hold stays on rack 0, and a pod running past its start is kept off."""
    pods = [solo(f"early-{i}", 4, on=f"r0-t{i}", limit=6 + i) for i in range(4)]
    pods += [solo(f"late-{i}", 4, on=f"r1-t{i}", limit=15 + i) for i in range(4)]
    s = make_state([*pods, *big_gang(at=T0 + 2)])
    s.filter(s.cache.pods["default/big-0"], NODES, T0 + 3)
    assert s.holds.queue_reservations["default/big"].domain == "nvl-0"
    stream = solo("stream-0", 4, limit=60, at=T0 + 4)
    s.cache.apply("pods", "ADDED", stream)
    s.cache.apply("pods", "DELETED", s.cache.pods["default/early-1"])
    s.queue.tick(T0 + 7.6)
    assert s.holds.queue_reservations["default/big"].domain == "nvl-0"
    assert "r0-t1" not in s.filter(stream, NODES, T0 + 7.7).passed


@pytest.mark.parametrize("give_up", ["barrier", "bind failed"])
def test_a_started_gang_whose_pods_miss_the_barrier_keeps_its_nodes_from_the_stream(give_up: str) -> None:
    """The gang started on rack 0 but its pods did not all reach bind in time (or binding failed): the
    nodes stay held for it until the next pass, which starts it again there; a pod running past that
    start filtered in between is kept off."""
    pods = [solo(f"late-{i}", 4, on=f"r1-t{i}", limit=15 + i) for i in range(4)]
    s = make_state([*pods, *big_gang(at=T0 + 2)])
    out = s.filter(s.cache.pods["default/big-0"], NODES, T0 + 3)
    assert "default/big" in s.holds.started
    assert out.passed == ["r0-t0"]
    stream = solo("stream-0", 4, limit=60, at=T0 + 4)
    s.cache.apply("pods", "ADDED", stream)
    assert not set(s.filter(stream, NODES, T0 + 4).passed) & set(DOMAIN0)
    assert s.bind("default", "big-0", "", "r0-t0", T0 + 4).action == "wait"
    if give_up == "barrier":
        assert s.bind.barrier_timeout("default/big", T0 + 10).action == "error"
    else:
        s.bind.failed("default/big", ["default/big-0"])
    assert "default/big" not in s.holds.started
    assert not set(s.filter(stream, NODES, T0 + 10).passed) & set(DOMAIN0)
    s.queue.tick(T0 + 11)  # the pass starts the gang again on rack 0
    assert sorted(s.holds.started["default/big"].hold.claims) == DOMAIN0
    assert not set(s.filter(stream, NODES, T0 + 11).passed) & set(DOMAIN0)
    assert s.filter(s.cache.pods["default/big-1"], NODES, T0 + 11).passed[0] in DOMAIN0


def test_a_start_the_queue_loop_leaves_out_keeps_its_nodes_from_the_stream() -> None:
    """The queue loop decided outside the lock to start the gang on rack 0, and one of its pods changed
    meanwhile: the start is left out for the next pass, and until then rack 0 stays held for the gang."""
    pods = [solo(f"late-{i}", 4, on=f"r1-t{i}", limit=15 + i) for i in range(4)]
    s = make_state([*pods, *big_gang(at=T0 + 2)])
    stream = solo("stream-0", 4, limit=60, at=T0 + 2)
    s.cache.apply("pods", "ADDED", stream)
    job = s.queue.begin(T0 + 3)
    assert job is not None
    decision = job.decide()
    assert [st.gang for st in decision.starts] == ["default/big"]
    changed = dict(s.cache.pods["default/big-1"])
    changed["metadata"] = {**changed["metadata"], "labels": {"touched": "yes"}}
    s.cache.apply("pods", "MODIFIED", changed)  # the gang's spec is worked out again: the start is stale
    s.queue.commit(job, decision)
    assert "default/big" not in s.holds.started
    assert not set(s.filter(stream, NODES, T0 + 3).passed) & set(DOMAIN0)
    s.queue.tick(T0 + 4)  # the next pass starts it
    assert sorted(s.holds.started["default/big"].hold.claims) == DOMAIN0


class FlakyQueueCluster(FakeQueueCluster):
    def annotate_node(self, node: str, value: str | None) -> None:
        raise RuntimeError("API unreachable")

    def annotate_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        raise RuntimeError("API unreachable")

    def evict(self, namespace: str, name: str, uid: str, *, dry_run: bool = False) -> str | None:
        raise RuntimeError("API unreachable")


def test_the_queue_loop_ticks_until_stopped_and_retries_what_failed() -> None:
    hi = [member("hi", i, priority=1000, at=T0) for i in range(4)]
    s = make_state([*preemption_cluster(), *big_gang(), *hi], config=QueueConfig(preempt_after_s=0))
    s.cache.synced = False
    fake = FlakyQueueCluster()
    ready = [False]
    ext = Extender(
        state=s,
        cluster=fake,
        queue_cluster=fake,
        clock=ApiClock(epoch=lambda: T0 + 10),
        ready=lambda: ready[0],
    )

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.create_task(ext.run_queue(stop, 0.01))
        await asyncio.sleep(0.1)
        assert s.queue.metrics.passes == 0  # informers not synced: the queue waits
        ready[0] = True
        for _ in range(200):
            await asyncio.sleep(0.01)
            if s.queue.metrics.passes >= 2:
                break
        stop.set()
        await loop
        await ext.drain()

    asyncio.run(run())
    assert s.cache.synced
    assert s.queue.metrics.preemptions >= 1
    assert s.queue.metrics.evictions_refused >= 1  # the failed eviction is counted, asked again later
    assert any(e[1] == "PreemptionBlocked" for e in fake.events)


def test_passes_started_by_changes_keep_the_gap_the_caller_sets() -> None:
    s = make_state([*busy_cluster(), *big_gang()])
    s.queue.tick(T0 + 20)
    assert s.queue.metrics.passes == 1
    s.queue.min_gap_s = 5.0  # a pass took over a second: the verbs keep the lock most of the time
    s.cache.apply("pods", "ADDED", solo("new", 4, at=T0 + 21))
    s.queue.tick(T0 + 21)
    assert s.queue.metrics.passes == 1  # changed, but too soon
    assert not s.queue.due("default/big", T0 + 21, s.cache.spec(("annotations", "default/big")))
    s.queue.tick(T0 + 26)
    assert s.queue.metrics.passes == 2


def test_changes_start_no_pass_while_no_gang_waits_and_nothing_is_held() -> None:
    """Pods on their own come and go by the thousand on a busy cluster: with no gang waiting a pass
    decides nothing, so it is not run (it holds the state lock the verbs need)."""
    s = make_state([*busy_cluster()])
    s.queue.tick(T0 + 1)  # the first pass after a (re)start always runs: it reads the annotations
    assert s.queue.metrics.passes == 1
    for i in range(3):
        s.cache.apply("pods", "ADDED", solo(f"s{i}", 1, at=T0 + 2))
        s.queue.tick(T0 + 2 + i)
    assert s.queue.metrics.passes == 1
    gang = big_gang(at=T0 + 5)
    for p in gang:
        s.cache.apply("pods", "ADDED", p)
    s.queue.tick(T0 + 6)
    assert s.queue.metrics.passes == 2  # a gang waits: changes run the queue again
    assert "default/big" in s.holds.queue_reservations
    for i, p in enumerate(gang):  # bound: nothing waits, the hold goes with the next pass
        bound = dict(p)
        bound["spec"] = {**p["spec"], "nodeName": f"r1-t{i}"}
        s.cache.apply("pods", "MODIFIED", bound)
    s.queue.tick(T0 + 7)
    assert s.queue.metrics.passes == 3
    assert not s.holds.queue_reservations
    s.cache.apply("pods", "ADDED", solo("s9", 1, at=T0 + 8))
    s.queue.tick(T0 + 8)
    assert s.queue.metrics.passes == 3
