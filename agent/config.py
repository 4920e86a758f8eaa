"""Settings of ``gpu-node-agent run``: one validated, frozen model; precedence CLI > env > file, here only.

The config file is YAML with ``version: v1``. Top-level keys are the run settings below (camelCase), the
device plugin's sections (``flags``, ``sharing``, ``cdi``; see :mod:`deviceplugin.config`), the DRA
driver's ``dra`` section (:mod:`deviceplugin.dra.config`) and the node's ``health`` section, parsed
here into :class:`~agent.healthbook.HealthConfig`::

    health:
      ignoredXids: [13, 31, 43, 45, 68, 109]   # replaces the default list
      extraIgnoredXids: []                     # added to it
      fabricUnhealthyMarksGpu: false
      recoveryQuietSeconds: 120
      probeIntervalSeconds: 5

and the ``fabric`` section, the fabric policy (:mod:`topology.fabrichealth`; what takes a GPU out of its
NVLink domain, and with ``health.fabricUnhealthyMarksGpu`` out of kubelet, and what only marks the
node ``degraded``)::

    fabric:
      unhealthyConditions: [route_unhealthy, incorrect_configuration, not_completed, summary_unhealthy]
      degradedConditions: [degraded_bandwidth, route_recovery, access_timeout_recovery, limited_capacity]

Every problem is reported as one line naming the setting and where it came
from (``--kubelet-dir``, ``env GPU_NODE_AGENT_KUBELET_DIR``, ``config.yaml: kubeletDir``); the command
prints them and exits 2, before anything starts.

Limits: the file is read through :mod:`topology.safeyaml` (UTF-8, bounded nesting, alias expansion
and integer digits) and may be at most ``MAX_CONFIG_BYTES``; every interval and duration has a range
(``SECONDS``); a listen address must be ``HOST:PORT`` with an IP address this host can listen on, or a
host name (``[ADDR]:PORT`` for IPv6; an empty host listens everywhere).

To add a setting: add a :class:`Setting` row to ``SETTINGS`` and a field to :class:`RunSettings`; the
CLI flag, the env var and the file key come from the row.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import math
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.files import RefusedFileError, read_bytes
from agent.healthbook import DEFAULT_IGNORED_XIDS, HealthConfig
from agent.imex import DAEMONS, ImexManageConfig
from deviceplugin.config import (
    IMEX_AGENT_KEYS,
    ConfigError,
    MigStrategy,
    PluginConfig,
    SectionReader,
    parse_plugin_config,
)
from deviceplugin.dra.config import DraConfig, parse_dra_config, shared_conflicts
from topology import safeyaml
from topology.fabrichealth import DEFAULT_FABRIC_POLICY, FabricCondition, FabricPolicy, parse_conditions
from topology.logs import FORMATS, LEVELS

ENV_PREFIX = "GPU_NODE_AGENT_"
CONFIG_VERSION = "v1"
PLUGIN_SECTIONS = ("flags", "sharing", "cdi", "imex")
HEALTH_SECTION = "health"
FABRIC_SECTION = "fabric"
DRA_SECTION = "dra"  # deviceplugin.dra.config
MAX_CONFIG_BYTES = 1024 * 1024
SECONDS: dict[str, tuple[float, float]] = {
    # RunSettings field: (least, most) seconds
    "shutdown_grace_s": (0.1, 300.0),
    "rediscover_interval_s": (1.0, 86400.0),
    "registration_check_s": (1.0, 3600.0),
    "metrics_interval_s": (0.1, 3600.0),
    "pod_resources_interval_s": (0.1, 3600.0),
}
HEALTH_SECONDS: dict[str, tuple[float, float]] = {
    "recoveryQuietSeconds": (0.0, 86400.0),
    "probeIntervalSeconds": (0.01, 3600.0),
}
DEFAULT_HEALTH_ADDR = "0.0.0.0:9401"


@dataclass(frozen=True, slots=True)
class RunSettings:
    node_name: str
    kubelet_dir: Path = Path("/var/lib/kubelet/device-plugins")
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    simulate: str | None = None
    simulate_faults: Path | None = None
    sysfs_root: Path | None = None
    no_kube: bool = False
    kubeconfig: Path | None = None  # None: $KUBECONFIG, else the in-cluster service account
    config_file: Path | None = None
    log_format: str = "auto"
    log_level: str = "info"
    shutdown_grace_s: float = 5.0
    rediscover_interval_s: float = 60.0
    registration_check_s: float = 30.0
    metrics_addr: str = "0.0.0.0:9400"  # HOST:PORT of /metrics, /healthz, /readyz; "" turns them off
    # HOST:PORT of /healthz, /readyz alone (kubelet's probes); "" turns it off. The command's default is
    # DEFAULT_HEALTH_ADDR (set in load_settings); settings built in code (tests, the demo) opt in.
    health_addr: str = ""
    metrics_format: str = "native"
    metrics_interval_s: float = 10.0
    pod_resources_interval_s: float = 10.0
    proc_root: Path = Path("/proc")
    dev_root: Path | None = None  # None: /dev, or the simulated node's own with --simulate
    pod_logs_root: Path = Path("/var/log/pods")
    plugin: PluginConfig = field(default_factory=PluginConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    dra: DraConfig = field(default_factory=DraConfig)
    imex: ImexManageConfig = field(default_factory=ImexManageConfig)


def _path(text: str) -> Path:
    if not text:
        raise ValueError("expected a path, got an empty string")
    return Path(text)


def _seconds(field: str) -> Callable[[str], float]:
    least, most = SECONDS[field]

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not least <= value <= most:  # NaN fails too
            raise ValueError(f"expected seconds from {least:g} to {most:g}, got {text[:40]}")
        return value

    return parse


def _choice(valid: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in valid:
            raise ValueError(f"{text!r} is not one of {', '.join(valid)}")
        return text

    return parse


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _sim_spec(text: str) -> str:
    from agent.nvml.simulate import parse_spec  # noqa: PLC0415 - only when simulating

    parse_spec(text)  # SimSpecError is a ValueError naming the valid profiles/options
    return text


def _nonempty(text: str) -> str:
    if not text.strip():
        raise ValueError("expected a non-empty string")
    return text.strip()


_HOST_LABEL = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?$")


def _listen_addr(text: str) -> str:
    """``HOST:PORT`` to listen on, checked now so a bad one stops the start before anything runs: an IP
    address must be one this host can listen on; a host name must be well formed (it is resolved when
    the listener starts)."""
    text = text.strip()
    if not text:
        return ""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or len(port) > 5 or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT (or '' to turn it off), got {text[:80]!r}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{host[1:-1][:60]!r} is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"an IPv6 address needs brackets: [{host[:60]}]:{port}")
    elif not host:
        return text
    elif all(part.isascii() and part.isdigit() for part in host.split(".")):
        try:
            ip = ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{host[:60]} is not an IPv4 address") from None
    else:
        labels = host.rstrip(".").split(".")
        if len(host) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
            raise ValueError(f"{host[:60]!r} is not an IP address or host name")
        return text
    if not ip.is_unspecified:  # 0.0.0.0 and [::] listen everywhere; nothing to check
        _can_listen(ip)
    return text


def _can_listen(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    """Bind a throw-away socket to ``ip`` (any port): an address of another host fails here, at once."""
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(ip), 0))
    except OSError as exc:
        raise ValueError(f"cannot listen on {ip}: {exc.strerror or exc}") from None


@dataclass(frozen=True, slots=True)
class Setting:
    field: str  # RunSettings field
    flag: str  # CLI flag
    env: str  # environment variable
    key: str  # config file key
    parse: Callable[[str], Any]
    help: str
    is_flag: bool = False  # a switch without a value on the command line


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "node_name", "--node-name", "NODE_NAME", "nodeName", _nonempty, "this node's name (default: hostname)"
    ),
    Setting(
        "kubelet_dir",
        "--kubelet-dir",
        ENV_PREFIX + "KUBELET_DIR",
        "kubeletDir",
        _path,
        "device-plugin directory with kubelet.sock",
    ),
    Setting(
        "kubeconfig",
        "--kubeconfig",
        ENV_PREFIX + "KUBECONFIG",  # $KUBECONFIG itself (a path list) is read by the client as usual
        "kubeconfig",
        _path,
        "kubeconfig for publishing (default: $KUBECONFIG, else the in-cluster service account)",
    ),
    Setting(
        "pod_resources_socket",
        "--pod-resources-socket",
        ENV_PREFIX + "POD_RESOURCES_SOCKET",
        "podResourcesSocket",
        _path,
        "kubelet pod-resources socket (registration check)",
    ),
    Setting(
        "simulate",
        "--simulate",
        ENV_PREFIX + "SIMULATE",
        "simulate",
        _sim_spec,
        "simulated machine PROFILE[:k=v]",
    ),
    Setting(
        "simulate_faults",
        "--simulate-faults",
        ENV_PREFIX + "SIMULATE_FAULTS",
        "simulateFaults",
        _path,
        "JSON-lines fault file the simulator follows",
    ),
    Setting(
        "sysfs_root", "--sysfs-root", ENV_PREFIX + "SYSFS_ROOT", "sysfsRoot", _path, "root of /sys to read"
    ),
    Setting(
        "no_kube",
        "--no-kube",
        ENV_PREFIX + "NO_KUBE",
        "noKube",
        _boolean,
        "run without a Kubernetes API (node side only)",
        is_flag=True,
    ),
    Setting(
        "log_format", "--log-format", ENV_PREFIX + "LOG_FORMAT", "logFormat", _choice(FORMATS), "log format"
    ),
    Setting("log_level", "--log-level", ENV_PREFIX + "LOG_LEVEL", "logLevel", _choice(LEVELS), "log level"),
    Setting(
        "shutdown_grace_s",
        "--shutdown-grace",
        ENV_PREFIX + "SHUTDOWN_GRACE",
        "shutdownGraceSeconds",
        _seconds("shutdown_grace_s"),
        "seconds servers get to finish on stop",
    ),
    Setting(
        "rediscover_interval_s",
        "--rediscover-interval",
        ENV_PREFIX + "REDISCOVER_INTERVAL",
        "rediscoverIntervalSeconds",
        _seconds("rediscover_interval_s"),
        "seconds between periodic rediscoveries",
    ),
    Setting(
        "registration_check_s",
        "--registration-check-interval",
        ENV_PREFIX + "REGISTRATION_CHECK_INTERVAL",
        "registrationCheckSeconds",
        _seconds("registration_check_s"),
        "seconds between pod-resources checks that kubelet lists our devices",
    ),
    Setting(
        "metrics_addr",
        "--metrics-addr",
        ENV_PREFIX + "METRICS_ADDR",
        "metricsAddr",
        _listen_addr,
        "HOST:PORT for /metrics, /healthz, /readyz ('' turns them off; default 0.0.0.0:9400)",
    ),
    Setting(
        "health_addr",
        "--health-addr",
        ENV_PREFIX + "HEALTH_ADDR",
        "healthAddr",
        _listen_addr,
        "HOST:PORT for /healthz, /readyz alone, on their own connections (kubelet's probes); '' turns it "
        "off (default 0.0.0.0:9401)",
    ),
    Setting(
        "metrics_format",
        "--metrics-format",
        ENV_PREFIX + "METRICS_FORMAT",
        "metricsFormat",
        _choice(("native", "dcgm")),
        "metric names: native gpuagent_* or dcgm-exporter's DCGM_FI_* (default native)",
    ),
    Setting(
        "metrics_interval_s",
        "--metrics-interval",
        ENV_PREFIX + "METRICS_INTERVAL",
        "metricsIntervalSeconds",
        _seconds("metrics_interval_s"),
        "seconds between NVML refreshes of the metrics cache (default 10)",
    ),
    Setting(
        "pod_resources_interval_s",
        "--pod-resources-interval",
        ENV_PREFIX + "POD_RESOURCES_INTERVAL",
        "podResourcesIntervalSeconds",
        _seconds("pod_resources_interval_s"),
        "seconds between pod-resources refreshes for metric pod labels (default 10)",
    ),
    Setting(
        "proc_root",
        "--proc-root",
        ENV_PREFIX + "PROC_ROOT",
        "procRoot",
        _path,
        "host /proc, to map processes of shared GPUs to pods (needs hostPID)",
    ),
    Setting(
        "dev_root",
        "--dev-root",
        ENV_PREFIX + "DEV_ROOT",
        "devRoot",
        _path,
        "host /dev, where the IMEX channel device nodes are (default /dev; --simulate: its own)",
    ),
    Setting(
        "pod_logs_root",
        "--pod-logs-root",
        ENV_PREFIX + "POD_LOGS_ROOT",
        "podLogsRoot",
        _path,
        "kubelet's /var/log/pods, to name the pods of those processes",
    ),
)

PLUGIN_OVERRIDES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # (CLI flag, env var, path inside the file's plugin sections)
    ("--mig-strategy", "MIG_STRATEGY", ("flags", "migStrategy")),
    ("--imex-channel-ids", "IMEX_CHANNEL_IDS", ("imex", "channelIDs")),  # NVIDIA's device plugin's names
    ("--imex-required", "IMEX_REQUIRED", ("imex", "required")),
    ("--imex-manage", "IMEX_MANAGE", ("imex", "manage")),
    ("--imex-daemon", "IMEX_DAEMON", ("imex", "daemon")),
    ("--imex-address", "IMEX_ADDRESS", ("imex", "address")),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", dest="config", metavar="FILE", help="config file (version: v1)")
    for s in SETTINGS:
        dest = s.field
        if s.is_flag:
            parser.add_argument(
                s.flag, dest=dest, action="store_const", const="true", help=f"{s.help} [{s.env}]"
            )
        else:
            parser.add_argument(s.flag, dest=dest, metavar="VALUE", help=f"{s.help} [{s.env}]")
    parser.add_argument(
        "--mig-strategy", dest="mig_strategy", choices=[m.value for m in MigStrategy], help="[MIG_STRATEGY]"
    )
    parser.add_argument(
        "--imex-channel-ids",
        dest="imex_channel_ids",
        metavar="IDS",
        help="IMEX channels every GPU container gets: '' (none) or 0 [IMEX_CHANNEL_IDS]",
    )
    parser.add_argument(
        "--imex-required",
        dest="imex_required",
        action="store_const",
        const="true",
        help="refuse to start without the IMEX channel device node [IMEX_REQUIRED]",
    )
    parser.add_argument(
        "--imex-manage",
        dest="imex_manage",
        action="store_const",
        const="true",
        help="keep the IMEX peer list equal to this node's NVLink clique and restart the daemon on "
        "membership changes [IMEX_MANAGE]",
    )
    parser.add_argument(
        "--imex-daemon",
        dest="imex_daemon",
        choices=DAEMONS,
        help="how the managed IMEX daemon runs: systemd service, child process, or none [IMEX_DAEMON]",
    )
    parser.add_argument(
        "--imex-address",
        dest="imex_address",
        metavar="IP",
        help="this node's IMEX address (default: the Node's InternalIP) [IMEX_ADDRESS]",
    )


def load_file(path: Path) -> dict[str, Any]:
    """Read a v1 config file; raises :class:`ConfigError` with one line for an unreadable or wrong file
    (not a regular file, not UTF-8, not YAML, beyond the limits of :mod:`topology.safeyaml` or
    ``MAX_CONFIG_BYTES``)."""
    try:
        raw = read_bytes(path, limit=MAX_CONFIG_BYTES)  # a FIFO or device is refused, never waited on
    except RefusedFileError as exc:  # not a regular file, or larger than MAX_CONFIG_BYTES
        raise ConfigError([f"{path}: {exc.strerror}"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    try:
        data = safeyaml.load(safeyaml.decode(raw, source=str(path)), source=str(path))
    except safeyaml.InputError as exc:
        raise ConfigError([str(exc)]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected a mapping at the top, got {type(data).__name__}"])
    version = data.get("version")
    if version != CONFIG_VERSION:
        raise ConfigError([f"{path}: version: expected {CONFIG_VERSION!r}, got {version!r}"])
    return data


def load_settings(args: argparse.Namespace, env: Mapping[str, str]) -> RunSettings:
    """Merge CLI > env > file > defaults; raises :class:`ConfigError` listing every problem."""
    config_path_text = getattr(args, "config", None) or env.get(ENV_PREFIX + "CONFIG")
    config_path = Path(config_path_text) if config_path_text else None
    data: dict[str, Any] = load_file(config_path) if config_path is not None else {}
    source = str(config_path) if config_path is not None else "config"
    problems: list[str] = []
    sections = {"version", HEALTH_SECTION, FABRIC_SECTION, DRA_SECTION}
    known = sections | {s.key for s in SETTINGS} | set(PLUGIN_SECTIONS)
    for key in sorted(_key_text(k) for k in data if k not in known):  # YAML keys may be ints or null
        problems.append(f"{source}: {key}: unknown key; valid: {', '.join(sorted(known))}")

    values: dict[str, Any] = {}
    for s in SETTINGS:
        raw: Any = getattr(args, s.field, None)
        where = s.flag
        if raw is None and s.env in env:
            raw, where = env[s.env], f"env {s.env}"
        if raw is None and s.key in data and data[s.key] is not None:
            raw, where = data[s.key], f"{source}: {s.key}"
            if isinstance(raw, list | dict):
                problems.append(
                    f"{where}: expected one value, got a {'list' if isinstance(raw, list) else 'mapping'}"
                )
                continue
            raw = str(raw).lower() if isinstance(raw, bool) else str(raw)
        if raw is None:
            continue
        try:
            values[s.field] = s.parse(str(raw))
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
    values.setdefault("node_name", socket.gethostname())

    plugin_data: dict[str, Any] = {k: data[k] for k in PLUGIN_SECTIONS if k in data}
    for flag, var, path in PLUGIN_OVERRIDES:
        override = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if override is None:  # an empty flag (``--imex-channel-ids ''``) still wins over the env
            override = env.get(var)
        if override is not None:
            section = dict(plugin_data.get(path[0]) or {})
            section[path[1]] = override
            plugin_data[path[0]] = section
    imex_section = plugin_data.get("imex")
    imex_agent: dict[str, Any] = {}
    if isinstance(imex_section, Mapping):
        imex_agent = {k: imex_section[k] for k in IMEX_AGENT_KEYS if k in imex_section}
    try:
        imex = parse_imex_manage(imex_agent, source=source)
    except ConfigError as exc:
        problems.extend(exc.problems)
        imex = ImexManageConfig()
    try:
        plugin = parse_plugin_config(plugin_data, source=source)
    except ConfigError as exc:
        problems.extend(exc.problems)
        plugin = PluginConfig()
    try:
        health = parse_health_config(data, source=source)
    except ConfigError as exc:
        problems.extend(exc.problems)
        health = HealthConfig()
    try:
        health = dataclasses.replace(health, fabric_policy=parse_fabric_policy(data, source=source))
    except ConfigError as exc:
        problems.extend(exc.problems)
    try:
        dra = parse_dra_config(data, source=source)
    except ConfigError as exc:
        problems.extend(exc.problems)
        dra = DraConfig()
    problems.extend(f"{source}: {p}" for p in shared_conflicts(dra, plugin))
    if values.get("simulate_faults") is not None and values.get("simulate") is None:
        problems.append("--simulate-faults: needs --simulate (faults are injected into the simulator)")
    values.setdefault("health_addr", DEFAULT_HEALTH_ADDR)
    metrics_addr = values.get("metrics_addr", RunSettings.__dataclass_fields__["metrics_addr"].default)
    clash = _same_port(metrics_addr, values["health_addr"])
    if clash:
        problems.append(f"--health-addr: {clash}; the health listener needs a port of its own")
    if problems:
        raise ConfigError(problems)
    return RunSettings(**values, config_file=config_path, plugin=plugin, health=health, dra=dra, imex=imex)


def parse_imex_manage(body: Mapping[str, Any], *, source: str = "config") -> ImexManageConfig:
    """The agent's keys of the ``imex`` section (flags and env give strings); :class:`ConfigError`
    naming each bad one."""
    problems: list[str] = []
    values: dict[str, Any] = {}

    def text(key: str, limit: int = 4096) -> str | None:
        value = body.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value or len(value) > limit or not value.isprintable():
            problems.append(f"{source}: imex.{key}: expected a non-empty string, got {str(value)[:60]!r}")
            return None
        return value

    def number(key: str) -> int | None:
        value = body.get(key)
        if value is None:
            return None
        if isinstance(value, str) and value.isdigit() and len(value) < 8:
            value = int(value)
        if type(value) is not int:
            problems.append(f"{source}: imex.{key}: expected an integer, got {str(value)[:60]!r}")
            return None
        return value

    manage = body.get("manage")
    if isinstance(manage, str) and manage.lower() in ("true", "false"):
        values["manage"] = manage.lower() == "true"
    elif isinstance(manage, bool):
        values["manage"] = manage
    elif manage is not None:
        problems.append(f"{source}: imex.manage: expected true or false, got {str(manage)[:60]!r}")
    for key, dest in (("daemon", "daemon"), ("service", "service"), ("address", "address"), ("ctl", "ctl")):
        got = text(key, 253)
        if got is not None:
            values[dest] = got
    path = text("nodesConfig")
    if path is not None:
        values["nodes_config"] = Path(path)
    command = body.get("command")
    if command is not None:
        if isinstance(command, str):
            command = command.split()
        if not isinstance(command, list) or not command or not all(isinstance(c, str) and c for c in command):
            problems.append(f"{source}: imex.command: expected a list of strings, got {str(command)[:60]!r}")
        else:
            values["command"] = tuple(command[:64])
    for key, dest in (("port", "port"), ("maxPeers", "max_peers")):
        got_n = number(key)
        if got_n is not None:
            values[dest] = got_n
    if problems:
        raise ConfigError(problems)
    try:
        return ImexManageConfig(**values)
    except ValueError as exc:
        raise ConfigError([f"{source}: {exc}"]) from None


def _key_text(key: Any) -> str:
    """A top-level key as a message shows it (as the plugin sections show theirs): text as it is, any
    other YAML key (``5``, ``null``) as its ``repr``; at most 64 characters."""
    text = key if isinstance(key, str) else repr(key)
    return text if len(text) <= 64 else text[:61] + "..."


def _same_port(metrics: str, health: str) -> str | None:
    """Why the two listeners cannot both bind (same port on overlapping addresses), else ``None``."""
    (m_host, _, m_port), (h_host, _, h_port) = metrics.rpartition(":"), health.rpartition(":")
    if not metrics or not health or m_port != h_port or int(h_port or 0) == 0:
        return None
    wildcard = ("", "0.0.0.0", "[::]", "::")
    if m_host == h_host or m_host in wildcard or h_host in wildcard:
        return f"{health} and --metrics-addr {metrics} use the same port"
    return None


def parse_health_config(data: Mapping[str, Any], *, source: str = "config") -> HealthConfig:
    """Validate the ``health`` section of a v1 config file (other sections are not read).

    Raises :class:`ConfigError` listing every problem as ``<source>: health.<key>: <what is wrong>``.
    """
    problems: list[str] = []
    r = SectionReader(problems)
    body = r.section(
        data,
        HEALTH_SECTION,
        "",
        {
            "ignoredXids",
            "extraIgnoredXids",
            "fabricUnhealthyMarksGpu",
            "recoveryQuietSeconds",
            "probeIntervalSeconds",
        },
    )
    ignored = _xids(body, "ignoredXids", problems)
    extra = _xids(body, "extraIgnoredXids", problems) or frozenset()
    health = HealthConfig(
        ignored_xids=(DEFAULT_IGNORED_XIDS if ignored is None else ignored) | extra,
        fabric_unhealthy_marks_gpu=r.boolean(
            body, "fabricUnhealthyMarksGpu", "health.fabricUnhealthyMarksGpu", False
        ),
        recovery_quiet_s=_health_seconds(r, body, "recoveryQuietSeconds", 120.0),
        probe_interval_s=_health_seconds(r, body, "probeIntervalSeconds", 5.0),
    )
    if problems:
        raise ConfigError([f"{source}: {p}" for p in problems])
    return health


def parse_fabric_policy(data: Mapping[str, Any], *, source: str = "config") -> FabricPolicy:
    """Validate the ``fabric`` section: each key a list of condition names (absent: the default)."""
    problems: list[str] = []
    body = SectionReader(problems).section(
        data, FABRIC_SECTION, "", {"unhealthyConditions", "degradedConditions"}
    )
    sets: dict[str, frozenset[FabricCondition]] = {}
    for key in ("unhealthyConditions", "degradedConditions"):
        if body.get(key) is None:
            continue
        try:
            sets[key] = parse_conditions(body[key], f"fabric.{key}")
        except ValueError as exc:
            problems.append(str(exc))
    policy = DEFAULT_FABRIC_POLICY
    if not problems:
        unhealthy = sets.get("unhealthyConditions", DEFAULT_FABRIC_POLICY.unhealthy)
        degraded = sets.get("degradedConditions", DEFAULT_FABRIC_POLICY.degraded - unhealthy)
        try:
            policy = FabricPolicy(unhealthy=unhealthy, degraded=degraded)
        except ValueError as exc:
            problems.append(f"fabric: {exc}")
    if problems:
        raise ConfigError([f"{source}: {p}" for p in problems])
    return policy


def _health_seconds(r: SectionReader, body: Mapping[str, Any], key: str, default: float) -> float:
    least, most = HEALTH_SECONDS[key]
    return r.number(body, key, f"health.{key}", default, minimum=least, maximum=most)


def _xids(body: Mapping[str, Any], key: str, problems: list[str]) -> frozenset[int] | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, list) and all(
        isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value
    ):
        return frozenset(value)
    problems.append(f"health.{key}: expected a list of positive XID numbers, got {value!r}")
    return None
