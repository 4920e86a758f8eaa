"""``gpu-node-agent run`` end to end on a simulated node: start, register, stop cleanly."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.commands import run as run_command
from agent.commands.run import serve
from agent.config import RunSettings
from deviceplugin.config import parse_plugin_config
from tests.deviceplugin.helpers import FakeKubelet, running_kubelet


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The command configures process-wide logging; put it back for the tests that follow."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="run", dir="/tmp") as d:
        yield Path(d)


def test_serve_registers_and_stops_without_signals(short_dir: Path) -> None:
    settings = RunSettings(
        node_name="node-a",
        kubelet_dir=short_dir,
        simulate="dgx-a100-mig",
        no_kube=True,
        metrics_addr="",
        plugin=parse_plugin_config({"flags": {"migStrategy": "mixed"}}),
    )

    async def body() -> int:
        async with running_kubelet(short_dir) as kubelet:
            stop = asyncio.Event()
            task = asyncio.create_task(serve(settings, stop=stop))
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 5, timeout=20)
            assert {r.resource_name for r in kubelet.registrations} >= {
                "nvidia.com/gpu",
                "nvidia.com/mig-1g.10gb",
            }
            stop.set()
            return await asyncio.wait_for(task, 20)

    assert asyncio.run(body()) == 0
    assert list(short_dir.glob("nvidia-*.sock")) == []


def test_unknown_profile_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command.main(["--simulate", "dgx-z900"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "dgx-h100" in err  # lists the valid ones


def test_plan_that_cannot_apply_exits_1(short_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run_command.main(
        [
            "--simulate",
            "dgx-a100-mig",
            "--mig-strategy",
            "single",
            "--kubelet-dir",
            str(short_dir),
            "--no-kube",
        ]
    )
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "migStrategy single" in err


def test_sigterm_stops_the_process_and_removes_sockets(short_dir: Path) -> None:
    async def body() -> int:
        kubelet = FakeKubelet(short_dir)
        await kubelet.start()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "agent.cli",
                "run",
                "--simulate",
                "pcie-l40s",
                "--kubelet-dir",
                str(short_dir),
                "--no-kube",
                "--metrics-addr",
                "",
                "--health-addr",
                "",
                "--log-format",
                "json",
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                await kubelet.wait_for(lambda: len(kubelet.registrations) == 1, timeout=30)
                assert (short_dir / "nvidia-gpu.sock").exists()
                proc.send_signal(signal.SIGTERM)
                return await asyncio.wait_for(proc.wait(), 20)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        finally:
            await kubelet.stop()

    assert asyncio.run(body()) == 0
    assert list(short_dir.glob("nvidia-*.sock")) == []


def test_allocatable_check_reads_pod_resources(short_dir: Path) -> None:
    from agent.commands.run import _allocatable_check
    from agent.podresources.fake import FakePodResourcesServer

    socket = short_dir / "pr.sock"
    check = _allocatable_check(socket)
    assert check is not None

    async def body() -> tuple[object, object, object]:
        missing = await check()  # no socket yet: unknown, not "nothing listed"
        async with FakePodResourcesServer(str(socket), allocatable={"nvidia.com/gpu": ["GPU-a", "GPU-b"]}):
            listed = await check()
        async with FakePodResourcesServer(str(socket), allocatable=None):
            unimplemented = await check()
        return missing, listed, unimplemented

    missing, listed, unimplemented = asyncio.run(body())
    assert missing is None
    assert listed == {"nvidia.com/gpu": frozenset({"GPU-a", "GPU-b"})}
    assert unimplemented is None
