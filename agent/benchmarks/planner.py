"""``gpu-node-agent bench planner``: plan latency and extender filter throughput.

1. A 72-GPU gang (18 pods x 4 GPUs in one NVLink domain) on 10,000 GB200-like nodes (NVL72 racks of
   18 trays, 8 racks per leaf, 8 leaves per spine) with 8% of trays partly busy: the first plan on a
   snapshot (indexing included) and then repeated plans (p50/p99).
2. A 1,000-pod gang in 100 subgroups of 10 (each inside one tier-1 domain) on 1,000 nodes in 100
   tier-1 domains, with some nodes partly busy.
3. Extender filter throughput over HTTP on loopback: keep-alive clients POST ``filter`` for pods on
   their own, every call carrying all node names of a 1,000-node cluster.
4. ``plan --cluster`` of a cluster file of ``--plan-file-nodes`` GB200 trays (default 100,000, written
   as block YAML or JSON) and a gang of 2 subgroups of 18 trays inside one spine: read in a fresh
   process, which reports the time to read the file (load and checks) and to plan (index and plan),
   wall and CPU, and its peak RSS.

The clusters are generated from a fixed seed, so every run plans the same problems.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import http.client
import json
import multiprocessing
import os
import random
import resource
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

from agent.benchmarks.machine import describe_ms, machine_summary, percentile
from scheduler_plugin.planner import plan, prepare
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, NodeState, Plan, Role


def gb200_cluster(nodes: int, *, busy_share: float, seed: int) -> ClusterSnapshot:
    rng = random.Random(seed)
    out = []
    for i in range(nodes):
        rack, tray = divmod(i, 18)
        free = rng.choice((0, 1, 2, 3)) if rng.random() < busy_share else 4
        out.append(
            NodeState(
                name=f"rack{rack:04d}-tray{tray:02d}",
                gpus=4,
                free=free,
                domains={
                    "nvlink": f"nvl-{rack:04d}",
                    "leaf": f"leaf-{rack // 8:03d}",
                    "spine": f"spine-{rack // 64:02d}",
                },
            )
        )
    return ClusterSnapshot(tiers=("nvlink", "leaf", "spine"), nodes=tuple(out))


def domain_cluster(nodes: int, domains: int, *, busy_share: float, seed: int) -> ClusterSnapshot:
    rng = random.Random(seed)
    per = nodes // domains
    out = []
    for i in range(nodes):
        d = i // per
        free = rng.choice((4, 6)) if rng.random() < busy_share else 8
        out.append(
            NodeState(
                name=f"node{i:05d}",
                gpus=8,
                free=free,
                domains={"nvlink": f"dom-{d:03d}", "leaf": f"leaf-{d // 10:02d}", "spine": "spine-0"},
            )
        )
    return ClusterSnapshot(tiers=("nvlink", "leaf", "spine"), nodes=tuple(out))


def _time_plans(snapshot: ClusterSnapshot, gang: Gang, runs: int) -> tuple[float, list[float], Any]:
    t0 = time.perf_counter()
    first = plan(prepare(snapshot), gang)
    cold = time.perf_counter() - t0
    prepared = prepare(snapshot)
    plan(prepared, gang)  # fill the capacity caches the way a long-lived extender has them
    warm = []
    for _ in range(runs):
        t = time.perf_counter()
        plan(prepared, gang)
        warm.append(time.perf_counter() - t)
    return cold, warm, first


def _describe(result: Any) -> str:
    if isinstance(result, Plan):
        doms = sorted({s.domain for s in result.subgroups if s.domain})
        shown = ", ".join(doms[:3]) + (", ..." if len(doms) > 3 else "")
        return (
            f"feasible: {len(result.placement)} pods, {len(result.subgroups)} subgroup(s) in {shown}; "
            f"stranded {result.score['stranded_gpus']:.0f} GPUs, span tier {result.score['span_tier']:.0f}"
        )
    return f"infeasible: {result.reason}"


def bench_72(runs: int) -> None:
    snap = gb200_cluster(10_000, busy_share=0.08, seed=72)
    gang = Gang(
        name="nvl72",
        roles=(Role(name="worker", pods=18, gpus_per_pod=4, subgroup_size=18, subgroup_tier="nvlink"),),
    )
    cold, warm, first = _time_plans(snap, gang, runs)
    print("72-GPU gang (18 x 4 GPUs, one NVLink domain) on 10,000 nodes / 556 racks, 8% of trays partly busy")
    print(f"  {_describe(first)}")
    print(f"  first plan incl. indexing: {cold * 1000:.1f} ms")
    print(f"  repeated plans: {describe_ms(warm)}")
    spine = Gang(name="nvl72x4", roles=(dataclasses.replace(gang.roles[0], pods=72),), tier="spine")
    cold, warm, first = _time_plans(snap, spine, max(10, runs // 4))
    print("288-GPU gang (4 subgroups of 18 x 4 GPUs, gang inside one spine) on the same cluster")
    print(f"  {_describe(first)}")
    print(f"  first plan incl. indexing: {cold * 1000:.1f} ms; repeated: {describe_ms(warm)}")


def bench_1000(runs: int) -> None:
    snap = domain_cluster(1_000, 100, busy_share=0.1, seed=1000)
    gang = Gang(
        name="big",
        roles=(Role(name="worker", pods=1000, gpus_per_pod=4, subgroup_size=10, subgroup_tier="nvlink"),),
    )
    cold, warm, first = _time_plans(snap, gang, runs)
    print(
        "1,000-pod gang (100 subgroups of 10 x 4 GPUs) on 1,000 nodes in 100 tier-1 domains, 10% partly busy"
    )
    print(f"  {_describe(first)}")
    print(f"  first plan incl. indexing: {cold * 1000:.1f} ms; repeated: {describe_ms(warm)}")


def bench_extender(requests: int, clients: int, nodes: int) -> None:
    from scheduler_plugin.extender import (  # noqa: PLC0415 - only this part needs it
        Extender,
        ExtenderServer,
        ExtenderState,
    )

    class NoCluster:
        async def bind(
            self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
        ) -> None:
            return None

        def event(self, pod: Mapping[str, Any], *, reason: str, message: str, warning: bool) -> None:
            return None

    state = ExtenderState()
    names = [f"node{i:05d}" for i in range(nodes)]
    state.cache.replace(
        "nodes",
        [
            {
                "metadata": {"name": n, "labels": {"gpuagent.dev/nvlink-domain": f"dom-{i // 18:03d}"}},
                "status": {"allocatable": {"nvidia.com/gpu": "4"}},
            }
            for i, n in enumerate(names)
        ],
    )
    ext = Extender(state=state, cluster=NoCluster())
    server = ExtenderServer(ext)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start("127.0.0.1", 0), loop).result(10)
    port = server.port
    pod = {
        "metadata": {"name": "solo", "namespace": "default"},
        "spec": {
            "schedulerName": "gpu-topology-scheduler",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        },
    }
    state.cache.replace("pods", [pod])  # the extender decides only for pods its informer knows
    body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()
    per_client = requests // clients
    # clients run in their own processes so that they do not share the server's interpreter lock
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(clients) as pool:
        pool.map(_noop, range(clients))  # start-up cost outside the measurement
        t0 = time.perf_counter()
        results = pool.starmap(_client, [(port, body, per_client)] * clients)
        elapsed = time.perf_counter() - t0
    latencies = [x for lat, _ in results for x in lat]
    failures = [sum(f for _, f in results)]
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()
    done = per_client * clients
    print(f"extender filter over HTTP on loopback: {nodes} node names per call, {clients} keep-alive clients")
    print(
        f"  {done / elapsed:.0f} requests/s ({done} requests in {elapsed:.2f} s, {failures[0]} failed); "
        f"latency p50 {percentile(latencies, 50) * 1000:.2f} ms, "
        f"p99 {percentile(latencies, 99) * 1000:.2f} ms"
    )


def write_cluster_file(path: str, snapshot: ClusterSnapshot, *, fmt: str) -> int:
    """``snapshot`` as a ``plan --cluster`` file, block YAML (as ``yaml.safe_dump`` writes it) or
    JSON; its size in bytes."""
    if fmt == "json":
        data = {
            "tiers": list(snapshot.tiers),
            "nodes": [
                {"name": n.name, "gpus": n.gpus, "free": n.free, "domains": dict(n.domains)}
                for n in snapshot.nodes
            ],
        }
        text = json.dumps(data, indent=1)
    else:
        parts = ["tiers:\n", *(f"- {t}\n" for t in snapshot.tiers), "nodes:\n"]
        for n in snapshot.nodes:
            parts.append(f"- name: {n.name}\n  gpus: {n.gpus}\n  free: {n.free}\n  domains:\n")
            parts.extend(f"    {t}: {d}\n" for t, d in n.domains.items())
        text = "".join(parts)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return len(text.encode())


def _peak_rss_bytes() -> int:
    """This process's peak RSS: ``VmHWM`` of its own memory (Linux), else ``ru_maxrss``. Linux keeps
    ``ru_maxrss`` across ``exec``, so a child started by a large parent would report the parent's size."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _plan_file_child(cluster: str, gang_path: str) -> dict[str, Any]:
    """In a fresh process: ``plan --cluster``'s steps timed, the result described, the peak RSS."""
    from agent.commands.plan import read_cluster, read_gang  # noqa: PLC0415 - the child's own work
    from scheduler_plugin.formats import result_to_data  # noqa: PLC0415

    w0, c0 = time.perf_counter(), time.process_time()
    snapshot = read_cluster(cluster)
    gang = read_gang(gang_path, snapshot.tiers)
    w1, c1 = time.perf_counter(), time.process_time()
    result = plan(prepare(snapshot), gang)
    w2, c2 = time.perf_counter(), time.process_time()
    json.dumps(result_to_data(result, snapshot.tiers))
    w3, c3 = time.perf_counter(), time.process_time()
    return {
        "load_s": w1 - w0,
        "load_cpu_s": c1 - c0,
        "plan_s": w2 - w1,
        "plan_cpu_s": c2 - c1,
        "total_s": w3 - w0,
        "total_cpu_s": c3 - c0,
        "peak_rss_bytes": _peak_rss_bytes(),
        "result": _describe(result),
    }


def bench_plan_file(nodes: int, fmt: str) -> dict[str, Any]:
    snap = gb200_cluster(nodes, busy_share=0.08, seed=72)
    racks = -(-nodes // 18)
    gang = {
        "name": "train-a",
        "tier": "spine",
        "roles": [
            {"name": "worker", "pods": 36, "gpus_per_pod": 4, "subgroup_size": 18, "subgroup_tier": "nvlink"}
        ],
    }
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        cluster = os.path.join(tmp, f"cluster.{fmt}")
        size = write_cluster_file(cluster, snap, fmt=fmt)
        gang_path = os.path.join(tmp, "gang.json")
        with open(gang_path, "w", encoding="utf-8") as fh:
            json.dump(gang, fh)
        del snap
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            figures: dict[str, Any] = pool.apply(_plan_file_child, (cluster, gang_path))
    print(
        f"plan --cluster of {nodes:,} GB200 trays ({racks:,} NVL72 racks, {-(-racks // 8):,} leaves, "
        f"{-(-racks // 64):,} spines; 8% partly busy) in {fmt.upper()} of {size / 1e6:.1f} MB; "
        "gang: 2 subgroups of 18 x 4 GPUs inside one spine"
    )
    print(f"  {figures['result']}")
    print(
        f"  read {figures['load_s']:.2f} s (CPU {figures['load_cpu_s']:.2f} s), "
        f"plan {figures['plan_s']:.2f} s (CPU {figures['plan_cpu_s']:.2f} s), "
        f"total {figures['total_s']:.2f} s (CPU {figures['total_cpu_s']:.2f} s); "
        f"peak RSS {figures['peak_rss_bytes'] / 2**20:.0f} MiB"
    )
    return figures


def _noop(_: int) -> None:
    return None


def _client(port: int, body: bytes, count: int) -> tuple[list[float], int]:
    """One keep-alive HTTP client: ``count`` filter calls; (latencies in s, failed calls)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    latencies = []
    failed = 0
    for _ in range(count):
        t = time.perf_counter()
        conn.request("POST", "/filter", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        latencies.append(time.perf_counter() - t)
        if resp.status != 200 or json.loads(data)["Error"]:
            failed += 1
    conn.close()
    return latencies, failed


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="gpu-node-agent bench planner", description="plan latency and extender throughput"
    )
    p.add_argument("--runs", type=int, default=200, help="repeated plans per scenario (default 200)")
    p.add_argument("--requests", type=int, default=2000, help="extender filter requests (default 2000)")
    p.add_argument("--clients", type=int, default=4, help="concurrent HTTP clients (default 4)")
    p.add_argument(
        "--extender-nodes", type=int, default=1000, help="node names per filter call (default 1000)"
    )
    p.add_argument(
        "--plan-file-nodes",
        type=int,
        default=None,
        help="nodes of the plan --cluster file case (default 100,000; 2,000 with --quick; 0 skips it)",
    )
    p.add_argument(
        "--plan-file-format", choices=("yaml", "json"), default="yaml", help="the cluster file's format"
    )
    p.add_argument("--only-plan-file", action="store_true", help="run only the plan --cluster file case")
    p.add_argument("--quick", action="store_true", help="few runs, for a smoke test")
    a = p.parse_args(argv)
    if a.runs < 1 or a.requests < 1 or a.clients < 1 or a.extender_nodes < 1:
        p.error("--runs, --requests, --clients and --extender-nodes must be positive")
    if a.plan_file_nodes is not None and a.plan_file_nodes < 0:
        p.error("--plan-file-nodes must not be negative")
    runs, requests = (5, 50) if a.quick else (a.runs, a.requests)
    file_nodes = a.plan_file_nodes if a.plan_file_nodes is not None else (2_000 if a.quick else 100_000)
    print(machine_summary())
    if not a.only_plan_file:
        bench_72(runs)
        bench_1000(max(5, runs // 10))
        bench_extender(max(requests, a.clients), a.clients, a.extender_nodes)
    if file_nodes:
        bench_plan_file(file_nodes, a.plan_file_format)
    return 0
