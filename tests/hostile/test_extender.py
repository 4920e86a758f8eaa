"""Hostile input to the kube-scheduler extender over real HTTP on loopback (issue 16, rows E1-E3 and the
extender's trust rules): JSON nested 100,000 deep and 5,000-digit numbers (E1), a gang size of a billion
(E2), idle, silent and stalled connections (E3), huge bodies and wrong content types, forged pods that
try to reserve GPUs or grow memory, and binds of pods that are not ours, not filtered by us, or bound to
nodes that do not exist; an API server that answers a binding with garbage, an endless body or not at
all, with an interim 100 Continue first, with "already assigned" to that node or another, or that closes
the connection after the binding was written (issue 26). Every case gets a clear answer, nothing is
bound that should not be, no state is left for forged pods, and the server keeps serving. Each test
runs under a deadline of a few seconds with short server timeouts injected; the state is fed directly
(no API server)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import resource
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest

from scheduler_plugin.extender import (
    MAX_JSON_DEPTH,
    MAX_NUMBER_CHARS,
    Extender,
    ExtenderServer,
    ExtenderState,
    ServerLimits,
    json_depth,
)
from scheduler_plugin.extender import filter as filter_module
from scheduler_plugin.extender import inputs as inputs_module
from scheduler_plugin.gangs import GangError, gang_from_podgroup
from scheduler_plugin.queue import QueueConfig
from scheduler_plugin.snapshot import MAX_GANG_PODS, ClusterSnapshot, Gang, PlanResult
from tests.integration.fakekube import hypernode, node, pod

NODES = [f"r{r}-t{t}" for r in range(2) for t in range(4)]
FAST = ServerLimits(
    header_timeout_s=0.5, body_timeout_s=0.5, idle_timeout_s=0.5, write_timeout_s=1.0, max_connections=16
)
DEADLINE_S = 8.0
JSON_HEADERS = {"Content-Type": "application/json"}


def make_state(pods: list[dict[str, Any]] = ()) -> ExtenderState:  # type: ignore[assignment]
    s = ExtenderState(queue=QueueConfig(reservation_ttl_s=60.0, barrier_timeout_s=5.0))
    s.cache.replace("nodes", [node(n, 4) for n in NODES])
    s.cache.replace(
        "hypernodes",
        [hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t{t}" for t in range(4)]) for r in range(2)],
    )
    s.cache.replace("pods", pods)
    return s


def gang_pod(name: str, rank: int, *, gang: str = "g", size: int = 4, **extra: str) -> dict[str, Any]:
    ann = {
        "gpuagent.dev/gang": gang,
        "gpuagent.dev/gang-size": str(size),
        "gpuagent.dev/subgroup-size": str(size),
        "gpuagent.dev/subgroup-tier": "nvlink",
        "gpuagent.dev/rank": str(rank),
        **extra,
    }
    return pod(name, 4, annotations=ann)


class Recorder:
    def __init__(self) -> None:
        self.bound: list[tuple[str, str]] = []
        self.events: list[tuple[str, str, str]] = []

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        self.bound.append((f"{namespace}/{name}", node))

    def event(self, pod: Mapping[str, Any], *, reason: str, message: str, warning: bool) -> None:
        self.events.append((pod["metadata"]["name"], reason, message))


class Served:
    def __init__(self, server: ExtenderServer, state: ExtenderState, cluster: Recorder) -> None:
        self.server = server
        self.state = state
        self.cluster = cluster

    @property
    def port(self) -> int:
        return self.server.port

    async def call(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] = JSON_HEADERS,
    ) -> tuple[int, Any]:
        return await request(self.port, method, path, body, headers)

    async def post(self, verb: str, args: Any) -> tuple[int, Any]:
        return await self.call("POST", f"/{verb}", json.dumps(args).encode())


async def request(
    port: int, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] = JSON_HEADERS
) -> tuple[int, Any]:
    """One request on a fresh connection (``Connection: close``): (status, decoded JSON body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    _, _, payload = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(payload) if payload else None


@asynccontextmanager
async def serving(
    state: ExtenderState | None = None, *, limits: ServerLimits = FAST, max_body: int = 1 << 20
) -> AsyncIterator[Served]:
    state = state or make_state()
    cluster = Recorder()
    ext = Extender(state=state, cluster=cluster, unknown_pod_grace_s=0.0)
    server = ExtenderServer(ext, max_body_bytes=max_body, limits=limits)
    await server.start("127.0.0.1", 0)
    try:
        yield Served(server, state, cluster)
    finally:
        await server.stop(grace_s=1.0)


def run(test: Callable[[Served], Awaitable[None]], state: ExtenderState | None = None, **kwargs: Any) -> None:
    async def main() -> None:
        async with serving(state, **kwargs) as srv:
            await test(srv)
            await still_serving(srv)

    asyncio.run(asyncio.wait_for(main(), DEADLINE_S))


async def still_serving(srv: Served) -> None:
    t = time.monotonic()
    status, body = await srv.call("GET", "/healthz", headers={})
    assert (status, body) == (200, {"status": "ok"})
    assert time.monotonic() - t < 1.0


# -- E1: JSON that would crash the parser -----------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"[" * 100_000 + b"]" * 100_000, id="arrays-100000-deep"),
        pytest.param(b'{"Pod":' * 5_000 + b"1" + b"}" * 5_000, id="objects-5000-deep"),
        pytest.param(b"[" * 100_000, id="unclosed-100000-deep"),
        pytest.param(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), id="one-over-the-limit"),
    ],
)
def test_deeply_nested_json_is_refused_naming_the_limit(body: bytes) -> None:
    async def test(srv: Served) -> None:
        for verb in ("filter", "prioritize", "bind"):
            status, out = await srv.call("POST", f"/{verb}", body)
            assert status == 400, out
            assert "nested" in out["Error"]
            assert f"limit of {MAX_JSON_DEPTH}" in out["Error"]

    run(test)


@pytest.mark.parametrize(
    ("literal", "needle"),
    [
        pytest.param(b"1" * 5_000, f"limit of {MAX_NUMBER_CHARS}", id="int-5000-digits"),
        pytest.param(b"-" + b"9" * 4_301, f"limit of {MAX_NUMBER_CHARS}", id="int-over-python-int-limit"),
        pytest.param(b"0." + b"1" * 5_000, f"limit of {MAX_NUMBER_CHARS}", id="float-5000-digits"),
        pytest.param(b"1e999999", "", id="float-overflow-is-just-inf"),
        pytest.param(b"NaN", "NaN is not JSON", id="nan"),
    ],
)
def test_huge_numbers_are_refused_naming_the_limit(literal: bytes, needle: str) -> None:
    async def test(srv: Served) -> None:
        body = b'{"Pod": {"metadata": {"name": "x"}, "n": ' + literal + b'}, "NodeNames": []}'
        status, out = await srv.call("POST", "/filter", body)
        if needle:
            assert status == 400, out
            assert needle in out["Error"]
        else:
            assert status == 200  # decodes; the pod is simply unknown

    run(test)


def test_brackets_and_quotes_inside_strings_do_not_count_as_nesting() -> None:
    inside = json.dumps({"a": "[" * 1000 + '\\"{{{' + "]" * 5, "b": [[["x"]]]}).encode()
    assert json_depth(inside) == 4
    assert json_depth(b"[]") == 1
    assert json_depth(b'"[[["') == 0


# -- bodies, lengths and content types --------------------------------------------------------------


def test_huge_bodies_are_refused_before_they_are_read() -> None:
    async def test(srv: Served) -> None:
        for length, status in ((10**12, 413), (2 << 20, 413), (10**40, 400)):
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
            head = f"POST /filter HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n"
            writer.write(head.encode() + b"\r\n")
            await writer.drain()
            raw = await asyncio.wait_for(reader.read(), 2)
            writer.close()
            assert raw.startswith(f"HTTP/1.1 {status}".encode()), raw[:80]
            assert b"Connection: close" in raw

    run(test, max_body=1 << 20)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        pytest.param({}, 415, id="none"),
        pytest.param({"Content-Type": "text/plain"}, 415, id="text-plain"),
        pytest.param({"Content-Type": "application/x-www-form-urlencoded"}, 415, id="form"),
        pytest.param({"Content-Type": "multipart/form-data; boundary=x"}, 415, id="multipart"),
        pytest.param({"Content-Type": "application/json; charset=utf-8"}, 200, id="json-charset"),
        pytest.param({"Content-Type": "Application/JSON"}, 200, id="json-case"),
    ],
)
def test_only_json_bodies_are_accepted(headers: dict[str, str], status: int) -> None:
    async def test(srv: Served) -> None:
        body = json.dumps({"Pod": pod("x", 1), "NodeNames": NODES}).encode()
        got, out = await srv.call("POST", "/filter", body, headers)
        assert got == status, out
        if status == 415:
            assert "application/json" in out["Error"]

    run(test)


# -- forged pods ---------------------------------------------------------------------------------------


def test_forged_gang_pods_reserve_nothing_and_a_real_pod_still_fits() -> None:
    # four forged pods of a gang that would take every GPU of both racks
    forged = [gang_pod(f"f{i}", i, gang="grab", size=8) for i in range(4)]
    real = pod("real", 4)

    async def test(srv: Served) -> None:
        for p in forged:
            status, out = await srv.post("filter", {"Pod": p, "NodeNames": NODES})
            assert status == 200
            assert out["NodeNames"] == []
            assert set(out["FailedAndUnresolvableNodes"]) == set(NODES)
            assert "not known to the extender's informer" in out["FailedAndUnresolvableNodes"]["r0-t0"]
        assert srv.state.holds.started == {}
        assert srv.cluster.events == []  # no API writes for a forged pod
        status, out = await srv.post("filter", {"Pod": real, "NodeNames": NODES})
        assert set(out["NodeNames"]) == set(NODES)

    run(test, make_state([real]))


def test_many_forged_filters_leave_no_state_behind() -> None:
    async def test(srv: Served) -> None:
        before = (dict(srv.state.cache.pods), len(srv.state.outbox.last_event), len(srv.state.holds.filtered))
        ext = srv.server.extender
        for i in range(3_000):  # each a new pod name, half of them gangs
            p = gang_pod(f"forged-{i}", 0, gang=f"g{i}") if i % 2 else pod(f"forged-{i}", 1)
            status, out = await ext.dispatch(
                "POST", "/filter", json.dumps({"Pod": p, "NodeNames": NODES}).encode()
            )
            assert status == 200
            assert out["NodeNames"] == []
        assert srv.state.holds.started == {}
        assert (
            dict(srv.state.cache.pods),
            len(srv.state.outbox.last_event),
            len(srv.state.holds.filtered),
        ) == before

    run(test, make_state([pod("real", 1)]))


def test_a_forged_copy_of_a_real_pod_is_decided_on_the_informers_copy() -> None:
    real = pod("solo", 4)
    forged = gang_pod("solo", 0, gang="grab", size=8)  # same name, claims to lead a gang of 8

    async def test(srv: Served) -> None:
        _, out = await srv.post("filter", {"Pod": forged, "NodeNames": NODES})
        assert set(out["NodeNames"]) == set(NODES)  # the real pod on its own fits everywhere
        assert srv.state.holds.started == {}
        other_uid = {**real, "metadata": {**real["metadata"], "uid": "forged-uid"}}
        _, out = await srv.post("filter", {"Pod": other_uid, "NodeNames": NODES})
        assert out["NodeNames"] == []
        assert "uid" in out["FailedAndUnresolvableNodes"]["r0-t0"]

    run(test, make_state([real]))


def test_pods_of_another_scheduler_get_no_decision() -> None:
    theirs = pod("theirs", 1, namespace="kube-system")
    theirs["spec"]["schedulerName"] = "default-scheduler"

    async def test(srv: Served) -> None:
        _, out = await srv.post("filter", {"Pod": theirs, "NodeNames": NODES})
        assert out["NodeNames"] == []
        assert "'default-scheduler'" in out["FailedAndUnresolvableNodes"]["r0-t0"]
        assert srv.state.holds.filtered == {}

    run(test, make_state([theirs]))


# -- bind: only our pods, only after our filter, only to real nodes -------------------------------------


def _other_scheduler(p: dict[str, Any]) -> dict[str, Any]:
    p["spec"]["schedulerName"] = "default-scheduler"
    return p


def _bound(p: dict[str, Any]) -> dict[str, Any]:
    p["spec"]["nodeName"] = "r0-t1"
    p["status"] = {"phase": "Running"}
    return p


@pytest.mark.parametrize(
    ("pods", "args", "needle"),
    [
        pytest.param(
            [_other_scheduler(pod("coredns", 0, namespace="kube-system"))],
            {"PodName": "coredns", "PodNamespace": "kube-system", "Node": "r0-t0"},
            "names scheduler 'default-scheduler'",
            id="default-scheduler-pod-in-kube-system",
        ),
        pytest.param(
            [],
            {"PodName": "ghost", "PodNamespace": "default", "Node": "r0-t0"},
            "not known to the extender's informer",
            id="pod-that-does-not-exist",
        ),
        pytest.param(
            [pod("solo", 1)],
            {"PodName": "solo", "PodNamespace": "default", "Node": "nowhere"},
            "node nowhere is not known",
            id="node-that-does-not-exist",
        ),
        pytest.param(
            [pod("solo", 1)],
            {"PodName": "solo", "PodNamespace": "default", "Node": "r0-t0"},
            "was not passed by this extender's filter",
            id="never-filtered",
        ),
        pytest.param(
            [pod("solo", 1)],
            {"PodName": "solo", "PodNamespace": "default", "PodUID": "forged", "Node": "r0-t0"},
            "has uid uid-default-solo, not forged",
            id="wrong-uid",
        ),
        pytest.param(
            [_bound(pod("solo", 1))],
            {"PodName": "solo", "PodNamespace": "default", "Node": "r0-t0"},
            "already bound to r0-t1",
            id="already-bound",
        ),
        pytest.param(
            [gang_pod("w0", 0)],
            {"PodName": "w0", "PodNamespace": "default", "Node": "r0-t0"},
            "has no reservation",
            id="gang-pod-never-filtered",
        ),
    ],
)
def test_bind_refuses_what_it_did_not_decide(
    pods: list[dict[str, Any]], args: dict[str, str], needle: str
) -> None:
    async def test(srv: Served) -> None:
        status, out = await srv.post("bind", args)
        assert status == 200
        assert needle in out["Error"], out
        assert srv.cluster.bound == []

    run(test, make_state(pods))


def test_bind_after_filter_binds_and_only_once() -> None:
    p = pod("solo", 4)

    async def test(srv: Served) -> None:
        _, out = await srv.post("filter", {"Pod": p, "NodeNames": ["r0-t0"]})
        assert out["NodeNames"] == ["r0-t0"]
        args = {"PodName": "solo", "PodNamespace": "default", "PodUID": "uid-default-solo", "Node": "r0-t0"}
        assert (await srv.post("bind", args))[1] == {"Error": ""}
        again = (await srv.post("bind", args))[1]["Error"]
        assert "already bound" in again or "not passed" in again
        assert srv.cluster.bound == [("default/solo", "r0-t0")]

    run(test, make_state([p]))


# -- E2: a gang of a billion pods -----------------------------------------------------------------------


@pytest.fixture
def bounded_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    """A regression reaches the planner with the huge gang: fail fast there instead of eating memory."""
    real_plan = inputs_module.plan

    def guarded(snapshot: ClusterSnapshot, gang: Gang, **kwargs: Any) -> PlanResult:
        assert sum(r.pods for r in gang.roles) <= MAX_GANG_PODS, "an unbounded gang reached the planner"
        return real_plan(snapshot, gang, **kwargs)

    monkeypatch.setattr(inputs_module, "plan", guarded)
    monkeypatch.setattr(filter_module, "plan", guarded)


@pytest.mark.usefixtures("bounded_planner")
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        pytest.param(
            {"gpuagent.dev/gang-size": "1000000000", "gpuagent.dev/subgroup-size": "1"},
            "gpuagent.dev/gang-size: 1000000000 is over the limit",
            id="gang-size",
        ),
        pytest.param(
            {"gpuagent.dev/gang-size": "9" * 5000}, "gpuagent.dev/gang-size: 999999999999...", id="digits"
        ),
        pytest.param(
            {"gpuagent.dev/subgroup-size": "1000000000"}, "gpuagent.dev/subgroup-size", id="subgroup"
        ),
        pytest.param({"gpuagent.dev/rank": "7" * 5000}, "gpuagent.dev/rank: rank 777777777777", id="rank"),
    ],
)
def test_a_billion_pod_gang_is_an_invalid_gang_naming_the_annotation_and_limit(
    extra: dict[str, str], needle: str
) -> None:
    p = gang_pod("huge", 0, gang="huge", **extra)

    async def test(srv: Served) -> None:
        t = time.monotonic()
        status, out = await srv.post("filter", {"Pod": p, "NodeNames": NODES})
        assert time.monotonic() - t < 1.0
        assert status == 200
        msg = out["FailedAndUnresolvableNodes"]["r0-t0"]
        assert needle in msg
        assert f"limit of {MAX_GANG_PODS} pods per gang" in msg
        assert srv.state.holds.started == {}
        await asyncio.sleep(0.05)
        assert [r for _, r, _ in srv.cluster.events] == ["InvalidGang"]

    run(test, make_state([p]))


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        pytest.param(
            {"minMember": 1_000_000_000}, "spec.minMember: 1000000000 is over the limit", id="min-member"
        ),
        pytest.param(
            {"subGroupPolicy": [{"name": "w", "subGroupSize": 1_000_000_000}]},
            "subGroupPolicy[0].subGroupSize: 1000000000 is over the limit",
            id="subgroup-size",
        ),
        pytest.param(
            {"subGroupPolicy": [{"name": "w", "subGroupSize": 5_000, "matchLabelKeys": ["i"]}]},
            "3 subgroup(s) x 5000 = 15000 pods is over the limit",
            id="instances-times-size",
        ),
    ],
)
def test_podgroup_sizes_over_the_limit_are_refused(spec: dict[str, Any], needle: str) -> None:
    pg = {"metadata": {"name": "pg", "namespace": "default"}, "spec": spec}
    pods = [
        pod(f"p{i}", 1, annotations={"scheduling.k8s.io/group-name": "pg"}, labels={"i": str(i)})
        for i in range(3)
    ]
    with pytest.raises(GangError) as err:
        gang_from_podgroup(pg, pods, ("nvlink",))
    assert needle in str(err.value)
    assert f"limit of {MAX_GANG_PODS} pods per gang" in str(err.value)


def test_planning_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    real_plan = inputs_module.plan

    def slow(snapshot: ClusterSnapshot, gang: Gang, **kwargs: Any) -> PlanResult:
        time.sleep(1.5)  # a long plan: the loop must keep answering meanwhile
        return real_plan(snapshot, gang, **kwargs)

    monkeypatch.setattr(inputs_module, "plan", slow)
    monkeypatch.setattr(filter_module, "plan", slow)
    pods = [gang_pod(f"w{i}", i) for i in range(4)]

    async def test(srv: Served) -> None:
        filtering = asyncio.create_task(srv.post("filter", {"Pod": pods[0], "NodeNames": NODES}))
        await asyncio.sleep(0.2)
        # calls that need the state lock the plan holds wait in a worker thread, not on the loop
        scoring = asyncio.create_task(srv.post("prioritize", {"Pod": pods[1], "NodeNames": NODES}))
        binding = asyncio.create_task(
            srv.post("bind", {"PodName": "w1", "PodNamespace": "default", "Node": "nowhere"})
        )
        for _ in range(3):
            t = time.monotonic()
            assert (await srv.call("GET", "/healthz", headers={}))[0] == 200
            assert time.monotonic() - t < 0.3
        assert not filtering.done()
        assert not scoring.done()
        _, out = await filtering
        assert len(out["NodeNames"]) == 1
        assert (await scoring)[0] == 200
        assert "node nowhere is not known" in (await binding)[1]["Error"]

    run(test, make_state(pods))


# -- E3: connections that say nothing -------------------------------------------------------------------


@pytest.fixture
def open_files() -> Iterator[int]:
    """Room for a thousand client sockets (raises the soft limit toward the hard one for the test)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1000 + 256
    if soft < wanted and (hard == resource.RLIM_INFINITY or hard > soft):
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard)
        )
    try:
        yield min(1000, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 256)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_thousand_idle_connections_do_not_lock_kube_scheduler_out(open_files: int) -> None:
    p = pod("real", 1)

    async def test(srv: Served) -> None:
        idle = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(open_files)]
        try:
            await asyncio.sleep(0.05)
            assert srv.server.connections <= FAST.max_connections
            t = time.monotonic()
            status, out = await srv.post("filter", {"Pod": p, "NodeNames": NODES})
            assert status == 200
            assert set(out["NodeNames"]) == set(NODES)
            assert time.monotonic() - t < 1.0
            assert srv.server.stats.evicted >= open_files - FAST.max_connections
        finally:
            for _, w in idle:
                w.close()

    run(test, make_state([p]), limits=dataclasses.replace(FAST, header_timeout_s=30.0))


def test_silent_idle_slow_and_stalled_connections_are_closed_in_time() -> None:
    async def test(srv: Served) -> None:
        # silent from the start, and idle after one keep-alive request: closed after the timeout
        r1, w1 = await asyncio.open_connection("127.0.0.1", srv.port)
        r2, w2 = await asyncio.open_connection("127.0.0.1", srv.port)
        w2.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        # a head that never ends, and a body that stalls: 408 after the timeout
        r3, w3 = await asyncio.open_connection("127.0.0.1", srv.port)
        w3.write(b"POST /filter HTTP/1.1\r\nContent-Type: application/json\r\n")
        r4, w4 = await asyncio.open_connection("127.0.0.1", srv.port)
        w4.write(b"POST /filter HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        t = time.monotonic()
        silent = await asyncio.wait_for(r1.read(), 3)
        kept = await asyncio.wait_for(r2.read(), 3)
        slow = await asyncio.wait_for(r3.read(), 3)
        stalled = await asyncio.wait_for(r4.read(), 3)
        assert time.monotonic() - t < 2.5
        assert silent == b""
        assert kept.startswith(b"HTTP/1.1 200")
        assert kept.count(b"HTTP/1.1") == 1
        assert slow.startswith(b"HTTP/1.1 408")
        assert b"headers" in slow
        assert stalled.startswith(b"HTTP/1.1 408")
        assert b"body" in stalled
        for w in (w1, w2, w3, w4):
            w.close()
        assert srv.server.stats.timeouts.keys() >= {"header", "idle", "body"}

    run(test)


def test_binds_waiting_at_the_barrier_are_never_evicted() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(4)]
    limits = dataclasses.replace(FAST, max_connections=6, header_timeout_s=30.0)

    async def test(srv: Served) -> None:
        nodes = {}
        for p in pods:
            _, out = await srv.post("filter", {"Pod": p, "NodeNames": NODES})
            nodes[p["metadata"]["name"]] = out["NodeNames"][0]

        def args(name: str) -> dict[str, str]:
            return {
                "PodName": name,
                "PodNamespace": "default",
                "PodUID": f"uid-default-{name}",
                "Node": nodes[name],
            }

        waiting = [asyncio.create_task(srv.post("bind", args(f"w{i}"))) for i in range(3)]
        await asyncio.sleep(0.3)
        idle = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(20)]
        try:
            await asyncio.sleep(0.05)
            last = await srv.post("bind", args("w3"))
            results = [(await t)[1] for t in waiting] + [last[1]]
        finally:
            for _, w in idle:
                w.close()
        assert results == [{"Error": ""}] * 4
        assert len(srv.cluster.bound) == 4

    run(test, make_state(pods), limits=limits)


# -- the API server's answers to a binding: the extender's own client trusts them no more -------------


@pytest.mark.parametrize(
    ("answer", "needle"),
    [
        pytest.param(b"\x00\xff\xfe not http\r\n\r\n", "bad status line", id="garbage"),
        pytest.param(
            b"HTTP/1.1 201 Created\r\nContent-Length: 99999999999\r\n\r\n", "over 1048576", id="huge-length"
        ),
        pytest.param(
            b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 100_000,
            "chunk line or trailer",
            id="endless-chunk-size",
        ),
        pytest.param(
            b"HTTP/1.1 201 Created\r\nContent-Length: 10\r\n\r\n{", "no answer within", id="stalled"
        ),
        pytest.param(b"", "no answer within", id="silent"),
    ],
)
def test_a_hostile_answer_to_a_binding_is_that_pods_error_and_the_loop_keeps_serving(
    answer: bytes, needle: str
) -> None:
    from agent.commands.extender import KubeCluster
    from topology.kube import Kube
    from topology.kube.aio import AsyncKube

    p = pod("solo", 4)

    over = asyncio.Event()

    async def api(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
            await over.wait()  # then hold the connection open
        finally:
            writer.close()

    async def main() -> None:
        hostile = await asyncio.start_server(api, "127.0.0.1", 0)
        aio = AsyncKube(
            "127.0.0.1", hostile.sockets[0].getsockname()[1], tls=None, timeout_s=0.5, max_body_bytes=1 << 20
        )
        cluster = KubeCluster(Kube(None), aio)  # the sync client is never used here
        ext = Extender(state=make_state([p]), cluster=cluster, unknown_pod_grace_s=0.0)
        server = ExtenderServer(ext, max_body_bytes=1 << 20, limits=FAST)
        await server.start("127.0.0.1", 0)
        srv = Served(server, ext.state, Recorder())
        try:
            _, out = await srv.post("filter", {"Pod": p, "NodeNames": ["r0-t0"]})
            assert out["NodeNames"] == ["r0-t0"]
            args = {
                "PodName": "solo",
                "PodNamespace": "default",
                "PodUID": "uid-default-solo",
                "Node": "r0-t0",
            }
            bind = asyncio.ensure_future(srv.post("bind", args))
            await still_serving(srv)  # while the binding waits on the hostile server
            status, out = await bind
            assert status == 200
            assert "binding default/solo to r0-t0 failed" in out["Error"]
            assert needle in out["Error"]
            await still_serving(srv)
        finally:
            await server.stop(grace_s=1.0)
            await aio.aclose()
            over.set()
            hostile.close()
            await asyncio.sleep(0.05)  # the API's connections close

    asyncio.run(asyncio.wait_for(main(), DEADLINE_S))


def _refusal(status: int, message: str) -> bytes:
    body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status}).encode()
    return b"HTTP/1.1 %d Conflict\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


_CREATED = b'HTTP/1.1 201 Created\r\nContent-Length: 17\r\n\r\n{"kind":"Status"}'
_ASSIGNED = 'Operation cannot be fulfilled on pods/binding "solo": pod solo is already assigned to node "{}"'


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        pytest.param(b"HTTP/1.1 100 Continue\r\n\r\n" + _CREATED, "", id="continue-then-created"),
        pytest.param(
            b"HTTP/1.1 100 Continue\r\n\r\n" + _refusal(409, _ASSIGNED.format("r1-t0")),
            'already assigned to node "r1-t0"',
            id="continue-then-refused",
        ),
        pytest.param(_refusal(409, _ASSIGNED.format("r0-t0")), "", id="already-on-that-node"),
        pytest.param(
            _refusal(409, _ASSIGNED.format("r1-t0")), 'already assigned to node "r1-t0"', id="on-another-node"
        ),
        pytest.param(b"", "not sent again", id="closed-after-the-post"),
    ],
)
def test_the_api_servers_answer_to_a_binding_decides_and_a_written_binding_is_never_sent_twice(
    answer: bytes, error: str
) -> None:
    """Issue 26 items 14 and 16: an interim ``100 Continue`` is not the answer (the final one decides);
    a binding refused because the pod is already on that node is bound; a connection that ends after
    the binding was written is that pod's error, the binding never sent again (it may have been done)."""
    from agent.commands.extender import KubeCluster
    from topology.kube import Kube
    from topology.kube.aio import AsyncKube

    p = pod("solo", 4)
    posts: list[bytes] = []

    async def api(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET /version "):  # the connection is kept alive for the binding
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                    continue
                posts.append(head)
                if not answer:
                    return  # read, then closed without a word
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> dict[str, Any]:
        hostile = await asyncio.start_server(api, "127.0.0.1", 0)
        aio = AsyncKube("127.0.0.1", hostile.sockets[0].getsockname()[1], tls=None, timeout_s=2.0)
        cluster = KubeCluster(Kube(None), aio)  # the sync client is never used here
        ext = Extender(state=make_state([p]), cluster=cluster, unknown_pod_grace_s=0.0)
        server = ExtenderServer(ext, max_body_bytes=1 << 20, limits=FAST)
        await server.start("127.0.0.1", 0)
        srv = Served(server, ext.state, Recorder())
        try:
            _, out = await srv.post("filter", {"Pod": p, "NodeNames": ["r0-t0"]})
            assert out["NodeNames"] == ["r0-t0"]
            await aio.request("GET", "/version")  # the binding goes on a kept-alive connection
            args = {
                "PodName": "solo",
                "PodNamespace": "default",
                "PodUID": "uid-default-solo",
                "Node": "r0-t0",
            }
            status, out = await srv.post("bind", args)
            assert status == 200
            assert aio.opened == 1
            await still_serving(srv)
            return dict(out)
        finally:
            await server.stop(grace_s=1.0)
            await aio.aclose()
            hostile.close()

    out = asyncio.run(asyncio.wait_for(main(), DEADLINE_S))
    if error:
        assert "binding default/solo to r0-t0 failed" in out["Error"]
        assert error in out["Error"]
    else:
        assert out["Error"] == ""
    assert len(posts) == 1


@pytest.mark.parametrize(
    ("path", "value"),
    [
        pytest.param(("spec", "containers"), "not-a-list", id="containers-a-string"),
        pytest.param(("spec", "containers"), [1, None, "c"], id="containers-not-objects"),
        pytest.param(("spec", "initContainers"), {"a": 1}, id="init-containers-a-map"),
        pytest.param(("spec", "nodeSelector"), ["pool"], id="node-selector-a-list"),
        pytest.param(("metadata", "annotations"), None, id="annotations-null"),
        pytest.param(("metadata", "ownerReferences"), "me", id="owners-a-string"),
        pytest.param(("status", "startTime"), 12, id="start-time-a-number"),
        pytest.param(("spec", "priority"), "high", id="priority-a-string"),
    ],
)
def test_malformed_pod_fields_are_kept_as_they_came_and_cost_no_other_pod_its_answer(
    path: tuple[str, str], value: Any
) -> None:
    """The cache projects every pod it is sent (issue 28): a field of the wrong shape is kept as it came,
    judged where it is read, and never stops the informer feed, a pass, or another pod's filter."""
    bad = pod("bad", 1, node_name="r0-t0")
    bad[path[0]][path[1]] = value
    gang = [gang_pod(f"g-{i}", i) for i in range(4)]
    s = make_state([bad, *gang])
    s.cache.apply("pods", "MODIFIED", bad)
    s.queue.tick(1_800_000_000.0)
    good = pod("good", 1)
    s.cache.apply("pods", "ADDED", good)
    out = s.filter(good, NODES, 1_800_000_000.0)
    assert out.passed, out.failed
    answered = s.filter(s.cache.pods["default/bad"], NODES, 1_800_000_000.0)
    assert answered.passed or answered.failed or answered.unresolvable
    s.cache.apply("pods", "DELETED", bad)
    assert "default/bad" not in s.cache.pods
