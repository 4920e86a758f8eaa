"""``gpu-node-agent bench cluster --systems ours,volcano,kueue,native``: one seeded job stream through
each real scheduling system in turn, on the same hollow GB200 cluster.

The cluster is :func:`agent.benchmarks.cluster.start_hollow_cluster`'s: hollow kubelets with the real
device manager, one ``gpu-node-agent run`` each, our HyperNodes. The stream (:func:`make_stream`, seeded)
mixes NVL72-style gangs (one or two subgroups of a half or a whole rack, each subgroup inside one NVLink
domain), segments (one or two 4-tray subgroups, each inside one NVLink domain) and small one-pod jobs;
runtimes of minutes are compressed to seconds. A job ends when the benchmark deletes its objects at its
runtime after all its pods are ``Running``, as a job controller would. Each system gets the stream in its
own namespace, with only its own scheduler processes running:

- ``ours``: kube-scheduler with our extender (``schedulerName: gpu-topology-scheduler``), gangs by the
  ``gpuagent.dev/*`` annotations (subgroup tier ``nvlink``);
- ``volcano``: vc-scheduler, one Volcano ``PodGroup`` per job (``subGroupPolicy``: each subgroup, by a pod
  label, hard inside tier 1 of our HyperNodes);
- ``kueue``: Kueue's controller manager (TAS) on the Topology that ``gpu-node-agent controller --export
  kueue`` writes, a ResourceFlavor on it, a ClusterQueue and a LocalQueue; indexed batch ``Job``\\ s
  (kube-controller-manager's Job controller) with ``podset-required-topology`` (one subgroup) or
  ``podset-slice-required-topology`` + ``podset-slice-size`` (several) at the export's NVLink level;
  kube-scheduler places the pods Kueue ungates;
- ``native``: kube-scheduler alone with ``GenericWorkload``/``TopologyAwareWorkloadScheduling``: a
  ``Workload`` per job and one gang ``PodGroup`` per subgroup requiring ``gpuagent.dev/nvlink-domain``.

Figures per system (:func:`figures`, pure over a :class:`Record`): share of subgroups inside one NVLink
domain, GPU allocation over time (time-weighted mean over the system's window), stranded GPUs (free GPUs
in NVLink domains that cannot host the smallest waiting subgroup), job wait (creation to the last pod
bound; a job that never started counts to the end of the window), creation to all pods ``Running``, and
half-placed gangs (some pods bound, others never within the window). A system whose binaries are not built
is reported as skipped with the build command.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agent import localcluster
from agent.benchmarks import cluster as bench
from agent.benchmarks.machine import machine_summary, percentile

SYSTEMS: tuple[str, ...] = ("ours", "volcano", "kueue", "native")
JOB_LABEL = "bench.gpuagent.dev/job"
SUBGROUP_LABEL = "bench.gpuagent.dev/subgroup"
NVLINK_LABEL = "gpuagent.dev/nvlink-domain"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
KINDS = ("gang", "segment", "small")
GPUS_PER_TRAY = 4
SEGMENT_TRAYS = 4
RUNTIME_CLAMP_S = (5.0, 60.0)
KUEUE = "kueue.x-k8s.io"
KUEUE_TOPOLOGY = "gpu-node-agent-bench"
KUEUE_FLAVOR = "gb200-bench"
KUEUE_CLUSTER_QUEUE = "bench-cq"
KUEUE_LOCAL_QUEUE = "bench"
EXPORT_FIELD_MANAGER = "kubectl"
TICK_S = 0.25
DRAIN_S = 180.0
DESCRIPTIONS = {
    "ours": "kube-scheduler + our extender (gpuagent.dev gang annotations)",
    "volcano": "vc-scheduler, PodGroup subGroupPolicy on our HyperNodes",
    "kueue": "Kueue TAS on our exported Topology + kube-scheduler",
    "native": "kube-scheduler, Workload/PodGroup topology (1.37 gates)",
}


# ------------------------------------------------------------------------------------------ the stream


@dataclass(frozen=True)
class JobSpec:
    """One job of the stream: ``pods`` pods of ``gpus_per_pod`` GPUs; consecutive blocks of
    ``subgroup_size`` pods (by rank) must each sit inside one NVLink domain (0: no constraint)."""

    name: str
    kind: str
    arrival_s: float
    runtime_s: float
    pods: int
    gpus_per_pod: int
    subgroup_size: int

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod

    @property
    def subgroups(self) -> int:
        return self.pods // self.subgroup_size if self.subgroup_size else 0

    def unit(self) -> tuple[int, int]:
        """The smallest piece that must be placed together: (pods, GPUs per pod)."""
        return (self.subgroup_size or self.pods, self.gpus_per_pod)


def make_stream(
    *, seed: int, jobs: int, racks: int, trays: int, load: float, runtime_median_s: float = 20.0
) -> list[JobSpec]:
    """A seeded job stream for ``racks`` NVL72 racks of ``trays`` 4-GPU trays: 25% NVL72-style gangs (one
    or two subgroups of a whole or half rack), 35% segments (one or two subgroups of up to 4 trays), 40%
    single pods of 1, 2 or 4 GPUs. Runtimes log-normal around ``runtime_median_s`` (sigma 0.5, clamped to
    5..60 s); exponential gaps scaled so that sum(GPUs x runtime) / (cluster GPUs x arrival span) equals
    ``load``. Raises ``ValueError`` naming a bad argument."""
    for what, value, low in (("jobs", jobs, 1), ("racks", racks, 1), ("trays", trays, 1)):
        if value < low:
            raise ValueError(f"{what} must be at least {low}, got {value}")
    if not 0 < load <= 4:
        raise ValueError(f"load must be in (0, 4], got {load}")
    if not runtime_median_s > 0:
        raise ValueError(f"runtime median must be positive, got {runtime_median_s}")
    rng = random.Random(seed)
    nodes = racks * trays
    shapes: list[tuple[str, int, int, int, float]] = []
    for _ in range(jobs):
        r = rng.random()
        if r < 0.25:
            size = rng.choice((trays, max(1, trays // 2)))
            k = rng.choice((1, 2)) if 2 * size <= nodes else 1
            kind, pods, gpus, sub = "gang", k * size, GPUS_PER_TRAY, size
        elif r < 0.60:
            size = min(SEGMENT_TRAYS, trays)
            k = rng.choice((1, 2)) if 2 * size <= nodes else 1
            kind, pods, gpus, sub = "segment", k * size, GPUS_PER_TRAY, size
        else:
            kind, pods, gpus, sub = "small", 1, rng.choice((1, 2, 4)), 0
        runtime = math.exp(rng.gauss(math.log(runtime_median_s), 0.5))
        runtime = round(min(max(runtime, RUNTIME_CLAMP_S[0]), RUNTIME_CLAMP_S[1]), 1)
        shapes.append((kind, pods, gpus, sub, runtime))
    gaps = [rng.expovariate(1.0) for _ in range(jobs)]
    work = sum(pods * gpus * runtime for _, pods, gpus, _, runtime in shapes)
    span = work / (nodes * GPUS_PER_TRAY * load)
    offsets = [0.0]
    for g in gaps[1:jobs]:
        offsets.append(offsets[-1] + g)
    scale = span / offsets[-1] if offsets[-1] > 0 else 0.0
    return [
        JobSpec(f"j{i:03d}-{kind}", kind, round(offsets[i] * scale, 2), runtime, pods, gpus, sub)
        for i, (kind, pods, gpus, sub, runtime) in enumerate(shapes)
    ]


# ------------------------------------------------------------------------------------------ the figures


@dataclass(frozen=True)
class PodRecord:
    """One pod as observed: its job and subgroup, GPUs, node, and seconds from the stream's start when it
    was first seen bound, first seen ``Running`` and deleted (None: never)."""

    job: str
    subgroup: int
    gpus: int
    node: str | None = None
    bound_s: float | None = None
    running_s: float | None = None
    gone_s: float | None = None
    failed: str | None = None  # the kubelet ended it (phase Failed): its reason


@dataclass
class Record:
    """What one system's run observed; every time in seconds from the stream's start."""

    system: str
    jobs: list[JobSpec]
    submitted: dict[str, float]
    started: dict[str, float]  # all pods Running
    ended: dict[str, float]  # the benchmark deleted it
    pods: list[PodRecord]
    window_s: float
    node_gpus: dict[str, int]
    domain_of: dict[str, str]  # node -> NVLink domain


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _p95(values: Sequence[float]) -> float | None:
    return percentile(values, 95) if values else None


def allocation_timeline(rec: Record) -> list[tuple[float, int]]:
    """(time, GPUs held by bound pods) at every change, from 0 to the window's end."""
    deltas: dict[float, int] = {}
    for p in rec.pods:
        if p.bound_s is None or p.bound_s >= rec.window_s:
            continue
        deltas[p.bound_s] = deltas.get(p.bound_s, 0) + p.gpus
        end = min(p.gone_s if p.gone_s is not None else rec.window_s, rec.window_s)
        deltas[end] = deltas.get(end, 0) - p.gpus
    out = [(0.0, 0)]
    held = 0
    for t in sorted(deltas):
        held += deltas[t]
        if held == out[-1][1]:
            continue  # a pod bound and gone at once, or one leaving as another comes
        if t == out[-1][0]:
            out[-1] = (t, held)
        else:
            out.append((t, held))
    return out


def _stranded_at(rec: Record, t: float, by_job: Mapping[str, list[PodRecord]]) -> int:
    """Free GPUs at ``t`` in NVLink domains that cannot host the smallest subgroup then waiting."""
    waiting = [
        j
        for j in rec.jobs
        if rec.submitted.get(j.name, math.inf) <= t
        and rec.ended.get(j.name, math.inf) > t
        and sum(1 for p in by_job.get(j.name, ()) if p.bound_s is not None and p.bound_s <= t) < j.pods
    ]
    if not waiting:
        return 0
    pods, g = min((j.unit() for j in waiting), key=lambda u: (u[0] * u[1], u[0]))
    used: dict[str, int] = {}
    for p in rec.pods:
        if p.node and p.bound_s is not None and p.bound_s <= t and (p.gone_s is None or p.gone_s > t):
            used[p.node] = used.get(p.node, 0) + p.gpus
    free_in: dict[str, int] = {}
    room_in: dict[str, int] = {}
    for node, gpus in rec.node_gpus.items():
        d = rec.domain_of.get(node, node)
        free = max(0, gpus - used.get(node, 0))
        free_in[d] = free_in.get(d, 0) + free
        room_in[d] = room_in.get(d, 0) + free // g
    return sum(free for d, free in free_in.items() if free and room_in[d] < pods)


def figures(rec: Record) -> dict[str, Any]:
    """The comparison's figures for one system's run (see the module docstring)."""
    by_job: dict[str, list[PodRecord]] = {}
    for p in rec.pods:
        by_job.setdefault(p.job, []).append(p)
    total = sum(rec.node_gpus.values())
    window = rec.window_s
    local = constrained = 0
    waits: list[float] = []
    to_running: list[float] = []
    half = unstarted = 0
    for j in rec.jobs:
        pods = by_job.get(j.name, [])
        bound = [p for p in pods if p.bound_s is not None]
        if j.name in rec.submitted:
            if len(bound) >= j.pods:
                waits.append(max(p.bound_s or 0.0 for p in bound) - rec.submitted[j.name])
            else:
                waits.append(max(0.0, window - rec.submitted[j.name]))
        if j.name in rec.started:
            to_running.append(rec.started[j.name] - rec.submitted[j.name])
        else:
            unstarted += 1
        if j.pods > 1 and 0 < len(bound) < j.pods:
            half += 1
        for sg in range(j.subgroups):
            members = [p for p in bound if p.subgroup == sg]
            if len(members) < j.subgroup_size:
                continue
            constrained += 1
            local += len({rec.domain_of.get(p.node or "", p.node) for p in members}) == 1
    timeline = allocation_timeline(rec)
    held_s = sum(
        a * (t1 - t0) for (t0, a), (t1, _) in zip(timeline, [*timeline[1:], (window, 0)], strict=True)
    )
    cuts = sorted(
        {0.0, window}
        | {t for t, _ in timeline}
        | {t for t in rec.submitted.values() if t < window}
        | {t for t in rec.ended.values() if t < window}
    )
    stranded_s = sum(_stranded_at(rec, t0, by_job) * (t1 - t0) for t0, t1 in itertools.pairwise(cuts))

    def r3(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {
        "jobs": len(rec.jobs),
        "started": len(rec.jobs) - unstarted,
        "unstarted": unstarted,
        "window_s": round(window, 2),
        "subgroups_placed": constrained,
        "nvlink_local_ratio": r3(local / constrained if constrained else None),
        "allocation_ratio": r3(held_s / (total * window) if total and window > 0 else None),
        "stranded_gpus_mean": r3(stranded_s / window if window > 0 else None),
        "wait_mean_s": r3(_mean(waits)),
        "wait_p95_s": r3(_p95(waits)),
        "to_running_mean_s": r3(_mean(to_running)),
        "to_running_p95_s": r3(_p95(to_running)),
        "half_placed_gangs": half,
        "failed_pods": sum(1 for p in rec.pods if p.failed),
        "failed_reasons": sorted({p.failed for p in rec.pods if p.failed}),
    }


# ------------------------------------------------------------------------------------------ observing


class PodLog(bench.PodWatch):
    """Every pod of one namespace, from one list + watch on a thread: labels, node, and the times (from
    ``t0``) it was first seen bound, first seen ``Running`` and deleted."""

    def __init__(self, client: Any, namespace: str, identify: Callable[[Mapping[str, Any]], tuple[str, int]]):
        self._identify = identify
        self._lock = threading.Lock()
        self.t0 = time.monotonic()
        self.pods: dict[str, dict[str, Any]] = {}
        super().__init__(client, namespace, name="pod-log")

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _event(self, kind: str, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        name = str(meta.get("name", ""))
        now = self.now()
        with self._lock:
            entry = self.pods.get(name)
            if entry is None:
                job, sub = self._identify(pod)
                gpus = 0
                for c in (pod.get("spec") or {}).get("containers") or ():
                    gpus += int(((c.get("resources") or {}).get("limits") or {}).get(bench.GPU, 0))
                entry = {"job": job, "subgroup": sub, "gpus": gpus, "node": None}
                entry.update(bound=None, running=None, gone=None, failed=None)
                self.pods[name] = entry
            if kind == "DELETED":
                entry["gone"] = entry["gone"] if entry["gone"] is not None else now
                return
            node = (pod.get("spec") or {}).get("nodeName")
            if node and entry["bound"] is None:
                entry["node"], entry["bound"] = str(node), now
            status = pod.get("status") or {}
            if status.get("phase") == "Running" and entry["running"] is None:
                entry["running"] = now
            if status.get("phase") in ("Failed", "Succeeded") and entry["gone"] is None:
                entry["gone"] = now  # holds nothing any more, for the scheduler as for the figures
                if status.get("phase") == "Failed":  # Succeeded: its container stopped on deletion
                    entry["failed"] = str(status.get("reason") or "Failed")

    def running(self, job: str) -> int:
        with self._lock:
            return sum(
                1 for e in self.pods.values() if e["job"] == job and e["running"] and e["gone"] is None
            )

    def live(self) -> int:
        with self._lock:
            return sum(1 for e in self.pods.values() if e["gone"] is None)

    def records(self) -> list[PodRecord]:
        with self._lock:
            return [
                PodRecord(
                    e["job"],
                    e["subgroup"],
                    e["gpus"],
                    e["node"],
                    e["bound"],
                    e["running"],
                    e["gone"],
                    e["failed"],
                )
                for e in self.pods.values()
                if e["job"]
            ]


# ------------------------------------------------------------------------------------------ the systems


class SystemSkippedError(RuntimeError):
    """The system's counterparts are not built here; the message names what and the build command."""


class System(Protocol):
    """One scheduling system: its processes, and how a job of the stream becomes its objects."""

    name: str
    jobs: Sequence[JobSpec]  # the stream being run (set by :func:`run_stream`)

    def start(self) -> None: ...
    def submit(self, job: JobSpec) -> None: ...
    def finish(self, job: JobSpec) -> None: ...
    def identify(self, pod: Mapping[str, Any]) -> tuple[str, int]: ...
    def stop(self) -> None: ...


def _labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def _by_label(pod: Mapping[str, Any]) -> tuple[str, int]:
    labels = _labels(pod)
    return str(labels.get(JOB_LABEL, "")), int(labels.get(SUBGROUP_LABEL, "0") or 0)


def job_labels(job: JobSpec, rank: int) -> dict[str, str]:
    sub = rank // job.subgroup_size if job.subgroup_size else 0
    return {JOB_LABEL: job.name, SUBGROUP_LABEL: str(sub)}


@dataclass
class Context:
    """What every system needs: the cluster, its namespace, where to write."""

    cluster: bench.HollowCluster
    counterparts: localcluster.Counterparts
    namespace: str
    workdir: Path
    fabric_file: Path
    total_gpus: int

    def kube(self) -> Any:
        from topology.kube import Kube  # noqa: PLC0415

        return Kube(self.cluster.client)

    def delete_pods(self, job: JobSpec) -> None:
        self.kube().request(
            "DELETE",
            f"/api/v1/namespaces/{self.namespace}/pods",
            query={"labelSelector": f"{JOB_LABEL}={job.name}", "gracePeriodSeconds": "1"},
        )


def _stop_all(parts: list[Any]) -> None:
    while parts:
        part = parts.pop()
        try:
            part.stop()
        except Exception as exc:  # a part that will not stop must not keep the others running
            print(f"bench cluster --systems: stopping {part!r}: {exc}", file=sys.stderr)


class Ours:
    name = "ours"
    jobs: Sequence[JobSpec] = ()

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.parts: list[Any] = []

    def start(self) -> None:
        cp, plane = self.ctx.counterparts, self.ctx.cluster.plane
        ext = bench.ExtenderProcess(plane.apiserver.kubeconfig, self.ctx.workdir)
        self.parts.append(ext)
        self.parts.append(
            localcluster.start_kube_scheduler(
                cp,
                self.ctx.workdir,
                apiserver=plane.apiserver,
                scheduler_name=bench.EXTENDER_SCHEDULER,
                extenders=[ext.scheduler_entry()],
            )
        )

    def pods(self, job: JobSpec) -> list[dict[str, Any]]:
        out = []
        for i in range(job.pods):
            ann: dict[str, str] = {}
            if job.subgroup_size:
                ann = {
                    "gpuagent.dev/gang": job.name,
                    "gpuagent.dev/gang-size": str(job.pods),
                    "gpuagent.dev/subgroup-size": str(job.subgroup_size),
                    "gpuagent.dev/subgroup-tier": "nvlink",
                    "gpuagent.dev/rank": str(i),
                }
            out.append(
                bench.gpu_pod(
                    f"{job.name}-{i}",
                    scheduler=bench.EXTENDER_SCHEDULER,
                    gpus=job.gpus_per_pod,
                    annotations=ann,
                    labels=job_labels(job, i),
                )
            )
        return out

    def submit(self, job: JobSpec) -> None:
        bench.create_pods(self.ctx.cluster.client, self.ctx.namespace, self.pods(job))

    def finish(self, job: JobSpec) -> None:
        self.ctx.delete_pods(job)

    def identify(self, pod: Mapping[str, Any]) -> tuple[str, int]:
        return _by_label(pod)

    def stop(self) -> None:
        _stop_all(self.parts)


def volcano_podgroup(job: JobSpec) -> dict[str, Any]:
    """All of the job or none; each subgroup (pods with the same subgroup label) hard inside one tier-1
    HyperNode."""
    spec: dict[str, Any] = {"minMember": job.pods, "queue": "default"}
    if job.subgroup_size:
        spec["subGroupPolicy"] = [
            {
                "name": "nvlink",
                "subGroupSize": job.subgroup_size,
                "labelSelector": {"matchLabels": {JOB_LABEL: job.name}},
                "matchLabelKeys": [SUBGROUP_LABEL],
                "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
            }
        ]
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": job.name},
        "spec": spec,
    }


class Volcano(Ours):
    name = "volcano"

    def start(self) -> None:
        cp, plane = self.ctx.counterparts, self.ctx.cluster.plane
        try:
            cp.check(["vc-scheduler"])
        except localcluster.MissingCounterpartError as exc:
            raise SystemSkippedError(str(exc)) from None
        self.parts.append(
            localcluster.start_volcano_scheduler(
                cp, self.ctx.workdir, apiserver=plane.apiserver, scheduler_name=bench.VOLCANO_SCHEDULER
            )
        )

    def pods(self, job: JobSpec) -> list[dict[str, Any]]:
        return [
            bench.gpu_pod(
                f"{job.name}-{i}",
                scheduler=bench.VOLCANO_SCHEDULER,
                gpus=job.gpus_per_pod,
                annotations={"scheduling.k8s.io/group-name": job.name},
                labels=job_labels(job, i),
            )
            for i in range(job.pods)
        ]

    def submit(self, job: JobSpec) -> None:
        self.ctx.kube().create(
            f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{self.ctx.namespace}/podgroups",
            volcano_podgroup(job),
        )
        super().submit(job)

    def finish(self, job: JobSpec) -> None:
        self.ctx.delete_pods(job)
        self.ctx.kube().delete(
            f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{self.ctx.namespace}/podgroups/{job.name}"
        )


def native_objects(job: JobSpec) -> list[tuple[str, dict[str, Any]]]:
    """(plural, object): the Workload with one gang template per subgroup, and the PodGroups."""
    templates = [
        {
            "name": f"sg{i}",
            "schedulingPolicy": {"gang": {"minCount": job.subgroup_size}},
            "schedulingConstraints": {"topology": [{"key": NVLINK_LABEL}]},
        }
        for i in range(job.subgroups)
    ]
    out: list[tuple[str, dict[str, Any]]] = [
        (
            "workloads",
            {
                "apiVersion": "scheduling.k8s.io/v1beta1",
                "kind": "Workload",
                "metadata": {"name": job.name},
                "spec": {"podGroupTemplates": templates},
            },
        )
    ]
    for t in templates:
        out.append(
            (
                "podgroups",
                {
                    "apiVersion": "scheduling.k8s.io/v1beta1",
                    "kind": "PodGroup",
                    "metadata": {"name": f"{job.name}-{t['name']}"},
                    "spec": {
                        "workloadRef": {"workloadName": job.name, "templateName": t["name"]},
                        "schedulingPolicy": t["schedulingPolicy"],
                        "schedulingConstraints": t["schedulingConstraints"],
                    },
                },
            )
        )
    return out


class Native(Ours):
    name = "native"

    def start(self) -> None:
        plane = self.ctx.cluster.plane
        self.parts.append(
            localcluster.start_kube_scheduler(
                self.ctx.counterparts,
                self.ctx.workdir,
                apiserver=plane.apiserver,
                scheduler_name=bench.PLAIN_SCHEDULER,
                feature_gates=localcluster.WORKLOAD_FEATURE_GATES,
            )
        )

    def _path(self, plural: str) -> str:
        return f"/apis/scheduling.k8s.io/v1beta1/namespaces/{self.ctx.namespace}/{plural}"

    def pods(self, job: JobSpec) -> list[dict[str, Any]]:
        out = []
        for i in range(job.pods):
            pod = bench.gpu_pod(
                f"{job.name}-{i}",
                scheduler=bench.PLAIN_SCHEDULER,
                gpus=job.gpus_per_pod,
                labels=job_labels(job, i),
            )
            if job.subgroup_size:
                pod["spec"]["schedulingGroup"] = {"podGroupName": f"{job.name}-sg{i // job.subgroup_size}"}
            out.append(pod)
        return out

    def submit(self, job: JobSpec) -> None:
        if job.subgroup_size:
            kube = self.ctx.kube()
            for plural, obj in native_objects(job):
                kube.create(self._path(plural), obj)
        super().submit(job)

    def finish(self, job: JobSpec) -> None:
        self.ctx.delete_pods(job)
        if not job.subgroup_size:
            return
        kube = self.ctx.kube()
        for plural, obj in native_objects(job):
            path = f"{self._path(plural)}/{obj['metadata']['name']}"
            kube.delete(path)
            if plural == "podgroups":  # no kube-controller-manager here to drop the protection finalizer
                with contextlib.suppress(Exception):  # already gone
                    kube.request(
                        "PATCH",
                        path,
                        body={"metadata": {"finalizers": None}},
                        content_type="application/merge-patch+json",
                    )


def kueue_job(job: JobSpec, *, level: str) -> dict[str, Any]:
    """An indexed batch Job in the bench LocalQueue: one subgroup -> the pod set required in one domain of
    ``level``; several -> each slice of ``subgroup_size`` pods in one such domain."""
    ann: dict[str, str] = {}
    if job.subgroup_size and job.subgroups == 1:
        ann[f"{KUEUE}/podset-required-topology"] = level
    elif job.subgroup_size:
        ann[f"{KUEUE}/podset-slice-required-topology"] = level
        ann[f"{KUEUE}/podset-slice-size"] = str(job.subgroup_size)
    pod = bench.gpu_pod("x", scheduler=bench.PLAIN_SCHEDULER, gpus=job.gpus_per_pod, annotations=ann)
    spec = pod["spec"]
    spec["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job.name, "labels": {f"{KUEUE}/queue-name": KUEUE_LOCAL_QUEUE}},
        "spec": {
            "parallelism": job.pods,
            "completions": job.pods,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "suspend": True,
            "template": {"metadata": {"labels": {JOB_LABEL: job.name}, "annotations": ann}, "spec": spec},
        },
    }


def kueue_setup_objects(*, total_gpus: int) -> list[tuple[str, dict[str, Any]]]:
    """(plural, object), cluster-scoped: the ResourceFlavor on the exported Topology and a ClusterQueue
    with the whole cluster as quota."""
    api = f"{KUEUE}/v1beta2"
    return [
        (
            "resourceflavors",
            {
                "apiVersion": api,
                "kind": "ResourceFlavor",
                "metadata": {"name": KUEUE_FLAVOR},
                "spec": {"nodeLabels": {"gpuagent.dev/hollow": "true"}, "topologyName": KUEUE_TOPOLOGY},
            },
        ),
        (
            "clusterqueues",
            {
                "apiVersion": api,
                "kind": "ClusterQueue",
                "metadata": {"name": KUEUE_CLUSTER_QUEUE},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory", bench.GPU],
                            "flavors": [
                                {
                                    "name": KUEUE_FLAVOR,
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": "10000"},
                                        {"name": "memory", "nominalQuota": "100Ti"},
                                        {"name": bench.GPU, "nominalQuota": str(total_gpus)},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
        ),
    ]


class Kueue:
    name = "kueue"
    jobs: Sequence[JobSpec] = ()

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.parts: list[Any] = []
        self.created: list[str] = []
        self.level = ""

    def start(self) -> None:
        cp, plane = self.ctx.counterparts, self.ctx.cluster.plane
        try:
            cp.check(["kueue-manager", "kube-controller-manager"])
            cp.crds("kueue")
        except localcluster.MissingCounterpartError as exc:
            raise SystemSkippedError(str(exc)) from None
        self.parts.append(
            localcluster.start_kube_controller_manager(cp, self.ctx.workdir, apiserver=plane.apiserver)
        )
        self.parts.append(
            localcluster.start_kueue(
                cp, self.ctx.workdir, apiserver=plane.apiserver, frameworks=("batch/job",)
            )
        )
        self.parts.append(
            localcluster.start_kube_scheduler(
                cp, self.ctx.workdir, apiserver=plane.apiserver, scheduler_name=bench.PLAIN_SCHEDULER
            )
        )
        kube = self.ctx.kube()
        topology, nodes = self.export()
        for doc in nodes:  # as `kubectl apply --server-side` would: under a manager of its own, so that
            # the agent's labels (gpuagent.dev/nvlink-domain, applied as gpu-node-agent) are left alone
            kube.apply(f"/api/v1/nodes/{doc['metadata']['name']}", doc, field_manager=EXPORT_FIELD_MANAGER)
        base = f"/apis/{KUEUE}/v1beta2"
        kube.create(f"{base}/topologies", topology)
        self.created.append(f"{base}/topologies/{KUEUE_TOPOLOGY}")
        for plural, obj in kueue_setup_objects(total_gpus=self.ctx.total_gpus):
            kube.create(f"{base}/{plural}", obj)
            self.created.append(f"{base}/{plural}/{obj['metadata']['name']}")
        lq = {
            "apiVersion": f"{KUEUE}/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": KUEUE_LOCAL_QUEUE},
            "spec": {"clusterQueue": KUEUE_CLUSTER_QUEUE},
        }
        kube.create(f"{base}/namespaces/{self.ctx.namespace}/localqueues", lq)
        self.created.append(f"{base}/namespaces/{self.ctx.namespace}/localqueues/{KUEUE_LOCAL_QUEUE}")

    def export(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """``gpu-node-agent controller --once --export kueue``, as an operator runs it."""
        import yaml  # noqa: PLC0415

        out = self.ctx.workdir / "kueue-export.yaml"
        argv = [
            *localcluster.AGENT_COMMAND,
            "controller",
            "--once",
            f"--kubeconfig={self.ctx.cluster.plane.apiserver.kubeconfig}",
            f"--ibnetdiscover={self.ctx.fabric_file}",
            "--lease-namespace=default",
            "--log-format=json",
            "--export=kueue",
            f"--output={out}",
            f"--kueue-topology={KUEUE_TOPOLOGY}",
        ]
        done = subprocess.run(
            argv, env=dict(localcluster.AGENT_ENV), capture_output=True, text=True, timeout=300, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[2:4])}: exit {done.returncode}: {done.stderr[-500:]}")
        docs = [d for d in yaml.safe_load_all(out.read_text()) if d]
        topology = next(d for d in docs if d.get("kind") == "Topology")
        self.level = next(
            lv["nodeLabel"] for lv in topology["spec"]["levels"] if lv["nodeLabel"] == NVLINK_LABEL
        )
        return topology, [d for d in docs if d.get("kind") == "Node"]

    def submit(self, job: JobSpec) -> None:
        self.ctx.kube().create(
            f"/apis/batch/v1/namespaces/{self.ctx.namespace}/jobs", kueue_job(job, level=self.level)
        )

    def finish(self, job: JobSpec) -> None:
        kube = self.ctx.kube()
        ns = self.ctx.namespace
        kube.request(
            "DELETE", f"/apis/batch/v1/namespaces/{ns}/jobs/{job.name}", body={"propagationPolicy": "Orphan"}
        )
        self.ctx.delete_pods(job)
        items, _ = kube.list(f"/apis/{KUEUE}/v1beta2/namespaces/{ns}/workloads")
        for wl in items:
            owners = (wl.get("metadata") or {}).get("ownerReferences") or []
            if any(o.get("kind") == "Job" and o.get("name") == job.name for o in owners):
                kube.delete(f"/apis/{KUEUE}/v1beta2/namespaces/{ns}/workloads/{wl['metadata']['name']}")

    def identify(self, pod: Mapping[str, Any]) -> tuple[str, int]:
        labels = _labels(pod)
        job = str(labels.get(JOB_LABEL, ""))
        index = int(labels.get(INDEX_LABEL, "0") or 0)
        size = next((j.subgroup_size for j in self.jobs if j.name == job), 0) if job else 0
        return job, index // size if size else 0

    def stop(self) -> None:
        kube = self.ctx.kube()
        for path in reversed(self.created):
            try:
                kube.delete(path)
            except Exception as exc:  # left behind: say so, stop the rest
                print(f"bench cluster --systems: deleting {path}: {exc}", file=sys.stderr)
        self.created.clear()
        _stop_all(self.parts)


SYSTEM_CLASSES: dict[str, Callable[[Context], System]] = {
    "ours": Ours,
    "volcano": Volcano,
    "kueue": Kueue,
    "native": Native,
}


# ------------------------------------------------------------------------------------------ the run


def run_stream(system: System, ctx: Context, jobs: Sequence[JobSpec], *, window_s: float) -> Record:
    """Submit ``jobs`` at their arrival times, end each ``runtime_s`` after all its pods are ``Running``,
    stop at ``window_s`` at the latest; then delete whatever is left and wait until its pods are gone."""
    system.jobs = jobs
    log = PodLog(ctx.cluster.client, ctx.namespace, system.identify)
    submitted: dict[str, float] = {}
    started: dict[str, float] = {}
    ended: dict[str, float] = {}
    queue = sorted(jobs, key=lambda j: (j.arrival_s, j.name))
    try:
        while True:
            now = log.now()
            while queue and queue[0].arrival_s <= now:
                job = queue.pop(0)
                submitted[job.name] = log.now()
                system.submit(job)
            for job in jobs:
                if job.name in submitted and job.name not in started and log.running(job.name) >= job.pods:
                    started[job.name] = log.now()
                if (
                    job.name in started
                    and job.name not in ended
                    and log.now() >= started[job.name] + job.runtime_s
                ):
                    ended[job.name] = log.now()
                    system.finish(job)
            if (not queue and len(ended) == len(jobs)) or log.now() >= window_s:
                break
            time.sleep(TICK_S)
        window = log.now()
        for job in jobs:
            if job.name in submitted and job.name not in ended:
                system.finish(job)
        localcluster.wait_until(
            lambda: log.live() == 0, what=f"pods of {ctx.namespace} gone", timeout_s=DRAIN_S
        )
        time.sleep(1.0)  # the last DELETED events
        pods = log.records()
    finally:
        log.close()
    return Record(
        system=system.name,
        jobs=list(jobs),
        submitted=submitted,
        started=started,
        ended=ended,
        pods=pods,
        window_s=window,
        node_gpus={},
        domain_of={},
    )


def node_facts(client: Any) -> tuple[dict[str, int], dict[str, str]]:
    """Each node's allocatable GPUs and its NVLink domain (the agent's ``gpuagent.dev/nvlink-domain``)."""
    gpus: dict[str, int] = {}
    domain: dict[str, str] = {}
    nodes, _ = bench._kube(client).list("/api/v1/nodes")
    for n in nodes:
        name = n["metadata"]["name"]
        gpus[name] = int(((n.get("status") or {}).get("allocatable") or {}).get(bench.GPU, "0"))
        domain[name] = (n["metadata"].get("labels") or {}).get(NVLINK_LABEL, name)
    return gpus, domain


def memory_of(cluster: bench.HollowCluster) -> int:
    """Bytes resident in the hollow nodes and their agents."""
    total = 0
    for n in cluster.nodes:
        for proc in (n.node.process, n.agent.process):
            if proc is not None and proc.alive():
                total += localcluster.group_rss_bytes(proc.pid)
    return total


def _systems(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SYSTEMS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown system(s) {bad or [text]}: choose from {','.join(SYSTEMS)}"
        )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a system named twice in {text!r}")
    return names


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-node-agent bench cluster --systems", description=__doc__.splitlines()[0]
    )
    p.add_argument("--systems", type=_systems, required=True, help=f"comma-separated, of {','.join(SYSTEMS)}")
    p.add_argument("--racks", type=bench._int_in(1, 8), default=4, help="NVL72 racks (default 4)")
    p.add_argument("--trays", type=bench._int_in(1, 18), default=18, help="trays per rack (default 18)")
    p.add_argument("--jobs", type=bench._int_in(1, 500), default=30, help="jobs in the stream (default 30)")
    p.add_argument("--seed", type=bench._int_in(0, 2**31), default=1, help="stream seed (default 1)")
    p.add_argument("--load", type=_positive_float, default=0.9, help="offered load (default 0.9)")
    p.add_argument("--runtime", type=_positive_float, default=20.0, help="median job runtime, s (default 20)")
    p.add_argument(
        "--window",
        type=_positive_float,
        default=None,
        help="seconds from the first submission after which a system stops (default: last arrival + 120)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--plot", type=Path, help="write a PNG: allocation over time and the figures per system")
    return p


COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("nvlink_local_ratio", "NVL-local", "{:.3f}"),
    ("allocation_ratio", "alloc", "{:.3f}"),
    ("stranded_gpus_mean", "stranded", "{:.1f}"),
    ("wait_mean_s", "wait mean s", "{:.1f}"),
    ("wait_p95_s", "wait p95 s", "{:.1f}"),
    ("to_running_mean_s", "to Running s", "{:.1f}"),
    ("to_running_p95_s", "Running p95 s", "{:.1f}"),
    ("half_placed_gangs", "half-placed", "{:d}"),
    ("started", "started", "{:d}"),
    ("window_s", "window s", "{:.0f}"),
)


def render(doc: Mapping[str, Any]) -> list[str]:
    c = doc["cluster"]
    lines = [
        doc["machine"],
        f"cluster: {c['nodes']} hollow GB200 trays ({c['racks']} NVL72 racks x {c['trays']}), "
        f"{c['gpus']} GPUs, "
        f"{c['nvlink_domains']} NVLink domains; hollow nodes + agents resident {c['resident_mib']} MiB",
        f"stream: {doc['stream']['jobs']} jobs (seed {doc['stream']['seed']}, load {doc['stream']['load']}: "
        f"{doc['stream']['kinds']}), runtimes {doc['stream']['runtime_s']} s",
        "",
        f"{'system':<9} " + " ".join(f"{h:>13}" for _, h, _ in COLUMNS),
    ]
    for name, row in doc["systems"].items():
        if "skipped" in row or "error" in row:
            what = "skipped" if "skipped" in row else "error"
            lines.append(f"{name:<9} {what}: {row.get('skipped') or row.get('error')}")
            continue
        cells = []
        for key, _, fmt in COLUMNS:
            v = row.get(key)
            cells.append(f"{'n/a' if v is None else fmt.format(v):>13}")
        lines.append(f"{name:<9} " + " ".join(cells))
    lines.append("")
    lines += [f"  {name}: {DESCRIPTIONS[name]}" for name in doc["systems"]]
    return lines


def _stream_summary(jobs: Sequence[JobSpec]) -> str:
    counts = {k: sum(1 for j in jobs if j.kind == k) for k in KINDS}
    return ", ".join(f"{n} {k}" for k, n in counts.items())


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    from topology import logs  # noqa: PLC0415

    logs.configure("auto", "error")
    try:
        jobs = make_stream(
            seed=args.seed,
            jobs=args.jobs,
            racks=args.racks,
            trays=args.trays,
            load=args.load,
            runtime_median_s=args.runtime,
        )
    except ValueError as exc:
        print(f"bench cluster --systems: {exc}", file=sys.stderr)
        return 2
    window = args.window if args.window is not None else max(j.arrival_s for j in jobs) + 120.0
    say: Callable[[str], None] = (lambda _: None) if args.json else (lambda m: print(m, flush=True))
    with tempfile.TemporaryDirectory(prefix="gna-bench-systems-") as tmp:
        workdir = Path(tmp)
        specs = bench.tray_specs(racks=args.racks, trays=args.trays)
        try:
            cluster = bench.start_hollow_cluster(
                workdir, specs=specs, extender=False, workload_api="native" in args.systems, announce=say
            )
        except bench.ClusterUnavailableError as exc:
            print(f"bench cluster --systems: cannot run here: {exc}", file=sys.stderr)
            return 1
        try:
            doc = compare(cluster, workdir, specs, jobs, args=args, window_s=window, say=say)
        finally:
            cluster.stop()
    if args.json:
        print(json.dumps(doc, sort_keys=True))
    else:
        for line in render(doc):
            print(line)
    if args.plot:
        from scheduler_plugin.placement.systems_plot import plot_systems  # noqa: PLC0415

        plot_systems(doc, args.plot)
    return 0


def compare(
    cluster: bench.HollowCluster,
    workdir: Path,
    specs: Sequence[localcluster.GpuNodeSpec],
    jobs: Sequence[JobSpec],
    *,
    args: argparse.Namespace,
    window_s: float,
    say: Callable[[str], None],
) -> dict[str, Any]:
    from agent.nvml.sim_sysfs import ibnetdiscover_sample  # noqa: PLC0415
    from agent.nvml.simulate import parse_spec  # noqa: PLC0415

    fabric = workdir / "ibnetdiscover.txt"
    fabric.write_text(ibnetdiscover_sample([parse_spec(s.simulate) for s in specs]))
    node_gpus, domain_of = node_facts(cluster.client)
    total = sum(node_gpus.values())
    doc: dict[str, Any] = {
        "machine": machine_summary(),
        "cluster": {
            "nodes": len(node_gpus),
            "racks": args.racks,
            "trays": args.trays,
            "gpus": total,
            "nvlink_domains": len(set(domain_of.values())),
            "resident_mib": round(memory_of(cluster) / 2**20),
        },
        "stream": {
            "jobs": len(jobs),
            "seed": args.seed,
            "load": args.load,
            "kinds": _stream_summary(jobs),
            "runtime_s": [min(j.runtime_s for j in jobs), max(j.runtime_s for j in jobs)],
            "window_s": window_s,
        },
        "systems": {},
        "timelines": {},
    }
    for name in args.systems:
        ns = f"bench-{name}"
        bench.ensure_namespace(cluster.client, ns)
        ctx = Context(cluster, localcluster.locate_counterparts(), ns, workdir / name, fabric, total)
        ctx.workdir.mkdir(parents=True, exist_ok=True)
        system = SYSTEM_CLASSES[name](ctx)
        say(f"{name}: starting {DESCRIPTIONS[name]} ...")
        try:
            system.start()
        except SystemSkippedError as exc:
            doc["systems"][name] = {"skipped": f"{exc} (build: {bench.BUILD_COMMAND})"}
            system.stop()
            continue
        except Exception as exc:  # one system that cannot start is that system's row, not the run's end
            doc["systems"][name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
            system.stop()
            continue
        say(f"{name}: {len(jobs)} jobs, at most {window_s:.0f} s ...")
        try:
            rec = run_stream(system, ctx, jobs, window_s=window_s)
        except Exception as exc:
            doc["systems"][name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
            continue
        finally:
            system.stop()
        rec.node_gpus, rec.domain_of = node_gpus, domain_of
        doc["systems"][name] = figures(rec)
        doc["timelines"][name] = [[round(t, 2), a] for t, a in allocation_timeline(rec)]
        say(f"{name}: {json.dumps(doc['systems'][name], sort_keys=True)}")
    return doc
