"""The simulator's machine, exported for the C-level driver stand-in (``tests/nvmlstub``).

The stand-in (a ``libnvidia-ml.so.1`` compiled against NVIDIA's ``nvml.h``) serves the same machine as the
simulator: :func:`describe_machine` writes a :class:`~agent.nvml.profiles.MachineSpec` — identity, memory,
NVLink wiring, the PCIe matrix, fabric and platform info, MIG profiles and the initial MIG layout, the
event types the GPU supports — as a line format the C library reads at ``nvmlInit``.
:class:`FaultTranslator` translates the events of the simulator's fault file (``--simulate-faults``, see
:mod:`agent.nvml.faults`) into the control lines the stand-in applies, so one script of faults drives
both.

Format (``nvmlstub 1``): one record per line, fields separated by TAB, ``#`` comments; numbers in decimal or
``0x`` hex, ``-`` for "none"::

    nvmlstub 1
    system      driver_version  nvml_version  cuda_driver_version
    gpu         index uuid name serial bus_id pci_device_id minor memory_total_mib memory_reserved_mib
                cc_major cc_minor architecture brand numa_node cpu_affinity power_limit_w idle_power_w
                max_sm_clock_mhz memory_clock_mhz nvlink_version module_id features supported_events board_id
    link        gpu link remote_type remote_bus_id          (in link order)
    pcie        gpu other_gpu nvml_topology_level
    fabric      gpu cluster_uuid_hex clique_id state status health_mask health_summary
    platform    gpu chassis_serial slot tray host_id module_id peer_type ib_guid rack_guid
    migprofile  gpu nvml_enum id name slices placement_size max_instances memory_mib sm_count
                copy_engines decoders encoders jpegs ofas
    mig         gpu current_enabled pending_enabled
    gi          gpu gpu_instance_id profile_id placement_start mig_uuid     (in GPU-instance id order)

``features`` bits: 1 memory temperature (``NVML_FI_DEV_MEMORY_TEMP``), 2 remapped rows.

Control lines (the C library reads those appended to ``NVMLSTUB_CONTROL``)::

    xid gpu xid gpu_instance_id|-1      lost gpu      recover gpu      ecc_dbe gpu      ecc_sbe gpu
    nvlink_down gpu link      nvlink_up gpu link
    fabric gpu state status clique_id health_mask health_summary      ("-" keeps a value)
    process_start gpu pid used_bytes|- gpu_instance_id|-1 sm_percent      process_exit gpu pid
    mig gpu enabled gi_id:profile_id:start:mig_uuid,...|-     (a whole new MIG layout)
    error code call|* gpu|-1 times|-1      clear_errors
    lost_silent gpu      reset gpu      ecc_rise gpu count

``call`` is a canonical function name (:func:`canonical_call`): a simulator primitive
(``device_register_events``) and the NVML function (``nvmlDeviceRegisterEvents``) name the same call.

Everything is read through public names of :mod:`agent.nvml.profiles` and :mod:`agent.nvml.fake`; the
simulator's behavioural rules that are not data (which GPUs report memory temperature or remapped rows,
which event types a driver supports, how MIG UUIDs and a v1 ``rackGuid`` are derived) are restated here
and pinned by the contract suite, which compares the stand-in with the simulator.
"""

from __future__ import annotations

import re
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.nvml.errors import CODES
from agent.nvml.fake import (  # NVML event type bits (nvml.h nvmlEventType*): the simulator's one definition
    EVENT_CLOCK,
    EVENT_DBE,
    EVENT_GPU_UNAVAILABLE,
    EVENT_MIG_CONFIG_CHANGE,
    EVENT_PSTATE,
    EVENT_RECOVERY_ACTION,
    EVENT_SBE,
    EVENT_XID,
    HEALTH_MASKS,
    TOPOLOGY_LEVELS,
    gi_id_for,
    plan_layout,
)
from agent.nvml.faults import fabric_mask_fault
from agent.nvml.profiles import (
    ARCH_ADA,
    ARCH_AMPERE,
    MIG_COMPUTE_SLICES,
    GpuSpec,
    MachineSpec,
    MigProfileSpec,
    det_uuid,
)
from topology.model import FabricHealthSummary, FabricState, LinkLevel, RemoteDeviceType

FORMAT_VERSION = 1

FEATURE_MEMORY_TEMPERATURE = 1
FEATURE_REMAPPED_ROWS = 2


# nvmlIntNvLinkDeviceType_t
REMOTE_TYPES: dict[RemoteDeviceType, int] = {
    RemoteDeviceType.GPU: 0,
    RemoteDeviceType.IBMNPU: 1,
    RemoteDeviceType.SWITCH: 2,
}
REMOTE_TYPE_UNKNOWN = 0xFF

FABRIC_STATES: dict[FabricState, int] = {
    FabricState.NOT_SUPPORTED: 0,
    FabricState.NOT_STARTED: 1,
    FabricState.IN_PROGRESS: 2,
    FabricState.COMPLETED: 3,
}
HEALTH_SUMMARIES: dict[FabricHealthSummary, int] = {
    FabricHealthSummary.NOT_SUPPORTED: 0,
    FabricHealthSummary.HEALTHY: 1,
    FabricHealthSummary.UNHEALTHY: 2,
    FabricHealthSummary.LIMITED_CAPACITY: 3,
}

_FIELD = re.compile(r"^[^\t\r\n]*$")
_VERSION_SUFFIX = re.compile(r"_v\d+$")


class DescribeError(ValueError):
    """A machine or fault the stand-in cannot express (the message names what and where)."""


# --------------------------------------------------------------------------- the machine


def _field(value: object, where: str) -> str:
    text = str(value)
    if not text or not _FIELD.match(text):
        raise DescribeError(f"{where}: {text!r} cannot be one field (empty, or holds a tab or newline)")
    return text


def _line(kind: str, *values: object, where: str) -> str:
    return "\t".join([kind, *(_field(v, f"{where} field {i + 1}") for i, v in enumerate(values))])


def supported_event_types(machine: MachineSpec, gpu: GpuSpec) -> int:
    """The event types ``nvmlDeviceGetSupportedEventTypes`` reports, as the simulator decides them."""
    mask = EVENT_SBE | EVENT_DBE | EVENT_PSTATE | EVENT_XID | EVENT_CLOCK
    if gpu.mig_profiles:
        mask |= EVENT_MIG_CONFIG_CHANGE
    if int(machine.driver_version.split(".")[0]) >= 570:
        mask |= EVENT_GPU_UNAVAILABLE | EVENT_RECOVERY_ACTION
    return mask


def features(gpu: GpuSpec) -> int:
    """Bits for the optional sensors: HBM parts report memory temperature; Ampere and newer HBM parts
    report remapped rows (the GDDR Ada boards neither)."""
    bits = 0
    if gpu.architecture != ARCH_ADA:
        bits |= FEATURE_MEMORY_TEMPERATURE
    if gpu.architecture >= ARCH_AMPERE and gpu.architecture != ARCH_ADA:
        bits |= FEATURE_REMAPPED_ROWS
    return bits


def _profile(gpu: GpuSpec, name: str) -> MigProfileSpec:
    for prof in gpu.mig_profiles:
        if prof.name == name:
            return prof
    raise DescribeError(f"GPU {gpu.index} ({gpu.name}): MIG layout names unknown profile {name!r}")


def _place(
    gpu: GpuSpec, wanted: list[MigProfileSpec], serial: int
) -> tuple[tuple[tuple[int, MigProfileSpec, int, str], ...], int]:
    """Place a whole MIG layout as the simulator does (``fake.plan_layout``; creation numbers from
    ``serial`` in plan order, which the MIG UUIDs derive from); returns the instances in GPU-instance id
    order and the next creation number."""
    names = [p.name for p in wanted]
    slices = sum(p.slices for p in wanted)
    if slices > MIG_COMPUTE_SLICES:
        raise DescribeError(
            f"GPU {gpu.index}: layout {names} needs {slices} compute slices; the GPU has {MIG_COMPUTE_SLICES}"
        )
    planned = plan_layout(wanted)
    if planned is None:
        raise DescribeError(f"GPU {gpu.index}: MIG layout {names} has no valid placement")
    out = []
    for prof, start in planned:
        gi_id = gi_id_for(start, prof.placement_size)
        out.append((gi_id, prof, start, "MIG-" + det_uuid(gpu.uuid, "gi", gi_id, "ci", 0, serial)))
        serial += 1
    return tuple(sorted(out, key=lambda inst: inst[0])), serial


def mig_instances(gpu: GpuSpec) -> tuple[tuple[int, MigProfileSpec, int, str], ...]:
    """The GPU's initial MIG layout as ``(gpu instance id, profile, placement start, MIG UUID)`` in GPU-
    instance id order, placed as the simulator places it; empty when MIG is off."""
    if gpu.mig_layout is None:
        return ()
    return _place(gpu, [_profile(gpu, name) for name in gpu.mig_layout], 0)[0]


def rack_guid(chassis_serial: str) -> bytes:
    """The v1 platform struct's ``rackGuid`` the simulator derives from the chassis serial."""
    return uuidlib.uuid5(uuidlib.NAMESPACE_OID, chassis_serial).bytes


def _ib_guid(text: str | None) -> str:
    if text is None:
        return "-"
    digits = text.removeprefix("0x")
    if not re.fullmatch(r"[0-9a-fA-F]{16}([0-9a-fA-F]{16})?", digits):
        raise DescribeError(f"platform ib_guid {text!r} is not 0x and 16 or 32 hex digits")
    return "0x" + digits


def describe_machine(machine: MachineSpec) -> str:
    """The ``nvmlstub 1`` description of a simulator machine (see the module docstring)."""
    lines = [f"# {machine.profile} {machine.hostname}", f"nvmlstub\t{FORMAT_VERSION}"]
    lines.append(
        _line(
            "system",
            machine.driver_version,
            machine.nvml_version,
            machine.cuda_driver_version,
            where="system",
        )
    )
    for gpu in machine.gpus:
        where = f"GPU {gpu.index}"
        lines.append(
            _line(
                "gpu",
                gpu.index,
                gpu.uuid,
                gpu.name,
                gpu.serial,
                gpu.pci_bus_id,
                f"0x{gpu.pci_device_id:08X}",
                gpu.minor_number,
                gpu.memory_total_mib,
                gpu.memory_reserved_mib,
                gpu.compute_capability[0],
                gpu.compute_capability[1],
                gpu.architecture,
                gpu.brand,
                gpu.numa_node,
                gpu.cpu_affinity or "-",
                gpu.power_limit_watts,
                gpu.idle_power_watts,
                gpu.max_sm_clock_mhz,
                gpu.memory_clock_mhz,
                gpu.nvlink_version or 0,
                gpu.module_id,
                features(gpu),
                f"0x{supported_event_types(machine, gpu):X}",
                gpu.board_id,
                where=where,
            )
        )
        for link, spec in enumerate(gpu.nvlinks):
            remote = REMOTE_TYPES.get(spec.remote_type, REMOTE_TYPE_UNKNOWN)
            lines.append(
                _line("link", gpu.index, link, remote, spec.remote_pci_bus_id, where=f"{where} link")
            )
        for other, level in enumerate(machine.pcie[gpu.index]):
            value = 0 if level is LinkLevel.SELF else TOPOLOGY_LEVELS[level]
            lines.append(_line("pcie", gpu.index, other, value, where=f"{where} pcie"))
        if gpu.fabric is not None:
            f = gpu.fabric
            lines.append(
                _line(
                    "fabric",
                    gpu.index,
                    uuidlib.UUID(f.cluster_uuid).hex,
                    f.clique_id,
                    f.state,
                    f.status,
                    f"0x{f.health_mask:X}",
                    f.health_summary,
                    where=f"{where} fabric",
                )
            )
        if gpu.platform is not None:
            p = gpu.platform
            lines.append(
                _line(
                    "platform",
                    gpu.index,
                    p.chassis_serial or "-",
                    p.slot_number,
                    p.tray_index,
                    p.host_id,
                    p.module_id,
                    p.peer_type,
                    _ib_guid(p.ib_guid),
                    rack_guid(p.chassis_serial).hex(),
                    where=f"{where} platform",
                )
            )
        for prof in gpu.mig_profiles:
            lines.append(
                _line(
                    "migprofile",
                    gpu.index,
                    prof.nvml_enum,
                    prof.id,
                    prof.name,
                    prof.slices,
                    prof.placement_size,
                    prof.max_instances,
                    prof.memory_mib,
                    prof.sm_count,
                    prof.copy_engines,
                    prof.decoders,
                    prof.encoders,
                    prof.jpegs,
                    prof.ofas,
                    where=f"{where} MIG profile {prof.name}",
                )
            )
        if gpu.mig_profiles:
            enabled = int(gpu.mig_layout is not None)
            lines.append(_line("mig", gpu.index, enabled, enabled, where=f"{where} MIG mode"))
        for gi_id, prof, start, mig_uuid in mig_instances(gpu):
            lines.append(
                _line("gi", gpu.index, gi_id, prof.id, start, mig_uuid, where=f"{where} GPU instance")
            )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- faults


def canonical_call(name: str) -> str:
    """``device_get_uuid`` / ``nvmlDeviceGetUUID`` / ``nvmlEventSetWait_v2`` → ``devicegetuuid`` /
    ``eventsetwait``: the key the stand-in matches a scripted error's call by."""
    text = name.removeprefix("nvml")
    text = _VERSION_SUFFIX.sub("", text)
    return text.replace("_", "").lower()


def _int(event: Mapping[str, Any], key: str) -> int:
    value = event.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise DescribeError(f"fault field {key!r} must be an integer, got {value!r}")
    return value


def _gpu(event: Mapping[str, Any], machine: MachineSpec) -> GpuSpec:
    index = _int(event, "gpu")
    if not 0 <= index < len(machine.gpus):
        raise DescribeError(
            f"fault names GPU {index}; this {machine.profile} has GPUs 0-{len(machine.gpus) - 1}"
        )
    return machine.gpus[index]


def _code(value: object) -> int:
    if isinstance(value, str) and value.upper() in CODES:
        return CODES[value.upper()]
    if isinstance(value, int) and not isinstance(value, bool) and value in CODES.values():
        return value
    raise DescribeError(f"fault field 'code' must be an NVML error name or number, got {value!r}")


def _fabric_command(gpu: GpuSpec, event: Mapping[str, Any]) -> str:
    if gpu.fabric is None:
        raise DescribeError(f"GPU {gpu.index} ({gpu.name}) has no NVLink fabric info")
    state = status = clique = mask = summary = "-"
    if event.get("state") is not None:
        try:
            state = str(FABRIC_STATES[FabricState(str(event["state"]).upper())])
        except ValueError:
            raise DescribeError(f"unknown fabric state {event['state']!r}") from None
    if event.get("status") is not None:
        name = str(event["status"]).upper()
        if name != "SUCCESS" and name not in CODES:
            raise DescribeError(f"unknown fabric status {event['status']!r}; SUCCESS or an NVML error name")
        status = "0" if name == "SUCCESS" else str(CODES[name])
    if event.get("clique_id") is not None:
        clique = str(_int(event, "clique_id"))
    if event.get("health_summary") is not None:
        try:
            value = FabricHealthSummary(str(event["health_summary"]).upper())
        except ValueError:
            raise DescribeError(f"unknown fabric health summary {event['health_summary']!r}") from None
        summary = str(HEALTH_SUMMARIES[value])
        mask = f"0x{HEALTH_MASKS[value]:X}"
    try:
        masked = fabric_mask_fault(event)
    except ValueError as exc:
        raise DescribeError(str(exc)) from None
    if masked is not None:  # the same mask and summary the simulator sets
        mask, summary = f"0x{masked[0]:X}", str(HEALTH_SUMMARIES[masked[1]])
    if (state, status, clique, summary) == ("-", "-", "-", "-"):
        raise DescribeError(
            "a fabric event needs health_summary, conditions, incorrect_configuration, state, status or "
            "clique_id"
        )
    return "\t".join(["fabric", str(gpu.index), state, status, clique, mask, summary])


MigInstance = tuple[int, MigProfileSpec, int, str]
"""A placed GPU instance: ``(gpu instance id, profile, placement start, MIG UUID)``."""


@dataclass(slots=True)
class _GpuFaultState:
    """What later faults on one GPU depend on: its MIG layout, lost or not, its processes."""

    mig_enabled: bool
    instances: tuple[MigInstance, ...]
    next_serial: int
    lost: bool = False
    processes: dict[int, int] = field(default_factory=dict)  # pid -> GPU instance id (-1: whole GPU)


class FaultTranslator:
    """Turns a sequence of fault-file events into the stand-in's control lines.

    It keeps what later lines depend on, as the simulator does: MIG layouts after ``mig_reconfig`` (placed
    like ``fake.plan_layout``, creation numbers continuing, so MIG UUIDs match), which GPUs are lost and
    which processes run where. An event the simulator refuses raises :class:`DescribeError` naming the
    field, and changes nothing.
    """

    def __init__(self, machine: MachineSpec) -> None:
        self.machine = machine
        self._gpus = [
            _GpuFaultState(
                mig_enabled=gpu.mig_layout is not None,
                instances=mig_instances(gpu),
                next_serial=len(gpu.mig_layout or ()),
            )
            for gpu in machine.gpus
        ]

    def instances(self, gpu: int) -> tuple[MigInstance, ...]:
        """The GPU's MIG layout now (empty with MIG off)."""
        state = self._gpus[gpu]
        return state.instances if state.mig_enabled else ()

    def command(self, event: Mapping[str, Any]) -> str:
        """The control line for one decoded fault event (see the module docstring)."""
        kind = event.get("event")
        if kind == "nvml_error":
            return self._error(event)
        gpu_spec = _gpu(event, self.machine)
        state = self._gpus[gpu_spec.index]
        g = str(gpu_spec.index)
        if kind == "xid":
            xid = _int(event, "xid")
            if xid <= 0:
                raise DescribeError(f"fault field 'xid' must be positive, got {xid}")
            gi = event.get("gpu_instance_id")
            if gi is not None:
                ids = [inst[0] for inst in self.instances(gpu_spec.index)]
                if _int(event, "gpu_instance_id") not in ids:
                    raise DescribeError(f"GPU {g} has no GPU instance {gi}; its instances: {ids}")
            if xid == 79:
                state.lost = True
            return "\t".join(["xid", g, str(xid), "-1" if gi is None else str(gi)])
        if kind in ("gpu_lost", "recover", "ecc_dbe", "ecc_sbe"):
            if kind == "gpu_lost":
                state.lost = True
            elif kind == "recover" and state.lost:
                state.lost = False
                state.processes.clear()
            return "\t".join([{"gpu_lost": "lost"}.get(kind, kind), g])
        if kind in ("nvlink_down", "nvlink_up"):
            link = _int(event, "link")
            if not 0 <= link < len(gpu_spec.nvlinks):
                raise DescribeError(f"GPU {g} has {len(gpu_spec.nvlinks)} NVLinks; no link {link}")
            return "\t".join([kind, g, str(link)])
        if kind in ("gpu_lost_silent", "reset", "ecc_rising"):
            return self._health_fault(kind, g, state, event)
        if kind == "fabric":
            return _fabric_command(gpu_spec, event)
        if kind == "process_start":
            return self._process_start(gpu_spec, state, event)
        if kind == "process_exit":
            pid = _int(event, "pid")
            state.processes.pop(pid, None)
            return "\t".join(["process_exit", g, str(pid)])
        if kind == "mig_reconfig":
            return self._mig_reconfig(gpu_spec, state, event)
        raise DescribeError(f"unknown fault event {kind!r}")

    def _health_fault(self, kind: str, g: str, state: _GpuFaultState, event: Mapping[str, Any]) -> str:
        if kind == "gpu_lost_silent":
            state.lost = True
            return "\t".join(["lost_silent", g])
        if kind == "reset":
            state.lost = False
            state.processes.clear()
            return "\t".join(["reset", g])
        count = 1 if event.get("count") is None else _int(event, "count")
        if count <= 0:
            raise DescribeError(f"fault field 'count' must be a positive integer, got {count}")
        return "\t".join(["ecc_rise", g, str(count)])

    def _error(self, event: Mapping[str, Any]) -> str:
        if event.get("code") is None:
            return "clear_errors"
        call = event.get("call")
        if call is not None and (not isinstance(call, str) or not call):
            raise DescribeError(f"fault field 'call' must be a function name, got {call!r}")
        gpu = event.get("gpu")
        index = -1 if gpu is None else _gpu(event, self.machine).index
        times = -1 if event.get("times") is None else _int(event, "times")
        code = str(_code(event["code"]))
        return "\t".join(["error", code, canonical_call(call) if call else "*", str(index), str(times)])

    def _process_start(self, gpu: GpuSpec, state: _GpuFaultState, event: Mapping[str, Any]) -> str:
        pid = _int(event, "pid")
        used = event.get("used_memory_mib")
        used_bytes = "-" if used is None else str(_int(event, "used_memory_mib") * 2**20)
        gi_id = -1
        mig_uuid = event.get("mig_uuid")
        if mig_uuid is not None:
            by_uuid = {inst[3]: inst[0] for inst in self.instances(gpu.index)}
            if mig_uuid not in by_uuid:
                raise DescribeError(f"{mig_uuid} is not a MIG device of GPU {gpu.index}")
            gi_id = by_uuid[mig_uuid]
        if pid in state.processes:
            raise DescribeError(f"pid {pid} already runs on GPU {gpu.index}")
        sm = 80 if event.get("sm_percent") is None else max(0, min(100, _int(event, "sm_percent")))
        state.processes[pid] = gi_id
        return "\t".join(["process_start", str(gpu.index), str(pid), used_bytes, str(gi_id), str(sm)])

    def _mig_reconfig(self, gpu: GpuSpec, state: _GpuFaultState, event: Mapping[str, Any]) -> str:
        profiles = event.get("profiles")
        if profiles is not None and (
            not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles)
        ):
            raise DescribeError(
                f"fault field 'profiles' must be a list of profile names or null, got {profiles!r}"
            )
        if not gpu.mig_profiles:
            raise DescribeError(f"GPU {gpu.index} ({gpu.name}) is not MIG-capable")
        if state.lost:
            raise DescribeError(f"GPU {gpu.index} is lost")
        if any(gi >= 0 for gi in state.processes.values()):
            raise DescribeError(f"GPU {gpu.index} has processes on MIG devices; stop them first")
        placed: tuple[MigInstance, ...] = ()
        serial = state.next_serial
        if profiles is not None:
            wanted = [_profile(gpu, name) for name in profiles]
            placed, serial = _place(gpu, wanted, serial)
        state.mig_enabled = profiles is not None
        state.instances, state.next_serial = placed, serial
        layout = ",".join(f"{gi}:{prof.id}:{start}:{uuid}" for gi, prof, start, uuid in placed) or "-"
        return "\t".join(["mig", str(gpu.index), str(int(profiles is not None)), layout])


def fault_command(event: Mapping[str, Any], machine: MachineSpec) -> str:
    """The control line for one fault event on ``machine`` as the profile starts it (a fresh
    :class:`FaultTranslator`; use one translator for a sequence of events)."""
    return FaultTranslator(machine).command(event)


__all__ = [
    "FORMAT_VERSION",
    "DescribeError",
    "FaultTranslator",
    "MigInstance",
    "canonical_call",
    "describe_machine",
    "fault_command",
    "features",
    "mig_instances",
    "supported_event_types",
]
