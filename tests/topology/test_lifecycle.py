"""The stop-aware waits every component loop uses."""

from __future__ import annotations

import asyncio

from topology.lifecycle import sleep_until, wait_for_event


def test_sleep_until() -> None:
    async def body() -> tuple[bool, bool]:
        stop = asyncio.Event()
        first = await sleep_until(stop, 0.01)
        stop.set()
        return first, await sleep_until(stop, 10)

    assert asyncio.run(body()) == (False, True)


def test_wait_for_event_returns_on_the_event_the_stop_or_the_timeout() -> None:
    async def body() -> list[tuple[bool, bool]]:
        event, stop = asyncio.Event(), asyncio.Event()
        seen = [(await wait_for_event(event, stop, 0.01), event.is_set())]  # timeout
        asyncio.get_running_loop().call_later(0.01, event.set)
        seen.append((await wait_for_event(event, stop), event.is_set()))  # the event, left set
        stop.set()
        seen.append((await wait_for_event(asyncio.Event(), stop), stop.is_set()))  # the stop, no timeout
        return seen

    assert asyncio.run(body()) == [(False, False), (False, True), (True, True)]
