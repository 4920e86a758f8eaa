"""The contract between the Python simulator and the C-level driver stand-in: for every simulator profile the
agent answers the same over both.

One side is ``--simulate PROFILE`` (the simulator's pynvml face under the one NVML composition); the other
is the agent's real NVML path (``agent.nvml.real`` over the unmodified ``pynvml``) loading the stand-in
``libnvidia-ml.so.1`` (``tests/nvmlstub/nvmlstub.c``, compiled against NVIDIA's ``nvml.h``) that serves the
machine the simulator exports (``agent.nvml.describe``). Each run is its own process.

Compared: ``discover --output json``; and, through ``tests.nvmlstub.probe``, discovery with the device
plugin's resources, metrics samples (per GPU, fabric, per MIG device, process utilisation) before and
after faults, one refresh of the metrics cache rendered as ``/metrics`` text (native and DCGM names),
health events around an Xid 79 and a MIG reconfiguration, and NVML's call/error counters.

Normalised, because they must differ: the host's memory size and kernel release in ``discover`` (read
from ``/proc`` on the real path; the simulated node takes them from its profile), and on the older-driver
variant of an NVLink-5 part the NVLink byte counters (that driver answers the KiB throughput fields, so
bytes are compared at KiB granularity, and the agent makes one more bulk field read per GPU and sample).

Scripted error paths: GPU_IS_LOST on every wait after Xid 79 (the healthy GPUs' events keep coming),
NOT_SUPPORTED on ``nvmlDeviceRegisterEvents``, NO_PERMISSION on process and GPU/compute-instance listings;
library variants without ``nvmlDeviceGetComputeRunningProcesses_v3``, without
``nvmlDeviceGetGpuFabricInfoV``, and an older driver (no NVLink-5 byte fields, no ClocksEventReasons, no
TemperatureV, platform info v1 only), each compared with the simulator's library shaped the same way.

Skips (with the reason) where no C compiler or no ``nvidia-nvml-dev`` header is installed.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from typing import Any

import pytest

from agent.nvml.describe import mig_instances
from agent.nvml.simulate import PROFILES, parse_spec
from tests.nvmlstub.build import SOURCE, build
from tests.nvmlstub.conftest import REPO, Runner

ALL_PROFILES = sorted(PROFILES)


def _first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two JSON values first differ (for a readable failure)."""
    if type(a) is not type(b):
        return f"{path or '<root>'}: {a!r} != {b!r}"
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}.{key}: present on one side only"
            found = _first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{path or '<root>'}: {a!r} != {b!r}"


def assert_same(simulated: Any, stub: Any) -> None:
    difference = _first_difference(simulated, stub)
    assert difference is None, f"simulator and C stand-in differ at {difference}"


def _events(step: list[Any]) -> list[tuple[str, int] | None]:
    out: list[tuple[str, int] | None] = []
    for entry in step:
        assert "ok" in entry, entry
        event = entry["ok"]
        out.append(None if event is None else (event["kind"], event["gpu_index"]))
    return out


# --------------------------------------------------------------------------- discover, every profile


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_discover_json_is_identical(runner: Runner, profile: str) -> None:
    simulated = runner.discover(profile, stub=False)
    stub = runner.discover(profile, stub=True)
    for side in (simulated, stub):  # /proc facts of the machine running the test on the real path
        side["host"].pop("memory_bytes")
        side["host"].pop("kernel")
        side.pop("imex", None)  # the simulated tray's IMEX daemon; the stand-in's host has none
    assert_same(simulated, stub)
    machine = parse_spec(profile).machine()
    assert stub["driver"]["driver_version"] == machine.driver_version  # served by the stand-in
    assert [g["uuid"] for g in stub["gpus"]] == [g.uuid for g in machine.gpus]
    assert stub["host"]["cpu_count"] == machine.cpu_count


# --------------------------------------------------------------------------- samples, events, plugin


def _contract_script(profile: str) -> list[dict[str, Any]]:
    machine = parse_spec(profile).machine()
    last = len(machine.gpus) - 1
    busy = next(g.index for g in machine.gpus if g.mig_layout is None and g.index > 0)
    script: list[dict[str, Any]] = [
        {"discover": True},
        {
            "fault": {
                "event": "process_start",
                "gpu": busy,
                "pid": 4242,
                "used_memory_mib": 1024,
                "sm_percent": 60,
            }
        },
    ]
    for gpu in machine.gpus:
        instances = mig_instances(gpu)
        if instances:  # a process on one MIG device
            script.append(
                {
                    "fault": {
                        "event": "process_start",
                        "gpu": gpu.index,
                        "pid": 77,
                        "mig_uuid": instances[0][3],
                    }
                }
            )
            break
    script += [{"sample": True}, {"sample": True}]
    if machine.gpus[busy].nvlinks:
        script.append({"fault": {"event": "nvlink_down", "gpu": busy, "link": 0}})
    script.append({"fault": {"event": "ecc_dbe", "gpu": busy}})
    if machine.gpus[0].fabric is not None and machine.gpus[0].fabric.health_summary:
        script.append({"fault": {"event": "fabric", "gpu": 0, "health_summary": "UNHEALTHY"}})
    script += [
        {"sample": True},
        {"metrics": True},
        {"register": True},
        {"fault": {"event": "xid", "gpu": 0, "xid": 13}},
        {"fault": {"event": "ecc_sbe", "gpu": busy}},
        {"wait": 3},
        {"fault": {"event": "xid", "gpu": last, "xid": 79}},
        {"wait": 3},
    ]
    if machine.gpus[2].mig_layout is not None:
        # a new layout: MIG_CONFIG_CHANGE, new UUIDs, MIG handles of the old layout's slots reused
        script += [
            {"fault": {"event": "mig_reconfig", "gpu": 2, "profiles": ["3g.40gb", "2g.20gb", "1g.10gb"]}},
            {"wait": 2},
            {"discover": True},
            {"sample": True},
        ]
    script += [
        {"fault": {"event": "ecc_sbe", "gpu": 0}},
        {"wait": 2},
        {"discover": True},
        {"sample": True},
        {"counters": True},
    ]
    return script


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_samples_events_and_plugin_are_identical(runner: Runner, profile: str) -> None:
    script = _contract_script(profile)
    simulated = runner.probe(profile, script, stub=False)
    stub = runner.probe(profile, script, stub=True)
    assert_same(simulated, stub)

    # and the shared answer is the one a driver gives
    machine = parse_spec(profile).machine()
    last = len(machine.gpus) - 1
    results = dict(zip((next(iter(s)) for s in script), stub[1:], strict=False))
    assert results["counters"]["calls"] > 0
    waits = [r for s, r in zip(script, stub[1:], strict=True) if "wait" in s]
    busy = script[1]["fault"]["gpu"]
    assert _events(waits[0]) == [("xid", 0), ("ecc_sbe", busy), None]
    assert _events(waits[1]) == [("xid", last), ("gpu_lost", last), None]
    if machine.gpus[2].mig_layout is not None:
        assert _events(waits.pop(2)) == [("mig_config_change", 2), None]
        reconfigured = [r for s, r in zip(script, stub[1:], strict=True) if "discover" in s][1]
        devices = [d for m in reconfigured["inventory"]["mig"] if m["gpu_index"] == 2 for d in m["devices"]]
        assert sorted(d["profile"] for d in devices) == ["1g.10gb", "2g.20gb", "3g.40gb"]
    assert _events(waits[2]) == [("ecc_sbe", 0), None]  # the healthy GPUs' events keep coming
    final = [r for s, r in zip(script, stub[1:], strict=True) if "discover" in s][-1]
    gpus = final["inventory"]["gpus"]
    assert gpus[last]["lost"]
    assert not any(g["lost"] for g in gpus[:last])
    advertised = {d["gpu_index"] for r in final["plugin"]["ok"]["resources"] for d in r["devices"]}
    assert last not in advertised
    first_sample = next(r for s, r in zip(script, stub[1:], strict=True) if "sample" in s)
    busy_sample = first_sample["gpus"][str(busy)]["ok"]
    assert busy_sample["gpu_utilization_percent"] > 0
    assert [p["pid"] for p in busy_sample["processes"]] == [4242]
    metrics = next(r for s, r in zip(script, stub[1:], strict=True) if "metrics" in s)
    assert metrics["problem"] is None
    uuid = machine.gpus[busy].uuid
    assert f'gpuagent_gpu_sample_ok{{gpu="{busy}",uuid="{uuid}"}} 1.0' in metrics["native"]


# --------------------------------------------------------------------------- scripted error paths


def test_a_lost_gpu_is_reported_once_and_healthy_events_keep_coming(runner: Runner) -> None:
    """NVIDIA: after Xid 79 every wait answers GPU_IS_LOST. The agent reports the lost GPU once, counts the
    error once (no spinning through waits that fail at once) and keeps the healthy GPUs' events."""
    script: list[dict[str, Any]] = [
        {"register": True},
        {"fault": {"event": "xid", "gpu": 7, "xid": 79}},
        {"wait": 4},
        {"fault": {"event": "ecc_sbe", "gpu": 0}},
        {"wait": 2},
        {"counters": True},
    ]
    simulated = runner.probe("dgx-h100", script, stub=False)
    stub = runner.probe("dgx-h100", script, stub=True)
    assert_same(simulated, stub)
    assert _events(stub[3]) == [("xid", 7), ("gpu_lost", 7), None, None]
    assert _events(stub[5]) == [("ecc_sbe", 0), None]
    assert stub[6]["errors_by_code"].get("GPU_IS_LOST") == 1


@pytest.mark.parametrize("profile", ["dgx-h100", "gb200-nvl72"])
def test_health_faults_lost_silently_ecc_rising_and_reset(runner: Runner, profile: str) -> None:
    """Issue 27's health faults over both: a GPU that answers GPU_IS_LOST to every query without any event
    (the waits stay quiet until a query tells the backend, which then reports it once), uncorrectable ECC
    rising without events, Xid 79 then an answer without a reset (counters kept), and a reset (counters to
    zero, every GPU answering again)."""
    script: list[dict[str, Any]] = [
        {"register": True},
        {"health": True},
        {"fault": {"event": "gpu_lost_silent", "gpu": 1}},
        {"wait": 2},
        {"health": True},
        {"wait": 2},
        {"fault": {"event": "ecc_rising", "gpu": 2, "count": 3}},
        {"wait": 1},
        {"fault": {"event": "xid", "gpu": 3, "xid": 79}},
        {"fault": {"event": "ecc_rising", "gpu": 3, "count": 2}},
        {"wait": 3},
        {"fault": {"event": "recover", "gpu": 3}},
        {"health": True},
        {"fault": {"event": "reset", "gpu": 1}},
        {"fault": {"event": "reset", "gpu": 2}},
        {"fault": {"event": "reset", "gpu": 3}},
        {"health": True},
        {"wait": 1},  # GPUs that answer again are registered again before the next wait
        {"fault": {"event": "ecc_sbe", "gpu": 1}},
        {"wait": 2},
        {"counters": True},
    ]
    simulated = runner.probe(profile, script, stub=False)
    stub = runner.probe(profile, script, stub=True)
    assert_same(simulated, stub)

    def unc(step: dict[str, Any], gpu: int) -> Any:
        return step[str(gpu)]["ok"]["ecc_uncorrected_volatile"]

    first, lost, recovered, after_reset = stub[2], stub[5], stub[13], stub[17]
    assert all("ok" in r for r in first.values())
    assert _events(stub[4]) == [None, None]  # lost without an event: the waits say nothing
    assert lost["1"] == {"error": "NVMLError", "code": "GPU_IS_LOST"}
    assert all("ok" in r for g, r in lost.items() if g != "1")
    assert _events(stub[6]) == [("gpu_lost", 1), None]  # the query's answer, reported once
    assert _events(stub[8]) == [None]  # rising ECC: no event
    assert _events(stub[11]) == [("xid", 3), ("gpu_lost", 3), None]
    assert unc(recovered, 2) == 3
    assert unc(recovered, 3) == 2  # answers again without a reset: the count stays
    assert recovered["1"]["error"] == "NVMLError"
    assert all(unc(after_reset, g) == 0 for g in (1, 2, 3))
    assert _events(stub[20]) == [("ecc_sbe", 1), None]  # GPU 1 registered again once it answered


def test_register_events_not_supported_on_one_gpu(runner: Runner) -> None:
    """``nvml.h``: after NOT_SUPPORTED from ``nvmlDeviceRegisterEvents`` the event set can still be used."""
    script: list[dict[str, Any]] = [
        {
            "fault": {
                "event": "nvml_error",
                "code": "NOT_SUPPORTED",
                "call": "nvmlDeviceRegisterEvents",
                "gpu": 0,
            }
        },
        {"register": True},
        {"fault": {"event": "ecc_sbe", "gpu": 1}},
        {"fault": {"event": "xid", "gpu": 0, "xid": 13}},
        {"wait": 2},
    ]
    simulated = runner.probe("dgx-h100", script, stub=False)
    stub = runner.probe("dgx-h100", script, stub=True)
    assert_same(simulated, stub)
    assert stub[2] == {"ok": None}
    assert _events(stub[5]) == [("ecc_sbe", 1), None]  # GPU 0 is not registered; GPU 1 is


def test_no_permission_on_process_and_instance_listings(runner: Runner) -> None:
    """An unprivileged agent: NO_PERMISSION on process lists and GPU/compute-instance listings leaves those
    parts out and keeps the rest of each GPU's answers."""
    profile = "dgx-a100-mig"
    error = {"event": "nvml_error", "code": "NO_PERMISSION"}
    script: list[dict[str, Any]] = [
        {"fault": {"event": "process_start", "gpu": 5, "pid": 4242, "used_memory_mib": 1024}},
        {"fault": {**error, "call": "nvmlDeviceGetComputeRunningProcesses", "gpu": 5}},
        {"fault": {**error, "call": "nvmlDeviceGetGpuInstances", "gpu": 1}},
        {"fault": {**error, "call": "nvmlGpuInstanceGetComputeInstances", "gpu": 2}},
        {"discover": True},
        {"sample": True},
    ]
    simulated = runner.probe(profile, script, stub=False)
    stub = runner.probe(profile, script, stub=True)
    assert_same(simulated, stub)
    inventory, sample = stub[5]["inventory"], stub[6]
    assert not any(g["error"] for g in inventory["gpus"])
    gpu5 = sample["gpus"]["5"]["ok"]
    assert gpu5["processes"] == []
    assert gpu5["power_watts"] is not None
    assert gpu5["memory_used_bytes"] == 1024 * 2**20


_LOST_ON_EVERY_WAIT = r"""
import ctypes, json, os, sys
lib = ctypes.CDLL(sys.argv[1])
out = {}
missing = ["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGpuFabricInfoV",
           "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperatureV"]
out["symbols"] = {name: hasattr(lib, name) for name in missing}
assert lib.nvmlInit_v2() == 0
handles = []
for i in range(2):
    h = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0
    handles.append(h)
es = ctypes.c_void_p()
assert lib.nvmlEventSetCreate(ctypes.byref(es)) == 0
for h in handles:
    assert lib.nvmlDeviceRegisterEvents(h, ctypes.c_ulonglong(0x8), es) == 0
with open(os.environ["NVMLSTUB_CONTROL"], "a") as f:
    f.write("xid\t1\t79\t-1\n")
data = (ctypes.c_ubyte * 64)()
out["waits"] = [lib.nvmlEventSetWait_v2(es, ctypes.byref(data), 10) for _ in range(5)]
assert lib.nvmlEventSetFree(es) == 0
fresh = ctypes.c_void_p()
assert lib.nvmlEventSetCreate(ctypes.byref(fresh)) == 0
out["register_healthy"] = lib.nvmlDeviceRegisterEvents(handles[0], ctypes.c_ulonglong(0x8), fresh)
out["register_lost"] = lib.nvmlDeviceRegisterEvents(handles[1], ctypes.c_ulonglong(0x8), fresh)
out["fresh_wait"] = lib.nvmlEventSetWait_v2(fresh, ctypes.byref(data), 10)
out["unsupported_mask"] = lib.nvmlDeviceRegisterEvents(handles[0], ctypes.c_ulonglong(1 << 40), fresh)
print(json.dumps(out))
"""


@pytest.mark.parametrize("variant", ["current", "no-processes-v3", "no-fabric-v", "old-driver"])
def test_the_library_as_a_driver_answers(runner: Runner, variant: str) -> None:
    """At the C API, without pynvml: after Xid 79 every wait on a set holding the lost GPU answers
    GPU_IS_LOST (the Xid event itself first); a new set without it times out; each variant lacks its
    symbols."""
    env, _ = runner.stub_env("dgx-h100", variant)
    library = runner.libraries[variant] / "libnvidia-ml.so.1"
    done = subprocess.run(
        [sys.executable, "-c", _LOST_ON_EVERY_WAIT, str(library)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = json.loads(done.stdout)
    success, not_supported, timeout, gpu_is_lost = 0, 3, 10, 15
    assert out["waits"] == [success, gpu_is_lost, gpu_is_lost, gpu_is_lost, gpu_is_lost]
    assert out["register_healthy"] == success
    assert out["register_lost"] == gpu_is_lost
    assert out["fresh_wait"] == timeout
    assert out["unsupported_mask"] == not_supported
    expected_missing = {
        "current": set(),
        "no-processes-v3": {"nvmlDeviceGetComputeRunningProcesses_v3"},
        "no-fabric-v": {"nvmlDeviceGetGpuFabricInfoV"},
        "old-driver": {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperatureV"},
    }[variant]
    assert {name for name, present in out["symbols"].items() if not present} == expected_missing


_GARBAGE_CONTROL = r"""
import ctypes, json, os, sys
lib = ctypes.CDLL(sys.argv[1])
assert lib.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
es = ctypes.c_void_p()
assert lib.nvmlEventSetCreate(ctypes.byref(es)) == 0
assert lib.nvmlDeviceRegisterEvents(h, ctypes.c_ulonglong(0x8), es) == 0
garbage = ["nonsense", "xid\t99\t79\t-1", "xid\t0", "x" * 20000, "error\tx\ty", "\x00\xff", "fabric\t0\t1"]
with open(os.environ["NVMLSTUB_CONTROL"], "a", encoding="latin-1") as f:
    f.write("\n".join(garbage) + "\nxid\t0\t13\t-1\n")

class Data(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong),
                ("eventData", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]

data = Data()
first = lib.nvmlEventSetWait_v2(es, ctypes.byref(data), 100)
second = lib.nvmlEventSetWait_v2(es, ctypes.byref(data), 10)
print(json.dumps({"first": first, "xid": data.eventData, "second": second}))
"""


def test_garbage_control_lines_are_skipped(runner: Runner) -> None:
    """Control lines the library cannot apply (unknown, wrong field count, no such GPU, longer than its
    buffer, binary) are reported on stderr and skipped; the next good line still applies."""
    env, _ = runner.stub_env("dgx1-v100")
    library = runner.libraries["current"] / "libnvidia-ml.so.1"
    done = subprocess.run(
        [sys.executable, "-c", _GARBAGE_CONTROL, str(library)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = json.loads(done.stdout)
    assert out == {"first": 0, "xid": 13, "second": 10}  # the Xid 13 event, then a timeout
    assert "nvmlstub: control line xid names no GPU of this machine" in done.stderr
    assert "nvmlstub: ignoring control line nonsense with 1 fields" in done.stderr


@pytest.mark.parametrize(
    ("original", "changed"),
    [
        ("nvmlDeviceGetCount_v2(unsigned int *deviceCount)", "nvmlDeviceGetCount_v2(int *deviceCount)"),
        ("nvmlReturn_t nvmlDeviceGetIndex(", "nvmlReturn_t nvmlDeviceGetIndexOf("),  # not in nvml.h
    ],
    ids=["signature-differs", "not-declared"],
)
def test_a_definition_unlike_nvml_h_does_not_compile(
    stub_libraries: dict[str, Any], tmp_path: Any, original: str, changed: str
) -> None:
    """The build checks every exported definition against NVIDIA's prototypes."""
    text = SOURCE.read_text(encoding="utf-8")
    assert original in text
    altered = tmp_path / "nvmlstub.c"
    altered.write_text(text.replace(original, changed, 1), encoding="utf-8")
    with pytest.raises(subprocess.CalledProcessError) as failed:
        build(tmp_path / "out", source=altered)
    assert "nvmlDeviceGet" in failed.value.stderr


def test_a_bad_description_fails_init_with_one_line(runner: Runner, tmp_path: Any) -> None:
    env, _ = runner.stub_env("pcie-l40s")
    bad = tmp_path / "bad.nvmlstub"
    bad.write_text("nvmlstub\t1\ngpu\t0\ttoo few fields\n", encoding="utf-8")
    env["NVMLSTUB_MACHINE"] = str(bad)
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "discover", "--output", "json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1  # no usable driver
    assert f"nvmlstub: unknown record or wrong number of fields ({bad} line 2)" in done.stderr
    assert "DRIVER_NOT_LOADED" in done.stderr or "driver is not loaded" in done.stderr


# --------------------------------------------------------------------------- older libraries and drivers


def _kib(result: list[Any]) -> list[Any]:
    """NVLink byte counters rounded down to whole KiB (what the throughput fields 138/139 carry)."""
    out = copy.deepcopy(result)
    for step in out:
        if isinstance(step, dict) and "gpus" in step:
            for entry in step["gpus"].values():
                for link in entry.get("ok", {}).get("nvlinks", []):
                    for key in ("tx_bytes", "rx_bytes"):
                        if link[key] is not None:
                            link[key] = link[key] // 1024 * 1024
    return out


VARIANT_CASES = [
    pytest.param("no-processes-v3", "dgx-a100-mig", id="no-processes-v3-dgx-a100-mig"),
    pytest.param("no-fabric-v", "gb200-nvl72", id="no-fabric-v-gb200-nvl72"),
    pytest.param("old-driver", "gb200-nvl72", id="old-driver-gb200-nvl72"),
    pytest.param("old-driver", "dgx-h100", id="old-driver-dgx-h100"),
]


@pytest.mark.parametrize(("variant", "profile"), VARIANT_CASES)
def test_older_libraries_fall_back_as_the_simulator_does(runner: Runner, variant: str, profile: str) -> None:
    script: list[dict[str, Any]] = [
        {"discover": True},
        {
            "fault": {
                "event": "process_start",
                "gpu": 5 if profile == "dgx-a100-mig" else 1,
                "pid": 9,
                "sm_percent": 90,
            }
        },
        {"sample": True},
        {"sample": True},
        {"counters": True},
    ]
    simulated = runner.probe(profile, script, stub=False, variant=variant)
    stub = runner.probe(profile, script, stub=True, variant=variant)
    if variant == "old-driver" and profile == "gb200-nvl72":
        # that driver answers NOT_SUPPORTED to the NVLink-5 byte fields: one more bulk read per GPU per sample
        stub[-1]["calls"] -= 4 * 2
    assert_same(_kib(simulated), _kib(stub))

    inventory, samples = stub[1]["inventory"], stub[4]
    gpu = samples["gpus"]["1"]["ok"]
    assert gpu["power_watts"] is not None
    assert gpu["temperature_celsius"] is not None
    if variant == "no-processes-v3":
        assert samples["gpus"]["5"]["ok"]["processes"] == []  # the rest of the sample stays
    if variant == "no-fabric-v":  # the unversioned v1 call: no health fields
        fabric = inventory["fabric"]
        assert len(fabric) == 4
        assert all(f["state"] == "COMPLETED" for f in fabric)
        assert {f["health_summary"] for f in fabric} == {"NOT_SUPPORTED"}
    if variant == "old-driver":
        assert gpu["throttle_reasons"] is not None  # from ClocksThrottleReasons
        assert all(link["tx_bytes"] for link in gpu["nvlinks"])  # from fields 138/139 (KiB), under load
        if profile == "gb200-nvl72":  # platform info through the v1 struct
            assert all(g["platform"] is not None for g in inventory["gpus"])
