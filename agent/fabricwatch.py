"""Component of ``run``: keeps the inventory's NVLink fabric facts current between discoveries.

Every ``interval_s`` the fabric info of each GPU that has some (and is not lost) is read again; when any
GPU's differs from the store's inventory, the store gets the inventory with the new fabric entries, and
its readers follow: the health monitor hands the fabric to the health book (the fabric policy's "out of
kubelet"), the publisher rewrites the ``GPUNode`` and the labels (``gpuagent.dev/fabric-health``, the
clique), the metrics show the conditions.

A read that fails keeps that GPU's last known entry (GPU lost and driver errors are the health monitor's
business; a failed read is not evidence about the fabric). Each round reads one value per fabric GPU
in a worker thread and changes the store only when something differs.
"""

from __future__ import annotations

import asyncio
import dataclasses

from agent.nvml.errors import NVMLError
from agent.nvml.protocol import NvmlBackend
from agent.runtime import InventoryStore
from topology import logs
from topology.fabrichealth import fabric_conditions
from topology.lifecycle import sleep_until
from topology.model import FabricInfo, NodeInventory


class FabricWatch:
    """Component: re-reads fabric info every ``interval_s`` and stores what changed."""

    def __init__(self, *, nvml: NvmlBackend, store: InventoryStore, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._nvml = nvml
        self._store = store
        self._interval = interval_s
        self._log = logs.get_logger("agent.fabricwatch")
        self.rounds = 0
        self.changes = 0
        self.read_failures = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not await sleep_until(stop, self._interval):
            await self.once()

    async def once(self) -> bool:
        """One round; ``True`` when the store got new fabric facts."""
        inventory = self._store.inventory
        targets = _targets(inventory)
        if not targets:
            return False
        fresh = await asyncio.to_thread(self._read, targets)
        self.rounds += 1
        current = self._store.inventory
        if current is not inventory:  # a rediscovery landed meanwhile: its facts are newer
            return False
        merged = tuple(fresh.get(f.gpu_index, f) for f in current.fabric)
        if merged == current.fabric:
            return False
        for before, after in zip(current.fabric, merged, strict=True):
            if before != after:
                self._log.info(
                    "fabric_changed",
                    gpu=after.gpu_index,
                    state=after.state.value,
                    health_summary=after.health_summary.value,
                    conditions=[c.value for c in fabric_conditions(after)],
                )
        self.changes += 1
        self._store.set_inventory(dataclasses.replace(current, fabric=merged))
        return True

    def _read(self, targets: tuple[int, ...]) -> dict[int, FabricInfo]:
        out: dict[int, FabricInfo] = {}
        for index in targets:
            try:
                info = self._nvml.fabric(index)
            except NVMLError:
                self.read_failures += 1
                continue
            if info is not None:
                out[index] = info
        return out


def _targets(inventory: NodeInventory) -> tuple[int, ...]:
    live = {g.index for g in inventory.gpus if not g.lost}
    return tuple(f.gpu_index for f in inventory.fabric if f.gpu_index in live)
