"""What a container gets for the devices kubelet allocated to it (pure; the server turns it into protobuf).

Validation comes first and names the device and the reason: an ID that is not a device of the resource,
a device that is unhealthy, or more than one shared device where ``failRequestsGreaterThanOne`` forbids it.

- ``envvar``: ``NVIDIA_VISIBLE_DEVICES`` = the allocated GPU/MIG UUIDs (or indices), replicas of one
  device collapsed, in request order.
- MPS: ``CUDA_MPS_PIPE_DIRECTORY`` (the resource's pipe directory under ``mpsRoot``, mounted at the same
  path), ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = 100 / replicas and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` =
  ``<ordinal>=<total / replicas in MiB>M`` per visible GPU; the MPS shared memory directory is mounted at
  ``/dev/shm``.
- ``cdi-cri``: ``cdi_devices`` = ``<kind>=<GPU or MIG UUID>`` per device, matching the spec
  :mod:`deviceplugin.cdi` writes.
- ``volume-mounts``: ``/dev/null`` mounted at ``/var/run/nvidia-container-devices/<id>`` per device (the
  NVIDIA container toolkit reads the names).
- ``passDeviceSpecs``: a ``rw`` DeviceSpec per device node (the GPU's ``/dev/nvidia<minor>`` and the
  control nodes).
- IMEX channels (``PluginConfig.imex_channels``, every container): ``NVIDIA_IMEX_CHANNELS`` (envvar),
  ``<vendor>/imex-channel=<id>`` (CDI), ``/var/run/nvidia-container-devices/imex/<id>`` (volume-mounts),
  a ``rw`` DeviceSpec of the channel node (passDeviceSpecs).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deviceplugin.config import ImexChannel, ListStrategy, PluginConfig, SharingStrategy
from deviceplugin.resources import Device, Resource

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
MPS_PIPE = "CUDA_MPS_PIPE_DIRECTORY"
MPS_THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_PINNED = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
IMEX_CHANNELS = "NVIDIA_IMEX_CHANNELS"
VOLUME_MOUNT_ROOT = "/var/run/nvidia-container-devices"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


class AllocationError(ValueError):
    """A request kubelet must not get devices for; the message says which device and why."""

    def __init__(self, message: str, *, device: str | None = None) -> None:
        super().__init__(message)
        self.device = device


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    envs: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()


def mps_pipe_dir(config: PluginConfig, resource_name: str) -> str:
    return posixpath.join(config.mps_root, resource_name.split("/", 1)[1], "pipe")


def validate(resource: Resource, ids: Sequence[str], *, unhealthy: Mapping[str, str]) -> list[Device]:
    """The devices for ``ids``, or :class:`AllocationError` for the first bad one."""
    if not ids:
        raise AllocationError(f"{resource.name}: the request names no devices")
    devices: list[Device] = []
    for device_id in ids:
        device = resource.device(device_id)
        if device is None:
            raise AllocationError(
                f"{resource.name}: device {device_id[:80]!r} is unknown (not advertised by this plugin)",
                device=device_id,
            )
        if device_id in unhealthy:
            raise AllocationError(
                f"{resource.name}: device {device_id} is unhealthy ({unhealthy[device_id]})", device=device_id
            )
        devices.append(device)
    if (
        resource.sharing is not SharingStrategy.NONE
        and resource.fail_requests_greater_than_one
        and len(ids) > 1
    ):
        raise AllocationError(
            f"{resource.name}: {len(ids)} shared devices requested ({', '.join(ids[:4])}"
            f"{', ...' if len(ids) > 4 else ''}) but at most 1 "
            "is allowed per container (failRequestsGreaterThanOne)",
            device=ids[1],
        )
    return devices


def allocate(
    resource: Resource, ids: Sequence[str], *, unhealthy: Mapping[str, str], config: PluginConfig
) -> ContainerAllocation:
    """The container's envs, mounts and CDI devices for one ``ContainerAllocateRequest``."""
    devices = validate(resource, ids, unhealthy=unhealthy)
    distinct = list({d.base_uuid: d for d in devices}.values())
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    if ListStrategy.ENVVAR in config.list_strategies:
        envs[VISIBLE_DEVICES] = ",".join(d.visible_id for d in distinct)
    if resource.sharing is SharingStrategy.MPS:
        pipe = mps_pipe_dir(config, resource.name)
        envs[MPS_PIPE] = pipe
        envs[MPS_THREADS] = str(100 // resource.replicas)
        envs[MPS_PINNED] = ",".join(
            f"{ordinal}={d.memory_bytes // resource.replicas // (1024 * 1024)}M"
            for ordinal, d in enumerate(distinct)
        )
        mounts.append(Mount(container_path=pipe, host_path=pipe))
        mounts.append(Mount(container_path="/dev/shm", host_path=posixpath.join(config.mps_root, "shm")))
    cdi: tuple[str, ...] = ()
    if ListStrategy.CDI_CRI in config.list_strategies or config.cdi.enabled:
        cdi = tuple(f"{config.cdi.kind}={d.base_uuid}" for d in distinct)
    if ListStrategy.VOLUME_MOUNTS in config.list_strategies:
        mounts += [
            Mount(container_path=f"{VOLUME_MOUNT_ROOT}/{d.visible_id}", host_path="/dev/null", read_only=True)
            for d in distinct
        ]
    specs: list[DeviceSpec] = []
    if config.pass_device_specs:
        nodes = [f"/dev/nvidia{d.minor_number}" for d in distinct if d.minor_number is not None]
        specs += [DeviceSpec(p, p) for p in (*dict.fromkeys(nodes), *CONTROL_NODES)]
    if config.imex_channels:
        extra = imex_allocation(config.imex_channels, config)
        envs.update(extra.envs)
        mounts += extra.mounts
        cdi += extra.cdi_devices
        specs += extra.devices
    return ContainerAllocation(envs=envs, mounts=tuple(mounts), cdi_devices=cdi, devices=tuple(specs))


def imex_allocation(channels: Sequence[ImexChannel], config: PluginConfig) -> ContainerAllocation:
    """The IMEX channels' part of a container, per strategy (as NVIDIA's device plugin gives them)."""
    envs: dict[str, str] = {}
    if ListStrategy.ENVVAR in config.list_strategies:
        envs[IMEX_CHANNELS] = ",".join(str(c.id) for c in channels)
    cdi: tuple[str, ...] = ()
    if ListStrategy.CDI_CRI in config.list_strategies or config.cdi.enabled:
        vendor = config.cdi.kind.split("/", 1)[0]
        cdi = tuple(f"{vendor}/imex-channel={c.id}" for c in channels)
    mounts: tuple[Mount, ...] = ()
    if ListStrategy.VOLUME_MOUNTS in config.list_strategies:
        mounts = tuple(
            Mount(container_path=f"{VOLUME_MOUNT_ROOT}/imex/{c.id}", host_path="/dev/null", read_only=True)
            for c in channels
        )
    specs: tuple[DeviceSpec, ...] = ()
    if config.pass_device_specs:
        specs = tuple(DeviceSpec(c.path, c.host_path, "rw") for c in channels)
    return ContainerAllocation(envs=envs, mounts=mounts, cdi_devices=cdi, devices=specs)
