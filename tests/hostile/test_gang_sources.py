"""Hostile RayClusters and native ``scheduling.k8s.io`` Workloads / PodGroups fed to the extender's gang
sources: replicas of two billion, counts with thousands of digits, wrong JSON types everywhere, a
hundred thousand worker groups, templates nested past any depth, labels that are not strings. Each is a
``GangError`` (or a wait, for what the operator will fix) naming the object and the field, within a
few seconds and a few MiB, never a crash or a plan the size of the number; through the
extender's state the pod is answered unresolvable with an ``InvalidGang`` Event and nothing is held."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from scheduler_plugin.gangs import (
    GangError,
    gang_for_pod,
    gang_from_annotations,
    gang_from_podgroup,
    gang_from_raycluster,
    gang_from_workload_podgroup,
    gang_key_of,
)
from scheduler_plugin.snapshot import MAX_GANG_PODS
from scheduler_plugin.state import ClusterState
from tests.integration.fakekube import hypernode, node

TIERS = ("nvlink", "leaf")
NS = "ml"
DEADLINE_S = 10.0
MAX_PEAK_BYTES = 64 << 20


pytestmark = pytest.mark.timeout(DEADLINE_S)  # a bound on a hang, not a speed claim


@pytest.fixture(autouse=True)
def bounded_memory() -> Iterator[None]:
    """Each case stays inside a small memory budget: nothing is built to the size of a hostile number."""
    tracemalloc.start()
    try:
        yield
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < MAX_PEAK_BYTES, f"peak {peak >> 20} MiB"


def raycluster() -> dict[str, Any]:
    tpl = {"spec": {"containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
    return {
        "metadata": {"name": "rc", "namespace": NS},
        "spec": {
            "headGroupSpec": {"template": {"spec": {"containers": [{"name": "h"}]}}},
            "workerGroupSpecs": [
                {"groupName": "gpu", "replicas": 4, "minReplicas": 0, "maxReplicas": 8, "template": tpl}
            ],
        },
    }


def with_group(**fields: Any) -> dict[str, Any]:
    rc = raycluster()
    rc["spec"]["workerGroupSpecs"][0].update(fields)
    return rc


def with_spec(**fields: Any) -> dict[str, Any]:
    rc = raycluster()
    rc["spec"].update(fields)
    return rc


def with_annotations(ann: Any) -> dict[str, Any]:
    rc = raycluster()
    rc["metadata"]["annotations"] = ann
    return rc


HUGE = "9" * 5000

RAY_CASES: list[Any] = [
    pytest.param(
        with_group(replicas=2**31 - 1, maxReplicas=2**31 - 1), "over the limit", id="replicas-int32-max"
    ),
    pytest.param(
        with_group(replicas=MAX_GANG_PODS + 1, maxReplicas=2**31 - 1), "over the limit", id="limit-plus-1"
    ),
    pytest.param(
        with_group(replicas=5000, numOfHosts=5000, maxReplicas=10**4),
        r"5000 replica\(s\) x 5000 host\(s\)",
        id="replicas-x-hosts",
    ),
    pytest.param(with_group(replicas=2**31), "outside 0..2147483647", id="replicas-over-int32"),
    pytest.param(with_group(replicas=10**5000), "a number is outside", id="replicas-5000-digits"),
    pytest.param(with_group(replicas=-1), "outside 0..", id="replicas-negative"),
    pytest.param(with_group(replicas="4"), r"replicas: expected an integer, got '4'", id="replicas-string"),
    pytest.param(with_group(replicas=4.0), "replicas: expected an integer", id="replicas-float"),
    pytest.param(with_group(replicas=True), "replicas: expected an integer", id="replicas-bool"),
    pytest.param(with_group(minReplicas={"a": 1}), "minReplicas: expected an integer", id="min-mapping"),
    pytest.param(with_group(maxReplicas=[8]), "maxReplicas: expected an integer", id="max-list"),
    pytest.param(with_group(numOfHosts=HUGE), "numOfHosts: expected an integer", id="hosts-huge-string"),
    pytest.param(with_group(groupName=7), "groupName: expected a non-empty name", id="group-name-int"),
    pytest.param(with_group(template=[1, 2]), "template: expected a mapping", id="template-list"),
    pytest.param(with_group(template={"spec": "x"}), "malformed spec.containers", id="template-spec-str"),
    pytest.param(
        with_group(template={"spec": {"containers": {"a": 1}}}),
        "malformed spec.containers",
        id="containers-map",
    ),
    pytest.param(
        with_group(template={"spec": {"containers": [{"resources": [1]}]}}),
        "malformed spec.containers",
        id="resources-list",
    ),
    pytest.param(
        with_spec(workerGroupSpecs=[None]), r"workerGroupSpecs\[0\]: expected a mapping", id="group-null"
    ),
    pytest.param(
        with_spec(workerGroupSpecs=[{"groupName": f"g{i}"} for i in range(MAX_GANG_PODS + 1)]),
        "10001 worker groups",
        id="too-many-groups",
    ),
    pytest.param(with_spec(headGroupSpec="head"), "spec.headGroupSpec: expected a mapping", id="head-str"),
    pytest.param(with_spec(headGroupSpec={"template": 5}), "headGroupSpec.template", id="head-template-int"),
    pytest.param(
        {"metadata": {"name": "rc", "namespace": NS}, "spec": [1]}, "spec: expected a mapping", id="spec-list"
    ),
    pytest.param(
        with_annotations({"gpuagent.dev/subgroup-size": HUGE}), "over the limit", id="size-5000-digits"
    ),
    pytest.param(
        with_annotations({"gpuagent.dev/subgroup-tier": "9" * 40}), "is not a cluster tier", id="tier-digits"
    ),
    pytest.param(
        with_annotations({"gpuagent.dev/gang-tier": "x" * 10_000}), "unknown tier", id="tier-10k-chars"
    ),
]


@pytest.mark.parametrize(("rc", "needle"), RAY_CASES)
def test_hostile_raycluster_is_a_gang_error_naming_the_field(rc: dict[str, Any], needle: str) -> None:
    with pytest.raises(GangError, match=needle) as err:
        gang_from_raycluster(rc, [], TIERS)
    assert "RayCluster ml/rc" in str(err.value)
    assert len(str(err.value)) < 1000  # a 5000-digit number is not echoed back


def test_raycluster_annotations_of_the_wrong_type_are_ignored_not_fatal() -> None:
    for ann in ([1, 2], "x", 5):
        spec = gang_from_raycluster(with_annotations(ann), [], TIERS)
        assert spec.gang.roles[1].subgroup_tier is None


def test_hostile_ray_pod_labels_do_not_make_a_gang() -> None:
    for labels in (
        {"ray.io/cluster": 5, "ray.io/node-type": "worker"},
        {"ray.io/cluster": "", "ray.io/node-type": "worker"},
        {"ray.io/cluster": "rc", "ray.io/node-type": ["worker"]},
        [1, 2],
    ):
        assert gang_key_of({"metadata": {"name": "p", "labels": labels}}) is None
    for spec in ({"schedulingGroup": "pg"}, {"schedulingGroup": {"podGroupName": 5}}, "spec"):
        assert gang_key_of({"metadata": {"name": "p"}, "spec": spec}) is None


def test_hostile_multi_host_index_labels_are_bounded() -> None:
    rc = with_group(numOfHosts=1, replicas=4)
    pod = {
        "metadata": {
            "name": "w",
            "namespace": NS,
            "labels": {
                "ray.io/cluster": "rc",
                "ray.io/node-type": "worker",
                "ray.io/group": "gpu",
                "ray.io/worker-group-replica-index": HUGE,  # not a rank: too many digits
                "ray.io/replica-host-index": "0",
            },
        },
        "spec": {"containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
    }
    spec = gang_from_raycluster(rc, [pod], TIERS)
    assert spec.members["ml/w"].index == 0
    pod["metadata"]["labels"]["ray.io/worker-group-replica-index"] = "7"
    with pytest.raises(GangError, match=r"rank 7, outside 0..3"):
        gang_from_raycluster(rc, [pod], TIERS)


# -- native PodGroup / Workload --------------------------------------------------------------------


def native(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "schedulingPolicy": {"gang": {"minCount": 1}},
        "schedulingConstraints": {"topology": [{"key": "gpuagent.dev/nvlink-domain"}]},
        "workloadRef": {"workloadName": "w", "templateName": "t"},
    }
    base.update(spec)
    return {"metadata": {"name": "pg", "namespace": NS}, "spec": base}


NATIVE_CASES: list[Any] = [
    pytest.param(
        native(schedulingPolicy={"gang": {"minCount": 2**31 - 1}}), "over the limit", id="min-int32"
    ),
    pytest.param(
        native(schedulingPolicy={"gang": {"minCount": HUGE}}), "over the limit", id="min-5000-digits"
    ),
    pytest.param(
        native(schedulingPolicy={"gang": {"minCount": 10**5000}}), "over the limit", id="min-bignum"
    ),
    pytest.param(
        native(schedulingPolicy={"gang": {"minCount": -3}}), "expected an integer >= 1", id="min-negative"
    ),
    pytest.param(native(schedulingPolicy={"gang": {"minCount": None}}), "expected an integer", id="min-null"),
    pytest.param(native(schedulingPolicy={"gang": {"minCount": 2.5}}), "expected an integer", id="min-float"),
    pytest.param(
        native(schedulingPolicy=[{"gang": {}}]), "schedulingPolicy: expected a mapping", id="policy-list"
    ),
    pytest.param(native(schedulingPolicy={"basic": "yes"}), "basic: expected a mapping", id="basic-str"),
    pytest.param(
        native(schedulingConstraints=7), "schedulingConstraints: expected a mapping", id="constraints-int"
    ),
    pytest.param(
        native(schedulingConstraints={"topology": [{"key": "k"}] * 100_000}), "at most one", id="100k-keys"
    ),
    pytest.param(
        native(schedulingConstraints={"topology": ["key"]}),
        r"topology\[0\]: expected a mapping",
        id="key-str",
    ),
    pytest.param(
        native(schedulingConstraints={"topology": [{"key": {"a": 1}}]}),
        "expected a node-label key",
        id="key-map",
    ),
    pytest.param(
        native(schedulingConstraints={"topology": [{"key": "x" * 100_000}]}),
        "not a topology label",
        id="key-100k",
    ),
    pytest.param(native(workloadRef="w/t"), "workloadRef: expected a mapping", id="ref-str"),
    pytest.param(
        native(workloadRef={"workloadName": 1, "templateName": "t"}), "workloadName", id="ref-name-int"
    ),
    pytest.param(
        {"metadata": {"name": "pg", "namespace": NS}, "spec": None},
        "spec: expected a mapping",
        id="spec-null",
    ),
]


@pytest.mark.parametrize(("pg", "needle"), NATIVE_CASES)
def test_hostile_native_podgroup_is_a_gang_error_naming_the_field(pg: dict[str, Any], needle: str) -> None:
    pod = {"metadata": {"name": "p", "namespace": NS}, "spec": {"containers": [{"name": "c"}]}}
    with pytest.raises(GangError, match=needle) as err:
        gang_from_workload_podgroup(pg, [pod], TIERS)
    assert "PodGroup ml/pg (scheduling.k8s.io)" in str(err.value)
    assert len(str(err.value)) < 1000


def test_hostile_workloads_are_read_within_bounds() -> None:
    deep: dict[str, Any] = {"name": "leaf", "podGroupTemplates": [{"name": "t"}]}
    for _ in range(5000):  # a template tree far past the API's depth of 4
        deep = {"name": "c", "compositePodGroupTemplates": [deep]}
    odd: list[Any] = [
        {"metadata": {"name": "w", "namespace": NS}, "spec": {"compositePodGroupTemplates": [deep]}},
        {"metadata": {"name": "w", "namespace": NS}, "spec": {"podGroupTemplates": "t"}},
        {"metadata": {"name": "w", "namespace": NS}, "spec": {"podGroupTemplates": [5, None, {"name": 7}]}},
        {"metadata": {"name": "w", "namespace": NS}, "spec": [1]},
    ]
    pod = {"metadata": {"name": "p", "namespace": NS}, "spec": {"containers": [{"name": "c"}]}}
    for wl in odd:
        with pytest.raises(GangError, match="Workload ml/w has no template 't'"):
            gang_from_workload_podgroup(native(), [pod], TIERS, {"ml/w": wl})


def test_ten_thousand_and_one_pods_naming_one_native_podgroup() -> None:
    group = {"podGroupName": "pg"}
    pods = [
        {"metadata": {"name": f"p{i}", "namespace": NS}, "spec": {"schedulingGroup": group}}
        for i in range(MAX_GANG_PODS + 1)
    ]
    with pytest.raises(GangError, match="its 10001 pods is over the limit"):
        gang_for_pod(pods[0], pods, {}, TIERS, workload_podgroups={"ml/pg": native()})


# -- through the extender's state ------------------------------------------------------------------


def _state() -> ClusterState:
    s = ClusterState()
    s.replace("nodes", [node(f"n{i}", 4, labels={"gpuagent.dev/nvlink-domain": "d0"}) for i in range(4)])
    s.replace("hypernodes", [hypernode("nvl-0", 1, "nvlink", [f"n{i}" for i in range(4)])])
    return s


def _pod(labels: dict[str, str], spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": NS, "uid": "u", "labels": labels},
        "spec": {
            "schedulerName": "gpu-topology-scheduler",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}],
            **(spec or {}),
        },
    }


RAY_LABELS = {"ray.io/cluster": "rc", "ray.io/node-type": "worker", "ray.io/group": "gpu"}


@pytest.mark.parametrize(
    ("kind", "obj", "pod"),
    [
        pytest.param(
            "rayclusters",
            with_group(replicas=2**31 - 1, maxReplicas=2**31 - 1),
            _pod(RAY_LABELS),
            id="raycluster-replicas",
        ),
        pytest.param(
            "rayclusters", with_spec(workerGroupSpecs="all"), _pod(RAY_LABELS), id="raycluster-groups"
        ),
        pytest.param(
            "workload_podgroups",
            native(schedulingPolicy={"gang": {"minCount": HUGE}}),
            _pod({}, {"schedulingGroup": {"podGroupName": "pg"}}),
            id="native-min-count",
        ),
    ],
)
def test_state_answers_hostile_sources_unresolvable_and_holds_nothing(
    kind: str, obj: dict[str, Any], pod: dict[str, Any]
) -> None:
    s = _state()
    s.replace("pods", [pod])
    s.replace(kind, [obj])
    names = [f"n{i}" for i in range(4)]
    out = s.filter(pod, names, now=1.0)
    assert not out.passed
    assert set(out.unresolvable) == set(names)
    assert next(iter(out.unresolvable.values())).startswith("invalid gang: ")
    assert [e.reason for e in out.events] == ["InvalidGang"]
    assert s.reservations == {}
    assert s.held_gpus() == {}
    bind: Callable[[], Any] = lambda: s.bind(NS, "p", "u", "n0", now=2.0)  # noqa: E731
    assert bind().action == "error"


def test_the_older_sources_share_the_bounded_messages() -> None:
    """Found here: a 5000-digit JSON integer made the error message itself raise ``ValueError`` (Python
    will not print it), and an unknown tier was echoed whole; both are shared with Volcano's PodGroup
    and our annotations."""
    pod = {"metadata": {"name": "p", "namespace": NS, "annotations": {"scheduling.k8s.io/group-name": "pg"}}}
    volcano = {"metadata": {"name": "pg", "namespace": NS}, "spec": {"minMember": 10**5000}}
    with pytest.raises(GangError, match=r"spec\.minMember: a number is over the limit"):
        gang_from_podgroup(volcano, [pod], TIERS)
    volcano["spec"]["minMember"] = -(10**5000)
    with pytest.raises(
        GangError, match=r"spec\.minMember: expected an integer >= 0, got an integer of 16610 bits"
    ):
        gang_from_podgroup(volcano, [pod], TIERS)
    ann = {"gpuagent.dev/gang": "g", "gpuagent.dev/subgroup-tier": "x" * 100_000}
    with pytest.raises(GangError, match="unknown tier") as err:
        gang_from_annotations(
            "ml/g", [{"metadata": {"name": "p", "namespace": NS, "annotations": ann}}], TIERS
        )
    assert len(str(err.value)) < 300
