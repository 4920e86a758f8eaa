"""``gpu-node-agent extender``: serve the kube-scheduler extender (filter / prioritize / bind).

The composition root: builds the API client and the one Kubernetes adapter (``topology.kube``), an
informer per kind the extender reads (Nodes, Pods, Volcano HyperNodes and PodGroups, KubeRay
RayClusters, ``scheduling.k8s.io`` Workloads and PodGroups, and DRA's ResourceClaims, ResourceClaimTemplates,
DeviceClasses and ResourceSlices for the GPUs pods get through claims) feeding the pure ``ExtenderState``, the
handlers (bindings and Events through the adapter) and the HTTP server once, and configures
``topology.logs``; then runs until SIGTERM/SIGINT. Shutdown order: stop accepting, answer waiting
binds, stop informers. Every kind but Nodes and Pods is optional: an API that is not served (404, a CRD
not installed, ``scheduling.k8s.io/v1beta1`` off) or forbidden (403, RBAC without it) is that source
off, logged once (``source_off`` / ``source_forbidden``), counted as empty and looked for again.

The queue (``scheduler_plugin.queue`` through ``ExtenderState``): gangs that do not fit wait in
PriorityClass-then-creation order; the head's nodes are held for it and carry the annotation
``gpuagent.dev/reserved-for: <namespace>/<gang>`` (merge-patched here, removed on release, read back
after a restart); a gang of higher priority that has waited ``--preempt-after`` seconds evicts whole
lower-priority gangs inside one domain through the Eviction API (``pods/eviction``), all of a preemption's
evictions or none: PodDisruptionBudgets are read (optional) and a victim set one would refuse is not
chosen, and every eviction is tried as a dry run before any is made (a refusal, HTTP 429, is said in an
Event on each victim pod and other victims are sought). A DaemonSet's pods, static pods and pods outside
``--preempt-namespaces`` are never victims; pods of a workload the extender does not know as a gang (a
JobSet, an MPIJob, a Kueue or coscheduling pod group, one controller's pods) are evicted together. Jobs
are read (optional) for their ``activeDeadlineSeconds``, a time limit of their pods. A declared limit
(``gpuagent.dev/time-limit``) counts only because the extender enforces it: work past it plus
``--time-limit-grace`` seconds is evicted the same way on nodes held for a waiting gang
(``--enforce-time-limits=held``), everywhere (``all``) or never (``off``, and then it counts as none).
The queue's metrics are served at ``/metrics`` on ``--health-addr``.

Trust: the extender answers kube-scheduler only. By default it listens on loopback, as a container in
the pod of its own kube-scheduler (``daemonset/base/scheduler-deployment.yaml``). On any other address
it requires TLS with a client certificate (``--tls-cert``, ``--tls-key``, ``--client-ca``: the server
side of kube-scheduler's extender ``tlsConfig``) and refuses to start without it (exit 2). Probes reach
``--health-addr``, a listener that serves ``/healthz``, ``/livez`` and ``/readyz`` and nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import ssl
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.heap import HeapKeeper
from scheduler_plugin.extender import (
    GANG_PLANNED,
    SCHEDULER_NAME,
    Extender,
    ExtenderServer,
    ExtenderState,
    ServerLimits,
    server_tls_context,
)
from scheduler_plugin.queue import RESERVED_FOR, QueueConfig, QueueError
from topology import logs
from topology.kube import (
    HYPERNODES,
    NODES,
    PODGROUPS,
    PODS,
    Informer,
    Kube,
    KubeError,
    api_client_from,
)
from topology.kube.aio import AsyncKube
from topology.kube.verbs import ClusterVerbs

log = logs.get_logger("agent.commands.extender")

COMPONENT = "gpu-topology-extender"  # Events' source.component / reportingComponent
RAYCLUSTERS = "/apis/ray.io/v1/rayclusters"  # KubeRay, every namespace
WORKLOADS = "/apis/scheduling.k8s.io/v1beta1/workloads"  # Kubernetes 1.37, gate GenericWorkload
WORKLOAD_PODGROUPS = "/apis/scheduling.k8s.io/v1beta1/podgroups"
JOBS = "/apis/batch/v1/jobs"  # a Job's activeDeadlineSeconds is its pods' time limit
PDBS = "/apis/policy/v1/poddisruptionbudgets"  # budgets a preemption's evictions must keep
DRA = "/apis/resource.k8s.io/v1/"  # GPUs pods get through claims (scheduler_plugin.claims)
SOURCES = (  # (the cache's kind, collection, optional: an API that may not be served)
    ("nodes", NODES, False),
    ("pods", PODS, False),
    ("hypernodes", HYPERNODES, True),
    ("podgroups", PODGROUPS, True),
    ("rayclusters", RAYCLUSTERS, True),
    ("workloads", WORKLOADS, True),
    ("workload_podgroups", WORKLOAD_PODGROUPS, True),
    ("jobs", JOBS, True),
    ("pdbs", PDBS, True),
    ("resourceclaims", DRA + "resourceclaims", True),
    ("resourceclaimtemplates", DRA + "resourceclaimtemplates", True),
    ("deviceclasses", DRA + "deviceclasses", True),
    ("resourceslices", DRA + "resourceslices", True),
)


QUEUE = QueueConfig()  # the queue's defaults: every queue flag's default is read from here
QUEUE_FLAGS: Mapping[str, tuple[str, str | None]] = {
    # QueueConfig field -> (flag, the word the flag takes for None); the Helm chart's extender value of
    # each is the flag in camelCase (--preempt-after: extender.preemptAfter), written in values.yaml and
    # the kustomize base with the same defaults (tests/daemonset/test_queue_defaults.py compares them)
    "preempt_after_s": ("--preempt-after", "never"),
    "reserve_after_s": ("--reserve-after", None),
    "reserve_after_limits": ("--reserve-after-limits", "off"),
    "reserve_idle_ratio": ("--reserve-idle-ratio", "off"),
    "interval_s": ("--queue-interval", None),
    "preempt_loss_ratio": ("--preempt-loss-ratio", "any"),
    "min_run_before_preempt_s": ("--min-run-before-preempt", None),
    "max_evictions": ("--max-evictions", "unlimited"),
    "preempt_namespaces": ("--preempt-namespaces", "*"),
    "enforce_time_limits": ("--enforce-time-limits", None),
    "time_limit_grace_s": ("--time-limit-grace", None),
    "reservation_ttl_s": ("--reservation-ttl", None),
    "barrier_timeout_s": ("--barrier-timeout", None),
    "repair_wait_s": ("--repair-wait", None),
}


def queue_default(name: str) -> str:
    """``QueueConfig``'s default of field ``name`` as its flag is written (None: the flag's word)."""
    value = getattr(QUEUE, name)
    if value is None:
        word = QUEUE_FLAGS[name][1]
        assert word is not None, f"{name}: a default of None needs a word for its flag"
        return word
    if isinstance(value, frozenset):
        return ",".join(sorted(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


class SourceInformer(Informer):
    """An informer that says once when its optional kind cannot be read, so the operator knows that source
    is off, and once when it comes back. Not served (404: the CRD is not installed or the API group is
    off) and forbidden (403: the service account lacks list/watch on it, e.g. RBAC older than the
    source) both count as empty and synced, and are looked for again with backoff."""

    def __init__(self, kube: Kube, path: str, sink: Any, *, kind: str, **options: Any) -> None:
        super().__init__(kube, path, sink, **options)
        self.kind = kind
        self.state: str | None = None  # "served", "not_served" or "forbidden"; None before the first list

    def list_once(self) -> str | None:
        try:
            rv = super().list_once()
            state = "served" if rv is not None else "not_served"
        except KubeError as exc:
            if exc.status != 403 or not self.optional:
                raise
            rv, state = None, "forbidden"
        if state != self.state:
            if state == "not_served":
                log.info(
                    "source_off",
                    kind=self.kind,
                    path=self.path,
                    detail="the API answers 404 (CRD not installed or API group off); counted as empty "
                    "and looked for again with backoff",
                )
            elif state == "forbidden":
                log.warning(
                    "source_forbidden",
                    kind=self.kind,
                    path=self.path,
                    detail="the API answers 403: grant the extender's service account get/list/watch on "
                    "this resource (daemonset/base/extender-rbac.yaml); counted as empty until then",
                )
            elif self.state is not None:
                log.info("source_on", kind=self.kind, path=self.path)
            self.state = state
        return rv


@dataclass(frozen=True)
class Settings:
    host: str
    port: int
    kubeconfig: str | None
    max_body_bytes: int
    watch_timeout_s: int
    log_format: str = "auto"
    log_level: str = "info"
    scheduler_name: str = SCHEDULER_NAME
    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None
    health_host: str | None = None  # None: no separate health listener
    health_port: int = 0
    max_connections: int = ServerLimits.max_connections
    # the queue's settings, defaults and meaning from QueueConfig (checked there: queue_config())
    preempt_after_s: float | None = QUEUE.preempt_after_s  # None: the queue never preempts
    reserve_after_s: float = QUEUE.reserve_after_s
    reserve_after_limits: float | None = QUEUE.reserve_after_limits  # None: off
    reserve_idle_ratio: float | None = QUEUE.reserve_idle_ratio  # None: off
    queue_interval_s: float = QUEUE.interval_s
    preempt_loss_ratio: float | None = QUEUE.preempt_loss_ratio  # None: a preemption may cost any loss
    min_run_before_preempt_s: float = QUEUE.min_run_before_preempt_s
    max_evictions: int | None = QUEUE.max_evictions  # None: no cap
    preempt_namespaces: frozenset[str] | None = QUEUE.preempt_namespaces  # None: every namespace
    enforce_time_limits: str = QUEUE.enforce_time_limits  # QueueConfig.ENFORCE_MODES
    time_limit_grace_s: float = QUEUE.time_limit_grace_s  # seconds past a declared limit before eviction
    reservation_ttl_s: float = QUEUE.reservation_ttl_s  # seconds a started plan holds while no pod comes
    barrier_timeout_s: float = QUEUE.barrier_timeout_s  # seconds a gang's binds wait for the rest
    # seconds a running gang's replacement pod waits for a ready tray of its subgroup's NVLink domain
    # before gpuagent.dev/repair: any lets it go to another domain
    repair_wait_s: float = QUEUE.repair_wait_s

    def queue_config(self) -> QueueConfig:
        """The queue's settings (``QueueConfig`` checks them: ``QueueError`` says what is wrong)."""
        return QueueConfig(
            preempt_after_s=self.preempt_after_s,
            reserve_after_s=self.reserve_after_s,
            reserve_after_limits=self.reserve_after_limits,
            reserve_idle_ratio=self.reserve_idle_ratio,
            preempt_loss_ratio=self.preempt_loss_ratio,
            min_run_before_preempt_s=self.min_run_before_preempt_s,
            max_evictions=self.max_evictions,
            interval_s=self.queue_interval_s,
            preempt_namespaces=self.preempt_namespaces,
            enforce_time_limits=self.enforce_time_limits,
            time_limit_grace_s=self.time_limit_grace_s,
            reservation_ttl_s=self.reservation_ttl_s,
            barrier_timeout_s=self.barrier_timeout_s,
            repair_wait_s=self.repair_wait_s,
        )

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost may resolve anywhere
        return False


def exposure_error(settings: Settings) -> str | None:
    """Why these settings must not start, or None: TLS settings come as a set of three, and a
    listener off loopback needs them (only kube-scheduler, holding a client certificate, may call)."""
    given = [settings.tls_cert, settings.tls_key, settings.client_ca]
    if any(given) and not all(given):
        return "--tls-cert, --tls-key and --client-ca: give all three or none"
    if not all(given) and not is_loopback(settings.host):
        return (
            f"--addr {settings.host}:{settings.port} is not a loopback address: the extender there "
            "requires TLS with client certificates (--tls-cert, --tls-key, --client-ca), or listen on "
            "127.0.0.1 in kube-scheduler's pod"
        )
    return None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"extender: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse_settings(argv: list[str]) -> Settings:
    p = _Parser(prog="gpu-node-agent extender", description="serve the kube-scheduler extender")
    p.add_argument(
        "--addr",
        default="127.0.0.1:8888",
        help="HOST:PORT to listen on (default 127.0.0.1:8888: loopback, in kube-scheduler's pod); "
        "any other address requires --tls-cert, --tls-key and --client-ca",
    )
    p.add_argument("--tls-cert", type=Path, help="server certificate (PEM) for TLS")
    p.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    p.add_argument(
        "--client-ca", type=Path, help="CA (PEM) that signed kube-scheduler's client certificate; required"
    )
    p.add_argument(
        "--health-addr",
        default="",
        help="HOST:PORT of a listener serving only /healthz, /livez and /readyz (for kubelet probes)",
    )
    p.add_argument(
        "--scheduler-name",
        default=SCHEDULER_NAME,
        help=f"spec.schedulerName of the pods this extender places and binds (default {SCHEDULER_NAME})",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=ServerLimits.max_connections,
        help="open connections at most; idle ones are closed to make room",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.add_argument(
        "--barrier-timeout",
        type=float,
        default=QUEUE.barrier_timeout_s,
        help="seconds a gang's bind calls wait for the rest of the gang (keep below httpTimeout; "
        f"default {queue_default('barrier_timeout_s')})",
    )
    p.add_argument(
        "--reservation-ttl",
        type=float,
        default=QUEUE.reservation_ttl_s,
        help=f"seconds an idle gang reservation lives (default {queue_default('reservation_ttl_s')})",
    )
    p.add_argument(
        "--repair-wait",
        type=float,
        default=QUEUE.repair_wait_s,
        help="seconds a running gang's replacement pod waits for a ready tray of its subgroup's NVLink "
        "domain before gpuagent.dev/repair: any lets it go to another domain (same-domain keeps waiting; "
        f"default {queue_default('repair_wait_s')}, from bench placement --tray-failures)",
    )
    p.add_argument(
        "--max-body-bytes", type=int, default=32 * 1024 * 1024, help="largest request body accepted"
    )
    p.add_argument(
        "--watch-timeout", type=int, default=300, help="seconds per watch request before re-watching"
    )
    p.add_argument(
        "--preempt-after",
        default=queue_default("preempt_after_s"),
        help="seconds a gang waits before it may evict whole gangs of lower priority inside one domain "
        f"(default {queue_default('preempt_after_s')}; 'never' turns gang preemption off)",
    )
    p.add_argument(
        "--reserve-after",
        type=float,
        default=QUEUE.reserve_after_s,
        help="seconds a gang waits before the queue holds nodes back for it "
        f"(default {queue_default('reserve_after_s')}; 0: at once)",
    )
    p.add_argument(
        "--reserve-after-limits",
        default=queue_default("reserve_after_limits"),
        metavar="K",
        help="besides, a gang holds nothing back until it has waited K times its own time limit "
        f"(default {queue_default('reserve_after_limits')}; 'off': only --reserve-after counts)",
    )
    p.add_argument(
        "--reserve-idle-ratio",
        default=queue_default("reserve_idle_ratio"),
        metavar="R",
        help="a gang those two keep from holding holds at once all the same when its hold keeps idle at "
        "most R times the GPU-time it will run itself (GPUs x time limit) "
        f"(default {queue_default('reserve_idle_ratio')}; 'off': never before its age)",
    )
    p.add_argument(
        "--queue-interval",
        type=float,
        default=QUEUE.interval_s,
        help="seconds between the queue's own passes (node annotations, releases, preemptions; "
        f"default {queue_default('interval_s')})",
    )
    p.add_argument(
        "--preempt-loss-ratio",
        default=queue_default("preempt_loss_ratio"),
        help="a preemption goes ahead only when its victims lose at most this times the GPU-time the "
        f"preemptor would otherwise wait (default {queue_default('preempt_loss_ratio')}; 'any' for no bound)",
    )
    p.add_argument(
        "--min-run-before-preempt",
        type=float,
        default=QUEUE.min_run_before_preempt_s,
        help="seconds a gang runs after it (re)starts before it may be preempted "
        f"(default {queue_default('min_run_before_preempt_s')})",
    )
    p.add_argument(
        "--max-evictions",
        default=queue_default("max_evictions"),
        help="times a gang may be evicted for preemption, counted while this extender runs "
        f"(default {queue_default('max_evictions')}; 'unlimited' for no cap)",
    )
    p.add_argument(
        "--preempt-namespaces",
        default=queue_default("preempt_namespaces"),
        help="comma-separated namespaces whose pods gang preemption may evict (default "
        f"'{queue_default('preempt_namespaces')}'; '*': every namespace); a DaemonSet's pods and static "
        "pods are never evicted",
    )
    p.add_argument(
        "--enforce-time-limits",
        choices=QueueConfig.ENFORCE_MODES,
        default=QUEUE.enforce_time_limits,
        help="evict pods past their declared time limit (gpuagent.dev/time-limit) plus the grace: "
        "on nodes held for a waiting gang (held), everywhere (all), or never (off: declared limits then "
        f"count as no limit); default {queue_default('enforce_time_limits')}",
    )
    p.add_argument(
        "--time-limit-grace",
        type=float,
        default=QUEUE.time_limit_grace_s,
        help="seconds a pod may run past its declared time limit before that eviction "
        f"(default {queue_default('time_limit_grace_s')})",
    )
    p.add_argument("--log-format", choices=logs.FORMATS, default="auto", help="auto: text on a TTY")
    p.add_argument("--log-level", choices=logs.LEVELS, default="info")
    a = p.parse_args(argv)
    host, port = _host_port(p, "--addr", a.addr)
    health_host, health_port = _host_port(p, "--health-addr", a.health_addr) if a.health_addr else (None, 0)
    if a.max_body_bytes < 1024:
        p.error("--max-body-bytes: must be at least 1024")
    if a.watch_timeout < 1:
        p.error("--watch-timeout: must be at least 1")
    if a.max_connections < 8:
        p.error("--max-connections: must be at least 8")
    if not a.scheduler_name:
        p.error("--scheduler-name: must not be empty")
    preempt_after = _number_or_word(p, "preempt_after_s", a.preempt_after, what="seconds")
    reserve_after_limits = _number_or_word(p, "reserve_after_limits", a.reserve_after_limits, what="a number")
    reserve_idle_ratio = _number_or_word(p, "reserve_idle_ratio", a.reserve_idle_ratio, what="a number")
    loss_ratio = _number_or_word(p, "preempt_loss_ratio", a.preempt_loss_ratio, what="a number")
    evictions = _number_or_word(p, "max_evictions", a.max_evictions, what="a whole number", whole=True)
    max_evictions = None if evictions is None else int(evictions)
    preempt_namespaces = _namespaces(p, a.preempt_namespaces)
    settings = Settings(
        host=host,
        port=port,
        kubeconfig=a.kubeconfig,
        barrier_timeout_s=a.barrier_timeout,
        reservation_ttl_s=a.reservation_ttl,
        max_body_bytes=a.max_body_bytes,
        watch_timeout_s=a.watch_timeout,
        log_format=a.log_format,
        log_level=a.log_level,
        scheduler_name=a.scheduler_name,
        tls_cert=a.tls_cert,
        tls_key=a.tls_key,
        client_ca=a.client_ca,
        health_host=health_host,
        health_port=health_port,
        max_connections=a.max_connections,
        preempt_after_s=preempt_after,
        reserve_after_s=a.reserve_after,
        reserve_after_limits=reserve_after_limits,
        reserve_idle_ratio=reserve_idle_ratio,
        queue_interval_s=a.queue_interval,
        preempt_loss_ratio=loss_ratio,
        min_run_before_preempt_s=a.min_run_before_preempt,
        max_evictions=max_evictions,
        preempt_namespaces=preempt_namespaces,
        enforce_time_limits=a.enforce_time_limits,
        time_limit_grace_s=a.time_limit_grace,
        repair_wait_s=a.repair_wait,
    )
    problem = exposure_error(settings)
    if problem:
        p.error(problem)
    try:
        settings.queue_config()  # the queue's settings are checked there, once
    except QueueError as err:
        flag, word = QUEUE_FLAGS.get(err.field or "", (f"queue setting {err.field}", None))
        detail = str(err).removeprefix(f"{err.field} ")
        p.error(f"{flag}: {detail.replace(' or None', f' or {word!r}') if word else detail}")
    return settings


def _host_port(p: _Parser, flag: str, value: str) -> tuple[str, int]:
    host, sep, port_s = value.rpartition(":")
    if not sep or not port_s.isascii() or not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        p.error(f"{flag}: expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port_s)


def _namespaces(p: argparse.ArgumentParser, value: str) -> frozenset[str] | None:
    """``--preempt-namespaces``: ``*`` (None: every namespace) or names separated by commas (the names
    are checked by ``QueueConfig``)."""
    if value.strip() == "*":
        return None
    names = frozenset(n.strip() for n in value.split(",") if n.strip())
    if not names:
        p.error("--preempt-namespaces: expected '*' or namespace names separated by commas, got nothing")
    return names


def _number_or_word(
    p: argparse.ArgumentParser, name: str, value: str, *, what: str, whole: bool = False
) -> float | None:
    """The flag of ``QueueConfig`` field ``name`` that takes a number (a whole one with ``whole``) or its
    word (None): one line on standard error and exit 2 otherwise. ``QueueConfig`` checks the range."""
    flag, word = QUEUE_FLAGS[name]
    assert word is not None
    if value.strip().lower() == word:
        return None
    try:
        return int(value) if whole else float(value)
    except ValueError:
        p.error(f"{flag}: expected {what} or {word!r}, got {value[:40]!r}")


class KubeCluster(ClusterVerbs):
    """The extender's :class:`scheduler_plugin.extender.Cluster` and ``QueueCluster``: bindings, Events,
    the ``gpuagent.dev/reserved-for`` Node and ``gpuagent.dev/gang-planned`` Pod annotations and
    evictions, through :mod:`topology.kube.verbs` (bindings on the event loop with ``aio``)."""

    def __init__(self, kube: Kube, aio: AsyncKube | None = None) -> None:
        super().__init__(
            kube, aio, component=COMPONENT, node_annotation=RESERVED_FOR, pod_annotation=GANG_PLANNED
        )


@dataclass(frozen=True)
class _StateFeed:
    """An informer's sink: one kind of the extender's ``ExtenderState``, updated under the shared lock."""

    kind: str
    state: ExtenderState
    lock: threading.Lock

    def replace(self, items: list[dict[str, Any]]) -> None:
        with self.lock:
            self.state.cache.replace(self.kind, items)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.state.cache.apply(self.kind, event_type, obj)


class Service:
    """The running extender: informers feeding the state, and the HTTP server. Startable from tests."""

    def __init__(self, settings: Settings, api_client: Any) -> None:
        """Raises ``ValueError`` for settings that must not start (see ``exposure_error``) and
        ``OSError``/``ssl.SSLError`` for TLS files that cannot be used."""
        problem = exposure_error(settings)
        if problem:
            raise ValueError(problem)
        tls: ssl.SSLContext | None = None
        if settings.tls_cert is not None and settings.tls_key is not None and settings.client_ca is not None:
            tls = server_tls_context(settings.tls_cert, settings.tls_key, settings.client_ca)
        self.settings = settings
        self.lock = threading.Lock()
        self.kube = Kube(api_client)
        self.state = ExtenderState(scheduler_name=settings.scheduler_name, queue=settings.queue_config())
        self.state.cache.synced = False  # the queue rebuilds its reservations once every informer has listed

        def reporter(kind: str) -> Callable[[BaseException], None]:
            def report(exc: BaseException) -> None:
                log.warning("informer_error", kind=kind, error=f"{type(exc).__name__}: {str(exc)[:200]}")

            return report

        self.informers = [
            SourceInformer(
                self.kube,
                path,
                _StateFeed(kind, self.state, self.lock),
                kind=kind,
                optional=optional,
                watch_timeout_s=settings.watch_timeout_s,
                retry_s=1.0,
                on_error=reporter(kind),
            )
            for kind, path, optional in SOURCES
        ]
        self.aio = AsyncKube.from_api_client(api_client)
        cluster = KubeCluster(self.kube, self.aio)
        self.extender = Extender(
            state=self.state,
            cluster=cluster,
            lock=self.lock,
            ready=lambda: all(i.synced.is_set() for i in self.informers),
            queue_cluster=cluster,
        )
        self._queue_stop = asyncio.Event()
        self._queue_task: asyncio.Task[None] | None = None
        # the listed state frozen out of the collector's full collections (``agent.heap``)
        self.heap = HeapKeeper()
        self._heap_task: asyncio.Task[None] | None = None
        limits = ServerLimits(max_connections=settings.max_connections)
        self.server = ExtenderServer(
            self.extender, max_body_bytes=settings.max_body_bytes, limits=limits, tls=tls
        )
        self.health: ExtenderServer | None = None
        if settings.health_host is not None:
            self.health = ExtenderServer(self.extender, max_body_bytes=1024, limits=limits, health_only=True)

    async def start(self) -> None:
        for inf in self.informers:
            inf.start()
        self._queue_stop.clear()
        self._queue_task = asyncio.get_running_loop().create_task(
            self.extender.run_queue(self._queue_stop, self.settings.queue_interval_s)
        )
        self._heap_task = asyncio.get_running_loop().create_task(
            self.heap.run(self._queue_stop, lambda: all(i.synced.is_set() for i in self.informers))
        )
        await self.server.start(self.settings.host, self.settings.port)
        log.info(
            "extender_listening",
            host=self.settings.host,
            port=self.server.port,
            tls="client certificates required" if self.settings.tls else "off (loopback)",
        )
        if self.health is not None and self.settings.health_host is not None:
            await self.health.start(self.settings.health_host, self.settings.health_port)
            log.info("health_listening", host=self.settings.health_host, port=self.health.port)

    async def stop(self) -> None:
        self._queue_stop.set()
        if self._queue_task is not None:
            await self._queue_task
            self._queue_task = None
        if self._heap_task is not None:
            await self._heap_task
            self._heap_task = None
            self.heap.release()
        if self.health is not None:
            await self.health.stop()
        await self.server.stop()
        for inf in self.informers:
            inf.stop_soon()
        await asyncio.gather(*(asyncio.to_thread(inf.stop, 2.0) for inf in self.informers))
        if self.aio is not None:
            await self.aio.aclose()


async def _run(settings: Settings) -> int:
    try:
        api_client = api_client_from(settings.kubeconfig)
    except Exception as exc:  # no usable credentials: one line, exit 2
        print(f"extender: cannot load Kubernetes credentials: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    try:
        service = Service(settings, api_client)
    except ValueError as exc:  # settings that must not start: one line, exit 2
        print(f"extender: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # unusable TLS files (ssl.SSLError is an OSError): one line, exit 2
        detail = " ".join(
            (exc.strerror if exc.strerror and not isinstance(exc, ssl.SSLError) else str(exc)).split()
        )
        print(
            f"extender: cannot use --tls-cert {settings.tls_cert}, --tls-key {settings.tls_key}, "
            f"--client-ca {settings.client_ca}: {detail}",
            file=sys.stderr,
        )
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await service.start()
    except OSError as exc:
        print(f"extender: cannot listen: {exc.strerror or exc}", file=sys.stderr)
        await service.stop()
        return 2
    await stop.wait()
    log.info("extender_stopping")
    await service.stop()
    return 0


# The interpreter hands the GIL from thread to thread every 5 ms by default. The extender's event loop
# answers kube-scheduler (filter, prioritize, bind) while worker threads decide the queue's passes and the
# informers apply events, CPU-bound Python all; each hand-over the loop waits for can cost it a whole
# interval, several times a call. At 0.5 ms, `gpu-node-agent bench extender --trays 9216 --seconds 20`
# (200 events/s) measured the gang-pod filter p99 under events 55 and 79 ms without, 40 and 42 ms with, in
# two pairs of runs side by side; the passes' throughput is not what kube-scheduler waits for.
GIL_SWITCH_INTERVAL_S = 0.0005


def tune_interpreter() -> None:
    """The extender process's interpreter settings (``GIL_SWITCH_INTERVAL_S``); the process-wide part of
    the composition, so it is set by ``main`` (and the bench that stands in for it), not by ``Service``."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


def main(argv: list[str]) -> int:
    settings = parse_settings(argv)
    logs.configure(settings.log_format, settings.log_level)
    tune_interpreter()
    return asyncio.run(_run(settings))
