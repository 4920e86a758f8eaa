"""Builders of inventories, samples and snapshots for the metrics tests (keyword arguments only)."""

from __future__ import annotations

from agent.nvml.protocol import GpuSample, MigSample, NvLinkCounters, ProcessInfo
from topology.model import Driver, Gpu, Host, MigDevice, MigState, NodeInventory

GIB = 1024**3
MIB = 1024**2


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08d}-0000-0000-0000-000000000000"


def mig_uuid(index: int, gi: int) -> str:
    return f"MIG-{index:08d}-{gi:04d}-0000-0000-000000000000"


def make_gpu(*, index: int, memory_bytes: int = 80 * GIB, name: str = "NVIDIA H100 80GB HBM3") -> Gpu:
    return Gpu(
        index=index,
        uuid=gpu_uuid(index),
        name=name,
        serial=None,
        pci_bus_id=f"00000000:{0x10 + index:02X}:00.0",
        minor_number=index,
        memory_total_bytes=memory_bytes,
        compute_capability=(9, 0),
        architecture="hopper",
        numa_node=0,
        cpu_affinity=None,
        persistence_mode=True,
        compute_mode="DEFAULT",
        power_limit_watts=700.0,
    )


def make_mig(*, parent: int, gi: int, profile: str = "1g.10gb", memory_bytes: int = 10 * GIB) -> MigDevice:
    return MigDevice(
        uuid=mig_uuid(parent, gi),
        parent_uuid=gpu_uuid(parent),
        parent_index=parent,
        index=gi,
        gpu_instance_id=gi,
        compute_instance_id=0,
        profile=profile,
        gpu_slices=1,
        memory_slices=1,
        compute_slices=1,
        memory_bytes=memory_bytes,
    )


def make_inventory(*, gpus: int = 2, mig: dict[int, list[tuple[int, str]]] | None = None) -> NodeInventory:
    """``gpus`` whole GPUs; ``mig`` maps a GPU index to its ``(gi, profile)`` MIG devices."""
    states = []
    for index, devices in sorted((mig or {}).items()):
        states.append(
            MigState(
                gpu_index=index,
                current_enabled=True,
                pending_enabled=True,
                devices=tuple(make_mig(parent=index, gi=gi, profile=p) for gi, p in devices),
            )
        )
    return NodeInventory(
        host=Host(name="node-a", cpu_count=64, memory_bytes=512 * GIB),
        driver=Driver(driver_version="580.126.20", nvml_version="13.580.126.20", cuda_driver_version=13000),
        gpus=tuple(make_gpu(index=i) for i in range(gpus)),
        mig=tuple(states),
    )


def make_sample(
    *, index: int, util: int = 50, used: int = 10 * GIB, processes: tuple[ProcessInfo, ...] = ()
) -> GpuSample:
    return GpuSample(
        gpu_index=index,
        gpu_utilization_percent=util,
        memory_utilization_percent=20,
        memory_used_bytes=used,
        memory_free_bytes=80 * GIB - used - 512 * MIB,
        memory_total_bytes=80 * GIB,
        temperature_celsius=41,
        memory_temperature_celsius=38,
        power_watts=312.5,
        energy_joules=123456.789,
        sm_clock_mhz=1980,
        memory_clock_mhz=2619,
        throttle_reasons=0x1 | 0x4,
        pcie_replays=3,
        ecc_corrected_volatile=5,
        ecc_uncorrected_volatile=0,
        ecc_corrected_aggregate=50,
        ecc_uncorrected_aggregate=1,
        remapped_rows_correctable=2,
        remapped_rows_uncorrectable=0,
        remapped_rows_pending=False,
        remapped_rows_failure=False,
        nvlinks=(
            NvLinkCounters(
                link=0,
                active=True,
                tx_bytes=1000,
                rx_bytes=2000,
                crc_flit_errors=1,
                crc_data_errors=0,
                replay_errors=2,
                recovery_errors=0,
            ),
            NvLinkCounters(
                link=1,
                active=False,
                tx_bytes=0,
                rx_bytes=0,
                crc_flit_errors=0,
                crc_data_errors=0,
                replay_errors=0,
                recovery_errors=1,
            ),
        ),
        processes=processes,
    )


def make_mig_sample(
    *, uuid: str, used: int = 1 * GIB, total: int = 10 * GIB, processes: tuple[ProcessInfo, ...] = ()
) -> MigSample:
    return MigSample(uuid=uuid, memory_used_bytes=used, memory_total_bytes=total, processes=processes)
