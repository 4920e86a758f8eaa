"""The DRA driver as one node component: ``DraDriver.run(stop)``.

- Devices: the device plugin's resource plan (the one resource manager) restricted to the resources
  the ``dra`` config serves; the device plugin serves the others (each device by exactly one API).
- Start: load the checkpoint (problems are logged, never fatal), write the CDI spec, serve the service
  socket, then the registration socket the kubelet's plugin watcher finds.
- Change: an inventory change re-plans (MIG reconfiguration, hot-plug) and rewrites the CDI spec; any
  change re-renders the slices, which are written only when they differ; a health change wakes the
  health streams.
- Kubelet restarts: the kubelet's plugin watcher finds our registration socket again by itself; a
  socket removed under us (the directory wiped) is served again at the next poll.
- Stop: both servers stop with a grace period and their sockets are removed; the checkpoint stays.

IMEX channels (``channels``, with ``dra.imexChannels``): the pool gets the node's ``imex-channel``
device and prepare gives each gang its channel (:mod:`deviceplugin.dra.imexchannel`); at start the
channels' CDI spec is written again from the checkpoint, and once the node is in a complete NVLink domain
the holds the domain's record keeps for it that no claim accounts for (a lost checkpoint) are given back.

Health as device taints: ``faults`` gives each published device the faults the node's health owner
decided for it (:mod:`deviceplugin.dra.taints` renders them; none by default); every health change
re-renders the pool, which is written when the taints differ, so a recovered device loses its taints.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from deviceplugin.cdi import cdi_spec, write_spec
from deviceplugin.config import PluginConfig
from deviceplugin.dra.channels import ChannelError
from deviceplugin.dra.checkpoint import Checkpoint
from deviceplugin.dra.config import DraConfig
from deviceplugin.dra.imexchannel import ImexChannels
from deviceplugin.dra.prepare import ClaimSource, Preparer
from deviceplugin.dra.publish import SliceApi, SlicePublisher
from deviceplugin.dra.server import (
    DeviceHealthRow,
    HealthView,
    UnixServer,
    registration_server,
    service_server,
)
from deviceplugin.dra.slices import PcieRoot, SliceDevice, build_slices, slice_devices
from deviceplugin.dra.taints import Fault, render_taints
from deviceplugin.node import NodeChange, NodeState
from deviceplugin.resources import Device, ResourceError, build_plan
from deviceplugin.server import PluginError
from topology import logs
from topology.kube import KubeError
from topology.lifecycle import wait_for_event

SERVICE_SOCKET = "dra.sock"
CHECKPOINT = "checkpoint.json"

DeviceFaults = Callable[[Device], Sequence[Fault]]
"""The faults of one published device, as the node's health owner decided them."""


def registration_socket(config: DraConfig) -> Path:
    return Path(config.registry_dir) / f"{config.driver_name}-reg.sock"


class DraDriver:
    """Component serving the node's DRA devices to the kubelet and publishing them as ResourceSlices."""

    def __init__(
        self,
        *,
        store: NodeState,
        config: DraConfig,
        plugin_config: PluginConfig,
        node_name: str,
        claims: ClaimSource,
        slices: SliceApi | None,
        pcie_root: PcieRoot = lambda _bus: None,
        faults: DeviceFaults | None = None,
        channels: ImexChannels | None = None,
        grace_s: float = 1.0,
        poll_s: float = 0.5,
        min_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        verify_interval_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self.config = config
        self._plugin_config = plugin_config
        self.node_name = node_name
        self._pcie_root = pcie_root
        self._faults = faults
        self._grace = grace_s
        self._poll = poll_s
        self._min_backoff = min_backoff_s
        self._max_backoff = max_backoff_s
        self._clock = clock
        self._verify_interval = verify_interval_s
        self._next_verify = clock() + verify_interval_s
        self._log = logs.get_logger("deviceplugin.dra").bind(driver=config.driver_name, node=node_name)
        self.service_dir = Path(config.plugin_dir) / config.driver_name
        self.service_socket = self.service_dir / SERVICE_SOCKET
        self.registration_socket = registration_socket(config)
        self.devices: dict[str, SliceDevice] = {}
        self.checkpoint = Checkpoint(self.service_dir / CHECKPOINT, driver=config.driver_name)
        self.preparer = Preparer(
            checkpoint=self.checkpoint,
            claims=claims,
            health=store,
            driver=config.driver_name,
            pool=node_name,
            kind=config.kind,
            published=lambda: self.devices,
            channels=channels,
        )
        self.channels = channels
        self.health = HealthView(self._health_rows)
        self.publisher = (
            SlicePublisher(api=slices, node_name=node_name, driver=config.driver_name, desired=self.slices)
            if slices is not None
            else None
        )
        self.registered = False
        self.registration_error = ""
        self.started = asyncio.Event()
        self._servers: list[UnixServer] = []
        self._socket_errors: dict[Path, str] = {}
        self._inventory_dirty = False
        # once, when the node is in a domain (``_reconcile``)
        self._reconcile_channels = channels is not None and channels.reconciles
        self._reconcile_at = 0.0
        self._reconcile_backoff = min_backoff_s
        self._publish_pending = True
        self._publish_at = 0.0
        self._backoff = min_backoff_s
        self._wake = asyncio.Event()

    # ----------------------------------------------------------------- views

    def plan_devices(self) -> dict[str, SliceDevice]:
        """The devices DRA serves now (raises ``ResourceError`` for a plan that cannot apply)."""
        plan = build_plan(self._store.inventory, self._plugin_config)
        served = [d for r in plan.resources if self.config.serves(r.name) for d in r.devices]
        return {sd.name: sd for sd in slice_devices(served)}

    def slices(self, generation: int, node_uid: str | None) -> list[dict[str, Any]]:
        inventory = self._store.inventory
        return build_slices(
            inventory,
            [sd.device for sd in self.devices.values()],
            node_name=self.node_name,
            node_uid=node_uid,
            driver=self.config.driver_name,
            generation=generation,
            taints=self.taints(),
            imex_channel=self.channels is not None,
            pcie_root=self._pcie_root,
        )

    def taints(self) -> dict[str, list[dict[str, Any]]]:
        """The rendered taints of the published devices that have any, by GPU/MIG UUID."""
        if self._faults is None:
            return {}
        out = {}
        for sd in self.devices.values():
            taints = render_taints(self._faults(sd.device), driver=self.config.driver_name)
            if taints:
                out[sd.device.base_uuid] = taints
        return out

    def _health_rows(self) -> list[DeviceHealthRow]:
        rows = []
        for name, sd in sorted(self.devices.items()):
            status = self._store.device_health(sd.device.health_keys)
            rows.append((self.node_name, name, status.healthy, "" if status.healthy else status.reason or ""))
        return rows

    def ready(self) -> bool:
        return self.problem() is None

    def problem(self) -> str | None:
        """Why the driver is not ready (a line for ``/readyz``), or ``None``."""
        if not self.started.is_set():
            return "not serving its sockets yet"
        if self._socket_errors:
            return "; ".join(sorted(self._socket_errors.values()))
        if self.registration_error:
            return f"the kubelet refused the registration: {self.registration_error[:200]}"
        if not self.registered:
            return f"not registered with the kubelet yet (plugin watcher, {self.registration_socket})"
        return None

    # ----------------------------------------------------------------- lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        self.devices = self.plan_devices()  # a plan that cannot apply at start is fatal (as for the plugin)
        for problem in await asyncio.to_thread(self.checkpoint.load):
            self._log.error(
                "dra_checkpoint_problem", reason=problem, hint="prepared claims are prepared again on demand"
            )
        self._write_cdi()
        if self.channels is not None:
            holds = [c.channel for c in self.checkpoint.claims.values() if c.channel is not None]
            try:
                await asyncio.to_thread(self.channels.write_spec, holds)
            except OSError as exc:
                self._log.error(
                    "dra_cdi_spec_write_failed", error=str(exc), hint="check cdi.specDir is writable"
                )
        self.health.changed()
        remove = self._store.add_listener(self._on_store)
        self._servers = [
            service_server(
                self.service_socket, preparer=self.preparer, health=self.health, grace_s=self._grace
            ),
            registration_server(
                self.registration_socket,
                driver=self.config.driver_name,
                endpoint=self.service_socket,
                on_status=self._on_registration,
                grace_s=self._grace,
            ),
        ]
        try:
            await self._serve_missing()
            self.started.set()
            self._log.info(
                "dra_driver_started",
                devices=len(self.devices),
                socket=str(self.service_socket),
                registration=str(self.registration_socket),
                claims=len(self.checkpoint.claims),
            )
            while not stop.is_set():
                await self._tick()
                await wait_for_event(self._wake, stop, self._poll)
                self._wake.clear()
        finally:
            remove()
            self.health.close()
            for server in reversed(self._servers):
                await server.stop()

    async def _serve_missing(self) -> None:
        for server in self._servers:
            if server.present():
                continue
            await server.stop(0)
            try:
                await server.start()
            except PluginError as exc:
                if self._socket_errors.get(server.socket_path) != str(exc):  # once per distinct failure
                    self._log.error("dra_socket_failed", reason=str(exc), hint="retrying at every poll")
                self._socket_errors[server.socket_path] = str(exc)
            else:
                self._socket_errors.pop(server.socket_path, None)
                if server.socket_path == self.registration_socket:
                    self.registered = False  # the plugin watcher registers us again
                    self.registration_error = ""
                self._log.info("dra_socket_serving", path=str(server.socket_path))

    async def _tick(self) -> None:
        if self._inventory_dirty:
            self._inventory_dirty = False
            try:
                self.devices = self.plan_devices()
            except ResourceError as exc:
                self._log.error(
                    "dra_plan_rejected", reason=str(exc), hint="keeping the devices published before"
                )
            else:
                self._write_cdi()
                self.health.changed()
        await self._serve_missing()
        if self._reconcile_channels:
            await self._reconcile()
        await self._publish()

    async def _reconcile(self) -> None:
        """The IMEX channel holds of this node that no claim accounts for any more are given back, once
        (``ImexChannels.reconcile``); after an error tried again with a doubling back-off until it could
        decide."""
        if self.channels is None or self.channels.domain() is None or self._clock() < self._reconcile_at:
            return
        held = [c.channel for c in self.checkpoint.claims.values() if c.channel is not None]
        try:
            released = await asyncio.to_thread(self.channels.reconcile, held=held)
        except (ChannelError, KubeError) as exc:
            self._reconcile_at = self._clock() + self._reconcile_backoff
            self._log.warning(
                "imex_channel_reconcile_failed",
                error=str(exc)[:300],
                retry_in_s=self._reconcile_backoff,
                hint="nothing was given back; the agent's RBAC needs get on resourceclaims",
            )
            self._reconcile_backoff = min(self._reconcile_backoff * 2, self._max_backoff)
            return
        if released is not None:
            self._reconcile_channels = False

    async def _publish(self) -> None:
        if self.publisher is not None and self._clock() >= self._next_verify:
            self._next_verify = self._clock() + self._verify_interval
            try:
                same = await asyncio.to_thread(self.publisher.verify)
            except KubeError as exc:
                self._log.warning("resourceslice_verify_failed", error=str(exc))
            else:
                if not same:
                    self._log.warning("resourceslices_changed_elsewhere", hint="writing the pool again")
                    self._publish_pending = True
        if self.publisher is None or not self._publish_pending or self._clock() < self._publish_at:
            return
        self._publish_pending = False  # before the write: a change while it is under way publishes again
        try:
            written = await asyncio.to_thread(self.publisher.publish_once)
        except KubeError as exc:
            self._publish_pending = True
            self.publisher.forget()
            self._publish_at = self._clock() + self._backoff
            self._log.warning("resourceslice_publish_failed", error=str(exc), retry_in_s=self._backoff)
            self._backoff = min(self._backoff * 2, self._max_backoff)
            return
        self._backoff = self._min_backoff
        if written:
            self._log.info("resourceslices_published", slices=written, generation=self.publisher.generation)

    def _write_cdi(self) -> None:
        spec = cdi_spec([sd.device for sd in self.devices.values()], kind=self.config.kind)
        try:
            path = write_spec(Path(self._plugin_config.cdi.spec_dir), spec)
        except OSError as exc:
            self._log.error("dra_cdi_spec_write_failed", error=str(exc), hint="check cdi.specDir is writable")
        else:
            self._log.info("dra_cdi_spec_written", path=str(path))

    def _on_store(self, change: NodeChange) -> None:
        if change.health_changed:
            self.health.changed()
        if change.inventory_changed:
            self._inventory_dirty = True
        self._publish_pending = True
        self._wake.set()

    def _on_registration(self, registered: bool, error: str) -> None:
        self.registered = registered
        self.registration_error = "" if registered else error or "no reason given"
        if registered:
            self._log.info("dra_registered")
        else:
            self._log.error("dra_registration_refused", error=error, hint="see the kubelet's log")
