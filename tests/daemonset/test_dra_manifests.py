"""The DRA deployment: the kustomize component ``daemonset/dra`` (+ ``extended-resource``) and the chart's
``dra.*`` values render the same objects; off by default; the agent's config they write parses."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import parse_health_config
from deviceplugin.config import parse_plugin_config
from deviceplugin.dra.config import parse_dra_config
from tests.daemonset.test_manifests import DAEMONSET, by_key, normalized, render_helm, render_kustomize


def _overlay(tmp_path: Path, *components: str) -> Path:
    shutil.copytree(DAEMONSET, tmp_path / "daemonset")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    listed = ", ".join(f"../daemonset/{c}" for c in components)
    (overlay / "kustomization.yaml").write_text(f"resources: [../daemonset/base]\ncomponents: [{listed}]\n")
    return overlay


@pytest.mark.parametrize(
    ("components", "values"),
    [
        pytest.param(("dra",), ["dra.enabled=true"], id="dra"),
        pytest.param(
            ("dra", "dra/extended-resource"),
            ["dra.enabled=true", "dra.extendedResourceName=nvidia.com/gpu"],
            id="extended-resource",
        ),
        pytest.param(
            ("dra", "dra/imex-channels"),
            ["dra.enabled=true", "dra.imexChannels=true"],
            id="imex-channels",
        ),
    ],
)
def test_chart_renders_the_dra_component(
    deploy_tools: Path, tmp_path: Path, components: tuple[str, ...], values: list[str]
) -> None:
    base = by_key(render_kustomize(deploy_tools, _overlay(tmp_path, *components)))
    chart = by_key(render_helm(deploy_tools, *values))
    base.pop(("Namespace", "", "gpu-system"))
    assert sorted(chart) == sorted(base)
    for k, obj in base.items():
        assert normalized(chart[k]) == normalized(obj), f"{k} differs between the chart and the component"
    device_class = base[("DeviceClass", "", "gpu.gpuagent.dev")]
    extended = device_class["spec"].get("extendedResourceName")
    assert extended == ("nvidia.com/gpu" if "dra/extended-resource" in components else None)


def test_dra_is_off_by_default(deploy_tools: Path) -> None:
    for objs in (render_kustomize(deploy_tools, DAEMONSET / "base"), render_helm(deploy_tools)):
        kinds = {o["kind"] for o in objs}
        assert "DeviceClass" not in kinds
        names = {o["metadata"]["name"] for o in objs}
        assert "gpu-node-agent-dra" not in names
        config = next(o for o in objs if o["metadata"]["name"] == "gpu-node-agent-config")
        assert "dra" not in yaml.safe_load(config["data"]["config.yaml"])


def test_the_component_config_enables_dra_and_parses(deploy_tools: Path, tmp_path: Path) -> None:
    objs = by_key(render_kustomize(deploy_tools, _overlay(tmp_path, "dra")))
    data: dict[str, Any] = yaml.safe_load(
        objs[("ConfigMap", "gpu-system", "gpu-node-agent-config")]["data"]["config.yaml"]
    )
    dra = parse_dra_config(data)
    assert dra.enabled
    assert dra.driver_name == "gpu.gpuagent.dev"
    parse_plugin_config(data)
    parse_health_config(data)
    ds = objs[("DaemonSet", "gpu-system", "gpu-node-agent")]
    mounts = {m["mountPath"] for m in ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert {dra.plugin_dir, dra.registry_dir} <= mounts
    rbac = objs[("ClusterRole", "", "gpu-node-agent-dra")]
    assert {"resourceslices", "resourceclaims"} == {r for rule in rbac["rules"] for r in rule["resources"]}
    # claims: get only (prepare, and at start the claims a channel record names for the node): no list
    # (an agent never reads every claim of the cluster), no write
    (claims,) = [rule for rule in rbac["rules"] if "resourceclaims" in rule["resources"]]
    assert set(claims["verbs"]) == {"get"}


@pytest.mark.parametrize("source", ["kustomize", "helm"])
def test_the_extender_reads_every_dra_kind_it_watches_and_writes_none(
    deploy_tools: Path, source: str
) -> None:
    """Issue 31 item 5: the extender counts GPUs pods get through claims from informers on DRA's kinds
    (``agent.commands.extender.SOURCES``); its role lets it read each of them and write none."""
    from agent.commands.extender import DRA, SOURCES

    objs = by_key(
        render_kustomize(deploy_tools, DAEMONSET / "base")
        if source == "kustomize"
        else render_helm(deploy_tools)
    )
    role = objs[("ClusterRole", "", "gpu-topology-extender")]
    verbs: dict[str, set[str]] = {}
    for rule in role["rules"]:
        if "resource.k8s.io" in rule["apiGroups"]:
            for res in rule["resources"]:
                verbs.setdefault(res, set()).update(rule["verbs"])
    watched = {path.removeprefix(DRA) for _, path, _ in SOURCES if path.startswith(DRA)}
    assert watched == {"resourceclaims", "resourceclaimtemplates", "deviceclasses", "resourceslices"}
    assert verbs == {key: {"get", "list", "watch"} for key in watched}


def _agent(objs: dict[tuple[str, str, str], dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = objs[("DaemonSet", "gpu-system", "gpu-node-agent")]["spec"]["template"]["spec"]
    return spec, spec["containers"][0]


@pytest.mark.parametrize("source", ["kustomize", "helm"])
def test_imex_channels_mount_the_hosts_channel_directory_at_its_path_and_add_only_mknod(
    deploy_tools: Path, tmp_path: Path, source: str
) -> None:
    """Issue 31 item 3: the driver makes each gang's channel device node under its dev root (``/dev``)
    and writes CDI specs naming that path, which the container runtime reads on the host: the host's
    channel directory is mounted at the same path, and MKNOD is the one capability added, only then."""
    from deviceplugin.imex import CHANNEL_DIR

    def render(imex: bool) -> dict[tuple[str, str, str], dict[str, Any]]:
        if source == "kustomize":
            components = ("dra", "dra/imex-channels") if imex else ("dra",)
            return by_key(render_kustomize(deploy_tools, _overlay(tmp_path / str(imex), *components)))
        return by_key(
            render_helm(deploy_tools, "dra.enabled=true", *(["dra.imexChannels=true"] if imex else []))
        )

    objs = render(True)
    spec, agent = _agent(objs)
    config = yaml.safe_load(objs[("ConfigMap", "gpu-system", "gpu-node-agent-config")]["data"]["config.yaml"])
    dra = parse_dra_config(config)
    assert (dra.imex_channels, dra.imex_namespace) == (True, "gpu-system")
    assert "devRoot" not in config  # /dev: the CDI specs' host paths are the host's own
    path = f"/dev/{CHANNEL_DIR}"
    (mount,) = [m for m in agent["volumeMounts"] if m["mountPath"] == path]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"] == {"path": path, "type": "DirectoryOrCreate"}
    assert not mount.get("readOnly")
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["MKNOD"]}
    assert agent["securityContext"]["allowPrivilegeEscalation"] is False
    # without IMEX channels: no channel directory, no capability added
    spec, agent = _agent(render(False))
    assert all(m["mountPath"] != path for m in agent["volumeMounts"])
    assert "add" not in agent["securityContext"]["capabilities"]
