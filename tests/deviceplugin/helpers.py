"""Builders shared by the device-plugin tests: simulated nodes (and the kubelet stand-in, re-exported)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from agent.discovery import discover
from agent.fakekubelet import FakeKubelet, Registration, running_kubelet
from agent.nvml.fake import SimulatedNvml
from agent.nvml.faults import FaultFollower
from agent.nvml.simulate import build_simulator, parse_spec
from topology.model import Host, NodeInventory

__all__ = [
    "FakeKubelet",
    "Registration",
    "SimNode",
    "inventory",
    "running_kubelet",
    "sim_node",
]


@dataclass
class SimNode:
    sim: SimulatedNvml
    sysfs: Path
    host: Host
    faults: FaultFollower | None = None

    def discover(self) -> NodeInventory:
        return discover(nvml=self.sim, sysfs_root=self.sysfs, host=self.host)


def sim_node(profile: str, *, faults: Path | None = None, sysfs: Path | None = None) -> SimNode:
    spec = parse_spec(profile)
    sim = build_simulator(spec)
    follower = None
    if faults is not None:
        follower = FaultFollower(sim, faults)
        follower.poll()
    sim.init()
    machine = spec.machine()
    host = Host(
        name=machine.hostname,
        cpu_count=machine.cpu_count,
        memory_bytes=machine.memory_bytes,
        numa_nodes=machine.numa_nodes,
    )
    return SimNode(
        sim=sim, sysfs=sysfs or Path(tempfile.gettempdir()) / "gna-empty-sysfs", host=host, faults=follower
    )


def inventory(profile: str) -> NodeInventory:
    return sim_node(profile).discover()
