"""Hostile ``--sysfs-root`` content on the agent's real NVML path (the C-level stand-in as the driver),
where the host facts are read from sysfs too (issue 26, items 18 and 20).

The tree is the profile's own, then damaged: ``cpu/online`` and a NUMA node's ``cpulist`` of
``0-4294967295`` (four billion ints, were they built), ``product_uuid`` linked to ``/dev/zero`` (a read
without end), an HCA's ``fw_ver`` made a FIFO (an open that waits for a writer), another's ``hca_type``
not UTF-8, a third's port folder named ``²``. Each process runs with 4 GiB of address space and a time
limit, so the code before the fix fails these tests instead of the machine.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from agent.nvml.simulate import parse_spec
from tests.nvmlstub.conftest import REPO, Runner

ADDRESS_SPACE = 4 << 30
PROFILE = "dgx-h100"


# ``python -c`` this, then the CLI's arguments: the limit is set inside the child, before anything loads
LIMITED_CLI = (
    "import resource, runpy, sys; "
    f"resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE}, {ADDRESS_SPACE})); "
    "sys.argv[0] = 'gpu-node-agent'; "
    "runpy.run_module('agent.cli', run_name='__main__')"
)


def _damage(sysfs: Path) -> Path:
    """Damages the tree as the module doc says; returns its ``class/infiniband`` folder."""
    (sysfs / "devices/system/cpu/online").write_text("0-4294967295\n")
    (sysfs / "devices/system/node/node0/cpulist").write_text("0-4294967295\n")
    uuid = sysfs / "class/dmi/id/product_uuid"
    uuid.unlink()
    uuid.symlink_to("/dev/zero")
    ib = sysfs / "class" / "infiniband"
    (ib / "mlx5_0" / "fw_ver").unlink()
    os.mkfifo(ib / "mlx5_0" / "fw_ver")
    (ib / "mlx5_1" / "hca_type").write_bytes(b"MT\xff4129\n")
    (ib / "mlx5_2" / "ports" / "\u00b2").mkdir()
    return ib


def test_discover_reads_what_is_sane_and_names_the_rest(runner: Runner) -> None:
    env, sysfs = runner.stub_env(PROFILE)
    ib = _damage(sysfs)
    done = subprocess.run(
        [sys.executable, "-c", LIMITED_CLI, "discover", "--output", "json", "--sysfs-root", str(sysfs)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout)
    host = out["host"]
    assert host["cpu_count"] == os.cpu_count()
    assert host["system_uuid"] is None
    assert [n["cpus"] for n in host["numa_nodes"]] == ["", "56-111,168-223"]
    machine = parse_spec(PROFILE).machine()
    assert len(out["ib"]) == sum(len(h.ports) for h in machine.hcas)
    assert {p["device"]: p["firmware"] for p in out["ib"]}["mlx5_0"] is None
    assert {p["device"]: p["hca_type"] for p in out["ib"]}["mlx5_1"] is None
    assert [e for e in out["errors"] if "infiniband" in e] == [
        f"{ib}/mlx5_0/fw_ver: not a regular file (a FIFO); attribute skipped",
        f"{ib}/mlx5_1/hca_type: not UTF-8 text (byte 0xff at offset 2); attribute skipped",
        f"{ib}/mlx5_2/ports/\u00b2: port directory name is not a number; skipped",
    ]


def test_run_starts_and_stops_cleanly(runner: Runner) -> None:
    env, sysfs = runner.stub_env(PROFILE)
    _damage(sysfs)
    with tempfile.TemporaryDirectory(prefix="hs", dir="/tmp") as kubelet_dir:
        argv = [
            *("-c", LIMITED_CLI, "run", "--no-kube", "--sysfs-root", str(sysfs), "--node-name", "node-h"),
            *("--kubelet-dir", kubelet_dir, "--metrics-addr", "", "--health-addr", ""),
            *("--pod-resources-socket", f"{kubelet_dir}/none.sock", "--log-format", "json"),
        ]
        with subprocess.Popen(
            [sys.executable, *argv],
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        ) as proc:
            seen = _start_and_stop(proc)
    assert not any("Traceback" in line for line in seen), "".join(seen)[-3000:]


def _start_and_stop(proc: subprocess.Popen[str]) -> list[str]:
    """Waits for ``agent_started``, sends SIGTERM, expects exit 0; returns every stderr line."""
    lines: queue.Queue[str | None] = queue.Queue()
    seen: list[str] = []

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        while True:
            line = lines.get(timeout=120)
            assert line is not None, "run ended before it started:\n" + "".join(seen)[-3000:]
            seen.append(line)
            if "agent_started" in line:
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, "".join(seen)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    while (line := lines.get(timeout=30)) is not None:
        seen.append(line)
    return seen
