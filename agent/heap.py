"""The collector's pauses in a process that holds one large, long-lived heap (the extender's informer state).

CPython's cyclic collector stops every thread while it walks a generation, and a full collection walks
every object the process keeps: about a second at 9,216 GB200 trays and 60,000 pods, during which no
filter, prioritize or informer event runs (``gpu-node-agent bench extender``'s "gc pause max"). Nearly
all of that heap is the informers' state, which lives until the object it mirrors changes and is freed
by reference counting then, not by the collector. So once the state is listed, :class:`HeapKeeper`
collects once and moves everything left into the collector's permanent generation (``gc.freeze``); each
``refreeze_s`` it collects the young generations (what was made since: cheap) and freezes what is left
too, so the full collections the interpreter starts on its own walk only a few seconds' survivors.
Frozen objects are still freed when their last reference goes; only a reference cycle among them would
wait, so each ``thaw_s`` everything is thawed and collected once (one full pause per ``thaw_s``, as
every full collection was before). What such a cycle can hold meanwhile is bounded: only objects alive
at a freeze and in a cycle that dies after it (a request in flight then), since the interpreter's own
full collections free the cycles that die before.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable

__all__ = ["HeapKeeper"]


class HeapKeeper:
    """Freezes the collected heap once it is worth keeping and keeps it frozen (module docstring)."""

    def __init__(
        self, *, refreeze_s: float = 2.0, thaw_s: float = 3600.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not 0 < refreeze_s <= thaw_s:
            raise ValueError(f"need 0 < refreeze_s <= thaw_s, got {refreeze_s} and {thaw_s}")
        self.refreeze_s = refreeze_s
        self.thaw_s = thaw_s
        self.clock = clock
        self._frozen_at: float | None = None
        self._thawed_at = 0.0

    def tick(self) -> str | None:
        """Freeze now if due: ``"froze"`` the first time, ``"refroze"`` each ``refreeze_s`` after,
        ``"thawed"`` when everything was thawed and collected first (each ``thaw_s``); None when not due."""
        now = self.clock()
        if self._frozen_at is None:
            what = "froze"
            self._thawed_at = now
        elif now - self._frozen_at < self.refreeze_s:
            return None
        elif now - self._thawed_at >= self.thaw_s:
            gc.unfreeze()
            what = "thawed"
            self._thawed_at = now
        else:
            what = "refroze"
        gc.collect(1 if what == "refroze" else 2)
        gc.freeze()
        self._frozen_at = now
        return what

    def release(self) -> None:
        """Give every frozen object back to the collector (the process stops keeping its state)."""
        gc.unfreeze()
        self._frozen_at = None

    async def run(self, stop: asyncio.Event, ready: Callable[[], bool], interval_s: float = 1.0) -> None:
        """``tick`` every ``interval_s`` once ``ready()`` (the informers listed) until ``stop``."""
        while not stop.is_set():
            if ready():
                self.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
