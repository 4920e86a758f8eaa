"""The operator launchers of ``agent.localcluster`` (vc-controller-manager, KubeRay, Kueue) and the
control plane's feature-gate options, as far as they run without the built counterparts."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from agent import localcluster as cluster

APISERVER: Any = None  # never reached: the binary is looked up first


def _manifest() -> list[dict[str, Any]]:
    """A cut-down copy of the shape of Kueue's published webhook manifest."""

    def hook(name: str, group: str, resource: str, path: str) -> dict[str, Any]:
        return {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "rules": [
                {
                    "apiGroups": [group],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": [resource],
                }
            ],
        }

    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "mutating-webhook-configuration"},
            "webhooks": [
                hook("mjob.kb.io", "batch", "jobs", "/mutate-batch-v1-job"),
                hook("mpod.kb.io", "", "pods", "/mutate--v1-pod"),
                hook("mraycluster.kb.io", "ray.io", "rayclusters", "/mutate-ray-io-v1-raycluster"),
                hook("mrayjob.kb.io", "ray.io", "rayjobs", "/mutate-ray-io-v1-rayjob"),
                hook(
                    "mworkload.kb.io",
                    "kueue.x-k8s.io",
                    "workloads",
                    "/mutate-kueue-x-k8s-io-v1beta2-workload",
                ),
            ],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "validating-webhook-configuration"},
            "webhooks": [
                hook("vjob.kb.io", "batch", "jobs/status", "/validate-batch-v1-job"),
                hook("vdeployment.kb.io", "apps", "deployments", "/validate-apps-v1-deployment"),
            ],
        },
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "webhook-service"}},
    ]


def test_webhooks_point_at_loopback_with_our_ca_and_only_for_enabled_frameworks() -> None:
    out = cluster.kueue_webhook_configurations(
        _manifest(), url="https://127.0.0.1:9443", ca_bundle=b"PEM", frameworks=("batch/job",)
    )
    assert [o["kind"] for o in out] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    assert [o["metadata"]["name"] for o in out] == list(cluster.KUEUE_WEBHOOK_NAMES.values())
    mutating = {h["name"]: h["clientConfig"] for h in out[0]["webhooks"]}
    # pods and ray.io are not enabled: Kueue would not serve their paths, and Fail would refuse them all
    assert sorted(mutating) == ["mjob.kb.io", "mworkload.kb.io"]
    assert mutating["mjob.kb.io"] == {
        "url": "https://127.0.0.1:9443/mutate-batch-v1-job",
        "caBundle": base64.b64encode(b"PEM").decode(),
    }
    assert [h["name"] for h in out[1]["webhooks"]] == ["vjob.kb.io"]  # a subresource counts as its kind


def test_ray_framework_keeps_the_raycluster_webhook_only() -> None:
    out = cluster.kueue_webhook_configurations(
        _manifest(), url="https://h:1", ca_bundle=b"x", frameworks=cluster.KUEUE_FRAMEWORKS
    )
    names = [h["name"] for h in out[0]["webhooks"]]
    assert "mraycluster.kb.io" in names
    assert "mrayjob.kb.io" not in names
    assert "mpod.kb.io" not in names


def test_an_unknown_framework_is_named() -> None:
    with pytest.raises(ValueError, match=r"pod"):
        cluster.kueue_webhook_configurations(_manifest(), url="u", ca_bundle=b"", frameworks=("pod",))


def test_kueue_config_serves_webhooks_on_loopback_without_internal_certs(tmp_path: Path) -> None:
    cfg = cluster.kueue_config(
        webhook_port=1, cert_dir=tmp_path, health_port=2, metrics_port=3, frameworks=("batch/job",)
    )
    assert cfg["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert cfg["internalCertManagement"] == {"enable": False}
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 1, "certDir": str(tmp_path)}
    assert cfg["health"]["healthProbeBindAddress"] == "127.0.0.1:2"
    assert cfg["metrics"]["bindAddress"] == "127.0.0.1:3"
    assert cfg["integrations"] == {"frameworks": ["batch/job"]}
    assert cfg["namespace"] == cluster.KUEUE_NAMESPACE


def test_feature_gates_flag() -> None:
    assert cluster.feature_gates_flag(None) == []
    assert cluster.feature_gates_flag({}) == []
    assert cluster.feature_gates_flag({"B": False, "A": True}) == ["--feature-gates=A=true,B=false"]
    flag = cluster.feature_gates_flag(cluster.WORKLOAD_FEATURE_GATES)[0]
    for gate in ("GenericWorkload", "TopologyAwareWorkloadScheduling", "CompositePodGroup"):
        assert f"{gate}=true" in flag


@pytest.mark.parametrize(
    ("start", "binary"),
    [
        pytest.param(cluster.start_volcano_controllers, "vc-controller-manager", id="volcano"),
        pytest.param(cluster.start_kuberay_operator, "kuberay-operator", id="kuberay"),
        pytest.param(cluster.start_kueue, "kueue-manager", id="kueue"),
    ],
)
def test_a_missing_operator_is_one_line_naming_the_build_command(
    tmp_path: Path, start: Any, binary: str
) -> None:
    with pytest.raises(cluster.MissingCounterpartError) as err:
        start(cluster.Counterparts(tmp_path), tmp_path / "run", apiserver=APISERVER)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{binary}: ")
    assert message.endswith("tests/e2e/counterparts/build.sh")
    assert not (tmp_path / "run" / "logs").exists()


def test_missing_crds_name_the_build_command(tmp_path: Path) -> None:
    with pytest.raises(cluster.MissingCounterpartError, match=r"kuberay CRDs: .*build\.sh$"):
        cluster.Counterparts(tmp_path).crds("kuberay")


def _ready_never() -> bool:
    return False


def test_an_operator_that_refuses_its_flags_is_one_line_naming_the_build_command(tmp_path: Path) -> None:
    old = tmp_path / "kuberay-operator"
    old.write_text("#!/bin/sh\necho 'flag provided but not defined: -batch-scheduler' >&2\nexit 2\n")
    old.chmod(0o755)
    with pytest.raises(cluster.MissingCounterpartError) as err:
        cluster._start_operator(
            "kuberay-operator", [str(old)], tmp_path / "op.log", ready=_ready_never, timeout_s=30
        )
    message = str(err.value)
    assert "\n" not in message
    assert "flag provided but not defined: -batch-scheduler" in message
    assert message.endswith("rebuild it with tests/e2e/counterparts/build.sh")


def test_an_operator_binary_that_cannot_run_is_one_line(tmp_path: Path) -> None:
    garbage = tmp_path / "kueue-manager"
    garbage.write_bytes(b"\x7fELF truncated")
    garbage.chmod(0o755)
    with pytest.raises(cluster.MissingCounterpartError, match=r"cannot run .*build\.sh$"):
        cluster._start_operator("kueue-manager", [str(garbage)], tmp_path / "op.log", ready=_ready_never)


def test_an_operator_that_fails_otherwise_shows_its_log(tmp_path: Path) -> None:
    crash = tmp_path / "vc-controller-manager"
    crash.write_text("#!/bin/sh\necho 'cannot reach the API server' >&2\nexit 1\n")
    crash.chmod(0o755)
    with pytest.raises(cluster.StartupError, match="cannot reach the API server"):
        cluster._start_operator(
            "vc-controller-manager", [str(crash)], tmp_path / "op.log", ready=_ready_never
        )


def test_operator_stop_runs_its_cleanup_and_stops_the_process(tmp_path: Path) -> None:
    sleeper = tmp_path / "op"
    sleeper.write_text("#!/bin/sh\necho up\nexec sleep 60\n")
    sleeper.chmod(0o755)
    log = tmp_path / "op.log"
    op = cluster._start_operator("op", [str(sleeper)], log, ready=lambda: "up" in log.read_text())
    cleaned: list[bool] = []
    op.cleanup = lambda: cleaned.append(True)
    assert op.rss_bytes() > 0
    op.stop()
    assert cleaned == [True]
    assert not op.process.alive()
    assert op.rss_bytes() == 0
