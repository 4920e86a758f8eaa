"""The CDI spec: one device per GPU/MIG UUID, lowest version, atomic write."""

from __future__ import annotations

import json
from pathlib import Path

from deviceplugin.cdi import CDI_VERSION, cdi_spec, write_spec
from deviceplugin.config import parse_plugin_config
from deviceplugin.resources import build_plan
from tests.deviceplugin.helpers import inventory


def test_spec_has_one_device_per_uuid(tmp_path: Path) -> None:
    config = parse_plugin_config(
        {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
    )
    plan = build_plan(inventory("dgx-h100"), config)
    devices = [d for r in plan.resources for d in r.devices]
    spec = cdi_spec(devices, kind="gpuagent.dev/gpu")
    assert spec["cdiVersion"] == CDI_VERSION
    names = [d["name"] for d in spec["devices"]]
    assert len(names) == 8
    assert names == sorted(names)
    assert all(
        d["containerEdits"]["deviceNodes"][0]["path"].startswith("/dev/nvidia") for d in spec["devices"]
    )
    path = write_spec(tmp_path / "cdi", spec)
    assert path.name == "gpuagent.dev-gpu.json"
    assert json.loads(path.read_text()) == spec
    assert [p.name for p in (tmp_path / "cdi").iterdir()] == [path.name]
