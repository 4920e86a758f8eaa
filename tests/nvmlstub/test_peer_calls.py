"""The calls NVIDIA's device plugin and GFD make beyond ours (``nvmlstub_peer.c``), through the unmodified
pynvml over the stand-in, and what a function the stand-in lacks does: FUNCTION_NOT_FOUND, its name recorded
for the test that ran the program (``NVMLSTUB_UNIMPLEMENTED``), no crash."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.nvmlstub.build import UNIMPLEMENTED_ENV, unimplemented_calls
from tests.nvmlstub.conftest import REPO, RUN_TIMEOUT_S, Runner

SCRIPT = r"""
import json, pynvml as n

def code(call):
    try:
        call()
    except n.NVMLError as exc:
        return exc.value
    return 0

n.nvmlInit()
out = {"migs": [], "off": []}
for i in range(n.nvmlDeviceGetCount()):
    gpu = n.nvmlDeviceGetHandleByIndex(i)
    try:
        enabled = n.nvmlDeviceGetMigMode(gpu)[0]
    except n.NVMLError_NotSupported:
        continue
    if not enabled:
        count = n.nvmlDeviceGetMaxMigDeviceCount(gpu)
        out["off"].append([count, code(lambda: n.nvmlDeviceGetGpuInstanceById(gpu, 1))])
        continue
    for slot in range(n.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            mig = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot)
        except n.NVMLError_NotFound:
            continue
        parent = n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        gi_id = n.nvmlDeviceGetGpuInstanceId(mig)
        gi = n.nvmlDeviceGetGpuInstanceById(gpu, gi_id)
        ci = n.nvmlGpuInstanceGetComputeInstanceById(gi, n.nvmlDeviceGetComputeInstanceId(mig))
        out["migs"].append({
            "parent_is_gpu": n.nvmlDeviceGetUUID(parent) == n.nvmlDeviceGetUUID(gpu),
            "gi_id": [gi_id, n.nvmlGpuInstanceGetInfo(gi).id],
            "ci_id": n.nvmlComputeInstanceGetInfo(ci).id,
            "no_such_ci": code(lambda: n.nvmlGpuInstanceGetComputeInstanceById(gi, 5)),
        })
    out["no_such_gi"] = code(lambda: n.nvmlDeviceGetGpuInstanceById(gpu, 99))
    out["parent_of_a_gpu"] = code(lambda: n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(gpu))
out["lacking"] = [code(lambda: n.nvmlDeviceGetBoardId(n.nvmlDeviceGetHandleByIndex(0))) for _ in range(2)]
print(json.dumps(out))
"""


def _run(runner: Runner, profile: str, record: Path) -> tuple[dict[str, Any], str]:
    env, _ = runner.stub_env(profile)
    env[UNIMPLEMENTED_ENV] = str(record)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result, done.stderr


def test_mig_parent_and_instances_by_id(runner: Runner, tmp_path: Path) -> None:
    out, _ = _run(runner, "dgx-a100-mig", tmp_path / "unimplemented")
    assert out["migs"], "dgx-a100-mig has MIG devices"
    for mig in out["migs"]:
        assert mig["parent_is_gpu"]
        assert mig["gi_id"][0] == mig["gi_id"][1]
        assert mig["ci_id"] == 0
        assert mig["no_such_ci"] == 6  # NVML_ERROR_NOT_FOUND
    assert out["no_such_gi"] == 6  # NOT_FOUND
    assert out["parent_of_a_gpu"] == 2  # INVALID_ARGUMENT: not a MIG device handle
    # MIG off: no MIG device can exist (nvml.h) and there is no GPU instance to find
    assert out["off"]
    assert all(row == [0, 3] for row in out["off"])  # 3: NOT_SUPPORTED


def test_a_function_the_stand_in_lacks_answers_function_not_found_and_is_named(
    runner: Runner, tmp_path: Path
) -> None:
    record = tmp_path / "unimplemented"
    out, stderr = _run(runner, "pcie-l40s", record)
    assert out["lacking"] == [13, 13]  # NVML_ERROR_FUNCTION_NOT_FOUND, each time
    assert unimplemented_calls(record) == ["nvmlDeviceGetBoardId"]
    assert record.read_text(encoding="utf-8") == "nvmlDeviceGetBoardId\n"  # once per function
    assert "nvmlstub: nvmlDeviceGetBoardId is not implemented by the stand-in" in stderr
