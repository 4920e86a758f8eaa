"""IMEX channels: the device-node check, the config (file, flags and env strings), what each device-list
strategy puts into a container, and the channel's CDI spec."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.config import ConfigError, ImexChannel, ImexConfig, PluginConfig, parse_plugin_config
from deviceplugin.container import IMEX_CHANNELS, VISIBLE_DEVICES, DeviceSpec, Mount, allocate
from deviceplugin.imex import ImexChannelError, channel_major, find_channels, imex_cdi_spec
from deviceplugin.resources import GPU_RESOURCE, build_plan
from tests.deviceplugin.helpers import inventory

PROC_DEVICES = (
    "Character devices:\n  1 mem\n509 nvidia-caps-imex-channels\n\n"
    "Block devices:\n511 nvidia-caps-imex-channels\n"
)


def node_files(
    tmp_path: Path, *, proc: str = PROC_DEVICES, channel: str | None = "file"
) -> tuple[Path, Path]:
    dev = tmp_path / "dev"
    (dev / "nvidia-caps-imex-channels").mkdir(parents=True)
    node = dev / "nvidia-caps-imex-channels" / "channel0"
    if channel == "file":
        node.write_text("stand-in\n")
    elif channel is not None:
        major = int(channel)
        try:
            os.mknod(node, 0o600 | stat.S_IFCHR, os.makedev(major, 0))
        except PermissionError:
            pytest.skip("mknod needs root here")
    devices = tmp_path / "devices"
    devices.write_text(proc)
    return dev, devices


def test_the_major_comes_from_the_character_devices_only(tmp_path: Path) -> None:
    _, devices = node_files(tmp_path)
    assert channel_major(devices) == 509
    devices.write_text("Block devices:\n509 nvidia-caps-imex-channels\n")
    assert channel_major(devices) is None
    assert channel_major(tmp_path / "absent") is None


def test_a_character_device_with_the_right_major_is_a_channel(tmp_path: Path) -> None:
    dev, devices = node_files(tmp_path, channel="509")
    [channel] = find_channels([0], dev_root=dev, proc_devices=devices)
    assert channel == ImexChannel(
        0, "/dev/nvidia-caps-imex-channels/channel0", str(dev / "nvidia-caps-imex-channels" / "channel0")
    )


def test_the_wrong_major_is_named(tmp_path: Path) -> None:
    dev, devices = node_files(tmp_path, channel="508")
    with pytest.raises(ImexChannelError, match="is device 508:0, not major 509"):
        find_channels([0], dev_root=dev, proc_devices=devices)


@pytest.mark.parametrize(
    ("proc", "channel", "stand_in", "message"),
    [
        pytest.param(
            "Character devices:\n  1 mem\n", "file", True, "no nvidia-caps-imex-channels line", id="no-major"
        ),
        pytest.param(PROC_DEVICES, None, True, "No such file or directory", id="no-node"),
        pytest.param(PROC_DEVICES, "file", False, "is not a character device", id="file-outside-simulation"),
    ],
)
def test_a_missing_channel_says_what_is_wrong(
    tmp_path: Path, proc: str, channel: str | None, stand_in: bool, message: str
) -> None:
    dev, devices = node_files(tmp_path, proc=proc, channel=channel)
    with pytest.raises(ImexChannelError, match=message):
        find_channels([0], dev_root=dev, proc_devices=devices, allow_stand_in=stand_in)


def test_the_simulation_stand_in_is_accepted_only_when_allowed(tmp_path: Path) -> None:
    dev, devices = node_files(tmp_path)
    assert [c.id for c in find_channels([0], dev_root=dev, proc_devices=devices, allow_stand_in=True)] == [0]
    assert find_channels([], dev_root=dev, proc_devices=devices) == ()


CONFIGS = {
    "default": ({}, ImexConfig()),
    "file": ({"imex": {"channelIDs": [0], "required": True}}, ImexConfig((0,), True)),
    "flag-string": ({"imex": {"channelIDs": "0", "required": "true"}}, ImexConfig((0,), True)),
    "empty-string": ({"imex": {"channelIDs": "", "required": "false"}}, ImexConfig()),
}


@pytest.mark.parametrize(("data", "want"), CONFIGS.values(), ids=CONFIGS.keys())
def test_imex_config(data: dict[str, Any], want: ImexConfig) -> None:
    assert parse_plugin_config(data).imex == want


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        pytest.param({"imex": {"channelIDs": [1]}}, "imex.channelIDs: [1] is not [] or [0]", id="channel-1"),
        pytest.param(
            {"imex": {"channelIDs": [0, 0]}}, "imex.channelIDs: [0, 0] is not [] or [0]", id="twice"
        ),
        pytest.param({"imex": {"channelIDs": [True]}}, "imex.channelIDs: [True] is not [] or [0]", id="bool"),
        pytest.param({"imex": {"channelIDs": "x"}}, "imex.channelIDs: 'x' is not [] or [0]", id="garbage"),
        pytest.param({"imex": {"required": "yes"}}, "imex.required: expected true or false", id="required"),
        pytest.param(
            {"imex": {"required": True}}, "imex.required: true needs imex.channelIDs [0]", id="no-ids"
        ),
        pytest.param({"imex": {"channel": [0]}}, "imex.channel: unknown key", id="unknown-key"),
    ],
)
def test_bad_imex_config_names_the_key(data: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_plugin_config(data, source="c.yaml")
    assert err.value.problems[0].startswith(f"c.yaml: {problem}")


CHANNEL = ImexChannel(
    0, "/dev/nvidia-caps-imex-channels/channel0", "/host/dev/nvidia-caps-imex-channels/channel0"
)


def allocated(data: dict[str, Any], channels: tuple[ImexChannel, ...] = (CHANNEL,)) -> Any:
    config: PluginConfig = dataclasses.replace(parse_plugin_config(data), imex_channels=channels)
    res = build_plan(inventory("gb200-nvl72"), config).by_name()[GPU_RESOURCE]
    return res, allocate(res, [res.devices[1].id], unhealthy={}, config=config)


def test_envvar_strategy_names_the_channel() -> None:
    res, got = allocated({})
    assert got.envs == {VISIBLE_DEVICES: res.devices[1].id, IMEX_CHANNELS: "0"}
    assert not got.cdi_devices
    assert not got.devices
    assert not got.mounts


def test_no_channel_no_injection() -> None:
    _, got = allocated({}, channels=())
    assert IMEX_CHANNELS not in got.envs


def test_cdi_strategy_adds_the_imex_channel_device_of_our_vendor() -> None:
    res, got = allocated(
        {"flags": {"plugin": {"deviceListStrategy": "cdi-cri"}}, "cdi": {"kind": "example.com/gpu"}}
    )
    assert got.cdi_devices == (f"example.com/gpu={res.devices[1].id}", "example.com/imex-channel=0")
    assert IMEX_CHANNELS not in got.envs


def test_volume_mounts_strategy_mounts_the_channel_name() -> None:
    res, got = allocated({"flags": {"plugin": {"deviceListStrategy": "volume-mounts"}}})
    assert got.mounts == (
        Mount(f"/var/run/nvidia-container-devices/{res.devices[1].id}", "/dev/null", read_only=True),
        Mount("/var/run/nvidia-container-devices/imex/0", "/dev/null", read_only=True),
    )
    assert not got.envs


def test_pass_device_specs_adds_a_rw_spec_for_the_channel() -> None:
    res, got = allocated({"flags": {"plugin": {"passDeviceSpecs": True}}})
    minor = res.devices[1].minor_number
    assert got.devices[0] == DeviceSpec(f"/dev/nvidia{minor}", f"/dev/nvidia{minor}", "rw")
    assert got.devices[-1] == DeviceSpec(CHANNEL.path, CHANNEL.host_path, "rw")
    assert DeviceSpec("/dev/nvidiactl", "/dev/nvidiactl", "rw") in got.devices


def test_the_channel_cdi_spec_maps_the_container_path_to_the_node() -> None:
    spec = imex_cdi_spec([CHANNEL], gpu_kind="gpuagent.dev/gpu")
    assert spec == {
        "cdiVersion": "0.5.0",
        "kind": "gpuagent.dev/imex-channel",
        "devices": [
            {
                "name": "0",
                "containerEdits": {
                    "deviceNodes": [
                        {"path": CHANNEL.path, "permissions": "rw", "hostPath": CHANNEL.host_path}
                    ]
                },
            }
        ],
    }
