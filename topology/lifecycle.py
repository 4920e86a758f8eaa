"""Waiting inside a long-running component: the two waits every ``run(stop)`` loop needs, written once.

A component runs until its ``stop`` event is set and must notice it promptly, whatever else it waits
for. :func:`sleep_until` waits for ``stop`` or a timeout; :func:`wait_for_event` waits for another
event (new work), ``stop`` or an optional timeout. Both return whether ``stop`` is set, so a loop reads
``while not await sleep_until(stop, interval): ...``.

Here, at the bottom layer, so the node agent, the device plugin and the cluster side share one version.
"""

from __future__ import annotations

import asyncio


async def sleep_until(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to ``seconds``; returns True when ``stop`` was set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=max(seconds, 0))
    except TimeoutError:
        return stop.is_set()
    return True


async def wait_for_event(event: asyncio.Event, stop: asyncio.Event, timeout: float | None = None) -> bool:
    """Wait until ``event`` or ``stop`` is set, or ``timeout`` seconds pass (``None``: no limit).

    Returns True when ``stop`` is set. ``event`` is left as it is: the caller clears it once it has
    taken the work it announced.
    """
    waiter = asyncio.ensure_future(event.wait())
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({waiter, stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        stopper.cancel()
    return stop.is_set()
