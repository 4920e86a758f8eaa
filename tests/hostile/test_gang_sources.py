"""Hostile RayClusters, native ``scheduling.k8s.io`` Workloads / PodGroups and Volcano PodGroups' label
selectors and role counts fed to the extender's gang sources: replicas of two billion, counts with
thousands of digits, wrong JSON types everywhere, ten thousand worker groups, 15,000 subgroup policies,
templates nested past any depth, labels and selectors that are not strings. Each is a
``GangError`` (or a wait, for what the operator will fix) naming the object and the field, within a
few seconds and a few MiB, never a crash or a plan the size of the number; through the
extender's state the pod is answered unresolvable with an ``InvalidGang`` Event and nothing is held."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from scheduler_plugin import gangs as gangs_module
from scheduler_plugin.extender import ExtenderState
from scheduler_plugin.gangs import (
    DEFAULT_ROLE,
    MAX_GANG_ROLES,
    GangError,
    gang_for_pod,
    gang_from_annotations,
    gang_from_podgroup,
    gang_from_raycluster,
    gang_from_workload_podgroup,
    gang_key_of,
)
from scheduler_plugin.snapshot import MAX_GANG_PODS
from tests.hostile.test_extender import Served, run
from tests.integration.fakekube import hypernode, node, pod

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


def _state() -> ExtenderState:
    s = ExtenderState()
    s.cache.replace(
        "nodes", [node(f"n{i}", 4, labels={"gpuagent.dev/nvlink-domain": "d0"}) for i in range(4)]
    )
    s.cache.replace("hypernodes", [hypernode("nvl-0", 1, "nvlink", [f"n{i}" for i in range(4)])])
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
    s.cache.replace("pods", [pod])
    s.cache.replace(kind, [obj])
    names = [f"n{i}" for i in range(4)]
    out = s.filter(pod, names, now=1.0)
    assert not out.passed
    assert set(out.unresolvable) == set(names)
    assert next(iter(out.unresolvable.values())).startswith("invalid gang: ")
    assert [e.reason for e in out.events] == ["InvalidGang"]
    assert s.holds.started == {}
    assert s.holds.held_gpus() == {}
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


# -- Volcano subGroupPolicy label selectors (issue 26 item 12) -------------------------------------


def volcano(*policies: Any, name: str = "pg", namespace: str = NS) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"subGroupPolicy": list(policies)}}


def worker(selector: Any, **policy: Any) -> dict[str, Any]:
    return {"name": "w", "subGroupSize": 1, "labelSelector": selector, **policy}


def grouped(name: str, *, group: str = "pg", namespace: str = NS, **labels: str) -> dict[str, Any]:
    return pod(
        name, 4, namespace=namespace, annotations={"scheduling.k8s.io/group-name": group}, labels=labels
    )


def expr(key: Any = "r", operator: Any = "In", values: Any = ("w",)) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values is not None:
        out["values"] = list(values) if isinstance(values, tuple) else values
    return out


MANY = [f"v{i}" for i in range(100_000)]
SEL = r"spec\.subGroupPolicy\[0\]\.labelSelector"

SELECTOR_CASES: list[Any] = [
    pytest.param(
        {"matchExpressions": [expr(values="abc")]},
        rf"{SEL}\.matchExpressions\[0\]\.values: expected a list of strings, got 'abc'",
        id="values-a-string",
    ),
    pytest.param(
        {"matchExpressions": "r in (w)"},
        rf"{SEL}\.matchExpressions: expected a list, got 'r in \(w\)'",
        id="expressions-a-string",
    ),
    pytest.param(
        {"matchExpressions": {"key": "r"}}, rf"{SEL}\.matchExpressions: expected a list", id="expressions-map"
    ),
    pytest.param(
        {"matchLabels": ["r", "w"]}, rf"{SEL}\.matchLabels: expected a mapping", id="match-labels-a-list"
    ),
    pytest.param({"matchLabels": "r=w"}, rf"{SEL}\.matchLabels: expected a mapping", id="match-labels-str"),
    pytest.param(
        {"matchLabels": {5: "w"}}, rf"{SEL}\.matchLabels: expected label keys that are strings", id="key-int"
    ),
    pytest.param(
        {"matchLabels": {"r": ["w"]}}, rf"{SEL}\.matchLabels\[r\]: expected a string", id="value-list"
    ),
    pytest.param({"matchLabels": {"r": 5}}, rf"{SEL}\.matchLabels\[r\]: expected a string", id="value-int"),
    pytest.param(
        {"matchLabels": {"r": None}}, rf"{SEL}\.matchLabels\[r\]: expected a string", id="value-null"
    ),
    pytest.param(
        {"matchExpressions": ["r"]}, rf"{SEL}\.matchExpressions\[0\]: expected a mapping", id="expression-str"
    ),
    pytest.param(
        {"matchExpressions": [expr(key=5)]},
        rf"{SEL}\.matchExpressions\[0\]\.key: expected",
        id="expr-key-int",
    ),
    pytest.param(
        {"matchExpressions": [expr(key=None)]}, rf"{SEL}\.matchExpressions\[0\]\.key", id="expr-key-missing"
    ),
    pytest.param(
        {"matchExpressions": [expr(values=["w", 5])]},
        rf"{SEL}\.matchExpressions\[0\]\.values\[1\]: expected a string",
        id="expr-value-int",
    ),
    pytest.param(
        {"matchExpressions": [expr(values=[["w"]])]},
        rf"{SEL}\.matchExpressions\[0\]\.values\[0\]: expected a string",
        id="expr-value-list",
    ),
    pytest.param(
        {"matchExpressions": [expr(operator="Gt")]},
        r"operator: unknown operator 'Gt' \(one of In, NotIn, Exists, DoesNotExist\)",
        id="operator-unknown",
    ),
    pytest.param(
        {"matchExpressions": [expr(operator=["In"])]}, r"operator: unknown operator list", id="operator-list"
    ),
    pytest.param(
        {"matchExpressions": [expr(operator=None)]}, r"operator: unknown operator None", id="operator-missing"
    ),
    pytest.param(
        {"matchExpressions": [expr(values=[])]}, r"values: operator In needs at least one", id="in-no-values"
    ),
    pytest.param(
        {"matchExpressions": [expr(operator="Exists")]},
        r"values: operator Exists takes no values",
        id="exists-with-values",
    ),
    pytest.param("app=train", rf"{SEL}: expected a label selector", id="selector-a-string"),
    pytest.param([{"matchLabels": {}}], rf"{SEL}: expected a label selector", id="selector-a-list"),
    pytest.param(
        {"matchExpressions": [expr(values=MANY)]},
        r"values: 100000 values take the PodGroup over the limit of 256 label terms",
        id="values-100k",
    ),
    pytest.param(
        {"matchLabels": dict.fromkeys(MANY, "x")},
        rf"{SEL}: 100000 matchLabels and 0 matchExpressions take the PodGroup over the limit of 256",
        id="match-labels-100k",
    ),
    pytest.param(
        {"matchExpressions": [expr()] * 100_000},
        rf"{SEL}: 0 matchLabels and 100000 matchExpressions take the PodGroup over the limit",
        id="expressions-100k",
    ),
]


@pytest.mark.parametrize(("selector", "needle"), SELECTOR_CASES)
def test_malformed_label_selector_is_a_gang_error_naming_the_field(selector: Any, needle: str) -> None:
    """Found here: ``values: "abc"`` matched by substring, and a string expression or a list
    ``matchLabels`` raised ``AttributeError`` out of the gang source."""
    with pytest.raises(GangError, match=needle) as err:
        gang_from_podgroup(volcano(worker(selector)), [grouped("p0", r="w")], TIERS)
    assert str(err.value).startswith("PodGroup ml/pg: spec.subGroupPolicy[0]")
    assert len(str(err.value)) < 1000


@pytest.mark.parametrize(
    ("policy", "needle"),
    [
        pytest.param(
            {"matchLabelKeys": "r"}, r"matchLabelKeys: expected a list of label keys, got 'r'", id="keys-str"
        ),
        pytest.param({"matchLabelKeys": [5]}, r"matchLabelKeys\[0\]: expected a label key", id="keys-int"),
        pytest.param(
            {"matchLabelKeys": MANY}, "matchLabelKeys: 100000 keys take the PodGroup over", id="keys-100k"
        ),
        pytest.param({"name": ["w"]}, r"\.name: expected a name, got list", id="name-list"),
    ],
)
def test_malformed_policy_fields_are_gang_errors(policy: dict[str, Any], needle: str) -> None:
    with pytest.raises(GangError, match=needle):
        gang_from_podgroup(volcano(worker(None, **policy)), [grouped("p0", r="w")], TIERS)


def test_selector_terms_are_bounded_per_podgroup_not_per_policy() -> None:
    values = [f"v{i}" for i in range(100)]
    policies = [
        {"name": f"s{i}", "labelSelector": {"matchExpressions": [expr(values=values)]}} for i in range(3)
    ]
    with pytest.raises(GangError, match=r"subGroupPolicy\[2\]\.labelSelector\.matchExpressions\[0\]\.values"):
        gang_from_podgroup(volcano(*policies), [grouped("p0", r="w")], TIERS)
    spec = gang_from_podgroup(volcano(*policies[:2]), [grouped("p0", r="w")], TIERS)  # 2 x 101 terms
    assert [r.name for r in spec.gang.roles] == [DEFAULT_ROLE]


def test_unforeseen_shapes_are_that_gangs_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last line of defence: whatever a source raises that no check foresaw is a ``GangError`` of
    that gang (so the extender answers it ``InvalidGang``), never an exception out of the queue pass."""

    def broken(*_: Any) -> Any:
        raise AttributeError("'str' object has no attribute 'get'")

    monkeypatch.setattr(gangs_module, "gang_from_podgroup", broken)
    p = grouped("p0")
    with pytest.raises(GangError, match=r"podgroup gang ml/pg: malformed object, not read \(AttributeError"):
        gang_for_pod(p, [p], {"ml/pg": volcano()}, TIERS)


def _two_namespaces(*bad_policies: Any) -> tuple[ExtenderState, dict[str, Any], dict[str, Any]]:
    """A hostile PodGroup in namespace ``evil`` and a good two-pod gang in ``ml``, both pending."""
    s = _state()
    good = [grouped(f"g{i}", r="w") for i in range(2)]
    bad = grouped("b0", namespace="evil", r="w")
    s.cache.replace("pods", [*good, bad])
    good_policy = worker({"matchLabels": {"r": "w"}}, subGroupSize=2)
    s.cache.replace(
        "podgroups",
        [
            {
                "metadata": {"name": "pg", "namespace": NS},
                "spec": {"minMember": 2, "subGroupPolicy": [good_policy]},
            },
            volcano(*bad_policies, namespace="evil"),
        ],
    )
    return s, good[0], bad


STATE_SELECTORS = [
    pytest.param(p.values[0], id=p.id)
    for p in SELECTOR_CASES
    if p.id
    in (
        "values-a-string",
        "expressions-a-string",
        "match-labels-a-list",
        "key-int",
        "operator-unknown",
        "values-100k",
    )
]


@pytest.mark.parametrize("selector", STATE_SELECTORS)
def test_a_malformed_selector_is_invalid_for_its_gang_only(selector: Any) -> None:
    s, good, bad = _two_namespaces(worker(selector))
    names = [f"n{i}" for i in range(4)]
    s.queue.run_pass(1.0)  # every gang's pass: used to raise for all namespaces
    out = s.filter(bad, names, now=1.0)
    assert set(out.unresolvable) == set(names)
    assert "spec.subGroupPolicy[0].labelSelector" in out.unresolvable["n0"]
    assert [e.reason for e in out.events] == ["InvalidGang"]
    assert s.filter(bad, names, now=1.5).events == []  # one Event, not one per filter
    ok = s.filter(good, names, now=2.0)
    assert len(ok.passed) == 1, ok
    assert set(s.holds.started) == {"ml/pg"}


def test_filter_answers_200_beside_a_malformed_selector() -> None:
    """Over HTTP: the hostile group's pod is answered (unresolvable, one ``InvalidGang`` Event), the
    other namespace's gang is planned, and the server keeps serving."""
    s, good, bad = _two_namespaces(worker({"matchExpressions": [expr(values="abc")]}))
    names = [f"n{i}" for i in range(4)]

    async def test(srv: Served) -> None:
        for _ in range(2):
            status, out = await srv.post("filter", {"Pod": bad, "NodeNames": names})
            assert status == 200, out
            assert "values: expected a list of strings" in out["FailedAndUnresolvableNodes"]["n0"]
        status, out = await srv.post("filter", {"Pod": good, "NodeNames": names})
        assert status == 200, out
        assert len(out["NodeNames"]) == 1
        await asyncio.sleep(0.05)
        assert [(p, r) for p, r, _ in srv.cluster.events if r == "InvalidGang"] == [("b0", "InvalidGang")]

    run(test, s)


# -- roles and policies per gang (issue 26 item 13) ------------------------------------------------


class Watched(dict[str, Any]):
    """A mapping that counts every read of a key, to show what a refused gang never reads."""

    def __init__(self, reads: list[int], fields: dict[str, Any]) -> None:
        super().__init__(fields)
        self.reads = reads

    def get(self, key: str, default: Any = None) -> Any:
        self.reads[0] += 1
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.reads[0] += 1
        return super().__getitem__(key)


BOUND = f"limit of {MAX_GANG_ROLES} roles per gang"


def test_fifteen_thousand_subgroup_policies_are_refused_before_any_is_read() -> None:
    reads = [0]
    policies = [
        Watched(reads, {"name": f"s{i}", "labelSelector": {"matchLabels": {"r": f"x{i}"}}})
        for i in range(15_000)
    ]
    pods = [grouped(f"p{i}", r="w") for i in range(100)]
    with pytest.raises(
        GangError, match=r"PodGroup ml/pg: spec\.subGroupPolicy: 15000 entries is over the limit"
    ) as err:
        gang_from_podgroup(volcano(*policies), pods, TIERS)
    assert BOUND in str(err.value)
    assert reads == [0]


def test_subgroup_policies_up_to_the_bound_plan() -> None:
    policies = [worker({"matchLabels": {"r": f"x{i}"}}, name=f"s{i}") for i in range(MAX_GANG_ROLES + 1)]
    pods = [grouped(f"p{i}", r=f"x{i}") for i in range(MAX_GANG_ROLES + 1)]
    spec = gang_from_podgroup(volcano(*policies[:MAX_GANG_ROLES]), pods[:MAX_GANG_ROLES], TIERS)
    assert len(spec.gang.roles) == MAX_GANG_ROLES
    with pytest.raises(GangError, match=f"{MAX_GANG_ROLES + 1} entries is over the {BOUND}"):
        gang_from_podgroup(volcano(*policies), pods, TIERS)
    with pytest.raises(GangError, match=f"its {MAX_GANG_ROLES + 1} roles is over the {BOUND}"):  # + default
        gang_from_podgroup(volcano(*policies[:MAX_GANG_ROLES]), pods, TIERS)


def test_nine_thousand_999_worker_groups_are_refused_before_any_is_read() -> None:
    reads = [0]
    tpl = raycluster()["spec"]["workerGroupSpecs"][0]["template"]
    rc = with_spec(
        workerGroupSpecs=[
            Watched(reads, {"groupName": f"g{i}", "replicas": 1, "template": tpl}) for i in range(9_999)
        ]
    )
    field = "RayCluster ml/rc: spec.workerGroupSpecs"
    with pytest.raises(GangError, match=f"{field}: 9999 worker groups with the head is over the {BOUND}"):
        gang_from_raycluster(rc, [], TIERS)
    assert reads == [0]
    groups = [
        {"groupName": f"g{i}", "replicas": 1, "maxReplicas": 1, "template": tpl}
        for i in range(MAX_GANG_ROLES)
    ]
    assert (
        len(gang_from_raycluster(with_spec(workerGroupSpecs=groups[:-1]), [], TIERS).gang.roles)
        == MAX_GANG_ROLES
    )
    with pytest.raises(GangError, match=BOUND):
        gang_from_raycluster(with_spec(workerGroupSpecs=groups), [], TIERS)


def test_more_roles_than_the_bound_by_annotation_or_pod_shape_are_refused() -> None:
    ann = [
        pod(f"p{i}", 1, namespace=NS, annotations={"gpuagent.dev/gang": "g", "gpuagent.dev/role": f"r{i}"})
        for i in range(MAX_GANG_ROLES + 1)
    ]
    assert len(gang_from_annotations("ml/g", ann[:MAX_GANG_ROLES], TIERS).gang.roles) == MAX_GANG_ROLES
    with pytest.raises(
        GangError, match=f"gang ml/g: gpuagent.dev/role: 101 different roles is over the {BOUND}"
    ):
        gang_from_annotations("ml/g", ann, TIERS)
    group = {"podGroupName": "pg"}
    shapes = [
        {**pod(f"p{i}", i + 1, namespace=NS), "spec": {**pod("x", i + 1)["spec"], "schedulingGroup": group}}
        for i in range(MAX_GANG_ROLES + 1)
    ]
    pg = native(workloadRef=None)
    assert len(gang_from_workload_podgroup(pg, shapes[:MAX_GANG_ROLES], TIERS).gang.roles) == MAX_GANG_ROLES
    with pytest.raises(GangError, match=f"pods of 101 different shapes .* is over the {BOUND}"):
        gang_from_workload_podgroup(pg, shapes, TIERS)


def test_an_over_bound_gang_is_invalid_for_itself_only_with_one_event() -> None:
    policies = [worker({"matchLabels": {"r": f"x{i}"}}, name=f"s{i}") for i in range(15_000)]
    s, good, bad = _two_namespaces(*policies)
    names = [f"n{i}" for i in range(4)]
    s.queue.run_pass(1.0)
    out = s.filter(bad, names, now=1.0)
    assert set(out.unresolvable) == set(names)
    assert f"15000 entries is over the {BOUND}" in out.unresolvable["n0"]
    assert [e.reason for e in out.events] == ["InvalidGang"]
    assert s.filter(bad, names, now=1.5).events == []
    assert len(s.filter(good, names, now=2.0).passed) == 1
    assert set(s.holds.started) == {"ml/pg"}
