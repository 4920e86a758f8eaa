"""Start and stop the real counterparts on loopback: etcd, kube-apiserver, kube-scheduler, Volcano's
scheduler and the kubelet device-manager harness (``tests/e2e/counterparts/dmharness``), hollow GPU nodes,
and the operators users run on top (vc-controller-manager, the KubeRay operator, Kueue,
kube-controller-manager's Job controller).

Used by the e2e tests and by ``gpu-node-agent demo`` (which publishes to this control plane when it is
built). The binaries come from ``tests/e2e/counterparts/build.sh``, run by the test command (see the
README); :func:`locate_counterparts` finds them in the per-machine cache. Every component runs as its
own process group with its log in the run folder, listens on a free 127.0.0.1 port, keeps its data in
that folder, and is stopped (group killed) by its ``stop()``. Nothing here depends on pytest.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import yaml

COUNTERPARTS_SRC = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "counterparts"
VERSIONS_FILE = COUNTERPARTS_SRC / "versions.env"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "vc-scheduler", "dmharness")
DIR_ENV = "GPU_NODE_AGENT_COUNTERPARTS_DIR"
FIELD_MANAGER = "gpu-node-agent"
MERGE_PATCH = "application/merge-patch+json"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NAMESPACES = "/api/v1/namespaces"
START_TIMEOUT_S = 180.0


class MissingCounterpartError(RuntimeError):
    """A binary or file that build.sh should have produced is not there."""


class StartupError(RuntimeError):
    """A component exited or did not become ready in time; the message carries its log tail."""


# -------------------------------------------------------------------------------------------- binaries


def versions() -> dict[str, str]:
    """The pinned versions from counterparts/versions.env (KEY=VALUE lines)."""
    out: dict[str, str] = {}
    for raw in VERSIONS_FILE.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def default_counterparts_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where build.sh puts its output: <cache>/gpu-node-agent/<first 16 hex of sha256(versions.env)>."""
    if environ.get(DIR_ENV):
        return Path(environ[DIR_ENV])
    cache = Path(environ.get("XDG_CACHE_HOME") or Path(environ.get("HOME", "~")).expanduser() / ".cache")
    digest = hashlib.sha256(VERSIONS_FILE.read_bytes()).hexdigest()[:16]
    return cache / "gpu-node-agent" / digest


@dataclass(frozen=True)
class Counterparts:
    """The built binaries and Volcano's CRD files."""

    root: Path

    def binary(self, name: str) -> Path:
        path = self.root / "bin" / name
        if not os.access(path, os.X_OK):
            raise MissingCounterpartError(
                f"{name}: no executable at {path}; build it with tests/e2e/counterparts/build.sh"
            )
        return path

    def volcano_crds(self) -> list[Path]:
        files = sorted((self.root / "crd" / "volcano").glob("*.yaml"))
        if not files:
            raise MissingCounterpartError(
                f"Volcano CRDs: none in {self.root / 'crd' / 'volcano'}; run tests/e2e/counterparts/build.sh"
            )
        return files

    def crds(self, component: str) -> list[Path]:
        """The CRD files build.sh copied from a component's module (``kuberay``, ``kueue``,
        ``volcano-jobflow``, ...)."""
        files = sorted((self.root / "crd" / component).glob("*.yaml"))
        if not files:
            raise MissingCounterpartError(
                f"{component} CRDs: none in {self.root / 'crd' / component}; run {BUILD_COMMAND}"
            )
        return files

    def check(self, names: Iterable[str] = BINARIES) -> None:
        for name in names:
            self.binary(name)


def locate_counterparts(environ: Mapping[str, str] = os.environ) -> Counterparts:
    return Counterparts(default_counterparts_dir(environ))


# ------------------------------------------------------------------------------------------- processes


_PORTS_LOW, _PORTS_HIGH = 20000, 32767  # below Linux's default ephemeral range (32768-60999)
_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, outside the kernel's ephemeral range.

    A port the kernel handed out for ``bind(0)`` comes from the same range it takes source ports of
    outgoing connections from, so with many clients (agents, kubelets, informers) one of their
    connections may take it before the process it was meant for binds it ("address already in use").
    Ports below that range are never taken that way; a random start and the ports this process has
    handed out already keep two callers apart."""
    low, high = _ephemeral_range()
    top = min(_PORTS_HIGH, low - 1) if low > _PORTS_LOW + 1000 else _PORTS_HIGH
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(_PORTS_LOW, top)
        if port in _handed_out or low <= port <= high:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a crowded host: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ManagedProcess:
    """One counterpart process in its own process group, logging to a file."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(("$ " + " ".join(self.argv) + "\n").encode())
            log.flush()
            self._proc = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(self.env) if self.env is not None else None,
            )
        return self

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"{self.name} was not started")
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status once it has exited (``None`` while it runs or before it started)."""
        return self._proc.poll() if self._proc is not None else None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after the grace period."""
        proc = self._proc
        if proc is None:
            return
        try:
            pgid = os.getpgid(proc.pid)
        except ProcessLookupError:
            pgid = proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        self._proc = None


def wait_until(
    ready: Callable[[], bool],
    *,
    what: str,
    process: ManagedProcess | None = None,
    timeout_s: float = START_TIMEOUT_S,
    interval_s: float = 0.2,
) -> None:
    """Poll ``ready`` until true; fail early with the log tail when ``process`` exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and not process.alive():
            raise StartupError(
                f"{what}: {process.name} exited; log {process.log_path}:\n{process.log_tail()}"
            )
        with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
            if ready():
                return
        if time.monotonic() > deadline:
            tail = f"; log {process.log_path}:\n{process.log_tail()}" if process is not None else ""
            raise StartupError(f"{what}: not ready after {timeout_s:.0f}s{tail}")
        time.sleep(interval_s)


# ---------------------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Pki:
    """A throw-away CA, the API server's serving cert, an admin client cert and the SA signing key."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str) -> None:
    try:
        subprocess.run(["openssl", *args], check=True, capture_output=True)
    except FileNotFoundError as e:
        raise MissingCounterpartError("openssl: not on PATH (Debian package 'openssl')") from e
    except subprocess.CalledProcessError as e:
        raise StartupError(
            f"openssl {' '.join(args[:2])}: {e.stderr.decode(errors='replace').strip()}"
        ) from e


def make_pki(directory: Path) -> Pki:
    """Generate certificates with the openssl CLI (EC P-256, one day)."""
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=d / "ca.crt",
        ca_key=d / "ca.key",
        server_cert=d / "apiserver.crt",
        server_key=d / "apiserver.key",
        admin_cert=d / "admin.crt",
        admin_key=d / "admin.key",
        sa_key=d / "sa.key",
        sa_pub=d / "sa.pub",
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", str(pki.ca_key), "-out", str(pki.ca_cert), "-days", "1",
             "-subj", "/CN=gpu-node-agent-e2e-ca")  # fmt: skip
    ext = d / "apiserver.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n"
    )
    _issue(pki, pki.server_key, pki.server_cert, "/CN=kube-apiserver", ext)
    client_ext = d / "client.ext"
    client_ext.write_text("extendedKeyUsage=clientAuth\n")
    _issue(pki, pki.admin_key, pki.admin_cert, "/O=system:masters/CN=e2e-admin", client_ext)
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", str(pki.sa_key)
    )
    _openssl("pkey", "-in", str(pki.sa_key), "-pubout", "-out", str(pki.sa_pub))
    return pki


def _issue(pki: Pki, key: Path, cert: Path, subject: str, ext: Path) -> None:
    csr = cert.with_suffix(".csr")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-new", *ec, "-keyout", str(key), "-out", str(csr), "-subj", subject)
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(pki.ca_key),
             "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))  # fmt: skip


# ----------------------------------------------------------------------------------- etcd + API server


@dataclass
class Etcd:
    process: ManagedProcess
    client_url: str

    def stop(self) -> None:
        self.process.stop()


def start_etcd(counterparts: Counterparts, workdir: Path) -> Etcd:
    client_port, peer_port = free_port(), free_port()
    client_url = f"http://127.0.0.1:{client_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    argv = [
        str(counterparts.binary("etcd")),
        "--name=e2e",
        f"--data-dir={workdir / 'etcd-data'}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=e2e={peer_url}",
        "--unsafe-no-fsync",  # throw-away data; fsync makes a loaded test machine crawl
        "--log-level=warn",
    ]
    proc = ManagedProcess("etcd", argv, workdir / "logs" / "etcd.log").start()
    etcd = Etcd(proc, client_url)
    try:
        wait_until(lambda: _http_ok(f"{client_url}/health"), what="etcd /health", process=proc)
    except BaseException:
        etcd.stop()
        raise
    return etcd


@dataclass
class ApiServer:
    """A running kube-apiserver with an admin kubeconfig (client cert in system:masters)."""

    process: ManagedProcess
    url: str
    kubeconfig: Path
    pki: Pki
    _kube: Any = field(default=None, init=False, repr=False, compare=False)  # topology.kube.Kube of get()

    def api_client(self) -> Any:
        """A fresh ``ApiClient`` for the admin user, from :func:`topology.kube.api_client_from` (the
        caller closes it)."""
        from topology.kube import api_client_from

        return api_client_from(str(self.kubeconfig))

    def get(self, path: str) -> tuple[int, bytes]:
        """GET ``path`` as admin through :class:`topology.kube.Kube`; returns (status, body), a refusal
        included. No answer (refused, reset, timed out) raises ``ConnectionError``."""
        from topology.kube import Kube, KubeError

        if self._kube is None:
            self._kube = Kube(self.api_client(), request_timeout_s=5.0)
        try:
            return self._kube.read(path)  # type: ignore[no-any-return]
        except KubeError as exc:
            raise ConnectionError(str(exc)) from None

    def stop(self) -> None:
        try:
            self.process.stop()
        finally:
            if self._kube is not None:
                self._kube.api_client.close()
                self._kube = None


def write_kubeconfig(path: Path, *, server: str, pki: Pki) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "e2e", "cluster": {"server": server, "certificate-authority": str(pki.ca_cert)}}
        ],
        "users": [
            {
                "name": "admin",
                "user": {"client-certificate": str(pki.admin_cert), "client-key": str(pki.admin_key)},
            }
        ],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


WORKLOAD_FEATURE_GATES: Mapping[str, bool] = {
    "GenericWorkload": True,
    "TopologyAwareWorkloadScheduling": True,
    "CompositePodGroup": True,
}
"""Kubernetes' own gang and topology scheduling (``scheduling.k8s.io`` Workload/PodGroup and
CompositePodGroup): the gates for kube-apiserver and kube-scheduler. Off by default in 1.37, and so off in
the shared control plane."""
WORKLOAD_RUNTIME_CONFIG: tuple[str, ...] = (
    "scheduling.k8s.io/v1beta1=true",
    "scheduling.k8s.io/v1alpha3=true",
)
"""``--runtime-config`` that serves Workload/PodGroup (v1beta1) and CompositePodGroup (v1alpha3 only)."""


def feature_gates_flag(gates: Mapping[str, bool] | None) -> list[str]:
    """``["--feature-gates=A=true,B=false"]`` (names sorted), or ``[]`` for none."""
    if not gates:
        return []
    return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items()))]


def start_apiserver(
    counterparts: Counterparts,
    workdir: Path,
    *,
    etcd: Etcd,
    feature_gates: Mapping[str, bool] | None = None,
    runtime_config: Sequence[str] = (),
) -> ApiServer:
    """kube-apiserver on loopback; ``feature_gates`` and ``runtime_config`` (``group/version=true``) for APIs
    that are off by default (:data:`WORKLOAD_FEATURE_GATES`, :data:`WORKLOAD_RUNTIME_CONFIG`)."""
    pki = make_pki(workdir / "pki")
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    argv = [
        str(counterparts.binary("kube-apiserver")),
        f"--etcd-servers={etcd.client_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki.server_cert}",
        f"--tls-private-key-file={pki.server_key}",
        f"--client-ca-file={pki.ca_cert}",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--authorization-mode=Node,RBAC",
        # No controller manager here: nothing creates service accounts (pods would be rejected for lacking
        # one) and no node lifecycle controller lifts the not-ready taint that TaintNodesByCondition puts
        # on every new Node (fake Nodes are created Ready).
        "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
        # 127.0.0.1 is not a valid Endpoints address; nothing reaches the API server through a Service.
        "--endpoint-reconciler-type=none",
        f"--cert-dir={workdir / 'apiserver-certs'}",
        "--profiling=false",
        *feature_gates_flag(feature_gates),
        *([f"--runtime-config={','.join(runtime_config)}"] if runtime_config else []),
    ]
    proc = ManagedProcess("kube-apiserver", argv, workdir / "logs" / "kube-apiserver.log").start()
    server = ApiServer(proc, url, write_kubeconfig(workdir / "admin.kubeconfig", server=url, pki=pki), pki)
    try:
        wait_until(lambda: server.get("/readyz")[0] == 200, what="kube-apiserver /readyz", process=proc)
    except BaseException:
        server.stop()
        raise
    return server


@dataclass
class ControlPlane:
    """etcd + kube-apiserver, stopped in reverse order."""

    etcd: Etcd
    apiserver: ApiServer
    workdir: Path

    def stop(self) -> None:
        self.apiserver.stop()
        self.etcd.stop()


def start_control_plane(
    counterparts: Counterparts,
    workdir: Path,
    *,
    feature_gates: Mapping[str, bool] | None = None,
    runtime_config: Sequence[str] = (),
) -> ControlPlane:
    etcd = start_etcd(counterparts, workdir)
    try:
        apiserver = start_apiserver(
            counterparts, workdir, etcd=etcd, feature_gates=feature_gates, runtime_config=runtime_config
        )
    except BaseException:
        etcd.stop()
        raise
    return ControlPlane(etcd, apiserver, workdir)


def _http_ok(url: str, *, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3, context=context) as resp:
            return int(resp.status) == 200
    except urllib.error.HTTPError:
        return False


# ------------------------------------------------------------------------------------------ schedulers


@dataclass
class Scheduler:
    process: ManagedProcess
    name: str
    config_path: Path
    metrics_url: str | None = None  # kube-scheduler's /metrics (loopback, no credentials needed)

    def stop(self) -> None:
        self.process.stop()

    def metrics(self) -> str:
        """The scheduler's Prometheus text (``metrics_url``); ``RuntimeError`` when it has none."""
        if self.metrics_url is None:
            raise RuntimeError(f"scheduler {self.name} serves no metrics here")
        with urllib.request.urlopen(self.metrics_url, timeout=5, context=_loopback_tls()) as resp:
            return str(resp.read().decode())


def _loopback_tls() -> ssl.SSLContext:
    """A client context for a loopback server's own self-signed serving certificate."""
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    return insecure


def kube_scheduler_config(
    *,
    kubeconfig: Path,
    scheduler_name: str,
    extenders: Sequence[Mapping[str, Any]] = (),
    client_qps: int | None = None,
) -> dict[str, Any]:
    """A KubeSchedulerConfiguration: one profile, every node scored, the given extenders (top level);
    ``client_qps``: its API client's rate (burst twice that; None: kube-scheduler's default, 50/100)."""
    connection: dict[str, Any] = {"kubeconfig": str(kubeconfig)}
    if client_qps is not None:
        connection |= {"qps": client_qps, "burst": 2 * client_qps}
    cfg: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": connection,
        "leaderElection": {"leaderElect": False},
        "percentageOfNodesToScore": 100,
        "profiles": [{"schedulerName": scheduler_name}],
    }
    if extenders:
        cfg["extenders"] = [dict(e) for e in extenders]
    return cfg


def extender_entry(
    url: str, *, managed_resource: str | None = None, tls: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """kube-scheduler's ``extenders`` entry for our extender at ``url`` (filter, prioritize, bind and
    preempt: kube-scheduler's own preemption asks it, so it never takes part of a gang; ``tls``: the
    ``tlsConfig`` client side, ``certFile``/``keyFile``/``caFile``, with ``enableHTTPS``)."""
    entry: dict[str, Any] = {
        "urlPrefix": url,
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "bindVerb": "bind",
        "preemptVerb": "preempt",
        "weight": 5,
        "nodeCacheCapable": True,
        "httpTimeout": "30s",
        "ignorable": False,
    }
    if tls is not None:
        entry["enableHTTPS"] = True
        entry["tlsConfig"] = dict(tls)
    if managed_resource is not None:
        entry["managedResources"] = [{"name": managed_resource, "ignoredByScheduler": False}]
    return entry


def start_kube_scheduler(
    counterparts: Counterparts,
    workdir: Path,
    *,
    apiserver: ApiServer,
    scheduler_name: str = "default-scheduler",
    extenders: Sequence[Mapping[str, Any]] = (),
    feature_gates: Mapping[str, bool] | None = None,
    client_qps: int | None = None,
) -> Scheduler:
    """kube-scheduler with ``extenders`` (KubeSchedulerConfiguration ``extenders`` entries) and
    ``feature_gates`` (e.g. :data:`WORKLOAD_FEATURE_GATES`: its gang and topology plugins join the default
    profile); ``client_qps``: see :func:`kube_scheduler_config`."""
    d = workdir / f"kube-scheduler-{scheduler_name}"
    d.mkdir(parents=True, exist_ok=True)
    cfg_path = d / "config.yaml"
    cfg = kube_scheduler_config(
        kubeconfig=apiserver.kubeconfig,
        scheduler_name=scheduler_name,
        extenders=extenders,
        client_qps=client_qps,
    )
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    port = free_port()
    argv = [
        str(counterparts.binary("kube-scheduler")),
        f"--config={cfg_path}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={d / 'certs'}",
        # its histograms (attempt to bound, algorithm) for the benchmarks: loopback, no credentials
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        *feature_gates_flag(feature_gates),
    ]
    proc = ManagedProcess(
        f"kube-scheduler[{scheduler_name}]", argv, workdir / "logs" / f"{d.name}.log"
    ).start()
    sched = Scheduler(proc, scheduler_name, cfg_path, f"https://127.0.0.1:{port}/metrics")
    try:
        wait_until(
            lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", context=_loopback_tls()),
            what="kube-scheduler /healthz",
            process=proc,
        )
    except BaseException:
        sched.stop()
        raise
    return sched


VOLCANO_SCHEDULER_CONF: dict[str, Any] = {
    # deployment.md §7.3: gang in tier 1, network-topology-aware binpacking GPUs in tier 2.
    "actions": "enqueue, allocate, backfill",
    "tiers": [
        {"plugins": [{"name": "priority"}, {"name": "gang"}, {"name": "conformance"}]},
        {
            "plugins": [
                {"name": "drf"},
                {"name": "predicates"},
                {"name": "proportion"},
                {"name": "nodeorder"},
                {"name": "binpack"},
                {
                    "name": "network-topology-aware",
                    "arguments": {
                        "weight": 10,
                        "hypernode.binpack.resources": "nvidia.com/gpu",
                        "hypernode.binpack.resources.nvidia.com/gpu": 2,
                    },
                },
            ]
        },
    ],
}


def start_volcano_scheduler(
    counterparts: Counterparts,
    workdir: Path,
    *,
    apiserver: ApiServer,
    scheduler_name: str = "volcano",
    conf: Mapping[str, Any] = VOLCANO_SCHEDULER_CONF,
) -> Scheduler:
    """vc-scheduler; Volcano's CRDs must be installed first. Ready once it has created its default queue."""
    d = workdir / "vc-scheduler"
    d.mkdir(parents=True, exist_ok=True)
    conf_path = d / "volcano-scheduler.conf"
    conf_path.write_text(yaml.safe_dump(dict(conf), sort_keys=False))
    argv = [
        str(counterparts.binary("vc-scheduler")),
        f"--kubeconfig={apiserver.kubeconfig}",
        f"--scheduler-conf={conf_path}",
        f"--scheduler-name={scheduler_name}",
        "--leader-elect=false",
        "--schedule-period=200ms",
        f"--listen-address=127.0.0.1:{free_port()}",
        f"--healthz-address=127.0.0.1:{free_port()}",
        f"--cache-dump-dir={d}",
        f"--plugins-dir={d / 'plugins'}",
        "--logtostderr",
        "-v=3",
    ]
    proc = ManagedProcess("vc-scheduler", argv, workdir / "logs" / "vc-scheduler.log").start()
    sched = Scheduler(proc, scheduler_name, conf_path)
    try:
        wait_until(
            lambda: apiserver.get("/apis/scheduling.volcano.sh/v1beta1/queues/default")[0] == 200,
            what="vc-scheduler default queue",
            process=proc,
        )
        open_queue(apiserver, "default")
    except BaseException:
        sched.stop()
        raise
    return sched


def open_queue(apiserver: ApiServer, name: str) -> None:
    """Set a Volcano Queue's status to Open, the queue controller's job (vc-controller-manager is not run
    here); vc-scheduler allocates nothing from a queue whose state is not Open."""
    from topology.kube import Kube

    with apiserver.api_client() as api:
        Kube(api).request(
            "PATCH",
            f"/apis/scheduling.volcano.sh/v1beta1/queues/{name}/status",
            body={"status": {"state": "Open"}},
            content_type=MERGE_PATCH,
        )


# ------------------------------------------------------------------------------------------------ operators


@dataclass
class Operator:
    """A running operator (a controller manager): its process, and what to remove from the API server
    when it stops (webhook configurations that would otherwise send requests to a dead port)."""

    name: str
    process: ManagedProcess
    cleanup: Callable[[], None] | None = None

    def stop(self) -> None:
        try:
            if self.cleanup is not None:
                self.cleanup()
        finally:
            self.process.stop()

    def rss_bytes(self) -> int:
        """VmRSS of its process group (the wrapper shell or unshare included)."""
        return group_rss_bytes(self.process.pid) if self.process.alive() else 0


def _start_operator(
    name: str,
    argv: Sequence[str],
    log_path: Path,
    *,
    ready: Callable[[], bool],
    env: Mapping[str, str] | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> Operator:
    """Start ``argv`` and wait for ``ready``; a binary that cannot run, or that refuses its flags (exit 2,
    built from an older source), is one line naming the build command."""
    proc = ManagedProcess(name, argv, log_path, env=env)
    try:
        proc.start()
    except OSError as e:  # a truncated or foreign binary: "Exec format error"
        raise MissingCounterpartError(
            f"{name}: cannot run {argv[0]} ({e.strerror or e}); rebuild it with {BUILD_COMMAND}"
        ) from None
    try:
        wait_until(ready, what=f"{name} ready", process=proc, timeout_s=timeout_s)
    except StartupError:
        code = proc.returncode
        proc.stop()
        if code in (2, 126, 127):  # bad flag / not executable / not found, also behind a wrapper
            raise MissingCounterpartError(
                f"{name}: exited with {code} at start (log {log_path}: "
                f"{proc.log_tail(1).strip()!r}); rebuild it with {BUILD_COMMAND}"
            ) from None
        raise
    except BaseException:
        proc.stop()
        raise
    return Operator(name, proc)


def _operator_env(kubeconfig: Path, home: Path) -> dict[str, str]:
    """An operator's whole environment: the admin kubeconfig and nothing of the caller's."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "KUBECONFIG": str(kubeconfig)}


def start_kube_controller_manager(
    counterparts: Counterparts,
    workdir: Path,
    *,
    apiserver: ApiServer,
    controllers: Sequence[str] = ("job-controller",),
    feature_gates: Mapping[str, bool] | None = None,
) -> Operator:
    """kube-controller-manager running only ``controllers`` (default: the Job controller, which makes a
    batch Job's pods); ready when its /healthz answers. No service-account controllers: the test API
    server admits pods without service accounts."""
    d = workdir / "kube-controller-manager"
    d.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [
        str(counterparts.binary("kube-controller-manager")),
        f"--kubeconfig={apiserver.kubeconfig}",
        f"--authentication-kubeconfig={apiserver.kubeconfig}",
        f"--authorization-kubeconfig={apiserver.kubeconfig}",
        f"--controllers={','.join(controllers)}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={d / 'certs'}",
        "--use-service-account-credentials=false",
        *feature_gates_flag(feature_gates),
    ]
    return _start_operator(
        "kube-controller-manager",
        argv,
        workdir / "logs" / "kube-controller-manager.log",
        ready=lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", context=_loopback_tls()),
        env=_operator_env(apiserver.kubeconfig, d),
    )


VOLCANO_CONTROLLERS: tuple[str, ...] = (
    "job-controller",
    "pg-controller",
    "queue-controller",
    "gc-controller",
)
"""vc-controller-manager's controllers the tests run: Volcano Jobs, PodGroups for plain pods, Queue state
and finished-job clean-up. Not the HyperNode discovery controller (our topology controller owns
HyperNodes), nor JobFlow, CronJob, colocation or sharding."""


def start_volcano_controllers(
    counterparts: Counterparts,
    workdir: Path,
    *,
    apiserver: ApiServer,
    scheduler_name: str = "volcano",
    controllers: Sequence[str] = VOLCANO_CONTROLLERS,
) -> Operator:
    """vc-controller-manager (Volcano's CRDs must be installed); ready when its /healthz answers."""
    d = workdir / "vc-controller-manager"
    d.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [
        str(counterparts.binary("vc-controller-manager")),
        f"--kubeconfig={apiserver.kubeconfig}",
        "--leader-elect=false",
        f"--scheduler-name={scheduler_name}",
        f"--controllers={','.join(controllers)}",
        "--enable-healthz=true",
        f"--healthz-address=127.0.0.1:{port}",
        f"--listen-address=127.0.0.1:{free_port()}",
        "--logtostderr",
        "-v=2",
    ]
    return _start_operator(
        "vc-controller-manager",
        argv,
        workdir / "logs" / "vc-controller-manager.log",
        ready=lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"),
        env=_operator_env(apiserver.kubeconfig, d),
    )


def start_kuberay_operator(
    counterparts: Counterparts,
    workdir: Path,
    *,
    apiserver: ApiServer,
    batch_scheduler: str | None = "volcano",
    init_containers: bool = False,
) -> Operator:
    """The KubeRay operator (the ray.io CRDs, and Volcano's with ``batch_scheduler="volcano"``, must be
    installed). With Volcano it makes one Volcano PodGroup per RayCluster and gives its pods
    ``schedulerName: volcano``; with ``None`` it leaves scheduling alone (for Kueue). Ready on /readyz.
    ``init_containers``: KubeRay's own wait-for-GCS init container in worker pods (its default is on);
    off here because a hollow kubelet's fake runtime never ends a container, so it would keep every worker
    in ``Init`` (the operator's ``ENABLE_INIT_CONTAINER_INJECTION=false``)."""
    d = workdir / "kuberay-operator"
    d.mkdir(parents=True, exist_ok=True)
    probe = free_port()
    argv = [
        str(counterparts.binary("kuberay-operator")),
        f"--metrics-addr=127.0.0.1:{free_port()}",
        f"--health-probe-bind-address=127.0.0.1:{probe}",
        "--enable-leader-election=false",
        "--log-stdout-encoder=console",
    ]
    if batch_scheduler is not None:
        argv.append(f"--batch-scheduler={batch_scheduler}")
    return _start_operator(
        "kuberay-operator",
        argv,
        workdir / "logs" / "kuberay-operator.log",
        ready=lambda: _http_ok(f"http://127.0.0.1:{probe}/readyz"),
        env={
            **_operator_env(apiserver.kubeconfig, d),
            "ENABLE_INIT_CONTAINER_INJECTION": str(init_containers).lower(),
        },
    )


KUEUE_NAMESPACE = "kueue-system"
KUEUE_FRAMEWORKS: tuple[str, ...] = ("batch/job", "ray.io/raycluster")
KUEUE_METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
"""Where Kueue v0.17 reads its metrics serving cert when internal cert management is off (a constant in
its main package); the launcher puts one there inside Kueue's own mount namespace."""
KUEUE_WEBHOOK_NAMES = {
    "MutatingWebhookConfiguration": "gpu-node-agent-e2e-kueue-mutating",
    "ValidatingWebhookConfiguration": "gpu-node-agent-e2e-kueue-validating",
}
# Workload kinds of Kueue's webhook manifest that each framework serves; webhooks for kinds of frameworks
# that are not enabled are left out (Kueue does not serve their paths, and a Fail policy would then refuse
# every such object -- pods included -- cluster-wide).
_KUEUE_FRAMEWORK_RESOURCES = {"batch/job": ("batch", "jobs"), "ray.io/raycluster": ("ray.io", "rayclusters")}


def kueue_config(
    *, webhook_port: int, cert_dir: Path, health_port: int, metrics_port: int, frameworks: Sequence[str]
) -> dict[str, Any]:
    """Kueue's ``Configuration`` for a manager outside the cluster: webhooks on 127.0.0.1 with our
    certificate (internal cert management off), no leader election, probes and metrics on loopback."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "internalCertManagement": {"enable": False},
        "leaderElection": {"leaderElect": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "integrations": {"frameworks": list(frameworks)},
    }


def kueue_webhook_configurations(
    manifests: Sequence[Mapping[str, Any]], *, url: str, ca_bundle: bytes, frameworks: Sequence[str]
) -> list[dict[str, Any]]:
    """Kueue's published webhook configurations pointed at ``url`` (``https://127.0.0.1:PORT``) instead of
    its in-cluster Service, with ``ca_bundle`` (PEM), keeping only the webhooks of Kueue's own kinds and
    of ``frameworks``. Pure; raises ``ValueError`` naming a framework this function does not know."""
    import base64

    unknown = [f for f in frameworks if f not in _KUEUE_FRAMEWORK_RESOURCES]
    if unknown:
        raise ValueError(f"kueue frameworks {unknown}: known are {sorted(_KUEUE_FRAMEWORK_RESOURCES)}")
    allowed = {_KUEUE_FRAMEWORK_RESOURCES[f] for f in frameworks}
    out: list[dict[str, Any]] = []
    for doc in manifests:
        kind = doc.get("kind")
        if kind not in KUEUE_WEBHOOK_NAMES:
            continue
        hooks = []
        for hook in doc.get("webhooks") or []:
            rules = hook.get("rules") or []
            kinds = {
                (g, r) for rule in rules for g in rule.get("apiGroups", ()) for r in rule.get("resources", ())
            }
            if not all(g == "kueue.x-k8s.io" or (g, r.split("/")[0]) in allowed for g, r in kinds):
                continue
            path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path", "")
            client_config = {"url": f"{url}{path}", "caBundle": base64.b64encode(ca_bundle).decode()}
            hooks.append({**hook, "clientConfig": client_config})
        out.append(
            {
                "apiVersion": doc["apiVersion"],
                "kind": kind,
                "metadata": {"name": KUEUE_WEBHOOK_NAMES[kind]},
                "webhooks": hooks,
            }
        )
    return out


def _write_etc_overlay(directory: Path, pki: Pki) -> Path:
    """A copy of /etc plus Kueue's metrics cert at its fixed path, to bind-mount over /etc for Kueue only."""
    import shutil

    etc = directory / "etc"
    if etc.exists():
        shutil.rmtree(etc)
    shutil.copytree("/etc", etc, symlinks=True, ignore_dangling_symlinks=True)
    certs = etc / KUEUE_METRICS_CERT_DIR.relative_to("/etc")
    certs.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pki.server_cert, certs / "tls.crt")
    shutil.copyfile(pki.server_key, certs / "tls.key")
    return etc


def start_kueue(
    counterparts: Counterparts,
    workdir: Path,
    *,
    apiserver: ApiServer,
    frameworks: Sequence[str] = KUEUE_FRAMEWORKS,
    feature_gates: Mapping[str, bool] | None = None,
) -> Operator:
    """Kueue's controller manager against ``apiserver``: its CRDs applied, namespace ``kueue-system``, the
    webhooks served on 127.0.0.1 with the API server's own loopback certificate (signed by the test CA)
    and Kueue's webhook configurations pointed there. The CRDs of ``frameworks`` (e.g. ray.io) must be
    installed first. Needs root: Kueue reads its metrics certificate from a fixed path under /etc, given
    to it in its own mount namespace. ``stop`` deletes the webhook configurations first."""
    from topology.kube import Kube, KubeError

    binary = counterparts.binary("kueue-manager")
    manifests = load_yaml_documents([counterparts.root / "crd" / "kueue-webhook" / "manifests.yaml"])
    crds = load_yaml_documents(counterparts.crds("kueue"))
    if os.geteuid() != 0:
        raise MissingCounterpartError(
            f"kueue-manager: needs root to give it {KUEUE_METRICS_CERT_DIR} in its own mount namespace"
        )
    d = workdir / "kueue"
    d.mkdir(parents=True, exist_ok=True)
    cert_dir = d / "webhook-certs"
    cert_dir.mkdir(exist_ok=True)
    pki = apiserver.pki
    (cert_dir / "tls.crt").write_bytes(pki.server_cert.read_bytes())
    (cert_dir / "tls.key").write_bytes(pki.server_key.read_bytes())
    etc = _write_etc_overlay(d, pki)
    webhook_port, health_port = free_port(), free_port()
    config = kueue_config(
        webhook_port=webhook_port,
        cert_dir=cert_dir,
        health_port=health_port,
        metrics_port=free_port(),
        frameworks=frameworks,
    )
    (d / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    with apiserver.api_client() as api:
        apply_crds(api, crds, timeout_s=300)  # large schemas; a loaded machine needs longer
        try:
            Kube(api).create(NAMESPACES, {"metadata": {"name": KUEUE_NAMESPACE}})
        except KubeError as e:
            if e.status != 409:
                raise
    gates = {"VisibilityOnDemand": False, **dict(feature_gates or {})}
    argv = [
        "unshare", "--mount", "--propagation", "private", "--",
        "/bin/sh", "-c", 'mount --bind "$1" /etc && shift && exec "$@"', "sh", str(etc),
        str(binary), f"--config={d / 'config.yaml'}", f"--kubeconfig={apiserver.kubeconfig}",
        *feature_gates_flag(gates),
    ]  # fmt: skip
    op = _start_operator(
        "kueue-manager",
        argv,
        workdir / "logs" / "kueue-manager.log",
        ready=lambda: _http_ok(f"http://127.0.0.1:{health_port}/readyz"),
        env=_operator_env(apiserver.kubeconfig, d),
    )
    url = f"https://127.0.0.1:{webhook_port}"
    hooks = kueue_webhook_configurations(
        manifests, url=url, ca_bundle=pki.ca_cert.read_bytes(), frameworks=frameworks
    )

    def delete_hooks() -> None:
        with apiserver.api_client() as api:
            kube = Kube(api)
            for hook in hooks:
                kube.delete(
                    f"{_webhook_configurations(hook['kind'])}/{hook['metadata']['name']}"
                )  # 404: gone

    try:
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        wait_until(lambda: _tls_handshake(webhook_port, ctx), what="kueue webhook server", process=op.process)
        with apiserver.api_client() as api:
            kube = Kube(api)
            for body in hooks:
                kube.create(_webhook_configurations(body["kind"]), body)
    except BaseException:
        delete_hooks()
        op.stop()
        raise
    op.cleanup = delete_hooks
    return op


def _webhook_configurations(kind: str) -> str:
    """The collection of ``kind``: Mutating- or ValidatingWebhookConfiguration."""
    plural = (
        "mutatingwebhookconfigurations"
        if kind == "MutatingWebhookConfiguration"
        else "validatingwebhookconfigurations"
    )
    return f"/apis/admissionregistration.k8s.io/v1/{plural}"


def _tls_handshake(port: int, context: ssl.SSLContext) -> bool:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=2) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1"),
    ):
        return True


# -------------------------------------------------------------------------------------- device manager


@dataclass
class DeviceManagerHarness:
    """dmharness: the kubelet's device manager on ``socket_dir``, driven over HTTP on loopback."""

    process: ManagedProcess
    base_url: str
    socket_dir: Path

    @property
    def kubelet_socket(self) -> Path:
        return self.socket_dir / "kubelet.sock"

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.base_url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return int(resp.status), json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return int(e.code), json.loads(e.read() or b"null")

    def healthz(self) -> dict[str, Any]:
        return dict(self._checked("GET", "/healthz"))

    def resources(self) -> dict[str, Any]:
        """``{"resources": {name: {capacity, allocatable, healthy_devices}}, "deleted": [...]}``."""
        return dict(self._checked("GET", "/resources"))

    def allocate(self, resource: str, count: int, *, pod: str = "", container: str = "") -> tuple[int, Any]:
        """Allocate like a kubelet admitting a pod; (status, body) so tests can assert refusals."""
        return self._call(
            "POST", "/allocate", {"resource": resource, "count": count, "pod": pod, "container": container}
        )

    def delete_pod(self, pod_uid: str) -> tuple[int, Any]:
        return self._call("DELETE", f"/pods/{pod_uid}")

    def restart(self) -> dict[str, Any]:
        """Stop the manager, remove kubelet.sock, start a new one (what a kubelet restart does)."""
        return dict(self._checked("POST", "/restart"))

    def _checked(self, method: str, path: str) -> Any:
        status, body = self._call(method, path)
        if status != 200:
            raise RuntimeError(f"dmharness {method} {path}: HTTP {status}: {body}")
        return body

    def stop(self) -> None:
        self.process.stop()


def start_device_manager_harness(
    counterparts: Counterparts, workdir: Path, *, socket_dir: Path
) -> DeviceManagerHarness:
    socket_dir.mkdir(parents=True, exist_ok=True)
    ready = workdir / "dmharness.addr"
    ready.unlink(missing_ok=True)
    argv = [
        str(counterparts.binary("dmharness")),
        f"--socket-dir={socket_dir}",
        "--listen=127.0.0.1:0",
        f"--ready-file={ready}",
        "-v=4",
    ]
    proc = ManagedProcess("dmharness", argv, workdir / "logs" / "dmharness.log").start()
    try:
        wait_until(ready.exists, what="dmharness ready file", process=proc, timeout_s=60)
        harness = DeviceManagerHarness(proc, f"http://{ready.read_text().strip()}", socket_dir)
        wait_until(harness.kubelet_socket.exists, what="dmharness kubelet.sock", process=proc, timeout_s=30)
    except BaseException:
        proc.stop()
        raise
    return harness


# ------------------------------------------------------------------------------------ hollow GPU nodes

HOLLOW_NODE = "hollownode"
BUILD_COMMAND = "tests/e2e/counterparts/build.sh"
REPO_ROOT = Path(__file__).resolve().parents[1]
AGENT_COMMAND: tuple[str, ...] = (sys.executable, "-m", "agent.cli")
"""How a node agent is started: this interpreter, with the repository on ``PYTHONPATH``."""
AGENT_ENV: Mapping[str, str] = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)}
"""The agent's whole environment: nothing of the caller's (no ``KUBECONFIG``, no ``GPU_NODE_AGENT_*``)."""


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON-object line of ``path`` (``[]`` when it is absent). A last line without its
    newline is being written and is left for the next read; blank lines are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out: list[dict[str, Any]] = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n") or not line.strip():
            continue
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError(f"{path}: a line is not a JSON object: {line[:80]!r}")
        out.append(obj)
    return out


def group_rss_bytes(pid: int, *, proc_root: Path = Path("/proc")) -> int:
    """Resident memory (VmRSS) of every process in the process group that ``pid`` leads, in bytes."""
    total = 0
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so cut at the last ')'
            if int(stat.rpartition(")")[2].split()[2]) != pid:
                continue
            status = (entry / "status").read_text()
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile, or not ours to read
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def _socket_identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns  # the inode number alone may be reused at once


def hollow_node_argv(
    binary: Path,
    *,
    name: str,
    kubeconfig: Path,
    root_dir: Path,
    device_plugins_dir: Path,
    record: Path,
    kubelet_port: int,
    labels: Mapping[str, str] | None = None,
    max_pods: int = 110,
    status_update_s: float = 1.0,
    cpus: int | None = None,
    memory: str | None = None,
    verbosity: int = 2,
) -> list[str]:
    """The ``hollownode`` command line for one node (flags of ``counterparts/hollownode/main.go``)."""
    for key, value in (labels or {}).items():
        if "," in key or "," in value or "=" in key:
            raise ValueError(f"hollow node {name}: label {key}={value} cannot be passed in --node-labels")
    argv = [
        str(binary),
        f"--name={name}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={root_dir}",
        f"--device-plugins-dir={device_plugins_dir}",
        f"--record={record}",
        f"--kubelet-port={kubelet_port}",
        f"--max-pods={max_pods}",
        f"--node-status-update-frequency={int(status_update_s * 1000)}ms",
    ]
    if labels:
        argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    if cpus is not None:
        argv.append(f"--cpus={cpus}")
    if memory is not None:
        argv.append(f"--memory={memory}")
    argv.append(f"-v={verbosity}")
    return argv


class _Restartable:
    """Start, stop and restart of a handle over one :class:`ManagedProcess`: ``launch`` starts it and
    returns what ``_wait_started`` needs to tell the new process ready from the old one."""

    process: ManagedProcess | None

    def launch(self) -> object:
        raise NotImplementedError

    def _wait_started(self, token: object, timeout_s: float) -> None:
        raise NotImplementedError

    def start(self, *, timeout_s: float = START_TIMEOUT_S) -> Self:
        token = self.launch()
        try:
            self._wait_started(token, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace_s: float = 10.0) -> None:
        if self.process is not None:
            self.process.stop(grace_s)
            self.process = None

    def restart(self, *, timeout_s: float = START_TIMEOUT_S) -> None:
        """Stop and start the same command again on the same folders and ports (a kubelet restart, or
        a DaemonSet pod replaced on the node)."""
        self.stop()
        self.start(timeout_s=timeout_s)

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()


@dataclass
class HollowNode(_Restartable):
    """One hollow GPU node: the kubelet's code with the real device manager, on folders of its own.

    ``device_plugins_dir`` is what a DaemonSet mounts as ``/var/lib/kubelet/device-plugins`` (kubelet.sock,
    the plugins' sockets, the device checkpoint); ``pod_resources_socket`` is the kubelet's pod-resources
    API; ``record_path`` has one JSON line per CRI ``CreateContainer`` (see :meth:`records`). ``stop`` and
    ``start`` keep the folders, so a restart finds the checkpoint as a restarted kubelet does."""

    name: str
    argv: tuple[str, ...]
    workdir: Path
    kubelet_port: int
    apiserver: ApiServer
    log_path: Path
    process: ManagedProcess | None = None
    starts: int = 0

    @property
    def root_dir(self) -> Path:
        return self.workdir / "root"

    @property
    def device_plugins_dir(self) -> Path:
        return self.workdir / "dp"

    @property
    def record_path(self) -> Path:
        return self.workdir / "containers.jsonl"

    @property
    def kubelet_socket(self) -> Path:
        return self.device_plugins_dir / "kubelet.sock"

    @property
    def pod_resources_socket(self) -> Path:
        return self.root_dir / "pod-resources" / "kubelet.sock"

    def launch(self) -> tuple[int, int] | None:
        """Start the process; returns the identity of the kubelet.sock it replaces (for wait_ready)."""
        if self.process is not None and self.process.alive():
            raise RuntimeError(f"hollow node {self.name} is already running")
        before = _socket_identity(self.kubelet_socket)
        try:
            self.process = ManagedProcess(f"hollownode[{self.name}]", self.argv, self.log_path).start()
        except OSError as e:  # e.g. a truncated or foreign binary: "Exec format error"
            raise MissingCounterpartError(
                f"{HOLLOW_NODE}: cannot run {self.argv[0]} ({e.strerror or e}); "
                f"rebuild it with {BUILD_COMMAND}"
            ) from None
        self.starts += 1
        return before

    def wait_ready(
        self, old_socket: tuple[int, int] | None = None, *, timeout_s: float = START_TIMEOUT_S
    ) -> None:
        """Until the device manager serves a new kubelet.sock, pod-resources is up and the Node is Ready.
        A node that refuses its command line (exit 2: a binary older than its source) is one line naming the
        build command."""
        proc = self.process
        try:
            wait_until(
                lambda: _socket_identity(self.kubelet_socket) not in (None, old_socket),
                what=f"hollow node {self.name}: kubelet.sock",
                process=proc,
                timeout_s=timeout_s,
                interval_s=0.05,
            )
        except StartupError:
            if proc is None or proc.returncode != 2:
                raise
            said = proc.log_tail(1).strip()[:200]
            raise MissingCounterpartError(
                f"{HOLLOW_NODE}: {self.argv[0]} refused its command line ({said}); "
                f"rebuild it with {BUILD_COMMAND}"
            ) from None
        wait_until(
            self.pod_resources_socket.exists,
            what=f"hollow node {self.name}: pod-resources socket",
            process=proc,
            timeout_s=timeout_s,
            interval_s=0.05,
        )
        wait_until(
            self.ready, what=f"Node {self.name} Ready", process=proc, timeout_s=timeout_s, interval_s=0.1
        )

    def _wait_started(self, token: object, timeout_s: float) -> None:
        self.wait_ready(token if isinstance(token, tuple) else None, timeout_s=timeout_s)

    def records(self, *, pod: str | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
        """The CreateContainer requests the kubelet sent, oldest first (keys: ``node``, ``namespace``,
        ``pod``, ``pod_uid``, ``container``, ``attempt``, ``envs``, ``devices``, ``mounts``,
        ``cdi_devices``, ``annotations``, ``container_id``, ``error``, ...), optionally of one pod."""
        return [
            r
            for r in read_json_lines(self.record_path)
            if (pod is None or r.get("pod") == pod) and (namespace is None or r.get("namespace") == namespace)
        ]

    def node(self) -> dict[str, Any] | None:
        """The Node object as the API server has it (``None`` while it does not exist)."""
        status, body = self.apiserver.get(f"/api/v1/nodes/{self.name}")
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"GET node {self.name}: HTTP {status}: {body[:200]!r}")
        return dict(json.loads(body))

    def ready(self) -> bool:
        node = self.node()
        conditions = ((node or {}).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def capacity(self) -> dict[str, str]:
        return dict((((self.node() or {}).get("status") or {}).get("capacity")) or {})

    def allocatable(self) -> dict[str, str]:
        return dict((((self.node() or {}).get("status") or {}).get("allocatable")) or {})

    def pod_resources(self, *, timeout_s: float = 5.0) -> Any:
        """The kubelet's pod-resources ``List`` and ``GetAllocatableResources`` now: an
        ``agent.podresources.model.PodResourcesSnapshot`` (raises ``PodResourcesError`` when it cannot)."""
        import asyncio

        from agent.podresources.client import PodResourcesClient

        async def snapshot() -> Any:
            client = PodResourcesClient(str(self.pod_resources_socket), timeout_s=timeout_s)
            try:
                return await client.snapshot()
            finally:
                await client.close()

        return asyncio.run(snapshot())

    def rss_bytes(self) -> int:
        return group_rss_bytes(self.process.pid) if self.process is not None else 0


def _new_hollow_node(
    counterparts: Counterparts,
    workdir: Path,
    *,
    apiserver: ApiServer,
    name: str,
    kubelet_port: int | None = None,
    **options: Any,
) -> HollowNode:
    binary = counterparts.binary(HOLLOW_NODE)
    node_dir = workdir / "nodes" / name
    node_dir.mkdir(parents=True, exist_ok=True)
    port = kubelet_port or free_port()
    argv = hollow_node_argv(
        binary,
        name=name,
        kubeconfig=apiserver.kubeconfig,
        root_dir=node_dir / "root",
        device_plugins_dir=node_dir / "dp",
        record=node_dir / "containers.jsonl",
        kubelet_port=port,
        **options,
    )
    return HollowNode(
        name, tuple(argv), node_dir, port, apiserver, workdir / "logs" / f"hollownode-{name}.log"
    )


def start_hollow_node(
    counterparts: Counterparts,
    workdir: Path,
    *,
    apiserver: ApiServer,
    name: str,
    timeout_s: float = START_TIMEOUT_S,
    **options: Any,
) -> HollowNode:
    """Start one hollow GPU node registered with ``apiserver``; returns once its Node is Ready.

    ``options`` go to :func:`hollow_node_argv` (``labels``, ``max_pods``, ``status_update_s``, ``cpus``,
    ``memory``, ``verbosity``) and ``kubelet_port`` (default: a free port). Needs root: the kubelet's
    device-plugin folder is a constant, so the node bind-mounts its own in a private mount namespace."""
    nodes = start_hollow_nodes(
        counterparts, workdir, apiserver=apiserver, names=[name], timeout_s=timeout_s, **options
    )
    return nodes[0]


def start_hollow_nodes(
    counterparts: Counterparts,
    workdir: Path,
    *,
    apiserver: ApiServer,
    names: Sequence[str],
    timeout_s: float = START_TIMEOUT_S,
    **options: Any,
) -> list[HollowNode]:
    """Start hollow nodes side by side (each its own folders and kubelet port); all Ready, or none left."""
    if len(set(names)) != len(names):
        raise ValueError(f"hollow node names repeat: {sorted(names)}")
    nodes = [_new_hollow_node(counterparts, workdir, apiserver=apiserver, name=n, **options) for n in names]
    try:
        olds = [node.launch() for node in nodes]
        for node, old in zip(nodes, olds, strict=True):
            node.wait_ready(old, timeout_s=timeout_s)
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes


def node_agent_argv(
    *,
    node_name: str,
    simulate: str,
    device_plugins_dir: Path,
    pod_resources_socket: Path,
    kubeconfig: Path | None,
    metrics_addr: str,
    config_path: Path | None = None,
    faults_path: Path | None = None,
    command: Sequence[str] = AGENT_COMMAND,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """``gpu-node-agent run`` for one node, as the DaemonSet runs it (``kubeconfig`` None: ``--no-kube``)."""
    argv = [
        *command,
        "run",
        "--node-name",
        node_name,
        "--simulate",
        simulate,
        "--kubelet-dir",
        str(device_plugins_dir),
        "--pod-resources-socket",
        str(pod_resources_socket),
        "--metrics-addr",
        metrics_addr,
        "--health-addr",
        "",
        "--log-format",
        "json",
        # pod labels on metrics follow pod-resources within a second (the DaemonSet's default is 10 s)
        "--pod-resources-interval",
        "1",
        "--metrics-interval",
        "1",
    ]
    argv += ["--kubeconfig", str(kubeconfig)] if kubeconfig is not None else ["--no-kube"]
    if config_path is not None:
        argv += ["--config", str(config_path)]
    if faults_path is not None:
        argv += ["--simulate-faults", str(faults_path)]
    return [*argv, *extra_args]


@dataclass
class NodeAgent(_Restartable):
    """``gpu-node-agent run`` for one hollow node, with its fault file and ``/metrics``."""

    node_name: str
    argv: tuple[str, ...]
    log_path: Path
    metrics_port: int | None
    faults_path: Path | None
    config_path: Path | None
    env: Mapping[str, str] = field(default_factory=lambda: dict(AGENT_ENV))
    process: ManagedProcess | None = None
    starts: int = 0

    def launch(self) -> None:
        if self.process is not None and self.process.alive():
            raise RuntimeError(f"agent of {self.node_name} is already running")
        self.process = ManagedProcess(f"gpu-node-agent[{self.node_name}]", self.argv, self.log_path, self.env)
        self.process.start()
        self.starts += 1

    def wait_ready(self, *, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until ``/readyz`` answers 200: every plugin registered with the kubelet (needs ``/metrics`` on)."""
        if self.metrics_port is None:
            return
        url = f"http://127.0.0.1:{self.metrics_port}/readyz"
        what = f"agent of {self.node_name}: /readyz"
        wait_until(lambda: _http_ok(url), what=what, process=self.process, timeout_s=timeout_s)

    def _wait_started(self, token: object, timeout_s: float) -> None:
        self.wait_ready(timeout_s=timeout_s)

    def fault(self, **event: Any) -> None:
        """Append one event to the simulator's fault file, e.g. ``fault(event="xid", gpu=3, xid=79)``."""
        if self.faults_path is None:
            raise RuntimeError(f"agent of {self.node_name} was started without a fault file")
        with self.faults_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(event) + "\n")

    def metrics(self) -> str:
        """The ``/metrics`` text (Prometheus exposition format)."""
        if self.metrics_port is None:
            raise RuntimeError(f"agent of {self.node_name} was started without /metrics")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as resp:
            return str(resp.read().decode("utf-8"))

    def rss_bytes(self) -> int:
        return group_rss_bytes(self.process.pid) if self.process is not None else 0


def new_node_agent(
    node: HollowNode,
    *,
    simulate: str,
    kubeconfig: Path | None,
    config: Mapping[str, Any] | None = None,
    faults: Sequence[Mapping[str, Any]] | None = None,
    metrics: bool = True,
    command: Sequence[str] = AGENT_COMMAND,
    extra_args: Sequence[str] = (),
) -> NodeAgent:
    """A (not yet started) agent for ``node``: ``config`` is written as its ``version: v1`` file; ``faults``
    (even empty) creates its fault file with these events already in it (applied when it starts)."""
    d = node.workdir / "agent"
    d.mkdir(parents=True, exist_ok=True)
    config_path = faults_path = None
    if config is not None:
        config_path = d / "agent.yaml"
        config_path.write_text(yaml.safe_dump({"version": "v1", **dict(config)}, sort_keys=False))
    if faults is not None:
        faults_path = d / "faults.jsonl"
        faults_path.write_text("".join(json.dumps(dict(e)) + "\n" for e in faults), encoding="utf-8")
    port = free_port() if metrics else None
    argv = node_agent_argv(
        node_name=node.name,
        simulate=simulate,
        device_plugins_dir=node.device_plugins_dir,
        pod_resources_socket=node.pod_resources_socket,
        kubeconfig=kubeconfig,
        metrics_addr=f"127.0.0.1:{port}" if port is not None else "",
        config_path=config_path,
        faults_path=faults_path,
        command=command,
        extra_args=extra_args,
    )
    log_path = node.log_path.with_name(f"agent-{node.name}.log")
    return NodeAgent(node.name, tuple(argv), log_path, port, faults_path, config_path)


@dataclass(frozen=True)
class GpuNodeSpec:
    """One simulated GPU node: a hollow node and its agent."""

    name: str
    simulate: str  # PROFILE[:k=v,...], as --simulate takes it
    config: Mapping[str, Any] | None = None  # the agent's config file (version: v1 is added)
    faults: Sequence[Mapping[str, Any]] | None = None  # None: no fault file
    labels: Mapping[str, str] = field(default_factory=dict)  # the Node's registration labels


@dataclass
class HollowGpuNode:
    """A hollow node with its agent; ``stop`` stops both (the agent first, as a drained node would)."""

    spec: GpuNodeSpec
    node: HollowNode
    agent: NodeAgent

    @property
    def name(self) -> str:
        return self.node.name

    def stop(self) -> None:
        self.agent.stop()
        self.node.stop()


def start_hollow_gpu_nodes(
    counterparts: Counterparts,
    workdir: Path,
    *,
    apiserver: ApiServer,
    specs: Sequence[GpuNodeSpec],
    publish: bool = True,
    timeout_s: float = START_TIMEOUT_S,
    **node_options: Any,
) -> list[HollowGpuNode]:
    """Start a hollow node per spec, then one ``gpu-node-agent run`` per node against that node's folders
    (publishing labels and its GPUNode to ``apiserver`` unless ``publish`` is false); returns once every
    agent's plugins are registered with their kubelet. ``node_options`` go to every hollow node. On any
    failure everything started here is stopped."""
    by_name = {s.name: s for s in specs}
    if len(by_name) != len(specs):
        raise ValueError(f"GPU node names repeat: {sorted(s.name for s in specs)}")
    started: list[HollowGpuNode] = []
    agents: list[NodeAgent] = []
    nodes: list[HollowNode] = []
    try:
        common_labels = dict(node_options.pop("labels", None) or {})
        nodes = [
            _new_hollow_node(
                counterparts,
                workdir,
                apiserver=apiserver,
                name=s.name,
                labels={**common_labels, **s.labels},
                **node_options,
            )
            for s in specs
        ]
        olds = [node.launch() for node in nodes]
        for node, old in zip(nodes, olds, strict=True):
            node.wait_ready(old, timeout_s=timeout_s)
        for spec, node in zip(specs, nodes, strict=True):
            agent = new_node_agent(
                node,
                simulate=spec.simulate,
                kubeconfig=apiserver.kubeconfig if publish else None,
                config=spec.config,
                faults=spec.faults,
            )
            agents.append(agent)
            agent.launch()
        for agent in agents:
            agent.wait_ready(timeout_s=timeout_s)
        started = [HollowGpuNode(s, n, a) for s, n, a in zip(specs, nodes, agents, strict=True)]
    except BaseException:
        for agent in agents:
            agent.stop()
        for node in nodes:
            node.stop()
        raise
    return started


# ------------------------------------------------------------------------------------- cluster objects


def load_yaml_documents(paths: Iterable[Path]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in paths:
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def apply_crds(api_client: Any, crds: Iterable[Mapping[str, Any]], *, timeout_s: float = 60.0) -> list[str]:
    """Server-side apply each CRD (field manager ``gpu-node-agent``) and wait until all are Established."""
    from topology.kube import Kube

    # Plain JSON answers (``topology.kube``): a large CRD (KubeRay's schemas are megabytes) read into the
    # typed client's models costs seconds of CPU; only the status conditions are needed.
    kube = Kube(api_client, request_timeout_s=max(timeout_s, 30.0))
    names = []
    for crd in crds:
        name = crd["metadata"]["name"]
        kube.apply(f"{CRDS}/{name}", crd, field_manager=FIELD_MANAGER)
        names.append(name)

    def established() -> bool:
        for name in names:
            conds = (kube.get(f"{CRDS}/{name}").get("status") or {}).get("conditions") or []
            if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                return False
        return True

    wait_until(established, what=f"CRDs established ({', '.join(names)})", timeout_s=timeout_s)
    return names


def fake_gpu_node(
    name: str,
    *,
    gpus: int = 4,
    labels: Mapping[str, str] | None = None,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: int = 110,
) -> dict[str, Any]:
    """A simulated GPU Node: its metadata/spec; :func:`register_nodes` adds the Ready status."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **dict(labels or {})},
        },
        "spec": {},
        "status": {
            "capacity": {"cpu": cpu, "memory": memory, "pods": str(pods), "nvidia.com/gpu": str(gpus)},
            "allocatable": {"cpu": cpu, "memory": memory, "pods": str(pods), "nvidia.com/gpu": str(gpus)},
        },
    }


def register_nodes(api_client: Any, nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """Create fake Nodes and mark them Ready with the given capacity (no kubelet behind them)."""
    from topology.kube import NODES, Kube

    kube = Kube(api_client)
    names = []
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for node in nodes:
        kube.create(NODES, {k: v for k, v in node.items() if k != "status"})
        name = node["metadata"]["name"]
        status = dict(node.get("status", {}))
        status["conditions"] = [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node (e2e)",
             "lastHeartbeatTime": now, "lastTransitionTime": now},
        ]  # fmt: skip
        status["addresses"] = [{"type": "Hostname", "address": name}]
        kube.request("PATCH", f"{NODES}/{name}/status", body={"status": status}, content_type=MERGE_PATCH)
        names.append(name)
    return names


def delete_nodes(api_client: Any, names: Iterable[str]) -> None:
    """Delete Nodes (one already gone counts as deleted)."""
    from topology.kube import NODES, Kube

    kube = Kube(api_client)
    for name in names:
        kube.delete(f"{NODES}/{name}")


# ---------------------------------------------------------------------------------------- start-up figures


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agent.localcluster [--rounds N] [--hollow-nodes N [--profile P]]``: start etcd,
    kube-apiserver, kube-scheduler and vc-scheduler from the built binaries N times (each round in a fresh
    folder, everything stopped after), and print how long each took to become ready, with the machine.
    With ``--hollow-nodes``, each round then starts that many hollow GPU nodes side by side, one agent on
    each, and prints the times to Node Ready and to GPU capacity in Node.status and each process's VmRSS."""
    import argparse
    import statistics
    import tempfile

    from agent.benchmarks.machine import describe_ms, machine_summary

    parser = argparse.ArgumentParser(prog="python -m agent.localcluster", description=main.__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="start-up rounds (default 3)")
    parser.add_argument(
        "--hollow-nodes",
        type=int,
        default=0,
        metavar="N",
        help="then start N hollow GPU nodes with one agent each and print their start-up times and memory",
    )
    parser.add_argument("--profile", default="dgx1-v100", help="--simulate of the agents (default dgx1-v100)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.hollow_nodes < 0:
        parser.error("--hollow-nodes must not be negative")
    counterparts = locate_counterparts()
    try:
        counterparts.check((*BINARIES, HOLLOW_NODE) if args.hollow_nodes else BINARIES)
        crds = load_yaml_documents(counterparts.volcano_crds())
    except MissingCounterpartError as e:
        print(f"error: {e}")
        return 1
    figures: dict[str, list[float]] = {}
    memory: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="gpu-node-agent-e2e-") as tmp:
            hollow = (args.hollow_nodes, args.profile)
            _timed_round(counterparts, Path(tmp), crds, figures, hollow=hollow, memory=memory)
    print(f"start-up until ready, {args.rounds} round(s), binaries from {counterparts.root}")
    if args.hollow_nodes:
        print(
            f"(then {args.hollow_nodes} hollow GPU node(s) with agents --simulate {args.profile} each round)"
        )
    for label, values in figures.items():
        print(f"  {label:<26} {describe_ms(values)}")
    for label, mib in memory.items():
        print(f"  {label:<26} median {statistics.median(mib):.1f} MiB, max {max(mib):.1f} MiB (n={len(mib)})")
    print(machine_summary())
    return 0


def _timed_round(
    counterparts: Counterparts,
    workdir: Path,
    crds: list[dict[str, Any]],
    figures: dict[str, list[float]],
    *,
    hollow: tuple[int, str] = (0, ""),
    memory: dict[str, list[float]] | None = None,
) -> None:
    """Start everything once in ``workdir``, adding each component's time to ready to ``figures``."""
    running: list[Any] = []

    def timed(label: str, start: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        result = start(*args, **kwargs)
        figures.setdefault(label, []).append(time.perf_counter() - t0)
        return result

    try:
        t0 = time.perf_counter()
        etcd = timed("etcd", start_etcd, counterparts, workdir)
        running.append(etcd)
        apiserver = timed("kube-apiserver", start_apiserver, counterparts, workdir, etcd=etcd)
        running.append(apiserver)
        with apiserver.api_client() as api:
            timed("volcano CRDs", apply_crds, api, crds)
        running.append(
            timed("kube-scheduler", start_kube_scheduler, counterparts, workdir, apiserver=apiserver)
        )
        running.append(
            timed("vc-scheduler", start_volcano_scheduler, counterparts, workdir, apiserver=apiserver)
        )
        figures.setdefault("all, in sequence", []).append(time.perf_counter() - t0)
        if hollow[0]:
            memory = memory if memory is not None else {}
            _hollow_round(
                counterparts,
                workdir,
                apiserver,
                hollow=hollow,
                figures=figures,
                running=running,
                memory=memory,
            )
    finally:
        for component in reversed(running):
            component.stop()


def _times_until(
    checks: Mapping[str, Callable[[], bool]], since: Mapping[str, float], what: str
) -> dict[str, float]:
    """Poll every check together; seconds from ``since[key]`` until each first held."""
    pending = dict(checks)
    done: dict[str, float] = {}
    deadline = time.monotonic() + START_TIMEOUT_S
    while pending:
        for key, check in list(pending.items()):
            with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
                if check():
                    done[key] = time.monotonic() - since[key]
                    del pending[key]
        if pending and time.monotonic() > deadline:
            raise StartupError(f"{what}: not after {START_TIMEOUT_S:.0f}s for {', '.join(sorted(pending))}")
        time.sleep(0.02)
    return done


def _hollow_round(
    counterparts: Counterparts,
    workdir: Path,
    apiserver: ApiServer,
    *,
    hollow: tuple[int, str],
    figures: dict[str, list[float]],
    running: list[Any],
    memory: dict[str, list[float]],
) -> None:
    """Hollow nodes side by side, then an agent on each: times to Ready and to capacity, and VmRSS."""
    count, profile = hollow
    with apiserver.api_client() as api:
        apply_crds(api, load_yaml_documents([REPO_ROOT / "daemonset" / "crds" / "gpunode.yaml"]))
    nodes = [
        _new_hollow_node(counterparts, workdir, apiserver=apiserver, name=f"hollow-{i}") for i in range(count)
    ]
    launched: dict[str, float] = {}
    for node in nodes:
        launched[node.name] = time.monotonic()
        node.launch()
        running.append(node)
    ready = _times_until({n.name: n.ready for n in nodes}, launched, "hollow nodes Ready")
    figures.setdefault("hollow node start → Ready", []).extend(ready.values())
    agents = {n.name: new_node_agent(n, simulate=profile, kubeconfig=apiserver.kubeconfig) for n in nodes}
    started: dict[str, float] = {}
    for name, agent in agents.items():
        started[name] = time.monotonic()
        agent.launch()
        running.append(agent)

    def has_gpus(node: HollowNode) -> Callable[[], bool]:
        return lambda: any(k.startswith("nvidia.com/") and v != "0" for k, v in node.allocatable().items())

    capacity = _times_until({n.name: has_gpus(n) for n in nodes}, started, "GPU capacity in Node.status")
    figures.setdefault("agent start → GPU capacity", []).extend(capacity.values())
    # a node's own time to Ready plus its agent's time to capacity (not the wait for the other nodes)
    figures.setdefault("both, one after the other", []).extend(ready[k] + v for k, v in capacity.items())
    time.sleep(2.0)  # past the first metrics refresh
    memory.setdefault("hollownode VmRSS", []).extend(n.rss_bytes() / 2**20 for n in nodes)
    memory.setdefault("agent VmRSS", []).extend(a.rss_bytes() / 2**20 for a in agents.values())


if __name__ == "__main__":
    raise SystemExit(main())
