"""The DRA component on the real API server: every object passes server-side dry-run (the DeviceClass with
``extendedResourceName`` too), and with the agent's pod-bound token the RBAC and the admission policy let
an agent write its own node's ResourceSlices of its driver and nothing else."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import dynamic

from agent import localcluster as cluster
from tests.e2e.test_deployment_e2e import (
    MANAGER,
    NAMESPACE,
    REPO,
    agent_on,
    apply,
    delete,
    kustomize_objects,
    status_of,
)

pytestmark = pytest.mark.e2e


def component_objects(tmp: Path) -> list[dict[str, Any]]:
    kustomize_objects()  # builds the tools once
    tools = Path(
        subprocess.run(
            ["bash", str(REPO / "tests" / "e2e" / "deploytools" / "build.sh")],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    shutil.copytree(REPO / "daemonset", tmp / "daemonset")
    (tmp / "overlay").mkdir()
    (tmp / "overlay" / "kustomization.yaml").write_text(
        "resources: [../daemonset/base]\ncomponents: [../daemonset/dra, ../daemonset/dra/extended-resource]\n"
    )
    out = subprocess.run(
        [str(tools / "kustomize"), "build", str(tmp / "overlay")], capture_output=True, text=True, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def dra_installed(
    api_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dynamic.DynamicClient, list[dict[str, Any]]]]:
    objs = component_objects(tmp_path_factory.mktemp("dra-deploy"))
    dyn = dynamic.DynamicClient(api_client)
    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    cluster.apply_crds(api_client, crds)
    wanted = [o for o in objs if o["kind"] == "Namespace"]
    wanted += [o for o in objs if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == MANAGER]
    wanted += [o for o in objs if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "dra"]
    for obj in wanted:
        apply(dyn, obj)
    try:
        yield dyn, objs
    finally:
        for obj in reversed(wanted):
            if obj["kind"] != "Namespace":
                delete(dyn, obj)


def _slice(node: str, driver: str = "gpu.gpuagent.dev") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-0"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"nvlinkDomain": {"string": "x.1"}}}],
        },
    }


def test_every_dra_object_passes_server_side_dry_run(
    dra_installed: tuple[dynamic.DynamicClient, list[dict[str, Any]]],
) -> None:
    dyn, objs = dra_installed
    kinds = set()
    for obj in objs:
        reply = apply(dyn, obj, dry_run=True)
        assert reply.metadata.name == obj["metadata"]["name"]
        kinds.add(obj["kind"])
    assert "DeviceClass" in kinds


def test_an_agent_writes_only_its_own_nodes_slices(
    dra_installed: tuple[dynamic.DynamicClient, list[dict[str, Any]]],
    api_client: Any,
    gpu_nodes: Callable[..., list[str]],
    e2e_test_label: str,
) -> None:
    dyn, _ = dra_installed
    mine, other = gpu_nodes(["dra-adm-a", "dra-adm-b"], gpus=4)
    with agent_on(api_client, mine, e2e_test_label) as agent:
        agent_dyn = dynamic.DynamicClient(agent)

        def denied() -> bool:
            return status_of(lambda: apply(agent_dyn, _slice(other), dry_run=True))[0] == 403

        try:
            cluster.wait_until(denied, what="the policy to deny another node's ResourceSlice", timeout_s=60)
            code, body = status_of(lambda: apply(agent_dyn, _slice(other)))
            assert code == 403
            assert f"node {mine} may not modify ResourceSlice" in body
            code, body = status_of(lambda: apply(agent_dyn, _slice(mine, "other.example.com")))
            assert code == 403
            assert "ResourceSlices of driver other.example.com" in body
            assert status_of(lambda: apply(agent_dyn, _slice(mine)))[0] == 200
            assert status_of(lambda: delete(agent_dyn, _slice(mine)))[0] == 200
            # getting a claim is granted (404: none by that name; prepare, and the claims a channel record
            # names at start); listing claims (O(cluster) per agent) or writing them is not
            claims = agent_dyn.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")
            assert status_of(lambda: claims.get(name="nope", namespace=NAMESPACE))[0] == 404
            assert status_of(lambda: claims.get(namespace=NAMESPACE))[0] == 403
            assert status_of(lambda: claims.delete(name="nope", namespace=NAMESPACE))[0] == 403
        finally:
            for node in (mine, other):
                delete(dyn, _slice(node))
