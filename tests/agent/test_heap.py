"""``agent.heap.HeapKeeper``: the listed state frozen out of the collector's full collections, garbage
collected before each freeze, everything thawed and collected again each ``thaw_s``."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from agent.heap import HeapKeeper


class Node:
    """An object that can sit in a reference cycle and be watched by a weak reference."""

    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Iterator[Clock]:
    yield Clock()
    gc.unfreeze()  # what a test froze goes back to the collector


def test_freezes_once_then_only_each_refreeze_interval(clock: Clock) -> None:
    keeper = HeapKeeper(refreeze_s=60, thaw_s=3600, clock=clock)
    assert keeper.tick() == "froze"
    frozen = gc.get_freeze_count()
    assert frozen > 0
    clock.t = 59
    assert keeper.tick() is None
    kept = [Node() for _ in range(100)]  # state listed since
    clock.t = 60
    assert keeper.tick() == "refroze"
    assert gc.get_freeze_count() >= frozen + len(kept)


def test_garbage_is_collected_before_it_is_frozen(clock: Clock) -> None:
    keeper = HeapKeeper(refreeze_s=10, thaw_s=100, clock=clock)
    gone = cycle()  # unreachable at once: only the collector frees a cycle
    assert keeper.tick() == "froze"
    assert gone() is None


def test_garbage_made_since_the_last_freeze_is_collected_before_the_next(clock: Clock) -> None:
    keeper = HeapKeeper(refreeze_s=10, thaw_s=100, clock=clock)
    assert keeper.tick() == "froze"
    gone = cycle()
    clock.t = 10
    assert keeper.tick() == "refroze"
    assert gone() is None


def test_a_cycle_frozen_while_alive_is_freed_at_the_next_thaw(clock: Clock) -> None:
    keeper = HeapKeeper(refreeze_s=10, thaw_s=100, clock=clock)
    a = Node()
    a.other = Node()
    a.other.other = a
    watch = weakref.ref(a)
    assert keeper.tick() == "froze"
    del a  # the cycle is garbage now, but frozen: the collector does not see it
    clock.t = 10
    assert keeper.tick() == "refroze"
    assert watch() is not None
    clock.t = 100
    assert keeper.tick() == "thawed"
    assert watch() is None


def test_release_gives_everything_back(clock: Clock) -> None:
    keeper = HeapKeeper(clock=clock)
    keeper.tick()
    keeper.release()
    assert gc.get_freeze_count() == 0
    assert keeper.tick() == "froze"  # and the next tick freezes afresh


def test_run_waits_for_the_listing_and_stops(clock: Clock) -> None:
    keeper = HeapKeeper(refreeze_s=1, thaw_s=10, clock=clock)
    listed = False

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(keeper.run(stop, lambda: listed, interval_s=0.01))
        await asyncio.sleep(0.05)
        assert gc.get_freeze_count() == 0  # not listed yet: nothing frozen
        nonlocal listed
        listed = True
        for _ in range(200):
            await asyncio.sleep(0.01)
            if gc.get_freeze_count():
                break
        assert gc.get_freeze_count() > 0
        stop.set()
        await task

    asyncio.run(main())


def test_bad_intervals_are_refused() -> None:
    with pytest.raises(ValueError, match="refreeze_s"):
        HeapKeeper(refreeze_s=0)
    with pytest.raises(ValueError, match="refreeze_s"):
        HeapKeeper(refreeze_s=10, thaw_s=5)
