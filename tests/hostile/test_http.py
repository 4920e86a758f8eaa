"""Hostile HTTP against the agent's listeners (metrics on ``--metrics-addr``, health on ``--health-addr``):
garbage request lines, huge heads, bad ``Content-Length`` (D12), slowloris, idle and stalled connections
that used to hold every slot (D13), pipelined garbage, HTTP/0.9 lines, non-UTF-8 paths, clients that do not
read. Each case checks the clear status it gets and that both listeners keep serving; kubelet-style probes
(a fresh connection, ``GET /healthz``, 1 s timeout) keep passing throughout. Loopback only; each test runs
under a hard deadline of a few seconds, with short listener timeouts injected."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from agent.metrics.server import MAX_BODY_BYTES, HealthServer, MetricsServer, Timeouts
from topology.httpserver import MAX_HEAD_BYTES

FAST = Timeouts(head_s=1.0, body_s=1.0, idle_s=1.5, write_s=1.0)
DEADLINE_S = 8.0
Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class Listeners:
    metrics: MetricsServer
    health: HealthServer

    @property
    def mport(self) -> int:
        return self.metrics.bound_port

    @property
    def hport(self) -> int:
        return self.health.bound_port


@asynccontextmanager
async def listening(
    *, render: Callable[[], bytes] = lambda: b"m 1\n", **kwargs: object
) -> AsyncIterator[Listeners]:
    metrics = MetricsServer(host="127.0.0.1", port=0, render=render, timeouts=FAST, **kwargs)  # type: ignore[arg-type]
    health = HealthServer(host="127.0.0.1", port=0, timeouts=FAST, readiness=(("nvml", lambda: None),))
    await metrics.start()
    await health.start()
    try:
        yield Listeners(metrics, health)
    finally:
        await health.stop()
        await metrics.stop()


def run(test: Callable[[Listeners], Awaitable[None]], **kwargs: object) -> None:
    async def main() -> None:
        async with listening(**kwargs) as ls:  # type: ignore[arg-type]
            await test(ls)
            await still_serving(ls)

    asyncio.run(asyncio.wait_for(main(), DEADLINE_S))


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes] | None:
    """One response, or ``None`` when the server closed the connection instead."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers["content-length"]))
    return int(lines[0].split()[1]), headers, body


async def ask(port: int, raw: bytes, *, timeout: float = 3.0) -> tuple[int, dict[str, str], bytes] | None:
    """Send ``raw`` on a fresh connection; the first response (``None`` if closed without one)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(read_response(reader), timeout)
    finally:
        writer.close()


async def closed_by_server(reader: asyncio.StreamReader, *, within: float, rest: bytes | None = None) -> bool:
    """Whether the server closes the connection within ``within`` s (having sent ``rest`` first, when
    given)."""
    try:
        got = await asyncio.wait_for(reader.read(), within)
    except ConnectionError:
        return rest is None
    except TimeoutError:
        return False
    return rest is None or got == rest


async def probe(port: int, path: str = "/healthz") -> int:
    """What kubelet's httpGet probe does: a fresh connection, one GET, 1 s for the whole answer."""
    raw = (
        f"GET {path} HTTP/1.1\r\nHost: 10.0.0.7:{port}\r\nUser-Agent: kube-probe/1.34\r\n"
        "Accept: */*\r\nConnection: close\r\n\r\n"
    ).encode()
    got = await ask(port, raw, timeout=1.0)
    assert got is not None, f"{path} closed without an answer"
    return got[0]


async def still_serving(ls: Listeners) -> None:
    assert await probe(ls.hport) == 200
    assert await probe(ls.hport, "/readyz") == 200
    assert await probe(ls.mport, "/metrics") == 200


async def until(condition: Callable[[], bool], *, within: float) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"not true within {within} s"
        await asyncio.sleep(0.05)


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


# --- D12: Content-Length that is not ASCII digits --------------------------------------------------


def test_d12_non_ascii_digit_content_length_gets_400_and_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)

    async def check(ls: Listeners) -> None:
        got = await ask(ls.mport, b"GET /metrics HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n")
        assert got is not None
        status, headers, body = got
        assert (status, headers["connection"]) == (400, "close")
        assert body == b"Content-Length must be a number in ASCII digits, got '\\xb2'\n"

    run(check)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings] == ["http_request_rejected"]
    assert warnings[0].gna_fields["status"] == 400  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if r.exc_info], "no traceback"


@pytest.mark.parametrize(
    ("value", "status", "reason"),
    [
        pytest.param("x", 400, "ASCII digits", id="non-digit"),
        pytest.param("-1", 400, "ASCII digits", id="negative"),
        pytest.param("+5", 400, "ASCII digits", id="plus-sign"),
        pytest.param("0x10", 400, "ASCII digits", id="hex"),
        pytest.param("\u0663", 400, "ASCII digits", id="arabic-indic-digit"),  # latin-1 cannot carry it
        pytest.param("9" * 20, 400, "ASCII digits", id="huge-20-digits"),
        pytest.param("9" * 5000, 400, "ASCII digits", id="beyond-int-str-digits-limit"),
        pytest.param(str(MAX_BODY_BYTES + 1), 413, "larger than", id="over-body-limit"),
        pytest.param("1, 2", 400, "conflicting", id="conflicting-list"),
    ],
)
def test_bad_content_length_gets_a_clear_status(value: str, status: int, reason: str) -> None:
    raw = b"GET /metrics HTTP/1.1\r\nContent-Length: " + value.encode("utf-8") + b"\r\n\r\n"

    async def check(ls: Listeners) -> None:
        got = await ask(ls.mport, raw)
        assert got is not None
        assert got[0] == status
        assert reason in got[2].decode()

    run(check)


def test_two_different_content_length_headers_and_transfer_encoding_are_refused() -> None:
    async def check(ls: Listeners) -> None:
        got = await ask(ls.mport, b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy")
        assert got is not None
        assert got[0] == 400
        got = await ask(ls.mport, b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        assert got is not None
        assert got[0] == 501

    run(check)


def test_a_small_body_is_read_and_the_connection_kept() -> None:
    async def check(ls: Listeners) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", ls.mport)
        writer.write(b"GET /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc" + get("/healthz"))
        first, second = await read_response(reader), await read_response(reader)
        assert first is not None
        assert second is not None
        assert (first[0], first[2], second[0]) == (200, b"m 1\n", 200)
        writer.close()

    run(check)


# --- garbage, HTTP/0.9, huge heads, non-UTF-8 paths -------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        pytest.param(b"\x00\x01\x02\x03\r\n\r\n", 400, id="binary"),
        pytest.param(bytes(range(32, 256)) * 8 + b"\r\n\r\n", 400, id="high-bytes"),
        pytest.param(b"GET\r\n\r\n", 400, id="method-only"),
        pytest.param(b"GET /metrics\r\n\r\n", 400, id="http-0.9-line"),
        pytest.param(b"GET /metrics HTTP/0.9\r\n\r\n", 505, id="http-0.9-version"),
        pytest.param(b"GET /metrics HTTP/2.0\r\n\r\n", 505, id="http-2-version"),
        pytest.param(b"GET /metrics HTTPS/1.1\r\n\r\n", 400, id="not-http"),
        pytest.param(b"get /metrics HTTP/1.1\r\n\r\n", 400, id="lower-case-method"),
        pytest.param(b"GET  /metrics HTTP/1.1\r\n\r\n", 400, id="two-spaces"),
        pytest.param(b"GET /metrics HTTP/1.1 extra\r\n\r\n", 400, id="four-parts"),
        pytest.param(b"GET metrics HTTP/1.1\r\n\r\n", 400, id="no-leading-slash"),
        pytest.param(b"GET http://x/metrics HTTP/1.1\r\n\r\n", 400, id="absolute-form"),
        pytest.param(b"GET /\xff\xfe HTTP/1.1\r\n\r\n", 400, id="non-utf8-path"),
        pytest.param("GET /m\u00e9trics HTTP/1.1\r\n\r\n".encode(), 400, id="utf8-path-unencoded"),
        pytest.param(b"GET /metrics%FF HTTP/1.1\r\n\r\n", 404, id="percent-encoded-non-utf8"),
        pytest.param(b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400, id="header-without-colon"),
        pytest.param(b"GET /metrics HTTP/1.1\r\nBad Name: x\r\n\r\n", 400, id="space-in-header-name"),
        pytest.param(b"GET /metrics HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400, id="folded-header"),
        pytest.param(b"GET /metrics HTTP/1.1\r\nA: b\x00c\r\n\r\n", 400, id="nul-in-value"),
        pytest.param(b"DELETE /metrics HTTP/1.1\r\n\r\n", 405, id="other-method"),
        pytest.param(b"\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n", 200, id="leading-empty-lines-allowed"),
    ],
)
def test_garbage_gets_a_clear_status_on_both_listeners(raw: bytes, status: int) -> None:
    async def check(ls: Listeners) -> None:
        for port in (ls.mport, ls.hport):
            got = await ask(port, raw)
            assert got is not None, "closed without an answer"
            assert got[0] == status, got
            if status >= 400 and status not in (404, 405):  # a malformed request ends the connection
                assert got[1]["connection"] == "close"
                assert got[2].strip(), "a reason in the body"

    run(check)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(
            b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n", id="one-huge"
        ),
        pytest.param(
            b"GET /metrics HTTP/1.1\r\n" + b"X-Many: 0123456789\r\n" * 2000 + b"\r\n", id="many-headers"
        ),
        pytest.param(b"GET /" + b"a" * (MAX_HEAD_BYTES * 2), id="endless-request-line"),
    ],
)
def test_huge_heads_get_431(raw: bytes) -> None:
    async def check(ls: Listeners) -> None:
        got = await ask(ls.mport, raw)
        assert got is not None
        assert got[0] == 431
        assert str(MAX_HEAD_BYTES) in got[2].decode()

    run(check)


def test_a_flood_of_garbage_logs_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    async def check(ls: Listeners) -> None:
        answers = await asyncio.gather(*(ask(ls.mport, b"\x16\x03\x01 garbage\r\n\r\n") for _ in range(50)))
        assert {a[0] for a in answers if a is not None} == {400}

    run(check)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings] == ["http_request_rejected"]
    assert not [r for r in caplog.records if r.exc_info]


# --- pipelining ---------------------------------------------------------------------------------------


def test_pipelined_requests_are_answered_in_order_and_garbage_ends_the_connection() -> None:
    async def check(ls: Listeners) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", ls.mport)
        writer.write(get("/healthz") + get("/metrics") + b"GARBAGE\r\n\r\n" + get("/healthz"))
        answers = [await asyncio.wait_for(read_response(reader), 3) for _ in range(3)]
        assert [a[0] if a else None for a in answers] == [200, 200, 400]
        assert await closed_by_server(reader, within=3, rest=b"")  # the request after the garbage: unread
        writer.close()

    run(check)


# --- slow and idle clients (D13) ----------------------------------------------------------------------


async def _trickle(port: int, data: bytes, every_s: float) -> tuple[float, bytes]:
    """Send ``data`` a byte every ``every_s`` until the server answers or closes; how long that took
    from connect, and what it answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    answered_at: list[float] = []
    answer = asyncio.create_task(reader.read())
    answer.add_done_callback(lambda _: answered_at.append(time.monotonic()))
    try:
        for i in range(len(data)):
            if answer.done():
                break
            try:
                writer.write(data[i : i + 1])
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.wait([answer], timeout=every_s)
        text = await asyncio.wait_for(answer, 3)
        return answered_at[0] - started, text
    finally:
        writer.close()


def test_slowloris_head_is_cut_at_the_head_timeout_while_probes_pass() -> None:
    async def check(ls: Listeners) -> None:
        slow = asyncio.create_task(_trickle(ls.mport, get("/metrics", "X-Pad: " + "a" * 50 + "\r\n"), 0.25))
        for _ in range(3):
            await asyncio.sleep(0.2)
            assert await probe(ls.hport) == 200
            assert await probe(ls.mport, "/metrics") == 200
        took, answer = await slow
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert FAST.head_s - 0.2 < took < FAST.head_s + 1.0

    run(check)


def test_one_byte_per_second_cannot_stretch_a_head() -> None:
    """The head's deadline counts from connect, not from the last byte."""

    async def check(ls: Listeners) -> None:
        took, answer = await _trickle(ls.hport, get("/healthz"), 1.0)
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert took < FAST.head_s + 1.0

    run(check)


def test_a_stalled_body_is_cut_at_the_body_timeout() -> None:
    async def check(ls: Listeners) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", ls.mport)
        writer.write(b"GET /metrics HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc")
        started = time.monotonic()
        got = await asyncio.wait_for(read_response(reader), FAST.body_s + 2)
        assert got is not None
        assert got[0] == 408
        assert time.monotonic() - started < FAST.body_s + 1.0
        writer.close()

    run(check)


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() -> None:
    async def check(ls: Listeners) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", ls.mport)
        writer.write(get("/metrics"))
        assert (await read_response(reader) or (0,))[0] == 200
        started = time.monotonic()
        assert await closed_by_server(reader, within=FAST.idle_s + 2, rest=b"")
        assert FAST.idle_s - 0.2 < time.monotonic() - started < FAST.idle_s + 1.0
        writer.close()

    run(check)


async def _hold(port: int, n: int, send: bytes) -> list[Conn]:
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(n)]
    for _, w in conns:
        if send:
            w.write(send)
    await asyncio.sleep(0.2)
    return conns


def test_d13_idle_and_stalled_connections_cannot_starve_health_or_metrics() -> None:
    """The D13 reproducer: 64 idle and 64 stalled-body connections to the metrics port (cap 64, the
    default). Kubelet-style probes of the health listener keep passing, /metrics answers at once
    (the connection waiting longest makes room), and every stalled connection is gone within the
    timeouts."""

    async def check(ls: Listeners) -> None:
        assert ls.metrics.max_connections == 64
        idle = await _hold(ls.mport, 64, b"")
        stalled = await _hold(ls.mport, 64, b"GET /metrics HTTP/1.1\r\nContent-Length: 1000\r\n\r\n")
        assert ls.metrics.open_connections <= 64
        for _ in range(5):
            assert await probe(ls.hport) == 200
            assert await probe(ls.hport, "/readyz") == 200
            assert await probe(ls.mport, "/metrics") == 200
            assert await probe(ls.mport) == 200  # /healthz still answered on the metrics port too
            await asyncio.sleep(0.1)
        # every held connection is closed by the server within the head/body timeouts
        closed = await asyncio.gather(
            *(closed_by_server(r, within=FAST.body_s + 1.5) for r, _ in idle + stalled)
        )
        assert all(closed), [i for i, c in enumerate(closed) if not c]
        for _, w in idle + stalled:
            w.close()
        await until(lambda: ls.metrics.open_connections == 0, within=2.0)

    run(check)


def test_idle_connections_to_the_health_listener_cannot_starve_the_probe() -> None:
    async def check(ls: Listeners) -> None:
        held = await _hold(ls.hport, 3 * ls.health.max_connections, b"")
        assert ls.health.open_connections <= ls.health.max_connections
        for _ in range(5):
            assert await probe(ls.hport) == 200
        for _, w in held:
            w.close()

    run(check)


def test_a_client_that_does_not_read_is_cut_at_the_write_timeout() -> None:
    big = b"m 1\n" * (8 << 20)  # 32 MiB, more than the socket buffers take

    async def check(ls: Listeners) -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", ls.mport)
        writer.write(get("/metrics"))
        await asyncio.sleep(0.2)
        assert await probe(ls.hport) == 200
        await until(lambda: ls.metrics.open_connections == 0, within=FAST.write_s + 2)
        writer.close()

    run(check, render=lambda: big)
