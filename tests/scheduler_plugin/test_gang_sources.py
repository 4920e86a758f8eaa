"""Gang sources beside Volcano PodGroups and our annotations: KubeRay RayClusters and the native
``scheduling.k8s.io`` Workload / PodGroup API, to a Gang and pod places; and the extender's state
planning and binding them."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.extender import ExtenderState
from scheduler_plugin.extender.filter import EXCLUDE_CONFIRM_S
from scheduler_plugin.gangs import (
    GangError,
    GangIncompleteError,
    gang_for_pod,
    gang_from_raycluster,
    gang_from_workload_podgroup,
    gang_key_of,
)
from scheduler_plugin.queue import QueueConfig
from scheduler_plugin.snapshot import PodSlot
from tests.integration.fakekube import hypernode, node

TIERS = ("nvlink", "leaf", "spine")
NS = "ml"


def container(gpus: int = 0, cpu: str | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if gpus:
        res["limits"] = {"nvidia.com/gpu": str(gpus)}
    if cpu:
        res["requests"] = {"cpu": cpu}
    return {"name": "ray", "image": "rayproject/ray", "resources": res}


def template(gpus: int = 0, cpu: str | None = None, ann: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"annotations": ann or {}},
        "spec": {"schedulerName": "gpu-topology-scheduler", "containers": [container(gpus, cpu)]},
    }


def worker_group(name: str, replicas: int | None, *, gpus: int = 4, **extra: Any) -> dict[str, Any]:
    group: dict[str, Any] = {
        "groupName": name,
        "minReplicas": extra.pop("minReplicas", 0),
        "maxReplicas": extra.pop("maxReplicas", 100),
        "rayStartParams": {},
        "template": template(gpus, ann=extra.pop("ann", None)),
        **extra,
    }
    if replicas is not None:
        group["replicas"] = replicas
    return group


def raycluster(
    groups: list[dict[str, Any]], *, name: str = "rc", ann: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": NS, "annotations": ann or {}},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": template(0, "500m")},
            "workerGroupSpecs": groups,
            **spec,
        },
    }


def ray_pod(
    name: str, group: str, *, cluster: str = "rc", gpus: int = 4, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    head = group == "headgroup"
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {
                "ray.io/cluster": cluster,
                "ray.io/node-type": "head" if head else "worker",
                "ray.io/group": group,
                "ray.io/is-ray-node": "yes",
                **(labels or {}),
            },
        },
        "spec": {"containers": [container(0, "500m") if head else container(gpus)]},
        "status": {"phase": "Pending"},
    }


NVLINK = {"gpuagent.dev/subgroup-tier": "nvlink"}


def two_groups() -> dict[str, Any]:
    return raycluster([worker_group("gpu-a", 4, ann=NVLINK), worker_group("gpu-b", 4, ann=NVLINK)], ann={})


def ray_pods() -> list[dict[str, Any]]:
    return [ray_pod("rc-head-x", "headgroup")] + [
        ray_pod(f"rc-{g}-worker-{i}", g) for g in ("gpu-a", "gpu-b") for i in range(4)
    ]


# -- RayCluster ----------------------------------------------------------------------------------


def test_raycluster_is_one_gang_head_role_and_a_role_per_worker_group() -> None:
    spec = gang_from_raycluster(two_groups(), ray_pods(), TIERS)
    assert spec.key == "ml/rc"
    assert spec.source == "raycluster"
    head, a, b = spec.gang.roles
    assert (head.name, head.pods, head.gpus_per_pod, head.resources_per_pod) == (
        "headgroup",
        1,
        0,
        {"cpu": 500},
    )
    assert head.subgroup_tier is None
    for role, name in ((a, "gpu-a"), (b, "gpu-b")):
        assert (role.name, role.pods, role.gpus_per_pod) == (name, 4, 4)
        assert (role.subgroup_size, role.subgroup_tier, role.min_subgroups) == (4, "nvlink", None)
    assert spec.min_member == 9  # all-or-nothing: head + 2 x 4 workers
    assert spec.members["ml/rc-head-x"] == PodSlot("headgroup", 0)
    assert [spec.members[f"ml/rc-gpu-b-worker-{i}"] for i in range(4)] == [
        PodSlot("gpu-b", i) for i in range(4)
    ]


def test_raycluster_shape_comes_from_templates_before_pods_exist() -> None:
    spec = gang_from_raycluster(two_groups(), [ray_pod("rc-gpu-a-worker-0", "gpu-a")], TIERS)
    assert [(r.name, r.pods, r.gpus_per_pod) for r in spec.gang.roles] == [
        ("headgroup", 1, 0),
        ("gpu-a", 4, 4),
        ("gpu-b", 4, 4),
    ]
    assert spec.gang.roles[0].resources_per_pod == {"cpu": 500}
    assert list(spec.members) == ["ml/rc-gpu-a-worker-0"]


def test_raycluster_annotations_template_first_then_the_cluster() -> None:
    rc = raycluster(
        [
            worker_group("a", 4),  # takes the RayCluster's annotations
            worker_group("b", 4, ann={"gpuagent.dev/subgroup-tier": "leaf"}),  # its own tier wins
        ],
        ann={
            "gpuagent.dev/subgroup-tier": "nvlink",
            "gpuagent.dev/subgroup-size": "2",
            "gpuagent.dev/gang-tier": "spine",
            "gpuagent.dev/topology-mode": "soft",
        },
    )
    spec = gang_from_raycluster(rc, [], TIERS)
    _, a, b = spec.gang.roles
    assert (a.subgroup_tier, a.subgroup_size) == ("nvlink", 2)
    assert (b.subgroup_tier, b.subgroup_size) == ("leaf", 2)
    assert spec.gang.tier == "spine"
    assert spec.gang.soft


def test_raycluster_without_topology_annotations_has_no_subgroups() -> None:
    spec = gang_from_raycluster(raycluster([worker_group("a", 3)]), [], TIERS)
    assert [(r.subgroup_size, r.subgroup_tier) for r in spec.gang.roles] == [(None, None), (None, None)]
    assert spec.gang.tier is None
    assert not spec.gang.soft


@pytest.mark.parametrize(
    ("fields", "pods"),
    [
        pytest.param({"replicas": 3}, 3, id="replicas"),
        pytest.param({"replicas": 1, "minReplicas": 2}, 2, id="below-min-takes-min"),
        pytest.param({"replicas": 9, "maxReplicas": 5}, 5, id="above-max-takes-max"),
        pytest.param({"minReplicas": 6, "maxReplicas": 4, "replicas": 5}, 4, id="min-over-max-takes-max"),
        pytest.param({"minReplicas": 2}, 2, id="no-replicas-takes-min"),
        pytest.param({"replicas": 3, "numOfHosts": 2}, 6, id="multi-host"),
        pytest.param({"replicas": 3, "numOfHosts": 0}, 3, id="hosts-0-is-defaulted-to-1"),
        pytest.param({"replicas": 3, "maxReplicas": 2147483647}, 3, id="default-max"),
    ],
)
def test_raycluster_replicas_are_clamped_as_kuberay_does(fields: dict[str, Any], pods: int) -> None:
    group = worker_group("w", fields.pop("replicas", None), **fields)
    spec = gang_from_raycluster(raycluster([group]), [], TIERS)
    assert spec.gang.roles[1].pods == pods
    assert spec.min_member == 1 + pods


def test_raycluster_suspended_worker_group_has_no_role() -> None:
    spec = gang_from_raycluster(
        raycluster([worker_group("a", 2), worker_group("b", 3, suspend=True)]), [], TIERS
    )
    assert [r.name for r in spec.gang.roles] == ["headgroup", "a"]


def test_raycluster_autoscaling_minimum_is_min_replicas_in_whole_subgroups() -> None:
    rc = raycluster(
        [
            worker_group("free", 6, minReplicas=2),  # no topology: pods one by one
            worker_group("blocks", 8, minReplicas=3, ann={**NVLINK, "gpuagent.dev/subgroup-size": "4"}),
            worker_group("whole", 4, minReplicas=1, ann=NVLINK),  # one subgroup: starts whole
        ],
        enableInTreeAutoscaling=True,
    )
    spec = gang_from_raycluster(rc, [], TIERS)
    _, free, blocks, whole = spec.gang.roles
    assert (free.subgroup_size, free.min_subgroups) == (1, 2)
    assert (blocks.subgroup_size, blocks.min_subgroups) == (4, 1)
    assert (whole.subgroup_size, whole.min_subgroups) == (4, None)
    assert spec.min_member == 1 + 2 + 4 + 4
    # without autoscaling every desired pod is the minimum (KubeRay's own Volcano minMember)
    rc["spec"]["enableInTreeAutoscaling"] = False
    assert gang_from_raycluster(rc, [], TIERS).min_member == 1 + 6 + 8 + 4


def test_raycluster_multi_host_index_labels_are_the_rank() -> None:
    rc = raycluster([worker_group("tpu", 2, numOfHosts=2, ann={**NVLINK, "gpuagent.dev/subgroup-size": "2"})])
    pods = [
        ray_pod(
            f"w-{name}",
            "tpu",
            labels={"ray.io/worker-group-replica-index": rep, "ray.io/replica-host-index": host},
        )
        for name, rep, host in (("a", "1", "1"), ("b", "0", "0"), ("c", "1", "0"), ("d", "0", "1"))
    ]
    spec = gang_from_raycluster(rc, pods, TIERS)
    assert {k: v.index for k, v in spec.members.items()} == {
        "ml/w-b": 0,
        "ml/w-d": 1,
        "ml/w-c": 2,
        "ml/w-a": 3,
    }


@pytest.mark.parametrize(
    ("rc", "pods", "needle"),
    [
        pytest.param(raycluster([worker_group("a", 2)], suspend=True), [], "spec.suspend", id="suspended"),
        pytest.param(
            raycluster([worker_group("a", 1)]),
            [ray_pod("x", "a"), ray_pod("y", "a")],
            "more than the 1",
            id="scaling-down",
        ),
        pytest.param(
            raycluster([worker_group("a", 1)]),
            [ray_pod("h1", "headgroup"), ray_pod("h2", "headgroup")],
            "2 head pods",
            id="two-heads",
        ),
    ],
)
def test_raycluster_waits_for_what_the_operator_will_fix(
    rc: dict[str, Any], pods: list[dict[str, Any]], needle: str
) -> None:
    with pytest.raises(GangIncompleteError, match=needle):
        gang_from_raycluster(rc, pods, TIERS)


def _bad(**spec: Any) -> dict[str, Any]:
    rc = raycluster([worker_group("a", 2)])
    rc["spec"].update(spec)
    return rc


@pytest.mark.parametrize(
    ("rc", "pods", "needle"),
    [
        pytest.param(
            raycluster([worker_group("a", 1), worker_group("a", 1)]),
            [],
            r"workerGroupSpecs\[1\].groupName: 'a' is used twice",
            id="duplicate-group",
        ),
        pytest.param(
            raycluster([worker_group("headgroup", 1)]),
            [],
            r"workerGroupSpecs\[0\].groupName: 'headgroup'",
            id="group-named-headgroup",
        ),
        pytest.param(
            raycluster([worker_group("", 1)]), [], r"workerGroupSpecs\[0\].groupName", id="empty-group-name"
        ),
        pytest.param(
            raycluster([worker_group("a", 1, ann={"gpuagent.dev/subgroup-tier": "rack"})]),
            [],
            r"workerGroupSpecs\[0\].template.metadata.annotations\[gpuagent.dev/subgroup-tier\]: "
            "unknown tier",
            id="unknown-tier-on-template",
        ),
        pytest.param(
            raycluster([worker_group("a", 1)], ann={"gpuagent.dev/subgroup-size": "two"}),
            [],
            r"RayCluster ml/rc: metadata.annotations\[gpuagent.dev/subgroup-size\]: expected an integer",
            id="bad-size-on-cluster",
        ),
        pytest.param(
            raycluster([worker_group("a", 1)], ann={"gpuagent.dev/topology-mode": "maybe"}),
            [],
            "topology-mode",
            id="bad-mode",
        ),
        pytest.param(
            raycluster([worker_group("a", 1)]),
            [ray_pod("stray", "b")],
            "ray.io/group='b', which is not a worker group",
            id="pod-of-unknown-group",
        ),
        pytest.param(
            raycluster([worker_group("a", 1)]),
            [
                {
                    **ray_pod("h", "a"),
                    "metadata": {
                        **ray_pod("h", "a")["metadata"],
                        "labels": {"ray.io/cluster": "rc", "ray.io/node-type": "head", "ray.io/group": "a"},
                    },
                }
            ],
            "is the head",
            id="head-in-a-worker-group",
        ),
        pytest.param(
            raycluster([worker_group("a", 1)]),
            [
                {
                    "metadata": {
                        "name": "w",
                        "namespace": NS,
                        "labels": {
                            "ray.io/cluster": "rc",
                            "ray.io/node-type": "worker",
                            "ray.io/group": "headgroup",
                        },
                    }
                }
            ],
            "is a worker with ray.io/group=headgroup",
            id="worker-in-headgroup",
        ),
        pytest.param(
            raycluster([worker_group("a", 1)]),
            [
                {
                    "metadata": {
                        "name": "w",
                        "namespace": NS,
                        "labels": {"ray.io/cluster": "rc", "ray.io/node-type": "worker"},
                    }
                }
            ],
            "has no ray.io/group label",
            id="no-group-label",
        ),
        pytest.param(
            _bad(enableInTreeAutoscaling="yes"), [], "spec.enableInTreeAutoscaling", id="autoscaling"
        ),
        pytest.param(_bad(headGroupSpec=None), [], "spec.headGroupSpec: expected a mapping", id="no-head"),
        pytest.param(
            _bad(workerGroupSpecs={"a": 1}), [], "spec.workerGroupSpecs: expected a list", id="groups"
        ),
        pytest.param(
            raycluster([worker_group("a", 1, template="x")]),
            [],
            r"workerGroupSpecs\[0\].template: expected a mapping",
            id="template-not-mapping",
        ),
        pytest.param(
            raycluster([worker_group("a", 1, suspend="no")]), [], r"\[0\].suspend", id="suspend-not-bool"
        ),
    ],
)
def test_raycluster_contradictions_name_the_object_and_field(
    rc: dict[str, Any], pods: list[dict[str, Any]], needle: str
) -> None:
    with pytest.raises(GangError, match=needle) as err:
        gang_from_raycluster(rc, pods, TIERS)
    assert not isinstance(err.value, GangIncompleteError)
    assert "RayCluster ml/rc" in str(err.value)


# -- native scheduling.k8s.io PodGroup -----------------------------------------------------------


def native_pg(
    *,
    name: str = "pg",
    min_count: int | None = 4,
    key: str | None = "gpuagent.dev/nvlink-domain",
    ref: tuple[str, str] | None = ("train", "workers"),
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulingPolicy": {"gang": {"minCount": min_count}} if min_count is not None else {"basic": {}}
    }
    if key is not None:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    if ref is not None:
        spec["workloadRef"] = {"workloadName": ref[0], "templateName": ref[1]}
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def workload(templates: list[str], *, composite: bool = False) -> dict[str, Any]:
    pgts = [{"name": t, "schedulingPolicy": {"gang": {"minCount": 1}}} for t in templates]
    spec: dict[str, Any] = (
        {"compositePodGroupTemplates": [{"name": "all", "podGroupTemplates": pgts}]}
        if composite
        else {"podGroupTemplates": pgts}
    )
    return {"metadata": {"name": "train", "namespace": NS}, "spec": spec}


def member(name: str, *, group: str = "pg", gpus: int = 4, index: int | None = None) -> dict[str, Any]:
    labels = {"batch.kubernetes.io/job-completion-index": str(index)} if index is not None else {}
    return {
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"schedulingGroup": {"podGroupName": group}, "containers": [container(gpus)]},
        "status": {"phase": "Pending"},
    }


def test_native_podgroup_gang_with_topology_key_as_our_tier() -> None:
    pods = [member(f"p{i}", index=3 - i) for i in range(4)]
    spec = gang_from_workload_podgroup(native_pg(), pods, TIERS, {"ml/train": workload(["workers"])})
    assert spec.key == "ml/pg"
    assert spec.source == "workload"
    (role,) = spec.gang.roles
    assert (role.name, role.pods, role.gpus_per_pod, role.min_subgroups) == ("workers", 4, 4, None)
    assert spec.gang.tier == "nvlink"
    assert not spec.gang.soft
    assert spec.min_member == 4
    assert spec.members["ml/p0"] == PodSlot("workers", 3)  # Job completion index is the rank


def test_native_podgroup_more_pods_than_min_count_is_elastic() -> None:
    spec = gang_from_workload_podgroup(
        native_pg(min_count=4, ref=None), [member(f"p{i}") for i in range(6)], TIERS
    )
    (role,) = spec.gang.roles
    assert (role.name, role.pods, role.subgroup_size, role.min_subgroups) == ("default", 6, 1, 4)
    assert spec.min_member == 4


def test_native_basic_policy_is_a_group_of_minimum_one() -> None:
    spec = gang_from_workload_podgroup(native_pg(min_count=None), [member("a"), member("b")], TIERS)
    assert spec.min_member == 1
    assert spec.gang.tier == "nvlink"
    assert spec.gang.roles[0].min_subgroups == 1


def test_native_pods_of_different_requests_become_roles() -> None:
    pods = [member("big", gpus=8), member("small-0", gpus=1), member("small-1", gpus=1)]
    spec = gang_from_workload_podgroup(native_pg(min_count=2), pods, TIERS)
    assert [(r.name, r.pods, r.gpus_per_pod, r.min_subgroups) for r in spec.gang.roles] == [
        ("workers-0", 1, 8, None),
        ("workers-1", 2, 1, None),
    ]
    assert spec.min_member == 2


def test_native_composite_workload_templates_are_found() -> None:
    spec = gang_from_workload_podgroup(
        native_pg(),
        [member(f"p{i}") for i in range(4)],
        TIERS,
        {"ml/train": workload(["workers"], composite=True)},
    )
    assert spec.gang.roles[0].name == "workers"


@pytest.mark.parametrize(
    ("key", "tier"),
    [
        ("gpuagent.dev/nvlink-domain", "nvlink"),
        ("nvidia.com/gpu.clique", "nvlink"),
        ("gpuagent.dev/ib-leaf", "leaf"),
        ("gpuagent.dev/leaf-domain", "leaf"),
        ("gpuagent.dev/spine-domain", "spine"),
    ],
)
def test_native_topology_keys_map_to_tiers(key: str, tier: str) -> None:
    spec = gang_from_workload_podgroup(native_pg(key=key, min_count=1), [member("a")], TIERS)
    assert spec.gang.tier == tier


def test_native_fewer_pods_than_min_count_wait() -> None:
    with pytest.raises(GangIncompleteError, match=r"minCount is 4; 3 pod\(s\) name it so far"):
        gang_from_workload_podgroup(native_pg(), [member(f"p{i}") for i in range(3)], TIERS)


def _native(**spec: Any) -> dict[str, Any]:
    pg = native_pg()
    pg["spec"].update(spec)
    return pg


@pytest.mark.parametrize(
    ("pg", "workloads", "needle"),
    [
        pytest.param(native_pg(key="kubernetes.io/hostname"), {}, "not a topology label", id="hostname-key"),
        pytest.param(
            native_pg(key="gpuagent.dev/core-domain"), {}, "unknown tier 'core'", id="tier-not-in-cluster"
        ),
        pytest.param(native_pg(key=""), {}, r"topology\[0\].key: expected a node-label key", id="empty-key"),
        pytest.param(
            native_pg(),
            {"ml/train": workload(["head"])},
            "Workload ml/train has no template 'workers'",
            id="template",
        ),
        pytest.param(
            _native(schedulingPolicy={"basic": {}, "gang": {"minCount": 1}}), {}, "exactly one", id="both"
        ),
        pytest.param(_native(schedulingPolicy={}), {}, "exactly one", id="neither"),
        pytest.param(
            _native(schedulingPolicy={"gang": {"minCount": 0}}),
            {},
            "minCount: expected an integer >= 1",
            id="zero",
        ),
        pytest.param(
            _native(schedulingPolicy={"gang": {"minCount": [4]}}),
            {},
            "minCount: expected an integer",
            id="list",
        ),
        pytest.param(
            _native(schedulingPolicy={"gang": "all"}), {}, "gang: expected a mapping", id="gang-str"
        ),
        pytest.param(
            _native(schedulingConstraints={"topology": [{"key": "a"}, {"key": "b"}]}),
            {},
            "at most one",
            id="two-keys",
        ),
        pytest.param(
            _native(schedulingConstraints={"topology": "a"}), {}, "expected a list", id="topology-str"
        ),
        pytest.param(
            _native(workloadRef={"workloadName": "train"}), {}, "templateName", id="no-template-name"
        ),
        pytest.param(_native(workloadRef={"templateName": "w"}), {}, "workloadName", id="no-workload-name"),
        pytest.param(_native(spec=None), {}, "", id="spec-kept"),
    ],
)
def test_native_contradictions_name_the_object_and_field(
    pg: dict[str, Any], workloads: dict[str, Any], needle: str
) -> None:
    if needle == "":  # an unknown field is not a contradiction
        gang_from_workload_podgroup(pg, [member(f"p{i}") for i in range(4)], TIERS, workloads)
        return
    with pytest.raises(GangError, match=needle) as err:
        gang_from_workload_podgroup(pg, [member(f"p{i}") for i in range(4)], TIERS, workloads)
    assert not isinstance(err.value, GangIncompleteError)
    assert "PodGroup ml/pg (scheduling.k8s.io)" in str(err.value)


# -- which source, through gang_for_pod -----------------------------------------------------------


def test_gang_key_of_order_native_volcano_annotations_ray() -> None:
    p = ray_pod("x", "a")
    assert gang_key_of(p) == ("raycluster", "ml/rc")
    p["metadata"]["annotations"] = {"gpuagent.dev/gang": "mine"}
    assert gang_key_of(p) == ("annotations", "ml/mine")
    p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = "ray-rc-pg"  # KubeRay with Volcano
    assert gang_key_of(p) == ("podgroup", "ml/ray-rc-pg")
    p["spec"]["schedulingGroup"] = {"podGroupName": "native"}
    assert gang_key_of(p) == ("workload", "ml/native")


def test_ray_pods_other_than_head_and_worker_are_on_their_own() -> None:
    cleanup = ray_pod("rc-redis-cleanup", "headgroup")
    cleanup["metadata"]["labels"]["ray.io/node-type"] = "redis-cleanup"
    assert gang_key_of(cleanup) is None
    assert gang_key_of({"metadata": {"labels": {"ray.io/cluster": "rc"}}}) is None


def test_gang_for_pod_reads_the_raycluster_and_skips_pods_being_deleted() -> None:
    pods = ray_pods()
    old = ray_pod("rc-gpu-a-worker-old", "gpu-a")  # replaced, terminating: not a fifth worker
    old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    done = ray_pod("rc-gpu-b-worker-done", "gpu-b")
    done["status"]["phase"] = "Failed"
    spec = gang_for_pod(pods[1], [*pods, old, done], {}, TIERS, rayclusters={"ml/rc": two_groups()})
    assert spec is not None
    assert spec.source == "raycluster"
    assert "ml/rc-gpu-a-worker-old" not in spec.members
    assert len(spec.members) == 9


def test_gang_for_pod_waits_for_an_unknown_raycluster_or_podgroup() -> None:
    with pytest.raises(GangIncompleteError, match=r"RayCluster ml/rc \(ray.io/cluster\) is not known yet"):
        gang_for_pod(ray_pod("w", "a"), [], {}, TIERS)
    with pytest.raises(GangIncompleteError, match=r"PodGroup ml/pg \(spec.schedulingGroup.podGroupName\)"):
        gang_for_pod(member("p"), [], {}, TIERS)


def test_gang_for_pod_reads_the_native_podgroup() -> None:
    pods = [member(f"p{i}") for i in range(4)] + [member("other", group="pg2")]
    spec = gang_for_pod(
        pods[0],
        pods,
        {},
        TIERS,
        workload_podgroups={"ml/pg": native_pg()},
        workloads={"ml/train": workload(["workers"])},
    )
    assert spec is not None
    assert sorted(spec.members) == [f"ml/p{i}" for i in range(4)]


# -- the extender's state --------------------------------------------------------------------------

RACK_NODES = [f"r{r}-t{t}" for r in range(3) for t in range(4)]


def _state() -> ExtenderState:
    s = ExtenderState(queue=QueueConfig(reservation_ttl_s=30.0, barrier_timeout_s=5.0))
    s.cache.replace("nodes", [node(n, 4) for n in RACK_NODES])
    s.cache.replace(
        "hypernodes",
        [hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t{t}" for t in range(4)]) for r in range(3)],
    )
    return s


def _ours(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["schedulerName"] = "gpu-topology-scheduler"
    pod["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
    return pod


def _place_all(s: ExtenderState, pods: list[dict[str, Any]], names: list[str] = RACK_NODES) -> dict[str, str]:
    placed: dict[str, str] = {}
    for p in pods:
        out = s.filter(p, names, now=1.0)
        assert len(out.passed) == 1, (p["metadata"]["name"], out.failed, out.unresolvable)
        placed[p["metadata"]["name"]] = out.passed[0]
    decisions = [s.bind(NS, name, f"uid-{name}", n, now=2.0) for name, n in placed.items()]
    assert [d.action for d in decisions[:-1]] == ["wait"] * (len(pods) - 1)
    assert decisions[-1].action == "bind"
    assert len(decisions[-1].pods) == len(pods)
    return placed


def test_state_plans_a_raycluster_each_worker_group_in_one_nvlink_domain() -> None:
    s = _state()
    pods = [_ours(p) for p in ray_pods()]
    s.cache.replace("pods", pods)
    s.cache.replace("rayclusters", [two_groups()])
    placed = _place_all(s, pods)
    for g in ("gpu-a", "gpu-b"):
        racks = {placed[f"rc-{g}-worker-{i}"].split("-")[0] for i in range(4)}
        assert len(racks) == 1, (g, placed)
    a_rack = placed["rc-gpu-a-worker-0"].split("-")[0]
    assert a_rack != placed["rc-gpu-b-worker-0"].split("-")[0]


def test_state_waits_for_the_raycluster_object_then_plans() -> None:
    s = _state()
    pods = [_ours(p) for p in ray_pods()]
    s.cache.replace("pods", pods)
    out = s.filter(pods[1], RACK_NODES, now=1.0)
    assert not out.passed
    assert not out.unresolvable
    assert "waiting for the rest of the gang" in next(iter(out.failed.values()))
    assert [e.reason for e in out.events] == ["GangIncomplete"]
    s.cache.apply("rayclusters", "ADDED", two_groups())
    assert "ml/rc" in s.cache.rayclusters
    _place_all(s, pods)


def test_state_invalid_raycluster_is_unresolvable_with_an_event() -> None:
    s = _state()
    pods = [_ours(p) for p in ray_pods()]
    s.cache.replace("pods", pods)
    bad = two_groups()
    bad["spec"]["workerGroupSpecs"][1]["groupName"] = "gpu-a"
    s.cache.replace("rayclusters", [bad])
    out = s.filter(pods[1], RACK_NODES, now=1.0)
    assert "groupName: 'gpu-a' is used twice" in next(iter(out.unresolvable.values()))
    assert [e.reason for e in out.events] == ["InvalidGang"]


def test_state_plans_a_native_podgroup_inside_one_nvlink_domain() -> None:
    s = _state()
    s.cache.replace("nodes", [node(n, 4, labels={"gpuagent.dev/nvlink-domain": n[:2]}) for n in RACK_NODES])
    s.cache.replace("hypernodes", [])  # the tier from node labels alone
    pods = [_ours(member(f"p{i}")) for i in range(4)]
    s.cache.replace("pods", pods)
    s.cache.replace("workload_podgroups", [native_pg()])
    s.cache.replace("workloads", [workload(["workers"])])
    placed = _place_all(s, pods)
    assert len({n.split("-")[0] for n in placed.values()}) == 1
    s.cache.apply("workload_podgroups", "DELETED", native_pg())
    assert s.cache.workload_podgroups == {}


def test_native_topology_key_of_a_custom_tier_and_a_head_only_raycluster() -> None:
    """``gpuagent.dev/<tier>-domain`` names any cluster tier (a HyperNode ``tierName`` of the operator's);
    a RayCluster without worker groups is its head alone."""
    pg = native_pg(key="gpuagent.dev/rack-domain", min_count=1)
    assert gang_from_workload_podgroup(pg, [member("a")], ("nvlink", "rack")).gang.tier == "rack"
    with pytest.raises(GangError, match=r"gpuagent.dev/-domain.*not a topology label"):
        gang_from_workload_podgroup(native_pg(key="gpuagent.dev/-domain"), [member("a")], TIERS)
    rc = raycluster([])
    del rc["spec"]["workerGroupSpecs"]
    spec = gang_from_raycluster(rc, [ray_pod("h", "headgroup")], TIERS)
    assert [r.name for r in spec.gang.roles] == ["headgroup"]
    assert spec.min_member == 1


def test_state_places_a_head_pinned_to_a_cpu_pool_and_workers_on_gpu_racks() -> None:
    """Roles may select different nodes (a Ray head on CPU nodes by its own nodeSelector): each role is
    planned on the nodes its pods select; the reservation keeps the RayCluster's gang as it is."""
    s = _state()
    cpu = node("cpu-0", 0, labels={"pool": "cpu"})
    s.cache.replace("nodes", [*(node(n, 4, labels={"pool": "gpu"}) for n in RACK_NODES), cpu])
    pods = [_ours(p) for p in ray_pods()]
    for p in pods:
        p["spec"]["nodeSelector"] = {"pool": "cpu" if p["metadata"]["name"] == "rc-head-x" else "gpu"}
    s.cache.replace("pods", pods)
    s.cache.replace("rayclusters", [two_groups()])
    placed = _place_all(s, pods, [*RACK_NODES, "cpu-0"])
    assert placed["rc-head-x"] == "cpu-0"
    assert all(n.startswith("r") for k, n in placed.items() if k != "rc-head-x")
    for g in ("gpu-a", "gpu-b"):
        assert len({placed[f"rc-{g}-worker-{i}"].split("-")[0] for i in range(4)}) == 1


def test_state_pods_of_one_role_must_agree_on_node_selector() -> None:
    s = _state()
    pods = [_ours(p) for p in ray_pods()]
    pods[1]["spec"]["nodeSelector"] = {"pool": "a"}
    pods[2]["spec"]["nodeSelector"] = {"pool": "b"}
    s.cache.replace("pods", pods)
    s.cache.replace("rayclusters", [two_groups()])
    out = s.filter(pods[1], RACK_NODES, now=1.0)
    assert "the pods of role gpu-a disagree on nodeSelector pool ('a', 'b')" in next(
        iter(out.failed.values())
    )


def test_a_call_narrowed_to_another_domain_keeps_the_plan() -> None:
    """kube-scheduler 1.37's pod-group cycle (TopologyPlacementGenerator) filters one domain's nodes at a
    time: a call whose candidates are all in other domains than the planned node's fails there without
    dropping the plan or ruling the node out; a call that has the planned node's domain but not the node
    still means kube-scheduler ruled the node out."""
    s = _state()
    pods = [_ours(member(f"p{i}")) for i in range(4)]
    s.cache.replace("pods", pods)
    s.cache.replace("workload_podgroups", [native_pg()])
    first = s.filter(pods[0], RACK_NODES, now=1.0).passed[0]
    res = s.holds.started["ml/pg"]
    rack = first.split("-")[0]
    others = [n for n in RACK_NODES if not n.startswith(rack + "-")]
    out = s.filter(pods[0], others, now=2.0)
    assert out.passed == []
    assert "outside this call's candidate domain" in next(iter(out.failed.values()))
    assert out.events == []
    assert s.holds.started["ml/pg"] is res
    assert s.filter(pods[0], [n for n in RACK_NODES if n.startswith(rack + "-")], now=3.0).passed == [first]
    s.filter(pods[0], [n for n in RACK_NODES if n != first], now=4.0)
    out = s.filter(pods[0], [n for n in RACK_NODES if n != first], now=4.0 + EXCLUDE_CONFIRM_S)
    assert [e.reason for e in out.events] == ["GangNodeFiltered"]
    assert "ml/pg" not in s.holds.started


def test_state_roles_on_different_pools_while_a_role_has_no_pod_yet() -> None:
    """Found by the e2e with the real KubeRay operator, which creates a RayCluster's pods one at a time:
    the head (CPU pool) and the first worker group exist, the second group's pods do not yet."""
    s = _state()
    cpu = node("cpu-0", 0, labels={"pool": "cpu"})
    s.cache.replace("nodes", [*(node(n, 4, labels={"pool": "gpu"}) for n in RACK_NODES), cpu])
    pods = [_ours(p) for p in ray_pods() if "gpu-b" not in p["metadata"]["name"]]
    for p in pods:
        p["spec"]["nodeSelector"] = {"pool": "cpu" if p["metadata"]["name"] == "rc-head-x" else "gpu"}
    s.cache.replace("pods", pods)
    s.cache.replace("rayclusters", [two_groups()])
    out = s.filter(pods[0], [*RACK_NODES, "cpu-0"], now=1.0)
    assert out.passed == []  # nothing is planned, nor held, for gpu-b's pods before they exist
    assert "5 of its 9 pods (its spec's replicas) exist so far" in out.failed["cpu-0"]
    assert "ml/rc" not in s.holds.started
    rest = [_ours(p) for p in ray_pods() if "gpu-b" in p["metadata"]["name"]]
    for p in rest:
        p["spec"]["nodeSelector"] = {"pool": "gpu"}
        s.cache.apply("pods", "ADDED", p)
    out = s.filter(pods[0], [*RACK_NODES, "cpu-0"], now=2.0)
    assert out.passed == ["cpu-0"]
    assert s.holds.started["ml/rc"].target == 9
