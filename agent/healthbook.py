"""Device health as a pure state machine: NVML events, fabric health and probes in, health by UUID out.

The one owner of device health on the node. :class:`HealthBook` decides it and keeps the records;
its output is a :class:`HealthTable`, an immutable value the store hands to every reader (the device
plugin, metrics, the publisher) without keeping health of its own.

Keys are GPU UUIDs and MIG UUIDs. A device kubelet sees (a GPU, a MIG device or a replica) is unhealthy
when any of its keys is (``deviceplugin.resources.Device.health_keys``; the rule is
:meth:`HealthTable.device`), so marking a GPU marks its MIG devices and replicas, and an event for one
MIG device marks only that MIG device (and the whole-GPU device that contains it, where one is
advertised).

Rules:

- XID critical errors mark the GPU, or the MIG device the event's GPU/compute instance IDs name, unless
  the XID is in the ignore list (default 13, 31, 43, 45, 68, 109: application errors). XID 79 (fell off
  the bus) counts as the GPU being lost.
- Double-bit ECC errors mark the GPU; single-bit ones, MIG config changes and recovery-action notices do
  not change health.
- GPU lost (or unavailable) marks the GPU *lost*: any NVML answer ``GPU_IS_LOST`` for it (an event wait,
  a probe, the metrics refresh, discovery) arrives here as a lost event or a failing probe.
- Probe readings (:class:`~agent.nvml.protocol.HealthReading`): a rise of the volatile uncorrectable ECC
  count, a pending or failed row remap, or pages pending retirement mark the GPU as needing a reset.
- A fabric the fabric policy calls unhealthy (``topology.fabrichealth``: by default route unhealthy,
  incorrect configuration, state other than ``COMPLETED``, summary ``UNHEALTHY``) marks the GPU when
  ``fabric_unhealthy_marks_gpu`` is set, until the fabric is no longer unhealthy; the reason names the
  conditions. A degraded fabric never marks a GPU.

Recovery, on evidence. Each fault is of one of two classes (:data:`RESET_XIDS` is the table, with its
source):

- *needs a reset* (lost, the reset-class XIDs, double-bit ECC, uncorrectable ECC rising, row remap
  pending or failed, retirement pending): it clears only once a probe has seen evidence of a reset — the
  GPU re-enumerated (it stopped answering and answers again), or a volatile ECC counter fell (only a reset
  or a driver reload sets them back) — and the GPU reads clean (volatile uncorrectable ECC count zero,
  no row remap pending or failed, no retirement pending), and then stays quiet for ``recovery_quiet_s``;
- *self-clearing* (every other XID): once a probe finds the GPU answering and nothing bad was seen for
  ``recovery_quiet_s`` seconds.

Something bad during the quiet period (a new event, a failing probe, a rise of the volatile
uncorrectable ECC count, a new GPU_IS_LOST) starts it again, and a reset-class one needs a new reset.
Each reason names the fault and what would clear it (the device plugin's log and the Node Event carry it).

No clock inside: every input carries ``now`` (monotonic seconds).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from agent.nvml.protocol import EventKind, HealthReading, NvmlEvent
from topology.fabrichealth import DEFAULT_FABRIC_POLICY, FabricLevel, FabricPolicy, GpuFabricVerdict
from topology.model import Health, NodeInventory

DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
LOST_XIDS: frozenset[int] = frozenset({79})

# The XIDs whose resolution in NVIDIA's Xid catalog ("Xid Errors", docs.nvidia.com/deploy/xid-errors,
# transcribed in the project's reference/hardware.md §12) is a GPU reset or a reboot (RESET_GPU,
# RESTART_BM, or a workflow ending in one), with what each means. A GPU they mark returns only on
# evidence of a reset. 46 and 48 as GB200 health validation treats them (drain, reset GPU); 63 takes
# effect at the next reset; 74 as NVIDIA's NVLink workflow most often ends. The rest of the catalog
# (application faults 13, 31, 32, 43, 45, 68, 69; 8, 38, 92, 94 contained ECC, 121, 154 …) clears after
# the quiet period.
# - 92 (high single-bit ECC error rate) is self-clearing: the catalog's resolution is IGNORE, then
#   CONTACT_SUPPORT (hardware.md §12). reference/gb200-imex.md lists 92 under "reset GPU"; the catalog does
#   not bear that out, and nothing is lost by following it: single-bit errors are corrected, and what
#   would need a reset (a row remap pending or failed, uncorrectable ECC rising, Xid 48/63/64) marks the
#   GPU reset-class through its own event or the probe.
# - 109 (context-switch timeout) is reset-class by the catalog (RESET_GPU) and also in
#   DEFAULT_IGNORED_XIDS, as in NVIDIA's device plugin (usually an application's doing): by default it
#   marks nothing; taken out of the ignore list it needs a reset.
RESET_XIDS: Mapping[int, str] = MappingProxyType(
    {
        46: "GPU stopped processing",
        48: "double-bit ECC error",
        62: "internal micro-controller halt",
        63: "row remap or page retirement recorded",
        64: "row remap or page retirement failed",
        74: "NVLink error",
        79: "GPU has fallen off the bus",
        95: "uncontained ECC error",
        109: "context-switch timeout",
        119: "GSP RPC timeout",
        120: "GSP error",
        136: "NVLink training failed",
        140: "unrecovered ECC error",
        143: "GPU initialization error",
        155: "NVLink software-defined error",
        156: "resource retirement event",
        158: "GPU fatal timeout",
    }
)
SELF_CLEARING_XIDS: Mapping[int, str] = MappingProxyType(
    {
        8: "GPU stopped processing (idle timeout)",
        13: "graphics engine exception",
        31: "GPU memory page fault",
        32: "invalid or corrupted push buffer",
        38: "driver firmware error",
        43: "GPU stopped processing (channel reset)",
        45: "preemptive cleanup",
        68: "video decoder exception",
        69: "graphics engine class error",
        92: "high single-bit ECC error rate",
        94: "contained ECC error",
        121: "C2C link error",
        154: "GPU recovery action changed",
    }
)


@dataclass(frozen=True, slots=True)
class HealthConfig:
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    fabric_unhealthy_marks_gpu: bool = False
    recovery_quiet_s: float = 120.0
    probe_interval_s: float = 5.0
    fabric_policy: FabricPolicy = DEFAULT_FABRIC_POLICY


class FaultClass(enum.StrEnum):
    """What kind of fault marked a key (readers that must say it, such as DRA device taints): ``lost``
    (not answering NVML), ``fabric`` (the fabric policy), ``xid`` (an XID, or a memory fault NVIDIA
    reports as one: double-bit ECC is XID 48, row remap 63/64, uncontained ECC 95)."""

    XID = "xid"
    LOST = "lost"
    FABRIC = "fabric"


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    health: Health
    reason: str | None = None
    fault: str | None = None  # the fault alone, short (e.g. "XID 79 (GPU has fallen off the bus)")
    fault_class: FaultClass | None = None

    @property
    def healthy(self) -> bool:
        return self.health is Health.HEALTHY


HEALTHY = DeviceHealth(Health.HEALTHY)


class HealthTable(Mapping[str, DeviceHealth]):
    """Device health at one moment: a read-only mapping of the unhealthy keys (GPU and MIG UUIDs) to
    their health and reason; a key it does not list is healthy.

    :meth:`device` is the one place the rule is written: a device made of several keys is unhealthy
    when any of them is.
    """

    __slots__ = ("_unhealthy",)

    def __init__(self, entries: Mapping[str, DeviceHealth] | None = None) -> None:
        self._unhealthy = {k: v for k, v in (entries or {}).items() if not v.healthy}

    def __getitem__(self, key: str) -> DeviceHealth:
        return self._unhealthy[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._unhealthy)

    def __len__(self) -> int:
        return len(self._unhealthy)

    def __repr__(self) -> str:
        return f"HealthTable({self._unhealthy!r})"

    def of(self, key: str) -> DeviceHealth:
        """One key's health."""
        return self._unhealthy.get(key, HEALTHY)

    def device(self, keys: Iterable[str]) -> DeviceHealth:
        """Health of a device made of several keys (a GPU and its MIG devices): the first unhealthy
        key's, else healthy."""
        for key in keys:
            status = self._unhealthy.get(key)
            if status is not None:
                return status
        return HEALTHY


@dataclass(slots=True)
class _Record:
    fault: str  # what happened, e.g. "XID 79 (GPU has fallen off the bus)"
    last_bad: float
    lost: bool = False  # not answering NVML now
    gone: bool = False  # NVML answered GPU_IS_LOST for it since the fault (re-enumeration can be seen)
    fabric: bool = False
    reset: bool = False  # needs a GPU reset before reuse
    reset_seen: bool = False  # a probe saw evidence of a reset since the fault
    fault_class: FaultClass = FaultClass.XID  # of ``fault``


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an input did: the keys whose health changed, and whether the event was ignored by rule."""

    changed: frozenset[str] = frozenset()
    ignored: bool = False


@dataclass(slots=True)
class HealthBook:
    config: HealthConfig = field(default_factory=HealthConfig)
    _records: dict[str, _Record] = field(default_factory=dict)
    _gpu_of: dict[str, str] = field(default_factory=dict)  # MIG UUID -> parent GPU UUID
    _mig_by_instance: dict[tuple[str, int, int], str] = field(default_factory=dict)
    _index_of: dict[str, int] = field(default_factory=dict)  # GPU UUID -> NVML index
    _readings: dict[str, HealthReading] = field(default_factory=dict)  # GPU UUID -> last probe reading

    # ----------------------------------------------------------------- inputs

    def set_inventory(self, inventory: NodeInventory, now: float) -> Outcome:
        """Learn the node's GPUs and MIG devices; forget keys that vanished; GPUs discovery found lost
        are marked lost."""
        before = self.snapshot()
        self._index_of = {g.uuid: g.index for g in inventory.gpus if g.uuid}
        self._gpu_of = {}
        self._mig_by_instance = {}
        for mig in inventory.mig_devices():
            self._gpu_of[mig.uuid] = mig.parent_uuid
            self._mig_by_instance[(mig.parent_uuid, mig.gpu_instance_id, mig.compute_instance_id)] = mig.uuid
        known = set(self._index_of) | set(self._gpu_of)
        self._records = {k: v for k, v in self._records.items() if k in known}
        self._readings = {k: v for k, v in self._readings.items() if k in self._index_of}
        for gpu in inventory.gpus:
            if gpu.lost and gpu.uuid:
                fault = f"GPU lost during discovery ({gpu.error or 'not answering'})"
                self._mark(gpu.uuid, fault, now, lost=True, gone=True)
        return Outcome(changed=_diff(before, self.snapshot()))

    def on_event(self, event: NvmlEvent, now: float) -> Outcome:
        before = self.snapshot()
        gpu = event.gpu_uuid if event.gpu_uuid in self._index_of else self._uuid_at(event.gpu_index)
        if gpu is None:
            return Outcome(ignored=True)
        if event.kind is EventKind.XID:
            xid = event.xid if event.xid is not None else 0
            if xid in self.config.ignored_xids:
                return Outcome(ignored=True)
            target = gpu
            if event.gpu_instance_id is not None and event.compute_instance_id is not None:
                target = self._mig_by_instance.get(
                    (gpu, event.gpu_instance_id, event.compute_instance_id), gpu
                )
            if xid in LOST_XIDS:
                self._mark(gpu, _xid_fault(xid), now, lost=True)
            else:
                self._mark(target, _xid_fault(xid), now, reset=xid in RESET_XIDS)
        elif event.kind is EventKind.ECC_DBE:
            self._mark(gpu, "double-bit ECC error", now, reset=True)
        elif event.kind in (EventKind.GPU_LOST, EventKind.GPU_UNAVAILABLE):
            self._mark(gpu, "GPU lost (NVML answers GPU_IS_LOST)", now, lost=True, gone=True)
        else:
            return Outcome(ignored=True)
        return Outcome(changed=_diff(before, self.snapshot()))

    def on_fabric(self, gpu_uuid: str, verdict: GpuFabricVerdict, now: float) -> Outcome:
        """The GPU's fabric as the fabric policy judges it (one more fault source): unhealthy marks the
        GPU (with ``fabric_unhealthy_marks_gpu``); anything else lets it recover after the quiet period."""
        if not self.config.fabric_unhealthy_marks_gpu or gpu_uuid not in self._index_of:
            return Outcome(ignored=True)
        before = self.snapshot()
        record = self._records.get(gpu_uuid)
        if verdict.level is FabricLevel.UNHEALTHY:
            if record is None or not record.fabric:
                self._mark(gpu_uuid, verdict.reason, now, fault_class=FaultClass.FABRIC)
                self._records[gpu_uuid].fabric = True
        elif record is not None and record.fabric:
            record.fabric = False  # recovery still waits for the quiet period
        return Outcome(changed=_diff(before, self.snapshot()))

    def on_probe(
        self,
        gpu_uuid: str,
        *,
        answered: bool,
        lost: bool,
        now: float,
        error: str | None = None,
        reading: HealthReading | None = None,
    ) -> Outcome:
        """A probe of one GPU: ``answered`` when it answered as itself, ``lost`` when it said GPU lost;
        ``reading`` what it read (counters judged against the previous reading)."""
        if gpu_uuid not in self._index_of:
            return Outcome(ignored=True)
        before = self.snapshot()
        keys = [gpu_uuid, *(m for m, g in self._gpu_of.items() if g == gpu_uuid)]
        if not answered:
            if lost:
                record = self._records.get(gpu_uuid)
                if record is None or not record.lost:
                    self._mark(
                        gpu_uuid, f"GPU lost ({error or 'not answering NVML'})", now, lost=True, gone=True
                    )
                else:
                    record.last_bad = now
                    record.gone = True
            elif gpu_uuid in self._records:
                self._records[gpu_uuid].last_bad = now
            return Outcome(changed=_diff(before, self.snapshot()))
        dropped = False
        if reading is not None:
            dropped = self._judge(gpu_uuid, self._readings.get(gpu_uuid), reading, now)
            self._readings[gpu_uuid] = reading
        gpu_record = self._records.get(gpu_uuid)
        reenumerated = gpu_record is not None and gpu_record.gone
        clean = _clean(reading)
        for key in keys:
            record = self._records.get(key)
            if record is None:
                continue
            if record.lost or record.gone:
                record.lost = record.gone = False
                record.last_bad = now
            if record.reset and (reenumerated or dropped) and not record.reset_seen:
                record.reset_seen = True
                record.last_bad = now
            if record.reset and not (record.reset_seen and clean):
                continue
            if not record.fabric and now - record.last_bad >= self.config.recovery_quiet_s:
                del self._records[key]
        return Outcome(changed=_diff(before, self.snapshot()))

    def note_reading(self, reading: HealthReading) -> None:
        """Keep ``reading`` (taken right after a fault event) as the baseline the next probe compares with,
        without judging it: the counters the event itself raised are that fault, not a second one, and a
        reset that follows before the next probe still shows as a counter that fell."""
        if reading.uuid in self._index_of:
            self._readings[reading.uuid] = reading

    def _judge(self, gpu: str, previous: HealthReading | None, reading: HealthReading, now: float) -> bool:
        """Mark what a reading shows is wrong; returns whether a volatile ECC counter fell (a reset)."""
        dropped = False
        if previous is not None:
            for name in ("ecc_corrected_volatile", "ecc_uncorrected_volatile"):
                old, new = getattr(previous, name), getattr(reading, name)
                if old is not None and new is not None and new < old:
                    dropped = True
            old_unc, new_unc = previous.ecc_uncorrected_volatile, reading.ecc_uncorrected_volatile
            if old_unc is not None and new_unc is not None and new_unc > old_unc:
                self._mark(
                    gpu,
                    f"uncorrectable ECC errors rising (volatile count {old_unc} -> {new_unc})",
                    now,
                    reset=True,
                )
        if reading.remapped_rows_failure:
            self._mark_condition(gpu, "row remapping failed", now)
        elif reading.remapped_rows_pending:
            self._mark_condition(gpu, "row remap pending", now)
        if reading.retired_pages_pending:
            self._mark_condition(gpu, "page retirement pending", now)
        return dropped

    def _mark_condition(self, gpu: str, fault: str, now: float) -> None:
        """A standing condition, seen again at every probe: it marks a GPU not yet marked for a reset
        (one already marked stays out while the reading is not clean, and keeps its first fault)."""
        record = self._records.get(gpu)
        if record is None or not record.reset:
            self._mark(gpu, fault, now, reset=True)

    # ----------------------------------------------------------------- outputs

    def status(self, key: str) -> DeviceHealth:
        record = self._records.get(key)
        if record is None:
            return HEALTHY
        cls = FaultClass.LOST if record.lost else record.fault_class
        return DeviceHealth(Health.UNHEALTHY, self._reason(record), fault=record.fault, fault_class=cls)

    def needs_reset(self, key: str) -> bool:
        """Whether the key's fault clears only after a GPU reset."""
        record = self._records.get(key)
        return record is not None and (record.reset or record.lost)

    def table(self) -> HealthTable:
        """The health readers see: every marked key with its reason."""
        return HealthTable({k: self.status(k) for k in self._records})

    def snapshot(self) -> dict[str, DeviceHealth]:
        """Every known key's health (what an input changed is the difference of two)."""
        keys = list(self._index_of) + list(self._gpu_of)
        return {k: self.status(k) for k in keys}

    def unhealthy_gpus(self) -> list[tuple[int, str]]:
        """(index, UUID) of every GPU that has itself or a MIG device marked: the probe targets."""
        gpus = {k if k in self._index_of else self._gpu_of.get(k) for k in self._records}
        return sorted((self._index_of[g], g) for g in gpus if g is not None and g in self._index_of)

    def is_lost(self, gpu_uuid: str) -> bool:
        record = self._records.get(gpu_uuid)
        return record is not None and record.lost

    # ----------------------------------------------------------------- internals

    def _uuid_at(self, index: int) -> str | None:
        for uuid, i in self._index_of.items():
            if i == index:
                return uuid
        return None

    def _mark(
        self,
        key: str,
        fault: str,
        now: float,
        *,
        lost: bool = False,
        gone: bool = False,
        reset: bool = False,
        fault_class: FaultClass = FaultClass.XID,
    ) -> None:
        """Mark ``key``; a fault that needs a reset keeps that need (and asks for a new reset). ``gone``:
        NVML itself answered GPU_IS_LOST (an XID 79 event alone is ``lost`` but not ``gone``)."""
        reset = reset or lost
        record = self._records.get(key)
        if record is None:
            self._records[key] = _Record(
                fault=fault, last_bad=now, lost=lost, gone=gone, reset=reset, fault_class=fault_class
            )
            return
        record.gone = record.gone or gone
        if reset or not record.reset:
            record.fault = fault
            record.fault_class = fault_class
        record.last_bad = now
        record.lost = record.lost or lost
        if reset:
            record.reset = True
            record.reset_seen = False

    def _reason(self, record: _Record) -> str:
        """The fault and what would clear it."""
        quiet = f"{self.config.recovery_quiet_s:g} s"
        if record.lost:
            return (
                f"{record.fault}; not answering NVML: needs a GPU reset or a reboot, returns once it answers "
                f"again, reads clean (volatile uncorrectable ECC 0, no row remap or retirement pending) and "
                f"stays quiet for {quiet}"
            )
        if record.reset and not record.reset_seen:
            return (
                f"{record.fault}: needs a GPU reset, returns once a reset is seen (GPU re-enumerated or "
                f"volatile ECC counters back to zero), it reads clean and stays quiet for {quiet}"
            )
        if record.reset:
            return (
                f"{record.fault}; reset seen: returns once it reads clean (volatile uncorrectable ECC 0, "
                f"no row remap or retirement pending) and stays quiet for {quiet}"
            )
        if record.fabric:
            return f"{record.fault}: returns once the fabric reports healthy and it stays quiet for {quiet}"
        return f"{record.fault}: returns after {quiet} without errors"


def _xid_fault(xid: int) -> str:
    meaning = RESET_XIDS.get(xid) or SELF_CLEARING_XIDS.get(xid)
    return f"XID {xid} ({meaning})" if meaning else f"XID {xid}"


def _clean(reading: HealthReading | None) -> bool:
    """Whether a reading shows nothing that needs a reset (what is not read does not count against)."""
    if reading is None:
        return True
    return not (
        (reading.ecc_uncorrected_volatile or 0) > 0
        or reading.remapped_rows_pending
        or reading.remapped_rows_failure
        or reading.retired_pages_pending
    )


def _diff(before: Mapping[str, DeviceHealth], after: Mapping[str, DeviceHealth]) -> frozenset[str]:
    return frozenset(k for k in set(before) | set(after) if before.get(k) != after.get(k))
