"""GPUs pods get through DRA claims, counted by the extender like ``nvidia.com/gpu``: what a claim asks,
what a pool has, what allocations use per node, and the filter and the gang planner reading them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_plugin.claims import MAX_RESULTS, Ask, ClaimBook, book_of, claim_ask, pool_of
from scheduler_plugin.cluster import snapshot_from_objects
from scheduler_plugin.extender import ExtenderState, gpus_of
from tests.integration.fakekube import hypernode, node, pod

GPU_CLASS = "gpu.gpuagent.dev"
DRIVER = "gpu.gpuagent.dev"
NODES = ["r0-t0", "r0-t1", "r1-t0", "r1-t1"]


def request(count: int | None = None, *, cls: str = GPU_CLASS, mode: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if count is not None:
        exactly["count"] = count
    if mode is not None:
        exactly["allocationMode"] = mode
    return {"name": "r", "exactly": exactly}


def claim_spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


def gpu_slice(
    node_name: str, gpus: int, *, generation: int = 1, tainted: tuple[int, ...] = ()
) -> dict[str, Any]:
    devices: list[dict[str, Any]] = []
    for i in range(gpus):
        d: dict[str, Any] = {
            "name": f"gpu-{i}",
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": f"GPU-{node_name}-{i}"}},
        }
        if i in tainted:
            d["taints"] = [{"key": f"{DRIVER}/xid", "value": "XID-79", "effect": "NoSchedule"}]
        devices.append(d)
    devices.append({"name": "imex-channel", "attributes": {"type": {"string": "imex-channel"}}})
    return {
        "metadata": {"name": f"{node_name}-{DRIVER}-0"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def claim(
    name: str,
    count: int = 1,
    *,
    namespace: str = "default",
    on: str | None = None,
    devices: tuple[str, ...] = (),
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
        "spec": claim_spec(request(count)),
    }
    if on is not None:
        results = [{"request": "r", "driver": DRIVER, "pool": on, "device": d} for d in devices]
        obj["status"] = {"allocation": {"devices": {"results": results}}}
    return obj


def template(
    name: str, count: int = 1, *, namespace: str = "default", mode: str | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": claim_spec(request(count, mode=mode))},
    }


def dra_pod(
    name: str,
    *,
    claim_name: str | None = None,
    template_name: str | None = None,
    node_name: str | None = None,
    namespace: str = "default",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    p = pod(name, 0, node_name=node_name, namespace=namespace, annotations=annotations)
    ref: dict[str, Any] = {"name": "gpus"}
    if claim_name is not None:
        ref["resourceClaimName"] = claim_name
    if template_name is not None:
        ref["resourceClaimTemplateName"] = template_name
    p["spec"]["resourceClaims"] = [ref]
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
    return p


def dra_state(
    *, pods: list[dict[str, Any]] = (), claims: list[dict[str, Any]] = (), templates=()
) -> ExtenderState:  # type: ignore[assignment]
    """Four nodes whose GPUs are all served by DRA (no allocatable nvidia.com/gpu), two NVLink domains."""
    s = ExtenderState()
    s.cache.replace("nodes", [node(n, 0) for n in NODES])
    s.cache.replace(
        "hypernodes", [hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t0", f"r{r}-t1"]) for r in range(2)]
    )
    s.cache.replace("resourceslices", [gpu_slice(n, 4) for n in NODES])
    s.cache.replace("resourceclaimtemplates", list(templates))
    s.cache.replace("resourceclaims", list(claims))
    s.cache.replace("pods", list(pods))
    return s


# -- what a claim asks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "ask"),
    [
        pytest.param(claim_spec(request(2)), Ask(count=2), id="exact-count"),
        pytest.param(claim_spec(request()), Ask(count=1), id="count-defaults-to-1"),
        pytest.param(claim_spec(request(mode="All")), Ask(whole=True), id="all-devices"),
        pytest.param(
            claim_spec(request(3, cls="imex-channel.gpuagent.dev")), Ask(), id="imex-channel-no-gpu"
        ),
        pytest.param(claim_spec(request(2), request(1)), Ask(count=3), id="two-requests-add"),
        pytest.param(
            {
                "devices": {
                    "requests": [
                        {"name": "r", "firstAvailable": [request(4)["exactly"], request(1)["exactly"]]}
                    ]
                }
            },
            Ask(count=4),
            id="prioritized-list-first-choice",
        ),
        pytest.param(claim_spec(request(10**12)), Ask(count=MAX_RESULTS + 1), id="huge-count-bounded"),
        pytest.param(claim_spec(request(0)), Ask(), id="zero-count-nothing"),
    ],
)
def test_what_a_claim_asks(spec: dict[str, Any], ask: Ask) -> None:
    assert claim_ask(spec) == ask


def test_a_pool_counts_its_untainted_gpus_of_the_newest_generation_and_maps_mig_to_its_parent() -> None:
    old = gpu_slice("n", 8, generation=1)
    new = gpu_slice("n", 4, generation=2, tainted=(1,))
    for mig, parent in (("mig-a", "GPU-n-2"), ("mig-b", "GPU-n-9")):  # GPU-n-9: MIG on, not published whole
        new["spec"]["devices"].append(
            {"name": mig, "attributes": {"type": {"string": "mig"}, "parentUUID": {"string": parent}}}
        )
    pool = pool_of([old, new])
    assert pool is not None
    assert (pool.node, pool.gpus) == ("n", 3)
    assert pool.counts_as["mig-a"] == "gpu-2"
    assert pool.counts_as["mig-b"] is None  # uses no whole GPU
    assert pool.counts_as["imex-channel"] is None


def test_a_gpu_shared_by_two_claims_is_used_once_and_freed_when_both_go() -> None:
    book = ClaimBook()
    book.update("resourceslices", "s", gpu_slice("n", 4))
    book.update("resourceclaims", "default/a", claim("a", on="n", devices=("gpu-0", "imex-channel")))
    book.update("resourceclaims", "default/b", claim("b", on="n", devices=("gpu-0", "gpu-1")))
    assert (book.capacity("n"), book.used("n")) == (4, 2)
    book.update("resourceclaims", "default/b", None)
    assert book.used("n") == 1
    book.update("resourceclaims", "default/a", None)
    assert book.used("n") == 0


# -- the extender's state ------------------------------------------------------------------------


def test_a_dra_only_node_has_its_pools_gpus_and_a_claim_pod_asks_its_templates_count() -> None:
    s = dra_state(templates=[template("two", 2)], pods=[dra_pod("p", template_name="two")])
    assert all(s.cache.free_gpus(n) == 4 for n in NODES)
    assert gpus_of(s.cache.info["default/p"]) == 2
    assert sorted(s.filter(s.cache.pods["default/p"], NODES, 0.0).passed) == NODES


def test_allocations_use_gpus_on_their_node_and_the_filter_reads_them() -> None:
    s = dra_state(
        templates=[template("two", 2)],
        claims=[claim("held", 3, on="r0-t0", devices=("gpu-0", "gpu-1", "gpu-2"))],
        pods=[dra_pod("runs", claim_name="held", node_name="r0-t0"), dra_pod("p", template_name="two")],
    )
    assert s.cache.free_gpus("r0-t0") == 1  # the allocation counts; the bound pod's ask is not counted again
    out = s.filter(s.cache.pods["default/p"], NODES, 0.0)
    assert "r0-t0" in out.failed
    assert sorted(out.passed) == NODES[1:]
    s.cache.apply("resourceclaims", "DELETED", claim("held", 3))
    assert s.cache.free_gpus("r0-t0") == 4


def test_a_template_seen_after_its_pod_and_the_claim_made_from_it_update_the_pods_ask() -> None:
    p = dra_pod("p", template_name="t")
    s = dra_state(pods=[p])
    assert gpus_of(s.cache.info["default/p"]) == 0
    s.cache.apply("resourceclaimtemplates", "ADDED", template("t", 3))
    assert gpus_of(s.cache.info["default/p"]) == 3
    made = dict(
        p,
        status={
            "phase": "Pending",
            "resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus-x"}],
        },
    )
    s.cache.apply("pods", "MODIFIED", made)
    s.cache.apply("resourceclaims", "ADDED", claim("p-gpus-x", 1))
    assert gpus_of(s.cache.info["default/p"]) == 1  # the claim made from the template is what is asked


def test_a_claim_of_the_same_name_in_another_namespace_is_not_the_pods() -> None:
    s = dra_state(claims=[claim("c", 4, namespace="other")], pods=[dra_pod("p", claim_name="c")])
    assert gpus_of(s.cache.info["default/p"]) == 0
    s.cache.apply("resourceclaims", "ADDED", claim("c", 2))
    assert gpus_of(s.cache.info["default/p"]) == 2


def test_all_devices_asks_a_whole_node_and_follows_the_largest_pool() -> None:
    s = dra_state(templates=[template("all", mode="All")], pods=[dra_pod("p", template_name="all")])
    assert gpus_of(s.cache.info["default/p"]) == 4
    s.cache.apply("resourceslices", "MODIFIED", gpu_slice("r1-t1", 8, generation=2))
    assert gpus_of(s.cache.info["default/p"]) == 8
    assert s.filter(s.cache.pods["default/p"], NODES, 0.0).passed == ["r1-t1"]


def test_a_tainted_gpu_leaves_the_nodes_capacity() -> None:
    s = dra_state()
    s.cache.apply("resourceslices", "MODIFIED", gpu_slice("r0-t1", 4, generation=2, tainted=(0, 3)))
    assert s.cache.free_gpus("r0-t1") == 2


def test_extended_resource_pods_count_their_request_not_kube_schedulers_claim() -> None:
    p = pod("ext", 2, node_name="r1-t0")  # nvidia.com/gpu served through the DeviceClass
    ext = claim(
        "ext-extended-resources-abc",
        2,
        on="r1-t0",
        devices=("gpu-0", "gpu-1"),
        annotations={"resource.kubernetes.io/extended-resource-claim": "true"},
    )
    s = dra_state(claims=[ext], pods=[p])
    assert s.cache.free_gpus("r1-t0") == 2


def test_a_mapped_extended_resource_other_than_nvidia_gpu_counts_as_gpus() -> None:
    p = pod("imp", 0)
    p["spec"]["containers"][0]["resources"] = {
        "limits": {f"deviceclass.resource.kubernetes.io/{GPU_CLASS}": "3"}
    }
    q = pod("named", 0)
    q["spec"]["containers"][0]["resources"] = {"limits": {"example.com/gpu": "2"}}
    s = dra_state(pods=[p, q])
    assert gpus_of(s.cache.info["default/imp"]) == 3
    assert gpus_of(s.cache.info["default/named"]) == 0
    s.cache.apply(
        "deviceclasses",
        "ADDED",
        {"metadata": {"name": GPU_CLASS}, "spec": {"extendedResourceName": "example.com/gpu"}},
    )
    assert gpus_of(s.cache.info["default/named"]) == 2


def test_a_gang_of_claim_pods_is_planned_with_each_pods_claim_gpus() -> None:
    annotations = {
        "gpuagent.dev/gang": "g",
        "gpuagent.dev/gang-size": "4",
        "gpuagent.dev/subgroup-size": "2",
        "gpuagent.dev/subgroup-tier": "nvlink",
    }
    pods = [
        dra_pod(f"w{i}", template_name="four", annotations={**annotations, "gpuagent.dev/rank": str(i)})
        for i in range(4)
    ]
    s = dra_state(templates=[template("four", 4)], pods=pods)
    placed = {}
    for p in pods:
        out = s.filter(s.cache.pods[f"default/{p['metadata']['name']}"], NODES, 0.0)
        assert len(out.passed) == 1, (out.failed, out.unresolvable)
        placed[p["metadata"]["name"]] = out.passed[0]
    assert sorted(placed.values()) == NODES  # 4 GPUs each: one whole node per pod
    assert placed["w0"][:2] == placed["w1"][:2]
    assert placed["w2"][:2] == placed["w3"][:2]
    assert sum(s.holds.started["default/g"].hold.claims.values()) == 16


def test_a_gang_pods_claim_allocated_on_its_planned_node_before_bind_counts_once() -> None:
    """kube-scheduler writes a gang pod's claim allocation (PreBind) before our bind barrier binds the
    pod: the allocation counts its GPUs as used, so the gang's hold on that node lets them go; the
    bind then takes off only the rest, and an allocation withdrawn puts them back on the hold."""
    annotations = {"gpuagent.dev/gang": "g", "gpuagent.dev/gang-size": "2"}
    pods = [
        dra_pod(f"w{i}", template_name="two", annotations={**annotations, "gpuagent.dev/rank": str(i)})
        for i in range(2)
    ]
    s = dra_state(templates=[template("two", 2)], pods=pods)
    placed = {}
    for p in pods:
        out = s.filter(s.cache.pods[f"default/{p['metadata']['name']}"], NODES, 0.0)
        assert len(out.passed) == 1, (out.failed, out.unresolvable)
        placed[p["metadata"]["name"]] = out.passed[0]
    here = placed["w0"]
    before = s.cache.free_gpus(here)
    held = s.holds.held()[here]["nvidia.com/gpu"]
    # the claim made from w0's template, then its allocation on w0's planned node
    made = dict(pods[0], status={"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "w0-gpus"}]})
    s.cache.apply("pods", "MODIFIED", made)
    s.cache.apply("resourceclaims", "ADDED", claim("w0-gpus", 2))
    assert s.cache.free_gpus(here) == before
    s.cache.apply("resourceclaims", "MODIFIED", claim("w0-gpus", 2, on=here, devices=("gpu-0", "gpu-1")))
    assert s.cache.free_gpus(here) == before  # counted once: by the allocation, no longer by the hold
    assert s.holds.held().get(here, {}).get("nvidia.com/gpu", 0) == held - 2
    # the allocation withdrawn (kube-scheduler's binding failed): the hold has them again
    s.cache.apply("resourceclaims", "MODIFIED", claim("w0-gpus", 2))
    assert s.holds.held()[here]["nvidia.com/gpu"] == held
    assert s.cache.free_gpus(here) == before
    # allocated again, then the pod deleted before it bound: its slot is held in full again
    s.cache.apply("resourceclaims", "MODIFIED", claim("w0-gpus", 2, on=here, devices=("gpu-0", "gpu-1")))
    assert s.holds.held().get(here, {}).get("nvidia.com/gpu", 0) == held - 2
    s.cache.apply("pods", "DELETED", made)
    assert s.holds.held()[here]["nvidia.com/gpu"] == held
    s.cache.apply("pods", "ADDED", made)
    assert s.holds.held().get(here, {}).get("nvidia.com/gpu", 0) == held - 2  # made again, read again
    # allocated again, then bound: the bind takes off nothing more than what is left of its share
    s.cache.apply("resourceclaims", "MODIFIED", claim("w0-gpus", 2, on=here, devices=("gpu-0", "gpu-1")))
    s.cache.apply("pods", "MODIFIED", dict(made, spec={**made["spec"], "nodeName": here}))
    assert s.cache.free_gpus(here) == before
    assert s.holds.held().get(here, {}).get("nvidia.com/gpu", 0) == held - 2


def test_a_claim_allocated_on_another_node_than_planned_leaves_the_hold() -> None:
    annotations = {"gpuagent.dev/gang": "g", "gpuagent.dev/gang-size": "2"}
    pods = [
        dra_pod(f"w{i}", claim_name=f"c{i}", annotations={**annotations, "gpuagent.dev/rank": str(i)})
        for i in range(2)
    ]
    s = dra_state(claims=[claim("c0", 2), claim("c1", 2)], pods=pods)
    for p in pods:
        assert len(s.filter(s.cache.pods[f"default/{p['metadata']['name']}"], NODES, 0.0).passed) == 1
    holds = s.holds.held()
    res = s.holds.started["default/g"]
    planned = res.nodes[res.spec.members["default/w0"]]
    other = next(n for n in NODES if n != planned)
    s.cache.apply("resourceclaims", "MODIFIED", claim("c0", 2, on=other, devices=("gpu-0", "gpu-1")))
    assert s.holds.held() == holds  # not the pod's planned node: its share stays held there
    assert res.allocated == {}


def test_a_snapshot_from_listed_objects_counts_claims_as_the_extender_does() -> None:
    """``plan --from-cluster`` (``snapshot_from_objects`` with a book of the listed DRA objects) and the
    extender's state see the same GPUs and free GPUs on every node: pools' GPUs besides allocatable,
    allocations used (a shared GPU once), a bound claim pod's ask not counted again, a bound pod's
    mapped extended resource counted as GPUs, a pending pod nothing."""
    claims = [
        claim("held", 3, on="r0-t0", devices=("gpu-0", "gpu-1", "gpu-2")),
        claim("shared-a", 1, on="r1-t1", devices=("gpu-3",)),
        claim("shared-b", 1, on="r1-t1", devices=("gpu-3",)),
        claim("p-gpus-x", 2, on="r0-t1", devices=("gpu-0", "gpu-1")),
    ]
    made = dra_pod("made", template_name="two", node_name="r0-t1")
    made["status"] = {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus-x"}]}
    extended = pod("ext", 0, node_name="r1-t0")
    extended["spec"]["containers"][0]["resources"] = {
        "requests": {"deviceclass.resource.kubernetes.io/gpu.gpuagent.dev": "2"}
    }
    pods = [
        dra_pod("runs", claim_name="held", node_name="r0-t0"),
        made,
        extended,
        pod("plain", 1, node_name="r1-t0"),
        dra_pod("waits", template_name="two"),
    ]
    templates = [template("two", 2)]
    s = dra_state(pods=pods, claims=claims, templates=templates)
    nodes = [node(n, 0) for n in NODES]
    hypernodes = [hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t0", f"r{r}-t1"]) for r in range(2)]
    book = book_of(
        {
            "resourceslices": [gpu_slice(n, 4) for n in NODES],
            "resourceclaims": claims,
            "resourceclaimtemplates": templates,
        }
    )
    listed = snapshot_from_objects(nodes, pods, hypernodes, claims=book)
    view = {n.name: (n.gpus, n.free) for n in s.cache.snapshot().nodes}
    assert {n.name: (n.gpus, n.free) for n in listed.nodes} == view
    assert view == {"r0-t0": (4, 1), "r0-t1": (4, 2), "r1-t0": (4, 1), "r1-t1": (4, 3)}


# -- the book's incremental counts equal a fresh count -------------------------------------------

_NODES = ("n0", "n1", "n2")
_DEVICES = ("gpu-0", "gpu-1", "gpu-2", "gpu-3", "mig-a", "imex-channel", "other")


def _pool_slice(node: str, gpus: int, generation: int, tainted: frozenset[int]) -> dict[str, Any]:
    s = gpu_slice(node, gpus, generation=generation, tainted=tuple(sorted(tainted)))
    s["spec"]["devices"].append(
        {
            "name": "mig-a",
            "attributes": {"type": {"string": "mig"}, "parentUUID": {"string": f"GPU-{node}-0"}},
        }
    )
    return s


_slice_event = st.tuples(
    st.just("resourceslices"),
    st.sampled_from(_NODES),
    st.one_of(
        st.none(),
        st.builds(
            lambda node, gpus, gen, tainted: (node, gpus, gen, tainted),
            st.sampled_from(_NODES),
            st.integers(0, 4),
            st.integers(1, 3),
            st.frozensets(st.integers(0, 3), max_size=2),
        ),
    ),
)
_claim_event = st.tuples(
    st.just("resourceclaims"),
    st.sampled_from(("c0", "c1", "c2", "c3")),
    st.one_of(st.none(), st.lists(st.tuples(st.sampled_from(_NODES), st.sampled_from(_DEVICES)), max_size=5)),
)


def _fresh_counts(slices: dict[str, Any], claims: dict[str, Any]) -> dict[str, tuple[int, int]]:
    fresh = ClaimBook()
    for key, obj in slices.items():
        fresh.update("resourceslices", key, obj)
    for key, obj in claims.items():
        fresh.update("resourceclaims", key, obj)
    return {n: (fresh.capacity(n), fresh.used(n)) for n in _NODES}


@given(st.lists(st.one_of(_slice_event, _claim_event), max_size=25))
def test_incremental_counts_equal_a_fresh_count_after_any_events(events: list[Any]) -> None:
    book = ClaimBook()
    slices: dict[str, Any] = {}
    claims: dict[str, Any] = {}
    totals: dict[str, list[int]] = {n: [0, 0] for n in _NODES}  # what the Changes said, summed
    for kind, name, body in events:
        if kind == "resourceslices":
            obj = None if body is None else _pool_slice(*body)
            key = f"slice-{name}"  # one slice object per name; its pool may be any node's
            store = slices
        else:
            obj = None
            if body is not None:
                obj = claim(name, 1)
                results = [{"request": "r", "driver": DRIVER, "pool": n, "device": d} for n, d in body]
                obj["status"] = {"allocation": {"devices": {"results": results}}}
            key = f"default/{name}"
            store = claims
        if obj is None:
            store.pop(key, None)
        else:
            store[key] = obj
        change = book.update(kind, key, obj)
        for n, (has, used) in change.nodes.items():
            totals[n][0] += has
            totals[n][1] += used
        assert {n: (book.capacity(n), book.used(n)) for n in _NODES} == _fresh_counts(slices, claims)
        assert {n: tuple(v) for n, v in totals.items()} == _fresh_counts(slices, claims)
