"""Fixtures for end-to-end tests against the real control plane (marker ``e2e``).

What runs: etcd, kube-apiserver and kube-scheduler built from k8s.io/kubernetes, Volcano's scheduler
(vc-scheduler) and the kubelet's device manager inside ``counterparts/dmharness`` -- all built once per
machine by ``tests/e2e/counterparts/build.sh`` (versions in ``counterparts/versions.env``), started on
127.0.0.1 with free ports and per-run temporary folders by ``agent/localcluster.py``. Component logs are
in ``<pytest tmp>/e2e*/logs/``; a failing start shows the log tail.

If a binary is missing, the tests that need it FAIL, or SKIP with the reason when
``GPU_NODE_AGENT_E2E_OPTIONAL=1``.

The pattern for a new e2e test (follow it in later features)
-------------------------------------------------------------
1. Put it in ``tests/e2e/test_<feature>.py`` with ``pytestmark = pytest.mark.e2e`` at the top.
2. Ask for the fixtures you need; start nothing yourself that a fixture already starts:

   - ``control_plane`` / ``api_client`` -- one etcd + kube-apiserver for the whole session (admin
     kubeconfig at ``control_plane.apiserver.kubeconfig``). Shared: create cluster-scoped objects with
     names unique to your test and delete them (or use the factories below, which clean up).
   - ``namespace`` -- a fresh namespace; its pods (deleted at once, no kubelet) and the namespace go
     away at the end.
   - ``gpu_nodes`` -- ``gpu_nodes(["n1", "n2"], gpus=4, labels={...})`` registers Ready fake Nodes with
     ``nvidia.com/gpu`` allocatable, and deletes them at the end. Each node carries the label
     ``gpuagent.dev/e2e-test=<the test's id>`` (``e2e_test_label``): select it in pods so that your pods
     never land on another test's nodes.
   - ``volcano_crds`` / ``volcano`` -- Volcano's CRDs installed; vc-scheduler running (scheduler name
     ``volcano``, gang + network-topology-aware plugins as in deployment.md §7.3).
   - ``kube_scheduler`` -- a kube-scheduler for this test. Pass extenders and the scheduler name with
     indirect parametrization:
     ``@pytest.mark.parametrize("kube_scheduler", [{"scheduler_name": "gpu-topology-scheduler",
     "extenders": [{"urlPrefix": ..., "filterVerb": "filter", ...}]}], indirect=True)``;
     ``kube_scheduler_factory(scheduler_name=..., extenders=[...])`` when the extender's URL is known
     only inside the test.
   - ``device_manager`` -- the kubelet device manager on a private socket folder
     (``device_manager.socket_dir``): point a device plugin at it, then read ``resources()``,
     ``allocate(...)``, ``restart()``.
   - ``hollow_gpu_nodes`` -- module-scoped: ``hollow_gpu_nodes(cluster.GpuNodeSpec("hn-1", "dgx1-v100",
     config={...}, faults=()))`` starts real kubelets (``counterparts/hollownode``, needs root) with one
     ``gpu-node-agent run --simulate ...`` each, publishing to the shared API server, and returns once
     the agents' plugins are registered: ``node.node`` (``allocatable()``, ``records()``,
     ``pod_resources()``, ``restart()``), ``node.agent`` (``fault(...)``, ``metrics()``, ``restart()``).
     Use them for anything about what a node offers, instead of ``gpu_nodes``; pin pods with
     ``nodeSelector: {kubernetes.io/hostname: <node>}``. ``module_kube_scheduler`` binds them (one
     ``default-scheduler`` per module). Example: ``test_hollow_nodes.py``.
   - operators (issue 19; module-scoped, each stopped after the module): ``volcano_controllers``
     (vc-controller-manager), ``kuberay_volcano`` / ``kuberay_plain`` (the KubeRay operator with or
     without ``--batch-scheduler=volcano``), ``kueue`` (Kueue with its webhooks on loopback; root),
     ``job_controller`` (kube-controller-manager's Job controller), ``kuberay_crds``; and
     ``start_gpu_racks(...)`` (``yield from`` it in a module fixture: hollow GB200 racks plus a CPU-only
     node, on any API server) with ``run_topology_controller_once(...)``. Examples:
     ``test_operators_volcano.py``, ``test_operators_kueue.py``, ``test_operators_native.py``.
3. Wait for outcomes with ``cluster.wait_until(predicate, what=...)`` (it polls and names what it
   waited for); never assert on elapsed time.
4. Anything your test starts itself (a helper server, a plugin) is stopped in a ``finally`` or by a
   fixture finalizer.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent import localcluster as cluster

OPTIONAL_ENV = "GPU_NODE_AGENT_E2E_OPTIONAL"
REPO_ROOT = Path(__file__).resolve().parents[2]


def _unavailable(reason: str) -> None:
    """Skip when e2e is declared optional on this machine; otherwise fail (CI must run them)."""
    if os.environ.get(OPTIONAL_ENV) == "1":
        pytest.skip(reason)
    pytest.fail(f"{reason} (set {OPTIONAL_ENV}=1 to skip instead)", pytrace=False)


def _require(counterparts: cluster.Counterparts, *names: str) -> None:
    try:
        counterparts.check(names)
    except cluster.MissingCounterpartError as e:
        _unavailable(str(e))


@pytest.fixture(scope="session")
def counterparts() -> cluster.Counterparts:
    return cluster.locate_counterparts()


@pytest.fixture(scope="session")
def e2e_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def control_plane(counterparts: cluster.Counterparts, e2e_workdir: Path) -> Iterator[cluster.ControlPlane]:
    _require(counterparts, "etcd", "kube-apiserver")
    try:
        plane = cluster.start_control_plane(counterparts, e2e_workdir)
    except cluster.MissingCounterpartError as e:  # e.g. no openssl for the certificates
        _unavailable(str(e))
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def api_client(control_plane: cluster.ControlPlane) -> Iterator[Any]:
    client = control_plane.apiserver.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def volcano_crds(counterparts: cluster.Counterparts, api_client: Any) -> list[str]:
    try:
        files = counterparts.volcano_crds()
    except cluster.MissingCounterpartError as e:
        _unavailable(str(e))
    return cluster.apply_crds(api_client, cluster.load_yaml_documents(files))


@pytest.fixture(scope="session")
def volcano(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    volcano_crds: list[str],
    e2e_workdir: Path,
) -> Iterator[cluster.Scheduler]:
    _require(counterparts, "vc-scheduler")
    sched = cluster.start_volcano_scheduler(counterparts, e2e_workdir, apiserver=control_plane.apiserver)
    try:
        yield sched
    finally:
        sched.stop()


@pytest.fixture
def kube_scheduler_factory(
    counterparts: cluster.Counterparts, control_plane: cluster.ControlPlane, tmp_path: Path
) -> Iterator[Callable[..., cluster.Scheduler]]:
    """``start(scheduler_name=..., extenders=[...])`` -> a running kube-scheduler, stopped after the test.

    For extenders whose URL is known only inside the test (an in-test server)."""
    _require(counterparts, "kube-scheduler")
    started: list[cluster.Scheduler] = []

    def start(
        *, scheduler_name: str = "default-scheduler", extenders: Sequence[Mapping[str, Any]] = ()
    ) -> cluster.Scheduler:
        sched = cluster.start_kube_scheduler(
            counterparts,
            tmp_path / f"sched-{len(started)}",
            apiserver=control_plane.apiserver,
            scheduler_name=scheduler_name,
            extenders=extenders,
        )
        started.append(sched)
        return sched

    try:
        yield start
    finally:
        for sched in reversed(started):
            sched.stop()


@pytest.fixture
def kube_scheduler(
    request: pytest.FixtureRequest, kube_scheduler_factory: Callable[..., cluster.Scheduler]
) -> cluster.Scheduler:
    """A kube-scheduler for one test; indirect param: ``{"scheduler_name": ..., "extenders": [...]}``."""
    params: Mapping[str, Any] = getattr(request, "param", None) or {}
    unknown = set(params) - {"scheduler_name", "extenders"}
    if unknown:
        raise ValueError(f"kube_scheduler fixture: unknown parameter(s) {sorted(unknown)}")
    return kube_scheduler_factory(**params)


@pytest.fixture
def device_manager(
    counterparts: cluster.Counterparts, tmp_path: Path
) -> Iterator[cluster.DeviceManagerHarness]:
    _require(counterparts, "dmharness")
    harness = cluster.start_device_manager_harness(
        counterparts, tmp_path, socket_dir=tmp_path / "device-plugins"
    )
    try:
        yield harness
    finally:
        harness.stop()


@pytest.fixture
def e2e_test_label(request: pytest.FixtureRequest) -> str:
    """A label value unique to this test (valid as a Kubernetes label value and name part)."""
    value = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")
    return value[-55:].strip("-") or "e2e"


@pytest.fixture
def namespace(api_client: Any, e2e_test_label: str) -> Iterator[str]:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    name = f"t-{e2e_test_label}"[:63].rstrip("-")
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        # No kubelet and no namespace controller: delete pods at once, then ask for the namespace.
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        core.delete_namespace(name)


@pytest.fixture
def gpu_nodes(api_client: Any, e2e_test_label: str) -> Iterator[Callable[..., list[str]]]:
    created: list[str] = []

    def register(names: list[str], *, gpus: int = 4, labels: Mapping[str, str] | None = None) -> list[str]:
        merged = {"gpuagent.dev/e2e-test": e2e_test_label, **dict(labels or {})}
        nodes = [cluster.fake_gpu_node(n, gpus=gpus, labels=merged) for n in names]
        done = cluster.register_nodes(api_client, nodes)
        created.extend(done)
        return done

    try:
        yield register
    finally:
        cluster.delete_nodes(api_client, created)


@pytest.fixture
def gpunode_crd_path() -> Path:
    return REPO_ROOT / "daemonset" / "crds" / "gpunode.yaml"


# ------------------------------------------------------------------------------ hollow GPU nodes (issue 17)


@pytest.fixture(scope="session")
def gpunode_crd_installed(api_client: Any) -> list[str]:
    """Our GPUNode CRD in the shared API server (agents publish into it)."""
    return cluster.apply_crds(
        api_client, cluster.load_yaml_documents([REPO_ROOT / "daemonset" / "crds" / "gpunode.yaml"])
    )


@pytest.fixture(scope="module")
def module_kube_scheduler(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[cluster.Scheduler]:
    """One ``default-scheduler`` for every test of a module (started once, stopped after the module)."""
    _require(counterparts, "kube-scheduler")
    sched = cluster.start_kube_scheduler(
        counterparts, tmp_path_factory.mktemp("sched"), apiserver=control_plane.apiserver
    )
    try:
        yield sched
    finally:
        sched.stop()


@pytest.fixture(scope="module")
def hollow_gpu_nodes(
    request: pytest.FixtureRequest,
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    api_client: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., list[cluster.HollowGpuNode]]]:
    """``start(spec, ...)`` -> hollow GPU nodes (a real kubelet each, ``counterparts/hollownode``) with one
    ``gpu-node-agent run`` per node publishing to the shared API server; returns once every agent's plugins
    are registered. Module-scoped: share the nodes across a module's tests. At the end of the module every
    agent and node is stopped and their Node and GPUNode objects are deleted. Each Node carries
    ``gpuagent.dev/e2e-test=hollow-<module>`` and ``gpuagent.dev/hollow=true``; select it by
    ``kubernetes.io/hostname``. Needs root (each node's own mount namespace)."""
    _require(counterparts, "hollownode")
    if os.geteuid() != 0:
        _unavailable(
            "hollow nodes need root: each bind-mounts its device-plugin folder in its own mount namespace"
        )
    request.getfixturevalue("gpunode_crd_installed")  # the agents publish their GPUNode into it
    module = re.sub(r"[^a-z0-9]+", "-", request.module.__name__.rsplit(".", 1)[-1].lower()).strip("-")
    labels = {"gpuagent.dev/e2e-test": f"hollow-{module}"[:63].rstrip("-"), "gpuagent.dev/hollow": "true"}
    workdir = tmp_path_factory.mktemp("hollow")
    started: list[cluster.HollowGpuNode] = []

    def start(*specs: cluster.GpuNodeSpec, **node_options: Any) -> list[cluster.HollowGpuNode]:
        nodes = cluster.start_hollow_gpu_nodes(
            counterparts,
            workdir,
            apiserver=control_plane.apiserver,
            specs=specs,
            labels={**labels, **dict(node_options.pop("labels", None) or {})},
            **node_options,
        )
        started.extend(nodes)
        return nodes

    try:
        yield start
    finally:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        for node in reversed(started):
            node.stop()
        custom = client.CustomObjectsApi(api_client)
        for node in started:
            try:
                custom.delete_cluster_custom_object(
                    "topology.gpuagent.dev", "v1alpha1", "gpunodes", node.name
                )
            except ApiException as e:
                if e.status != 404:
                    raise
        cluster.delete_nodes(api_client, [n.name for n in started])


# ------------------------------------------------------------------------------- real operators (issue 19)
#
# The operators users run on top of the schedulers: vc-controller-manager (Volcano Jobs, Queue state,
# PodGroups for plain pods), the KubeRay operator (with Volcano as its batch scheduler, or plain for Kueue),
# Kueue's controller manager (webhooks on loopback) and kube-controller-manager's Job controller. Module
# scope: an operator runs for the module that asks for it and is stopped after it (two KubeRay operators
# must never reconcile the same API server at once).


@dataclass
class GpuRacks:
    """Hollow GB200 trays with their agents, ``racks[rack][tray]`` (one NVLink domain per rack), and one
    CPU-only hollow node (no GPUs, no agent) for what needs no GPU, such as a Ray head. Every node carries
    ``gpuagent.dev/e2e-test=<label>`` and ``gpuagent.dev/cpu-only`` (``true`` on the CPU node only).
    Trays report 16 CPUs and 64 GiB, the CPU node 8 and 16 GiB."""

    shape: str
    label: str
    racks: list[list[cluster.HollowGpuNode]]
    cpu_node: cluster.HollowNode
    workdir: Path

    @property
    def trays(self) -> int:
        return len(self.racks[0])

    def names(self, rack: int) -> list[str]:
        return [n.name for n in self.racks[rack]]

    def by_name(self) -> dict[str, cluster.HollowGpuNode]:
        return {n.name: n for rack in self.racks for n in rack}

    def ibnetdiscover(self) -> Path:
        """The fabric the racks' simulated HCAs cable into, as ``ibnetdiscover`` prints it."""
        from agent.nvml.sim_sysfs import ibnetdiscover_sample
        from agent.nvml.simulate import parse_spec

        path = self.workdir / "fabric.ibnetdiscover"
        path.write_text(ibnetdiscover_sample([parse_spec(n.spec.simulate) for n in self.by_name().values()]))
        return path


CPU_ONLY_LABEL = "gpuagent.dev/cpu-only"


def start_gpu_racks(
    request: pytest.FixtureRequest,
    counterparts: cluster.Counterparts,
    apiserver: cluster.ApiServer,
    api_client: Any,
    workdir: Path,
    *,
    prefix: str,
    racks: int,
    trays: int,
    timeout_s: float = 120.0,
) -> Iterator[GpuRacks]:
    """Generator for a module fixture (``yield from``): ``racks`` x ``trays`` hollow ``gb200-nvl72`` trays
    with an agent each, plus a CPU-only node; waits until every tray offers 4 GPUs and its NVLink-domain
    label. At the end everything is stopped and its Node and GPUNode objects are deleted."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    _require(counterparts, "hollownode")
    if os.geteuid() != 0:
        _unavailable("hollow nodes need root: each bind-mounts its device-plugin folder in its own namespace")
    # the agents publish their GPUNode into it (this API server may be another than the shared one)
    cluster.apply_crds(
        api_client, cluster.load_yaml_documents([REPO_ROOT / "daemonset" / "crds" / "gpunode.yaml"])
    )
    shape = f"{racks}x{trays}"
    label = f"{prefix}-{shape}"
    specs = [
        cluster.GpuNodeSpec(f"{prefix}{shape}-r{r}-t{t:02d}", f"gb200-nvl72:rack={r},tray={t}")
        for r in range(racks)
        for t in range(trays)
    ]
    cpu_name = f"{prefix}{shape}-cpu"
    labels = {"gpuagent.dev/e2e-test": label, "gpuagent.dev/hollow": "true"}
    nodes: list[cluster.HollowGpuNode] = []
    cpu: cluster.HollowNode | None = None
    try:
        cpu = cluster.start_hollow_node(
            counterparts,
            workdir,
            apiserver=apiserver,
            name=cpu_name,
            labels={**labels, CPU_ONLY_LABEL: "true"},
            cpus=8,
            memory="16Gi",
            timeout_s=timeout_s,
        )
        nodes = cluster.start_hollow_gpu_nodes(
            counterparts,
            workdir,
            apiserver=apiserver,
            specs=specs,
            labels={**labels, CPU_ONLY_LABEL: "false"},
            cpus=16,  # room for a Ray head or other CPU pods beside a tray's GPU pods
            memory="64Gi",
            timeout_s=timeout_s,
        )

        def short() -> list[str]:
            out = []
            for node in nodes:
                obj = node.node.node() or {}
                alloc = (obj.get("status") or {}).get("allocatable") or {}
                if alloc.get("nvidia.com/gpu") != "4" or "gpuagent.dev/nvlink-domain" not in (
                    (obj.get("metadata") or {}).get("labels") or {}
                ):
                    out.append(node.name)
            return out

        try:
            cluster.wait_until(
                lambda: not short(),
                what=f"{len(nodes)} hollow trays offering 4 GPUs with their NVLink-domain label",
                timeout_s=timeout_s * max(1, len(nodes) // 8),
            )
        except cluster.StartupError as e:
            raise cluster.StartupError(f"{e}; still short: {short()}") from None
        yield GpuRacks(shape, label, [nodes[r * trays : (r + 1) * trays] for r in range(racks)], cpu, workdir)
    finally:
        for node in reversed(nodes):
            node.stop()
        if cpu is not None:
            cpu.stop()
        custom = client.CustomObjectsApi(api_client)
        for spec in specs:
            try:
                custom.delete_cluster_custom_object(
                    "topology.gpuagent.dev", "v1alpha1", "gpunodes", spec.name
                )
            except ApiException as e:
                if e.status != 404:
                    raise
        cluster.delete_nodes(api_client, [s.name for s in specs] + [cpu_name])


def run_topology_controller_once(
    kubeconfig: Path, racks: GpuRacks, *extra: str, timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """``gpu-node-agent controller --once`` against the API server, as an operator runs it: HyperNodes from
    the agents' GPUNodes and the racks' fabric (``extra``: e.g. ``--export kueue --output FILE``)."""
    argv = [
        *cluster.AGENT_COMMAND,
        "controller",
        "--once",
        f"--kubeconfig={kubeconfig}",
        f"--ibnetdiscover={racks.ibnetdiscover()}",
        "--lease-namespace=default",
        "--log-format=json",
        *extra,
    ]
    done = subprocess.run(
        argv, env=dict(cluster.AGENT_ENV), capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, f"{' '.join(argv)}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="session")
def kuberay_crds(counterparts: cluster.Counterparts, api_client: Any) -> list[str]:
    """The ray.io CRDs (RayCluster, RayJob, RayService) of the KubeRay release in versions.env."""
    try:
        files = counterparts.crds("kuberay")
    except cluster.MissingCounterpartError as e:
        _unavailable(str(e))
    # large CRDs (RayCluster's schema is megabytes): a loaded machine needs longer than the default
    return cluster.apply_crds(api_client, cluster.load_yaml_documents(files), timeout_s=300)


def _operator(start: Callable[[], cluster.Operator]) -> Iterator[cluster.Operator]:
    """A module fixture's body: the operator ``start`` runs (skipped or failed with the build command when
    its binary is missing), yielded, and stopped after the module."""
    try:
        op = start()
    except cluster.MissingCounterpartError as e:
        _unavailable(str(e))
        raise  # unreachable: _unavailable skips or fails
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture(scope="module")
def volcano_controllers(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    volcano_crds: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[cluster.Operator]:
    """vc-controller-manager (Volcano Jobs, Queue state, PodGroups for plain pods) for this module."""
    yield from _operator(
        lambda: cluster.start_volcano_controllers(
            counterparts, tmp_path_factory.mktemp("vc-cm"), apiserver=control_plane.apiserver
        )
    )


@pytest.fixture(scope="module")
def kuberay_volcano(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    volcano_crds: list[str],
    kuberay_crds: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[cluster.Operator]:
    """The KubeRay operator with ``--batch-scheduler=volcano`` for this module."""
    yield from _operator(
        lambda: cluster.start_kuberay_operator(
            counterparts, tmp_path_factory.mktemp("kuberay"), apiserver=control_plane.apiserver
        )
    )


@pytest.fixture(scope="module")
def kuberay_plain(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    kuberay_crds: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[cluster.Operator]:
    """The KubeRay operator without a batch scheduler (pods go to kube-scheduler; Kueue gates them)."""
    yield from _operator(
        lambda: cluster.start_kuberay_operator(
            counterparts,
            tmp_path_factory.mktemp("kuberay"),
            apiserver=control_plane.apiserver,
            batch_scheduler=None,
        )
    )


@pytest.fixture(scope="module")
def kueue(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    kuberay_crds: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[cluster.Operator]:
    """Kueue's controller manager (frameworks batch/job and ray.io/raycluster) with its webhooks served on
    loopback and registered; stopped, and the webhook configurations deleted, after the module."""
    if os.geteuid() != 0:
        _unavailable("kueue-manager needs root: its metrics certificate path is fixed under /etc")
    yield from _operator(
        lambda: cluster.start_kueue(
            counterparts, tmp_path_factory.mktemp("kueue"), apiserver=control_plane.apiserver
        )
    )


@pytest.fixture(scope="module")
def job_controller(
    counterparts: cluster.Counterparts,
    control_plane: cluster.ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[cluster.Operator]:
    """kube-controller-manager with only the Job controller (batch Jobs get their pods)."""
    yield from _operator(
        lambda: cluster.start_kube_controller_manager(
            counterparts, tmp_path_factory.mktemp("kcm"), apiserver=control_plane.apiserver
        )
    )
