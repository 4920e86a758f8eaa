"""The ``NvmlBackend`` contract, asserted identically against every simulator profile and real NVML.

The real backend's cases carry the ``gpu`` marker and skip when NVML cannot be initialised here.
"""

from __future__ import annotations

import re
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.discovery import discover
from agent.host import read_host
from agent.nvml.errors import NVMLError, NVMLError_Uninitialized
from agent.nvml.protocol import GpuSample, NvmlBackend, NvmlEvent
from agent.nvml.real import RealNvml
from agent.nvml.simulate import PROFILES, build_simulator
from tests.agent.inventory_checks import assert_matrix_consistent, assert_mig_within_slices
from topology.model import FabricState, LinkLevel, RemoteDeviceType

NVML_BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")
PCIE_LEVELS = {LinkLevel.PIX, LinkLevel.PXB, LinkLevel.PHB, LinkLevel.NODE, LinkLevel.SYS}

BACKENDS = [pytest.param(name, id=name) for name in sorted(PROFILES)] + [
    pytest.param("real", id="real-nvml", marks=pytest.mark.gpu)
]


def _fresh(kind: str) -> NvmlBackend:
    return RealNvml() if kind == "real" else build_simulator(kind)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[NvmlBackend]:
    nvml = _fresh(request.param)
    try:
        nvml.init()
    except NVMLError as exc:
        if request.param == "real":
            pytest.skip(f"no usable NVML here: {exc} ({exc.name})")
        raise
    yield nvml
    nvml.shutdown()


@pytest.mark.parametrize("kind", BACKENDS)
def test_calls_before_init_raise_uninitialized(kind: str) -> None:
    nvml = _fresh(kind)
    with pytest.raises(NVMLError_Uninitialized):
        nvml.device_count()


def test_driver_and_identity(backend: NvmlBackend) -> None:
    driver = backend.driver()
    assert re.match(r"^\d+\.\d+", driver.driver_version)
    assert driver.cuda_driver_version >= 10000
    count = backend.device_count()
    assert count >= 1
    uuids = set()
    for index in range(count):
        gpu = backend.gpu(index)
        assert gpu.index == index
        assert gpu.uuid.startswith("GPU-")
        uuids.add(gpu.uuid)
        assert NVML_BUS_ID.match(gpu.pci_bus_id), gpu.pci_bus_id
        assert gpu.memory_total_bytes > 0
        assert gpu.compute_capability >= (3, 0)
        assert gpu.name
        assert not gpu.lost
        if gpu.platform is not None and gpu.platform.ib_guid is not None:
            assert re.fullmatch(r"0x[0-9a-f]{16}([0-9a-f]{16})?", gpu.platform.ib_guid), gpu.platform.ib_guid
    assert len(uuids) == count
    with pytest.raises(NVMLError):
        backend.gpu(count)


def test_nvlinks_are_contiguous_and_unresolved(backend: NvmlBackend) -> None:
    for index in range(backend.device_count()):
        gpu = backend.gpu(index)
        links = backend.nvlinks(index)
        assert len(links) == gpu.nvlink_count
        assert [lk.link for lk in links] == list(range(len(links)))
        for link in links:
            assert link.gpu_index == index
            assert link.remote_gpu_index is None  # discovery resolves it
            assert link.version is None or 1 <= link.version <= 6
            if link.active:
                assert link.remote_type in set(RemoteDeviceType)
                assert link.remote_pci_bus_id


def test_pcie_levels_are_symmetric(backend: NvmlBackend) -> None:
    count = backend.device_count()
    for a in range(count):
        for b in range(a + 1, count):
            level = backend.pcie_level(a, b)
            assert level is None or level in PCIE_LEVELS
            assert backend.pcie_level(b, a) == level


def test_mig_state_matches_capability(backend: NvmlBackend) -> None:
    for index in range(backend.device_count()):
        gpu = backend.gpu(index)
        state = backend.mig_state(index)
        assert (state is not None) == gpu.mig_capable
        if state is None or not state.current_enabled:
            continue
        assert sum(d.gpu_slices for d in state.devices) <= 7
        gi_ids = {gi.id for gi in state.gpu_instances}
        for device in state.devices:
            assert device.uuid.startswith("MIG-")
            assert device.parent_uuid == gpu.uuid
            assert device.gpu_instance_id in gi_ids
            assert 0 < device.memory_bytes < gpu.memory_total_bytes


def test_fabric_is_none_or_well_formed(backend: NvmlBackend) -> None:
    for index in range(backend.device_count()):
        info = backend.fabric(index)
        if info is None:
            continue
        assert info.gpu_index == index
        assert str(uuidlib.UUID(info.cluster_uuid)) == info.cluster_uuid
        assert info.state is not FabricState.NOT_SUPPORTED
        assert info.status  # "SUCCESS" or an NVML error name
        assert info.health_mask is None or 0 <= info.health_mask < 2**32
        assert info.clique == f"{info.cluster_uuid}.{info.clique_id}"


def test_samples_and_counters(backend: NvmlBackend) -> None:
    before = backend.counters().calls
    for index in range(backend.device_count()):
        sample = backend.sample(index)
        assert isinstance(sample, GpuSample)
        assert sample.gpu_index == index
        if sample.memory_total_bytes is not None:
            assert sample.memory_total_bytes == backend.gpu(index).memory_total_bytes
        assert sample.temperature_celsius is None or 0 < sample.temperature_celsius < 130
        assert isinstance(backend.process_utilization(index), tuple)
    assert backend.counters().calls > before


def test_health_reading_names_the_gpu_and_reads_counters_or_none(backend: NvmlBackend) -> None:
    """The health probe's read: the GPU at the index answers as itself; each counter is a count, a flag,
    or ``None`` where the GPU does not support it (never an error for that alone)."""
    for index in range(backend.device_count()):
        reading = backend.health_reading(index)
        assert reading.uuid == backend.gpu(index).uuid
        for count in (reading.ecc_corrected_volatile, reading.ecc_uncorrected_volatile):
            assert count is None or count >= 0
        for flag in (
            reading.remapped_rows_pending,
            reading.remapped_rows_failure,
            reading.retired_pages_pending,
        ):
            assert flag is None or isinstance(flag, bool)


def test_events_wait_times_out_as_none(backend: NvmlBackend) -> None:
    backend.register_events(tuple(range(backend.device_count())))
    event = backend.wait_event(1)
    assert event is None or isinstance(event, NvmlEvent)


def test_discovery_over_the_backend(backend: NvmlBackend, tmp_path: Path) -> None:
    inv = discover(nvml=backend, sysfs_root=tmp_path, host=read_host(sysfs_root=tmp_path))
    assert len(inv.gpus) == backend.device_count()
    assert all(not g.lost for g in inv.gpus)
    assert_matrix_consistent(inv)
    assert_mig_within_slices(inv)
