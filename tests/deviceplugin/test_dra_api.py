"""The DRA kubelet API stubs: current with our .proto files, on the kubelet's wire names, with the
published field numbers; and, where the Go module cache holds k8s.io/kubelet v0.37.2 (the machines that
build the real counterparts), equal field for field to the upstream descriptors."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from deviceplugin.dra.api import dra_pb2, health_pb2, health_v1_pb2, registration_pb2

ROOT = Path(__file__).resolve().parents[2]
KUBELET_MODULE = "k8s.io/kubelet@v0.37.2/pkg/apis"
UPSTREAM = {
    "dra": "dra/v1/api.proto",
    "health": "dra-health/v1alpha1/api.proto",
    "health_v1": "dra-health/v1/api.proto",
    "registration": "pluginregistration/v1/api.proto",
}
OURS: dict[str, Any] = {
    "dra": dra_pb2,
    "health": health_pb2,
    "health_v1": health_v1_pb2,
    "registration": registration_pb2,
}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_regeneration_gives_no_diff() -> None:
    result = subprocess.run(
        ["bash", str(ROOT / "deviceplugin/dra/api/generate.sh"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_services_on_the_kubelets_wire_names() -> None:
    dra = dra_pb2.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert dra.full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert set(dra.methods_by_name) == {"NodePrepareResources", "NodeUnprepareResources"}
    health = health_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert health.full_name == "v1alpha1.DRAResourceHealth"
    assert health.methods_by_name["NodeWatchResources"].server_streaming
    health_v1 = health_v1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert health_v1.full_name == "v1.DRAResourceHealth"
    registration = registration_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert registration.full_name == "pluginregistration.Registration"


@pytest.mark.parametrize(
    ("module", "message", "fields"),
    [
        ("dra", "Claim", {"namespace": 1, "uid": 2, "name": 3}),
        (
            "dra",
            "Device",
            {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4, "share_id": 5},
        ),
        ("dra", "NodePrepareResourceResponse", {"devices": 1, "error": 2}),
        ("dra", "NodeUnprepareResourceResponse", {"error": 1}),
        ("health", "DeviceIdentifier", {"pool_name": 1, "device_name": 2}),
        (
            "health",
            "DeviceHealth",
            {
                "device": 1,
                "health": 2,
                "last_updated_time": 3,
                "health_check_timeout_seconds": 4,
                "message": 5,
            },
        ),
        ("registration", "PluginInfo", {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}),
        ("registration", "RegistrationStatus", {"plugin_registered": 1, "error": 2}),
    ],
)
def test_published_field_numbers(module: str, message: str, fields: dict[str, int]) -> None:
    descriptor = OURS[module].DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in descriptor.fields} == fields


def _gomodcache() -> Path | None:
    env = os.environ.get("GOMODCACHE")
    if env:
        return Path(env)
    go = shutil.which("go")
    if go is not None:
        done = subprocess.run(
            [go, "env", "GOMODCACHE"], capture_output=True, text=True, check=False, timeout=60
        )
        if done.returncode == 0 and done.stdout.strip():
            return Path(done.stdout.strip())
    default = Path.home() / "go" / "pkg" / "mod"
    return default if default.is_dir() else None


def _shape(file: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    messages = {
        m.name: sorted(
            (f.name, f.number, f.type, f.label, f.type_name.rsplit(".", 1)[-1], f.proto3_optional)
            for f in m.field
        )
        for m in file.message_type
    }
    for m in file.message_type:
        for nested in m.nested_type:  # map entries
            messages[f"{m.name}.{nested.name}"] = sorted((f.name, f.number, f.type) for f in nested.field)
    services = {
        s.name: sorted(
            (x.name, x.input_type.rsplit(".", 1)[-1], x.output_type.rsplit(".", 1)[-1], x.server_streaming)
            for x in s.method
        )
        for s in file.service
    }
    enums = {e.name: sorted((v.name, v.number) for v in e.value) for e in file.enum_type}
    return {"package": file.package, "messages": messages, "services": services, "enums": enums}


@pytest.mark.parametrize("module", sorted(UPSTREAM))
def test_equal_to_the_upstream_descriptors(module: str) -> None:
    cache = _gomodcache()
    upstream = cache / KUBELET_MODULE / UPSTREAM[module] if cache is not None else None
    if upstream is None or not upstream.is_file():
        pytest.skip(f"{KUBELET_MODULE}/{UPSTREAM[module]} is not in the Go module cache")
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        shutil.copy(upstream, Path(tmp) / "api.proto")
        code = protoc.main(
            ["protoc", f"-I{tmp}", f"--descriptor_set_out={out}", str(Path(tmp) / "api.proto")]
        )
        assert code == 0
        theirs = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    ours = descriptor_pb2.FileDescriptorProto()
    OURS[module].DESCRIPTOR.CopyToProto(ours)
    assert _shape(ours) == _shape(theirs)
