from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agent.config import ConfigError, add_arguments, load_settings
from agent.metrics.exporter import MetricsSettings
from agent.metrics.wiring import health_addr, metrics_settings


def _load(argv: list[str], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return load_settings(parser.parse_args(argv), env or {})


def test_defaults_serve_native_metrics_on_dcgm_exporters_port() -> None:
    s = metrics_settings(_load(["--node-name", "n"]))
    assert s == MetricsSettings(host="0.0.0.0", port=9400)


def test_flags_env_and_empty_addr() -> None:
    s = metrics_settings(
        _load(
            [
                "--node-name",
                "n",
                "--metrics-addr",
                "127.0.0.1:9500",
                "--metrics-format",
                "dcgm",
                "--proc-root",
                "/host/proc",
            ],
            {"GPU_NODE_AGENT_METRICS_INTERVAL": "2.5", "GPU_NODE_AGENT_POD_RESOURCES_SOCKET": "/pr.sock"},
        )
    )
    assert s is not None
    assert (s.host, s.port, s.format, s.interval_s, s.pod_resources_socket, s.proc_root) == (
        "127.0.0.1",
        9500,
        "dcgm",
        2.5,
        str(Path("/pr.sock")),
        "/host/proc",
    )
    assert metrics_settings(_load(["--node-name", "n", "--metrics-addr", ""])) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--metrics-addr", "9400"], "--metrics-addr: expected HOST:PORT", id="addr"),
        pytest.param(["--metrics-format", "json"], "--metrics-format: 'json' is not one of", id="format"),
        pytest.param(["--metrics-interval", "0"], "--metrics-interval", id="interval"),
        pytest.param(["--health-addr", "9401"], "--health-addr: expected HOST:PORT", id="health-addr"),
        pytest.param(["--health-addr", "host:99999"], "--health-addr: expected HOST:PORT", id="health-port"),
        pytest.param(
            ["--health-addr", "0.0.0.0:9400"],
            "--health-addr: 0.0.0.0:9400 and --metrics-addr 0.0.0.0:9400 use the same port",
            id="health-on-the-metrics-port",
        ),
        pytest.param(
            ["--metrics-addr", "127.0.0.1:9401"],
            "--health-addr: 0.0.0.0:9401 and --metrics-addr 127.0.0.1:9401 use the same port",
            id="metrics-on-the-default-health-port",
        ),
    ],
)
def test_bad_values_abort_with_one_line_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(["--node-name", "n", *argv])
    assert any(p.startswith(message) for p in info.value.problems), info.value.problems


def test_the_health_listener_has_its_own_port_by_default() -> None:
    """kubelet probes the pod IP, so the default listens on every address of the pod (port 9401)."""
    assert health_addr(_load(["--node-name", "n"])) == ("0.0.0.0", 9401)


def test_health_addr_from_env_and_file_and_off(tmp_path: Path) -> None:
    assert health_addr(_load(["--node-name", "n"], {"GPU_NODE_AGENT_HEALTH_ADDR": "127.0.0.1:19401"})) == (
        "127.0.0.1",
        19401,
    )
    config = tmp_path / "c.yaml"
    config.write_text("version: v1\nhealthAddr: '[::]:9411'\n", encoding="utf-8")
    assert health_addr(_load(["--node-name", "n", "--config", str(config)])) == ("::", 9411)
    assert health_addr(_load(["--node-name", "n", "--health-addr", ""])) is None
    # a different address on the same port does not clash
    s = _load(["--node-name", "n", "--metrics-addr", "127.0.0.1:9400", "--health-addr", "127.0.0.2:9400"])
    assert health_addr(s) == ("127.0.0.2", 9400)
