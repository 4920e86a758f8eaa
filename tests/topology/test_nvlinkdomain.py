"""An NVLink domain as a whole: tray readiness (fabric under the agent's own policy, managed IMEX, Node),
degraded trays and why, the IMEX quorum, the largest subgroup of whole trays, stranded GPUs and
fragmentation; the NVLinkDomain object and its CRD."""

from __future__ import annotations

import copy
import dataclasses
import pathlib
from typing import Any

import pytest
import yaml

from tests.topology.factories import nvl72_tray
from tests.topology.test_fabrichealth import with_gpu
from topology.builder import FabricPolicy as TreePolicy
from topology.controller import Inputs, build_from
from topology.fabrichealth import DEFAULT_DEGRADED, DEFAULT_UNHEALTHY, FabricCondition, FabricPolicy
from topology.gpunode import GpuNodeError, gpunode_object, inventory_from_gpunode, published_verdicts
from topology.model import Health, NodeInventory
from topology.nvlink import FabricStatus
from topology.nvlinkdomain import (
    DomainStatus,
    TrayState,
    crd_yaml,
    domain_statuses,
    largest_subgroup,
    nvlinkdomain_crd,
    nvlinkdomain_object,
    tray_from_gpunode,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
READY_IMEX = {"state": "ready", "status": "READY", "peers": 18, "managed": True}
STRICT = FabricPolicy(
    unhealthy=DEFAULT_UNHEALTHY | {FabricCondition.DEGRADED_BANDWIDTH},
    degraded=DEFAULT_DEGRADED - {FabricCondition.DEGRADED_BANDWIDTH},
)


def tray_of(obj: dict[str, Any], *, used: int = 0, node: dict[str, Any] | None = None) -> TrayState:
    """What the controller reads from a GPUNode object."""
    name, inv, health = inventory_from_gpunode(obj)
    status = obj["status"]
    got = tray_from_gpunode(
        name,
        inv,
        verdicts=published_verdicts(obj),
        health=health,
        imex=status.get("imex"),
        node=node,
        used_gpus=used,
    )
    assert got is not None
    return got


def rack(n: int = 18, **overrides: NodeInventory) -> dict[str, dict[str, Any]]:
    out = {}
    for t in range(n):
        name = f"rack0-tray{t}"
        inv = overrides.get(name) or nvl72_tray(name)
        out[name] = gpunode_object(inv, node_name=name, imex=READY_IMEX)
    return out


def status_of(objs: dict[str, dict[str, Any]], used: dict[str, int] | None = None) -> DomainStatus:
    (only,) = domain_statuses(tray_of(o, used=(used or {}).get(n, 0)) for n, o in objs.items()).values()
    return only


def test_a_clean_rack_is_ready_with_quorum_and_a_subgroup_of_18() -> None:
    s = status_of(rack())
    assert (len(s.members), len(s.ready), s.quorum, s.largest_subgroup) == (18, 18, "18/18", 18)
    assert (s.gpus, s.healthy_gpus, s.free_gpus, s.stranded_gpus, s.fragmentation) == (72, 72, 72, 0, 0.0)
    assert s.degraded == ()
    assert s.name.startswith("nvl-")
    assert nvlinkdomain_object(s)["status"]["phase"] == "Ready"


def test_route_unhealthy_tray_is_not_ready_and_its_free_gpus_are_stranded() -> None:
    bad = with_gpu(nvl72_tray("rack0-tray3"), 1, health={"route_unhealthy": True})
    s = status_of(rack(**{"rack0-tray3": bad}))
    assert "rack0-tray3" not in s.ready
    assert (s.largest_subgroup, s.stranded_gpus) == (17, 4)
    (d,) = s.degraded
    assert (d.name, d.ready) == ("rack0-tray3", False)
    assert "route_unhealthy" in d.reason
    assert nvlinkdomain_object(s)["status"]["phase"] == "Degraded"


def test_degraded_bandwidth_keeps_the_tray_ready_but_listed() -> None:
    slow = with_gpu(nvl72_tray("rack0-tray5"), 0, health={"degraded_bandwidth": True})
    s = status_of(rack(**{"rack0-tray5": slow}))
    assert len(s.ready) == 18
    assert s.largest_subgroup == 18
    (d,) = s.degraded
    assert (d.name, d.ready, d.reason) == ("rack0-tray5", True, "fabric degraded: degraded_bandwidth")


def test_agent_policy_that_calls_degraded_bandwidth_unhealthy_makes_the_tray_unready() -> None:
    """The agent's configured policy, published per GPU in status.fabric, is what the controller reads."""
    slow = with_gpu(nvl72_tray("rack0-tray5"), 0, health={"degraded_bandwidth": True})
    objs = rack()
    objs["rack0-tray5"] = gpunode_object(slow, node_name="rack0-tray5", fabric_policy=STRICT, imex=READY_IMEX)
    s = status_of(objs)
    assert "rack0-tray5" not in s.ready
    assert s.largest_subgroup == 17
    assert "degraded_bandwidth" in s.degraded[0].reason
    # the HyperNode tree agrees: the tray leaves its clique's domain
    tree = build_from(Inputs(gpunodes=objs, nodes=None), policy=TreePolicy.ISOLATE).tree
    assert "rack0-tray5" in tree.excluded
    # an older agent's object without status.fabric: the default policy judges (degraded, kept)
    old = copy.deepcopy(objs["rack0-tray5"])
    del old["status"]["fabric"]
    objs["rack0-tray5"] = old
    assert "rack0-tray5" in status_of(objs).ready
    tree = build_from(Inputs(gpunodes=objs, nodes=None), policy=TreePolicy.ISOLATE).tree
    assert "rack0-tray5" not in tree.excluded


def test_managed_imex_not_ready_makes_the_tray_unready_unmanaged_only_degraded() -> None:
    objs = rack()
    objs["rack0-tray0"]["status"]["imex"] = {
        "state": "not-ready",
        "status": "WAITING_FOR_PEERS",
        "managed": True,
    }
    objs["rack0-tray1"]["status"]["imex"] = {"state": "not-ready", "status": "WAITING_FOR_PEERS"}
    s = status_of(objs)
    assert s.quorum == "16/18"
    assert "rack0-tray0" not in s.ready
    assert "rack0-tray1" in s.ready
    reasons = {d.name: (d.ready, d.reason) for d in s.degraded}
    assert reasons["rack0-tray0"] == (False, "IMEX WAITING_FOR_PEERS")
    assert reasons["rack0-tray1"] == (True, "IMEX WAITING_FOR_PEERS (not managed by the agent)")


def test_unhealthy_gpu_and_used_gpus_shrink_the_largest_subgroup_and_fragment() -> None:
    objs = rack()
    inv = nvl72_tray("rack0-tray2")
    sick = {g.uuid: (Health.UNHEALTHY if g.index == 0 else Health.HEALTHY) for g in inv.gpus}
    objs["rack0-tray2"] = gpunode_object(inv, node_name="rack0-tray2", health=sick, imex=READY_IMEX)
    s = status_of(objs, used={"rack0-tray7": 2})
    assert (s.healthy_gpus, s.free_gpus, s.largest_subgroup) == (71, 69, 16)
    # 69 free on ready trays, 64 of them on wholly free trays
    assert s.fragmentation == pytest.approx(1 - 64 / 69)
    assert {d.name: d.reason for d in s.degraded} == {"rack0-tray2": "1 of 4 GPUs unhealthy"}


def test_not_ready_node_is_not_a_ready_tray() -> None:
    obj = rack(1)["rack0-tray0"]
    node = {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    t = tray_of(obj, node=node)
    assert t.not_ready_reason() == "Node NotReady"
    assert largest_subgroup([t]) == 0


def test_fabric_in_progress_tray_stays_a_member_but_not_ready() -> None:
    from topology.model import FabricState

    starting = nvl72_tray("rack0-tray9", state=FabricState.IN_PROGRESS)
    s = status_of(rack(**{"rack0-tray9": starting}))
    assert "rack0-tray9" in s.members
    assert "rack0-tray9" not in s.ready


def test_two_racks_are_two_domains() -> None:
    objs = rack(2)
    other = nvl72_tray("rack1-tray0", cluster_uuid="bbbbbbbb-0000-0000-0000-000000000001", clique_id=1)
    objs["rack1-tray0"] = gpunode_object(other, node_name="rack1-tray0")
    statuses = domain_statuses(tray_of(o) for o in objs.values())
    assert sorted(len(s.members) for s in statuses.values()) == [1, 2]


@pytest.mark.parametrize(
    "fabric",
    [
        "not a list",
        [{"gpu": 0}],
        [{"gpu": 0, "level": "fine", "conditions": []}],
        [{"gpu": -1, "level": "healthy", "conditions": []}],
        [{"gpu": True, "level": "healthy", "conditions": []}],
        [{"gpu": 0, "level": "healthy", "conditions": ["bogus"]}],
        ["x"],
    ],
    ids=["not-list", "no-level", "bad-level", "negative-gpu", "bool-gpu", "bad-condition", "not-object"],
)
def test_malformed_published_verdicts_are_refused_with_the_entry(fabric: object) -> None:
    obj = rack(1)["rack0-tray0"]
    obj["status"]["fabric"] = fabric
    with pytest.raises(GpuNodeError, match=r"status\.fabric"):
        published_verdicts(obj)


def test_malformed_verdicts_skip_only_that_gpunode_in_the_controller() -> None:
    objs = rack(3)
    objs["rack0-tray1"]["status"]["fabric"] = [{"gpu": 0, "level": "nonsense"}]
    result = build_from(Inputs(gpunodes=objs, nodes=None), policy=TreePolicy.ISOLATE)
    assert any("rack0-tray1" in p and "status.fabric" in p for p in result.problems)
    assert set(result.tree.node_domain) == {"rack0-tray0", "rack0-tray2"}


def test_tray_of_a_node_without_multi_node_fabric_is_none() -> None:
    from tests.topology.factories import hgx_node

    inv = hgx_node("hgx-0")
    assert tray_from_gpunode("hgx-0", inv, verdicts=None, health=None, imex=None) is None


def test_crd_on_disk_is_generated_and_the_chart_has_the_same() -> None:
    on_disk = (ROOT / "daemonset/crds/nvlinkdomain.yaml").read_text(encoding="utf-8")
    assert on_disk == crd_yaml(), "regenerate with: .venv/bin/python -m topology.nvlinkdomain"
    chart = (ROOT / "daemonset/chart/gpu-node-agent/crds/nvlinkdomain.yaml").read_text(encoding="utf-8")
    assert chart == on_disk


def test_object_fits_the_crd_schema_and_printer_columns_name_real_fields() -> None:
    s = status_of(rack())
    obj = yaml.safe_load(yaml.safe_dump(nvlinkdomain_object(s)))
    version = nvlinkdomain_crd()["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert set(obj["status"]) <= set(schema)
    for col in version["additionalPrinterColumns"]:
        value: Any = obj
        for part in col["jsonPath"].strip(".").split("."):
            value = value.get(part) if isinstance(value, dict) else None
        assert value is not None or col["name"] == "Age", col


def test_tray_state_is_frozen_and_free_never_negative() -> None:
    t = TrayState(name="a", clique=status_of(rack(1)).clique, gpus=4, healthy_gpus=2, used_gpus=4)
    assert t.free_gpus == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.gpus = 3  # type: ignore[misc]
    assert FabricStatus.OK is t.fabric
