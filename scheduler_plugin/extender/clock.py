"""The extender's one clock: API time (seconds since the epoch, what pod timestamps and time limits are
written in) that never steps backwards.

The wall clock is read once, at start; from then on the time is that plus the monotonic clock's
elapsed seconds. A wall clock stepped back (NTP, an operator) cannot move a barrier's deadline, a
plan's expiry or a queue reservation's start into the future again, nor make a pass judge work as
younger than it is; the cost is the drift of the node's clock since start, which NTP keeps small.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ApiClock:
    """``clock()``: seconds since the epoch, read from the wall clock once (``epoch``, at construction)
    and advanced by the monotonic clock (``monotonic``) only. Both are arguments so a test can step
    them."""

    def __init__(
        self, *, epoch: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._monotonic = monotonic
        self._offset = epoch() - monotonic()

    def __call__(self) -> float:
        return self._offset + self._monotonic()
