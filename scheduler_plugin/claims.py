"""GPUs that pods get through Dynamic Resource Allocation, as the extender counts them.

A pod gets GPUs of the agent's DRA driver (``gpu.gpuagent.dev``) three ways, and each is counted as
whole GPUs, like an ``nvidia.com/gpu`` request:

- its ``spec.resourceClaims`` name a ResourceClaim (``resourceClaimName``) or a ResourceClaimTemplate
  (``resourceClaimTemplateName``; the claim made from it is named in ``status.resourceClaimStatuses``)
  of the pod's own namespace. Each request of the claim for a GPU class counts ``exactly.count``
  (default 1); ``allocationMode: All`` counts every GPU of a node (the largest pool known: such a pod
  fits only a whole free node of that size); a prioritized list (``firstAvailable``) counts its first
  choice. A claim or template not seen yet counts nothing until it is. A count above what one claim can
  ever be allocated (``MAX_RESULTS`` devices, the API's bound) counts as ``MAX_RESULTS + 1``;
- a request of an extended resource that a GPU class maps (``extendedResourceName``, or the implicit
  ``deviceclass.resource.kubernetes.io/<class>``): ``nvidia.com/gpu`` already counts as itself; any
  other mapped name counts as that many GPUs;
- nothing else: IMEX channel claims (class ``imex-channel.gpuagent.dev``) are no GPUs.

The unit is the whole GPU, as for ``nvidia.com/gpu``: a claim of the GPU class counts whole GPUs even
where kube-scheduler could satisfy it with MIG devices (a node with only MIG devices has no whole GPU).

What a pod asks is written into its projection (``with_claims``) as requests of two containers with
names no real container can have (``<resource-claims>``, ``<extended-resources>``), so every reader of
a pod's requests (filter, gangs, planner, queue) counts them with no change. While the pod holds a node,
the part through claims is not counted as its use (``claimed``): what is used is read from the claims'
allocations instead (``status.allocation.devices.results``: driver, pool (the node), device), each GPU
once per node however many claims share it (a MIG device's parent GPU counts as used where the pool
publishes it whole; the agent's pools do not, so a MIG device uses no whole GPU). The extended
resource claims kube-scheduler makes for pods (annotation ``resource.kubernetes.io/extended-resource-claim``)
are not read: their pods' own requests count. What a node has through DRA is the GPUs (``type: gpu``)
of its pool's newest ResourceSlices without a ``NoSchedule``/``NoExecute`` taint.

Between kube-scheduler writing a claim's allocation (PreBind) and the pod's binding arriving, the
allocation already counts as used on the node: a gang pod planned there no longer counts in its gang's
hold for what its claims are allocated on its planned node (``ClaimBook.allocated_on``; the extender's
``Holds.claims_allocated`` takes it off the hold), so its GPUs count once.

Pure: no client, no clock. ``ClaimBook`` keeps the projected objects' facts and says what changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler_plugin.cluster import GPU
from scheduler_plugin.snapshot import NodeState

DRIVER = "gpu.gpuagent.dev"
GPU_CLASSES = frozenset({"gpu.gpuagent.dev"})
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"  # a class's implicit extended resource name
EXTENDED_CLAIM = "resource.kubernetes.io/extended-resource-claim"  # kube-scheduler's claims for pods
MAX_RESULTS = 32  # resource.k8s.io/v1: at most 32 allocation results per claim
CLAIMS_CONTAINER = "<resource-claims>"  # not a valid container name: never a real container's
EXTENDED_CONTAINER = "<extended-resources>"
SYNTHETIC = (CLAIMS_CONTAINER, EXTENDED_CONTAINER)
_BLOCKING = ("NoSchedule", "NoExecute")

# the extender's kinds this module reads: kind -> namespaced
KINDS: Mapping[str, bool] = {
    "resourceclaims": True,
    "resourceclaimtemplates": True,
    "deviceclasses": False,
    "resourceslices": False,
}


def book_of(
    objects: Mapping[str, Iterable[Mapping[str, Any]]],
    *,
    driver: str = DRIVER,
    classes: frozenset[str] = GPU_CLASSES,
) -> ClaimBook:
    """A book of DRA objects listed once (a kind of :data:`KINDS` -> its objects), as the extender's
    is after their events (``plan --from-cluster`` reads the cluster with it)."""
    book = ClaimBook(driver=driver, classes=classes)
    for kind in ("deviceclasses", "resourceslices", "resourceclaimtemplates", "resourceclaims"):
        for obj in objects.get(kind, ()):
            meta = _map(obj.get("metadata"))
            name = _str(meta.get("name"))
            key = f"{_str(meta.get('namespace')) or 'default'}/{name}" if KINDS[kind] else name
            book.update(kind, key, obj)
    return book


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclass(frozen=True, slots=True)
class Ask:
    """GPUs one claim spec asks: ``count`` exact GPUs, plus every GPU of a node if ``whole``."""

    count: int = 0
    whole: bool = False


def _one_request(exact: Mapping[str, Any], classes: frozenset[str]) -> Ask:
    if _str(exact.get("deviceClassName")) not in classes:
        return Ask()
    if exact.get("allocationMode") == "All":
        return Ask(whole=True)
    count = exact.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        return Ask()  # the API refuses it; nothing is counted for it
    return Ask(count=min(count, MAX_RESULTS + 1))


def claim_ask(spec: Any, classes: frozenset[str] = GPU_CLASSES) -> Ask:
    """The GPUs a ResourceClaimSpec (``spec.devices.requests``) asks for of ``classes``."""
    count, whole = 0, False
    for raw in _list(_map(_map(spec).get("devices")).get("requests")):
        request = _map(raw)
        if "exactly" in request:
            one = _one_request(_map(request.get("exactly")), classes)
        else:  # a prioritized list: its first choice
            first = _list(request.get("firstAvailable"))
            one = _one_request(_map(first[0]), classes) if first else Ask()
        count += one.count
        whole = whole or one.whole
    return Ask(count=min(count, MAX_RESULTS + 1), whole=whole)


def allocated(claim: Mapping[str, Any], driver: str = DRIVER) -> tuple[tuple[str, str], ...]:
    """(pool, device) of every allocation result of ``driver`` in a claim's status; results of another
    shape than the API's are skipped."""
    devices = _map(_map(_map(claim.get("status")).get("allocation")).get("devices"))
    out = []
    for raw in _list(devices.get("results"))[:MAX_RESULTS]:
        r = _map(raw)
        pool, device = _str(r.get("pool")), _str(r.get("device"))
        if r.get("driver") == driver and pool and device:
            out.append((pool, device))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Pool:
    """One node's pool of the driver as its newest slices say: the node, its GPUs that can be allocated,
    and what each device counts as (a GPU: itself; a MIG device: its parent GPU; anything else: None)."""

    node: str
    gpus: int
    counts_as: Mapping[str, str | None]


def _attr(device: Mapping[str, Any], name: str) -> str:
    return _str(_map(_map(device.get("attributes")).get(name)).get("string"))


def pool_of(slices: Iterable[Mapping[str, Any]]) -> Pool | None:
    """The pool the given slices (one pool's, any generation) describe, from its newest generation."""
    newest: int | None = None
    chosen: list[Mapping[str, Any]] = []
    for s in slices:
        gen = _map(_map(s.get("spec")).get("pool")).get("generation", 0)
        gen = gen if isinstance(gen, int) and not isinstance(gen, bool) else 0
        if newest is None or gen > newest:
            newest, chosen = gen, [s]
        elif gen == newest:
            chosen.append(s)
    if newest is None:
        return None
    node = ""
    devices: list[Mapping[str, Any]] = []
    for s in chosen:
        spec = _map(s.get("spec"))
        node = node or _str(spec.get("nodeName"))
        devices += [_map(d) for d in _list(spec.get("devices"))]
    by_uuid = {_attr(d, "uuid"): _str(d.get("name")) for d in devices if _attr(d, "type") == "gpu"}
    counts_as: dict[str, str | None] = {}
    gpus = 0
    for d in devices:
        name, kind = _str(d.get("name")), _attr(d, "type")
        if not name:
            continue
        if kind == "gpu":
            counts_as[name] = name
            blocked = any(_map(t).get("effect") in _BLOCKING for t in _list(d.get("taints")))
            gpus += 0 if blocked else 1
        elif kind == "mig":  # its parent GPU, where that is published whole; else no whole GPU
            counts_as[name] = by_uuid.get(_attr(d, "parentUUID"))
        else:
            counts_as[name] = None
    return Pool(node=node, gpus=gpus, counts_as=counts_as)


@dataclass
class Change:
    """What one event changed: per node (GPUs it has through DRA, GPUs used there through claims),
    each as a difference; and the pods whose asks must be worked out again."""

    nodes: dict[str, tuple[int, int]] = field(default_factory=dict)
    pods: set[str] = field(default_factory=set)


class ClaimBook:
    """The DRA facts the extender keeps (module docstring): claims' asks and allocations, templates'
    asks, GPU classes' extended resource names, pools; which pods read which of them."""

    def __init__(self, *, driver: str = DRIVER, classes: frozenset[str] = GPU_CLASSES) -> None:
        self.driver = driver
        self.classes = classes
        self._asks: dict[str, Ask] = {}  # "claim:<ns>/<name>" / "template:<ns>/<name>" -> ask
        self._results: dict[str, tuple[tuple[str, str], ...]] = {}  # claim key -> (pool, device) allocated
        self._claim_gpus: dict[str, dict[str, frozenset[str]]] = {}  # claim key -> node -> GPUs
        self._gpu_claims: dict[str, dict[str, int]] = {}  # node -> GPU device -> claims holding it
        self._slices: dict[str, str] = {}  # slice name -> "<driver>/<pool>"
        self._pool_slices: dict[str, dict[str, Mapping[str, Any]]] = {}  # pool -> slice name -> object
        self._pools: dict[str, Pool] = {}  # "<driver>/<pool>" -> pool
        self._node_gpus: dict[str, int] = {}  # node -> GPUs of its pools
        self._by_pool: dict[str, set[str]] = {}  # pool name -> claims allocated from it
        self._names: dict[str, str] = {}  # DeviceClass -> the extended resource name it maps
        self._readers: dict[str, set[str]] = {}  # what a pod reads ("claim:..", "all", "classes") -> pods
        self._reads: dict[str, frozenset[str]] = {}  # pod key -> what it reads
        self._extended_names: frozenset[str] | None = None

    # -- what nodes have and use ---------------------------------------------------------------
    def capacity(self, node: str) -> int:
        """GPUs ``node`` has through DRA (its pool's untainted GPUs)."""
        return self._node_gpus.get(node, 0)

    def used(self, node: str) -> int:
        """GPUs of ``node`` allocated to claims (each once)."""
        return len(self._gpu_claims.get(node, {}))

    def allocated_on(self, pod: str, node: str) -> int:
        """GPUs of ``node`` allocated to the claims pod ``pod`` (a key ``with_claims`` saw) reads, each
        once."""
        gpus: set[str] = set()
        for ref in self._reads.get(pod, ()):
            if ref.startswith("claim:"):
                gpus |= self._claim_gpus.get(ref.removeprefix("claim:"), {}).get(node, frozenset())
        return len(gpus)

    def readers(self, claim: str) -> frozenset[str]:
        """The pods that read the claim ``<namespace>/<name>``."""
        return frozenset(self._readers.get("claim:" + claim, ()))

    def largest(self) -> int:
        """The most GPUs one node has through DRA (what ``allocationMode: All`` asks)."""
        return max(self._node_gpus.values(), default=0)

    def extended_names(self) -> frozenset[str]:
        """Extended resource names that GPU classes serve, ``nvidia.com/gpu`` aside (it counts as itself)."""
        if self._extended_names is None:
            names = {IMPLICIT_PREFIX + c for c in self.classes}
            names.update(n for c, n in self._names.items() if c in self.classes)
            names.discard(GPU)
            self._extended_names = frozenset(names)
        return self._extended_names

    # -- events --------------------------------------------------------------------------------
    def update(self, kind: str, key: str, obj: Mapping[str, Any] | None) -> Change:
        """One object of ``kind`` (``KINDS``) is now ``obj`` (None: deleted)."""
        change = Change()
        if kind == "resourceclaims":
            self._set_ask("claim:" + key, obj, change)
            self._claim_allocated(key, obj, change)
        elif kind == "resourceclaimtemplates":
            spec = _map(obj.get("spec")).get("spec") if obj is not None else None
            self._set_ask("template:" + key, None if obj is None else {"spec": spec}, change)
        elif kind == "deviceclasses":
            before = self.extended_names()
            name = _str(_map(obj.get("spec")).get("extendedResourceName")) if obj is not None else ""
            if name:
                self._names[key] = name
            else:
                self._names.pop(key, None)
            self._extended_names = None
            if self.extended_names() != before:
                change.pods |= self._readers.get("classes", set())
        elif kind == "resourceslices":
            self._slice(key, obj, change)
        return change

    def _set_ask(self, ref: str, obj: Mapping[str, Any] | None, change: Change) -> None:
        ask = None
        if obj is not None and not _extended_claim(obj):
            ask = claim_ask(obj.get("spec"), self.classes)
        if ask != self._asks.get(ref):
            if ask is None:
                self._asks.pop(ref, None)
            else:
                self._asks[ref] = ask
            change.pods |= self._readers.get(ref, set())

    def _claim_allocated(self, key: str, obj: Mapping[str, Any] | None, change: Change) -> None:
        results: tuple[tuple[str, str], ...] = ()
        if obj is not None and not _extended_claim(obj):
            results = allocated(obj, self.driver)
        for pool in {p for p, _ in self._results.pop(key, ())}:
            self._by_pool[pool].discard(key)
            if not self._by_pool[pool]:
                del self._by_pool[pool]
        if results:
            self._results[key] = results
            for pool in {p for p, _ in results}:
                self._by_pool.setdefault(pool, set()).add(key)
        self._count_claim(key, results, change)

    def _count_claim(self, key: str, results: tuple[tuple[str, str], ...], change: Change) -> None:
        held: dict[str, set[str]] = {}
        for pool_name, device in results:
            pool = self._pools.get(f"{self.driver}/{pool_name}")
            if pool is None:  # slices not seen (yet): every device but the IMEX channel is a GPU
                gpu: str | None = None if device == "imex-channel" else device
                node = pool_name
            else:
                gpu = pool.counts_as.get(device, device)
                node = pool.node or pool_name
            if gpu is not None:
                held.setdefault(node, set()).add(gpu)
        new = {n: frozenset(g) for n, g in held.items()}
        old = self._claim_gpus.pop(key, {})
        if new:
            self._claim_gpus[key] = new
        for node in set(old) | set(new):
            before = self.used(node)
            counts = self._gpu_claims.setdefault(node, {})
            for g in old.get(node, ()):
                counts[g] -= 1
                if not counts[g]:
                    del counts[g]
            for g in new.get(node, ()):
                counts[g] = counts.get(g, 0) + 1
            if not counts:
                del self._gpu_claims[node]
            self._note(change, node, 0, self.used(node) - before)

    def _slice(self, name: str, obj: Mapping[str, Any] | None, change: Change) -> None:
        old = self._slices.pop(name, None)
        keys = set()
        if old is not None:
            keys.add(old)
            members = self._pool_slices[old]
            del members[name]
            if not members:
                del self._pool_slices[old]
        if obj is not None:
            spec = _map(obj.get("spec"))
            if spec.get("driver") == self.driver:
                pool_key = f"{self.driver}/{_str(_map(spec.get('pool')).get('name'))}"
                self._slices[name] = pool_key
                self._pool_slices.setdefault(pool_key, {})[name] = obj
                keys.add(pool_key)
        wholes = self._readers.get("all")
        largest = self.largest() if wholes else 0
        for key in keys:
            before = self._pools.pop(key, None)
            after = pool_of(self._pool_slices.get(key, {}).values())
            if after is not None:
                self._pools[key] = after
            if before is not None:
                self._has(before.node, -before.gpus)
                self._note(change, before.node, -before.gpus, 0)
            if after is not None:
                self._has(after.node, after.gpus)
                self._note(change, after.node, after.gpus, 0)
            if (before.counts_as if before else {}) != (after.counts_as if after else {}):
                self._recount(key.removeprefix(self.driver + "/"), change)
        if wholes and self.largest() != largest:
            change.pods |= wholes

    def _has(self, node: str, gpus: int) -> None:
        left = self._node_gpus.get(node, 0) + gpus
        if left:
            self._node_gpus[node] = left
        else:
            self._node_gpus.pop(node, None)

    def _recount(self, pool: str, change: Change) -> None:
        """Allocations that name ``pool`` are counted again (what a device counts as may have changed)."""
        for key in sorted(self._by_pool.get(pool, ())):
            self._count_claim(key, self._results[key], change)

    @staticmethod
    def _note(change: Change, node: str, has: int, used: int) -> None:
        if not node or (not has and not used):
            return
        h, u = change.nodes.get(node, (0, 0))
        change.nodes[node] = (h + has, u + used)

    # -- pods ----------------------------------------------------------------------------------
    def forget_pod(self, key: str) -> None:
        for ref in self._reads.pop(key, frozenset()):
            readers = self._readers.get(ref)
            if readers is not None:
                readers.discard(key)
                if not readers:
                    del self._readers[ref]

    def with_claims(self, key: str, pod: Mapping[str, Any]) -> dict[str, Any]:
        """``pod`` (a projection) with what it asks through DRA written as the two synthetic containers'
        requests (module docstring); remembers what the pod reads, for ``Change.pods``."""
        spec = _map(pod.get("spec"))
        if not spec.get("resourceClaims") and _plain(spec):  # most pods: nothing to work out
            if key in self._reads:
                self.forget_pod(key)
            return pod if isinstance(pod, dict) else dict(pod)
        meta = _map(pod.get("metadata"))
        namespace = _str(meta.get("namespace")) or "default"
        generated = {
            _str(_map(s).get("name")): _str(_map(s).get("resourceClaimName"))
            for s in _list(_map(pod.get("status")).get("resourceClaimStatuses"))
        }
        reads: set[str] = set()
        count = 0
        whole = False
        for raw in _list(spec.get("resourceClaims")):
            ref = _map(raw)
            claim = _str(ref.get("resourceClaimName"))
            template = _str(ref.get("resourceClaimTemplateName"))
            made = generated.get(_str(ref.get("name")), "")
            found: Ask | None = None
            if claim:
                reads.add(f"claim:{namespace}/{claim}")
                found = self._asks.get(f"claim:{namespace}/{claim}")
            elif template:
                reads.add(f"template:{namespace}/{template}")
                if made:
                    reads.add(f"claim:{namespace}/{made}")
                    found = self._asks.get(f"claim:{namespace}/{made}")
                if found is None:
                    found = self._asks.get(f"template:{namespace}/{template}")
            if found is not None:
                count += found.count
                whole = whole or found.whole
        if whole:
            reads.add("all")
            count += self.largest()
        if "containers" in spec and not isinstance(spec.get("containers"), list):
            self.forget_pod(key)
            return dict(pod)  # another shape than the API's: the gang sources name it
        containers = [c for c in _list(spec.get("containers")) if _map(c).get("name") not in SYNTHETIC]
        extended = self._extended(spec, containers, reads)
        if count:
            containers.append(_synthetic(CLAIMS_CONTAINER, min(count, MAX_RESULTS + 1)))
        if extended:
            containers.append(_synthetic(EXTENDED_CONTAINER, extended))
        self.forget_pod(key)
        if reads:
            self._reads[key] = frozenset(reads)
            for r in reads:
                self._readers.setdefault(r, set()).add(key)
        if not count and not extended and "containers" not in spec:
            return dict(pod)
        return {**pod, "spec": {**spec, "containers": containers}}

    def _extended(self, spec: Mapping[str, Any], containers: list[Any], reads: set[str]) -> int:
        """GPUs asked as extended resources other than ``nvidia.com/gpu`` that GPU classes map:
        containers' sum, or the largest init container's if more."""
        names = self.extended_names()
        total = 0
        for part, add in ((containers, True), (_list(spec.get("initContainers")), False)):
            for c in part:
                requests = _map(_map(_map(c).get("resources")).get("requests"))
                limits = _map(_map(_map(c).get("resources")).get("limits"))
                asked = {*requests, *limits}
                if any("/" in str(n) and n != GPU for n in asked):
                    reads.add("classes")
                n = 0
                for name in asked & names:
                    raw = requests.get(name, limits.get(name))
                    if isinstance(raw, int | str) and not isinstance(raw, bool) and str(raw).isdigit():
                        n += min(int(raw), MAX_RESULTS + 1)
                total = total + n if add else max(total, n)
        return min(total, MAX_RESULTS + 1)


_PLAIN = frozenset({GPU, "cpu", "memory", "ephemeral-storage"})


def _plain(spec: Mapping[str, Any]) -> bool:
    """Whether no container of ``spec`` is a synthetic one or asks a resource a DeviceClass could map
    (an extended resource other than ``nvidia.com/gpu``)."""
    for part in ("containers", "initContainers"):
        for raw in _list(spec.get(part)):
            c = _map(raw)
            if c.get("name") in SYNTHETIC:
                return False
            resources = _map(c.get("resources"))
            for field_ in ("requests", "limits"):
                for name in _map(resources.get(field_)):
                    if name not in _PLAIN and "/" in str(name):
                        return False
    return True


def _extended_claim(claim: Mapping[str, Any]) -> bool:
    """Whether kube-scheduler made ``claim`` for a pod's extended resources (the pod's requests count)."""
    return _map(_map(claim.get("metadata")).get("annotations")).get(EXTENDED_CLAIM) == "true"


def _synthetic(name: str, gpus: int) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": {GPU: str(gpus)}}}


def claimed(pod: Mapping[str, Any]) -> int:
    """The GPUs a (projected) pod asks through claims: not counted as its use while it holds a node
    (the claims' allocations are)."""
    for c in _list(_map(pod.get("spec")).get("containers")):
        if _map(c).get("name") == CLAIMS_CONTAINER:
            raw = _map(_map(_map(c).get("resources")).get("requests")).get(GPU)
            return int(raw) if isinstance(raw, str) and raw.isdigit() else 0
    return 0


def with_gpus(base: NodeState, dra: int) -> NodeState:
    """A node's planner state (nothing used) with the ``dra`` GPUs its pool has besides allocatable."""
    if dra <= 0:
        return base
    return replace(base, gpus=base.gpus + dra, free=base.free + dra)
