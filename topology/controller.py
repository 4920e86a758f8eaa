"""The topology controller: watches Nodes, GPUNodes and fabric ConfigMaps, keeps the HyperNode tree.

The adapter around the pure core (:mod:`topology.sources` -> :mod:`topology.builder`):

- one :class:`Reflector` per kind lists, then watches (relisting after a 410), into a store;
- changes mark the controller dirty; a reconcile runs once nothing changed for ``debounce_s`` (and at
  the latest ``max_delay_s`` after the first change);
- only the Lease holder reconciles; a reconcile builds the tree, diffs it against the HyperNodes the
  cluster holds and writes only what differs (server-side apply, field manager ``gpu-node-agent``),
  deleting only HyperNodes labelled ``volcano.sh/network-topology-source: gpu-node-agent``;
- a node leaving (or rejoining) its NVLink domain is recorded as an Event on the Node;
- failed writes are retried with backoff; the stores keep the latest state meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from topology.builder import Diff, FabricPolicy, NodeFacts, Tree, build_tree, desired_objects, diff
from topology.gpunode import GpuNodeError, inventory_from_gpunode
from topology.ibnet import IbnetError, SwitchTree, parse_many, switch_tree
from topology.kube import GPUNODES, HYPERNODES, NODES, Kube, KubeError, LeaseElector, configmaps, events
from topology.model import NodeInventory
from topology.sources import (
    SourceError,
    StaticMapping,
    assemble,
    facts_from_inventory,
    node_labels_of,
    parse_mapping,
)

log = logging.getLogger("topology.controller")

FABRIC_CONFIGMAP_LABEL = "gpuagent.dev/fabric"
MAPPING_KEY = "mapping.yaml"
IBNET_SUFFIX = ".ibnetdiscover"
COMPONENT = "gpu-topology-controller"
EVENT_NAMESPACE = "default"  # the API server keeps Events about cluster-scoped objects (Nodes) there


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
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        hit = cache.get((key, rv)) if cache is not None and rv else None
        if hit is None:
            try:
                name, inv, _health = inventory_from_gpunode(obj)
                hit = (name, inv, facts_from_inventory(name, inv))
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


# --------------------------------------------------------------------------- reflectors


class Reflector:
    """List, then watch, one kind into ``store`` (by name); runs in a thread until ``stop`` is set."""

    def __init__(
        self,
        kube: Kube,
        path: str,
        *,
        on_change: Callable[[], None],
        label_selector: str | None = None,
        watch_timeout_s: int = 300,
        optional: bool = False,
    ) -> None:
        self.kube = kube
        self.path = path
        self.on_change = on_change
        self.label_selector = label_selector
        self.watch_timeout_s = watch_timeout_s
        self.optional = optional  # a missing CRD lists as empty (retried)
        self.store: dict[str, dict[str, Any]] = {}
        self.synced = threading.Event()
        self.lock = threading.Lock()
        self.errors = 0

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return dict(self.store)

    def run(self, stop: threading.Event) -> None:
        backoff = 0.5
        while not stop.is_set():
            try:
                items, rv = self.kube.list(self.path, label_selector=self.label_selector)
                with self.lock:
                    self.store = {str(o["metadata"]["name"]): o for o in items}
                self.synced.set()
                self.on_change()
                backoff = 0.5
                while not stop.is_set():
                    for kind, obj in self.kube.watch(
                        self.path, rv, timeout_s=self.watch_timeout_s, label_selector=self.label_selector
                    ):
                        meta = obj.get("metadata") or {}
                        rv = str(meta.get("resourceVersion", rv))
                        if kind == "BOOKMARK":
                            continue
                        name = str(meta.get("name"))
                        with self.lock:
                            if kind == "DELETED":
                                self.store.pop(name, None)
                            else:
                                self.store[name] = obj
                        self.on_change()
                        if stop.is_set():
                            break
            except KubeError as exc:
                self.errors += 1
                if exc.status == 404 and self.optional:
                    with self.lock:
                        self.store = {}
                    self.synced.set()
                elif exc.status != 410:
                    log.warning("watch_failed", extra={"path": self.path, "error": str(exc)})
                stop.wait(backoff if exc.status != 410 else 0)
                backoff = min(backoff * 2, 30.0)
            except Exception as exc:  # a malformed stream must not end the reflector
                self.errors += 1
                log.warning(
                    "watch_failed", extra={"path": self.path, "error": f"{type(exc).__name__}: {exc}"}
                )
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)


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
        self._wake = threading.Event()
        self._lock = threading.Lock()
        watch_s = settings.watch_timeout_s
        self.nodes = Reflector(kube, NODES, on_change=self._changed, watch_timeout_s=watch_s)
        self.gpunodes = Reflector(
            kube, GPUNODES, on_change=self._changed, watch_timeout_s=watch_s, optional=True
        )
        self.hypernodes = Reflector(
            kube, HYPERNODES, on_change=self._changed, watch_timeout_s=watch_s, optional=True
        )
        self.fabric = Reflector(
            kube,
            configmaps(settings.namespace),
            on_change=self._changed,
            label_selector=FABRIC_CONFIGMAP_LABEL,
            watch_timeout_s=watch_s,
            optional=True,
        )
        self.reflectors = (self.nodes, self.gpunodes, self.hypernodes, self.fabric)
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
        for r in self.reflectors:
            try:
                items, _ = self.kube.list(r.path, label_selector=r.label_selector)
            except KubeError as exc:
                if exc.status != 404 or not r.optional:
                    raise KubeError(exc.status, f"cannot list {r.path}: {exc}") from None
                items = []
            r.store = {str(o["metadata"]["name"]): o for o in items}
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
                log.info("topology_note", extra={"note": note})
        d = diff(desired_objects(tree), self.hypernodes.snapshot())
        self.stats.reconciles += 1
        self.stats.last_diff = d
        for name in d.conflicts:
            self._problem(f"HyperNode {name!r} exists and is not ours; left alone (rename or delete it)")
        if not self.settings.dry_run:
            self._write(d)
            self._report_exclusions(tree)
        if self.settings.export is not None:
            self.settings.export(tree)
        log.info(
            "reconciled",
            extra={"hypernodes": len(tree.hypernodes), "writes": d.writes, "unchanged": d.unchanged},
        )
        return d

    def _write(self, d: Diff) -> None:
        failed = 0
        for obj in d.apply:
            name = obj["metadata"]["name"]
            try:
                applied = self.kube.apply(f"{HYPERNODES}/{quote(name)}", obj)
                self.stats.writes += 1
                with self.hypernodes.lock:  # the watch will confirm; do not rewrite meanwhile
                    self.hypernodes.store[name] = applied or obj
            except KubeError as exc:
                failed += 1
                log.warning("hypernode_apply_failed", extra={"hypernode": name, "error": str(exc)})
        for name in d.delete:
            try:
                self.kube.delete(f"{HYPERNODES}/{quote(name)}")
                self.stats.writes += 1
                with self.hypernodes.lock:
                    self.hypernodes.store.pop(name, None)
            except KubeError as exc:
                failed += 1
                log.warning("hypernode_delete_failed", extra={"hypernode": name, "error": str(exc)})
        if failed:
            self.stats.failed_writes += failed
            raise KubeError(0, f"{failed} HyperNode write(s) failed; retrying")

    def _seed_exclusions(self) -> None:
        """What an earlier run already reported (its Events), so a restart does not report it again."""
        self._seeded = True
        try:
            items, _ = self.kube.list(events(EVENT_NAMESPACE))
        except KubeError as exc:
            log.warning("event_list_failed", extra={"error": str(exc)})
            return
        latest: dict[str, tuple[str, str, str]] = {}
        for e in items:
            if (
                e.get("reportingComponent") != COMPONENT
                and (e.get("source") or {}).get("component") != COMPONENT
            ):
                continue
            node = str((e.get("involvedObject") or {}).get("name", ""))
            stamp = str(e.get("lastTimestamp") or e.get("eventTime") or "")
            if node and (node not in latest or stamp >= latest[node][0]):
                latest[node] = (stamp, str(e.get("reason")), str(e.get("message")))
        self._excluded = {
            n: msg for n, (_, reason, msg) in latest.items() if reason == "NvlinkDomainExcluded"
        }

    def _report_exclusions(self, tree: Tree) -> None:
        if not self._seeded:
            self._seed_exclusions()
        for node, reason in tree.excluded.items():
            if self._excluded.get(node) != reason:
                self._event(node, "Warning", "NvlinkDomainExcluded", reason)
        for node in sorted(set(self._excluded) - set(tree.excluded)):
            if node in tree.node_domain:
                self._event(node, "Normal", "NvlinkDomainRestored", f"back in {tree.node_domain[node]}")
        self._excluded = dict(tree.excluded)

    def _event(self, node: str, type_: str, reason: str, message: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        involved: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "name": node}
        uid = ((self.nodes.snapshot().get(node) or {}).get("metadata") or {}).get("uid")
        if uid:
            involved["uid"] = uid  # kubectl describe node matches events by uid
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{node}.", "namespace": EVENT_NAMESPACE},
            "involvedObject": involved,
            "type": type_,
            "reason": reason,
            "message": message,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.settings.identity,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.kube.create(events(EVENT_NAMESPACE), body)
        except KubeError as exc:
            log.warning("event_failed", extra={"node": node, "error": str(exc)})
        log.info(
            "node_excluded" if type_ == "Warning" else "node_restored",
            extra={"node": node, "reason": message},
        )

    def _problem(self, message: str) -> None:
        if message not in self._reported_problems:
            self._reported_problems.add(message)
            log.warning("input_problem", extra={"problem": message})

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
        return all(r.synced.is_set() for r in self.reflectors)

    async def run(self, stop: asyncio.Event) -> None:
        thread_stop = threading.Event()
        loop = asyncio.get_running_loop()
        threads = [
            threading.Thread(target=r.run, args=(thread_stop,), name=f"reflector{r.path}", daemon=True)
            for r in self.reflectors
        ]
        for t in threads:
            t.start()
        backoff = 0.5
        try:
            while not stop.is_set():
                if self.elector is not None:
                    was = self.elector.leading
                    try:
                        await asyncio.to_thread(self.elector.try_acquire_or_renew)
                    except KubeError as exc:
                        self.elector.leading = False
                        log.warning("lease_failed", extra={"error": str(exc)})
                    if self.elector.leading and not was:
                        log.info("leading", extra={"identity": self.settings.identity})
                        self._changed()
                    elif was and not self.elector.leading:
                        log.warning("lost_lease", extra={"identity": self.settings.identity})
                due = self._due()
                if due == 0.0 and self.is_leader() and self.synced():
                    with self._lock:
                        self._dirty_since = None
                    try:
                        await asyncio.to_thread(self.reconcile)
                        backoff = 0.5
                    except KubeError as exc:
                        log.warning("reconcile_failed", extra={"error": str(exc), "retry_s": backoff})
                        await _wait(stop, backoff)
                        backoff = min(backoff * 2, 60.0)
                        self._changed()
                    continue
                wait = self.settings.retry_period_s if self.elector is not None else 3600.0
                if due is not None:
                    wait = min(wait, max(due, 0.05))
                self._wake.clear()
                await _wait_any(stop, self._wake, wait, loop)
        finally:
            thread_stop.set()
            if self.elector is not None:
                await asyncio.to_thread(self.elector.release)
            for t in threads:
                await asyncio.to_thread(t.join, 2.0)  # a thread still in a long watch ends by itself


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return


async def _wait_any(
    stop: asyncio.Event, wake: threading.Event, seconds: float, loop: asyncio.AbstractEventLoop
) -> None:
    """Until ``stop``, a change (``wake``, set from reflector threads) or ``seconds`` pass."""
    deadline = loop.time() + seconds
    while not stop.is_set() and not wake.is_set():
        left = deadline - loop.time()
        if left <= 0:
            return
        await _wait(stop, min(left, 0.05))
