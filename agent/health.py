"""Health monitor: NVML events and probes feed the :class:`~agent.healthbook.HealthBook`, the one owner of
device health; after each change the book's :class:`~agent.healthbook.HealthTable` is handed to the
:class:`~agent.runtime.InventoryStore`, which tells its readers.

NVML's event wait blocks, so it runs in a worker thread (``asyncio.to_thread``) with a short timeout,
and each event is handed back to the loop. A failing wait is logged and retried with a back-off; it
never marks devices unhealthy by itself (only events and probes about a GPU do). A GPU_IS_LOST answer to
any other call (the metrics refresh, discovery, preferred allocation's PCIe levels) comes back from the
backend as a GPU_LOST event on the next wait (``agent.nvml.real``), within one wait timeout; while waits
fail and back off (up to ``MAX_WAIT_BACKOFF_S``), the monitor takes those reports every wait timeout
without waiting (``take_lost_reports``), so the back-off never delays a lost GPU.

Every GPU is probed every ``probe_interval_s``: one identity query and one bulk read of its volatile
ECC counts, row-remap and retirement flags (:meth:`~agent.nvml.protocol.NvmlBackend.health_reading`),
all GPUs in one worker-thread call; the book judges the readings (a GPU that stopped answering, a rise in
uncorrectable ECC, a pending remap, evidence of a reset). Fabric health is read from the store's inventory
(kept current by ``agent.fabricwatch.FabricWatch``) each time it changes, judged by the fabric policy
and handed to the book. A MIG configuration change asks for a rediscovery.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from agent.healthbook import HealthBook, HealthConfig, Outcome
from agent.nvml.errors import LOST_CODES, NVMLError
from agent.nvml.protocol import EventKind, HealthReading, NvmlBackend, NvmlEvent
from agent.runtime import InventoryStore, StoreUpdate
from topology import logs
from topology.fabrichealth import fabric_verdicts
from topology.lifecycle import sleep_until, wait_for_event

WAIT_TIMEOUT_MS = 100
MAX_WAIT_BACKOFF_S = 5.0


class HealthMonitor:
    """Component: keeps ``store``'s health table current from NVML."""

    def __init__(
        self,
        *,
        nvml: NvmlBackend,
        store: InventoryStore,
        config: HealthConfig,
        clock: Callable[[], float] = time.monotonic,
        wait_timeout_ms: int = WAIT_TIMEOUT_MS,
        on_mig_change: Callable[[str], None] | None = None,
    ) -> None:
        self._nvml = nvml
        self._store = store
        self._clock = clock
        self._wait_ms = wait_timeout_ms
        self._on_mig_change = on_mig_change
        self.book = HealthBook(config=config)
        self.config = config
        self.wait_failures = 0
        self.events_seen = 0
        self._registered: tuple[int, ...] = ()
        self._inventory_changed = asyncio.Event()
        self.started = asyncio.Event()  # set once events are registered and the loops run
        self._log = logs.get_logger("agent.health")

    async def run(self, stop: asyncio.Event) -> None:
        self._apply(self.book.set_inventory(self._store.inventory, self._clock()))
        self.apply_fabric()
        remove = self._store.add_listener(self._on_store)
        try:
            await self._register()
            self.started.set()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._events(stop))
                tg.create_task(self._probes(stop))
                tg.create_task(self._follow_inventory(stop))
        finally:
            remove()

    # ----------------------------------------------------------------- loops

    async def _events(self, stop: asyncio.Event) -> None:
        backoff = 0.1
        while not stop.is_set():
            try:
                event, reading = await asyncio.to_thread(self._wait_and_read)
            except NVMLError as exc:
                self.wait_failures += 1
                self._log.warning(
                    "nvml_event_wait_failed",
                    error=str(exc),
                    retry_in_s=backoff,
                    hint="device health still follows probes; check the driver if this repeats",
                )
                if await self._back_off(stop, backoff):
                    return
                backoff = min(backoff * 2, MAX_WAIT_BACKOFF_S)
                continue
            backoff = 0.1
            if event is not None:
                self.handle_event(event, reading)

    async def _back_off(self, stop: asyncio.Event, seconds: float) -> bool:
        """Sleep ``seconds`` after a failed wait (``True`` when stopped), taking the GPU_LOST reports
        other calls queue meanwhile every wait timeout: the back-off delays the next wait, never a lost
        GPU."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        step = max(self._wait_ms, 1) / 1000
        while True:
            for event in self._nvml.take_lost_reports():
                self.handle_event(event)
            left = end - loop.time()
            if left <= 0:
                return False
            if await sleep_until(stop, min(step, left)):
                return True

    def _wait_and_read(self) -> tuple[NvmlEvent | None, HealthReading | None]:
        """In a worker thread: the next event and, for an error event, the GPU's counters read right
        after it (what the fault left them at, so a reset that follows at once is still seen)."""
        event = self._nvml.wait_event(self._wait_ms)
        if event is None or event.kind not in (EventKind.XID, EventKind.ECC_DBE):
            return event, None
        try:
            return event, self._nvml.health_reading(event.gpu_index)
        except NVMLError:
            return event, None  # the next probe reads it (and sees a lost GPU)

    def handle_event(self, event: NvmlEvent, reading: HealthReading | None = None) -> Outcome:
        """Apply one event (public so tests and the event thread share one path); ``reading``: the GPU's
        counters read just after the event, kept as the baseline the next probe compares with."""
        self.events_seen += 1
        self._store.record_event(event)
        if event.kind is EventKind.MIG_CONFIG_CHANGE and self._on_mig_change is not None:
            self._on_mig_change("mig_config_change")
        outcome = self.book.on_event(event, self._clock())
        if reading is not None:
            self.book.note_reading(reading)
        if outcome.changed:
            key = min(outcome.changed)
            self._log.bind(gpu_uuid=event.gpu_uuid).warning(
                "device_unhealthy",
                event_kind=event.kind.value,
                xid=event.xid,
                devices=sorted(outcome.changed),
                reason=self.book.status(key).reason,
                hint="the device is withdrawn from new pods; the reason says what returns it",
            )
        self._apply(outcome)
        return outcome

    async def _probes(self, stop: asyncio.Event) -> None:
        while not await sleep_until(stop, self.config.probe_interval_s):
            await self.probe_once()

    async def probe_once(self) -> None:
        """Probe every GPU."""
        targets = self._probe_targets()
        results = await asyncio.to_thread(self._probe_all, targets)
        for (_, uuid), (answered, lost, error, reading) in zip(targets, results, strict=True):
            was = self.book.status(uuid)
            outcome = self.book.on_probe(
                uuid, answered=answered, lost=lost, now=self._clock(), error=error, reading=reading
            )
            log = self._log.bind(gpu_uuid=uuid)
            for key in sorted(outcome.changed):
                status = self.book.status(key)
                if status.healthy:
                    log.info("device_recovered", device=key)
                elif key == uuid and was.healthy:
                    log.warning(
                        "device_unhealthy",
                        source="probe",
                        devices=sorted(outcome.changed),
                        reason=status.reason,
                        hint="the device is withdrawn from new pods; the reason says what returns it",
                    )
            self._apply(outcome)

    def apply_fabric(self) -> None:
        """Hand the inventory's fabric, judged by the fabric policy, to the book (one more fault source)."""
        if not self.config.fabric_unhealthy_marks_gpu:
            return
        inventory = self._store.inventory
        uuids = {g.index: g.uuid for g in inventory.gpus if g.uuid and not g.lost}
        for verdict in fabric_verdicts(inventory, self.config.fabric_policy):
            uuid = uuids.get(verdict.gpu_index)
            if uuid is None or self.book.is_lost(uuid):
                continue
            outcome = self.book.on_fabric(uuid, verdict, self._clock())
            if outcome.changed:
                self._log.bind(gpu_uuid=uuid).warning(
                    "device_fabric_unhealthy",
                    reason=verdict.reason,
                    hint="set by the fabric policy (health.fabricUnhealthyMarksGpu); check the NVLink fabric",
                )
            self._apply(outcome)

    def _probe_targets(self) -> list[tuple[int, str]]:
        """(index, UUID) of every GPU of the inventory and every GPU the book holds unhealthy."""
        targets = {(g.index, g.uuid) for g in self._store.inventory.gpus if g.uuid}
        targets.update(self.book.unhealthy_gpus())
        return sorted(targets)

    def _probe_all(
        self, targets: list[tuple[int, str]]
    ) -> list[tuple[bool, bool, str | None, HealthReading | None]]:
        """In a worker thread: one health reading per GPU."""
        return [self._probe(index, uuid) for index, uuid in targets]

    def _probe(self, index: int, uuid: str) -> tuple[bool, bool, str | None, HealthReading | None]:
        try:
            reading = self._nvml.health_reading(index)
        except NVMLError as exc:
            return False, exc.value in LOST_CODES, str(exc), None
        if reading.uuid != uuid:
            return False, True, f"index {index} now answers as {reading.uuid}", None
        return True, False, None, reading

    async def _follow_inventory(self, stop: asyncio.Event) -> None:
        while not await wait_for_event(self._inventory_changed, stop):
            self._inventory_changed.clear()
            self._apply(self.book.set_inventory(self._store.inventory, self._clock()))
            self.apply_fabric()
            await self._register()

    # ----------------------------------------------------------------- helpers

    def _on_store(self, update: StoreUpdate) -> None:
        if update.inventory_changed:
            self._inventory_changed.set()

    async def _register(self) -> None:
        indices = tuple(g.index for g in self._store.inventory.gpus if not g.lost)
        if indices == self._registered:
            return
        try:
            await asyncio.to_thread(self._nvml.register_events, indices)
        except NVMLError as exc:
            self._log.warning(
                "nvml_event_registration_failed",
                error=str(exc),
                hint="events are not watched; health follows probes only",
            )
            return
        self._registered = indices

    def _apply(self, outcome: Outcome) -> None:
        if outcome.changed:
            self._store.set_health(self.book.table())
