"""The real Volcano scheduler places gangs by the HyperNodes it is given (deployment.md §7).

Scheduling decisions only, on hand-made ``Node`` objects and hand-made domains of 2 and 3 nodes (shapes
no simulated machine makes). Subgroups inside the NVLink domains our topology controller builds from
the agents of real (hollow) kubelets, with every pod ``Running`` with its devices, are in
``test_hollow_scheduling.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent import localcluster as cluster
from tests.integration.fakekube import hypernode

pytestmark = pytest.mark.e2e

HYPERNODES = ("topology.volcano.sh", "v1alpha1", "hypernodes")
PODGROUPS = ("scheduling.volcano.sh", "v1beta1", "podgroups")
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"


@pytest.fixture
def hypernodes(api_client: Any, volcano_crds: list[str]) -> Iterator[Callable[[dict[str, Any]], None]]:
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    created: list[str] = []

    def create(body: dict[str, Any]) -> None:
        api.create_cluster_custom_object(*HYPERNODES, body)
        created.append(body["metadata"]["name"])

    try:
        yield create
    finally:
        for name in reversed(created):
            api.delete_cluster_custom_object(*HYPERNODES, name)


def gang_pod(name: str, *, group: str, gpus: int, test_label: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {GROUP_ANNOTATION: group}},
        "spec": {
            "schedulerName": "volcano",
            "nodeSelector": {"gpuagent.dev/e2e-test": test_label},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/none:0",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus), "cpu": "1", "memory": "1Gi"}},
                }
            ],
        },
    }


def two_nvlink_domains(
    gpu_nodes: Callable[..., list[str]], hypernodes: Callable[[dict[str, Any]], None], label: str
) -> tuple[list[str], list[str]]:
    """Domain A: 2 nodes, domain B: 3 nodes (4 GPUs each), one leaf above both."""
    a = gpu_nodes([f"vc-a{i}" for i in range(2)], gpus=4)
    b = gpu_nodes([f"vc-b{i}" for i in range(3)], gpus=4)
    hypernodes(hypernode(f"nvl-a-{label}"[:63], tier=1, tier_name="nvlink", members=a))
    hypernodes(hypernode(f"nvl-b-{label}"[:63], tier=1, tier_name="nvlink", members=b))
    hypernodes(
        hypernode(
            f"leaf-{label}"[:63],
            tier=2,
            tier_name="leaf",
            members=[f"nvl-a-{label}"[:63], f"nvl-b-{label}"[:63]],
            member_type="HyperNode",
        )
    )
    return a, b


def run_gang(
    api_client: Any,
    namespace: str,
    *,
    pods: int,
    highest_tier: int,
    label: str,
    subgroup: dict[str, Any] | None = None,
    pod_labels: Callable[[int], dict[str, str]] = lambda _: {},
) -> list[str]:
    from kubernetes import client

    spec: dict[str, Any] = {
        "minMember": pods,
        "queue": "default",
        "networkTopology": {"mode": "hard", "highestTierAllowed": highest_tier},
    }
    if subgroup is not None:
        spec["subGroupPolicy"] = [subgroup]
    podgroup = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "gang"},
    }
    podgroup["spec"] = spec
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        *PODGROUPS[:2], namespace, PODGROUPS[2], podgroup
    )
    core = client.CoreV1Api(api_client)
    names = [f"worker-{i}" for i in range(pods)]
    for i, name in enumerate(names):
        pod = gang_pod(name, group="gang", gpus=4, test_label=label)
        pod["metadata"]["labels"] = pod_labels(i)
        core.create_namespaced_pod(namespace, pod)
    return names


def bound_nodes(api_client: Any, namespace: str, pods: list[str]) -> dict[str, str | None]:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    return {p: core.read_namespaced_pod(p, namespace).spec.node_name for p in pods}


def podgroup_condition(api_client: Any, namespace: str, condition: str) -> bool:
    from kubernetes import client

    pg = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        *PODGROUPS[:2], namespace, PODGROUPS[2], "gang"
    )
    return any(
        c.get("type") == condition and c.get("status") == "True"
        for c in pg.get("status", {}).get("conditions", [])
    )


@pytest.fixture
def cleanup_podgroups(api_client: Any, namespace: str) -> Iterator[None]:
    yield
    from kubernetes import client

    client.CustomObjectsApi(api_client).delete_collection_namespaced_custom_object(
        *PODGROUPS[:2], namespace, PODGROUPS[2]
    )


@pytest.mark.usefixtures("volcano", "cleanup_podgroups")
def test_gang_lands_inside_one_nvlink_domain(
    api_client: Any,
    gpu_nodes: Callable[..., list[str]],
    hypernodes: Callable[[dict[str, Any]], None],
    namespace: str,
    e2e_test_label: str,
) -> None:
    _, domain_b = two_nvlink_domains(gpu_nodes, hypernodes, e2e_test_label)
    pods = run_gang(api_client, namespace, pods=3, highest_tier=1, label=e2e_test_label)

    cluster.wait_until(
        lambda: all(bound_nodes(api_client, namespace, pods).values()),
        what="all 3 gang pods bound by vc-scheduler",
    )
    placement = bound_nodes(api_client, namespace, pods)
    # Only domain B has room for three 4-GPU pods; domain A would need to be split.
    assert sorted(n for n in placement.values() if n) == sorted(domain_b)


@pytest.mark.usefixtures("volcano", "cleanup_podgroups")
def test_gang_too_big_for_any_nvlink_domain_stays_pending_as_a_whole(
    api_client: Any,
    gpu_nodes: Callable[..., list[str]],
    hypernodes: Callable[[dict[str, Any]], None],
    namespace: str,
    e2e_test_label: str,
) -> None:
    two_nvlink_domains(gpu_nodes, hypernodes, e2e_test_label)
    pods = run_gang(api_client, namespace, pods=4, highest_tier=1, label=e2e_test_label)

    cluster.wait_until(
        lambda: podgroup_condition(api_client, namespace, "Unschedulable"),
        what="PodGroup 'gang' marked Unschedulable by vc-scheduler",
    )
    assert set(bound_nodes(api_client, namespace, pods).values()) == {None}


@pytest.mark.usefixtures("volcano", "cleanup_podgroups")
def test_gang_may_span_domains_when_the_leaf_tier_is_allowed(
    api_client: Any,
    gpu_nodes: Callable[..., list[str]],
    hypernodes: Callable[[dict[str, Any]], None],
    namespace: str,
    e2e_test_label: str,
) -> None:
    domain_a, domain_b = two_nvlink_domains(gpu_nodes, hypernodes, e2e_test_label)
    pods = run_gang(api_client, namespace, pods=4, highest_tier=2, label=e2e_test_label)

    cluster.wait_until(
        lambda: all(bound_nodes(api_client, namespace, pods).values()), what="all 4 gang pods bound"
    )
    placement = bound_nodes(api_client, namespace, pods)
    used = {n for n in placement.values() if n}
    assert len(used) == 4
    assert used <= set(domain_a) | set(domain_b)
    assert used & set(domain_a)
    assert used & set(domain_b)


@pytest.mark.usefixtures("volcano", "cleanup_podgroups")
def test_each_subgroup_lands_inside_one_nvlink_domain(
    api_client: Any,
    gpu_nodes: Callable[..., list[str]],
    hypernodes: Callable[[dict[str, Any]], None],
    namespace: str,
    e2e_test_label: str,
) -> None:
    # What Volcano's job controller makes of a partitionPolicy (scheduling.md §2.2): two partitions of
    # two 4-GPU pods, each partition inside one NVLink domain, the whole job inside one leaf.
    domain_a, domain_b = two_nvlink_domains(gpu_nodes, hypernodes, e2e_test_label)
    subgroup = {
        "name": "worker",
        "subGroupSize": 2,
        "labelSelector": {"matchLabels": {"role": "worker"}},
        "matchLabelKeys": ["volcano.sh/partition-id"],
        "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
    }
    pods = run_gang(
        api_client,
        namespace,
        pods=4,
        highest_tier=2,
        label=e2e_test_label,
        subgroup=subgroup,
        pod_labels=lambda i: {"role": "worker", "volcano.sh/partition-id": str(i // 2)},
    )

    cluster.wait_until(
        lambda: all(bound_nodes(api_client, namespace, pods).values()), what="all 4 pods bound"
    )
    placement = bound_nodes(api_client, namespace, pods)
    domain_of = dict.fromkeys(domain_a, "a") | dict.fromkeys(domain_b, "b")
    partitions = [{domain_of[str(placement[p])] for p in pods[k : k + 2]} for k in (0, 2)]
    assert all(len(domains) == 1 for domains in partitions), placement
    # Domain B has room for one partition only (3 nodes), so the partitions sit in different domains.
    assert partitions[0] != partitions[1], placement


@pytest.mark.usefixtures("volcano", "cleanup_podgroups")
def test_gang_fits_a_domain_of_the_tree_our_builder_makes(
    api_client: Any,
    gpu_nodes: Callable[..., list[str]],
    hypernodes: Callable[[dict[str, Any]], None],
    namespace: str,
    e2e_test_label: str,
) -> None:
    """topology.builder's HyperNode tree, as the controller writes it, is what vc-scheduler places by."""
    from topology.builder import NodeFacts, TopologyInput, build_tree, desired_objects

    racks = {"r0": 2, "r1": 3}  # NVLink domains of 2 and 3 nodes under one leaf
    facts = [
        NodeFacts(
            name=f"tb-{rack}-{i}", domain_label=f"{e2e_test_label[:20]}-{rack}", leaves=frozenset({"leaf0"})
        )
        for rack, size in racks.items()
        for i in range(size)
    ]
    gpu_nodes([f.name for f in facts], gpus=4)
    tree = build_tree(TopologyInput(nodes=tuple(facts)))
    objects = desired_objects(tree)
    assert {o["spec"]["tierName"] for o in objects.values()} == {"nvlink", "leaf"}
    for name in sorted(objects, key=lambda n: objects[n]["spec"]["tier"]):
        hypernodes(objects[name])

    pods = run_gang(api_client, namespace, pods=3, highest_tier=1, label=e2e_test_label)
    cluster.wait_until(
        lambda: all(bound_nodes(api_client, namespace, pods).values()), what="all 3 gang pods bound"
    )
    placement = bound_nodes(api_client, namespace, pods)
    assert {tree.node_domain[str(n)] for n in placement.values()} == {tree.node_domain["tb-r1-0"]}
    assert sorted(str(n) for n in placement.values()) == ["tb-r1-0", "tb-r1-1", "tb-r1-2"]
