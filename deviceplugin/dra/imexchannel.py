"""The node side of one IMEX channel per job: at prepare, the gang's channel from the domain's record
(:mod:`deviceplugin.dra.channelbook`), its device node made under the dev root and a CDI device for it;
at unprepare, the node's hold given back and the device node removed once no claim here uses it; at
start (``reconcile``), the holds the record keeps for this node that no prepared claim (the checkpoint)
and none of the claims the record names for it (a GET of each) accounts for are given back: a
checkpoint lost with the agent's state would otherwise keep those channels taken in the domain for
good.

The node publishes one ``imex-channel`` device (:data:`IMEX_DEVICE`) in its pool while it sits in a
complete NVLink domain; every claim of the gang on this node is allocated that device, and the
container sees only its own channel: the CDI device ``<driver>/imex-channel=<N>`` edits in just
``/dev/nvidia-caps-imex-channels/channel<N>``. The node-wide CDI spec of the kind lists the channels
prepared here now. Blocking calls: run them from a worker thread.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from deviceplugin.cdi import write_spec
from deviceplugin.config import ImexChannel
from deviceplugin.dra.channelbook import ChannelBook
from deviceplugin.dra.channels import ChannelError, ClaimIdentity, channel_request
from deviceplugin.dra.checkpoint import ChannelHold
from deviceplugin.dra.slices import IMEX_CHANNEL_DEVICE
from deviceplugin.imex import (
    CONTAINER_DIR,
    ImexChannelError,
    create_channel,
    imex_cdi_spec,
    remove_channel,
)
from topology import logs

IMEX_DEVICE = IMEX_CHANNEL_DEVICE
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a namespace name (RFC 1123 label)


class ImexChannels:
    def __init__(
        self,
        *,
        book: ChannelBook,
        node_name: str,
        driver: str,
        domain: Callable[[], str | None],
        dev_root: Path,
        proc_devices: Path,
        cdi_dir: Path,
        allow_stand_in: bool = False,
        claim_get: Callable[[str, str], Mapping[str, Any] | None] | None = None,
    ) -> None:
        """``claim_get``: one ResourceClaim by namespace and name from the API, None when there is none
        (``reconcile`` reads the claims the record names; None: no reconcile)."""
        self.book = book
        self._claim_get = claim_get
        self.node_name = node_name
        self.driver = driver
        self._domain = domain
        self.dev_root = dev_root
        self.proc_devices = proc_devices
        self.cdi_dir = cdi_dir
        self.kind = f"{driver}/{IMEX_DEVICE}"
        self._allow_stand_in = allow_stand_in
        self._log = logs.get_logger("deviceplugin.dra").bind(driver=driver, node=node_name)

    @property
    def reconciles(self) -> bool:
        """Whether ``reconcile`` can read claims (it was given ``claim_get``)."""
        return self._claim_get is not None

    def domain(self) -> str | None:
        return self._domain()

    def cdi_id(self, channel: int) -> str:
        return f"{self.kind}={channel}"

    def prepare(self, claim: Mapping[str, Any], *, held: Iterable[ChannelHold]) -> ChannelHold:
        """The claim's channel, its device node made and the CDI spec written with it and ``held`` (the
        channels of the claims prepared here). Raises :class:`ChannelError`."""
        domain = self._domain()
        if domain is None:
            raise ChannelError("this node is in no complete NVLink domain now: no IMEX channel to give")
        request = channel_request(claim, driver=self.driver)
        channel = self.book.acquire(domain, request, self.node_name)
        hold = ChannelHold(domain=domain, gang=request.gang, channel=channel)
        try:
            create_channel(
                channel,
                dev_root=self.dev_root,
                proc_devices=self.proc_devices,
                allow_stand_in=self._allow_stand_in,
            )
            self.write_spec([*held, hold])
        except (ImexChannelError, OSError) as exc:
            if not any(h == hold for h in held):
                self.book.release(domain, gang=request.gang, channel=channel, node=self.node_name)
            raise ChannelError(f"IMEX channel {channel}: {exc}") from None
        self._log.info("imex_channel_prepared", domain=domain, gang=request.gang, channel=channel)
        return hold

    def unprepare(self, hold: ChannelHold, *, held: Iterable[ChannelHold]) -> None:
        """Give ``hold`` back unless another claim here (``held``: those still prepared) holds the same
        channel; the device node goes with the last one. Raises :class:`ChannelError`."""
        rest = list(held)
        self.write_spec(rest)
        if any(h.channel == hold.channel for h in rest):
            return
        try:
            remove_channel(hold.channel, dev_root=self.dev_root)
        except ImexChannelError as exc:
            raise ChannelError(str(exc)) from None
        self.book.release(hold.domain, gang=hold.gang, channel=hold.channel, node=self.node_name)
        self._log.info("imex_channel_released", domain=hold.domain, gang=hold.gang, channel=hold.channel)

    def reconcile(self, *, held: Iterable[ChannelHold]) -> list[tuple[str, int]] | None:
        """Give back the holds the domain's record keeps for this node that neither ``held`` (the claims
        prepared here, from the checkpoint) nor a claim the record names for this node accounts for: one
        GET per named claim, and a hold stays while one of them exists with the recorded uid and is
        allocated this node's IMEX channel device for that gang (a 404 or another uid is no claim's). A
        hold with no identity for this node (written before identities were recorded, or its identity
        was malformed) cannot be checked: it is kept and reported; one whose gang no namespace can have
        is no claim's and is given back. Returns the (gang, channel) given back, or None when it cannot
        decide now (no complete NVLink domain, or nothing to read claims with). Raises
        :class:`ChannelError` (the record) and the claim reader's errors: every GET is made before
        anything is given back, so nothing is given back on a partial view."""
        domain = self._domain()
        if domain is None or self._claim_get is None:
            return None
        mine = list(held)
        kept = {(h.gang, h.channel) for h in mine if h.domain == domain}
        in_use = {h.channel for h in mine}
        holds = [
            (c, h)
            for c, h in sorted(self.book.held(domain, self.node_name).items())
            if (h.gang, c) not in kept
        ]
        stale: list[tuple[str, int]] = []
        for channel, holder in holds:
            namespace = holder.gang.partition("/")[0]
            if not _NAMESPACE.fullmatch(namespace):  # a peer's bad entry: no claim can be of this gang
                stale.append((holder.gang, channel))
                continue
            identities = holder.claims_of(self.node_name)
            if not identities:
                self._log.warning(
                    "imex_channel_hold_unverifiable",
                    domain=domain,
                    gang=holder.gang,
                    channel=channel,
                    detail="the record names no claim for this node's hold (written by an older agent); "
                    "kept until a claim of the gang is prepared or unprepared here. Remove this node from "
                    f"the entry channel-{channel} by hand if no pod of the gang runs here",
                )
                continue
            if not any(self._still_here(i, holder.gang) for i in identities):
                stale.append((holder.gang, channel))
        released = []
        for gang, channel in stale:
            self.book.release(domain, gang=gang, channel=channel, node=self.node_name)
            if channel not in in_use:
                try:
                    remove_channel(channel, dev_root=self.dev_root)
                except ImexChannelError as exc:
                    self._log.warning("imex_channel_remove_failed", channel=channel, error=str(exc))
            self._log.warning(
                "imex_channel_stale_hold_released",
                domain=domain,
                gang=gang,
                channel=channel,
                detail="the record held it for this node, but no prepared claim here and none of the "
                "claims it names (gone, made again, or allocated elsewhere) holds it (a checkpoint lost "
                "with the agent's state)",
            )
            released.append((gang, channel))
        return released

    def _still_here(self, identity: ClaimIdentity, gang: str) -> bool:
        assert self._claim_get is not None
        claim = self._claim_get(identity.namespace, identity.name)
        if claim is None:
            return False
        meta = claim.get("metadata")
        if not isinstance(meta, Mapping) or meta.get("uid") != identity.uid:
            return False
        return self._allocated_here(claim, gang)

    def _allocated_here(self, claim: Mapping[str, Any], gang: str) -> bool:
        """Whether ``claim`` is allocated this node's IMEX channel device and belongs to ``gang``."""
        status = claim.get("status")
        allocation = status.get("allocation") if isinstance(status, Mapping) else None
        devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
        results = devices.get("results") if isinstance(devices, Mapping) else None
        here = any(
            isinstance(r, Mapping)
            and r.get("driver") == self.driver
            and r.get("pool") == self.node_name
            and r.get("device") == IMEX_DEVICE
            for r in (results if isinstance(results, list) else [])
        )
        if not here:
            return False
        try:
            return channel_request(claim, driver=self.driver).gang == gang
        except ChannelError:
            return False

    def write_spec(self, held: Iterable[ChannelHold]) -> None:
        channels = sorted({h.channel for h in held})
        spec = imex_cdi_spec(
            [
                ImexChannel(
                    id=c,
                    path=f"{CONTAINER_DIR}/channel{c}",
                    host_path=str(self.dev_root / "nvidia-caps-imex-channels" / f"channel{c}"),
                )
                for c in channels
            ],
            gpu_kind=f"{self.driver}/gpu",
        )
        write_spec(self.cdi_dir, spec)
