"""Preferred allocation: optimal for the documented score (against brute force), and the policies."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceplugin.preferred import (
    Candidate,
    DeviceKind,
    Policy,
    Topology,
    best_gpu_set,
    brute_force_best,
    preferred_allocation,
    topology_from_inventory,
)
from tests.deviceplugin.helpers import inventory
from topology.model import LinkLevel

LEVELS = [LinkLevel.PIX, LinkLevel.PXB, LinkLevel.PHB, LinkLevel.NODE, LinkLevel.SYS]


def gpu_candidates(
    topology: Topology, unhealthy: set[str] | frozenset[str] = frozenset()
) -> dict[str, Candidate]:
    return {g: Candidate(id=g, gpu=g, kind=DeviceKind.GPU, healthy=g not in unhealthy) for g in topology.gpus}


@st.composite
def topologies(draw: st.DrawFn, max_gpus: int = 10) -> Topology:
    n = draw(st.integers(min_value=1, max_value=max_gpus))
    names = [f"GPU-{i:02d}" for i in range(n)]
    pairs = list(itertools.combinations(names, 2))
    nv = {p: draw(st.sampled_from([0, 0, 1, 2, 4, 18])) for p in pairs}
    pc = {p: draw(st.sampled_from(LEVELS)) for p in pairs}
    numa = {g: draw(st.sampled_from([0, 1, None])) for g in names}
    return Topology.build(names, nvlinks=nv, pcie=pc, numa=numa)


@given(data=st.data(), topology=topologies())
def test_best_set_equals_brute_force(data: st.DataObject, topology: Topology) -> None:
    available = data.draw(st.lists(st.sampled_from(topology.gpus), unique=True))
    must = data.draw(st.lists(st.sampled_from(available), unique=True, max_size=3)) if available else []
    size = data.draw(st.integers(min_value=0, max_value=len(topology.gpus)))
    got = best_gpu_set(topology, available=available, must_include=must, size=size)
    assert got == brute_force_best(topology, available=available, must_include=must, size=size)
    assert len(got) == min(size, len(set(available) | set(must))) or size <= len(must)
    assert set(must[:size]) <= set(got) or size < len(must)


@given(topology=topologies(max_gpus=8), data=st.data())
def test_answer_is_deterministic_under_input_order(topology: Topology, data: st.DataObject) -> None:
    available = list(topology.gpus)
    shuffled = data.draw(st.permutations(available))
    size = data.draw(st.integers(min_value=1, max_value=len(available)))
    assert best_gpu_set(topology, available=available, size=size) == best_gpu_set(
        topology, available=shuffled, size=size
    )


@pytest.mark.parametrize("profile", ["dgx1-v100", "pcie-l40s", "dgx-h100", "dgx-a100-mig", "gb200-nvl72"])
def test_optimal_on_every_size_of_each_profile(profile: str) -> None:
    topology = topology_from_inventory(inventory(profile))
    gpus = topology.gpus
    for size in range(1, len(gpus) + 1):
        got = best_gpu_set(topology, available=gpus, size=size)
        assert got == brute_force_best(topology, available=gpus, size=size), size
        for must in gpus[:3]:
            want = brute_force_best(topology, available=gpus, must_include=[must], size=size)
            assert best_gpu_set(topology, available=gpus, must_include=[must], size=size) == want


def test_sixteen_gpus_against_brute_force() -> None:
    # two 8-GPU NVLink islands with uneven links, joined over PCIe: the exact search must find the optimum
    names = [f"GPU-{i:02d}" for i in range(16)]
    nv = {}
    pc = {}
    for a, b in itertools.combinations(range(16), 2):
        same = a // 8 == b // 8
        nv[(names[a], names[b])] = ((a * 7 + b * 3) % 4) if same else 0
        pc[(names[a], names[b])] = LEVELS[(a + b) % 5]
    topology = Topology.build(names, nvlinks=nv, pcie=pc, numa={g: i // 8 for i, g in enumerate(names)})
    for size in (2, 5, 8, 11):
        assert best_gpu_set(topology, available=names, size=size) == brute_force_best(
            topology, available=names, size=size
        )


def test_dgx1_pairs_pick_double_links() -> None:
    inv = inventory("dgx1-v100")
    topology = topology_from_inventory(inv)
    uuid = {g.index: g.uuid for g in inv.gpus}
    got = best_gpu_set(topology, available=topology.gpus, must_include=[uuid[0]], size=2)
    # GPU 0 has NV2 to GPUs 3 and 4 (hardware.md §2); 3 shares its NUMA node, so it wins the tie on PCIe
    assert set(got) == {uuid[0], uuid[3]}
    # the best four GPUs have as many NVLinks among them as any four can have
    four = best_gpu_set(topology, available=topology.gpus, size=4)
    assert topology.score(four).nvlinks == brute_force_score(topology, 4)


def brute_force_score(topology: Topology, size: int) -> int:
    return max(topology.score(c).nvlinks for c in itertools.combinations(topology.gpus, size))


def test_pcie_l40s_prefers_one_numa_node() -> None:
    inv = inventory("pcie-l40s")
    topology = topology_from_inventory(inv)
    got = best_gpu_set(topology, available=topology.gpus, size=2)
    numa = {g.uuid: g.numa_node for g in inv.gpus}
    assert numa[got[0]] == numa[got[1]]


def test_unhealthy_and_unknown_devices_are_skipped_not_fatal() -> None:
    inv = inventory("dgx-h100")
    topology = topology_from_inventory(inv)
    bad = topology.gpus[0]
    got = preferred_allocation(
        candidates=gpu_candidates(topology, {bad}),
        topology=topology,
        available=[*topology.gpus, "GPU-not-on-this-node"],
        must_include=[],
        size=3,
    )
    assert len(got) == 3
    assert bad not in got
    assert "GPU-not-on-this-node" not in got


def test_must_include_comes_first_and_is_kept() -> None:
    topology = topology_from_inventory(inventory("dgx1-v100"))
    must = topology.gpus[5]
    got = preferred_allocation(
        candidates=gpu_candidates(topology),
        topology=topology,
        available=topology.gpus,
        must_include=[must],
        size=3,
    )
    assert got[0] == must
    assert len(set(got)) == 3


def replica_candidates(gpus: int, replicas: int) -> dict[str, Candidate]:
    return {
        f"GPU-{g}::{r}": Candidate(id=f"GPU-{g}::{r}", gpu=f"GPU-{g}", kind=DeviceKind.REPLICA)
        for g in range(gpus)
        for r in range(replicas)
    }


@pytest.mark.parametrize(
    ("policy", "taken", "size", "want_gpus"),
    [
        pytest.param(Policy.SPREAD, [], 3, ["GPU-0", "GPU-1", "GPU-2"], id="spread-empty"),
        pytest.param(Policy.SPREAD, ["GPU-0::0", "GPU-1::0"], 1, ["GPU-2"], id="spread-least-used"),
        pytest.param(Policy.PACK, [], 3, ["GPU-0", "GPU-0", "GPU-0"], id="pack-empty"),
        pytest.param(Policy.PACK, ["GPU-2::0"], 2, ["GPU-2", "GPU-2"], id="pack-most-used"),
    ],
)
def test_replica_policies(policy: Policy, taken: list[str], size: int, want_gpus: list[str]) -> None:
    candidates = replica_candidates(3, 4)
    available = [d for d in candidates if d not in taken]
    topology = Topology.build(["GPU-0", "GPU-1", "GPU-2"])
    got = preferred_allocation(
        candidates=candidates,
        topology=topology,
        available=available,
        must_include=[],
        size=size,
        policy=policy,
    )
    assert [candidates[d].gpu for d in got] == want_gpus


def test_mig_devices_prefer_one_parent() -> None:
    candidates = {
        "MIG-a0": Candidate("MIG-a0", "GPU-a", DeviceKind.MIG),
        "MIG-b0": Candidate("MIG-b0", "GPU-b", DeviceKind.MIG),
        "MIG-b1": Candidate("MIG-b1", "GPU-b", DeviceKind.MIG),
        "MIG-c0": Candidate("MIG-c0", "GPU-c", DeviceKind.MIG),
        "MIG-c1": Candidate("MIG-c1", "GPU-c", DeviceKind.MIG),
        "MIG-c2": Candidate("MIG-c2", "GPU-c", DeviceKind.MIG),
    }
    topology = Topology.build(["GPU-a", "GPU-b", "GPU-c"])
    got = preferred_allocation(
        candidates=candidates, topology=topology, available=list(candidates), must_include=[], size=2
    )
    assert {candidates[d].gpu for d in got} == {"GPU-b"}  # the tightest parent that fits
    with_must = preferred_allocation(
        candidates=candidates, topology=topology, available=list(candidates), must_include=["MIG-c0"], size=2
    )
    assert {candidates[d].gpu for d in with_must} == {"GPU-c"}


@given(topology=topologies(max_gpus=8), data=st.data())
def test_never_over_size_and_never_unhealthy(topology: Topology, data: st.DataObject) -> None:
    unhealthy = set(data.draw(st.lists(st.sampled_from(topology.gpus), unique=True)))
    size = data.draw(st.integers(min_value=1, max_value=len(topology.gpus)))
    got = preferred_allocation(
        candidates=gpu_candidates(topology, unhealthy),
        topology=topology,
        available=list(topology.gpus),
        must_include=[],
        size=size,
    )
    assert len(got) == min(size, len(topology.gpus) - len(unhealthy))
    assert not set(got) & unhealthy
    # never worse than the simple baseline: the first healthy GPUs by name
    baseline = sorted(set(topology.gpus) - unhealthy)[:size]
    assert topology.score(got).as_tuple() >= topology.score(baseline).as_tuple()


def test_pcie_levels_break_ties_between_nvswitch_pairs() -> None:
    inv = inventory("dgx-h100")
    uuid = {g.index: g.uuid for g in inv.gpus}
    # every pair is NV18 through the NVSwitches; NVML says GPUs 0 and 5 share a PCIe switch
    levels = dict.fromkeys(itertools.combinations(range(8), 2), LinkLevel.SYS)
    levels[(0, 5)] = LinkLevel.PIX
    topology = topology_from_inventory(inv, pcie_levels=levels)
    assert best_gpu_set(topology, available=topology.gpus, size=2) == tuple(sorted((uuid[0], uuid[5])))
    without = topology_from_inventory(inv)  # NUMA fallback: a same-socket pair, first by name
    pair = best_gpu_set(without, available=without.gpus, size=2)
    numa = {g.uuid: g.numa_node for g in inv.gpus}
    assert numa[pair[0]] == numa[pair[1]]
