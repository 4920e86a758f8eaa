"""Each simulated machine pins the facts of reference/hardware.md it is built from."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.nvml.fake import SimulatedNvml
from agent.nvml.profiles import DGX1_NVLINK_COUNTS, PROFILES, build_machine
from agent.nvml.simulate import build_simulator
from topology.model import LinkLevel, RemoteDeviceType


def started(spec: str) -> SimulatedNvml:
    sim = build_simulator(spec)
    sim.init()
    return sim


def nvlink_pairs(sim: SimulatedNvml) -> dict[tuple[int, int], int]:
    """Direct GPU-GPU link counts per ordered pair, resolved from the remote PCI bus ids."""
    by_bus = {sim.gpu(i).pci_bus_id: i for i in range(sim.device_count())}
    out: Counter[tuple[int, int]] = Counter()
    for i in range(sim.device_count()):
        for link in sim.nvlinks(i):
            if link.remote_type is RemoteDeviceType.GPU and link.remote_pci_bus_id in by_bus:
                out[(i, by_bus[link.remote_pci_bus_id])] += 1
    return dict(out)


def numa_split(sim: SimulatedNvml) -> list[int | None]:
    return [sim.gpu(i).numa_node for i in range(sim.device_count())]


def test_dgx_h100() -> None:
    sim = started("dgx-h100")
    assert sim.device_count() == 8
    gpus = [sim.gpu(i) for i in range(8)]
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g.memory_total_mib for g in gpus} == {81559}
    assert [g.pci_bus_id[9:11] for g in gpus] == ["1B", "43", "52", "61", "9D", "C3", "D1", "DF"]
    assert gpus[0].pci_bus_id == "00000000:1B:00.0"
    assert (gpus[0].compute_capability, gpus[0].architecture, gpus[0].pci_device_id) == (
        (9, 0),
        "hopper",
        0x233010DE,
    )
    assert gpus[0].power_limit_watts == 700
    assert gpus[0].brand == "NVIDIA"
    assert numa_split(sim) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert gpus[0].cpu_affinity == "0-55,112-167"
    assert gpus[7].cpu_affinity == "56-111,168-223"
    links = sim.nvlinks(0)
    assert len(links) == 18
    assert all(link.version == 4 for link in links)
    assert sim.device_get_nvlink_version(0, 0) == 6  # the NVML enum, NVLINK_VERSION_4_0
    assert Counter(link.remote_pci_bus_id for link in links) == {
        "00000000:05:00.0": 5,
        "00000000:06:00.0": 5,
        "00000000:07:00.0": 4,
        "00000000:08:00.0": 4,
    }
    assert {link.remote_type for link in links} == {RemoteDeviceType.SWITCH}
    assert sim.pcie_level(0, 3) is LinkLevel.NODE
    assert sim.pcie_level(0, 4) is LinkLevel.SYS
    mig = sim.mig_state(0)
    assert mig is not None
    assert not mig.current_enabled
    fabric = sim.fabric(0)
    assert fabric is not None
    assert fabric.clique_id == 0
    assert not fabric.multi_node
    assert sim.driver().driver_version == "580.126.20"
    assert sim.driver().cuda_major == 13
    machine = sim.machine
    compute = machine.compute_hcas()
    assert [h.device for h in compute] == [
        "mlx5_0",
        "mlx5_3",
        "mlx5_4",
        "mlx5_5",
        "mlx5_6",
        "mlx5_9",
        "mlx5_10",
        "mlx5_11",
    ]
    assert [h.netdev for h in compute][:2] == ["ibp24s0", "ibp64s0"]
    assert {(h.hca_type, h.ports[0].rate_gbps, h.ports[0].link_layer) for h in compute} == {
        ("MT4129", 400.0, "InfiniBand")
    }
    assert [h.rail for h in compute] == list(range(8))
    assert len(machine.hcas) == 12


def test_hgx_h200() -> None:
    sim = started("hgx-h200")
    gpus = [sim.gpu(i) for i in range(sim.device_count())]
    assert len(gpus) == 8
    assert {g.name for g in gpus} == {"NVIDIA H200"}  # not "H200 141GB HBM3e"
    assert {g.memory_total_mib for g in gpus} == {143771}
    assert gpus[0].pci_device_id == 0x233510DE
    assert gpus[0].power_limit_watts == 700
    assert {len(sim.nvlinks(i)) for i in range(8)} == {18}
    assert numa_split(sim) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(sim.machine.compute_hcas()) == 8
    sim.reconfigure_mig(0, ["3g.71gb", "3g.71gb"])
    mig = sim.mig_state(0)
    assert mig is not None
    assert [d.sm_count for d in mig.devices] == [60, 60]


@pytest.mark.parametrize(("rack", "tray"), [(0, 0), (3, 5), (3, 17)], ids=["r0t0", "r3t5", "r3t17"])
def test_gb200_nvl72(rack: int, tray: int) -> None:
    sim = started(f"gb200-nvl72:rack={rack},tray={tray}")
    assert sim.device_count() == 4
    gpus = [sim.gpu(i) for i in range(4)]
    assert {g.name for g in gpus} == {"NVIDIA GB200"}
    assert {g.memory_total_mib for g in gpus} == {189471}
    assert [g.pci_bus_id for g in gpus] == [
        "00000008:01:00.0",
        "00000009:01:00.0",
        "00000018:01:00.0",
        "00000019:01:00.0",
    ]
    assert gpus[0].architecture == "blackwell"
    assert gpus[0].compute_capability == (10, 0)
    assert gpus[0].power_limit_watts == 1200
    assert numa_split(sim) == [0, 0, 1, 1]
    assert [g.cpu_affinity for g in gpus] == ["0-71", "0-71", "72-143", "72-143"]
    assert {len(sim.nvlinks(i)) for i in range(4)} == {18}
    assert sim.nvlinks(0)[0].version == 5
    fabrics = [sim.fabric(i) for i in range(4)]
    assert all(f is not None and f.multi_node and f.clique_id == 32766 for f in fabrics)
    assert len({f.clique for f in fabrics if f}) == 1
    platform = gpus[2].platform
    assert platform is not None
    assert (platform.tray_index, platform.slot_number, platform.module_id) == (tray, tray + 1, 3)
    assert sim.machine.hostname == f"rack{rack}-tray{tray}"
    assert [h.device for h in sim.machine.compute_hcas()] == ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5"]
    assert [h.pci_address for h in sim.machine.compute_hcas()][1] == "0002:03:00.0"
    assert [h.netdev for h in sim.machine.compute_hcas()] == ["ibp3s0", "ibP2p3s0", "ibP16p3s0", "ibP18p3s0"]


def test_gb200_clique_identity_is_per_rack() -> None:
    def clique(spec: str) -> str:
        fabric = started(spec).fabric(0)
        assert fabric is not None
        return fabric.clique

    same_rack = {clique(f"gb200-nvl72:rack=2,tray={t}") for t in range(18)}
    assert len(same_rack) == 1
    assert clique("gb200-nvl72:rack=2") != clique("gb200-nvl72:rack=3")
    assert clique("gb200-nvl72:rack=2,clique=7").endswith(".7")
    chassis = {started(f"gb200-nvl72:rack={r}").gpu(0).platform for r in (0, 1)}
    assert len({p.chassis_serial for p in chassis if p}) == 2


def test_dgx_a100_mig() -> None:
    sim = started("dgx-a100-mig")
    gpus = [sim.gpu(i) for i in range(sim.device_count())]
    assert len(gpus) == 8
    assert {g.name for g in gpus} == {"NVIDIA A100-SXM4-80GB"}
    assert {g.memory_total_mib for g in gpus} == {81920}
    assert gpus[0].pci_bus_id == "00000000:07:00.0"
    assert gpus[0].pci_device_id == 0x20B210DE
    assert numa_split(sim) == [3, 3, 1, 1, 7, 7, 5, 5]
    assert gpus[0].cpu_affinity == "48-63,176-191"
    assert {len(sim.nvlinks(i)) for i in range(8)} == {12}
    assert Counter(link.remote_pci_bus_id for link in sim.nvlinks(0)) == {
        f"00000000:{b:02X}:00.0": 2 for b in range(0xC4, 0xCA)
    }
    assert sim.nvlinks(0)[0].version == 3
    assert sim.device_get_nvlink_version(0, 0) == 5
    assert sim.pcie_level(0, 1) is LinkLevel.PXB
    assert sim.pcie_level(1, 2) is LinkLevel.SYS
    layouts = []
    for i in range(8):
        state = sim.mig_state(i)
        assert state is not None
        layouts.append(sorted(d.profile for d in state.devices) if state.current_enabled else None)
    assert layouts == [
        ["1g.10gb"] * 7,
        ["1g.10gb", "2g.20gb", "3g.40gb"],
        ["3g.40gb", "3g.40gb"],
        ["1g.10gb", "2g.20gb", "4g.40gb"],
        None,
        None,
        None,
        None,
    ]
    state = sim.mig_state(2)
    assert state is not None
    assert [(g.profile_id, g.placement_start, g.placement_size, g.id) for g in state.gpu_instances] == [
        (9, 4, 4, 1),
        (9, 0, 4, 2),
    ]
    assert [d.memory_bytes // 2**20 for d in state.devices] == [40192, 40192]
    assert sim.fabric(0) is None  # fabric info is Hopper+
    assert sim.driver().cuda_driver_version == 12040
    compute = sim.machine.compute_hcas()
    assert [h.device for h in compute] == [f"mlx5_{n}" for n in (0, 1, 2, 3, 6, 7, 8, 9)]
    assert {(h.hca_type, h.ports[0].rate_gbps) for h in compute} == {("MT4123", 200.0)}
    assert compute[0].pci_address == "0000:0c:00.0"
    assert compute[0].netdev == "ibp12s0"


def test_dgx1_v100_cube_mesh() -> None:
    sim = started("dgx1-v100")
    gpus = [sim.gpu(i) for i in range(sim.device_count())]
    assert len(gpus) == 8
    assert {g.name for g in gpus} == {"Tesla V100-SXM2-32GB"}
    assert {g.memory_total_mib for g in gpus} == {32768}
    assert gpus[0].architecture == "volta"
    assert gpus[0].brand == "TESLA"
    assert {len(sim.nvlinks(i)) for i in range(8)} == {6}
    assert sim.nvlinks(0)[0].version == 2
    pairs = nvlink_pairs(sim)
    for a in range(8):
        for b in range(8):
            assert pairs.get((a, b), 0) == DGX1_NVLINK_COUNTS[a][b], (a, b)
    # the published rows, spelled out
    assert [pairs.get((0, b), 0) for b in range(8)] == [0, 1, 1, 2, 2, 0, 0, 0]
    assert [pairs.get((5, b), 0) for b in range(8)] == [0, 2, 0, 0, 1, 0, 2, 1]
    assert (0, 5) not in pairs
    assert (3, 4) not in pairs
    assert numa_split(sim) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert gpus[4].cpu_affinity == "20-39,60-79"
    assert sim.pcie_level(0, 1) is LinkLevel.PIX
    assert sim.pcie_level(0, 2) is LinkLevel.PHB
    assert sim.pcie_level(3, 4) is LinkLevel.SYS
    assert sim.mig_state(0) is None
    assert sim.fabric(0) is None
    assert [h.device for h in sim.machine.compute_hcas()] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert {h.ports[0].rate_gbps for h in sim.machine.hcas} == {100.0}


def test_pcie_l40s() -> None:
    sim = started("pcie-l40s")
    gpus = [sim.gpu(i) for i in range(sim.device_count())]
    assert len(gpus) == 4
    assert {g.name for g in gpus} == {"NVIDIA L40S"}
    assert {g.memory_total_mib for g in gpus} == {46068}
    assert gpus[0].compute_capability == (8, 9)
    assert gpus[0].architecture == "ada"
    assert gpus[0].power_limit_watts == 350
    assert gpus[0].pci_device_id == 0x26B910DE
    assert all(sim.nvlinks(i) == () for i in range(4))
    assert numa_split(sim) == [0, 0, 1, 1]
    assert [g.cpu_affinity for g in gpus] == ["0-95,192-287"] * 2 + ["96-191,288-383"] * 2
    assert sim.pcie_level(0, 1) is LinkLevel.NODE
    assert sim.pcie_level(2, 3) is LinkLevel.NODE
    assert sim.pcie_level(1, 2) is LinkLevel.SYS
    assert sim.mig_state(0) is None
    assert sim.fabric(0) is None
    hcas = sim.machine.hcas
    assert [(h.device, h.numa_node, h.ports[0].rate_gbps) for h in hcas] == [
        ("mlx5_0", 1, 200.0),
        ("mlx5_1", 1, 200.0),
    ]
    assert hcas[1].sys_image_guid == hcas[0].node_guid  # second function of one dual-port card


def test_every_profile_is_described() -> None:
    assert set(PROFILES) == {"dgx-h100", "hgx-h200", "gb200-nvl72", "dgx-a100-mig", "dgx1-v100", "pcie-l40s"}
    assert all(p.description and "\n" not in p.description for p in PROFILES.values())


def test_uuids_are_deterministic_and_differ_between_nodes() -> None:
    a = build_machine("dgx-h100", {"su": 1, "node": 2})
    b = build_machine("dgx-h100", {"su": 1, "node": 2})
    c = build_machine("dgx-h100", {"su": 1, "node": 3})
    assert a == b
    assert {g.uuid for g in a.gpus}.isdisjoint(g.uuid for g in c.gpus)
    assert all(g.uuid.startswith("GPU-") and len(g.uuid) == 40 for g in a.gpus)
    assert build_machine("dgx-h100", {"hostname": "n1"}).hostname == "n1"


SPECS = st.one_of(
    st.builds(
        lambda p, su, node: (p, {"su": su, "node": node}),
        st.sampled_from(["dgx-h100", "hgx-h200", "dgx-a100-mig", "dgx1-v100", "pcie-l40s"]),
        st.integers(0, 63),
        st.integers(0, 31),
    ),
    st.builds(lambda r, t: ("gb200-nvl72", {"rack": r, "tray": t}), st.integers(0, 63), st.integers(0, 17)),
)


@given(spec=SPECS)
def test_connectivity_is_symmetric(spec: tuple[str, dict[str, int]]) -> None:
    sim = SimulatedNvml(build_machine(*spec))
    sim.init()
    n = sim.device_count()
    for a in range(n):
        assert sim.pcie_level(a, a) is LinkLevel.SELF
        for b in range(n):
            assert sim.pcie_level(a, b) is sim.pcie_level(b, a)
    pairs = nvlink_pairs(sim)
    assert all(pairs.get((b, a)) == count for (a, b), count in pairs.items())
    switch_links = {
        i: Counter(
            link.remote_pci_bus_id for link in sim.nvlinks(i) if link.remote_type is RemoteDeviceType.SWITCH
        )
        for i in range(n)
    }
    assert len({tuple(sorted(c.items())) for c in switch_links.values()}) == 1  # same fan-out per GPU


def test_hca_identities_follow_the_observed_relations_and_are_unique_cluster_wide() -> None:
    machines = [build_machine("dgx-h100", {"su": s, "node": n}) for s in (0, 63) for n in (0, 31)]
    machines += [build_machine("gb200-nvl72", {"rack": r, "tray": t}) for r in (0, 63) for t in (0, 17)]
    node_guids: set[int] = set()
    port_guids: set[int] = set()
    lids: set[int] = set()
    for machine in machines:
        for hca in machine.hcas:
            port = hca.ports[0]
            if port.link_layer == "InfiniBand":
                assert port.port_guid == hca.node_guid  # single-port IB CA
                lids.add(port.lid)
                assert 0 < port.lid < 0xC000  # unicast LID range
            else:  # RoCE: MAC-derived EUI-64
                assert (port.port_guid >> 24) & 0xFFFF == 0xFFFE
                assert port.lid == 0
            node_guids.add(hca.node_guid)
            port_guids.add(port.port_guid)
    count = sum(len(m.hcas) for m in machines)
    assert len(node_guids) == len(port_guids) == count
    assert len(lids) == sum(1 for m in machines for h in m.hcas if h.ports[0].link_layer == "InfiniBand")
