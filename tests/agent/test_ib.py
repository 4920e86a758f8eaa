from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agent.ib import (
    IbFormatError,
    parse_guid,
    parse_lid,
    parse_numbered,
    parse_rate,
    port_guid_from_gid,
    read_ib,
)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def make_hca(
    sysfs: Path,
    device: str,
    *,
    pci: str,
    node_guid: str = "58a2:e103:002a:09b8",
    numa: str = "1",
    ports: int = 1,
    rate: str = "400 Gb/sec (4X NDR)",
    netdev: str | None = None,
) -> Path:
    """One HCA in the kernel's formats, its ``device`` a relative symlink into ``devices/``."""
    pci_dir = sysfs / "devices" / "pci0000:00" / pci
    _write(pci_dir / "numa_node", f"{numa}\n")
    _write(pci_dir / "local_cpulist", "56-111,168-223\n")
    if netdev:
        _write(pci_dir / "net" / netdev / "dev_port", "0\n")
    dev = sysfs / "class" / "infiniband" / device
    dev.mkdir(parents=True)
    os.symlink(os.path.relpath(pci_dir, dev), dev / "device")
    _write(dev / "node_guid", f"{node_guid}\n")
    _write(dev / "sys_image_guid", f"{node_guid}\n")
    _write(dev / "hca_type", "MT4129\n")
    _write(dev / "fw_ver", "28.39.2048\n")
    _write(dev / "board_id", "MT_0000000838\n")
    _write(dev / "node_desc", f"node-1 {device}\n")
    for n in range(1, ports + 1):
        port = dev / "ports" / str(n)
        _write(port / "state", "4: ACTIVE\n")
        _write(port / "phys_state", "5: LinkUp\n")
        _write(port / "rate", f"{rate}\n")
        _write(port / "link_layer", "InfiniBand\n")
        _write(port / "lid", "0x6c\n")
        _write(port / "sm_lid", "0x4\n")
        _write(port / "gids" / "0", f"fe80:0000:0000:0000:{node_guid}\n")
    return dev


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("58a2:e103:002a:09b8\n", "0x58a2e103002a09b8"),
        ("b83f:d203:39:2b82", "0xb83fd20300392b82"),
        ("0xB83FD20300392B82", "0xb83fd20300392b82"),
        ("e09d730300156ff6", "0xe09d730300156ff6"),
    ],
)
def test_parse_guid(text: str, expected: str) -> None:
    assert parse_guid(text) == expected


@pytest.mark.parametrize("text", ["58a2:e103:002a", "zzzz:e103:002a:09b8", "", "12345"])
def test_parse_guid_rejects(text: str) -> None:
    with pytest.raises(IbFormatError):
        parse_guid(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400 Gb/sec (4X NDR)", 400.0),
        ("200 Gb/sec (2X NDR)", 200.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("800 Gb/sec (4X XDR)", 800.0),
        ("10 Gb/sec (4X)", 10.0),
        ("56 Gb/sec (4X FDR)\n", 56.0),
    ],
)
def test_parse_rate(text: str, expected: float) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize("text", ["fast", "400 Gbps", "Gb/sec (4X NDR)"])
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(IbFormatError, match="Gb/sec"):
        parse_rate(text)


def test_small_parsers() -> None:
    assert parse_numbered("4: ACTIVE\n") == "ACTIVE"
    assert parse_numbered("6: LinkErrorRecovery") == "LinkErrorRecovery"
    assert parse_lid("0x6c") == 108
    assert parse_lid("7") == 7
    assert port_guid_from_gid("fe80:0000:0000:0000:58a2:e103:002a:09b8") == "0x58a2e103002a09b8"
    with pytest.raises(IbFormatError):
        parse_numbered("ACTIVE")
    with pytest.raises(IbFormatError):
        port_guid_from_gid("fe80::1")


def test_reads_every_port_with_identity_and_placement(tmp_path: Path) -> None:
    make_hca(
        tmp_path, "mlx5_1", pci="0000:40:00.0", node_guid="b83f:d203:0039:2b82", numa="0", netdev="ibp64s0"
    )
    make_hca(tmp_path, "mlx5_0", pci="0000:18:00.0", ports=2)
    scan = read_ib(tmp_path)
    assert scan.errors == ()
    assert [(p.device, p.port) for p in scan.ports] == [("mlx5_0", 1), ("mlx5_0", 2), ("mlx5_1", 1)]
    port = scan.ports[2]
    assert port.node_guid == "0xb83fd20300392b82"
    assert port.port_guid == "0xb83fd20300392b82"
    assert port.sys_image_guid == "0xb83fd20300392b82"
    assert port.state == "ACTIVE"
    assert port.physical_state == "LinkUp"
    assert port.rate_gbps == 400.0
    assert port.link_layer == "InfiniBand"
    assert port.lid == 0x6C
    assert port.numa_node == 0
    assert port.pci_address == "0000:40:00.0"
    assert port.netdev == "ibp64s0"
    assert port.hca_type == "MT4129"
    assert port.firmware == "28.39.2048"


def test_devices_sort_numerically(tmp_path: Path) -> None:
    for n, bus in ((10, "ce"), (2, "4f"), (1, "40")):
        make_hca(tmp_path, f"mlx5_{n}", pci=f"0000:{bus}:00.0")
    assert [p.device for p in read_ib(tmp_path).ports] == ["mlx5_1", "mlx5_2", "mlx5_10"]


def test_numa_minus_one_is_none(tmp_path: Path) -> None:
    make_hca(tmp_path, "mlx5_0", pci="0000:18:00.0", numa="-1")
    assert read_ib(tmp_path).ports[0].numa_node is None


def test_no_infiniband_class_is_no_ports_and_no_error(tmp_path: Path) -> None:
    scan = read_ib(tmp_path)
    assert scan.ports == ()
    assert scan.errors == ()


@pytest.mark.parametrize(
    ("relative", "content", "message"),
    [
        pytest.param("ports/1/rate", "fast\n", "rate: expected", id="bad-rate"),
        pytest.param("ports/1/state", "ACTIVE\n", "state: expected", id="bad-state"),
        pytest.param("ports/1/lid", "lid?\n", "lid: not a LID", id="bad-lid"),
        pytest.param("ports/1/gids/0", "fe80::1\n", "gids/0: not a full-form GID", id="bad-gid"),
        pytest.param("ports/1/phys_state", None, "phys_state: missing", id="missing-phys-state"),
        pytest.param("ports/1/link_layer", b"\xff\xfe", "link_layer: not UTF-8", id="binary-link-layer"),
    ],
)
def test_a_malformed_port_file_skips_that_port_only(
    tmp_path: Path, relative: str, content: str | bytes | None, message: str
) -> None:
    dev = make_hca(tmp_path, "mlx5_0", pci="0000:18:00.0", ports=2)
    make_hca(tmp_path, "mlx5_1", pci="0000:40:00.0")
    target = dev / relative
    if content is None:
        target.unlink()
    elif isinstance(content, bytes):
        target.write_bytes(content)
    else:
        target.write_text(content, encoding="utf-8")
    scan = read_ib(tmp_path)
    assert [(p.device, p.port) for p in scan.ports] == [("mlx5_0", 2), ("mlx5_1", 1)]
    assert len(scan.errors) == 1
    assert message in scan.errors[0]
    assert "port mlx5_0/1 skipped" in scan.errors[0]
    assert "\n" not in scan.errors[0]


def test_a_malformed_node_guid_skips_that_hca_only(tmp_path: Path) -> None:
    dev = make_hca(tmp_path, "mlx5_0", pci="0000:18:00.0", ports=2)
    make_hca(tmp_path, "mlx5_1", pci="0000:40:00.0")
    (dev / "node_guid").write_text("nonsense\n", encoding="utf-8")
    scan = read_ib(tmp_path)
    assert [p.device for p in scan.ports] == ["mlx5_1"]
    assert scan.errors == (f"{dev / 'node_guid'}: not a GUID: 'nonsense'; HCA mlx5_0 skipped",)


# --------------------------------------------------------------------------- the simulator's tree

SIM_PROFILES = ["dgx-h100", "hgx-h200", "gb200-nvl72:rack=2,tray=7", "dgx-a100-mig", "dgx1-v100", "pcie-l40s"]


@pytest.mark.parametrize("spec", SIM_PROFILES)
def test_reads_the_simulated_tree_of_every_profile(spec: str, tmp_path: Path) -> None:
    from agent.nvml.sim_sysfs import write_sysfs
    from agent.nvml.simulate import parse_spec

    machine = write_sysfs(tmp_path, parse_spec(spec))
    scan = read_ib(tmp_path)
    assert scan.errors == ()
    expected = {(h.device, p.port): (h, p) for h in machine.hcas for p in h.ports}
    assert {(p.device, p.port) for p in scan.ports} == set(expected)
    for port in scan.ports:
        hca, spec_port = expected[(port.device, port.port)]
        assert port.node_guid == f"0x{hca.node_guid:016x}"
        assert port.sys_image_guid == f"0x{hca.sys_image_guid:016x}"
        assert port.port_guid == f"0x{spec_port.port_guid:016x}"
        assert port.rate_gbps == spec_port.rate_gbps
        assert port.link_layer == spec_port.link_layer
        assert port.lid == spec_port.lid
        assert port.numa_node == hca.numa_node
        assert port.pci_address == hca.pci_address
        assert port.netdev == hca.netdev
        assert port.hca_type == hca.hca_type
        assert port.firmware == hca.fw_ver


def test_a_malformed_file_in_the_simulated_tree_loses_only_that_port(tmp_path: Path) -> None:
    from agent.nvml.sim_sysfs import write_sysfs
    from agent.nvml.simulate import parse_spec

    machine = write_sysfs(tmp_path, parse_spec("dgx-h100"))
    victim = machine.hcas[3]
    rate = tmp_path / "class" / "infiniband" / victim.device / "ports" / "1" / "rate"
    rate.write_text("400 Gbit\n", encoding="utf-8")
    scan = read_ib(tmp_path)
    assert len(scan.ports) == sum(len(h.ports) for h in machine.hcas) - 1
    assert victim.device not in {p.device for p in scan.ports}
    assert len(scan.errors) == 1
    assert scan.errors[0].endswith(f"port {victim.device}/1 skipped")


# --------------------------------------------------------------------------- hostile trees (issue 26)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        pytest.param(
            lambda dev: ((dev / "fw_ver").unlink(), (dev / "fw_ver").mkdir()),
            "fw_ver: not a regular file (a directory); attribute skipped",
            id="fw-ver-directory",
        ),
        pytest.param(
            lambda dev: (dev / "hca_type").write_bytes(b"\xffMT4129\n"),
            "hca_type: not UTF-8 text (byte 0xff at offset 0); attribute skipped",
            id="hca-type-not-utf8",
        ),
    ],
)
def test_an_unreadable_informational_attribute_skips_only_that_attribute(
    tmp_path: Path, damage: object, message: str
) -> None:
    dev = make_hca(tmp_path, "mlx5_0", pci="0000:18:00.0", ports=2)
    damage(dev)  # type: ignore[operator]
    scan = read_ib(tmp_path)
    assert [(p.device, p.port) for p in scan.ports] == [("mlx5_0", 1), ("mlx5_0", 2)]
    assert scan.errors == (f"{dev}/{message}",)
    field = "firmware" if "fw_ver" in message else "hca_type"
    assert {getattr(p, field) for p in scan.ports} == {None}


@pytest.mark.parametrize("name", ["\u00b2", "\u0661", "1\n", "9" * 200, "-1", "+1"])
def test_a_port_directory_not_named_by_ascii_digits_is_skipped(tmp_path: Path, name: str) -> None:
    dev = make_hca(tmp_path, "mlx5_0", pci="0000:18:00.0")
    shutil.copytree(dev / "ports" / "1", dev / "ports" / name)
    scan = read_ib(tmp_path)
    assert [(p.device, p.port) for p in scan.ports] == [("mlx5_0", 1)]
    assert scan.errors == (f"{dev}/ports/{name}: port directory name is not a number; skipped",)


@pytest.mark.parametrize("dev_port", ["\u00b2", "\u0663", "9" * 5000, "x"])
def test_a_dev_port_that_is_not_a_number_skips_that_netdev(tmp_path: Path, dev_port: str) -> None:
    dev = make_hca(tmp_path, "mlx5_0", pci="0000:18:00.0", ports=2, netdev="ib0")
    net = tmp_path / "devices" / "pci0000:00" / "0000:18:00.0" / "net"
    (net / "ib1").mkdir()
    (net / "ib1" / "dev_port").write_text("1\n", encoding="utf-8")
    (net / "ib0" / "dev_port").write_text(f"{dev_port}\n", encoding="utf-8")
    scan = read_ib(tmp_path)
    assert [(p.port, p.netdev) for p in scan.ports] == [(1, None), (2, "ib1")]
    [error] = scan.errors
    assert error.startswith(f"{dev}/device/net/ib0/dev_port: not a port number: ")
    assert error.endswith("; netdev ib0 skipped")
    assert len(error) < 300


@pytest.mark.parametrize(
    ("relative", "content"),
    [
        pytest.param("ports/1/lid", "0x6_c\n", id="lid-underscore"),
        pytest.param("ports/1/lid", "\u0663\n", id="lid-arabic-digit"),
        pytest.param("ports/1/rate", f"{'4' * 400} Gb/sec (4X NDR)\n", id="rate-huge"),
        pytest.param("ports/1/state", "\u0664: ACTIVE\n", id="state-arabic-digit"),
    ],
)
def test_numbers_in_port_files_are_ascii_and_bounded(tmp_path: Path, relative: str, content: str) -> None:
    dev = make_hca(tmp_path, "mlx5_0", pci="0000:18:00.0", ports=2)
    (dev / relative).write_text(content, encoding="utf-8")
    scan = read_ib(tmp_path)
    assert [(p.device, p.port) for p in scan.ports] == [("mlx5_0", 2)]
    [error] = scan.errors
    assert error.startswith(f"{dev}/{relative}: ")
    assert error.endswith("; port mlx5_0/1 skipped")
