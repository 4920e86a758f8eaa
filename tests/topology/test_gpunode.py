from __future__ import annotations

import copy
import pathlib
import re
from typing import Any

import pytest
import yaml

from tests.topology.factories import hgx_node, ib_port, nvl72_tray, pcie_node
from topology.gpunode import (
    API_VERSION,
    GpuNodeError,
    crd_yaml,
    gpunode_crd,
    gpunode_object,
    inventory_from_gpunode,
)
from topology.model import FabricHealthSummary, FabricState, Health

ROOT = pathlib.Path(__file__).resolve().parents[2]


def validate(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """The structural-schema checks the API server applies (types, required, enums, bounds, strict
    unknown-field rejection), enough to show that the CRD rejects malformed objects."""
    errors: list[str] = []
    t = schema.get("type")
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "number": (int, float)}
    if t == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{path}: expected integer"]
    elif t in kinds and (not isinstance(value, kinds[t]) or (t == "number" and isinstance(value, bool))):
        return [f"{path}: expected {t}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in enum")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{path}: below minimum")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{path}: does not match pattern")
    if t == "array":
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{path}: too few items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: too many items")
        for i, item in enumerate(value):
            errors += validate(schema["items"], item, f"{path}[{i}]")
    if t == "object" and "properties" in schema:
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}.{key}: required")
        for key, item in value.items():
            if key not in schema["properties"]:
                errors.append(f"{path}.{key}: unknown field")
            else:
                errors += validate(schema["properties"][key], item, f"{path}.{key}")
    return errors


def schema() -> dict[str, Any]:
    return gpunode_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


PORTS = (ib_port("mlx5_0", node_guid="0xe09d7303007a4bd8", switch_guid="0x2c5eab0300b87b40"),)
INVENTORIES = {
    "gb200-tray": nvl72_tray("rack0-tray0", ports=PORTS),
    "hgx-h100": hgx_node("h100-0"),
    "pcie-l40s": pcie_node("l40s-0"),
    "fabric-in-progress": nvl72_tray("rack0-tray1", state=FabricState.IN_PROGRESS),
}


@pytest.mark.parametrize("inv", INVENTORIES.values(), ids=INVENTORIES.keys())
def test_object_validates_and_round_trips(inv: Any) -> None:
    health = {g.uuid: Health.HEALTHY for g in inv.gpus}
    obj = gpunode_object(inv, node_name="node-a", node_uid="uid-1", health=health)
    assert validate(schema(), obj) == []
    name, back, back_health = inventory_from_gpunode(yaml.safe_load(yaml.safe_dump(obj)))
    assert name == "node-a"
    assert back == inv
    assert back_health == health
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-1"}
    ]


def test_summary_of_an_nvl72_tray() -> None:
    inv = nvl72_tray("t0")
    bad_one = {g.uuid: (Health.UNHEALTHY if g.index == 2 else Health.HEALTHY) for g in inv.gpus}
    summary = gpunode_object(inv, node_name="t0", health=bad_one)["status"]["summary"]
    assert summary == {
        "gpus": 4,
        "product": "NVIDIA GB200",
        "fabric": "ok",
        "fabricHealth": "healthy",
        "health": "Degraded",
        "memoryMiB": 189471,
        "clique": "9c6f5af3-0000-4000-8000-00000000000a.32766",
        "unhealthyDevices": 1,
    }
    unhealthy = nvl72_tray("t0", summary=FabricHealthSummary.UNHEALTHY)
    s2 = gpunode_object(unhealthy, node_name="t0")["status"]["summary"]
    assert s2["fabric"] == "unhealthy"
    assert "GPU 0, 1, 2, 3" in s2["fabricReason"]
    assert s2["health"] == "Unknown"
    assert "health" not in gpunode_object(unhealthy, node_name="t0")["status"]


def mutate(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    *head, last = path.split(".")
    cur: Any = out
    for key in head:
        cur = cur[int(key)] if key.isdigit() else cur[key]
    if value is KeyError:
        del cur[last]
    else:
        cur[int(last) if last.isdigit() else last] = value
    return out


MALFORMED = {
    "gpu-count-as-string": ("status.summary.gpus", "four"),
    "unknown-fabric-state": ("status.inventory.fabric.0.state", "BROKEN"),
    "missing-gpu-uuid": ("status.inventory.gpus.0.uuid", KeyError),
    "compute-capability-three-items": ("status.inventory.gpus.0.compute_capability", [10, 0, 1]),
    "unknown-inventory-field": ("status.inventory.surprise", 1),
    "bad-health-value": ("status.health.0.health", "Sick"),
    "bad-clique-format": ("status.summary.clique", "32766"),
    "missing-spec": ("spec", KeyError),
}


@pytest.mark.parametrize(("path", "value"), MALFORMED.values(), ids=MALFORMED.keys())
def test_schema_rejects_malformed(path: str, value: Any) -> None:
    inv = nvl72_tray("t0")
    obj = gpunode_object(inv, node_name="t0", health={g.uuid: Health.HEALTHY for g in inv.gpus})
    assert validate(schema(), obj) == []
    assert validate(schema(), mutate(obj, path, value)) != []


def test_schema_has_no_preserve_unknown_fields() -> None:
    assert "x-kubernetes-preserve-unknown-fields" not in crd_yaml()


def test_crd_file_is_generated_from_the_model() -> None:
    on_disk = (ROOT / "daemonset/crds/gpunode.yaml").read_text(encoding="utf-8")
    assert on_disk == crd_yaml(), "regenerate with: .venv/bin/python -m topology.gpunode"


PARSE_ERRORS = {
    "not-an-object": ([], "expected an object"),
    "no-name": ({"apiVersion": API_VERSION, "kind": "GPUNode", "metadata": {}}, "metadata.name is missing"),
    "wrong-kind": ({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"}}, "expected topology"),
    "no-status": ({"apiVersion": API_VERSION, "kind": "GPUNode", "metadata": {"name": "a"}}, "not published"),
}


@pytest.mark.parametrize(("obj", "message"), PARSE_ERRORS.values(), ids=PARSE_ERRORS.keys())
def test_parser_errors_are_one_line(obj: Any, message: str) -> None:
    with pytest.raises(GpuNodeError, match=message) as info:
        inventory_from_gpunode(obj)
    assert "\n" not in str(info.value)


def test_parser_names_the_bad_field() -> None:
    obj = gpunode_object(nvl72_tray("t0"), node_name="t0")
    obj["status"]["inventory"]["gpus"][1]["memory_total_bytes"] = "lots"
    with pytest.raises(
        GpuNodeError, match=r"GPUNode 't0': status.inventory: NodeInventory.gpus\[1\].memory_total"
    ):
        inventory_from_gpunode(obj)
    obj = gpunode_object(nvl72_tray("t0"), node_name="t0", health={})
    obj["status"]["health"] = [{"id": "GPU-x"}]
    with pytest.raises(GpuNodeError, match=r"status.health\[0\]"):
        inventory_from_gpunode(obj)
