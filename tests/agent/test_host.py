from __future__ import annotations

from pathlib import Path

import pytest

from agent.host import MAX_CPUS, cpulist_from_masks, format_cpulist, parse_cpulist, read_host


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)), ("", ()), ("5", (5,)), ("0-1,1-2\n", (0, 1, 2))],
)
def test_parse_cpulist(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize(
    "text",
    [
        "a-b",
        "3-1",
        "1,,x",
        "0-65536",  # one past MAX_CPUS (0-4294967295: tests/hostile/test_node.py, in a bounded child)
        "9" * 5000,  # more digits than int() takes
        "\u00b2",  # isdigit() takes it, int() does not
        "0-\u0663",  # int() reads ARABIC-INDIC DIGIT THREE as 3
        "1_0",  # int() reads 10
        "+1",
    ],
)
def test_parse_cpulist_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="CPU list"):
        parse_cpulist(text)


def test_parse_cpulist_takes_the_largest_cpu_id() -> None:
    assert parse_cpulist(f"{MAX_CPUS - 2}-{MAX_CPUS - 1}") == (MAX_CPUS - 2, MAX_CPUS - 1)


def test_format_and_masks_round_trip() -> None:
    cpus = list(range(56)) + list(range(112, 168))
    assert format_cpulist(cpus) == "0-55,112-167"
    masks = [0, 0, 0, 0]
    for cpu in cpus:
        masks[cpu // 64] |= 1 << (cpu % 64)
    assert cpulist_from_masks(masks) == "0-55,112-167"
    assert format_cpulist([]) == ""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_read_host_from_roots(tmp_path: Path) -> None:
    sysfs, proc = tmp_path / "sys", tmp_path / "proc"
    _write(sysfs / "devices/system/cpu/online", "0-223\n")
    _write(sysfs / "devices/system/node/node0/cpulist", "0-55,112-167\n")
    _write(
        sysfs / "devices/system/node/node0/meminfo",
        "Node 0 MemTotal:       1048576 kB\nNode 0 MemFree: 1 kB\n",
    )
    _write(sysfs / "devices/system/node/node1/cpulist", "56-111,168-223\n")
    _write(sysfs / "devices/system/node/node10/cpulist", "\n")  # memory-only node (GPU HBM)
    _write(sysfs / "devices/system/node/possible", "0-10\n")
    _write(proc / "meminfo", "MemTotal:       2097152 kB\n")
    _write(proc / "sys/kernel/hostname", "dgx-01\n")
    _write(proc / "sys/kernel/osrelease", "6.8.0-60-generic\n")
    host = read_host(sysfs_root=sysfs, proc_root=proc)
    assert host.name == "dgx-01"
    assert host.cpu_count == 224
    assert host.memory_bytes == 2 * 2**30
    assert [(n.id, n.cpus) for n in host.numa_nodes] == [(0, "0-55,112-167"), (1, "56-111,168-223"), (10, "")]
    assert host.numa_nodes[0].memory_bytes == 2**30
    assert host.numa_nodes[1].memory_bytes is None
    assert host.kernel == "6.8.0-60-generic"
    assert read_host(sysfs_root=sysfs, proc_root=proc, hostname="node-a").name == "node-a"


def test_read_host_without_files_falls_back(tmp_path: Path) -> None:
    host = read_host(sysfs_root=tmp_path / "none", proc_root=tmp_path / "none")
    assert host.name
    assert host.cpu_count >= 1
    assert host.numa_nodes == ()


def test_read_host_skips_facts_that_are_not_files_or_not_sane(tmp_path: Path) -> None:
    """Issue 26 item 20: ``product_uuid`` that is a folder, ``osrelease`` not UTF-8, ``cpu/online`` past
    ``MAX_CPUS``, a ``MemTotal`` of 5,000 digits, a ``node²`` folder: each fact is left out, the rest is
    read. (``/dev/zero`` and FIFOs: tests/agent/test_files.py and, end to end, tests/hostile/test_node.py.)"""
    import os

    sysfs, proc = tmp_path / "sys", tmp_path / "proc"
    _write(sysfs / "devices/system/cpu/online", "0-65536\n")
    _write(sysfs / "devices/system/node/node0/cpulist", "0-3\n")
    _write(sysfs / "devices/system/node/node0/meminfo", f"Node 0 MemTotal: {'9' * 5000} kB\n")
    _write(sysfs / "devices/system/node/node1/cpulist", "4-7,8-70000\n")
    _write(sysfs / "devices/system/node/node\u0663/cpulist", "0-3\n")
    _write(sysfs / "devices/system/node/node\u00b2/cpulist", "0-3\n")
    (sysfs / "class/dmi/id/product_uuid").mkdir(parents=True)
    _write(proc / "meminfo", "MemTotal:       2097152 kB\n")
    _write(proc / "sys/kernel/hostname", "x" * 300 + "\n")
    (proc / "sys/kernel/osrelease").write_bytes(b"6.8.0-\xff\n")
    host = read_host(sysfs_root=sysfs, proc_root=proc)
    assert host.cpu_count == os.cpu_count()
    assert [(n.id, n.cpus, n.memory_bytes) for n in host.numa_nodes] == [(0, "0-3", None), (1, "", None)]
    assert host.memory_bytes == 2 * 2**30
    assert host.system_uuid is None
    assert host.kernel is None
    assert host.name != "x" * 300
