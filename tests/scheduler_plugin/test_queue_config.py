"""``QueueConfig``: the queue's and the extender's queue settings, checked once, each refusal naming its
field (``QueueError.field``)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from scheduler_plugin.queue import QueueConfig, QueueError


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"preempt_after_s": math.inf}, id="endless-preempt-after"),
        pytest.param({"preempt_after_s": -1.0}, id="negative-preempt-after"),
        pytest.param({"preempt_loss_ratio": math.inf}, id="endless-ratio"),
        pytest.param({"reserve_after_s": math.nan}, id="nan-reserve-after"),
        pytest.param({"reserve_after_limits": -2.0}, id="negative-multiple"),
        pytest.param({"max_evictions": QueueConfig.MAX_EVICTIONS_CAP + 1}, id="cap-too-large"),
        pytest.param({"max_evictions": -1}, id="negative-cap"),
        pytest.param({"exact_victims": -1}, id="negative-exact-victims"),
        pytest.param({"max_plans": 0}, id="no-plans"),
        pytest.param({"interval_s": 0.0}, id="interval-zero"),
        pytest.param({"interval_s": 7200.0}, id="interval-two-hours"),
        pytest.param({"interval_s": math.nan}, id="interval-nan"),
        pytest.param({"enforce_time_limits": "sometimes"}, id="enforce-mode"),
        pytest.param({"time_limit_grace_s": -1.0}, id="negative-grace"),
        pytest.param({"time_limit_grace_s": math.inf}, id="endless-grace"),
        pytest.param({"preempt_namespaces": frozenset({"ML"})}, id="namespace-upper"),
        pytest.param({"preempt_namespaces": frozenset({"a", "x" * 64})}, id="namespace-long"),
        pytest.param({"preempt_namespaces": frozenset({"*"})}, id="namespace-star"),
        pytest.param({"preempt_namespaces": frozenset()}, id="namespaces-none-given"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_field(kwargs: dict[str, Any]) -> None:
    (name,) = kwargs
    with pytest.raises(QueueError, match=f"^{name} must be") as err:
        QueueConfig(**kwargs)
    assert err.value.field == name


def test_the_defaults_and_good_settings_are_kept() -> None:
    d = QueueConfig()
    assert (d.interval_s, d.preempt_namespaces, d.enforce_time_limits, d.time_limit_grace_s) == (
        1.0,
        None,
        "held",
        60.0,
    )
    q = QueueConfig(
        preempt_after_s=None,
        preempt_loss_ratio=None,
        max_evictions=None,
        interval_s=0.05,
        preempt_namespaces=frozenset({"ml", "batch-2"}),
        enforce_time_limits="off",
        time_limit_grace_s=0.0,
    )
    assert q.preempt_namespaces == frozenset({"ml", "batch-2"})
    assert q.enforce_time_limits in QueueConfig.ENFORCE_MODES


def test_a_long_bad_value_is_shown_cut() -> None:
    with pytest.raises(QueueError) as err:
        QueueConfig(enforce_time_limits="x" * 10_000)
    assert len(str(err.value)) < 200
