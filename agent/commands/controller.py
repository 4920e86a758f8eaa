"""``gpu-node-agent controller``: build and apply the HyperNode tree, or print it / export it offline.

Offline (no cluster)::

    gpu-node-agent controller --once --from DIR [--output yaml|json]
    gpu-node-agent controller --once --from DIR --export slurm|kueue|labels --output FILE

``DIR`` holds GPUNode objects (``*.yaml``/``*.yml``/``*.json``, several per file allowed, as printed by
``discover --output gpunode`` or ``kubectl get gpunodes -o yaml``; Node objects there lend their labels),
``*.ibnetdiscover`` files and an optional ``mapping.yaml``. A file there that cannot be read (not UTF-8,
not YAML, beyond the limits of :mod:`topology.safeyaml`) stops the run with one line naming it (exit 2)
and leaves the last export file as it was; a malformed object in a file is skipped with one line.

In a cluster (kubeconfig or in-cluster service account)::

    gpu-node-agent controller [--leader-elect] [--lease-namespace NS] [--export ... --output FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any

from topology import logs, safeyaml
from topology.builder import FabricPolicy, Tree, desired_objects
from topology.controller import (
    COMPONENT,
    MAPPING_KEY,
    ControllerSettings,
    Inputs,
    TopologyController,
    build_from,
)
from topology.exports import kueue_objects, labels_objects, slurm_topology, yaml_stream
from topology.gpunode import API_VERSION, KIND
from topology.sources import SourceError, StaticMapping, node_labels_problem, parse_mapping

EXPORTS = ("slurm", "kueue", "labels")


class UsageError(ValueError):
    pass


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-node-agent controller", description=__doc__.split("\n\n")[0])
    p.add_argument("--once", action="store_true", help="reconcile (or print) once and exit")
    p.add_argument("--from", dest="from_dir", metavar="DIR", help="read GPUNodes and fabric files from DIR")
    p.add_argument(
        "--output",
        metavar="FORMAT|FILE",
        help="without --export: yaml (default) or json; with --export: the file to write ('-' = stdout)",
    )
    p.add_argument(
        "--export", choices=EXPORTS, help="write a Slurm topology.conf, Kueue Topology or node labels"
    )
    p.add_argument("--slurm-form", choices=("block", "tree"), default="block", help="topology.conf form")
    p.add_argument("--kueue-topology", default="gpu-node-agent", help="name of the Kueue Topology object")
    p.add_argument(
        "--unhealthy-fabric",
        choices=[m.value for m in FabricPolicy],
        default=FabricPolicy.ISOLATE.value,
        help="nodes whose fabric is incomplete or unhealthy: own domain (isolate), out of the tree, or kept",
    )
    p.add_argument(
        "--ibnetdiscover", action="append", default=[], metavar="FILE", help="ibnetdiscover output"
    )
    p.add_argument("--mapping", metavar="FILE", help="static mapping file (version: v1)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--leader-elect", action="store_true", help="reconcile only while holding the Lease")
    p.add_argument(
        "--lease-namespace", default="gpu-system", help="namespace of the Lease, fabric ConfigMaps, Events"
    )
    p.add_argument("--lease-name", default=COMPONENT)
    p.add_argument("--identity", help="leader-election identity (default: $POD_NAME, else the host name)")
    p.add_argument("--debounce", type=float, default=1.0, help="seconds without changes before a reconcile")
    p.add_argument("--max-delay", type=float, default=10.0, help="longest a change waits for its reconcile")
    p.add_argument("--dry-run", action="store_true", help="compute the writes, issue none")
    p.add_argument(
        "--metrics-addr",
        default="",
        metavar="HOST:PORT",
        help="serve /metrics (per NVLink domain: free, healthy, stranded GPUs, fragmentation), /healthz "
        "and /readyz here; '' (default) turns it off",
    )
    p.add_argument(
        "--no-nvlink-domains",
        dest="nvlink_domains",
        action="store_false",
        help="write no NVLinkDomain objects and no HyperNode condition (and watch no pods)",
    )
    p.add_argument(
        "--config", metavar="FILE", help="settings file (version: v1); CLI > GPU_TOPOLOGY_* env > file"
    )
    p.add_argument(
        "--log-format", choices=logs.FORMATS, default="auto", help="log lines: JSON, or text on a terminal"
    )
    p.add_argument("--log-level", choices=logs.LEVELS, default="info")
    return p


def read_dir(directory: pathlib.Path) -> tuple[Inputs, list[str]]:
    """GPUNodes, Nodes (for labels), ibnetdiscover files and mapping.yaml from one folder, and the
    objects skipped (one line each).

    A file that cannot be read as a whole (not UTF-8, not YAML, nested too deep, aliases repeating too
    much: :mod:`topology.safeyaml`) stops the run with one line naming it (exit 2), so an export built
    from the folder never silently lacks that file's nodes and the last good export file stays as it
    is. An object that is read but malformed (a GPUNode with a wrong field, a Node whose labels are not
    strings) is skipped with one line, as the controller does in a cluster. Files of other suffixes are
    not read at all."""
    if not directory.is_dir():
        raise UsageError(f"--from {directory}: not a directory")
    gpunodes: dict[str, dict[str, Any]] = {}
    nodes: dict[str, dict[str, Any]] = {}
    ibnet: list[tuple[str, str]] = []
    mapping: StaticMapping | None = None
    skipped: list[str] = []
    for path in sorted(directory.iterdir()):
        is_object_file = path.suffix in (".yaml", ".yml", ".json")
        if not path.is_file() or not (is_object_file or path.suffix == ".ibnetdiscover"):
            continue
        try:
            text = safeyaml.read_text(path)
            if path.suffix == ".ibnetdiscover":
                ibnet.append((str(path), text))
                continue
            if path.name == MAPPING_KEY:
                mapping = parse_mapping(text, source=str(path))
                continue
            docs = safeyaml.load_all(text, source=str(path))
        except safeyaml.InputError as exc:
            raise UsageError(str(exc)) from None
        for doc in docs:
            for obj in _objects(doc):
                meta = obj.get("metadata")
                raw_name = meta.get("name") if isinstance(meta, dict) else None
                name = raw_name if isinstance(raw_name, str) else ""
                if obj.get("kind") == KIND and obj.get("apiVersion") == API_VERSION:
                    if name and name in gpunodes:
                        raise UsageError(f"{path}: GPUNode {name!r} appears twice in {directory}")
                    gpunodes[name or f"{path}#{len(gpunodes)}"] = obj
                elif obj.get("kind") == "Node" and name:
                    problem = node_labels_problem(obj)
                    if problem:
                        skipped.append(f"Node {name!r} in {path}: {problem}")
                    else:
                        nodes[name] = obj
    inputs = Inputs(
        gpunodes=gpunodes,
        nodes=None if not nodes else _with_gpunodes(nodes, gpunodes),
        ibnet=tuple(ibnet),
        mapping=mapping,
    )
    return inputs, skipped


def _with_gpunodes(
    nodes: dict[str, dict[str, Any]], gpunodes: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Offline, Node files lend labels; they do not remove GPUNodes that have no Node file."""
    out = dict(nodes)
    for name in gpunodes:
        out.setdefault(name, {"metadata": {"name": name}})
    return out


def _objects(doc: Any) -> list[dict[str, Any]]:
    if (
        isinstance(doc, dict)
        and str(doc.get("kind", "")).endswith("List")
        and isinstance(doc.get("items"), list)
    ):
        return [o for o in doc["items"] if isinstance(o, dict)]
    if isinstance(doc, list):
        return [o for o in doc if isinstance(o, dict)]
    return [doc] if isinstance(doc, dict) else []


def render_export(tree: Tree, what: str, *, slurm_form: str, kueue_name: str) -> str:
    if what == "slurm":
        return slurm_topology(tree, form=slurm_form)
    if what == "kueue":
        return yaml_stream(kueue_objects(tree, name=kueue_name))
    return yaml_stream(labels_objects(tree))


def write_output(target: str, text: str) -> None:
    if target == "-":
        sys.stdout.write(text)
        return
    path = pathlib.Path(target)
    if path.is_file() and path.read_bytes() == text.encode("utf-8"):
        return  # unchanged: no write
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


# config file key / environment variable -> argparse destination, and how to read the value
SETTINGS: dict[str, tuple[str, str, Callable[[Any], Any]]] = {
    "unhealthyFabric": (
        "unhealthy_fabric",
        "GPU_TOPOLOGY_UNHEALTHY_FABRIC",
        lambda v: FabricPolicy(str(v)).value,
    ),
    "leaseNamespace": ("lease_namespace", "GPU_TOPOLOGY_LEASE_NAMESPACE", str),
    "leaseName": ("lease_name", "GPU_TOPOLOGY_LEASE_NAME", str),
    "debounceSeconds": ("debounce", "GPU_TOPOLOGY_DEBOUNCE_SECONDS", float),
    "maxDelaySeconds": ("max_delay", "GPU_TOPOLOGY_MAX_DELAY_SECONDS", float),
    "mapping": ("mapping", "GPU_TOPOLOGY_MAPPING", str),
    "ibnetdiscover": (
        "ibnetdiscover",
        "GPU_TOPOLOGY_IBNETDISCOVER",
        lambda v: [str(x) for x in v] if isinstance(v, list) else str(v).split(","),
    ),
    "slurmForm": ("slurm_form", "GPU_TOPOLOGY_SLURM_FORM", lambda v: _choice(str(v), ("block", "tree"))),
    "kueueTopology": ("kueue_topology", "GPU_TOPOLOGY_KUEUE_TOPOLOGY", str),
    "metricsAddr": ("metrics_addr", "GPU_TOPOLOGY_METRICS_ADDR", str),
}


def _choice(value: str, valid: tuple[str, ...]) -> str:
    if value not in valid:
        raise ValueError(f"{value!r} is not one of {', '.join(valid)}")
    return value


def file_and_env_defaults(config: str | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """Defaults from the config file (``version: v1``), overridden by ``GPU_TOPOLOGY_*`` variables;
    the command line overrides both. A bad value raises :class:`UsageError` naming it."""
    values: dict[str, Any] = {}
    if config:
        try:
            data = safeyaml.load(safeyaml.read_text(config), source=config)
        except OSError as exc:
            raise UsageError(f"--config {config}: {exc.strerror or exc}") from None
        except safeyaml.InputError as exc:
            raise UsageError(f"--config {exc}") from None
        if not isinstance(data, dict) or data.get("version") != "v1":
            raise UsageError(f"--config {config}: expected a mapping with version: v1")
        for key, value in data.items():
            if key == "version":
                continue
            if key not in SETTINGS:
                raise UsageError(f"--config {config}: unknown key {key!r}; valid: {', '.join(SETTINGS)}")
            dest, _, read = SETTINGS[key]
            try:
                values[dest] = read(value)
            except ValueError as exc:
                raise UsageError(f"--config {config}: {key}: {exc}") from None
    for _key, (dest, env, read) in SETTINGS.items():
        if env in environ:
            try:
                values[dest] = read(environ[env])
            except ValueError as exc:
                raise UsageError(f"{env}: {exc}") from None
    return values


def main(argv: list[str]) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    p = parser()
    try:
        p.set_defaults(**file_and_env_defaults(known.config, os.environ))
    except UsageError as exc:
        print(f"controller: {exc}", file=sys.stderr)
        return 2
    args = p.parse_args(argv)
    logs.configure(args.log_format, args.log_level)
    try:
        return _main(args)
    except (UsageError, SourceError, OSError) as exc:
        print(f"controller: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    policy = FabricPolicy(args.unhealthy_fabric)
    if args.export and not args.output:
        raise UsageError("--export needs --output FILE ('-' for stdout)")
    if not args.export and args.output not in (None, "yaml", "json"):
        raise UsageError(f"--output {args.output!r}: without --export it is yaml or json")
    try:
        static_ibnet = tuple((f, safeyaml.read_text(f)) for f in args.ibnetdiscover)
        static_mapping = (
            parse_mapping(safeyaml.read_text(args.mapping), source=args.mapping) if args.mapping else None
        )
    except safeyaml.InputError as exc:
        raise UsageError(str(exc)) from None
    if args.from_dir:
        if not args.once:
            raise UsageError("--from DIR works with --once (offline, no cluster)")
        inputs, skipped = read_dir(pathlib.Path(args.from_dir))
        inputs.ibnet = inputs.ibnet + static_ibnet
        inputs.mapping = inputs.mapping or static_mapping
        result = build_from(inputs, policy=policy)
        for problem in skipped + result.problems:
            print(f"controller: skipped: {problem}", file=sys.stderr)
        tree = result.tree
        for node, reason in tree.excluded.items():
            print(f"controller: {node}: {reason}", file=sys.stderr)
        for note in tree.notes:
            print(f"controller: note: {note}", file=sys.stderr)
        if args.export:
            write_output(
                args.output,
                render_export(tree, args.export, slurm_form=args.slurm_form, kueue_name=args.kueue_topology),
            )
            return 0
        objects = list(desired_objects(tree).values())
        if args.output == "json":
            print(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2))
        else:
            sys.stdout.write(yaml_stream(objects))
        return 0

    from topology.kube import Kube, api_client_from  # noqa: PLC0415 - the cluster path only

    export: Callable[[Tree], None] | None = None
    if args.export:
        what, target = args.export, args.output

        def export(tree: Tree) -> None:
            write_output(
                target, render_export(tree, what, slurm_form=args.slurm_form, kueue_name=args.kueue_topology)
            )

    identity = args.identity or os.environ.get("POD_NAME") or socket.gethostname()
    settings = ControllerSettings(
        policy=policy,
        namespace=args.lease_namespace,
        leader_elect=args.leader_elect and not args.once,
        lease_name=args.lease_name,
        identity=identity,
        debounce_s=args.debounce,
        max_delay_s=max(args.max_delay, args.debounce),
        dry_run=args.dry_run,
        static_ibnet=static_ibnet,
        static_mapping=static_mapping,
        export=export,
        domains=args.nvlink_domains,
    )
    controller = TopologyController(kube=Kube(api_client_from(args.kubeconfig)), settings=settings)
    if args.once:
        return _once(controller)
    asyncio.run(_serve(controller, metrics_addr=args.metrics_addr))
    return 0


def _once(controller: TopologyController) -> int:
    from topology.kube import KubeError  # noqa: PLC0415

    try:
        d = controller.reconcile_once()
    except KubeError as exc:
        raise UsageError(str(exc)) from None
    print(
        f"controller: {len(d.apply)} applied, {len(d.delete)} deleted, {d.unchanged} unchanged"
        f"{', ' + str(len(d.conflicts)) + ' conflicts' if d.conflicts else ''}"
        f"{' (dry run)' if controller.settings.dry_run else ''}",
        file=sys.stderr,
    )
    return 0


async def _serve(controller: TopologyController, *, metrics_addr: str = "") -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if not metrics_addr:
        await controller.run(stop)
        return
    server = metrics_server(controller, metrics_addr)
    await server.start()
    try:
        await controller.run(stop)
    finally:
        await server.stop()


def metrics_server(controller: TopologyController, addr: str) -> Any:
    """``/metrics`` (the NVLink domains and the controller's counters), ``/healthz``, ``/readyz`` (ready
    once every watch has listed) on ``addr``."""
    from agent.metrics.domains import controller_render  # noqa: PLC0415 - loads prometheus_client only here
    from agent.metrics.server import MetricsServer  # noqa: PLC0415

    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise UsageError(f"--metrics-addr {addr!r}: expected HOST:PORT")
    stats = controller.stats
    return MetricsServer(
        host=host.strip("[]") or "0.0.0.0",
        port=int(port),
        render=controller_render(
            lambda: controller.domains,
            lambda: {
                "reconciles": stats.reconciles,
                "writes": stats.writes,
                "failed_writes": stats.failed_writes,
            },
        ),
        readiness=[("watches", lambda: None if controller.synced() else "not every watch has listed yet")],
    )
