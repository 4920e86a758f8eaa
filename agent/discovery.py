"""Discovery: one node's GPUs, MIG, NVLink, fabric, InfiniBand and MPS as a ``NodeInventory``.

:func:`discover` asks an already-initialised :class:`~agent.nvml.protocol.NvmlBackend` (real or simulated)
and reads InfiniBand from a sysfs root; host facts are given. Everything else is pure:
:func:`resolve_nvlinks` and :func:`connectivity_matrix` are functions of plain data.

Failures are contained where they happen:
- a GPU whose identity query fails is kept as a placeholder (``lost=True`` for GPU_IS_LOST and its
  kin, ``error`` naming the call and the NVML error) and the other GPUs are discovered normally;
- a later per-GPU query (links, MIG, fabric) that fails marks that GPU's ``error`` (and ``lost`` for the
  lost codes) and keeps what was already known;
- node-level problems (driver query, device count, IB and MPS files) go to ``NodeInventory.errors``.

An NVML error is not an answer: an inventory built around one (a device count that failed reads as no
GPUs, an identity query that failed leaves a GPU without a UUID, a failed MIG query hides its MIG
devices) says nothing about which devices are gone. ``discover(strict=True)``, what the running agent
uses, raises :class:`DiscoveryIncompleteError` instead of returning such an inventory, so rediscovery keeps
the last good one. A lost GPU (GPU_IS_LOST and its kin) is an answer, and so is "not supported".

The matrix follows ``nvidia-smi topo -m``: ``NV<n>`` where a pair shares NVLinks — *n* direct active
links between them, plus, when both GPUs have active links to NVSwitches, the smaller of the two GPUs'
switch-link counts (``NV18`` on DGX H100, ``NV12`` on DGX A100) — otherwise the PCIe level NVML reports
for the pair. Where NVML cannot say (not supported), same NUMA node is ``NODE`` and different is ``SYS``.
Lost and unidentified GPUs are left out of the matrix (nothing can be said about their links).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from agent.ib import read_ib
from agent.mps import DEFAULT_PIPE_DIRECTORY, detect_mps
from agent.nvml.errors import CODES, LOST_CODES, NVMLError
from agent.nvml.protocol import NvmlBackend
from topology.model import (
    ConnectivityMatrix,
    Driver,
    FabricInfo,
    Gpu,
    Host,
    LinkLevel,
    MigState,
    MpsInfo,
    NodeInventory,
    NvLink,
    RemoteDeviceType,
)

T = TypeVar("T")

_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def normalize_bus_id(bus_id: str) -> str:
    """Any PCI address form (``00000000:1B:00.0``, ``0000:1b:00.0``, ``1b:00.0``) → ``0000:1b:00.0``.

    Unparseable text is returned lower-cased and stripped, so comparison still works on equal strings.
    """
    match = _BUS_ID.match(bus_id.strip())
    if not match:
        return bus_id.strip().lower()
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def _placeholder(index: int, error: str, *, lost: bool) -> Gpu:
    return Gpu(
        index=index,
        uuid="",
        name="",
        serial=None,
        pci_bus_id="",
        minor_number=None,
        memory_total_bytes=0,
        compute_capability=(0, 0),
        architecture="unknown",
        numa_node=None,
        cpu_affinity=None,
        persistence_mode=None,
        compute_mode=None,
        lost=lost,
        error=error,
    )


def usable(gpu: Gpu) -> bool:
    """Identified (has a UUID) and not lost: only such GPUs get links, MIG, fabric and a matrix row."""
    return bool(gpu.uuid) and not gpu.lost


def _describe(call: str, exc: NVMLError) -> str:
    return f"{call}: {exc} (NVML {exc.name})"


ANSWER_CODES = LOST_CODES | {CODES["NOT_SUPPORTED"]}
"""NVML error codes that answer the question (the GPU is gone; the hardware cannot say); every other
code means NVML did not answer."""


class DiscoveryIncompleteError(RuntimeError):
    """NVML failed a query during a strict discovery; ``failures`` names each failed query and error,
    ``inventory`` is what could be seen anyway (for a first start that has nothing better)."""

    def __init__(self, failures: Sequence[str], inventory: NodeInventory) -> None:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        super().__init__(f"NVML did not answer: {failures[0]}{more}")
        self.failures = tuple(failures)
        self.inventory = inventory


def resolve_nvlinks(gpus: Sequence[Gpu], links: Sequence[NvLink]) -> tuple[NvLink, ...]:
    """Fill ``remote_gpu_index`` for links whose remote PCI address is one of ``gpus``.

    A remote reported as a GPU but at an address of no known GPU keeps ``remote_gpu_index=None``.
    """
    by_bus = {normalize_bus_id(g.pci_bus_id): g.index for g in gpus if g.pci_bus_id and not g.lost}
    out: list[NvLink] = []
    for link in links:
        remote = None
        if link.remote_pci_bus_id and link.remote_type in (RemoteDeviceType.GPU, None):
            remote = by_bus.get(normalize_bus_id(link.remote_pci_bus_id))
        out.append(dataclasses.replace(link, remote_gpu_index=remote) if remote is not None else link)
    return tuple(out)


def nvlink_counts(indices: Sequence[int], links: Sequence[NvLink]) -> dict[tuple[int, int], int]:
    """Active NVLinks per unordered GPU pair ``(a, b)`` with ``a < b`` (pairs without links absent).

    Direct links count as the smaller of the two sides' counts (a link one side reports down is down);
    NVSwitch links add ``min(switch links of a, switch links of b)`` for every pair.
    """
    direct: dict[tuple[int, int], int] = {}
    switch: dict[int, int] = dict.fromkeys(indices, 0)
    for link in links:
        if not link.active or link.gpu_index not in switch:
            continue
        if link.remote_type is RemoteDeviceType.SWITCH:
            switch[link.gpu_index] += 1
        elif link.remote_gpu_index is not None and link.remote_gpu_index in switch:
            key = (link.gpu_index, link.remote_gpu_index)
            direct[key] = direct.get(key, 0) + 1
    out: dict[tuple[int, int], int] = {}
    ordered = sorted(indices)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            n = min(direct.get((a, b), 0), direct.get((b, a), 0)) + min(switch[a], switch[b])
            if n:
                out[(a, b)] = n
    return out


def connectivity_matrix(
    gpus: Sequence[Gpu],
    links: Sequence[NvLink],
    pcie: Mapping[tuple[int, int], LinkLevel | None],
) -> ConnectivityMatrix:
    """The ``topo -m`` matrix over the usable GPUs (identified, not lost), by index.

    ``pcie`` maps ``(a, b)`` with ``a < b`` to NVML's PCIe level; a missing or ``None`` entry falls back
    to the GPUs' NUMA nodes (same node → ``NODE``, else ``SYS``).
    """
    present = sorted((g for g in gpus if usable(g)), key=lambda g: g.index)
    indices = [g.index for g in present]
    numa = {g.index: g.numa_node for g in present}
    counts = nvlink_counts(indices, links)
    rows: list[tuple[str, ...]] = []
    for a in indices:
        row: list[str] = []
        for b in indices:
            if a == b:
                row.append(LinkLevel.SELF.value)
                continue
            key = (min(a, b), max(a, b))
            n = counts.get(key, 0)
            if n:
                row.append(f"NV{n}")
                continue
            level = pcie.get(key)
            if level is None or level in (LinkLevel.SELF, LinkLevel.NVLINK):
                same = numa[a] is not None and numa[a] == numa[b]
                level = LinkLevel.NODE if same else LinkLevel.SYS
            row.append(level.value)
        rows.append(tuple(row))
    return ConnectivityMatrix(gpu_indices=tuple(indices), cells=tuple(rows))


class _GpuProblems:
    """Per-GPU errors collected while discovering; applied to the ``Gpu`` records at the end."""

    def __init__(self) -> None:
        self.errors: dict[int, list[str]] = {}
        self.lost: set[int] = set()
        self.unanswered: list[str] = []  # NVML errors that are no answer, node-level ones too

    def record(self, index: int, call: str, exc: NVMLError) -> None:
        self.errors.setdefault(index, []).append(_describe(call, exc))
        self.failed(f"GPU {index} {call}", exc)
        if exc.value in LOST_CODES:
            self.lost.add(index)

    def failed(self, call: str, exc: NVMLError) -> None:
        if exc.value not in ANSWER_CODES:
            self.unanswered.append(_describe(call, exc))

    def apply(self, gpu: Gpu) -> Gpu:
        problems = self.errors.get(gpu.index)
        if not problems:
            return gpu
        text = "; ".join(([gpu.error] if gpu.error else []) + problems)
        return dataclasses.replace(gpu, error=text, lost=gpu.lost or gpu.index in self.lost)


def _per_gpu(problems: _GpuProblems, index: int, call: str, fn: Callable[[int], T], default: T) -> T:
    if index in problems.lost:
        return default
    try:
        return fn(index)
    except NVMLError as exc:
        problems.record(index, call, exc)
        return default


def discover(
    *,
    nvml: NvmlBackend,
    sysfs_root: Path,
    host: Host,
    mps_root: Path | None = None,
    mps_pipe_directory: str = DEFAULT_PIPE_DIRECTORY,
    strict: bool = False,
) -> NodeInventory:
    """The node's inventory through ``nvml`` (initialised by the caller) and ``sysfs_root``.

    ``mps_root`` is the filesystem root under which the MPS pipe directory and ``proc`` are looked up;
    ``None`` skips MPS detection (``NodeInventory.mps`` stays ``None``). With ``strict``, an NVML error
    that is no answer raises :class:`DiscoveryIncompleteError` (see the module doc) once the rest is read.
    """
    errors: list[str] = []
    problems = _GpuProblems()
    driver: Driver | None = None
    try:
        driver = nvml.driver()
    except NVMLError as exc:
        errors.append(_describe("driver version", exc))
        problems.failed("driver version", exc)
    try:
        count = nvml.device_count()
    except NVMLError as exc:
        errors.append(_describe("device count", exc))
        problems.failed("device count", exc)
        count = 0

    gpus: list[Gpu] = []
    for index in range(count):
        try:
            gpus.append(nvml.gpu(index))
        except NVMLError as exc:
            problems.failed(f"GPU {index} identity", exc)
            lost = exc.value in LOST_CODES
            gpus.append(_placeholder(index, _describe("identity", exc), lost=lost))
            if lost:
                problems.lost.add(index)
    live = [g.index for g in gpus if usable(g)]

    raw_links: list[NvLink] = []
    mig: list[MigState] = []
    fabric: list[FabricInfo] = []
    for index in live:
        raw_links.extend(_per_gpu(problems, index, "nvlinks", nvml.nvlinks, ()))
        state = _per_gpu(problems, index, "MIG state", nvml.mig_state, None)
        if state is not None:
            mig.append(state)
        info = _per_gpu(problems, index, "fabric info", nvml.fabric, None)
        if info is not None:
            fabric.append(info)

    pcie: dict[tuple[int, int], LinkLevel | None] = {}
    for pos, a in enumerate(live):
        for b in live[pos + 1 :]:
            if a in problems.lost or b in problems.lost:
                continue
            try:
                pcie[(a, b)] = nvml.pcie_level(a, b)
            except NVMLError as exc:
                errors.append(_describe(f"PCIe level of GPU {a} and GPU {b}", exc))
                problems.failed(f"PCIe level of GPU {a} and GPU {b}", exc)

    final_gpus = tuple(problems.apply(g) for g in gpus)
    links = resolve_nvlinks(final_gpus, [lk for lk in raw_links if lk.gpu_index not in problems.lost])
    matrix = connectivity_matrix(final_gpus, links, pcie) if count else None

    ib = read_ib(sysfs_root)
    errors.extend(ib.errors)
    mps: MpsInfo | None = None
    if mps_root is not None:
        scan = detect_mps(
            root=mps_root, gpus=[g for g in final_gpus if usable(g)], pipe_directory=mps_pipe_directory
        )
        mps = scan.info
        errors.extend(scan.errors)

    inventory = NodeInventory(
        host=host,
        driver=driver,
        gpus=final_gpus,
        mig=tuple(s for s in mig if s.gpu_index not in problems.lost),
        mps=mps,
        nvlinks=links,
        matrix=matrix,
        fabric=tuple(f for f in fabric if f.gpu_index not in problems.lost),
        ib=ib.ports,
        errors=tuple(errors),
    )
    if strict and problems.unanswered:
        raise DiscoveryIncompleteError(problems.unanswered, inventory)
    return inventory
