"""IMEX channels for multi-node NVLink: which channel device nodes this node has, and their CDI spec.

NCCL's multi-node NVLink needs ``/dev/nvidia-caps-imex-channels/channel<N>`` inside the container. As in
NVIDIA's device plugin (``imex.channelIDs``: ``[]`` or ``[0]``; ``imex.required``), every GPU container
gets the configured channels; :func:`find_channels` checks at start that each is a character device under
the dev root whose major is the ``nvidia-caps-imex-channels`` line of ``/proc/devices``:

- found: the channels go to ``deviceplugin.container.allocate`` (per device-list strategy: ``envvar`` →
  ``NVIDIA_IMEX_CHANNELS``; CDI → ``<vendor>/imex-channel=<id>`` from :func:`imex_cdi_spec`;
  ``volume-mounts`` → ``/var/run/nvidia-container-devices/imex/<id>``; ``passDeviceSpecs`` → a ``rw``
  DeviceSpec);
- missing: :class:`ImexChannelError` naming what is wrong — the caller exits when ``imex.required``,
  else warns once and injects nothing.

A simulated node (``--simulate``) where ``mknod`` is not allowed has a regular file standing in for the
device node; only ``allow_stand_in`` accepts it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from deviceplugin.config import ImexChannel

CHANNEL_DIR = "nvidia-caps-imex-channels"
MAJOR_NAME = "nvidia-caps-imex-channels"
CONTAINER_DIR = f"/dev/{CHANNEL_DIR}"
CDI_CLASS = "imex-channel"
MAX_PROC_DEVICES_BYTES = 64 * 1024


class ImexChannelError(RuntimeError):
    """A configured channel this node does not have; the message is one line for the operator."""


def channel_major(proc_devices: Path) -> int | None:
    """The character-device major of ``nvidia-caps-imex-channels`` in ``/proc/devices``, or ``None``."""
    try:
        with proc_devices.open("rb") as fh:
            text = fh.read(MAX_PROC_DEVICES_BYTES).decode("ascii", "replace")
    except OSError:
        return None
    in_char = False
    for line in text.splitlines():
        if line.strip().endswith(":"):
            in_char = line.strip() == "Character devices:"
            continue
        fields = line.split()
        if in_char and len(fields) == 2 and fields[1] == MAJOR_NAME and fields[0].isdigit():
            return int(fields[0])
    return None


def find_channels(
    ids: Iterable[int], *, dev_root: Path, proc_devices: Path, allow_stand_in: bool = False
) -> tuple[ImexChannel, ...]:
    """The channels of ``ids`` this node has; raises :class:`ImexChannelError` for the first that is
    missing or not the right device."""
    wanted = tuple(ids)
    if not wanted:
        return ()
    major = channel_major(proc_devices)
    if major is None:
        raise ImexChannelError(
            f"no {MAJOR_NAME} line in {proc_devices}: the IMEX channel driver is not loaded "
            "(load nvidia with NVreg_CreateImexChannel0=1 or run nvidia-modprobe -s -i 0)"
        )
    out = []
    for channel in wanted:
        host = dev_root / CHANNEL_DIR / f"channel{channel}"
        try:
            st = os.stat(host)
        except OSError as exc:
            raise ImexChannelError(
                f"IMEX channel {channel}: {host}: {exc.strerror or exc} (create it with "
                f"nvidia-modprobe -s -i {channel}, or mknod {host} c {major} {channel})"
            ) from None
        if stat.S_ISCHR(st.st_mode):
            found = os.major(st.st_rdev)
            if found != major:
                raise ImexChannelError(
                    f"IMEX channel {channel}: {host} is device {found}:{os.minor(st.st_rdev)}, "
                    f"not major {major} ({MAJOR_NAME})"
                )
        elif not (allow_stand_in and stat.S_ISREG(st.st_mode)):
            raise ImexChannelError(f"IMEX channel {channel}: {host} is not a character device")
        out.append(ImexChannel(id=channel, path=f"{CONTAINER_DIR}/channel{channel}", host_path=str(host)))
    return tuple(out)


def imex_cdi_kind(gpu_kind: str) -> str:
    """``<vendor>/imex-channel`` for the GPUs' CDI kind ``<vendor>/<class>``."""
    return f"{gpu_kind.split('/', 1)[0]}/{CDI_CLASS}"


def imex_cdi_spec(channels: Iterable[ImexChannel], *, gpu_kind: str) -> dict[str, Any]:
    """The CDI spec of the channels (one device per channel, named by its id); ``hostPath`` (CDI 0.5.0)
    where the node's path differs from the container's."""
    devices = []
    for ch in sorted(channels, key=lambda c: c.id):
        node: dict[str, Any] = {"path": ch.path, "permissions": "rw"}
        if ch.host_path != ch.path:
            node["hostPath"] = ch.host_path
        devices.append({"name": str(ch.id), "containerEdits": {"deviceNodes": [node]}})
    return {"cdiVersion": "0.5.0", "kind": imex_cdi_kind(gpu_kind), "devices": devices}


def create_channel(
    channel: int, *, dev_root: Path, proc_devices: Path, allow_stand_in: bool = False
) -> ImexChannel:
    """Make ``<dev_root>/nvidia-caps-imex-channels/channel<N>`` (a character device of the
    ``nvidia-caps-imex-channels`` major, minor N), or accept the right one already there; on a
    simulated node where ``mknod`` is not allowed, a regular stand-in file. Raises
    :class:`ImexChannelError` naming what is wrong."""
    major = channel_major(proc_devices)
    if major is None:
        raise ImexChannelError(
            f"no {MAJOR_NAME} line in {proc_devices}: the IMEX channel driver is not loaded"
        )
    host = dev_root / CHANNEL_DIR / f"channel{channel}"
    if not host.exists():
        try:
            host.parent.mkdir(parents=True, exist_ok=True)
            os.mknod(host, 0o666 | stat.S_IFCHR, os.makedev(major, channel))
        except PermissionError:
            if not allow_stand_in:
                raise ImexChannelError(
                    f"IMEX channel {channel}: cannot create {host}: not permitted"
                ) from None
            host.write_text(f"simulated IMEX channel {channel}\n", encoding="utf-8")
        except OSError as exc:
            if not host.exists():
                raise ImexChannelError(
                    f"IMEX channel {channel}: cannot create {host}: {exc.strerror or exc}"
                ) from None
    (found,) = find_channels(
        [channel], dev_root=dev_root, proc_devices=proc_devices, allow_stand_in=allow_stand_in
    )
    return found


def remove_channel(channel: int, *, dev_root: Path) -> None:
    """Remove the channel's device node (or stand-in); one already gone is fine. Raises
    :class:`ImexChannelError` when it cannot be removed."""
    host = dev_root / CHANNEL_DIR / f"channel{channel}"
    try:
        host.unlink(missing_ok=True)
    except OSError as exc:
        raise ImexChannelError(
            f"IMEX channel {channel}: cannot remove {host}: {exc.strerror or exc}"
        ) from None
