"""The latest pod-resources snapshot, refreshed in the background so readers never call the kubelet.

A failed refresh keeps the last good snapshot (pods rarely change between refreshes, and a kubelet
restart must not strip every label at once) and counts the error; ``stale`` tells when the last good
answer is older than ``stale_after_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.podresources.client import PodResourcesClient, PodResourcesError
from agent.podresources.model import EMPTY, PodResourcesSnapshot
from topology import logs
from topology.lifecycle import sleep_until


@dataclass(frozen=True, slots=True)
class PodResourcesStats:
    refreshes: int = 0
    errors: int = 0
    last_success_unix: float | None = None
    last_error: str | None = None
    generation: int = 0  # bumps whenever the snapshot's content changes


class PodResourcesCache:
    def __init__(
        self,
        *,
        client: PodResourcesClient,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"pod-resources refresh interval must be > 0 s, got {interval_s}")
        self._client = client
        self._interval_s = interval_s
        self._clock = clock
        self._snapshot: PodResourcesSnapshot = EMPTY
        self._stats = PodResourcesStats()
        self._log = logs.get_logger("agent.podresources").bind(socket=client.socket_path)

    def snapshot(self) -> PodResourcesSnapshot:
        return self._snapshot

    def stats(self) -> PodResourcesStats:
        return self._stats

    async def refresh(self) -> bool:
        """One refresh; ``True`` when it succeeded."""
        s = self._stats
        try:
            snap = await self._client.snapshot()
        except PodResourcesError as exc:
            if s.last_error != str(exc):
                self._log.warning("podresources_refresh_failed", error=str(exc))
            self._stats = PodResourcesStats(
                refreshes=s.refreshes + 1,
                errors=s.errors + 1,
                last_success_unix=s.last_success_unix,
                last_error=str(exc),
                generation=s.generation,
            )
            return False
        changed = snap != self._snapshot
        if s.last_error is not None:
            self._log.info("podresources_refresh_recovered", pods=snap.pods_listed)
        if changed:
            self._snapshot = snap
        self._stats = PodResourcesStats(
            refreshes=s.refreshes + 1,
            errors=s.errors,
            last_success_unix=self._clock(),
            last_error=None,
            generation=s.generation + 1 if changed else s.generation,
        )
        return True

    async def run(self, stop: asyncio.Event, *, refresh_first: bool = True) -> None:
        """Refresh every interval until ``stop`` is set (at once unless ``refresh_first`` is False,
        for a caller that just refreshed); closes the client on the way out."""
        try:
            if not refresh_first:
                await sleep_until(stop, self._interval_s)
            while not stop.is_set():
                await self.refresh()
                await sleep_until(stop, self._interval_s)
        finally:
            await self._client.close()
