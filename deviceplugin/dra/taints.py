"""Device health as ResourceSlice device taints (``resource.k8s.io/v1`` ``spec.devices[].taints``). Pure.

Nothing here decides health: the node's one owner (the agent's health book, and the fabric policy for
the fabric level) hands each published device its :class:`Fault` list, and this module only renders it:

- key ``<driver>/<cause>``: ``gpu.gpuagent.dev/xid`` (an XID or a memory fault NVIDIA reports as one),
  ``/lost`` (not answering NVML), ``/fabric`` (the multi-node NVLink fabric);
- effect ``NoSchedule`` for a fault that withdraws the device (the device plugin withdraws the same
  device from kubelet), ``None`` for a condition that leaves it schedulable (a degraded fabric, or an
  unhealthy one while ``health.fabricUnhealthyMarksGpu`` is off): informational, a claim may still get
  it, and a tolerating claim or a person can read why;
- value: the fault as a label value (``XID-79-GPU-has-fallen-off-the-bus``), at most 63 characters.

One taint per key (the stronger effect wins, then the first fault); ``timeAdded`` is left to the API
server, which stamps it when the taint first appears. A device that recovers has no fault, so the next
rendering of the pool drops its taints.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

MAX_VALUE = 63
_NOT_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


class TaintCause(enum.StrEnum):
    XID = "xid"
    LOST = "lost"
    FABRIC = "fabric"


class TaintEffect(enum.StrEnum):
    NONE = "None"
    NO_SCHEDULE = "NoSchedule"


_RANK = {TaintEffect.NONE: 0, TaintEffect.NO_SCHEDULE: 1}


@dataclass(frozen=True, slots=True)
class Fault:
    """One reason a device is tainted, as the node's health owner decided it."""

    cause: TaintCause
    detail: str
    effect: TaintEffect = TaintEffect.NO_SCHEDULE


def taint_value(detail: str) -> str:
    """``detail`` as a Kubernetes label value: runs of other characters become ``-``, at most 63
    characters, starting and ending with a letter or digit (``""`` when nothing is left)."""
    text = _NOT_VALUE.sub("-", detail)[:MAX_VALUE]
    return text.strip("-_.")


def render_taints(faults: Iterable[Fault], *, driver: str) -> list[dict[str, Any]]:
    """The taints of one device, sorted by key."""
    chosen: dict[TaintCause, Fault] = {}
    for fault in faults:
        have = chosen.get(fault.cause)
        if have is None or _RANK[fault.effect] > _RANK[have.effect]:
            chosen[fault.cause] = fault
    out = []
    for cause in sorted(chosen, key=lambda c: c.value):
        fault = chosen[cause]
        taint: dict[str, Any] = {"key": f"{driver}/{cause.value}", "effect": fault.effect.value}
        value = taint_value(fault.detail)
        if value:
            taint["value"] = value
        out.append(taint)
    return out
