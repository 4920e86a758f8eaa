"""The extender command's queue flags: defaults read from ``QueueConfig``, values checked by it (one line
naming the flag, exit 2), and ``--reserve-after-limits``."""

from __future__ import annotations

import dataclasses

import pytest

from agent.commands.extender import QUEUE_FLAGS, Settings, parse_settings, queue_default
from scheduler_plugin.queue import QueueConfig, QueueError


def test_settings_built_without_flags_carry_queue_config_s_defaults() -> None:
    s = Settings(
        host="127.0.0.1",
        port=0,
        kubeconfig=None,
        max_body_bytes=1024,
        watch_timeout_s=1,
    )
    assert s.queue_config() == QueueConfig()


def test_the_extender_settings_beside_the_queue_are_checked_by_queue_config_once() -> None:
    """The bind barrier, the plans' TTL and the repair wait have their defaults and checks in QueueConfig
    too: the flag's error is QueueConfig's, naming the flag."""
    q = parse_settings(["--barrier-timeout=7", "--reservation-ttl=9", "--repair-wait=0"]).queue_config()
    assert (q.barrier_timeout_s, q.reservation_ttl_s, q.repair_wait_s) == (7.0, 9.0, 0.0)
    for field in ("barrier_timeout_s", "reservation_ttl_s"):
        with pytest.raises(QueueError, match=field):
            QueueConfig(**{field: 0.0})
    with pytest.raises(QueueError, match="repair_wait_s"):
        QueueConfig(repair_wait_s=float("nan"))


def test_flag_defaults_are_written_as_the_flags_take_them() -> None:
    assert queue_default("preempt_after_s") == "600"
    assert queue_default("reserve_after_limits") == "off"
    assert queue_default("preempt_namespaces") == "*"
    assert queue_default("time_limit_grace_s") == "60"
    for name in QUEUE_FLAGS:  # each default read back through its flag is QueueConfig's
        flag, _ = QUEUE_FLAGS[name]
        got = getattr(parse_settings([f"{flag}={queue_default(name)}"]).queue_config(), name)
        assert got == getattr(QueueConfig(), name), flag


def test_reserve_after_limits_flag_reaches_the_queue_config() -> None:
    assert parse_settings([]).queue_config().reserve_after_limits is None
    q = parse_settings(["--reserve-after-limits", "2", "--reserve-after", "30"]).queue_config()
    assert q == dataclasses.replace(QueueConfig(), reserve_after_limits=2.0, reserve_after_s=30.0)
    assert parse_settings(["--reserve-after-limits", "OFF"]).reserve_after_limits is None


def test_reserve_idle_ratio_flag_reaches_the_queue_config() -> None:
    assert parse_settings([]).queue_config().reserve_idle_ratio is None
    q = parse_settings(["--reserve-idle-ratio", "0.02", "--reserve-after", "345600"]).queue_config()
    assert q == dataclasses.replace(QueueConfig(), reserve_idle_ratio=0.02, reserve_after_s=345600.0)
    assert parse_settings(["--reserve-idle-ratio", "Off"]).reserve_idle_ratio is None


def test_every_queue_setting_reaches_the_queue_config() -> None:
    s = parse_settings(
        [
            "--queue-interval=0.5",
            "--preempt-namespaces=ml,batch",
            "--enforce-time-limits=all",
            "--time-limit-grace=5",
        ]
    )
    q = s.queue_config()
    assert (q.interval_s, q.preempt_namespaces, q.enforce_time_limits, q.time_limit_grace_s) == (
        0.5,
        frozenset({"ml", "batch"}),
        "all",
        5.0,
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        pytest.param(
            ["--reserve-after-limits", "-1"],
            "extender: --reserve-after-limits: must be a finite number >= 0 or 'off', got -1.0",
            id="multiple-negative",
        ),
        pytest.param(
            ["--reserve-after-limits", "twice"],
            "extender: --reserve-after-limits: expected a number or 'off', got 'twice'",
            id="multiple-word",
        ),
        pytest.param(
            ["--reserve-idle-ratio", "nan"],
            "extender: --reserve-idle-ratio: must be a finite number >= 0 or 'off', got nan",
            id="idle-ratio-nan",
        ),
        pytest.param(
            ["--reserve-idle-ratio", "cheap"],
            "extender: --reserve-idle-ratio: expected a number or 'off', got 'cheap'",
            id="idle-ratio-word",
        ),
        pytest.param(
            ["--preempt-after", "inf"],
            "extender: --preempt-after: must be a finite number >= 0 or 'never', got inf",
            id="preempt-inf",
        ),
        pytest.param(
            ["--queue-interval", "7200"],
            "extender: --queue-interval: must be between 0.05 and 3600 seconds, got 7200.0",
            id="interval-long",
        ),
        pytest.param(
            ["--max-evictions", "2000000"],
            "extender: --max-evictions: must be between 0 and 1000000 or 'unlimited', got 2000000",
            id="evictions-over-cap",
        ),
    ],
)
def test_a_bad_queue_value_is_one_line_naming_the_flag(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err == line + "\n"
