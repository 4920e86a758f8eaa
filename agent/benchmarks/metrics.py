"""``gpu-node-agent bench metrics``: scrape latency, RSS and CPU of the metrics exporter.

The exporter runs in its own process (what is measured), on a simulated node (``--profile``, default
``dgx-a100-mig``) with pod attribution on: a fake kubelet pod-resources server (real gRPC over a unix
socket, in this process) lists N pods, and every pod holds a device — first the MIG devices, one pod
each, then time-slicing replicas of the whole GPUs (each with one simulated process, mapped back to
its pod through a generated ``/proc/<pid>/cgroup`` and ``/var/log/pods`` tree, so the per-process
split of shared GPUs runs on every refresh).

For each pod count in ``--pods`` (default 10, 100, 1000) a fresh exporter is started and scraped over
one keep-alive HTTP connection: latency p50/p99 seen by the client, and the series count. Then, with
``--detail-pods`` pods (default 100):

- idle: ``--idle-seconds`` (default 300) with a scrape every 15 s (a Prometheus' pace) and the
  background refreshes; CPU (% of one core) and RSS of the exporter process. The exporter closes a
  connection idle for 15 s, so the scraper opens a new one when its kept-alive connection was closed
  (as Prometheus' client does) and says how many scrapes needed one;
- memory: RSS before and after ``--leak-scrapes`` back-to-back scrapes (default 10,000), sampled
  along the way.

The figures are printed with the machine they ran on; targets: p99 < 10 ms, RSS < 100 MiB, CPU < 2%.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil

from agent.benchmarks.machine import machine_summary, percentile
from agent.podresources.fake import FakeContainer, FakePod, FakePodResourcesServer

TARGET_P99_MS = 10.0
TARGET_RSS_MIB = 100.0
TARGET_CPU_PERCENT = 2.0
SCRAPE_EVERY_S = 15.0  # Prometheus' default scrape interval: the idle phase's pace
MIB = 1024 * 1024


# --------------------------------------------------------------------------- the node layout


def plan_node(profile: str, pods: int, root: Path, *, others: int = 0) -> dict[str, Any]:
    """Pods, devices and processes for ``pods`` attributed pods (and ``others`` pods holding only a
    non-GPU device); writes the /proc and pod-log trees."""
    from agent.discovery import discover  # noqa: PLC0415 - only the bench needs discovery here
    from agent.nvml.simulate import build_simulator  # noqa: PLC0415
    from topology.model import Host  # noqa: PLC0415

    sim = build_simulator(profile)
    sim.init()
    inv = discover(nvml=sim, sysfs_root=root / "sys", host=Host("bench-node", 1, 1))
    migs = list(inv.mig_devices())
    with_mig = {m.gpu_index for m in inv.mig if m.devices}
    whole = [g for g in inv.gpus if g.index not in with_mig]
    shared = max(0, pods - len(migs))
    replicas = math.ceil(shared / len(whole)) if whole and shared else 0
    proc, logs = root / "proc", root / "pods"
    proc.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    plan_pods: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    allocatable: dict[str, list[str]] = {}
    for i in range(pods):
        name = f"job-{i:04d}"
        if i < len(migs):
            dev = migs[i]
            plan_pods.append({"name": name, "resource": f"nvidia.com/mig-{dev.profile}", "device": dev.uuid})
            continue
        k = i - len(migs)
        gpu = whole[k % len(whole)]
        replica = k // len(whole)
        plan_pods.append({"name": name, "resource": "nvidia.com/gpu", "device": f"{gpu.uuid}::{replica}"})
        uid = f"{i:08x}-0000-4000-8000-{i:012x}"
        pid = 200_000 + i
        (proc / str(pid)).mkdir(exist_ok=True)
        (proc / str(pid) / "cgroup").write_text(f"0::/kubepods/burstable/pod{uid}/{i:064x}\n")
        (logs / f"bench_{name}_{uid}").mkdir(exist_ok=True)
        processes.append(
            {"gpu": gpu.index, "pid": pid, "memory": (1 + i % 4) * 1024 * MIB, "sm": 10 + i % 50}
        )
    for gpu in whole:
        allocatable["nvidia.com/gpu"] = allocatable.get("nvidia.com/gpu", []) + [
            f"{gpu.uuid}::{r}" for r in range(max(replicas, 1))
        ]
    return {
        "profile": profile,
        "pods": plan_pods,
        "processes": processes,
        "allocatable": allocatable,
        "others": others,
        "proc_root": str(proc),
        "pod_logs_root": str(logs),
    }


def fake_pods(plan: dict[str, Any]) -> list[FakePod]:
    gpu_pods = [
        FakePod("bench", p["name"], (FakeContainer("main", {p["resource"]: [p["device"]]}),))
        for p in plan["pods"]
    ]
    other_pods = [
        FakePod("web", f"web-{i:05d}", (FakeContainer("app", {"example.com/nic": [f"vf-{i}"]}),))
        for i in range(plan["others"])
    ]
    return gpu_pods + other_pods


# --------------------------------------------------------------------------- the exporter process


def serve(
    plan_path: Path,
    socket_path: str,
    port_file: Path,
    fmt: str,
    interval_s: float,
    *,
    idle_timeout_s: float | None = None,
) -> int:
    """The measured process: a simulated node's exporter until SIGTERM (its listener's idle timeout
    the agent's own unless ``idle_timeout_s`` is given)."""
    import signal  # noqa: PLC0415

    from agent.discovery import discover  # noqa: PLC0415
    from agent.metrics.exporter import MetricsExporter, MetricsSettings  # noqa: PLC0415
    from agent.metrics.server import Timeouts  # noqa: PLC0415
    from agent.nvml.simulate import build_simulator  # noqa: PLC0415
    from topology.model import Host  # noqa: PLC0415

    plan = json.loads(plan_path.read_text())
    sim = build_simulator(plan["profile"])
    sim.init()
    for p in plan["processes"]:
        sim.add_process(p["gpu"], p["pid"], used_memory_bytes=p["memory"], sm_percent=p["sm"])
    with tempfile.TemporaryDirectory(prefix="bench-sys-") as sysfs:
        inv = discover(nvml=sim, sysfs_root=Path(sysfs), host=Host("bench-node", 1, 1))
    exporter = MetricsExporter(
        settings=MetricsSettings(
            host="127.0.0.1",
            port=0,
            format=fmt,
            interval_s=interval_s,
            pod_resources_socket=socket_path,
            pod_resources_interval_s=interval_s,
            proc_root=plan["proc_root"],
            pod_logs_root=plan["pod_logs_root"],
        ),
        backend=sim,
        inventory=lambda: inv,
        hostname="bench-node",
        timeouts=Timeouts(idle_s=idle_timeout_s) if idle_timeout_s is not None else None,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        task = asyncio.create_task(exporter.run(stop))
        await asyncio.wait_for(exporter.serving.wait(), timeout=60)
        port_file.write_text(str(exporter.server.bound_port))
        await task

    asyncio.run(main())
    return 0


# --------------------------------------------------------------------------- the measuring side


# how a kept-alive connection that the exporter has closed fails the next request on it
_CLOSED_BY_PEER = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class Scraper:
    """A keep-alive HTTP connection to the exporter, opened again when the exporter has closed it.

    The exporter closes a connection idle for 15 s (``agent.metrics.server.Timeouts``), so a scrape
    every 15 s may find its connection gone. Like Prometheus' HTTP client, a request that fails that
    way on a connection that has served before is sent once more on a new connection
    (``reconnects`` counts them); a failure on a new connection is the exporter's and is raised.
    """

    def __init__(self, port: int) -> None:
        self._port = port
        self._conn = self._connect()
        self._served = False  # has this connection answered a request?
        self.reconnects = 0

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self._port, timeout=30)

    def get(self, path: str = "/metrics") -> tuple[int, bytes]:
        try:
            return self._get(path)
        except _CLOSED_BY_PEER:
            if not self._served:
                raise
        self._conn.close()
        self._conn = self._connect()
        self._served = False
        self.reconnects += 1
        return self._get(path)

    def _get(self, path: str) -> tuple[int, bytes]:
        self._conn.request("GET", path)
        resp = self._conn.getresponse()
        body = resp.read()
        self._served = True
        return resp.status, body

    def close(self) -> None:
        self._conn.close()


class Run:
    """A fake kubelet (in a loop thread of this process) and an exporter child process."""

    def __init__(
        self,
        *,
        profile: str,
        pods: int,
        fmt: str,
        interval_s: float,
        workdir: Path,
        others: int = 0,
        idle_timeout_s: float | None = None,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"pods{pods}-", dir=workdir))
        self.plan = plan_node(profile, pods, self.dir, others=others)
        (self.dir / "plan.json").write_text(json.dumps(self.plan))
        self.socket = str(self.dir / "pr.sock")
        self.fmt = fmt
        self.interval_s = interval_s
        self.idle_timeout_s = idle_timeout_s
        self.loop = asyncio.new_event_loop()
        self.kubelet = FakePodResourcesServer(
            self.socket, pods=fake_pods(self.plan), allocatable=self.plan["allocatable"]
        )
        self.child: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.port = 0

    def _thread(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def __enter__(self) -> Run:
        import threading  # noqa: PLC0415

        self._loop_thread = threading.Thread(target=self._thread, daemon=True)
        self._loop_thread.start()
        asyncio.run_coroutine_threadsafe(self.kubelet.start(), self.loop).result(30)
        port_file = self.dir / "port"
        self._log = (self.dir / "exporter.log").open("wb")
        self.child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent.benchmarks.metrics",
                "_serve",
                str(self.dir / "plan.json"),
                self.socket,
                str(port_file),
                self.fmt,
                str(self.interval_s),
                *([] if self.idle_timeout_s is None else [str(self.idle_timeout_s)]),
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        deadline = time.monotonic() + 120
        while not port_file.exists() or not port_file.read_text():
            if self.child.poll() is not None or time.monotonic() > deadline:
                log = (self.dir / "exporter.log").read_text()[-2000:]
                raise RuntimeError(f"exporter did not start: {log}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        return self

    @property
    def process(self) -> psutil.Process:
        assert self.child is not None
        return psutil.Process(self.child.pid)

    def __exit__(self, *exc: object) -> None:
        if self.child is not None:
            self.child.terminate()
            try:
                self.child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait(timeout=10)
        if self._log is not None:
            self._log.close()
        asyncio.run_coroutine_threadsafe(self.kubelet.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=30)
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_RENDER_SUM = re.compile(rb"\ngpuagent_metrics_scrape_duration_seconds_sum (\S+)")


def _render_sum(body: bytes) -> float:
    m = _RENDER_SUM.search(body)
    return float(m.group(1)) if m else math.nan


@dataclass(frozen=True, slots=True)
class Latency:
    client_s: list[float]  # request to last byte, seen by the scraper
    render_s: list[float]  # the exporter's own time to render each scrape (from its summary)
    cpu_ms_per_scrape: float  # exporter process CPU time per scrape
    series: int
    attributed: int


def _latency(run: Run, scrapes: int) -> Latency:
    scraper = Scraper(run.port)
    proc = run.process
    try:
        for _ in range(20):
            status, body = scraper.get()
            if status != 200:
                raise RuntimeError(f"/metrics answered {status}")
        lines = body.decode().splitlines()
        series = sum(1 for line in lines if line and not line.startswith("#"))
        attributed = sum(1 for line in lines if line.startswith("gpuagent_device_allocation_info{"))
        client: list[float] = []
        sums = [_render_sum(body)]
        cpu0 = sum(proc.cpu_times()[:2])
        for _ in range(scrapes + 1):
            start = time.perf_counter()
            _, body = scraper.get()
            client.append(time.perf_counter() - start)
            sums.append(_render_sum(body))
        cpu = (sum(proc.cpu_times()[:2]) - cpu0) * 1000 / (scrapes + 1)
        # a body reports the render time of the scrapes before it: consecutive differences give the
        # render time of each timed scrape
        render = [b - a for a, b in itertools.pairwise(sums[1:])]
        return Latency(client[:scrapes], render, cpu, series, attributed)
    finally:
        scraper.close()


def _ms(values: list[float], pct: float) -> float:
    return percentile(values, pct) * 1000


@dataclass(frozen=True, slots=True)
class Idle:
    cpu_percent: float  # of one core, over the idle period
    rss_mib: float  # at its end
    scrapes: int
    reconnects: int  # scrapes that found their kept-alive connection closed by the exporter


def _idle(
    run: Run,
    seconds: float,
    *,
    every_s: float = SCRAPE_EVERY_S,
    pause: Callable[[float], None] = time.sleep,
) -> Idle:
    """CPU and RSS of the exporter over ``seconds`` with a scrape every ``every_s`` (``pause`` waits
    between scrapes)."""
    proc = run.process
    scraper = Scraper(run.port)
    scrapes = 0
    try:
        scraper.get()
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        while time.monotonic() - t0 < seconds:
            status, _ = scraper.get()
            if status != 200:
                raise RuntimeError(f"/metrics answered {status}")
            scrapes += 1
            pause(min(every_s, max(0.0, seconds - (time.monotonic() - t0))))
        cpu = (sum(proc.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0) * 100
        return Idle(cpu, proc.memory_info().rss / MIB, scrapes, scraper.reconnects)
    finally:
        scraper.close()


def _memory(run: Run, scrapes: int) -> list[float]:
    """RSS MiB after up to 1000 warm-up scrapes, then five times along ``scrapes`` back-to-back ones."""
    proc = run.process
    scraper = Scraper(run.port)
    try:
        for _ in range(min(1000, scrapes)):
            scraper.get()
        marks = [proc.memory_info().rss / MIB]
        step = max(1, scrapes // 5)
        for i in range(1, scrapes + 1):
            scraper.get()
            if i % step == 0:
                marks.append(proc.memory_info().rss / MIB)
        return marks
    finally:
        scraper.close()


def main(argv: list[str]) -> int:
    if argv and argv[0] == "_serve":
        idle_timeout_s = float(argv[6]) if len(argv) > 6 else None
        return serve(
            Path(argv[1]), argv[2], Path(argv[3]), argv[4], float(argv[5]), idle_timeout_s=idle_timeout_s
        )
    parser = argparse.ArgumentParser(prog="gpu-node-agent bench metrics", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="dgx-a100-mig", help="simulated machine (default %(default)s)")
    parser.add_argument("--format", choices=("native", "dcgm"), default="native")
    parser.add_argument("--pods", default="10,100,1000", help="pod counts to compare (default %(default)s)")
    parser.add_argument(
        "--other-pods",
        default="0,1000,5000",
        help="pods without GPUs listed beside --detail-pods attributed ones (default %(default)s)",
    )
    parser.add_argument("--scrapes", type=int, default=500, help="timed scrapes per pod count")
    parser.add_argument("--detail-pods", type=int, default=100, help="pods for the idle and memory runs")
    parser.add_argument("--idle-seconds", type=float, default=300.0, help="idle period (default %(default)s)")
    parser.add_argument("--leak-scrapes", type=int, default=10_000, help="scrapes of the memory run")
    parser.add_argument("--interval", type=float, default=10.0, help="exporter refresh interval, seconds")
    args = parser.parse_args(argv)
    try:
        counts = [int(p) for p in args.pods.split(",") if p]
        others = [int(p) for p in args.other_pods.split(",") if p]
    except ValueError:
        print("bench metrics: --pods, --other-pods: expected comma-separated integers", file=sys.stderr)
        return 2
    if (
        args.scrapes < 1
        or args.idle_seconds < 0
        or args.leak_scrapes < 0
        or min(counts + others, default=0) < 0
    ):
        print("bench metrics: --scrapes must be >= 1; pod counts and durations >= 0", file=sys.stderr)
        return 2

    print(machine_summary())
    print("load average at start (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))
    print(f"profile {args.profile}, format {args.format}, refresh every {args.interval:g} s")
    workdir = Path(tempfile.mkdtemp(prefix="bench-metrics-", dir="/tmp"))
    verdicts: list[str] = []

    def run_for(pods: int, other: int = 0) -> Run:
        return Run(
            profile=args.profile,
            pods=pods,
            fmt=args.format,
            interval_s=args.interval,
            workdir=workdir,
            others=other,
        )

    def row(label: str, lat: Latency) -> None:
        cells = (
            label,
            lat.attributed,
            lat.series,
            f"{_ms(lat.client_s, 50):.2f}",
            f"{_ms(lat.client_s, 99):.2f}",
            f"{_ms(lat.render_s, 50):.2f}",
            f"{_ms(lat.render_s, 99):.2f}",
            f"{lat.cpu_ms_per_scrape:.2f}",
        )
        print("  " + " ".join(f"{c:>10}" for c in cells))

    try:
        print("\nscrape latency in ms (client: request to last byte over keep-alive HTTP; render: the")
        print("exporter's own time per scrape, from its summary; cpu: exporter CPU time per scrape)")
        head = ("pods", "attrib", "series", "client p50", "p99", "render p50", "p99", "cpu")
        print("  " + " ".join(f"{h:>10}" for h in head))
        for pods in counts:
            with run_for(pods) as run:
                lat = _latency(run, args.scrapes)
            row(str(pods), lat)
            if pods == args.detail_pods:
                r99 = _ms(lat.render_s, 99)
                verdicts.append(
                    f"render p99 {r99:.2f} ms {'<' if r99 < TARGET_P99_MS else '>='} {TARGET_P99_MS:g}"
                )
        if others:
            print(f"\n{args.detail_pods} attributed pods plus pods without GPUs (first column: pods listed)")
            print("  " + " ".join(f"{h:>10}" for h in head))
            for other in others:
                with run_for(args.detail_pods, other) as run:
                    lat = _latency(run, args.scrapes)
                row(str(args.detail_pods + other), lat)

        if args.idle_seconds > 0:
            with run_for(args.detail_pods) as run:
                idle = _idle(run, args.idle_seconds)
            cpu, rss = idle.cpu_percent, idle.rss_mib
            print(
                f"\nidle {args.idle_seconds:g} s, {args.detail_pods} pods, a scrape every "
                f"{SCRAPE_EVERY_S:g} s, refresh every {args.interval:g} s: CPU {cpu:.2f}% of one core, "
                f"RSS {rss:.1f} MiB ({idle.scrapes} scrapes, {idle.reconnects} on a new connection: the "
                f"exporter closes one idle for 15 s)"
            )
            verdicts.append(
                f"idle CPU {cpu:.2f}% {'<' if cpu < TARGET_CPU_PERCENT else '>='} {TARGET_CPU_PERCENT:g}%"
            )
            verdicts.append(f"RSS {rss:.1f} MiB {'<' if rss < TARGET_RSS_MIB else '>='} {TARGET_RSS_MIB:g}")
        if args.leak_scrapes > 0:
            with run_for(args.detail_pods) as run:
                marks = _memory(run, args.leak_scrapes)
            trail = " -> ".join(f"{m:.1f}" for m in marks)
            print(
                f"\nmemory over {args.leak_scrapes} back-to-back scrapes ({args.detail_pods} pods, after "
                f"{min(1000, args.leak_scrapes)} warm-up): RSS {trail} MiB, "
                f"growth {marks[-1] - marks[0]:+.1f} MiB"
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\ntargets: " + "; ".join(verdicts))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
