"""Which running work the extender's queue may preempt, and as what: whole workloads the extender does
not know as gangs, never a DaemonSet's or a static pod nor a namespace preemption may not take from,
never a victim set a PodDisruptionBudget would refuse, and eviction counts that belong to one job, not
to a name.

Cluster as in ``test_extender_queue``: two NVLink domains (nvl-0: r0-t0..3, nvl-1: r1-t0..3) of four
4-GPU nodes; ``preemption_cluster`` runs lo0 and lo1 in nvl-0 and lo2 plus a lone pod in nvl-1, where
evicting costs least."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.extender import ExtenderState
from scheduler_plugin.queue import QueueConfig
from scheduler_plugin.queueing import VictimSet, never_victim, victim_group
from tests.integration.fakekube import pod
from tests.scheduler_plugin.test_extender_queue import (
    NODES,
    T0,
    make_state,
    member,
    preemption_cluster,
    solo,
    timed,
)

NVL1 = NODES[4:]


def hi_gang(name: str = "hi", at: float = T0) -> list[dict[str, Any]]:
    return [member(name, i, priority=1000, at=at) for i in range(4)]


def evicted(s: ExtenderState, now: float) -> set[str]:
    return {e.pod["metadata"]["name"] for e in s.queue.tick(now).evictions}


def owned(p: dict[str, Any], kind: str, name: str, uid: str | None = None) -> dict[str, Any]:
    p["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": kind, "name": name, "uid": uid or f"uid-{name}", "controller": True}
    ]
    return p


def pdb(name: str, selector: dict[str, Any] | None, allowed: int, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "default", **meta},
        "spec": {"selector": selector} if selector is not None else {},
        "status": {"disruptionsAllowed": allowed, "observedGeneration": 1},
    }


def labelled(pods: list[dict[str, Any]], prefix: str, **labels: str) -> list[dict[str, Any]]:
    for p in pods:
        if p["metadata"]["name"].startswith(prefix):
            p["metadata"]["labels"].update(labels)
    return pods


# -- item 8: what an eviction cannot free, or may not take ---------------------------------------------
def _lone_as(kind: str) -> tuple[list[dict[str, Any]], frozenset[str] | None]:
    """The preemption cluster with its lone pod (the cheapest victim, in the cheaper domain) made one
    that is never a victim."""
    pods = [p for p in preemption_cluster() if p["metadata"]["name"] != "lone"]
    lone = solo("lone", 4, on="r1-t3", at=T0)
    namespaces = None
    if kind == "daemonset":
        owned(lone, "DaemonSet", "gpu-burner")
    elif kind == "mirror-owner":
        owned(lone, "Node", "r1-t3")
    elif kind == "mirror-annotation":
        lone["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "0123abcd"
    elif kind == "namespace":
        lone = timed(pod("lone", 4, namespace="infra", node_name="r1-t3"), created=T0, started=T0)
        namespaces = frozenset({"default"})
    return [*pods, lone], namespaces


@pytest.mark.parametrize("kind", ["daemonset", "mirror-owner", "mirror-annotation", "namespace"])
def test_daemonset_static_and_not_allowed_pods_are_never_victims(kind: str) -> None:
    pods, namespaces = _lone_as(kind)
    s = make_state(pods, config=QueueConfig(preempt_after_s=0))
    s.preempt.namespaces = namespaces
    for p in hi_gang():
        s.cache.apply("pods", "ADDED", p)
    got = evicted(s, T0 + 10)
    assert "lone" not in got
    # nvl-1 cannot free without the lone pod: the whole of nvl-0 goes instead
    assert got == {"lo0-0", "lo0-1", "lo1-0", "lo1-1"}


def test_with_only_such_pods_in_the_way_nothing_is_evicted() -> None:
    pods = [owned(solo(f"ds-{n}", 4, on=n, at=T0), "DaemonSet", "gpu-burner") for n in NODES]
    s = make_state([*pods, *hi_gang()], config=QueueConfig(preempt_after_s=0))
    assert evicted(s, T0 + 10) == set()


def test_kube_schedulers_own_preemption_gets_no_daemonset_or_static_victims() -> None:
    ds = owned(solo("ds", 4, on="r1-t3", at=T0), "DaemonSet", "gpu-burner")
    s = make_state([ds, solo("urgent", 4, at=T0 + 5)])
    victims = {"r1-t3": VictimSet((ds["metadata"]["uid"],), 0)}
    assert s.preempt(s.cache.pods["default/urgent"], victims, T0 + 5) == {}


def test_never_victim_reasons_name_the_owner_and_the_namespace() -> None:
    ds = owned(pod("x", 1), "DaemonSet", "exporter")
    assert never_victim(ds, None) == "owned by DaemonSet exporter"
    assert never_victim(pod("y", 1, namespace="kube-system"), frozenset({"ml"})) == (
        "namespace kube-system is not one preemption may take from"
    )
    assert never_victim(pod("z", 1, namespace="ml"), frozenset({"ml"})) is None
    # an owner that does not say it is the controller does not count as one
    ref = ds["metadata"]["ownerReferences"][0]
    ref["controller"] = False
    assert never_victim(ds, None) is None


# -- item 9: workloads the extender does not know as gangs are evicted whole ---------------------------
def _split_workload(how: str) -> list[dict[str, Any]]:
    """A 4-pod workload the extender does not know as a gang, two pods in each domain (the cheapest
    work there: it started last), beside older gangs."""
    pods = [member("old0", i, size=2, on=f"r0-t{2 + i}", at=T0 - 1000) for i in range(2)]
    pods += [member("old1", i, size=2, on=f"r1-t{2 + i}", at=T0 - 1000) for i in range(2)]
    for i, n in enumerate(["r0-t0", "r0-t1", "r1-t0", "r1-t1"]):
        p = solo(f"wl-{i}", 4, on=n, at=T0)
        labels = p["metadata"]["labels"]
        if how == "jobset":
            labels["jobset.sigs.k8s.io/jobset-name"] = "wl"
            owned(p, "Job", f"wl-workers-{i // 2}")  # a JobSet's two Jobs: grouped by the JobSet
        elif how == "mpijob":
            labels["training.kubeflow.org/job-name"] = "wl"
            owned(p, "MPIJob", "wl")
        elif how == "kueue":
            labels["kueue.x-k8s.io/pod-group-name"] = "wl"
        elif how == "coscheduling":
            labels["scheduling.x-k8s.io/pod-group"] = "wl"
        elif how == "job":
            owned(p, "Job", "wl")
        pods.append(p)
    return pods


@pytest.mark.parametrize("how", ["jobset", "mpijob", "kueue", "coscheduling", "job"])
def test_a_workload_the_extender_does_not_know_as_a_gang_is_evicted_whole(how: str) -> None:
    hi = [member("hi", i, size=2, priority=1000, at=T0) for i in range(2)]
    s = make_state([*_split_workload(how), *hi], config=QueueConfig(preempt_after_s=0))
    actions = s.queue.tick(T0 + 10)
    got = {e.pod["metadata"]["name"] for e in actions.evictions}
    assert got == {f"wl-{i}" for i in range(4)}  # all four, never the two in one domain
    assert len({e.victim for e in actions.evictions}) == 1


def test_a_replicasets_pods_are_independent_replicas() -> None:
    pods = _split_workload("none")
    for p in pods:
        if p["metadata"]["name"].startswith("wl-"):
            owned(p, "ReplicaSet", "serve-7d9f")
    hi = [member("hi", i, size=2, priority=1000, at=T0) for i in range(2)]
    s = make_state([*pods, *hi], config=QueueConfig(preempt_after_s=0))
    got = evicted(s, T0 + 10)
    assert len(got) == 2
    assert got <= {f"wl-{i}" for i in range(4)}


def test_kube_schedulers_own_preemption_never_takes_part_of_a_workload() -> None:
    pods = _split_workload("jobset")
    s = make_state([*pods, solo("urgent", 4, at=T0 + 5)])
    uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    half = {"r0-t0": VictimSet((uid["wl-0"],), 0)}
    assert s.preempt(s.cache.pods["default/urgent"], half, T0 + 5) == {}


def test_victim_group_names_the_outermost_workload() -> None:
    p = owned(pod("w", 1, labels={"jobset.sigs.k8s.io/jobset-name": "js"}), "Job", "js-workers-0")
    assert victim_group(p) == "jobset:default/js"
    assert victim_group(owned(pod("w", 1), "Job", "train")) == "job:default/train"
    assert victim_group(owned(pod("w", 1), "ReplicaSet", "serve")) is None
    assert victim_group(pod("w", 1)) is None
    long = pod("w", 1, labels={"kueue.x-k8s.io/pod-group-name": "g" * 5000})
    assert len(victim_group(long) or "") < 300  # a hostile value is cut, never kept whole


# -- item 7: disruption budgets are read before anything is evicted ------------------------------------
def test_a_gang_its_budget_protects_is_no_victim() -> None:
    pods = labelled(preemption_cluster(), "lo2-", app="lo2")
    s = make_state([*pods, *hi_gang()], config=QueueConfig(preempt_after_s=0))
    s.cache.replace("pdbs", [pdb("lo2", {"matchLabels": {"app": "lo2"}}, 1)])  # 1 of its 3 pods at a time
    got = evicted(s, T0 + 10)
    assert not {"lo2-0", "lo2-1", "lo2-2"} & got  # never a first pod with the rest refused
    assert got == {"lo0-0", "lo0-1", "lo1-0", "lo1-1"}


@pytest.mark.parametrize(
    "budget",
    [
        pytest.param(pdb("all", {}, 0), id="empty-selector-selects-every-pod"),
        pytest.param(
            pdb("expr", {"matchExpressions": [{"key": "app", "operator": "In", "values": ["lo2"]}]}, 0),
            id="match-expressions",
        ),
        pytest.param(
            {**pdb("stale", {"matchLabels": {"app": "lo2"}}, 5, generation=2)},
            id="status-older-than-spec",
        ),
    ],
)
def test_budgets_are_read_as_the_eviction_api_reads_them(budget: dict[str, Any]) -> None:
    pods = labelled(preemption_cluster(), "lo2-", app="lo2")
    s = make_state([*pods, *hi_gang()], config=QueueConfig(preempt_after_s=0))
    s.cache.replace("pdbs", [budget])
    got = evicted(s, T0 + 10)
    assert not {"lo2-0", "lo2-1", "lo2-2"} & got


def test_a_budget_nothing_selects_or_that_allows_enough_changes_nothing() -> None:
    pods = labelled(preemption_cluster(), "lo2-", app="lo2")
    s = make_state([*pods, *hi_gang()], config=QueueConfig(preempt_after_s=0))
    s.cache.replace("pdbs", [pdb("none", None, 0), pdb("roomy", {"matchLabels": {"app": "lo2"}}, 3)])
    assert evicted(s, T0 + 10) == {"lo2-0", "lo2-1", "lo2-2", "lone"}


def test_victims_each_within_a_shared_budget_but_not_together_are_not_evicted() -> None:
    pods = labelled(labelled(preemption_cluster(), "lo2-", team="a"), "lone", team="a")
    s = make_state([*pods, *hi_gang()], config=QueueConfig(preempt_after_s=0))
    s.cache.replace(
        "pdbs", [pdb("team-a", {"matchLabels": {"team": "a"}}, 3)]
    )  # lo2 (3) or lone (1), not both
    first = s.queue.tick(T0 + 10)
    assert first.evictions == ()
    blocked = [e for e in first.events if e.reason == "PreemptionBlocked"]
    assert {e.pod["metadata"]["name"] for e in blocked} == {f"hi-{i}" for i in range(4)}
    assert "PodDisruptionBudget default/team-a allows 3" in blocked[0].message
    assert "default/hi" not in s.holds.queue_reservations  # no hold for a preemption that does not happen
    assert "gpuagent_extender_preemptions_total 0" in s.queue.metrics_text().decode()
    # the next pass seeks other victims: nvl-0's gangs, whole
    assert evicted(s, T0 + 11) == {"lo0-0", "lo0-1", "lo1-0", "lo1-1"}


# -- item 10: eviction counts belong to a job, not to its name -----------------------------------------
def _evict_lo_and_rerun(s: ExtenderState, *, uid: str, now: float) -> set[str]:
    """The first preemption (hi) runs; its victims' pods go and hi ends; then the victim gangs run
    again under the same names, made by a Job of ``uid``. Returns the gangs evicted first."""
    first = s.queue.tick(now)
    victims = {e.victim for e in first.evictions} - {"pod:default/lone"}
    assert victims
    for e in first.evictions:
        s.cache.apply("pods", "DELETED", e.pod)
    for p in hi_gang():
        s.cache.apply("pods", "DELETED", s.cache.pods[f"default/{p['metadata']['name']}"])
    s.queue.tick(now + 5)  # a pass sees them all gone
    for gang in victims:
        name = gang.split("/")[1]
        for p in preemption_cluster():
            if p["metadata"]["name"].startswith(f"{name}-"):
                s.cache.apply(
                    "pods", "ADDED", owned(timed(p, created=now + 20, started=now + 21), "Job", name, uid)
                )
    return victims


@pytest.mark.parametrize(
    ("same_job", "counted"),
    [pytest.param(True, 1, id="the-same-job-made-again"), pytest.param(False, 0, id="a-new-job-same-name")],
)
def test_eviction_counts_follow_the_job_that_owns_the_gang(same_job: bool, counted: int) -> None:
    pods = preemption_cluster()
    for p in pods:
        if p["metadata"]["name"][:3] in ("lo0", "lo1", "lo2"):
            owned(p, "Job", p["metadata"]["name"].rsplit("-", 1)[0], "uid-first")
    s = make_state([*pods, *hi_gang()], config=QueueConfig(preempt_after_s=0, max_evictions=1))
    victims = _evict_lo_and_rerun(s, uid="uid-first" if same_job else "uid-second", now=T0 + 20)
    for p in hi_gang("hi2", at=T0 + 40):
        s.cache.apply("pods", "ADDED", p)
    second = s.queue.tick(T0 + 50)
    assert all(s.inputs.last_running[g].evictions == counted for g in victims)
    again = victims & {e.victim for e in second.evictions}
    assert bool(again) is (counted == 0)  # a new job under an old name is no more immune than any


def test_a_count_for_a_gang_no_controller_owns_goes_with_its_last_pod() -> None:
    s = make_state(
        [*preemption_cluster(), *hi_gang()], config=QueueConfig(preempt_after_s=0, max_evictions=1)
    )
    first = s.queue.tick(T0 + 20)
    victims = {e.victim for e in first.evictions} - {"pod:default/lone"}
    for e in first.evictions:
        s.cache.apply("pods", "DELETED", e.pod)
    s.queue.tick(T0 + 25)  # all its pods gone: nothing makes them again
    for gang in victims:
        name = gang.split("/")[1]
        for p in preemption_cluster():
            if p["metadata"]["name"].startswith(f"{name}-"):
                s.cache.apply("pods", "ADDED", timed(p, created=T0 + 30, started=T0 + 31))
    s.queue.tick(T0 + 40)
    assert all(s.inputs.last_running[g].evictions == 0 for g in victims)
