"""The shared HTTP/1.1 connection layer (``topology.httpserver``): head parsing without trusting the
client, and the listener's own answers (limits, the cap's eviction order, refusal, a failing handler).
The servers built on it are tested through their routes in ``tests/agent/metrics``,
``tests/scheduler_plugin``, ``tests/integration`` and ``tests/hostile``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest

from topology import logs
from topology.httpserver import (
    HttpServer,
    Limits,
    Rejected,
    Request,
    Response,
    parse_head,
)

FAST = Limits(head_s=1.0, body_s=1.0, idle_s=1.0, write_s=1.0, max_connections=2, max_body_bytes=64)


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        pytest.param(b"GET /metrics HTTP/1.1\r\n\r\n", Request("GET", "/metrics", True, 0), id="plain"),
        pytest.param(
            b"GET /m?x=1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            Request("GET", "/m", True, 0),
            id="1.0-ka",
        ),
        pytest.param(b"HEAD / HTTP/1.0\r\n\r\n", Request("HEAD", "/", False, 0), id="1.0-closes"),
        pytest.param(
            b"GET / HTTP/1.1\r\nConnection: Upgrade, Close\r\n\r\n",
            Request("GET", "/", False, 0),
            id="close-token",
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\ncontent-length: 7\r\nContent-Length: 7\r\n\r\n",
            Request("POST", "/", True, 7),
            id="same-length-twice",
        ),
        pytest.param(
            b"POST /filter HTTP/1.1\r\nContent-Type: application/json; charset=utf-8\r\n\r\n",
            Request("POST", "/filter", True, 0, "application/json; charset=utf-8"),
            id="content-type",
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nContent-Length: 999999999999999\r\n\r\n",
            Request("POST", "/", True, 999_999_999_999_999),
            id="15-digits",
        ),
        pytest.param(b"GET / HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n", 400, id="d12-superscript-two"),
        pytest.param(b"GET / HTTP/1.1\r\nContent-Length: 1234567890123456\r\n\r\n", 400, id="16-digits"),
        pytest.param(
            b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, id="two-lengths"
        ),
        pytest.param(b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501, id="chunked"),
        pytest.param(b"GET / HTTP/3\r\n\r\n", 505, id="http3"),
        pytest.param(b"GET /\x7f HTTP/1.1\r\n\r\n", 400, id="del-in-path"),
    ],
)
def test_parse_head(head: bytes, expected: Request | int) -> None:
    got = parse_head(head)
    if isinstance(expected, Request):
        assert got == expected
    else:
        assert isinstance(got, Rejected)
        assert got.status == expected
        assert got.reason.isascii()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"idle_s": 0}, r"^Limits.idle_s: must be > 0, got 0$", id="idle"),
        pytest.param({"max_body_bytes": -1}, r"^Limits.max_body_bytes: must be > 0", id="body"),
        pytest.param({"max_connections": 0}, r"^max_connections: must be >= 1, got 0$", id="cap"),
    ],
)
def test_limits_are_validated(change: dict[str, float], message: str) -> None:
    fields: dict[str, float] = {
        "head_s": 1,
        "body_s": 1,
        "idle_s": 1,
        "write_s": 1,
        "max_connections": 1,
        "max_body_bytes": 1,
    }
    with pytest.raises(ValueError, match=message):
        Limits(**(fields | change))  # type: ignore[arg-type]


async def _echo(request: Request, body: bytes) -> Response:
    if request.path == "/boom":
        raise RuntimeError("boom")
    if request.path == "/slow":
        await asyncio.sleep(0.5)
    return Response(200, "text/plain", request.method.encode() + b" " + body)


def _json_error(status: int, reason: str) -> Response:
    return Response(status, "application/json", json.dumps({"Error": reason}).encode())


def _run(test: Callable[[HttpServer], Awaitable[None]], **kwargs: object) -> None:
    async def main() -> None:
        server = HttpServer(
            name="test", handler=_echo, limits=FAST, log=logs.get_logger("tests.httpserver"), **kwargs
        )  # type: ignore[arg-type]
        await server.start("127.0.0.1", 0)
        try:
            await test(server)
        finally:
            await server.stop(grace_s=1.0)

    asyncio.run(asyncio.wait_for(main(), 10))


async def _ask(
    port: int, raw: bytes, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
) -> tuple[int, bytes]:
    reader, writer = conn or await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    body = await reader.readexactly(length)
    if conn is None:
        writer.close()
    return int(head.split()[1]), body


def test_body_is_handed_to_the_handler_and_errors_use_the_servers_format() -> None:
    async def check(server: HttpServer) -> None:
        assert await _ask(server.port, b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi") == (200, b"POST hi")
        status, body = await _ask(server.port, b"POST / HTTP/1.1\r\nContent-Length: 65\r\n\r\n")
        assert status == 413
        assert json.loads(body) == {"Error": "request body of 65 bytes is larger than the limit of 64 bytes"}
        assert (await _ask(server.port, b"GET /boom HTTP/1.1\r\n\r\n"))[0] == 500
        assert server.stats.rejected == 1

    _run(check, error_response=_json_error)


def test_never_served_connections_are_evicted_before_served_idle_ones() -> None:
    async def check(server: HttpServer) -> None:
        served = await asyncio.open_connection("127.0.0.1", server.port)
        assert (await _ask(server.port, b"GET / HTTP/1.1\r\n\r\n", served))[0] == 200  # now idle
        silent = await asyncio.open_connection("127.0.0.1", server.port)  # newer, never served
        await asyncio.sleep(0.05)
        assert (await _ask(server.port, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n"))[0] == 200
        assert await asyncio.wait_for(silent[0].read(), 3) == b""  # the silent one made room
        assert (await _ask(server.port, b"GET / HTTP/1.1\r\n\r\n", served))[0] == 200  # still open
        assert server.stats.evicted == 1
        for _, w in (served, silent):
            w.close()

    _run(check)


def test_when_every_connection_is_answering_a_newcomer_gets_503_if_asked() -> None:
    async def check(server: HttpServer) -> None:
        busy = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
        for _, w in busy:
            w.write(b"GET /slow HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0.1)
        status, body = await _ask(server.port, b"GET / HTTP/1.1\r\n\r\n")
        assert (status, json.loads(body)) == (503, {"Error": "too many connections answering requests"})
        for conn in busy:
            assert (await _ask(server.port, b"", conn))[0] == 200  # neither was cut
            conn[1].close()
        assert (server.stats.refused, server.stats.evicted) == (1, 0)

    _run(check, error_response=_json_error, answer_when_full=True)
