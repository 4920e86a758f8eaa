"""The Eviction API as the extender's preemption uses it, against the real kube-apiserver (issue 26,
item 7), and a preemption that keeps a PodDisruptionBudget on hollow GB200 trays with the real
kube-scheduler calling the extender (``test_queue_e2e``'s trays, extender and PriorityClasses).

A dry run (``deleteOptions.dryRun: [All]``) checks the pod's PodDisruptionBudgets and evicts
nothing; each dry run is judged alone, so dry runs of a whole victim set all pass where the evictions
themselves would stop half-way, which is why the extender also reads the budgets and counts the set
together (``queueing.over_budget``) before it evicts anything.

No kubelet and no disruption controller run here: the pods' status (Running, Ready) and the budget's
status (what the disruption controller would write) are set through their status subresources."""

from __future__ import annotations

from typing import Any

import pytest

from agent import localcluster as cluster
from agent.commands.extender import KubeCluster
from scheduler_plugin.queueing import budgets_from, over_budget
from tests.e2e import test_hollow_scheduling as hollow
from tests.e2e import test_queue_e2e as queue_e2e
from tests.e2e.test_hollow_scheduling import WAIT_S, Racks, bound, create, events
from tests.e2e.test_queue_e2e import QueueExtender, core, gang_pods
from topology.kube import Kube

pytestmark = pytest.mark.e2e

# the trays, their HyperNodes, the extender and the PriorityClasses, as test_queue_e2e has them
racks = hollow.racks
domains = hollow.domains
idle_trays = hollow.idle_trays
queue_extender = queue_e2e.queue_extender
priority_classes = queue_e2e.priority_classes


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


def test_a_gang_its_budget_protects_keeps_every_pod_and_the_other_domain_goes(
    api_client: Any,
    namespace: str,
    racks: Racks,
    queue_extender: QueueExtender,
    priority_classes: None,
) -> None:
    """One rack runs lo-full, the other lo-a and lo-b (started last: the cheaper rack to take). A budget
    over lo-b (no disruption controller runs here: never processed, the API refuses every eviction it
    covers, the extender counts it as allowing none) leaves that rack unfreeable: the high-priority gang
    takes lo-full's rack, whole, and lo-a and lo-b keep every pod."""
    from kubernetes import client

    ns, label, trays = namespace, racks.label, racks.trays
    low = {"lo-full": trays, "lo-a": trays // 2, "lo-b": trays - trays // 2}
    for name, n in low.items():
        pods = gang_pods(name, n, label, priority_class="e2e-gpu-low")
        for p in pods:
            p["metadata"]["labels"] = {"app": name}
        create(api_client, ns, pods)
        cluster.wait_until(
            lambda name=name, n=n: len(bound(api_client, ns, name)) == n,
            what=f"{name} bound",
            timeout_s=WAIT_S,
        )
    client.PolicyV1Api(api_client).create_namespaced_pod_disruption_budget(
        ns,
        {
            "metadata": {"name": "lo-b"},
            "spec": {"minAvailable": low["lo-b"], "selector": {"matchLabels": {"app": "lo-b"}}},
        },
    )
    cluster.wait_until(
        lambda: queue_extender.state(lambda s: f"{ns}/lo-b" in s.cache.pdbs),
        what="the extender sees the budget",
    )
    before = {g: bound(api_client, ns, g) for g in low}
    create(api_client, ns, gang_pods("hi", trays, label, priority_class="e2e-gpu-high"))
    cluster.wait_until(
        lambda: len(bound(api_client, ns, "hi")) == trays,
        what="the high-priority gang bound",
        timeout_s=WAIT_S,
    )
    hi_nodes = set(bound(api_client, ns, "hi").values())
    assert hi_nodes == set(before["lo-full"].values())  # the rack the budget does not protect
    live = {
        p.metadata.name
        for p in core(api_client).list_namespaced_pod(ns).items
        if not p.metadata.deletion_timestamp
    }
    assert not set(before["lo-full"]) & live  # evicted whole
    for gang in ("lo-a", "lo-b"):
        assert set(before[gang]) <= live, f"{gang} lost pods"
    cluster.wait_until(  # an Event on each pod evicted, none on the budget's
        lambda: (
            {e.involved_object.name for e in events(api_client, ns, "Preempted")} == set(before["lo-full"])
        ),
        what="Preempted on lo-full's pods only",
    )
