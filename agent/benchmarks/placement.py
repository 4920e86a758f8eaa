"""``gpu-node-agent bench placement``: our planner against the anchors' placement algorithms.

Runs one seeded job stream through the simulator once per policy, with each policy's own queue in its
default configuration (``policies.OWN_QUEUE``: ours is the extender's queue, ``scheduler_plugin.queue``;
the anchors' are cited in their modules) and again with one queue for all (like for like: FIFO with
EASY backfill, see ``sim``), then a small-instance study against the integer-program optimum, and
prints the tables with the machine it ran on. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from agent.benchmarks.machine import machine_summary
from scheduler_plugin.placement import failures, frontier, optimum, report, workloads
from scheduler_plugin.placement import shapes as clusters
from scheduler_plugin.placement.metrics import SIZE_CLASSES, figures, paired
from scheduler_plugin.placement.policies import OWN_QUEUE, POLICIES
from scheduler_plugin.placement.policies.base import TierBlind
from scheduler_plugin.placement.sim import BACKFILL, SimulationError, simulate
from scheduler_plugin.queue import QueueConfig, QueueError

TABLES: tuple[str, ...] = ("own", "like")

DEFAULT_JOBS = {"nvl72": 2000, "philly": 0, "mixed": 8000}  # 0: the whole Philly trace
# nvl72: 3 seeds since each policy also runs with its own queue (Slurm's node reservations cost about
# 200 s per 64-rack seed alone); 10 seeds as issue 8 ran them take --seeds 10
DEFAULT_SEEDS = {"nvl72": 3, "philly": 1, "mixed": 3}
QUICK_JOBS = {"nvl72": 150, "philly": 600, "mixed": 400}
# --frontier: (racks, jobs) per workload, sized so that every setting and anchor runs on each of
# FRONTIER_SEEDS seeds in minutes on two cores; Philly's jobs are small, so a small cluster saturates
FRONTIER_SIZE = {"nvl72": (16, 400), "philly": (4, 2500), "mixed": (8, 1200)}
FRONTIER_QUICK_SIZE = {"nvl72": (4, 60), "philly": (1, 200), "mixed": (2, 200)}
FRONTIER_SEEDS = 8
FAILURE_SEEDS = 5
FAILURE_SIZE = (16, 300)  # (racks, jobs) of the tray-failure study; quick: FAILURE_QUICK_SIZE
FAILURE_QUICK_SIZE = (4, 60)
REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO.parent / "shared" / "data"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-node-agent bench placement", description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=workloads.WORKLOADS, default="nvl72")
    p.add_argument(
        "--cluster", choices=clusters.SHAPES, default="nvl72", help="cluster shape (default nvl72)"
    )
    p.add_argument(
        "--racks", type=int, default=None, help="size in NVL72-rack equivalents (default 64; quick 16)"
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="jobs in the stream (default: nvl72 2000, philly the whole trace, mixed 8000)",
    )
    p.add_argument("--load", type=float, default=0.95, help="offered load the arrivals are scaled to")
    p.add_argument(
        "--backfill",
        choices=BACKFILL,
        default="count",
        help="the like-for-like queue: the head's reservation by GPU count (default), or its policy's "
        "own plan on the nodes as they free up (reserve; slower)",
    )
    p.add_argument(
        "--tables",
        default="own,like",
        help="which tables: own (each policy with its own queue), like (one queue for all, --backfill); "
        "default both, own first",
    )
    p.add_argument(
        "--high-priority",
        type=float,
        default=0.0,
        help="share of jobs in a high PriorityClass (e.g. 0.2); reports their wait, preemptions",
    )
    p.add_argument(
        "--preempt-after",
        type=float,
        default=QueueConfig().preempt_after_s,
        help="seconds a gang waits before our queue may preempt lower-priority gangs for it "
        f"(default {QueueConfig().preempt_after_s:g}: the extender's)",
    )
    p.add_argument(
        "--reserve-after",
        type=float,
        default=QueueConfig().reserve_after_s,
        help="seconds a gang waits before our queue holds nodes back for it "
        f"(default {QueueConfig().reserve_after_s:g}, 0: at once; the extender's --reserve-after)",
    )
    p.add_argument(
        "--reserve-after-limits",
        type=float,
        default=QueueConfig().reserve_after_limits,
        metavar="K",
        help="besides, a gang holds nothing back until it has waited K times its own time limit "
        "(default: off; the extender's --reserve-after-limits)",
    )
    p.add_argument(
        "--no-tiers",
        action="store_true",
        help="every policy places the jobs with their tier constraints dropped (a topology-blind gang "
        "scheduler): what the constraints cost in allocation and wait; NVL-local then counts the "
        "jobs' subgroups that still landed in one NVLink domain",
    )
    p.add_argument("--seed", type=int, default=1, help="first seed")
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="seeds to average over (default: nvl72 3, mixed 3, philly 1; quick 1)",
    )
    p.add_argument("--workers", type=int, default=None, help="simulation processes (default: up to 2 CPUs)")
    p.add_argument(
        "--policies", default=",".join(POLICIES), help="comma-separated subset of: " + ", ".join(POLICIES)
    )
    p.add_argument(
        "--optimum-instances", type=int, default=None, help="small instances (default 12; quick 3)"
    )
    p.add_argument("--optimum-time-limit", type=float, default=20.0, help="seconds per integer program")
    p.add_argument(
        "--data-dir", type=Path, default=DEFAULT_DATA, help=f"Philly data (default {DEFAULT_DATA})"
    )
    p.add_argument(
        "--frontier",
        nargs="?",
        const="nvl72,philly",
        default=None,
        metavar="WORKLOADS",
        help="the queue's trade-off instead of the tables: ours at each --frontier-settings, every other "
        "policy at its own queue, per workload (default nvl72,philly; sizes in FRONTIER_SIZE), seed by "
        f"seed (default {FRONTIER_SEEDS} seeds)",
    )
    p.add_argument(
        "--frontier-settings",
        default=frontier.DEFAULT_SETTINGS,
        help="our queue's dial for --frontier, comma-separated settings of up to three parts joined by "
        "'/': S (hold back after S seconds), Kx (after K times the gang's time limit), Ri (a younger "
        "gang holds at once when its hold keeps idle at most R times its own GPU-time), nofill (fill_holes "
        f"off), e.g. 3600/2x, 345600/0.02i, 21600/1i/nofill (default {frontier.DEFAULT_SETTINGS})",
    )
    p.add_argument(
        "--tray-failures",
        action="store_true",
        help="the tray-failure study instead of the tables: trays fail and return (scheduler_plugin/"
        "placement/failures.py), every gang system at its own behaviour when a tray fails under a running "
        "gang; NVL72 mix on --racks (default 16) racks, --jobs (default 300) jobs, paired over --seeds "
        f"(default {FAILURE_SEEDS})",
    )
    p.add_argument(
        "--tray-mtbf-h",
        type=float,
        default=failures.DEFAULT_MTBF_H,
        help="mean hours a tray runs between failures (default 16,200: Meta's Llama 3 paper, 419 unexpected "
        "interruptions in 54 days on 16,384 H100s, ~78%% hardware, per 4-GPU tray)",
    )
    p.add_argument(
        "--tray-repair-h",
        type=float,
        default=failures.DEFAULT_REPAIR_H,
        help="mean hours a failed tray is down (default 24: an assumption, a swap within a working day; "
        "the Llama 3 paper gives no repair time)",
    )
    p.add_argument(
        "--checkpoint-min",
        type=float,
        default=failures.DEFAULT_CHECKPOINT_S / 60,
        help="minutes of progress between a job's checkpoints (default 30)",
    )
    p.add_argument(
        "--ours-repair-wait-h",
        type=float,
        default=failures.DEFAULT_OURS_WAIT_H,
        help="--tray-failures: hours ours waits for a tray in the gang's NVLink domain (default "
        f"{failures.DEFAULT_OURS_WAIT_H:g}: the extender's --repair-wait default; 0: at once); then "
        "--ours-after-wait",
    )
    p.add_argument(
        "--ours-after-wait",
        choices=failures.AFTER_WAIT,
        default="afresh",
        help="--tray-failures: what ours does once that wait is over: afresh (the gang's controller "
        "restarts it; placed afresh), any (gpuagent.dev/repair: any: the lost pods go to any domain), "
        "wait (keep waiting for ever)",
    )
    p.add_argument("--quick", action="store_true", help="CI-sized run")
    p.add_argument("--json", type=Path, help="write the figures as JSON here")
    p.add_argument("--markdown", type=Path, help="write a Markdown table here")
    p.add_argument("--plot", type=Path, help="write a PNG comparison plot here")
    return p


# the queue flags, applied to QueueConfig() in this order: (flag, QueueConfig field, argparse dest)
_QUEUE_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--preempt-after", "preempt_after_s", "preempt_after"),
    ("--reserve-after", "reserve_after_s", "reserve_after"),
    ("--reserve-after-limits", "reserve_after_limits", "reserve_after_limits"),
)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    names = _policy_names(args.policies)
    if names is None:
        return 2
    config = _queue_config(args)
    if config is None:
        return 2
    if args.frontier is not None:
        return _frontier(args, names, config)
    if args.tray_failures:
        return _tray_failures(args, names)
    return _tables(args, names, config)


def _policy_names(policies: str) -> list[str] | None:
    """The ``--policies`` asked for, or None (said on stderr) when one is unknown or none is given."""
    names = [n.strip() for n in policies.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        print(
            f"bench placement: --policies: unknown {unknown or names}; valid: {', '.join(POLICIES)}",
            file=sys.stderr,
        )
        return None
    return names


def _queue_config(args: argparse.Namespace) -> QueueConfig | None:
    """Our queue's settings from its flags (``_QUEUE_FLAGS``, in order), or None (the first bad flag
    said on stderr)."""
    config = QueueConfig()
    for flag, name, dest in _QUEUE_FLAGS:
        try:
            config = dataclasses.replace(config, **{name: getattr(args, dest)})
        except QueueError as err:
            print(f"bench placement: {flag}: {err}", file=sys.stderr)
            return None
    return config


@dataclasses.dataclass(frozen=True)
class _TableRun:
    """The sizes of a tables run, each from its flag or the (quick) default."""

    racks: int
    count: int  # jobs per stream (0: the whole Philly trace)
    instances: int  # small instances against the optimum
    seeds: list[int]
    workers: int
    tables: list[str]


def _table_run(args: argparse.Namespace) -> _TableRun | None:
    """The run's sizes, or None (said on stderr) when one is out of range."""
    quick = args.quick
    n_seeds = args.seeds if args.seeds is not None else (1 if quick else DEFAULT_SEEDS[args.workload])
    workers = args.workers if args.workers is not None else min(2, _usable_cpus())
    if n_seeds < 1 or workers < 1:
        print("bench placement: --seeds and --workers must be >= 1", file=sys.stderr)
        return None
    tables = [t.strip() for t in args.tables.split(",") if t.strip()]
    if not tables or any(t not in TABLES for t in tables) or len(set(tables)) != len(tables):
        print(f"bench placement: --tables: {args.tables!r}; give own, like or own,like", file=sys.stderr)
        return None
    return _TableRun(
        racks=args.racks if args.racks is not None else (16 if quick else 64),
        count=args.jobs if args.jobs is not None else (QUICK_JOBS if quick else DEFAULT_JOBS)[args.workload],
        instances=args.optimum_instances if args.optimum_instances is not None else (3 if quick else 12),
        seeds=list(range(args.seed, args.seed + n_seeds)),
        workers=workers,
        tables=tables,
    )


def _seed_streams(
    args: argparse.Namespace,
    cluster: clusters.Cluster,
    workload: str,
    *,
    count: int,
    seeds: Sequence[int],
    philly: workloads.PhillyData | None,
) -> dict[int, list[workloads.Job]]:
    """Each seed's job stream of ``workload`` on ``cluster`` at the run's load and priorities."""
    return {
        seed: workloads.build(
            workload,
            count=count,
            seed=seed,
            load=args.load,
            capacity=cluster.total_gpus,
            nvlink_domain_gpus=cluster.tier1_domain_gpus(),
            tier_gpus=cluster.largest_domain_gpus(),
            fits=cluster.fits_empty,
            philly=philly,
            high_priority=args.high_priority,
        )
        for seed in seeds
    }


def _streams(
    args: argparse.Namespace, run: _TableRun
) -> tuple[clusters.Cluster, dict[int, list[workloads.Job]]]:
    """The cluster and each seed's job stream (ValueError, OSError: a bad size or missing data)."""
    cluster = clusters.build(args.cluster, run.racks)
    philly = workloads.load_philly(args.data_dir) if args.workload != "nvl72" else None
    count = run.count
    count = count if count > 0 else len(philly.jobs) if philly else 0
    streams = _seed_streams(args, cluster, args.workload, count=count, seeds=run.seeds, philly=philly)
    return cluster, streams


def _tables(args: argparse.Namespace, names: list[str], config: QueueConfig) -> int:
    """The tables: each policy with its own queue and/or one queue for all, then the small study."""
    run = _table_run(args)
    if run is None:
        return 2
    try:
        cluster, streams = _streams(args, run)
    except (ValueError, OSError) as err:
        print(f"bench placement: {err}", file=sys.stderr)
        return 2
    machine = machine_summary()
    print(machine, file=sys.stderr)
    doc = _tables_doc(args, run, machine, cluster, streams[run.seeds[0]])
    try:
        done = _simulate_all(args, run, names=names, config=config, cluster=cluster, streams=streams)
    except SimulationError as err:
        print(f"bench placement: {err}", file=sys.stderr)
        return 1
    timelines = _fill_tables(doc, args, run, names, done)
    if run.instances > 0:
        _small_study(doc, names, run.instances, args.optimum_time_limit, args.seed)
    md = report.markdown(doc)
    print(md)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    if args.markdown:
        args.markdown.write_text(md, encoding="utf-8")
    if args.plot:
        report.plot(doc, timelines, args.plot)
    return 0


def _tables_notes(args: argparse.Namespace, run: _TableRun, jobs: list[workloads.Job]) -> list[str]:
    """What the tables' reader needs to know: the queues, the window, the seeds, the workload."""
    tables, seeds, workers = run.tables, run.seeds, run.workers
    span_h = jobs[-1].arrival_s / 3600
    longest_h = max(j.runtime_s for j in jobs) / 3600
    queue_note = {
        "count": "queue: FIFO with EASY backfill on GPU counts, the same for every policy "
        "(runtimes known exactly)",
        "reserve": "queue: FIFO with EASY backfill, the head reserving the nodes of its policy's own plan "
        "at the first completion time it fits (node-based reservation), the same for every gang policy; "
        "kube-default keeps the GPU-count rule (runtimes known exactly)",
    }[args.backfill]
    own_note = (
        "own queues: ours = the extender's queue (scheduler_plugin.queue: head reservation on the domains "
        f"that free earliest and block least, backfill by time limit, gang preemption after "
        f"{args.preempt_after:g} s, holding back for a gang after {args.reserve_after:g} s"
        + (
            f" and {args.reserve_after_limits:g} x its time limit"
            if args.reserve_after_limits is not None
            else ""
        )
        + "); "
        "slurm = EASY backfill with node reservations from its own plan; "
        "volcano, kueue, kube-default = greedy (every job that fits starts, nothing held); kai = greedy "
        "with KAI's preempt action (whole lower-priority jobs, lowest priority and latest started first). "
        "Jobs in priority order, then arrival; time limits = runtimes. Sources in each policy module"
    )
    notes = [
        *([own_note] if "own" in tables else []),
        ("like for like: " if "own" in tables and "like" in tables else "") + queue_note,
        f"arrivals scaled to offered load {args.load} over {span_h:.1f} h (seed {seeds[0]}); figures "
        "time-weighted over the last 75 % of the arrival span (first 25 % is warm-up)",
        f"figures are means over seeds {seeds[0]}..{seeds[-1]} (per-seed values in the JSON); "
        f"{workers} worker process(es), so plan times are measured with {workers} simulation(s) running",
        "alloc counts GPUs held by partly placed gangs (kube-default): allocated but idle",
    ]
    if span_h < 2 * longest_h:
        notes.append(
            f"the arrival span ({span_h:.1f} h) is short against the longest runtime ({longest_h:.1f} h): "
            "the cluster is still filling, so allocation stays under the offered load"
        )
    if args.no_tiers:
        notes.append(
            "tiers dropped (--no-tiers): every policy places the jobs without their subgroup and gang "
            "tiers; NVL-local counts the subgroups that still landed in one NVLink domain"
        )
    if args.workload in ("philly", "mixed"):
        notes.append(
            "Philly jobs: arrivals and GPU counts from philly-jobs-seed0.tsv (first jobs in arrival order); "
            "runtimes SAMPLED from philly-runtimes.csv (not joined per job in the sources), "
            "clamped to [60 s, 1 day]"
        )
    if args.workload in ("nvl72", "mixed"):
        notes.append("NVL72 mix: synthetic, parameters in scheduler_plugin/placement/workloads.py")
    return notes


def _tables_doc(
    args: argparse.Namespace,
    run: _TableRun,
    machine: str,
    cluster: clusters.Cluster,
    jobs: list[workloads.Job],
) -> dict[str, Any]:
    """The tables' JSON document before the figures (``jobs``: the first seed's stream)."""
    return {
        "benchmark": "placement",
        "machine": machine,
        "workload": args.workload,
        "cluster": {
            "shape": cluster.shape,
            "racks": run.racks,
            "nodes": len(cluster.nodes),
            "gpus": cluster.total_gpus,
            "tier1_domains": len(cluster.domains(cluster.tiers[0])),
        },
        "jobs": len(jobs),
        "load": args.load,
        "backfill": args.backfill,
        "tables": run.tables,
        "high_priority": args.high_priority,
        "preempt_after_s": args.preempt_after,
        "reserve_after_s": args.reserve_after,
        "reserve_after_limits": args.reserve_after_limits,
        "no_tiers": args.no_tiers,
        "seed": args.seed,
        "seeds": run.seeds,
        "quick": args.quick,
        "notes": _tables_notes(args, run, jobs),
        "policies": {},
    }


def _queue_of(args: argparse.Namespace, table: str, name: str) -> tuple[str, str]:
    """(queue, preemption) of a policy in a table: its own, or the like-for-like ``--backfill``."""
    return OWN_QUEUE[name] if table == "own" else (args.backfill, "none")


_Done = dict[tuple[str, str, int], tuple[dict[str, Any], Any]]  # (table, policy, seed) -> (figures, timeline)


def _simulate_all(
    args: argparse.Namespace,
    run: _TableRun,
    *,
    names: list[str],
    config: QueueConfig,
    cluster: clusters.Cluster,
    streams: dict[int, list[workloads.Job]],
) -> _Done:
    """Every (table, policy, seed), in worker processes unless there is one worker."""
    tasks = [(table, name, seed) for table in run.tables for seed in run.seeds for name in names]
    one = partial(_simulate_one, no_tiers=args.no_tiers, config=config)
    done: _Done = {}
    if run.workers == 1:
        for table, name, seed in tasks:
            done[(table, name, seed)] = one(cluster, streams[seed], name, seed, *_queue_of(args, table, name))
        return done
    with ProcessPoolExecutor(
        max_workers=run.workers, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        futures = {
            pool.submit(one, cluster, streams[seed], name, seed, *_queue_of(args, table, name)): (
                table,
                name,
                seed,
            )
            for table, name, seed in tasks
        }
        for fut, key in futures.items():
            done[key] = fut.result()
    return done


def _fill_tables(
    doc: dict[str, Any], args: argparse.Namespace, run: _TableRun, names: list[str], done: _Done
) -> dict[str, Any]:
    """Put each table's means, per-seed figures and pairings into ``doc``; the first table's
    timelines (first seed) per policy."""
    tables, seeds = run.tables, run.seeds
    timelines: dict[str, Any] = {}
    anchors = [n for n in names if n != "ours" and POLICIES[n]().gang]
    for table in tables:
        part: dict[str, Any] = {"queue": _queue_words(table, args.backfill), "policies": {}}
        for name in names:
            runs = [done[(table, name, seed)][0] for seed in seeds]
            part["policies"][name] = {
                **_mean(runs),
                "queue": "/".join(_queue_of(args, table, name)),
                "per_seed": [{"seed": s, **r} for s, r in zip(seeds, runs, strict=True)],
            }
            if table == tables[0]:
                timelines[name] = done[(table, name, seeds[0])][1]
        if "ours" in names and anchors and len(seeds) > 1:
            ours = [done[(table, "ours", seed)][0] for seed in seeds]
            part["paired"] = {n: paired(ours, [done[(table, n, seed)][0] for seed in seeds]) for n in anchors}
        if table == tables[0]:
            doc["queues"] = part["queue"]
            doc["policies"] = part["policies"]
            if "paired" in part:
                doc["paired"] = part["paired"]
        else:
            doc["like_for_like"] = part
    return timelines


def _frontier(args: argparse.Namespace, names: list[str], config: QueueConfig) -> int:
    """``--frontier``: ours at each setting of its dial and every other policy at its own queue, per
    workload, on the same seeds; the aim judged per anchor (``scheduler_plugin.placement.frontier``)."""
    wanted = [w.strip() for w in str(args.frontier).split(",") if w.strip()]
    bad = [w for w in wanted if w not in workloads.WORKLOADS]
    if bad or not wanted or len(set(wanted)) != len(wanted):
        print(
            f"bench placement: --frontier: {args.frontier!r}; give workloads from "
            f"{', '.join(workloads.WORKLOADS)}, each once",
            file=sys.stderr,
        )
        return 2
    if "ours" not in names:
        print("bench placement: --frontier: --policies must include ours", file=sys.stderr)
        return 2
    try:
        settings = frontier.parse_settings(args.frontier_settings)
    except frontier.FrontierError as err:
        print(f"bench placement: --frontier-settings: {err}", file=sys.stderr)
        return 2
    n_seeds = args.seeds if args.seeds is not None else (2 if args.quick else FRONTIER_SEEDS)
    workers = args.workers if args.workers is not None else min(2, _usable_cpus())
    if n_seeds < 1 or workers < 1:
        print("bench placement: --seeds and --workers must be >= 1", file=sys.stderr)
        return 2
    seeds = list(range(args.seed, args.seed + n_seeds))
    anchors = [n for n in names if n != "ours"]
    rows = [*(f"ours {s.label}" for s in settings), *anchors]
    try:
        philly = workloads.load_philly(args.data_dir) if set(wanted) - {"nvl72"} else None
        setups: dict[str, tuple[clusters.Cluster, dict[int, list[workloads.Job]]]] = {}
        for wl in wanted:
            racks, count = (FRONTIER_QUICK_SIZE if args.quick else FRONTIER_SIZE)[wl]
            racks = args.racks if args.racks is not None else racks
            count = args.jobs if args.jobs is not None else count
            cluster = clusters.build(args.cluster, racks)
            setups[wl] = (cluster, _seed_streams(args, cluster, wl, count=count, seeds=seeds, philly=philly))
    except (ValueError, OSError) as err:
        print(f"bench placement: {err}", file=sys.stderr)
        return 2
    machine = machine_summary()
    print(machine, file=sys.stderr)
    started = time.perf_counter()
    tasks: list[tuple[str, str, int]] = [(wl, row, seed) for wl in wanted for seed in seeds for row in rows]
    by_label = {f"ours {s.label}": s for s in settings}

    def submit_args(wl: str, row: str, seed: int) -> tuple[Any, ...]:
        cluster, streams = setups[wl]
        if row in by_label:
            return (cluster, streams[seed], "ours", seed, *OWN_QUEUE["ours"])
        return (cluster, streams[seed], row, seed, *OWN_QUEUE[row])

    def run_config(row: str) -> QueueConfig:
        return by_label[row].config(config) if row in by_label else config

    done: dict[tuple[str, str, int], dict[str, Any]] = {}
    try:
        if workers == 1:
            for wl, row, seed in tasks:
                run = partial(_simulate_one, no_tiers=args.no_tiers, config=run_config(row))
                done[(wl, row, seed)] = run(*submit_args(wl, row, seed))[0]
        else:
            with ProcessPoolExecutor(
                max_workers=workers, mp_context=multiprocessing.get_context("spawn")
            ) as pool:
                futures = {
                    pool.submit(
                        partial(_simulate_one, no_tiers=args.no_tiers, config=run_config(row)),
                        *submit_args(wl, row, seed),
                    ): (wl, row, seed)
                    for wl, row, seed in tasks
                }
                for fut, key in futures.items():
                    done[key] = fut.result()[0]
    except SimulationError as err:
        print(f"bench placement: {err}", file=sys.stderr)
        return 1
    doc: dict[str, Any] = {
        "benchmark": "placement-frontier",
        "machine": machine,
        "settings": [s.label for s in settings],
        "default_setting": _default_label(settings),
        "anchors": anchors,
        "aim_anchors": [a for a in anchors if POLICIES[a]().gang],
        "load": args.load,
        "seed": args.seed,
        "seeds": seeds,
        "quick": args.quick,
        "preempt_after_s": args.preempt_after,
        "high_priority": args.high_priority,
        "no_tiers": args.no_tiers,
        "workloads": {},
    }
    for wl in wanted:
        cluster, streams = setups[wl]
        runs = {row: [done[(wl, row, seed)] for seed in seeds] for row in rows}
        ours = {s.label: runs[f"ours {s.label}"] for s in settings}
        doc["workloads"][wl] = {
            "cluster": {
                "shape": cluster.shape,
                "nodes": len(cluster.nodes),
                "gpus": cluster.total_gpus,
                "domain_gpus": cluster.tier1_domain_gpus(),
            },
            "jobs": len(streams[seeds[0]]),
            "rows": {
                row: {
                    "queue": _frontier_queue(row, by_label),
                    **_spread(runs[row]),
                    "per_seed": [{"seed": s, **r} for s, r in zip(seeds, runs[row], strict=True)],
                }
                for row in rows
            },
            "aims": {a: frontier.aim(ours, runs[a]) for a in anchors},
        }
    doc["aim_holds"] = all(
        bool(part["aims"][a]["holds"]) for part in doc["workloads"].values() for a in doc["aim_anchors"]
    )
    doc["wall_s"] = round(time.perf_counter() - started, 1)
    doc["notes"] = _frontier_notes(doc, workers)
    md = report.frontier_markdown(doc)
    print(md)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    if args.markdown:
        args.markdown.write_text(md, encoding="utf-8")
    if args.plot:
        report.frontier_plot(doc, args.plot)
    return 0


def _default_label(settings: tuple[frontier.Setting, ...]) -> str | None:
    """The label of the setting that is the extender's default (``QueueConfig()``), if it ran."""
    base = QueueConfig()
    for s in settings:
        if s.dial == (
            base.reserve_after_s,
            base.reserve_after_limits,
            base.reserve_idle_ratio,
            base.fill_holes,
        ):
            return s.label
    return None


def _frontier_queue(row: str, by_label: dict[str, frontier.Setting]) -> str:
    if row in by_label:
        s = by_label[row]
        parts = [f"reserve_after_s={s.reserve_after_s:g}"]
        if s.reserve_after_limits is not None:
            parts.append(f"reserve_after_limits={s.reserve_after_limits:g}")
        if s.reserve_idle_ratio is not None:
            parts.append(f"reserve_idle_ratio={s.reserve_idle_ratio:g}")
        if not s.fill_holes:
            parts.append("fill_holes=false")
        return "core (" + ", ".join(parts) + ")"
    return "/".join(OWN_QUEUE[row])


_SPREAD = ("allocation_ratio", "wait_mean_s", "wait_max_s", "wait_p95_s", "jct_mean_s")


def _spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and standard error over the seeds of the frontier's figures and of the wait per size class
    (over the seeds whose stream has that class)."""
    out: dict[str, Any] = {}
    for key in _SPREAD:
        values = [float(r[key]) for r in runs if isinstance(r.get(key), int | float)]
        if values:
            mean, se = frontier.mean_se(values)
            out[key] = {"mean": mean, "se": se}
    classes: dict[str, Any] = {}
    for c in SIZE_CLASSES:
        values = [float(r["wait_mean_by_class_s"][c]) for r in runs if c in r.get("wait_mean_by_class_s", {})]
        if values:
            mean, se = frontier.mean_se(values)
            classes[c] = {"mean": mean, "se": se}
    out["wait_mean_by_class_s"] = classes
    out["unstarted_jobs"] = sum(int(r.get("unstarted_jobs") or 0) for r in runs)
    out["gpus_conserved"] = all(bool(r.get("gpus_conserved")) for r in runs)
    return out


def _frontier_notes(doc: dict[str, Any], workers: int) -> list[str]:
    seeds = doc["seeds"]
    notes = [
        "ours = the extender's queue (scheduler_plugin.queue.decide) at each setting of its dial: S = a "
        "gang holds nothing back until it has waited S seconds (--reserve-after), Kx = until it has "
        "waited K times its own time limit (reserve_after_limits), S/Kx = the later of the two; Ri = "
        "besides, a younger gang holds at once when its hold keeps idle at most R times its own "
        "GPU-time (reserve_idle_ratio); nofill = fill_holes off; "
        "every other policy with its own queue in its default configuration (OWN_QUEUE, cited in each "
        "policy module); time limits = runtimes",
        f"figures: mean ± standard error over seeds {seeds[0]}..{seeds[-1]} (the same job streams for "
        "every row); time-weighted over the last 75 % of the arrival span",
        "aim per anchor: one setting of ours whose mean difference, seed by seed, is not worse on "
        "allocation, mean wait and largest wait at once (holds); within noise: none worse by two "
        "standard errors; the best setting shown",
        "size classes by the GPUs of a tier-1 (NVLink) domain D: small <= D/2 < one domain <= D < "
        "several domains",
        "kube-default places pods, not gangs: its allocation counts GPUs that partly placed gangs hold "
        "idle, so it is shown but is no anchor of the aim (the gang policies are)",
        f"{workers} worker process(es); wall time {doc['wall_s']:g} s",
    ]
    if "philly" in doc["workloads"] or "mixed" in doc["workloads"]:
        notes.append(
            "Philly jobs: arrivals and GPU counts from philly-jobs-seed0.tsv (first jobs in arrival "
            "order); runtimes SAMPLED per seed from philly-runtimes.csv, clamped to [60 s, 1 day]"
        )
    if "nvl72" in doc["workloads"] or "mixed" in doc["workloads"]:
        notes.append("NVL72 mix: synthetic, parameters in scheduler_plugin/placement/workloads.py")
    return notes


def _queue_words(table: str, backfill: str) -> str:
    if table == "own":
        return "each policy's own queue in its default configuration"
    return f"FIFO with EASY backfill for every policy ({backfill})"


def _simulate_one(  # noqa: PLR0917 -- one task's fields, submitted to a worker process
    cluster: clusters.Cluster,
    jobs: list[workloads.Job],
    name: str,
    seed: int,
    queue: str = "count",
    preempt: str = "none",
    *,
    no_tiers: bool = False,
    config: QueueConfig | None = None,
) -> tuple[dict[str, Any], Any]:
    """One policy on one stream (runs in a worker process when there are several)."""
    last = [-1]

    def progress(done: int, total: int) -> None:
        pct = 100 * done // max(1, total)
        if pct >= last[0] + 10:
            last[0] = pct
            print(f"  {name} (seed {seed}): {done}/{total} jobs done", file=sys.stderr, flush=True)

    print(
        f"simulating {name} (seed {seed}, {len(jobs)} jobs, {cluster.total_gpus} GPUs, queue {queue}, "
        f"preemption {preempt})",
        file=sys.stderr,
        flush=True,
    )
    started = time.perf_counter()
    policy = TierBlind(POLICIES[name]()) if no_tiers else POLICIES[name]()
    result = simulate(
        cluster,
        jobs,
        policy,
        clock=time.perf_counter,
        progress=progress,
        queue=queue,
        preempt=preempt,
        queue_config=config,
    )
    figs: dict[str, Any] = figures(result, domain_gpus=cluster.tier1_domain_gpus())
    figs["sim_wall_s"] = round(time.perf_counter() - started, 2)
    figs["gpus_conserved"] = result.released_all and result.max_allocated <= result.total_gpus
    return figs, result.timeline


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Numbers averaged over the seeds that have them (None if none has); flags true only if true for
    all; nested tables averaged key by key."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for r in runs for k in r):  # every key, first-seen order
        values = [r.get(key) for r in runs]
        present = [v for v in values if v is not None]
        if present and all(isinstance(v, bool) for v in present):
            out[key] = all(present)
        elif present and all(isinstance(v, dict) for v in present):
            out[key] = _mean(present)
        else:
            nums = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
            out[key] = sum(nums) / len(nums) if nums else None
    return out


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _banner_to_stderr() -> None:
    """HiGHS prints a banner on stdout when the first solver is made; send it to stderr instead."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        optimum.new_solver()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _small_study(doc: dict[str, Any], names: list[str], instances: int, limit: float, seed: int) -> None:
    print(f"small instances: {instances} integer programs", file=sys.stderr, flush=True)
    _banner_to_stderr()
    ratios: dict[str, list[float]] = {n: [] for n in names}
    of_set: dict[str, list[float]] = {n: [] for n in names}
    of_free: dict[str, list[float]] = {n: [] for n in names}
    opt_free: list[float] = []
    proven = 0
    for k in range(instances):
        inst = optimum.small_instance(seed * 1000 + k)
        best = optimum.solve(inst.snapshot, inst.gangs, time_limit_s=limit)
        proven += best.optimal
        opt_free.append(best.gpus / inst.free_gpus)
        # the optimum's own batch, in order: what placement alone loses (admission set aside)
        chosen = set(best.placed)
        its_set = optimum.Instance(
            snapshot=inst.snapshot,
            gangs=tuple(g for g in inst.gangs if g.name in chosen),
            free_gpus=inst.free_gpus,
        )
        for n in names:
            got = optimum.greedy_in_order(POLICIES[n](), inst)
            of_free[n].append(got / inst.free_gpus)
            ratios[n].append(got / best.bound if best.bound > 0 else 1.0)
            placed = optimum.greedy_in_order(POLICIES[n](), its_set)
            of_set[n].append(placed / best.gpus if best.gpus > 0 else 1.0)
        print(
            f"  instance {k}: optimum {best.gpus} GPUs (proven: {best.optimal})", file=sys.stderr, flush=True
        )
    for n in names:
        doc["policies"][n]["small_allocation_ratio"] = sum(of_free[n]) / instances
        doc["policies"][n]["optimum_ratio_mean"] = sum(ratios[n]) / instances
        doc["policies"][n]["optimum_ratio_min"] = min(ratios[n])
        doc["policies"][n]["optimum_set_ratio_mean"] = sum(of_set[n]) / instances
        doc["policies"][n]["optimum_set_ratio_min"] = min(of_set[n])
    doc["policies"]["optimum"] = {
        "basis": "small static instances only (integer program, HiGHS); other figures do not apply",
        "allocation_ratio": sum(opt_free) / instances,
        "small_allocation_ratio": sum(opt_free) / instances,
        "optimum_ratio_mean": 1.0,
        "optimum_ratio_min": 1.0,
        "optimum_set_ratio_mean": 1.0,
        "optimum_set_ratio_min": 1.0,
        **dict.fromkeys(("wait_mean_s", "wait_p95_s", "jct_mean_s", "nvlink_local_ratio")),
        **dict.fromkeys(("stranded_gpus_mean", "free_domains_mean", "plan_p50_ms", "plan_p99_ms")),
        "partial_gangs": 0,
    }
    doc["small_instances"] = {
        "instances": instances,
        "cluster": "4 NVL72 racks (2 per leaf), about half the racks partly busy",
        "proven_optimal": proven,
        "method": (
            "policies take the batch in order, skipping what they cannot place; ratio to the IP bound. "
            "'optimum's set': the same, given only the gangs the optimum places (placement alone)"
        ),
    }


def _tray_failures(args: argparse.Namespace, names: list[str]) -> int:
    """``--tray-failures``: every gang system at its own behaviour when trays fail (``failures``)."""
    systems = [n for n in names if n in failures.BEHAVIOUR]
    if "ours" not in systems or len(systems) < 2:
        print(
            "bench placement: --tray-failures compares ours with anchors among "
            + ", ".join(failures.BEHAVIOUR),
            file=sys.stderr,
        )
        return 2
    racks_default, jobs_default = FAILURE_QUICK_SIZE if args.quick else FAILURE_SIZE
    racks = args.racks if args.racks is not None else racks_default
    count = args.jobs if args.jobs is not None else jobs_default
    n_seeds = args.seeds if args.seeds is not None else (1 if args.quick else FAILURE_SEEDS)
    seeds = list(range(args.seed, args.seed + max(1, n_seeds)))
    try:
        cluster = clusters.build("nvl72", racks)
        cfgs = {
            seed: failures.FailureConfig(
                mtbf_h=args.tray_mtbf_h,
                repair_h=args.tray_repair_h,
                checkpoint_s=args.checkpoint_min * 60,
                seed=seed,
                ours_wait_h=args.ours_repair_wait_h,
                ours_after_wait=args.ours_after_wait,
            )
            for seed in seeds
        }
    except ValueError as err:
        print(f"bench placement: --tray-failures: {err}", file=sys.stderr)
        return 2
    # jobs that fit with 2 trays of every rack down (what a provider guarantees: 16 of 18)
    spare = dataclasses.replace(
        cluster, nodes=tuple(n for n in cluster.nodes if not n.name.endswith(("-t16", "-t17")))
    )
    machine = machine_summary()
    print(machine, file=sys.stderr)
    rows: dict[str, list[dict[str, float]]] = {n: [] for n in systems}
    for seed in seeds:
        jobs = workloads.build(
            "nvl72",
            count=count,
            seed=seed,
            load=args.load,
            capacity=cluster.total_gpus,
            nvlink_domain_gpus=cluster.tier1_domain_gpus(),
            tier_gpus=cluster.largest_domain_gpus(),
            fits=spare.fits_empty,
        )
        for name in systems:
            rows[name].append(
                failures.simulate_failures(cluster, jobs, POLICIES[name](), cfgs[seed]).summary()
            )
            print(f"seed {seed} {name} done", file=sys.stderr)
    doc = failures.report(rows, seeds=seeds, racks=racks, jobs=count, cfg=cfgs[seeds[0]], machine=machine)
    print(doc)
    if args.markdown:
        args.markdown.write_text(doc, encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "seeds": seeds, "runs": rows}, indent=2) + "\n")
    return 0
