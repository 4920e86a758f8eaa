"""The device plugin's part of the ``version: v1`` config file, validated into frozen settings.

Pure: takes already-loaded YAML data, returns a :class:`PluginConfig` or every problem found, one line
each, naming the key path (``sharing.timeSlicing.resources[0].replicas: ...``). Keys follow NVIDIA's
config v1 where they mean the same thing::

    flags:
      migStrategy: none | single | mixed
      mpsRoot: /run/nvidia/mps
      plugin:
        deviceListStrategy: envvar | cdi-cri | volume-mounts | [envvar, cdi-cri, ...]
        deviceIDStrategy: uuid | index
        passDeviceSpecs: false                 # DeviceSpecs for the device nodes (and IMEX channels)
        sharedDevicesAllocationPolicy: distributed | packed   # replicas: spread (default) or pack
    sharing:
      timeSlicing | mps:
        renameByDefault: false
        failRequestsGreaterThanOne: false       # MPS: true unless set
        resources:
          - name: nvidia.com/gpu
            replicas: 4                          # 2 .. MAX_REPLICAS
            rename: nvidia.com/gpu.shared        # optional; never a name the node advertises otherwise
            devices: all | <count> | [<index> | "<i>:<j>" | <uuid>, ...]
    cdi:
      enabled: false                           # also implied by deviceListStrategy cdi-cri
      specDir: /var/run/cdi
      kind: gpuagent.dev/gpu
    imex:                                      # IMEX channels in every GPU container (multi-node NVLink)
      channelIDs: []                           # [] or [0], as NVIDIA's device plugin accepts
      required: false                          # true: no channel device node is a start-up error

The file's ``health`` section configures the node's health rules, not the plugin: it is parsed by
``agent.config`` with the same :class:`SectionReader`.
"""

from __future__ import annotations

import enum
import re
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from deviceplugin.preferred import Policy

RESOURCE_PREFIX = "nvidia.com/"
MAX_RESOURCE_NAME = 63
MAX_REPLICAS = 1024
"""The most replicas of one device: beyond it a node lists tens of thousands of devices to kubelet."""
DEFAULT_CDI_DIR = "/var/run/cdi"
DEFAULT_CDI_KIND = "gpuagent.dev/gpu"


class MigStrategy(enum.StrEnum):
    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


class SharingStrategy(enum.StrEnum):
    NONE = "none"
    TIME_SLICING = "time-slicing"
    MPS = "mps"


class DeviceIdStrategy(enum.StrEnum):
    UUID = "uuid"
    INDEX = "index"


class ListStrategy(enum.StrEnum):
    ENVVAR = "envvar"
    CDI_CRI = "cdi-cri"
    VOLUME_MOUNTS = "volume-mounts"


IMEX_AGENT_KEYS = (
    "manage",
    "ctl",
    "daemon",
    "service",
    "command",
    "nodesConfig",
    "address",
    "port",
    "maxPeers",
)
"""Keys of the ``imex`` section that the node agent reads (host-managed IMEX, ``agent.imexmanage``); the
plugin accepts and leaves them."""
IMEX_CHANNEL_IDS = ((), (0,))
"""The channel lists ``imex.channelIDs`` accepts (NVIDIA's device plugin accepts the same two)."""


@dataclass(frozen=True, slots=True)
class ImexConfig:
    channel_ids: tuple[int, ...] = ()
    required: bool = False


@dataclass(frozen=True, slots=True)
class ImexChannel:
    """An IMEX channel whose device node the agent found: ``host_path`` on the node, ``path`` in the
    container (``/dev/nvidia-caps-imex-channels/channel<id>``)."""

    id: int
    path: str
    host_path: str


@dataclass(frozen=True, slots=True)
class SharedResource:
    name: str
    replicas: int
    rename: str | None = None
    devices: str | int | tuple[str, ...] = "all"  # "all", the first N GPUs, or indices/"i:j"/UUIDs


@dataclass(frozen=True, slots=True)
class Sharing:
    strategy: SharingStrategy = SharingStrategy.NONE
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    resources: tuple[SharedResource, ...] = ()


@dataclass(frozen=True, slots=True)
class CdiConfig:
    enabled: bool = False
    spec_dir: str = DEFAULT_CDI_DIR
    kind: str = DEFAULT_CDI_KIND


@dataclass(frozen=True, slots=True)
class PluginConfig:
    mig_strategy: MigStrategy = MigStrategy.NONE
    device_id_strategy: DeviceIdStrategy = DeviceIdStrategy.UUID
    list_strategies: tuple[ListStrategy, ...] = (ListStrategy.ENVVAR,)
    allocation_policy: Policy = Policy.SPREAD
    mps_root: str = "/run/nvidia/mps"
    sharing: Sharing = field(default_factory=Sharing)
    cdi: CdiConfig = field(default_factory=CdiConfig)
    pass_device_specs: bool = False
    imex: ImexConfig = field(default_factory=ImexConfig)
    # the channels checked on this node (filled in by the composition root after the device-node check;
    # every container of every resource gets them)
    imex_channels: tuple[ImexChannel, ...] = ()


class ConfigError(ValueError):
    """Every problem found, one per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


_RESOURCE_RE = re.compile(r"^nvidia\.com/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_HEX = "[0-9a-fA-F]"
_UUID = f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
_DEVICE_RE = re.compile(
    rf"^(?:\d{{1,4}}|\d{{1,4}}:\d{{1,4}}|GPU-{_UUID}|MIG-{_UUID}|MIG-GPU-{_UUID}/\d{{1,4}}/\d{{1,4}})$"
)
WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_CDI_KIND_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_POLICIES = {
    "distributed": Policy.SPREAD,
    "packed": Policy.PACK,
    "spread": Policy.SPREAD,
    "pack": Policy.PACK,
}


class SectionReader:
    """Typed access to the sections of a v1 config file that records one problem per bad key (naming
    its path) and keeps going."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems

    def section(self, data: Mapping[str, Any], key: str, path: str, known: set[str]) -> Mapping[str, Any]:
        value = data.get(key)
        where = f"{path}{key}"
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.problems.append(f"{where}: expected a mapping, got {type(value).__name__}")
            return {}
        for extra in sorted({_key(k) for k in value} - known):
            self.problems.append(f"{where}.{extra}: unknown key; valid: {', '.join(sorted(known))}")
        return value

    def choice(
        self, data: Mapping[str, Any], key: str, where: str, valid: Mapping[str, Any], default: Any
    ) -> Any:
        if key not in data or data[key] is None:
            return default
        value = data[key]
        if isinstance(value, str) and value in valid:
            return valid[value]
        self.problems.append(f"{where}: {_show(value)} is not one of {', '.join(valid)}")
        return default

    def boolean(self, data: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
        if key not in data or data[key] is None:
            return default
        if isinstance(data[key], bool):
            return bool(data[key])
        self.problems.append(f"{where}: expected true or false, got {_show(data[key])}")
        return default

    def number(
        self,
        data: Mapping[str, Any],
        key: str,
        where: str,
        default: float,
        *,
        minimum: float,
        maximum: float | None = None,
    ) -> float:
        if key not in data or data[key] is None:
            return default
        value = data[key]
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and value >= minimum
            and (maximum is None or value <= maximum)
        ):
            return float(value)
        bound = f">= {minimum:g}" if maximum is None else f"from {minimum:g} to {maximum:g}"
        self.problems.append(f"{where}: expected a number {bound}, got {_show(value)}")
        return default

    def string(self, data: Mapping[str, Any], key: str, where: str, default: str) -> str:
        if key not in data or data[key] is None:
            return default
        if isinstance(data[key], str) and data[key]:
            return str(data[key])
        self.problems.append(f"{where}: expected a non-empty string, got {_show(data[key])}")
        return default


def parse_plugin_config(data: Mapping[str, Any], *, source: str = "config") -> PluginConfig:
    """Validate the ``flags``, ``sharing``, ``cdi`` and ``imex`` sections of a v1 config file (others are
    not read).

    Raises :class:`ConfigError` listing every problem as ``<source>: <key path>: <what is wrong>``.
    """
    problems: list[str] = []
    r = SectionReader(problems)
    flags = r.section(data, "flags", "", {"migStrategy", "mpsRoot", "plugin"})
    plugin = r.section(
        flags,
        "plugin",
        "flags.",
        {"deviceListStrategy", "deviceIDStrategy", "sharedDevicesAllocationPolicy", "passDeviceSpecs"},
    )
    mig = r.choice(
        flags, "migStrategy", "flags.migStrategy", {m.value: m for m in MigStrategy}, MigStrategy.NONE
    )
    id_strategy = r.choice(
        plugin,
        "deviceIDStrategy",
        "flags.plugin.deviceIDStrategy",
        {s.value: s for s in DeviceIdStrategy},
        DeviceIdStrategy.UUID,
    )
    policy = r.choice(
        plugin,
        "sharedDevicesAllocationPolicy",
        "flags.plugin.sharedDevicesAllocationPolicy",
        _POLICIES,
        Policy.SPREAD,
    )
    lists = _list_strategies(plugin.get("deviceListStrategy"), problems)
    mps_root = r.string(flags, "mpsRoot", "flags.mpsRoot", "/run/nvidia/mps")

    sharing = _sharing(r, data, mig)
    cdi_data = r.section(data, "cdi", "", {"enabled", "specDir", "kind"})
    cdi_enabled = r.boolean(cdi_data, "enabled", "cdi.enabled", False) or ListStrategy.CDI_CRI in lists
    kind = r.string(cdi_data, "kind", "cdi.kind", DEFAULT_CDI_KIND)
    if not _CDI_KIND_RE.match(kind):
        problems.append(f"cdi.kind: {_show(kind)} is not <vendor>/<class> (for example gpuagent.dev/gpu)")
    cdi = CdiConfig(
        enabled=cdi_enabled,
        spec_dir=r.string(cdi_data, "specDir", "cdi.specDir", DEFAULT_CDI_DIR),
        kind=kind,
    )
    pass_specs = r.boolean(plugin, "passDeviceSpecs", "flags.plugin.passDeviceSpecs", False)
    imex = _imex(r, data)
    if sharing.strategy is SharingStrategy.MPS and mig is not MigStrategy.NONE:
        problems.append(
            f"sharing.mps: MPS cannot be combined with flags.migStrategy {mig.value} (MPS needs whole GPUs)"
        )
    if problems:
        raise ConfigError([f"{source}: {p}" for p in problems])
    return PluginConfig(
        mig_strategy=mig,
        device_id_strategy=id_strategy,
        list_strategies=lists,
        allocation_policy=policy,
        mps_root=mps_root,
        sharing=sharing,
        cdi=cdi,
        pass_device_specs=pass_specs,
        imex=imex,
    )


def _imex(r: SectionReader, data: Mapping[str, Any]) -> ImexConfig:
    """The ``imex`` section; ``channelIDs`` and ``required`` also as the strings the flags and env
    variables give (``"0"``, ``""``, ``"true"``)."""
    body = r.section(data, "imex", "", {"channelIDs", "required", *IMEX_AGENT_KEYS})
    raw = body.get("channelIDs")
    ids: tuple[int, ...] = ()
    if isinstance(raw, str):  # --imex-channel-ids / IMEX_CHANNEL_IDS: comma-separated
        parts = [p.strip() for p in raw.split(",") if p.strip()]
        raw = [int(p) if p.isdigit() else p for p in parts]
    if raw is not None:
        plain = isinstance(raw, list) and all(type(x) is int for x in raw)
        if plain and tuple(raw) in IMEX_CHANNEL_IDS:
            ids = tuple(raw)
        else:
            r.problems.append(f"imex.channelIDs: {_show(body.get('channelIDs'))} is not [] or [0]")
    required_raw = body.get("required")
    if isinstance(required_raw, str) and required_raw.lower() in ("true", "false"):
        required = required_raw.lower() == "true"
    else:
        required = r.boolean(body, "required", "imex.required", False)
    if required and not ids:
        r.problems.append("imex.required: true needs imex.channelIDs [0]")
    return ImexConfig(channel_ids=ids, required=required)


def _list_strategies(value: Any, problems: list[str]) -> tuple[ListStrategy, ...]:
    if value is None:
        return (ListStrategy.ENVVAR,)
    items = [value] if isinstance(value, str) else value
    valid = {s.value: s for s in ListStrategy}
    if not isinstance(items, list) or not items or not all(isinstance(i, str) and i in valid for i in items):
        problems.append(
            f"flags.plugin.deviceListStrategy: {_show(value)} is not one of {', '.join(valid)} "
            "(or a list of them)"
        )
        return (ListStrategy.ENVVAR,)
    return tuple(dict.fromkeys(valid[i] for i in items))


def _sharing(r: SectionReader, data: Mapping[str, Any], mig: MigStrategy) -> Sharing:
    section = r.section(data, "sharing", "", {"timeSlicing", "mps"})
    present = [k for k in ("timeSlicing", "mps") if section.get(k) is not None]
    if len(present) > 1:
        r.problems.append("sharing: timeSlicing and mps are mutually exclusive; configure one")
        return Sharing()
    if not present:
        return Sharing()
    key = present[0]
    strategy = SharingStrategy.TIME_SLICING if key == "timeSlicing" else SharingStrategy.MPS
    body = r.section(section, key, "sharing.", {"renameByDefault", "failRequestsGreaterThanOne", "resources"})
    where = f"sharing.{key}"
    rename_default = r.boolean(body, "renameByDefault", f"{where}.renameByDefault", False)
    fail_default = strategy is SharingStrategy.MPS
    fail_gt1 = r.boolean(
        body, "failRequestsGreaterThanOne", f"{where}.failRequestsGreaterThanOne", fail_default
    )
    raw = body.get("resources")
    resources: list[SharedResource] = []
    if not isinstance(raw, list) or not raw:
        r.problems.append(f"{where}.resources: expected a non-empty list of {{name, replicas}}")
        raw = []
    seen: set[str] = set()
    names = {
        item["name"]: i
        for i, item in reversed(list(enumerate(raw)))
        if isinstance(item, Mapping) and isinstance(item.get("name"), str)
    }
    renamed: dict[str, int] = {}
    for i, item in enumerate(raw):
        at = f"{where}.resources[{i}]"
        if not isinstance(item, Mapping):
            r.problems.append(f"{at}: expected a mapping with name and replicas")
            continue
        for extra in sorted({_key(k) for k in item} - {"name", "replicas", "rename", "devices"}):
            r.problems.append(f"{at}.{extra}: unknown key; valid: devices, name, rename, replicas")
        name = item.get("name")
        if not isinstance(name, str) or not _RESOURCE_RE.match(name):
            r.problems.append(f"{at}.name: {_show(name)} is not a resource name like nvidia.com/gpu")
            continue
        if strategy is SharingStrategy.MPS and name != "nvidia.com/gpu":
            r.problems.append(f"{at}.name: MPS shares whole GPUs only (nvidia.com/gpu), not {name}")
        if name in seen:
            r.problems.append(f"{at}.name: {name} is listed twice")
        seen.add(name)
        replicas = item.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or not 2 <= replicas <= MAX_REPLICAS:
            r.problems.append(
                f"{at}.replicas: expected an integer from 2 to {MAX_REPLICAS}, got {_show(replicas)}"
            )
            continue
        rename = item.get("rename")
        if rename is None and rename_default:
            rename = f"{name}.shared"
        if rename is not None and (
            not isinstance(rename, str) or not _RESOURCE_RE.match(rename) or len(rename) > MAX_RESOURCE_NAME
        ):
            r.problems.append(
                f"{at}.rename: {_show(rename)} is not a resource name like nvidia.com/gpu.shared"
            )
            continue
        if rename is not None:
            clash = _rename_clash(rename, name, mig, names, renamed)
            if clash is not None:
                r.problems.append(f"{at}.rename: {clash}")
                continue
            renamed[rename] = i
        devices = _devices(item.get("devices", "all"), f"{at}.devices", r.problems)
        resources.append(SharedResource(name=name, replicas=replicas, rename=rename, devices=devices))
    return Sharing(
        strategy=strategy,
        rename_by_default=rename_default,
        fail_requests_greater_than_one=fail_gt1,
        resources=tuple(resources),
    )


def _rename_clash(
    rename: str, name: str, mig: MigStrategy, names: Mapping[Any, int], renamed: Mapping[str, int]
) -> str | None:
    """Why ``rename`` would take a name the node advertises otherwise (then its devices would vanish
    behind the shared ones), or ``None``."""
    if rename == name:
        return f"the same as name; leave rename out to share under {name}"
    if rename == WHOLE_GPU_RESOURCE:
        return f"{rename} clashes with the whole GPUs' resource {WHOLE_GPU_RESOURCE}; choose another name"
    if mig is MigStrategy.MIXED and rename.startswith(MIG_RESOURCE_PREFIX):
        return (
            f"{rename} clashes with the MIG resources of flags.migStrategy mixed "
            f"({MIG_RESOURCE_PREFIX}<profile>); choose another name"
        )
    if rename in names:
        return f"{rename} is also the name of resources[{names[rename]}]; choose another name"
    if rename in renamed:
        return (
            f"{rename} is also the rename of resources[{renamed[rename]}]; each shared resource needs a "
            "name of its own"
        )
    return None


def _devices(value: Any, where: str, problems: list[str]) -> str | int | tuple[str, ...]:
    if value == "all":
        return "all"
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if not isinstance(value, list) or not value:
        problems.append(
            f"{where}: expected all, a positive count or a list of indices/UUIDs, got {_show(value)}"
        )
        return "all"
    entries: list[str] = []
    for i, v in enumerate(value):
        text = str(v) if isinstance(v, int | str) and not isinstance(v, bool) else None
        if text is None or not _DEVICE_RE.match(text):
            problems.append(f"{where}[{i}]: {_show(v)} is not a GPU index, '<gpu>:<mig>' or a GPU-/MIG- UUID")
            continue
        entries.append(text)
    return tuple(entries) if entries else "all"


def _key(key: Any) -> str:
    """A mapping key as a message shows it: text, at most 64 characters."""
    text = key if isinstance(key, str) else _show(key)
    return text if len(text) <= 64 else text[:61] + "..."


def _show(value: Any) -> str:
    """``repr(value)`` cut short, so a huge or deeply nested value never makes a huge message."""
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 2, 60, 60, 6, 6
