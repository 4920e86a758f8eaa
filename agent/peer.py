"""NVIDIA's device plugin beside ours, over one machine served by the C NVML stand-in (issue 30).

The peer is NVIDIA's ``nvidia-device-plugin`` (built by ``tests/e2e/counterparts/build.sh``, component
``nvidia_device_plugin``), unmodified. Both programs load the C stand-in ``libnvidia-ml.so.1``
(``tests/nvmlstub``) from ``LD_LIBRARY_PATH`` and read the same machine description (exported from a
simulator profile by :func:`agent.nvml.describe.describe_machine`); ours runs ``gpu-node-agent run`` on its
real NVML path (no ``--simulate``). A fault reaches both as the same control line: :meth:`StandIn.fault`
translates one simulator fault event (``{"event": "xid", "gpu": 3, "xid": 79}``) and appends it to each
control file the machine's processes follow.

NVIDIA's plugin serves its sockets in the constant folder ``/var/lib/kubelet/device-plugins`` and reads the
MIG capability minors from ``/proc/driver/nvidia-caps/mig-minors``; it runs in a mount namespace of its own
(``unshare -m``, root) where the kubelet's device-plugin folder is bind-mounted on the first and this
machine's ``proc/driver`` on the second. IMEX channel 0, when asked for, is a character device
``dev/nvidia-caps-imex-channels/channel0`` under the machine's folder with the major that its
``proc/devices`` names: NVIDIA's plugin finds it through ``--driver-root-ctr-path`` (a root holding
``dev/``), ours through ``--dev-root`` and ``--proc-root``.

Used by ``tests/e2e/test_peer_hollow.py`` (each plugin on its own hollow node) and ``gpu-node-agent bench
deviceplugin --peer nvidia`` (:mod:`agent.benchmarks.peer`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.nvml.describe import FaultTranslator, describe_machine
from agent.nvml.sim_sysfs import write_sysfs
from agent.nvml.simulate import parse_spec

PEER_PLUGIN = "nvidia-device-plugin"
REPO_ROOT = Path(__file__).resolve().parents[1]
STAND_IN_BUILD = ("-m", "tests.nvmlstub.build")
"""How the stand-in is compiled (run in the repository: ``python -m tests.nvmlstub.build OUT current``)."""
LIBRARY = "libnvidia-ml.so.1"
IMEX_MAJOR = 237
"""The character-device major this machine's ``proc/devices`` gives ``nvidia-caps-imex-channels``."""
KUBELET_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
MIG_GPUS = 16  # the stand-in holds at most 16 GPUs: the capability table covers every minor it serves


class StandInUnavailableError(RuntimeError):
    """The C stand-in cannot be built here (no compiler, no ``nvml.h``, no repository); one line."""


def build_stand_in(out_dir: Path) -> Path:
    """Compile the stand-in (variant ``current``) into ``out_dir``; returns the folder holding it."""
    if not (REPO_ROOT / "tests" / "nvmlstub" / "build.py").is_file():
        raise StandInUnavailableError(
            f"the C NVML stand-in's sources are not here ({REPO_ROOT}/tests/nvmlstub)"
        )
    done = subprocess.run(
        [sys.executable, *STAND_IN_BUILD, str(out_dir), "current"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise StandInUnavailableError(f"the C NVML stand-in does not build: {last[:300]}")
    return Path(done.stdout.strip().splitlines()[-1]).parent


def mig_minors_table(gpus: int = MIG_GPUS) -> str:
    """What the driver publishes in ``/proc/driver/nvidia-caps/mig-minors``: a minor per capability."""
    lines = ["config 1", "monitor 2"]
    minor = 3
    for gpu in range(gpus):
        for gi in range(15):
            lines.append(f"gpu{gpu}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(8):
                lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "\n".join(lines) + "\n"


class StandIn:
    """One machine (a simulator profile) on the C stand-in, in ``directory``: its description, sysfs tree,
    proc and dev folders, and one control file per process that follows it (:meth:`control`)."""

    def __init__(
        self, profile: str, *, library_dir: Path, directory: Path, imex_channel: bool = False
    ) -> None:
        spec = parse_spec(profile)
        self.profile = profile
        self.machine = spec.machine()
        self.library_dir = library_dir
        self.directory = directory
        self.imex_channel = imex_channel
        self._translator = FaultTranslator(self.machine)
        self._controls: list[Path] = []
        directory.mkdir(parents=True, exist_ok=True)
        self.description.write_text(describe_machine(self.machine), encoding="utf-8")
        self.sysfs.mkdir(exist_ok=True)
        write_sysfs(self.sysfs, spec)
        cpu = self.sysfs / "devices" / "system" / "cpu"
        cpu.mkdir(parents=True, exist_ok=True)
        (cpu / "online").write_text(f"0-{self.machine.cpu_count - 1}\n", encoding="utf-8")
        dmi = self.sysfs / "class" / "dmi" / "id"
        dmi.mkdir(parents=True, exist_ok=True)
        (dmi / "product_uuid").write_text(self.machine.system_uuid + "\n", encoding="utf-8")
        caps = self.proc / "driver" / "nvidia-caps"
        caps.mkdir(parents=True, exist_ok=True)
        (caps / "mig-minors").write_text(mig_minors_table(), encoding="utf-8")
        devices = "Character devices:\n195 nvidia\n"
        if imex_channel:
            devices += f"{IMEX_MAJOR} nvidia-caps-imex-channels\n"
            channels = self.dev / "nvidia-caps-imex-channels"
            channels.mkdir(parents=True, exist_ok=True)
            node = channels / "channel0"
            if not node.exists():
                os.mknod(node, 0o600 | 0o020000, os.makedev(IMEX_MAJOR, 0))  # S_IFCHR
        else:
            self.dev.mkdir(parents=True, exist_ok=True)
        (self.proc / "devices").write_text(devices, encoding="utf-8")

    @property
    def description(self) -> Path:
        return self.directory / "machine.nvmlstub"

    @property
    def sysfs(self) -> Path:
        return self.directory / "sys"

    @property
    def proc(self) -> Path:
        return self.directory / "proc"

    @property
    def dev(self) -> Path:
        return self.directory / "dev"

    def control(self, name: str) -> Path:
        """A new, empty control file for one process (``name`` tells them apart); every later
        :meth:`fault` is appended to it."""
        path = self.directory / f"control-{name}-{len(self._controls)}"
        path.write_text("", encoding="utf-8")
        self._controls.append(path)
        return path

    def env(self, control: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a process on this machine (``base``: default this process's)."""
        env = dict(os.environ if base is None else base)
        env.update(
            LD_LIBRARY_PATH=str(self.library_dir),
            NVMLSTUB_MACHINE=str(self.description),
            NVMLSTUB_CONTROL=str(control),
            NVMLSTUB_SYSFS=str(self.sysfs),
        )
        return env

    def fault(self, event: Mapping[str, Any], *, to: Sequence[Path] | None = None) -> str:
        """Append one simulator fault event, as the stand-in's control line, to every control file (the
        same fault for every program on this machine), or to those of ``to``; returns the line."""
        line = self._translator.command(event)
        for path in self._controls if to is None else to:
            with path.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        return line


def plugin_config(
    *, mig_strategy: str = "none", replicas: int = 1, imex_channel: bool = False
) -> dict[str, Any]:
    """The ``version: v1`` config both device plugins read (NVIDIA's keys, which ours shares)."""
    config: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": mig_strategy}}
    if replicas > 1:
        config["sharing"] = {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}
    if imex_channel:
        config["imex"] = {"channelIDs": [0], "required": True}
    return config


def our_config(
    config: Mapping[str, Any], *, probe_interval_s: float = 0.2, recovery_quiet_s: float = 1.0
) -> dict[str, Any]:
    """Ours' config file: the plugin keys of ``config`` and a ``health`` section (how often a GPU is probed
    and how long a fault must stay quiet before a device returns; NVIDIA's plugin has neither)."""
    health = {"probeIntervalSeconds": probe_interval_s, "recoveryQuietSeconds": recovery_quiet_s}
    return {**dict(config), "health": health}


def nvidia_plugin_argv(
    binary: Path, *, stand_in: StandIn, plugin_dir: Path, config_file: Path, extra: Sequence[str] = ()
) -> list[str]:
    """NVIDIA's plugin in its own mount namespace on ``plugin_dir`` (the kubelet's device-plugin folder)."""
    args = [
        str(binary),
        "--kubelet-socket",
        str(plugin_dir / "kubelet.sock"),
        "--config-file",
        str(config_file),
        "--driver-root-ctr-path",
        str(stand_in.directory),  # a root holding dev/: the IMEX channel's device node is looked up there
        *extra,
    ]
    script = (
        f"mkdir -p {KUBELET_PLUGIN_DIR} && mount --bind {plugin_dir} {KUBELET_PLUGIN_DIR} && "
        f"mount --bind {stand_in.proc / 'driver'} /proc/driver && exec {' '.join(args)}"
    )
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script]


def our_agent_argv(
    *,
    stand_in: StandIn,
    node_name: str,
    plugin_dir: Path,
    config_file: Path,
    pod_resources_socket: Path,
    metrics_addr: str,
    command: Sequence[str] = (sys.executable, "-m", "agent.cli"),
) -> list[str]:
    """``gpu-node-agent run`` on the real NVML path over the stand-in (no ``--simulate``), no Kubernetes."""
    return [
        *command,
        "run",
        "--node-name",
        node_name,
        "--kubelet-dir",
        str(plugin_dir),
        "--pod-resources-socket",
        str(pod_resources_socket),
        "--metrics-addr",
        metrics_addr,
        "--health-addr",
        "",
        "--log-format",
        "json",
        "--no-kube",
        "--config",
        str(config_file),
        "--sysfs-root",
        str(stand_in.sysfs),
        "--dev-root",
        str(stand_in.dev),
        "--proc-root",
        str(stand_in.proc),
    ]


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    path.write_text(json.dumps(dict(config), indent=1), encoding="utf-8")
    return path


__all__ = [
    "IMEX_MAJOR",
    "PEER_PLUGIN",
    "StandIn",
    "StandInUnavailableError",
    "build_stand_in",
    "mig_minors_table",
    "nvidia_plugin_argv",
    "our_agent_argv",
    "our_config",
    "plugin_config",
    "write_config",
]
