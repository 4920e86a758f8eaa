"""The Eviction API as the extender's preemption uses it, against the real kube-apiserver (issue 26,
item 7): a dry run (``deleteOptions.dryRun: [All]``) checks the pod's PodDisruptionBudgets and evicts
nothing; each dry run is judged alone, so dry runs of a whole victim set all pass where the evictions
themselves would stop half-way, which is why the extender also reads the budgets and counts the set
together (``queueing.over_budget``) before it evicts anything.

No kubelet and no disruption controller run here: the pods' status (Running, Ready) and the budget's
status (what the disruption controller would write) are set through their status subresources."""

from __future__ import annotations

from typing import Any

import pytest

from agent.commands.extender import KubeCluster
from scheduler_plugin.queueing import budgets_from, over_budget
from topology.kube import Kube

pytestmark = pytest.mark.e2e


def _running_pod(api: Any, ns: str, name: str) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": name, "labels": {"app": "train"}},
            "spec": {"nodeName": "gone-node", "containers": [{"name": "c", "image": "x"}]},
        },
    )
    ready = {"type": "Ready", "status": "True"}
    core.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Running", "conditions": [ready]}})


def _budget(api: Any, ns: str, allowed: int | None) -> dict[str, Any]:
    """A budget over both pods; ``allowed``: the disruption controller's verdict written into its status
    (None: never written, as when no controller has seen it yet)."""
    from kubernetes import client

    policy = client.PolicyV1Api(api)
    body = {
        "metadata": {"name": "train-budget"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}},
    }
    made = policy.create_namespaced_pod_disruption_budget(ns, body)
    if allowed is not None:
        status = {
            "observedGeneration": made.metadata.generation,
            "disruptionsAllowed": allowed,
            "currentHealthy": 2,
            "desiredHealthy": 1,
            "expectedPods": 2,
        }
        policy.patch_namespaced_pod_disruption_budget_status("train-budget", ns, {"status": status})
    listed = api.sanitize_for_serialization(policy.read_namespaced_pod_disruption_budget("train-budget", ns))
    assert isinstance(listed, dict)
    return listed


def _terminating(api: Any, ns: str, name: str) -> bool:
    from kubernetes import client

    return client.CoreV1Api(api).read_namespaced_pod(name, ns).metadata.deletion_timestamp is not None


def test_dry_run_evicts_nothing_and_a_budget_refuses_it(api_client: Any, namespace: str) -> None:
    kc = KubeCluster(Kube(api_client, request_timeout_s=10))
    for name in ("w-0", "w-1"):
        _running_pod(api_client, namespace, name)
    assert kc.evict(namespace, "w-0", "", dry_run=True) is None
    assert not _terminating(api_client, namespace, "w-0")  # checked, not evicted
    _budget(api_client, namespace, None)  # not yet processed: the API refuses every eviction it covers
    refused = kc.evict(namespace, "w-0", "", dry_run=True)
    assert refused is not None
    assert "PodDisruptionBudget" in refused
    assert "train-budget" in refused  # the API names the budget in the Status's causes


def test_dry_runs_of_a_set_pass_one_by_one_where_the_budget_counts_them_together(
    api_client: Any, namespace: str
) -> None:
    from kubernetes import client

    kc = KubeCluster(Kube(api_client, request_timeout_s=10))
    pods = []
    for name in ("w-0", "w-1"):
        _running_pod(api_client, namespace, name)
        read = client.CoreV1Api(api_client).read_namespaced_pod(name, namespace)
        pods.append(api_client.sanitize_for_serialization(read))
    budget = _budget(api_client, namespace, 1)  # one of the two may go
    assert [kc.evict(namespace, n, "", dry_run=True) for n in ("w-0", "w-1")] == [None, None]
    assert not _terminating(api_client, namespace, "w-0")
    # the extender's own count of the set: both together break the budget, so it evicts neither
    assert over_budget(pods, budgets_from([budget])) == [(f"{namespace}/train-budget", 2, 1)]
    # what evicting one by one would have done: the first goes, the second is refused, half a gang gone
    assert kc.evict(namespace, "w-0", "") is None
    assert _terminating(api_client, namespace, "w-0")
    refused = kc.evict(namespace, "w-1", "")
    assert refused is not None
    assert "train-budget" in refused
