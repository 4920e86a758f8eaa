"""The kustomize base and the Helm chart describe the same objects, and both are well formed."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.commands.extender import parse_settings
from agent.localcluster import versions
from agent.simnode import open_simulated_node
from scheduler_plugin.extender import GANG_PLANNED, SCHEDULER_NAME
from scheduler_plugin.queue import RESERVED_FOR, QueueConfig
from tests.agent.test_imexmanage import settings
from tests.daemonset.conftest import REPO
from tests.topology.factories import ib_port, nvl72_tray
from topology.labels import MIG_STRATEGIES, node_labels

DAEMONSET = REPO / "daemonset"


def render_kustomize(tools: Path, path: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(tools / "kustomize"), "build", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def render_helm(tools: Path, *values: str) -> list[dict[str, Any]]:
    args = [
        str(tools / "helm"),
        "template",
        "gna",
        str(DAEMONSET / "chart" / "gpu-node-agent"),
        "--kube-version",
        "1.34.0",
    ]
    args += ["--namespace", "gpu-system", "--include-crds"]
    for v in values:
        args += ["--set", v]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def normalized(obj: dict[str, Any]) -> dict[str, Any]:
    """Compares embedded YAML files (ConfigMap data) by content, not by layout."""
    if obj.get("kind") != "ConfigMap":
        return obj
    data = {k: yaml.safe_load(v) if k.endswith(".yaml") else v for k, v in obj.get("data", {}).items()}
    return {**obj, "data": data}


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return (obj["kind"], meta.get("namespace", ""), meta["name"])


def by_key(objs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {key(o): o for o in objs}


def test_helm_defaults_render_the_kustomize_base(deploy_tools: Path) -> None:
    base = by_key(render_kustomize(deploy_tools, DAEMONSET / "base"))
    chart = by_key(render_helm(deploy_tools))
    # Helm installs into an existing namespace (helm install --create-namespace); the base creates it.
    base.pop(("Namespace", "", "gpu-system"))
    assert sorted(chart) == sorted(base)
    for k, obj in base.items():
        assert normalized(chart[k]) == normalized(obj), (
            f"{k} differs between the Helm chart and the kustomize base"
        )


def test_chart_crd_is_the_same_file_as_the_base_crd() -> None:
    base = (DAEMONSET / "crds" / "gpunode.yaml").read_text()
    chart = (DAEMONSET / "chart" / "gpu-node-agent" / "crds" / "gpunode.yaml").read_text()
    assert chart == base, "run: cp daemonset/crds/gpunode.yaml daemonset/chart/gpu-node-agent/crds/"


@pytest.mark.parametrize(
    ("values", "check"),
    [
        (
            ["agent.migStrategy=mixed"],
            lambda objs: (
                "migStrategy: mixed"
                in objs[("ConfigMap", "gpu-system", "gpu-node-agent-config")]["data"]["config.yaml"]
            ),
        ),
        (
            ["agent.metricsFormat=dcgm"],
            lambda objs: (
                "--metrics-format=dcgm"
                in objs[("DaemonSet", "gpu-system", "gpu-node-agent")]["spec"]["template"]["spec"][
                    "containers"
                ][0]["args"]
            ),
        ),
        (
            ["image.repository=registry.local/gna", "image.tag=9.9"],
            lambda objs: (
                objs[("DaemonSet", "gpu-system", "gpu-node-agent")]["spec"]["template"]["spec"]["containers"][
                    0
                ]["image"]
                == "registry.local/gna:9.9"
            ),
        ),
        (
            ["agent.nodeSelector.pool=gpu"],
            lambda objs: (
                objs[("DaemonSet", "gpu-system", "gpu-node-agent")]["spec"]["template"]["spec"][
                    "nodeSelector"
                ]["pool"]
                == "gpu"
            ),
        ),
        (
            [
                "agent.sharing.timeSlicing.resources[0].name=nvidia.com/gpu",
                "agent.sharing.timeSlicing.resources[0].replicas=4",
            ],
            lambda objs: (
                yaml.safe_load(
                    objs[("ConfigMap", "gpu-system", "gpu-node-agent-config")]["data"]["config.yaml"]
                )["sharing"]
                == {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}
            ),
        ),
        (
            ["extender.enabled=false"],
            lambda objs: not any("extender" in k[2] or "scheduler" in k[2] for k in objs),
        ),
        (
            ["agent.sharedGpuSplit=true"],
            lambda objs: (
                objs[("DaemonSet", "gpu-system", "gpu-node-agent")]["spec"]["template"]["spec"]["hostPID"]
                is True
                and any(
                    m["mountPath"] == "/var/log/pods" and m["readOnly"]
                    for m in objs[("DaemonSet", "gpu-system", "gpu-node-agent")]["spec"]["template"]["spec"][
                        "containers"
                    ][0]["volumeMounts"]
                )
            ),
        ),
        (
            ["podMonitor.enabled=true"],
            lambda objs: ("PodMonitor", "gpu-system", "gpu-node-agent") in objs,
        ),
        (
            [
                "extender.preemptAfter=never",
                "extender.preemptLossRatio=any",
                "extender.minRunBeforePreempt=300",
                "extender.maxEvictions=unlimited",
            ],
            lambda objs: (
                parse_settings(
                    next(
                        c
                        for c in objs[("Deployment", "gpu-system", "gpu-topology-scheduler")]["spec"][
                            "template"
                        ]["spec"]["containers"]
                        if c["name"] == "extender"
                    )["args"][1:]
                ).queue_config()
                == QueueConfig(
                    preempt_after_s=None,
                    preempt_loss_ratio=None,
                    min_run_before_preempt_s=300,
                    max_evictions=None,
                )
            ),
        ),
        (
            ["extender.preemptNamespaces=ml\\,batch"],
            lambda objs: (
                parse_settings(
                    next(
                        c
                        for c in objs[("Deployment", "gpu-system", "gpu-topology-scheduler")]["spec"][
                            "template"
                        ]["spec"]["containers"]
                        if c["name"] == "extender"
                    )["args"][1:]
                ).preempt_namespaces
                == frozenset({"ml", "batch"})
            ),
        ),
        (
            ["extender.enforceTimeLimits=all", "extender.timeLimitGrace=15"],
            lambda objs: (
                (
                    (
                        s := parse_settings(
                            next(
                                c
                                for c in objs[("Deployment", "gpu-system", "gpu-topology-scheduler")]["spec"][
                                    "template"
                                ]["spec"]["containers"]
                                if c["name"] == "extender"
                            )["args"][1:]
                        )
                    ).enforce_time_limits,
                    s.time_limit_grace_s,
                )
                == ("all", 15.0)
            ),
        ),
    ],
    ids=[
        "mig-strategy",
        "metrics-format",
        "image",
        "node-selector",
        "sharing",
        "no-extender",
        "shared-gpu-split",
        "pod-monitor",
        "extender-queue",
        "extender-preempt-namespaces",
        "extender-time-limits",
    ],
)
def test_helm_values_reach_the_objects(deploy_tools: Path, values: list[str], check: Any) -> None:
    assert check(by_key(render_helm(deploy_tools, *values)))


def test_every_agent_write_is_pinned_by_the_admission_policy(deploy_tools: Path) -> None:
    objs = by_key(render_kustomize(deploy_tools, DAEMONSET / "base"))
    role = objs[("ClusterRole", "", "gpu-node-agent")]
    policies = [
        objs[("ValidatingAdmissionPolicy", "", name)]
        for name in ("gpu-node-agent-own-node-only", "gpu-node-agent-own-events")
    ]
    written = {
        res
        for rule in role["rules"]
        if set(rule["verbs"]) & {"create", "update", "patch", "delete"}
        for res in rule["resources"]
    }
    pinned = {
        res
        for policy in policies
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
        for res in rule["resources"]
    }
    assert written <= pinned
    for policy in policies:
        binding = objs[("ValidatingAdmissionPolicyBinding", "", policy["metadata"]["name"])]
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert policy["spec"]["failurePolicy"] == "Fail"


def owned_label_pattern() -> re.Pattern[str]:
    """The policy's ``owned`` variable (a CEL string literal) as the RE2 pattern CEL matches with."""
    docs = yaml.safe_load_all((DAEMONSET / "base" / "admission-policy.yaml").read_text(encoding="utf-8"))
    policy = next(d for d in docs if d["metadata"]["name"] == "gpu-node-agent-own-node-only")
    literal = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "owned")
    assert literal.startswith("'^")
    assert literal.endswith("$'")
    return re.compile(literal[1:-1].replace("\\\\", "\\"))


def every_published_label_key() -> set[str]:
    """Every label key the agent's publisher writes, over every simulated machine and setting."""
    keys: set[str] = set()
    for spec in ("dgx-h100", "hgx-h200", "gb200-nvl72", "dgx-a100-mig", "dgx1-v100", "pcie-l40s"):
        with open_simulated_node(spec) as node:
            node.nvml.init()
            inventory = node.discover()
        # one MIG layout per node, so that "single" applies: every GPU cut the way the first uniform one is
        uniform = [s for s in inventory.mig if len({d.profile for d in s.devices}) == 1 and s.devices]
        same = tuple(dataclasses.replace(s, gpu_index=g.index) for s in uniform[:1] for g in inventory.gpus)
        variants = [inventory, dataclasses.replace(inventory, mig=same)]
        if spec == "gb200-nvl72":  # ports whose switch is known (the ib-leaf label)
            port = ib_port("mlx5_0", node_guid="0x0002c90300000001", switch_guid="0x0002c90300000002")
            variants.append(nvl72_tray("t", ports=(port,)))
        for inv in variants:
            for mig in MIG_STRATEGIES:
                for sharing, replicas in (("none", 1), ("time-slicing", 4), ("mps", 2)):
                    keys |= set(
                        node_labels(
                            inv,
                            node_name="n",
                            mig_strategy=mig,
                            sharing_strategy=sharing,
                            replicas=replicas,
                            imex="ready",
                        )
                    )
    return keys


def test_the_admission_policy_lets_the_agent_write_every_label_it_publishes() -> None:
    pattern = owned_label_pattern()
    keys = every_published_label_key()
    assert sorted(k for k in keys if not pattern.search(k)) == []
    # the families are all there (a machine or setting lost from the loop above would hide a key)
    for key in (
        "nvidia.com/gpu.clique",
        "nvidia.com/gpu.slices.gi",
        "nvidia.com/gpu.multiprocessors",
        "nvidia.com/mig-1g.10gb.count",
        "nvidia.com/mig.capable",
        "nvidia.com/cuda.runtime-version.full",
        "gpuagent.dev/nvlink-domain",
        "gpuagent.dev/ib-leaf",
    ):
        assert key in keys


@pytest.mark.parametrize(
    "key",
    [
        "fabric.topograph.run/tier-0",
        "accelerator.topograph.run/domain",
        "network.topology.nvidia.com/leaf",
        "kubernetes.io/hostname",
        "node-role.kubernetes.io/control-plane",
        "node.kubernetes.io/exclude-from-external-load-balancers",
        "topology.kubernetes.io/zone",
        "nvidia.com/gpu.deploy.driver",
        "nvidia.com/mig.config",
        "nvidia.com/mig.config.state",
        "nvidia.com/gpu.workload.config",
        "nvidia.com/gpu.present.extra",
        "nvidia.com/gpu",
        "gpuagent.dev/topology-spine",
        "gpuagent.dev/spine-domain",
        "gpuagent.dev/reserved-for",
        "gpuagent.dev/e2e-test",
        "xgpuagent.dev/nvlink-domain",
    ],
)
def test_the_admission_policy_keeps_the_agent_off_labels_of_other_owners(key: str) -> None:
    assert owned_label_pattern().search(key) is None


def pod_specs(objs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    out = {}
    for obj in objs:
        if obj["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
            out[key(obj)] = obj["spec"]["template"]["spec"]
        elif obj["kind"] == "Pod":
            out[key(obj)] = obj["spec"]
    return out


def test_every_pod_runs_with_the_runtime_default_seccomp_profile(deploy_tools: Path) -> None:
    renders = {
        "kustomize": render_kustomize(deploy_tools, DAEMONSET / "base"),
        "helm": render_helm(deploy_tools, "agent.sharedGpuSplit=true", "podMonitor.enabled=true"),
    }
    for name, objs in renders.items():
        pods = pod_specs(objs)
        # the extender may run in its own Deployment or inside the scheduler's pod
        assert {k[2] for k in pods} >= {"gpu-node-agent", "gpu-topology-controller", "gpu-topology-scheduler"}
        for k, pod in pods.items():
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, (name, k)
            for ctr in pod["containers"] + pod.get("initContainers", []):
                override = (ctr.get("securityContext") or {}).get("seccompProfile")
                assert override in (None, {"type": "RuntimeDefault"}), (name, k, ctr["name"])


def test_agent_daemonset_least_privilege(deploy_tools: Path) -> None:
    ds = by_key(render_kustomize(deploy_tools, DAEMONSET / "base"))[
        ("DaemonSet", "gpu-system", "gpu-node-agent")
    ]
    pod = ds["spec"]["template"]["spec"]
    ctr = pod["containers"][0]
    assert pod["priorityClassName"] == "system-node-critical"
    assert ctr["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert ctr["securityContext"]["allowPrivilegeEscalation"] is False
    assert not ctr["securityContext"].get("privileged", False)
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    assert mounts["/host/sys"]["readOnly"] is True
    assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] is True
    assert {"NODE_NAME"} <= {e["name"] for e in ctr["env"]}
    assert ctr["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert ctr["readinessProbe"]["httpGet"]["path"] == "/readyz"


def _agent_container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    ds = by_key(objs)[("DaemonSet", "gpu-system", "gpu-node-agent")]
    container: dict[str, Any] = ds["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(
    ("source", "health_port"),
    [pytest.param("kustomize", 9401, id="base"), pytest.param("helm", 9555, id="chart-health-port")],
)
def test_agent_probes_use_the_health_listener(deploy_tools: Path, source: str, health_port: int) -> None:
    """kubelet's probes go to the --health-addr listener (its own connections), never the metrics port
    that any pod can fill (issue 16, D13); it listens on the pod's addresses, where kubelet probes."""
    objs = (
        render_kustomize(deploy_tools, DAEMONSET / "base")
        if source == "kustomize"
        else render_helm(deploy_tools, f"agent.healthPort={health_port}")
    )
    ctr = _agent_container(objs)
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    assert ports == {"metrics": 9400, "health": health_port}
    assert f"--health-addr=0.0.0.0:{health_port}" in ctr["args"]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert ctr[probe]["httpGet"] == {"path": path, "port": "health"}
        assert ctr[probe]["timeoutSeconds"] == 1


@pytest.mark.parametrize(
    "values", [[], ["extender.port=9999", "extender.healthPort=9998"]], ids=["base", "ports"]
)
def test_extender_runs_beside_kube_scheduler_on_loopback(deploy_tools: Path, values: list[str]) -> None:
    from urllib.parse import urlparse

    from agent.commands.extender import parse_settings

    objs = by_key(
        render_kustomize(deploy_tools, DAEMONSET / "base")
        if not values
        else render_helm(deploy_tools, *values)
    )
    # no Deployment, Service or service account of its own: nothing outside the scheduler pod reaches it
    assert not [
        k
        for k in objs
        if k[2] == "gpu-topology-extender" and k[0] in ("Deployment", "Service", "ServiceAccount")
    ]
    pod = objs[("Deployment", "gpu-system", "gpu-topology-scheduler")]["spec"]["template"]["spec"]
    ctrs = {c["name"]: c for c in pod["containers"]}
    assert set(ctrs) == {"kube-scheduler", "extender"}
    ext = ctrs["extender"]
    settings = parse_settings(ext["args"][1:])  # the command's own check: loopback, or TLS
    assert settings.host == "127.0.0.1"
    assert not settings.tls
    ports = {p["name"]: p["containerPort"] for p in ext["ports"]}
    assert ports == {"extender-health": settings.health_port}  # only the health listener is a pod port
    assert ext["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "extender-health"}
    assert ext["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "extender-health"}
    assert ext["securityContext"]["allowPrivilegeEscalation"] is False
    config = yaml.safe_load(
        objs[("ConfigMap", "gpu-system", "gpu-topology-scheduler-config")]["data"]["config.yaml"]
    )
    (entry,) = config["extenders"]
    url = urlparse(entry["urlPrefix"])
    assert (url.scheme, url.hostname, url.port) == ("http", "127.0.0.1", settings.port)
    assert entry["bindVerb"] == "bind"
    # its permissions go to the pod's service account
    binding = objs[("ClusterRoleBinding", "", "gpu-topology-extender")]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-topology-scheduler", "namespace": "gpu-system"}
    ]
    assert pod["serviceAccountName"] == "gpu-topology-scheduler"


EXTENDER_POLICY = "gpu-topology-extender-annotations-only"


def _variables(policy: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


@pytest.mark.parametrize("source", ["kustomize", "helm"])
def test_every_extender_write_is_pinned_by_its_admission_policy(deploy_tools: Path, source: str) -> None:
    """Issue 26 item 11: the extender's ClusterRole patches any Node and Pod; a policy bound to the pod's
    service account lets through only the two annotations the extender writes (tested on the real API
    server in tests/e2e/test_deployment_e2e.py)."""
    objs = by_key(
        render_kustomize(deploy_tools, DAEMONSET / "base")
        if source == "kustomize"
        else render_helm(deploy_tools)
    )
    role = objs[("ClusterRole", "", "gpu-topology-extender")]
    written = {
        res
        for rule in role["rules"]
        if "" in rule["apiGroups"] and set(rule["verbs"]) & {"create", "update", "patch", "delete"}
        for res in rule["resources"]
        if "/" not in res and res != "events"  # subresources (binding, eviction) are not object writes
    }
    assert written == {"nodes", "pods"}
    policy = objs[("ValidatingAdmissionPolicy", "", EXTENDER_POLICY)]
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    matched = {res: set(rule["operations"]) for rule in rules for res in rule["resources"]}
    # a patch may update and, as a server-side apply, create; DELETE of pods is kube-scheduler's preemption
    assert matched == {"nodes": {"CREATE", "UPDATE", "DELETE"}, "pods": {"CREATE", "UPDATE"}}
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = objs[("ValidatingAdmissionPolicyBinding", "", EXTENDER_POLICY)]
    assert binding["spec"] == {"policyName": EXTENDER_POLICY, "validationActions": ["Deny"]}
    # it matches exactly the service account the role is bound to, the one the scheduler pod runs as
    (subject,) = objs[("ClusterRoleBinding", "", "gpu-topology-extender")]["subjects"]
    user = f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{user}'"
    pod = objs[("Deployment", "gpu-system", "gpu-topology-scheduler")]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == subject["name"]
    # the annotations allowed are the ones the extender writes, on the pods of its own scheduler
    variables = _variables(policy)
    assert variables["owned"] == f"variables.isNode ? '{RESERVED_FOR}' : '{GANG_PLANNED}'"
    extender = next(c for c in pod["containers"] if c["name"] == "extender")
    assert variables["scheduler"] == f"'{parse_settings(extender['args'][1:]).scheduler_name}'"
    config = yaml.safe_load(
        objs[("ConfigMap", "gpu-system", "gpu-topology-scheduler-config")]["data"]["config.yaml"]
    )
    assert [p["schedulerName"] for p in config["profiles"]] == [SCHEDULER_NAME]


@pytest.mark.parametrize("values", [["admissionPolicy.enabled=false"], ["extender.enabled=false"]])
def test_chart_renders_the_extender_policy_only_with_the_extender(
    deploy_tools: Path, values: list[str]
) -> None:
    kinds = {k[0] for k in by_key(render_helm(deploy_tools, *values)) if k[2] == EXTENDER_POLICY}
    assert kinds == set()


def test_kube_scheduler_image_is_the_tested_release(deploy_tools: Path) -> None:
    """Issue 26 item 24: the second kube-scheduler the manifests deploy is the release every test runs
    the extender behind (K8S_VERSION in tests/e2e/counterparts/versions.env)."""
    tested = versions()["K8S_VERSION"]
    values = yaml.safe_load(
        (DAEMONSET / "chart" / "gpu-node-agent" / "values.yaml").read_text(encoding="utf-8")
    )
    assert values["scheduler"]["image"] == f"registry.k8s.io/kube-scheduler:{tested}"
    for objs in (render_kustomize(deploy_tools, DAEMONSET / "base"), render_helm(deploy_tools)):
        pod = by_key(objs)[("Deployment", "gpu-system", "gpu-topology-scheduler")]["spec"]["template"]["spec"]
        images = {c["name"]: c["image"] for c in pod["containers"]}
        assert images["kube-scheduler"] == f"registry.k8s.io/kube-scheduler:{tested}"


def _agent_config(objs: list[dict[str, Any]]) -> dict[str, Any]:
    cm = by_key(objs)[("ConfigMap", "gpu-system", "gpu-node-agent-config")]
    config: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return config


@pytest.mark.parametrize(
    ("source", "values", "writable"),
    [
        pytest.param("kustomize", [], False, id="base"),
        pytest.param("helm", [], False, id="chart"),
        pytest.param("helm", ["agent.imex.manage=true"], True, id="chart-manage"),
    ],
)
def test_agent_mounts_the_hosts_imex_ctl_read_only_and_its_config_dir_writable_only_when_managed(
    deploy_tools: Path, source: str, values: list[str], writable: bool, tmp_path: Path
) -> None:
    objs = (
        render_kustomize(deploy_tools, DAEMONSET / "base")
        if source == "kustomize"
        else render_helm(deploy_tools, *values)
    )
    ctr = _agent_container(objs)
    pod = by_key(objs)[("DaemonSet", "gpu-system", "gpu-node-agent")]["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["/host/usr/bin"]["readOnly"] is True
    assert volumes[mounts["/host/usr/bin"]["name"]]["hostPath"] == {"path": "/usr/bin", "type": "Directory"}
    assert mounts["/etc/nvidia-imex"]["readOnly"] is (not writable)
    assert volumes[mounts["/etc/nvidia-imex"]["name"]]["hostPath"]["path"] == "/etc/nvidia-imex"
    config = _agent_config(objs)
    assert config["imex"]["ctl"] == "/host/usr/bin/nvidia-imex-ctl"  # the host's binary, through the mount
    assert bool(config["imex"].get("manage")) is writable
    assert bool(pod.get("hostNetwork")) is writable  # the child daemon serves its peers on the node address
    # the rendered config is one the agent accepts
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    got = settings([], config=cfg).imex
    assert got.manage is writable
    assert got.ctl == "/host/usr/bin/nvidia-imex-ctl"
    if writable:
        assert (got.daemon, got.command[0]) == ("child", "/host/usr/bin/nvidia-imex")


def test_controller_may_write_nvlinkdomains_and_hypernode_status_and_serves_metrics(
    deploy_tools: Path,
) -> None:
    objs = by_key(render_kustomize(deploy_tools, DAEMONSET / "base"))
    role = objs[("ClusterRole", "", "gpu-topology-controller")]
    allowed = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert {"create", "patch", "delete", "watch"} <= allowed[("topology.gpuagent.dev", "nvlinkdomains")]
    assert "patch" in allowed[("topology.gpuagent.dev", "nvlinkdomains/status")]
    assert "patch" in allowed[("topology.volcano.sh", "hypernodes/status")]
    assert {"list", "watch"} <= allowed[("", "pods")]
    ctr = objs[("Deployment", "gpu-system", "gpu-topology-controller")]["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert "--metrics-addr=0.0.0.0:9402" in ctr["args"]
    crds = {o["metadata"]["name"] for o in render_kustomize(deploy_tools, DAEMONSET / "crds")}
    assert "nvlinkdomains.topology.gpuagent.dev" in crds
