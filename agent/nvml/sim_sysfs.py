"""Simulated Linux sysfs and ``ibnetdiscover`` output for the simulator's machines.

- :func:`write_sysfs` writes the InfiniBand part of a node's sysfs under a root directory, in the
  kernel's formats (hardware.md §13): ``class/infiniband/<dev>/{node_type,node_guid,sys_image_guid,
  hca_type,hw_rev,fw_ver,board_id,node_desc}``, ``ports/<n>/{state,phys_state,rate,link_layer,lid,
  sm_lid,lid_mask_count,sm_sl,cap_mask,gids/0,pkeys/0}``, a ``device`` symlink to the PCI function
  (``devices/pci<domain>:00/<bdf>/`` with ``numa_node``, ``local_cpulist``, ``local_cpus``, ``vendor``,
  ``device``, ``net/<netdev>/dev_port``), ``class/net/<netdev>`` links, and the NUMA nodes
  (``devices/system/node/node<N>/cpulist``).
- :func:`ibnetdiscover_sample` renders the topology file ``ibnetdiscover`` would print for the fabric
  of a list of simulated nodes (hardware.md §15 format), including the leaf, spine and (when the
  nodes span several spine groups) core switches of the rail-optimised fabric model
  (``agent.nvml.profiles``).

Both are deterministic: the same specs give byte-identical output.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from agent.host import parse_cpulist
from agent.nvml.profiles import (
    CORE_SWITCHES,
    LANE_GBPS,
    LEAF_UPLINK_PORT,
    SPINES_PER_RAIL,
    HcaSpec,
    IbPortSpec,
    MachineSpec,
    SwitchSpec,
    build_machine,
    core_switch,
    spine_switch,
)
from agent.nvml.simulate import SimSpec, parse_spec

PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATES = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}
CAP_MASK_IB = 0xA651E848
CAP_MASK_ETH = 0x00010000
MELLANOX_VENDOR_ID = 0x15B3
SWITCH_DEVICE_ID = 0xD2F2  # Quantum-2
IB_VENDOR_ID = 0x2C9

SpecLike = SimSpec | MachineSpec | str


def machine_of(spec: SpecLike) -> MachineSpec:
    if isinstance(spec, MachineSpec):
        return spec
    if isinstance(spec, str):
        spec = parse_spec(spec)
    return build_machine(spec.profile, spec.options_dict())


# --------------------------------------------------------------------------- formats


def guid_groups(guid: int) -> str:
    """``node_guid`` format: four 16-bit hex groups, e.g. ``58a2:e103:002a:09b8``."""
    text = f"{guid:016x}"
    return ":".join(text[i : i + 4] for i in range(0, 16, 4))


def rate_text(port: IbPortSpec) -> str:
    """``rate`` format ``"%d%s Gb/sec (%dX%s)"`` with ``.5`` for half rates."""
    total = port.width * LANE_GBPS[port.speed]
    whole = int(total)
    half = ".5" if total - whole >= 0.5 else ""
    return f"{whole}{half} Gb/sec ({port.width}X {port.speed})"


def cpumask(cpulist: str) -> str:
    """``local_cpus`` format: comma-separated 32-bit hex words, most significant first."""
    cpus = parse_cpulist(cpulist)  # the one bounded CPU-list parser
    top = max(cpus, default=0)
    words = top // 32 + 1
    mask = sum(1 << c for c in cpus)
    return ",".join(f"{(mask >> (32 * w)) & 0xFFFFFFFF:08x}" for w in reversed(range(words)))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")


def _link(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(os.path.relpath(target, path.parent))


# --------------------------------------------------------------------------- sysfs


def write_sysfs(root: Path, spec: SpecLike) -> MachineSpec:
    """Write the node's fake sysfs under ``root`` (the directory standing for ``/sys``)."""
    machine = machine_of(spec)
    for node in machine.numa_nodes:
        node_dir = root / "devices" / "system" / "node" / f"node{node.id}"
        _write(node_dir / "cpulist", node.cpus)
        if node.memory_bytes is not None:
            kib = node.memory_bytes // 1024
            _write(node_dir / "meminfo", f"Node {node.id} MemTotal:       {kib} kB")
    for hca in machine.hcas:
        _write_hca(root, hca)
    return machine


def _pci_dir(root: Path, address: str) -> Path:
    domain = address.split(":", 1)[0]
    return root / "devices" / f"pci{domain}:00" / address


def _write_hca(root: Path, hca: HcaSpec) -> None:
    pci = _pci_dir(root, hca.pci_address)
    _write(pci / "numa_node", str(hca.numa_node))
    _write(pci / "local_cpulist", hca.local_cpulist)
    _write(pci / "local_cpus", cpumask(hca.local_cpulist))
    _write(pci / "vendor", f"0x{MELLANOX_VENDOR_ID:04x}")
    _write(pci / "device", f"0x{hca.pci_device_id:04x}")
    _write(pci / "class", "0x020700" if hca.ports[0].link_layer == "InfiniBand" else "0x020000")
    net = pci / "net" / hca.netdev
    _write(net / "dev_port", "0")
    _link(root / "class" / "net" / hca.netdev, net)

    dev = pci / "infiniband" / hca.device
    _write(dev / "node_type", "1: CA")
    _write(dev / "node_guid", guid_groups(hca.node_guid))
    _write(dev / "sys_image_guid", guid_groups(hca.sys_image_guid))
    _write(dev / "hca_type", hca.hca_type)
    _write(dev / "hw_rev", "0")
    _write(dev / "fw_ver", hca.fw_ver)
    _write(dev / "board_id", hca.board_id)
    _write(dev / "node_desc", hca.node_desc)
    # as in real sysfs: <pci>/infiniband/<dev>/device -> ../../../<pci>
    (dev / "device").unlink(missing_ok=True)
    (dev / "device").symlink_to(f"../../../{hca.pci_address}")
    for port in hca.ports:
        pdir = dev / "ports" / str(port.port)
        _write(pdir / "state", f"{port.state}: {PORT_STATES[port.state]}")
        _write(pdir / "phys_state", f"{port.phys_state}: {PHYS_STATES[port.phys_state]}")
        _write(pdir / "rate", rate_text(port))
        _write(pdir / "link_layer", port.link_layer)
        _write(pdir / "lid", f"0x{port.lid:x}")
        _write(pdir / "sm_lid", f"0x{port.sm_lid:x}")
        _write(pdir / "lid_mask_count", "0")
        _write(pdir / "sm_sl", "0")
        ib = port.link_layer == "InfiniBand"
        _write(pdir / "cap_mask", f"0x{CAP_MASK_IB if ib else CAP_MASK_ETH:08x}")
        _write(pdir / "gids" / "0", "fe80:0000:0000:0000:" + guid_groups(port.port_guid))
        _write(pdir / "pkeys" / "0", "0xffff")
        for counter in ("symbol_error", "link_downed", "port_rcv_errors", "port_xmit_discards"):
            _write(pdir / "counters" / counter, "0")
        if not ib:
            _write(pdir / "gid_attrs" / "types" / "0", "RoCE v2")
            _write(pdir / "gid_attrs" / "ndevs" / "0", hca.netdev)
    _link(root / "class" / "infiniband" / hca.device, dev)


# --------------------------------------------------------------------------- ibnetdiscover


@dataclass(slots=True)
class _SwitchNode:
    spec: SwitchSpec
    ports: dict[int, str] = field(default_factory=dict)  # port -> rendered port line


@dataclass(frozen=True, slots=True)
class _CaNode:
    guid: int
    device_id: int
    sys_image_guid: int
    desc: str
    line: str


def _width_speed(port: IbPortSpec) -> str:
    return f"{port.width}x{port.speed}"


def ibnetdiscover_sample(specs: Iterable[SpecLike]) -> str:
    """The ``ibnetdiscover`` topology file of the fabric the given simulated nodes cable into."""
    machines = [machine_of(s) for s in specs]
    switches: dict[int, _SwitchNode] = {}
    cas: dict[int, _CaNode] = {}
    group_spine: dict[tuple[str, int], int] = {}
    seen: dict[tuple[str, int, int], str] = {}
    for m in machines:
        key = (m.position.group_kind, m.position.group, m.position.slot)
        if key in seen:
            raise ValueError(
                f"simulated nodes {seen[key]} and {m.hostname} both occupy {key[0]} {key[1]} slot {key[2]}"
            )
        seen[key] = m.hostname
        gk = (m.position.group_kind, m.position.group)
        if group_spine.setdefault(gk, m.position.spine_group) != m.position.spine_group:
            raise ValueError(
                f"{gk[0]} {gk[1]} is placed in spine groups {group_spine[gk]} and {m.position.spine_group}"
            )
        for hca in m.hcas:
            port = hca.ports[0]
            if port.leaf is None or port.leaf_port is None:
                continue
            leaf = switches.setdefault(port.leaf.guid, _SwitchNode(port.leaf))
            leaf.ports[port.leaf_port] = (
                f'[{port.leaf_port}]\t"H-{hca.node_guid:016x}"[{port.port}]({port.port_guid:016x}) '
                f'\t\t# "{hca.node_desc}" lid {port.lid} {_width_speed(port)}'
            )
            cas[hca.node_guid] = _CaNode(
                guid=hca.node_guid,
                device_id=hca.pci_device_id,
                sys_image_guid=hca.sys_image_guid,
                desc=hca.node_desc,
                line=(
                    f'[{port.port}]({port.port_guid:016x}) \t"S-{port.leaf.guid:016x}"[{port.leaf_port}]'
                    f'\t\t# lid {port.lid} lmc 0 "{port.leaf.description}" lid {port.leaf.lid} '
                    f"{_width_speed(port)}"
                ),
            )
            _connect_spines(switches, m, port.leaf)
    spines = sorted((s for s in switches.values() if s.spec.kind == "spine"), key=lambda s: s.spec.guid)
    if len({(m.position.group_kind, m.position.spine_group) for m in machines}) > 1:
        cores = [_SwitchNode(core_switch(c)) for c in range(CORE_SWITCHES)]
        for core in cores:
            core.spec = _with_ports(core.spec, len(spines))
            switches[core.spec.guid] = core
        for i, spine in enumerate(spines):
            for c, core in enumerate(cores):
                _cable(spine, LEAF_UPLINK_PORT + c, core, i + 1)
    return _render(switches, cas)


def _with_ports(spec: SwitchSpec, needed: int) -> SwitchSpec:
    nports = 65
    while nports - 1 < needed:
        nports = (nports - 1) * 2 + 1
    return replace(spec, nports=nports)


def _connect_spines(switches: dict[int, _SwitchNode], m: MachineSpec, leaf: SwitchSpec) -> None:
    rail = leaf.rail
    leaf_node = switches[leaf.guid]
    for j in range(SPINES_PER_RAIL):
        spine_spec = spine_switch(m.position.group_kind, m.position.spine_group, rail, j)
        spine = switches.setdefault(spine_spec.guid, _SwitchNode(spine_spec))
        _cable(leaf_node, LEAF_UPLINK_PORT + j, spine, m.position.group_pos + 1)


def _cable(a: _SwitchNode, a_port: int, b: _SwitchNode, b_port: int) -> None:
    link = "4xNDR"
    a.ports[a_port] = (
        f'[{a_port}]\t"S-{b.spec.guid:016x}"[{b_port}]\t\t# "{b.spec.description}" lid {b.spec.lid} {link}'
    )
    b.ports[b_port] = (
        f'[{b_port}]\t"S-{a.spec.guid:016x}"[{a_port}]\t\t# "{a.spec.description}" lid {a.spec.lid} {link}'
    )


def _render(switches: dict[int, _SwitchNode], cas: dict[int, _CaNode]) -> str:
    lines = ["#", "# Topology file: generated on Thu Jan  1 00:00:00 2026", "#"]
    if cas:
        first = min(cas)
        lines.append(f"# Initiated from node {first:016x} port {first:016x}")
    for guid in sorted(switches):
        node = switches[guid]
        s = node.spec
        lines += [
            "",
            f"vendid=0x{IB_VENDOR_ID:x}",
            f"devid=0x{SWITCH_DEVICE_ID:x}",
            f"sysimgguid=0x{s.guid:016x}",
            f"switchguid=0x{s.guid:016x}({s.guid:016x})",
            f'Switch\t{s.nports} "S-{s.guid:016x}"\t\t# "{s.description}" enhanced port 0 lid {s.lid} lmc 0',
        ]
        lines += [node.ports[p] for p in sorted(node.ports)]
    for guid in sorted(cas):
        ca = cas[guid]
        lines += [
            "",
            f"vendid=0x{IB_VENDOR_ID:x}",
            f"devid=0x{ca.device_id:x}",
            f"sysimgguid=0x{ca.sys_image_guid:016x}",
            f"caguid=0x{ca.guid:016x}",
            f'Ca\t1 "H-{ca.guid:016x}"\t\t# "{ca.desc}"',
            ca.line,
        ]
    return "\n".join(lines) + "\n"
