"""``gpu-node-agent bench deviceplugin --peer nvidia``: our device plugin and NVIDIA's, in one run (issue 30).

Both serve the same machine (a simulator profile exported to the C NVML stand-in: :mod:`agent.peer`) to
the same kubelet harness (:class:`agent.fakekubelet.FakeKubelet`, one per plugin on a folder of its own),
one after the other so that neither is measured under the other's load. Ours is ``gpu-node-agent run`` on
its real NVML path over the stand-in (a GPU probed every ``--our-probe-s``, default 0.5 s, and a quiet
period of 0.05 s instead of the defaults 5 s and 120 s, so that the recovery steps are short); NVIDIA's
is ``nvidia-device-plugin``, unmodified, in a mount namespace of its own (root). Measured for each:

- registration: from the process's start (fork and exec included: ours' interpreter start and imports,
  NVIDIA's binary loading) until ``Register`` arrives at the kubelet harness, and until every GPU is
  listed; beside it the CPU time the process had used when ``Register`` arrived (in clock ticks, 10 ms),
  which a machine busy with other work stretches far less than the wall time; ours' packages are
  compiled to bytecode first (:func:`compile_bytecode`), as the image ships them;
- RSS (VmRSS of the process group) and CPU (user + system time of the group over wall time) at idle, and
  during a fault storm (Xid 13, ignored by both, at ``--storm-rate`` events a second for ``--storm-s``;
  then an Xid 94 whose arrival at the kubelet shows the storm consumed);
- ``Allocate`` and ``GetPreferredAllocation`` over gRPC, the same requests to both; each preferred answer
  is scored by the NVLinks among the GPUs it chose, against the brute-force maximum for that request;
- kubelet restart (every socket removed, a new kubelet.sock) until ``Register`` arrives again;
- fault to kubelet ``Unhealthy``: an Xid 94 (neither ignores it) on a GPU the kubelet holds Healthy,
  from appending the control line until ListAndWatch delivers the device Unhealthy. NVIDIA's plugin never
  returns a device, so it is restarted (a fresh stand-in state) when the next GPU is still Unhealthy;
- recovery: Xid 79 on one GPU, two of ours' probe intervals later a reset of it; whether (and when,
  from the reset) the kubelet sees it Healthy again within ``--recovery-wait-s``.

Aims (printed met/MISSED): ours at least as fast as NVIDIA's on every latency (p50 and p99), optimal on
every preferred allocation, RSS within 2x of the Go program's. Exit 2 with one line when NVIDIA's plugin is
not built, the stand-in cannot be built, or the run lacks root or ``unshare``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agent import localcluster as cluster
from agent import peer
from agent.benchmarks import floorplugin
from agent.benchmarks.machine import machine_summary, percentile
from agent.fakekubelet import FakeKubelet
from agent.simnode import open_simulated_node
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc
from deviceplugin.preferred import Topology, topology_from_inventory

GPU = "nvidia.com/gpu"
SOCKET = "nvidia-gpu.sock"
START_TIMEOUT_S = 60.0
STEP_TIMEOUT_S = 30.0
RSS_AIM_RATIO = 2.0
SIDES = ("ours", "nvidia")
LABELS = {"ours": "ours", "nvidia": "NVIDIA's"}


# ------------------------------------------------------------------------------------ process figures


def group_cpu_s(pid: int, *, proc_root: Path = Path("/proc")) -> float:
    """User + system CPU seconds of every process in the process group ``pid`` leads."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 12 and int(fields[2]) == pid:  # after "(comm)": state ppid pgrp ... utime stime
            total += int(fields[11]) + int(fields[12])
    return total / ticks


async def _usage(pid: int, seconds: float) -> tuple[int, float]:
    """(peak RSS bytes, CPU ratio) of the group over ``seconds`` of waiting."""
    c0, w0 = group_cpu_s(pid), time.perf_counter()
    peak = cluster.group_rss_bytes(pid)
    deadline = w0 + seconds
    while time.perf_counter() < deadline:
        await asyncio.sleep(min(0.25, max(0.0, deadline - time.perf_counter())))
        peak = max(peak, cluster.group_rss_bytes(pid))
    return peak, (group_cpu_s(pid) - c0) / (time.perf_counter() - w0)


# ------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class PreferredRequest:
    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int

    def message(self) -> pb.PreferredAllocationRequest:
        return pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(self.available),
                    must_include_deviceIDs=list(self.must_include),
                    allocation_size=self.size,
                )
            ]
        )


def preferred_requests(gpus: Sequence[str], count: int, seed: int = 7) -> list[PreferredRequest]:
    """Random availability, must-include (0 or 1 GPU) and size, the same for both plugins."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        available = rng.sample(list(gpus), rng.randint(2, len(gpus)))
        must = tuple(rng.sample(available, rng.randint(0, 1)))
        size = rng.randint(max(2, len(must)), len(available))
        out.append(PreferredRequest(tuple(available), must, size))
    return out


def nvlinks(topology: Topology, gpus: Sequence[str]) -> int:
    return topology.score(gpus).nvlinks


def best_nvlinks(topology: Topology, request: PreferredRequest) -> int:
    """The most NVLinks any valid answer to ``request`` holds (every combination tried)."""
    must = list(request.must_include)
    pool = [g for g in request.available if g not in must]
    return max(
        nvlinks(topology, must + list(rest))
        for rest in itertools.combinations(pool, request.size - len(must))
    )


def _timed_calls(socket: Path, requests: Sequence[Any], method: str) -> tuple[list[float], list[Any]]:
    """Blocking gRPC calls from this (worker) thread: seconds per call, and the replies."""
    times: list[float] = []
    replies: list[Any] = []
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        call = getattr(pb_grpc.DevicePluginStub(channel), method)
        call(requests[0], timeout=10)  # connect and warm up
        for request in requests:
            t0 = time.perf_counter()
            replies.append(call(request, timeout=10))
            times.append(time.perf_counter() - t0)
    return times, replies


# ------------------------------------------------------------------------------------------ one side


@dataclass
class Side:
    """One plugin under measurement: how it starts, and what it does with a device it marked."""

    name: str  # "ours" | "nvidia"
    argv: Callable[[Path], list[str]]  # the kubelet folder -> the command line
    stand_in: peer.StandIn
    work: Path
    process: cluster.ManagedProcess | None = None
    control: Path | None = None
    plugin_restarts: int = 0
    marked: set[str] = field(default_factory=set)  # devices NVIDIA's plugin holds Unhealthy for good
    sent_again: int = 0  # fault lines appended again because the first was not delivered

    def launch(self, directory: Path) -> cluster.ManagedProcess:
        self.control = self.stand_in.control(self.name)
        log = self.work / f"{self.name}.log"
        self.process = cluster.ManagedProcess(
            self.name, self.argv(directory), log, self.stand_in.env(self.control)
        ).start()
        return self.process

    def fault(self, event: dict[str, Any]) -> None:
        assert self.control is not None
        self.stand_in.fault(event, to=[self.control])

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


def _health(kubelet: FakeKubelet, uuid: str) -> str | None:
    return kubelet.devices.get(GPU, {}).get(uuid)


def _registered_after(kubelet: FakeKubelet, count: int) -> Callable[[], bool]:
    return lambda: len(kubelet.registrations) > count


def _summary(values_s: Sequence[float]) -> dict[str, float | int]:
    ms = [v * 1000 for v in values_s]
    return {"p50_ms": statistics.median(ms), "p99_ms": percentile(ms, 99), "n": len(ms)}


async def _measure(
    side: Side, args: argparse.Namespace, uuids: list[str], topology: Topology
) -> dict[str, Any]:
    directory = side.work / side.name
    directory.mkdir()
    kubelet = FakeKubelet(directory)
    await kubelet.start()

    def all_healthy() -> bool:
        listed = kubelet.devices.get(GPU, {})
        return len(listed) == len(uuids) and all(h == "Healthy" for h in listed.values())

    async def started() -> None:
        before = len(kubelet.registrations)
        proc = side.launch(directory)
        async with asyncio.timeout(START_TIMEOUT_S):
            while not (len(kubelet.registrations) > before and all_healthy()):
                if not proc.alive():
                    raise RuntimeError(f"{side.name} exited:\n{proc.log_tail()}")
                try:
                    await kubelet.wait_for(lambda: len(kubelet.registrations) > before and all_healthy(), 0.5)
                except TimeoutError:
                    continue

    async def healthy_again(uuid: str) -> None:
        """The GPU Healthy in ListAndWatch: ours returns it by itself; NVIDIA's plugin is restarted."""
        if side.name == "nvidia" and (uuid in side.marked or _health(kubelet, uuid) != "Healthy"):
            side.stop()
            side.plugin_restarts += 1
            side.marked.clear()
            await started()
        await kubelet.wait_for(lambda: _health(kubelet, uuid) == "Healthy", STEP_TIMEOUT_S)

    async def unhealthy_after(
        event: dict[str, Any], uuid: str, *, resend_s: float | None = 1.0, from_first: bool = False
    ) -> float:
        """From appending ``event`` until ListAndWatch delivers ``uuid`` Unhealthy. The event is appended
        again every ``resend_s`` until then: after a storm the driver's event queue (256 deep in the
        stand-in, as in NVML) may be full, and a plugin just started may not have registered for events
        yet; both drop it. The time counts from the last append, or with ``from_first`` from the first."""
        seen: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        def on_list(resource: str, devices: dict[str, str]) -> None:
            if resource == GPU and devices.get(uuid) == "Unhealthy" and not seen.done():
                seen.set_result(time.perf_counter())

        kubelet.listeners.append(on_list)
        try:
            t0 = time.perf_counter()
            async with asyncio.timeout(STEP_TIMEOUT_S):
                while True:
                    sent = time.perf_counter()
                    side.fault(event)
                    side.sent_again += 1
                    try:
                        t1 = await asyncio.wait_for(asyncio.shield(seen), resend_s)
                        break
                    except TimeoutError:
                        continue
        finally:
            kubelet.listeners.remove(on_list)
            side.sent_again -= 1
        if side.name == "nvidia":
            side.marked.update(u for u, h in kubelet.devices.get(GPU, {}).items() if h != "Healthy")
        return t1 - (t0 if from_first else sent)

    out: dict[str, Any] = {}
    cpu_at_register: list[float] = []

    def first_registration(_: object) -> None:
        if not cpu_at_register and side.process is not None:
            cpu_at_register.append(group_cpu_s(side.process.pid))

    kubelet.on_register.append(first_registration)
    try:
        t0 = time.perf_counter()
        await started()
        assert side.process is not None
        out["registration_ms"] = (kubelet.registrations[0].at - t0) * 1000
        # the CPU it used until then: what a loaded machine's scheduling does not stretch (clock ticks)
        out["registration_cpu_ms"] = cpu_at_register[0] * 1000 if cpu_at_register else None
        kubelet.on_register.remove(first_registration)
        out["listed_ms"] = (time.perf_counter() - t0) * 1000
        rss, cpu = await _usage(side.process.pid, args.idle_s)
        out["idle"] = {"rss_bytes": rss, "cpu_ratio": cpu}

        socket = directory / SOCKET
        rng = random.Random(11)
        allocs = [
            pb.AllocateRequest(
                container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=rng.sample(uuids, rng.randint(1, 8)))
                ]
            )
            for _ in range(args.allocations)
        ]
        times, _ = await asyncio.to_thread(_timed_calls, socket, allocs, "Allocate")
        out["allocate"] = _summary(times)

        requests = preferred_requests(uuids, args.preferred)
        times, replies = await asyncio.to_thread(
            _timed_calls, socket, [r.message() for r in requests], "GetPreferredAllocation"
        )
        optimal = 0
        invalid = 0
        for request, reply in zip(requests, replies, strict=True):
            chosen = list(reply.container_responses[0].deviceIDs)
            valid = (
                len(set(chosen)) == request.size
                and set(chosen) <= set(request.available)
                and set(request.must_include) <= set(chosen)
            )
            invalid += int(not valid)
            optimal += int(valid and nvlinks(topology, chosen) == best_nvlinks(topology, request))
        out["preferred"] = {**_summary(times), "optimal": optimal, "invalid": invalid, "total": len(requests)}

        reregister: list[float] = []
        for _ in range(args.restarts):
            before = len(kubelet.registrations)
            await kubelet.restart()
            t1 = time.perf_counter()
            await kubelet.wait_for(_registered_after(kubelet, before), STEP_TIMEOUT_S)
            reregister.append(kubelet.registrations[-1].at - t1)
            await kubelet.wait_for(all_healthy, STEP_TIMEOUT_S)
        out["reregister"] = _summary(reregister)

        # a storm of ignored Xids, then one both act on: its arrival shows the storm consumed
        line_every_s = 0.05
        per_tick = max(1, round(args.storm_rate * line_every_s))
        c0, w0 = group_cpu_s(side.process.pid), time.perf_counter()
        peak = cluster.group_rss_bytes(side.process.pid)
        sent = 0
        while time.perf_counter() - w0 < args.storm_s:
            for _ in range(per_tick):
                side.fault({"event": "xid", "gpu": sent % len(uuids), "xid": 13})
                sent += 1
            await asyncio.sleep(line_every_s)
            peak = max(peak, cluster.group_rss_bytes(side.process.pid))
        resent = side.sent_again
        after = await unhealthy_after({"event": "xid", "gpu": 0, "xid": 94}, uuids[0], from_first=True)
        cpu_storm = (group_cpu_s(side.process.pid) - c0) / (time.perf_counter() - w0)
        out["storm"] = {
            "events": sent,
            "seconds": args.storm_s,
            "rss_bytes_peak": peak,
            "cpu_ratio": cpu_storm,
            "marker_after_storm_ms": after * 1000,
            "marker_resent": side.sent_again - resent,
        }

        resent = side.sent_again
        propagation: list[float] = []
        for i in range(args.faults):
            index = (i + 1) % len(uuids)
            await healthy_again(uuids[index])
            propagation.append(await unhealthy_after({"event": "xid", "gpu": index, "xid": 94}, uuids[index]))
        out["fault_unhealthy"] = {**_summary(propagation), "resent": side.sent_again - resent}

        index = 1
        await healthy_again(uuids[index])
        await unhealthy_after({"event": "xid", "gpu": index, "xid": 79}, uuids[index])
        # a reset takes the operator longer than two probes: ours returns a GPU on evidence of one (a probe
        # saw it lost, a later one sees it answer), so the reset comes after two of its probe intervals
        await asyncio.sleep(2 * args.our_probe_s)
        t2 = time.perf_counter()
        side.fault({"event": "reset", "gpu": index})
        try:
            await kubelet.wait_for(lambda: _health(kubelet, uuids[index]) == "Healthy", args.recovery_wait_s)
            out["recovery_ms"] = (time.perf_counter() - t2) * 1000
        except TimeoutError:
            out["recovery_ms"] = None
        out["healthy_after_xid79_reset"] = sum(h == "Healthy" for h in kubelet.devices.get(GPU, {}).values())
        out["plugin_restarts"] = side.plugin_restarts
    except TimeoutError:
        tail = side.process.log_tail(20) if side.process is not None else "(not running)"
        raise RuntimeError(f"{side.name}: a step timed out; figures so far {out}; its log:\n{tail}") from None
    finally:
        side.stop()
        await kubelet.stop()
    return out


async def _measure_floor(work: Path, args: argparse.Namespace, uuids: list[str]) -> dict[str, Any]:
    """The least a Python plugin can be (``agent.benchmarks.floorplugin``), measured as the sides are:
    process start -> ``Register``, RSS and CPU at idle, ``Allocate``."""
    directory = work / "floor"
    directory.mkdir()
    kubelet = FakeKubelet(directory)
    await kubelet.start()
    argv = [sys.executable, "-m", "agent.benchmarks.floorplugin", str(directory), GPU, *uuids]
    process = cluster.ManagedProcess("floor", argv, work / "floor.log", dict(os.environ))
    cpu_at_register: list[float] = []

    def first_registration(_: object) -> None:
        if not cpu_at_register:
            cpu_at_register.append(group_cpu_s(process.pid))

    kubelet.on_register.append(first_registration)
    out: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        process.start()
        await kubelet.wait_for(lambda: len(kubelet.devices.get(GPU, {})) == len(uuids), START_TIMEOUT_S)
        out["registration_ms"] = (kubelet.registrations[0].at - t0) * 1000
        out["registration_cpu_ms"] = cpu_at_register[0] * 1000 if cpu_at_register else None
        rss, cpu = await _usage(process.pid, args.idle_s)
        out["idle"] = {"rss_bytes": rss, "cpu_ratio": cpu}
        rng = random.Random(11)
        allocs = [
            pb.AllocateRequest(
                container_requests=[
                    pb.ContainerAllocateRequest(
                        devices_ids=rng.sample(uuids, rng.randint(1, min(8, len(uuids))))
                    )
                ]
            )
            for _ in range(args.allocations)
        ]
        times, _ = await asyncio.to_thread(_timed_calls, directory / floorplugin.ENDPOINT, allocs, "Allocate")
        out["allocate"] = _summary(times)
    except TimeoutError:
        raise RuntimeError(f"the floor plugin did not register; its log:\n{process.log_tail(20)}") from None
    finally:
        process.stop()
        await kubelet.stop()
    return out


def floor_rows(figures: dict[str, dict[str, Any]]) -> list[Row]:
    """The floor beside ours: what of each figure is the runtime's (the floor's) and what is ours."""
    ours, floor = figures["ours"], figures["floor"]
    return [
        Row("registration (start -> Register)", _ms(ours["registration_ms"]), _ms(floor["registration_ms"])),
        Row(
            "  CPU used until Register",
            _ms(ours.get("registration_cpu_ms")),
            _ms(floor.get("registration_cpu_ms")),
        ),
        Row("Allocate p50", _ms(ours["allocate"]["p50_ms"]), _ms(floor["allocate"]["p50_ms"])),
        Row("Allocate p99", _ms(ours["allocate"]["p99_ms"]), _ms(floor["allocate"]["p99_ms"])),
        Row("RSS at idle", _mib(ours["idle"]["rss_bytes"]), _mib(floor["idle"]["rss_bytes"])),
    ]


# --------------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Row:
    label: str
    ours: str
    theirs: str
    verdict: str = ""


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _mib(value: int) -> str:
    return f"{value / 2**20:.1f} MiB"


def verdicts(figures: dict[str, dict[str, Any]]) -> tuple[list[Row], dict[str, bool]]:
    """The side-by-side rows and each aim's verdict."""
    ours, theirs = figures["ours"], figures["nvidia"]
    rows: list[Row] = []
    aims: dict[str, bool] = {}

    def latency(label: str, a: float | None, b: float | None, key: str) -> None:
        met = a is not None and (b is None or a <= b)
        aims[key] = met
        rows.append(Row(label, _ms(a), _ms(b), "met" if met else "MISSED"))

    latency(
        "registration (start -> Register)", ours["registration_ms"], theirs["registration_ms"], "registration"
    )
    rows.append(
        Row(
            "  CPU used until Register",
            _ms(ours.get("registration_cpu_ms")),
            _ms(theirs.get("registration_cpu_ms")),
        )
    )
    for name, label in (
        ("fault_unhealthy", "fault -> kubelet Unhealthy"),
        ("reregister", "kubelet restart -> registered"),
        ("preferred", "GetPreferredAllocation"),
        ("allocate", "Allocate"),
    ):
        for pct in ("p50", "p99"):
            latency(f"{label} {pct}", ours[name][f"{pct}_ms"], theirs[name][f"{pct}_ms"], f"{name}_{pct}")
    latency(
        "storm, then Xid 94 -> Unhealthy",
        ours["storm"]["marker_after_storm_ms"],
        theirs["storm"]["marker_after_storm_ms"],
        "after_storm",
    )
    rows.append(
        Row(
            "  fault lines appended again (not yet watching)",
            str(ours["fault_unhealthy"].get("resent", 0)),
            str(theirs["fault_unhealthy"].get("resent", 0)),
        )
    )
    rows.append(
        Row(
            "  Xid 94 appended again (queue full)",
            str(ours["storm"]["marker_resent"]),
            str(theirs["storm"]["marker_resent"]),
        )
    )
    aims["preferred_optimal_ours"] = ours["preferred"]["optimal"] == ours["preferred"]["total"]
    rows.append(
        Row(
            "preferred: NVLink-optimal answers",
            f"{ours['preferred']['optimal']}/{ours['preferred']['total']}",
            f"{theirs['preferred']['optimal']}/{theirs['preferred']['total']}",
            "met" if aims["preferred_optimal_ours"] else "MISSED",
        )
    )
    rss_met = ours["idle"]["rss_bytes"] <= RSS_AIM_RATIO * theirs["idle"]["rss_bytes"]
    aims["rss"] = rss_met
    rows.append(
        Row(
            "RSS at idle",
            _mib(ours["idle"]["rss_bytes"]),
            _mib(theirs["idle"]["rss_bytes"]),
            f"{'met' if rss_met else 'MISSED'} (aim <= {RSS_AIM_RATIO:g}x)",
        )
    )
    rows.append(
        Row(
            "RSS peak in the storm",
            _mib(ours["storm"]["rss_bytes_peak"]),
            _mib(theirs["storm"]["rss_bytes_peak"]),
        )
    )
    rows.append(
        Row(
            "CPU at idle",
            f"{100 * ours['idle']['cpu_ratio']:.1f}%",
            f"{100 * theirs['idle']['cpu_ratio']:.1f}%",
        )
    )
    rows.append(
        Row(
            f"CPU in the storm ({ours['storm']['events']} / {theirs['storm']['events']} Xid 13)",
            f"{100 * ours['storm']['cpu_ratio']:.1f}%",
            f"{100 * theirs['storm']['cpu_ratio']:.1f}%",
        )
    )
    recovered = ours["recovery_ms"] is not None
    aims["recovery"] = recovered
    rows.append(
        Row(
            "Xid 79, reset -> Healthy again",
            _ms(ours["recovery_ms"]) if recovered else "never",
            _ms(theirs["recovery_ms"]) if theirs["recovery_ms"] is not None else "never",
            "met" if recovered else "MISSED",
        )
    )
    rows.append(
        Row(
            "GPUs Healthy after that",
            str(ours["healthy_after_xid79_reset"]),
            str(theirs["healthy_after_xid79_reset"]),
        )
    )
    rows.append(
        Row("plugin restarts the run needed", str(ours["plugin_restarts"]), str(theirs["plugin_restarts"]))
    )
    return rows, aims


def render(rows: Sequence[Row], header: Row = Row("", "ours", "NVIDIA's", "aim")) -> str:
    table = [header, *rows]
    widths = [max(len(getattr(r, f)) for r in table) for f in ("label", "ours", "theirs", "verdict")]
    lines = []
    for r in table:
        cells = (r.label, r.ours, r.theirs, r.verdict)
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ).rstrip()
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main


def compile_bytecode(packages: Sequence[str] = ("agent", "deviceplugin", "topology")) -> bool:
    """Compile ours' bytecode before it starts, as the image ships it (``daemonset/Dockerfile``), so the
    registration time is a deployed agent's and not that of compiling every module (an editable or
    source install run with ``PYTHONDONTWRITEBYTECODE`` compiles at each start). False where a package's
    folder cannot be written: then ours starts as it would from there."""
    import compileall  # noqa: PLC0415 - the bench alone needs it
    import importlib  # noqa: PLC0415

    done = True
    for name in packages:
        folder = Path(importlib.import_module(name).__file__ or "").parent
        done = compileall.compile_dir(folder, quiet=2) and done
    return bool(done)


def _unavailable(why: str) -> int:
    print(f"bench deviceplugin --peer nvidia: {why}")
    return 2


async def _run(args: argparse.Namespace, binary: Path, library: Path, work: Path) -> dict[str, Any]:
    stand_in = peer.StandIn(args.profile, library_dir=library, directory=work / "machine")
    with open_simulated_node(args.profile) as node:
        node.nvml.init()
        inventory = node.discover()
        node.nvml.shutdown()
    uuids = [g.uuid for g in sorted(inventory.gpus, key=lambda g: g.index)]
    topology = topology_from_inventory(inventory)
    config = peer.plugin_config()
    ours_config = peer.write_config(
        work / "ours.json", peer.our_config(config, probe_interval_s=args.our_probe_s, recovery_quiet_s=0.05)
    )
    theirs_config = peer.write_config(work / "nvidia.json", config)
    sides = {
        "ours": Side(
            "ours",
            lambda d: peer.our_agent_argv(
                stand_in=stand_in,
                node_name="bench",
                plugin_dir=d,
                config_file=ours_config,
                pod_resources_socket=work / "no-pod-resources.sock",
                metrics_addr="",
            ),
            stand_in,
            work,
        ),
        "nvidia": Side(
            "nvidia",
            lambda d: peer.nvidia_plugin_argv(
                binary, stand_in=stand_in, plugin_dir=d, config_file=theirs_config
            ),
            stand_in,
            work,
        ),
    }
    figures = {name: await _measure(sides[name], args, uuids, topology) for name in SIDES}
    if args.floor:
        figures["floor"] = await _measure_floor(work, args, uuids)
    return figures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu-node-agent bench deviceplugin --peer nvidia", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--peer", choices=["nvidia"], required=True, help="the peer plugin (NVIDIA's)")
    parser.add_argument("--profile", default="dgx1-v100", help="simulated machine (default dgx1-v100)")
    parser.add_argument("--allocations", type=int, default=500, help="Allocate calls (default 500)")
    parser.add_argument(
        "--preferred", type=int, default=500, help="GetPreferredAllocation calls (default 500)"
    )
    parser.add_argument("--faults", type=int, default=40, help="faults injected (default 40)")
    parser.add_argument("--restarts", type=int, default=10, help="kubelet restarts (default 10)")
    parser.add_argument("--idle-s", type=float, default=3.0, help="idle window for RSS and CPU (default 3)")
    parser.add_argument("--storm-s", type=float, default=3.0, help="fault storm length (default 3)")
    parser.add_argument("--storm-rate", type=int, default=1000, help="Xid events a second (default 1000)")
    parser.add_argument(
        "--recovery-wait-s", type=float, default=10.0, help="how long a reset GPU is awaited (default 10)"
    )
    parser.add_argument(
        "--our-probe-s",
        type=float,
        default=0.5,
        help="ours' health.probeIntervalSeconds (default 0.5; 5 in production): how soon a reset GPU returns",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also measure the least a Python plugin can be (agent.benchmarks.floorplugin: interpreter, "
        "grpc and the stubs only): registration, Allocate and RSS beside ours",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = parser.parse_args(argv)
    for name in ("allocations", "preferred", "faults", "restarts", "storm_rate"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("idle_s", "storm_s", "recovery_wait_s", "our_probe_s"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")

    try:
        binary = cluster.locate_counterparts().binary(peer.PEER_PLUGIN)
    except cluster.MissingCounterpartError as exc:
        return _unavailable(f"NVIDIA's device plugin is not built ({exc})")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return _unavailable("NVIDIA's device plugin needs root and unshare (a mount namespace of its own)")
    with tempfile.TemporaryDirectory(prefix="dpp", dir="/tmp") as tmp:
        work = Path(tmp)
        try:
            library = peer.build_stand_in(work / "lib")
        except peer.StandInUnavailableError as exc:
            return _unavailable(str(exc))
        compiled = compile_bytecode()
        load = os.getloadavg()[0]
        figures = asyncio.run(_run(args, binary, library, work))
    rows, aims = verdicts(figures)
    if args.json:
        print(
            json.dumps(
                {
                    "machine": machine_summary(),
                    "profile": args.profile,
                    "load_average": load,
                    "ours_bytecode_compiled": compiled,
                    "figures": figures,
                    "aims": aims,
                },
                indent=1,
                sort_keys=True,
            )
        )
        return 0
    print(machine_summary())
    print(
        f"profile: {args.profile} on the C NVML stand-in; each plugin alone with its kubelet harness; "
        f"ours probes every {args.our_probe_s:g} s, quiet period 0.05 s, "
        f"{'from compiled bytecode (as the image)' if compiled else 'compiling its modules at start'}; "
        f"load average {load:.1f} at start; "
        f"NVIDIA's {binary}"
    )
    print(render(rows))
    print(
        f"aims met: {sum(aims.values())}/{len(aims)}"
        + "".join(f"; MISSED {k}" for k, v in aims.items() if not v)
    )
    if "floor" in figures:
        print("\nthe floor of a Python plugin (interpreter, grpc, the stubs; nothing else), same run:")
        print(render(floor_rows(figures), Row("", "ours", "floor")))
    return 0
