"""``gpu-node-agent discover``: discover this node (or a simulated one) and print the inventory.

Composition root: builds the NVML backend (real, or the simulator with ``--simulate``), the host facts
and the sysfs root once, runs :func:`agent.discovery.discover` and renders the result with one of
:data:`OUTPUTS` (a table, or ``NodeInventory.to_dict()`` as JSON / YAML). New output formats are one entry
in that table: a name mapped to a function ``(NodeInventory, Options) -> str``.

Exit codes: 0 inventory printed (problems found on the way are listed in it); 1 no NVIDIA driver / NVML
(one line on stderr that names what is missing and suggests ``--simulate``); 2 bad usage (one line).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from agent.discovery import discover
from agent.imex import ImexStatus, NoImexDaemon
from agent.imexctl import ImexCtlReader, ImexReader
from agent.mps import DEFAULT_PIPE_DIRECTORY
from agent.nvml.errors import NVMLError
from agent.nvml.protocol import NvmlBackend
from topology import logs
from topology.model import FabricHealthSummary, FabricInfo, FabricState, Host, MigState, NodeInventory

PROG = "gpu-node-agent discover"


@dataclass(frozen=True, slots=True)
class Options:
    simulate: str | None
    simulate_faults: Path | None
    sysfs_root: Path | None
    output: str
    node_name: str | None
    mps_pipe_directory: str
    log_format: str
    log_level: str
    imex: ImexStatus | None = None  # the IMEX daemon as discovery read it (set by main for the renderers)


# --------------------------------------------------------------------------- rendering


def _gib(n: int) -> str:
    return f"{n / 2**30:.0f} GiB"


def _mib(n: int) -> str:
    return f"{n // 2**20} MiB"


def _grid(rows: list[list[str]], *, gap: int = 2) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [(" " * gap).join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _mig_summary(state: MigState | None) -> str:
    if state is None:
        return "-"
    if not state.current_enabled:
        return "enabled on reset" if state.pending_enabled else "disabled"
    if not state.devices:
        return "enabled, no devices"
    counts: dict[str, int] = {}
    for device in sorted(state.devices, key=lambda d: (-d.gpu_slices, d.profile)):
        counts[device.profile] = counts.get(device.profile, 0) + 1
    return "+".join(f"{n}x{p}" if n > 1 else p for p, n in counts.items())


def _fabric_summary(info: FabricInfo | None) -> str:
    if info is None:
        return "-"
    if info.state is not FabricState.COMPLETED:
        return info.state.value.lower().replace("_", " ")
    parts = [info.clique if info.multi_node else "no clique"]
    if info.status != "SUCCESS":
        parts.append(info.status)
    if info.health_summary is not FabricHealthSummary.NOT_SUPPORTED:
        parts.append(info.health_summary.value)
    return " ".join(parts)


def render_table(inv: NodeInventory, opts: Options | None = None) -> str:
    """Summary, GPUs, the ``topo -m``-style matrix, MIG devices, InfiniBand, MPS and problems."""
    out: list[str] = []
    host = inv.host
    out.append(
        f"Host    {host.name}  ({host.cpu_count} CPUs, {_gib(host.memory_bytes)} memory, "
        f"{len(host.numa_nodes)} NUMA nodes)"
    )
    if inv.driver is not None:
        d = inv.driver
        out.append(f"Driver  {d.driver_version}  CUDA {d.cuda_major}.{d.cuda_minor}  NVML {d.nvml_version}")
    else:
        out.append("Driver  unknown")
    out.append("")

    mig = {s.gpu_index: s for s in inv.mig}
    fabric = {f.gpu_index: f for f in inv.fabric}
    rows = [["GPU", "Name", "Memory", "Bus ID", "NUMA", "MIG", "Fabric"]]
    for gpu in inv.gpus:
        if gpu.lost or (gpu.error and not gpu.uuid):
            state = "LOST" if gpu.lost else "ERROR"
            rows.append([str(gpu.index), state, "-", "-", "-", "-", "-"])
            continue
        rows.append(
            [
                str(gpu.index),
                gpu.name + (" (error)" if gpu.error else ""),
                _mib(gpu.memory_total_bytes),
                gpu.pci_bus_id,
                "N/A" if gpu.numa_node is None else str(gpu.numa_node),
                _mig_summary(mig.get(gpu.index)),
                _fabric_summary(fabric.get(gpu.index)),
            ]
        )
    if len(rows) > 1:
        out.extend(_grid(rows))
    else:
        out.append("No GPUs.")

    if inv.matrix is not None and inv.matrix.gpu_indices:
        out.append("")
        out.extend(_matrix_lines(inv))

    devices = inv.mig_devices()
    if devices:
        out.append("")
        rows = [["MIG device", "GPU", "GI", "CI", "Profile", "Memory", "UUID"]]
        for dev in devices:
            rows.append(
                [
                    str(dev.index),
                    str(dev.parent_index),
                    str(dev.gpu_instance_id),
                    str(dev.compute_instance_id),
                    dev.profile,
                    _mib(dev.memory_bytes),
                    dev.uuid,
                ]
            )
        out.extend(_grid(rows))

    if inv.ib:
        out.append("")
        rows = [["IB device", "Port", "State", "Rate", "Link layer", "NUMA", "PCI", "Node GUID"]]
        for p in inv.ib:
            rows.append(
                [
                    p.device,
                    str(p.port),
                    f"{p.state}/{p.physical_state}",
                    f"{p.rate_gbps:g} Gb/s",
                    p.link_layer,
                    "N/A" if p.numa_node is None else str(p.numa_node),
                    p.pci_address or "-",
                    p.node_guid,
                ]
            )
        out.extend(_grid(rows))

    if inv.mps is not None:
        out.append("")
        if inv.mps.daemon_running:
            limits = ", ".join(
                f"{g.gpu_uuid}: {g.active_thread_percentage or '-'}% threads, "
                f"{_mib(g.pinned_memory_limit_bytes) if g.pinned_memory_limit_bytes else 'no'} pinned limit"
                for g in inv.mps.gpus
            )
            out.append(f"MPS     running (pipe {inv.mps.pipe_directory})" + (f"; {limits}" if limits else ""))
        else:
            out.append("MPS     not running")

    imex = opts.imex if opts is not None else None
    if imex is not None:
        out.append("")
        peers = f", {len(imex.peers)} peers" if imex.peers else ""
        reason = f"; {imex.reason}" if imex.reason else ""
        out.append(f"IMEX    {imex.status.value} ({imex.label}{peers}){reason}")

    failed = [g for g in inv.gpus if g.error]
    if inv.errors or failed:
        out.append("")
        out.append("Problems")
        out.extend(f"  GPU {g.index}: {g.error}" for g in failed)
        out.extend(f"  {e}" for e in inv.errors)
    return "\n".join(out) + "\n"


def _matrix_lines(inv: NodeInventory) -> list[str]:
    assert inv.matrix is not None
    by_index = {g.index: g for g in inv.gpus}
    names = [f"GPU{i}" for i in inv.matrix.gpu_indices]
    rows = [["", *names, "CPU Affinity", "NUMA Affinity"]]
    for i, cells in zip(inv.matrix.gpu_indices, inv.matrix.cells, strict=True):
        gpu = by_index[i]
        rows.append(
            [
                f"GPU{i}",
                *(f" {c}" if c == "X" else c for c in cells),
                gpu.cpu_affinity or "N/A",
                "N/A" if gpu.numa_node is None else str(gpu.numa_node),
            ]
        )
    lines = _grid(rows)
    legend = "Legend: X self, NV# # bonded NVLinks, PIX one PCIe bridge, PXB several bridges, "
    legend += "PHB host bridge, NODE within a NUMA node, SYS across sockets"
    return [*lines, "", legend]


def _with_imex(inv: NodeInventory, imex: ImexStatus | None) -> dict[str, object]:
    """The inventory's schema, and the IMEX daemon's status under ``imex`` where it was read
    (``NodeInventory.from_dict`` reads the inventory and leaves ``imex`` aside)."""
    out = inv.to_dict()
    if imex is not None:
        out["imex"] = imex.to_dict()
    return out


def render_json(inv: NodeInventory, opts: Options | None = None) -> str:
    return json.dumps(_with_imex(inv, opts.imex if opts is not None else None), indent=2) + "\n"


def render_yaml(inv: NodeInventory, opts: Options | None = None) -> str:
    import yaml  # noqa: PLC0415 - only this output needs it

    data = _with_imex(inv, opts.imex if opts is not None else None)
    text: str = yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    return text


def render_gpunode(inv: NodeInventory, opts: Options | None = None, *, imex: ImexStatus | None = None) -> str:
    """The node's ``GPUNode`` object (``topology.gpunode``) as YAML, named ``--node-name`` or the host."""
    import yaml  # noqa: PLC0415 - only this output needs it

    from topology.gpunode import gpunode_object  # noqa: PLC0415

    name = (opts.node_name if opts is not None else None) or inv.host.name
    imex = opts.imex if opts is not None else None
    obj = gpunode_object(inv, node_name=name, imex=imex.to_status() if imex is not None else None)
    text: str = yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)
    return text


Renderer = Callable[[NodeInventory, Options], str]

OUTPUTS: dict[str, Renderer] = {
    "table": render_table,
    "json": render_json,
    "yaml": render_yaml,
    "gpunode": render_gpunode,
}
"""Output name → renderer. Add a format by adding an entry (import heavy modules inside the function)."""


# --------------------------------------------------------------------------- arguments


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2) instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}; see --help\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Discover this node's GPUs, MIG, MPS, NVLink, fabric and InfiniBand.")
    p.add_argument(
        "--simulate",
        metavar="PROFILE[:k=v,...]",
        help="discover a simulated machine instead of this one (no GPU needed)",
    )
    p.add_argument(
        "--simulate-faults", metavar="PATH", type=Path, help="JSON-lines fault file (with --simulate)"
    )
    p.add_argument(
        "--sysfs-root",
        metavar="DIR",
        type=Path,
        help="sysfs root to read InfiniBand from (default /sys; with --simulate a generated tree)",
    )
    p.add_argument(
        "--output", "-o", default="table", help=f"output format: {', '.join(OUTPUTS)} (default table)"
    )
    p.add_argument("--node-name", metavar="N", help="node name to report (default: the host name)")
    p.add_argument(
        "--mps-pipe-directory",
        metavar="DIR",
        default=DEFAULT_PIPE_DIRECTORY,
        help=f"MPS control daemon pipe directory (default {DEFAULT_PIPE_DIRECTORY})",
    )
    p.add_argument(
        "--log-format", default="auto", help=f"log format: {', '.join(logs.FORMATS)} (default auto)"
    )
    p.add_argument(
        "--log-level", default="warning", help=f"log level: {', '.join(logs.LEVELS)} (default warning)"
    )
    return p


def parse_options(argv: list[str]) -> Options:
    """Parsed and validated options; a bad value exits 2 with one line naming the valid ones."""
    parser = _parser()
    ns = parser.parse_args(argv)
    if ns.output not in OUTPUTS:
        parser.error(f"unknown --output {ns.output!r}; valid: {', '.join(OUTPUTS)}")
    if ns.log_format not in logs.FORMATS:
        parser.error(f"unknown --log-format {ns.log_format!r}; valid: {', '.join(logs.FORMATS)}")
    if ns.log_level not in logs.LEVELS:
        parser.error(f"unknown --log-level {ns.log_level!r}; valid: {', '.join(logs.LEVELS)}")
    if ns.simulate_faults is not None and ns.simulate is None:
        parser.error("--simulate-faults needs --simulate")
    return Options(
        simulate=ns.simulate,
        simulate_faults=ns.simulate_faults,
        sysfs_root=ns.sysfs_root,
        output=ns.output,
        node_name=ns.node_name,
        mps_pipe_directory=ns.mps_pipe_directory,
        log_format=ns.log_format,
        log_level=ns.log_level,
    )


# --------------------------------------------------------------------------- composition


class UsageError(Exception):
    """Bad input found after parsing (e.g. an unknown simulator profile): exit 2."""


class NoDriverError(Exception):
    """No usable NVML on this machine: exit 1."""


@dataclass(frozen=True, slots=True)
class Environment:
    nvml: NvmlBackend
    sysfs_root: Path
    mps_root: Path | None
    host: Host
    imex: ImexReader


@contextmanager
def simulated_environment(opts: Options) -> Iterator[Environment]:
    """The simulator of ``--simulate`` with its generated sysfs tree (a temp dir unless given)."""
    from agent.simnode import open_simulated_node  # noqa: PLC0415 - simulator path only

    assert opts.simulate is not None
    try:
        node = open_simulated_node(
            opts.simulate,
            faults_path=opts.simulate_faults,
            sysfs_root=opts.sysfs_root,
            hostname=opts.node_name,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with node:
        yield Environment(
            nvml=node.nvml,
            sysfs_root=node.sysfs_root,
            mps_root=node.mps_root,
            host=node.host,
            imex=node.imex if node.imex is not None else NoImexDaemon(),
        )


def real_environment(opts: Options) -> Environment:
    """This machine: pynvml, ``/sys`` (or ``--sysfs-root``), MPS under ``/``."""
    from agent.host import read_host  # noqa: PLC0415
    from agent.nvml.real import RealNvml  # noqa: PLC0415 - real path only

    sysfs = opts.sysfs_root or Path("/sys")
    return Environment(
        nvml=RealNvml(),
        sysfs_root=sysfs,
        mps_root=Path("/"),
        host=read_host(sysfs_root=sysfs, hostname=opts.node_name),
        imex=ImexCtlReader(),
    )


_NO_DRIVER_HINT = "'gpu-node-agent discover --simulate PROFILE' runs without a GPU"


def _no_driver_message(exc: NVMLError) -> str:
    what = {
        "LIBRARY_NOT_FOUND": "the NVML library libnvidia-ml.so.1 was not found (no NVIDIA driver installed)",
        "DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded",
        "LIB_RM_VERSION_MISMATCH": "the NVML library does not match the loaded kernel driver (reboot)",
        "NO_PERMISSION": "no permission to open the NVIDIA devices",
    }.get(exc.name, f"NVML failed to initialise: {exc} ({exc.name})")
    return f"{PROG}: no NVIDIA GPU access: {what}; {_NO_DRIVER_HINT}"


def run(opts: Options) -> NodeInventory:
    """Discover with the options' backend; raises :class:`UsageError` / :class:`NoDriverError`."""
    return run_with_imex(opts)[0]


def run_with_imex(opts: Options) -> tuple[NodeInventory, ImexStatus]:
    """:func:`run`, and the node's IMEX daemon as ``nvidia-imex-ctl -q`` reports it (absent: not an error)."""
    log = logs.get_logger("agent.commands.discover")
    with ExitStack() as stack:
        if opts.simulate is not None:
            env = stack.enter_context(simulated_environment(opts))
        else:
            env = real_environment(opts)
        host = env.host
        log = log.bind(node=host.name)
        try:
            env.nvml.init()
        except NVMLError as exc:
            log.info("nvml_init_failed", code=exc.name, reason=str(exc))
            raise NoDriverError(_no_driver_message(exc)) from None
        try:
            inventory = discover(
                nvml=env.nvml,
                sysfs_root=env.sysfs_root,
                host=host,
                mps_root=env.mps_root,
                mps_pipe_directory=opts.mps_pipe_directory,
            )
        finally:
            env.nvml.shutdown()
        imex = env.imex.read()
    for gpu in inventory.gpus:
        if gpu.error:
            (log.bind(gpu_uuid=gpu.uuid) if gpu.uuid else log).warning(
                "gpu_discovery_failed", index=gpu.index, lost=gpu.lost, error=gpu.error
            )
    for problem in inventory.errors:
        log.warning("discovery_problem", problem=problem)
    log.info("discovery_done", gpus=len(inventory.gpus), ib_ports=len(inventory.ib), imex=imex.status.value)
    return inventory, imex


def main(argv: list[str]) -> int:
    try:
        opts = parse_options(argv)
    except SystemExit as exc:  # --help (0) or a usage error already printed (2)
        return exc.code if isinstance(exc.code, int) else 2
    logs.configure(opts.log_format, opts.log_level)
    try:
        inventory, imex = run_with_imex(opts)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except NoDriverError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    sys.stdout.write(OUTPUTS[opts.output](inventory, dataclasses.replace(opts, imex=imex)))
    return 0
