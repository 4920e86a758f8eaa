"""Machine presets of the NVML simulator: the static facts of six real machine types.

Every value here comes from ``reference/hardware.md`` (names, memory in MiB, bus ids, NUMA/CPU lists,
NVLink wiring, MIG profile tables, HCAs); values marked *inferred* there are defaults, not ground truth.
A profile is built from options (``su``/``node`` or ``rack``/``tray``, ``hostname``…) into a frozen
:class:`MachineSpec`; the stateful simulator (``agent.nvml.fake``) and the fake sysfs
(``agent.nvml.sim_sysfs``) both read it. Everything is pure and deterministic: the same options give
the same UUIDs, GUIDs and LIDs on every node, so all nodes of a simulated cluster agree on one
InfiniBand fabric.

Fabric model (rail-optimised): compute HCA *k* of every node of a group cables to that group's rail-*k*
leaf. The group is the scalable unit (``su``, 32 nodes) for 8-GPU servers and the rack for GB200 NVL72
(18 trays). Rail-*k* leaves of a spine group (4 SUs, or 8 GB200 racks) connect to that group's two
rail-*k* spines; when a fabric spans several spine groups, two core switches join every spine.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from topology.model import LinkLevel, NumaNode, PlatformInfo, RemoteDeviceType

_NS = uuid.UUID("5d7a6c1e-2b1f-4f57-9a3c-6a1e0c2b9f10")

# NVML enum values (nvidia-ml-py 13.615.71)
ARCH_VOLTA, ARCH_AMPERE, ARCH_ADA, ARCH_HOPPER, ARCH_BLACKWELL = 5, 7, 8, 9, 10
BRAND_TESLA, BRAND_NVIDIA = 2, 14
NVLINK_VERSION_2_0, NVLINK_VERSION_3_1, NVLINK_VERSION_4_0, NVLINK_VERSION_5_0 = 2, 5, 6, 7
FABRIC_STATE_COMPLETED = 3
HEALTH_SUMMARY_NOT_SUPPORTED, HEALTH_SUMMARY_HEALTHY = 0, 1
HEALTHY_FABRIC_MASK = 0x1AA  # every 2-bit condition FALSE, incorrect-configuration NONE
DEFAULT_CLIQUE_ID = 32766  # the default NVLink partition (inferred from its ubiquity)
ZERO_UUID = "00000000-0000-0000-0000-000000000000"

MIG_MEMORY_SLICES = 8
MIG_COMPUTE_SLICES = 7


# --------------------------------------------------------------------------- static facts


@dataclass(frozen=True, slots=True)
class MigProfileSpec:
    """One GPU-instance profile (a ``nvidia-smi mig -lgip`` row) and its placements (§10.2)."""

    name: str  # "3g.40gb"
    id: int  # the -lgip id (19, 20, 15, 14, 9, 5, 0)
    nvml_enum: int  # NVML_GPU_INSTANCE_PROFILE_* used to query it
    slices: int  # compute slices
    placement_size: int  # memory slices
    starts: tuple[int, ...]  # valid placement starts
    max_instances: int
    memory_mib: int
    sm_count: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int


@dataclass(frozen=True, slots=True)
class NvLinkSpec:
    remote_type: RemoteDeviceType
    remote_pci_bus_id: str  # NVML form
    remote_gpu: int | None = None  # peer GPU index for direct GPU-GPU links


@dataclass(frozen=True, slots=True)
class FabricSpec:
    """What ``nvmlDeviceGetGpuFabricInfoV`` (v3) reports at start."""

    cluster_uuid: str
    clique_id: int
    state: int  # NVML_GPU_FABRIC_STATE_*
    status: int  # NVML return code, meaningful when COMPLETED
    health_mask: int
    health_summary: int  # NVML_GPU_FABRIC_HEALTH_SUMMARY_*


@dataclass(frozen=True, slots=True)
class GpuSpec:
    index: int
    uuid: str
    name: str
    serial: str
    board_id: int
    pci_bus_id: str  # NVML form "00000000:1B:00.0"
    pci_device_id: int  # e.g. 0x233010DE
    minor_number: int
    memory_total_mib: int
    memory_reserved_mib: int
    bar1_mib: int
    compute_capability: tuple[int, int]
    architecture: int  # NVML_DEVICE_ARCH_*
    brand: int  # NVML_BRAND_*
    numa_node: int  # CPU-side NUMA node (nvidia-smi "NUMA Affinity")
    cpu_affinity: str
    power_limit_watts: int
    idle_power_watts: int
    max_sm_clock_mhz: int
    memory_clock_mhz: int
    nvlink_version: int | None  # NVML_NVLINK_VERSION_* enum; None without NVLink
    nvlinks: tuple[NvLinkSpec, ...]
    mig_profiles: tuple[MigProfileSpec, ...]  # empty: not MIG-capable
    mig_layout: tuple[str, ...] | None  # None: MIG disabled; else enabled with these GPU instances
    fabric: FabricSpec | None
    platform: PlatformInfo | None
    module_id: int

    @property
    def bus_id_sysfs(self) -> str:
        return sysfs_bus_id(self.pci_bus_id)


@dataclass(frozen=True, slots=True)
class SwitchSpec:
    """An InfiniBand switch of the simulated fabric."""

    guid: int
    lid: int
    name: str  # "su0-leaf-r3"
    kind: str  # "leaf" | "spine" | "core"
    model: str = "MQM9700"
    nports: int = 65  # external ports + 1, as ibnetdiscover prints
    rail: int = -1  # the rail of a leaf or spine; -1 for core switches

    @property
    def description(self) -> str:
        return f"MF0;{self.name}:{self.model}/U1"


@dataclass(frozen=True, slots=True)
class IbPortSpec:
    port: int
    state: int  # 4 ACTIVE, 1 DOWN, 2 INIT
    phys_state: int  # 5 LinkUp, 3 Disabled, 2 Polling
    width: int  # lanes
    speed: str  # "NDR", "HDR", "EDR"
    link_layer: str  # "InfiniBand" / "Ethernet"
    lid: int
    sm_lid: int
    port_guid: int
    leaf: SwitchSpec | None = None  # the switch this port cables to (IB compute ports)
    leaf_port: int | None = None

    @property
    def rate_gbps(self) -> float:
        return self.width * LANE_GBPS[self.speed]


@dataclass(frozen=True, slots=True)
class HcaSpec:
    device: str  # "mlx5_0"
    pci_address: str  # sysfs form "0000:18:00.0"
    netdev: str
    numa_node: int
    local_cpulist: str
    hca_type: str  # "MT4129"
    pci_device_id: int  # 0x1021
    fw_ver: str
    board_id: str
    node_guid: int
    sys_image_guid: int
    node_desc: str
    ports: tuple[IbPortSpec, ...]
    rail: int | None  # compute rail; None for storage / in-band cards
    near_gpus: tuple[int, ...] = ()  # GPUs sharing the HCA's PCIe switch (PIX/PXB)


@dataclass(frozen=True, slots=True)
class FabricPosition:
    group_kind: str  # "su" or "rack"
    group: int
    slot: int  # node index inside the group (tray for GB200)
    spine_group: int
    group_pos: int  # position of the group inside its spine group


@dataclass(frozen=True, slots=True)
class MachineSpec:
    profile: str
    hostname: str
    driver_version: str
    nvml_version: str
    cuda_driver_version: int
    cpu_count: int
    memory_bytes: int
    numa_nodes: tuple[NumaNode, ...]
    gpus: tuple[GpuSpec, ...]
    pcie: tuple[tuple[LinkLevel, ...], ...]  # GPU x GPU PCIe common-ancestor level, SELF on the diagonal
    hcas: tuple[HcaSpec, ...]
    position: FabricPosition
    system_uuid: str

    def compute_hcas(self) -> tuple[HcaSpec, ...]:
        return tuple(h for h in self.hcas if h.rail is not None)


LANE_GBPS: dict[str, float] = {
    "SDR": 2.5,
    "DDR": 5.0,
    "QDR": 10.0,
    "FDR10": 10.0,
    "FDR": 14.0,
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """``00000008:01:00.0`` → ``0008:01:00.0`` (Linux sysfs form: 4-digit domain, lower case)."""
    domain, rest = nvml_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def nvml_bus_id(sysfs: str) -> str:
    """``0000:1b:00.0`` → ``00000000:1B:00.0``."""
    domain, rest = sysfs.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def det_uuid(*parts: object) -> str:
    """A deterministic UUID for a path of parts."""
    return str(uuid.uuid5(_NS, "/".join(str(p) for p in parts)))


def _det_int(bits: int, *parts: object) -> int:
    return uuid.uuid5(_NS, "/".join(str(p) for p in parts)).int & ((1 << bits) - 1)


def cpu_list(ranges: list[tuple[int, int]]) -> str:
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)


# --------------------------------------------------------------------------- MIG tables (§10.3)


def _mig_table(
    rows: list[tuple[str, int, int, int, int, int, int, int, int]],
) -> tuple[MigProfileSpec, ...]:
    """Rows of (name, id, max, memory MiB, SMs, CE, DEC, JPEG, OFA) → specs with §10.2 placements."""
    shape = {  # id -> (NVML enum, compute slices, placement size, starts)
        19: (0, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        20: (7, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        15: (9, 1, 2, (0, 2, 4, 6)),
        14: (1, 2, 2, (0, 2, 4)),
        9: (2, 3, 4, (0, 4)),
        5: (3, 4, 4, (0,)),
        0: (4, 7, 8, (0,)),
    }
    out = []
    for name, pid, max_n, mem, sms, ce, dec, jpeg, ofa in rows:
        enum_value, slices, size, starts = shape[pid]
        out.append(
            MigProfileSpec(
                name=name,
                id=pid,
                nvml_enum=enum_value,
                slices=slices,
                placement_size=size,
                starts=starts,
                max_instances=max_n,
                memory_mib=mem,
                sm_count=sms,
                copy_engines=ce,
                decoders=dec,
                encoders=0,
                jpegs=jpeg,
                ofas=ofa,
            )
        )
    return tuple(out)


MIG_A100_80GB = _mig_table(
    [
        ("1g.10gb", 19, 7, 9728, 14, 1, 0, 0, 0),
        ("1g.10gb+me", 20, 1, 9728, 14, 1, 1, 1, 1),
        ("1g.20gb", 15, 4, 19968, 14, 1, 1, 0, 0),
        ("2g.20gb", 14, 3, 19968, 28, 2, 1, 0, 0),
        ("3g.40gb", 9, 2, 40192, 42, 3, 2, 0, 0),
        ("4g.40gb", 5, 1, 40192, 56, 4, 2, 0, 0),
        ("7g.80gb", 0, 1, 80896, 98, 7, 5, 1, 1),
    ]
)
MIG_H100_80GB = _mig_table(
    [
        ("1g.10gb", 19, 7, 9984, 16, 1, 1, 1, 0),
        ("1g.10gb+me", 20, 1, 9984, 16, 1, 1, 1, 1),
        ("1g.20gb", 15, 4, 20096, 26, 1, 1, 1, 0),
        ("2g.20gb", 14, 3, 20096, 32, 2, 2, 2, 0),
        ("3g.40gb", 9, 2, 40448, 60, 3, 3, 3, 0),
        ("4g.40gb", 5, 1, 40448, 64, 4, 4, 4, 0),
        ("7g.80gb", 0, 1, 81152, 132, 8, 7, 7, 1),
    ]
)
MIG_H200 = _mig_table(
    [
        ("1g.18gb", 19, 7, 16384, 16, 1, 1, 1, 0),
        ("1g.18gb+me", 20, 1, 16384, 16, 1, 1, 1, 1),
        ("1g.35gb", 15, 4, 33024, 26, 1, 1, 1, 0),
        ("2g.35gb", 14, 3, 33024, 32, 2, 2, 2, 0),
        ("3g.71gb", 9, 2, 71168, 60, 3, 3, 3, 0),
        ("4g.71gb", 5, 1, 71168, 64, 4, 4, 4, 0),
        ("7g.141gb", 0, 1, 143104, 132, 8, 7, 7, 1),
    ]
)
# GB200: 1g/2g rows are reported by production boards; 3g/4g/7g SM and engine counts are inferred
# from B200 (hardware.md §10.3, §17).
MIG_GB200 = _mig_table(
    [
        ("1g.23gb", 19, 7, 22528, 18, 2, 1, 1, 0),
        ("1g.23gb+me", 20, 1, 22528, 18, 2, 1, 1, 1),
        ("1g.47gb", 15, 4, 46592, 32, 2, 1, 1, 0),
        ("2g.47gb", 14, 3, 46592, 38, 4, 2, 2, 0),
        ("3g.93gb", 9, 2, 93184, 70, 6, 3, 3, 0),
        ("4g.93gb", 5, 1, 93184, 72, 8, 4, 4, 0),
        ("7g.186gb", 0, 1, 186112, 148, 14, 7, 7, 1),
    ]
)


# --------------------------------------------------------------------------- options


@dataclass(frozen=True, slots=True)
class OptionSpec:
    name: str
    low: int | None  # None: a string option
    high: int | None
    help: str


_HOSTNAME = OptionSpec("hostname", None, None, "node hostname (default derived from the position)")
_SERVER_OPTIONS = (
    OptionSpec("su", 0, 63, "scalable unit (32 nodes sharing one leaf per rail)"),
    OptionSpec("node", 0, 31, "node index inside its scalable unit"),
    _HOSTNAME,
)
_GB200_OPTIONS = (
    OptionSpec("rack", 0, 63, "NVL72 rack: one NVLink domain (clusterUuid) and one leaf per rail"),
    OptionSpec("tray", 0, 17, "compute tray inside the rack"),
    OptionSpec("node", 0, 17, "alias of tray"),
    OptionSpec("su", 0, 7, "spine group of the rack (default rack // 8)"),
    OptionSpec("clique", 0, 0x7FFF, f"NVLink partition clique id (default {DEFAULT_CLIQUE_ID})"),
    _HOSTNAME,
)

Options = Mapping[str, int | str]


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    description: str
    options: tuple[OptionSpec, ...]
    build: Callable[[Options], MachineSpec]


# --------------------------------------------------------------------------- fabric helpers

_LEAF_OUI = 0x2C5EAB03_00000000  # Quantum-2 switch GUID prefix (as seen in real fabrics)
_CX_OUI = 0xE09D7303_00000000  # ConnectX GUID prefix
SUS_PER_SPINE_GROUP = 4
RACKS_PER_SPINE_GROUP = 8
SPINES_PER_RAIL = 2
CORE_SWITCHES = 2
LEAF_UPLINK_PORT = 33  # leaf ports 1..32 go down to nodes, 33.. up to spines


def leaf_switch(group_kind: str, group: int, rail: int) -> SwitchSpec:
    kind_bit = 1 if group_kind == "su" else 2
    guid = _LEAF_OUI | (kind_bit << 24) | (group << 8) | rail
    base = 1 if group_kind == "su" else 0x401
    return SwitchSpec(
        guid=guid,
        lid=base + group * 16 + rail,
        name=f"{group_kind}{group}-leaf-r{rail}",
        kind="leaf",
        rail=rail,
    )


def spine_switch(group_kind: str, spine_group: int, rail: int, index: int) -> SwitchSpec:
    kind_bit = 3 if group_kind == "su" else 4
    guid = _LEAF_OUI | (kind_bit << 24) | (spine_group << 12) | (rail << 4) | index
    base = 0x801 if group_kind == "su" else 0xA01
    return SwitchSpec(
        guid=guid,
        lid=base + spine_group * 32 + rail * SPINES_PER_RAIL + index,
        name=f"{'sg' if group_kind == 'su' else 'rg'}{spine_group}-spine-r{rail}-{index}",
        kind="spine",
        rail=rail,
    )


def core_switch(index: int) -> SwitchSpec:
    return SwitchSpec(
        guid=_LEAF_OUI | (5 << 24) | index, lid=0xF01 + index, name=f"core-{index}", kind="core"
    )


def _hca_guid(pos: FabricPosition, function: int) -> int:
    kind_bit = 1 if pos.group_kind == "su" else 2
    return _CX_OUI | (kind_bit << 28) | (pos.group << 16) | (pos.slot << 8) | function


def _hca_lid(pos: FabricPosition, function: int) -> int:
    if pos.group_kind == "su":
        return 0x1000 + (pos.group * 32 + pos.slot) * 16 + function
    return 0x9000 + (pos.group * 18 + pos.slot) * 8 + function


SM_LID = 1


def _mac_port_guid(pos: FabricPosition, function: int) -> int:
    """RoCE port GUID: the EUI-64 of the port's MAC (ConnectX OUI with the U/L bit flipped, ``fffe``
    in the middle); the MAC's low 24 bits encode the node's position and the PCI function."""
    kind_bit = 1 if pos.group_kind == "su" else 2
    low = (kind_bit << 20) | (pos.group << 12) | (pos.slot << 4) | function
    oui = (_CX_OUI >> 40) ^ 0x020000
    return (oui << 40) | (0xFFFE << 24) | low


@dataclass(frozen=True, slots=True)
class _Hca:
    """Per-profile HCA row before the fabric position is applied."""

    device: str
    pci: str
    netdev: str
    numa: int
    kind: str  # "cx7", "cx6", "cx4", "bf3"
    link_layer: str
    width: int
    speed: str
    rail: int | None
    near_gpus: tuple[int, ...] = ()


_HCA_MODELS: dict[str, tuple[str, int, str, str]] = {  # kind -> (hca_type, PCI device id, fw, board id)
    "cx7": ("MT4129", 0x1021, "28.39.2048", "MT_0000000838"),
    "cx6": ("MT4123", 0x101B, "20.39.1002", "MT_0000000223"),
    "cx4": ("MT4115", 0x1013, "12.28.2006", "MT_2180110032"),
    "bf3": ("MT41692", 0xA2DC, "32.39.2048", "MT_0000000884"),
}


def _hcas(
    rows: list[_Hca], pos: FabricPosition, hostname: str, numa: tuple[NumaNode, ...]
) -> tuple[HcaSpec, ...]:
    cpus = {n.id: n.cpus for n in numa}
    out = []
    for function, row in enumerate(rows):
        hca_type, dev_id, fw, board = _HCA_MODELS[row.kind]
        guid = _hca_guid(pos, function)
        if row.link_layer == "InfiniBand" and row.rail is not None:
            leaf = leaf_switch(pos.group_kind, pos.group, row.rail)
            port = IbPortSpec(
                port=1,
                state=4,
                phys_state=5,
                width=row.width,
                speed=row.speed,
                link_layer="InfiniBand",
                lid=_hca_lid(pos, function),
                sm_lid=SM_LID,
                port_guid=guid,
                leaf=leaf,
                leaf_port=pos.slot + 1,
            )
        else:  # Ethernet (RoCE) function: MAC-derived port GUID, no LID
            port = IbPortSpec(
                port=1,
                state=4,
                phys_state=5,
                width=row.width,
                speed=row.speed,
                link_layer=row.link_layer,
                lid=0,
                sm_lid=0,
                port_guid=_mac_port_guid(pos, function),
            )
        # the second function of a dual-port card reports the first one's GUID as system image GUID
        sys_image = guid
        if row.pci.endswith(".1"):
            sys_image = _hca_guid(pos, function - 1)
        out.append(
            HcaSpec(
                device=row.device,
                pci_address=row.pci,
                netdev=row.netdev,
                numa_node=row.numa,
                local_cpulist=cpus.get(row.numa, ""),
                hca_type=hca_type,
                pci_device_id=dev_id,
                fw_ver=fw,
                board_id=board,
                node_guid=guid,
                sys_image_guid=sys_image,
                node_desc=f"{hostname} {row.device}",
                ports=(port,),
                rail=row.rail,
                near_gpus=row.near_gpus,
            )
        )
    return tuple(out)


# --------------------------------------------------------------------------- GPU helpers


def _nvswitch_links(count: int, switches: list[str], split: list[int]) -> tuple[NvLinkSpec, ...]:
    links: list[NvLinkSpec] = []
    for pci, n in zip(switches, split, strict=True):
        links += [NvLinkSpec(RemoteDeviceType.SWITCH, pci)] * n
    assert len(links) == count
    return tuple(links)


def _pcie_matrix(n: int, level: Callable[[int, int], LinkLevel]) -> tuple[tuple[LinkLevel, ...], ...]:
    return tuple(
        tuple(LinkLevel.SELF if a == b else level(min(a, b), max(a, b)) for b in range(n)) for a in range(n)
    )


def _serial(hostname: str, index: int) -> str:
    return str(1650000000000 + _det_int(36, hostname, "serial", index) % 10**12)


@dataclass(frozen=True, slots=True)
class _Model:
    name: str
    pci_device_id: int
    memory_mib: int
    reserved_mib: int
    bar1_mib: int
    cc: tuple[int, int]
    arch: int
    brand: int
    power_w: int
    idle_w: int
    sm_clock: int
    mem_clock: int
    nvlink_version: int | None
    mig: tuple[MigProfileSpec, ...]


V100 = _Model(
    "Tesla V100-SXM2-32GB",
    0x1DB510DE,
    32768,
    307,
    32768,
    (7, 0),
    ARCH_VOLTA,
    BRAND_TESLA,
    300,
    42,
    1530,
    877,
    NVLINK_VERSION_2_0,
    (),
)
A100 = _Model(
    "NVIDIA A100-SXM4-80GB",
    0x20B210DE,
    81920,
    529,
    131072,
    (8, 0),
    ARCH_AMPERE,
    BRAND_NVIDIA,
    400,
    62,
    1410,
    1593,
    NVLINK_VERSION_3_1,
    MIG_A100_80GB,
)
H100 = _Model(
    "NVIDIA H100 80GB HBM3",
    0x233010DE,
    81559,
    551,
    131072,
    (9, 0),
    ARCH_HOPPER,
    BRAND_NVIDIA,
    700,
    72,
    1980,
    2619,
    NVLINK_VERSION_4_0,
    MIG_H100_80GB,
)
H200 = _Model(
    "NVIDIA H200",
    0x233510DE,
    143771,
    567,
    262144,
    (9, 0),
    ARCH_HOPPER,
    BRAND_NVIDIA,
    700,
    76,
    1980,
    3201,
    NVLINK_VERSION_4_0,
    MIG_H200,
)
GB200 = _Model(
    "NVIDIA GB200",
    0x294110DE,
    189471,
    1049,
    262144,
    (10, 0),
    ARCH_BLACKWELL,
    BRAND_NVIDIA,
    1200,
    160,
    2062,
    3996,
    NVLINK_VERSION_5_0,
    MIG_GB200,
)
L40S = _Model(
    "NVIDIA L40S",
    0x26B910DE,
    46068,
    595,
    65536,
    (8, 9),
    ARCH_ADA,
    BRAND_NVIDIA,
    350,
    33,
    2520,
    9001,
    None,
    (),
)


def _gpu(
    model: _Model,
    *,
    hostname: str,
    index: int,
    bus: str,
    numa: int,
    cpus: str,
    nvlinks: tuple[NvLinkSpec, ...] = (),
    mig_layout: tuple[str, ...] | None = None,
    fabric: FabricSpec | None = None,
    platform: PlatformInfo | None = None,
    module_id: int = 0,
) -> GpuSpec:
    return GpuSpec(
        index=index,
        uuid="GPU-" + det_uuid(hostname, "gpu", index),
        name=model.name,
        serial=_serial(hostname, index),
        board_id=0x100 * (index + 1),
        pci_bus_id=bus,
        pci_device_id=model.pci_device_id,
        minor_number=index,
        memory_total_mib=model.memory_mib,
        memory_reserved_mib=model.reserved_mib,
        bar1_mib=model.bar1_mib,
        compute_capability=model.cc,
        architecture=model.arch,
        brand=model.brand,
        numa_node=numa,
        cpu_affinity=cpus,
        power_limit_watts=model.power_w,
        idle_power_watts=model.idle_w,
        max_sm_clock_mhz=model.sm_clock,
        memory_clock_mhz=model.mem_clock,
        nvlink_version=model.nvlink_version if nvlinks else None,
        nvlinks=nvlinks,
        mig_profiles=model.mig,
        mig_layout=mig_layout,
        fabric=fabric,
        platform=platform,
        module_id=module_id or index + 1,
    )


def _int(opts: Options, name: str, default: int) -> int:
    value = opts.get(name, default)
    assert isinstance(value, int), name
    return value


def _server_position(opts: Options) -> FabricPosition:
    su = _int(opts, "su", 0)
    return FabricPosition(
        group_kind="su",
        group=su,
        slot=_int(opts, "node", 0),
        spine_group=su // SUS_PER_SPINE_GROUP,
        group_pos=su % SUS_PER_SPINE_GROUP,
    )


def _hostname(opts: Options, default: str) -> str:
    value = opts.get("hostname", default)
    return str(value)


def _system_uuid(hostname: str) -> str:
    return det_uuid(hostname, "system")


_FM_FABRIC = FabricSpec(  # 8-GPU NVSwitch boards with Fabric Manager (hardware.md §9)
    cluster_uuid=ZERO_UUID,
    clique_id=0,
    state=FABRIC_STATE_COMPLETED,
    status=0,
    health_mask=0,
    health_summary=HEALTH_SUMMARY_NOT_SUPPORTED,
)

# --------------------------------------------------------------------------- the profiles


def _hopper_8gpu(opts: Options, profile: str, model: _Model, driver: tuple[str, int]) -> MachineSpec:
    pos = _server_position(opts)
    hostname = _hostname(opts, f"{profile}-su{pos.group}-node{pos.slot}")
    numa = (
        NumaNode(0, "0-55,112-167", 1024 * 2**30),
        NumaNode(1, "56-111,168-223", 1024 * 2**30),
    )
    buses = ["1B", "43", "52", "61", "9D", "C3", "D1", "DF"]
    switches = [f"00000000:{b:02X}:00.0" for b in (5, 6, 7, 8)]
    gpus = tuple(
        _gpu(
            model,
            hostname=hostname,
            index=i,
            bus=f"00000000:{bus}:00.0",
            numa=i // 4,
            cpus=numa[i // 4].cpus,
            nvlinks=_nvswitch_links(18, switches, [5, 5, 4, 4]),
            fabric=_FM_FABRIC,
        )
        for i, bus in enumerate(buses)
    )
    ndr = ("InfiniBand", 4, "NDR")
    rows = [
        _Hca("mlx5_0", "0000:18:00.0", "ibp24s0", 0, "cx7", *ndr, rail=0, near_gpus=(0,)),
        _Hca("mlx5_1", "0000:29:00.0", "enp41s0f0np0", 0, "cx7", "Ethernet", 4, "HDR", rail=None),
        _Hca("mlx5_2", "0000:29:00.1", "enp41s0f1np1", 0, "cx7", "Ethernet", 4, "HDR", rail=None),
        _Hca("mlx5_3", "0000:40:00.0", "ibp64s0", 0, "cx7", *ndr, rail=1, near_gpus=(1,)),
        _Hca("mlx5_4", "0000:4f:00.0", "ibp79s0", 0, "cx7", *ndr, rail=2, near_gpus=(2,)),
        _Hca("mlx5_5", "0000:5e:00.0", "ibp94s0", 0, "cx7", *ndr, rail=3, near_gpus=(3,)),
        _Hca("mlx5_6", "0000:9a:00.0", "ibp154s0", 1, "cx7", *ndr, rail=4, near_gpus=(4,)),
        _Hca("mlx5_7", "0000:aa:00.0", "enp170s0f0np0", 1, "cx7", "Ethernet", 4, "HDR", rail=None),
        _Hca("mlx5_8", "0000:aa:00.1", "enp170s0f1np1", 1, "cx7", "Ethernet", 4, "HDR", rail=None),
        _Hca("mlx5_9", "0000:c0:00.0", "ibp192s0", 1, "cx7", *ndr, rail=5, near_gpus=(5,)),
        _Hca("mlx5_10", "0000:ce:00.0", "ibp206s0", 1, "cx7", *ndr, rail=6, near_gpus=(6,)),
        _Hca("mlx5_11", "0000:dc:00.0", "ibp220s0", 1, "cx7", *ndr, rail=7, near_gpus=(7,)),
    ]
    return MachineSpec(
        profile=profile,
        hostname=hostname,
        driver_version=driver[0],
        nvml_version=f"{driver[1] // 1000}.{driver[0]}",
        cuda_driver_version=driver[1],
        cpu_count=224,
        memory_bytes=2048 * 2**30,
        numa_nodes=numa,
        gpus=gpus,
        pcie=_pcie_matrix(8, lambda a, b: LinkLevel.NODE if a // 4 == b // 4 else LinkLevel.SYS),
        hcas=_hcas(rows, pos, hostname, numa),
        position=pos,
        system_uuid=_system_uuid(hostname),
    )


def build_dgx_h100(opts: Options) -> MachineSpec:
    return _hopper_8gpu(opts, "dgx-h100", H100, ("580.126.20", 13000))


def build_hgx_h200(opts: Options) -> MachineSpec:
    return _hopper_8gpu(opts, "hgx-h200", H200, ("580.65.06", 13000))


def build_gb200_nvl72(opts: Options) -> MachineSpec:
    rack = _int(opts, "rack", 0)
    tray = _int(opts, "tray", _int(opts, "node", 0))
    spine_group = _int(opts, "su", rack // RACKS_PER_SPINE_GROUP)
    clique = _int(opts, "clique", DEFAULT_CLIQUE_ID)
    pos = FabricPosition(
        group_kind="rack",
        group=rack,
        slot=tray,
        spine_group=spine_group,
        group_pos=rack % RACKS_PER_SPINE_GROUP,
    )
    hostname = _hostname(opts, f"rack{rack}-tray{tray}")
    numa = (NumaNode(0, "0-71", 480 * 2**30), NumaNode(1, "72-143", 480 * 2**30))
    cluster_uuid = det_uuid("gb200-nvl72", "rack", rack, "cluster")
    fabric = FabricSpec(
        cluster_uuid=cluster_uuid,
        clique_id=clique,
        state=FABRIC_STATE_COMPLETED,
        status=0,
        health_mask=HEALTHY_FABRIC_MASK,
        health_summary=HEALTH_SUMMARY_HEALTHY,
    )
    chassis = f"1830125{rack:06d}"
    # 18 NVLinks per GPU, one to each of the 18 NVSwitch chips of the rack's 9 switch trays (inferred
    # addressing: switch trays are not PCI devices of this tray)
    switches = [f"{0x100 + rack:08X}:{sw:02X}:00.0" for sw in range(18)]
    buses = ["00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0"]
    gpus = tuple(
        _gpu(
            GB200,
            hostname=hostname,
            index=i,
            bus=bus,
            numa=i // 2,
            cpus=numa[i // 2].cpus,
            nvlinks=_nvswitch_links(18, switches, [1] * 18),
            fabric=fabric,
            platform=PlatformInfo(
                chassis_serial=chassis,
                slot_number=tray + 1,
                tray_index=tray,
                host_id=tray + 1,
                module_id=i + 1,
                peer_type=0,
                ib_guid=f"0x{_hca_guid(pos, 0):016x}",
            ),
            module_id=i + 1,
        )
        for i, bus in enumerate(buses)
    )
    ndr = ("InfiniBand", 4, "NDR")
    eth = ("Ethernet", 4, "NDR")
    rows = [
        _Hca("mlx5_0", "0000:03:00.0", "ibp3s0", 0, "cx7", *ndr, rail=0, near_gpus=()),
        _Hca("mlx5_1", "0002:03:00.0", "ibP2p3s0", 0, "cx7", *ndr, rail=1),
        _Hca("mlx5_2", "0006:03:00.0", "enP6p3s0f0np0", 0, "bf3", *eth, rail=None),
        _Hca("mlx5_3", "0006:03:00.1", "enP6p3s0f1np1", 0, "bf3", *eth, rail=None),
        _Hca("mlx5_4", "0010:03:00.0", "ibP16p3s0", 1, "cx7", *ndr, rail=2),
        _Hca("mlx5_5", "0012:03:00.0", "ibP18p3s0", 1, "cx7", *ndr, rail=3),
        _Hca("mlx5_6", "0016:03:00.0", "enP22p3s0f0np0", 1, "bf3", *eth, rail=None),
        _Hca("mlx5_7", "0016:03:00.1", "enP22p3s0f1np1", 1, "bf3", *eth, rail=None),
    ]
    return MachineSpec(
        profile="gb200-nvl72",
        hostname=hostname,
        driver_version="580.126.09",
        nvml_version="13.580.126.09",
        cuda_driver_version=13000,
        cpu_count=144,
        memory_bytes=960 * 2**30,
        numa_nodes=numa,
        gpus=gpus,
        pcie=_pcie_matrix(4, lambda a, b: LinkLevel.NODE if a // 2 == b // 2 else LinkLevel.SYS),
        hcas=_hcas(rows, pos, hostname, numa),
        position=pos,
        system_uuid=_system_uuid(hostname),
    )


# Mixed MIG layout of the dgx-a100-mig preset (every entry is a valid placement set, §10.2).
A100_MIG_LAYOUT: dict[int, tuple[str, ...]] = {
    0: ("1g.10gb",) * 7,
    1: ("3g.40gb", "2g.20gb", "1g.10gb"),
    2: ("3g.40gb", "3g.40gb"),
    3: ("4g.40gb", "2g.20gb", "1g.10gb"),
}


def build_dgx_a100_mig(opts: Options) -> MachineSpec:
    pos = _server_position(opts)
    hostname = _hostname(opts, f"dgx-a100-su{pos.group}-node{pos.slot}")
    # 2x 64-core EPYC with SMT in NPS4: NUMA n owns cores 16n..16n+15 and their SMT siblings
    numa = tuple(
        NumaNode(n, cpu_list([(16 * n, 16 * n + 15), (128 + 16 * n, 128 + 16 * n + 15)]), 256 * 2**30)
        for n in range(8)
    )
    gpu_numa = [3, 3, 1, 1, 7, 7, 5, 5]
    buses = ["07", "0F", "47", "4E", "87", "90", "B7", "BD"]
    switches = [f"00000000:{b:02X}:00.0" for b in range(0xC4, 0xCA)]
    gpus = tuple(
        _gpu(
            A100,
            hostname=hostname,
            index=i,
            bus=f"00000000:{bus}:00.0",
            numa=gpu_numa[i],
            cpus=numa[gpu_numa[i]].cpus,
            nvlinks=_nvswitch_links(12, switches, [2] * 6),
            mig_layout=A100_MIG_LAYOUT.get(i),
        )
        for i, bus in enumerate(buses)
    )
    hdr = ("InfiniBand", 4, "HDR")
    rows = [
        _Hca("mlx5_0", "0000:0c:00.0", "ibp12s0", 3, "cx6", *hdr, rail=0, near_gpus=(0, 1)),
        _Hca("mlx5_1", "0000:12:00.0", "ibp18s0", 3, "cx6", *hdr, rail=1, near_gpus=(0, 1)),
        _Hca("mlx5_2", "0000:4b:00.0", "ibp75s0", 1, "cx6", *hdr, rail=2, near_gpus=(2, 3)),
        _Hca("mlx5_3", "0000:54:00.0", "ibp84s0", 1, "cx6", *hdr, rail=3, near_gpus=(2, 3)),
        _Hca("mlx5_4", "0000:e1:00.0", "enp225s0f0np0", 6, "cx6", "Ethernet", 4, "HDR", rail=None),
        _Hca("mlx5_5", "0000:e1:00.1", "enp225s0f1np1", 6, "cx6", "Ethernet", 2, "HDR", rail=None),
        _Hca("mlx5_6", "0000:8d:00.0", "ibp141s0", 7, "cx6", *hdr, rail=4, near_gpus=(4, 5)),
        _Hca("mlx5_7", "0000:94:00.0", "ibp148s0", 7, "cx6", *hdr, rail=5, near_gpus=(4, 5)),
        _Hca("mlx5_8", "0000:ba:00.0", "ibp186s0", 5, "cx6", *hdr, rail=6, near_gpus=(6, 7)),
        _Hca("mlx5_9", "0000:cc:00.0", "ibp204s0", 5, "cx6", *hdr, rail=7, near_gpus=(6, 7)),
        _Hca("mlx5_10", "0000:61:00.0", "enp97s0f0np0", 2, "cx6", "Ethernet", 4, "HDR", rail=None),
        _Hca("mlx5_11", "0000:61:00.1", "enp97s0f1np1", 2, "cx6", "Ethernet", 4, "HDR", rail=None),
    ]
    return MachineSpec(
        profile="dgx-a100-mig",
        hostname=hostname,
        driver_version="550.54.15",
        nvml_version="12.550.54.15",
        cuda_driver_version=12040,
        cpu_count=256,
        memory_bytes=2048 * 2**30,
        numa_nodes=numa,
        gpus=gpus,
        pcie=_pcie_matrix(8, lambda a, b: LinkLevel.PXB if a // 2 == b // 2 else LinkLevel.SYS),
        hcas=_hcas(rows, pos, hostname, numa),
        position=pos,
        system_uuid=_system_uuid(hostname),
    )


# DGX-1 hybrid cube-mesh: NVLinks per GPU pair (hardware.md §2), rows GPU0..7
DGX1_NVLINK_COUNTS: tuple[tuple[int, ...], ...] = (
    (0, 1, 1, 2, 2, 0, 0, 0),
    (1, 0, 2, 1, 0, 2, 0, 0),
    (1, 2, 0, 2, 0, 0, 1, 0),
    (2, 1, 2, 0, 0, 0, 0, 1),
    (2, 0, 0, 0, 0, 1, 1, 2),
    (0, 2, 0, 0, 1, 0, 2, 1),
    (0, 0, 1, 0, 1, 2, 0, 2),
    (0, 0, 0, 1, 2, 1, 2, 0),
)


def _dgx1_pcie(a: int, b: int) -> LinkLevel:
    if a // 4 != b // 4:
        return LinkLevel.SYS
    return LinkLevel.PIX if a // 2 == b // 2 else LinkLevel.PHB


def build_dgx1_v100(opts: Options) -> MachineSpec:
    pos = _server_position(opts)
    hostname = _hostname(opts, f"dgx1-su{pos.group}-node{pos.slot}")
    numa = (NumaNode(0, "0-19,40-59", 256 * 2**30), NumaNode(1, "20-39,60-79", 256 * 2**30))
    buses = ["06", "07", "0A", "0B", "85", "86", "89", "8A"]
    bus_ids = [f"00000000:{b}:00.0" for b in buses]
    gpus = []
    for i in range(8):
        links: list[NvLinkSpec] = []
        for peer, count in enumerate(DGX1_NVLINK_COUNTS[i]):
            links += [NvLinkSpec(RemoteDeviceType.GPU, bus_ids[peer], peer)] * count
        gpus.append(
            _gpu(
                V100,
                hostname=hostname,
                index=i,
                bus=bus_ids[i],
                numa=i // 4,
                cpus=numa[i // 4].cpus,
                nvlinks=tuple(links),
            )
        )
    edr = ("InfiniBand", 4, "EDR")
    rows = [
        _Hca("mlx5_0", "0000:05:00.0", "ib0", 0, "cx4", *edr, rail=0, near_gpus=(0, 1)),
        _Hca("mlx5_1", "0000:0c:00.0", "ib1", 0, "cx4", *edr, rail=1, near_gpus=(2, 3)),
        _Hca("mlx5_2", "0000:84:00.0", "ib2", 1, "cx4", *edr, rail=2, near_gpus=(4, 5)),
        _Hca("mlx5_3", "0000:8b:00.0", "ib3", 1, "cx4", *edr, rail=3, near_gpus=(6, 7)),
    ]
    return MachineSpec(
        profile="dgx1-v100",
        hostname=hostname,
        driver_version="580.173.02",
        nvml_version="13.580.173.02",
        cuda_driver_version=13000,
        cpu_count=80,
        memory_bytes=512 * 2**30,
        numa_nodes=numa,
        gpus=tuple(gpus),
        pcie=_pcie_matrix(8, _dgx1_pcie),
        hcas=_hcas(rows, pos, hostname, numa),
        position=pos,
        system_uuid=_system_uuid(hostname),
    )


def build_pcie_l40s(opts: Options) -> MachineSpec:
    pos = _server_position(opts)
    hostname = _hostname(opts, f"l40s-su{pos.group}-node{pos.slot}")
    numa = (NumaNode(0, "0-95,192-287", 768 * 2**30), NumaNode(1, "96-191,288-383", 768 * 2**30))
    buses = ["38", "4A", "B8", "CA"]
    gpus = tuple(
        _gpu(L40S, hostname=hostname, index=i, bus=f"00000000:{b}:00.0", numa=i // 2, cpus=numa[i // 2].cpus)
        for i, b in enumerate(buses)
    )
    ndr200 = ("InfiniBand", 2, "NDR")
    rows = [
        _Hca("mlx5_0", "0000:d1:00.0", "ibp209s0f0", 1, "cx7", *ndr200, rail=0),
        _Hca("mlx5_1", "0000:d1:00.1", "ibp209s0f1", 1, "cx7", *ndr200, rail=1),
    ]
    return MachineSpec(
        profile="pcie-l40s",
        hostname=hostname,
        driver_version="570.86.15",
        nvml_version="12.570.86.15",
        cuda_driver_version=12080,
        cpu_count=384,
        memory_bytes=1536 * 2**30,
        numa_nodes=numa,
        gpus=gpus,
        pcie=_pcie_matrix(4, lambda a, b: LinkLevel.NODE if a // 2 == b // 2 else LinkLevel.SYS),
        hcas=_hcas(rows, pos, hostname, numa),
        position=pos,
        system_uuid=_system_uuid(hostname),
    )


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "dgx-h100",
            "8x H100 SXM 80GB, 4 NVSwitches (NV18), 2 NUMA, 8x CX-7 NDR",
            _SERVER_OPTIONS,
            build_dgx_h100,
        ),
        Profile(
            "hgx-h200", "8x H200 141GB, NVSwitch (NV18), 2 NUMA, 8x CX-7 NDR", _SERVER_OPTIONS, build_hgx_h200
        ),
        Profile(
            "gb200-nvl72",
            "one GB200 NVL72 compute tray: 4 GPUs on the rack's multi-node NVLink fabric",
            _GB200_OPTIONS,
            build_gb200_nvl72,
        ),
        Profile(
            "dgx-a100-mig",
            "8x A100 80GB, 6 NVSwitches (NV12), mixed MIG layout on GPUs 0-3, 4-7 full",
            _SERVER_OPTIONS,
            build_dgx_a100_mig,
        ),
        Profile(
            "dgx1-v100",
            "8x V100 32GB in the hybrid cube-mesh (NVLink between some pairs)",
            _SERVER_OPTIONS,
            build_dgx1_v100,
        ),
        Profile("pcie-l40s", "4x L40S on PCIe, no NVLink, 2 NUMA nodes", _SERVER_OPTIONS, build_pcie_l40s),
    )
}


def build_machine(profile: str, options: Options | None = None) -> MachineSpec:
    """The machine of a profile with already-validated options (see ``agent.nvml.simulate``)."""
    return PROFILES[profile].build(options or {})
