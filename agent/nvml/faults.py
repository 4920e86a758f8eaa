"""``--simulate-faults PATH``: the JSON-lines fault file a simulated node follows.

- :func:`apply_fault` applies one decoded event to a ``SimulatedNvml``.
- :class:`FaultFollower` reads lines appended to the fault file, one event per line::

      {"event":"xid","gpu":3,"xid":79}          {"event":"gpu_lost","gpu":2}
      {"event":"recover","gpu":2}               {"event":"nvlink_down","gpu":0,"link":5}
      {"event":"nvlink_up","gpu":0,"link":5}    {"event":"ecc_dbe","gpu":1}   {"event":"ecc_sbe","gpu":1}
      {"event":"xid","gpu":0,"xid":31,"gpu_instance_id":7}      (an Xid on one MIG GPU instance)
      {"event":"fabric","gpu":0,"health_summary":"UNHEALTHY"}
      {"event":"fabric","gpu":0,"state":"IN_PROGRESS","status":"INSUFFICIENT_RESOURCES","clique_id":7}
      {"event":"fabric","gpu":0,"conditions":["route_unhealthy"]}   (the health mask: exactly these
      flags true — degraded_bandwidth, route_recovery, route_unhealthy, access_timeout_recovery — and
      optional "incorrect_configuration":"INSUFFICIENT_NVLINKS"; the summary follows unless given;
      "conditions": [] is a clean mask)
      {"event":"process_start","gpu":0,"pid":4242,"used_memory_mib":1024}   (optional "mig_uuid",
      "sm_percent")          {"event":"process_exit","gpu":0,"pid":4242}
      {"event":"mig_reconfig","gpu":0,"profiles":["3g.40gb","3g.40gb"]}   (null profiles: MIG off)
      {"event":"nvml_error","code":"LIB_RM_VERSION_MISMATCH"}   (every call fails; optional "call",
      "gpu"; "code": null clears) — e.g. a driver upgraded under a running agent
      {"event":"gpu_lost_silent","gpu":2}   (GPU_IS_LOST to every query, no event; "recover" or
      "reset" ends it)          {"event":"reset","gpu":3}   (a GPU reset: answers again, volatile ECC
      counters to zero, pending row remap applied)          {"event":"ecc_rising","gpu":1,"count":5}
      (uncorrectable ECC count rises, no event; "count" defaults to 1)
      {"event":"imex","state":"WAITING_FOR_PEERS"}   (the simulated IMEX daemon of a GB200 tray,
      ``agent.imex``; "NOT_INSTALLED" makes it absent, "READY" ready again)

  A bad line is logged (``fault_line_invalid`` with the file and line number) and skipped; the
  others still apply. Lines are bounded: at most ``MAX_LINE_BYTES`` bytes and ``MAX_DEPTH`` levels of
  nesting (an event is a flat object); a longer line is dropped without being held in memory, a deeper
  one is refused before it is parsed. ``poll()`` is the synchronous step (tests, and the simulated
  node applying the lines already written when it opens); ``run(stop)`` polls every
  ``poll_interval_s`` (default 20 ms), reading at most ``STEP_BYTES`` each time, until ``stop`` is set.

The simulated node (:class:`agent.simnode.SimulatedNode`) owns the follower of its fault file; the
simulator knows nothing of files.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.imexsim import SimulatedImexDaemon
from agent.nvml.errors import CODES
from agent.nvml.fabric import encode_health_mask, summary_of
from agent.nvml.fake import SimulatedNvml, SimulationError
from topology import logs
from topology.lifecycle import sleep_until
from topology.model import FabricHealthSummary

log = logs.get_logger(__name__)

FAULT_EVENTS = (
    "xid",
    "gpu_lost",
    "recover",
    "nvlink_down",
    "nvlink_up",
    "ecc_dbe",
    "ecc_sbe",
    "fabric",
    "mig_reconfig",
    "nvml_error",
    "process_start",
    "process_exit",
    "gpu_lost_silent",
    "reset",
    "ecc_rising",
    "imex",
)


_HEAD_BYTES = 64
MAX_LINE_BYTES = 64 * 1024
MAX_DEPTH = 8
READ_CHUNK_BYTES = 1024 * 1024
STEP_BYTES = 64 * 1024  # what one poll of run() reads, so one step on the event loop stays short


class FaultLineError(ValueError):
    pass


def decode_line(raw: bytes) -> dict[str, Any]:
    """One fault line as a JSON object; raises ``FaultLineError`` naming the limit it breaks."""
    if len(raw) > MAX_LINE_BYTES:
        raise FaultLineError(f"line longer than {MAX_LINE_BYTES} bytes")
    depth = _nesting(raw)
    if depth > MAX_DEPTH:
        raise FaultLineError(f"JSON nested deeper than {MAX_DEPTH} levels")
    event = json.loads(raw)
    if not isinstance(event, dict):
        raise FaultLineError("not a JSON object")
    return event


def _nesting(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in ``raw`` (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def _int_field(event: Mapping[str, Any], key: str) -> int:
    value = event.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise FaultLineError(f"field {key!r} must be an integer, got {value!r}")
    return value


def apply_fault(
    sim: SimulatedNvml, event: Mapping[str, Any], *, imex: SimulatedImexDaemon | None = None
) -> None:
    """Apply one decoded fault event; raises ``FaultLineError`` / ``SimulationError`` naming the problem.
    ``imex``: the node's simulated IMEX daemon, which ``imex`` events drive."""
    kind = event.get("event")
    if kind not in FAULT_EVENTS:
        raise FaultLineError(f"unknown event {kind!r}; valid: {', '.join(FAULT_EVENTS)}")
    if kind == "imex":
        _apply_imex(imex, event)
        return
    if kind == "nvml_error":
        _apply_nvml_error(sim, event)
        return
    gpu = _int_field(event, "gpu")
    if kind == "xid":
        gi = event.get("gpu_instance_id")
        sim.inject_xid(
            gpu,
            _int_field(event, "xid"),
            gpu_instance_id=None if gi is None else _int_field(event, "gpu_instance_id"),
        )
    elif kind == "gpu_lost":
        sim.lose_gpu(gpu)
    elif kind == "recover":
        sim.recover_gpu(gpu)
    elif kind == "nvlink_down":
        sim.nvlink_down(gpu, _int_field(event, "link"))
    elif kind == "nvlink_up":
        sim.nvlink_up(gpu, _int_field(event, "link"))
    elif kind == "ecc_dbe":
        sim.ecc_dbe(gpu)
    elif kind == "ecc_sbe":
        sim.ecc_sbe(gpu)
    elif kind == "fabric":
        _apply_fabric(sim, gpu, event)
    elif kind == "process_start":
        used = event.get("used_memory_mib")
        mig_uuid = event.get("mig_uuid")
        if mig_uuid is not None and not isinstance(mig_uuid, str):
            raise FaultLineError(f"field 'mig_uuid' must be a MIG-… UUID, got {mig_uuid!r}")
        sim.add_process(
            gpu,
            _int_field(event, "pid"),
            used_memory_bytes=None if used is None else _int_field(event, "used_memory_mib") * 2**20,
            mig_uuid=mig_uuid,
            sm_percent=80 if event.get("sm_percent") is None else _int_field(event, "sm_percent"),
        )
    elif kind == "process_exit":
        sim.remove_process(gpu, _int_field(event, "pid"))
    elif kind in ("gpu_lost_silent", "reset", "ecc_rising"):
        _apply_health_fault(sim, gpu, event)
    else:  # mig_reconfig
        profiles = event.get("profiles")
        if profiles is not None and (
            not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles)
        ):
            raise FaultLineError(
                f"field 'profiles' must be a list of profile names or null, got {profiles!r}"
            )
        sim.reconfigure_mig(gpu, profiles)


def _apply_health_fault(sim: SimulatedNvml, gpu: int, event: Mapping[str, Any]) -> None:
    """``gpu_lost_silent``, ``reset``, ``ecc_rising`` (optional ``count``, default 1)."""
    kind = event.get("event")
    if kind == "gpu_lost_silent":
        sim.lose_gpu_silently(gpu)
    elif kind == "reset":
        sim.reset_gpu(gpu)
    else:
        count = 1 if event.get("count") is None else _int_field(event, "count")
        if count <= 0:
            raise FaultLineError(f"field 'count' must be a positive integer, got {count}")
        sim.ecc_rising(gpu, count)


def fabric_mask_fault(event: Mapping[str, Any]) -> tuple[int, FabricHealthSummary] | None:
    """The health mask and summary a fabric fault's ``conditions`` / ``incorrect_configuration`` ask
    for (the summary given by ``health_summary`` when present), or ``None`` when it sets neither;
    ``FaultLineError`` naming a bad field. Shared with the C stand-in's fault translator."""
    conditions = event.get("conditions")
    config = event.get("incorrect_configuration")
    if conditions is None and config is None:
        return None
    if conditions is None:
        conditions = []
    if not isinstance(conditions, list) or not all(isinstance(c, str) for c in conditions):
        raise FaultLineError(f"field 'conditions' must be a list of condition names, got {conditions!r}")
    if config is not None and not isinstance(config, str):
        raise FaultLineError(f"field 'incorrect_configuration' must be a string, got {config!r}")
    config = "NONE" if config is None else config.upper()
    wanted = [c.lower() for c in conditions]
    try:
        mask = encode_health_mask(wanted, config)
    except ValueError as exc:
        raise FaultLineError(str(exc)) from None
    summary = summary_of(wanted, config)
    given = event.get("health_summary")
    if isinstance(given, str) and given.upper() in FabricHealthSummary.__members__:
        summary = FabricHealthSummary[given.upper()]
    return mask, summary


def _apply_fabric(sim: SimulatedNvml, gpu: int, event: Mapping[str, Any]) -> None:
    """``fabric``: ``health_summary``, ``conditions`` / ``incorrect_configuration`` (the health mask)
    and/or ``state``, ``status``, ``clique_id``."""
    fields = {k: event.get(k) for k in ("health_summary", "state", "status")}
    for key, value in fields.items():
        if value is not None and not isinstance(value, str):
            raise FaultLineError(f"field {key!r} must be a string, got {value!r}")
    clique = event.get("clique_id")
    masked = fabric_mask_fault(event)
    if all(v is None for v in fields.values()) and clique is None and masked is None:
        raise FaultLineError(
            "a fabric event needs health_summary, conditions, incorrect_configuration, state, status or "
            "clique_id"
        )
    summary, state, status = (str(v).upper() if v is not None else None for v in fields.values())
    if summary is not None and summary not in FabricHealthSummary.__members__:
        valid = ", ".join(FabricHealthSummary.__members__)
        raise FaultLineError(f"unknown fabric health summary {summary!r}; valid: {valid}")
    if state is not None or status is not None or clique is not None:
        sim.set_fabric_state(
            gpu,
            state=state,
            status=status,
            clique_id=None if clique is None else _int_field(event, "clique_id"),
        )
    if masked is not None:
        sim.set_fabric_health(gpu, masked[1], mask=masked[0])
    elif summary is not None:
        sim.set_fabric_health(gpu, summary)


def _apply_imex(imex: SimulatedImexDaemon | None, event: Mapping[str, Any]) -> None:
    """``{"event":"imex","state":"…"}``: the simulated IMEX daemon's new state."""
    if imex is None:
        raise FaultLineError("this simulated node has no IMEX daemon (only multi-node NVLink profiles do)")
    state = event.get("state")
    if not isinstance(state, str):
        raise FaultLineError(f"field 'state' must be an IMEX daemon state such as READY, got {state!r}")
    try:
        imex.set_state(state)
    except ValueError as exc:
        raise FaultLineError(str(exc)) from None


def _apply_nvml_error(sim: SimulatedNvml, event: Mapping[str, Any]) -> None:
    """``{"event":"nvml_error","code":"LIB_RM_VERSION_MISMATCH"}``: every NVML call fails with that
    code from now on (optionally only ``call`` and/or ``gpu``); ``"code": null`` clears all."""
    code = event.get("code")
    if code is None:
        sim.clear_errors()
        return
    if isinstance(code, str):
        if code.upper() not in CODES:
            raise FaultLineError(f"unknown NVML error {code!r}; e.g. GPU_IS_LOST, LIB_RM_VERSION_MISMATCH")
        code = CODES[code.upper()]
    if not isinstance(code, int) or isinstance(code, bool):
        raise FaultLineError(f"field 'code' must be an NVML error name or number, got {code!r}")
    call = event.get("call")
    if call is not None and not isinstance(call, str):
        raise FaultLineError(f"field 'call' must be a simulator primitive or pynvml function, got {call!r}")
    gpu = event.get("gpu")
    sim.inject_error(code, call=call, gpu=None if gpu is None else _int_field(event, "gpu"))


class FaultFollower:
    """Follows a JSON-lines fault file and applies each new line to a simulator."""

    def __init__(
        self,
        sim: SimulatedNvml,
        path: Path,
        *,
        poll_interval_s: float = 0.02,
        imex: SimulatedImexDaemon | None = None,
    ) -> None:
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be positive, got {poll_interval_s}")
        self.sim = sim
        self.imex = imex
        self.path = path
        self.poll_interval_s = poll_interval_s
        self.applied = 0
        self.errors: list[str] = []
        self._offset = 0
        self._partial = b""
        self._line_no = 0
        self._inode: int | None = None
        self._head = b""  # the file's first bytes, to notice a rewrite of the same length
        self._skipping = False  # inside a line too long to keep: drop bytes up to its newline

    def poll(self, max_bytes: int | None = None) -> int:
        """Apply every complete line appended since the last poll (at most ``max_bytes`` of the file
        when given; the rest waits for the next poll); returns how many applied."""
        applied = 0
        try:
            with self.path.open("rb") as fh:
                stat = os.fstat(fh.fileno())
                head = fh.read(len(self._head))
                if stat.st_ino != self._inode or stat.st_size < self._offset or head != self._head:
                    # a new, truncated or rewritten file: start over from its first line
                    self._offset, self._partial, self._line_no = 0, b"", 0
                    self._skipping = False
                    self._inode = stat.st_ino
                fh.seek(self._offset)
                budget = max_bytes
                while budget is None or budget > 0:
                    data = fh.read(READ_CHUNK_BYTES if budget is None else min(budget, READ_CHUNK_BYTES))
                    if not data:
                        break
                    if budget is not None:
                        budget -= len(data)
                    if self._offset < _HEAD_BYTES:
                        self._head = (self._head if self._offset else b"") + data[
                            : _HEAD_BYTES - self._offset
                        ]
                    self._offset += len(data)
                    applied += self._take(data)
        except FileNotFoundError:
            return applied
        self.applied += applied
        return applied

    def _take(self, data: bytes) -> int:
        """Apply the complete lines of ``data`` (after the partial line kept from before)."""
        *lines, rest = (self._partial + data).split(b"\n")
        applied = 0
        for raw in lines:
            self._line_no += 1
            if self._skipping:  # the end of a line already reported as too long
                self._skipping = False
                continue
            if raw.strip() and self._apply(raw):
                applied += 1
        if len(rest) > MAX_LINE_BYTES:
            if not self._skipping:
                self._report(self._line_no + 1, FaultLineError(f"line longer than {MAX_LINE_BYTES} bytes"))
            self._skipping, rest = True, b""
        self._partial = rest
        return applied

    def _apply(self, raw: bytes) -> bool:
        try:
            apply_fault(self.sim, decode_line(raw), imex=self.imex)
        except (ValueError, SimulationError, RecursionError) as exc:  # JSON and FaultLineError: ValueErrors
            self._report(self._line_no, exc)
            return False
        return True

    def _report(self, line: int, exc: Exception) -> None:
        error = str(exc) if not isinstance(exc, RecursionError) else "JSON nested too deeply"
        self.errors.append(f"{self.path}:{line}: {error}")
        del self.errors[:-100]  # the latest problems; the log has them all
        log.error(
            "fault_line_invalid",
            path=str(self.path),
            line=line,
            error=error,
            action="line skipped; later lines still apply",
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set."""
        while not stop.is_set():
            self.poll(max_bytes=STEP_BYTES)  # a bounded step on the event loop
            await sleep_until(stop, self.poll_interval_s)
        self.poll(max_bytes=STEP_BYTES)
