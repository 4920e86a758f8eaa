"""Which devices back which resource, per MIG strategy and sharing, on the simulated machines."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.config import parse_plugin_config
from deviceplugin.preferred import DeviceKind
from deviceplugin.resources import GPU_RESOURCE, ResourceError, build_plan, mig_resource_name
from tests.deviceplugin.helpers import inventory


def plan_of(profile: str, data: dict[str, Any]) -> dict[str, Any]:
    plan = build_plan(inventory(profile), parse_plugin_config(data))
    return {r.name: r for r in plan.resources}


def test_none_strategy_advertises_whole_gpus_with_numa() -> None:
    inv = inventory("dgx-a100-mig")
    res = plan_of("dgx-a100-mig", {})
    assert list(res) == [GPU_RESOURCE]
    devices = res[GPU_RESOURCE].devices
    assert [d.id for d in devices] == [g.uuid for g in sorted(inv.gpus, key=lambda g: g.index)]
    assert [d.numa_node for d in devices] == [g.numa_node for g in sorted(inv.gpus, key=lambda g: g.index)]
    assert res[GPU_RESOURCE].socket_name == "nvidia-gpu.sock"


def test_mixed_strategy_one_resource_per_profile() -> None:
    inv = inventory("dgx-a100-mig")
    res = plan_of("dgx-a100-mig", {"flags": {"migStrategy": "mixed"}})
    mig_on = {s.gpu_index for s in inv.mig if s.current_enabled}
    assert len(res[GPU_RESOURCE].devices) == len(inv.gpus) - len(mig_on)
    per_profile: dict[str, int] = {}
    for mig in inv.mig_devices():
        per_profile[mig_resource_name(mig.profile)] = per_profile.get(mig_resource_name(mig.profile), 0) + 1
    assert {k: len(v.devices) for k, v in res.items() if k != GPU_RESOURCE} == per_profile
    one = res["nvidia.com/mig-1g.10gb"]
    assert one.socket_name == "nvidia-mig-1g.10gb.sock"
    assert all(d.kind is DeviceKind.MIG and d.id.startswith("MIG-") for d in one.devices)
    # a MIG device's health follows its parent GPU too
    assert all(d.health_keys == (d.gpu_uuid, d.id) for d in one.devices)


def test_single_strategy_refuses_mixed_layouts() -> None:
    with pytest.raises(ResourceError, match="migStrategy single"):
        plan_of("dgx-a100-mig", {"flags": {"migStrategy": "single"}})


def test_single_strategy_without_mig_is_like_none() -> None:
    assert len(plan_of("dgx-h100", {"flags": {"migStrategy": "single"}})[GPU_RESOURCE].devices) == 8


def test_mig_profile_names_replace_plus() -> None:
    assert mig_resource_name("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"


def test_time_slicing_replicas_and_rename_keep_unselected_gpus_whole() -> None:
    res = plan_of(
        "dgx-h100",
        {
            "sharing": {
                "timeSlicing": {
                    "renameByDefault": True,
                    "resources": [{"name": "nvidia.com/gpu", "replicas": 3, "devices": [0, 1]}],
                }
            }
        },
    )
    shared = res["nvidia.com/gpu.shared"]
    assert len(shared.devices) == 6
    assert shared.devices[0].id.endswith("::0")
    assert shared.devices[2].id.endswith("::2")
    assert all(d.kind is DeviceKind.REPLICA for d in shared.devices)
    assert len(res[GPU_RESOURCE].devices) == 6  # the other six GPUs stay whole
    assert shared.socket_name == "nvidia-gpu.shared.sock"


def test_sharing_without_rename_replaces_the_resource() -> None:
    res = plan_of(
        "pcie-l40s", {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
    )
    assert list(res) == [GPU_RESOURCE]
    assert len(res[GPU_RESOURCE].devices) == 8
    assert res[GPU_RESOURCE].fail_requests_greater_than_one


def test_index_strategy_visible_ids() -> None:
    res = plan_of(
        "dgx-a100-mig", {"flags": {"migStrategy": "mixed", "plugin": {"deviceIDStrategy": "index"}}}
    )
    assert all(":" in d.visible_id for d in res["nvidia.com/mig-1g.10gb"].devices)
    assert all(d.visible_id.isdigit() for d in res[GPU_RESOURCE].devices)


def test_sharing_an_absent_resource_warns() -> None:
    plan = build_plan(
        inventory("dgx-h100"),
        parse_plugin_config(
            {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 2}]}}}
        ),
    )
    assert plan.warnings
    assert "nvidia.com/mig-1g.10gb" in plan.warnings[0]


PROFILES = ["dgx-h100", "dgx-a100-mig", "dgx1-v100", "pcie-l40s", "gb200-nvl72"]


@settings(max_examples=40, deadline=None)
@given(
    profile=st.sampled_from(PROFILES),
    mig=st.sampled_from(["none", "mixed"]),
    replicas=st.integers(min_value=2, max_value=16),
    rename=st.booleans(),
    subset=st.lists(st.integers(min_value=0, max_value=7), min_size=1, max_size=4, unique=True)
    | st.just("all"),
)
def test_plans_never_repeat_or_lose_devices(
    profile: str, mig: str, replicas: int, rename: bool, subset: list[int] | str
) -> None:
    inv = _INVENTORIES.setdefault(profile, inventory(profile))
    devices: Any = subset if subset == "all" else list(subset)
    data = {
        "flags": {"migStrategy": mig},
        "sharing": {
            "timeSlicing": {
                "renameByDefault": rename,
                "resources": [{"name": "nvidia.com/gpu", "replicas": replicas, "devices": devices}],
            }
        },
    }
    plan = build_plan(inv, parse_plugin_config(data))
    ids = [d.id for r in plan.resources for d in r.devices]
    assert len(ids) == len(set(ids))
    assert all(len(i) <= 63 for i in ids)
    # every physical device is advertised: whole, as MIG devices, or as exactly `replicas` replicas
    bases: dict[str, int] = {}
    for r in plan.resources:
        for d in r.devices:
            bases[d.base_uuid] = bases.get(d.base_uuid, 0) + 1
    expected = {
        g.uuid
        for g in inv.gpus
        if mig == "none" or not any(s.gpu_index == g.index and s.current_enabled for s in inv.mig)
    }
    if mig == "mixed":
        expected |= {m.uuid for m in inv.mig_devices()}
    assert set(bases) == expected
    assert set(bases.values()) <= {1, replicas}


_INVENTORIES: dict[str, Any] = {}
