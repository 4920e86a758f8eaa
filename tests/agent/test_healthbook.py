"""The health state machine: which keys an input marks, and when they come back."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from agent.healthbook import (
    DEFAULT_IGNORED_XIDS,
    RESET_XIDS,
    SELF_CLEARING_XIDS,
    FaultClass,
    HealthBook,
    HealthConfig,
)
from agent.nvml.protocol import EventKind, HealthReading, NvmlEvent
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
    reason = b.status(gpu.uuid).reason
    assert reason is not None
    assert reason.startswith("XID 48 (double-bit ECC error): needs a GPU reset")
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
    b.on_event(xid(gpu, 94), 0.0)  # contained ECC error: the application restarts, no reset
    b.on_event(xid(gpu, 8), 8.0)
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
    assert (b.status(gpu.uuid).reason or "").startswith("fabric unhealthy: route_unhealthy")
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


# --------------------------------------------------------------------------- recovery on evidence


def reading(gpu: Gpu, unc: int = 0, cor: int = 0, **kw: Any) -> HealthReading:
    return HealthReading(uuid=gpu.uuid, ecc_uncorrected_volatile=unc, ecc_corrected_volatile=cor, **kw)


def answers(b: HealthBook, gpu: Gpu, now: float, **kw: Any) -> None:
    b.on_probe(gpu.uuid, answered=True, lost=False, now=now, reading=reading(gpu, **kw))


@pytest.mark.parametrize("value", sorted(RESET_XIDS))
def test_a_reset_class_xid_never_clears_by_quiet_alone(mig_inventory: NodeInventory, value: int) -> None:
    gpu = mig_inventory.gpus[5]
    b = book(mig_inventory, ignored_xids=frozenset())  # 109 is in the default ignore list
    answers(b, gpu, 0.0)
    b.on_event(xid(gpu, value), 1.0)
    for now in (20.0, 100.0, 10_000.0):
        answers(b, gpu, now)
    assert not b.status(gpu.uuid).healthy
    assert b.needs_reset(gpu.uuid)


def test_xid_92_clears_after_the_quiet_period_without_a_reset(mig_inventory: NodeInventory) -> None:
    """Xid 92 (high single-bit ECC rate) is self-clearing: NVIDIA's catalog resolves it IGNORE (see the
    table's comment for the reference that says otherwise, and why it is not followed)."""
    gpu = mig_inventory.gpus[2]
    b = book(mig_inventory)
    answers(b, gpu, 0.0, cor=5)
    assert b.on_event(xid(gpu, 92), 1.0).changed == {gpu.uuid}
    assert not b.needs_reset(gpu.uuid)
    answers(b, gpu, 5.0, cor=900)  # corrected errors keep coming: no reason to keep it out
    assert not b.status(gpu.uuid).healthy
    answers(b, gpu, 11.0, cor=1000)
    assert b.status(gpu.uuid).healthy


def test_the_xid_classes_are_disjoint_and_a_reset_class_ignored_xid_is_only_109() -> None:
    assert not set(RESET_XIDS) & set(SELF_CLEARING_XIDS)
    assert 92 in SELF_CLEARING_XIDS
    assert DEFAULT_IGNORED_XIDS & set(RESET_XIDS) == {109}


def _device_health_section() -> str:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    start = text.index("### Device health")
    return " ".join(text[start : text.index("\n### ", start + 1)].split())


def test_the_readme_states_the_xid_table_as_the_code_has_it() -> None:
    """The README's Device health lists exactly the reset-class Xids, and says what the code does with
    Xid 92 (self-clearing) and with each Xid that is both reset-class and ignored by default (109)."""
    section = _device_health_section()
    listed = re.search(r"a lost GPU; Xids ([\d, ]+) \(NVIDIA's Xid catalog", section)
    assert listed is not None
    assert [int(x) for x in listed.group(1).split(",")] == sorted(RESET_XIDS)
    assert re.search(r"Every other Xid clears after the quiet period; among them Xid 92\b", section)
    for value in sorted(DEFAULT_IGNORED_XIDS & set(RESET_XIDS)):
        sentence = re.search(
            rf"Xid {value} \([^)]*\) is reset-class by the catalog and also in the default "
            r"ignore list",
            section,
        )
        assert sentence is not None, f"the README does not say Xid {value} is reset-class and ignored"


def test_xid_79_with_rising_ecc_stays_out_and_returns_after_a_reset(mig_inventory: NodeInventory) -> None:
    """The issue's case: after Xid 79 the GPU answers again while its volatile uncorrectable ECC count
    keeps rising; it stays out well past the quiet period, and returns once the counters were reset."""
    gpu = mig_inventory.gpus[6]
    b = book(mig_inventory)
    answers(b, gpu, 0.0)
    b.on_event(xid(gpu, 79), 1.0)
    b.on_probe(gpu.uuid, answered=False, lost=True, now=2.0, error="GPU is lost")
    answers(b, gpu, 3.0, unc=2)  # answers again, no reset: uncorrectable errors since the last one
    for i, now in enumerate((20.0, 40.0, 60.0, 80.0)):
        answers(b, gpu, now, unc=3 + i)
    status = b.status(gpu.uuid)
    assert not status.healthy
    assert status.reason is not None
    assert "uncorrectable ECC errors rising (volatile count 5 -> 6)" in status.reason
    assert "needs a GPU reset" in status.reason
    answers(b, gpu, 90.0, unc=0)  # a reset: the volatile counters are back at zero
    assert not b.status(gpu.uuid).healthy  # then the quiet period
    answers(b, gpu, 99.0, unc=0)
    assert not b.status(gpu.uuid).healthy
    out = b.on_probe(gpu.uuid, answered=True, lost=False, now=100.0, reading=reading(gpu))
    assert out.changed == {gpu.uuid}
    assert b.status(gpu.uuid).healthy


def test_a_rise_in_uncorrectable_ecc_marks_a_healthy_gpu(mig_inventory: NodeInventory) -> None:
    gpu, other = mig_inventory.gpus[4], mig_inventory.gpus[5]
    b = book(mig_inventory)
    answers(b, gpu, 0.0, unc=1)  # the first reading is the baseline
    answers(b, other, 0.0)
    assert b.status(gpu.uuid).healthy
    out = b.on_probe(gpu.uuid, answered=True, lost=False, now=5.0, reading=reading(gpu, unc=2))
    assert out.changed == {gpu.uuid}
    assert b.needs_reset(gpu.uuid)
    assert b.status(other.uuid).healthy


def test_a_rise_during_the_quiet_period_counts_as_bad(mig_inventory: NodeInventory) -> None:
    gpu = mig_inventory.gpus[0]
    b = book(mig_inventory)
    answers(b, gpu, 0.0)
    b.on_event(xid(gpu, 94), 1.0)  # self-clearing
    answers(b, gpu, 5.0, unc=1)  # an uncorrectable error inside the quiet period: now it needs a reset
    answers(b, gpu, 100.0, unc=1)
    assert b.needs_reset(gpu.uuid)
    assert not b.status(gpu.uuid).healthy


def test_a_new_gpu_is_lost_during_the_quiet_period_needs_a_new_reset(mig_inventory: NodeInventory) -> None:
    gpu = mig_inventory.gpus[1]
    b = book(mig_inventory)
    b.on_event(xid(gpu, 79), 0.0)
    answers(b, gpu, 1.0)  # re-enumerated: the quiet period runs
    b.on_probe(gpu.uuid, answered=False, lost=True, now=5.0, error="GPU is lost")
    assert b.is_lost(gpu.uuid)
    answers(b, gpu, 6.0)
    answers(b, gpu, 12.0)
    assert not b.status(gpu.uuid).healthy  # quiet counted from 6, not 1
    answers(b, gpu, 16.0)
    assert b.status(gpu.uuid).healthy


@pytest.mark.parametrize(
    ("flags", "fault"),
    [
        ({"remapped_rows_pending": True}, "row remap pending"),
        ({"remapped_rows_failure": True}, "row remapping failed"),
        ({"retired_pages_pending": True}, "page retirement pending"),
    ],
    ids=["remap-pending", "remap-failed", "retirement-pending"],
)
def test_pending_remap_or_retirement_holds_the_gpu_until_a_reset(
    mig_inventory: NodeInventory, flags: dict[str, bool], fault: str
) -> None:
    gpu = mig_inventory.gpus[7]
    b = book(mig_inventory)
    answers(b, gpu, 0.0, unc=1, **flags)
    status = b.status(gpu.uuid)
    assert not status.healthy
    assert status.reason is not None
    assert status.reason.startswith(fault)
    answers(b, gpu, 50.0, unc=1, **flags)
    assert not b.status(gpu.uuid).healthy
    answers(b, gpu, 60.0, unc=0)  # reset: the counter fell, the flag is gone
    answers(b, gpu, 70.0, unc=0)
    assert b.status(gpu.uuid).healthy


def test_a_clean_reading_without_evidence_of_a_reset_does_not_return_the_gpu(
    mig_inventory: NodeInventory,
) -> None:
    gpu = mig_inventory.gpus[3]
    b = book(mig_inventory)
    answers(b, gpu, 0.0)
    b.on_event(NvmlEvent(EventKind.ECC_DBE, gpu.index, gpu.uuid), 1.0)
    answers(b, gpu, 500.0)  # zero counters all along: nothing says a reset happened
    assert not b.status(gpu.uuid).healthy


def test_the_reason_names_the_fault_and_what_clears_it(mig_inventory: NodeInventory) -> None:
    gpu, other = mig_inventory.gpus[0], mig_inventory.gpus[1]
    b = book(mig_inventory)
    b.on_event(NvmlEvent(EventKind.GPU_LOST, gpu.index, gpu.uuid), 0.0)
    b.on_event(xid(other, 94), 0.0)
    lost, contained = b.status(gpu.uuid).reason, b.status(other.uuid).reason
    assert lost is not None
    assert contained is not None
    assert lost.startswith("GPU lost (NVML answers GPU_IS_LOST); not answering NVML: needs a GPU reset")
    assert contained == "XID 94 (contained ECC error): returns after 10 s without errors"


def test_a_reset_right_after_the_fault_is_seen_against_the_counters_read_with_the_event(
    mig_inventory: NodeInventory,
) -> None:
    """The counters read just after a double-bit ECC event are the baseline: a reset before the next probe
    still shows as a counter that fell, and the counter the event itself raised is not a second fault."""
    gpu = mig_inventory.gpus[3]
    b = book(mig_inventory)
    answers(b, gpu, 0.0, unc=0)
    b.on_event(NvmlEvent(EventKind.ECC_DBE, gpu.index, gpu.uuid), 1.0)
    b.note_reading(HealthReading(uuid=gpu.uuid, ecc_corrected_volatile=0, ecc_uncorrected_volatile=1))
    reason = b.status(gpu.uuid).reason
    assert reason is not None
    assert reason.startswith("double-bit ECC error")
    answers(b, gpu, 2.0, unc=0)  # reset between the event and this probe
    answers(b, gpu, 20.0, unc=0)
    assert b.status(gpu.uuid).healthy


def test_each_mark_says_its_fault_class_for_readers_that_must_name_it(mig_inventory: NodeInventory) -> None:
    """The class DRA turns into a taint key (xid, lost, fabric) is the book's, with the short fault."""
    g0, g1, g2, g3 = mig_inventory.gpus[:4]
    b = book(mig_inventory, fabric_unhealthy_marks_gpu=True)
    b.on_event(xid(g0, 48), 0.0)
    b.on_event(xid(g1, 79), 0.0)
    b.on_event(NvmlEvent(EventKind.ECC_DBE, g2.index, g2.uuid), 0.0)
    b.on_fabric(g3.uuid, ROUTE_UNHEALTHY, 0.0)
    got = {u: (b.status(u).fault_class, b.status(u).fault) for u in (g0.uuid, g1.uuid, g2.uuid, g3.uuid)}
    assert got == {
        g0.uuid: (FaultClass.XID, "XID 48 (double-bit ECC error)"),
        g1.uuid: (FaultClass.LOST, "XID 79 (GPU has fallen off the bus)"),
        g2.uuid: (FaultClass.XID, "double-bit ECC error"),
        g3.uuid: (FaultClass.FABRIC, "fabric unhealthy: route_unhealthy"),
    }
    assert b.table().of(g3.uuid).fault_class is FaultClass.FABRIC
    # a later reset-class XID on the fabric-marked GPU takes over the fault and its class
    b.on_event(xid(g3, 48), 1.0)
    assert b.status(g3.uuid).fault_class is FaultClass.XID
    assert b.status(mig_inventory.gpus[5].uuid).fault_class is None  # healthy: no class
