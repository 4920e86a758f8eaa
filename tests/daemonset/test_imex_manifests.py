"""IMEX channels for the device plugin (NVIDIA's ``imex.channelIDs`` / ``imex.required``) in the deployment:
the chart's ``agent.imex.channelIDs`` / ``agent.imex.required`` and the kustomize component
``daemonset/imex-channel`` render the same objects; the agent reads what they set; the host's channel
directory is mounted at its own path, read-only unless DRA's per-job channels need it writable."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.imex import CHANNEL_DIR
from tests.agent.test_imexmanage import settings
from tests.daemonset.test_dra_manifests import _overlay
from tests.daemonset.test_manifests import DAEMONSET, by_key, normalized, render_helm, render_kustomize

Objects = dict[tuple[str, str, str], dict[str, Any]]
CHANNEL_PATH = f"/dev/{CHANNEL_DIR}"


def _agent(objs: Objects) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = objs[("DaemonSet", "gpu-system", "gpu-node-agent")]["spec"]["template"]["spec"]
    return spec, spec["containers"][0]


def _imex_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("IMEX_")}


def _channel_mount(objs: Objects) -> tuple[dict[str, Any], dict[str, Any]] | None:
    spec, agent = _agent(objs)
    mounts = [m for m in agent["volumeMounts"] if m["mountPath"] == CHANNEL_PATH]
    if not mounts:
        return None
    (mount,) = mounts
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    return mount, volume


@pytest.mark.parametrize(
    ("components", "values"),
    [
        pytest.param(("imex-channel",), ["agent.imex.channelIDs={0}"], id="channel-0"),
        pytest.param(
            ("dra", "imex-channel", "dra/imex-channels"),
            ["agent.imex.channelIDs={0}", "dra.enabled=true", "dra.imexChannels=true"],
            id="with-dra-channels",
        ),
    ],
)
def test_chart_renders_the_imex_channel_component(
    deploy_tools: Path, tmp_path: Path, components: tuple[str, ...], values: list[str]
) -> None:
    base = by_key(render_kustomize(deploy_tools, _overlay(tmp_path, *components)))
    chart = by_key(render_helm(deploy_tools, *values))
    base.pop(("Namespace", "", "gpu-system"))
    assert sorted(chart) == sorted(base)
    for k, obj in base.items():
        assert normalized(chart[k]) == normalized(obj), f"{k} differs between the chart and the component"


@pytest.mark.parametrize(
    ("source", "values", "required"),
    [
        pytest.param("kustomize", [], False, id="component"),
        pytest.param("helm", ["agent.imex.channelIDs={0}"], False, id="chart"),
        pytest.param(
            "helm", ["agent.imex.channelIDs={0}", "agent.imex.required=true"], True, id="chart-required"
        ),
    ],
)
def test_channel_ids_reach_the_agent_and_the_hosts_channel_directory_is_mounted_read_only(
    deploy_tools: Path, tmp_path: Path, source: str, values: list[str], required: bool
) -> None:
    objs = by_key(
        render_kustomize(deploy_tools, _overlay(tmp_path, "imex-channel"))
        if source == "kustomize"
        else render_helm(deploy_tools, *values)
    )
    _, agent = _agent(objs)
    env = _imex_env(agent)
    assert env == {"IMEX_CHANNEL_IDS": "0", "IMEX_REQUIRED": str(required).lower()}
    imex = settings([], env=env).plugin.imex  # what the agent makes of them
    assert (imex.channel_ids, imex.required) == ((0,), required)
    found = _channel_mount(objs)
    assert found is not None, "the host's channel directory is not mounted"
    mount, volume = found
    # the agent looks under /dev (its default dev root) and names the host's path to the runtime
    assert settings([], env=env).dev_root in (None, Path("/dev"))
    assert volume["hostPath"] == {"path": CHANNEL_PATH, "type": "DirectoryOrCreate"}
    assert mount["readOnly"] is True
    # nothing more than the device plugin needs: no capability, no other mount or volume than the base's
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    base_spec, base_agent = _agent(by_key(render_kustomize(deploy_tools, DAEMONSET / "base")))
    assert [m for m in agent["volumeMounts"] if m is not mount] == base_agent["volumeMounts"]
    spec, _ = _agent(objs)
    assert [v for v in spec["volumes"] if v is not volume] == base_spec["volumes"]


@pytest.mark.parametrize("source", ["kustomize", "helm"])
def test_no_channel_ids_no_imex_env_and_no_channel_directory(deploy_tools: Path, source: str) -> None:
    objs = by_key(
        render_kustomize(deploy_tools, DAEMONSET / "base")
        if source == "kustomize"
        else render_helm(deploy_tools)
    )
    _, agent = _agent(objs)
    assert _imex_env(agent) == {}
    assert _channel_mount(objs) is None


@pytest.mark.parametrize("source", ["kustomize", "helm"])
def test_with_dras_channels_too_the_directory_is_mounted_once_and_writable(
    deploy_tools: Path, tmp_path: Path, source: str
) -> None:
    """DRA's per-job channels make device nodes in the same directory (MKNOD): one mount, writable."""
    objs = by_key(
        render_kustomize(deploy_tools, _overlay(tmp_path, "dra", "imex-channel", "dra/imex-channels"))
        if source == "kustomize"
        else render_helm(
            deploy_tools, "agent.imex.channelIDs={0}", "dra.enabled=true", "dra.imexChannels=true"
        )
    )
    spec, agent = _agent(objs)
    assert [m["mountPath"] for m in agent["volumeMounts"]].count(CHANNEL_PATH) == 1
    assert [v["name"] for v in spec["volumes"]].count("imex-channels") == 1
    found = _channel_mount(objs)
    assert found is not None
    assert found[0]["readOnly"] is False
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["MKNOD"]}
    assert _imex_env(agent) == {"IMEX_CHANNEL_IDS": "0", "IMEX_REQUIRED": "false"}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(
            ["agent.imex.channelIDs={1}"], "agent.imex.channelIDs: [1] is not [] or [0]", id="channel-1"
        ),
        pytest.param(
            ["agent.imex.channelIDs={0,1}"],
            "agent.imex.channelIDs: [0,1] is not [] or [0]",
            id="two-channels",
        ),
        pytest.param(
            ["agent.imex.required=true"],
            "agent.imex.required: true needs agent.imex.channelIDs [0]",
            id="required",
        ),
    ],
)
def test_the_chart_refuses_what_the_agent_would_refuse(
    deploy_tools: Path, values: list[str], expected: str
) -> None:
    args = [str(deploy_tools / "helm"), "template", "gna", str(DAEMONSET / "chart" / "gpu-node-agent")]
    args += ["--kube-version", "1.34.0", "--namespace", "gpu-system"]
    for v in values:
        args += ["--set", v]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert expected in done.stderr
