"""The fabric faults over both NVML paths: the simulator and the C stand-in answer the same, and the answer
is the one the fabric policy reads.

On a GB200 tray: fabric ``IN_PROGRESS`` on one GPU before the first discovery (a tray booting before its
NVLink partition is up), then each health-mask condition in turn (``{"event":"fabric","conditions":[…]}``
and ``incorrect_configuration``), a clean mask again, and the state back to ``COMPLETED``; after each,
discovery's fabric entries, the metrics cache's fabric reads and the ``/metrics`` text (native
``gpuagent_fabric_condition`` and DCGM's fabric fields) are compared.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from agent.nvml.describe import DescribeError, FaultTranslator
from agent.nvml.fake import SimulatedNvml
from agent.nvml.faults import FaultLineError, apply_fault
from agent.nvml.simulate import parse_spec
from tests.nvmlstub.conftest import Runner
from tests.nvmlstub.test_contract_c import assert_same

PROFILE = "gb200-nvl72"

FAULTS: list[tuple[dict[str, Any], str, dict[str, Any]]] = [
    # (fault, the GPU it names, what GPU 1's decoded fabric entry shows afterwards)
    (
        {"event": "fabric", "gpu": 1, "conditions": ["degraded_bandwidth"]},
        "degraded",
        {"degraded_bandwidth": True},
    ),
    (
        {"event": "fabric", "gpu": 1, "conditions": ["route_recovery"]},
        "degraded",
        {"route_recovery_in_progress": True},
    ),
    (
        {"event": "fabric", "gpu": 1, "conditions": ["route_unhealthy"]},
        "unhealthy",
        {"route_unhealthy": True},
    ),
    (
        {"event": "fabric", "gpu": 1, "conditions": ["access_timeout_recovery"]},
        "degraded",
        {"access_timeout_recovery": True},
    ),
    (
        {"event": "fabric", "gpu": 1, "incorrect_configuration": "INSUFFICIENT_NVLINKS"},
        "unhealthy",
        {"incorrect_configuration": "INSUFFICIENT_NVLINKS"},
    ),
    ({"event": "fabric", "gpu": 1, "conditions": []}, "healthy", {"route_unhealthy": False}),
]


def _script() -> list[dict[str, Any]]:
    script: list[dict[str, Any]] = [
        {"fault": {"event": "fabric", "gpu": 2, "state": "IN_PROGRESS"}},  # before the first discovery
        {"discover": True},
        {"sample": True},
    ]
    for fault, _, _ in FAULTS:
        script += [{"fault": fault}, {"discover": True}, {"sample": True}, {"metrics": True}]
    script += [{"fault": {"event": "fabric", "gpu": 2, "state": "COMPLETED"}}, {"discover": True}]
    return script


def _fabric(result: dict[str, Any], gpu: int) -> dict[str, Any]:
    [entry] = [f for f in result["inventory"]["fabric"] if f["gpu_index"] == gpu]
    return entry


@pytest.mark.parametrize("variant", ["current", "no-fabric-v"])
def test_each_fabric_condition_and_in_progress_at_boot_answer_the_same(runner: Runner, variant: str) -> None:
    script = _script()
    simulated = runner.probe(PROFILE, script, stub=False, variant=variant)
    stub = runner.probe(PROFILE, script, stub=True, variant=variant)
    assert_same(simulated, stub)
    if variant == "no-fabric-v":  # the unversioned v1 call: state only, no health fields, on both sides
        steps = list(zip(script, stub[1:], strict=True))
        first = next(r for s, r in steps if "discover" in s)
        assert _fabric(first, 2)["state"] == "IN_PROGRESS"
        assert {f["health_summary"] for f in first["inventory"]["fabric"]} == {"NOT_SUPPORTED"}
        return

    # and the shared answer is the fault's
    steps = list(zip(script, stub[1:], strict=True))
    discovers = [r for s, r in steps if "discover" in s]
    assert _fabric(discovers[0], 2)["state"] == "IN_PROGRESS"  # seen by the very first discovery
    assert _fabric(discovers[0], 1)["state"] == "COMPLETED"
    for (_, level, shown), result in zip(FAULTS, discovers[1:], strict=False):
        health = _fabric(result, 1)["health"]
        for key, want in shown.items():
            assert health[key] == want, (level, key, health)
        summary = _fabric(result, 1)["health_summary"]
        want_summary = {"healthy": "HEALTHY", "degraded": "LIMITED_CAPACITY", "unhealthy": "UNHEALTHY"}[level]
        assert summary == want_summary
    assert _fabric(discovers[-1], 2)["state"] == "COMPLETED"
    metrics = [r for s, r in steps if "metrics" in s]
    routed = metrics[2]["native"]
    assert any(
        line.startswith("gpuagent_fabric_condition{")
        and 'condition="route_unhealthy"' in line
        and 'gpu="1"' in line
        and line.endswith(" 1.0")
        for line in routed
    ), routed
    assert any(
        line.startswith("DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY{") and line.endswith(" 2.0")
        for line in metrics[2]["dcgm"]
    )


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        pytest.param({"conditions": ["slow"]}, "unknown fabric condition(s) slow", id="condition"),
        pytest.param({"conditions": "route_unhealthy"}, "must be a list of condition names", id="not-a-list"),
        pytest.param(
            {"incorrect_configuration": "WRONG"}, "unknown incorrect configuration 'WRONG'", id="config"
        ),
    ],
)
def test_a_bad_fabric_fault_names_the_field_on_both_paths(fault: dict[str, Any], message: str) -> None:
    machine = parse_spec(PROFILE).machine()
    sim = SimulatedNvml(machine)
    sim.init()
    before = sim.fabric(0)
    event = {"event": "fabric", "gpu": 0, **fault}
    with pytest.raises(FaultLineError, match=re.escape(message)):
        apply_fault(sim, event)
    assert sim.fabric(0) == before  # nothing changed
    with pytest.raises(DescribeError, match=re.escape(message)):
        FaultTranslator(machine).command(event)
