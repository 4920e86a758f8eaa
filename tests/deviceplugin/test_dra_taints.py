"""Rendering device faults as ResourceSlice taints: keys per cause, effects, label-safe values, one taint
per key with the stronger effect."""

from __future__ import annotations

import re

import pytest

from deviceplugin.dra.taints import Fault, TaintCause, TaintEffect, render_taints, taint_value

DRIVER = "gpu.gpuagent.dev"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def test_each_cause_has_its_key_and_the_fault_as_value() -> None:
    taints = render_taints(
        [
            Fault(TaintCause.XID, "XID 48 (double-bit ECC error)"),
            Fault(TaintCause.LOST, "GPU lost (NVML answers GPU_IS_LOST)"),
            Fault(TaintCause.FABRIC, "fabric degraded: limited_capacity", TaintEffect.NONE),
        ],
        driver=DRIVER,
    )
    assert taints == [
        {"key": "gpu.gpuagent.dev/fabric", "effect": "None", "value": "fabric-degraded-limited_capacity"},
        {
            "key": "gpu.gpuagent.dev/lost",
            "effect": "NoSchedule",
            "value": "GPU-lost-NVML-answers-GPU_IS_LOST",
        },
        {"key": "gpu.gpuagent.dev/xid", "effect": "NoSchedule", "value": "XID-48-double-bit-ECC-error"},
    ]


def test_one_taint_per_key_and_the_withdrawal_wins() -> None:
    taints = render_taints(
        [
            Fault(TaintCause.FABRIC, "fabric unhealthy: route_unhealthy", TaintEffect.NONE),
            Fault(TaintCause.FABRIC, "fabric unhealthy: route_unhealthy"),
        ],
        driver=DRIVER,
    )
    assert taints == [
        {
            "key": "gpu.gpuagent.dev/fabric",
            "effect": "NoSchedule",
            "value": "fabric-unhealthy-route_unhealthy",
        }
    ]


def test_no_fault_no_taint() -> None:
    assert render_taints([], driver=DRIVER) == []


@pytest.mark.parametrize(
    "detail",
    ["", "---", "x" * 500, "ünïcödé ✓ fault", "(XID 79)", "a" * 62 + "-b", "ends with dot."],
    ids=["empty", "dashes", "long", "unicode", "parens", "cut-at-dash", "dot"],
)
def test_values_are_always_label_values(detail: str) -> None:
    value = taint_value(detail)
    assert len(value) <= 63
    assert LABEL_VALUE.match(value), value
    (taint,) = render_taints([Fault(TaintCause.XID, detail)], driver=DRIVER)
    assert taint.get("value", "") == value
