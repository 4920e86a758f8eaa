"""The extender command's DRA wiring: informers for ResourceSlices, ResourceClaims and
ResourceClaimTemplates feed ``ExtenderState`` over real HTTP (the fake Kubernetes API server of
``tests/integration``), and the real ``filter`` verb counts a claim pod's GPUs against the pools'
GPUs less the allocations."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.commands import extender as command
from scheduler_plugin.extender import gpus_of
from tests.integration import fakekube
from tests.integration.fakekube import FakeKube, node
from tests.integration.test_extender_http import Running, wait_for
from tests.scheduler_plugin.test_claims import claim, dra_pod, gpu_slice, template

NODES = ["n0", "n1"]
DRA_PATHS = {
    command.DRA + kind: kind for kind in ("resourceclaims", "resourceclaimtemplates", "resourceslices")
}


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKube]:
    for path, kind in DRA_PATHS.items():
        monkeypatch.setitem(fakekube.PATHS, path, kind)
    kube = FakeKube()
    for n in NODES:
        kube.put("nodes", node(n, 0))  # every GPU served through DRA: none allocatable as nvidia.com/gpu
        kube.put("resourceslices", gpu_slice(n, 4))
    kube.start()
    yield kube
    kube.stop()


def test_a_claim_pod_is_filtered_by_the_pools_gpus_less_the_allocations(served: FakeKube) -> None:
    ext = Running(served)
    try:
        served.put("resourceclaimtemplates", template("two", 2))
        served.put("resourceclaims", claim("busy", 3, on="n0", devices=("gpu-0", "gpu-1", "gpu-2")))
        p = dra_pod("p", template_name="two")
        served.put("pods", p)
        wait_for(
            lambda: ext.state(
                lambda s: (
                    s.cache.claims.used("n0") == 3
                    and "default/p" in s.cache.info
                    and gpus_of(s.cache.info["default/p"]) == 2
                )
            ),
            "the allocation, the template and the pod reach the state",
        )
        assert ext.filter(p, NODES)["NodeNames"] == ["n1"]
        served.delete("resourceclaims", "busy")
        wait_for(lambda: ext.state(lambda s: s.cache.claims.used("n0") == 0), "the claim's GPUs freed")
        assert sorted(ext.filter(p, NODES)["NodeNames"]) == NODES
    finally:
        ext.stop()
