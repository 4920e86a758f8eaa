"""Hot-plug watching: NVIDIA PCI functions and InfiniBand devices appearing, going, binding, unbinding.

Two sources with one interface (:class:`HotplugSource`), each an async stream of :class:`HotplugEvent`:

- :class:`PyudevSource` — the kernel's udev netlink monitor through ``pyudev`` (``subsystem=pci`` with
  NVIDIA vendor id ``0x10de``, and ``subsystem=infiniband``; actions ``add``, ``remove``, ``bind``,
  ``unbind``). It takes any object with pyudev's ``Monitor`` surface (``fileno``, ``start``, ``poll``,
  ``filter_by``), so tests drive it with a fake monitor; :meth:`PyudevSource.from_system` builds the real one.
- :class:`QueueHotplugSource` — in memory: whoever simulates hardware calls :meth:`~QueueHotplugSource.push`
  (the NVML simulator on ``gpu_lost``/``recover``, a test). :func:`simulated_source` subscribes it to
  ``SimulatedNvml.add_hotplug_listener``, whose listener receives events with ``action``, ``subsystem``
  and ``pci_address`` attributes, and unsubscribes on close.

The ``run`` command consumes ``events()`` to trigger rediscovery. Iteration ends after ``close()``.
:func:`event_from_udev` is the pure filter/normaliser both sources share.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

ACTIONS: Final = frozenset({"add", "remove", "bind", "unbind"})
SUBSYSTEMS: Final = frozenset({"pci", "infiniband"})
NVIDIA_VENDOR_ID: Final = 0x10DE

_PCI_ADDRESS = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


@dataclass(frozen=True, slots=True)
class HotplugEvent:
    action: str  # "add" | "remove" | "bind" | "unbind"
    subsystem: str  # "pci" | "infiniband"
    pci_address: str | None  # sysfs form "0000:1b:00.0"; the HCA's PCI function for infiniband
    device: str | None = None  # kernel name: the PCI address for pci, "mlx5_0" for infiniband


def normalize_pci_address(text: str) -> str | None:
    """``0000:1B:00.0`` / ``00000000:1b:00.0`` → ``0000:1b:00.0``; anything else → ``None``."""
    match = _PCI_ADDRESS.match(text.strip())
    if not match:
        return None
    domain, bus, dev, fn = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


def _vendor(properties: Mapping[str, str]) -> int | None:
    pci_id = properties.get("PCI_ID")  # "10DE:2330"
    if pci_id and ":" in pci_id:
        try:
            return int(pci_id.split(":", 1)[0], 16)
        except ValueError:
            return None
    vendor = properties.get("ID_VENDOR_ID")  # "0x10de"
    if vendor:
        try:
            return int(vendor, 16)
        except ValueError:
            return None
    return None


def _pci_from_path(device_path: str) -> str | None:
    """The last PCI function in a sysfs device path (``/devices/pci0000:16/…/0000:18:00.0/infiniband/…``)."""
    found = None
    for part in device_path.split("/"):
        address = normalize_pci_address(part)
        if address:
            found = address
    return found


def event_from_udev(
    *,
    action: str | None,
    subsystem: str | None,
    properties: Mapping[str, str],
    device_path: str,
    sys_name: str,
) -> HotplugEvent | None:
    """Our event for one uevent, or ``None`` when it is not one we watch."""
    if action not in ACTIONS or subsystem not in SUBSYSTEMS:
        return None
    if subsystem == "pci":
        if _vendor(properties) != NVIDIA_VENDOR_ID:
            return None
        address = normalize_pci_address(properties.get("PCI_SLOT_NAME", "") or sys_name)
        if address is None:
            address = _pci_from_path(device_path)
        return HotplugEvent(action, subsystem, address, address)
    return HotplugEvent(action, subsystem, _pci_from_path(device_path), sys_name or None)


class HotplugSource(Protocol):
    def events(self) -> AsyncIterator[HotplugEvent]:
        """Events as they arrive; ends after :meth:`close`."""
        ...

    def close(self) -> None: ...


_CLOSED: Final = object()


class _QueueBase:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._closed = False

    def _put(self, item: object) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed() and threading.get_ident() != self._loop_thread:
            loop.call_soon_threadsafe(self._queue.put_nowait, item)
        else:
            self._queue.put_nowait(item)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._put(_CLOSED)

    async def _drain(self) -> AsyncIterator[HotplugEvent]:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        while True:
            item = await self._queue.get()
            if item is _CLOSED:
                return
            assert isinstance(item, HotplugEvent)
            yield item


class QueueHotplugSource(_QueueBase):
    """In-memory hot-plug source; :meth:`push` may be called from any thread.

    ``on_close`` runs once when the source closes (e.g. to unsubscribe from a simulator).
    """

    def __init__(self, *, on_close: Callable[[], object] | None = None) -> None:
        super().__init__()
        self._on_close = on_close

    def close(self) -> None:
        if not self._closed and self._on_close is not None:
            self._on_close()
        super().close()

    def push(self, action: str, subsystem: str, pci_address: str | None, device: str | None = None) -> None:
        if action not in ACTIONS:
            raise ValueError(f"unknown hot-plug action {action!r}; valid: {', '.join(sorted(ACTIONS))}")
        if subsystem not in SUBSYSTEMS:
            raise ValueError(
                f"unknown hot-plug subsystem {subsystem!r}; valid: {', '.join(sorted(SUBSYSTEMS))}"
            )
        address = normalize_pci_address(pci_address) if pci_address else None
        if not self._closed:
            self._put(HotplugEvent(action, subsystem, address or pci_address, device or address))

    def events(self) -> AsyncIterator[HotplugEvent]:
        return self._drain()


def simulated_source(simulator: Any) -> QueueHotplugSource:
    """A :class:`QueueHotplugSource` fed by the simulator's hot-plug notifications.

    ``simulator.add_hotplug_listener(listener)`` calls ``listener(event)`` with an object carrying
    ``action``, ``subsystem`` and ``pci_address``, and returns an unsubscribe function.
    """
    source: QueueHotplugSource

    def listener(event: Any) -> None:
        source.push(str(event.action), str(event.subsystem), event.pci_address)

    unsubscribe = simulator.add_hotplug_listener(listener)
    source = QueueHotplugSource(on_close=unsubscribe if callable(unsubscribe) else None)
    return source


class MonitorLike(Protocol):
    """The part of ``pyudev.Monitor`` we use."""

    def fileno(self) -> int: ...

    def start(self) -> None: ...

    def poll(self, timeout: float | None = None) -> Any: ...

    def filter_by(self, subsystem: str, device_type: str | None = None) -> None: ...


def _device_event(device: Any) -> HotplugEvent | None:
    properties: Mapping[str, str] = getattr(device, "properties", None) or {}
    return event_from_udev(
        action=getattr(device, "action", None),
        subsystem=getattr(device, "subsystem", None),
        properties=properties,
        device_path=str(getattr(device, "device_path", "") or ""),
        sys_name=str(getattr(device, "sys_name", "") or ""),
    )


class PyudevSource(_QueueBase):
    """udev netlink events through a pyudev-style monitor, read when its fd is readable."""

    def __init__(self, monitor: MonitorLike) -> None:
        super().__init__()
        self._monitor = monitor
        for subsystem in sorted(SUBSYSTEMS):
            monitor.filter_by(subsystem)

    @classmethod
    def from_system(cls) -> PyudevSource:
        """The machine's udev monitor (needs ``pyudev`` and a netlink socket)."""
        import pyudev  # noqa: PLC0415 - only the agent on a node needs it

        context = pyudev.Context()
        return cls(pyudev.Monitor.from_netlink(context))

    def _on_readable(self) -> None:
        while True:
            device = self._monitor.poll(timeout=0)
            if device is None:
                return
            event = _device_event(device)
            if event is not None and not self._closed:
                self._queue.put_nowait(event)

    async def _events(self) -> AsyncIterator[HotplugEvent]:
        loop = asyncio.get_running_loop()
        self._monitor.start()
        fd = self._monitor.fileno()
        loop.add_reader(fd, self._on_readable)
        try:
            async for event in self._drain():
                yield event
        finally:
            loop.remove_reader(fd)

    def events(self) -> AsyncIterator[HotplugEvent]:
        return self._events()


def describe(event: HotplugEvent) -> dict[str, str | None]:
    """Log fields for an event."""
    return {
        "action": event.action,
        "subsystem": event.subsystem,
        "pci_address": event.pci_address,
        "device": event.device,
    }
