"""Issue 29 item 3 in the extender: ``gpuagent.dev/mnnvl`` placement on ready trays and the bind barrier
that waits for the chosen trays' IMEX."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.extender import ExtenderState
from scheduler_plugin.extender.bind import IMEX_RECHECK_S
from scheduler_plugin.queue import QueueConfig
from tests.integration.fakekube import hypernode, node, pod

NODES = [f"r{r}-t{t}" for r in range(2) for t in range(4)]
READY = {
    "gpuagent.dev/fabric-health": "healthy",
    "nvidia.com/gpu.clique": "c.0",
    "gpuagent.dev/imex": "ready",
}


def labels(imex: str = "ready") -> dict[str, str]:
    return {**READY, "gpuagent.dev/imex": imex}


def gang_pod(name: str, rank: int, *, size: int = 2, extra: dict[str, str] | None = None) -> dict[str, Any]:
    ann = {
        "gpuagent.dev/gang": "g",
        "gpuagent.dev/gang-size": str(size),
        "gpuagent.dev/subgroup-size": str(size),
        "gpuagent.dev/subgroup-tier": "nvlink",
        "gpuagent.dev/rank": str(rank),
        **(extra or {}),
    }
    return pod(name, 4, annotations=ann)


def make_state(
    pods: list[dict[str, Any]], *, unready: tuple[str, ...] = (), fabric: bool = True
) -> ExtenderState:
    s = ExtenderState(queue=QueueConfig(reservation_ttl_s=60.0, barrier_timeout_s=5.0))
    s.cache.replace(
        "nodes",
        [
            node(n, 4, labels=(labels("not-ready" if n in unready else "ready") if fabric else {}))
            for n in NODES
        ],
    )
    s.cache.replace(
        "hypernodes", [hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t{t}" for t in range(4)]) for r in range(2)]
    )
    s.cache.replace("pods", pods)
    return s


def planned(s: ExtenderState, pods: list[dict[str, Any]], now: float = 0.0) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in pods:
        got = s.filter(p, NODES, now)
        assert len(got.passed) == 1, (got.failed, got.unresolvable)
        out[p["metadata"]["name"]] = got.passed[0]
    return out


def test_a_gang_needing_multi_node_nvlink_avoids_unready_trays_by_default() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(2)]
    s = make_state(pods, unready=("r0-t0",))
    assert "r0-t0" not in set(planned(s, pods).values())  # name order alone would take it first
    assert s.holds.started["default/g"].mnnvl == "required"


def test_mnnvl_off_ignores_readiness() -> None:
    pods = [gang_pod(f"w{i}", i, extra={"gpuagent.dev/mnnvl": "off"}) for i in range(2)]
    s = make_state(pods, unready=("r0-t0",))
    assert set(planned(s, pods).values()) == {"r0-t0", "r0-t1"}


def test_without_fabric_labels_the_default_is_off() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(2)]
    s = make_state(pods, fabric=False)
    planned(s, pods)
    assert s.holds.started["default/g"].mnnvl == "off"


def test_required_waits_when_no_domain_has_enough_ready_trays() -> None:
    pods = [gang_pod(f"w{i}", i, size=4, extra={"gpuagent.dev/mnnvl": "required"}) for i in range(4)]
    s = make_state(pods, unready=("r0-t0", "r1-t3"))
    out = s.filter(pods[0], NODES, 0.0)
    assert not out.passed
    assert "not ready left out" in next(iter(out.failed.values()))
    assert "GangUnschedulable" in [e.reason for e in out.events]


def test_preferred_falls_back_to_unready_trays_ready_ones_first() -> None:
    pods = [gang_pod(f"w{i}", i, size=4, extra={"gpuagent.dev/mnnvl": "preferred"}) for i in range(4)]
    s = make_state(pods, unready=("r0-t0", "r1-t3"))
    got = set(planned(s, pods).values())
    assert len({n[:2] for n in got}) == 1
    assert len(got) == 4


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        ("gpuagent.dev/mnnvl", "yes"),
        ("gpuagent.dev/mnnvl", "Required"),
        ("gpuagent.dev/mnnvl", ""),
        ("gpuagent.dev/repair", "anywhere"),
    ],
)
def test_a_bad_annotation_refuses_the_gang_naming_it(annotation: str, value: str) -> None:
    pods = [gang_pod(f"w{i}", i, extra={annotation: value}) for i in range(2)]
    s = make_state(pods)
    out = s.filter(pods[0], NODES, 0.0)
    assert not out.passed
    assert not s.holds.started
    msg = next(iter(out.unresolvable.values()))
    assert annotation in msg
    assert repr(value) in msg
    assert [e.reason for e in out.events] == ["InvalidGang"]


def test_pods_that_disagree_on_the_mode_refuse_the_gang() -> None:
    pods = [
        gang_pod("w0", 0, extra={"gpuagent.dev/mnnvl": "off"}),
        gang_pod("w1", 1, extra={"gpuagent.dev/mnnvl": "required"}),
    ]
    s = make_state(pods)
    out = s.filter(pods[0], NODES, 0.0)
    assert "disagree on annotation gpuagent.dev/mnnvl" in next(iter(out.unresolvable.values()))


def set_imex(s: ExtenderState, name: str, state: str) -> None:
    s.cache.apply("nodes", "MODIFIED", node(name, 4, labels=labels(state)))


def test_bind_waits_for_every_chosen_trays_imex_then_binds() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(2)]
    s = make_state(pods)
    at = planned(s, pods)
    set_imex(s, at["w1"], "not-ready")  # after the plan: the barrier must hold it
    assert s.bind("default", "w0", "uid-default-w0", at["w0"], 1.0).action == "wait"
    d = s.bind("default", "w1", "uid-default-w1", at["w1"], 1.0)
    assert d.action == "wait"
    assert d.deadline == pytest.approx(1.0 + IMEX_RECHECK_S)
    assert s.bind.barrier_timeout("default/g", d.deadline).action == "wait"  # still not ready
    set_imex(s, at["w1"], "ready")
    done = s.bind.barrier_timeout("default/g", 2.0)
    assert done.action == "bind"
    assert sorted(k for k, _, _ in done.pods) == ["default/w0", "default/w1"]


def test_an_imex_that_stays_unready_releases_the_gang_naming_the_tray() -> None:
    pods = [gang_pod(f"w{i}", i) for i in range(2)]
    s = make_state(pods)
    at = planned(s, pods)
    set_imex(s, at["w0"], "not-ready")
    s.bind("default", "w0", "uid-default-w0", at["w0"], 1.0)
    s.bind("default", "w1", "uid-default-w1", at["w1"], 1.0)
    d = s.bind.barrier_timeout("default/g", 6.0)  # the barrier's 5 s are over
    assert d.action == "error"
    assert at["w0"] in d.error
    assert at["w1"] not in d.error
    assert {e.reason for e in d.events} == {"GangImexNotReady"}
    assert at["w0"] in d.events[0].message
    assert "default/g" not in s.holds.started


def test_a_preferred_gang_binds_at_the_deadline_and_says_which_tray_was_not_ready() -> None:
    pods = [gang_pod(f"w{i}", i, extra={"gpuagent.dev/mnnvl": "preferred"}) for i in range(2)]
    s = make_state(pods)
    at = planned(s, pods)
    set_imex(s, at["w1"], "not-ready")
    s.bind("default", "w0", "uid-default-w0", at["w0"], 1.0)
    assert s.bind("default", "w1", "uid-default-w1", at["w1"], 1.0).action == "wait"
    d = s.bind.barrier_timeout("default/g", 6.0)
    assert d.action == "bind"
    assert len(d.pods) == 2
    assert [e.reason for e in d.events] == ["GangImexNotReady", "GangImexNotReady"]
    assert at["w1"] in d.events[0].message


def test_an_off_gang_binds_whatever_the_imex_label_says() -> None:
    pods = [gang_pod(f"w{i}", i, extra={"gpuagent.dev/mnnvl": "off"}) for i in range(2)]
    s = make_state(pods)
    at = planned(s, pods)
    set_imex(s, at["w1"], "not-ready")
    s.bind("default", "w0", "uid-default-w0", at["w0"], 1.0)
    assert s.bind("default", "w1", "uid-default-w1", at["w1"], 1.0).action == "bind"


def test_the_default_mode_asks_about_fabric_only_for_a_gang_needing_nvlink() -> None:
    from scheduler_plugin.extender.policy import GangPolicy, resolve_mnnvl
    from scheduler_plugin.snapshot import Gang, Role

    asked: list[bool] = []

    def attached() -> bool:
        asked.append(True)
        return True

    leaf = Gang("g", (Role("w", 2, 4, subgroup_size=2, subgroup_tier="leaf"),))
    auto = Gang("g", (Role("w", 2, 4, subgroup_auto_min=1),))
    assert resolve_mnnvl(GangPolicy(), leaf, ("nvlink", "leaf"), fabric_attached=attached) == "off"
    assert not asked
    assert resolve_mnnvl(GangPolicy(), auto, ("nvlink", "leaf"), fabric_attached=attached) == "required"
    assert (
        resolve_mnnvl(GangPolicy(mnnvl="preferred"), auto, ("nvlink",), fabric_attached=attached)
        == "preferred"
    )


def test_the_http_barrier_binds_once_the_trays_imex_turns_ready() -> None:
    import asyncio
    import json

    from scheduler_plugin.extender import Extender

    class Recorder:
        def __init__(self) -> None:
            self.bound: list[tuple[str, str]] = []

        async def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Any = None) -> None:
            self.bound.append((f"{namespace}/{name}", node))

        def event(self, pod: Any, *, reason: str, message: str, warning: bool) -> None:
            pass

    clock = [1000.0]

    async def scenario() -> tuple[list[dict[str, Any]], Recorder]:
        pods = [gang_pod(f"w{i}", i) for i in range(2)]
        s = make_state(pods)
        rec = Recorder()
        ext = Extender(state=s, cluster=rec, clock=lambda: clock[0])
        at = {}
        for p in pods:
            _, out = await ext.dispatch(
                "POST", "/filter", json.dumps({"Pod": p, "NodeNames": NODES}).encode()
            )
            at[p["metadata"]["name"]] = out["NodeNames"][0]
        set_imex(s, at["w1"], "not-ready")

        def args(name: str) -> bytes:
            return json.dumps(
                {
                    "PodName": name,
                    "PodNamespace": "default",
                    "PodUID": f"uid-default-{name}",
                    "Node": at[name],
                }
            ).encode()

        calls = [asyncio.create_task(ext.dispatch("POST", "/bind", args(f"w{i}"))) for i in range(2)]
        await asyncio.sleep(IMEX_RECHECK_S * 2)  # looked at the labels again at least once
        assert rec.bound == []  # every pod arrived, but a chosen tray's IMEX is not ready
        set_imex(s, at["w1"], "ready")
        clock[0] += 1.0  # within the barrier's 5 s
        results = [(await c)[1] for c in calls]
        await ext.drain()
        return results, rec

    results, rec = asyncio.run(scenario())
    assert results == [{"Error": ""}] * 2
    assert len(rec.bound) == 2
