"""InfiniBand HCAs and ports from Linux sysfs (``<sysfs_root>/class/infiniband``), in the kernel's formats.

Formats (``drivers/infiniband/core/sysfs.c``, ``hw/mlx5/main.c``): ``node_guid``/``sys_image_guid`` as four
16-bit hex groups (``58a2:e103:002a:09b8``), ``ports/<n>/state`` as ``"4: ACTIVE"``, ``phys_state`` as
``"5: LinkUp"``, ``rate`` as ``"400 Gb/sec (4X NDR)"``, ``lid`` as ``"0x6c"``, ``gids/0`` as eight
4-hex groups whose last four are the port GUID; ``device`` is a symlink to the PCI function whose
directory holds ``numa_node`` (``-1`` when unknown).

The parsers are pure functions over strings; :func:`read_ib` is the thin adapter that walks a tree,
reading every file through :func:`agent.files.read_text` (regular files only, bounded). A malformed or
unreadable file skips that port (or that HCA, for ``node_guid``, ``sys_image_guid`` and ``numa_node``)
with a one-line error naming the path, and keeps every other port; an informational attribute
(``hca_type``, ``fw_ver``, a netdev's ``dev_port``) that cannot be read skips only that attribute, with
one error line. Numbers are ASCII digits of bounded length: a port directory named ``²`` or ``٣`` is
not a port.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agent.files import RefusedFileError, read_text
from topology.model import IbPort

_GUID_GROUPS = re.compile(r"^([0-9a-fA-F]{1,4}):([0-9a-fA-F]{1,4}):([0-9a-fA-F]{1,4}):([0-9a-fA-F]{1,4})$")
_GUID_HEX = re.compile(r"^(?:0x)?([0-9a-fA-F]{1,16})$")
_RATE = re.compile(r"^([0-9]{1,6}(?:\.[0-9]{1,6})?) Gb/sec(?: \(([0-9]{1,3})X ?([A-Za-z0-9]*)\))?$")
_NUMBERED = re.compile(r"^([0-9]{1,3}): (.+)$")
_LID = re.compile(r"^(?:0[xX][0-9a-fA-F]{1,8}|[0-9]{1,10})$")  # 16-bit on IB, 32-bit extended LIDs on OPA
_NUMA = re.compile(r"^-?[0-9]{1,5}$")
_SMALL_NUMBER = re.compile(r"[0-9]{1,5}")  # a port directory name, a netdev's dev_port
_PCI_ADDRESS = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


class IbFormatError(ValueError):
    """A sysfs value that is not in the kernel's format."""


def parse_guid(text: str) -> str:
    """``58a2:e103:002a:09b8`` (kernel form) or ``0x58a2e103002a09b8`` → ``0x58a2e103002a09b8``."""
    value = text.strip()
    groups = _GUID_GROUPS.match(value)
    if groups:
        return "0x" + "".join(g.lower().zfill(4) for g in groups.groups())
    plain = _GUID_HEX.match(value)
    if plain and (value.startswith("0x") or len(plain.group(1)) == 16):
        return "0x" + plain.group(1).lower().zfill(16)
    raise IbFormatError(f"not a GUID: {value!r}")


def parse_numbered(text: str) -> str:
    """``"4: ACTIVE"`` → ``"ACTIVE"``; ``"5: LinkUp"`` → ``"LinkUp"``."""
    match = _NUMBERED.match(text.strip())
    if not match:
        raise IbFormatError(f"expected '<n>: <NAME>', got {text.strip()!r}")
    return match.group(2).strip()


def parse_rate(text: str) -> float:
    """``"400 Gb/sec (4X NDR)"`` → ``400.0``; ``"2.5 Gb/sec (1X SDR)"`` → ``2.5``."""
    match = _RATE.match(text.strip())
    if not match:
        raise IbFormatError(f"expected '<n> Gb/sec (<w>X <SPEED>)', got {text.strip()!r}")
    return float(match.group(1))


def parse_lid(text: str) -> int:
    """``"0x6c"`` → ``108`` (the kernel prints LIDs in hex)."""
    value = text.strip()
    if not _LID.match(value):
        raise IbFormatError(f"not a LID: {value[:40]!r}")
    return int(value, 16) if value.lower().startswith("0x") else int(value)


def port_guid_from_gid(text: str) -> str:
    """GID 0 (``fe80:0000:0000:0000:58a2:e103:002a:09b8``) → its interface id as a GUID."""
    groups = text.strip().split(":")
    if len(groups) != 8 or not all(re.fullmatch(r"[0-9a-fA-F]{1,4}", g) for g in groups):
        raise IbFormatError(f"not a full-form GID: {text.strip()!r}")
    return parse_guid(":".join(groups[4:]))


def parse_numa_node(text: str) -> int | None:
    """``numa_node`` of a PCI function: ``-1`` means none."""
    value = text.strip()
    if not _NUMA.match(value):
        raise IbFormatError(f"not a NUMA node: {value[:40]!r}")
    node = int(value)
    return None if node < 0 else node


@dataclass(frozen=True, slots=True)
class IbScan:
    """What :func:`read_ib` found: the ports it could read and a line per problem."""

    ports: tuple[IbPort, ...]
    errors: tuple[str, ...]


def _read(path: str) -> str:
    return read_text(path)  # plain str paths: this runs on every rediscovery


def _read_optional(path: str) -> str | None:
    try:
        return _read(path).strip()
    except FileNotFoundError:
        return None


def _read_informational(path: str, errors: list[str]) -> str | None:
    """An attribute nothing depends on: a problem is one error line and ``None``, never a lost port."""
    try:
        return _read_optional(path)
    except OSError as exc:
        errors.append(f"{path}: {_describe(exc)}; attribute skipped")
        return None


def _small_number(text: str) -> int | None:
    """An ASCII decimal of at most five digits (``str.isdigit`` also takes ``²`` and ``٣``)."""
    return int(text) if _SMALL_NUMBER.fullmatch(text) else None


def _pci_address(device_dir: str) -> str | None:
    try:
        target = os.readlink(f"{device_dir}/device")
    except OSError:
        return None
    name = os.path.basename(target.rstrip("/"))
    return name.lower() if _PCI_ADDRESS.match(name) else None


def _netdevs(device_dir: str, errors: list[str]) -> dict[int, str]:
    """Netdev per port number, from ``device/net/<if>/dev_port`` (0-based); no ``dev_port``: port 1. A
    ``dev_port`` that is not a number skips that netdev with one error line."""
    net = f"{device_dir}/device/net"
    try:
        names = sorted(os.listdir(net))
    except OSError:
        return {}
    out: dict[int, str] = {}
    for name in names:
        path = f"{net}/{name}/dev_port"
        try:
            dev_port = _read_optional(path)
        except OSError as exc:
            errors.append(f"{path}: {_describe(exc)}; netdev {name} skipped")
            continue
        number = 0 if dev_port is None else _small_number(dev_port)
        if number is None:
            errors.append(f"{path}: not a port number: {(dev_port or '')[:40]!r}; netdev {name} skipped")
            continue
        out.setdefault(number + 1, name)
    return out


def _sorted_numeric(names: list[str]) -> list[str]:
    def key(name: str) -> tuple[bool, int, str]:
        number = _small_number(name)
        return (number is None, number or 0, name)

    return sorted(names, key=key)


def read_ib(sysfs_root: Path) -> IbScan:
    """Every port of every HCA under ``<sysfs_root>/class/infiniband``, sorted by device then port.

    No ``infiniband`` class directory means no HCAs (not an error).
    """
    base = os.path.join(sysfs_root, "class", "infiniband")
    try:
        devices = os.listdir(base)
    except FileNotFoundError:
        return IbScan((), ())
    except OSError as exc:
        return IbScan((), (f"{base}: cannot list InfiniBand devices: {exc.strerror or exc}",))
    ports: list[IbPort] = []
    errors: list[str] = []
    for device in _sorted_numeric_devices(devices):
        _read_device(f"{base}/{device}", device, ports, errors)
    return IbScan(tuple(ports), tuple(errors))


def _sorted_numeric_devices(names: list[str]) -> list[str]:
    def key(name: str) -> tuple[str, int]:
        match = re.fullmatch(r"(.*?)([0-9]+)", name)
        return (match.group(1), int(match.group(2))) if match else (name, -1)

    return sorted(names, key=key)


def _read_device(device_dir: str, device: str, ports: list[IbPort], errors: list[str]) -> None:
    current = f"{device_dir}/node_guid"
    try:
        node_guid = parse_guid(_read(current))
        current = f"{device_dir}/sys_image_guid"
        raw_sys = _read_optional(current)
        sys_image_guid = parse_guid(raw_sys) if raw_sys else None
        current = f"{device_dir}/device/numa_node"
        raw_numa = _read_optional(current)
        numa_node = parse_numa_node(raw_numa) if raw_numa is not None else None
    except (IbFormatError, OSError) as exc:
        errors.append(f"{current}: {_describe(exc)}; HCA {device} skipped")
        return
    hca_type = _read_informational(f"{device_dir}/hca_type", errors)
    firmware = _read_informational(f"{device_dir}/fw_ver", errors)
    pci_address = _pci_address(device_dir)
    netdevs = _netdevs(device_dir, errors)
    ports_dir = f"{device_dir}/ports"
    try:
        port_names = _sorted_numeric(os.listdir(ports_dir))
    except OSError as exc:
        errors.append(f"{ports_dir}: {_describe(exc)}; HCA {device} has no readable ports")
        return
    for name in port_names:
        port_dir = f"{ports_dir}/{name}"
        number = _small_number(name)
        if number is None:
            errors.append(f"{port_dir}: port directory name is not a number; skipped")
            continue
        current = port_dir
        try:
            current = f"{port_dir}/state"
            state = parse_numbered(_read(current))
            current = f"{port_dir}/phys_state"
            physical_state = parse_numbered(_read(current))
            current = f"{port_dir}/rate"
            rate = parse_rate(_read(current))
            current = f"{port_dir}/link_layer"
            link_layer = _read(current).strip()
            if not link_layer:
                raise IbFormatError("empty link layer")
            current = f"{port_dir}/lid"
            raw_lid = _read_optional(current)
            lid = parse_lid(raw_lid) if raw_lid is not None else None
            current = f"{port_dir}/gids/0"
            raw_gid = _read_optional(current)
            port_guid = port_guid_from_gid(raw_gid) if raw_gid is not None else None
            if port_guid == "0x0000000000000000":
                port_guid = None
        except (IbFormatError, OSError) as exc:
            errors.append(f"{current}: {_describe(exc)}; port {device}/{name} skipped")
            continue
        ports.append(
            IbPort(
                device=device,
                port=number,
                state=state,
                physical_state=physical_state,
                rate_gbps=rate,
                link_layer=link_layer,
                node_guid=node_guid,
                port_guid=port_guid,
                sys_image_guid=sys_image_guid,
                numa_node=numa_node,
                pci_address=pci_address,
                netdev=netdevs.get(number),
                hca_type=hca_type,
                firmware=firmware,
                lid=lid,
            )
        )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(exc, RefusedFileError):
        return str(exc.strerror)
    if isinstance(exc, OSError):
        return f"unreadable ({exc.strerror or exc})"
    return str(exc)
