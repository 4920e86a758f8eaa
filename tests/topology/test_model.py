from __future__ import annotations

import pytest

from topology.model import (
    Connection,
    ConnectivityMatrix,
    Driver,
    FabricHealth,
    FabricHealthSummary,
    FabricInfo,
    FabricState,
    Gpu,
    Host,
    LinkLevel,
    NodeInventory,
    tier_number,
)


def make_gpu(index: int = 0) -> Gpu:
    return Gpu(
        index=index,
        uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
        name="NVIDIA H100 80GB HBM3",
        serial=None,
        pci_bus_id="00000000:1B:00.0",
        minor_number=index,
        memory_total_bytes=81559 * 2**20,
        compute_capability=(9, 0),
        architecture="hopper",
        numa_node=0,
        cpu_affinity="0-55,112-167",
        persistence_mode=True,
        compute_mode="DEFAULT",
    )


def make_inventory() -> NodeInventory:
    fabric = FabricInfo(
        gpu_index=0,
        cluster_uuid="9c6f5af3-0000-4000-8000-000000000001",
        clique_id=4026,
        state=FabricState.COMPLETED,
        status="SUCCESS",
        health_mask=0x1AA,
        health=FabricHealth(degraded_bandwidth=False, incorrect_configuration="NONE"),
        health_summary=FabricHealthSummary.HEALTHY,
    )
    return NodeInventory(
        host=Host(name="n1", cpu_count=224, memory_bytes=2**40),
        driver=Driver("580.126.20", "13.580.126.20", 13000),
        gpus=(make_gpu(0), make_gpu(1)),
        matrix=ConnectivityMatrix((0, 1), (("X", "NV18"), ("NV18", "X"))),
        fabric=(fabric,),
    )


def test_round_trip_through_plain_data() -> None:
    inv = make_inventory()
    plain = inv.to_dict()
    assert plain["schema"] == "v1"
    assert plain["fabric"][0]["state"] == "COMPLETED"
    assert plain["gpus"][0]["compute_capability"] == [9, 0]
    assert NodeInventory.from_dict(plain) == inv


def test_from_dict_names_the_bad_field() -> None:
    plain = make_inventory().to_dict()
    plain["gpus"][1]["memory_total_bytes"] = "lots"
    with pytest.raises(ValueError, match=r"gpus\[1\]\.memory_total_bytes"):
        NodeInventory.from_dict(plain)


def test_from_dict_rejects_unknown_enum_value_listing_valid_ones() -> None:
    plain = make_inventory().to_dict()
    plain["fabric"][0]["state"] = "DONE"
    with pytest.raises(ValueError, match="COMPLETED"):
        NodeInventory.from_dict(plain)


@pytest.mark.parametrize(
    ("cell", "level", "links"),
    [("NV18", LinkLevel.NVLINK, 18), ("PIX", LinkLevel.PIX, 0), ("X", LinkLevel.SELF, 0)],
    ids=["nvlink", "pix", "self"],
)
def test_connection_parse_and_print(cell: str, level: LinkLevel, links: int) -> None:
    conn = Connection.parse(cell)
    assert (conn.level, conn.nvlinks) == (level, links)
    assert str(conn) == cell


def test_clique_label_and_multi_node() -> None:
    fab = make_inventory().fabric[0]
    assert fab.clique == "9c6f5af3-0000-4000-8000-000000000001.4026"
    assert fab.multi_node
    zero = FabricInfo(
        0,
        "00000000-0000-0000-0000-000000000000",
        0,
        FabricState.COMPLETED,
        "SUCCESS",
        None,
        FabricHealth(),
        FabricHealthSummary.NOT_SUPPORTED,
    )
    assert not zero.multi_node


def test_tier_numbers() -> None:
    assert tier_number("nvlink") == 1
    assert tier_number("core") == 4
    with pytest.raises(ValueError, match="valid: nvlink, leaf, spine, core"):
        tier_number("rack")


def test_driver_cuda_version_parts() -> None:
    drv = Driver("580.126.20", "13.580.126.20", 12040)
    assert (drv.cuda_major, drv.cuda_minor, drv.driver_major) == (12, 4, 580)
