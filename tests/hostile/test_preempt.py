"""Hostile input to the extender's ``preempt`` verb over real HTTP on loopback: garbage
``ExtenderPreemptionArgs`` (wrong types, negative or huge PDB counts, victims without UIDs), victim maps
of over a hundred thousand pods or ten thousand nodes, unknown and forged preemptors and
victims. Every case gets a clear answer (HTTP 400 naming the field, or a result that takes nothing it
cannot vouch for), in bounded time, and the server keeps serving (``run`` checks health after each)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from scheduler_plugin.extender import ExtenderState
from scheduler_plugin.queueing import MAX_VICTIM_PODS
from tests.hostile.test_extender import NODES, Served, gang_pod, make_state, run
from tests.integration.fakekube import pod


def _args(victims: Any, *, preemptor: dict[str, Any] | None = None, meta: bool = True) -> bytes:
    key = "NodeNameToMetaVictims" if meta else "NodeNameToVictims"
    return json.dumps({"Pod": preemptor or pod("urgent", 4), key: victims}).encode()


@pytest.mark.parametrize(
    ("victims", "field"),
    [
        pytest.param([1, 2], "NodeNameToMetaVictims", id="map-is-a-list"),
        pytest.param({"r0-t0": "all"}, "NodeNameToMetaVictims['r0-t0']", id="victims-a-string"),
        pytest.param({"r0-t0": {"Pods": {"UID": "x"}}}, "Pods", id="pods-not-a-list"),
        pytest.param({"r0-t0": {"Pods": [7]}}, "Pods[0]", id="pod-not-an-object"),
        pytest.param({"r0-t0": {"Pods": [{"UID": ""}]}}, "Pods[0]", id="empty-uid"),
        pytest.param({"r0-t0": {"Pods": [{"Name": "x"}]}}, "Pods[0]", id="no-uid"),
        pytest.param({"r0-t0": {"Pods": [], "NumPDBViolations": -1}}, "NumPDBViolations", id="negative-pdb"),
        pytest.param({"r0-t0": {"Pods": [], "NumPDBViolations": "1"}}, "NumPDBViolations", id="pdb-string"),
        pytest.param({"r0-t0": {"Pods": [], "NumPDBViolations": True}}, "NumPDBViolations", id="pdb-bool"),
    ],
)
def test_garbage_victims_are_a_400_naming_the_field(victims: Any, field: str) -> None:
    async def test(srv: Served) -> None:
        status, out = await srv.call("POST", "/preempt", _args(victims))
        assert status == 400
        assert field in out["Error"]

    run(test, make_state([pod("urgent", 4), pod("v", 4, node_name="r0-t0")]))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"[]", id="not-an-object"),
        pytest.param(b'{"NodeNameToMetaVictims": {}}', id="no-pod"),
        pytest.param(
            b'{"Pod": {"metadata": {"name": "urgent"}}, "NodeNameToMetaVictims": {"n": {"NumPDBViolations": '
            + b"9" * 5000
            + b"}}}",
            id="5000-digit-pdb",
        ),
        pytest.param(b'{"Pod": ' * 200 + b"{}" + b"}" * 200, id="nested-200-deep"),
    ],
)
def test_bodies_that_are_not_preemption_args_are_refused(body: bytes) -> None:
    async def test(srv: Served) -> None:
        status, out = await srv.call("POST", "/preempt", body)
        assert status in (200, 400)
        assert out.get("Error")
        assert status == 400 or "Pod" in out["Error"]

    run(test, make_state([pod("urgent", 4)]))


def test_more_victims_than_the_limit_are_refused_without_reading_them_all() -> None:
    per_node = 1000
    nodes = MAX_VICTIM_PODS // per_node + 2
    victims = {f"n{i}": {"Pods": [{"UID": f"u{i}-{j}"} for j in range(per_node)]} for i in range(nodes)}

    async def test(srv: Served) -> None:
        status, out = await srv.call("POST", "/preempt", _args(victims))
        assert status == 400
        assert f"more than {MAX_VICTIM_PODS}" in out["Error"]

    run(test, make_state([pod("urgent", 4)]), max_body=32 << 20)


def test_ten_thousand_nodes_of_unknown_victims_take_nothing() -> None:
    victims = {f"ghost-{i}": {"Pods": [{"UID": f"forged-{i}"}], "NumPDBViolations": 0} for i in range(10_000)}

    async def test(srv: Served) -> None:
        status, out = await srv.call("POST", "/preempt", _args(victims))
        assert status == 200
        assert out == {"NodeNameToMetaVictims": {}}

    run(test, make_state([pod("urgent", 4), pod("v", 4, node_name="r0-t0")]), max_body=32 << 20)


def test_unknown_forged_and_gang_preemptors_get_no_victims() -> None:
    victim = pod("v", 4, node_name="r0-t0")
    uid = victim["metadata"]["uid"]
    meta = {"r0-t0": {"Pods": [{"UID": uid}], "NumPDBViolations": 0}}
    gang_member = gang_pod("g-0", 0, size=1)

    async def test(srv: Served) -> None:
        for preemptor in (
            pod("nobody", 4),  # not known to the informer
            {**pod("urgent", 4), "metadata": {**pod("urgent", 4)["metadata"], "uid": "forged-uid"}},
            gang_member,  # a gang's preemption is the queue's, whole gangs only
        ):
            status, out = await srv.call("POST", "/preempt", _args(meta, preemptor=preemptor))
            assert status == 200
            assert out == {"NodeNameToMetaVictims": {}}, preemptor["metadata"]
        # the real pod on its own may take the pod on its own
        status, out = await srv.call("POST", "/preempt", _args(meta))
        assert out == {"NodeNameToMetaVictims": meta}

    run(test, make_state([pod("urgent", 4), victim, gang_member]))


def test_full_victims_form_is_read_and_half_a_gang_is_never_offered() -> None:
    members = [gang_pod(f"pair-{i}", i, gang="pair", size=2) for i in range(2)]
    members[0]["spec"]["nodeName"], members[1]["spec"]["nodeName"] = "r0-t0", "r0-t1"
    members[0]["status"]["phase"] = members[1]["status"]["phase"] = "Running"

    async def test(srv: Served) -> None:
        full = {"r0-t0": {"Pods": [members[0]], "NumPDBViolations": 0}}
        status, out = await srv.call("POST", "/preempt", _args(full, meta=False))
        assert status == 200
        assert out == {"NodeNameToMetaVictims": {}}

    run(test, make_state([pod("urgent", 4), *members]))


# -- what tenants write on the work a preemption may take (issue 26, items 7-10) -------------------------
def _victims_cluster(lone: dict[str, Any]) -> ExtenderState:
    """nvl-0 runs an old 2-pod gang on two nodes; the tenant's ``lone`` pod sits on r0-t0 beside
    nothing else: a 4-GPU preemptor can take r0-t0 (if ``lone`` may go) or the old gang's pair."""
    old = [gang_pod(f"old-{i}", i, gang="old", size=2) for i in range(2)]
    for i, p in enumerate(old):
        p["spec"]["nodeName"], p["status"]["phase"] = f"r0-t{2 + i}", "Running"
        p["metadata"]["creationTimestamp"] = p["status"]["startTime"] = "2026-12-01T00:00:00Z"
    fill = [pod(f"fill-{n}", 4, node_name=n) for n in NODES if n not in ("r0-t0", "r0-t2", "r0-t3")]
    for p in fill:
        p["spec"]["priority"] = 10**6  # higher than the preemptor: never victims
    lone["spec"]["nodeName"], lone["status"]["phase"] = "r0-t0", "Running"
    hi = gang_pod("hi-0", 0, gang="hi", size=1)
    hi["spec"]["priority"] = 1000
    s = make_state([*old, *fill, lone, hi])
    s.queue.config = dataclasses.replace(s.queue.config, preempt_after_s=0)
    return s


@pytest.mark.parametrize(
    "refs",
    [
        pytest.param("a string", id="not-a-list"),
        pytest.param([1, None, "x"], id="entries-not-objects"),
        pytest.param([{"kind": "DaemonSet", "name": "ds", "controller": "true"}], id="controller-a-string"),
        pytest.param(
            [{"kind": 7, "name": ["x"], "uid": {"a": 1}, "controller": True}], id="fields-wrong-types"
        ),
        pytest.param(
            [{"kind": "Job", "name": "j" * 100_000, "uid": "u" * 100_000, "controller": True}], id="huge"
        ),
    ],
)
def test_garbage_owner_references_make_a_pod_on_its_own_and_the_pass_goes_on(refs: Any) -> None:
    lone = pod("lone", 4)
    lone["metadata"]["ownerReferences"] = refs
    s = _victims_cluster(lone)
    actions = s.queue.tick(1_900_000_000.0)
    got = {e.pod["metadata"]["name"] for e in actions.evictions}
    assert got in ({"lone"}, {"old-0", "old-1"})  # one victim, whole; no exception
    assert all(len(e.victim) < 600 for e in actions.evictions)


@pytest.mark.parametrize(
    "labels",
    [
        pytest.param({"jobset.sigs.k8s.io/jobset-name": 7}, id="value-not-a-string"),
        pytest.param({"kueue.x-k8s.io/pod-group-name": "g" * 100_000}, id="huge-value"),
        pytest.param({"jobset.sigs.k8s.io/jobset-uid": ["u"]}, id="uid-not-a-string"),
    ],
)
def test_garbage_group_labels_are_cut_or_ignored(labels: dict[str, Any]) -> None:
    lone = pod("lone", 4)
    lone["metadata"]["labels"] = labels
    s = _victims_cluster(lone)
    actions = s.queue.tick(1_900_000_000.0)
    assert {e.pod["metadata"]["name"] for e in actions.evictions} in ({"lone"}, {"old-0", "old-1"})
    assert all(len(e.victim) < 600 for e in actions.evictions)


def _pdb(spec: Any, status: Any, metadata: Any = None) -> dict[str, Any]:
    return {
        "metadata": metadata if metadata is not None else {"name": "b", "namespace": "tenant"},
        "spec": spec,
        "status": status,
    }


@pytest.mark.parametrize(
    ("budget", "blocks"),
    [
        pytest.param(_pdb({"selector": []}, {"disruptionsAllowed": 0}), False, id="selector-a-list"),
        pytest.param(
            _pdb({"selector": {"matchLabels": ["x"]}}, {"disruptionsAllowed": 0}), True, id="labels-a-list"
        ),
        pytest.param(
            _pdb({"selector": {"matchExpressions": "x"}}, {"disruptionsAllowed": 0}),
            True,
            id="exprs-not-a-list",
        ),
        pytest.param(
            _pdb(
                {"selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": "lone"}]}},
                {"disruptionsAllowed": 0},
            ),
            False,
            id="values-a-string-not-a-substring-match",
        ),
        pytest.param(
            _pdb(
                {"selector": {"matchExpressions": [{"key": ["k"], "operator": "Exists"}]}},
                {"disruptionsAllowed": 0},
            ),
            False,
            id="key-not-a-string",
        ),
        pytest.param(
            _pdb(
                {"selector": {"matchExpressions": [{"key": "app", "operator": "Near"}]}},
                {"disruptionsAllowed": 0},
            ),
            True,
            id="unknown-operator-keeps-the-budget",
        ),
        pytest.param(_pdb({"selector": {}}, {"disruptionsAllowed": "9"}), True, id="allowed-a-string"),
        pytest.param(_pdb({"selector": {}}, {"disruptionsAllowed": True}), True, id="allowed-a-bool"),
        pytest.param(_pdb({"selector": {}}, {"disruptionsAllowed": -5}), True, id="allowed-negative"),
        pytest.param(_pdb({"selector": {}}, None), True, id="no-status"),
        pytest.param(_pdb({"selector": {}}, {"disruptionsAllowed": 10**30}), False, id="allowed-huge"),
        pytest.param(_pdb(None, "x", metadata={"name": ["b"], "namespace": 7}), False, id="nothing-readable"),
    ],
)
def test_garbage_disruption_budgets_never_stop_the_pass(budget: dict[str, Any], blocks: bool) -> None:
    """A budget read wrongly must never let a refused set be chosen: what cannot be read of how many
    disruptions it allows counts as none, an operator this reader does not know selects; a selector that
    is no selector selects nothing (the API server itself refuses such budgets)."""
    lone = pod("lone", 4, namespace="tenant", labels={"app": "lone"})
    s = _victims_cluster(lone)
    s.cache.replace("pdbs", [budget])
    actions = s.queue.tick(1_900_000_000.0)
    got = {e.pod["metadata"]["name"] for e in actions.evictions}
    if blocks:
        assert got == {"old-0", "old-1"}  # the lone pod is protected: the old gang goes, whole
    else:
        assert got == {"lone"}  # the cheapest victim
