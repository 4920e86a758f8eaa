"""``gpu-node-agent bench deviceplugin --dra``: the DRA driver's figures beside the device plugin's.

The node runtime (health monitor, fault follower, rediscovery) and the DRA driver (:mod:`deviceplugin.dra`)
run on a simulated machine in a temporary directory; the kubelet's side is played over the real unix
sockets with the kubelet's wire paths; the API is in memory (claims it reads, slices it writes, the IMEX
channel record), so the figures are the node's own cost, without an API server's round trip. Measured:

- NodePrepareResources / NodeUnprepareResources latency: one claim per call, each claim allocated a
  random one of the node's devices (a claim prepared for the first time: read from the API, checked,
  written to the checkpoint with fsync);
- with an NVLink-domain profile (``gb200-nvl72``), the same for IMEX channel claims (the gang's channel
  from the domain record, its device node made and the CDI spec written; unprepare removes it);
- slice publish after a health change: from appending an XID line to the ``--simulate-faults`` file until
  the pool with that device's taint is written (a self-clearing XID, 94), and from the recovery (quiet
  period 50 ms) until the pool without it is written;
- RSS of the process before the driver starts and after all calls.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

from agent.benchmarks.machine import percentile
from agent.dra import domain_of, health_faults
from agent.health import HealthMonitor
from agent.healthbook import HealthConfig
from agent.runtime import Component, InventoryStore, Rediscovery, run_components
from agent.simnode import open_simulated_node
from deviceplugin.config import parse_plugin_config
from deviceplugin.dra.api import dra_pb2 as pb
from deviceplugin.dra.channelbook import KubeChannelBook
from deviceplugin.dra.config import DraConfig
from deviceplugin.dra.driver import DraDriver
from deviceplugin.dra.imexchannel import IMEX_DEVICE, ImexChannels
from topology.fabrichealth import DEFAULT_FABRIC_POLICY
from topology.kube import KubeError

DRIVER = "gpu.gpuagent.dev"
PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
NODE = "bench-node"


class _Api:
    """Claims, slices and ConfigMaps in memory, with the API's optimistic concurrency for the latter."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.applied: list[tuple[float, dict[str, Any]]] = []
        self.configmaps: dict[str, dict[str, Any]] = {}
        self._version = 0

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.claims.get((namespace, name))

    def node_uid(self, name: str) -> str | None:
        return "bench-node-uid"

    def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        return list(self.slices.values())

    def apply_slice(self, obj: Mapping[str, Any]) -> None:
        copy = json.loads(json.dumps(obj))
        self.slices[copy["metadata"]["name"]] = copy
        self.applied.append((time.perf_counter(), copy))

    def delete_slice(self, name: str) -> None:
        self.slices.pop(name, None)

    # the ConfigMap verbs KubeChannelBook uses
    def get(self, path: str) -> dict[str, Any]:
        if path not in self.configmaps:
            raise KubeError(404, "not found")
        out: dict[str, Any] = json.loads(json.dumps(self.configmaps[path]))
        return out

    def create(self, collection: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._store(f"{collection}/{body['metadata']['name']}", body)

    def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.configmaps[path]["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise KubeError(409, "conflict")
        return self._store(path, body)

    def _store(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._version += 1
        obj: dict[str, Any] = json.loads(json.dumps(body))
        obj["metadata"]["resourceVersion"] = str(self._version)
        self.configmaps[path] = obj
        return obj


def rss_bytes() -> int:
    """Resident set size now (``/proc/self/statm``), else the peak from ``getrusage``."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _claim(name: str, uid: str, device: str, gang: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "bench", "uid": uid}
    if gang is not None:
        meta["labels"] = {"gpuagent.dev/gang": gang}
    return {
        "metadata": meta,
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "r", "driver": DRIVER, "pool": NODE, "device": device}]}
            }
        },
    }


def _timed(socket: Path, path: str, requests: list[Any], answer: Any) -> list[float]:
    """Blocking gRPC calls from this (worker) thread; seconds per call; every claim must succeed."""
    out: list[float] = []
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        call = channel.unary_unary(
            path,
            request_serializer=type(requests[0]).SerializeToString,
            response_deserializer=answer.FromString,
        )
        for request in requests:
            t0 = time.perf_counter()
            reply = call(request, timeout=10, wait_for_ready=True)
            out.append(time.perf_counter() - t0)
            errors = [c.error for c in reply.claims.values() if c.error]
            if errors:
                raise RuntimeError(f"{path}: {errors[0]}")
    return out


async def _until(check: Callable[[], bool], timeout_s: float = 10.0) -> float:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.001)
    return time.perf_counter()


def _tainted(applied: list[tuple[float, dict[str, Any]]], device: str, since: int) -> Callable[[], bool]:
    def check() -> bool:
        return any(
            d["name"] == device and "taints" in d
            for _, obj in applied[since:]
            for d in obj["spec"].get("devices", [])
        )

    return check


def _clean(applied: list[tuple[float, dict[str, Any]]], device: str, since: int) -> Callable[[], bool]:
    def check() -> bool:
        return any(
            any(d["name"] == device for d in obj["spec"].get("devices", []))
            and not any(d["name"] == device and "taints" in d for d in obj["spec"].get("devices", []))
            for _, obj in applied[since:]
        )

    return check


async def dra_figures(*, profile: str, claims: int, faults: int, seed: int = 11) -> dict[str, Any]:
    """The DRA figures (seconds per sample; RSS in bytes)."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="drab", dir="/tmp") as tmp:
        directory = Path(tmp)
        fault_file = directory / "faults.jsonl"
        fault_file.write_text("")
        node = open_simulated_node(profile, faults_path=fault_file, hostname=NODE)
        node.nvml.init()
        rss_before = rss_bytes()
        store = InventoryStore(node.discover())
        api = _Api()
        health_config = HealthConfig(recovery_quiet_s=0.05, probe_interval_s=0.02)
        rediscovery = Rediscovery(store=store, discover=node.discover, interval_s=None)
        health = HealthMonitor(
            nvml=node.nvml, store=store, config=health_config, on_mig_change=rediscovery.request
        )
        channels = None
        if node.dev_root is not None and node.proc_devices is not None:
            channels = ImexChannels(
                book=KubeChannelBook(api, namespace="gpu-system"),  # type: ignore[arg-type]
                node_name=NODE,
                driver=DRIVER,
                domain=domain_of(store),
                dev_root=node.dev_root,
                proc_devices=node.proc_devices,
                cdi_dir=directory / "cdi",
                allow_stand_in=True,
            )
        driver = DraDriver(
            store=store,
            config=DraConfig(
                enabled=True, plugin_dir=str(directory / "plugins"), registry_dir=str(directory / "registry")
            ),
            plugin_config=parse_plugin_config({"cdi": {"specDir": str(directory / "cdi")}}),
            node_name=NODE,
            claims=api,
            slices=api,
            faults=health_faults(store, DEFAULT_FABRIC_POLICY),
            channels=channels,
            poll_s=0.01,
        )
        components: list[Component] = [health, rediscovery, driver]
        if node.faults is not None:
            components.append(node.faults)
        stop = asyncio.Event()
        task = asyncio.create_task(run_components(components, stop))
        out: dict[str, Any] = {}
        try:
            await asyncio.wait_for(driver.started.wait(), 10)
            await _until(lambda: bool(api.applied))
            devices = sorted(n for n in driver.devices)
            socket = driver.service_socket
            refs = []
            for i in range(claims):
                uid = f"uid-{i}"
                api.claims[("bench", f"c-{i}")] = _claim(f"c-{i}", uid, rng.choice(devices))
                refs.append(pb.Claim(namespace="bench", uid=uid, name=f"c-{i}"))
            prepare = [pb.NodePrepareResourcesRequest(claims=[r]) for r in refs]
            unprepare = [pb.NodeUnprepareResourcesRequest(claims=[r]) for r in refs]
            out["prepare"] = await asyncio.to_thread(
                _timed, socket, PREPARE, prepare, pb.NodePrepareResourcesResponse
            )
            out["unprepare"] = await asyncio.to_thread(
                _timed, socket, UNPREPARE, unprepare, pb.NodeUnprepareResourcesResponse
            )
            if channels is not None and channels.domain() is not None:
                imex = []
                for i in range(claims):
                    uid = f"imex-{i}"
                    api.claims[("bench", f"i-{i}")] = _claim(f"i-{i}", uid, IMEX_DEVICE, gang=f"gang-{i % 8}")
                    imex.append(pb.Claim(namespace="bench", uid=uid, name=f"i-{i}"))
                out["imex_prepare"] = await asyncio.to_thread(
                    _timed,
                    socket,
                    PREPARE,
                    [pb.NodePrepareResourcesRequest(claims=[r]) for r in imex],
                    pb.NodePrepareResourcesResponse,
                )
                out["imex_unprepare"] = await asyncio.to_thread(
                    _timed,
                    socket,
                    UNPREPARE,
                    [pb.NodeUnprepareResourcesRequest(claims=[r]) for r in imex],
                    pb.NodeUnprepareResourcesResponse,
                )
            gpus = sorted(store.inventory.gpus, key=lambda g: g.index)
            by_uuid = {sd.device.base_uuid: name for name, sd in driver.devices.items()}
            taint, untaint = [], []
            for i in range(faults):
                gpu = gpus[i % len(gpus)]
                name = by_uuid.get(gpu.uuid)
                if name is None:  # a MIG-enabled GPU: its whole-GPU device is not published
                    continue
                since = len(api.applied)
                t0 = time.perf_counter()
                with fault_file.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"event": "xid", "gpu": gpu.index, "xid": 94}) + "\n")
                t1 = await _until(_tainted(api.applied, name, since))
                taint.append(t1 - t0)
                since = len(api.applied)
                recovered: list[float] = []
                uuid = gpu.uuid

                def on_change(change: Any, uuid: str = uuid, recovered: list[float] = recovered) -> None:
                    if change.health_changed and store.device_health([uuid]).healthy and not recovered:
                        recovered.append(time.perf_counter())  # the moment the node says it is back

                remove = store.add_listener(on_change)
                try:
                    t3 = await _until(_clean(api.applied, name, since))
                finally:
                    remove()
                untaint.append(t3 - recovered[0])
            out["publish_taint"] = taint
            out["publish_recovered"] = untaint
            out["rss_before_bytes"] = rss_before
            out["rss_after_bytes"] = rss_bytes()
            out["devices"] = len(devices)
            out["slice_writes"] = len(api.applied)
        finally:
            stop.set()
            await task
            node.nvml.shutdown()
            node.close()
    return out


def summary(values_s: list[float]) -> dict[str, float | int]:
    """p50/p99/max in milliseconds and the count, for ``--json``."""
    if not values_s:
        return {"n": 0}
    ms = [v * 1000 for v in values_s]
    return {
        "p50_ms": round(percentile(ms, 50), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "max_ms": round(max(ms), 3),
        "n": len(ms),
    }


def print_dra(figures: Mapping[str, Any], line: Callable[[str, list[float]], None]) -> None:
    """The DRA rows of the table (``line`` prints one row of durations)."""
    print(f"DRA driver ({figures['devices']} devices published, in-memory API)")
    line("NodePrepareResources (gRPC, 1 claim)", figures["prepare"])
    line("NodeUnprepareResources (gRPC, 1 claim)", figures["unprepare"])
    if "imex_prepare" in figures:
        line("  IMEX channel claim: prepare", figures["imex_prepare"])
        line("  IMEX channel claim: unprepare", figures["imex_unprepare"])
    if figures["publish_taint"]:
        line("XID -> slice with the taint written", figures["publish_taint"])
        line("recovered -> slice without it written", figures["publish_recovered"])
    before, after = figures["rss_before_bytes"], figures["rss_after_bytes"]
    print(
        f"{'RSS before the driver / after all calls':<44} {before / 2**20:.1f} MiB / {after / 2**20:.1f} MiB"
    )
