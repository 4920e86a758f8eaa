"""Which devices back which resource: a pure function of the inventory and the plugin config.

- MIG strategy ``none``: every GPU is one ``nvidia.com/gpu`` device (MIG-enabled GPUs too, whole).
- ``single``: when MIG is on, every GPU must have MIG enabled with devices of one profile; the MIG
  devices become ``nvidia.com/gpu``. With MIG off everywhere it is the same as ``none``.
- ``mixed``: GPUs without MIG are ``nvidia.com/gpu``; MIG devices go to one resource per profile,
  ``nvidia.com/mig-<profile>`` with ``+`` written as ``.`` (``nvidia.com/mig-1g.10gb``).
- Sharing (time-slicing or MPS) replaces a resource's devices by ``replicas`` copies each, IDs
  ``<uuid>::<n>``; with a rename the shared devices move to the new name and the GPUs not selected by
  ``devices`` stay whole under the old one.

Every device carries its NUMA node (the parent GPU's, for MIG devices and replicas) and the health keys
(GPU and MIG UUIDs) whose state decides its own.

Limits: one resource lists at most :data:`MAX_DEVICES_PER_RESOURCE` devices (what kubelet's messages
comfortably carry); a shared resource never takes the name of another resource the node advertises;
``devices`` entries that name no device of their resource are listed in :attr:`ResourcePlan.unmatched`
(the agent refuses to start with them, and warns when a later inventory makes an entry stale).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from deviceplugin.config import (
    DeviceIdStrategy,
    MigStrategy,
    PluginConfig,
    SharedResource,
    SharingStrategy,
)
from deviceplugin.preferred import Candidate, DeviceKind
from topology.model import Gpu, MigDevice, NodeInventory

GPU_RESOURCE = "nvidia.com/gpu"
MAX_DEVICES_PER_RESOURCE = 16_384


class ResourceError(ValueError):
    """The inventory cannot be advertised under the configured strategy (one line, says why)."""


@dataclass(frozen=True, slots=True)
class Device:
    """One device kubelet allocates."""

    id: str  # GPU UUID, MIG UUID or "<uuid>::<n>"
    kind: DeviceKind
    gpu_uuid: str
    gpu_index: int
    visible_id: str  # what NVIDIA_VISIBLE_DEVICES gets: the UUID, or index_id with the index strategy
    index_id: str  # "i" for a GPU, "i:j" for MIG device j of GPU i
    base_uuid: str  # the GPU or MIG UUID this device is (or is a replica of)
    numa_node: int | None
    memory_bytes: int
    minor_number: int | None
    health_keys: tuple[str, ...]  # UUIDs whose health decides this device's
    replica: int | None = None
    mig_profile: str | None = None
    slices: int = 1


@dataclass(frozen=True, slots=True)
class Resource:
    name: str
    devices: tuple[Device, ...]
    sharing: SharingStrategy = SharingStrategy.NONE
    replicas: int = 1
    fail_requests_greater_than_one: bool = False
    _by_id: Mapping[str, Device] = field(init=False, repr=False, compare=False)  # devices by ID

    @property
    def socket_name(self) -> str:
        """``nvidia-<name after nvidia.com/>.sock`` in the device-plugin directory."""
        return f"nvidia-{self.name.split('/', 1)[1]}.sock"

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {d.id: d for d in self.devices})

    def device(self, device_id: str) -> Device | None:
        return self._by_id.get(device_id)

    def candidates(self, healthy: Mapping[str, bool]) -> dict[str, Candidate]:
        return {
            d.id: Candidate(
                id=d.id, gpu=d.gpu_uuid, kind=d.kind, healthy=healthy.get(d.id, True), slices=d.slices
            )
            for d in self.devices
        }


@dataclass(frozen=True, slots=True)
class ResourcePlan:
    resources: tuple[Resource, ...]
    warnings: tuple[str, ...] = ()
    unmatched: tuple[str, ...] = ()  # sharing ``devices`` entries that name no device, one line each

    def by_name(self) -> dict[str, Resource]:
        return {r.name: r for r in self.resources}


def mig_resource_name(profile: str) -> str:
    return f"nvidia.com/mig-{profile.replace('+', '.')}"


def build_plan(inventory: NodeInventory, config: PluginConfig) -> ResourcePlan:
    """The resources this node advertises; raises :class:`ResourceError` when the strategy cannot apply."""
    warnings: list[str] = [
        f"GPU {g.index} is not advertised: it has no UUID ({g.error or 'lost during discovery'})"
        for g in inventory.gpus
        if not g.uuid
    ]
    gpus = sorted((g for g in inventory.gpus if g.uuid), key=lambda g: g.index)
    mig_on = {s.gpu_index: s for s in inventory.mig if s.current_enabled}
    groups: dict[str, list[Device]] = {}
    strategy = config.mig_strategy
    if strategy is MigStrategy.SINGLE and mig_on:
        without = [g.index for g in gpus if g.index not in mig_on or not mig_on[g.index].devices]
        if without:
            raise ResourceError(
                "migStrategy single: every GPU must have MIG enabled with at least one MIG device, "
                f"but GPU(s) {', '.join(map(str, without))} do not; use migStrategy mixed"
            )
        profiles = sorted({d.profile for s in mig_on.values() for d in s.devices})
        if len(profiles) > 1:
            raise ResourceError(
                f"migStrategy single: all MIG devices must have one profile, found {', '.join(profiles)}; "
                "use migStrategy mixed"
            )
    for gpu in gpus:
        state = mig_on.get(gpu.index)
        if strategy is MigStrategy.NONE or state is None:
            groups.setdefault(GPU_RESOURCE, []).append(_gpu_device(gpu, inventory, config))
            continue
        for mig in sorted(state.devices, key=lambda d: d.index):
            name = GPU_RESOURCE if strategy is MigStrategy.SINGLE else mig_resource_name(mig.profile)
            groups.setdefault(name, []).append(_mig_device(mig, gpu, config))
    resources: dict[str, Resource] = {
        name: Resource(name=name, devices=tuple(ds)) for name, ds in groups.items()
    }
    sharing = config.sharing
    unmatched: list[str] = []
    if sharing.strategy is not SharingStrategy.NONE:
        key = "timeSlicing" if sharing.strategy is SharingStrategy.TIME_SLICING else "mps"
        for i, shared in enumerate(sharing.resources):
            base = resources.get(shared.name)
            if base is None:
                warnings.append(f"sharing: {shared.name} is not advertised on this node; nothing to share")
                continue
            target = shared.rename or shared.name
            if target != shared.name and target in resources:
                raise ResourceError(
                    f"sharing.{key}.resources[{i}].rename: {target} clashes with {target}, which this "
                    "node advertises; choose another name"
                )
            picked, rest = _select(base.devices, shared)
            stale = _unmatched(base.devices, shared)
            if stale:
                unmatched.append(
                    f"sharing.{key}.resources[{i}].devices: {', '.join(stale)} name no device of "
                    f"{shared.name} on this node"
                )
            total = len(picked) * shared.replicas
            if total > MAX_DEVICES_PER_RESOURCE:
                raise ResourceError(
                    f"{target}: {total} devices ({len(picked)} x {shared.replicas} replicas) is more than "
                    f"{MAX_DEVICES_PER_RESOURCE} for one resource; lower sharing replicas"
                )
            replicated = Resource(
                name=shared.rename or shared.name,
                devices=tuple(_replicas(picked, shared.replicas)),
                sharing=sharing.strategy,
                replicas=shared.replicas,
                fail_requests_greater_than_one=sharing.fail_requests_greater_than_one,
            )
            if shared.rename and rest:
                resources[shared.name] = Resource(name=shared.name, devices=tuple(rest))
            elif shared.rename:
                del resources[shared.name]
            else:
                replicated = Resource(
                    name=replicated.name,
                    devices=replicated.devices + tuple(rest),
                    sharing=replicated.sharing,
                    replicas=replicated.replicas,
                    fail_requests_greater_than_one=replicated.fail_requests_greater_than_one,
                )
            resources[replicated.name] = replicated
    for res in resources.values():
        too_long = [d.id for d in res.devices if len(d.id) > 63]
        if too_long:
            raise ResourceError(
                f"{res.name}: device ID {too_long[0]!r} is longer than kubelet's 63 characters"
            )
    return ResourcePlan(
        resources=tuple(resources[k] for k in sorted(resources)),
        warnings=tuple(warnings + unmatched),
        unmatched=tuple(unmatched),
    )


def _gpu_device(gpu: Gpu, inventory: NodeInventory, config: PluginConfig) -> Device:
    migs = [d.uuid for s in inventory.mig if s.gpu_index == gpu.index for d in s.devices]
    return Device(
        id=gpu.uuid,
        kind=DeviceKind.GPU,
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        visible_id=gpu.uuid if config.device_id_strategy is DeviceIdStrategy.UUID else str(gpu.index),
        index_id=str(gpu.index),
        base_uuid=gpu.uuid,
        numa_node=gpu.numa_node,
        memory_bytes=gpu.memory_total_bytes,
        minor_number=gpu.minor_number,
        health_keys=(gpu.uuid, *migs),
        slices=7,
    )


def _mig_device(mig: MigDevice, gpu: Gpu, config: PluginConfig) -> Device:
    by_index = f"{gpu.index}:{mig.index}"
    return Device(
        id=mig.uuid,
        kind=DeviceKind.MIG,
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        visible_id=mig.uuid if config.device_id_strategy is DeviceIdStrategy.UUID else by_index,
        index_id=by_index,
        base_uuid=mig.uuid,
        numa_node=gpu.numa_node,
        memory_bytes=mig.memory_bytes,
        minor_number=gpu.minor_number,
        health_keys=(gpu.uuid, mig.uuid),
        mig_profile=mig.profile,
        slices=mig.gpu_slices,
    )


def _select(devices: Iterable[Device], shared: SharedResource) -> tuple[list[Device], list[Device]]:
    items = list(devices)
    if shared.devices == "all":
        return items, []
    if isinstance(shared.devices, int):
        return items[: shared.devices], items[shared.devices :]
    wanted = set(shared.devices)

    def named(d: Device) -> bool:
        return d.base_uuid in wanted or d.index_id in wanted

    return [d for d in items if named(d)], [d for d in items if not named(d)]


def _unmatched(devices: Iterable[Device], shared: SharedResource) -> list[str]:
    """The ``devices`` entries of ``shared`` that name none of ``devices``, as the config wrote them."""
    if not isinstance(shared.devices, tuple):
        return []
    names = {n for d in devices for n in (d.base_uuid, d.index_id)}
    return [repr(e) if not e.isdigit() else e for e in shared.devices if e not in names]


def _replicas(devices: Iterable[Device], replicas: int) -> list[Device]:
    out: list[Device] = []
    for d in devices:
        for n in range(replicas):
            out.append(
                Device(
                    id=f"{d.base_uuid}::{n}",
                    kind=DeviceKind.REPLICA,
                    gpu_uuid=d.gpu_uuid,
                    gpu_index=d.gpu_index,
                    visible_id=d.visible_id,
                    index_id=d.index_id,
                    base_uuid=d.base_uuid,
                    numa_node=d.numa_node,
                    memory_bytes=d.memory_bytes,
                    minor_number=d.minor_number,
                    health_keys=d.health_keys,
                    replica=n,
                    mig_profile=d.mig_profile,
                    slices=d.slices,
                )
            )
    return out
