"""Hostile DRA objects (a tenant writes ResourceClaims, ResourceClaimTemplates and pods' claim references;
a stand-in or a broken driver may write odd allocations and slices): the extender counts what it can,
never crashes, never counts below zero, and a tenant cannot move another namespace's pods."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.claims import MAX_RESULTS, ClaimBook
from scheduler_plugin.extender import gpus_of
from tests.scheduler_plugin.test_claims import NODES, claim, dra_pod, dra_state, gpu_slice, template


def test_a_claim_asking_a_huge_count_fits_nowhere_and_harms_no_one() -> None:
    huge = template("huge", 10**18)
    s = dra_state(templates=[huge, template("one", 1)], pods=[dra_pod("h", template_name="huge")])
    s.cache.apply("pods", "ADDED", dra_pod("ok", template_name="one"))
    assert gpus_of(s.cache.info["default/h"]) == MAX_RESULTS + 1
    out = s.filter(s.cache.pods["default/h"], NODES, 0.0)
    assert out.passed == []
    assert set(out.failed) == set(NODES)
    assert sorted(s.filter(s.cache.pods["default/ok"], NODES, 0.0).passed) == NODES


@pytest.mark.parametrize(
    "status",
    [
        pytest.param("allocated", id="status-a-string"),
        pytest.param({"allocation": []}, id="allocation-a-list"),
        pytest.param({"allocation": {"devices": {"results": "gpu-0"}}}, id="results-a-string"),
        pytest.param({"allocation": {"devices": {"results": [None, 7, "x", []]}}}, id="results-not-mappings"),
        pytest.param(
            {
                "allocation": {
                    "devices": {"results": [{"driver": "gpu.gpuagent.dev", "pool": 5, "device": None}]}
                }
            },
            id="fields-of-wrong-types",
        ),
        pytest.param(
            {
                "allocation": {
                    "devices": {"results": [{"driver": "other.vendor", "pool": "r0-t0", "device": "gpu-0"}]}
                }
            },
            id="another-driver",
        ),
    ],
)
def test_a_malformed_allocation_uses_nothing(status: Any) -> None:
    bad = claim("bad", 2)
    bad["status"] = status
    s = dra_state(claims=[bad])
    assert all(s.cache.free_gpus(n) == 4 for n in NODES)
    s.cache.apply("resourceclaims", "DELETED", bad)
    assert all(s.cache.free_gpus(n) == 4 for n in NODES)


def test_an_allocation_with_thousands_of_results_counts_at_most_the_apis_bound() -> None:
    many = claim("many", on="r0-t0", devices=tuple(f"gpu-{i % 4}" for i in range(10_000)))
    big = claim("big", on="r0-t1", devices=tuple(f"dev-{i}" for i in range(10_000)))
    s = dra_state(claims=[many, big])
    assert s.cache.free_gpus("r0-t0") == 0
    assert s.cache.claims.used("r0-t1") == MAX_RESULTS


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(None, id="no-spec"),
        pytest.param("gpus", id="spec-a-string"),
        pytest.param({"devices": {"requests": "all"}}, id="requests-a-string"),
        pytest.param({"devices": {"requests": [None, 3, {"exactly": "x"}]}}, id="requests-not-mappings"),
        pytest.param(
            {"devices": {"requests": [{"exactly": {"deviceClassName": "gpu.gpuagent.dev", "count": "9"}}]}},
            id="count-a-string",
        ),
        pytest.param(
            {"devices": {"requests": [{"exactly": {"deviceClassName": "gpu.gpuagent.dev", "count": True}}]}},
            id="count-a-bool",
        ),
        pytest.param(
            {"devices": {"requests": [{"exactly": {"deviceClassName": "gpu.gpuagent.dev", "count": -4}}]}},
            id="count-negative",
        ),
        pytest.param({"devices": {"requests": [{"firstAvailable": []}]}}, id="empty-prioritized-list"),
    ],
)
def test_a_malformed_claim_spec_asks_nothing(spec: Any) -> None:
    bad = claim("c")
    bad["spec"] = spec
    s = dra_state(claims=[bad], pods=[dra_pod("p", claim_name="c")])
    assert gpus_of(s.cache.info["default/p"]) == 0


def test_a_claim_in_another_namespace_neither_counts_for_nor_moves_a_pod_here() -> None:
    s = dra_state(templates=[template("t", 2)], pods=[dra_pod("p", template_name="t")])
    s.cache.apply("resourceclaimtemplates", "ADDED", template("t", 4, namespace="tenant-b"))
    s.cache.apply("resourceclaims", "ADDED", claim("t", 4, namespace="tenant-b"))
    assert gpus_of(s.cache.info["default/p"]) == 2


@pytest.mark.parametrize(
    "refs",
    [
        pytest.param("c", id="claims-a-string"),
        pytest.param([None, 1, {"name": 3, "resourceClaimName": ["c"]}], id="references-not-mappings"),
    ],
)
def test_malformed_claim_references_ask_nothing(refs: Any) -> None:
    p = dra_pod("p", claim_name="c")
    p["spec"]["resourceClaims"] = refs
    s = dra_state(claims=[claim("c", 2)], pods=[p])
    assert gpus_of(s.cache.info["default/p"]) == 0


def test_a_container_named_like_the_synthetic_one_cannot_forge_an_ask() -> None:
    p = dra_pod("p", claim_name="c")
    p["spec"]["containers"].append(
        {"name": "<resource-claims>", "resources": {"requests": {"nvidia.com/gpu": "7"}}}
    )
    s = dra_state(claims=[claim("c", 1)], pods=[p])
    assert gpus_of(s.cache.info["default/p"]) == 1


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"driver": "gpu.gpuagent.dev", "devices": "many"}, id="devices-a-string"),
        pytest.param({"driver": "gpu.gpuagent.dev", "pool": "p", "devices": [None, 1]}, id="pool-a-string"),
        pytest.param(
            {
                "driver": "gpu.gpuagent.dev",
                "pool": {"name": "r0-t0", "generation": "x"},
                "devices": [{"name": 5}],
            },
            id="generation-and-name-of-wrong-types",
        ),
    ],
)
def test_a_malformed_slice_adds_no_gpus_and_its_removal_takes_none(spec: Any) -> None:
    bad = {"metadata": {"name": "bad"}, "spec": spec}
    s = dra_state()
    s.cache.apply("resourceslices", "ADDED", bad)
    assert all(s.cache.free_gpus(n) == 4 for n in NODES)
    s.cache.apply("resourceslices", "DELETED", bad)
    assert all(s.cache.free_gpus(n) == 4 for n in NODES)


def test_events_in_any_order_leave_the_book_as_a_fresh_one() -> None:
    objs = [
        ("resourceslices", "s0", gpu_slice("n", 4)),
        ("resourceclaims", "default/a", claim("a", on="n", devices=("gpu-0", "gpu-1"))),
        ("resourceclaims", "default/b", claim("b", on="n", devices=("gpu-1",))),
    ]
    forward, backward = ClaimBook(), ClaimBook()
    for kind, key, obj in objs:
        forward.update(kind, key, obj)
    for kind, key, obj in reversed(objs):
        backward.update(kind, key, obj)
    assert (
        (forward.capacity("n"), forward.used("n")) == (backward.capacity("n"), backward.used("n")) == (4, 2)
    )
    for kind, key, _ in objs:
        forward.update(kind, key, None)
    assert (forward.capacity("n"), forward.used("n")) == (0, 0)
