"""Hostile input to the topology controller: files in ``controller --once --from DIR`` (non-UTF-8, nested
deep, YAML alias bombs, huge numbers, malformed objects), its ``--config``/``--mapping``/
``--ibnetdiscover`` files and the fabric ConfigMaps it reads in a cluster.

The rule these pin: a file that cannot be read as a whole stops an offline run with one line naming it
(exit 2) and leaves the last export file as it was; an object that is read but malformed is skipped with
one line and the good nodes are still built; nothing runs away in time or memory.
"""

from __future__ import annotations

import json
import logging
import pathlib
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from agent.commands import controller as controller_command
from tests.topology.factories import nvl72_tray
from topology import safeyaml
from topology.controller import GpuPods, fabric_from_configmaps
from topology.gpunode import gpunode_object, inventory_from_gpunode
from topology.nvlinkdomain import tray_from_gpunode

pytestmark = pytest.mark.timeout(10)

GOOD = ("tray-a", "tray-b")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The command configures process-wide logging; put it back for the tests that follow."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def gpunode(name: str) -> dict[str, Any]:
    return gpunode_object(nvl72_tray(name), node_name=name)


@pytest.fixture
def folder(tmp_path: pathlib.Path) -> pathlib.Path:
    """Two good GPUNodes (one NVLink domain) that every hostile file is added to."""
    d = tmp_path / "in"
    d.mkdir()
    for name in GOOD:
        (d / f"{name}.yaml").write_text(yaml.safe_dump(gpunode(name)), encoding="utf-8")
    return d


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = controller_command.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def refused(folder: pathlib.Path, capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    """The run stops with exit 2 and one stderr line containing every needle; nothing on stdout."""
    code, out, err = run(["--once", "--from", str(folder)], capsys)
    assert code == 2, err
    assert out == ""
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
    return err


def built(folder: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """The run succeeds and both good nodes are members of the tree."""
    code, out, err = run(["--once", "--from", str(folder)], capsys)
    assert code == 0, err
    assert "Traceback" not in err
    for name in GOOD:
        assert name in out
    return out, err


# --------------------------------------------------------------------------- C1: not UTF-8


@pytest.mark.parametrize("name", ["bad.yaml", "bad.json", "bad.yml", "fabric.ibnetdiscover", "mapping.yaml"])
def test_c1_a_file_that_is_not_utf8_is_named_and_the_run_exits_2(
    folder: pathlib.Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (folder / name).write_bytes(b"kind: Node\nmetadata: {name: \xff\xfe}\n")
    refused(folder, capsys, str(folder / name), "not UTF-8", "0xff", "offset 28")


def test_c1_the_last_good_export_stays_when_an_input_is_not_utf8(
    folder: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "topology.conf"
    args = ["--once", "--from", str(folder), "--export", "slurm", "--output", str(target)]
    assert run(args, capsys)[0] == 0
    good = target.read_bytes()
    (folder / "bad.yaml").write_bytes(b"\x80\x81")
    code, _, err = run(args, capsys)
    assert code == 2
    assert "bad.yaml: not UTF-8" in err
    assert target.read_bytes() == good


def test_c1_files_of_other_suffixes_are_not_read(
    folder: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (folder / "notes.bin").write_bytes(bytes(range(256)))
    (folder / ".tray-a.yaml.swp").write_bytes(b"\xff" * 64)
    built(folder, capsys)


def test_c1_an_existing_export_file_that_is_not_utf8_is_replaced(
    folder: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "topology.conf"
    target.write_bytes(b"\xff\xfe old")
    args = ["--once", "--from", str(folder), "--export", "slurm", "--output", str(target)]
    assert run(args, capsys)[0] == 0
    assert "tray-a" in target.read_text(encoding="utf-8")


@pytest.mark.parametrize("flag", ["--config", "--mapping", "--ibnetdiscover"])
def test_c1_flag_files_that_are_not_utf8_are_one_line(
    folder: pathlib.Path, tmp_path: pathlib.Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad-file"
    bad.write_bytes(b"version: v1\n# \xc3\x28\n")
    code, out, err = run(["--once", "--from", str(folder), flag, str(bad)], capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert f"{bad}: not UTF-8 text (byte 0xc3 at offset 14)" in err


# --------------------------------------------------------------------------- C2: deep nesting


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("deep.json", "[" * 5000 + "]" * 5000),
        ("deep-object.json", '{"a":' * 5000 + "1" + "}" * 5000),
        ("deep-block.yaml", "".join(f"{' ' * i}k:\n" for i in range(200)) + " " * 200 + "k: 1\n"),
    ],
    ids=["json-lists", "json-objects", "yaml-block"],
)
def test_c2_deep_nesting_is_refused_with_the_file_and_the_limit(
    folder: pathlib.Path, name: str, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (folder / name).write_text(text, encoding="utf-8")
    refused(folder, capsys, str(folder / name), f"nested deeper than {safeyaml.MAX_DEPTH} levels (the limit)")


def test_c2_a_gpunode_nested_deep_inside_its_status_names_the_key_path(
    folder: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = gpunode("tray-c")
    text = json.dumps(obj).replace('"summary": {', '"summary": {"x": ' + "[" * 5000 + "]" * 5000 + ", ", 1)
    (folder / "tray-c.json").write_text(text, encoding="utf-8")
    refused(folder, capsys, "tray-c.json: status.summary.x[0][0]", "nested deeper than")


def test_c2_real_objects_are_well_inside_the_depth_limit(
    folder: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # kubectl get gpunodes -o json wraps the objects in a List: still far from the limit
    items = {"apiVersion": "v1", "kind": "List", "items": [gpunode("tray-c"), gpunode("tray-d")]}
    (folder / "list.json").write_text(json.dumps(items), encoding="utf-8")
    out, _ = built(folder, capsys)
    assert "tray-d" in out


# --------------------------------------------------------------------------- C3: YAML aliases


def laughs(levels: int = 9, width: int = 9) -> str:
    lines = [f"    l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines)


def test_c3_a_billion_laughs_in_a_node_label_is_refused_at_once(
    folder: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = f"apiVersion: v1\nkind: Node\nmetadata:\n  name: tray-a\n  labels:\n{laughs()}\n"
    (folder / "node.yaml").write_text(text, encoding="utf-8")
    tracemalloc.start()
    started = time.monotonic()
    try:
        err = refused(
            folder, capsys, str(folder / "node.yaml"), "metadata.labels.l", "aliases repeat more than"
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 2.0
    assert peak < 32 * 2**20, peak
    assert f"{safeyaml.MAX_ALIAS_NODES} nodes (the limit)" in err


def test_c3_a_recursive_alias_is_refused(folder: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    (folder / "loop.yaml").write_text(
        "kind: Node\nmetadata:\n  name: tray-a\n  labels: &me {x: *me}\n", encoding="utf-8"
    )
    refused(folder, capsys, "loop.yaml: metadata.labels.x", "repeats a node that contains it")


def test_c3_an_alias_bomb_in_a_fabric_configmap_is_one_problem_not_a_crash() -> None:
    bomb = f"version: v1\nnodes:\n{laughs()}\n"
    cm = {"metadata": {"name": "fabric"}, "data": {"mapping.yaml": bomb, "a.ibnetdiscover": ""}}
    started = time.monotonic()
    _, mapping, problems = fabric_from_configmaps([cm])
    assert time.monotonic() - started < 2.0
    assert mapping is None
    assert len(problems) == 1
    assert problems[0].startswith("configmap/fabric[mapping.yaml]: nodes.l")
    assert "aliases repeat more than" in problems[0]


def test_c3_a_few_ordinary_anchors_still_work(
    folder: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (folder / "mapping.yaml").write_text(
        "version: v1\nnodes:\n  tray-a: &leaves [leaf-1, leaf-2]\n  tray-b: *leaves\n", encoding="utf-8"
    )
    out, _ = built(folder, capsys)
    assert "leaf" in out


# --------------------------------------------------------------------------- huge numbers


def test_a_5000_digit_integer_is_refused_by_the_loader_with_its_key(
    folder: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = yaml.safe_dump(gpunode("tray-c")).replace("gpus: 4", "gpus: " + "9" * 5000, 1)
    (folder / "tray-c.yaml").write_text(text, encoding="utf-8")
    refused(
        folder,
        capsys,
        "tray-c.yaml: status.summary.gpus",
        f"an integer of 5000 digits (the limit is {safeyaml.MAX_INT_DIGITS})",
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("memory_total_bytes", 10**40, "gpus[0].memory_total_bytes: 41-digit integer outside int64"),
        ("minor_number", -(10**30), "gpus[0].minor_number: 31-digit integer outside int64"),
        ("index", True, "gpus[0].index: expected int, got bool"),
    ],
    ids=["huge", "huge-negative", "bool"],
)
def test_numbers_outside_int64_in_a_gpunode_skip_that_gpunode_naming_the_field(
    folder: pathlib.Path, field: str, value: Any, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = gpunode("tray-c")
    obj["status"]["inventory"]["gpus"][0][field] = value
    (folder / "tray-c.json").write_text(json.dumps(obj), encoding="utf-8")
    out, err = built(folder, capsys)
    assert f"skipped: GPUNode 'tray-c': status.inventory: NodeInventory.{message}" in err
    assert "tray-c" not in out


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1.0e+999"])
def test_a_float_that_is_not_finite_skips_that_gpunode(
    folder: pathlib.Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = gpunode("tray-c")
    port = {
        "device": "mlx5_0",
        "port": 1,
        "state": "ACTIVE",
        "physical_state": "LinkUp",
        "rate_gbps": "RATE",
        "link_layer": "InfiniBand",
    }
    obj["status"]["inventory"]["ib"] = [port]
    text = yaml.safe_dump(obj).replace("rate_gbps: RATE", f"rate_gbps: {value}")
    (folder / "tray-c.yaml").write_text(text, encoding="utf-8")
    out, err = built(folder, capsys)
    assert "skipped: GPUNode 'tray-c': status.inventory: NodeInventory.ib[0].rate_gbps:" in err
    assert "not a finite number" in err
    assert "tray-c" not in out


# --------------------------------------------------------------------------- malformed objects


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"apiVersion": "topology.gpuagent.dev/v1alpha1", "kind": "GPUNode", "metadata": ["x"]},
            "GPUNode (no metadata.name): metadata.name is missing",
        ),
        (
            {"apiVersion": "topology.gpuagent.dev/v1alpha1", "kind": "GPUNode", "metadata": {"name": 7}},
            "GPUNode (no metadata.name): metadata.name is missing",
        ),
        (
            {"apiVersion": "topology.gpuagent.dev/v1alpha1", "kind": "GPUNode", "metadata": {"name": "x"}},
            "GPUNode 'x': status.inventory is missing",
        ),
        (
            {
                "apiVersion": "topology.gpuagent.dev/v1alpha1",
                "kind": "GPUNode",
                "metadata": {"name": "x"},
                "status": "ready",
            },
            "GPUNode 'x': status.inventory is missing",
        ),
        (
            {"kind": "Node", "metadata": {"name": "tray-a", "labels": ["a", "b"]}},
            "Node 'tray-a' in",
        ),
        (
            {"kind": "Node", "metadata": {"name": "tray-a", "labels": {"k": {"deep": [1, 2]}}}},
            "metadata.labels.k: expected a string, got dict",
        ),
    ],
    ids=["metadata-list", "name-int", "no-status", "status-string", "labels-list", "label-dict"],
)
def test_a_malformed_object_is_skipped_with_one_line(
    folder: pathlib.Path, doc: dict[str, Any], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (folder / "odd.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    _, err = built(folder, capsys)
    lines = [line for line in err.splitlines() if "skipped" in line]
    assert len(lines) == 1, err
    assert message in lines[0]


@pytest.mark.parametrize(
    "text",
    [
        "just a string\n",
        "- 1\n- [2]\n- null\n",
        "kind: List\nitems: 5\n",
        "kind: List\nitems: [1, 'x', null]\n",
        "---\n---\n",
        "!!python/object:os.system {}\n",
    ],
    ids=["scalar", "list-of-junk", "items-not-list", "items-junk", "empty-docs", "python-tag"],
)
def test_documents_that_are_not_objects_are_ignored_or_refused_never_a_traceback(
    folder: pathlib.Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (folder / "odd.yaml").write_text(text, encoding="utf-8")
    code, _, err = run(["--once", "--from", str(folder)], capsys)
    assert "Traceback" not in err
    if code == 2:
        assert "odd.yaml: not YAML" in err
        assert err.count("\n") == 1
    else:
        assert code == 0


# --------------------------------------------------------------------------- ibnetdiscover


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            f'Switch {"9" * 5000} "S-0002c90300000001"  # "sw1" enhanced port 0 lid 1 lmc 0\n',
            "fabric.ibnetdiscover:1: port count of 5000 digits (the limit is 6)",
        ),
        (
            f'Switch 36 "S-{"a" * 100_000}"\n',
            "fabric.ibnetdiscover:1: not an InfiniBand GUID: 'aaaa",
        ),
    ],
    ids=["port-count-digits", "guid-length"],
)
def test_an_ibnetdiscover_file_out_of_bounds_is_one_short_line(
    folder: pathlib.Path, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (folder / "fabric.ibnetdiscover").write_text(text, encoding="utf-8")
    _, err = built(folder, capsys)
    assert message in err
    assert max(len(line) for line in err.splitlines()) < 400


@pytest.mark.parametrize("flag", ["--config", "--mapping", "--ibnetdiscover"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "too-large"])
def test_a_named_file_that_is_not_a_regular_file_or_too_large_is_refused_at_once(
    folder: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], flag: str, kind: str
) -> None:
    """``--config``, ``--mapping`` and ``--ibnetdiscover`` are read through the one bounded reader: a
    FIFO (whose ``open`` used to wait for a writer for ever), ``/dev/zero`` (whose read used to never
    end) or a file over the limit is one line naming the path, exit 2."""
    import os

    path = tmp_path / "named.yaml"
    if kind == "fifo":
        os.mkfifo(path)
        why = "not a regular file (a FIFO)"
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
        why = "not a regular file (a character device)"
    else:
        with open(path, "wb") as fh:
            fh.truncate(safeyaml.MAX_TEXT_BYTES + 1)  # sparse: no disk, the reader stops after the limit
        why = f"larger than {safeyaml.MAX_TEXT_BYTES} bytes (the limit)"
    code, out, err = run(["--once", "--from", str(folder), flag, str(path)], capsys)
    assert code == 2, err
    assert out == ""
    prefix = "--config " if flag == "--config" else ""
    assert err == f"controller: {prefix}{path}: {why}\n"


# --------------------------------------------------------------------------- NVLink domains (issue 29)
# Pods are tenant-writable; GPUNode status.imex/status.fabric come from node credentials: every shape is
# read bounded, a bad one costs only its own object.


@pytest.mark.parametrize(
    ("limits", "gpus"),
    [
        ({"nvidia.com/gpu": "abc"}, None),
        ({"nvidia.com/gpu": "-4"}, None),
        ({"nvidia.com/gpu": "9" * 5000}, None),
        ({"nvidia.com/gpu": 10**12}, 1024),
        ({"nvidia.com/gpu": ["4"]}, None),
        ({"nvidia.com/gpu": "2"}, 2),
    ],
    ids=["text", "negative", "huge-text", "huge-int", "list", "fine"],
)
def test_hostile_pod_gpu_requests_are_bounded_or_ignored(limits: dict[str, Any], gpus: int | None) -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "t"},
        "spec": {"nodeName": "n", "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": "Running"},
    }
    got = GpuPods.gpus_of(pod)
    assert got == (None if gpus is None else ("n", gpus))


@pytest.mark.parametrize(
    "pod",
    [
        {"spec": "x"},
        {"spec": {"nodeName": ["n"]}},
        {"spec": {"nodeName": "n", "containers": "x"}},
        {"spec": {"nodeName": "n", "containers": [None, 3, {"resources": "x"}]}},
        {"spec": {"nodeName": "n", "initContainers": {"a": 1}}, "status": "x"},
    ],
    ids=["spec-text", "node-list", "containers-text", "container-junk", "init-mapping"],
)
def test_malformed_pods_count_no_gpus(pod: dict[str, Any]) -> None:
    sink = GpuPods()
    sink.replace([{"metadata": {"name": "p", "namespace": "t"}, **pod}])
    assert sink.used_by_node() == {}


@pytest.mark.parametrize(
    "imex",
    [
        "ready",
        ["ready"],
        {"state": "bogus", "status": "x" * 10_000},
        {"state": "ready", "managed": "yes"},
        None,
    ],
    ids=["text", "list", "bogus-state", "managed-text", "none"],
)
def test_hostile_imex_status_makes_a_bounded_tray(imex: Any) -> None:
    obj = gpunode_object(nvl72_tray("t0"), node_name="t0")
    name, inv, health = inventory_from_gpunode(obj)
    tray = tray_from_gpunode(name, inv, verdicts=None, health=health, imex=imex)
    assert tray is not None
    assert tray.imex in ("ready", "not-ready", "absent")
    assert len(tray.imex_status) <= 40
    assert tray.imex_managed is False  # only the boolean true counts
