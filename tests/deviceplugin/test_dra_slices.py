"""The pure ResourceSlice builder: NVIDIA's attribute names, ours (NVLink domain, clique, rack/tray,
fabric health), MIG devices, the slice limit, the taint hook, and the device names."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from deviceplugin.config import PluginConfig, parse_plugin_config
from deviceplugin.dra.slices import (
    MAX_DEVICES_PER_SLICE,
    build_slices,
    content,
    counter_set_name,
    device_name,
    pci_bus_id,
    quantity,
    slice_devices,
)
from deviceplugin.resources import Device, build_plan
from tests.deviceplugin.helpers import inventory
from topology.model import FabricHealthSummary, NodeInventory

DRIVER = "gpu.gpuagent.dev"


def _devices(inv: NodeInventory, config: PluginConfig | None = None) -> list[Device]:
    plan = build_plan(inv, config or PluginConfig())
    return [d for r in plan.resources for d in r.devices]


def _slices(inv: NodeInventory, config: PluginConfig | None = None, **kw: Any) -> list[dict[str, Any]]:
    kw.setdefault("node_uid", "uid-1")
    kw.setdefault("generation", 3)
    return build_slices(inv, _devices(inv, config), node_name="rack2-tray5", driver=DRIVER, **kw)


def _attrs(device: dict[str, Any]) -> dict[str, Any]:
    return {k: next(iter(v.values())) for k, v in device["attributes"].items()}


def test_gb200_devices_carry_the_nvlink_domain_and_nvidias_names() -> None:
    inv = inventory("gb200-nvl72:rack=2,tray=5")
    (obj,) = _slices(inv, pcie_root=lambda bus: f"pci{bus[:4]}:00")
    spec = obj["spec"]
    assert obj["apiVersion"] == "resource.k8s.io/v1"
    assert spec["driver"] == DRIVER
    assert spec["nodeName"] == "rack2-tray5"
    assert spec["pool"] == {"name": "rack2-tray5", "generation": 3, "resourceSliceCount": 1}
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert len(spec["devices"]) == 4
    fabric = inv.fabric[0]
    for device, gpu in zip(spec["devices"], sorted(inv.gpus, key=lambda g: device_name(g.uuid)), strict=True):
        a = _attrs(device)
        assert device["name"] == device_name(gpu.uuid)
        assert a["uuid"] == gpu.uuid
        assert a["type"] == "gpu"
        assert a["productName"] == gpu.name
        assert a["architecture"] == "blackwell"
        assert a["cudaComputeCapability"] == f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}.0"
        assert a["resource.kubernetes.io/pciBusID"] == pci_bus_id(gpu.pci_bus_id)
        assert a["resource.kubernetes.io/pcieRoot"] == f"pci{pci_bus_id(gpu.pci_bus_id)[:4]}:00"
        assert a["nvlinkDomain"] == f"{fabric.cluster_uuid.lower()}.{fabric.clique_id}"
        assert a["clusterUUID"] == fabric.cluster_uuid.lower()
        assert a["cliqueId"] == fabric.clique_id
        assert a["fabricHealth"] == "healthy"
        assert a["tray"] == 5
        assert gpu.platform is not None
        assert a["rack"] == gpu.platform.chassis_serial
        assert a["numaNode"] == gpu.numa_node
        assert device["capacity"]["memory"]["value"] == quantity(gpu.memory_total_bytes)
        assert "driverVersion" in a
        assert "cudaDriverVersion" in a


def test_node_without_multi_node_fabric_has_no_nvlink_domain() -> None:
    (obj,) = _slices(inventory("dgx-h100"))
    for device in obj["spec"]["devices"]:
        a = _attrs(device)
        assert "nvlinkDomain" not in a
        assert "cliqueId" not in a
        assert "resource.kubernetes.io/pcieRoot" not in a  # unknown is left out, never guessed


def test_unhealthy_fabric_reports_it_and_withdraws_the_nvlink_domain() -> None:
    inv = inventory("gb200-nvl72:rack=0,tray=0")
    bad = dataclasses.replace(inv.fabric[1], health_summary=FabricHealthSummary.UNHEALTHY)
    inv = dataclasses.replace(inv, fabric=(inv.fabric[0], bad, *inv.fabric[2:]))
    (obj,) = _slices(inv)
    by_index = {_attrs(d)["index"]: _attrs(d) for d in obj["spec"]["devices"]}
    assert by_index[bad.gpu_index]["fabricHealth"] == "unhealthy"
    assert by_index[inv.fabric[0].gpu_index]["fabricHealth"] == "healthy"
    # as the clique label: a tray with an unhealthy fabric is out of its NVLink domain, so no claim
    # matching on the domain lands on it; the raw clique facts stay
    assert all("nvlinkDomain" not in a for a in by_index.values())
    assert {a["cliqueId"] for a in by_index.values()} == {inv.fabric[0].clique_id}


def test_mig_devices_name_their_parent_and_profile() -> None:
    inv = inventory("dgx-a100-mig")
    config = parse_plugin_config({"flags": {"migStrategy": "mixed"}})
    obj, _counters = _slices(inv, config)
    migs = [d for d in obj["spec"]["devices"] if _attrs(d)["type"] == "mig"]
    gpus = [d for d in obj["spec"]["devices"] if _attrs(d)["type"] == "gpu"]
    assert len(migs) == len(inv.mig_devices())
    assert len(gpus) == len(
        [g for g in inv.gpus if not any(s.gpu_index == g.index and s.current_enabled for s in inv.mig)]
    )
    by_uuid = {m.uuid: m for m in inv.mig_devices()}
    for device in migs:
        a = _attrs(device)
        mig = by_uuid[a["uuid"]]
        assert a["parentUUID"] == mig.parent_uuid
        assert a["profile"] == mig.profile
        assert a["parentIndex"] == mig.parent_index
        assert "index" not in a
        assert device["capacity"]["memory"]["value"] == quantity(mig.memory_bytes)


def test_mig_devices_consume_their_gpus_shared_counters() -> None:
    inv = inventory("dgx-a100-mig")
    config = parse_plugin_config({"flags": {"migStrategy": "mixed"}})
    slices = _slices(inv, config)
    assert [sorted(set(s["spec"]) & {"devices", "sharedCounters"}) for s in slices] == [
        ["devices"],
        ["sharedCounters"],
    ]  # the API takes devices and counter sets only in separate slices of one pool
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    sets = {c["name"]: c["counters"] for c in slices[1]["spec"]["sharedCounters"]}
    parents = {m.parent_uuid for m in inv.mig_devices()}
    gpus = {g.uuid: g for g in inv.gpus}
    assert set(sets) == {counter_set_name(u) for u in parents}
    for uuid in parents:
        assert sets[counter_set_name(uuid)] == {"memory": {"value": quantity(gpus[uuid].memory_total_bytes)}}
    by_uuid = {m.uuid: m for m in inv.mig_devices()}
    used: dict[str, int] = {}
    for device in slices[0]["spec"]["devices"]:
        a = _attrs(device)
        if a["type"] == "gpu":
            assert "consumesCounters" not in device  # a GPU without MIG shares nothing
            continue
        mig = by_uuid[a["uuid"]]
        (consumes,) = device["consumesCounters"]
        assert consumes == {
            "counterSet": counter_set_name(mig.parent_uuid),
            "counters": {"memory": {"value": quantity(mig.memory_bytes)}},
        }
        used[mig.parent_uuid] = used.get(mig.parent_uuid, 0) + mig.memory_bytes
    assert all(used[u] <= gpus[u].memory_total_bytes for u in parents)  # the layout fits its counters


def test_replicas_are_not_published() -> None:
    inv = inventory("dgx-h100")
    config = parse_plugin_config(
        {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    )
    assert len(_devices(inv, config)) == 32
    assert slice_devices(_devices(inv, config)) == ()  # time-slicing stays with the device plugin


def test_more_devices_than_one_slice_holds_split_into_a_counted_pool() -> None:
    inv = inventory("dgx-h100")
    base = _devices(inv)[0]
    many = [dataclasses.replace(base, id=f"GPU-{n:08d}", base_uuid=f"GPU-{n:08d}") for n in range(300)]
    slices = build_slices(inv, many, node_name="n", node_uid=None, driver=DRIVER, generation=1)
    assert MAX_DEVICES_PER_SLICE == 64  # the API's limit once a device carries taints or counters
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 64, 64, 64, 44]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {5}
    assert len({s["metadata"]["name"] for s in slices}) == 5
    assert "ownerReferences" not in slices[0]["metadata"]


def test_no_devices_still_publishes_the_empty_pool() -> None:
    inv = inventory("dgx-h100")
    (obj,) = build_slices(inv, [], node_name="n", node_uid=None, driver=DRIVER, generation=1)
    assert obj["spec"]["devices"] == []
    assert obj["spec"]["pool"]["resourceSliceCount"] == 1


def test_taint_hook_renders_taints_on_the_named_device_only() -> None:
    inv = inventory("dgx-h100")
    gpu = inv.gpus[2]
    taint = {"key": "gpu.gpuagent.dev/xid", "value": "79", "effect": "NoSchedule"}
    (obj,) = _slices(inv, taints={gpu.uuid: [taint]})
    tainted = [d for d in obj["spec"]["devices"] if "taints" in d]
    assert [d["name"] for d in tainted] == [device_name(gpu.uuid)]
    assert tainted[0]["taints"] == [taint]


def test_content_ignores_the_generation_only() -> None:
    inv = inventory("dgx-h100")
    assert content(_slices(inv, generation=1)) == content(_slices(inv, generation=9))
    assert content(_slices(inv)) != content(_slices(inv, taints={inv.gpus[0].uuid: [{"key": "k"}]}))


@pytest.mark.parametrize(
    ("uuid", "name"),
    [
        ("GPU-8F3C0000-1111-2222-3333-444455556666", "gpu-8f3c0000-1111-2222-3333-444455556666"),
        (
            "MIG-GPU-8f3c0000-1111-2222-3333-444455556666/1/0",
            "mig-gpu-8f3c0000-1111-2222-3333-444455556666-1-0",
        ),
        ("--weird__UUID--", "weird-uuid"),
    ],
    ids=["gpu", "old-mig-form", "sanitised"],
)
def test_device_names_are_dns_labels(uuid: str, name: str) -> None:
    assert device_name(uuid) == name
    assert len(device_name(uuid * 4)) <= 63
    assert not device_name(uuid * 4).endswith("-")


@pytest.mark.parametrize(
    ("nvml", "kernel"),
    [("00000000:1B:00.0", "0000:1b:00.0"), ("00000008:01:00.0", "0008:01:00.0"), ("weird", "weird")],
)
def test_pci_bus_id_kernel_form(nvml: str, kernel: str) -> None:
    assert pci_bus_id(nvml) == kernel


def test_long_strings_are_cut_to_the_api_limit() -> None:
    inv = inventory("dgx-h100")
    gpus = tuple(dataclasses.replace(g, name="X" * 200) for g in inv.gpus)
    inv = dataclasses.replace(inv, gpus=gpus)
    (obj,) = _slices(inv)
    assert all(len(_attrs(d)["productName"]) == 64 for d in obj["spec"]["devices"])


def test_the_imex_channel_device_is_published_only_inside_a_complete_nvlink_domain() -> None:
    inv = inventory("gb200-nvl72:rack=2,tray=5")
    (obj,) = _slices(inv, imex_channel=True)
    channel = next(d for d in obj["spec"]["devices"] if d["name"] == "imex-channel")
    fabric = inv.fabric[0]
    assert channel["allowMultipleAllocations"] is True  # every claim of the gang on the node shares it
    assert _attrs(channel) == {
        "type": "imex-channel",
        "nvlinkDomain": f"{fabric.cluster_uuid.lower()}.{fabric.clique_id}",
        "clusterUUID": fabric.cluster_uuid.lower(),
        "cliqueId": fabric.clique_id,
    }
    (plain,) = _slices(inv)
    assert all(d["name"] != "imex-channel" for d in plain["spec"]["devices"])
    (single,) = _slices(inventory("dgx-h100"), imex_channel=True)  # no multi-node NVLink: no channel
    assert all(d["name"] != "imex-channel" for d in single["spec"]["devices"])
