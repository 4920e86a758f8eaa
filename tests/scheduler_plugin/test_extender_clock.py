"""The extender's one clock (``extender.clock.ApiClock``): API time that never steps backwards."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from scheduler_plugin.extender import Extender, ExtenderState
from scheduler_plugin.extender.clock import ApiClock

T0 = 1_800_000_000.0


class Clocks:
    """A wall clock and a monotonic clock a test steps by hand."""

    def __init__(self) -> None:
        self.wall = T0
        self.monotonic = 500.0


def test_the_clock_starts_at_the_wall_time_and_advances_with_the_monotonic_clock() -> None:
    c = Clocks()
    clock = ApiClock(epoch=lambda: c.wall, monotonic=lambda: c.monotonic)
    assert clock() == T0
    c.monotonic += 2.5
    c.wall += 2.5
    assert clock() == T0 + 2.5


def test_the_clock_does_not_go_back_when_the_wall_clock_does() -> None:
    c = Clocks()
    clock = ApiClock(epoch=lambda: c.wall, monotonic=lambda: c.monotonic)
    c.monotonic += 10.0
    c.wall -= 3600.0  # NTP or an operator steps the node's clock back an hour
    assert clock() == T0 + 10.0
    c.monotonic += 1.0
    c.wall += 7200.0  # and forward two hours: read once, the wall clock is not read again
    assert clock() == T0 + 11.0


def test_the_default_clock_reads_seconds_since_the_epoch_and_never_steps_back() -> None:
    clock = ApiClock()
    reads = [clock() for _ in range(1000)]
    assert reads == sorted(reads)
    assert abs(reads[0] - time.time()) < 60.0  # API time, not the monotonic clock's own origin


class NoCluster:
    """A cluster the extender never calls here."""

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        raise AssertionError("not called")

    def event(self, pod: Mapping[str, Any], *, reason: str, message: str, warning: bool) -> None:
        raise AssertionError("not called")


def test_the_extender_runs_on_the_one_clock_by_default() -> None:
    assert isinstance(Extender(state=ExtenderState(), cluster=NoCluster()).clock, ApiClock)
