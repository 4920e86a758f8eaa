"""``gpu-node-agent bench deviceplugin``: the device plugin's latencies, measured over real sockets.

The node runtime (health monitor, fault follower, rediscovery, plugin manager) runs on a simulated
machine in a temporary directory; an in-process kubelet stand-in (:mod:`agent.fakekubelet`)
registers it and consumes ListAndWatch. Measured:

- Allocate latency: a blocking gRPC client in a worker thread, one container per call;
- fault-to-kubelet health propagation: from appending an XID line to the ``--simulate-faults`` file until
  the kubelet side receives the device as Unhealthy in ListAndWatch (a self-clearing XID, 94: the device
  then recovers before the next fault; quiet period 50 ms for the benchmark);
- lost-without-event propagation: a GPU answers GPU_IS_LOST to every query and no event says so
  (``gpu_lost_silent``); from the first answer (a read like the metrics refresh's, in a worker thread)
  until the kubelet side receives the device as Unhealthy; a ``reset`` line brings it back. The health
  probe is driven by the benchmark (``probe_once``), not by its timer, so the answer measured is the
  first one;
- re-registration after a kubelet restart: from the new ``kubelet.sock`` serving until ``Register``
  arrives;
- GetPreferredAllocation: over gRPC, and the pure function on 8-GPU machines, with its optimality rate
  against brute force for random availability and sizes.

Aims: propagation p99 < 200 ms, lost without event p99 < 2 s, re-registration < 1 s, preferred allocation
p99 < 2 ms for 8 GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from agent.benchmarks.dra import dra_figures, print_dra, summary
from agent.benchmarks.machine import describe_ms, machine_summary, percentile
from agent.fakekubelet import FakeKubelet
from agent.health import HealthMonitor
from agent.healthbook import HealthConfig
from agent.nvml.errors import LOST_CODES, NVMLError
from agent.nvml.faults import FaultFollower
from agent.nvml.protocol import NvmlBackend
from agent.runtime import Component, InventoryStore, Rediscovery, run_components
from agent.simnode import open_simulated_node
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc
from deviceplugin.config import PluginConfig
from deviceplugin.manager import PluginManager
from deviceplugin.preferred import (
    Candidate,
    DeviceKind,
    Topology,
    brute_force_best,
    preferred_allocation,
    topology_from_inventory,
)
from topology import logs
from topology.model import LinkLevel

GPU = "nvidia.com/gpu"


def _timed_calls(socket: Path, requests: list[object], method: str) -> list[float]:
    """Blocking gRPC calls from this (worker) thread; seconds per call."""
    out: list[float] = []
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        call = getattr(stub, method)
        call(requests[0], timeout=5)  # connect and warm up
        for request in requests:
            t0 = time.perf_counter()
            call(request, timeout=5)
            out.append(time.perf_counter() - t0)
    return out


async def _runtime_figures(args: argparse.Namespace) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="dpb", dir="/tmp") as tmp:
        directory = Path(tmp)
        faults = directory / "faults.jsonl"
        faults.write_text("")
        node = open_simulated_node(args.profile, faults_path=faults)
        sim, discover_fn = node.nvml, node.discover
        sim.init()
        config = PluginConfig()
        # the probe's own timer stays out of the way: the benchmark probes when it means to
        health_config = HealthConfig(recovery_quiet_s=0.05, probe_interval_s=3600.0)
        store = InventoryStore(discover_fn())
        rediscovery = Rediscovery(store=store, discover=discover_fn, interval_s=None)
        health = HealthMonitor(nvml=sim, store=store, config=health_config, on_mig_change=rediscovery.request)
        manager = PluginManager(store=store, config=config, kubelet_dir=directory)
        components: list[Component] = [health, rediscovery, manager]
        if node.faults is not None:
            components.append(node.faults)
        kubelet = FakeKubelet(directory)
        await kubelet.start()
        stop = asyncio.Event()
        task = asyncio.create_task(run_components(components, stop))
        try:
            await kubelet.wait_for(lambda: len(kubelet.devices.get(GPU, {})) == len(store.inventory.gpus), 10)
            uuids = [g.uuid for g in sorted(store.inventory.gpus, key=lambda g: g.index)]
            socket = directory / "nvidia-gpu.sock"
            rng = random.Random(7)

            allocs: list[object] = [
                pb.AllocateRequest(
                    container_requests=[
                        pb.ContainerAllocateRequest(devices_ids=rng.sample(uuids, rng.randint(1, len(uuids))))
                    ]
                )
                for _ in range(args.allocations)
            ]
            allocate = await asyncio.to_thread(_timed_calls, socket, allocs, "Allocate")

            prefs: list[object] = []
            for _ in range(args.preferred):
                avail = rng.sample(uuids, rng.randint(1, len(uuids)))
                prefs.append(
                    pb.PreferredAllocationRequest(
                        container_requests=[
                            pb.ContainerPreferredAllocationRequest(
                                available_deviceIDs=avail, allocation_size=rng.randint(1, len(avail))
                            )
                        ]
                    )
                )
            preferred = await asyncio.to_thread(_timed_calls, socket, prefs, "GetPreferredAllocation")

            propagation: list[float] = []
            for i in range(args.faults):
                index = i % len(uuids)
                uuid = uuids[index]
                seen: asyncio.Future[float] = asyncio.get_running_loop().create_future()

                def on_list(
                    resource: str,
                    devices: dict[str, str],
                    uuid: str = uuid,
                    seen: asyncio.Future[float] = seen,
                ) -> None:
                    if resource == GPU and devices.get(uuid) == "Unhealthy" and not seen.done():
                        seen.set_result(time.perf_counter())

                kubelet.listeners.append(on_list)
                t0 = time.perf_counter()
                with faults.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"event": "xid", "gpu": index, "xid": 94}) + "\n")
                t1 = await asyncio.wait_for(seen, 10)
                propagation.append(t1 - t0)
                kubelet.listeners.remove(on_list)
                await _recover(kubelet, health, uuid, health_config.recovery_quiet_s)

            lost: list[float] = []
            for i in range(args.lost):
                index = i % len(uuids)
                uuid = uuids[index]
                applied = node.faults.applied if node.faults is not None else 0
                with faults.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"event": "gpu_lost_silent", "gpu": index}) + "\n")
                await _applied(node.faults, applied)
                answered = await asyncio.to_thread(_lost_answer, sim, index)
                await kubelet.wait_for(_unhealthy(kubelet, uuid), 10)
                lost.append(time.perf_counter() - answered)
                applied = node.faults.applied if node.faults is not None else 0
                with faults.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"event": "reset", "gpu": index}) + "\n")
                await _applied(node.faults, applied)
                await _recover(kubelet, health, uuid, health_config.recovery_quiet_s)

            reregister: list[float] = []
            for _ in range(args.restarts):
                before = len(kubelet.registrations)
                await kubelet.restart()
                t0 = time.perf_counter()
                await kubelet.wait_for(_registered_after(kubelet, before), 10)
                reregister.append(kubelet.registrations[-1].at - t0)
                await kubelet.wait_for(lambda: len(kubelet.devices.get(GPU, {})) == len(uuids), 10)
        finally:
            stop.set()
            await task
            await kubelet.stop()
            sim.shutdown()
            node.close()
    return {
        "allocate": allocate,
        "preferred_grpc": preferred,
        "propagation": propagation,
        "lost": lost,
        "reregister": reregister,
    }


def _lost_answer(sim: NvmlBackend, index: int) -> float:
    """In a worker thread: read the GPU as the metrics refresh does; when its answer is GPU_IS_LOST."""
    try:
        sim.sample(index)
    except NVMLError as exc:
        if exc.value in LOST_CODES:
            return time.perf_counter()
        raise
    raise RuntimeError(f"GPU {index} still answers; the gpu_lost_silent line did not apply")


async def _applied(follower: FaultFollower | None, before: int) -> None:
    """Until the fault follower has applied a line more than ``before``."""
    if follower is None:
        raise RuntimeError("the simulated node follows no fault file")
    async with asyncio.timeout(10):
        while follower.applied <= before:
            await asyncio.sleep(0.005)


async def _recover(kubelet: FakeKubelet, health: HealthMonitor, uuid: str, quiet_s: float) -> None:
    """Probe until the device is Healthy again in ListAndWatch (the quiet period in between)."""
    async with asyncio.timeout(10):
        while kubelet.devices.get(GPU, {}).get(uuid) != "Healthy":
            await health.probe_once()
            await asyncio.sleep(quiet_s / 2)


def _healthy(kubelet: FakeKubelet, uuid: str) -> Callable[[], bool]:
    return lambda: kubelet.devices.get(GPU, {}).get(uuid) == "Healthy"


def _unhealthy(kubelet: FakeKubelet, uuid: str) -> Callable[[], bool]:
    return lambda: kubelet.devices.get(GPU, {}).get(uuid) == "Unhealthy"


def _registered_after(kubelet: FakeKubelet, count: int) -> Callable[[], bool]:
    return lambda: len(kubelet.registrations) > count


def _random_topology(rng: random.Random, n: int) -> Topology:
    names = [f"GPU-{i:02d}" for i in range(n)]
    pairs = list(itertools.combinations(names, 2))
    levels = [LinkLevel.PIX, LinkLevel.PXB, LinkLevel.PHB, LinkLevel.NODE, LinkLevel.SYS]
    return Topology.build(
        names,
        nvlinks={p: rng.choice([0, 0, 1, 2, 4, 12, 18]) for p in pairs},
        pcie={p: rng.choice(levels) for p in pairs},
        numa={g: rng.choice([0, 1]) for g in names},
    )


def _pure_figures(count: int) -> tuple[list[float], list[float], int, int, dict[str, float]]:
    """Pure-function latency on 8-GPU machines and optimality against brute force."""
    rng = random.Random(11)
    topologies: list[Topology] = []
    for profile in ("dgx-h100", "dgx1-v100", "pcie-l40s", "dgx-a100-mig"):
        with open_simulated_node(profile) as node:
            node.nvml.init()
            topologies.append(topology_from_inventory(node.discover()))
            node.nvml.shutdown()
    topologies += [_random_topology(rng, 8) for _ in range(20)]
    latencies: list[float] = []
    cpu: list[float] = []
    optimal = total = 0
    for i in range(count):
        topo = topologies[i % len(topologies)]
        avail = rng.sample(list(topo.gpus), rng.randint(1, len(topo.gpus)))
        must = rng.sample(avail, rng.randint(0, min(2, len(avail))))
        size = rng.randint(len(must) or 1, len(avail))
        candidates = {g: Candidate(id=g, gpu=g, kind=DeviceKind.GPU) for g in topo.gpus}
        t0, c0 = time.perf_counter(), time.thread_time()
        got = preferred_allocation(
            candidates=candidates, topology=topo, available=avail, must_include=must, size=size
        )
        latencies.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        best = brute_force_best(topo, available=avail, must_include=must, size=size)
        total += 1
        optimal += int(topo.score(got).as_tuple() == topo.score(best).as_tuple())
    sixteen: dict[str, float] = {}
    for size in (4, 8, 12):
        topo16 = _random_topology(rng, 16)
        t0 = time.perf_counter()
        got16 = preferred_allocation(
            candidates={g: Candidate(id=g, gpu=g, kind=DeviceKind.GPU) for g in topo16.gpus},
            topology=topo16,
            available=list(topo16.gpus),
            must_include=[],
            size=size,
        )
        sixteen[f"16 GPUs, size {size}"] = (time.perf_counter() - t0) * 1000
        best16 = brute_force_best(topo16, available=topo16.gpus, size=size)
        total += 1
        optimal += int(topo16.score(got16).as_tuple() == topo16.score(best16).as_tuple())
    return latencies, cpu, optimal, total, sixteen


def main(argv: list[str]) -> int:
    if any(a == "--peer" or a.startswith("--peer=") for a in argv):
        from agent.benchmarks.peer import main as peer_main  # noqa: PLC0415 - the peer comparison only

        return peer_main(argv)
    parser = argparse.ArgumentParser(
        prog="gpu-node-agent bench deviceplugin", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--profile", default="dgx-h100", help="simulated machine (default dgx-h100)")
    parser.add_argument("--allocations", type=int, default=1000, help="Allocate calls (default 1000)")
    parser.add_argument(
        "--preferred", type=int, default=1000, help="GetPreferredAllocation calls (default 1000)"
    )
    parser.add_argument("--faults", type=int, default=100, help="faults injected (default 100)")
    parser.add_argument(
        "--lost", type=int, default=100, help="GPUs lost without an event, one at a time (default 100)"
    )
    parser.add_argument("--restarts", type=int, default=20, help="kubelet restarts (default 20)")
    parser.add_argument("--optimality", type=int, default=2000, help="pure-function requests (default 2000)")
    parser.add_argument(
        "--dra",
        action="store_true",
        help="also the DRA driver in the same run: prepare/unprepare, slice publish after a health "
        "change, RSS",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    for name in ("allocations", "preferred", "faults", "lost", "restarts", "optimality"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")

    logs.configure("text", "error")
    load = os.getloadavg()
    if not args.json:
        print(machine_summary())
        print(
            f"profile: {args.profile}; one process, kubelet stand-in on the same event loop; "
            f"load average {load[0]:.1f} at start"
        )
    figures = asyncio.run(_runtime_figures(args))
    gc.collect()  # start the pure measurements without the gRPC phase's garbage
    pure, pure_cpu, optimal, total, sixteen = _pure_figures(args.optimality)
    dra = None
    if args.dra:  # agent.benchmarks.dra: the DRA driver on the same machine, in the same run
        dra = asyncio.run(dra_figures(profile=args.profile, claims=args.allocations, faults=args.faults))
    if args.json:
        out = {
            "machine": machine_summary(),
            "profile": args.profile,
            "load_average": load[0],
            "deviceplugin": {k: summary(v) for k, v in {**figures, "preferred_pure": pure}.items()},
            "optimality": {"optimal": optimal, "total": total},
            "dra": None
            if dra is None
            else {k: summary(v) if isinstance(v, list) else v for k, v in dra.items()},
        }
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0

    def line(label: str, values: list[float], aim: float | None = None) -> None:
        verdict = ""
        if aim is not None:
            p99 = percentile([v * 1000 for v in values], 99)
            verdict = f"  [aim p99 < {aim:g} ms: {'met' if p99 < aim else 'MISSED'}]"
        print(f"{label:<44} {describe_ms(values)}{verdict}")

    line("Allocate (gRPC, unix socket)", figures["allocate"])
    line("GetPreferredAllocation (gRPC, 8 GPUs)", figures["preferred_grpc"], 2)
    line("preferred allocation (pure, 8 GPUs)", pure, 2)
    line("  same, CPU time of the call", pure_cpu, 2)
    line("fault -> kubelet sees Unhealthy", figures["propagation"], 200)
    line("lost, no event: answer -> kubelet Unhealthy", figures["lost"], 2000)
    line("kubelet restart -> registered again", figures["reregister"], 1000)
    for label, ms in sixteen.items():
        print(f"{'preferred allocation (pure, ' + label + ')':<44} {ms:.3f} ms")
    print(f"{'optimality vs brute force':<44} {optimal}/{total} = {100 * optimal / total:.1f}%")
    if dra is not None:
        print_dra(dra, line)
    return 0
