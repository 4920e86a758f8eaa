"""Hostile input to the gang queue core: time limits as the API may carry them, bad settings, and
state that names nodes the cluster no longer has. Bounded time and memory; each case well under 1 s."""

from __future__ import annotations

import math

import pytest

from scheduler_plugin.queue import (
    PodFacts,
    QueueConfig,
    QueueError,
    Running,
    Waiting,
    decide,
    planner_place,
    rebuild,
    time_limit,
)
from tests.scheduler_plugin.placement.builders import gang, racks


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("nan", id="nan"),
        pytest.param("inf", id="inf"),
        pytest.param("-inf", id="minus-inf"),
        pytest.param("", id="empty"),
        pytest.param("9" * 100_000, id="100k-digits"),
        pytest.param("1e999", id="overflow"),
        pytest.param("0", id="zero"),
        pytest.param("12h", id="unit"),
        pytest.param("\x00", id="nul"),
    ],
)
def test_a_bad_time_limit_is_one_error_naming_key_and_object(raw: str) -> None:
    with pytest.raises(QueueError) as err:
        time_limit({"gpuagent.dev/time-limit": raw}, where="team/train-7")
    text = str(err.value)
    assert "team/train-7" in text
    assert "gpuagent.dev/time-limit" in text
    assert len(text) < 400  # the value is shown shortened by repr, never echoed whole


@pytest.mark.parametrize(
    "kwargs",
    [
        {"preempt_after_s": math.nan},
        {"preempt_after_s": -0.5},
        {"reserve_after_s": math.nan},
        {"reserve_after_s": -1.0},
        {"exact_victims": -1},
        {"max_plans": 0},
    ],
)
def test_bad_queue_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(QueueError):
        QueueConfig(**kwargs)  # type: ignore[arg-type]


def test_state_naming_lost_nodes_is_ignored_not_fatal() -> None:
    snap = racks([4, 4, 0, 0])
    running = {
        "a": Running("a", 0, 0.0, 100.0, {"r0-n02": 4, "r0-n03": 4, "gone-node": 4}),
        "ghost": Running("ghost", 0, 0.0, 50.0, {"gone-node": 4}),
    }
    head = Waiting("head", gang(4, subgroup=4), 0, 1.0, 10.0)
    d = decide(
        5.0, snap, running, [head], {}, place=planner_place(), config=QueueConfig(preempt_after_s=None)
    )
    assert d.reservations["head"].start_s == 100.0
    assert "gone-node" not in d.reservations["head"].claims
    pods = [PodFacts("a", 0, 0.0, 100.0, "gone-node", 4, 0.0), PodFacts("head", 0, 1.0, 10.0, None, 4)]
    state = rebuild(5.0, snap, pods, [head], {"gone-node": "head", "r0-n00": "head"}, place=planner_place())
    assert state.reservations == {}  # one node left: the gang no longer fits there, planned afresh


def test_time_limit_field_is_not_a_string() -> None:
    with pytest.raises(QueueError, match="not a number"):
        time_limit({"kueue.x-k8s.io/max-exec-time-seconds": "ten"}, where="ns/p")
