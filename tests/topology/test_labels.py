from __future__ import annotations

import dataclasses

import pytest

from tests.topology.factories import UUID_A, hgx_node, ib_port, nvl72_tray, pcie_node
from topology.labels import LABEL_CLIQUE, LABEL_IB_LEAF, LABEL_NVLINK_DOMAIN, label_value, node_labels
from topology.model import FabricHealthSummary, FabricState, MigDevice, MigState, NodeInventory
from topology.names import switch_set_name


def test_gfd_labels_of_an_nvl72_tray() -> None:
    labels = node_labels(nvl72_tray("t0"), node_name="t0")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-GB200"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.memory"] == "189471"
    assert labels["nvidia.com/cuda.driver.major"] == "580"
    assert labels["nvidia.com/cuda.driver.minor"] == "126"
    assert labels["nvidia.com/cuda.driver.rev"] == "20"
    assert labels["nvidia.com/cuda.runtime-version.full"] == "13.0"
    assert labels["nvidia.com/mig.strategy"] == "none"
    assert labels[LABEL_CLIQUE] == f"{UUID_A}.32766"
    assert labels[LABEL_NVLINK_DOMAIN] == f"nvl-{UUID_A}-32766"
    assert LABEL_IB_LEAF not in labels


def test_gpu_family_is_spelled_as_gfd_spells_it() -> None:
    """GFD writes ``ada-lovelace`` where NVML's architecture is ADA (NVIDIA's GFD over the same machine:
    tests/e2e/test_peer_gfd.py)."""
    assert node_labels(pcie_node("p"), node_name="p")["nvidia.com/gpu.family"] == "ada-lovelace"
    assert node_labels(nvl72_tray("t"), node_name="t")["nvidia.com/gpu.family"] == "blackwell"


CLIQUE_CASES = {
    "completed-healthy": (nvl72_tray("t"), True, True),
    "in-progress": (nvl72_tray("t", state=FabricState.IN_PROGRESS), False, False),
    "unhealthy-loses-gfd-clique-and-domain": (
        nvl72_tray("t", summary=FabricHealthSummary.UNHEALTHY),
        False,
        False,
    ),
    "limited-capacity-keeps-both": (
        nvl72_tray("t", summary=FabricHealthSummary.LIMITED_CAPACITY),
        True,
        True,
    ),
}


@pytest.mark.parametrize(("inv", "clique", "domain"), CLIQUE_CASES.values(), ids=CLIQUE_CASES.keys())
def test_clique_label_only_when_completed(inv: object, clique: bool, domain: bool) -> None:
    labels = node_labels(inv, node_name="t")  # type: ignore[arg-type]
    assert (LABEL_CLIQUE in labels) is clique
    assert (LABEL_NVLINK_DOMAIN in labels) is domain


def test_gpus_disagreeing_on_the_clique_get_no_label() -> None:
    inv = nvl72_tray("t")
    fabric = list(inv.fabric)
    fabric[3] = dataclasses.replace(fabric[3], clique_id=7)
    labels = node_labels(dataclasses.replace(inv, fabric=tuple(fabric)), node_name="t")
    assert LABEL_CLIQUE not in labels
    assert labels["gpuagent.dev/nvlink-fabric"] == "inconsistent"


def test_hgx_node_is_its_own_domain_and_labels_its_leaf_set() -> None:
    ports = tuple(
        ib_port(f"mlx5_{k}", node_guid=f"0xe09d73030000000{k}", switch_guid=f"0x2c5eab030000000{k}")
        for k in range(4)
    )
    labels = node_labels(hgx_node("h0", ports=ports), node_name="h0")
    assert labels[LABEL_NVLINK_DOMAIN] == "nvl-node-h0"
    assert LABEL_CLIQUE not in labels
    assert labels[LABEL_IB_LEAF] == switch_set_name("leaf", [f"2c5eab030000000{k}" for k in range(4)])


def test_pcie_and_sharing_and_bad_options() -> None:
    labels = node_labels(pcie_node("p"), node_name="p", sharing_strategy="time-slicing", replicas=4)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L40S-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    with pytest.raises(ValueError, match="mig_strategy 'double'"):
        node_labels(pcie_node("p"), node_name="p", mig_strategy="double")


def test_label_value_sanitizing() -> None:
    assert label_value("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert label_value("A (weird) name!") == "A-weird-name"
    assert len(label_value("x" * 100)) == 63


def test_mig_labels_follow_the_strategy() -> None:

    inv = hgx_node("m")
    devices = tuple(
        MigDevice(
            uuid=f"MIG-{g}-{i}",
            parent_uuid=inv.gpus[g].uuid,
            parent_index=g,
            index=i,
            gpu_instance_id=i,
            compute_instance_id=0,
            profile="1g.10gb",
            gpu_slices=1,
            memory_slices=1,
            compute_slices=1,
            memory_bytes=9984 * 2**20,
            sm_count=16,
        )
        for g in range(8)
        for i in range(7)
    )
    states = tuple(
        MigState(gpu_index=g, current_enabled=True, pending_enabled=True, devices=devices[g * 7 : g * 7 + 7])
        for g in range(8)
    )
    mig = dataclasses.replace(inv, mig=states)
    single = node_labels(mig, node_name="m", mig_strategy="single")
    assert single["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert single["nvidia.com/gpu.count"] == "56"
    assert single["nvidia.com/gpu.memory"] == "9984"
    mixed = node_labels(mig, node_name="m", mig_strategy="mixed")
    assert mixed["nvidia.com/mig-1g.10gb.count"] == "56"
    assert mixed["nvidia.com/gpu.count"] == "8"
    assert "nvidia.com/mig-1g.10gb.count" not in node_labels(mig, node_name="m")


def _mig_node(enabled: dict[int, tuple[str, ...]]) -> NodeInventory:
    """An 8-GPU HGX node whose GPUs in ``enabled`` have MIG on with one device per listed profile."""
    inv = hgx_node("m")
    states = []
    for g, profiles in enabled.items():
        devices = tuple(
            MigDevice(
                uuid=f"MIG-{g}-{i}",
                parent_uuid=inv.gpus[g].uuid,
                parent_index=g,
                index=i,
                gpu_instance_id=i,
                compute_instance_id=0,
                profile=profile,
                gpu_slices=1,
                memory_slices=1,
                compute_slices=1,
                memory_bytes=9984 * 2**20,
                sm_count=16,
            )
            for i, profile in enumerate(profiles)
        )
        states.append(MigState(gpu_index=g, current_enabled=True, pending_enabled=True, devices=devices))
    return dataclasses.replace(inv, mig=tuple(states))


INVALID_SINGLE = {
    "some-gpus-without-mig": dict.fromkeys(range(4), ("1g.10gb",)),
    "a-mig-gpu-without-devices": {g: ("1g.10gb",) if g else () for g in range(8)},
    "two-profiles": {g: ("1g.10gb",) if g else ("2g.20gb",) for g in range(8)},
}


@pytest.mark.parametrize("enabled", INVALID_SINGLE.values(), ids=INVALID_SINGLE.keys())
def test_single_strategy_over_a_layout_it_cannot_serve_is_labelled_invalid_as_gfd_does(
    enabled: dict[int, tuple[str, ...]],
) -> None:
    """NVIDIA's GFD over the same machine writes these (tests/e2e/test_peer_gfd.py); our device plugin
    refuses the layout, so the node offers no nvidia.com/gpu."""
    labels = node_labels(_mig_node(enabled), node_name="m", mig_strategy="single", replicas=4)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-INVALID"
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.memory"]) == ("0", "0")
    assert (labels["nvidia.com/gpu.replicas"], labels["nvidia.com/gpu.sharing-strategy"]) == ("0", "")
    assert node_labels(_mig_node(enabled), node_name="m", mig_strategy="mixed")["nvidia.com/gpu.count"] != "0"
