"""The extender command's wiring of the gang sources: informers for KubeRay RayClusters and the native
``scheduling.k8s.io`` Workloads / PodGroups feed ``ExtenderState``; an API that is not served (404) is
that source off -- logged once, synced as empty, no crash -- and is picked up when it appears. Real HTTP
against the fake Kubernetes API server of ``tests/integration``; the gang decisions through the real
``filter`` verb."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from agent.commands import extender as command
from tests.integration import fakekube
from tests.integration.fakekube import FakeKube, hypernode, node, pod
from tests.integration.test_extender_http import Running, wait_for
from topology.kube import KubeError

NODES = [f"r{r}-t{t}" for r in range(3) for t in range(4)]
DRA_KINDS = ("deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices")
SOURCE_PATHS = {
    command.RAYCLUSTERS: "rayclusters",
    command.WORKLOADS: "workloads",
    command.WORKLOAD_PODGROUPS: "workload_podgroups",
}


def _cluster(fake: FakeKube) -> None:
    for n in NODES:
        fake.put("nodes", node(n, 4))
    for r in range(3):
        fake.put("hypernodes", hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t{t}" for t in range(4)]))


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKube]:
    """A fake API server that serves the RayCluster and scheduling.k8s.io collections too."""
    for path, kind in SOURCE_PATHS.items():
        monkeypatch.setitem(fakekube.PATHS, path, kind)
    kube = FakeKube()
    _cluster(kube)
    kube.start()
    yield kube
    kube.stop()


def _source_logs(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return sorted(
        str(getattr(r, "gna_fields", {}).get("kind"))
        for r in caplog.records
        if getattr(r, "gna_event", "") == event
    )


def test_sources_not_served_are_off_logged_once_and_synced(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpu_node_agent")
    fake = FakeKube()  # serves nodes, pods, HyperNodes and Volcano PodGroups only
    _cluster(fake)
    fake.start()
    ext = Running(fake)  # returns once every informer is synced
    try:
        by_kind = {i.kind: i for i in ext.service.informers if isinstance(i, command.SourceInformer)}
        wait_for(
            lambda: fake.requests.count(("GET", command.RAYCLUSTERS)) >= 3, "RayClusters looked for again"
        )
        assert {k for k, i in by_kind.items() if i.state == "not_served"} == {
            "rayclusters",
            "workloads",
            "workload_podgroups",
            "jobs",  # batch/v1 Jobs (time limits for the queue), not served by this fake either
            "pdbs",  # policy/v1 PodDisruptionBudgets (what preemption must keep), nor these
            *DRA_KINDS,  # resource.k8s.io/v1 (GPUs through claims), nor these
        }
        assert _source_logs(caplog, "source_off") == sorted(
            ["jobs", "pdbs", "rayclusters", "workload_podgroups", "workloads", *DRA_KINDS]
        )
        # the sources being off changes nothing for the others: a pod on its own still passes
        p = pod("solo", 4)
        fake.put("pods", p)
        wait_for(lambda: ext.state(lambda s: "default/solo" in s.cache.pods), "informer sees the pod")
        assert len(ext.filter(p, NODES)["NodeNames"]) == len(NODES)
    finally:
        ext.stop()
        fake.stop()


def test_a_source_that_appears_is_picked_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpu_node_agent")
    fake = FakeKube()
    _cluster(fake)
    fake.start()
    ext = Running(fake)
    try:
        wait_for(lambda: _source_logs(caplog, "source_off").count("rayclusters") == 1, "source_off logged")
        # the CRD gets installed: the same server now serves the collection
        monkeypatch.setitem(fakekube.PATHS, command.RAYCLUSTERS, "rayclusters")
        fake.objects["rayclusters"] = {}
        fake.put("rayclusters", _raycluster())
        wait_for(
            lambda: ext.state(lambda s: "ml/rc" in s.cache.rayclusters),
            "the RayCluster reaches the state",
            40.0,
        )
        # the informer's list feeds the state before the informer says the source is back: wait for both
        wait_for(lambda: _source_logs(caplog, "source_on") == ["rayclusters"], "source_on logged", 10.0)
        assert _source_logs(caplog, "source_off").count("rayclusters") == 1  # once, not per retry
    finally:
        ext.stop()
        fake.stop()


def _template(gpus: int, ann: dict[str, str] | None = None) -> dict[str, Any]:
    res = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {"requests": {"cpu": "1"}}
    return {
        "metadata": {"annotations": ann or {}},
        "spec": {
            "schedulerName": "gpu-topology-scheduler",
            "containers": [{"name": "ray", "image": "x", "resources": res}],
        },
    }


def _raycluster() -> dict[str, Any]:
    nvlink = {"gpuagent.dev/subgroup-tier": "nvlink"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "rc", "namespace": "ml"},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": _template(0)},
            "workerGroupSpecs": [
                {
                    "groupName": g,
                    "replicas": 4,
                    "minReplicas": 4,
                    "maxReplicas": 4,
                    "template": _template(4, nvlink),
                }
                for g in ("a", "b")
            ],
        },
    }


def _ray_pod(name: str, group: str) -> dict[str, Any]:
    head = group == "headgroup"
    return pod(
        name,
        0 if head else 4,
        namespace="ml",
        labels={
            "ray.io/cluster": "rc",
            "ray.io/node-type": "head" if head else "worker",
            "ray.io/group": group,
        },
        annotations={"gpuagent.dev/subgroup-tier": "nvlink"} if not head else {},
    )


def test_raycluster_gang_through_filter(served: FakeKube) -> None:
    ext = Running(served)
    try:
        served.put("rayclusters", _raycluster())
        pods = [_ray_pod("rc-head", "headgroup")] + [
            _ray_pod(f"rc-{g}-{i}", g) for g in ("a", "b") for i in range(4)
        ]
        for p in pods:
            served.put("pods", p)
        wait_for(
            lambda: ext.state(lambda s: len(s.cache.pods) == len(pods) and "ml/rc" in s.cache.rayclusters),
            "informers see the RayCluster and its pods",
        )
        placed = {p["metadata"]["name"]: ext.filter_gang(p, NODES)["NodeNames"] for p in pods}
        assert all(len(n) == 1 for n in placed.values()), placed
        for g in ("a", "b"):
            assert len({placed[f"rc-{g}-{i}"][0].split("-")[0] for i in range(4)}) == 1, placed
        assert placed["rc-a-0"][0].split("-")[0] != placed["rc-b-0"][0].split("-")[0]
    finally:
        ext.stop()


def test_native_podgroup_gang_through_filter(served: FakeKube) -> None:
    ext = Running(served)
    try:
        served.put(
            "workloads",
            {
                "metadata": {"name": "train", "namespace": "ml"},
                "spec": {
                    "podGroupTemplates": [{"name": "workers", "schedulingPolicy": {"gang": {"minCount": 4}}}]
                },
            },
        )
        served.put(
            "workload_podgroups",
            {
                "metadata": {"name": "train-workers-0", "namespace": "ml"},
                "spec": {
                    "workloadRef": {"workloadName": "train", "templateName": "workers"},
                    "schedulingPolicy": {"gang": {"minCount": 4}},
                    "schedulingConstraints": {"topology": [{"key": "gpuagent.dev/nvlink-domain"}]},
                },
            },
        )
        pods = []
        for i in range(4):
            p = pod(f"w{i}", 4, namespace="ml")
            p["spec"]["schedulingGroup"] = {"podGroupName": "train-workers-0"}
            pods.append(p)
            served.put("pods", p)
        wait_for(
            lambda: ext.state(
                lambda s: len(s.cache.pods) == 4 and s.cache.workload_podgroups and s.cache.workloads
            ),
            "informers see the Workload, PodGroup and pods",
        )
        nodes = [ext.filter_gang(p, NODES)["NodeNames"] for p in pods]
        assert all(len(n) == 1 for n in nodes)
        assert len({n[0].split("-")[0] for n in nodes}) == 1
    finally:
        ext.stop()


class _Answers:
    """A ``Kube`` whose list answers come from a script: a status to refuse with, or items."""

    def __init__(self, *answers: int | list[dict[str, Any]]) -> None:
        self.answers = list(answers)

    def list(self, path: str, *, label_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        answer = self.answers.pop(0)
        if isinstance(answer, int):
            raise KubeError(answer, f"{path} refused")
        return answer, "7"


class _Sink:
    def __init__(self) -> None:
        self.replaced: list[list[dict[str, Any]]] = []

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.replaced.append(items)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        raise AssertionError("no watch here")


def test_forbidden_or_missing_optional_source_is_off_and_logged_on_each_change_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gpu_node_agent")
    kube = _Answers(403, 403, 404, 404, [{"metadata": {"name": "rc"}}], 403)
    inf = command.SourceInformer(kube, command.RAYCLUSTERS, _Sink(), kind="rayclusters", optional=True)  # type: ignore[arg-type]
    states = []
    for _ in range(6):
        inf.list_once()
        states.append(inf.state)
    assert states == ["forbidden", "forbidden", "not_served", "not_served", "served", "forbidden"]
    events = [
        getattr(r, "gna_event", "")
        for r in caplog.records
        if getattr(r, "gna_event", "").startswith("source_")
    ]
    assert events == ["source_forbidden", "source_off", "source_on", "source_forbidden"]
    forbidden = next(r for r in caplog.records if getattr(r, "gna_event", "") == "source_forbidden")
    assert "extender-rbac.yaml" in str(getattr(forbidden, "gna_fields", {}).get("detail"))


def test_a_required_kind_is_never_off() -> None:
    inf = command.SourceInformer(_Answers(403), command.PODS, _Sink(), kind="pods", optional=False)  # type: ignore[arg-type]
    with pytest.raises(KubeError):
        inf.list_once()
    inf = command.SourceInformer(_Answers(404), command.PODS, _Sink(), kind="pods", optional=False)  # type: ignore[arg-type]
    with pytest.raises(KubeError):
        inf.list_once()
