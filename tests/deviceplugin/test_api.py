"""The generated kubelet API stubs: current with the .proto, and on the wire paths kubelet uses."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from deviceplugin.api import deviceplugin_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_regeneration_gives_no_diff() -> None:
    result = subprocess.run(
        ["bash", str(ROOT / "deviceplugin/api/generate.sh"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_services_use_package_v1beta1() -> None:
    services = pb.DESCRIPTOR.services_by_name
    assert services["Registration"].full_name == "v1beta1.Registration"
    methods = {m.name for m in services["DevicePlugin"].methods}
    assert methods == {
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    }
    assert services["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        ("DevicePluginOptions", {"pre_start_required": 1, "get_preferred_allocation_available": 2}),
        ("RegisterRequest", {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}),
        ("Device", {"ID": 1, "health": 2, "topology": 3}),
        ("NUMANode", {"ID": 1}),
        (
            "ContainerPreferredAllocationRequest",
            {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3},
        ),
        ("ContainerPreferredAllocationResponse", {"deviceIDs": 1}),
        ("ContainerAllocateRequest", {"devices_ids": 1}),
        (
            "ContainerAllocateResponse",
            {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5},
        ),
        ("Mount", {"container_path": 1, "host_path": 2, "read_only": 3}),
        ("DeviceSpec", {"container_path": 1, "host_path": 2, "permissions": 3}),
        ("CDIDevice", {"name": 1}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_field_numbers_match_the_published_api(message: str, fields: dict[str, int]) -> None:
    descriptor = pb.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in descriptor.fields} == fields
