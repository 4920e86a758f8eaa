from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from agent.ib import read_ib
from agent.nvml.profiles import IbPortSpec
from agent.nvml.sim_sysfs import cpumask, guid_groups, ibnetdiscover_sample, rate_text, write_sysfs
from topology.ibnet import CORE, LEAF, SPINE, parse_ibnetdiscover, switch_tree


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_dgx_h100_tree_uses_the_kernel_formats(tmp_path: Path) -> None:
    machine = write_sysfs(tmp_path, "dgx-h100:su=1,node=3")
    dev = tmp_path / "class" / "infiniband" / "mlx5_0"
    assert read(dev / "node_type") == "1: CA\n"
    assert re.fullmatch(r"([0-9a-f]{4}:){3}[0-9a-f]{4}\n", read(dev / "node_guid"))
    assert read(dev / "hca_type") == "MT4129\n"
    assert read(dev / "fw_ver") == "28.39.2048\n"
    assert read(dev / "board_id") == "MT_0000000838\n"
    assert read(dev / "node_desc") == "dgx-h100-su1-node3 mlx5_0\n"
    port = dev / "ports" / "1"
    assert read(port / "state") == "4: ACTIVE\n"
    assert read(port / "phys_state") == "5: LinkUp\n"
    assert read(port / "rate") == "400 Gb/sec (4X NDR)\n"
    assert read(port / "link_layer") == "InfiniBand\n"
    assert re.fullmatch(r"0x[0-9a-f]+\n", read(port / "lid"))
    assert read(port / "sm_lid") == "0x1\n"
    assert read(port / "cap_mask") == "0xa651e848\n"
    assert read(port / "gids" / "0") == "fe80:0000:0000:0000:" + read(dev / "node_guid")
    assert read(port / "pkeys" / "0") == "0xffff\n"
    assert os.readlink(dev / "device") == "../../../0000:18:00.0"
    assert read(dev / "device" / "numa_node") == "0\n"
    assert read(dev / "device" / "local_cpulist") == "0-55,112-167\n"
    assert (tmp_path / "class" / "net" / "ibp24s0").resolve() == (
        dev / "device" / "net" / "ibp24s0"
    ).resolve()
    storage = tmp_path / "class" / "infiniband" / "mlx5_1" / "ports" / "1"
    assert read(storage / "link_layer") == "Ethernet\n"
    assert read(storage / "cap_mask") == "0x00010000\n"
    assert read(tmp_path / "devices" / "system" / "node" / "node1" / "cpulist") == "56-111,168-223\n"
    assert len(machine.hcas) == 12


@pytest.mark.parametrize(
    "spec",
    ["dgx-h100", "hgx-h200", "gb200-nvl72:rack=2,tray=7", "dgx-a100-mig", "dgx1-v100", "pcie-l40s"],
)
def test_the_ib_reader_reads_back_what_the_profile_says(tmp_path: Path, spec: str) -> None:
    machine = write_sysfs(tmp_path, spec)
    scan = read_ib(tmp_path)
    assert scan.errors == ()
    by_device = {p.device: p for p in scan.ports}
    assert set(by_device) == {h.device for h in machine.hcas}
    for hca in machine.hcas:
        port = by_device[hca.device]
        assert port.node_guid == f"0x{hca.node_guid:016x}"
        assert port.sys_image_guid == f"0x{hca.sys_image_guid:016x}"
        assert port.port_guid == f"0x{hca.ports[0].port_guid:016x}"
        assert port.pci_address == hca.pci_address
        assert port.numa_node == hca.numa_node
        assert port.netdev == hca.netdev
        assert port.rate_gbps == hca.ports[0].rate_gbps
        assert port.link_layer == hca.ports[0].link_layer
        assert port.lid == hca.ports[0].lid
        assert (port.state, port.physical_state) == ("ACTIVE", "LinkUp")


def test_gb200_pci_domains_in_sysfs_form(tmp_path: Path) -> None:
    write_sysfs(tmp_path, "gb200-nvl72")
    link = os.readlink(tmp_path / "class" / "infiniband" / "mlx5_4" / "device")
    assert link == "../../../0010:03:00.0"
    assert read(tmp_path / "class" / "infiniband" / "mlx5_4" / "device" / "numa_node") == "1\n"


@pytest.mark.parametrize(
    ("width", "speed", "text"),
    [
        (4, "NDR", "400 Gb/sec (4X NDR)"),
        (2, "NDR", "200 Gb/sec (2X NDR)"),
        (4, "HDR", "200 Gb/sec (4X HDR)"),
        (4, "EDR", "100 Gb/sec (4X EDR)"),
        (4, "XDR", "800 Gb/sec (4X XDR)"),
        (1, "SDR", "2.5 Gb/sec (1X SDR)"),
        (4, "FDR", "56 Gb/sec (4X FDR)"),
    ],
)
def test_rate_format(width: int, speed: str, text: str) -> None:
    port = IbPortSpec(
        port=1,
        state=4,
        phys_state=5,
        width=width,
        speed=speed,
        link_layer="InfiniBand",
        lid=1,
        sm_lid=1,
        port_guid=1,
    )
    assert rate_text(port) == text


def test_guid_and_cpumask_formats() -> None:
    assert guid_groups(0x58A2E103002A09B8) == "58a2:e103:002a:09b8"
    assert cpumask("0-3") == "0000000f"
    assert cpumask("0-1,32-33") == "00000003,00000003"


def test_write_is_idempotent(tmp_path: Path) -> None:
    write_sysfs(tmp_path, "pcie-l40s")
    write_sysfs(tmp_path, "pcie-l40s")
    assert read_ib(tmp_path).errors == ()


# --------------------------------------------------------------------------- ibnetdiscover

GB200_RACKS = [f"gb200-nvl72:rack={r},tray={t}" for r in range(2) for t in range(18)]
DGX_SUS = [f"dgx-h100:su={s},node={n}" for s in range(2) for n in range(4)]


def test_sample_follows_the_topology_file_format() -> None:
    text = ibnetdiscover_sample(["dgx-h100:su=0,node=0"])
    lines = text.splitlines()
    assert lines[:3] == ["#", "# Topology file: generated on Thu Jan  1 00:00:00 2026", "#"]
    assert re.fullmatch(r"# Initiated from node [0-9a-f]{16} port [0-9a-f]{16}", lines[3])
    switch = next(i for i, line in enumerate(lines) if line.startswith("Switch\t"))
    assert lines[switch - 4 : switch] == [
        "vendid=0x2c9",
        "devid=0xd2f2",
        f"sysimgguid=0x{lines[switch].split('S-')[1][:16]}",
        f"switchguid=0x{lines[switch].split('S-')[1][:16]}({lines[switch].split('S-')[1][:16]})",
    ]
    assert re.fullmatch(
        r'Switch\t65 "S-[0-9a-f]{16}"\t\t# "MF0;su0-leaf-r0:MQM9700/U1" enhanced port 0 lid \d+ lmc 0',
        lines[switch],
    )
    assert re.fullmatch(
        r'\[1\]\t"H-[0-9a-f]{16}"\[1\]\([0-9a-f]{16}\) \t\t# "dgx-h100-su0-node0 mlx5_0" lid \d+ 4xNDR',
        lines[switch + 1],
    )
    ca = next(i for i, line in enumerate(lines) if line.startswith("Ca\t"))
    assert lines[ca - 4] == "vendid=0x2c9"
    assert lines[ca - 3] == "devid=0x1021"
    assert lines[ca - 1].startswith("caguid=0x")
    assert re.fullmatch(r'Ca\t1 "H-[0-9a-f]{16}"\t\t# "dgx-h100-su0-node0 mlx5_0"', lines[ca])
    assert re.fullmatch(
        r'\[1\]\([0-9a-f]{16}\) \t"S-[0-9a-f]{16}"\[1\]\t\t'
        r'# lid \d+ lmc 0 "MF0;su0-leaf-r0:MQM9700/U1" lid \d+ 4xNDR',
        lines[ca + 1],
    )


def test_gb200_racks_share_one_leaf_per_rail_and_parse_into_a_tree() -> None:
    tree = switch_tree(parse_ibnetdiscover(ibnetdiscover_sample(GB200_RACKS)))
    hosts_by_leaves: dict[frozenset[str], set[str]] = {}
    for ca, leaves in tree.host_leaves.items():
        hosts_by_leaves.setdefault(leaves, set()).add(tree.hosts[ca])
    # a node touches one leaf per rail (4 rails); the 18 trays of a rack share them
    node_leaves: dict[str, set[str]] = {}
    for ca, leaves in tree.host_leaves.items():
        node_leaves.setdefault(tree.hosts[ca], set()).update(leaves)
    assert {len(v) for v in node_leaves.values()} == {4}
    groups = {frozenset(v) for v in node_leaves.values()}
    assert len(groups) == 2  # one leaf domain per rack
    for group in groups:
        members = {h for h, v in node_leaves.items() if frozenset(v) == group}
        assert len(members) == 18
        assert len({h.split("-")[0] for h in members}) == 1
    assert sorted(set(tree.tier.values())) == [LEAF, SPINE]  # both racks in spine group 0: no core
    assert all(len(tree.uplinks[leaf]) == 2 for leaf, t in tree.tier.items() if t == LEAF)


def test_dgx_scalable_units_share_eight_rail_leaves_and_spine_groups_add_a_core() -> None:
    specs = [*DGX_SUS, "dgx-h100:su=4,node=0"]  # SU 4 is in spine group 1
    tree = switch_tree(parse_ibnetdiscover(ibnetdiscover_sample(specs)))
    node_leaves: dict[str, set[str]] = {}
    for ca, leaves in tree.host_leaves.items():
        node_leaves.setdefault(tree.hosts[ca], set()).update(leaves)
    assert {len(v) for v in node_leaves.values()} == {8}
    assert node_leaves["dgx-h100-su0-node0"] == node_leaves["dgx-h100-su0-node3"]
    assert node_leaves["dgx-h100-su0-node0"].isdisjoint(node_leaves["dgx-h100-su1-node0"])
    levels = sorted(tree.tier.values())
    assert levels.count(LEAF) == 3 * 8
    assert levels.count(SPINE) == 2 * 8 * 2
    assert levels.count(CORE) == 2


def test_storage_ports_are_not_in_the_fabric() -> None:
    fabric = parse_ibnetdiscover(ibnetdiscover_sample(["dgx-a100-mig"]))
    cas = [n for n in fabric.nodes.values() if n.kind == "ca"]
    assert sorted(n.description.split()[1] for n in cas) == [f"mlx5_{k}" for k in (0, 1, 2, 3, 6, 7, 8, 9)]


def test_sample_is_deterministic_and_node_views_agree() -> None:
    assert ibnetdiscover_sample(GB200_RACKS) == ibnetdiscover_sample(GB200_RACKS)
    # a leaf seen from one node's sample has the same GUID and LID as in the whole-fabric sample
    one = parse_ibnetdiscover(ibnetdiscover_sample(["gb200-nvl72:rack=1,tray=4"]))
    whole = parse_ibnetdiscover(ibnetdiscover_sample(GB200_RACKS))
    assert set(one.nodes) <= set(whole.nodes)


def test_two_nodes_in_one_slot_are_refused() -> None:
    with pytest.raises(ValueError, match="both occupy rack 0 slot 3"):
        ibnetdiscover_sample(["gb200-nvl72:rack=0,tray=3", "gb200-nvl72:rack=0,node=3,hostname=x"])
    with pytest.raises(ValueError, match="spine groups"):
        ibnetdiscover_sample(["gb200-nvl72:rack=0,tray=1,su=0", "gb200-nvl72:rack=0,tray=2,su=1"])
