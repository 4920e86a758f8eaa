"""Small inventories for topology tests (keyword builders; no simulator needed)."""

from __future__ import annotations

from topology.builder import NodeFacts
from topology.model import (
    ConnectivityMatrix,
    Driver,
    FabricHealth,
    FabricHealthSummary,
    FabricInfo,
    FabricState,
    Gpu,
    Host,
    IbPort,
    NodeInventory,
)
from topology.nvlink import CliqueKey, FabricStatus

UUID_A = "9c6f5af3-0000-4000-8000-00000000000a"
UUID_B = "9c6f5af3-0000-4000-8000-00000000000b"


def gpu(index: int, *, name: str = "NVIDIA GB200", mem_mib: int = 189471, arch: str = "blackwell") -> Gpu:
    return Gpu(
        index=index,
        uuid=f"GPU-{index:08x}-1111-2222-3333-444444444444",
        name=name,
        serial=None,
        pci_bus_id=f"00000000:{index + 1:02X}:00.0",
        minor_number=index,
        memory_total_bytes=mem_mib * 2**20,
        compute_capability=(10, 0),
        architecture=arch,
        numa_node=0,
        cpu_affinity=None,
        persistence_mode=True,
        compute_mode="DEFAULT",
    )


def fabric(
    index: int,
    *,
    cluster_uuid: str = UUID_A,
    clique_id: int = 32766,
    state: FabricState = FabricState.COMPLETED,
    status: str = "SUCCESS",
    summary: FabricHealthSummary = FabricHealthSummary.HEALTHY,
) -> FabricInfo:
    return FabricInfo(
        gpu_index=index,
        cluster_uuid=cluster_uuid,
        clique_id=clique_id,
        state=state,
        status=status,
        health_mask=0x1AA,
        health=FabricHealth(degraded_bandwidth=False, incorrect_configuration="NONE"),
        health_summary=summary,
    )


def ib_port(device: str, *, node_guid: str, switch_guid: str | None) -> IbPort:
    return IbPort(
        device=device,
        port=1,
        state="ACTIVE",
        physical_state="LinkUp",
        rate_gbps=400.0,
        link_layer="InfiniBand",
        node_guid=node_guid,
        port_guid=node_guid,
        sys_image_guid=node_guid,
        numa_node=0,
        pci_address=None,
        switch_guid=switch_guid,
    )


def nvl72_tray(
    host: str,
    *,
    cluster_uuid: str = UUID_A,
    clique_id: int = 32766,
    state: FabricState = FabricState.COMPLETED,
    summary: FabricHealthSummary = FabricHealthSummary.HEALTHY,
    ports: tuple[IbPort, ...] = (),
) -> NodeInventory:
    cells = tuple(tuple("X" if a == b else "NV18" for b in range(4)) for a in range(4))
    return NodeInventory(
        host=Host(name=host, cpu_count=144, memory_bytes=2**39),
        driver=Driver("580.126.20", "13.580.126.20", 13000),
        gpus=tuple(gpu(i) for i in range(4)),
        matrix=ConnectivityMatrix((0, 1, 2, 3), cells),
        fabric=tuple(
            fabric(i, cluster_uuid=cluster_uuid, clique_id=clique_id, state=state, summary=summary)
            for i in range(4)
        ),
        ib=ports,
    )


def hgx_node(host: str, *, ports: tuple[IbPort, ...] = ()) -> NodeInventory:
    cells = tuple(tuple("X" if a == b else "NV18" for b in range(8)) for a in range(8))
    return NodeInventory(
        host=Host(name=host, cpu_count=224, memory_bytes=2**41),
        driver=Driver("580.126.20", "13.580.126.20", 13000),
        gpus=tuple(gpu(i, name="NVIDIA H100 80GB HBM3", mem_mib=81559, arch="hopper") for i in range(8)),
        matrix=ConnectivityMatrix(tuple(range(8)), cells),
        ib=ports,
    )


def pcie_node(host: str) -> NodeInventory:
    cells = tuple(tuple("X" if a == b else "SYS" for b in range(4)) for a in range(4))
    return NodeInventory(
        host=Host(name=host, cpu_count=64, memory_bytes=2**38),
        driver=Driver("580.126.20", "13.580.126.20", 13000),
        gpus=tuple(gpu(i, name="NVIDIA L40S", mem_mib=46068, arch="ada") for i in range(4)),
        matrix=ConnectivityMatrix((0, 1, 2, 3), cells),
    )


def tray(
    name: str,
    *,
    cluster: str = UUID_A,
    clique: int = 32766,
    leaves: tuple[str, ...] = (),
    fabric_status: FabricStatus = FabricStatus.OK,
) -> NodeFacts:
    """Builder input for one NVL72 tray."""
    return NodeFacts(
        name=name,
        fabric=fabric_status,
        clique=CliqueKey(cluster, clique)
        if fabric_status in (FabricStatus.OK, FabricStatus.UNHEALTHY)
        else None,
        reason=None if fabric_status is FabricStatus.OK else f"fabric {fabric_status.value}",
        leaves=frozenset(leaves),
    )
