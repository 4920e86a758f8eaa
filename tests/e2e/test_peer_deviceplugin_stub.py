"""NVIDIA's ``nvidia-device-plugin`` (the peer, built by ``counterparts/build.sh``), unmodified, over the C
NVML stand-in for every profile: it starts, registers with a kubelet registration service
(``agent.fakekubelet``) and lists every device Healthy, and the resources and device IDs it lists are the
ones our device plugin plans for the same machine (``deviceplugin.resources.build_plan`` over the inventory
``discover`` reads through the same stand-in). No NVML function it calls is lacking.

NVIDIA's plugin serves its sockets in the constant folder ``/var/lib/kubelet/device-plugins`` and reads the
MIG capability minors from ``/proc/driver/nvidia-caps/mig-minors``; it runs in a mount namespace of its own
(``unshare -m``, root) where a private folder is mounted on the first and a table the driver would publish
on the second.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent import localcluster as cluster
from agent.fakekubelet import running_kubelet
from deviceplugin.config import parse_plugin_config
from deviceplugin.resources import build_plan
from tests.e2e.conftest import REPO_ROOT, _require, _unavailable
from tests.nvmlstub.build import UNIMPLEMENTED_ENV, StubUnavailableError, build, unimplemented_calls
from tests.nvmlstub.conftest import Runner
from topology.model import NodeInventory

pytestmark = pytest.mark.e2e

PLUGIN = "nvidia-device-plugin"
RUN_TIMEOUT_S = 120
REGISTER_TIMEOUT_S = 60.0

CASES: dict[str, tuple[str, dict[str, object]]] = {
    "dgx-h100": ("dgx-h100", {"flags": {"migStrategy": "none"}}),
    "hgx-h200-mixed": ("hgx-h200", {"flags": {"migStrategy": "mixed"}}),
    "gb200-nvl72": ("gb200-nvl72:rack=1,tray=3", {"flags": {"migStrategy": "none"}}),
    "dgx-a100-mig-none": ("dgx-a100-mig", {"flags": {"migStrategy": "none"}}),
    "dgx-a100-mig-mixed": ("dgx-a100-mig", {"flags": {"migStrategy": "mixed"}}),
    "dgx1-v100": ("dgx1-v100", {"flags": {"migStrategy": "none"}}),
    "pcie-l40s-time-slicing": (
        "pcie-l40s",
        {
            "flags": {"migStrategy": "none"},
            "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}},
        },
    ),
}


@pytest.fixture(scope="module")
def plugin(counterparts: cluster.Counterparts) -> Path:
    _require(counterparts, PLUGIN)
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        _unavailable(
            "NVIDIA's device plugin needs root and unshare (a mount namespace for its constant paths)"
        )
    return counterparts.binary(PLUGIN)


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    out = tmp_path_factory.mktemp("peer-dp-nvmlstub")
    try:
        library = build(out)
    except StubUnavailableError as exc:
        _unavailable(f"the C NVML stand-in cannot be built here: {exc}")
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"the C NVML stand-in does not compile against nvml.h:\n{exc.stderr}")
    return Runner({"current": library.parent}, tmp_path_factory.mktemp("peer-dp-runs"))


def _mig_minors(gpu_minors: list[int]) -> str:
    """The table the driver publishes in /proc/driver/nvidia-caps/mig-minors (a minor per capability)."""
    lines = ["config 1", "monitor 2"]
    minor = 3
    for gpu in gpu_minors:
        for gi in range(15):
            lines.append(f"gpu{gpu}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(8):
                lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "\n".join(lines) + "\n"


def _our_plan(env: dict[str, str], sysfs: Path, config: dict[str, object]) -> dict[str, set[str]]:
    argv = ["-m", "agent.cli", "discover", "--output", "json", "--mps-pipe-directory", "/nonexistent-mps"]
    argv += ["--sysfs-root", str(sysfs)]
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"discover exited {done.returncode}:\n{done.stderr[-3000:]}"
    inventory = NodeInventory.from_dict(json.loads(done.stdout))
    plan = build_plan(inventory, parse_plugin_config(config))
    return {r.name: {d.id for d in r.devices} for r in plan.resources}


async def _theirs(
    plugin: Path,
    env: dict[str, str],
    work: Path,
    config: dict[str, object],
    *,
    minors: str,
    expected: set[str],
) -> tuple[dict[str, dict[str, str]], str]:
    sockets = work / "device-plugins"
    sockets.mkdir()
    driver = work / "proc-driver"
    (driver / "nvidia-caps").mkdir(parents=True)
    (driver / "nvidia-caps" / "mig-minors").write_text(minors, encoding="utf-8")
    config_file = work / "config.json"
    config_file.write_text(json.dumps({"version": "v1", **config}), encoding="utf-8")
    log = work / "nvidia-device-plugin.log"
    script = (
        f"mount --bind {sockets} /var/lib/kubelet/device-plugins && mount --bind {driver} /proc/driver && "
        f"exec {plugin} --kubelet-socket {sockets}/kubelet.sock --config-file {config_file}"
    )
    async with running_kubelet(sockets) as kubelet:
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                "unshare", "-m", "--propagation", "private", "sh", "-c",
                f"mkdir -p /var/lib/kubelet/device-plugins && {script}",
                env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                # every resource ours plans is listed (or the plugin exited): then compare
                await kubelet.wait_for(
                    lambda: expected <= set(kubelet.devices) or proc.returncode is not None,
                    timeout=REGISTER_TIMEOUT_S,
                )
            except TimeoutError:
                pass
            finally:
                if proc.returncode is None:
                    proc.terminate()
                await proc.wait()
        return dict(kubelet.devices), log.read_text(encoding="utf-8", errors="replace")


@pytest.mark.parametrize("name", list(CASES))
def test_nvidia_device_plugin_runs_over_the_stand_in_and_lists_our_devices(
    plugin: Path, runner: Runner, tmp_path: Path, name: str
) -> None:
    profile, config = CASES[name]
    env, sysfs = runner.stub_env(profile)
    unimplemented = tmp_path / "unimplemented"
    env[UNIMPLEMENTED_ENV] = str(unimplemented)
    ours = _our_plan(env, sysfs, config)
    inventory_minors = list(range(16))  # every minor the stand-in can serve (it holds at most 16 GPUs)

    minors = _mig_minors(inventory_minors)
    listed, log = asyncio.run(_theirs(plugin, env, tmp_path, config, minors=minors, expected=set(ours)))

    lacking = unimplemented_calls(unimplemented)
    assert not lacking, f"{PLUGIN} called NVML functions the stand-in lacks: {lacking}\n{log[-3000:]}"
    assert listed, f"{PLUGIN} registered nothing:\n{log[-4000:]}"
    theirs = {resource: set(devices) for resource, devices in listed.items()}
    assert theirs == ours, f"resources and device IDs differ (NVIDIA's, ours):\n{log[-2000:]}"
    unhealthy = {r: [i for i, h in d.items() if h != "Healthy"] for r, d in listed.items()}
    assert all(not ids for ids in unhealthy.values()), unhealthy
