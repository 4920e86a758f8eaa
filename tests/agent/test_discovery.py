from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.discovery import (
    connectivity_matrix,
    discover,
    normalize_bus_id,
    nvlink_counts,
    resolve_nvlinks,
)
from agent.host import simulated_host
from agent.nvml.errors import CODES, NVMLError
from agent.nvml.fake import SimulatedNvml, SimulationError
from agent.nvml.simulate import PROFILES, build_simulator
from tests.agent.inventory_checks import assert_matrix_consistent, assert_mig_within_slices
from topology.model import (
    ConnectivityMatrix,
    FabricHealthSummary,
    Gpu,
    LinkLevel,
    NodeInventory,
    NvLink,
    RemoteDeviceType,
)

ALL_PROFILES = sorted(PROFILES)

# hardware.md §2: per-pair NVLink counts of the DGX-1 hybrid cube-mesh
V100_LINKS = [
    [0, 1, 1, 2, 2, 0, 0, 0],
    [1, 0, 2, 1, 0, 2, 0, 0],
    [1, 2, 0, 2, 0, 0, 1, 0],
    [2, 1, 2, 0, 0, 0, 0, 1],
    [2, 0, 0, 0, 0, 1, 1, 2],
    [0, 2, 0, 0, 1, 0, 2, 1],
    [0, 0, 1, 0, 1, 2, 0, 2],
    [0, 0, 0, 1, 2, 1, 2, 0],
]


def _sim(profile: str) -> SimulatedNvml:
    sim = build_simulator(profile)
    sim.init()
    return sim


def _discover(sim: SimulatedNvml, tmp: Path) -> NodeInventory:
    return discover(nvml=sim, sysfs_root=tmp, host=simulated_host(sim.machine))


# --------------------------------------------------------------------------- every profile


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_every_profile_discovers_cleanly(profile: str, tmp_path: Path) -> None:
    sim = _sim(profile)
    inv = _discover(sim, tmp_path)
    assert inv.errors == ()
    assert inv.driver is not None
    assert [g.index for g in inv.gpus] == list(range(len(sim.machine.gpus)))
    assert all(not g.lost and g.error is None and g.uuid.startswith("GPU-") for g in inv.gpus)
    assert inv.host.name == sim.machine.hostname
    assert_matrix_consistent(inv)
    assert_mig_within_slices(inv)


@pytest.mark.parametrize(
    ("profile", "cell"),
    [("dgx-h100", "NV18"), ("hgx-h200", "NV18"), ("gb200-nvl72", "NV18"), ("dgx-a100-mig", "NV12")],
)
def test_nvswitch_machines_show_every_pair_as_the_switch_link_count(
    profile: str, cell: str, tmp_path: Path
) -> None:
    inv = _discover(_sim(profile), tmp_path)
    assert inv.matrix is not None
    n = len(inv.matrix.gpu_indices)
    assert all(inv.matrix.cells[i][j] == cell for i in range(n) for j in range(n) if i != j)


def test_dgx1_cube_mesh_counts_and_sys_elsewhere(tmp_path: Path) -> None:
    inv = _discover(_sim("dgx1-v100"), tmp_path)
    assert inv.matrix is not None
    for a in range(8):
        for b in range(8):
            if a == b:
                continue
            conn = inv.matrix.connection(a, b)
            if V100_LINKS[a][b]:
                assert str(conn) == f"NV{V100_LINKS[a][b]}"
            else:
                assert conn.level is LinkLevel.SYS
    # remote PCI ids resolved to peer GPU indices
    assert all(link.remote_gpu_index is not None for link in inv.nvlinks if link.gpu_index == 0)


def test_pcie_machine_has_no_nvlink_and_pcie_levels(tmp_path: Path) -> None:
    inv = _discover(_sim("pcie-l40s"), tmp_path)
    assert inv.nvlinks == ()
    assert inv.mig == ()  # not MIG-capable: None, not an error
    assert inv.fabric == ()  # not supported: None
    assert inv.matrix is not None
    assert inv.matrix.cells[0] == ("X", "NODE", "SYS", "SYS")
    assert all(g.nvlink_count == 0 and not g.mig_capable for g in inv.gpus)


def test_fabric_of_a_gb200_tray_is_a_multi_node_clique(tmp_path: Path) -> None:
    inv = _discover(build_and_init("gb200-nvl72:rack=3,tray=5"), tmp_path)
    assert len(inv.fabric) == 4
    cliques = {f.clique for f in inv.fabric}
    assert len(cliques) == 1
    assert all(f.multi_node and f.health_summary is FabricHealthSummary.HEALTHY for f in inv.fabric)
    assert inv.host.name == "rack3-tray5"


def build_and_init(spec: str) -> SimulatedNvml:
    sim = build_simulator(spec)
    sim.init()
    return sim


# --------------------------------------------------------------------------- failures


def test_a_lost_gpu_is_marked_and_the_others_kept(tmp_path: Path) -> None:
    sim = _sim("dgx-h100")
    sim.lose_gpu(3)
    inv = _discover(sim, tmp_path)
    lost = inv.gpu(3)
    assert lost.lost
    assert lost.error is not None
    assert "GPU_IS_LOST" in lost.error
    assert [g.index for g in inv.gpus if not g.lost] == [0, 1, 2, 4, 5, 6, 7]
    assert all(g.error is None for g in inv.gpus if g.index != 3)
    assert inv.matrix is not None
    assert inv.matrix.gpu_indices == (0, 1, 2, 4, 5, 6, 7)
    assert all(link.gpu_index != 3 for link in inv.nvlinks)
    assert inv.errors == ()
    assert_matrix_consistent(inv)


def test_a_gpu_lost_after_identity_is_marked_lost_and_left_out(tmp_path: Path) -> None:
    sim = _sim("dgx-a100-mig")
    sim.inject_error(CODES["GPU_IS_LOST"], call="device_get_gpu_instances", gpu=1)
    inv = _discover(sim, tmp_path)
    gpu = inv.gpu(1)
    assert gpu.lost
    assert gpu.uuid.startswith("GPU-")  # identity was read before it fell off
    assert gpu.error is not None
    assert gpu.error.startswith("MIG state:")
    assert all(s.gpu_index != 1 for s in inv.mig)
    assert inv.matrix is not None
    assert 1 not in inv.matrix.gpu_indices


def test_any_other_nvml_error_marks_that_gpu_only(tmp_path: Path) -> None:
    sim = _sim("gb200-nvl72")
    sim.inject_error(CODES["UNKNOWN"], call="device_get_gpu_fabric_info_v", gpu=2)
    inv = _discover(sim, tmp_path)
    gpu = inv.gpu(2)
    assert not gpu.lost
    assert gpu.error == "fabric info: Unknown Error (NVML UNKNOWN)"
    assert [f.gpu_index for f in inv.fabric] == [0, 1, 3]
    assert inv.matrix is not None
    assert inv.matrix.gpu_indices == (0, 1, 2, 3)


def test_identity_failure_that_is_not_lost_keeps_a_placeholder(tmp_path: Path) -> None:
    sim = _sim("pcie-l40s")
    sim.inject_error(CODES["NO_PERMISSION"], call="device_get_uuid", gpu=0)
    inv = _discover(sim, tmp_path)
    gpu = inv.gpu(0)
    assert gpu.error == "identity: Insufficient Permissions (NVML NO_PERMISSION)"
    assert not gpu.lost
    assert [g.uuid != "" for g in inv.gpus] == [False, True, True, True]
    assert inv.matrix is not None
    assert inv.matrix.gpu_indices == (1, 2, 3)  # nothing is known about an unidentified GPU's links


def test_node_level_problems_go_to_errors(tmp_path: Path) -> None:
    sim = _sim("dgx-h100")
    sim.inject_error(CODES["UNKNOWN"], call="device_get_count")
    sim.inject_error(CODES["UNKNOWN"], call="system_get_driver_version")
    inv = _discover(sim, tmp_path)
    assert inv.gpus == ()
    assert inv.driver is None
    assert inv.matrix is None
    assert inv.errors == (
        "driver version: Unknown Error (NVML UNKNOWN)",
        "device count: Unknown Error (NVML UNKNOWN)",
    )


def test_pcie_level_not_supported_falls_back_to_numa(tmp_path: Path) -> None:
    sim = _sim("pcie-l40s")
    sim.inject_error(CODES["NOT_SUPPORTED"], call="device_get_topology_common_ancestor")
    inv = _discover(sim, tmp_path)
    assert inv.errors == ()
    assert inv.matrix is not None
    assert inv.matrix.cells[0] == ("X", "NODE", "SYS", "SYS")


def test_pcie_level_failure_is_a_node_error(tmp_path: Path) -> None:
    sim = _sim("pcie-l40s")
    sim.inject_error(CODES["UNKNOWN"], call="device_get_topology_common_ancestor", times=1)
    inv = _discover(sim, tmp_path)
    assert inv.errors == ("PCIe level of GPU 0 and GPU 1: Unknown Error (NVML UNKNOWN)",)
    assert inv.matrix is not None
    assert inv.matrix.cells[0][1] == "NODE"


# --------------------------------------------------------------------------- link changes


def test_nvlink_down_lowers_the_count_on_a_switch_machine(tmp_path: Path) -> None:
    sim = _sim("dgx-h100")
    sim.nvlink_down(0, 5)
    inv = _discover(sim, tmp_path)
    assert inv.matrix is not None
    assert inv.matrix.connection(0, 1) == inv.matrix.connection(1, 0)
    assert str(inv.matrix.connection(0, 7)) == "NV17"
    assert str(inv.matrix.connection(1, 7)) == "NV18"
    assert_matrix_consistent(inv)


def test_nvlink_down_on_a_direct_link_lowers_that_pair_only(tmp_path: Path) -> None:
    sim = _sim("dgx1-v100")
    before = _discover(sim, tmp_path)
    to_gpu3 = [lk.link for lk in before.nvlinks if lk.gpu_index == 0 and lk.remote_gpu_index == 3]
    assert len(to_gpu3) == 2
    sim.nvlink_down(0, to_gpu3[0])
    after = _discover(sim, tmp_path)
    assert after.matrix is not None
    assert str(after.matrix.connection(0, 3)) == "NV1"
    assert str(after.matrix.connection(3, 0)) == "NV1"
    assert str(after.matrix.connection(0, 4)) == "NV2"
    sim.nvlink_down(0, to_gpu3[1])
    gone = _discover(sim, tmp_path)
    assert gone.matrix is not None
    assert gone.matrix.connection(0, 3).level is sim.pcie_level(0, 3)  # no NVLink left: the PCIe path
    assert gone.matrix.connection(0, 3).level is not LinkLevel.NVLINK


# --------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("00000000:1B:00.0", "0000:1b:00.0"),
        ("0000:1b:00.0", "0000:1b:00.0"),
        ("1b:00.0", "0000:1b:00.0"),
        ("00000008:01:00.0", "0008:01:00.0"),
        (" weird ", "weird"),
    ],
)
def test_normalize_bus_id(text: str, expected: str) -> None:
    assert normalize_bus_id(text) == expected


def _gpu(index: int, bus: str, numa: int | None = 0) -> Gpu:
    return Gpu(
        index=index,
        uuid=f"GPU-{index}",
        name="x",
        serial=None,
        pci_bus_id=bus,
        minor_number=index,
        memory_total_bytes=1,
        compute_capability=(9, 0),
        architecture="hopper",
        numa_node=numa,
        cpu_affinity=None,
        persistence_mode=None,
        compute_mode=None,
    )


def _link(
    gpu: int, link: int, remote: str, *, active: bool = True, kind: RemoteDeviceType = RemoteDeviceType.GPU
) -> NvLink:
    return NvLink(gpu, link, active, 4, kind, remote, None)


def test_resolve_nvlinks_matches_any_bus_id_form() -> None:
    gpus = [_gpu(0, "00000000:1B:00.0"), _gpu(1, "00000000:43:00.0")]
    links = resolve_nvlinks(
        gpus,
        [
            _link(0, 0, "0000:43:00.0"),
            _link(1, 0, "00000000:1b:00.0"),
            _link(0, 1, "0000:99:00.0"),
            _link(0, 2, "00000000:05:00.0", kind=RemoteDeviceType.SWITCH),
        ],
    )
    assert [lk.remote_gpu_index for lk in links] == [1, 0, None, None]


def test_inactive_and_unknown_links_do_not_count() -> None:
    links = [
        NvLink(0, 0, True, 4, RemoteDeviceType.GPU, "b", 1),
        NvLink(1, 0, True, 4, RemoteDeviceType.GPU, "a", 0),
        NvLink(0, 1, False, 4, RemoteDeviceType.GPU, "b", 1),
        NvLink(1, 1, True, 4, RemoteDeviceType.GPU, "a", 0),
        NvLink(0, 2, True, 4, RemoteDeviceType.GPU, "z", 9),  # not one of ours
    ]
    assert nvlink_counts([0, 1], links) == {(0, 1): 1}


def test_matrix_pcie_levels_and_missing_entries() -> None:
    gpus = [_gpu(0, "a", 0), _gpu(1, "b", 0), _gpu(2, "c", 1)]
    m = connectivity_matrix(gpus, [], {(0, 1): LinkLevel.PIX, (0, 2): None})
    assert m == ConnectivityMatrix((0, 1, 2), (("X", "PIX", "SYS"), ("PIX", "X", "SYS"), ("SYS", "SYS", "X")))


# --------------------------------------------------------------------------- properties

_FAULT = st.one_of(
    st.tuples(st.just("nvlink_down"), st.integers(0, 7), st.integers(0, 17)),
    st.tuples(st.just("lose"), st.integers(0, 7), st.just(0)),
    st.tuples(
        st.just("mig"),
        st.integers(0, 7),
        st.lists(
            st.sampled_from(["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]), max_size=8
        ),
    ),
)


def _apply(sim: SimulatedNvml, fault: tuple[str, int, object]) -> None:
    kind, gpu, arg = fault
    gpu %= len(sim.machine.gpus)
    try:
        if kind == "nvlink_down":
            links = len(sim.machine.gpus[gpu].nvlinks)
            if links:
                sim.nvlink_down(gpu, int(str(arg)) % links)
        elif kind == "lose":
            sim.lose_gpu(gpu)
        else:
            assert isinstance(arg, list)
            sim.reconfigure_mig(gpu, arg)
    except SimulationError:
        pass  # an impossible change (not MIG-capable, no placement, lost GPU) leaves the machine as it was


@given(
    profile=st.sampled_from(ALL_PROFILES),
    faults=st.lists(_FAULT, max_size=6),
)
def test_matrix_and_mig_invariants_under_faults(
    profile: str, faults: Sequence[tuple[str, int, object]]
) -> None:
    sim = _sim(profile)
    for fault in faults:
        _apply(sim, fault)
    inv = discover(nvml=sim, sysfs_root=Path("/nonexistent-sysfs"), host=simulated_host(sim.machine))
    assert_matrix_consistent(inv)
    assert_mig_within_slices(inv)
    lost = {g.index for g in inv.gpus if g.lost}
    assert lost == {i for i, g in enumerate(sim.machine.gpus) if _is_lost(sim, i)}


def _is_lost(sim: SimulatedNvml, index: int) -> bool:
    try:
        sim.device_get_uuid(index)
    except NVMLError:
        return True
    return False
