"""The topology controller: watches Nodes, GPUNodes and fabric ConfigMaps, keeps the HyperNode tree.

The adapter around the pure core (:mod:`topology.sources` -> :mod:`topology.builder`):

- one :class:`topology.kube.Informer` per kind lists, then watches (relisting after a 410), into a
  :class:`topology.kube.Store`;
- changes mark the controller dirty; a reconcile runs once nothing changed for ``debounce_s`` (and at
  the latest ``max_delay_s`` after the first change);
- only the Lease holder reconciles; a reconcile builds the tree, diffs it against the HyperNodes the
  cluster holds and writes only what differs (server-side apply, field manager ``gpu-node-agent``),
  deleting only HyperNodes labelled ``volcano.sh/network-topology-source: gpu-node-agent``;
- a node leaving (or rejoining) its NVLink domain is recorded as an Event on the Node (once per change;
  after a restart, the Events recorded before say what was already reported);
- failed writes are retried with backoff; the stores keep the latest state meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from topology import logs
from topology.builder import Diff, FabricPolicy, NodeFacts, Tree, build_tree, desired_objects, diff
from topology.gpunode import GpuNodeError, inventory_from_gpunode, published_verdicts
from topology.ibnet import IbnetError, SwitchTree, parse_many, switch_tree
from topology.kube import (
    GPUNODES,
    HYPERNODES,
    NODES,
    PODS,
    EventRecorder,
    Informer,
    Kube,
    KubeError,
    LeaseElector,
    ObjectRef,
    Store,
    configmaps,
    object_key,
)
from topology.lifecycle import sleep_until, wait_for_event
from topology.model import NodeInventory
from topology.nvlink import CliqueKey
from topology.nvlinkdomain import (
    API_VERSION as NVLINKDOMAIN_API_VERSION,
)
from topology.nvlinkdomain import (
    KIND as NVLINKDOMAIN_KIND,
)
from topology.nvlinkdomain import (
    NVLINKDOMAINS,
    DomainStatus,
    TrayState,
    domain_status,
    hypernode_condition,
    merged_conditions,
    node_is_ready,
    nvlinkdomain_object,
    tray_from_gpunode,
)
from topology.sources import (
    SourceError,
    StaticMapping,
    assemble,
    facts_from_inventory,
    node_labels_of,
    parse_mapping,
)

log = logs.get_logger("topology.controller")

FABRIC_CONFIGMAP_LABEL = "gpuagent.dev/fabric"
MAPPING_KEY = "mapping.yaml"
IBNET_SUFFIX = ".ibnetdiscover"
COMPONENT = "gpu-topology-controller"


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    policy: FabricPolicy = FabricPolicy.ISOLATE
    namespace: str = "gpu-system"  # Lease, fabric ConfigMaps (Events about Nodes go to "default")
    leader_elect: bool = False
    lease_name: str = COMPONENT
    identity: str = "controller"
    lease_duration_s: int = 15
    retry_period_s: float = 2.0
    debounce_s: float = 1.0
    max_delay_s: float = 10.0
    watch_timeout_s: int = 300
    dry_run: bool = False
    static_ibnet: tuple[tuple[str, str], ...] = ()  # (name, text) of --ibnetdiscover files
    static_mapping: StaticMapping | None = None
    export: Callable[[Tree], None] | None = None  # writes an export file after each reconcile
    domains: bool = True  # NVLinkDomain objects, the HyperNodes' condition (watches pods for free GPUs)

    def __post_init__(self) -> None:
        if self.debounce_s < 0 or self.max_delay_s < self.debounce_s:
            raise ValueError("debounce: need 0 <= debounce_s <= max_delay_s")
        if self.leader_elect and self.lease_duration_s <= self.retry_period_s * 2:
            raise ValueError("lease: lease_duration_s must exceed twice retry_period_s")


# --------------------------------------------------------------------------- pure-ish assembly


@dataclass
class Inputs:
    """What one reconcile reads; the same shape online (stores) and offline (files)."""

    gpunodes: Mapping[str, Mapping[str, Any]]
    nodes: Mapping[str, Mapping[str, Any]] | None  # None offline: every GPUNode counts
    ibnet: tuple[tuple[str, str], ...] = ()
    mapping: StaticMapping | None = None


@dataclass
class BuildResult:
    tree: Tree
    problems: list[str] = field(default_factory=list)  # unreadable objects and sources, one line each


ParseCache = dict[tuple[str, str], tuple[str, NodeInventory, NodeFacts] | str]
"""(object name, resourceVersion) -> (node, inventory) or the parse error: a reconcile re-parses only
GPUNodes that changed."""


def build_from(inputs: Inputs, *, policy: FabricPolicy, cache: ParseCache | None = None) -> BuildResult:
    problems: list[str] = []
    inventories: dict[str, NodeInventory] = {}
    known_facts: dict[str, NodeFacts] = {}
    fresh: ParseCache = {}
    for key in sorted(inputs.gpunodes):
        obj = inputs.gpunodes[key]
        meta = obj.get("metadata")
        rv = str(meta.get("resourceVersion", "")) if isinstance(meta, Mapping) else ""
        hit = cache.get((key, rv)) if cache is not None and rv else None
        if hit is None:
            try:
                name, inv, _health = inventory_from_gpunode(obj)
                hit = (name, inv, facts_from_inventory(name, inv, published_verdicts(obj)))
            except GpuNodeError as exc:
                hit = str(exc)
        fresh[(key, rv)] = hit
        if isinstance(hit, str):
            problems.append(hit)
            continue
        inventories[hit[0]] = hit[1]
        known_facts[hit[0]] = hit[2]
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    tree_data: SwitchTree | None = None
    if inputs.ibnet:
        try:
            tree_data = switch_tree(parse_many(inputs.ibnet))
        except IbnetError as exc:
            problems.append(str(exc))
    labels = None
    known = None
    if inputs.nodes is not None:
        labels = dict(node_labels_of(obj) for obj in inputs.nodes.values())
        known = list(inputs.nodes)
    data = assemble(
        inventories=inventories,
        node_labels=labels,
        switch_tree=tree_data,
        mapping=inputs.mapping,
        known_nodes=known,
        facts=known_facts,
    )
    return BuildResult(build_tree(data, policy=policy), problems)


def fabric_from_configmaps(
    cms: Iterable[Mapping[str, Any]],
) -> tuple[tuple[tuple[str, str], ...], StaticMapping | None, list[str]]:
    ibnet: list[tuple[str, str]] = []
    mapping: StaticMapping | None = None
    problems: list[str] = []
    for cm in sorted(cms, key=lambda c: str((c.get("metadata") or {}).get("name", ""))):
        cm_name = str((cm.get("metadata") or {}).get("name", "?"))
        for key, text in sorted((cm.get("data") or {}).items()):
            source = f"configmap/{cm_name}[{key}]"
            if key.endswith(IBNET_SUFFIX):
                ibnet.append((source, str(text)))
            elif key == MAPPING_KEY:
                try:
                    mapping = parse_mapping(str(text), source=source)
                except SourceError as exc:
                    problems.append(str(exc))
    return tuple(ibnet), mapping, problems


class GpuPods:
    """Informer sink for every pod: keeps only the GPUs (``nvidia.com/gpu``) each pod bound to a node
    holds while it runs, so 100,000 pods cost a few small tuples; ``on_change`` runs only when a node's
    count changes."""

    RESOURCE = "nvidia.com/gpu"

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self.on_change = on_change
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[str, int]] = {}  # namespace/name -> (node, GPUs)

    @classmethod
    def gpus_of(cls, pod: Mapping[str, Any]) -> tuple[str, int] | None:
        """``(node, GPUs)`` of a pod that holds GPUs on a node now, else ``None``."""
        raw_spec = pod.get("spec")
        spec: Mapping[str, Any] = raw_spec if isinstance(raw_spec, Mapping) else {}
        raw_status = pod.get("status")
        phase = raw_status.get("phase") if isinstance(raw_status, Mapping) else None
        node = spec.get("nodeName")
        if not isinstance(node, str) or not node or phase in ("Succeeded", "Failed"):
            return None
        gpus = max(
            sum(cls._count(spec.get("containers"))), max(cls._count(spec.get("initContainers")), default=0)
        )
        return (node, gpus) if gpus > 0 else None

    @classmethod
    def _count(cls, containers: Any) -> list[int]:
        out: list[int] = []
        for c in containers if isinstance(containers, list) else []:
            res = c.get("resources") if isinstance(c, Mapping) else None
            value: Any = None
            for part in ("limits", "requests"):
                section = res.get(part) if isinstance(res, Mapping) else None
                if value is None and isinstance(section, Mapping):
                    value = section.get(cls.RESOURCE)
            try:
                out.append(max(0, min(int(str(value)), 1024)) if value is not None else 0)
            except ValueError:
                out.append(0)
        return out

    def replace(self, items: list[dict[str, Any]]) -> None:
        fresh: dict[str, tuple[str, int]] = {}
        for pod in items:
            got = self.gpus_of(pod)
            if got is not None:
                fresh[object_key(pod)] = got
        with self._lock:
            changed = fresh != self._pods
            self._pods = fresh
        if changed:
            self.on_change()

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        got = None if event_type == "DELETED" else self.gpus_of(obj)
        with self._lock:
            before = self._pods.get(key)
            if got is None:
                self._pods.pop(key, None)
            else:
                self._pods[key] = got
        if before != got:
            self.on_change()

    def used_by_node(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with self._lock:
            for node, gpus in self._pods.values():
                out[node] = out.get(node, 0) + gpus
        return out


# --------------------------------------------------------------------------- controller


@dataclass
class Stats:
    reconciles: int = 0
    writes: int = 0
    failed_writes: int = 0
    last_diff: Diff | None = None


class TopologyController:
    def __init__(
        self, *, kube: Kube, settings: ControllerSettings, monotonic: Callable[[], float] = time.monotonic
    ):
        self.kube = kube
        self.settings = settings
        self.monotonic = monotonic
        self.stats = Stats()
        self.last_tree: Tree | None = None  # the tree of the latest reconcile
        self._dirty_since: float | None = None
        self._last_change = 0.0
        self._wake = _Wake(None, None)  # set while run() runs
        self._lock = threading.Lock()
        # what the cluster holds, one store per kind, kept current by one informer each
        self.nodes = Store(self._changed)
        self.gpunodes = Store(self._changed)
        self.hypernodes = Store(self._changed)
        self.fabric = Store(self._changed)
        self.pods = GpuPods(self._changed)
        self.nvlinkdomains = Store(self._changed)
        watch_s = settings.watch_timeout_s
        self.informers: tuple[Informer, ...] = (
            Informer(kube, NODES, self.nodes, watch_timeout_s=watch_s),
            Informer(kube, GPUNODES, self.gpunodes, watch_timeout_s=watch_s, optional=True),
            Informer(kube, HYPERNODES, self.hypernodes, watch_timeout_s=watch_s, optional=True),
            Informer(
                kube,
                configmaps(settings.namespace),
                self.fabric,
                label_selector=FABRIC_CONFIGMAP_LABEL,
                watch_timeout_s=watch_s,
                optional=True,
            ),
        )
        if settings.domains:
            self.informers += (
                Informer(kube, PODS, self.pods, watch_timeout_s=watch_s),
                Informer(kube, NVLINKDOMAINS, self.nvlinkdomains, watch_timeout_s=watch_s, optional=True),
            )
        self.domains: dict[str, DomainStatus] = {}  # the latest status of every NVLink domain, by name
        self._tray_cache: dict[tuple[str, str, bool, int], TrayState | None] = {}
        self._domain_inputs: dict[CliqueKey, tuple[TrayState, ...]] = {}
        self.recorder = EventRecorder(kube, component=COMPONENT, instance=settings.identity)
        self.elector = (
            LeaseElector(
                kube,
                settings.namespace,
                settings.lease_name,
                settings.identity,
                lease_duration_s=settings.lease_duration_s,
            )
            if settings.leader_elect
            else None
        )
        self._excluded: dict[str, str] = {}  # node -> reason last reported
        self._reported_problems: set[str] = set()
        self._parsed: ParseCache = {}
        self._seeded = False

    def _changed(self) -> None:
        now = self.monotonic()
        with self._lock:
            if self._dirty_since is None:
                self._dirty_since = now
            self._last_change = now
        self._wake.set()

    # -- one reconcile (sync: runs in a worker thread) -------------------------------------------
    def inputs(self) -> Inputs:
        ibnet, mapping, problems = fabric_from_configmaps(self.fabric.snapshot().values())
        for p in problems:
            self._problem(p)
        return Inputs(
            gpunodes=self.gpunodes.snapshot(),
            nodes=self.nodes.snapshot(),
            ibnet=self.settings.static_ibnet + ibnet,
            mapping=mapping or self.settings.static_mapping,
        )

    def reconcile_once(self) -> Diff:
        """List every source once (no watches), then reconcile: ``controller --once`` and the demo.

        Raises :class:`KubeError` (naming the path) when a required source cannot be listed."""
        for informer in self.informers:
            try:
                if informer.list_once() is None:  # an optional kind whose CRD is not installed
                    informer.sink.replace([])
            except KubeError as exc:
                raise KubeError(exc.status, f"cannot list {informer.path}: {exc}") from None
        return self.reconcile()

    def reconcile(self) -> Diff:
        result = build_from(self.inputs(), policy=self.settings.policy, cache=self._parsed)
        for p in result.problems:
            self._problem(p)
        tree = result.tree
        self.last_tree = tree
        for note in tree.notes:
            if note not in self._reported_problems:
                self._reported_problems.add(note)
                log.info("topology_note", note=note)
        d = diff(desired_objects(tree), self.hypernodes.snapshot())
        self.stats.reconciles += 1
        self.stats.last_diff = d
        for name in d.conflicts:
            self._problem(f"HyperNode {name!r} exists and is not ours; left alone (rename or delete it)")
        if not self.settings.dry_run:
            self._write(d)
            self._report_exclusions(tree)
        if self.settings.domains:
            self._reconcile_domains(tree)
        if self.settings.export is not None:
            self.settings.export(tree)
        log.info("reconciled", hypernodes=len(tree.hypernodes), writes=d.writes, unchanged=d.unchanged)
        return d

    def _write(self, d: Diff) -> None:
        failed = 0
        for obj in d.apply:
            name = obj["metadata"]["name"]
            try:
                applied = self.kube.apply(f"{HYPERNODES}/{quote(name)}", obj)
                self.stats.writes += 1
                self.hypernodes.remember(applied or obj)  # the watch will confirm; do not rewrite meanwhile
            except KubeError as exc:
                failed += 1
                log.warning("hypernode_apply_failed", hypernode=name, error=str(exc))
        for name in d.delete:
            try:
                self.kube.delete(f"{HYPERNODES}/{quote(name)}")
                self.stats.writes += 1
                self.hypernodes.forget(name)
            except KubeError as exc:
                failed += 1
                log.warning("hypernode_delete_failed", hypernode=name, error=str(exc))
        if failed:
            self.stats.failed_writes += failed
            raise KubeError(0, f"{failed} HyperNode write(s) failed; retrying")

    # -- NVLink domains ---------------------------------------------------------------------------
    def _trays(self) -> list[TrayState]:
        """Every tray of a multi-node NVLink domain whose Node exists; a GPUNode is read again only when
        it, its Node's readiness or its pods' GPUs changed."""
        gpunodes = self.gpunodes.snapshot()
        nodes = self.nodes.snapshot()
        used = self.pods.used_by_node()
        fresh: dict[tuple[str, str, bool, int], TrayState | None] = {}
        trays: list[TrayState] = []
        for key, obj in gpunodes.items():
            if key not in nodes:
                continue
            meta = obj.get("metadata")
            rv = str(meta.get("resourceVersion", "")) if isinstance(meta, Mapping) else ""
            node = nodes[key]
            ck = (key, rv, node_is_ready(node), used.get(key, 0))
            if ck in self._tray_cache and rv:
                hit = self._tray_cache[ck]
            else:
                try:
                    name, inv, health = inventory_from_gpunode(obj)
                    status = obj.get("status")
                    hit = tray_from_gpunode(
                        name,
                        inv,
                        verdicts=published_verdicts(obj),
                        health=health,
                        imex=status.get("imex") if isinstance(status, Mapping) else None,
                        node=node,
                        used_gpus=ck[3],
                    )
                except GpuNodeError:
                    hit = None  # reported once by build_from
            fresh[ck] = hit
            if hit is not None:
                trays.append(hit)
        self._tray_cache = fresh
        return trays

    def _reconcile_domains(self, tree: Tree) -> None:
        """Recompute the domains whose trays changed; write each NVLinkDomain and the tier-1 HyperNode's
        condition only where they differ from what the cluster holds."""
        by_clique: dict[CliqueKey, list[TrayState]] = {}
        for t in self._trays():
            by_clique.setdefault(t.clique, []).append(t)
        inputs = {k: tuple(sorted(v, key=lambda t: t.name)) for k, v in by_clique.items()}
        previous = {s.clique: s for s in self.domains.values()}
        statuses: dict[str, DomainStatus] = {}
        for clique, trays in sorted(inputs.items()):
            same = self._domain_inputs.get(clique) == trays and clique in previous
            s = previous[clique] if same else domain_status(clique, trays)
            statuses[s.name] = s
        self._domain_inputs = inputs
        self.domains = statuses
        if self.settings.dry_run:
            return
        failed = 0
        for name, s in statuses.items():
            failed += self._write_domain(s)
            if name in tree.hypernodes:
                failed += self._write_condition(s)
        for name in sorted(set(self.nvlinkdomains.snapshot()) - set(statuses)):
            try:
                self.kube.delete(f"{NVLINKDOMAINS}/{quote(name)}")
                self.nvlinkdomains.forget(name)
                self.stats.writes += 1
            except KubeError as exc:
                failed += 1
                log.warning("nvlinkdomain_delete_failed", nvlinkdomain=name, error=str(exc))
        if failed:
            self.stats.failed_writes += failed
            raise KubeError(0, f"{failed} NVLinkDomain/HyperNode status write(s) failed; retrying")

    def _write_domain(self, s: DomainStatus) -> int:
        want = nvlinkdomain_object(s)
        have = self.nvlinkdomains.get(s.name) or {}
        path = f"{NVLINKDOMAINS}/{quote(s.name)}"
        labels = ((have.get("metadata") or {}).get("labels")) or {}
        try:
            if have.get("spec") != want["spec"] or labels != want["metadata"]["labels"]:
                have = self.kube.apply(path, {k: v for k, v in want.items() if k != "status"}) or have
                self.stats.writes += 1
            if have.get("status") != want["status"]:
                body = {
                    "apiVersion": NVLINKDOMAIN_API_VERSION,
                    "kind": NVLINKDOMAIN_KIND,
                    "metadata": {"name": s.name},
                    "status": want["status"],
                }
                have = self.kube.apply(f"{path}/status", body) or {**have, "status": want["status"]}
                self.stats.writes += 1
                log.info(
                    "nvlinkdomain_changed",
                    nvlinkdomain=s.name,
                    ready=len(s.ready),
                    trays=len(s.members),
                    imex_quorum=s.quorum,
                    largest_subgroup=s.largest_subgroup,
                )
        except KubeError as exc:
            if exc.status == 404:  # the NVLinkDomain CRD is not installed: HyperNodes go on regardless
                self._problem(
                    "the NVLinkDomain CRD is not installed (daemonset/crds/nvlinkdomain.yaml); "
                    "no domain objects written"
                )
                return 0
            log.warning("nvlinkdomain_apply_failed", nvlinkdomain=s.name, error=str(exc))
            return 1
        self.nvlinkdomains.remember(have)
        return 0

    def _write_condition(self, s: DomainStatus) -> int:
        have = self.hypernodes.get(s.name)
        if have is None:
            return 0
        status, reason, message = hypernode_condition(s)
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions = merged_conditions(
            (have.get("status") or {}).get("conditions"), status, reason, message, now=now
        )
        if conditions is None:
            return 0
        body = {
            "apiVersion": have.get("apiVersion", "topology.volcano.sh/v1alpha1"),
            "kind": "HyperNode",
            "metadata": {"name": s.name},
            "status": {"conditions": conditions},
        }
        try:
            applied = self.kube.apply(f"{HYPERNODES}/{quote(s.name)}/status", body)
        except KubeError as exc:
            if exc.status == 404:  # deleted meanwhile; the next reconcile sees it
                return 0
            log.warning("hypernode_condition_failed", hypernode=s.name, error=str(exc))
            return 1
        self.stats.writes += 1
        self.hypernodes.remember(
            applied or {**have, "status": {**(have.get("status") or {}), **body["status"]}}
        )
        return 0

    def _seed_exclusions(self) -> None:
        """What an earlier run already reported (its Events), so a restart does not report it again."""
        self._seeded = True
        try:
            latest = self.recorder.latest()
        except KubeError as exc:
            log.warning("event_list_failed", error=str(exc))
            return
        self._excluded = {node: e.message for node, e in latest.items() if e.reason == "NvlinkDomainExcluded"}

    def _report_exclusions(self, tree: Tree) -> None:
        if not self._seeded:
            self._seed_exclusions()
        for node, reason in tree.excluded.items():
            if self._excluded.get(node) != reason:
                self._event(node, "NvlinkDomainExcluded", reason, warning=True)
        for node in sorted(set(self._excluded) - set(tree.excluded)):
            if node in tree.node_domain:
                self._event(node, "NvlinkDomainRestored", f"back in {tree.node_domain[node]}", warning=False)
        self._excluded = dict(tree.excluded)

    def _event(self, node: str, reason: str, message: str, *, warning: bool) -> None:
        uid = ((self.nodes.get(node) or {}).get("metadata") or {}).get("uid")
        try:
            self.recorder.record(
                ObjectRef("Node", node, uid=str(uid or "")), reason=reason, message=message, warning=warning
            )
        except KubeError as exc:
            log.warning("event_failed", node=node, error=str(exc))
        log.info("node_excluded" if warning else "node_restored", node=node, reason=message)

    def _problem(self, message: str) -> None:
        if message not in self._reported_problems:
            self._reported_problems.add(message)
            log.warning("input_problem", problem=message)

    # -- the loop ----------------------------------------------------------------------------------
    def _due(self) -> float | None:
        """Seconds until a reconcile is due (0 = now), ``None`` when nothing changed."""
        with self._lock:
            if self._dirty_since is None:
                return None
            now = self.monotonic()
            quiet = self._last_change + self.settings.debounce_s - now
            latest = self._dirty_since + self.settings.max_delay_s - now
            return max(0.0, min(quiet, latest))

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.leading

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    async def run(self, stop: asyncio.Event) -> None:
        """Watch, elect and reconcile until ``stop`` is set; then stop the informers, release the Lease."""
        wake = asyncio.Event()
        self._wake = _Wake(asyncio.get_running_loop(), wake)
        for informer in self.informers:
            informer.start()
        backoff = 0.5
        try:
            while not stop.is_set():
                wake.clear()  # before reading what changed: a change from now on wakes the wait below
                if self.elector is not None:
                    was = self.elector.leading
                    try:
                        await asyncio.to_thread(self.elector.try_acquire_or_renew)
                    except KubeError as exc:
                        self.elector.leading = False
                        log.warning("lease_failed", error=str(exc))
                    if self.elector.leading and not was:
                        log.info("leading", identity=self.settings.identity)
                        self._changed()
                    elif was and not self.elector.leading:
                        log.warning("lost_lease", identity=self.settings.identity)
                due = self._due()
                if due == 0.0 and self.is_leader() and self.synced():
                    with self._lock:
                        self._dirty_since = None
                    try:
                        await asyncio.to_thread(self.reconcile)
                        backoff = 0.5
                    except KubeError as exc:
                        log.warning("reconcile_failed", error=str(exc), retry_s=backoff)
                        await sleep_until(stop, backoff)
                        backoff = min(backoff * 2, 60.0)
                        self._changed()
                    continue
                wait = self.settings.retry_period_s if self.elector is not None else 3600.0
                if due is not None:
                    wait = min(wait, max(due, 0.05))
                await wait_for_event(wake, stop, wait)
        finally:
            self._wake = _Wake(None, None)
            for informer in self.informers:
                informer.stop_soon()  # closes its open watch
            if self.elector is not None:
                await asyncio.to_thread(self.elector.release)
            await asyncio.gather(*(asyncio.to_thread(i.stop, 2.0) for i in self.informers))


@dataclass(frozen=True, slots=True)
class _Wake:
    """Wakes the running loop from any thread (informer threads report changes); a no-op when none runs."""

    loop: asyncio.AbstractEventLoop | None
    event: asyncio.Event | None

    def set(self) -> None:
        if self.loop is None or self.event is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self.loop.call_soon_threadsafe(self.event.set)
