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
- GPU lost (or unavailable) marks the GPU *lost*: it stays unhealthy until a probe finds it answering
  again; from then on it is treated like any other unhealthy GPU.
- A fabric the fabric policy calls unhealthy (``topology.fabrichealth``: by default route unhealthy,
  incorrect configuration, state other than ``COMPLETED``, summary ``UNHEALTHY``) marks the GPU when
  ``fabric_unhealthy_marks_gpu`` is set, until the fabric is no longer unhealthy; the reason names the
  conditions. A degraded fabric never marks a GPU.
- Recovery: a GPU (and its MIG devices) becomes healthy once a probe finds it answering and nothing bad
  was seen for ``recovery_quiet_s`` seconds. A failing probe counts as something bad.

No clock inside: every input carries ``now`` (monotonic seconds).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from agent.nvml.protocol import EventKind, NvmlEvent
from topology.fabrichealth import DEFAULT_FABRIC_POLICY, FabricLevel, FabricPolicy, GpuFabricVerdict
from topology.model import Health, NodeInventory

DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
LOST_XIDS: frozenset[int] = frozenset({79})


@dataclass(frozen=True, slots=True)
class HealthConfig:
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    fabric_unhealthy_marks_gpu: bool = False
    recovery_quiet_s: float = 120.0
    probe_interval_s: float = 5.0
    fabric_policy: FabricPolicy = DEFAULT_FABRIC_POLICY


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    health: Health
    reason: str | None = None

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
    reason: str
    last_bad: float
    lost: bool = False
    fabric: bool = False


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
        for gpu in inventory.gpus:
            if gpu.lost and gpu.uuid:
                self._mark(
                    gpu.uuid, f"GPU lost during discovery: {gpu.error or 'not answering'}", now, lost=True
                )
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
                self._mark(gpu, f"XID {xid}: GPU has fallen off the bus", now, lost=True)
            else:
                self._mark(target, f"XID {xid}", now)
        elif event.kind is EventKind.ECC_DBE:
            self._mark(gpu, "double-bit ECC error", now)
        elif event.kind in (EventKind.GPU_LOST, EventKind.GPU_UNAVAILABLE):
            self._mark(gpu, "GPU lost: not answering NVML", now, lost=True)
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
                self._mark(gpu_uuid, verdict.reason, now)
                self._records[gpu_uuid].fabric = True
        elif record is not None and record.fabric:
            record.fabric = False  # recovery still waits for the quiet period
        return Outcome(changed=_diff(before, self.snapshot()))

    def on_probe(
        self, gpu_uuid: str, *, answered: bool, lost: bool, now: float, error: str | None = None
    ) -> Outcome:
        """A probe of one GPU: ``answered`` when a cheap query succeeded, ``lost`` when it said GPU lost."""
        if gpu_uuid not in self._index_of:
            return Outcome(ignored=True)
        before = self.snapshot()
        keys = [gpu_uuid, *(m for m, g in self._gpu_of.items() if g == gpu_uuid)]
        if not answered:
            if lost:
                self._mark(gpu_uuid, f"GPU lost: {error or 'not answering NVML'}", now, lost=True)
            elif gpu_uuid in self._records:
                self._records[gpu_uuid].last_bad = now
            return Outcome(changed=_diff(before, self.snapshot()))
        for key in keys:
            record = self._records.get(key)
            if record is None:
                continue
            if record.lost:
                record.lost = False
                record.last_bad = now
                record.reason = f"{record.reason}; answering again, quiet period running"
            elif not record.fabric and now - record.last_bad >= self.config.recovery_quiet_s:
                del self._records[key]
        return Outcome(changed=_diff(before, self.snapshot()))

    # ----------------------------------------------------------------- outputs

    def status(self, key: str) -> DeviceHealth:
        record = self._records.get(key)
        if record is None:
            return HEALTHY
        return DeviceHealth(Health.UNHEALTHY, record.reason)

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

    def _mark(self, key: str, reason: str, now: float, *, lost: bool = False) -> None:
        record = self._records.get(key)
        if record is None:
            self._records[key] = _Record(reason=reason, last_bad=now, lost=lost)
            return
        record.reason = reason
        record.last_bad = now
        record.lost = record.lost or lost


def _diff(before: Mapping[str, DeviceHealth], after: Mapping[str, DeviceHealth]) -> frozenset[str]:
    return frozenset(k for k in set(before) | set(after) if before.get(k) != after.get(k))
