"""The node runtime: the components ``run`` starts, the store they share, and their lifecycle.

- :class:`Component`: anything with ``async def run(self, stop: asyncio.Event) -> None`` that returns
  soon after ``stop`` is set, having released what it holds. Tests start and stop components this way,
  without signals.
- :class:`InventoryStore`: the current :class:`~topology.model.NodeInventory`, the current device health
  and XID counts; readers subscribe for changes. The device plugin (through its own
  ``deviceplugin.node.NodeState`` Protocol, which the store satisfies), the metrics exporter and the
  publisher read it; discovery and the health monitor write it. Health is decided by
  :class:`~agent.healthbook.HealthBook`; the store carries the book's latest
  :class:`~agent.healthbook.HealthTable` (immutable) and keeps no health of its own.
- :func:`run_components`: runs components in one TaskGroup until ``stop`` is set or one fails; then sets
  ``stop`` so the others shut down in order.

This module imports no adapter (no gRPC, no HTTP, no Kubernetes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agent.healthbook import DeviceHealth, HealthTable
from agent.nvml.protocol import EventKind, NvmlEvent
from topology import logs
from topology.lifecycle import sleep_until, wait_for_event
from topology.model import Gpu, NodeInventory


@runtime_checkable
class Component(Protocol):
    """A long-running part of ``run``."""

    async def run(self, stop: asyncio.Event) -> None: ...


class Change(enum.Flag):
    INVENTORY = enum.auto()
    HEALTH = enum.auto()
    EVENTS = enum.auto()


@dataclass(frozen=True, slots=True)
class StoreUpdate:
    version: int
    change: Change

    @property
    def inventory_changed(self) -> bool:
        return bool(self.change & Change.INVENTORY)

    @property
    def health_changed(self) -> bool:
        return bool(self.change & Change.HEALTH)


Listener = Callable[[StoreUpdate], None]


class InventoryStore:
    """Shared state of one node; every method runs on the event loop (no locking needed)."""

    def __init__(self, inventory: NodeInventory) -> None:
        self._inventory = inventory
        self._health = HealthTable()
        self._xids: dict[tuple[str, int], int] = {}
        self._events: dict[tuple[str, str], int] = {}
        self._version = 0
        self._changed = asyncio.Event()
        self._last_change = Change(0)
        self._listeners: list[Listener] = []

    # ----------------------------------------------------------------- reading

    @property
    def inventory(self) -> NodeInventory:
        return self._inventory

    @property
    def version(self) -> int:
        return self._version

    def health(self) -> HealthTable:
        """Every GPU and MIG device by UUID that is not healthy, with its reason; others are healthy."""
        return self._health

    def health_of(self, uuid: str) -> DeviceHealth:
        return self._health.of(uuid)

    def device_health(self, keys: Iterable[str]) -> DeviceHealth:
        """Health of a device made of several keys (a GPU and its MIG devices); see
        :meth:`HealthTable.device`."""
        return self._health.device(keys)

    def xid_counts(self) -> Mapping[tuple[str, int], int]:
        """XID events seen since start, by (GPU UUID, XID) — ignored XIDs included."""
        return dict(self._xids)

    def event_counts(self) -> Mapping[tuple[str, str], int]:
        """NVML events seen since start, by (GPU UUID, event kind)."""
        return dict(self._events)

    # ----------------------------------------------------------------- writing

    def set_inventory(self, inventory: NodeInventory) -> None:
        if inventory == self._inventory:
            return
        self._inventory = inventory
        self._bump(Change.INVENTORY)

    def set_health(self, health: Mapping[str, DeviceHealth]) -> None:
        """Publish the health table the book decided (any mapping is read as one: keys absent or
        healthy are healthy)."""
        table = health if isinstance(health, HealthTable) else HealthTable(health)
        if table == self._health:
            return
        self._health = table
        self._bump(Change.HEALTH)

    def record_event(self, event: NvmlEvent) -> None:
        key = (event.gpu_uuid, event.kind.value)
        self._events[key] = self._events.get(key, 0) + 1
        if event.kind is EventKind.XID and event.xid is not None:
            xkey = (event.gpu_uuid, event.xid)
            self._xids[xkey] = self._xids.get(xkey, 0) + 1
        self._bump(Change.EVENTS)

    # ----------------------------------------------------------------- following

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` synchronously on every change; returns a function that removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    async def wait_for_change(self, since: int, *, timeout: float | None = None) -> int:
        """The version after ``since``; returns at once if it moved already, or ``since`` on timeout."""
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        while self._version == since:
            event = self._changed
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if remaining is not None and remaining <= 0:
                break
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                break
        return self._version

    async def subscribe(self, stop: asyncio.Event) -> AsyncIterator[int]:
        """Yield the version now and after every change until ``stop`` is set."""
        seen = self._version
        yield seen
        while not stop.is_set():
            version = await self.wait_for_change(seen, timeout=0.25)
            if version != seen:
                seen = version
                yield seen

    def _bump(self, change: Change) -> None:
        self._version += 1
        self._last_change = change
        event, self._changed = self._changed, asyncio.Event()
        event.set()
        update = StoreUpdate(self._version, change)
        for listener in list(self._listeners):
            listener(update)


async def run_components(components: Sequence[Component], stop: asyncio.Event) -> None:
    """Run every component until ``stop`` is set. A component that fails or returns early sets ``stop``,
    so the others shut down in their own order instead of being cancelled; failures are raised together
    (an ``ExceptionGroup``) once every component has returned."""
    errors: list[Exception] = []

    async def guarded(component: Component) -> None:
        try:
            await component.run(stop)
        except Exception as exc:  # collected and re-raised below
            errors.append(exc)
        finally:
            stop.set()

    async with asyncio.TaskGroup() as tg:
        for component in components:
            tg.create_task(guarded(component), name=type(component).__name__)
    if errors:
        raise ExceptionGroup("a component of the node runtime failed", errors)


class Rediscovery:
    """Component: runs ``discover`` again when asked (MIG config change, hot-plug) or every ``interval_s``,
    and stores the new inventory; readers see it through the store.

    A discovery that fails (``discover`` raises, e.g. ``agent.discovery.DiscoveryIncompleteError`` when NVML
    did not answer) changes nothing: the last good inventory stays, so no device is withdrawn from
    kubelet and health events keep applying to the GPUs it knows. :meth:`problem` says why until a
    discovery succeeds again (readiness fails with it); meanwhile discovery is retried every
    ``retry_s``, doubling up to ``max_retry_s`` (never longer than ``interval_s``). Devices are withdrawn
    only when a discovery succeeds without them.
    """

    def __init__(
        self,
        *,
        store: InventoryStore,
        discover: Callable[[], NodeInventory],
        interval_s: float | None = None,
        debounce_s: float = 0.05,
        on_error: Callable[[Exception], None] | None = None,
        retry_s: float = 1.0,
        max_retry_s: float = 8.0,
    ) -> None:
        self._store = store
        self._discover = discover
        self._interval = interval_s
        self._debounce = debounce_s
        self._on_error = on_error
        self._first_retry = retry_s
        self._max_retry = max_retry_s if interval_s is None else min(max_retry_s, interval_s)
        self._retry = retry_s
        self._problem: str | None = None
        self._wanted = asyncio.Event()
        self._log = logs.get_logger("agent.runtime")
        self.reasons: list[str] = []
        self.runs = 0
        self.failures = 0

    def problem(self) -> str | None:
        """Why the inventory may be stale (the last discovery failed), or ``None``; a readiness check."""
        return self._problem

    def request(self, reason: str) -> None:
        """Ask for a rediscovery soon (safe to call from the event loop only)."""
        self.reasons.append(reason)
        self._wanted.set()

    def failed(self, exc: Exception) -> None:
        """Record a discovery that failed outside :meth:`once` (the first one, at start): readiness
        fails with it and discovery is retried as after any failure."""
        self.failures += 1
        if self._problem is None:
            self._retry = min(self._first_retry, self._max_retry)
        else:
            self._retry = min(self._retry * 2, self._max_retry)
        reason = f"discovery failed, the inventory may be stale: {_one_line(exc)}"
        if reason != self._problem:
            self._problem = reason
            if self._on_error is not None:
                self._on_error(exc)
            else:
                self._log.error(
                    "rediscovery_failed",
                    error=_one_line(exc),
                    hint="keeping the last inventory; no device is withdrawn until discovery answers",
                )

    async def run(self, stop: asyncio.Event) -> None:
        while True:
            timeout = self._retry if self._problem is not None else self._interval
            if await wait_for_event(self._wanted, stop, timeout):
                return
            if self._wanted.is_set() and await sleep_until(stop, self._debounce):
                return
            self._wanted.clear()
            await self.once()

    async def once(self) -> None:
        try:
            inventory = await asyncio.to_thread(self._discover)
        except Exception as exc:  # a failed rediscovery keeps the last inventory
            self.failed(exc)
            return
        self.runs += 1
        if self._problem is not None:
            self._log.info("rediscovery_recovered", gpus=len(inventory.gpus))
        self._problem = None
        self._retry = self._first_retry
        self._store.set_inventory(carry_lost_gpus(self._store.inventory, inventory))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def carry_lost_gpus(previous: NodeInventory, current: NodeInventory) -> NodeInventory:
    """Keep a GPU that was known and is now lost (discovery could not even read its UUID) in the
    inventory, marked lost, with its MIG devices: it stays advertised, Unhealthy, until it reappears,
    instead of silently vanishing from kubelet's capacity."""
    known = {g.index: g for g in previous.gpus if g.uuid}
    carried: dict[int, Gpu] = {}
    for gpu in current.gpus:
        before = known.get(gpu.index)
        if gpu.lost and not gpu.uuid and before is not None:
            carried[gpu.index] = dataclasses.replace(before, lost=True, error=gpu.error)
    if not carried:
        return current
    gpus = tuple(carried.get(g.index, g) for g in current.gpus)
    mig = tuple(s for s in current.mig if s.gpu_index not in carried) + tuple(
        s for s in previous.mig if s.gpu_index in carried
    )
    return dataclasses.replace(current, gpus=gpus, mig=tuple(sorted(mig, key=lambda s: s.gpu_index)))
