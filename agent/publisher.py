"""Component of ``run``: publishes this node's ``GPUNode`` and its node labels to the Kubernetes API.

- ``GPUNode`` (``topology.gpunode``): server-side apply of the object (name = node name, an owner
  reference to the Node so it goes with the Node) and of its ``status`` (inventory, per-device health,
  summary), field manager ``gpu-node-agent``.
- Node labels (``topology.labels``): GFD-compatible ``nvidia.com/*`` and our ``gpuagent.dev/*``,
  applied as one server-side apply of ``metadata.labels``; a label this node no longer has is removed
  because the same manager stops sending it.
- The IMEX daemon's status (``agent.imexctl.ImexMonitor``, where given): ``status.imex`` and the label
  ``gpuagent.dev/imex``; a change of it is published like a change of the store.
- Nothing is written when nothing changed (the last successful write is remembered per part).
- When the API is down or the CRD is missing, writes are retried with exponential backoff; the latest
  state is always what the next attempt sends, and the agent keeps running.
- Every ``verify_interval_s`` the GPUNode is read back; if someone deleted it, it is written again.
- Device health changes become Node Events (``kubectl describe node`` shows them): ``GpuUnhealthy``
  (Warning) with the health book's reason — the fault and what would clear it — and ``GpuHealthy``
  when the device returns; one Event per device and change, best effort (a refused Event is logged and
  not retried: the GPUNode status and the device plugin carry the health either way).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from agent.imex import ImexStatus
from agent.imexctl import ImexMonitor
from topology import logs
from topology.fabrichealth import DEFAULT_FABRIC_POLICY, FabricPolicy
from topology.gpunode import API_VERSION, KIND, gpunode_object
from topology.kube import GPUNODES, NODES, Kube, KubeError
from topology.kube.recorder import EventRecorder, ObjectRef
from topology.labels import node_labels
from topology.model import Health, NodeInventory

log = logs.get_logger("agent.publisher")


class HealthLike(Protocol):
    @property
    def healthy(self) -> bool: ...

    @property
    def reason(self) -> str | None: ...


class PublisherSource(Protocol):
    """What the publisher reads from the agent's store (``agent.runtime.InventoryStore`` fits)."""

    @property
    def inventory(self) -> NodeInventory: ...

    @property
    def version(self) -> int: ...

    def health(self) -> Mapping[str, HealthLike]: ...

    async def wait_for_change(self, since: int, *, timeout: float | None = None) -> int: ...


class ImexSource(Protocol):
    """The IMEX daemon's latest status and a count of its changes (``agent.imexctl.ImexMonitor`` fits)."""

    @property
    def status(self) -> ImexStatus | None: ...

    @property
    def version(self) -> int: ...


class NodeApi(Protocol):
    """The API calls publishing needs (``KubeNodeApi`` over the one adapter, :class:`topology.kube.Kube`)."""

    def node_uid(self, name: str) -> str | None: ...

    def apply_gpunode(self, obj: Mapping[str, Any]) -> None: ...

    def apply_gpunode_status(self, obj: Mapping[str, Any]) -> None: ...

    def gpunode_exists(self, name: str) -> bool: ...

    def apply_labels(self, name: str, labels: Mapping[str, str]) -> None: ...

    def node_event(self, name: str, uid: str, *, reason: str, message: str, warning: bool) -> None: ...


class KubeNodeApi:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.recorder = EventRecorder(kube, component="gpu-node-agent")

    def node_uid(self, name: str) -> str | None:
        try:
            uid = (self.kube.get(f"{NODES}/{quote(name)}").get("metadata") or {}).get("uid")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return str(uid) if uid else None

    def apply_gpunode(self, obj: Mapping[str, Any]) -> None:
        body = {k: v for k, v in obj.items() if k != "status"}
        self.kube.apply(f"{GPUNODES}/{quote(obj['metadata']['name'])}", body)

    def apply_gpunode_status(self, obj: Mapping[str, Any]) -> None:
        name = obj["metadata"]["name"]
        body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "status": obj["status"]}
        self.kube.apply(f"{GPUNODES}/{quote(name)}/status", body)

    def gpunode_exists(self, name: str) -> bool:
        try:
            self.kube.get(f"{GPUNODES}/{quote(name)}")
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def apply_labels(self, name: str, labels: Mapping[str, str]) -> None:
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels)}}
        self.kube.apply(f"{NODES}/{quote(name)}", body)

    def node_event(self, name: str, uid: str, *, reason: str, message: str, warning: bool) -> None:
        self.recorder.record(
            ObjectRef("Node", name, uid=uid), reason=reason, message=message, warning=warning
        )


@dataclass(frozen=True, slots=True)
class PublisherSettings:
    node_name: str
    mig_strategy: str = "none"
    sharing_strategy: str = "none"
    replicas: int = 1
    shared_renamed: bool = False
    min_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    verify_interval_s: float = 300.0
    fabric_policy: FabricPolicy = DEFAULT_FABRIC_POLICY


def device_health(inventory: NodeInventory, unhealthy: Mapping[str, HealthLike]) -> dict[str, Health]:
    """Every GPU and MIG device by UUID: Unhealthy where the store says so, else Healthy."""
    out: dict[str, Health] = {}
    for key in [g.uuid for g in inventory.gpus if g.uuid] + [d.uuid for d in inventory.mig_devices()]:
        status = unhealthy.get(key)
        out[key] = Health.UNHEALTHY if status is not None and not status.healthy else Health.HEALTHY
    for key, status in unhealthy.items():
        if key not in out and not status.healthy:
            out[key] = Health.UNHEALTHY
    return out


class Publisher:
    """``async run(stop)``: publish now, then after every change of the store, until ``stop``."""

    def __init__(
        self,
        *,
        source: PublisherSource,
        api: NodeApi,
        settings: PublisherSettings,
        imex: ImexSource | None = None,
    ) -> None:
        self.source = source
        self.imex = imex
        self.api = api
        self.settings = settings
        self.writes = 0
        self.failures = 0
        self._log = log.bind(node=settings.node_name)
        self._uid: str | None = None
        self._created = False
        self._status: dict[str, Any] | None = None
        self._labels: dict[str, str] | None = None
        self._announced: dict[str, str] = {}  # device key -> the unhealthy reason last announced
        self.health_events = 0

    def desired(self) -> tuple[dict[str, Any], dict[str, str]]:
        inv = self.source.inventory
        s = self.settings
        health = device_health(inv, self.source.health())
        imex = self.imex.status if self.imex is not None else None
        obj = gpunode_object(
            inv,
            node_name=s.node_name,
            node_uid=self._uid,
            health=health,
            fabric_policy=s.fabric_policy,
            imex=imex.to_status() if imex is not None else None,
        )
        labels = node_labels(
            inv,
            node_name=s.node_name,
            mig_strategy=s.mig_strategy,
            sharing_strategy=s.sharing_strategy,
            replicas=s.replicas,
            shared_renamed=s.shared_renamed,
            fabric_policy=s.fabric_policy,
            imex=imex.label if imex is not None else None,
        )
        return obj, labels

    def publish_once(self) -> int:
        """Write what differs from the last successful writes; returns the number of writes.
        Raises :class:`KubeError` when the API refuses (the caller backs off)."""
        if self._uid is None:
            self._uid = self.api.node_uid(self.settings.node_name)
            if self._uid is None:
                raise KubeError(404, f"Node {self.settings.node_name!r} not found")
        obj, labels = self.desired()
        writes = 0
        if not self._created:
            self.api.apply_gpunode(obj)
            self._created = True
            self._status = None
            writes += 1
        if obj["status"] != self._status:
            self.api.apply_gpunode_status(obj)
            self._status = obj["status"]
            writes += 1
        if labels != self._labels:
            self.api.apply_labels(self.settings.node_name, labels)
            self._labels = labels
            writes += 1
        self.writes += writes
        return writes

    def announce_health(self) -> int:
        """One Node Event per device whose health changed since the last announcement (see the module
        doc); returns how many were recorded. Needs the Node's uid (after a first publish)."""
        if self._uid is None:
            return 0
        inv = self.source.inventory
        where = {g.uuid: f"GPU {g.index} ({g.uuid})" for g in inv.gpus if g.uuid}
        where.update({d.uuid: f"MIG device {d.uuid} of GPU {d.parent_index}" for d in inv.mig_devices()})
        now = {k: v.reason or "unhealthy" for k, v in self.source.health().items() if not v.healthy}
        recorded = 0
        for key in sorted(set(now) | set(self._announced)):
            reason = now.get(key)
            if reason == self._announced.get(key):
                continue
            device = where.get(key, key)
            if reason is None:
                event, message, warning = (
                    "GpuHealthy",
                    f"{device} is healthy again and back in service",
                    False,
                )
                del self._announced[key]
            else:
                event, message, warning = "GpuUnhealthy", f"{device} withdrawn: {reason}", True
                self._announced[key] = reason
            try:
                self.api.node_event(
                    self.settings.node_name, self._uid, reason=event, message=message, warning=warning
                )
            except KubeError as exc:
                self._log.warning(
                    "health_event_failed",
                    device=key,
                    error=str(exc),
                    hint="the GPUNode status and the device plugin still carry the health",
                )
                continue
            recorded += 1
        self.health_events += recorded
        return recorded

    def verify(self) -> None:
        """Forget what was written if the GPUNode is gone (deleted by hand, or the CRD reinstalled)."""
        if self._created and not self.api.gpunode_exists(self.settings.node_name):
            self._log.warning("gpunode_missing")
            self._created = False
            self._status = None
            self._uid = None  # the Node may have been re-created (a new uid for the owner reference)

    async def _call(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.to_thread(fn)

    async def run(self, stop: asyncio.Event) -> None:
        backoff = self.settings.min_backoff_s
        version = -1
        imex_version = -1
        loop = asyncio.get_running_loop()
        next_verify = loop.time() + self.settings.verify_interval_s
        pending = True
        while not stop.is_set():
            if pending:
                version = self.source.version
                imex_version = self.imex.version if self.imex is not None else -1
                try:
                    n = await self._call(self.publish_once)
                    if n:
                        self._log.info("published", writes=n)
                    pending = False
                    backoff = self.settings.min_backoff_s
                    await self._call(self.announce_health)
                except KubeError as exc:
                    self.failures += 1
                    self._log.warning("publish_failed", error=str(exc), retry_s=backoff)
                    await _sleep(stop, backoff)
                    backoff = min(backoff * 2, self.settings.max_backoff_s)
                    continue
            if loop.time() >= next_verify:
                next_verify = loop.time() + self.settings.verify_interval_s
                try:
                    await self._call(self.verify)
                except KubeError as exc:
                    self._log.warning("verify_failed", error=str(exc))
                pending = pending or not self._created
                continue
            wait = max(0.0, next_verify - loop.time())
            changed = await self.source.wait_for_change(version, timeout=min(wait, 0.25))
            if changed != version or (self.imex is not None and self.imex.version != imex_version):
                pending = True


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return


def publisher_for_run(ctx: Any) -> Publisher | None:
    """The ``run`` component factory: ``None`` with ``--no-kube`` or when no API config is found."""
    settings = ctx.settings
    if settings.no_kube:
        return None
    from topology.kube import api_client_from  # noqa: PLC0415 - loads the Kubernetes client only here

    try:
        client = api_client_from(str(settings.kubeconfig) if settings.kubeconfig else None)
    except Exception as exc:  # no kubeconfig and not in a cluster
        log.warning("publisher_disabled", reason=f"no Kubernetes API configuration: {exc}")
        return None
    plugin = settings.plugin
    sharing = plugin.sharing
    replicas = max((r.replicas for r in sharing.resources), default=1)
    renamed = bool(sharing.resources) and all(r.rename for r in sharing.resources)
    imex = ctx.extras.get("imex")
    return Publisher(
        source=ctx.store,
        imex=imex if isinstance(imex, ImexMonitor) else None,
        api=KubeNodeApi(Kube(client)),
        settings=PublisherSettings(
            node_name=settings.node_name,
            mig_strategy=str(plugin.mig_strategy.value),
            sharing_strategy=str(sharing.strategy.value),
            replicas=replicas,
            shared_renamed=renamed,
            fabric_policy=settings.health.fabric_policy,
        ),
    )
