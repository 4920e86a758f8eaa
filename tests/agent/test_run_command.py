"""``gpu-node-agent run`` end to end on a simulated node: start, register, stop cleanly."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
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


def test_further_components_are_built_after_kubelet_registration(short_dir: Path) -> None:
    """Metrics and publishing (the factories) are built once the plugins registered and the IMEX daemon
    was read, so loading their modules never delays kubelet seeing the devices; they still run, and stop
    with the agent."""
    settings = RunSettings(
        node_name="node-a", kubelet_dir=short_dir, simulate="pcie-l40s", no_kube=True, metrics_addr=""
    )
    seen: list[int] = []
    imex_read: list[bool] = []  # the IMEX daemon read before them: the first publication says if it has one
    stopped: list[bool] = []

    class Extra:
        async def run(self, stop: asyncio.Event) -> None:
            await stop.wait()
            stopped.append(True)

    def factory(ctx: run_command.RunContext) -> Extra:
        seen.append(len(kubelet.registrations))
        imex_read.append(getattr(ctx.extras["imex"], "status", None) is not None)
        return Extra()

    async def body() -> int:
        nonlocal kubelet
        async with running_kubelet(short_dir) as kubelet:
            stop = asyncio.Event()
            task = asyncio.create_task(serve(settings, stop=stop, factories=(factory,)))
            async with asyncio.timeout(20):  # (kubelet.wait_for looks only when kubelet sees a change)
                while not seen:
                    await asyncio.sleep(0.01)
            stop.set()
            return await asyncio.wait_for(task, 20)

    kubelet: FakeKubelet
    assert asyncio.run(body()) == 0
    assert seen == [1]  # built after the one resource's registration, and once
    assert imex_read == [True]
    assert stopped == [True]


def test_a_factory_that_fails_stops_the_agent_with_its_error(short_dir: Path) -> None:
    settings = RunSettings(
        node_name="node-a", kubelet_dir=short_dir, simulate="pcie-l40s", no_kube=True, metrics_addr=""
    )

    def broken(ctx: run_command.RunContext) -> None:
        raise RuntimeError("metrics address taken")

    async def body() -> None:
        async with running_kubelet(short_dir):
            await asyncio.wait_for(serve(settings, stop=asyncio.Event(), factories=(broken,)), 20)

    with pytest.raises(ExceptionGroup) as caught:
        asyncio.run(body())
    assert [str(e) for e in caught.value.exceptions] == ["metrics address taken"]
    assert list(short_dir.glob("nvidia-*.sock")) == []


def test_run_without_metrics_or_kube_loads_neither(short_dir: Path) -> None:
    """With ``--metrics-addr '' --health-addr '' --no-kube`` the default factories opt out before
    importing: no prometheus_client, no Kubernetes client in the process (memory and start time)."""
    script = f"""
import asyncio, sys
from pathlib import Path
from agent.commands.run import default_factories, serve
from agent.config import RunSettings
from tests.deviceplugin.helpers import running_kubelet

async def main():
    d = Path({str(short_dir)!r})
    settings = RunSettings(node_name="n", kubelet_dir=d, simulate="pcie-l40s", no_kube=True,
                           metrics_addr="", health_addr="")
    built = asyncio.Event()
    last = lambda ctx: built.set()  # called after the default factories
    async with running_kubelet(d) as kubelet:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(settings, stop=stop, factories=(*default_factories(), last)))
        await asyncio.wait_for(built.wait(), 20)
        stop.set()
        assert await task == 0
    heavy = ("prometheus_client", "kubernetes", "agent.metrics.wiring", "agent.publisher", "topology.kube")
    print(",".join(m for m in heavy if m in sys.modules) or "none")

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "none"


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
