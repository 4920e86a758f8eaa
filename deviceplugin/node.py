"""What the device plugin needs from the node, as Protocols it defines itself.

The node side (``agent.runtime.InventoryStore``) satisfies them structurally; this package imports
nothing of it, and a test can hand in any object that answers the same calls.

- :class:`NodeState`: the node's inventory now, the health of a device (:class:`DeviceHealthSource`)
  and a listener for changes (:class:`NodeChange`).
- :class:`HealthStatus`: one device's health as the node decided it.

The device plugin keeps no health of its own: it asks ``device_health(device.health_keys)`` whenever
it answers kubelet (``PluginState``), and when a change says health moved it wakes the ListAndWatch
streams at once. Its lifecycle is the node's component contract: ``PluginManager.run(stop)`` returns
soon after ``stop`` is set, having stopped its servers and removed its sockets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from topology.model import NodeInventory


class HealthStatus(Protocol):
    """One device's health: whether it is healthy, and why not."""

    @property
    def healthy(self) -> bool: ...

    @property
    def reason(self) -> str | None: ...


class DeviceHealthSource(Protocol):
    """Answers the health of a device made of several keys (GPU and MIG UUIDs); the node decides the
    rule (a device is unhealthy when any of its keys is)."""

    def device_health(self, keys: Iterable[str]) -> HealthStatus: ...


class NodeChange(Protocol):
    """What one change of the node says."""

    @property
    def inventory_changed(self) -> bool: ...

    @property
    def health_changed(self) -> bool: ...


class NodeState(DeviceHealthSource, Protocol):
    """The node as the device plugin sees it."""

    @property
    def inventory(self) -> NodeInventory: ...

    def add_listener(self, listener: Callable[[NodeChange], None]) -> Callable[[], None]:
        """Call ``listener`` synchronously on every change (on the event loop); returns a function that
        removes it."""
        ...
