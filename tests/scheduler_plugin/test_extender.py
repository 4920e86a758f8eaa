"""The extender's pure state (reservations, barrier, scores) and its request handlers, with an
injected clock and an in-memory cluster recorder (no network; tests/integration has the HTTP side)."""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from scheduler_plugin.cluster import CPU, GPU, pod_requests, snapshot_from_objects
from scheduler_plugin.extender import Extender, ExtenderState, json_depth
from scheduler_plugin.extender import bind as bind_module
from scheduler_plugin.extender import filter as filter_module
from scheduler_plugin.extender import inputs as inputs_module
from scheduler_plugin.extender.filter import EXCLUDE_CONFIRM_S
from scheduler_plugin.planner import SnapshotCache
from scheduler_plugin.queue import QueueConfig, Reservation
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, PlanResult, PodSlot, changed_nodes
from tests.integration.fakekube import hypernode, node, pod

NODES = [f"r{r}-t{t}" for r in range(2) for t in range(4)]


def gang_pod(
    name: str, rank: int, *, gang: str = "g", size: int = 4, gpus: int = 4, min_subgroups: int | None = None
) -> dict[str, Any]:
    ann = {
        "gpuagent.dev/gang": gang,
        "gpuagent.dev/gang-size": str(size),
        "gpuagent.dev/subgroup-size": "2",
        "gpuagent.dev/subgroup-tier": "nvlink",
        "gpuagent.dev/rank": str(rank),
    }
    if min_subgroups is not None:
        ann["gpuagent.dev/min-subgroups"] = str(min_subgroups)
    return pod(name, gpus, annotations=ann)


def make_state(*, ttl: float = 10.0, barrier: float = 5.0, pods: list[dict[str, Any]] = ()) -> ExtenderState:  # type: ignore[assignment]
    s = ExtenderState(queue=QueueConfig(reservation_ttl_s=ttl, barrier_timeout_s=barrier))
    s.cache.replace("nodes", [node(n, 4) for n in NODES])
    s.cache.replace(
        "hypernodes",
        [hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t{t}" for t in range(4)]) for r in range(2)],
    )
    s.cache.replace("pods", pods)
    return s


class Recorder:
    def __init__(self, fail: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.bound: list[tuple[str, str]] = []
        self.bound_annotations: dict[str, dict[str, str]] = {}
        self.events: list[tuple[str, str]] = []
        self.fail = fail

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        if f"{namespace}/{name}" in self.fail:
            raise RuntimeError("injected API failure")
        self.bound.append((f"{namespace}/{name}", node))
        if annotations:
            self.bound_annotations[f"{namespace}/{name}"] = dict(annotations)

    def event(self, pod: Mapping[str, Any], *, reason: str, message: str, warning: bool) -> None:
        self.events.append((pod["metadata"]["name"], reason))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def known(s: ExtenderState, p: dict[str, Any]) -> dict[str, Any]:
    """``p`` as the informer reports it: the extender decides only for pods its informer knows."""
    s.cache.apply("pods", "ADDED", p)
    return p


def planned_node(s: ExtenderState, p: dict[str, Any], now: float) -> str:
    out = s.filter(p, NODES, now)
    assert len(out.passed) == 1, (out.failed, out.unresolvable)
    return out.passed[0]


# -- state ---------------------------------------------------------------------------------------


def test_a_started_gangs_hold_is_the_one_reservation_type_and_holds_gpus_and_cpu_per_node() -> None:
    """The plan's hold is a ``queue.Reservation``: each planned node's GPUs and CPU, from the start until
    the TTL, counted by ``held``/``held_gpus``; a bound pod's share leaves it; given up at the barrier,
    the GPUs still held stay held as a ``Reservation`` from the past, which ``head_holds`` returns."""
    pods = [gang_pod(f"w{i}", i) for i in range(4)]
    for p in pods:
        p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2", "nvidia.com/gpu": "4"}
    s = make_state(pods=pods, ttl=10.0, barrier=5.0)
    cpu = pod_requests(pods[0])[CPU]
    nodes = [planned_node(s, p, 100.0) for p in pods]
    hold = s.holds.started["default/g"].hold
    assert isinstance(hold, Reservation)
    assert (hold.start_s, hold.expires_s) == (100.0, 110.0)
    assert dict(hold.claims) == dict.fromkeys(nodes, 4)
    assert s.holds.held() == {n: {GPU: 4, CPU: cpu} for n in nodes}
    assert s.holds.held_gpus() == dict.fromkeys(nodes, 4)
    s.cache.apply("pods", "MODIFIED", {**pods[0], "spec": {**pods[0]["spec"], "nodeName": nodes[0]}})
    assert s.holds.held()[nodes[0]] == {GPU: 0, CPU: 0}  # bound elsewhere: its share is no longer held
    assert s.holds.head_holds() == []
    assert s.bind("default", "w1", "", nodes[1], 101.0).action == "wait"
    assert s.bind.barrier_timeout("default/g", 106.0).action == "error"  # two of four: under the minimum
    assert "default/g" not in s.holds.started
    assert s.holds.held() == {}
    (kept,) = s.holds.head_holds()
    assert isinstance(kept, Reservation)
    assert (kept.gang, kept.start_s, dict(kept.claims)) == (
        "default/g",
        -math.inf,
        dict.fromkeys(nodes[1:], 4),
    )


def test_gang_plan_reserves_and_filters_each_pod_to_its_node() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(4)]
    s = make_state(pods=pods)
    nodes = [planned_node(s, p, 0.0) for p in pods]
    assert len(set(nodes)) == 4
    # blocks of 2 (ranks 0-1, 2-3) each in one rack
    assert nodes[0][:2] == nodes[1][:2]
    assert nodes[2][:2] == nodes[3][:2]
    res = s.holds.started["default/g"]
    assert sum(res.hold.claims.values()) == 16
    # a pod on its own cannot take a reserved GPU
    solo = known(s, pod("solo", 1))
    out = s.filter(solo, NODES, 0.0)
    for n in nodes:
        assert "not reserved for a gang" in out.failed[n]


def test_reservation_expires_when_no_pod_reaches_bind() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(4)]
    s = make_state(pods=pods, ttl=10.0)
    planned_node(s, pods[0], 0.0)
    assert s.holds.expire(9.0) == []
    assert s.holds.expire(10.0) == ["default/g"]
    assert s.holds.started == {}
    assert all(s.cache.free_gpus(n) == 4 for n in NODES)


def test_bind_on_another_node_than_planned_is_an_error() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(4)]
    s = make_state(pods=pods)
    n0 = planned_node(s, pods[0], 0.0)
    other = next(n for n in NODES if n != n0)
    d = s.bind("default", "w0", "uid-default-w0", other, 0.0)
    assert d.action == "error"
    assert f"planned on {n0}" in d.error


def test_barrier_timeout_binds_when_the_elastic_minimum_arrived() -> None:
    pods = [gang_pod(f"w{i}", i, min_subgroups=1) for i in range(4)]
    s = make_state(pods=pods, barrier=5.0)
    nodes = {p["metadata"]["name"]: planned_node(s, p, 0.0) for p in pods}
    assert s.bind("default", "w0", "uid-default-w0", nodes["w0"], 1.0).action == "wait"
    d = s.bind("default", "w1", "uid-default-w1", nodes["w1"], 2.0)
    assert d.action == "wait"
    assert s.bind.barrier_timeout("default/g", 3.0).action == "wait"  # not yet
    d = s.bind.barrier_timeout("default/g", 6.0)
    assert d.action == "bind"
    assert sorted(k for k, _, _ in d.pods) == ["default/w0", "default/w1"]


def test_barrier_timeout_below_the_minimum_releases_everything() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(4)]
    s = make_state(pods=pods)
    nodes = {p["metadata"]["name"]: planned_node(s, p, 0.0) for p in pods}
    s.bind("default", "w0", "uid-default-w0", nodes["w0"], 1.0)
    d = s.bind.barrier_timeout("default/g", 100.0)
    assert d.action == "error"
    assert "only 1 of 4" in d.error
    assert [e.reason for e in d.events] == ["GangBarrierTimeout"]
    assert s.holds.started == {}


def test_gang_pods_prioritize_their_planned_node() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(4)]
    s = make_state(pods=pods)
    n0 = planned_node(s, pods[0], 0.0)
    scores = dict(s.prioritize(pods[0], NODES, 0.0))
    assert scores[n0] == 10
    assert sum(scores.values()) == 10


def test_solo_scores_prefer_used_domains_and_full_nodes() -> None:
    s = make_state(pods=[pod("busy", 2, node_name="r0-t0")])
    scores = dict(s.prioritize(known(s, pod("solo", 2)), NODES, 0.0))
    assert scores["r0-t0"] == max(scores.values())  # fills the half-used node
    assert scores["r0-t1"] > scores["r1-t0"]  # keeps rack 1 whole
    assert all(0 <= v <= 10 for v in scores.values())
    assert dict(s.prioritize(known(s, pod("huge", 8)), ["r0-t1"], 0.0)) == {"r0-t1": 0}


def test_informer_events_update_usage() -> None:
    s = make_state()
    p = pod("x", 4, node_name="r0-t0")
    s.cache.apply("pods", "ADDED", p)
    assert s.cache.free_gpus("r0-t0") == 0
    s.cache.apply("pods", "MODIFIED", {**p, "status": {"phase": "Succeeded"}})
    assert s.cache.free_gpus("r0-t0") == 4
    s.cache.apply("pods", "MODIFIED", p)
    s.cache.apply("pods", "DELETED", p)
    assert s.cache.free_gpus("r0-t0") == 4
    s.cache.apply("nodes", "DELETED", node("r0-t0", 4))
    assert "r0-t0" not in s.filter(known(s, pod("y", 1)), NODES, 0.0).passed


def test_restart_mid_gang_plans_only_the_unbound_pods() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(4)]
    pods[0] = {**pods[0], "spec": {**pods[0]["spec"], "nodeName": "r1-t0"}, "status": {"phase": "Running"}}
    pods[1] = {**pods[1], "spec": {**pods[1]["spec"], "nodeName": "r1-t1"}, "status": {"phase": "Running"}}
    s = make_state(pods=pods)
    n2 = planned_node(s, pods[2], 0.0)
    n3 = planned_node(s, pods[3], 0.0)
    assert {n2, n3}.isdisjoint({"r1-t0", "r1-t1"})
    assert s.holds.started["default/g"].target == 2


def test_events_are_not_repeated_for_the_same_reason() -> None:
    pods = [gang_pod(f"w{i}", i, size=10) for i in range(10)]  # cannot fit in two racks of 4 trays
    s = make_state(pods=pods)
    first = s.filter(pods[0], NODES, 0.0)
    again = s.filter(pods[0], NODES, 1.0)
    # the queue says once, on every pod, that the gang fits nowhere even with every node free
    assert sorted({e.reason for e in first.events}) == ["GangNeverFits", "GangUnschedulable"]
    assert [e.reason for e in first.events].count("GangNeverFits") == 10
    assert again.events == []


def test_snapshot_from_objects_with_labels_and_requests() -> None:
    nodes = [
        node("a", 8, labels={"gpuagent.dev/nvlink-domain": "d1", "gpuagent.dev/ib-leaf": "L"}),
        node("b", 8),
    ]
    nodes[1]["spec"]["unschedulable"] = True
    pods = [
        pod("p", 3, node_name="a"),
        {**pod("done", 8, node_name="a"), "status": {"phase": "Succeeded"}},
        pod("pending", 8),
    ]
    snap = snapshot_from_objects(nodes, pods)
    assert snap.tiers == ("nvlink", "leaf")
    a, b = snap.nodes
    assert (a.gpus, a.free, dict(a.domains)) == (8, 5, {"nvlink": "d1", "leaf": "L"})
    assert a.free_resources == {"cpu": 64000, "memory": 512 * 2**30}
    assert not b.schedulable


# -- handlers ------------------------------------------------------------------------------------


def test_handlers_bind_a_gang_through_the_barrier() -> None:
    async def scenario() -> tuple[list[dict[str, Any]], Recorder]:
        pods = [gang_pod(f"w{i}", i) for i in range(4)]
        rec = Recorder()
        ext = Extender(state=make_state(pods=pods), cluster=rec, clock=Clock())
        nodes = {}
        for p in pods:
            status, out = await ext.dispatch(
                "POST", "/filter", json.dumps({"Pod": p, "NodeNames": NODES}).encode()
            )
            assert status == 200
            nodes[p["metadata"]["name"]] = out["NodeNames"][0]

        def args(name: str) -> bytes:
            return json.dumps(
                {
                    "PodName": name,
                    "PodNamespace": "default",
                    "PodUID": f"uid-default-{name}",
                    "Node": nodes[name],
                }
            ).encode()

        waiting = [asyncio.create_task(ext.dispatch("POST", "/bind", args(f"w{i}"))) for i in range(3)]
        await asyncio.sleep(0)
        assert rec.bound == []
        last = await ext.dispatch("POST", "/bind", args("w3"))
        results = [await t for t in waiting] + [last]
        await ext.drain()
        return [r[1] for r in results], rec

    results, rec = asyncio.run(scenario())
    assert results == [{"Error": ""}] * 4
    assert len(rec.bound) == 4
    assert ("w0", "GangPlanned") in rec.events


def test_handlers_report_a_failed_binding() -> None:
    async def scenario() -> dict[str, Any]:
        rec = Recorder(fail={"default/solo"})
        p = pod("solo", 1)
        state = make_state(pods=[p])
        ext = Extender(state=state, cluster=rec, clock=Clock())
        await ext.dispatch("POST", "/filter", json.dumps({"Pod": p, "NodeNames": NODES}).encode())
        _, out = await ext.dispatch(
            "POST",
            "/bind",
            json.dumps({"PodName": "solo", "PodNamespace": "default", "Node": "r0-t0"}).encode(),
        )
        assert state.cache.free_gpus("r0-t0") == 4  # the failed bind is not counted
        return out

    assert "injected API failure" in asyncio.run(scenario())["Error"]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        pytest.param("GET", "/healthz", 200, id="healthz"),
        pytest.param("GET", "/readyz", 200, id="readyz"),
        pytest.param("GET", "/filter", 405, id="filter-get"),
        pytest.param("POST", "/evict", 404, id="unknown-verb"),
    ],
)
def test_dispatch_routes(method: str, path: str, status: int) -> None:
    ext = Extender(state=make_state(), cluster=Recorder())
    got, body = asyncio.run(ext.dispatch(method, path, b""))
    assert got == status
    assert body


def test_dispatch_prefix_path_and_not_ready() -> None:
    ext = Extender(state=make_state(pods=[pod("a", 1)]), cluster=Recorder(), ready=lambda: False)
    status, _ = asyncio.run(ext.dispatch("GET", "/readyz", b""))
    assert status == 503
    status, out = asyncio.run(
        ext.dispatch(
            "POST", "/scheduler/filter", json.dumps({"Pod": pod("a", 1), "NodeNames": ["r0-t0"]}).encode()
        )
    )
    assert status == 200
    assert out["NodeNames"] == ["r0-t0"]


def test_a_pod_made_again_after_the_plan_takes_its_reserved_place() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(4)]
    s = make_state(pods=pods)
    planned_node(s, pods[0], 0.0)
    res = s.holds.started["default/g"]
    assert res.target == 4
    s.cache.apply("pods", "DELETED", pods[3])
    again = gang_pod("w3-again", 3)  # its controller makes the pod of rank 3 again, under a new name
    s.cache.apply("pods", "ADDED", again)
    n3 = planned_node(s, again, 1.0)
    assert s.holds.started["default/g"] is res  # no new plan
    assert n3 == res.nodes[PodSlot("worker", 3)]


def test_an_annotation_gang_is_neither_planned_nor_held_before_its_pods_exist() -> None:
    """One pod declaring ``gang-size: 8`` once got 8 pods planned and their nodes held, renewed by
    kube-scheduler's retries, so a pod on its own was refused on an empty cluster."""
    lone = gang_pod("w0", 0, size=8)
    s = make_state(pods=[lone])
    for t in range(3):  # kube-scheduler retries
        out = s.filter(lone, NODES, float(t))
        assert out.passed == []
        assert "1 of its 8 pods (gpuagent.dev/gang-size) exist so far" in next(iter(out.failed.values()))
    assert s.holds.started == {}
    assert s.holds.queue_reservations == {}
    other = pod("solo", 4)
    s.cache.apply("pods", "ADDED", other)
    assert s.filter(other, NODES, 3.0).passed == NODES  # nothing is held for pods that do not exist


def test_gang_plan_honours_the_pods_node_selector() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(4)]
    for p in pods:
        p["spec"]["nodeSelector"] = {"pool": "b"}
    s = make_state(pods=pods)
    nodes = [node(n, 4, labels={"pool": "b" if n.startswith("r1") else "a"}) for n in NODES]
    s.cache.replace("nodes", nodes)
    assert {planned_node(s, p, 0.0)[:2] for p in pods} == {"r1"}
    pods[3]["spec"]["nodeSelector"] = {"pool": "a"}
    s = make_state(pods=pods)
    out = s.filter(pods[0], NODES, 0.0)
    assert "disagree on nodeSelector pool" in next(iter(out.failed.values()))


def test_gang_plan_skips_tainted_nodes_it_does_not_tolerate() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(4)]
    s = make_state(pods=pods)
    nodes = [node(n, 4) for n in NODES]
    for n in nodes[:4]:  # rack 0 is tainted
        n["spec"]["taints"] = [{"key": "maintenance", "value": "yes", "effect": "NoSchedule"}]
    s.cache.replace("nodes", nodes)
    assert {planned_node(s, p, 0.0)[:2] for p in pods} == {"r1"}
    tolerant = [gang_pod(f"t{i}", i, gang="t") for i in range(4)]
    for p in tolerant:
        p["spec"]["tolerations"] = [{"key": "maintenance", "operator": "Exists"}]
        s.cache.apply("pods", "ADDED", p)
    assert {planned_node(s, p, 0.0)[:2] for p in tolerant} == {"r0"}  # r1 is held for gang g


def test_a_planned_node_the_scheduler_rules_out_is_replanned_around() -> None:
    pods = [gang_pod(f"w{i}", i, size=2) for i in range(2)]
    pods = [
        {
            **p,
            "metadata": {
                **p["metadata"],
                "annotations": {**p["metadata"]["annotations"], "gpuagent.dev/subgroup-size": "2"},
            },
        }
        for p in pods
    ]
    s = make_state(pods=pods)
    first = planned_node(s, pods[0], 0.0)
    without = [n for n in NODES if n != first]
    # kube-scheduler's view may lag: the plan stands for EXCLUDE_CONFIRM_S, and a call that has the node
    # again forgets the miss
    out = s.filter(pods[0], without, 1.0)
    assert out.passed == []
    assert out.events == []
    assert "may be a lag" in next(iter(out.failed.values()))
    assert s.filter(pods[0], NODES, 2.0).passed == [first]
    s.filter(pods[0], without, 3.0)
    assert s.filter(pods[0], without, 3.0 + EXCLUDE_CONFIRM_S - 0.1).events == []
    out = s.filter(pods[0], without, 3.0 + EXCLUDE_CONFIRM_S)
    assert out.passed == []
    assert [e.reason for e in out.events] == ["GangNodeFiltered"]
    assert s.holds.started == {}
    again = s.filter(pods[0], without, 9.0)
    assert len(again.passed) == 1
    assert again.passed[0] != first


@st.composite
def scheduler_runs(draw: st.DrawFn) -> tuple[list[list[dict[str, Any]]], list[tuple[str, int, int]]]:
    gangs = []
    for g in range(draw(st.integers(2, 3))):
        size = draw(st.integers(2, 6))
        gpus = draw(st.sampled_from([2, 4]))
        sub = draw(st.sampled_from([size, max(1, size // 2)]))
        pods = []
        for i in range(size):
            p = gang_pod(f"g{g}-{i}", i, gang=f"g{g}", size=size, gpus=gpus)
            p["metadata"]["annotations"]["gpuagent.dev/subgroup-size"] = str(sub)
            pods.append(p)
        gangs.append(pods)
    noise = draw(
        st.lists(
            st.tuples(st.sampled_from(["filter", "bind", "tick"]), st.integers(0, 2), st.integers(0, 5)),
            max_size=40,
        )
    )
    # then every pod tries once more, in an order drawn at random: filter all, bind all, let time pass
    every = [(g, i) for g, pods in enumerate(gangs) for i in range(len(pods))]
    filters = [("filter", g, i) for g, i in draw(st.permutations(every))]
    binds = [("bind", g, i) for g, i in draw(st.permutations(every))]
    ops = noise + filters + binds + [("tick", 0, 0)] * 6
    return gangs, ops


@given(scheduler_runs())
def test_interleaved_gangs_are_never_half_bound_or_over_capacity(
    run: tuple[list[list[dict[str, Any]]], list[tuple[str, int, int]]],
) -> None:
    gangs, ops = run
    s = make_state(pods=[p for g in gangs for p in g], ttl=10.0, barrier=5.0)
    chosen: dict[str, str] = {}  # pod -> node the scheduler assumed after filter
    waiting: dict[str, set[str]] = {}  # gang -> pods held at the barrier
    bound: dict[str, str] = {}
    size = {f"default/g{g}": len(pods) for g, pods in enumerate(gangs)}
    gpus = {
        f"default/{p['metadata']['name']}": int(
            p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        )
        for g in gangs
        for p in g
    }

    def apply(decision: Any) -> None:
        for key, _, where in decision.pods:
            bound[key] = where
            name = key.split("/", 1)[1]
            pod = next(p for g in gangs for p in g if p["metadata"]["name"] == name)
            s.cache.apply(
                "pods",
                "MODIFIED",
                {**pod, "spec": {**pod["spec"], "nodeName": where}, "status": {"phase": "Running"}},
            )
        waiting.pop(decision.gang, None)

    for now, (op, g, i) in enumerate(ops):  # the scheduler's calls, one per second
        if g >= len(gangs):
            continue
        pods = gangs[g]
        pod = pods[i % len(pods)]
        key = f"default/{pod['metadata']['name']}"
        gang = f"default/g{g}"
        if op == "filter" and key not in bound and key not in waiting.get(gang, set()):
            out = s.filter(pod, NODES, float(now))
            if len(out.passed) == 1:
                chosen[key] = out.passed[0]
        elif op == "bind" and key in chosen and key not in bound and key not in waiting.get(gang, set()):
            uid = pod["metadata"]["uid"]
            d = s.bind("default", pod["metadata"]["name"], uid, chosen.pop(key), float(now))
            if d.action == "wait":  # held at the barrier
                waiting.setdefault(gang, set()).add(key)
            elif d.action == "bind":
                apply(d)
        elif op == "tick":
            for w in list(waiting):
                d = s.bind.barrier_timeout(w, float(now))
                if d.action == "bind":
                    apply(d)
                elif d.action == "error":
                    waiting.pop(w, None)
        # never half-bound: a gang is bound whole or not at all
        for gk, n in size.items():
            count = sum(1 for k in bound if k.startswith(f"{gk}-"))
            assert count in (0, n), (gk, count, n)
        # never over capacity: bound pods plus holds fit every node
        use: Counter[str] = Counter()
        for k, node_name in bound.items():
            use[node_name] += gpus[k]
        held = s.holds.held_gpus()
        for node_name in NODES:
            assert use[node_name] + held.get(node_name, 0) <= 4, node_name
    whole = sum(1 for gk, n in size.items() if sum(k.startswith(f"{gk}-") for k in bound) == n)
    event(f"gangs bound whole: {whole}")


def test_a_reservation_goes_when_all_its_pods_are_deleted() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(4)]
    s = make_state(pods=pods)
    planned_node(s, pods[0], 0.0)
    for p in pods[:3]:
        s.cache.apply("pods", "DELETED", p)
    assert "default/g" in s.holds.started
    s.cache.apply("pods", "DELETED", pods[3])
    assert s.holds.started == {}
    assert all(s.cache.free_gpus(n) == 4 for n in NODES)


def test_a_podgroup_waiting_for_its_pods_is_not_an_invalid_gang() -> None:
    pg = {
        "metadata": {"name": "pg", "namespace": "default"},
        "spec": {
            "minMember": 8,
            "subGroupPolicy": [
                {"name": "w", "subGroupSize": 4, "labelSelector": {"matchLabels": {"r": "w"}}}
            ],
        },
    }
    pods = [
        pod(f"p{i}", 4, annotations={"scheduling.k8s.io/group-name": "pg"}, labels={"r": "w"})
        for i in range(4)
    ]
    s = make_state(pods=pods)
    s.cache.replace("podgroups", [pg])
    out = s.filter(pods[0], NODES, 0.0)
    assert out.unresolvable == {}
    assert "waiting for the rest of the gang" in out.failed[NODES[0]]
    assert [(e.reason, e.warning) for e in out.events] == [("GangIncomplete", False)]


def test_consecutive_gang_plans_reuse_the_unchanged_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    # the second gang's snapshot keeps the node objects the first gang's plan did not change, so the
    # planner prepares it from the first one and recomputes only the reserved nodes
    seen: list[ClusterSnapshot] = []
    real_plan = inputs_module.plan

    def spy(snapshot: ClusterSnapshot, gang: Gang, *, cache: SnapshotCache | None = None) -> PlanResult:
        seen.append(snapshot)
        return real_plan(snapshot, gang, cache=cache)

    monkeypatch.setattr(inputs_module, "plan", spy)  # the queue's plans
    monkeypatch.setattr(filter_module, "plan", spy)  # a waiting gang's, for its message
    first = [gang_pod(f"a{i}", i, gang="ga", size=2) for i in range(2)]
    second = [gang_pod(f"b{i}", i, gang="gb", size=2) for i in range(2)]
    s = make_state(pods=[*first, *second])
    held = {planned_node(s, p, 0.0) for p in first}
    planned_node(s, second[0], 0.0)
    assert len(seen) == 2
    changed = {seen[1].nodes[k].name for k in changed_nodes(seen[0], seen[1]) or []}
    assert changed == held


# -- trust: decisions only for pods the informer knows, binds only of what filter decided -----------


def test_filter_of_a_pod_the_informer_does_not_know_reserves_and_keeps_nothing() -> None:
    s = make_state()
    forged = [gang_pod(f"f{i}", i) for i in range(4)]
    for p in forged:
        out = s.filter(p, NODES, 0.0)
        assert out.passed == []
        assert set(out.unresolvable) == set(NODES)
        assert "not known to the extender's informer" in out.unresolvable["r0-t0"]
        assert out.events == []
    assert s.holds.started == {}
    assert s.cache.pods == {}
    assert s.prioritize(forged[0], NODES, 0.0) == [(n, 0) for n in NODES]


def test_filter_decides_on_the_informers_copy_and_checks_uid_and_scheduler() -> None:
    real = pod("solo", 4)
    theirs = pod("theirs", 1)
    theirs["spec"]["schedulerName"] = "default-scheduler"
    s = make_state(pods=[real, theirs])
    claims_gang = gang_pod("solo", 0)  # same key, forged annotations
    assert set(s.filter(claims_gang, NODES, 0.0).passed) == set(NODES)
    assert s.holds.started == {}
    recreated = {**real, "metadata": {**real["metadata"], "uid": "new-uid"}}
    assert "uid new-uid" in s.filter(recreated, NODES, 0.0).unresolvable["r0-t0"]
    assert "'default-scheduler'" in s.filter(theirs, NODES, 0.0).unresolvable["r0-t0"]
    other = ExtenderState(scheduler_name="mine")
    other.cache.replace("nodes", [node(n, 4) for n in NODES])
    other.cache.replace("pods", [real])
    assert "not 'mine'" in other.filter(real, NODES, 0.0).unresolvable["r0-t0"]


@pytest.mark.parametrize(
    ("setup", "node_name", "uid", "needle"),
    [
        pytest.param("none", "r0-t0", "", "not known to the extender's informer", id="unknown-pod"),
        pytest.param(
            "other-scheduler", "r0-t0", "", "names scheduler 'default-scheduler'", id="other-scheduler"
        ),
        pytest.param("filtered", "nowhere", "", "node nowhere is not known", id="unknown-node"),
        pytest.param("known", "r0-t0", "", "not passed by this extender's filter", id="not-filtered"),
        pytest.param("filtered", "r0-t0", "forged", "not forged", id="wrong-uid"),
        pytest.param(
            "filtered-then-full", "r0-t0", "", "needs 4 GPU(s); 0 free on r0-t0", id="no-longer-fits"
        ),
        pytest.param("filtered-long-ago", "r0-t0", "", "or too long ago", id="expired-decision"),
    ],
)
def test_bind_binds_only_what_this_extender_filtered(
    setup: str, node_name: str, uid: str, needle: str
) -> None:
    p = pod("solo", 4)
    if setup == "other-scheduler":
        p["spec"]["schedulerName"] = "default-scheduler"
    s = make_state(pods=[] if setup == "none" else [p])
    now = 0.0
    if setup.startswith("filtered"):
        assert "r0-t0" in s.filter(p, NODES, 0.0).passed
    if setup == "filtered-then-full":
        s.cache.apply("pods", "ADDED", pod("other", 4, node_name="r0-t0"))
    if setup == "filtered-long-ago":
        now = s.holds.ttl_s + 1
    d = s.bind("default", "solo", uid, node_name, now)
    assert d.action == "error"
    assert needle in d.error


def test_bind_after_filter_and_the_decision_is_used_once() -> None:
    p = pod("solo", 4)
    s = make_state(pods=[p])
    s.filter(p, NODES, 0.0)
    d = s.bind("default", "solo", "uid-default-solo", "r0-t0", 1.0)
    assert (d.action, d.pods) == ("bind", (("default/solo", "uid-default-solo", "r0-t0"),))
    assert s.bind("default", "solo", "", "r0-t0", 1.0).action == "error"


def test_nothing_is_kept_for_a_pod_once_it_is_deleted() -> None:
    pods = [gang_pod(f"w{i}", i, size=10) for i in range(10)]  # cannot fit: an Event per pod
    solo = pod("solo", 1)
    s = make_state(pods=[*pods, solo])
    for p in pods:
        s.filter(p, NODES, 0.0)
    s.filter(solo, NODES, 0.0)
    assert s.outbox.last_event
    assert s.holds.filtered
    for p in [*pods, solo]:
        s.cache.apply("pods", "DELETED", p)
    assert (s.cache.pods, s.outbox.last_event, s.holds.filtered, s.holds.started) == ({}, {}, {}, {})


def test_filter_waits_briefly_for_the_informer_to_report_a_pod() -> None:
    p = pod("late", 1)
    s = make_state()

    async def scenario() -> dict[str, Any]:
        ext = Extender(state=s, cluster=Recorder(), unknown_pod_grace_s=1.0)
        body = json.dumps({"Pod": p, "NodeNames": NODES}).encode()
        call = asyncio.create_task(ext.dispatch("POST", "/filter", body))
        await asyncio.sleep(0.2)
        with ext.lock:  # the informer reports it while filter waits
            s.cache.apply("pods", "ADDED", p)
        _, out = await call
        return out

    assert set(asyncio.run(scenario())["NodeNames"]) == set(NODES)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n'),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\a', max_size=3), inner, max_size=3)
    ),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@given(json_values)
def test_json_depth_is_the_nesting_depth_whatever_the_strings_hold(value: Any) -> None:
    body = json.dumps(value).encode()
    assert json_depth(body) == _depth(value)
    assert json_depth(json.dumps(value, ensure_ascii=False, indent=1).encode()) == _depth(value)


def test_a_node_heartbeat_keeps_the_domains_and_a_label_or_allocatable_change_is_seen() -> None:
    """Kubelets rewrite Node.status every few seconds; only labels (domains) and allocatable (GPUs)
    matter to filter and prioritize, and only their change makes the state read the node again."""
    s = make_state()
    solo = known(s, pod("solo", 1))
    s.prioritize(solo, NODES, 0.0)
    assert s.cache.domains_known()
    beat = node("r0-t0", 4)
    beat["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastHeartbeatTime": "now"}]
    s.cache.apply("nodes", "MODIFIED", beat)
    assert s.cache.domains_known()  # nothing prioritize reads changed
    fewer = node("r0-t0", 2)
    s.cache.apply("nodes", "MODIFIED", fewer)
    assert s.cache.free_gpus("r0-t0") == 2
    assert dict(s.prioritize(known(s, pod("three", 3)), ["r0-t0"], 0.0)) == {"r0-t0": 0}
    moved = node("r0-t0", 4)
    moved["metadata"]["labels"] = {"gpuagent.dev/nvlink-domain": "elsewhere"}
    s.cache.apply("nodes", "MODIFIED", moved)
    assert not s.cache.domains_known()  # read again on the next call
    s.cache.apply("hypernodes", "MODIFIED", hypernode("nvl-0", 1, "nvlink", ["r0-t1", "r0-t2", "r0-t3"]))
    scores = dict(s.prioritize(solo, NODES, 0.0))
    assert set(scores) == set(NODES)
    s.cache.apply("nodes", "DELETED", moved)
    assert not s.cache.domains_known()
    assert s.cache.free_gpus("r0-t0") == 0


def test_a_bound_pods_requests_are_read_again_only_when_its_containers_change() -> None:
    s = make_state()
    p = pod("run", 2)
    p["spec"]["nodeName"] = "r0-t0"
    p["status"]["phase"] = "Running"
    s.cache.apply("pods", "ADDED", p)
    assert s.cache.free_gpus("r0-t0") == 2
    beat = {**p, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    s.cache.apply("pods", "MODIFIED", beat)
    assert s.cache.free_gpus("r0-t0") == 2
    resized = json.loads(json.dumps(beat))
    resized["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "3"
    s.cache.apply("pods", "MODIFIED", resized)
    assert s.cache.free_gpus("r0-t0") == 1
    s.cache.apply("pods", "DELETED", resized)
    assert s.cache.free_gpus("r0-t0") == 4
    s.cache.apply("pods", "ADDED", p)  # the same name again: counted afresh
    assert s.cache.free_gpus("r0-t0") == 2


def test_an_auto_gang_binds_with_the_chosen_subgroup_size_on_each_pod() -> None:
    """``gpuagent.dev/subgroup-size: auto`` on 6 pods over two racks of 4 trays, one tray of each with
    its clique label withdrawn: the planner chooses 3 (3 ready trays per rack), says so in an Event and
    hands every pod the size on its Binding; no pod goes to an unready tray."""
    ann = {
        "gpuagent.dev/gang": "g",
        "gpuagent.dev/gang-size": "6",
        "gpuagent.dev/subgroup-size": "auto",
        "gpuagent.dev/subgroup-size-min": "2",
        "gpuagent.dev/subgroup-tier": "nvlink",
    }
    pods = [pod(f"w{i}", 4, annotations={**ann, "gpuagent.dev/rank": str(i)}) for i in range(6)]

    async def scenario() -> tuple[dict[str, str], Recorder]:
        s = make_state(pods=pods)
        healthy = {"gpuagent.dev/fabric-health": "healthy", "nvidia.com/gpu.clique": "c.0"}
        s.cache.replace(
            "nodes",
            [
                node(n, 4, labels={"gpuagent.dev/fabric-health": "healthy"} if n.endswith("t3") else healthy)
                for n in NODES
            ],
        )
        rec = Recorder()
        ext = Extender(state=s, cluster=rec, clock=Clock())
        nodes: dict[str, str] = {}
        for p in pods:
            status, out = await ext.dispatch(
                "POST", "/filter", json.dumps({"Pod": p, "NodeNames": NODES}).encode()
            )
            assert status == 200
            assert out["NodeNames"], out
            nodes[p["metadata"]["name"]] = out["NodeNames"][0]

        def args(name: str) -> bytes:
            return json.dumps(
                {
                    "PodName": name,
                    "PodNamespace": "default",
                    "PodUID": f"uid-default-{name}",
                    "Node": nodes[name],
                }
            ).encode()

        results = await asyncio.gather(*(ext.dispatch("POST", "/bind", args(f"w{i}")) for i in range(6)))
        await ext.drain()
        assert [r[1] for r in results] == [{"Error": ""}] * 6
        return nodes, rec

    nodes, rec = asyncio.run(scenario())
    assert not any(n.endswith("t3") for n in nodes.values())
    assert {nodes[f"w{i}"][:2] for i in range(3)} != {nodes[f"w{i}"][:2] for i in range(3, 6)}
    assert rec.bound_annotations == {
        f"default/w{i}": {bind_module.SUBGROUP_SIZE_CHOSEN: "3"} for i in range(6)
    }
    assert ("w0", "SubgroupSizeChosen") in rec.events


def test_a_fixed_size_gang_binds_without_annotations() -> None:
    s = make_state(pods=[gang_pod(f"w{i}", i) for i in range(4)])
    for i in range(4):
        p = s.cache.pods[f"default/w{i}"]
        n = planned_node(s, p, 0.0)
        decision = s.bind("default", f"w{i}", f"uid-default-w{i}", n, 0.0)
    assert decision.action == "bind"
    assert decision.annotations == {}
