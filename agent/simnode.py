"""A simulated node ready to discover: the simulator of a ``--simulate`` spec, the sysfs tree it
implies (InfiniBand HCAs in kernel formats), its host facts and, with ``--simulate-faults``, the
follower of its fault file.

One place for what ``discover``, ``run``, ``demo`` and the discovery benchmark each need when they
simulate, so they all see the same machine the same way. The node owns its fault follower: the lines
already in the file apply when the node opens, and whoever runs the node runs ``node.faults`` as one
more component (``await node.faults.run(stop)``) to apply the lines appended later.
"""

from __future__ import annotations

import os
import stat
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from agent.discovery import discover
from agent.host import simulated_host
from agent.imexsim import SimulatedImexDaemon
from agent.mps import DEFAULT_PIPE_DIRECTORY
from agent.nvml.fake import SimulatedNvml
from agent.nvml.faults import FaultFollower
from agent.nvml.sim_sysfs import write_sysfs
from agent.nvml.simulate import SimSpec, build_simulator, parse_spec
from topology.model import Host, NodeInventory


@dataclass
class SimulatedNode:
    spec: SimSpec
    nvml: SimulatedNvml  # not initialised: the caller owns init()/shutdown()
    sysfs_root: Path
    mps_root: Path  # an empty root: no MPS daemon unless a test writes one
    host: Host
    faults: FaultFollower | None = None  # the follower of the fault file, where one was given
    # multi-node NVLink machines (GB200): a dev root holding IMEX channel 0 and the /proc/devices naming
    # its major (a character device where mknod is allowed, else a regular file standing in for it)
    dev_root: Path | None = None
    proc_devices: Path | None = None
    imex: SimulatedImexDaemon | None = None  # its IMEX daemon (multi-node NVLink profiles)
    _stack: ExitStack = field(default_factory=ExitStack, repr=False)

    def discover(
        self, *, mps_pipe_directory: str = DEFAULT_PIPE_DIRECTORY, strict: bool = False
    ) -> NodeInventory:
        return discover(
            nvml=self.nvml,
            sysfs_root=self.sysfs_root,
            host=self.host,
            mps_root=self.mps_root,
            mps_pipe_directory=mps_pipe_directory,
            strict=strict,
        )

    def close(self) -> None:
        """Stops the managed IMEX daemon's listener, if any, and removes the generated files."""
        if self.imex is not None:
            self.imex.close()
        self._stack.close()

    def __enter__(self) -> SimulatedNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_simulated_node(
    simulate: str | SimSpec,
    *,
    faults_path: Path | None = None,
    sysfs_root: Path | None = None,
    hostname: str | None = None,
) -> SimulatedNode:
    """The node of a spec, its sysfs tree written into a temporary folder unless ``sysfs_root`` is given.
    With ``faults_path``, the lines already in that file are applied and ``faults`` follows the rest.

    Raises ``SimSpecError`` (a ``ValueError``, one line naming the valid choices) for a bad spec and
    ``ValueError`` for a fault file it cannot follow.
    """
    spec = parse_spec(simulate) if isinstance(simulate, str) else simulate
    if faults_path is not None and not faults_path.is_file():
        raise ValueError(f"--simulate-faults {faults_path}: no such file")
    sim = build_simulator(spec)
    multi_node = any(g.fabric is not None and g.fabric.cluster_uuid.strip("0-") for g in sim.machine.gpus)
    imex = None
    if multi_node:  # the rack's trays are the IMEX domain's peers
        rack = spec.option("rack", 0)
        imex = SimulatedImexDaemon(tuple(f"rack{rack}-tray{t}" for t in range(18)))
    faults = None
    if faults_path is not None:
        faults = FaultFollower(sim, faults_path, imex=imex)
        faults.poll()  # the lines already written apply before anything reads the node
    stack = ExitStack()
    root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-node-agent-sim-")))
    if sysfs_root is None:
        sysfs_root = root / "sys"
        sysfs_root.mkdir()
        write_sysfs(sysfs_root, spec)
    mps_root = root / "mps-root"
    mps_root.mkdir()
    dev_root = proc_devices = None
    if multi_node:
        dev_root, proc_devices = write_imex_channel(root)
    return SimulatedNode(
        spec=spec,
        nvml=sim,
        sysfs_root=sysfs_root,
        mps_root=mps_root,
        host=simulated_host(sim.machine, hostname=hostname),
        faults=faults,
        dev_root=dev_root,
        proc_devices=proc_devices,
        imex=imex,
        _stack=stack,
    )


SIMULATED_IMEX_MAJOR = 510


def write_imex_channel(root: Path) -> tuple[Path, Path]:
    """``root/dev/nvidia-caps-imex-channels/channel0`` and ``root/proc/devices`` naming its major, as a
    GB200 node's driver makes them; returns (dev root, the devices file)."""
    dev_root = root / "dev"
    channels = dev_root / "nvidia-caps-imex-channels"
    channels.mkdir(parents=True)
    node = channels / "channel0"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(SIMULATED_IMEX_MAJOR, 0))
    except OSError:  # not root (or no CAP_MKNOD): a stand-in only --simulate accepts
        node.write_text("simulated IMEX channel 0\n", encoding="utf-8")
    proc = root / "proc"
    proc.mkdir()
    devices = proc / "devices"
    devices.write_text(
        "Character devices:\n  1 mem\n195 nvidia-frontend\n"
        f"{SIMULATED_IMEX_MAJOR} nvidia-caps-imex-channels\n\nBlock devices:\n  8 sd\n",
        encoding="utf-8",
    )
    return dev_root, devices
