"""Allocate responses and their refusals (which device, and why)."""

from __future__ import annotations

from typing import Any

import pytest

from deviceplugin.config import PluginConfig, parse_plugin_config
from deviceplugin.container import (
    MPS_PINNED,
    MPS_PIPE,
    MPS_THREADS,
    VISIBLE_DEVICES,
    AllocationError,
    allocate,
)
from deviceplugin.resources import GPU_RESOURCE, Resource, build_plan
from tests.deviceplugin.helpers import inventory


def resource(profile: str, data: dict[str, Any], name: str = GPU_RESOURCE) -> tuple[Resource, PluginConfig]:
    config = parse_plugin_config(data)
    return build_plan(inventory(profile), config).by_name()[name], config


def test_envvar_lists_uuids_in_request_order() -> None:
    res, config = resource("dgx-h100", {})
    ids = [res.devices[3].id, res.devices[1].id]
    got = allocate(res, ids, unhealthy={}, config=config)
    assert got.envs == {VISIBLE_DEVICES: ",".join(ids)}
    assert not got.cdi_devices


def test_mig_devices_use_mig_uuids() -> None:
    res, config = resource("dgx-a100-mig", {"flags": {"migStrategy": "mixed"}}, "nvidia.com/mig-1g.10gb")
    got = allocate(res, [res.devices[0].id], unhealthy={}, config=config)
    assert got.envs[VISIBLE_DEVICES].startswith("MIG-")


def test_replicas_of_one_gpu_collapse() -> None:
    res, config = resource(
        "dgx-h100", {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    )
    got = allocate(res, [res.devices[0].id, res.devices[1].id], unhealthy={}, config=config)
    assert got.envs[VISIBLE_DEVICES] == res.devices[0].gpu_uuid


def test_mps_envs_and_mounts() -> None:
    res, config = resource(
        "pcie-l40s",
        {
            "flags": {"mpsRoot": "/run/mps"},
            "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
        },
    )
    got = allocate(res, [res.devices[0].id], unhealthy={}, config=config)
    mib = res.devices[0].memory_bytes // 4 // (1024 * 1024)
    assert got.envs[MPS_PIPE] == "/run/mps/gpu/pipe"
    assert got.envs[MPS_THREADS] == "25"
    assert got.envs[MPS_PINNED] == f"0={mib}M"
    assert {m.container_path for m in got.mounts} == {"/run/mps/gpu/pipe", "/dev/shm"}


def test_cdi_devices_named_by_kind_and_uuid() -> None:
    res, config = resource("dgx-h100", {"flags": {"plugin": {"deviceListStrategy": "cdi-cri"}}})
    got = allocate(res, [res.devices[0].id], unhealthy={}, config=config)
    assert got.cdi_devices == (f"gpuagent.dev/gpu={res.devices[0].id}",)
    assert VISIBLE_DEVICES not in got.envs


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        pytest.param("unknown", "device 'GPU-nope' is unknown", id="unknown"),
        pytest.param("unhealthy", "is unhealthy (XID 79)", id="unhealthy"),
        pytest.param("empty", "names no devices", id="empty"),
    ],
)
def test_refusals_name_the_device_and_reason(case: str, expected: str) -> None:
    res, config = resource("dgx-h100", {})
    first = res.devices[0].id
    ids = {"unknown": ["GPU-nope"], "unhealthy": [first], "empty": []}[case]
    with pytest.raises(AllocationError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        allocate(res, ids, unhealthy={first: "XID 79"}, config=config)


def test_more_than_one_replica_where_forbidden() -> None:
    res, config = resource(
        "dgx-h100", {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
    )
    with pytest.raises(AllocationError, match="at most 1") as err:
        allocate(res, [res.devices[0].id, res.devices[2].id], unhealthy={}, config=config)
    assert err.value.device == res.devices[2].id
