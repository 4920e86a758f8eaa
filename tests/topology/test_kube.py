"""The Kubernetes adapter against Kubernetes faked at the HTTP level (tests/topology/kubefake.py):
the informer (list, watch, relist after 410 Gone, a missing CRD, a prompt stop) and the Event writer."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.topology.kubefake import FakeKube, api_client
from topology.kube import (
    HYPERNODES,
    NODES,
    EventRecorder,
    Informer,
    Kube,
    KubeError,
    ObjectRef,
    Store,
    configmaps,
    events,
)
from topology.kube.client import Dechunker


def wait_for(check: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


@pytest.fixture(params=["close-delimited", "chunked"])
def fake(request: pytest.FixtureRequest) -> Iterator[tuple[FakeKube, Kube]]:
    """Watches ended by closing, and in chunked coding as the API server sends them."""
    f = FakeKube(chunked=request.param == "chunked")
    with f.serve() as url:
        yield f, Kube(api_client(url))


@pytest.fixture
def informers() -> Iterator[list[Informer]]:
    started: list[Informer] = []
    yield started
    for informer in started:
        informer.stop(5.0)


def test_informer_lists_then_follows_changes(fake: tuple[FakeKube, Kube], informers: list[Informer]) -> None:
    f, kube = fake
    f.put(NODES, node("a"))
    changes: list[int] = []
    store = Store(lambda: changes.append(1))
    informer = Informer(kube, NODES, store, watch_timeout_s=1)
    informers.append(informer)
    informer.start()
    assert informer.synced.wait(5)
    wait_for(lambda: set(store.snapshot()) == {"a"}, "the listed node")
    f.put(NODES, node("b"))
    f.put(NODES, node("a", team="ml"))
    f.remove(NODES, "b")
    wait_for(lambda: (store.get("a") or {})["metadata"]["labels"] == {"team": "ml"}, "the change")
    wait_for(lambda: set(store.snapshot()) == {"a"}, "the deletion")
    time.sleep(1.5)  # the server ends the watch; the informer watches again from where it was
    f.put(NODES, node("c"))
    wait_for(lambda: set(store.snapshot()) == {"a", "c"}, "a change after the re-watch")
    assert len(changes) >= 5
    assert informer.errors == 0


def test_informer_relists_after_410_gone(fake: tuple[FakeKube, Kube], informers: list[Informer]) -> None:
    f, kube = fake
    f.put(NODES, node("a"))
    store = Store()
    informer = Informer(kube, NODES, store, watch_timeout_s=1)
    informers.append(informer)
    informer.start()
    wait_for(lambda: "a" in store.snapshot(), "the first list")
    f.compacted = 10**9  # every resourceVersion the informer knows is now too old
    lists = sum(1 for m, p in f.requests if m == "GET" and p == NODES)
    wait_for(lambda: informer.errors >= 1, "a 410 from the watch")
    f.compacted = 0
    f.put(NODES, node("b"))
    wait_for(lambda: set(store.snapshot()) == {"a", "b"}, "the relist and the watch after it")
    assert sum(1 for m, p in f.requests if m == "GET" and p == NODES) > lists


def test_optional_kind_without_its_crd_is_empty_and_synced(
    fake: tuple[FakeKube, Kube], informers: list[Informer]
) -> None:
    f, kube = fake
    f.missing.add(HYPERNODES)
    store = Store()
    store.remember({"metadata": {"name": "left-over"}})
    informer = Informer(kube, HYPERNODES, store, optional=True, retry_s=0.05, max_retry_s=0.1)
    informers.append(informer)
    informer.start()
    assert informer.synced.wait(5)
    wait_for(lambda: store.snapshot() == {}, "the missing kind counted as empty")
    f.missing.clear()  # the CRD is installed
    f.put(HYPERNODES, {"metadata": {"name": "nvl-0"}})
    wait_for(lambda: set(store.snapshot()) == {"nvl-0"}, "objects once the CRD exists")


def test_a_required_kind_that_fails_is_retried(
    fake: tuple[FakeKube, Kube], informers: list[Informer]
) -> None:
    f, kube = fake
    f.down = True
    seen: list[BaseException] = []
    store = Store()
    informer = Informer(kube, NODES, store, retry_s=0.05, max_retry_s=0.1, on_error=seen.append)
    informers.append(informer)
    informer.start()
    wait_for(lambda: len(seen) >= 2, "errors reported")
    assert not informer.synced.is_set()
    assert all(isinstance(e, KubeError) and e.status == 503 for e in seen)
    f.down = False
    f.put(NODES, node("a"))
    wait_for(lambda: "a" in store.snapshot(), "the list after the outage")


def test_stop_ends_an_open_watch_at_once(fake: tuple[FakeKube, Kube]) -> None:
    f, kube = fake
    f.put(NODES, node("a"))
    informer = Informer(kube, NODES, Store(), watch_timeout_s=60)
    informer.start()
    assert informer.synced.wait(5)
    time.sleep(0.2)  # inside the watch now
    started = time.monotonic()
    informer.stop(5.0)
    assert time.monotonic() - started < 2.0
    assert informer._thread is not None
    assert not informer._thread.is_alive()


def test_namespaced_objects_are_kept_by_namespace_and_name(
    fake: tuple[FakeKube, Kube], informers: list[Informer]
) -> None:
    f, kube = fake
    cm = {"metadata": {"name": "fabric", "namespace": "ns", "labels": {"gpuagent.dev/fabric": "x"}}}
    f.put(configmaps("ns"), cm)
    f.put(configmaps("ns"), {"metadata": {"name": "other", "namespace": "ns"}})
    store = Store()
    informer = Informer(kube, configmaps("ns"), store, label_selector="gpuagent.dev/fabric")
    assert informer.list_once() is not None
    assert set(store.snapshot()) == {"ns/fabric"}


def test_event_recorder_writes_one_event_and_reads_back_the_latest(fake: tuple[FakeKube, Kube]) -> None:
    f, kube = fake
    clock = [1_700_000_000.0]
    recorder = EventRecorder(
        kube, component="gpu-topology-controller", instance="ctl-a", clock=lambda: clock[0]
    )
    n1 = ObjectRef("Node", "n1", uid="u1")
    recorder.record(n1, reason="NvlinkDomainExcluded", message="m1", warning=True)
    clock[0] += 5
    recorder.record(n1, reason="NvlinkDomainRestored", message="back")
    pod = ObjectRef("Pod", "p", namespace="team", uid="u2")
    recorder.record(pod, reason="GangPlanned", message="x" * 2000)
    stored = list(f.items(events("default")).values())
    assert len(stored) == 2
    first = next(e for e in stored if e["reason"] == "NvlinkDomainExcluded")
    assert first["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"}
    assert first["type"] == "Warning"
    assert first["count"] == 1
    assert first["source"] == {"component": "gpu-topology-controller"}
    assert first["reportingInstance"] == "ctl-a"
    assert first["metadata"]["name"].startswith("n1.")
    assert first["firstTimestamp"] == first["lastTimestamp"] == "2023-11-14T22:13:20Z"
    (pod_event,) = f.items(events("team")).values()
    assert pod_event["involvedObject"]["namespace"] == "team"
    assert len(pod_event["message"]) == 1024
    latest = recorder.latest()
    assert (latest["n1"].reason, latest["n1"].message) == ("NvlinkDomainRestored", "back")
    assert latest["n1"].type == "Normal"
    assert EventRecorder(kube, component="someone-else").latest() == {}


def test_watch_events_the_fast_parser_refuses_are_decoded_by_the_standard_one(
    fake: tuple[FakeKube, Kube], informers: list[Informer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone surrogate escape in a string (the API server passes it through) is refused by orjson;
    the standard parser takes the event, nothing is lost and the informer counts no error."""
    import json
    from types import SimpleNamespace

    from topology.kube import client as kube_client

    standard: list[bytes] = []

    def spy(data: bytes) -> Any:
        standard.append(data)
        return json.loads(data)

    monkeypatch.setattr(kube_client, "json", SimpleNamespace(loads=spy))
    f, kube = fake
    store = Store()
    informer = Informer(kube, NODES, store, watch_timeout_s=60)
    informers.append(informer)
    informer.start()
    assert informer.synced.wait(5)
    spec = {"name": "x\ud800y", "weight": 2**63 - 1, "ratio": 0.25, "text": "é ✓"}
    f.put(NODES, {**node("odd", team="ml"), "spec": spec})
    f.put(NODES, node("plain"))
    wait_for(lambda: {"odd", "plain"} <= set(store.snapshot()), "both nodes")
    assert (store.get("odd") or {})["spec"] == spec
    assert informer.errors == 0
    assert len([b for b in standard if b"odd" in b]) == 1  # the one event orjson refused, and only it


def test_a_chunked_watch_is_read_past_the_client_and_a_close_delimited_one_through_it(
    fake: tuple[FakeKube, Kube],
) -> None:
    """The API server's chunked watch is de-chunked from the socket (one read takes every event that
    arrived); any other body goes through the client's reader. Both yield the same events."""
    f, kube = fake
    _, rv = kube.list(NODES)
    f.put(NODES, node("b", team="x" * 3000))
    f.put(NODES, node("c"))
    watch = kube.watch(NODES, rv, timeout_s=1)
    through_client: list[int] = []
    client_read = watch._raw.read1

    def counted(n: int) -> bytes:
        through_client.append(n)
        data: bytes = client_read(n)
        return data

    watch._raw.read1 = counted
    seen = [(kind, obj["metadata"]["name"]) for kind, obj in watch]  # until the server ends it
    assert seen == [("ADDED", "b"), ("ADDED", "c")]
    assert bool(through_client) != f.chunked


def _chunked(payload: bytes, sizes: list[int], *, extension: bool, trailer: bool) -> bytes:
    out, pos = [], 0
    for size in sizes:
        piece = payload[pos : pos + size]
        if not piece:
            break
        pos += len(piece)
        out.append(f"{len(piece):X}{';ext=1' if extension else ''}\r\n".encode() + piece + b"\r\n")
    if pos < len(payload):
        out.append(f"{len(payload) - pos:x}\r\n".encode() + payload[pos:] + b"\r\n")
    out.append(b"0\r\n" + (b"X-Trailer: 1\r\n" if trailer else b"") + b"\r\n")
    return b"".join(out)


@given(
    payload=st.binary(max_size=3000),
    sizes=st.lists(st.integers(1, 700), max_size=12),
    cuts=st.lists(st.integers(0, 4000), max_size=20),
    extension=st.booleans(),
    trailer=st.booleans(),
)
def test_dechunker_gives_the_payload_however_the_stream_is_split(
    payload: bytes, sizes: list[int], cuts: list[int], extension: bool, trailer: bool
) -> None:
    stream = _chunked(payload, sizes, extension=extension, trailer=trailer)
    chunks = Dechunker()
    got, last = [], 0
    for cut in [*sorted(c for c in cuts if c < len(stream)), len(stream)]:
        assert not chunks.done
        got.append(chunks.feed(stream[last:cut]))
        last = cut
    assert chunks.done
    assert b"".join(got) == payload


@pytest.mark.parametrize(
    ("stream", "why"),
    [
        (b"zz\r\nab\r\n", "bad chunk size"),
        (b"-1\r\n", "bad chunk size"),
        (b"\r\n", "bad chunk size"),
        (b"1" * 17 + b"\r\n", "bad chunk size"),
        (b"2\r\nabXY", "not followed by CRLF"),
        (b"5" * 5000, "longer than 4096"),
    ],
)
def test_dechunker_refuses_broken_framing(stream: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Dechunker().feed(stream)


def test_a_watch_whose_connection_ends_inside_the_chunked_stream_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection that ends before the last chunk is a broken watch (the informer reports it and
    lists again), not the server's clean end of the stream."""
    f = FakeKube(chunked=True)
    with f.serve() as url:
        watch = Kube(api_client(url)).watch(NODES, "0", timeout_s=1)
        read, raw = watch._reader()
        assert raw
        monkeypatch.setattr(watch._raw._fp.fp, "read1", lambda n: b"", raising=False)
        with pytest.raises(KubeError, match="ended inside the stream"):
            read(100)
        watch.close()


def test_a_dechunker_says_what_a_chunk_still_owes_and_what_came_past_the_end() -> None:
    d = Dechunker()
    assert d.feed(b"a\r\n0123") == b"0123"
    assert d.pending == 6  # announced before its data arrives: a reader can refuse it at once
    assert d.rest == b""
    assert d.feed(b"456789\r\n0\r\n\r\nHTTP/1.1 200") == b"456789"
    assert d.done
    assert d.pending == 0
    assert d.rest == b"HTTP/1.1 200"
