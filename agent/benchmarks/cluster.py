"""``gpu-node-agent bench cluster``: scheduling on hollow GPU nodes, end to end.

Every node is a hollow kubelet (``counterparts/hollownode``: the kubelet's code with its real device
manager) with one ``gpu-node-agent run`` beside it, so GPU capacity reaches ``Node.status`` through our
plugins and every pod is admitted by a kubelet that calls our ``Allocate``. On one control plane
(etcd + kube-apiserver), with the topology controller's HyperNodes, it measures side by side:

1. a gang (one NVL72 rack's worth: ``--trays`` pods x 4 GPUs, all inside one NVLink domain), from
   creating it to every pod ``Running``: kube-scheduler + our extender (``gpuagent.dev/*`` annotations)
   and Volcano's vc-scheduler (a PodGroup with ``networkTopology`` hard at tier 1, on our HyperNodes);
2. the extender's cost per pod: independent 1-GPU pods through kube-scheduler alone and through
   kube-scheduler with the extender, to bound and to ``Running``.

Aims: the extender adds under 20% per pod; a 72-GPU gang on 2 racks is ``Running`` in under 10 s with
either path. The cluster machinery (:func:`start_hollow_cluster`) is shared with ``demo``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import localcluster
from agent.benchmarks.machine import machine_summary

GPU = "nvidia.com/gpu"
EXTENDER_SCHEDULER = "gpu-topology-scheduler"
PLAIN_SCHEDULER = "default-scheduler"
VOLCANO_SCHEDULER = "volcano"
POD_IMAGE = "registry.k8s.io/pause:3.10"
GPUS_PER_PROFILE = {"gb200-nvl72": 4, "dgx-h100": 8}
PODGROUPS = ("scheduling.volcano.sh", "v1beta1", "podgroups")
MERGE_PATCH = "application/merge-patch+json"
BUILD_COMMAND = "bash tests/e2e/counterparts/build.sh"
WAIT_S = 180.0
CREATE_THREADS = 8


class ClusterUnavailableError(RuntimeError):
    """Hollow nodes cannot run here (a binary not built, not root); one line for the user."""


# ------------------------------------------------------------------------------------------ the cluster


def tray_specs(*, racks: int, trays: int, dgx: int = 0) -> list[localcluster.GpuNodeSpec]:
    """GB200 trays ``gb200-r<rack>-t<tray>`` (the demo's names), then ``dgx`` DGX H100 nodes."""
    specs = [
        localcluster.GpuNodeSpec(
            f"gb200-r{r}-t{t:02d}", f"gb200-nvl72:rack={r},tray={t},hostname=gb200-r{r}-t{t:02d}"
        )
        for r in range(racks)
        for t in range(trays)
    ]
    specs += [
        localcluster.GpuNodeSpec(f"dgx-h100-{i}", f"dgx-h100:su=0,node={i},hostname=dgx-h100-{i}")
        for i in range(dgx)
    ]
    return specs


def unavailable_reason(counterparts: localcluster.Counterparts, *, volcano: bool) -> str | None:
    """Why hollow nodes cannot run here, or None."""
    names = ["etcd", "kube-apiserver", "kube-scheduler", localcluster.HOLLOW_NODE]
    if volcano:
        names.append("vc-scheduler")
    try:
        counterparts.check(names)
        counterparts.volcano_crds()
    except localcluster.MissingCounterpartError as exc:
        return f"{exc} (build: {BUILD_COMMAND})"
    if os.geteuid() != 0:
        return "hollow nodes need root (each bind-mounts its device-plugin folder in its own mount namespace)"
    return None


class RunningExtender:
    """``gpu-node-agent extender`` (its ``Service``) on an event loop thread of its own."""

    def __init__(self, kubeconfig: Path) -> None:
        from agent.commands.extender import Service, Settings  # noqa: PLC0415
        from topology.kube import api_client_from  # noqa: PLC0415

        settings = Settings(
            host="127.0.0.1",
            port=localcluster.free_port(),
            kubeconfig=str(kubeconfig),
            barrier_timeout_s=15.0,
            reservation_ttl_s=60.0,
            max_body_bytes=32 << 20,
            watch_timeout_s=5,
            log_level="error",
        )
        self.service = Service(settings, api_client_from(str(kubeconfig)))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="extender")
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.service.start(), self.loop).result(30)
        localcluster.wait_until(
            lambda: all(i.synced.is_set() for i in self.service.informers), what="extender informers synced"
        )
        self.url = f"http://127.0.0.1:{settings.port}/"

    def scheduler_entry(self) -> dict[str, Any]:
        """kube-scheduler's ``extenders`` entry for it."""
        return localcluster.extender_entry(self.url)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.service.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def _answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as reply:
            return int(reply.status) == 200
    except OSError:  # refused while it starts; 503 until its informers are synced
        return False


class ExtenderProcess:
    """``gpu-node-agent extender`` as its own process, as the deployment runs it (a sidecar of its
    kube-scheduler on loopback): the benchmark's client threads do not share its interpreter."""

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        port, health = localcluster.free_port(), localcluster.free_port()
        argv = [
            *localcluster.AGENT_COMMAND,
            "extender",
            "--addr",
            f"127.0.0.1:{port}",
            "--health-addr",
            f"127.0.0.1:{health}",
            "--kubeconfig",
            str(kubeconfig),
            "--barrier-timeout",
            "15",
            "--log-format",
            "json",
            "--log-level",
            "warning",
        ]
        self.process = localcluster.ManagedProcess(
            "gpu-node-agent extender", argv, workdir / "logs" / "extender.log", localcluster.AGENT_ENV
        ).start()
        try:
            localcluster.wait_until(
                lambda: _answers_200(f"http://127.0.0.1:{health}/readyz"),
                what="extender /readyz (informers synced)",
                process=self.process,
            )
        except BaseException:
            self.process.stop()
            raise
        self.url = f"http://127.0.0.1:{port}/"

    def scheduler_entry(self) -> dict[str, Any]:
        return localcluster.extender_entry(self.url)

    def stop(self) -> None:
        self.process.stop()


@dataclass
class HollowCluster:
    """A control plane, hollow GPU nodes with their agents, HyperNodes, and the schedulers asked for."""

    workdir: Path
    plane: localcluster.ControlPlane
    client: Any  # kubernetes ApiClient (admin)
    nodes: list[localcluster.HollowGpuNode] = field(default_factory=list)
    tree: Any = None  # topology.builder.Tree
    hypernode_writes: int = 0
    extender: RunningExtender | ExtenderProcess | None = None
    schedulers: list[localcluster.Scheduler] = field(default_factory=list)

    def node(self, name: str) -> localcluster.HollowGpuNode:
        return next(n for n in self.nodes if n.name == name)

    def stop(self) -> None:
        for sched in reversed(self.schedulers):
            sched.stop()
        if self.extender is not None:
            self.extender.stop()
        for node in reversed(self.nodes):
            node.stop()
        self.client.close()
        self.plane.stop()


def _kube(client: Any) -> Any:
    """The one Kubernetes adapter (``topology.kube.Kube``) over ``client``: plain-dict objects."""
    from topology.kube import Kube  # noqa: PLC0415

    return Kube(client)


def _pods(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def _podgroups(namespace: str) -> str:
    return f"/apis/{PODGROUPS[0]}/{PODGROUPS[1]}/namespaces/{namespace}/{PODGROUPS[2]}"


def _gpu_allocatable(client: Any) -> dict[str, int]:
    nodes, _ = _kube(client).list("/api/v1/nodes")
    return {
        n["metadata"]["name"]: int(((n.get("status") or {}).get("allocatable") or {}).get(GPU, "0"))
        for n in nodes
    }


def start_hollow_cluster(
    workdir: Path,
    *,
    specs: Sequence[localcluster.GpuNodeSpec],
    extender: bool = True,
    extender_process: bool = False,
    plain_scheduler: bool = False,
    volcano: bool = False,
    workload_api: bool = False,
    scheduler_qps: int | None = None,
    announce: Callable[[str], None] = lambda _: None,
) -> HollowCluster:
    """Start everything (raises :class:`ClusterUnavailableError` when it cannot run here); returns once every
    Node offers its GPUs, the HyperNodes are applied and the schedulers are up. The extender runs on a
    thread of this process (its state readable) or, with ``extender_process``, as its own process.
    ``workload_api``: kube-apiserver serves the ``scheduling.k8s.io`` Workload API with its gates on."""
    from agent.nvml.sim_sysfs import ibnetdiscover_sample  # noqa: PLC0415
    from agent.nvml.simulate import parse_spec  # noqa: PLC0415
    from topology.gpunode import gpunode_crd  # noqa: PLC0415

    counterparts = localcluster.locate_counterparts()
    why = unavailable_reason(counterparts, volcano=volcano)
    if why is not None:
        raise ClusterUnavailableError(why)
    announce("Starting the local control plane (etcd + kube-apiserver) ...")
    plane = localcluster.start_control_plane(
        counterparts,
        workdir,
        feature_gates=localcluster.WORKLOAD_FEATURE_GATES if workload_api else None,
        runtime_config=localcluster.WORKLOAD_RUNTIME_CONFIG if workload_api else (),
    )
    cluster = HollowCluster(workdir, plane, plane.apiserver.api_client())
    try:
        crds = localcluster.load_yaml_documents(counterparts.volcano_crds())
        localcluster.apply_crds(
            cluster.client, [gpunode_crd(), *(d for d in crds if d.get("kind") == "CustomResourceDefinition")]
        )
        announce(
            f"Starting {len(specs)} hollow GPU nodes (the kubelet's code with its real device manager) "
            "and one gpu-node-agent run per node ..."
        )
        cluster.nodes = localcluster.start_hollow_gpu_nodes(
            counterparts,
            workdir,
            apiserver=plane.apiserver,
            specs=specs,
            labels={"gpuagent.dev/hollow": "true"},
            cpus=16,
            memory="64Gi",
            status_update_s=1.0,
        )
        want = {s.name: GPUS_PER_PROFILE.get(parse_spec(s.simulate).profile, 1) for s in specs}
        localcluster.wait_until(
            lambda: all(_gpu_allocatable(cluster.client).get(n, 0) == g for n, g in want.items()),
            what="every Node's allocatable nvidia.com/gpu from its device plugin",
            timeout_s=WAIT_S,
            interval_s=0.2,
        )
        _untaint(cluster.client, [s.name for s in specs])
        fabric = ibnetdiscover_sample([parse_spec(s.simulate) for s in specs])
        localcluster.wait_until(
            lambda: _count_gpunodes(cluster.client) >= len(specs),
            what="every agent's GPUNode",
            timeout_s=WAIT_S,
        )
        cluster.tree, cluster.hypernode_writes = apply_hypernodes(plane.apiserver.kubeconfig, fabric)
        if extender and extender_process:
            cluster.extender = ExtenderProcess(plane.apiserver.kubeconfig, workdir)
        elif extender:
            cluster.extender = RunningExtender(plane.apiserver.kubeconfig)
        schedulers: list[tuple[str, Callable[[], localcluster.Scheduler]]] = []
        if cluster.extender is not None:
            entry = cluster.extender.scheduler_entry()
            schedulers.append(
                (
                    "kube-scheduler with the extender",
                    lambda: localcluster.start_kube_scheduler(
                        counterparts,
                        workdir,
                        apiserver=plane.apiserver,
                        scheduler_name=EXTENDER_SCHEDULER,
                        extenders=[entry],
                        client_qps=scheduler_qps,
                    ),
                )
            )
        if plain_scheduler:
            schedulers.append(
                (
                    "kube-scheduler",
                    lambda: localcluster.start_kube_scheduler(
                        counterparts,
                        workdir,
                        apiserver=plane.apiserver,
                        scheduler_name=PLAIN_SCHEDULER,
                        client_qps=scheduler_qps,
                    ),
                )
            )
        if volcano:
            schedulers.append(
                (
                    "vc-scheduler",
                    lambda: localcluster.start_volcano_scheduler(
                        counterparts, workdir, apiserver=plane.apiserver, scheduler_name=VOLCANO_SCHEDULER
                    ),
                )
            )
        if schedulers:
            announce(f"Starting {', '.join(what for what, _ in schedulers)} ...")
        for _, start in schedulers:
            cluster.schedulers.append(start())
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _untaint(client: Any, names: Sequence[str]) -> None:
    """No node controller runs here to lift the not-ready taint a new Node may carry."""
    kube = _kube(client)
    nodes, _ = kube.list("/api/v1/nodes")
    for n in nodes:
        name = n["metadata"]["name"]
        if name in names and (n.get("spec") or {}).get("taints"):
            kube.request(
                "PATCH", f"/api/v1/nodes/{name}", body={"spec": {"taints": None}}, content_type=MERGE_PATCH
            )


def _count_gpunodes(client: Any) -> int:
    from topology.kube import GPUNODES, Kube  # noqa: PLC0415

    items, _ = Kube(client).list(GPUNODES)
    return len(items)


def apply_hypernodes(kubeconfig: Path, fabric: str) -> tuple[Any, int]:
    """The topology controller, once: returns its tree and the writes it made."""
    from topology.builder import FabricPolicy  # noqa: PLC0415
    from topology.controller import ControllerSettings, TopologyController  # noqa: PLC0415
    from topology.kube import Kube, api_client_from  # noqa: PLC0415

    controller = TopologyController(
        kube=Kube(api_client_from(str(kubeconfig))),
        settings=ControllerSettings(
            policy=FabricPolicy.ISOLATE,
            namespace="default",
            leader_elect=False,
            identity="gpu-node-agent-local",
            static_ibnet=(("simulated fabric", fabric),),
        ),
    )
    d = controller.reconcile_once()
    return controller.last_tree, len(d.apply)


# ----------------------------------------------------------------------------------------------- pods


def ensure_namespace(client: Any, name: str) -> None:
    from topology.kube import KubeError  # noqa: PLC0415

    try:
        _kube(client).create("/api/v1/namespaces", {"metadata": {"name": name}})
    except KubeError as e:
        if e.status != 409:
            raise


def gpu_pod(
    name: str,
    *,
    scheduler: str,
    gpus: int,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": {"gpuagent.dev/hollow": "true"},
        "containers": [
            {
                "name": "main",
                "image": POD_IMAGE,
                "resources": {
                    "requests": {"cpu": "100m", "memory": "64Mi"},
                    "limits": {GPU: str(gpus), "cpu": "100m", "memory": "64Mi"},
                },
            }
        ],
    }
    if node_name is not None:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {}), "labels": dict(labels or {})},
        "spec": spec,
    }


def extender_gang(gang: str, pods: int, *, gpus: int = 4) -> list[dict[str, Any]]:
    """A gang for our extender: every pod in one NVLink domain, ranks in order."""
    return [
        gpu_pod(
            f"{gang}-{i}",
            scheduler=EXTENDER_SCHEDULER,
            gpus=gpus,
            annotations={
                "gpuagent.dev/gang": gang,
                "gpuagent.dev/gang-size": str(pods),
                "gpuagent.dev/subgroup-size": str(pods),
                "gpuagent.dev/subgroup-tier": "nvlink",
                "gpuagent.dev/rank": str(i),
            },
        )
        for i in range(pods)
    ]


def volcano_podgroup(gang: str, pods: int) -> dict[str, Any]:
    """A Volcano PodGroup: all ``pods`` or none, inside one tier-1 (NVLink) HyperNode."""
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": gang},
        "spec": {
            "minMember": pods,
            "queue": "default",
            "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
        },
    }


def volcano_gang(gang: str, pods: int, *, gpus: int = 4) -> list[dict[str, Any]]:
    return [
        gpu_pod(
            f"{gang}-{i}",
            scheduler=VOLCANO_SCHEDULER,
            gpus=gpus,
            annotations={"scheduling.k8s.io/group-name": gang},
        )
        for i in range(pods)
    ]


def create_pods(client: Any, namespace: str, pods: Sequence[Mapping[str, Any]]) -> None:
    """Create ``pods`` from a few threads at once, so that one client's request latency does not pace
    the schedulers being measured."""
    kube, path = _kube(client), _pods(namespace)
    if len(pods) <= 1:
        for p in pods:
            kube.create(path, p)
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(CREATE_THREADS, len(pods))) as pool:
        for done in [pool.submit(kube.create, path, p) for p in pods]:
            done.result()


@dataclass(frozen=True)
class PodView:
    name: str
    node: str | None
    phase: str | None


def list_pods(client: Any, namespace: str, prefix: str = "") -> dict[str, PodView]:
    pods, _ = _kube(client).list(_pods(namespace))
    views = (
        PodView(
            p["metadata"]["name"],
            (p.get("spec") or {}).get("nodeName"),
            (p.get("status") or {}).get("phase"),
        )
        for p in pods
    )
    return {v.name: v for v in views if v.name.startswith(prefix)}


@dataclass(frozen=True)
class Timing:
    bound_s: float
    running_s: float
    nodes: dict[str, str]  # pod -> node
    created_s: float = 0.0  # until the last create returned
    cpu_s: Mapping[str, float] = field(default_factory=dict)  # process -> CPU seconds it used meanwhile
    to_bound_ms: float | None = None  # kube-scheduler's own mean from attempt start to bound


class PodWatch:
    """The pods of one namespace from one list and then one watch on a thread, resumed from the last
    version when the stream breaks and listed again when that version is too old; subclasses say what
    each event means (``_event``). Set a subclass's own fields before calling ``__init__``: the first
    listing arrives during it."""

    def __init__(self, client: Any, namespace: str, *, name: str = "pod-watch") -> None:
        from topology.kube import Kube  # noqa: PLC0415

        self._kube = Kube(client)
        self._path = f"/api/v1/namespaces/{namespace}/pods"
        self._stop = threading.Event()
        self._watch: Any = None
        self._rv = self._relist("ADDED")
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    def _event(self, kind: str, pod: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _relist(self, kind: str) -> str:
        items, rv = self._kube.list(self._path)
        for pod in items:
            self._event(kind, pod)
        return rv

    def _run(self) -> None:
        from topology.kube import KubeError  # noqa: PLC0415

        while not self._stop.is_set():
            try:
                self._watch = self._kube.watch(self._path, self._rv, timeout_s=120)
                for kind, obj in self._watch:
                    self._rv = str((obj.get("metadata") or {}).get("resourceVersion") or self._rv)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self._event(kind, obj)
            except KubeError as exc:
                if self._stop.is_set():
                    return
                if exc.status == 410:  # too old to resume: list again
                    self._rv = self._relist("MODIFIED")
                else:
                    time.sleep(0.2)
            except Exception:  # the stream broke (or close() cut it): resume from the last version
                if self._stop.is_set():
                    return
                time.sleep(0.2)

    def close(self) -> None:
        self._stop.set()
        watch = self._watch
        if watch is not None:
            watch.close()
        self._thread.join(5)


class PodClock(PodWatch):
    """When each pod of one namespace was first seen bound to a node, first seen ``Running`` and first
    seen refused by its scheduler (``PodScheduled`` false): the time of each watch event as it arrives,
    with no polling lists loading the machine being measured."""

    def __init__(self, client: Any, namespace: str) -> None:
        self._changed = threading.Condition()
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        self.refused: set[str] = set()
        super().__init__(client, namespace, name="pod-clock")

    def _event(self, kind: str, pod: Mapping[str, Any]) -> None:
        name = str((pod.get("metadata") or {}).get("name", ""))
        if kind == "DELETED":
            self._forget(name)
        else:
            self._see(name, pod, time.monotonic())

    def _see(self, name: str, pod: Mapping[str, Any], now: float) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        status = pod.get("status") or {}
        with self._changed:
            if node and name not in self.bound:
                self.bound[name], self.nodes[name] = now, str(node)
            if status.get("phase") == "Running" and name not in self.running:
                self.running[name] = now
            for c in status.get("conditions") or ():
                if c.get("type") == "PodScheduled" and c.get("status") == "False":
                    self.refused.add(name)
            self._changed.notify_all()

    def _forget(self, name: str) -> None:
        with self._changed:
            self.bound.pop(name, None)
            self.running.pop(name, None)
            self.nodes.pop(name, None)
            self.refused.discard(name)

    def wait_refused(self, names: Sequence[str], *, timeout_s: float = WAIT_S) -> list[str]:
        """Until the scheduler has tried every pod in ``names`` and found no node; the pods it bound
        instead (it placed them before its informer saw the nodes held), each counted as tried."""
        self._wait(
            lambda: all(n in self.refused or n in self.bound for n in names),
            timeout_s,
            "refused by the scheduler",
        )
        with self._changed:
            return [n for n in names if n in self.bound]

    def wait(self, names: Sequence[str], t0: float, *, timeout_s: float = WAIT_S) -> Timing:
        """Until every pod in ``names`` is ``Running``; seconds from ``t0`` to the last bound and the last
        ``Running``."""
        self._wait(lambda: all(n in self.running for n in names), timeout_s, "Running")
        with self._changed:
            return Timing(
                max(self.bound.get(n, self.running[n]) for n in names) - t0,
                max(self.running[n] for n in names) - t0,
                {n: self.nodes.get(n, "") for n in names},
            )

    def _wait(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"after {timeout_s:.0f} s not every pod is {what} "
                        f"(bound: {len(self.bound)}, Running: {len(self.running)})"
                    )
                self._changed.wait(min(left, 0.5))


def time_pods(
    client: Any,
    namespace: str,
    names: Sequence[str],
    create: Callable[[], None],
    *,
    timeout_s: float = WAIT_S,
    clock: PodClock | None = None,
) -> Timing:
    """Run ``create`` and wait until every pod in ``names`` is bound, then ``Running``: seconds from
    before ``create`` to each (``clock``: a running :class:`PodClock` of ``namespace``, else one for
    this call)."""
    own = clock is None
    pods = clock if clock is not None else PodClock(client, namespace)
    try:
        t0 = time.monotonic()
        create()
        created_s = time.monotonic() - t0
        t = pods.wait(names, t0, timeout_s=timeout_s)
        return dataclasses.replace(t, created_s=created_s)
    finally:
        if own:
            pods.close()


HOLD_TAINT = {"key": "gpuagent.dev/bench-hold", "value": "true", "effect": "NoSchedule"}
BACKOFF_S = 1.2  # kube-scheduler's initial backoff of a pod after one failed attempt is 1 s
HOLD_SETTLE_S = 1.0  # the schedulers' informers see the taint before the first pod comes
HOLD_TRIES = 3


def hold_nodes(client: Any, nodes: Sequence[str], *, held: bool) -> None:
    """Put on (or take off) every node a ``NoSchedule`` taint that no benchmark pod tolerates."""
    from topology.kube import Kube  # noqa: PLC0415

    kube = Kube(client)
    body = {"spec": {"taints": [HOLD_TAINT] if held else None}}

    def patch(name: str) -> None:
        kube.request("PATCH", f"/api/v1/nodes/{name}", body=body, content_type=MERGE_PATCH)

    with concurrent.futures.ThreadPoolExecutor(max_workers=CREATE_THREADS) as pool:
        list(pool.map(patch, nodes))


def time_backlog(
    client: Any, clock: PodClock, namespace: str, nodes: Sequence[str], pods: Sequence[Mapping[str, Any]]
) -> Timing:
    """The scheduler's own pace: ``pods`` are created while every node is held by a taint, each is
    tried once and refused, and once kube-scheduler's backoff of them has passed all nodes are
    released at once; seconds from the release to the last pod bound and ``Running``. Pod creation,
    paced by the client, is outside the time measured."""
    names = [str(p["metadata"]["name"]) for p in pods]
    for _ in range(HOLD_TRIES):
        hold_nodes(client, nodes, held=True)
        time.sleep(HOLD_SETTLE_S)
        leaked: list[str] = []
        try:
            create_pods(client, namespace, pods)
            leaked = clock.wait_refused(names)
            if not leaked:
                time.sleep(BACKOFF_S)
        finally:
            t0 = time.monotonic()
            hold_nodes(client, nodes, held=False)
        if not leaked:
            return clock.wait(names, t0)
        print(f"  ({len(leaked)} pod(s) bound while the nodes were held: measured again)", file=sys.stderr)
        delete_pods(client, namespace)
    raise TimeoutError(f"pods kept being bound while every node was held, {HOLD_TRIES} times")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` and its waited-for children."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    ticks = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def delete_pods(client: Any, namespace: str, *, timeout_s: float = WAIT_S) -> None:
    """Delete every pod of ``namespace`` and wait until the kubelets have let them go."""
    _kube(client).request("DELETE", _pods(namespace), query={"gracePeriodSeconds": "1"})
    localcluster.wait_until(
        lambda: not list_pods(client, namespace), what=f"pods of {namespace} gone", timeout_s=timeout_s
    )


def delete_podgroups(client: Any, namespace: str) -> None:
    _kube(client).request("DELETE", _podgroups(namespace))


# ------------------------------------------------------------------------------------------ benchmark


@dataclass
class Results:
    nodes: int
    gpus: int
    gang_pods: int
    independent_pods: int
    gang: dict[str, list[Timing]] = field(default_factory=dict)  # path -> runs
    independent: dict[str, list[Timing]] = field(default_factory=dict)  # backlog released at once
    streamed: dict[str, list[Timing]] = field(default_factory=dict)  # created while the schedulers run
    gang_domains: dict[str, list[int]] = field(default_factory=dict)  # path -> NVLink domains used


def _domain_of(tree: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, h in tree.hypernodes.items():
        if h.tier_name == "nvlink":
            for member in h.members:
                out[member] = name
    return out


def _gang_creator(client: Any, ns: str, path: str, gang: str, pods: int) -> Callable[[], None]:
    """What creates one gang: its pods (extender), or its PodGroup and then its pods (Volcano)."""
    if path == "extender":
        extender_pods = extender_gang(gang, pods)
        return lambda: create_pods(client, ns, extender_pods)
    volcano_pods = volcano_gang(gang, pods)

    def create() -> None:
        _kube(client).create(_podgroups(ns), volcano_podgroup(gang, pods))
        create_pods(client, ns, volcano_pods)

    return create


def _processes(cluster: HollowCluster) -> dict[str, int]:
    """The processes whose CPU time each measurement reports: label -> pid."""
    out = {s.name: s.process.pid for s in cluster.schedulers}
    if isinstance(cluster.extender, ExtenderProcess):
        out["extender"] = cluster.extender.process.pid
    return out


ATTEMPT_METRIC = "scheduler_scheduling_attempt_duration_seconds"


def scheduled_attempts(text: str) -> tuple[float, int]:
    """From kube-scheduler's Prometheus text: seconds spent in, and the number of, attempts that placed
    a pod (``result="scheduled"``, every profile), each from the start of its scheduling cycle to the end
    of its binding (the extender's ``bind`` verb, or kube-scheduler's own binding POST)."""
    total, count = 0.0, 0
    for line in text.splitlines():
        if not line.startswith(ATTEMPT_METRIC) or 'result="scheduled"' not in line:
            continue
        name, value = line.partition("{")[0], line.rsplit(" ", 1)[-1]
        if name == f"{ATTEMPT_METRIC}_sum":
            total += float(value)
        elif name == f"{ATTEMPT_METRIC}_count":
            count += int(float(value))
    return total, count


def _attempts(scheduler: localcluster.Scheduler | None) -> tuple[float, int] | None:
    if scheduler is None or scheduler.metrics_url is None:
        return None
    try:
        return scheduled_attempts(scheduler.metrics())
    except (OSError, ValueError):  # unreadable metrics cost this one figure, never the run
        return None


def _cpu_used(
    pids: Mapping[str, int], measure: Callable[[], Timing], scheduler: localcluster.Scheduler | None = None
) -> Timing:
    """``measure()`` with the CPU time each of ``pids`` used meanwhile and ``scheduler``'s mean time
    from attempt start to bound of the pods it placed meanwhile."""
    before = {k: process_cpu_s(p) for k, p in pids.items()}
    before_attempts = _attempts(scheduler)
    t = measure()
    cpu = {k: round(process_cpu_s(p) - before[k], 3) for k, p in pids.items()}
    after = _attempts(scheduler)
    to_bound_ms = None
    if before_attempts is not None and after is not None and after[1] > before_attempts[1]:
        to_bound_ms = round(1000 * (after[0] - before_attempts[0]) / (after[1] - before_attempts[1]), 3)
    return dataclasses.replace(t, cpu_s=cpu, to_bound_ms=to_bound_ms)


def run_bench(cluster: HollowCluster, *, gang_pods: int, independent_pods: int, runs: int) -> Results:
    client = cluster.client
    ns = "bench"
    ensure_namespace(client, ns)
    gpus = sum(_gpu_allocatable(client).values())
    res = Results(len(cluster.nodes), gpus, gang_pods, independent_pods)
    domain_of = _domain_of(cluster.tree)
    nodes = [n.name for n in cluster.nodes]
    pids = _processes(cluster)
    by_name = {s.name: s for s in cluster.schedulers}
    clock = PodClock(client, ns)
    try:
        for run in range(runs):
            paths = ["extender", "volcano"] if run % 2 == 0 else ["volcano", "extender"]
            for path in paths:
                gang = f"{path[:3]}-gang-{run}"
                names = [f"{gang}-{i}" for i in range(gang_pods)]
                create = _gang_creator(client, ns, path, gang, gang_pods)
                t = time_pods(client, ns, names, create, clock=clock)
                res.gang.setdefault(path, []).append(t)
                res.gang_domains.setdefault(path, []).append(
                    len({domain_of.get(n, n) for n in t.nodes.values()})
                )
                delete_pods(client, ns)
                if path == "volcano":
                    delete_podgroups(client, ns)
            order = ["plain", "extender"] if run % 2 == 0 else ["extender", "plain"]
            for how, into in (("backlog", res.independent), ("streamed", res.streamed)):
                for path in order:
                    scheduler = PLAIN_SCHEDULER if path == "plain" else EXTENDER_SCHEDULER
                    prefix = f"{path[:3]}-{how[:3]}-{run}"
                    pods = [
                        gpu_pod(f"{prefix}-{i}", scheduler=scheduler, gpus=1) for i in range(independent_pods)
                    ]
                    if how == "backlog":
                        measure = functools.partial(time_backlog, client, clock, ns, nodes, pods)
                    else:
                        names = [str(p["metadata"]["name"]) for p in pods]
                        create = functools.partial(create_pods, client, ns, pods)
                        measure = functools.partial(time_pods, client, ns, names, create, clock=clock)
                    into.setdefault(path, []).append(_cpu_used(pids, measure, by_name.get(scheduler)))
                    delete_pods(client, ns)
    finally:
        clock.close()
    return res


def _per_pod(ts: list[Timing], pods: int, scheduler: str) -> dict[str, Any]:
    def med(attr: str) -> float:
        return float(statistics.median(getattr(t, attr) for t in ts))

    to_bound = [t.to_bound_ms for t in ts if t.to_bound_ms is not None]
    cpu: dict[str, float] = {}
    for label in sorted({k for t in ts for k in t.cpu_s}):
        if label == scheduler or (label == "extender" and scheduler == EXTENDER_SCHEDULER):
            cpu[label] = round(1000 * statistics.median(t.cpu_s.get(label, 0.0) for t in ts) / pods, 2)
    return {
        "ms_per_pod_bound": round(1000 * med("bound_s") / pods, 2),
        "ms_per_pod_running": round(1000 * med("running_s") / pods, 2),
        "pods_per_s_bound": round(pods / med("bound_s"), 1),
        "pods_per_s_running": round(pods / med("running_s"), 1),
        "created_s": round(med("created_s"), 3),
        "cpu_ms_per_pod": cpu,
        "to_bound_ms": round(float(statistics.median(to_bound)), 3) if to_bound else None,
    }


def _overhead(runs: dict[str, list[Timing]], attr: str) -> tuple[float, list[float]]:
    """The extender's added time per pod: the median over runs of each run's pair (same run, same
    cluster, the two measured back to back), and every run's figure."""
    pairs = [
        round(100 * (getattr(e, attr) / getattr(p, attr) - 1), 1)
        for p, e in zip(runs.get("plain", []), runs.get("extender", []), strict=False)
        if getattr(p, attr) > 0
    ]
    return (round(float(statistics.median(pairs)), 1) if pairs else 0.0), pairs


def summary(res: Results) -> dict[str, Any]:
    out: dict[str, Any] = {
        "nodes": res.nodes,
        "gpus": res.gpus,
        "gang": {"pods": res.gang_pods, "gpus": res.gang_pods * 4},
        "independent_pods": res.independent_pods,
    }
    for path, ts in res.gang.items():
        out["gang"][path] = {
            "running_s": [round(t.running_s, 3) for t in ts],
            "bound_s": [round(t.bound_s, 3) for t in ts],
            "median_running_s": round(float(statistics.median(t.running_s for t in ts)), 3),
            "max_running_s": round(max(t.running_s for t in ts), 3),
            "nvlink_domains_used": res.gang_domains[path],
        }
    for key, runs in (("independent", res.independent), ("streamed", res.streamed)):
        scheduler = {"plain": PLAIN_SCHEDULER, "extender": EXTENDER_SCHEDULER}
        out[key] = {path: _per_pod(ts, res.independent_pods, scheduler[path]) for path, ts in runs.items()}
        if "plain" in runs and "extender" in runs:
            for what in ("bound", "running"):
                median, pairs = _overhead(runs, f"{what}_s")
                out[key][f"extender_overhead_{what}_pct"] = median
                out[key][f"extender_overhead_{what}_pct_runs"] = pairs
    return out


def render(s: dict[str, Any], *, racks: int, trays: int) -> list[str]:
    g = s["gang"]
    lines = [
        f"cluster bench: {s['nodes']} hollow GPU nodes ({racks} NVL72 rack{'s' * (racks != 1)} x {trays} "
        f"gb200-nvl72 trays), {s['gpus']} GPUs, one gpu-node-agent each",
        f"gang: {g['pods']} pods x 4 GPUs ({g['gpus']} GPUs) in one NVLink domain, create -> all Running",
    ]
    qps = s.get("scheduler_qps")
    client = f"{qps} QPS, burst {2 * qps} (--scheduler-qps)" if qps else "50 QPS, burst 100 (its default)"
    names = {"extender": "kube-scheduler + extender", "volcano": "Volcano (PodGroup, HyperNodes)"}
    for path in ("extender", "volcano"):
        if path not in g:
            continue
        d = g[path]
        runs = ", ".join(f"{x:.2f}" for x in d["running_s"])
        aim = "met" if d["max_running_s"] < 10 else "NOT met"
        lines.append(
            f"  {names[path]:<32} median {d['median_running_s']:.2f} s, max {d['max_running_s']:.2f} s "
            f"(runs: {runs}; bound: {', '.join(f'{x:.2f}' for x in d['bound_s'])}); "
            f"NVLink domains used {d['nvlink_domains_used']}; aim < 10 s: {aim}"
        )
    heads = {
        "independent": (
            f"independent 1-GPU pods, {s['independent_pods']} per run, the scheduler's own pace: created "
            "while every node is held by a taint, tried and refused once, then all released at once; "
            f"from the release, median of runs; kube-scheduler's API client {client}"
        ),
        "streamed": (
            f"the same pods created from {CREATE_THREADS} threads while the schedulers run (paced by "
            "creation as much as by scheduling); from the first create, median of runs"
        ),
    }
    for key, head in heads.items():
        part = s.get(key) or {}
        if not part:
            continue
        lines.append(head)
        for path, label in (("plain", "kube-scheduler alone"), ("extender", "kube-scheduler + extender")):
            if path in part:
                d = part[path]
                cpu = " + ".join(f"{v:.1f} ({k})" for k, v in d["cpu_ms_per_pod"].items())
                lines.append(
                    f"  {label:<32} to bound {d['ms_per_pod_bound']:.1f} ms/pod "
                    f"({d['pods_per_s_bound']:.1f} pods/s), "
                    f"to Running {d['ms_per_pod_running']:.1f} ms/pod "
                    f"({d['pods_per_s_running']:.1f} pods/s); "
                    f"CPU ms/pod: {cpu or 'n/a'}"
                    + (f"; attempt to bound {d['to_bound_ms']:.0f} ms" if d.get("to_bound_ms") else "")
                )
        if "extender_overhead_bound_pct" in part:
            runs = ", ".join(f"{x:+.1f}%" for x in part["extender_overhead_bound_pct_runs"])
            line = (
                f"  extender adds {part['extender_overhead_bound_pct']:+.1f}% per pod to bound "
                f"(runs: {runs}), "
                f"{part['extender_overhead_running_pct']:+.1f}% to Running"
            )
            if key == "independent":
                line += f"; aim < 20%: {'met' if part['extender_overhead_bound_pct'] < 20 else 'NOT met'}"
            lines.append(line)
    return lines


def _int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {low}..{high}, got {value}")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-node-agent bench cluster", description=__doc__.splitlines()[0])
    p.add_argument("--racks", type=_int_in(1, 8), default=2, help="NVL72 racks of hollow trays (default 2)")
    p.add_argument("--trays", type=_int_in(1, 18), default=18, help="trays per rack = gang pods (default 18)")
    p.add_argument("--runs", type=_int_in(1, 20), default=3, help="runs of each measurement (default 3)")
    p.add_argument(
        "--pods",
        type=_int_in(1, 1000),
        default=None,
        help="independent 1-GPU pods per run (default: GPUs / 2)",
    )
    p.add_argument(
        "--scheduler-qps",
        type=_int_in(1, 100_000),
        default=None,
        help="both kube-schedulers' API client rate, burst twice that (default: kube-scheduler's own, "
        "50 with burst 100; its bindings wait in that limit, the extender's do not)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument(
        "--systems",
        help="ours,volcano,kueue,native: one job stream through each real system instead "
        "(agent.benchmarks.systems; its options: --systems X --help)",
    )
    return p


def main(argv: list[str]) -> int:
    if any(a == "--systems" or a.startswith("--systems=") for a in argv):
        from agent.benchmarks import systems  # noqa: PLC0415

        return systems.main(argv)
    args = parser().parse_args(argv)
    from topology import logs  # noqa: PLC0415

    logs.configure("auto", "error")
    gpus = args.racks * args.trays * 4
    independent = args.pods if args.pods is not None else max(1, gpus // 2)
    if independent > gpus:
        print(f"bench cluster: --pods {independent} exceeds the cluster's {gpus} GPUs", file=sys.stderr)
        return 2
    say: Callable[[str], None] = (lambda _: None) if args.json else (lambda m: print(m, flush=True))
    with tempfile.TemporaryDirectory(prefix="gna-bench-cluster-") as tmp:
        try:
            cluster = start_hollow_cluster(
                Path(tmp),
                specs=tray_specs(racks=args.racks, trays=args.trays),
                extender=True,
                extender_process=True,
                plain_scheduler=True,
                volcano=True,
                scheduler_qps=args.scheduler_qps,
                announce=say,
            )
        except ClusterUnavailableError as exc:
            print(f"bench cluster: cannot run here: {exc}", file=sys.stderr)
            return 1
        try:
            res = run_bench(cluster, gang_pods=args.trays, independent_pods=independent, runs=args.runs)
        finally:
            cluster.stop()
    s = summary(res)
    s["scheduler_qps"] = args.scheduler_qps
    if args.json:
        print(json.dumps({"machine": machine_summary(), **s}, sort_keys=True))
    else:
        print(machine_summary())
        for line in render(s, racks=args.racks, trays=args.trays):
            print(line)
    return 0
