"""``run`` on a simulated GB200 tray with ``imex.channelIDs [0]``: the channel is checked at start and every
GPU container gets it, over the real gRPC path kubelet uses; a required channel that is missing stops the
agent before it starts, with one line and exit code 2."""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.commands import run as run_command
from agent.commands.run import serve
from agent.config import RunSettings
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.config import parse_plugin_config
from tests.deviceplugin.helpers import running_kubelet
from tests.integration.test_deviceplugin_kubelet import call


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="imex", dir="/tmp") as d:
        yield Path(d)


def test_every_gpu_container_gets_the_channel_by_each_strategy(short_dir: Path) -> None:
    spec_dir = short_dir / "cdi"
    settings = RunSettings(
        node_name="rack0-tray0",
        kubelet_dir=short_dir,
        simulate="gb200-nvl72",
        no_kube=True,
        metrics_addr="",
        plugin=parse_plugin_config(
            {
                "flags": {"plugin": {"deviceListStrategy": ["envvar", "cdi-cri"], "passDeviceSpecs": True}},
                "cdi": {"specDir": str(spec_dir)},
                "imex": {"channelIDs": [0], "required": True},
            }
        ),
    )

    async def body() -> pb.ContainerAllocateResponse:
        async with running_kubelet(short_dir) as kubelet:
            stop = asyncio.Event()
            task = asyncio.create_task(serve(settings, stop=stop))
            await kubelet.wait_for(lambda: len(kubelet.devices.get("nvidia.com/gpu", {})) == 4, timeout=20)
            device = sorted(kubelet.devices["nvidia.com/gpu"])[0]
            reply = await call(
                short_dir,
                "nvidia-gpu.sock",
                "Allocate",
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[device])]),
            )
            stop.set()
            assert await asyncio.wait_for(task, 20) == 0
            response: pb.ContainerAllocateResponse = reply.container_responses[0]
            return response

    response = asyncio.run(body())
    assert response.envs["NVIDIA_IMEX_CHANNELS"] == "0"
    assert [c.name for c in response.cdi_devices][-1] == "gpuagent.dev/imex-channel=0"
    [spec] = [d for d in response.devices if d.container_path == "/dev/nvidia-caps-imex-channels/channel0"]
    assert spec.permissions == "rw"
    assert spec.host_path.endswith("/dev/nvidia-caps-imex-channels/channel0")
    written = json.loads((spec_dir / "gpuagent.dev-imex-channel.json").read_text())
    assert written["kind"] == "gpuagent.dev/imex-channel"
    assert [d["name"] for d in written["devices"]] == ["0"]


def test_a_required_channel_that_is_missing_exits_2_with_one_line(
    short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_command.main(
        [
            "--simulate",
            "dgx-h100",  # no multi-node NVLink: the simulated node has no IMEX channel
            "--imex-channel-ids",
            "0",
            "--imex-required",
            "--kubelet-dir",
            str(short_dir),
            "--no-kube",
            "--metrics-addr",
            "",
            "--health-addr",
            "",
            "--dev-root",
            str(short_dir / "no-dev"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("gpu-node-agent run: imex.required: ")
    assert "nvidia-caps-imex-channels" in err


def test_a_missing_channel_not_required_warns_once_and_injects_nothing(short_dir: Path) -> None:
    settings = RunSettings(
        node_name="h",
        kubelet_dir=short_dir,
        simulate="dgx-h100",
        dev_root=short_dir / "no-dev",  # hermetic on a host that has channels
        no_kube=True,
        metrics_addr="",
        plugin=parse_plugin_config({"imex": {"channelIDs": "0"}}),
    )
    node = run_command.build_node(settings)
    try:
        config = run_command.imex_plugin_config(settings, node)
    finally:
        node.cleanup()
    assert config.imex.channel_ids == (0,)
    assert config.imex_channels == ()
