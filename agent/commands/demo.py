"""``gpu-node-agent demo``: a simulated GPU cluster, end to end, on a machine without GPUs.

What it starts, all in this process:

- one node agent per simulated node (``gb200-nvl72`` trays in NVL72 racks, and ``dgx-h100`` nodes),
  each the real ``run`` agent (:func:`agent.commands.run.serve`): discovery through the NVML simulator,
  health, device plugins serving kubelet's v1beta1 API on real unix sockets and registered with an
  in-process kubelet stand-in (:mod:`agent.fakekubelet`), and a metrics endpoint;
- publishing: with ``--control-plane`` (the real etcd + kube-apiserver built by the test command) the
  agents write their ``GPUNode`` and labels to it and the topology controller applies HyperNodes;
  otherwise the objects they would apply are written as YAML into the output folder;
- the topology controller's HyperNode tree (tier 1 NVLink domains, then IB leaves and spines) from the
  agents' ``GPUNode`` objects and the simulated fabric's ``ibnetdiscover`` file;
- the gang planner placing a sample NVL72 training job on the cluster as the agents report it.

It prints the domain tree, the placement, where metrics are served and how to stop; ``--once`` stops
after one pass (for scripts and tests).

When the control plane and the hollow GPU node are built (``tests/e2e/counterparts/build.sh``; root, for
the nodes' mount namespaces), the nodes are real instead: each a hollow kubelet (the kubelet's code with its
real device manager) with one ``gpu-node-agent run`` process beside it, so ``Node.status`` GPU capacity
comes from our plugins through the kubelets; kube-scheduler with our extender binds the sample job into
one NVLink domain, the kubelets admit its pods with the devices our plugins chose, and the demo shows
each pod ``Running`` with its device IDs and the agents' metrics labelled with the pods (see
:func:`run_hollow_demo`; a smaller cluster by default: racks of 4 trays).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import functools
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import yaml

from agent.commands import run as run_command
from agent.config import RunSettings
from agent.fakekubelet import FakeKubelet
from agent.nvml.sim_sysfs import ibnetdiscover_sample
from agent.nvml.simulate import parse_spec
from agent.runtime import InventoryStore
from scheduler_plugin.cluster import snapshot_from_objects
from scheduler_plugin.planner import plan
from scheduler_plugin.snapshot import ClusterSnapshot, Gang, Infeasible, NodeState, Plan, PodSlot, Role
from topology import logs
from topology.builder import FabricPolicy, Tree, desired_objects
from topology.controller import Inputs, build_from
from topology.gpunode import gpunode_object
from topology.labels import node_labels
from topology.model import Health, NodeInventory

GPU_RESOURCE = "nvidia.com/gpu"
START_TIMEOUT_S = 60.0
TRAYS = 18  # trays per rack with in-process nodes
HOLLOW_TRAYS = 4  # trays per rack with hollow nodes (a real kubelet and an agent process each)
DEMO_NAMESPACE = "demo"


class DemoError(RuntimeError):
    """The demo could not bring the simulated cluster up; one line for the user."""


# --------------------------------------------------------------------------- the cluster layout


@dataclass(frozen=True, slots=True)
class DemoNode:
    name: str
    simulate: str  # the --simulate spec of its agent
    rack: int | None  # NVL72 rack, for GB200 trays


def cluster_layout(*, racks: int, dgx: int, trays: int = 18) -> tuple[DemoNode, ...]:
    """GB200 trays ``gb200-r<rack>-t<tray>`` in ``racks`` NVL72 racks, then ``dgx`` DGX H100 nodes."""
    nodes = [
        DemoNode(f"gb200-r{r}-t{t:02d}", f"gb200-nvl72:rack={r},tray={t},hostname=gb200-r{r}-t{t:02d}", r)
        for r in range(racks)
        for t in range(trays)
    ]
    nodes += [
        DemoNode(f"dgx-h100-{i}", f"dgx-h100:su=0,node={i},hostname=dgx-h100-{i}", None) for i in range(dgx)
    ]
    return tuple(nodes)


# --------------------------------------------------------------------------- pure views


def cluster_snapshot(
    inventories: Mapping[str, NodeInventory],
    health: Mapping[str, Mapping[str, Health]],
    tree: Tree,
    *,
    busy: Mapping[str, int],
) -> ClusterSnapshot:
    """The planner's view: healthy GPUs per node, minus ``busy`` ones, with domains from the tree."""
    tiers = tuple(
        t
        for t in ("nvlink", "leaf", "spine", "core")
        if any(h.tier_name == t for h in tree.hypernodes.values())
    )
    states = []
    for name in sorted(inventories):
        inv = inventories[name]
        bad = health.get(name, {})
        healthy = sum(1 for g in inv.gpus if not g.lost and bad.get(g.uuid, Health.HEALTHY) is Health.HEALTHY)
        states.append(
            NodeState(
                name=name,
                gpus=len(inv.gpus),
                free=max(0, healthy - busy.get(name, 0)),
                domains=tree.ancestors(name),
            )
        )
    return ClusterSnapshot(tiers=tiers, nodes=tuple(states))


def cluster_snapshot_from_api(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    hypernodes: Sequence[Mapping[str, Any]],
    *,
    busy: Mapping[str, int],
) -> ClusterSnapshot:
    """The planner's view read back from the API (as the extender sees it), minus ``busy`` GPUs."""
    snap = snapshot_from_objects(nodes, pods, hypernodes)
    return replace(
        snap,
        nodes=tuple(replace(n, free=max(0, n.free - busy.get(n.name, 0))) for n in snap.nodes),
    )


def sample_gang(*, pods: int = 18, gpus_per_pod: int = 4, subgroup: int = 18) -> Gang:
    """An NVL72 training job: ``pods`` workers, each block of ``subgroup`` inside one NVLink domain."""
    return Gang(
        name="llm-pretrain",
        roles=(Role("worker", pods, gpus_per_pod, subgroup_size=subgroup, subgroup_tier="nvlink"),),
    )


def _span(names: Sequence[str]) -> str:
    if not names:
        return "none"
    if len(names) <= 3:
        return ", ".join(names)
    return f"{names[0]} … {names[-1]}"


def render_tree(tree: Tree, gpus: Mapping[str, int]) -> list[str]:
    """The HyperNode tree, roots first, one line per HyperNode, tier-1 lines summarising their nodes."""
    children: dict[str, list[str]] = {}
    for child, parent in tree.parent.items():
        children.setdefault(parent, []).append(child)
    roots = sorted(h for h in tree.hypernodes if h not in tree.parent)
    lines: list[str] = []

    def walk(name: str, depth: int) -> None:
        h = tree.hypernodes[name]
        pad = "  " * depth
        if h.member_type == "Node":
            total = sum(gpus.get(n, 0) for n in h.members)
            lines.append(
                f"{pad}{h.tier_name:<6} {name}: {len(h.members)} nodes, {total} GPUs ({_span(h.members)})"
            )
            return
        lines.append(f"{pad}{h.tier_name:<6} {name}")
        for child in sorted(children.get(name, [])):
            walk(child, depth + 1)

    for root in roots:
        walk(root, 1)
    for node, why in sorted(tree.excluded.items()):
        lines.append(f"  excluded {node}: {why}")
    return lines


def render_plan(result: Plan | Infeasible, gang: Gang, busy: Mapping[str, int]) -> list[str]:
    role = gang.roles[0]
    head = (
        f'Sample job "{gang.name}": {role.pods} pods x {role.gpus_per_pod} GPUs, '
        f"every {role.subgroup_size} consecutive pods inside one {role.subgroup_tier} domain"
    )
    lines = [head]
    if busy:
        lines.append(f"  already busy (a running job): {_span(sorted(busy))} ({sum(busy.values())} GPUs)")
    if isinstance(result, Infeasible):
        lines.append(f"  not placed: {result.reason}")
        return lines
    for sg in result.subgroups:
        start = sg.index * (role.subgroup_size or role.pods)
        stop = min(role.pods, start + (role.subgroup_size or role.pods))
        pods = [PodSlot(sg.role, i) for i in range(start, stop)]
        nodes = [result.placement[p] for p in pods]
        lines.append(
            f"  subgroup {sg.index} -> {sg.domain}: {pods[0]}..{pods[-1]} on {_span(sorted(set(nodes)))}"
        )
    return lines


# --------------------------------------------------------------------------- the local control plane


@dataclass
class LocalApi:
    """The locally built etcd + kube-apiserver the agents publish to, with our and Volcano's CRDs."""

    plane: Any  # agent.localcluster.ControlPlane
    client: Any  # kubernetes ApiClient (admin)
    kubeconfig: Path
    url: str

    def stop(self) -> None:
        self.client.close()
        self.plane.stop()


def start_local_api(
    workdir: Path, *, required: bool, announce: Callable[[], None] = lambda: None
) -> tuple[LocalApi | None, str]:
    """Starts the control plane the test command builds; ``(None, why)`` when it is not built and not
    ``required`` (raises :class:`DemoError` when it is)."""
    from agent import localcluster  # noqa: PLC0415 - only when publishing to a local API
    from topology.gpunode import gpunode_crd  # noqa: PLC0415

    counterparts = localcluster.locate_counterparts()
    try:
        counterparts.check(("etcd", "kube-apiserver"))
        volcano = counterparts.volcano_crds()
    except localcluster.MissingCounterpartError as exc:
        why = f"no local control plane built ({exc})"
        if required:
            raise DemoError(why) from None
        return None, why
    announce()
    plane = localcluster.start_control_plane(counterparts, workdir)
    try:
        client = plane.apiserver.api_client()
        crds = [gpunode_crd()] + [
            d
            for d in localcluster.load_yaml_documents(volcano)
            if d.get("kind") == "CustomResourceDefinition"
        ]
        localcluster.apply_crds(client, crds)
    except BaseException:
        plane.stop()
        raise
    return LocalApi(plane, client, plane.apiserver.kubeconfig, plane.apiserver.url), ""


def _count_gpunodes(api: LocalApi) -> int:
    from topology.kube import GPUNODES, Kube  # noqa: PLC0415

    items, _ = Kube(api.client).list(GPUNODES)
    return len(items)


def _cluster_objects(
    api: LocalApi,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes, pods and HyperNodes as plain dicts, for the planner's snapshot."""
    from topology.kube import HYPERNODES, NODES, PODS, Kube  # noqa: PLC0415

    kube = Kube(api.client)
    return kube.list(NODES)[0], kube.list(PODS)[0], kube.list(HYPERNODES)[0]


def _apply_tree(api: LocalApi, fabric: str) -> tuple[Tree, int]:
    """The topology controller, once, against the local API: returns the tree and the writes it made."""
    from topology.controller import ControllerSettings, TopologyController  # noqa: PLC0415
    from topology.kube import Kube, api_client_from  # noqa: PLC0415

    controller = TopologyController(
        kube=Kube(api_client_from(str(api.kubeconfig))),
        settings=ControllerSettings(
            policy=FabricPolicy.ISOLATE,
            namespace="default",
            leader_elect=False,
            identity="demo",
            static_ibnet=(("simulated fabric", fabric),),
        ),
    )
    d = controller.reconcile_once()
    assert controller.last_tree is not None
    return controller.last_tree, len(d.apply)


# --------------------------------------------------------------------------- running it


@dataclass
class DemoOptions:
    racks: int = 2
    dgx: int = 2
    once: bool = False
    out: Path | None = None
    control_plane: str = "auto"  # auto | on | off
    busy_trays: int = 2  # trays of rack 0 shown as running another job
    trays: int | None = None  # per rack; None: TRAYS, or HOLLOW_TRAYS on hollow nodes
    hollow: str = "auto"  # auto (when built, with the control plane) | on | off


@dataclass
class RunningNode:
    node: DemoNode
    settings: RunSettings
    kubelet: FakeKubelet
    workdir: Path
    task: asyncio.Task[int] | None = None
    store: InventoryStore | None = None


@dataclass
class DemoResult:
    nodes: list[RunningNode] = field(default_factory=list)
    tree: Tree | None = None
    published_to: str = ""


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _observing_factories(stores: dict[str, InventoryStore]) -> tuple[run_command.ComponentFactory, ...]:
    """The agents' factories plus one that lets the demo read each agent's inventory store (it starts
    nothing)."""

    def observe(ctx: run_command.RunContext) -> None:
        stores[ctx.settings.node_name] = ctx.store

    return (*run_command.default_factories(), observe)


async def _wait_until(check: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)


def _scrape(port: int, *, wait_s: float = START_TIMEOUT_S) -> str:
    """The agent's /metrics, waiting up to ``wait_s`` for its listener: an agent starts serving metrics
    only once its device plugins have registered, which a loaded machine may delay past the rest."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                body: bytes = reply.read()
            return body.decode()
        except urllib.error.URLError as exc:
            if not isinstance(exc.reason, ConnectionRefusedError) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def write_objects(
    out: Path, gpunodes: Mapping[str, Mapping[str, Any]], labels: Mapping[str, Mapping[str, str]], tree: Tree
) -> None:
    """What the agents and the controller would apply, as YAML files under ``out``."""
    (out / "gpunodes").mkdir(parents=True, exist_ok=True)
    for name, obj in gpunodes.items():
        (out / "gpunodes" / f"{name}.yaml").write_text(yaml.safe_dump(dict(obj), sort_keys=False))
    (out / "node-labels.yaml").write_text(
        yaml.safe_dump({n: dict(v) for n, v in labels.items()}, sort_keys=True)
    )
    hypernodes = list(desired_objects(tree).values())
    (out / "hypernodes.yaml").write_text(yaml.safe_dump_all(hypernodes, sort_keys=False))


def hollow_unavailable(options: DemoOptions) -> str | None:
    """Why this run does not use hollow nodes, or None when it does (raises :class:`DemoError` when
    ``hollow`` is ``on`` and they cannot run here)."""
    if options.control_plane == "off" or options.hollow == "off":
        return "--control-plane off" if options.control_plane == "off" else "--hollow off"
    from agent import localcluster  # noqa: PLC0415
    from agent.benchmarks.cluster import unavailable_reason  # noqa: PLC0415

    why = unavailable_reason(localcluster.locate_counterparts(), volcano=False)
    if why is not None and options.hollow == "on":
        raise DemoError(f"no hollow nodes: {why}")
    return why


async def run_demo(options: DemoOptions, *, stop: asyncio.Event, out: TextIO) -> int:
    if hollow_unavailable(options) is None:
        return await run_hollow_demo(options, stop=stop, out=out)
    layout = cluster_layout(racks=options.racks, dgx=options.dgx, trays=options.trays or TRAYS)
    base = Path(tempfile.mkdtemp(prefix="gna-demo-"))
    out_dir = options.out if options.out is not None else Path(tempfile.mkdtemp(prefix="gna-demo-out-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    loop = asyncio.get_running_loop()
    # every agent waits on NVML events in a worker thread; give each its own
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=4 * len(layout) + 8))
    ports = _free_ports(len(layout))
    stores: dict[str, InventoryStore] = {}
    running: list[RunningNode] = []
    agent_stop = asyncio.Event()
    api: LocalApi | None = None
    try:
        no_api_reason = "--control-plane off"
        if options.control_plane != "off":
            api, no_api_reason = await asyncio.to_thread(
                start_local_api,
                base / "cp",
                required=options.control_plane == "on",
                announce=lambda: print(
                    "Starting the local control plane (etcd + kube-apiserver) ...", file=out, flush=True
                ),
            )
        if api is not None:
            await asyncio.to_thread(_register_nodes, api, layout)
        print(f"Starting {len(layout)} simulated nodes (no GPU needed) ...", file=out, flush=True)
        for i, node in enumerate(layout):
            workdir = base / f"n{i:03d}"
            kubelet_dir = workdir / "dp"
            kubelet_dir.mkdir(parents=True)
            kubelet = FakeKubelet(kubelet_dir)
            await kubelet.start()
            settings = RunSettings(
                node_name=node.name,
                kubelet_dir=kubelet_dir,
                pod_resources_socket=workdir / "pod-resources.sock",
                simulate=node.simulate,
                no_kube=api is None,
                kubeconfig=api.kubeconfig if api is not None else None,
                log_level="error",
                shutdown_grace_s=1.0,
                metrics_addr=f"127.0.0.1:{ports[i]}",
                metrics_interval_s=2.0,
                rediscover_interval_s=300.0,
            )
            running.append(RunningNode(node, settings, kubelet, workdir))
        factories = _observing_factories(stores)
        for rn in running:
            rn.task = asyncio.create_task(
                run_command.serve(rn.settings, stop=agent_stop, factories=factories), name=rn.node.name
            )
        await _wait_until(
            lambda: len(stores) == len(running) or any(r.task is not None and r.task.done() for r in running),
            timeout=START_TIMEOUT_S,
            what="the agents to discover their nodes",
        )
        failed = [r for r in running if r.task is not None and r.task.done()]
        if failed:
            exc = failed[0].task.exception() if failed[0].task is not None else None
            raise DemoError(f"agent {failed[0].node.name} stopped: {exc}")
        for rn in running:
            rn.store = stores[rn.node.name]
        await _wait_until(
            lambda: all(GPU_RESOURCE in r.kubelet.devices for r in running),
            timeout=START_TIMEOUT_S,
            what="every device plugin to register with its kubelet",
        )
        inventories = {r.node.name: r.store.inventory for r in running if r.store is not None}
        health = {
            r.node.name: {uuid: h.health for uuid, h in r.store.health().items()}
            for r in running
            if r.store is not None
        }
        gpunodes = {
            name: gpunode_object(inv, node_name=name, health=health[name])
            for name, inv in inventories.items()
        }
        labels = {name: node_labels(inv, node_name=name) for name, inv in inventories.items()}
        fabric = ibnetdiscover_sample([parse_spec(n.simulate) for n in layout])
        (out_dir / "fabric.ibnetdiscover").write_text(fabric)
        busy = {n.name: 4 for n in layout if n.rack == 0 and n.name.endswith(("-t03", "-t11"))}
        busy = dict(list(busy.items())[: options.busy_trays])
        per_rack = options.trays or TRAYS
        gang = sample_gang(pods=per_rack, subgroup=per_rack)
        problems: list[str] = []
        if api is not None:
            published = api
            await _wait_until(
                lambda: _count_gpunodes(published) >= len(layout),
                timeout=START_TIMEOUT_S,
                what="every agent to publish its GPUNode",
            )
            tree, writes = await asyncio.to_thread(_apply_tree, api, fabric)
            nodes, pods, hypernodes = await asyncio.to_thread(_cluster_objects, api)
            snapshot = cluster_snapshot_from_api(nodes, pods, hypernodes, busy=busy)
            where = (
                f"Published to the local kube-apiserver {api.url}: {len(layout)} GPUNodes and node labels "
                f"by the agents, {writes} HyperNodes by the controller\n"
                f"  kubectl --kubeconfig {api.kubeconfig} get gpunodes,hypernodes"
            )
        else:
            built = build_from(
                Inputs(gpunodes=gpunodes, nodes=None, ibnet=(("simulated fabric", fabric),)),
                policy=FabricPolicy.ISOLATE,
            )
            tree, problems = built.tree, built.problems
            snapshot = cluster_snapshot(inventories, health, tree, busy=busy)
            where = (
                f"No cluster API in this run ({no_api_reason}); the objects that would be applied are in "
                f"{out_dir}:\n  gpunodes/*.yaml (GPUNode per node), node-labels.yaml, hypernodes.yaml"
            )
        write_objects(out_dir, gpunodes, labels, tree)
        result = plan(snapshot, gang)

        scrape = await asyncio.to_thread(_scrape, ports[0])
        samples = sum(1 for line in scrape.splitlines() if line and not line.startswith("#"))
        _print_picture(
            out,
            running=running,
            inventories=inventories,
            tree=tree,
            problems=problems,
            where=where,
            result=result,
            gang=gang,
            busy=busy,
            ports=ports,
            samples=samples,
        )
        if not options.once:
            print("\nRunning. Press Ctrl-C to stop.", file=out, flush=True)
            await stop.wait()
        return 0
    finally:
        agent_stop.set()
        for rn in running:
            if rn.task is not None:
                with contextlib.suppress(Exception):
                    await rn.task
            await rn.kubelet.stop()
        if api is not None:
            await asyncio.to_thread(api.stop)
        shutil.rmtree(base, ignore_errors=True)  # sockets, simulated sysfs, control-plane data; not out_dir


def _register_nodes(api: LocalApi, layout: Sequence[DemoNode]) -> None:
    """Node objects for the simulated nodes (their kubelets are in-process stand-ins, not real)."""
    from agent import localcluster  # noqa: PLC0415

    gpus = {"gb200-nvl72": 4, "dgx-h100": 8}
    localcluster.register_nodes(
        api.client,
        [localcluster.fake_gpu_node(n.name, gpus=gpus[parse_spec(n.simulate).profile]) for n in layout],
    )


def _print_picture(
    out: TextIO,
    *,
    running: Sequence[RunningNode],
    inventories: Mapping[str, NodeInventory],
    tree: Tree,
    problems: Sequence[str],
    where: str,
    result: Plan | Infeasible,
    gang: Gang,
    busy: Mapping[str, int],
    ports: Sequence[int],
    samples: int,
) -> None:
    gpus = {name: len(inv.gpus) for name, inv in inventories.items()}
    trays = [r for r in running if r.node.rack is not None]
    racks = len({r.node.rack for r in trays})
    others = len(running) - len(trays)
    advertised = sum(
        sum(1 for h in r.kubelet.devices.get(GPU_RESOURCE, {}).values() if h == "Healthy") for r in running
    )
    registered = sum(1 for r in running if r.kubelet.registrations)
    p = print
    p("", file=out)
    p(
        f"Cluster: {len(running)} nodes ({len(trays)} gb200-nvl72 trays in {racks} NVL72 "
        f"rack{'s' * (racks != 1)}, "
        f"{others} dgx-h100), {sum(gpus.values())} GPUs",
        file=out,
    )
    p(
        f"Device plugins: {registered}/{len(running)} registered with their kubelet over unix sockets; "
        f"{GPU_RESOURCE}: {advertised} healthy devices advertised",
        file=out,
    )
    p(where, file=out)
    p("", file=out)
    p(f"HyperNode tree ({len(tree.hypernodes)} HyperNodes):", file=out)
    for line in render_tree(tree, gpus):
        p(line, file=out)
    for problem in problems:
        p(f"  problem: {problem}", file=out)
    p("", file=out)
    for line in render_plan(result, gang, busy):
        p(line, file=out)
    p("", file=out)
    p(
        f"Metrics: http://127.0.0.1:{ports[0]}/metrics ({running[0].node.name}, {samples} samples) "
        f"... http://127.0.0.1:{ports[-1]}/metrics ({running[-1].node.name}); also /healthz and /readyz",
        file=out,
    )
    p("Stop: Ctrl-C (or run with --once to exit after one pass)", file=out, flush=True)


# --------------------------------------------------------------------------- on hollow nodes


@dataclass
class HollowPod:
    name: str
    node: str
    phase: str
    devices: tuple[str, ...]  # the IDs the kubelet gave the container (its CreateContainer request)


@dataclass
class HollowPicture:
    gpus: dict[str, int]  # node -> allocatable nvidia.com/gpu in Node.status
    busy: dict[str, str]  # pod of another job -> its node
    pods: list[HollowPod]
    running_s: float
    labelled: dict[str, int]  # pod -> GPUs whose metrics carry its labels
    example: str  # one metric sample line labelled with a pod
    gpunodes: int


def _visible_devices(node: Any, pod: str) -> tuple[str, ...]:
    """``NVIDIA_VISIBLE_DEVICES`` of the pod's last recorded ``CreateContainer`` (container ``main``)."""
    records = [
        r for r in node.node.records(pod=pod, namespace=DEMO_NAMESPACE) if r.get("container") == "main"
    ]
    if not records:
        return ()
    value = str((records[-1].get("envs") or {}).get("NVIDIA_VISIBLE_DEVICES", ""))
    return tuple(v for v in value.split(",") if v)


def _has_devices(node: Any, pod: str) -> bool:
    return bool(_visible_devices(node, pod))


def pod_labelled_gpus(metrics_text: str, pod: str) -> tuple[set[str], str]:
    """GPU UUIDs whose samples carry ``pod``'s labels, and one such sample line."""
    uuids: set[str] = set()
    example = ""
    want = (f'pod="{pod}"', f'namespace="{DEMO_NAMESPACE}"')
    for line in metrics_text.splitlines():
        if line.startswith("#") or not all(w in line for w in want):
            continue
        start = line.find('uuid="')
        if start < 0:
            continue
        uuids.add(line[start + 6 : line.index('"', start + 6)])
        if not example and "allocation_info" not in line:
            example = line
    return uuids, example


def _allocatable(client: Any) -> dict[str, int]:
    from topology.kube import NODES, Kube  # noqa: PLC0415

    return {
        n["metadata"]["name"]: int(((n.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, "0"))
        for n in Kube(client).list(NODES)[0]
    }


def hollow_pass(
    cluster: Any, layout: Sequence[DemoNode], options: DemoOptions, out_dir: Path
) -> HollowPicture:
    """Create the other job's pods and the sample job on the hollow cluster; wait until they run and the
    agents label their GPUs' metrics with them (blocking; run it in a thread)."""
    from agent import localcluster  # noqa: PLC0415
    from agent.benchmarks import cluster as hollow  # noqa: PLC0415
    from topology.kube import GPUNODES, Kube  # noqa: PLC0415

    client = cluster.client
    hollow.ensure_namespace(client, DEMO_NAMESPACE)
    per_rack = options.trays or HOLLOW_TRAYS
    # another job holds whole trays of rack 0, bound straight to them (admitted by their kubelets)
    busy_nodes = [n.name for n in layout if n.rack == 0 and n.name.endswith(("-t03", "-t11"))]
    busy = {f"other-job-{i}": node for i, node in enumerate(busy_nodes[: options.busy_trays])}
    hollow.create_pods(
        client,
        DEMO_NAMESPACE,
        [
            hollow.gpu_pod(p, scheduler=hollow.EXTENDER_SCHEDULER, gpus=4, node_name=n)
            for p, n in busy.items()
        ],
    )
    if busy:
        localcluster.wait_until(
            lambda: all(
                v.phase == "Running" for v in hollow.list_pods(client, DEMO_NAMESPACE, "other-job-").values()
            ),
            what="the other job's pods Running",
            timeout_s=hollow.WAIT_S,
        )
        ext = cluster.extender

        def seen() -> bool:
            with ext.service.lock:
                return all(f"{DEMO_NAMESPACE}/{p}" in ext.service.state.pods for p in busy)

        localcluster.wait_until(seen, what="the extender to see the other job")
    free_racks = {n.rack for n in layout if n.rack is not None} - {
        n.rack for n in layout if n.name in busy.values()
    }
    if not free_racks:  # the extender would leave the whole gang pending; say so instead of waiting
        return HollowPicture(_allocatable(client), busy, [], 0.0, {}, "", len(Kube(client).list(GPUNODES)[0]))
    gang = sample_gang(pods=per_rack, subgroup=per_rack)
    pods = hollow.extender_gang(gang.name, per_rack)
    names = [p["metadata"]["name"] for p in pods]
    timing = hollow.time_pods(
        client, DEMO_NAMESPACE, names, lambda: hollow.create_pods(client, DEMO_NAMESPACE, pods)
    )
    shown: list[HollowPod] = []
    for name in names:
        node = cluster.node(timing.nodes[name])
        localcluster.wait_until(
            functools.partial(_has_devices, node, name), what=f"the CreateContainer record of {name}"
        )
        shown.append(HollowPod(name, node.name, "Running", _visible_devices(node, name)))
    labelled: dict[str, int] = {}
    example = ""

    def all_labelled() -> bool:
        nonlocal example
        for pod in shown:
            uuids, line = pod_labelled_gpus(cluster.node(pod.node).agent.metrics(), pod.name)
            labelled[pod.name] = len(uuids & set(pod.devices))
            example = example or line
        return all(labelled[p.name] == len(p.devices) for p in shown)

    localcluster.wait_until(all_labelled, what="the pods' labels on their GPUs' metrics", timeout_s=60)
    gpus = _allocatable(client)
    gpunodes = Kube(client).list(GPUNODES)[0]
    (out_dir / "gpunodes").mkdir(parents=True, exist_ok=True)
    for obj in gpunodes:
        (out_dir / "gpunodes" / f"{obj['metadata']['name']}.yaml").write_text(
            yaml.safe_dump(obj, sort_keys=False)
        )
    (out_dir / "hypernodes.yaml").write_text(
        yaml.safe_dump_all(list(desired_objects(cluster.tree).values()), sort_keys=False)
    )
    return HollowPicture(gpus, busy, shown, timing.running_s, labelled, example, len(gpunodes))


async def run_hollow_demo(options: DemoOptions, *, stop: asyncio.Event, out: TextIO) -> int:
    """The demo on hollow GPU nodes (see the module's docstring)."""
    from agent import localcluster  # noqa: PLC0415
    from agent.benchmarks import cluster as hollow  # noqa: PLC0415

    layout = cluster_layout(racks=options.racks, dgx=options.dgx, trays=options.trays or HOLLOW_TRAYS)
    base = Path(tempfile.mkdtemp(prefix="gna-demo-"))
    out_dir = options.out if options.out is not None else Path(tempfile.mkdtemp(prefix="gna-demo-out-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    cluster: Any = None
    try:
        cluster = await asyncio.to_thread(
            hollow.start_hollow_cluster,
            base,
            specs=[localcluster.GpuNodeSpec(n.name, n.simulate) for n in layout],
            extender=True,
            announce=lambda m: print(m, file=out, flush=True),
        )
        picture = await asyncio.to_thread(hollow_pass, cluster, layout, options, out_dir)
        _print_hollow_picture(out, cluster=cluster, layout=layout, picture=picture, out_dir=out_dir)
        if not options.once:
            print("\nRunning. Press Ctrl-C to stop.", file=out, flush=True)
            await stop.wait()
        return 0
    except (localcluster.StartupError, TimeoutError, hollow.ClusterUnavailableError) as exc:
        raise DemoError(str(exc).splitlines()[0]) from exc
    finally:
        if cluster is not None:
            await asyncio.to_thread(cluster.stop)
        shutil.rmtree(base, ignore_errors=True)


def _print_hollow_picture(
    out: TextIO, *, cluster: Any, layout: Sequence[DemoNode], picture: HollowPicture, out_dir: Path
) -> None:
    p = print
    trays = [n for n in layout if n.rack is not None]
    racks = len({n.rack for n in trays})
    api = cluster.plane.apiserver
    total = sum(picture.gpus.get(n.name, 0) for n in layout)
    p("", file=out)
    p(
        f"Cluster: {len(layout)} hollow nodes ({len(trays)} gb200-nvl72 trays in {racks} NVL72 "
        f"rack{'s' * (racks != 1)}, {len(layout) - len(trays)} dgx-h100): each a kubelet (real device "
        "manager, fake container runtime) with one gpu-node-agent",
        file=out,
    )
    p(
        f"Node.status from the kubelets: {GPU_RESOURCE} allocatable {total} on "
        f"{sum(1 for n in layout if picture.gpus.get(n.name))} Nodes, advertised by our device plugins",
        file=out,
    )
    p(
        f"Published to the local kube-apiserver {api.url}: {picture.gpunodes} GPUNodes and node labels "
        f"by the agents, {cluster.hypernode_writes} HyperNodes by the controller "
        f"(also written to {out_dir})\n"
        f"  kubectl --kubeconfig {api.kubeconfig} get nodes,gpunodes,hypernodes,pods -A",
        file=out,
    )
    p("", file=out)
    p(f"HyperNode tree ({len(cluster.tree.hypernodes)} HyperNodes):", file=out)
    for line in render_tree(cluster.tree, picture.gpus):
        p(line, file=out)
    p("", file=out)
    for other, node in picture.busy.items():
        p(f"Already running (another job, bound to its node): {other} on {node} (4 GPUs)", file=out)
    n = len(picture.pods)
    if not n:
        p(
            'Sample job "llm-pretrain": not placed: no NVL72 rack is free (each nvlink domain holds part '
            "of another job, or there is none)",
            file=out,
        )
        p("Stop: Ctrl-C (or run with --once to exit after one pass)", file=out, flush=True)
        return
    p(
        f'Sample job "llm-pretrain": {n} pods x 4 GPUs, all {n} inside one nvlink domain; bound by '
        f"kube-scheduler + our extender, admitted by the kubelets: all Running {picture.running_s:.1f} s "
        "after creation",
        file=out,
    )
    domain = {
        m: name for name, h in cluster.tree.hypernodes.items() if h.tier_name == "nvlink" for m in h.members
    }
    nodes = sorted({pod.node for pod in picture.pods})
    p(f"  subgroup 0 -> {', '.join(sorted({domain.get(x, x) for x in nodes}))}: on {_span(nodes)}", file=out)
    width = max(len(pod.name) for pod in picture.pods)
    for pod in picture.pods:
        p(f"  {pod.name:<{width}}  {pod.phase}  {pod.node}  {','.join(pod.devices)}", file=out)
    p("", file=out)
    gpus = sum(picture.labelled.values())
    p(f"Metrics: {gpus} GPUs of the job carry their pod's labels (namespace, pod, container), e.g.", file=out)
    p(f"  {picture.example}", file=out)
    first, last = cluster.nodes[0], cluster.nodes[-1]
    p(
        f"  http://127.0.0.1:{first.agent.metrics_port}/metrics ({first.name}) ... "
        f"http://127.0.0.1:{last.agent.metrics_port}/metrics ({last.name})",
        file=out,
    )
    p("Stop: Ctrl-C (or run with --once to exit after one pass)", file=out, flush=True)


# --------------------------------------------------------------------------- command


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def _tray_count(text: str) -> int:
    value = int(text)
    if not 1 <= value <= TRAYS:
        raise argparse.ArgumentTypeError(f"expected 1..{TRAYS}, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-node-agent demo", description=__doc__.splitlines()[0])
    p.add_argument(
        "--racks", type=_positive_int, default=2, help="GB200 NVL72 racks (18 trays each; default 2)"
    )
    p.add_argument("--dgx", type=_positive_int, default=2, help="DGX H100 nodes (default 2)")
    p.add_argument(
        "--trays",
        type=_tray_count,
        default=None,
        help=f"trays per rack, 1-18 (default {TRAYS}; {HOLLOW_TRAYS} on hollow nodes)",
    )
    p.add_argument("--once", action="store_true", help="exit after one pass")
    p.add_argument("--out", type=Path, default=None, help="folder for the objects the demo would apply")
    p.add_argument(
        "--control-plane",
        choices=("auto", "on", "off"),
        default="auto",
        help="publish to the locally built etcd + kube-apiserver (auto: when built)",
    )
    p.add_argument(
        "--hollow",
        choices=("auto", "on", "off"),
        default="auto",
        help="hollow GPU nodes (real kubelets) with the control plane (auto: when built and root)",
    )
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.racks + args.dgx == 0:
        print("gpu-node-agent demo: --racks and --dgx are both 0; nothing to simulate", file=sys.stderr)
        return 2
    logs.configure("auto", "error")
    options = DemoOptions(
        racks=args.racks,
        dgx=args.dgx,
        once=args.once,
        out=args.out,
        control_plane=args.control_plane,
        trays=args.trays,
        hollow=args.hollow,
    )

    async def body() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        return await run_demo(options, stop=stop, out=sys.stdout)

    try:
        return asyncio.run(body())
    except DemoError as exc:
        print(f"gpu-node-agent demo: {exc}", file=sys.stderr)
        return 1
