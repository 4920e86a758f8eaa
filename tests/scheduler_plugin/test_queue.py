"""The gang queue's decisions (``scheduler_plugin.queue``): order, reservation choice, backfill by time
limit, following the cluster, release, rebuild after a restart, and whole-gang preemption inside one
domain with the least GPU-time lost."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from scheduler_plugin.queue import (
    PodFacts,
    QueueConfig,
    QueueError,
    Reservation,
    Running,
    Waiting,
    decide,
    order,
    planner_place,
    rebuild,
    time_limit,
)
from scheduler_plugin.snapshot import ClusterSnapshot, Infeasible, NodeState
from tests.scheduler_plugin.placement.builders import gang, racks

NO_PREEMPT = QueueConfig(preempt_after_s=None)


def nodes_of(rack: int, *trays: int) -> list[str]:
    return [f"r{rack}-n{t:02d}" for t in trays]


def run(name: str, nodes: list[str], *, ends: float, started: float = 0.0, priority: int = 0) -> Running:
    return Running(name, priority, started, ends, dict.fromkeys(nodes, 4))


def wait(
    name: str, pods: int, *, created: float, limit: float | None = 1000.0, priority: int = 0, **kw: object
) -> Waiting:
    return Waiting(name, gang(pods, name=name, **kw), priority, created, limit)  # type: ignore[arg-type]


def busy(snapshot: ClusterSnapshot, running: dict[str, Running]) -> ClusterSnapshot:
    """``snapshot`` with the running gangs' GPUs taken."""
    used: dict[str, int] = {}
    for r in running.values():
        for n, g in r.claims.items():
            used[n] = used.get(n, 0) + g
    return ClusterSnapshot(
        tiers=snapshot.tiers,
        nodes=tuple(
            NodeState(name=n.name, gpus=n.gpus, free=n.gpus - used.get(n.name, 0), domains=n.domains)
            for n in snapshot.nodes
        ),
    )


def empty(*sizes: int) -> ClusterSnapshot:
    return racks(*[[4] * s for s in sizes])


# -- order ------------------------------------------------------------------------------------------


def test_order_is_priority_then_creation_then_name() -> None:
    ws = [
        wait("b", 1, created=5.0),
        wait("a", 1, created=5.0),
        wait("old", 1, created=1.0),
        wait("urgent", 1, created=9.0, priority=10),
    ]
    assert [w.name for w in order(ws)] == ["urgent", "old", "a", "b"]


# -- reservations -----------------------------------------------------------------------------------


def test_head_reserves_the_domain_that_frees_earliest() -> None:
    running = {
        "slow": run("slow", nodes_of(0, 0, 1), ends=500.0),
        "fast": run("fast", nodes_of(1, 0, 1), ends=100.0),
    }
    snap = busy(empty(4, 4), running)
    head = wait("head", 4, created=1.0, subgroup=4)
    d = decide(10.0, snap, running, [head], {}, place=planner_place(), config=NO_PREEMPT)
    r = d.reservations["head"]
    assert (r.start_s, r.domain) == (100.0, "nvl-1")
    assert sorted(r.claims) == nodes_of(1, 0, 1, 2, 3)
    assert r.waits_for == {"fast": 100.0}


def test_among_equal_times_the_reservation_blocks_the_least_other_work() -> None:
    # both racks free wholly at 100; rack 0 is half idle now, rack 1 fully busy until then: holding
    # rack 1 keeps nothing idle, holding rack 0 keeps 8 GPUs idle for 90 s
    running = {
        "a": run("a", nodes_of(0, 0, 1), ends=100.0),
        "b": run("b", nodes_of(1, 0, 1, 2, 3), ends=100.0),
    }
    snap = busy(empty(4, 4), running)
    head = wait("head", 4, created=1.0, subgroup=4)
    # the planner alone prefers rack 0 (by name) on the cluster as it will be at 100
    alone = planner_place()(empty(4, 4), head.gang)
    assert not isinstance(alone, Infeasible)
    assert all(n.startswith("r0") for n in alone.placement.values())
    d = decide(10.0, snap, running, [head], {}, place=planner_place(), config=NO_PREEMPT)
    r = d.reservations["head"]
    assert (r.start_s, r.domain, r.held_idle_gpu_s) == (100.0, "nvl-1", 0.0)


def test_work_without_a_time_limit_counts_as_never_ending() -> None:
    running = {
        "forever": run("forever", nodes_of(0, 0), ends=math.inf),
        "done": run("done", nodes_of(1, 0), ends=50.0),
    }
    snap = busy(empty(4, 4), running)
    head = wait("head", 4, created=1.0, subgroup=4)
    d = decide(0.0, snap, running, [head], {}, place=planner_place(), config=NO_PREEMPT)
    assert d.reservations["head"].domain == "nvl-1"
    only_forever = {"forever": running["forever"]}
    d2 = decide(
        0.0, busy(empty(4), only_forever), only_forever, [head], {}, place=planner_place(), config=NO_PREEMPT
    )
    assert d2.reservations == {}  # it can never fit: nothing is held for it


# -- backfill ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "starts"),
    [
        pytest.param(50.0, True, id="ends-before-the-reservation"),
        pytest.param(200.0, False, id="ends-after-it"),
        pytest.param(None, False, id="no-limit-never-ends"),
    ],
)
def test_backfill_on_reserved_nodes_only_when_it_ends_before_the_start(
    limit: float | None, starts: bool
) -> None:
    running = {"a": run("a", nodes_of(0, 2, 3), ends=100.0)}
    snap = busy(empty(4), running)
    head = wait("head", 4, created=1.0, subgroup=4)
    small = wait("small", 1, created=2.0, limit=limit)
    d = decide(10.0, snap, running, [head, small], {}, place=planner_place(), config=NO_PREEMPT)
    assert d.reservations["head"].start_s == 100.0
    assert [s.gang for s in d.starts] == (["small"] if starts else [])


def test_backfill_elsewhere_is_free_whatever_its_limit() -> None:
    running = {
        "a": run("a", nodes_of(0, 0, 1, 2, 3), ends=100.0),
        "b": run("b", nodes_of(1, 0, 1, 2, 3), ends=100.0),
        "c": run("c", nodes_of(2, 2, 3), ends=math.inf),
    }
    snap = busy(empty(4, 4, 4), running)
    head = wait("head", 4, created=1.0, subgroup=4)
    small = wait("small", 1, created=2.0, limit=None)
    d = decide(10.0, snap, running, [head, small], {}, place=planner_place(), config=NO_PREEMPT)
    held = d.reservations["head"]
    assert held.domain in {"nvl-0", "nvl-1"}
    (start,) = d.starts
    assert start.gang == "small"
    assert set(start.plan.placement.values()) <= set(nodes_of(2, 0, 1))


def test_reservation_is_never_given_to_later_gangs_of_the_same_priority() -> None:
    """Starvation is impossible: a stream of later gangs, none ending before the head's start, never
    takes its nodes, and the head starts when the work it waits for ends."""
    running = {"a": run("a", nodes_of(0, 0, 1), ends=100.0)}
    snap = busy(empty(4), running)
    head = wait("head", 4, created=0.0, subgroup=4)
    held: dict[str, Reservation] = {}
    for k in range(5):
        later = wait(f"later{k}", 1, created=1.0 + k, limit=500.0)
        d = decide(float(k), snap, running, [head, later], held, place=planner_place(), config=NO_PREEMPT)
        assert d.starts == ()
        held = dict(d.reservations)
    d = decide(100.0, empty(4), {}, [head], held, place=planner_place(), config=NO_PREEMPT)
    assert [s.gang for s in d.starts] == ["head"]
    assert d.released == ("head",)
    assert d.reservations == {}


# -- following the cluster and release --------------------------------------------------------------


def test_a_job_ending_early_moves_the_reservation_forward() -> None:
    running = {
        "a": run("a", nodes_of(0, 0, 1), ends=100.0),
        "a2": run("a2", nodes_of(0, 2), ends=80.0),
        "b": run("b", nodes_of(1, 0, 1, 2, 3), ends=300.0),
    }
    head = wait("head", 4, created=1.0, subgroup=4)
    first = decide(
        0.0, busy(empty(4, 4), running), running, [head], {}, place=planner_place(), config=NO_PREEMPT
    )
    r0 = first.reservations["head"]
    assert (r0.domain, r0.start_s, dict(r0.waits_for)) == ("nvl-0", 100.0, {"a": 100.0, "a2": 80.0})
    # a ends at 50, before its limit: the head still cannot start (a2 runs) but can by 80
    after = {k: v for k, v in running.items() if k != "a"}
    d = decide(
        50.0,
        busy(empty(4, 4), after),
        after,
        [head],
        first.reservations,
        place=planner_place(),
        config=NO_PREEMPT,
    )
    assert d.starts == ()
    assert (d.reservations["head"].domain, d.reservations["head"].start_s) == ("nvl-0", 80.0)
    # a reservation whose inputs did not change is kept as it is
    same = decide(
        60.0,
        busy(empty(4, 4), after),
        after,
        [head],
        d.reservations,
        place=planner_place(),
        config=NO_PREEMPT,
    )
    assert same.reservations["head"] is d.reservations["head"]


def test_a_lost_node_moves_the_reservation() -> None:
    running = {"a": run("a", nodes_of(0, 0), ends=100.0), "b": run("b", nodes_of(1, 0), ends=200.0)}
    head = wait("head", 4, created=1.0, subgroup=4)
    first = decide(
        0.0, busy(empty(4, 4), running), running, [head], {}, place=planner_place(), config=NO_PREEMPT
    )
    assert first.reservations["head"].domain == "nvl-0"
    snap = busy(empty(4, 4), running)
    gone = ClusterSnapshot(tiers=snap.tiers, nodes=tuple(n for n in snap.nodes if n.name != "r0-n03"))
    d = decide(1.0, gone, running, [head], first.reservations, place=planner_place(), config=NO_PREEMPT)
    r = d.reservations["head"]
    assert (r.domain, r.start_s) == ("nvl-1", 200.0)


def test_a_deleted_gang_releases_its_reservation() -> None:
    running = {"a": run("a", nodes_of(0, 0), ends=100.0)}
    head = wait("head", 4, created=1.0, subgroup=4)
    first = decide(
        0.0, busy(empty(4), running), running, [head], {}, place=planner_place(), config=NO_PREEMPT
    )
    d = decide(
        1.0,
        busy(empty(4), running),
        running,
        [],
        first.reservations,
        place=planner_place(),
        config=NO_PREEMPT,
    )
    assert d.released == ("head",)
    assert d.reservations == {}


# -- rebuild after a restart -------------------------------------------------------------------------


def test_rebuild_from_pods_and_node_annotations_gives_the_same_reservation() -> None:
    running = {
        "a": run("a", nodes_of(0, 0, 1), ends=100.0, started=0.0),
        "b": run("b", nodes_of(1, 0, 1), ends=300.0),
    }
    head = wait("head", 4, created=1.0, subgroup=4)
    snap = busy(empty(4, 4), running)
    before = decide(10.0, snap, running, [head], {}, place=planner_place(), config=NO_PREEMPT).reservations[
        "head"
    ]
    pods = [
        PodFacts(
            gang=r.name,
            priority=0,
            created_s=0.0,
            limit_s=r.ends_s - r.started_s,
            node=n,
            gpus=g,
            started_s=r.started_s,
        )
        for r in running.values()
        for n, g in r.claims.items()
    ]
    pods.append(PodFacts(gang="head", priority=0, created_s=1.0, limit_s=1000.0, node=None, gpus=4))
    annotations = dict.fromkeys(before.claims, "head") | {"r1-n03": "gone"}
    state = rebuild(20.0, snap, pods, [head], annotations, place=planner_place())
    assert state.running == running
    after = state.reservations["head"]
    assert (after.start_s, dict(after.claims), after.domain) == (
        before.start_s,
        dict(before.claims),
        before.domain,
    )
    assert state.stale_nodes == ("r1-n03",)
    # the rebuilt state gives the same next pass as the state never lost
    d1 = decide(20.0, snap, running, [head], {"head": before}, place=planner_place(), config=NO_PREEMPT)
    d2 = decide(
        20.0, snap, state.running, [head], state.reservations, place=planner_place(), config=NO_PREEMPT
    )
    assert d1.reservations.keys() == d2.reservations.keys()
    assert d1.starts == d2.starts


def test_time_limit_sources_and_bad_values() -> None:
    assert time_limit({}) is None
    assert time_limit({"gpuagent.dev/time-limit": "3600"}) == 3600.0
    assert (
        time_limit({"kueue.x-k8s.io/max-exec-time-seconds": "600", "gpuagent.dev/time-limit": "900"}, 700)
        == 600.0
    )
    assert time_limit({}, 120) == 120.0
    with pytest.raises(QueueError, match=r"ns/p: annotation gpuagent.dev/time-limit='soon'"):
        time_limit({"gpuagent.dev/time-limit": "soon"}, where="ns/p")
    with pytest.raises(QueueError, match="positive"):
        time_limit({"gpuagent.dev/time-limit": "-5"})
    with pytest.raises(QueueError, match="activeDeadlineSeconds"):
        time_limit({}, 0)
    with pytest.raises(QueueError, match="preempt_after_s"):
        QueueConfig(preempt_after_s=-1.0)


# -- preemption -------------------------------------------------------------------------------------


def preempt_case() -> tuple[ClusterSnapshot, dict[str, Running]]:
    """Rack 0: low gangs x (2 nodes, ran 100 s) and y (2 nodes, ran 50 s). Rack 1: z over all 4 nodes
    (ran 20 s: 320 GPU-s, the cheapest whole choice) ... and w spanning both racks (ran 1 s)."""
    running = {
        "x": run("x", nodes_of(0, 0, 1), ends=5000.0, started=0.0),
        "y": run("y", nodes_of(0, 2), ends=5000.0, started=50.0),
        "w": Running("w", 0, 99.0, 5000.0, {"r0-n03": 4, "r1-n03": 4}),
        "z": run("z", nodes_of(1, 0, 1, 2), ends=5000.0, started=80.0),
    }
    return busy(empty(4, 4), running), running


def test_preemption_waits_for_its_configured_wait() -> None:
    snap, running = preempt_case()
    hi = wait("hi", 2, created=50.0, priority=10, subgroup=2)
    d = decide(
        100.0, snap, running, [hi], {}, place=planner_place(), config=QueueConfig(preempt_after_s=60.0)
    )
    assert d.preemptions == ()
    assert d.wake_s == 110.0


def test_preemption_evicts_whole_gangs_with_least_gpu_time_lost_inside_one_domain() -> None:
    snap, running = preempt_case()
    hi = wait("hi", 2, created=0.0, priority=10, subgroup=2)
    d = decide(
        100.0, snap, running, [hi], {}, place=planner_place(), config=QueueConfig(preempt_after_s=60.0)
    )
    (pre,) = d.preemptions
    # w (8 GPUs x 1 s) frees one node in each rack: not enough in either alone; y + w frees 2 nodes of
    # rack 0 for 208 GPU-s, z alone 3 nodes of rack 1 for 240 GPU-s
    assert (pre.victims, pre.domain, pre.lost_gpu_s) == (("w", "y"), "nvl-0", 208.0)
    nodes = set(pre.plan.placement.values())
    assert nodes <= {"r0-n02", "r0-n03"}
    assert d.reservations["hi"].claims == dict.fromkeys(sorted(nodes), 4)
    assert d.starts == ()


def test_no_preemption_of_equal_or_higher_priority() -> None:
    snap, running = preempt_case()
    hi = wait("hi", 2, created=0.0, priority=0, subgroup=2)
    d = decide(100.0, snap, running, [hi], {}, place=planner_place(), config=QueueConfig(preempt_after_s=0.0))
    assert d.preemptions == ()


def test_greedy_victim_choice_beyond_the_exact_limit_is_still_whole_and_sufficient() -> None:
    snap, running = preempt_case()
    hi = wait("hi", 2, created=0.0, priority=10, subgroup=2)
    d = decide(
        100.0,
        snap,
        running,
        [hi],
        {},
        place=planner_place(),
        config=QueueConfig(preempt_after_s=0.0, exact_victims=0),
    )
    (pre,) = d.preemptions
    assert (pre.victims, pre.domain, pre.lost_gpu_s) == (("w", "y"), "nvl-0", 208.0)


@pytest.mark.parametrize("seed", range(12))
def test_preemption_is_optimal_against_brute_force(seed: int) -> None:
    """Random small clusters of whole-node gangs: the chosen victims are a least-lost set among all sets
    inside one rack that let the planner place the gang, and every victim is a whole gang."""
    rng = random.Random(seed)
    snap0 = empty(4, 4, 4)
    names = [n.name for n in snap0.nodes]
    free_nodes = list(names)
    rng.shuffle(free_nodes)
    running: dict[str, Running] = {}
    k = 0
    while free_nodes:
        size = rng.choice([1, 1, 2, 3])
        nodes, free_nodes = free_nodes[:size], free_nodes[size:]
        if rng.random() < 0.15:
            continue  # leave them idle
        running[f"j{k}"] = Running(
            f"j{k}", rng.choice([0, 0, 5, 20]), float(rng.randint(0, 90)), 1e6, dict.fromkeys(nodes, 4)
        )
        k += 1
    snap = busy(snap0, running)
    need = rng.choice([2, 3, 4])
    hi = wait("hi", need, created=0.0, priority=10, subgroup=need)
    place = planner_place()
    d = decide(100.0, snap, running, [hi], {}, place=place, config=QueueConfig(preempt_after_s=0.0))
    lower = [r for r in running.values() if r.priority < 10]
    best = math.inf
    for size in range(len(lower) + 1):
        for combo in itertools.combinations(lower, size):
            cost = sum(r.gpus * (100.0 - r.started_s) for r in combo)
            if cost >= best:
                continue
            freed = {n for r in combo for n in r.claims}
            for rack in range(3):
                inside = {n for n in names if n.startswith(f"r{rack}-")}
                nodes = tuple(
                    NodeState(
                        name=n.name,
                        gpus=4,
                        free=(n.free + (4 if n.name in freed else 0)) if n.name in inside else 0,
                        domains=n.domains,
                    )
                    for n in snap.nodes
                )
                if not isinstance(place(ClusterSnapshot(tiers=snap.tiers, nodes=nodes), hi.gang), Infeasible):
                    best = cost
                    break
    started_now = [s.gang for s in d.starts]
    if started_now:
        assert started_now == ["hi"]
        assert d.preemptions == ()
        return
    if best == math.inf:
        assert d.preemptions == ()
        return
    (pre,) = d.preemptions
    assert pre.lost_gpu_s == pytest.approx(best)
    assert set(pre.victims) <= {r.name for r in lower}
    racks_used = {n.split("-")[0] for n in pre.plan.placement.values()}
    assert len(racks_used) == 1
    # evicting exactly the victims (whole) frees room for the plan on every node it uses
    freed_gpus = {n: g for v in pre.victims for n, g in running[v].claims.items()}
    free_now = {n.name: n.free for n in snap.nodes}
    for node in pre.plan.placement.values():
        assert free_now[node] + freed_gpus.get(node, 0) >= 4


def test_reserve_after_lets_later_gangs_pass_a_young_head_then_holds_for_it() -> None:
    running = {"a": run("a", nodes_of(0, 2, 3), ends=100.0)}
    snap = busy(empty(4), running)
    head = wait("head", 4, created=0.0, subgroup=4)
    long = wait("long", 1, created=1.0, limit=500.0)
    config = QueueConfig(preempt_after_s=None, reserve_after_s=30.0)
    young = decide(10.0, snap, running, [head, long], {}, place=planner_place(), config=config)
    assert [s.gang for s in young.starts] == ["long"]
    assert young.reservations == {}
    assert young.wake_s == 30.0
    old = decide(30.0, snap, running, [head, long], {}, place=planner_place(), config=config)
    assert old.starts == ()
    assert old.reservations["head"].start_s == 100.0
    with pytest.raises(QueueError, match="reserve_after_s"):
        QueueConfig(reserve_after_s=math.inf)


def test_a_young_heads_wake_is_always_after_now_even_where_the_sum_rounds() -> None:
    """created + after rounds to now while now - created < after (29574.963966907064 + 3600): the gang
    is judged grown at once, and never asks to be woken at now (a simulator waking at now never advanced)."""
    created = 29574.963966907064
    now = created + 3600.0
    assert now - created < 3600.0  # the rounding this test is about
    running = {"a": run("a", nodes_of(0, 2, 3), ends=now + 100.0)}
    snap = busy(empty(4), running)
    head = wait("head", 4, created=created, subgroup=4)
    config = QueueConfig(preempt_after_s=None, reserve_after_s=3600.0)
    d = decide(now, snap, running, [head], {}, place=planner_place(), config=config)
    assert d.wake_s > now
    assert "head" in d.reservations


# -- preemption guards: no thrashing -----------------------------------------------------------------


def drive(
    until: float,
    running: dict[str, Running],
    arrivals: list[Waiting],
    config: QueueConfig,
    step: float = 20.0,
) -> tuple[dict[str, int], dict[str, float], dict[str, float]]:
    """A tiny cluster loop around ``decide`` on two 4-node racks: work ends at its limit, an evicted
    gang is queued again under its creation time and restarts from nothing. Returns evictions per gang,
    start and end times."""
    base = empty(4, 4)
    place = planner_place()
    evictions: dict[str, int] = {}
    started: dict[str, float] = {}
    ended: dict[str, float] = {}
    back: dict[str, Waiting] = {}
    resv: dict[str, Reservation] = {}
    limits = {r.name: r.ends_s - r.started_s for r in running.values()}
    limits.update({w.name: w.limit_s or math.inf for w in arrivals})
    t = 0.0
    while t <= until:
        for name in [n for n, r in running.items() if r.ends_s <= t]:
            ended[name] = running.pop(name).ends_s
        waiting = [*back.values(), *(w for w in arrivals if w.created_s <= t and w.name not in started)]
        d = decide(t, busy(base, running), running, waiting, resv, place=place, config=config)
        by_name = {w.name: w for w in waiting}
        for pre in d.preemptions:
            for v in pre.victims:
                gone = running.pop(v)
                evictions[v] = evictions.get(v, 0) + 1
                back[v] = Waiting(v, gang(len(gone.claims), name=v), gone.priority, 0.0, limits[v])
        for name, p in [(s.gang, s.plan) for s in d.starts] + [(p.gang, p.plan) for p in d.preemptions]:
            w = by_name[name]
            claims: dict[str, int] = {}
            for node in p.placement.values():
                claims[node] = claims.get(node, 0) + 4
            running[name] = Running(name, w.priority, t, t + limits[name], claims, evictions.get(name, 0))
            started[name] = t
            back.pop(name, None)
        resv = dict(d.reservations)
        t += step
    return evictions, started, ended


def thrash_case() -> tuple[dict[str, Running], list[Waiting]]:
    """Rack 0: low gang ``big`` (4 nodes, 3,000 s of work). Rack 1: a low gang that has run for a day
    and runs a day more (costly to evict). A high-priority one-node gang (300 s) arrives every 1,000 s."""
    running = {
        "big": run("big", nodes_of(0, 0, 1, 2, 3), started=0.0, ends=3000.0),
        "old": run("old", nodes_of(1, 0, 1, 2, 3), started=-86400.0, ends=86400.0),
    }
    stream = [wait(f"hp{k}", 1, created=400.0 + 1000.0 * k, limit=300.0, priority=10) for k in range(6)]
    return running, stream


def test_a_gang_evicted_once_is_not_evicted_again_and_again() -> None:
    """Without the guards ``big`` restarts after each small high-priority gang and the next one evicts
    it again: six evictions, never done. With them it is evicted at most once and finishes."""
    running, stream = thrash_case()
    unguarded = QueueConfig(preempt_after_s=60.0, preempt_loss_ratio=None, max_evictions=None)
    evictions, _, ended = drive(7000.0, dict(running), stream, unguarded)
    assert evictions.get("big", 0) >= 5  # the thrashing the guards are for
    assert "big" not in ended
    evictions, started, ended = drive(7000.0, dict(running), stream, QueueConfig(preempt_after_s=60.0))
    assert evictions == {"big": 1}
    assert "big" in ended
    assert all(w.name in started for w in stream)  # every high-priority gang still started


def test_the_eviction_cap_alone_stops_the_repeats() -> None:
    running, stream = thrash_case()
    capped = QueueConfig(preempt_after_s=60.0, preempt_loss_ratio=None, max_evictions=2)
    evictions, _, ended = drive(7000.0, dict(running), stream, capped)
    assert evictions["big"] == 2
    assert "big" in ended
    # with no bound on the loss the stream then evicts ``old`` (a day of work) for 300 s gangs: why the
    # default keeps both guards
    assert evictions["old"] >= 1


def worth_case() -> tuple[ClusterSnapshot, dict[str, Running]]:
    """Rack 0: ``big`` (4 nodes, ran 100 s). Rack 1: ``soon`` (2 nodes, ends at 200) and ``long`` (2 nodes,
    ran a day)."""
    running = {
        "big": run("big", nodes_of(0, 0, 1, 2, 3), started=0.0, ends=5000.0),
        "soon": run("soon", nodes_of(1, 0, 1), started=-1000.0, ends=200.0),
        "long": run("long", nodes_of(1, 2, 3), started=-86400.0, ends=86400.0),
    }
    return busy(empty(4, 4), running), running


@pytest.mark.parametrize(
    ("ratio", "victims"),
    [
        pytest.param(1.0, (), id="waits-for-its-start"),
        pytest.param(2.0, ("big",), id="twice-the-wait-covers-it"),
        pytest.param(None, ("big",), id="no-bound"),
    ],
)
def test_a_preemption_must_be_worth_the_wait(ratio: float | None, victims: tuple[str, ...]) -> None:
    """The gang (8 GPUs) starts at 200 on rack 1 anyway: 100 s x 8 GPUs of waiting is worth less than
    the 1,600 GPU-s ``big`` would lose (the cheapest victim set), unless the bound allows twice that."""
    snap, running = worth_case()
    hi = wait("hi", 2, created=0.0, priority=10, subgroup=2)
    config = QueueConfig(preempt_after_s=60.0, preempt_loss_ratio=ratio)
    d = decide(100.0, snap, running, [hi], {}, place=planner_place(), config=config)
    assert tuple(v for p in d.preemptions for v in p.victims) == victims
    if not victims:
        assert d.reservations["hi"].start_s == 200.0


def test_a_gang_that_never_fits_on_what_frees_may_preempt_at_any_loss() -> None:
    snap, running = worth_case()
    running = {n: Running(n, r.priority, r.started_s, math.inf, r.claims) for n, r in running.items()}
    hi = wait("hi", 2, created=0.0, priority=10, subgroup=2)
    d = decide(
        100.0, snap, running, [hi], {}, place=planner_place(), config=QueueConfig(preempt_after_s=60.0)
    )
    (pre,) = d.preemptions
    assert pre.victims == ("big",)


def test_a_gang_younger_than_the_minimum_run_is_no_victim() -> None:
    snap, running = preempt_case()
    hi = wait("hi", 2, created=0.0, priority=10, subgroup=2)
    config = QueueConfig(preempt_after_s=60.0, min_run_before_preempt_s=60.0)
    d = decide(100.0, snap, running, [hi], {}, place=planner_place(), config=config)
    (pre,) = d.preemptions
    # y (ran 50 s), w (1 s) and z (20 s) are too young: x (ran 100 s) frees two nodes of rack 0
    assert (pre.victims, pre.domain, pre.lost_gpu_s) == (("x",), "nvl-0", 800.0)


@pytest.mark.parametrize(
    ("cap", "victims"), [pytest.param(1, ("z",), id="capped"), pytest.param(None, ("w", "y"), id="no-cap")]
)
def test_a_gang_evicted_max_evictions_times_is_no_victim(cap: int | None, victims: tuple[str, ...]) -> None:
    snap, running = preempt_case()
    running = {
        n: Running(n, r.priority, r.started_s, r.ends_s, r.claims, 1 if n in "wy" else 0)
        for n, r in running.items()
    }
    hi = wait("hi", 2, created=0.0, priority=10, subgroup=2)
    config = QueueConfig(preempt_after_s=60.0, max_evictions=cap)
    d = decide(100.0, snap, running, [hi], {}, place=planner_place(), config=config)
    (pre,) = d.preemptions
    assert pre.victims == victims


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"preempt_loss_ratio": -1.0}, id="negative-ratio"),
        pytest.param({"preempt_loss_ratio": math.nan}, id="nan-ratio"),
        pytest.param({"min_run_before_preempt_s": -1.0}, id="negative-min-run"),
        pytest.param({"min_run_before_preempt_s": math.inf}, id="endless-min-run"),
        pytest.param({"min_run_before_preempt_s": math.nan}, id="nan-min-run"),
        pytest.param({"max_evictions": -1}, id="negative-cap"),
    ],
)
def test_bad_preemption_guards_are_refused_by_name(kwargs: dict[str, float]) -> None:
    with pytest.raises(QueueError, match=next(iter(kwargs))):
        QueueConfig(**kwargs)  # type: ignore[arg-type]


def test_a_reservation_of_a_lower_class_gives_way_to_a_higher_gang() -> None:
    """Strict priority: the idle capacity held for a low-priority head goes to a high-priority gang that
    arrives (no eviction needed); the low reservation is planned again around it; a gang of the head's
    own class still may not take it."""
    running = {"a": run("a", nodes_of(0, 0, 1), ends=100.0)}
    snap = busy(empty(4), running)
    low = wait("low", 4, created=0.0, subgroup=4)
    first = decide(5.0, snap, running, [low], {}, place=planner_place(), config=NO_PREEMPT)
    assert first.reservations["low"].start_s == 100.0
    same = wait("same", 1, created=10.0, limit=1000.0)
    held = decide(
        10.0, snap, running, [low, same], first.reservations, place=planner_place(), config=NO_PREEMPT
    )
    assert held.starts == ()
    high = wait("high", 1, created=10.0, limit=1000.0, priority=10)
    d = decide(10.0, snap, running, [low, high], first.reservations, place=planner_place(), config=NO_PREEMPT)
    assert [s.gang for s in d.starts] == ["high"]
    assert d.reservations["low"].start_s == 1010.0  # planned again in the pass, after ``high`` ends


def test_a_higher_head_takes_over_the_nodes_a_lower_reservation_held() -> None:
    running = {"a": run("a", nodes_of(0, 0, 1), ends=100.0)}
    snap = busy(empty(4), running)
    low = wait("low", 4, created=0.0, subgroup=4)
    first = decide(5.0, snap, running, [low], {}, place=planner_place(), config=NO_PREEMPT)
    high = wait("high", 4, created=10.0, priority=10, subgroup=4)
    d = decide(10.0, snap, running, [low, high], first.reservations, place=planner_place(), config=NO_PREEMPT)
    assert list(d.reservations) == ["high"]
    assert d.reservations["high"].start_s == 100.0  # where the low head would have started
    assert d.released == ("low",)  # planned again when it is the head
