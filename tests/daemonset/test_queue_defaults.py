"""The queue's defaults are written once, in ``QueueConfig``; the Helm chart's values.yaml and the kustomize
base write them again as the extender's flags, and each must read back as ``QueueConfig``'s own. The chart's
``scheduler.name`` reaches the extender as ``--scheduler-name``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.commands.extender import QUEUE, QUEUE_FLAGS, parse_settings
from scheduler_plugin.queue import QueueConfig
from tests.daemonset.test_manifests import DAEMONSET, by_key, render_helm

VALUES = DAEMONSET / "chart" / "gpu-node-agent" / "values.yaml"
BASE = DAEMONSET / "base"
DEPLOYMENT = ("Deployment", "gpu-system", "gpu-topology-scheduler")
SCHEDULER_CONFIG = ("ConfigMap", "gpu-system", "gpu-topology-scheduler-config")


def chart_key(flag: str) -> str:
    """The chart's ``extender`` value of a flag: ``--reserve-after-limits`` -> ``reserveAfterLimits``."""
    first, *rest = flag.removeprefix("--").split("-")
    return first + "".join(word.title() for word in rest)


def mismatches(written: Mapping[str, str], where: str) -> list[str]:
    """One line per queue setting that ``written`` (key -> the flag's text) lacks or that reads back as
    other than ``QueueConfig``'s default, naming the key."""
    out = []
    for field, (flag, _) in QUEUE_FLAGS.items():
        key = chart_key(flag) if where == "values.yaml" else flag
        if key not in written:
            out.append(f"{where}: {key} is not written (QueueConfig.{field} = {getattr(QUEUE, field)!r})")
            continue
        got = getattr(parse_settings([f"{flag}={written[key]}"]).queue_config(), field)
        if got != getattr(QUEUE, field):
            out.append(
                f"{where}: {key}={written[key]!r} reads as {got!r}, but QueueConfig.{field} defaults to "
                f"{getattr(QUEUE, field)!r}"
            )
    return out


def chart_values() -> dict[str, str]:
    values: dict[str, Any] = yaml.safe_load(VALUES.read_text())["extender"]
    return {k: str(v) for k, v in values.items()}


def extender_args(objs: Mapping[tuple[str, str, str], dict[str, Any]]) -> list[str]:
    containers = objs[DEPLOYMENT]["spec"]["template"]["spec"]["containers"]
    args: list[str] = next(c for c in containers if c["name"] == "extender")["args"]
    assert args[0] == "extender"
    return args[1:]


def base_objects() -> dict[tuple[str, str, str], dict[str, Any]]:
    docs = [
        d
        for f in ("scheduler-deployment.yaml", "scheduler-config.yaml")
        for d in yaml.safe_load_all((BASE / f).read_text())
        if d
    ]
    return by_key(docs)


def flags_of(args: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)


def test_every_queue_flag_is_a_queue_config_field_and_its_default_is_shown_in_its_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert set(QUEUE_FLAGS) <= set(QueueConfig.__dataclass_fields__)
    assert parse_settings([]).queue_config() == QueueConfig()  # the command's defaults are QueueConfig's
    with pytest.raises(SystemExit):
        parse_settings(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for flag, _ in QUEUE_FLAGS.values():
        assert flag in shown


def test_chart_values_write_the_queue_defaults() -> None:
    assert mismatches(chart_values(), "values.yaml") == []


def test_kustomize_base_writes_the_queue_defaults() -> None:
    assert mismatches(flags_of(extender_args(base_objects())), "daemonset/base") == []


@pytest.mark.parametrize(
    ("where", "key", "value", "field"),
    [
        ("values.yaml", "reserveAfter", "30", "reserve_after_s"),
        ("values.yaml", "enforceTimeLimits", "all", "enforce_time_limits"),
        ("daemonset/base", "--max-evictions", "unlimited", "max_evictions"),
        ("daemonset/base", "--preempt-namespaces", "ml", "preempt_namespaces"),
    ],
)
def test_a_default_written_differently_is_named(where: str, key: str, value: str, field: str) -> None:
    """The comparison fails naming the key that differs (and the QueueConfig field it should match)."""
    written = chart_values() if where == "values.yaml" else flags_of(extender_args(base_objects()))
    assert mismatches(written, where) == []
    (line,) = mismatches({**written, key: value}, where)
    assert line.startswith(f"{where}: {key}={value!r}")
    assert f"QueueConfig.{field}" in line
    (gone,) = mismatches({k: v for k, v in written.items() if k != key}, where)
    assert gone.startswith(f"{where}: {key} is not written")


def test_base_extender_serves_the_scheduler_it_runs_beside() -> None:
    objs = base_objects()
    config = yaml.safe_load(objs[SCHEDULER_CONFIG]["data"]["config.yaml"])
    (profile,) = config["profiles"]
    assert parse_settings(extender_args(objs)).scheduler_name == profile["schedulerName"]


def test_chart_scheduler_name_reaches_the_extender(deploy_tools: Path) -> None:
    """``scheduler.name`` names the profile, its lease and the pods the extender places and binds: the
    extender is told (``--scheduler-name``), else it would refuse every pod of a renamed scheduler."""
    objs = by_key(render_helm(deploy_tools, "scheduler.name=team-scheduler"))
    config = yaml.safe_load(objs[SCHEDULER_CONFIG]["data"]["config.yaml"])
    assert [p["schedulerName"] for p in config["profiles"]] == ["team-scheduler"]
    assert config["leaderElection"]["resourceName"] == "team-scheduler"
    assert parse_settings(extender_args(objs)).scheduler_name == "team-scheduler"


def test_chart_queue_values_reach_the_extender(deploy_tools: Path) -> None:
    objs = by_key(
        render_helm(
            deploy_tools,
            "extender.reserveAfter=30",
            "extender.reserveAfterLimits=2",
            "extender.reserveIdleRatio=0.02",
            "extender.queueInterval=0.5",
        )
    )
    s = parse_settings(extender_args(objs))
    assert (s.reserve_after_s, s.reserve_after_limits, s.reserve_idle_ratio, s.queue_interval_s) == (
        30.0,
        2.0,
        0.02,
        0.5,
    )
    q = s.queue_config()
    assert (q.reserve_after_s, q.reserve_after_limits, q.reserve_idle_ratio, q.interval_s) == (
        30.0,
        2.0,
        0.02,
        0.5,
    )
