"""Which pod holds which device, and how a shared device splits between pods (pure).

Device IDs from the kubelet are resolved against the inventory: a ``GPU-…`` or ``MIG-…`` UUID, optionally
with a replica suffix ``::<n>`` (time-slicing / MPS; ``n`` at most nine ASCII digits, anything else is an
unknown ID). The resolver remembers every answer, misses
included, so an ID that is not ours (another vendor, a GKE-style ID) costs one dictionary lookup per
refresh and never an NVML call.

Shared devices (replica IDs held by pods) are split per process when host PIDs are visible: every
NVML process on the device is mapped to a pod through ``/proc/<pid>/cgroup`` (see
:func:`parse_cgroup`) and ``/var/log/pods``; a pod's share is the sum over its processes, and a pod that
holds a replica but runs nothing gets 0. A process counts only for a pod that holds a replica of that
very device (so a PID from another PID namespace never lands on the wrong pod).

**Rule when the split is unknown** (no process on the device could be mapped, typically the agent runs
without ``hostPID``): every pod holding a replica is still listed (``gpuagent_device_allocation_info``
and the shares' owners) but ``Sharing.split`` is ``False`` and per-pod values are ``None``. The native
rendering then publishes no per-pod values for that device; the dcgm rendering repeats the device's
values on each pod's series, as dcgm-exporter does in its virtual-GPU mode.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.metrics.snapshot import Allocation, Owner, PodShare, Sharing
from agent.nvml.protocol import ProcessInfo, ProcessUtilization
from agent.podresources.model import PodResourcesSnapshot
from topology.model import NodeInventory

MEMO_LIMIT = 65_536  # remembered device IDs per inventory; a node has at most a few thousand
_REPLICA = re.compile(r"[0-9]{1,9}")  # n of "<uuid>::<n>": ASCII digits, bounded (never a 5,000-digit int)


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """A kubelet device ID resolved against the inventory."""

    uuid: str  # the gpu's or mig device's UUID
    gpu_index: int  # the (parent) gpu's NVML index
    mig: bool
    replica: int | None  # n of "<uuid>::<n>"; None for a whole device


class DeviceResolver:
    """Resolves device IDs for one inventory; answers (hits and misses) are memoised, at most
    ``memo_limit`` of them (a kubelet that keeps naming new IDs restarts the memo, never grows it)."""

    def __init__(self, inventory: NodeInventory, *, memo_limit: int = MEMO_LIMIT) -> None:
        self._memo_limit = memo_limit
        self._known: dict[str, tuple[int, bool]] = {g.uuid: (g.index, False) for g in inventory.gpus}
        for dev in inventory.mig_devices():
            self._known[dev.uuid] = (dev.parent_index, True)
        self._memo: dict[str, DeviceRef | None] = {}

    def resolve(self, device_id: str) -> DeviceRef | None:
        try:
            return self._memo[device_id]
        except KeyError:
            pass
        ref = self._lookup(device_id)
        if len(self._memo) >= self._memo_limit:
            self._memo.clear()
        self._memo[device_id] = ref
        return ref

    def _lookup(self, device_id: str) -> DeviceRef | None:
        base, sep, suffix = device_id.partition("::")
        replica: int | None = None
        if sep:
            if not _REPLICA.fullmatch(suffix):  # not isdigit(): it takes "²", which int() refuses
                return None
            replica = int(suffix)
        known = self._known.get(base)
        if known is None:
            return None
        return DeviceRef(uuid=base, gpu_index=known[0], mig=known[1], replica=replica)

    @property
    def misses(self) -> int:
        """How many distinct unknown IDs are cached (negative answers)."""
        return sum(1 for v in self._memo.values() if v is None)


@dataclass(frozen=True, slots=True)
class Attribution:
    owners: Mapping[str, tuple[Owner, ...]]  # uuid -> exclusive holders, sorted
    replica_holders: Mapping[str, tuple[tuple[Owner, int], ...]]  # uuid -> (holder, replica), sorted
    replicas_total: Mapping[str, int] | None  # uuid -> allocatable replicas; None: kubelet did not say
    allocations: tuple[Allocation, ...]


def attribute(snapshot: PodResourcesSnapshot, resolver: DeviceResolver) -> Attribution:
    owners: dict[str, set[Owner]] = defaultdict(set)
    holders: dict[str, set[tuple[Owner, int]]] = defaultdict(set)
    allocations: list[Allocation] = []
    for row in snapshot.assignments:
        ref = resolver.resolve(row.device_id)
        if ref is None:
            continue
        owner = Owner(namespace=row.namespace, pod=row.pod, container=row.container)
        if ref.replica is None:
            owners[ref.uuid].add(owner)
        else:
            holders[ref.uuid].add((owner, ref.replica))
        allocations.append(
            Allocation(
                resource=row.resource,
                device_id=row.device_id,
                uuid=ref.uuid,
                gpu_index=ref.gpu_index,
                owner=owner,
            )
        )
    total: dict[str, int] | None = None
    if snapshot.allocatable is not None:
        total = {}
        for dev in snapshot.allocatable:
            ref = resolver.resolve(dev.device_id)
            if ref is not None and ref.replica is not None:
                total[ref.uuid] = total.get(ref.uuid, 0) + 1
    allocations.sort(key=lambda a: (a.gpu_index, a.uuid, a.device_id, a.owner))
    return Attribution(
        owners={k: tuple(sorted(v)) for k, v in owners.items()},
        replica_holders={k: tuple(sorted(v)) for k, v in holders.items()},
        replicas_total=total,
        allocations=tuple(allocations),
    )


@dataclass(frozen=True, slots=True)
class PodOfProcess:
    """Where a host PID lives, as read from its cgroup and the kubelet's pod log directories."""

    namespace: str
    pod: str
    pod_uid: str
    container_id: str | None = None


def sharing(
    *,
    uuid: str,
    attribution: Attribution,
    processes: Iterable[ProcessInfo],
    utilization: Iterable[ProcessUtilization] | None,
    pods_of_pids: Mapping[int, PodOfProcess],
) -> Sharing | None:
    """The split of one shared device; ``None`` when no replica of it is held and none is allocatable.

    ``utilization`` is ``None`` where per-process utilisation is not available (mig devices).
    """
    held = attribution.replica_holders.get(uuid, ())
    total = None if attribution.replicas_total is None else attribution.replicas_total.get(uuid)
    if not held and not total:
        return None
    by_pod: dict[tuple[str, str], list[tuple[Owner, int]]] = defaultdict(list)
    for owner, replica in held:
        by_pod[(owner.namespace, owner.pod)].append((owner, replica))
    util_by_pid = {u.pid: u.sm_percent for u in utilization} if utilization is not None else None
    procs = list(processes)
    util: dict[Owner, float] = defaultdict(float)
    mem: dict[Owner, int] = defaultdict(int)
    count: dict[Owner, int] = defaultdict(int)
    mapped = 0
    for proc in procs:
        where = pods_of_pids.get(proc.pid)
        if where is None:
            continue
        entries = by_pod.get((where.namespace, where.pod))
        if not entries:
            continue
        owner = entries[0][0]  # the pod's first holder by container name (documented tie-break)
        mapped += 1
        count[owner] += 1
        if util_by_pid is not None:
            util[owner] += util_by_pid.get(proc.pid, 0)
        if proc.used_memory_bytes is not None:
            mem[owner] += proc.used_memory_bytes
    split = mapped > 0 or not procs
    replicas: dict[Owner, list[int]] = defaultdict(list)
    for owner, replica in held:
        replicas[owner].append(replica)
    shares = tuple(
        PodShare(
            owner=owner,
            replicas=tuple(sorted(reps)),
            utilization_percent=(util[owner] if util_by_pid is not None else None) if split else None,
            memory_used_bytes=mem[owner] if split else None,
            processes=count[owner],
        )
        for owner, reps in sorted(replicas.items())
    )
    return Sharing(replicas=total, allocated=len(held), split=split, shares=shares)


# --------------------------------------------------------------------------- cgroup paths

# cgroupfs driver: .../kubepods/<qos>/pod<uid>/<container-id>
_CGROUPFS = re.compile(r"/kubepods(?:/[a-z]+)?/pod([0-9a-f-]{36})(?:/([0-9a-f]{64}))?")
# systemd driver: kubepods-<qos>-pod<uid with _>.slice/<runtime>-<container-id>.scope
_SYSTEMD = re.compile(
    r"kubepods(?:-[a-z]+)?-pod([0-9a-f_]{36})\.slice(?:/(?:[a-z-]+-)?([0-9a-f]{64})\.scope)?"
)


def parse_cgroup(text: str) -> tuple[str, str | None] | None:
    """``(pod_uid, container_id)`` from the content of ``/proc/<pid>/cgroup``, cgroup v1 or v2.

    Understands the cgroupfs layout (``/kubepods/burstable/pod<uid>/<id>``) and the systemd one
    (``kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope``, also ``crio-``
    and ``docker-``). ``None`` for a process outside any pod.
    """
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _CGROUPFS.search(path)
        if m:
            return m.group(1), m.group(2)
        m = _SYSTEMD.search(path)
        if m:
            return m.group(1).replace("_", "-"), m.group(2)
    return None


def parse_pod_log_dir(name: str) -> tuple[str, str, str] | None:
    """``(namespace, pod, uid)`` from a ``/var/log/pods`` entry ``<namespace>_<pod>_<uid>``.

    Namespace and pod names cannot contain ``_`` (DNS labels/subdomains), so the split is exact.
    """
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]
