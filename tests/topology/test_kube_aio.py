"""Requests on an event loop (``topology.kube.aio``) against a scripted HTTP server on a real socket: what
is sent, kept-alive reuse, the connection cap, a server that closed an idle connection, refusals, and
answers that break HTTP. The real API server (TLS, client certificates) is met in the extender e2e."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from topology.kube import KubeError
from topology.kube.aio import AsyncKube

CREATED = (
    b'HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n{"kind":"Status"}'
)


class Seen:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.connections = 0
        self.open = 0
        self.most_open = 0


Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, Seen], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader, seen: Seen) -> bool:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return False
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    seen.requests.append((lines[0], headers, body))
    return True


def answering(*answers: bytes, delay_s: float = 0.0) -> Script:
    """Each request on a connection gets the next answer (the last one repeats); an answer that says
    ``Connection: close`` is followed by the close."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        n = 0
        while await read_request(reader, seen):
            await asyncio.sleep(delay_s)
            answer = answers[min(n, len(answers) - 1)]
            writer.write(answer)
            await writer.drain()
            if b"Connection: close" in answer:
                return
            n += 1

    return script


async def serve(script: Script) -> tuple[asyncio.Server, Seen, int]:
    seen = Seen()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.connections += 1
        seen.open += 1
        seen.most_open = max(seen.most_open, seen.open)
        try:
            await script(reader, writer, seen)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            seen.open -= 1
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, seen, server.sockets[0].getsockname()[1]


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


class Config:
    """The parts of ``kubernetes.client.Configuration`` that ``AsyncKube`` reads."""

    def __init__(self, host: str = "http://127.0.0.1:1", **fields: Any) -> None:
        self.host = host
        self.verify_ssl = True
        self.ssl_ca_cert = None
        self.ca_cert_data = None
        self.cert_file = None
        self.key_file = None
        self.assert_hostname = None
        self.tls_server_name = None
        self.proxy = None
        self.username = None
        self.password = None
        self.token = "Bearer t0"
        self.reads: list[int] = []
        self.__dict__.update(fields)

    def auth_settings(self) -> dict[str, Any]:
        self.reads.append(threading.get_ident())
        return {"BearerToken": {"in": "header", "key": "authorization", "value": self.token}}


def test_a_binding_is_posted_with_the_clients_token_and_connections_are_kept() -> None:
    cfg = Config()

    async def main() -> tuple[Seen, int, list[int]]:
        server, seen, port = await serve(answering(CREATED))
        kube = AsyncKube("127.0.0.1", port, tls=None, auth=cfg, auth_refresh_s=3600)
        for i in range(3):
            await kube.bind("ns", f"p{i}", "u-1" if i == 0 else "", "node-a")
        await kube.aclose()
        server.close()
        return seen, kube.opened, [threading.get_ident()]

    seen, opened, loop_thread = run(main())
    assert opened == 1
    assert seen.connections == 1
    line, headers, body = seen.requests[0]
    assert line == "POST /api/v1/namespaces/ns/pods/p0/binding HTTP/1.1"
    assert headers["authorization"] == "Bearer t0"
    assert headers["content-type"] == "application/json"
    assert headers["host"].startswith("127.0.0.1:")
    assert json.loads(body) == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p0", "namespace": "ns", "uid": "u-1"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"},
    }
    assert "uid" not in json.loads(seen.requests[1][2])["metadata"]
    assert len(cfg.reads) == 1
    assert cfg.reads[0] != loop_thread[0]


def test_the_token_is_read_again_after_the_refresh_interval() -> None:
    cfg = Config()

    async def main() -> Seen:
        server, seen, port = await serve(answering(CREATED))
        kube = AsyncKube("127.0.0.1", port, tls=None, auth=cfg, auth_refresh_s=0.05)
        await kube.bind("ns", "a", "", "n")
        cfg.token = "Bearer t1"
        await asyncio.sleep(0.1)
        await kube.bind("ns", "b", "", "n")
        await kube.aclose()
        server.close()
        return seen

    seen = run(main())
    assert [h["authorization"] for _, h, _ in seen.requests] == ["Bearer t0", "Bearer t1"]


def test_many_requests_at_once_share_at_most_the_connection_cap() -> None:
    async def main() -> tuple[Seen, int]:
        server, seen, port = await serve(answering(CREATED, delay_s=0.01))
        kube = AsyncKube("127.0.0.1", port, tls=None, max_connections=4)
        await asyncio.gather(*(kube.bind("ns", f"p{i}", "", "n") for i in range(40)))
        await kube.aclose()
        server.close()
        return seen, kube.opened

    seen, opened = run(main())
    assert len(seen.requests) == 40
    assert seen.most_open <= 4
    assert opened <= 4


async def until(condition: Callable[[], bool]) -> None:
    """Let the loop run until ``condition`` holds (the test's own deadline bounds it)."""
    while not condition():
        await asyncio.sleep(0.001)


def test_a_connection_the_server_closed_while_idle_is_dropped_before_a_request_is_written() -> None:
    closed = asyncio.Event()

    async def once_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        if await read_request(reader, seen):
            writer.write(CREATED)
            await writer.drain()
        writer.close()
        await writer.wait_closed()
        closed.set()

    async def main() -> tuple[Seen, int]:
        server, seen, port = await serve(once_then_close)
        kube = AsyncKube("127.0.0.1", port, tls=None)
        await kube.bind("ns", "a", "", "n")
        await closed.wait()
        await until(lambda: not kube._idle[0].usable())  # the client has seen the close
        await kube.bind("ns", "b", "", "n")  # never written on the closed connection
        await kube.aclose()
        server.close()
        return seen, kube.opened

    seen, opened = run(main())
    assert opened == 2
    assert [r[0].split()[1].rsplit("/", 2)[1] for r in seen.requests] == ["a", "b"]


def test_a_request_written_on_a_kept_connection_that_ends_unanswered_is_not_sent_again() -> None:
    """Issue 26 item 16: a POST whose bytes were written may have been carried out; sending it again
    turned a done binding into a 409 reported as a failure."""

    async def once_then_drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        if await read_request(reader, seen):
            writer.write(CREATED)
            await writer.drain()
        await read_request(reader, seen)  # then the server reads the next request and closes unanswered

    async def main() -> tuple[KubeError, Seen, int]:
        server, seen, port = await serve(once_then_drop)
        kube = AsyncKube("127.0.0.1", port, tls=None)
        await kube.bind("ns", "a", "", "n")
        with pytest.raises(KubeError) as exc:
            await kube.bind("ns", "b", "", "n")
        await kube.bind("ns", "c", "", "n")  # the next request takes a new connection
        await kube.aclose()
        server.close()
        return exc.value, seen, kube.opened

    err, seen, opened = run(main())
    assert err.status == 0
    assert "POST /api/v1/namespaces/ns/pods/b/binding: the connection closed before an answer" in str(err)
    assert "not sent again" in str(err)
    assert [r[0].split()[1].rsplit("/", 2)[1] for r in seen.requests] == ["a", "b", "c"]
    assert opened == 2


def conflict(pod: str, node: str) -> bytes:
    body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": f'Operation cannot be fulfilled on pods/binding "{pod}": '
            f'pod {pod} is already assigned to node "{node}"',
            "reason": "Conflict",
            "details": {"name": pod, "kind": "pods/binding"},
            "code": 409,
        }
    ).encode()
    return b"HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


def test_a_binding_refused_as_already_on_that_node_is_bound_and_on_another_node_is_refused() -> None:
    """The API server's answer to a second binding of a bound pod (pods/binding storage: 409 Conflict,
    ``pod NAME is already assigned to node "NODE"``): the same node is the binding done."""
    long = "p" + "-x" * 126  # a pod name of 253 characters: the whole message is kept

    async def main() -> list[str]:
        server, _, port = await serve(
            answering(
                conflict("p", "node-a"),
                conflict(long, "node-a"),
                conflict("p", "node-b"),
                conflict("q", "node-a"),
            )
        )
        kube = AsyncKube("127.0.0.1", port, tls=None)
        await kube.bind("ns", "p", "u-1", "node-a")
        await kube.bind("ns", long, "", "node-a")
        refused = []
        for name in ("p", "p"):  # on another node; then another pod's message
            with pytest.raises(KubeError) as exc:
                await kube.bind("ns", name, "", "node-a")
            refused.append(str(exc.value))
        await kube.aclose()
        server.close()
        return refused

    refused = run(main())
    assert refused[0].startswith("409: ")
    assert 'already assigned to node "node-b"' in refused[0]
    assert 'pod q is already assigned to node "node-a"' in refused[1]


def test_interim_answers_are_skipped_and_the_final_one_is_the_requests() -> None:
    """Issue 26 item 14: a ``100 Continue`` taken as the answer left the real one on the connection,
    read as the next binding's answer (a refused binding reported bound)."""
    cont = b"HTTP/1.1 100 Continue\r\n\r\n"
    hints = b"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n"

    async def main() -> tuple[KubeError, int]:
        server, _, port = await serve(answering(cont + CREATED, cont + hints + conflict("b", "node-z")))
        kube = AsyncKube("127.0.0.1", port, tls=None)
        await kube.bind("ns", "a", "", "n")
        with pytest.raises(KubeError) as exc:
            await kube.bind("ns", "b", "", "n")
        await kube.aclose()
        server.close()
        return exc.value, kube.opened

    err, opened = run(main())
    assert err.status == 409
    assert 'already assigned to node "node-z"' in str(err)
    assert opened == 1  # the connection stood at each answer's start: kept


def test_bytes_past_a_content_length_body_end_its_connection_and_never_answer_the_next_request() -> None:
    """Issue 26 item 15: a stray answer after a body, on a kept connection, answered the next request."""

    answers = [CREATED + conflict("b", "elsewhere"), conflict("b", "node-z")]  # in turn, any connection

    async def in_turn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        while await read_request(reader, seen):
            writer.write(answers.pop(0))
            await writer.drain()

    async def main() -> tuple[KubeError, int, int]:
        server, _, port = await serve(in_turn)
        kube = AsyncKube("127.0.0.1", port, tls=None)
        await kube.bind("ns", "a", "", "n")
        idle = len(kube._idle)
        with pytest.raises(KubeError) as exc:
            await kube.bind("ns", "b", "", "n")
        await kube.aclose()
        server.close()
        return exc.value, idle, kube.opened

    err, idle, opened = run(main())
    assert idle == 0
    assert 'already assigned to node "node-z"' in str(err)  # its own answer, not the stray one
    assert opened == 2


def test_bytes_that_arrive_while_a_connection_is_idle_end_it() -> None:
    stray = asyncio.Event()

    async def then_stray(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        if await read_request(reader, seen):
            writer.write(CREATED)
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            stray.set()
        while await read_request(reader, seen):
            writer.write(CREATED)
            await writer.drain()

    async def main() -> tuple[Seen, int]:
        server, seen, port = await serve(then_stray)
        kube = AsyncKube("127.0.0.1", port, tls=None)
        await kube.bind("ns", "a", "", "n")
        await stray.wait()
        await until(lambda: kube._idle[0].unread > 0)
        await kube.bind("ns", "b", "", "n")
        await kube.aclose()
        server.close()
        return seen, kube.opened

    seen, opened = run(main())
    assert opened == 2
    assert len(seen.requests) == 2


def test_a_fresh_connection_closed_unanswered_is_an_error_not_a_retry() -> None:
    async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        await read_request(reader, seen)

    async def main() -> tuple[KubeError, Seen]:
        server, seen, port = await serve(close_at_once)
        kube = AsyncKube("127.0.0.1", port, tls=None)
        with pytest.raises(KubeError) as exc:
            await kube.bind("ns", "a", "", "n")
        await kube.aclose()
        server.close()
        return exc.value, seen

    err, seen = run(main())
    assert err.status == 0
    assert "closed before an answer" in str(err)
    assert len(seen.requests) == 1


def test_a_refusal_carries_the_apis_status_and_message_and_the_connection_is_kept() -> None:
    body = b'{"kind":"Status","message":"pod p is already assigned to node \\"x\\""}'
    conflict = b"HTTP/1.1 409 Conflict\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    async def main() -> tuple[KubeError, int]:
        server, _, port = await serve(answering(conflict, CREATED))
        kube = AsyncKube("127.0.0.1", port, tls=None)
        with pytest.raises(KubeError) as exc:
            await kube.bind("ns", "p", "", "n")
        await kube.bind("ns", "q", "", "n")
        await kube.aclose()
        server.close()
        return exc.value, kube.opened

    err, opened = run(main())
    assert err.status == 409
    assert 'POST /api/v1/namespaces/ns/pods/p/binding: pod p is already assigned to node "x"' in str(err)
    assert opened == 1


def test_chunked_and_close_delimited_answers_are_read() -> None:
    chunked = (
        b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\n{"a"\r\n3\r\n:1}\r\n0\r\nT: v\r\n\r\n'
    )
    closing = b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"b":2}'

    async def main() -> tuple[Any, Any, int]:
        server, _, port = await serve(answering(chunked, closing))
        kube = AsyncKube("127.0.0.1", port, tls=None)
        first = await kube.request("GET", "/x")
        second = await kube.request("GET", "/y")
        await kube.aclose()
        server.close()
        return first, second, len(kube._idle)

    first, second, idle = run(main())
    assert first == {"a": 1}
    assert second == {"b": 2}
    assert idle == 0  # the close-delimited answer ended its connection


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        pytest.param(b"HTTP/2 200 OK\r\n\r\n", "bad status line", id="version"),
        pytest.param(b"HTTP/1.1 2x0 OK\r\n\r\n", "bad status line", id="status-not-digits"),
        pytest.param(b"\x00\xff garbage\r\n\r\n", "bad status line", id="garbage"),
        pytest.param(b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "bad header line", id="header"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length", id="negative"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "bad Content-Length",
            id="huge-length",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
            "disagree",
            id="two-lengths",
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2048\r\n\r\n", "over 1024", id="body-too-big"),
        pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "Transfer-Encoding", id="coding"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size", id="chunk-size"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n",
            "not followed by CRLF",
            id="chunk-crlf",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n", "over 1024", id="chunks-too-big"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", "inside the answer's body", id="short"
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n{x}", "not JSON", id="not-json"),
        pytest.param(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20000, "over 65536", id="head-too-big"),
        pytest.param(b"HTTP/1.1 200", "inside the answer's head", id="head-cut"),
        pytest.param(b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "asked no upgrade", id="upgrade"),
        pytest.param(b"HTTP/1.1 100 Continue\r\n\r\n" * 9, "more than 8 interim", id="endless-interim"),
        pytest.param(b"HTTP/1.1 100 Continue\r\n\r\n", "after an interim (1xx) answer", id="interim-only"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 70000,
            "chunk line or trailer over",
            id="chunk-line-too-long",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: " + b"v" * 70000,
            "chunk line or trailer over",
            id="trailer-too-long",
        ),
    ],
)
def test_an_answer_that_breaks_http_is_an_error_naming_what_was_wrong(answer: bytes, says: str) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        await read_request(reader, seen)
        writer.write(answer)
        await writer.drain()
        writer.close()

    async def main() -> tuple[KubeError, int]:
        server, _, port = await serve(script)
        kube = AsyncKube("127.0.0.1", port, tls=None, max_body_bytes=1024)
        with pytest.raises(KubeError) as exc:
            await kube.request("GET", "/x")
        await kube.aclose()
        server.close()
        return exc.value, len(kube._idle)

    err, idle = run(main())
    assert err.status == 0
    assert says in str(err)
    assert idle == 0  # never reused


class Failing(Config):
    def auth_settings(self) -> dict[str, Any]:
        raise RuntimeError("exec plugin exited 1")


@pytest.mark.parametrize(
    ("cfg", "says"),
    [
        pytest.param(Failing(), "RuntimeError: exec plugin exited 1", id="hook-failed"),
        pytest.param(Config(token="Bearer x\r\nX-Evil: 1"), "cannot be sent in a header", id="crlf"),
        pytest.param(Config(token="Bearer \u2603"), "cannot be sent in a header", id="not-latin1"),
    ],
)
def test_credentials_that_cannot_be_read_or_sent_are_that_requests_error(cfg: Config, says: str) -> None:
    async def main() -> KubeError:
        kube = AsyncKube("127.0.0.1", 1, tls=None, auth=cfg)
        with pytest.raises(KubeError) as exc:
            await kube.bind("ns", "a", "", "n")
        return exc.value

    err = run(main())
    assert err.status == 0
    assert says in str(err)


def test_no_answer_in_time_is_an_error() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        await read_request(reader, seen)
        await asyncio.sleep(5)

    async def main() -> KubeError:
        server, _, port = await serve(silent)
        kube = AsyncKube("127.0.0.1", port, tls=None, timeout_s=0.2)
        with pytest.raises(KubeError) as exc:
            await kube.bind("ns", "a", "", "n")
        await kube.aclose()
        server.close()
        return exc.value

    err = run(main())
    assert err.status == 0
    assert "no answer within 0.2 s" in str(err)


def test_nothing_listening_is_an_error() -> None:
    async def main() -> KubeError:
        kube = AsyncKube("127.0.0.1", 1, tls=None)
        with pytest.raises(KubeError) as exc:
            await kube.bind("ns", "a", "", "n")
        return exc.value

    assert run(main()).status == 0


def test_a_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        AsyncKube("h", 1, tls=None, max_connections=0)


class Client:
    def __init__(self, cfg: Config) -> None:
        self.configuration = cfg


@pytest.mark.parametrize(
    ("fields", "usable"),
    [
        pytest.param({"host": "http://127.0.0.1:8080"}, True, id="http"),
        pytest.param({"host": "https://10.0.0.1:6443", "verify_ssl": False}, True, id="https-unverified"),
        pytest.param({"host": "https://10.0.0.1:6443", "proxy": "http://proxy:3128"}, False, id="proxy"),
        pytest.param({"host": "http://127.0.0.1:8080", "username": "u"}, False, id="basic-auth"),
        pytest.param({"host": "unix:///var/run/x"}, False, id="scheme"),
    ],
)
def test_what_a_client_configuration_gives(fields: dict[str, Any], usable: bool) -> None:
    kube = AsyncKube.from_api_client(Client(Config(**fields)))
    assert (kube is not None) is usable
    if kube is not None and fields["host"].startswith("https"):
        assert kube.tls is not None
        assert kube.port == 6443
        assert kube._host_header == "10.0.0.1:6443"


def test_bytes_past_a_chunked_body_end_its_connection() -> None:
    extra = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n"

    async def main() -> tuple[Any, int]:
        server, _, port = await serve(answering(extra))
        kube = AsyncKube("127.0.0.1", port, tls=None)
        got = await kube.request("GET", "/x")
        idle = len(kube._idle)
        await kube.aclose()
        server.close()
        return got, idle

    got, idle = run(main())
    assert got == {}
    assert idle == 0  # the stream is not at an answer's start: never reused


@pytest.mark.parametrize(
    ("answer", "kept"),
    [
        pytest.param(CREATED, True, id="http-1.1"),
        pytest.param(CREATED.replace(b"HTTP/1.1", b"HTTP/1.0"), False, id="http-1.0"),
        pytest.param(
            CREATED.replace(b"HTTP/1.1", b"HTTP/1.0").replace(
                b"\r\n\r\n", b"\r\nConnection: Keep-Alive\r\n\r\n"
            ),
            True,
            id="http-1.0-keep-alive",
        ),
        pytest.param(CREATED.replace(b"\r\n\r\n", b"\r\nConnection: x, close\r\n\r\n"), False, id="close"),
    ],
)
def test_a_connection_is_kept_only_where_the_server_keeps_it(answer: bytes, kept: bool) -> None:
    async def main() -> int:
        server, _, port = await serve(answering(answer))
        kube = AsyncKube("127.0.0.1", port, tls=None)
        await kube.bind("ns", "a", "", "n")
        idle = len(kube._idle)
        await kube.aclose()
        server.close()
        return idle

    assert run(main()) == (1 if kept else 0)


class Hanging(Config):
    """A credential hook that answers ``answers`` times, then hangs until ``release`` is set."""

    def __init__(self, answers: int, **fields: Any) -> None:
        super().__init__(**fields)
        self.answers = answers
        self.release = threading.Event()
        self.calls = 0
        self.running = 0
        self.most_running = 0
        self._lock = threading.Lock()

    def auth_settings(self) -> dict[str, Any]:
        with self._lock:
            self.calls += 1
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            hang = self.calls > self.answers
        try:
            if hang:
                self.release.wait(30)
            return super().auth_settings()
        finally:
            with self._lock:
                self.running -= 1


async def on_a_worker_thread() -> int:
    """``asyncio.to_thread`` work (the extender's planning) still runs: within a bound, not stalled."""
    async with asyncio.timeout(5):
        return await asyncio.to_thread(lambda: 42)


def test_a_hanging_credential_hook_holds_one_thread_and_requests_go_on_with_the_last_token() -> None:
    """Issue 26 item 17: each request's read of a hanging hook held a worker of the default executor
    until it was full and every ``to_thread`` stalled."""
    cfg = Hanging(answers=1)

    async def main() -> tuple[Seen, int]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=2))
        server, seen, port = await serve(answering(CREATED))
        kube = AsyncKube(
            "127.0.0.1", port, tls=None, auth=cfg, auth_refresh_s=0.0, auth_timeout_s=0.05, max_connections=4
        )
        await kube.bind("ns", "first", "", "n")  # a token is read
        cfg.token = "Bearer t1"  # never read: the hook hangs from now on
        await asyncio.gather(*(kube.bind("ns", f"p{i}", "", "n") for i in range(40)))
        worked = await on_a_worker_thread()
        await asyncio.gather(*(kube.bind("ns", f"q{i}", "", "n") for i in range(10)))
        cfg.release.set()
        await kube.aclose()
        server.close()
        return seen, worked

    seen, worked = run(main())
    assert worked == 42
    assert len(seen.requests) == 51
    assert {h["authorization"] for _, h, _ in seen.requests} == {"Bearer t0"}
    assert cfg.calls == 2  # the first read, then the one that hangs: never a second at once
    assert cfg.most_running == 1


def test_a_hook_that_hangs_before_any_token_fails_requests_naming_it_and_holds_one_thread() -> None:
    cfg = Hanging(answers=0)

    async def main() -> tuple[list[BaseException | None], int]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        kube = AsyncKube("127.0.0.1", 1, tls=None, auth=cfg, auth_timeout_s=0.05)
        errors = await asyncio.gather(
            *(kube.bind("ns", f"p{i}", "", "n") for i in range(20)), return_exceptions=True
        )
        worked = await on_a_worker_thread()
        cfg.release.set()
        return errors, worked

    errors, worked = run(main())
    assert worked == 42
    assert all(isinstance(e, KubeError) and e.status == 0 for e in errors)
    assert "the credential hook has not answered" in str(errors[0])
    assert cfg.calls == 1


def test_a_credential_hook_that_fails_after_a_token_keeps_the_last_token() -> None:
    class FailingLater(Config):
        def auth_settings(self) -> dict[str, Any]:
            if self.reads:
                raise RuntimeError("exec plugin exited 1")
            return super().auth_settings()

    cfg = FailingLater()

    async def main() -> Seen:
        server, seen, port = await serve(answering(CREATED))
        kube = AsyncKube("127.0.0.1", port, tls=None, auth=cfg, auth_refresh_s=0.0)
        for i in range(3):
            await kube.bind("ns", f"p{i}", "", "n")
        await kube.aclose()
        server.close()
        return seen

    seen = run(main())
    assert [h["authorization"] for _, h, _ in seen.requests] == ["Bearer t0"] * 3


def test_a_bindings_annotations_are_posted_on_the_binding() -> None:
    """The API server copies a Binding's annotations to the pod: the extender's way to hand the pod the
    subgroup size chosen for it, with no write to the pod of its own."""

    async def main() -> Seen:
        server, seen, port = await serve(answering(CREATED))
        kube = AsyncKube("127.0.0.1", port, tls=None, auth=Config(), auth_refresh_s=3600)
        await kube.bind("ns", "p0", "", "node-a", {"gpuagent.dev/subgroup-size-chosen": "16"})
        await kube.aclose()
        server.close()
        return seen

    _, _, body = run(main()).requests[0]
    assert json.loads(body)["metadata"] == {
        "name": "p0",
        "namespace": "ns",
        "annotations": {"gpuagent.dev/subgroup-size-chosen": "16"},
    }
