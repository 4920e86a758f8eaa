from __future__ import annotations

import asyncio
import collections
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent.udev import (
    HotplugEvent,
    PyudevSource,
    QueueHotplugSource,
    event_from_udev,
    normalize_pci_address,
    simulated_source,
)

GPU_PATH = "/devices/pci0000:16/0000:16:01.0/0000:1b:00.0"
IB_PATH = "/devices/pci0000:16/0000:16:02.0/0000:18:00.0/infiniband/mlx5_0"


@dataclass
class FakeDevice:
    """The attributes of ``pyudev.Device`` the source reads."""

    action: str | None
    subsystem: str
    device_path: str
    sys_name: str
    properties: dict[str, str] = field(default_factory=dict)


class FakeMonitor:
    """pyudev's ``Monitor`` surface over a pipe: readable when devices are queued."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        self._devices: collections.deque[FakeDevice] = collections.deque()
        self.filters: list[tuple[str, str | None]] = []
        self.started = False

    def fileno(self) -> int:
        return self._read

    def start(self) -> None:
        self.started = True

    def filter_by(self, subsystem: str, device_type: str | None = None) -> None:
        self.filters.append((subsystem, device_type))

    def poll(self, timeout: float | None = None) -> FakeDevice | None:
        assert timeout == 0, "the source must never block the event loop"
        try:
            os.read(self._read, 1)
        except BlockingIOError:
            return None
        return self._devices.popleft()

    def emit(self, device: FakeDevice) -> None:
        self._devices.append(device)
        os.write(self._write, b"x")

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


@pytest.fixture
def monitor() -> Iterator[FakeMonitor]:
    m = FakeMonitor()
    yield m
    m.close()


def _gpu(action: str, vendor: str = "10DE") -> FakeDevice:
    return FakeDevice(
        action,
        "pci",
        GPU_PATH,
        "0000:1b:00.0",
        {"PCI_ID": f"{vendor}:2330", "PCI_SLOT_NAME": "0000:1B:00.0"},
    )


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param(
            {"action": "add", "subsystem": "pci", "properties": {"PCI_ID": "10DE:2330"}},
            HotplugEvent("add", "pci", "0000:1b:00.0", "0000:1b:00.0"),
            id="nvidia-gpu-add",
        ),
        pytest.param(
            {"action": "unbind", "subsystem": "pci", "properties": {"ID_VENDOR_ID": "0x10de"}},
            HotplugEvent("unbind", "pci", "0000:1b:00.0", "0000:1b:00.0"),
            id="nvidia-unbind-vendor-property",
        ),
        pytest.param(
            {"action": "add", "subsystem": "pci", "properties": {"PCI_ID": "15B3:1021"}},
            None,
            id="mellanox-pci-ignored",
        ),
        pytest.param(
            {"action": "change", "subsystem": "pci", "properties": {"PCI_ID": "10DE:2330"}},
            None,
            id="change-ignored",
        ),
        pytest.param(
            {"action": "add", "subsystem": "usb", "properties": {"PCI_ID": "10DE:2330"}},
            None,
            id="other-subsystem-ignored",
        ),
        pytest.param(
            {"action": "add", "subsystem": "pci", "properties": {}},
            None,
            id="no-vendor-ignored",
        ),
    ],
)
def test_event_from_udev_pci(kwargs: dict[str, Any], expected: HotplugEvent | None) -> None:
    assert event_from_udev(device_path=GPU_PATH, sys_name="0000:1b:00.0", **kwargs) == expected


def test_event_from_udev_infiniband_takes_the_pci_function_from_the_path() -> None:
    event = event_from_udev(
        action="remove", subsystem="infiniband", properties={}, device_path=IB_PATH, sys_name="mlx5_0"
    )
    assert event == HotplugEvent("remove", "infiniband", "0000:18:00.0", "mlx5_0")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0000:1B:00.0", "0000:1b:00.0"),
        ("00000008:01:00.0", "0008:01:00.0"),
        ("mlx5_0", None),
        ("1b:00.0", None),
    ],
)
def test_normalize_pci_address(text: str, expected: str | None) -> None:
    assert normalize_pci_address(text) == expected


async def _collect(source: Any, n: int) -> list[HotplugEvent]:
    out: list[HotplugEvent] = []
    async for event in source.events():
        out.append(event)
        if len(out) == n:
            break
    return out


def test_pyudev_source_streams_only_watched_events(monitor: FakeMonitor) -> None:
    source = PyudevSource(monitor)
    assert sorted(s for s, _ in monitor.filters) == ["infiniband", "pci"]

    async def scenario() -> list[HotplugEvent]:
        task = asyncio.create_task(_collect(source, 3))
        await asyncio.sleep(0)
        monitor.emit(_gpu("remove"))
        monitor.emit(_gpu("add", vendor="8086"))  # not NVIDIA
        monitor.emit(FakeDevice("add", "infiniband", IB_PATH, "mlx5_0"))
        monitor.emit(_gpu("bind"))
        return await asyncio.wait_for(task, timeout=10)

    events = asyncio.run(scenario())
    assert monitor.started
    assert [(e.action, e.subsystem, e.pci_address) for e in events] == [
        ("remove", "pci", "0000:1b:00.0"),
        ("add", "infiniband", "0000:18:00.0"),
        ("bind", "pci", "0000:1b:00.0"),
    ]


def test_pyudev_source_ends_on_close_and_releases_the_fd(monitor: FakeMonitor) -> None:
    source = PyudevSource(monitor)

    async def scenario() -> list[HotplugEvent]:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(_collect(source, 99))
        await asyncio.sleep(0)
        monitor.emit(_gpu("add"))
        await asyncio.sleep(0.01)
        source.close()
        events = await asyncio.wait_for(task, timeout=10)
        assert not loop.remove_reader(monitor.fileno()), "reader must be removed after the stream ends"
        return events

    assert [e.action for e in asyncio.run(scenario())] == ["add"]


def test_queue_source_accepts_pushes_from_other_threads() -> None:
    source = QueueHotplugSource()

    async def scenario() -> list[HotplugEvent]:
        task = asyncio.create_task(_collect(source, 2))
        await asyncio.sleep(0)
        thread = threading.Thread(target=lambda: source.push("remove", "pci", "00000000:1B:00.0"))
        thread.start()
        thread.join(timeout=10)
        source.push("add", "infiniband", "0000:18:00.0", "mlx5_0")
        return await asyncio.wait_for(task, timeout=10)

    events = asyncio.run(scenario())
    # the other thread's push is scheduled onto the loop, so it may arrive after the loop thread's own
    assert sorted(events, key=lambda e: e.action) == [
        HotplugEvent("add", "infiniband", "0000:18:00.0", "mlx5_0"),
        HotplugEvent("remove", "pci", "0000:1b:00.0", "0000:1b:00.0"),
    ]


def test_queue_source_rejects_unknown_values_and_ignores_pushes_after_close() -> None:
    source = QueueHotplugSource()
    with pytest.raises(ValueError, match="valid: add, bind, remove, unbind"):
        source.push("change", "pci", "0000:1b:00.0")
    with pytest.raises(ValueError, match="valid: infiniband, pci"):
        source.push("add", "usb", None)
    source.close()
    source.push("add", "pci", "0000:1b:00.0")

    async def drain() -> list[HotplugEvent]:
        return [e async for e in source.events()]

    assert asyncio.run(drain()) == []


def test_simulated_source_follows_the_simulator_and_unsubscribes_on_close() -> None:
    from agent.nvml.fake import HotplugEvent as SimEvent

    class Sim:
        """The simulator's listener interface (``SimulatedNvml.add_hotplug_listener``)."""

        def __init__(self) -> None:
            self.listeners: list[Any] = []

        def add_hotplug_listener(self, callback: Any) -> Any:
            self.listeners.append(callback)
            return lambda: self.listeners.remove(callback)

        def lose(self, bus: str) -> None:
            for cb in list(self.listeners):
                cb(SimEvent("remove", "pci", bus))

    sim = Sim()
    source = simulated_source(sim)
    sim.lose("0000:43:00.0")
    source.close()
    assert sim.listeners == []
    sim.lose("0000:52:00.0")

    async def drain() -> list[HotplugEvent]:
        return [e async for e in source.events()]

    assert asyncio.run(drain()) == [HotplugEvent("remove", "pci", "0000:43:00.0", "0000:43:00.0")]
