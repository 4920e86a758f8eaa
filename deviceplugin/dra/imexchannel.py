"""The node side of one IMEX channel per job: at prepare, the gang's channel from the domain's record
(:mod:`deviceplugin.dra.channelbook`), its device node made under the dev root and a CDI device for it;
at unprepare, the node's hold given back and the device node removed once no claim here uses it.

The node publishes one ``imex-channel`` device (:data:`IMEX_DEVICE`) in its pool while it sits in a
complete NVLink domain; every claim of the gang on this node is allocated that device, and the
container sees only its own channel: the CDI device ``<driver>/imex-channel=<N>`` edits in just
``/dev/nvidia-caps-imex-channels/channel<N>``. The node-wide CDI spec of the kind lists the channels
prepared here now. Blocking calls: run them from a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from deviceplugin.cdi import write_spec
from deviceplugin.config import ImexChannel
from deviceplugin.dra.channelbook import ChannelBook
from deviceplugin.dra.channels import ChannelError, channel_request
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
    ) -> None:
        self.book = book
        self.node_name = node_name
        self.driver = driver
        self._domain = domain
        self.dev_root = dev_root
        self.proc_devices = proc_devices
        self.cdi_dir = cdi_dir
        self.kind = f"{driver}/{IMEX_DEVICE}"
        self._allow_stand_in = allow_stand_in
        self._log = logs.get_logger("deviceplugin.dra").bind(driver=driver, node=node_name)

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
