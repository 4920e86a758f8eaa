"""Run asyncio servers (exporter, fake kubelet) in a background loop thread for synchronous tests."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import urllib.parse
from collections.abc import Coroutine
from typing import Any, TypeVar

from agent.metrics.exporter import MetricsExporter

T = TypeVar("T")


class LoopThread:
    """An event loop in a daemon thread; ``call`` runs a coroutine there and waits (bounded)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)

    def __enter__(self) -> LoopThread:
        self._thread.start()
        return self

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __exit__(self, *exc: object) -> None:
        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.call(drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


class RunningExporter:
    """Starts ``exporter.run(stop)`` on a loop thread; stops it (bounded) on exit."""

    def __init__(self, loop: LoopThread, exporter: MetricsExporter) -> None:
        self.loop = loop
        self.exporter = exporter
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def __enter__(self) -> RunningExporter:
        async def start() -> None:
            self._stop = asyncio.Event()
            self._task = asyncio.create_task(self.exporter.run(self._stop))
            await asyncio.wait_for(self.exporter.serving.wait(), timeout=30)

        self.loop.call(start())
        return self

    @property
    def port(self) -> int:
        return self.exporter.server.bound_port

    def refresh(self) -> None:
        """One pod-resources and one metrics refresh now (instead of waiting for the interval)."""

        async def go() -> None:
            if self.exporter.podresources is not None:
                await self.exporter.podresources.refresh()
            await self.exporter.cache.refresh()

        self.loop.call(go())

    def get(self, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        finally:
            conn.close()

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._stop is not None
            assert self._task is not None
            self._stop.set()
            await asyncio.wait_for(self._task, timeout=30)

        self.loop.call(stop(), timeout=60)


def prometheus_query(port: int, expr: str) -> list[dict[str, Any]]:
    """An instant PromQL query against a local Prometheus; the result vector."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        body = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    if body.get("status") != "success":
        raise AssertionError(f"query {expr!r}: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result
