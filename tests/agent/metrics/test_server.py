from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from agent.metrics.server import METRICS_CONTENT_TYPE, HealthServer, MetricsServer, Timeouts


async def _request(
    port: int, raw: bytes, *, reader_writer: tuple | None = None
) -> tuple[int, dict[str, str], bytes]:  # type: ignore[type-arg]
    reader, writer = reader_writer or await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers["content-length"])) if not raw.startswith(b"HEAD") else b""
    if reader_writer is None:
        writer.close()
        await writer.wait_closed()
    return status, headers, body


def _get(path: str, *, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


def _serve(test: Callable[[MetricsServer], object], **kwargs: object) -> None:
    async def main() -> None:
        server = MetricsServer(host="127.0.0.1", port=0, render=lambda: b"m 1\n", **kwargs)  # type: ignore[arg-type]
        await server.start()
        try:
            await test(server)  # type: ignore[misc]
        finally:
            await server.stop()

    asyncio.run(main())


def test_metrics_healthz_and_scrape_stats() -> None:
    async def check(server: MetricsServer) -> None:
        status, headers, body = await _request(server.bound_port, _get("/metrics"))
        assert (status, headers["content-type"], body) == (200, METRICS_CONTENT_TYPE, b"m 1\n")
        status, _, body = await _request(server.bound_port, _get("/healthz"))
        assert (status, body) == (200, b"ok\n")
        assert server.scrape_stats().count == 1

    _serve(check)


def test_readyz_lists_every_failing_reason() -> None:
    state = {"nvml": "NVML unusable: LIB_RM_VERSION_MISMATCH", "plugins": None}

    def broken() -> str | None:
        raise RuntimeError("boom")

    async def check(server: MetricsServer) -> None:
        status, _, body = await _request(server.bound_port, _get("/readyz"))
        assert status == 503
        assert body.decode().splitlines() == [
            "nvml: NVML unusable: LIB_RM_VERSION_MISMATCH",
            "broken: check raised RuntimeError: boom",
        ]

    _serve(
        check,
        readiness=(
            ("nvml", lambda: state["nvml"]),
            ("plugins", lambda: state["plugins"]),
            ("broken", broken),
        ),
    )


def test_readyz_ok_when_every_check_passes() -> None:
    async def check(server: MetricsServer) -> None:
        status, _, body = await _request(server.bound_port, _get("/readyz"))
        assert (status, body) == (200, b"ok\n")

    _serve(check, readiness=(("nvml", lambda: None),))


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        pytest.param(_get("/nope"), 404, id="unknown-path"),
        pytest.param(b"POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi", 405, id="post"),
        pytest.param(b"garbage\r\n\r\n", 400, id="bad-request-line"),
        pytest.param(b"GET /metrics HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400, id="bad-content-length"),
        pytest.param(b"GET /metrics HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n", 400, id="d12-non-ascii-digit"),
        pytest.param(_get("/metrics?x=1"), 200, id="query-ignored"),
    ],
)
def test_bad_requests_get_clear_statuses(raw: bytes, status: int) -> None:
    async def check(server: MetricsServer) -> None:
        got, _, _ = await _request(server.bound_port, raw)
        assert got == status

    _serve(check)


def test_keep_alive_serves_several_requests_on_one_connection_and_head_has_no_body() -> None:
    async def check(server: MetricsServer) -> None:
        conn = await asyncio.open_connection("127.0.0.1", server.bound_port)
        for _ in range(3):
            status, headers, body = await _request(server.bound_port, _get("/metrics"), reader_writer=conn)
            assert (status, headers["connection"], body) == (200, "keep-alive", b"m 1\n")
        status, headers, _ = await _request(
            server.bound_port, b"HEAD /metrics HTTP/1.1\r\n\r\n", reader_writer=conn
        )
        assert (status, headers["content-length"]) == (200, "4")
        status, headers, _ = await _request(
            server.bound_port, _get("/healthz", extra="Connection: close\r\n"), reader_writer=conn
        )
        assert headers["connection"] == "close"
        assert await asyncio.wait_for(conn[0].read(), timeout=5) == b""  # the server closed it
        conn[1].close()
        assert server.scrape_stats().count == 4

    _serve(check)


def test_stop_closes_idle_keep_alive_connections() -> None:
    async def main() -> None:
        server = MetricsServer(host="127.0.0.1", port=0, render=lambda: b"")
        await server.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
        await _request(server.bound_port, _get("/healthz"), reader_writer=(reader, writer))
        await asyncio.wait_for(server.stop(), timeout=10)
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""
        writer.close()

    asyncio.run(main())


def test_at_the_cap_the_connection_waiting_longest_makes_room() -> None:
    async def check(server: MetricsServer) -> None:
        first = await asyncio.open_connection("127.0.0.1", server.bound_port)
        await _request(server.bound_port, _get("/healthz"), reader_writer=first)  # now idle (keep-alive)
        second = await asyncio.open_connection("127.0.0.1", server.bound_port)
        status, _, _ = await _request(server.bound_port, _get("/healthz"), reader_writer=second)
        assert status == 200  # the newcomer is served ...
        assert await asyncio.wait_for(first[0].read(), timeout=5) == b""  # ... the idle one was closed
        assert server.open_connections == 1
        for _, w in (first, second):
            w.close()

    _serve(check, max_connections=1)


def test_a_connection_being_answered_is_never_evicted() -> None:
    big = b"m 1\n" * (8 << 20)  # 32 MiB: more than the socket buffers hold while the client does not read

    async def check(server: MetricsServer) -> None:
        busy = await asyncio.open_connection("127.0.0.1", server.bound_port)
        busy[1].write(_get("/metrics"))
        await busy[1].drain()
        await asyncio.sleep(0.3)  # the server is now waiting for the client to take the response
        # the one slot is answering /metrics: a newcomer is refused, the scrape is not cut
        newcomer = await asyncio.open_connection("127.0.0.1", server.bound_port)
        assert await asyncio.wait_for(newcomer[0].read(), timeout=5) == b""
        status, _, body = await _request(server.bound_port, b"", reader_writer=busy)
        assert (status, len(body)) == (200, len(big))
        for _, w in (busy, newcomer):
            w.close()

    async def main() -> None:
        server = MetricsServer(host="127.0.0.1", port=0, render=lambda: big, max_connections=1)
        await server.start()
        try:
            await check(server)
        finally:
            await server.stop()

    asyncio.run(main())


def test_default_timeouts_are_short() -> None:
    """Deliver 4: a head or body gets a few seconds, an idle keep-alive connection well under the old
    120 s."""
    t = Timeouts()
    assert (t.head_s, t.body_s, t.idle_s, t.write_s) == (5.0, 5.0, 15.0, 10.0)


def test_timeouts_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"Timeouts.idle_s: must be > 0"):
        Timeouts(idle_s=0)


def test_health_server_answers_health_and_readiness_only() -> None:
    async def main() -> None:
        server = HealthServer(host="127.0.0.1", port=0, readiness=(("nvml", lambda: "NVML unusable"),))
        await server.start()
        try:
            assert (await _request(server.bound_port, _get("/healthz")))[0] == 200
            status, _, body = await _request(server.bound_port, _get("/readyz"))
            assert (status, body) == (503, b"nvml: NVML unusable\n")
            status, _, body = await _request(server.bound_port, _get("/metrics"))
            assert (status, body) == (404, b"not found; try /healthz, /readyz\n")
        finally:
            await server.stop()

    asyncio.run(main())


def test_a_port_in_use_names_the_setting() -> None:
    async def main() -> None:
        first = HealthServer(host="127.0.0.1", port=0)
        await first.start()
        try:
            second = HealthServer(host="127.0.0.1", port=first.bound_port)
            with pytest.raises(
                RuntimeError, match=rf"^--health-addr 127.0.0.1:{first.bound_port}: cannot listen"
            ):
                await second.start()
        finally:
            await first.stop()

    asyncio.run(main())


def test_a_failing_render_answers_500_and_the_server_keeps_serving(caplog: pytest.LogCaptureFixture) -> None:
    def render() -> bytes:
        raise RuntimeError("boom")

    async def main() -> None:
        server = MetricsServer(host="127.0.0.1", port=0, render=render)
        await server.start()
        try:
            assert (await _request(server.bound_port, _get("/metrics")))[0] == 500
            assert (await _request(server.bound_port, _get("/healthz")))[0] == 200
        finally:
            await server.stop()

    asyncio.run(main())
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == ["http_route_failed"]
    assert not [r for r in caplog.records if r.exc_info]
