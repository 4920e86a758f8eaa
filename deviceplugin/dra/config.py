"""The ``dra`` section of the ``version: v1`` config file, validated into frozen settings. Pure::

    dra:
      enabled: false                       # off by default
      driverName: gpu.gpuagent.dev
      resources: [nvidia.com/gpu]          # which of the node's resources DRA serves instead of the
                                           # device plugin (default: every GPU and MIG resource)
      pluginDir: /var/lib/kubelet/plugins  # the service socket is <pluginDir>/<driverName>/dra.sock
      registryDir: /var/lib/kubelet/plugins_registry   # the kubelet's plugin watcher
      cdiKind: gpu.gpuagent.dev/gpu        # CDI device names the containers get: <kind>=<uuid>
      imexChannels: false                  # one IMEX channel per gang (DeviceClass imex-channel.gpuagent.dev)
      imexNamespace: gpu-system            # where each NVLink domain's channel record (a ConfigMap) lives

Each device is served by exactly one API: a resource named here is withdrawn from the device plugin
and published in the node's ResourceSlice pool instead; a shared resource (time-slicing, MPS) cannot
be named (DRA hands out whole GPUs and MIG devices). The checkpoint of prepared claims lives in
``<pluginDir>/<driverName>/checkpoint.json``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from deviceplugin.config import ConfigError, PluginConfig, SectionReader, SharingStrategy

DEFAULT_DRIVER = "gpu.gpuagent.dev"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/plugins"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
MAX_DRIVER_NAME = 63
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$")
_RESOURCE = re.compile(r"^nvidia\.com/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_CDI_KIND = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
KNOWN = {
    "enabled",
    "driverName",
    "resources",
    "pluginDir",
    "registryDir",
    "cdiKind",
    "imexChannels",
    "imexNamespace",
}
DEFAULT_IMEX_NAMESPACE = "gpu-system"
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class DraConfig:
    enabled: bool = False
    driver_name: str = DEFAULT_DRIVER
    resources: tuple[str, ...] | None = None  # None: every GPU and MIG resource of the node
    plugin_dir: str = DEFAULT_PLUGIN_DIR
    registry_dir: str = DEFAULT_REGISTRY_DIR
    cdi_kind: str = ""  # "" : "<driverName>/gpu"
    imex_channels: bool = False
    imex_namespace: str = DEFAULT_IMEX_NAMESPACE

    @property
    def kind(self) -> str:
        """The CDI kind of the devices DRA prepares."""
        return self.cdi_kind or f"{self.driver_name}/gpu"

    def serves(self, resource: str) -> bool:
        """Whether DRA (not the device plugin) serves ``resource`` on this node."""
        if not self.enabled:
            return False
        if self.resources is None:
            return resource == "nvidia.com/gpu" or resource.startswith("nvidia.com/mig-")
        return resource in self.resources

    @property
    def service_dir(self) -> PurePosixPath:
        return PurePosixPath(self.plugin_dir) / self.driver_name


def parse_dra_config(data: Mapping[str, Any], *, source: str = "config") -> DraConfig:
    """Validate the ``dra`` section (other sections are not read); raises :class:`ConfigError` listing
    every problem as ``<source>: dra.<key>: <what is wrong>``."""
    problems: list[str] = []
    r = SectionReader(problems)
    body = r.section(data, "dra", "", KNOWN)
    driver = r.string(body, "driverName", "dra.driverName", DEFAULT_DRIVER)
    if len(driver) > MAX_DRIVER_NAME or not _DNS_SUBDOMAIN.match(driver):
        problems.append(
            f"dra.driverName: {driver[:80]!r} is not a DNS subdomain of at most {MAX_DRIVER_NAME} "
            "characters with a dot (for example gpu.gpuagent.dev)"
        )
    resources: tuple[str, ...] | None = None
    raw = body.get("resources")
    if raw is not None:
        if not isinstance(raw, list) or not raw:
            problems.append(f"dra.resources: expected a non-empty list of resource names, got {raw!r:.80}")
        else:
            names: list[str] = []
            for i, name in enumerate(raw):
                if not isinstance(name, str) or not _RESOURCE.match(name) or len(name) > 63:
                    problems.append(
                        f"dra.resources[{i}]: {name!r:.80} is not a resource name like nvidia.com/gpu "
                        "or nvidia.com/mig-1g.10gb"
                    )
                elif name in names:
                    problems.append(f"dra.resources[{i}]: {name} is named twice")
                else:
                    names.append(name)
            resources = tuple(names)
    plugin_dir = _absolute(r, body, "pluginDir", DEFAULT_PLUGIN_DIR, problems)
    registry_dir = _absolute(r, body, "registryDir", DEFAULT_REGISTRY_DIR, problems)
    cdi_kind = r.string(body, "cdiKind", "dra.cdiKind", "")
    if cdi_kind and not _CDI_KIND.match(cdi_kind):
        problems.append(
            f"dra.cdiKind: {cdi_kind[:80]!r} is not <vendor>/<class> (for example gpu.gpuagent.dev/gpu)"
        )
    namespace = r.string(body, "imexNamespace", "dra.imexNamespace", DEFAULT_IMEX_NAMESPACE)
    if len(namespace) > 63 or not _NAMESPACE.match(namespace):
        problems.append(f"dra.imexNamespace: {namespace[:80]!r} is not a namespace name")
    config = DraConfig(
        imex_channels=r.boolean(body, "imexChannels", "dra.imexChannels", False),
        imex_namespace=namespace,
        enabled=r.boolean(body, "enabled", "dra.enabled", False),
        driver_name=driver,
        resources=resources,
        plugin_dir=plugin_dir,
        registry_dir=registry_dir,
        cdi_kind=cdi_kind,
    )
    if problems:
        raise ConfigError([f"{source}: {p}" for p in problems])
    return config


def _absolute(r: SectionReader, body: Mapping[str, Any], key: str, default: str, problems: list[str]) -> str:
    value = r.string(body, key, f"dra.{key}", default)
    if not value.startswith("/"):
        problems.append(f"dra.{key}: expected an absolute path, got {value[:80]!r}")
    return value


def shared_conflicts(dra: DraConfig, plugin: PluginConfig) -> list[str]:
    """``dra.resources`` entries that name a shared resource (time-slicing, MPS): DRA hands out whole
    GPUs and MIG devices only. One line each."""
    if not dra.enabled or plugin.sharing.strategy is SharingStrategy.NONE:
        return []
    shared = {name for r in plugin.sharing.resources for name in (r.name, r.rename) if name}
    return [
        f"dra.resources: {name} is shared ({plugin.sharing.strategy.value}); DRA serves whole GPUs and "
        "MIG devices only, so leave it to the device plugin"
        for name in sorted(shared)
        if dra.serves(name)
    ]
