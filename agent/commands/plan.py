"""``gpu-node-agent plan``: plan one gang on a cluster snapshot and print the plan as JSON.

``--cluster C.yaml`` reads a snapshot file; ``--from-cluster [--kubeconfig K]`` reads the live API
(nodes' allocatable ``nvidia.com/gpu``, bound pods' requests, HyperNodes, node-label fallback, and
GPUs through DRA: pools' GPUs, claims' allocations, as the extender counts them).
Exit 0 with ``{"feasible": ...}`` whether the gang fits or not; exit 2 with one line naming the
field for invalid input. Files are read within limits: regular files only, at most ``MAX_FILE_BYTES``
(64 MiB, room for a cluster of several hundred thousand nodes), and :mod:`topology.safeyaml`'s (UTF-8,
nesting, aliases, integer digits); a gang has at most ``MAX_GANG_PODS`` pods. A 100,000-node cluster
file plans in a few seconds (``gpu-node-agent bench planner --plan-file-nodes 100000``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from scheduler_plugin.formats import FormatError, gang_from_data, result_to_data, snapshot_from_data
from scheduler_plugin.planner import plan
from scheduler_plugin.snapshot import ClusterSnapshot, Gang
from topology import logs, safeyaml

MAX_FILE_BYTES = (
    64 * 1024 * 1024
)  # a 100,000-node cluster file is 12 MB (block YAML) to 25 MB (indented JSON)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"plan: {message}", file=sys.stderr)
        raise SystemExit(2)


def _load(path: str, what: str) -> Any:
    """A plan file's data: a regular file (a FIFO or device is refused, never waited on) of at most
    ``MAX_FILE_BYTES``, read by :mod:`topology.safeyaml`; :class:`FormatError` naming it otherwise."""
    try:
        text = safeyaml.read_text(path, limit=MAX_FILE_BYTES)
        return safeyaml.load(text, source=path)
    except OSError as exc:
        raise FormatError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    except safeyaml.InputError as exc:
        raise FormatError(f"{what}: {exc}") from None


def read_cluster(path: str) -> ClusterSnapshot:
    """The cluster file at ``path`` as a snapshot; :class:`FormatError` naming the file or field."""
    return snapshot_from_data(_load(path, "cluster"), "cluster")


def read_gang(path: str, tiers: tuple[str, ...]) -> Gang:
    """The gang file at ``path``, its tiers checked against ``tiers``; :class:`FormatError` likewise."""
    return gang_from_data(_load(path, "gang"), tiers, "gang")


DRA = "/apis/resource.k8s.io/v1/"  # GPUs pods get through claims (scheduler_plugin.claims)


def _live_snapshot(kubeconfig: str | None) -> ClusterSnapshot:
    """Nodes, pods, HyperNodes and the DRA objects (claims, templates, DeviceClasses, ResourceSlices)
    listed once through the one Kubernetes adapter; GPUs pods get through claims count as the extender
    counts them (:mod:`scheduler_plugin.claims`). No HyperNode CRD: none, so the node-label fallback
    applies; no ``resource.k8s.io/v1``: no claims."""
    from scheduler_plugin.claims import KINDS, book_of  # noqa: PLC0415 - only for --from-cluster
    from scheduler_plugin.cluster import snapshot_from_objects  # noqa: PLC0415
    from topology.kube import HYPERNODES, NODES, PODS, Kube, api_client_from  # noqa: PLC0415

    kube = Kube(api_client_from(kubeconfig))
    nodes, _ = kube.list(NODES)
    pods, _ = kube.list(PODS)
    hypernodes, _ = kube.list(HYPERNODES, missing_ok=True)
    dra = {kind: kube.list(DRA + kind, missing_ok=True)[0] for kind in KINDS}
    return snapshot_from_objects(nodes, pods, hypernodes, claims=book_of(dra))


def main(argv: list[str]) -> int:
    parser = _Parser(
        prog="gpu-node-agent plan",
        description="Plan one gang on a cluster snapshot; print the plan as JSON (see ARCHITECTURE.md).",
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--cluster", metavar="C.yaml", help="cluster snapshot file (tiers, nodes)")
    src.add_argument("--from-cluster", action="store_true", help="read the snapshot from the live API")
    parser.add_argument("--kubeconfig", metavar="K", help="kubeconfig for --from-cluster")
    parser.add_argument("--gang", metavar="G.yaml", required=True, help="gang file (name, tier, roles)")
    parser.add_argument("--indent", type=int, default=2, help="JSON indent (0: one line)")
    parser.add_argument("--log-format", choices=logs.FORMATS, default="auto", help="auto: text on a TTY")
    parser.add_argument("--log-level", choices=logs.LEVELS, default="warning")
    args = parser.parse_args(argv)
    logs.configure(args.log_format, args.log_level)
    if args.kubeconfig and not args.from_cluster:
        parser.error("--kubeconfig needs --from-cluster")
    try:
        if args.from_cluster:
            try:
                snapshot = _live_snapshot(args.kubeconfig)
            except Exception as exc:  # any API/config failure is one line and exit 2
                first = str(exc).splitlines()[0] if str(exc) else ""
                print(f"plan: --from-cluster: {type(exc).__name__}: {first}", file=sys.stderr)
                return 2
        else:
            snapshot = read_cluster(args.cluster)
        gang = read_gang(args.gang, snapshot.tiers)
    except FormatError as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return 2
    result = plan(snapshot, gang)
    print(json.dumps(result_to_data(result, snapshot.tiers), indent=args.indent or None))
    return 0
