"""Settings of ``run``: precedence CLI > env > file in one place; one line per bad value; exit 2."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from agent.commands import run as run_command
from agent.config import RunSettings, add_arguments, load_settings, parse_health_config
from agent.healthbook import DEFAULT_IGNORED_XIDS
from deviceplugin.config import ConfigError, MigStrategy
from topology.fabrichealth import DEFAULT_FABRIC_POLICY, FabricCondition


def parse(argv: list[str], env: dict[str, str] | None = None) -> RunSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return load_settings(parser.parse_args(argv), env or {})


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    s = parse([])
    assert s.kubelet_dir == Path("/var/lib/kubelet/device-plugins")
    assert s.node_name
    assert not s.no_kube
    assert s.plugin.mig_strategy is MigStrategy.NONE


@pytest.mark.parametrize(
    ("cli", "env", "file_value", "want"),
    [
        pytest.param(
            ["--kubelet-dir", "/c"], {"GPU_NODE_AGENT_KUBELET_DIR": "/e"}, "/f", "/c", id="cli-wins"
        ),
        pytest.param([], {"GPU_NODE_AGENT_KUBELET_DIR": "/e"}, "/f", "/e", id="env-over-file"),
        pytest.param([], {}, "/f", "/f", id="file"),
    ],
)
def test_precedence(tmp_path: Path, cli: list[str], env: dict[str, str], file_value: str, want: str) -> None:
    path = write(tmp_path, f"version: v1\nkubeletDir: {file_value}\n")
    s = parse([*cli, "--config", str(path)], env)
    assert s.kubelet_dir == Path(want)


def test_plugin_sections_and_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "version: v1\nflags:\n  migStrategy: single\nnoKube: true\n")
    assert parse(["--config", str(path)]).plugin.mig_strategy is MigStrategy.SINGLE
    assert parse(["--config", str(path)], {"MIG_STRATEGY": "mixed"}).plugin.mig_strategy is MigStrategy.MIXED
    assert parse(
        ["--config", str(path), "--mig-strategy", "none"], {"MIG_STRATEGY": "mixed"}
    ).plugin.mig_strategy is (MigStrategy.NONE)
    assert parse(["--config", str(path)]).no_kube


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        pytest.param("version: v2\n", {}, "version: expected 'v1'", id="version"),
        pytest.param("version: v1\nkubeletdir: /x\n", {}, "kubeletdir: unknown key", id="unknown-key"),
        pytest.param("version: v1\nlogLevel: loud\n", {}, "logLevel: 'loud' is not one of", id="file-value"),
        pytest.param(
            "version: v1\n",
            {"GPU_NODE_AGENT_SHUTDOWN_GRACE": "-1"},
            "env GPU_NODE_AGENT_SHUTDOWN_GRACE",
            id="env",
        ),
        pytest.param("version: [v1\n", {}, "not YAML", id="yaml"),
        pytest.param(
            "version: v1\nflags: {migStrategy: all}\n", {}, "flags.migStrategy", id="plugin-section"
        ),
    ],
)
def test_bad_values_name_what_and_where(
    tmp_path: Path, text: str, env: dict[str, str], expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        parse(["--config", str(path)], env)
    assert any(expected in p for p in err.value.problems), err.value.problems


def test_health_section_defaults_and_values() -> None:
    assert parse_health_config({}).ignored_xids == DEFAULT_IGNORED_XIDS == {13, 31, 43, 45, 68, 109}
    health = parse_health_config(
        {"health": {"extraIgnoredXids": [94], "fabricUnhealthyMarksGpu": True, "recoveryQuietSeconds": 1}}
    )
    assert 94 in health.ignored_xids
    assert 13 in health.ignored_xids
    assert health.fabric_unhealthy_marks_gpu
    assert health.recovery_quiet_s == 1.0


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param({"health": {"ignoredXids": ["13"]}}, "health.ignoredXids", id="xids"),
        pytest.param({"health": {"recoveryQuietSeconds": -1}}, "health.recoveryQuietSeconds", id="quiet"),
        pytest.param({"health": {"bogus": 1}}, "health.bogus: unknown key", id="unknown-key"),
    ],
)
def test_each_health_problem_is_one_line_naming_the_key(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_health_config(data, source="c.yaml")
    assert any(expected in p and p.startswith("c.yaml: ") for p in err.value.problems), err.value.problems
    assert all("\n" not in p for p in err.value.problems)


def test_health_section_comes_from_the_file_and_its_problems_join_the_others(tmp_path: Path) -> None:
    path = write(tmp_path, "version: v1\nhealth:\n  recoveryQuietSeconds: 7\n")
    assert parse(["--config", str(path)]).health.recovery_quiet_s == 7.0
    bad = write(tmp_path, "version: v1\nflags: {migStrategy: x}\nhealth: {probeIntervalSeconds: 0}\n")
    with pytest.raises(ConfigError) as err:
        parse(["--config", str(bad)])
    assert len(err.value.problems) == 2
    assert err.value.problems[1].startswith(
        f"{bad}: health.probeIntervalSeconds: expected a number from 0.01 to 3600"
    )


def test_main_prints_one_line_per_problem_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "version: v1\nlogLevel: loud\nshutdownGraceSeconds: 0\n")
    monkeypatch.delenv("GPU_NODE_AGENT_CONFIG", raising=False)
    assert run_command.main(["--config", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2
    assert all(line.startswith("gpu-node-agent run: ") for line in lines)


def test_missing_config_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command.main(["--config", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "cannot read" in err


def test_faults_need_a_simulator() -> None:
    with pytest.raises(ConfigError, match="--simulate-faults: needs --simulate"):
        parse(["--simulate-faults", "/tmp/f.jsonl"])
    assert parse(["--simulate", "pcie-l40s", "--simulate-faults", "/tmp/f.jsonl"]).simulate == "pcie-l40s"


def test_kubeconfig_setting_comes_from_the_flag_or_our_env_not_kubeconfig_path_lists() -> None:
    import argparse

    from agent.config import add_arguments, load_settings

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flag = load_settings(parser.parse_args(["--node-name", "n", "--kubeconfig", "/k/config"]), {})
    assert str(flag.kubeconfig) == "/k/config"
    env = load_settings(parser.parse_args(["--node-name", "n"]), {"KUBECONFIG": "/a:/b"})
    assert env.kubeconfig is None
    ours = load_settings(parser.parse_args(["--node-name", "n"]), {"GPU_NODE_AGENT_KUBECONFIG": "/c"})
    assert str(ours.kubeconfig) == "/c"


def test_fabric_policy_section_from_the_file(tmp_path: Path) -> None:
    assert parse([]).health.fabric_policy == DEFAULT_FABRIC_POLICY
    path = write(
        tmp_path, "version: v1\nfabric:\n  unhealthyConditions: [route_unhealthy, degraded_bandwidth]\n"
    )
    policy = parse(["--config", str(path)]).health.fabric_policy
    assert policy.unhealthy == {FabricCondition.ROUTE_UNHEALTHY, FabricCondition.DEGRADED_BANDWIDTH}
    assert FabricCondition.DEGRADED_BANDWIDTH not in policy.degraded  # moved, not in both
    assert FabricCondition.ROUTE_RECOVERY in policy.degraded
    bad = write(
        tmp_path,
        "version: v1\nfabric:\n  unhealthyConditions: [route_unhealthy]\n"
        "  degradedConditions: [route_unhealthy]\n  other: 1\n",
    )
    with pytest.raises(ConfigError) as err:
        parse(["--config", str(bad)])
    assert err.value.problems == [
        f"{bad}: fabric.other: unknown key; valid: degradedConditions, unhealthyConditions",
    ]
    both = write(
        tmp_path,
        "version: v1\nfabric:\n  unhealthyConditions: [route_unhealthy]\n"
        "  degradedConditions: [route_unhealthy]\n",
    )
    with pytest.raises(ConfigError) as err:
        parse(["--config", str(both)])
    assert err.value.problems == [
        f"{both}: fabric: fabric condition(s) route_unhealthy cannot be both unhealthy and degraded"
    ]
    typo = write(tmp_path, "version: v1\nfabric: {degradedConditions: [slow]}\n")
    with pytest.raises(ConfigError) as err:
        parse(["--config", str(typo)])
    assert err.value.problems[0].startswith(
        f"{typo}: fabric.degradedConditions: 'slow' is not a fabric condition"
    )


@pytest.mark.parametrize(
    ("argv", "env", "file_imex", "want"),
    [
        pytest.param([], {"IMEX_CHANNEL_IDS": "0"}, None, ((0,), False), id="env-channel"),
        pytest.param(
            [], {"IMEX_CHANNEL_IDS": "0", "IMEX_REQUIRED": "true"}, None, ((0,), True), id="env-required"
        ),
        pytest.param(
            [],
            {"IMEX_CHANNEL_IDS": "0"},
            "{channelIDs: [], required: false}",
            ((0,), False),
            id="env-over-file",
        ),
        pytest.param(
            [],
            {"IMEX_REQUIRED": "false"},
            "{channelIDs: [0], required: true}",
            ((0,), False),
            id="env-false-over-file",
        ),
        pytest.param(
            [], {"IMEX_CHANNEL_IDS": ""}, "{channelIDs: [0]}", ((), False), id="env-empty-over-file"
        ),
        pytest.param(
            ["--imex-channel-ids", ""], {"IMEX_CHANNEL_IDS": "0"}, None, ((), False), id="cli-empty-wins"
        ),
        pytest.param(
            ["--imex-channel-ids", "0", "--imex-required"],
            {"IMEX_CHANNEL_IDS": ""},
            None,
            ((0,), True),
            id="cli-wins",
        ),
    ],
)
def test_imex_channel_ids_and_required_from_the_environment(
    tmp_path: Path, argv: list[str], env: dict[str, str], file_imex: str | None, want: tuple[Any, ...]
) -> None:
    """NVIDIA's device plugin's env names (the Helm chart and the kustomize component set them) reach the
    plugin config, over the file and under the flags."""
    path = write(tmp_path, "version: v1\n" + (f"imex: {file_imex}\n" if file_imex else ""))
    imex = parse([*argv, "--config", str(path)], env).plugin.imex
    assert (imex.channel_ids, imex.required) == want


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"IMEX_CHANNEL_IDS": "1"}, "imex.channelIDs: '1' is not [] or [0]", id="bad-channel"),
        pytest.param(
            {"IMEX_REQUIRED": "true"}, "imex.required: true needs imex.channelIDs [0]", id="required"
        ),
        pytest.param({"IMEX_CHANNEL_IDS": "0", "IMEX_REQUIRED": "maybe"}, "imex.required", id="bad-required"),
    ],
)
def test_run_reads_imex_settings_from_its_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    """``run`` itself reads the process environment: a bad value there stops it with one line naming it."""
    for var in ("GPU_NODE_AGENT_CONFIG", "IMEX_CHANNEL_IDS", "IMEX_REQUIRED"):
        monkeypatch.delenv(var, raising=False)
    for var, text in env.items():
        monkeypatch.setenv(var, text)
    assert run_command.main(["--node-name", "n", "--no-kube"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert expected in err
