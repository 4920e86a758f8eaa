"""The health state machine: which keys an input marks, and when they come back."""

from __future__ import annotations

from typing import Any

import pytest

from agent.healthbook import HealthBook, HealthConfig
from agent.nvml.protocol import EventKind, NvmlEvent
from tests.deviceplugin.helpers import inventory
from topology.fabrichealth import FabricCondition, FabricLevel, GpuFabricVerdict
from topology.model import Gpu, Health, NodeInventory


@pytest.fixture(scope="module")
def mig_inventory() -> NodeInventory:
    return inventory("dgx-a100-mig")


def book(inv: NodeInventory, **kw: Any) -> HealthBook:
    b = HealthBook(config=HealthConfig(recovery_quiet_s=10, **kw))
    b.set_inventory(inv, 0.0)
    return b


def xid(gpu: Gpu, value: int, gi: int | None = None, ci: int | None = None) -> NvmlEvent:
    return NvmlEvent(
        EventKind.XID, gpu.index, gpu.uuid, xid=value, gpu_instance_id=gi, compute_instance_id=ci
    )


def test_critical_xid_marks_only_that_gpu(mig_inventory: NodeInventory) -> None:
    b = book(mig_inventory)
    gpu = mig_inventory.gpus[3]
    out = b.on_event(xid(gpu, 48), 1.0)
    assert out.changed == {gpu.uuid}
    assert b.status(gpu.uuid).health is Health.UNHEALTHY
    assert b.status(gpu.uuid).reason == "XID 48"
    assert all(b.status(g.uuid).healthy for g in mig_inventory.gpus if g is not gpu)


@pytest.mark.parametrize("value", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_ignored(mig_inventory: NodeInventory, value: int) -> None:
    b = book(mig_inventory)
    out = b.on_event(xid(mig_inventory.gpus[0], value), 1.0)
    assert out.ignored
    assert not out.changed


def test_ignore_list_is_configurable(mig_inventory: NodeInventory) -> None:
    b = book(mig_inventory, ignored_xids=frozenset({94}))
    assert b.on_event(xid(mig_inventory.gpus[0], 94), 1.0).ignored
    assert b.on_event(xid(mig_inventory.gpus[0], 13), 1.0).changed


def test_mig_instance_xid_marks_only_that_mig_device(mig_inventory: NodeInventory) -> None:
    mig = mig_inventory.mig_devices()[0]
    gpu = mig_inventory.gpu(mig.parent_index)
    b = book(mig_inventory)
    out = b.on_event(xid(gpu, 48, mig.gpu_instance_id, mig.compute_instance_id), 1.0)
    assert out.changed == {mig.uuid}
    assert b.status(gpu.uuid).healthy
    siblings = [m for m in mig_inventory.mig_devices() if m.parent_uuid == gpu.uuid and m.uuid != mig.uuid]
    assert siblings
    assert all(b.status(m.uuid).healthy for m in siblings)


def test_lost_gpu_waits_until_it_answers_then_for_quiet_period(mig_inventory: NodeInventory) -> None:
    gpu = mig_inventory.gpus[2]
    b = book(mig_inventory)
    b.on_event(NvmlEvent(EventKind.GPU_LOST, gpu.index, gpu.uuid), 1.0)
    assert b.is_lost(gpu.uuid)
    b.on_probe(gpu.uuid, answered=False, lost=True, now=100.0)
    assert not b.status(gpu.uuid).healthy
    b.on_probe(gpu.uuid, answered=True, lost=False, now=200.0)  # reappears: quiet period starts now
    assert not b.is_lost(gpu.uuid)
    assert not b.status(gpu.uuid).healthy
    b.on_probe(gpu.uuid, answered=True, lost=False, now=205.0)
    assert not b.status(gpu.uuid).healthy
    out = b.on_probe(gpu.uuid, answered=True, lost=False, now=210.0)
    assert out.changed == {gpu.uuid}
    assert b.status(gpu.uuid).healthy


def test_new_event_restarts_the_quiet_period(mig_inventory: NodeInventory) -> None:
    gpu = mig_inventory.gpus[0]
    b = book(mig_inventory)
    b.on_event(NvmlEvent(EventKind.ECC_DBE, gpu.index, gpu.uuid), 0.0)
    b.on_event(xid(gpu, 48), 8.0)
    b.on_probe(gpu.uuid, answered=True, lost=False, now=12.0)
    assert not b.status(gpu.uuid).healthy
    b.on_probe(gpu.uuid, answered=True, lost=False, now=18.0)
    assert b.status(gpu.uuid).healthy


def test_xid_79_counts_as_lost(mig_inventory: NodeInventory) -> None:
    gpu = mig_inventory.gpus[1]
    b = book(mig_inventory)
    b.on_event(xid(gpu, 79), 0.0)
    assert b.is_lost(gpu.uuid)


ROUTE_UNHEALTHY = GpuFabricVerdict(0, FabricLevel.UNHEALTHY, (FabricCondition.ROUTE_UNHEALTHY,))


def test_fabric_health_only_when_configured(mig_inventory: NodeInventory) -> None:
    gpu = mig_inventory.gpus[0]
    assert book(mig_inventory).on_fabric(gpu.uuid, ROUTE_UNHEALTHY, 0.0).ignored
    b = book(mig_inventory, fabric_unhealthy_marks_gpu=True)
    assert b.on_fabric(gpu.uuid, ROUTE_UNHEALTHY, 0.0).changed == {gpu.uuid}
    assert b.status(gpu.uuid).reason == "fabric unhealthy: route_unhealthy"
    b.on_probe(gpu.uuid, answered=True, lost=False, now=50.0)
    assert not b.status(gpu.uuid).healthy  # fabric still unhealthy
    b.on_fabric(gpu.uuid, GpuFabricVerdict(0, FabricLevel.HEALTHY), 51.0)
    b.on_probe(gpu.uuid, answered=True, lost=False, now=52.0)
    assert b.status(gpu.uuid).healthy


def test_a_degraded_fabric_never_marks_the_gpu(mig_inventory: NodeInventory) -> None:
    gpu = mig_inventory.gpus[0]
    b = book(mig_inventory, fabric_unhealthy_marks_gpu=True)
    degraded = GpuFabricVerdict(0, FabricLevel.DEGRADED, (FabricCondition.DEGRADED_BANDWIDTH,))
    assert not b.on_fabric(gpu.uuid, degraded, 0.0).changed
    assert b.status(gpu.uuid).healthy


def test_sbe_and_mig_change_do_not_touch_health(mig_inventory: NodeInventory) -> None:
    gpu = mig_inventory.gpus[0]
    b = book(mig_inventory)
    for kind in (EventKind.ECC_SBE, EventKind.MIG_CONFIG_CHANGE, EventKind.RECOVERY_ACTION):
        assert b.on_event(NvmlEvent(kind, gpu.index, gpu.uuid), 0.0).ignored


def test_inventory_change_forgets_vanished_keys(mig_inventory: NodeInventory) -> None:
    mig = mig_inventory.mig_devices()[0]
    b = book(mig_inventory)
    parent = mig_inventory.gpu(mig.parent_index)
    b.on_event(xid(parent, 48, mig.gpu_instance_id, mig.compute_instance_id), 0.0)
    smaller = NodeInventory(host=mig_inventory.host, driver=mig_inventory.driver, gpus=mig_inventory.gpus)
    out = b.set_inventory(smaller, 1.0)
    assert mig.uuid in out.changed
    assert b.unhealthy_gpus() == []
