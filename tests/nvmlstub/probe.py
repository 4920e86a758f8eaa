"""One probe of the agent's NVML path, printed as JSON: the contract suite runs it once per profile and mode.

``python -m tests.nvmlstub.probe --simulate PROFILE SCRIPT`` probes the Python simulator (the node
``--simulate`` builds, faults through its fault file); ``python -m tests.nvmlstub.probe --stub PROFILE
SCRIPT`` probes the real NVML path (``agent.nvml.real.RealNvml`` over the unmodified ``pynvml``), which
loads whatever ``libnvidia-ml.so.1`` ``LD_LIBRARY_PATH`` names — the C stand-in, serving the description in
``NVMLSTUB_MACHINE`` and following the control file ``NVMLSTUB_CONTROL`` (this probe appends the
translated faults there).

SCRIPT is a JSON list of steps, run in order after ``init``:

- ``{"fault": {...}}``: one fault-file event (``agent.nvml.faults``);
- ``{"discover": true}``: discovery (not strict) and the device plugin's resources (migStrategy mixed);
- ``{"sample": true}``: one metrics read — ``sample`` per GPU, ``fabric`` per GPU, ``mig_sample`` per MIG
  device and ``process_utilization`` per GPU, as the metrics cache reads them;
- ``{"metrics": true}``: one refresh of the agent's metrics cache (``agent.metrics.cache.MetricsCache``
  with a fixed clock) rendered as the ``/metrics`` text, native and DCGM-compatible (the device families;
  the agent's self-metrics carry timings);
- ``{"register": true}``: ``register_events`` for every GPU discovery found usable;
- ``{"health": true}``: the health probe's ``health_reading`` of every GPU discovery found;
- ``{"wait": N}``: N event waits of 50 ms each;
- ``{"counters": true}``: the backend's call/error counters.

Each step's result (or the error it raised: type, NVML code name) is one entry of the printed list.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import os
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from agent.discovery import discover, usable
from agent.host import read_host
from agent.metrics.cache import MetricsCache
from agent.metrics.dcgm import render_dcgm_devices
from agent.metrics.exposition import render_text
from agent.metrics.native import render_native_devices
from agent.nvml.describe import FaultTranslator
from agent.nvml.errors import NVMLError
from agent.nvml.profiles import MachineSpec
from agent.nvml.protocol import NvmlBackend
from agent.nvml.simulate import parse_spec
from deviceplugin.config import parse_plugin_config
from deviceplugin.resources import build_plan
from topology.model import NodeInventory

WAIT_MS = 50

SIM_LIBRARIES: dict[str, dict[str, Any]] = {
    "current": {},
    "no-processes-v3": {"missing": ("nvmlDeviceGetComputeRunningProcesses_v3",)},
    "no-fabric-v": {"missing": ("nvmlDeviceGetGpuFabricInfoV",)},
    "old-driver": {
        "missing": ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperatureV"),
        "platform_info_versions": (1,),
    },
}
"""The simulator's library shaped like each stand-in variant (``--variant`` in ``--simulate``
mode): the same missing symbols and platform-info versions. The old driver's missing NVLink-5 byte
fields (202/204) have no simulator counterpart; the contract compares those counters at KiB
granularity."""


def plain(value: Any) -> Any:
    """Dataclasses, enums, tuples → JSON-ready values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not f.name.startswith("_")
        }
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    return value


def _outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"ok": plain(fn())}
    except NVMLError as exc:
        return {"error": "NVMLError", "code": exc.name}
    except Exception as exc:  # the contract records what escaped, whatever it is
        return {"error": type(exc).__name__, "message": str(exc)[:200]}


class Probe:
    def __init__(
        self,
        nvml: NvmlBackend,
        machine: MachineSpec,
        sysfs_root: Path,
        apply: Callable[[dict[str, Any]], None],
    ):
        self.nvml = nvml
        self.machine = machine
        self.sysfs_root = sysfs_root
        self.apply = apply
        self.inventory: NodeInventory | None = None

    def host(self) -> Any:
        return read_host(sysfs_root=self.sysfs_root, hostname=self.machine.hostname)

    def discover(self) -> dict[str, Any]:
        inventory = discover(nvml=self.nvml, sysfs_root=self.sysfs_root, host=self.host())
        self.inventory = inventory
        plan = _outcome(
            lambda: build_plan(inventory, parse_plugin_config({"flags": {"migStrategy": "mixed"}}))
        )
        out = inventory.to_dict()
        out.pop(
            "host", None
        )  # host facts come from /proc on the real path; the discover CLI test covers them
        return {"inventory": out, "plugin": plan}

    def _gpus(self) -> list[int]:
        if self.inventory is None:
            self.discover()
        assert self.inventory is not None
        return [g.index for g in self.inventory.gpus if usable(g)]

    def sample(self) -> dict[str, Any]:
        gpus = self._gpus()
        assert self.inventory is not None
        migs = [d.uuid for d in self.inventory.mig_devices()]
        return {
            "gpus": {i: _outcome(lambda i=i: self.nvml.sample(i)) for i in gpus},
            "fabric": {i: _outcome(lambda i=i: self.nvml.fabric(i)) for i in gpus},
            "mig": {u: _outcome(lambda u=u: self.nvml.mig_sample(u)) for u in migs},
            "process_utilization": {i: _outcome(lambda i=i: self.nvml.process_utilization(i)) for i in gpus},
        }

    def health(self) -> dict[int, dict[str, Any]]:
        if self.inventory is None:
            self.discover()
        assert self.inventory is not None
        return {g.index: _outcome(lambda i=g.index: self.nvml.health_reading(i)) for g in self.inventory.gpus}

    def metrics(self) -> dict[str, Any]:
        if self.inventory is None:
            self.discover()
        inventory = self.inventory
        assert inventory is not None
        cache = MetricsCache(
            backend=self.nvml,
            inventory=lambda: inventory,
            hostname=self.machine.hostname,
            clock=lambda: 0.0,
            monotonic=lambda: 0.0,
        )
        snapshot = asyncio.run(cache.refresh())
        return {
            "problem": cache.nvml_problem(),
            "native": render_text(render_native_devices(snapshot)).decode().splitlines(),
            "dcgm": render_text(render_dcgm_devices(snapshot)).decode().splitlines(),
        }

    def run(self, step: dict[str, Any]) -> Any:
        if "fault" in step:
            return _outcome(lambda: self.apply(step["fault"]))
        if "discover" in step:
            return self.discover()
        if "sample" in step:
            return self.sample()
        if "metrics" in step:
            return self.metrics()
        if "health" in step:
            return self.health()
        if "register" in step:
            return _outcome(lambda: self.nvml.register_events(tuple(self._gpus())))
        if "wait" in step:
            return [_outcome(lambda: self.nvml.wait_event(WAIT_MS)) for _ in range(int(step["wait"]))]
        if "counters" in step:
            return plain(self.nvml.counters())
        raise ValueError(f"unknown probe step {step!r}")


def probe(mode: str, profile: str, script: list[dict[str, Any]], *, variant: str = "current") -> list[Any]:
    """Run a script (module docstring); ``variant`` shapes the simulator's library in ``--simulate``."""
    spec = parse_spec(profile)
    machine = spec.machine()
    with ExitStack() as stack:
        if mode == "--simulate":
            from agent.nvml.faults import FaultFollower
            from agent.simnode import open_simulated_node

            faults = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "faults.jsonl"
            faults.touch()
            node = stack.enter_context(open_simulated_node(spec, faults_path=faults))
            follower = node.faults
            assert follower is not None
            library = SIM_LIBRARIES[variant]
            if library:  # the simulator's own older-driver library, in place of the node's
                from agent.nvml.fake import SimulatedNvml

                sim = SimulatedNvml(machine, **library)  # type: ignore[arg-type]
                node.nvml = sim
                follower = FaultFollower(sim, faults)

            def apply(event: dict[str, Any]) -> None:
                with faults.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(event) + "\n")
                follower.poll()

            nvml: NvmlBackend = node.nvml
            sysfs_root = node.sysfs_root
        elif mode == "--stub":
            from agent.nvml.real import RealNvml

            control = Path(os.environ["NVMLSTUB_CONTROL"])
            sysfs_root = Path(os.environ["NVMLSTUB_SYSFS"])

            translator = FaultTranslator(machine)

            def apply(event: dict[str, Any]) -> None:
                line = translator.command(event)
                with control.open("a", encoding="utf-8") as fh:
                    fh.write(line + "\n")

            nvml = RealNvml()
        else:
            raise ValueError(f"mode must be --simulate or --stub, got {mode!r}")
        results: list[Any] = [_outcome(nvml.init)]
        if "error" in results[0]:
            return results
        try:
            results.extend(Probe(nvml, machine, sysfs_root, apply).run(step) for step in script)
        finally:
            nvml.shutdown()
        return results


def main(argv: list[str]) -> int:
    variant = "current"
    if len(argv) == 5 and argv[3] == "--variant":
        variant = argv.pop()
        argv.pop()
    if len(argv) != 3:
        print(
            "usage: python -m tests.nvmlstub.probe --simulate|--stub PROFILE SCRIPT_JSON [--variant NAME]",
            file=sys.stderr,
        )
        return 2
    mode, profile, script = argv
    json.dump(probe(mode, profile, json.loads(script), variant=variant), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
