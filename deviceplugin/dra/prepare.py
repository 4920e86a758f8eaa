"""NodePrepareResources / NodeUnprepareResources, without gRPC: what a claim's allocation gives the
container, checked against the devices this node publishes, and the checkpoint that makes both calls
idempotent.

- A claim already in the checkpoint is answered from it (the same devices, the same CDI IDs), without
  asking the API: a kubelet that restarted, or retried after a timeout, gets the same answer.
- A new claim is read from the API (``ClaimSource``); its ``status.allocation.devices.results`` for our
  driver must name devices of this node's pool that we publish and that are healthy now. The answer is
  written to the checkpoint before it is returned.
- Unprepare forgets the claim (an unknown claim is prepared-nothing: success).
- Each claim gets its own answer or its own error; one bad claim never fails the others.

Prepared devices reach the container by CDI: ``<kind>=<uuid>`` for the node-wide spec the driver
writes (:mod:`deviceplugin.cdi`).

A result naming the node's ``imex-channel`` device (with ``channels`` given) gets the gang's IMEX
channel (:mod:`deviceplugin.dra.imexchannel`): CDI ``<driver>/imex-channel=<N>``, the hold kept in the
checkpoint so unprepare gives it back, after a restart too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from deviceplugin.dra.channels import ChannelError
from deviceplugin.dra.checkpoint import (
    ChannelHold,
    Checkpoint,
    CheckpointError,
    PreparedClaim,
    PreparedDevice,
)
from deviceplugin.dra.imexchannel import IMEX_DEVICE, ImexChannels
from deviceplugin.dra.slices import SliceDevice
from deviceplugin.node import DeviceHealthSource
from topology import logs

MAX_RESULTS = 1024


class ClaimSource(Protocol):
    """Reads one ResourceClaim (camelCase dict), or ``None`` when it does not exist."""

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Prepared:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class PrepareError(ValueError):
    """A claim cannot be prepared here (one line, names the claim and the reason)."""


def devices_for(
    claim: Mapping[str, Any],
    ref: ClaimRef,
    *,
    driver: str,
    pool: str,
    published: Mapping[str, SliceDevice],
    kind: str,
    channel_device: str | None = None,
) -> tuple[PreparedDevice, ...]:
    """The prepared devices of one claim object; raises :class:`PrepareError`. Pure."""
    meta = claim.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    if uid != ref.uid:
        raise PrepareError(f"claim {ref}: the API has uid {uid!r:.60}, the kubelet asked for {ref.uid!r:.60}")
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    if not isinstance(allocation, Mapping):
        raise PrepareError(f"claim {ref}: not allocated (status.allocation is missing)")
    devices = allocation.get("devices")
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(results, list) or len(results) > MAX_RESULTS:
        raise PrepareError(
            f"claim {ref}: status.allocation.devices.results is not a list of at most {MAX_RESULTS}"
        )
    requests: dict[str, list[str]] = {}
    for i, result in enumerate(results):
        where = f"claim {ref}: status.allocation.devices.results[{i}]"
        if not isinstance(result, Mapping):
            raise PrepareError(f"{where}: expected a mapping")
        if result.get("driver") != driver:
            continue
        name, rpool, request = result.get("device"), result.get("pool"), result.get("request")
        if not isinstance(name, str) or not isinstance(request, str) or not isinstance(rpool, str):
            raise PrepareError(f"{where}: device, pool and request must be strings")
        if rpool != pool:
            raise PrepareError(f"{where}: pool {rpool!r:.80} is not this node's ({pool})")
        if name not in published and name != channel_device:
            raise PrepareError(f"{where}: device {name!r:.80} is not published by this node")
        names = requests.setdefault(name, [])
        if request not in names:
            names.append(request)
    out = []
    for name in sorted(requests):
        if name == channel_device:  # the channel's CDI device is known once the channel is
            out.append(PreparedDevice(tuple(requests[name]), pool, name, ()))
            continue
        uuid = published[name].device.base_uuid
        out.append(
            PreparedDevice(
                request_names=tuple(requests[name]),
                pool_name=pool,
                device_name=name,
                cdi_device_ids=(f"{kind}={uuid}",),
            )
        )
    return tuple(out)


class Preparer:
    """Prepare/unprepare over the checkpoint; reads the published devices through ``published`` (the
    driver keeps them current) and device health from the node when preparing."""

    def __init__(
        self,
        *,
        checkpoint: Checkpoint,
        claims: ClaimSource,
        health: DeviceHealthSource,
        driver: str,
        pool: str,
        kind: str,
        published: Callable[[], Mapping[str, SliceDevice]],
        channels: ImexChannels | None = None,
        to_thread: Callable[..., Awaitable[Any]] = asyncio.to_thread,
    ) -> None:
        self.channels = channels
        self.checkpoint = checkpoint
        self._claims = claims
        self._health = health
        self._driver = driver
        self._pool = pool
        self._kind = kind
        self._published = published
        self._to_thread = to_thread
        self._lock = asyncio.Lock()  # one checkpoint write at a time
        self._log = logs.get_logger("deviceplugin.dra").bind(driver=driver)
        self.prepares = 0
        self.errors = 0

    async def prepare(self, ref: ClaimRef) -> Prepared:
        known = self.checkpoint.claims.get(ref.uid)
        if known is not None:
            return Prepared(devices=known.devices)
        try:
            claim = await self._to_thread(self._claims.get_claim, ref.namespace, ref.name)
        except Exception as exc:  # the API unreachable: this claim fails, the kubelet retries
            return self._error(ref, f"claim {ref}: cannot read it from the API: {str(exc)[:200]}")
        if claim is None:
            return self._error(ref, f"claim {ref}: not found in the API")
        published = self._published()
        try:
            devices = devices_for(
                claim,
                ref,
                driver=self._driver,
                pool=self._pool,
                published=published,
                kind=self._kind,
                channel_device=IMEX_DEVICE if self.channels is not None else None,
            )
        except PrepareError as exc:
            return self._error(ref, str(exc))
        for d in devices:
            if d.device_name == IMEX_DEVICE and self.channels is not None:
                continue
            status = self._health.device_health(published[d.device_name].device.health_keys)
            if not status.healthy:
                return self._error(
                    ref, f"claim {ref}: device {d.device_name} is unhealthy ({status.reason or 'unhealthy'})"
                )
        async with self._lock:
            known = self.checkpoint.claims.get(ref.uid)
            if known is not None:
                return Prepared(devices=known.devices)
            hold = None
            if self.channels is not None and any(d.device_name == IMEX_DEVICE for d in devices):
                try:
                    hold = await self._to_thread(
                        functools.partial(self.channels.prepare, claim, held=self._holds())
                    )
                except ChannelError as exc:
                    return self._error(ref, f"claim {ref}: {exc}")
                cdi = (self.channels.cdi_id(hold.channel),)
                devices = tuple(
                    dataclasses.replace(d, cdi_device_ids=cdi) if d.device_name == IMEX_DEVICE else d
                    for d in devices
                )
            entry = PreparedClaim(
                uid=ref.uid, namespace=ref.namespace, name=ref.name, devices=devices, channel=hold
            )
            try:
                await self._to_thread(self.checkpoint.put, entry)
            except CheckpointError as exc:
                if hold is not None and self.channels is not None:
                    with contextlib.suppress(ChannelError):
                        await self._to_thread(
                            functools.partial(self.channels.unprepare, hold, held=self._holds())
                        )
                return self._error(ref, f"claim {ref}: {exc}")
        self.prepares += 1
        self._log.info(
            "claim_prepared", claim=str(ref), uid=ref.uid, devices=[d.device_name for d in devices]
        )
        return Prepared(devices=devices)

    async def unprepare(self, ref: ClaimRef) -> str:
        """``""`` on success (also for a claim never prepared here), else the error."""
        async with self._lock:
            known = self.checkpoint.claims.get(ref.uid)
            if known is not None and known.channel is not None and self.channels is not None:
                rest = [h for uid, h in self._held_by_uid() if uid != ref.uid]
                try:
                    await self._to_thread(
                        functools.partial(self.channels.unprepare, known.channel, held=rest)
                    )
                except ChannelError as exc:  # kept prepared: the kubelet retries the unprepare
                    self.errors += 1
                    self._log.error("claim_unprepare_failed", claim=str(ref), uid=ref.uid, reason=str(exc))
                    return f"claim {ref}: {exc}"
            try:
                removed = await self._to_thread(self.checkpoint.remove, ref.uid)
            except CheckpointError as exc:
                self.errors += 1
                self._log.error("claim_unprepare_failed", claim=str(ref), uid=ref.uid, reason=str(exc))
                return f"claim {ref}: {exc}"
        if removed:
            self._log.info("claim_unprepared", claim=str(ref), uid=ref.uid)
        return ""

    def _held_by_uid(self) -> list[tuple[str, ChannelHold]]:
        return [(uid, c.channel) for uid, c in self.checkpoint.claims.items() if c.channel is not None]

    def _holds(self) -> list[ChannelHold]:
        return [h for _, h in self._held_by_uid()]

    def _error(self, ref: ClaimRef, message: str) -> Prepared:
        self.errors += 1
        self._log.warning("claim_prepare_refused", claim=str(ref), uid=ref.uid, reason=message)
        return Prepared(error=message)
