"""Issue 29 item 5 in the extender: a running gang's replacement pod goes to a ready tray of the NVLink
domain the rest of its subgroup runs in, waits there (bounded, with an Event) when none is free, and
moves to another domain after the wait only where ``gpuagent.dev/repair: any`` allows it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest

from scheduler_plugin.extender import Extender, ExtenderState
from scheduler_plugin.queue import QueueConfig
from tests.integration.fakekube import hypernode, node, pod

NODES = [f"r{r}-t{t}" for r in range(2) for t in range(4)]
READY = {
    "gpuagent.dev/fabric-health": "healthy",
    "nvidia.com/gpu.clique": "c.0",
    "gpuagent.dev/imex": "ready",
}


def gang_pod(name: str, rank: int, *, on: str | None = None, repair: str | None = None) -> dict[str, Any]:
    ann = {
        "gpuagent.dev/gang": "g",
        "gpuagent.dev/gang-size": "4",
        "gpuagent.dev/subgroup-size": "2",
        "gpuagent.dev/subgroup-tier": "nvlink",
        "gpuagent.dev/rank": str(rank),
    }
    if repair is not None:
        ann["gpuagent.dev/repair"] = repair
    return pod(name, 4, annotations=ann, node_name=on)


def solo(name: str, on: str) -> dict[str, Any]:
    return pod(name, 4, node_name=on)


def make_state(pods: list[dict[str, Any]], *, failed: str, wait_s: float = 600.0) -> ExtenderState:
    s = ExtenderState(queue=QueueConfig(reservation_ttl_s=60.0, barrier_timeout_s=5.0, repair_wait_s=wait_s))
    nodes = []
    for n in NODES:
        obj = node(n, 4, labels=dict(READY))
        if n == failed:  # its agent withdrew it: not ready, and cordoned
            obj["metadata"]["labels"]["gpuagent.dev/fabric-health"] = "unhealthy"
            obj["spec"] = {"unschedulable": True}
        nodes.append(obj)
    s.cache.replace("nodes", nodes)
    s.cache.replace(
        "hypernodes", [hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t{t}" for t in range(4)]) for r in range(2)]
    )
    s.cache.replace("pods", pods)
    return s


def running_gang(*, repair: str | None = None) -> list[dict[str, Any]]:
    """Subgroup 0 (ranks 0, 1) on rack 1, subgroup 1 (ranks 2, 3) on rack 0; rank 1's tray r1-t1 failed and
    its controller made the pod again (unbound). Each rack has one other tray busy and one free, and rack 0's
    free tray comes first by name: a plan that does not know where rank 0 runs takes it."""
    return [
        gang_pod("w0", 0, on="r1-t0", repair=repair),
        gang_pod("w1", 1, repair=repair),
        gang_pod("w2", 2, on="r0-t0", repair=repair),
        gang_pod("w3", 3, on="r0-t1", repair=repair),
        solo("busy-0", "r0-t2"),
        solo("busy-1", "r1-t2"),
    ]


def test_the_replacement_goes_to_a_spare_tray_of_its_subgroups_domain() -> None:
    pods = running_gang()
    s = make_state(pods, failed="r1-t1")
    out = s.filter(pods[1], NODES, 0.0)
    assert out.passed == ["r1-t3"], (out.failed, out.unresolvable)
    res = s.holds.started["default/g"]
    assert res.target == 1  # no other pod of the gang moves
    assert list(res.nodes.values()) == ["r1-t3"]
    d = s.bind("default", "w1", "uid-default-w1", "r1-t3", 1.0)
    assert d.action == "bind"
    assert d.pods == (("default/w1", "uid-default-w1", "r1-t3"),)
    assert not d.events  # recorded only once the binding succeeded
    ((ev),) = d.bound_events
    assert (ev.pod["metadata"]["name"], ev.reason, ev.warning) == ("w1", "GangRepaired", False)
    assert (
        "bound on r1-t3, a ready tray of NVLink domain nvl-1 where the rest of its subgroup runs"
        in ev.message
    )


def test_with_no_spare_tray_in_the_domain_it_waits_and_says_so() -> None:
    pods = [*running_gang(), solo("busy-2", "r1-t3")]
    s = make_state(pods, failed="r1-t1")
    out = s.filter(pods[1], NODES, 0.0)
    assert not out.passed  # rack 0's r0-t3 is free, but it is not the subgroup's domain
    msg = next(iter(out.failed.values()))
    assert "nvl-1" in msg
    assert "repair" in msg
    assert "no other pod of the gang moves" in msg
    assert "gpuagent.dev/repair=same-domain: it keeps waiting there" in msg
    assert [e.reason for e in out.events] == ["GangRepairWaiting"]  # not GangUnschedulable
    assert out.events[0].message == msg


def test_a_tray_that_frees_in_the_domain_takes_the_waiting_replacement() -> None:
    busy = solo("busy-2", "r1-t3")
    pods = [*running_gang(), busy]
    s = make_state(pods, failed="r1-t1")
    assert not s.filter(pods[1], NODES, 0.0).passed
    s.cache.apply("pods", "DELETED", busy)
    s.queue.run_pass(1.0)
    assert s.filter(pods[1], NODES, 1.0).passed == ["r1-t3"]
    d = s.bind("default", "w1", "uid-default-w1", "r1-t3", 2.0)
    assert [e.reason for e in d.bound_events] == ["GangRepaired"]


def test_after_the_wait_any_lets_it_go_to_another_domain() -> None:
    pods = [*running_gang(repair="any"), solo("busy-2", "r1-t3")]
    s = make_state(pods, failed="r1-t1", wait_s=100.0)
    out = s.filter(pods[1], NODES, 0.0)
    assert not out.passed
    assert "after 100s of waiting (gpuagent.dev/repair=any)" in next(iter(out.failed.values()))
    s.queue.run_pass(50.0)
    assert not s.filter(pods[1], NODES, 50.0).passed
    s.queue.run_pass(101.0)
    assert s.filter(pods[1], NODES, 101.0).passed == ["r0-t3"]
    d = s.bind("default", "w1", "uid-default-w1", "r0-t3", 102.0)
    assert d.action == "bind"
    assert d.bound_events == ()  # another domain: not a repair inside the domain


def test_after_the_wait_same_domain_keeps_waiting() -> None:
    pods = [*running_gang(), solo("busy-2", "r1-t3")]
    s = make_state(pods, failed="r1-t1", wait_s=100.0)
    s.filter(pods[1], NODES, 0.0)
    s.queue.run_pass(101.0)
    out = s.filter(pods[1], NODES, 101.0)
    assert not out.passed
    assert "keeps waiting there (its wait is over)" in next(iter(out.failed.values()))
    assert [e.reason for e in out.events] == ["GangRepairWaiting"]


def test_a_replacement_is_not_put_on_an_unready_tray_of_its_domain() -> None:
    pods = running_gang()
    s = make_state(pods, failed="r1-t1")
    s.cache.apply("nodes", "MODIFIED", node("r1-t3", 4, labels={**READY, "gpuagent.dev/imex": "not-ready"}))
    assert not s.filter(pods[1], NODES, 0.0).passed


def test_a_whole_lost_subgroup_is_planned_afresh_inside_one_domain() -> None:
    pods = [
        gang_pod("w0", 0),
        gang_pod("w1", 1),
        gang_pod("w2", 2, on="r0-t0"),
        gang_pod("w3", 3, on="r0-t1"),
    ]
    s = make_state(pods, failed="r1-t1")
    got = {s.filter(p, NODES, 0.0).passed[0] for p in pods[:2]}
    assert len(got) == 2
    assert len({n[:2] for n in got}) == 1


def test_an_auto_sized_role_is_cut_by_the_size_its_bound_pods_carry() -> None:
    from scheduler_plugin.extender.repair import SUBGROUP_SIZE_CHOSEN, unbound_part
    from scheduler_plugin.gangs import GangSpec
    from scheduler_plugin.snapshot import Gang, PodSlot, Role

    role = Role("w", pods=4, gpus_per_pod=4, subgroup_auto_min=1)
    spec = GangSpec(
        key="default/g",
        gang=Gang("default/g", (role,)),
        members={f"default/w{i}": PodSlot("w", i) for i in range(4)},
        min_member=4,
        source="annotations",
    )
    chosen = {SUBGROUP_SIZE_CHOSEN: "2"}
    pods = {
        "default/w0": pod("w0", 4, node_name="r0-t0", annotations=chosen),
        "default/w1": pod("w1", 4, node_name="r0-t1", annotations=chosen),
        "default/w2": pod("w2", 4, node_name="r1-t0", annotations=chosen),
        "default/w3": pod("w3", 4),
    }
    domains = {f"r{r}-t{t}": {"nvlink": f"nvl-{r}"} for r in range(2) for t in range(4)}
    got = unbound_part(spec, pods, domains, ("nvlink",))
    assert got.gang is not None
    assert [(r.name, r.pods, r.domain) for r in got.gang.roles] == [("w#1", 1, "nvl-1")]
    assert got.members == {"default/w3": PodSlot("w#1", 0)}
    unpinned = unbound_part(spec, pods, domains, ("nvlink",), unpin=True)
    assert unpinned.gang is not None
    assert [r.domain for r in unpinned.gang.roles] == [None]


def test_an_auto_sized_replacement_binds_with_the_size_its_gang_runs_at() -> None:
    def auto_pod(name: str, rank: int, on: str | None = None) -> dict[str, Any]:
        p = gang_pod(name, rank, on=on)
        ann = p["metadata"]["annotations"]
        ann["gpuagent.dev/subgroup-size"] = "auto"
        if on is not None:  # written on the Binding when the gang started
            ann["gpuagent.dev/subgroup-size-chosen"] = "2"
        return p

    pods = [
        auto_pod("w0", 0, on="r1-t0"),
        auto_pod("w1", 1),
        auto_pod("w2", 2, on="r0-t0"),
        auto_pod("w3", 3, on="r0-t1"),
        solo("busy-0", "r0-t2"),
        solo("busy-1", "r1-t2"),
    ]
    s = make_state(pods, failed="r1-t1")
    out = s.filter(pods[1], NODES, 0.0)
    assert out.passed == ["r1-t3"]
    assert "SubgroupSizeChosen" not in [e.reason for e in out.events]  # nothing chosen anew
    d = s.bind("default", "w1", "uid-default-w1", "r1-t3", 1.0)
    assert d.action == "bind"
    assert d.annotations == {"default/w1": {"gpuagent.dev/subgroup-size-chosen": "2"}}


class _Cluster:
    """The API as the extender's bind path sees it: bindings (one may fail) and Events."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.events: list[tuple[str, str]] = []

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        if self.fail:
            raise RuntimeError("injected API failure")

    def event(self, pod: Mapping[str, Any], *, reason: str, message: str, warning: bool) -> None:
        self.events.append((pod["metadata"]["name"], reason))


@pytest.mark.parametrize("fail", [False, True], ids=["bound", "binding-failed"])
def test_gang_repaired_is_recorded_only_after_the_binding_succeeded(fail: bool) -> None:
    pods = running_gang()
    s = make_state(pods, failed="r1-t1")
    assert s.filter(pods[1], NODES, 0.0).passed == ["r1-t3"]
    cluster = _Cluster(fail)
    ext = Extender(state=s, cluster=cluster, clock=lambda: 1.0)
    args = {"PodName": "w1", "PodNamespace": "default", "PodUID": "uid-default-w1", "Node": "r1-t3"}

    async def bind() -> Any:
        out = await ext.dispatch("POST", "/bind", json.dumps(args).encode())
        await ext.drain()
        return out

    status, out = asyncio.run(bind())
    assert status == 200
    if fail:
        assert "injected API failure" in out["Error"]
        assert ("w1", "GangRepaired") not in cluster.events
    else:
        assert out == {"Error": ""}
        assert cluster.events.count(("w1", "GangRepaired")) == 1
