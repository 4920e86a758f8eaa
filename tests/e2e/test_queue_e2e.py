"""The extender's queue end to end: reservations with backfill and whole-gang preemption, on hollow GB200
trays with the real kube-scheduler calling our extender (issue 20, items 1, 2 and 5).

The trays, their agents, the NVLink HyperNodes from our topology controller and the idle-tray check are
``test_hollow_scheduling``'s (2 racks x 4 trays, one NVLink domain per rack, 4 GPUs a tray). The
extender runs with a short ``--preempt-after`` and queue interval so the scenarios take seconds. Time is
compressed: jobs declare limits of a few seconds (``gpuagent.dev/time-limit``) and the test ends each
one when its limit has passed, by deleting its pod, as a job controller would (the hollow kubelet runs
containers forever).

(a) A rack-sized gang behind a stream of small jobs: every tray busy with a job whose limit ends in
    seconds (rack 0 sooner than rack 1); the gang waits, holds rack 0 (``GangReserved`` with the
    expected start, ``gpuagent.dev/reserved-for`` on rack 0's Nodes, the extender's /metrics), small
    jobs that would run past that start keep being placed elsewhere, the gang starts within its
    estimate (plus the test's polling slack), whole, in rack 0, and the annotations go.
(b) A high-priority gang (PriorityClass value 1000) on a cluster full of low-priority gangs: after the
    wait it evicts whole gangs inside one NVLink domain through the Eviction API, runs there, and every
    other gang kept all its pods.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest

from agent import localcluster as cluster
from scheduler_plugin.queue import RESERVED_FOR
from tests.e2e import test_hollow_scheduling as hollow
from tests.e2e.test_hollow_scheduling import GPU, SCHEDULER, WAIT_S, Racks, bound, create, events, gpu_pod

# the trays, their HyperNodes and the idle-tray check, shared with that module
racks = hollow.racks
domains = hollow.domains
idle_trays = hollow.idle_trays

pytestmark = pytest.mark.e2e

LIMIT_ANN = "gpuagent.dev/time-limit"
PREEMPT_AFTER_S = 3.0
SLACK_S = 20.0  # polling, the kubelets' start-up of each pod, and a loaded 2-core CI machine


class QueueExtender:
    """``gpu-node-agent extender`` (its ``Service``) with the queue's settings made short."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import config

        from agent.commands.extender import Service, Settings

        settings = Settings(
            host="127.0.0.1",
            port=cluster.free_port(),
            kubeconfig=kubeconfig,
            barrier_timeout_s=15.0,
            reservation_ttl_s=60.0,
            max_body_bytes=32 << 20,
            watch_timeout_s=5,
            health_host="127.0.0.1",
            health_port=cluster.free_port(),
            preempt_after_s=PREEMPT_AFTER_S,
            queue_interval_s=0.5,
            # the test's job controller ends each job at its limit; the extender's eviction past the
            # limit plus this grace never races it
            time_limit_grace_s=30.0,
        )
        self.settings = settings
        self.service = Service(settings, config.new_client_from_config(config_file=kubeconfig))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.service.start(), self.loop).result(30)
        cluster.wait_until(
            lambda: all(i.synced.is_set() for i in self.service.informers), what="extender informers synced"
        )
        self.url = f"http://127.0.0.1:{settings.port}/"

    def state(self, fn: Callable[[Any], Any]) -> Any:
        with self.service.lock:
            return fn(self.service.state)

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.settings.health_port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.service.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def queue_extender(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    racks: Racks,
    domains: dict[str, set[str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[QueueExtender]:
    from tests.e2e.conftest import _require

    _require(counterparts, "kube-scheduler")
    ext = QueueExtender(str(control_plane.apiserver.kubeconfig))
    sched: cluster.Scheduler | None = None
    try:
        names = set(racks.by_name())
        cluster.wait_until(
            lambda: ext.state(
                lambda s: names <= set(s.cache.nodes) and set(domains) <= set(s.cache.hypernodes)
            ),
            what="the extender sees every tray and HyperNode",
            timeout_s=WAIT_S,
        )
        sched = cluster.start_kube_scheduler(
            counterparts,
            tmp_path_factory.mktemp("sched-queue"),
            apiserver=control_plane.apiserver,
            scheduler_name=SCHEDULER,
            extenders=[cluster.extender_entry(ext.url, managed_resource=GPU)],
        )
        yield ext
    finally:
        if sched is not None:
            sched.stop()
        ext.stop()


# ----------------------------------------------------------------------------------------------- helpers


def core(api: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api)


def job_pod(
    name: str, label: str, *, limit: float | None, node: str | None = None, **ann: str
) -> dict[str, Any]:
    annotations = dict(ann)
    if limit is not None:
        annotations[LIMIT_ANN] = str(limit)
    pod = gpu_pod(name, scheduler=SCHEDULER, label=label, annotations=annotations)
    if node is not None:  # bound straight to a tray, as if placed earlier
        pod["spec"] = {k: v for k, v in pod["spec"].items() if k not in ("schedulerName", "nodeSelector")}
        pod["spec"]["nodeName"] = node
    return pod


def gang_pods(
    name: str, n: int, label: str, *, priority_class: str | None = None, limit: float | None = None
) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        p = job_pod(
            f"{name}-{i}",
            label,
            limit=limit,
            **{
                "gpuagent.dev/gang": name,
                "gpuagent.dev/gang-size": str(n),
                "gpuagent.dev/subgroup-size": str(n),
                "gpuagent.dev/subgroup-tier": "nvlink",
                "gpuagent.dev/rank": str(i),
            },
        )
        if priority_class:
            p["spec"]["priorityClassName"] = priority_class
        out.append(p)
    return out


class JobController:
    """Ends pods whose time limit has passed since they started Running (deletes them), as a job
    controller would; counts what it ended."""

    def __init__(self, api: Any, ns: str) -> None:
        self.api, self.ns = api, ns
        self.ended: list[str] = []

    def tick(self) -> None:
        now = time.time()
        for p in core(self.api).list_namespaced_pod(self.ns).items:
            limit = (p.metadata.annotations or {}).get(LIMIT_ANN)
            if not limit or p.metadata.deletion_timestamp or not p.status.start_time:
                continue
            if p.status.start_time.timestamp() + float(limit) <= now:
                core(self.api).delete_namespaced_pod(p.metadata.name, self.ns, grace_period_seconds=0)
                self.ended.append(p.metadata.name)


def timeline(api: Any, ns: str) -> str:
    """The namespace's Events in the order they were last seen, one line each (for a failure's message)."""
    rows = sorted(
        core(api).list_namespaced_event(ns).items,
        key=lambda e: str(e.last_timestamp or e.event_time or e.metadata.creation_timestamp),
    )
    return "\n".join(
        f"{e.last_timestamp or e.event_time} {e.involved_object.name} {e.reason} x{e.count}: {e.message}"
        for e in rows
    )


def node_reserved_for(api: Any, names: list[str]) -> dict[str, str]:
    out = {}
    for n in names:
        value = (core(api).read_node(n).metadata.annotations or {}).get(RESERVED_FOR)
        if value:
            out[n] = value
    return out


def gang_bound_counts(api: Any, ns: str, gangs: dict[str, int]) -> dict[str, int]:
    return {g: len(bound(api, ns, g)) for g in gangs}


# ------------------------------------------------------------------------------------------------- tests


def test_rack_gang_behind_small_jobs_starts_within_its_reservation(
    api_client: Any,
    namespace: str,
    racks: Racks,
    queue_extender: QueueExtender,
) -> None:
    ns, label = namespace, racks.label
    rack0, rack1 = racks.names(0), racks.names(1)
    # every tray busy with a small job: rack 0's end in 6-9 s, rack 1's in 15-18 s
    for i, node in enumerate(rack0):
        create(api_client, ns, [job_pod(f"early-{i}", label, limit=6 + i, node=node)])
    for i, node in enumerate(rack1):
        create(api_client, ns, [job_pod(f"late-{i}", label, limit=15 + i, node=node)])
    cluster.wait_until(
        lambda: all(p.status.start_time for p in core(api_client).list_namespaced_pod(ns).items),
        what="the small jobs Running",
        timeout_s=WAIT_S,
    )
    create(api_client, ns, gang_pods("big", len(rack0), label))
    cluster.wait_until(
        lambda: events(api_client, ns, "GangReserved"),
        what="GangReserved Event on the gang",
        timeout_s=WAIT_S,
    )
    message = events(api_client, ns, "GangReserved")[0].message
    found = re.search(r"expected start (\S+Z)", message)
    assert found, message
    expected = datetime.fromisoformat(found.group(1).replace("Z", "+00:00")).timestamp()
    cluster.wait_until(
        lambda: node_reserved_for(api_client, rack0) == dict.fromkeys(rack0, f"{ns}/big"),
        what="gpuagent.dev/reserved-for on rack 0's Nodes",
        timeout_s=WAIT_S,
    )
    assert "gpuagent_extender_reservations 1" in queue_extender.metrics()
    assert f"gpuagent_extender_reserved_gpus {4 * len(rack0)}" in queue_extender.metrics()
    # a stream of small jobs that would run past the reservation's start: placed around it (rack 1),
    # never on rack 0; the test ends jobs as their limits pass
    jobs = JobController(api_client, ns)
    stream: list[str] = []
    deadline = expected + SLACK_S
    started_at: float | None = None
    while time.time() < deadline + WAIT_S:
        jobs.tick()
        if len(stream) < 6 and time.time() < expected:
            name = f"stream-{len(stream)}"
            create(api_client, ns, [job_pod(name, label, limit=60)])
            stream.append(name)
        got = bound(api_client, ns, "big")
        if got:  # the barrier binds the whole gang at once: the rest follow within moments, never stop
            first_bound = time.time()
            cluster.wait_until(
                lambda: len(bound(api_client, ns, "big")) == len(rack0),
                what="the whole gang bound once one pod is",
                timeout_s=30,
            )
            got = bound(api_client, ns, "big")
        for name in stream:
            node = core(api_client).read_namespaced_pod(name, ns).spec.node_name
            assert node is None or node in rack1, (
                f"{name} (limit past the reserved start) on {node}; Events:\n{timeline(api_client, ns)}"
            )
        if got:
            started_at = first_bound
            assert set(got.values()) == set(rack0)
            break
        time.sleep(0.5)
    assert started_at is not None, "the gang never started"
    assert started_at <= deadline, f"started {started_at - expected:.1f}s after its expected start"
    cluster.wait_until(
        lambda: not node_reserved_for(api_client, rack0),
        what="the reservation's annotations removed once the gang started",
        timeout_s=WAIT_S,
    )
    assert "gpuagent_extender_reservations 0" in queue_extender.metrics()
    # small jobs kept running around it: rack 1 took stream jobs as its early jobs ended
    cluster.wait_until(
        lambda: (jobs.tick(), any(n.startswith("stream-") for n in bound(api_client, ns, "stream")))[1],
        what="stream jobs placed on rack 1",
        timeout_s=WAIT_S,
    )


@pytest.fixture
def priority_classes(api_client: Any) -> Iterator[None]:
    from kubernetes import client

    sched = client.SchedulingV1Api(api_client)
    for name, value in (("e2e-gpu-high", 1000), ("e2e-gpu-low", 0)):
        try:
            sched.create_priority_class({"metadata": {"name": name}, "value": value})
        except client.ApiException as e:
            if e.status != 409:
                raise
    yield
    for name in ("e2e-gpu-high", "e2e-gpu-low"):
        sched.delete_priority_class(name)


def test_high_priority_gang_evicts_whole_gangs_in_one_domain(
    api_client: Any,
    namespace: str,
    racks: Racks,
    queue_extender: QueueExtender,
    priority_classes: None,
) -> None:
    ns, label = namespace, racks.label
    trays = racks.trays
    low = {"lo-full": trays, "lo-a": trays // 2, "lo-b": trays - trays // 2}
    for name, n in low.items():  # the whole cluster, one low-priority gang after another
        create(api_client, ns, gang_pods(name, n, label, priority_class="e2e-gpu-low"))
        cluster.wait_until(
            lambda name=name, n=n: len(bound(api_client, ns, name)) == n,
            what=f"{name} bound",
            timeout_s=WAIT_S,
        )
    before = {g: bound(api_client, ns, g) for g in low}
    create(api_client, ns, gang_pods("hi", trays, label, priority_class="e2e-gpu-high"))
    cluster.wait_until(
        lambda: len(bound(api_client, ns, "hi")) == trays,
        what="the high-priority gang bound",
        timeout_s=WAIT_S,
    )
    hi_nodes = set(bound(api_client, ns, "hi").values())
    rack_of = {n: r for r in range(len(racks.nodes)) for n in racks.names(r)}
    assert len({rack_of[n] for n in hi_nodes}) == 1, f"not in one NVLink domain: {hi_nodes}"
    live = {
        p.metadata.name
        for p in core(api_client).list_namespaced_pod(ns).items
        if not p.metadata.deletion_timestamp
    }
    for gang, placed in before.items():
        kept = {p for p in placed if p in live}
        inside = set(placed.values()) & hi_nodes
        if inside:
            assert not kept, f"{gang} lost only part of its pods: {sorted(kept)} left"
        else:
            assert kept == set(placed), f"{gang} outside the domain lost pods: {sorted(set(placed) - kept)}"
    assert events(api_client, ns, "GangPreempting")
    metrics = dict(
        line.split(" ", 1) for line in queue_extender.metrics().splitlines() if not line.startswith("#")
    )
    assert metrics["gpuagent_extender_preemptions_total"] == "1", metrics
    assert metrics["gpuagent_extender_evicted_pods_total"] == str(trays), metrics  # one rack, whole gangs
