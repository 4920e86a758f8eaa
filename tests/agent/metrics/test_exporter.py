from __future__ import annotations

import argparse

import pytest

from agent.metrics.exporter import MetricsSettings, add_arguments, parse_addr, settings_from_args


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("0.0.0.0:9400", ("0.0.0.0", 9400), id="any-v4"),
        pytest.param("127.0.0.1:0", ("127.0.0.1", 0), id="ephemeral"),
        pytest.param(":9400", ("0.0.0.0", 9400), id="empty-host"),
        pytest.param("[::]:9400", ("::", 9400), id="v6"),
    ],
)
def test_parse_addr(text: str, expected: tuple[str, int]) -> None:
    assert parse_addr(text) == expected


@pytest.mark.parametrize("text", ["9400", "host:", "host:http", ""])
def test_parse_addr_rejects_bad_values_naming_the_flag(text: str) -> None:
    with pytest.raises(ValueError, match="--metrics-addr: expected HOST:PORT"):
        parse_addr(text)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"format": "json"}, "--metrics-format", id="format"),
        pytest.param({"port": 70000}, "--metrics-addr", id="port"),
        pytest.param({"interval_s": 0}, "--metrics-interval", id="interval"),
        pytest.param({"pod_resources_interval_s": -1}, "--pod-resources-interval", id="pr-interval"),
    ],
)
def test_settings_validate(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MetricsSettings(**kwargs)  # type: ignore[arg-type]


def _parse(*argv: str) -> MetricsSettings | None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from_args(parser.parse_args(list(argv)))


def test_flags_defaults_and_overrides() -> None:
    assert _parse() == MetricsSettings()
    s = _parse(
        "--metrics-addr",
        "127.0.0.1:9500",
        "--metrics-format",
        "dcgm",
        "--metrics-interval",
        "2",
        "--pod-resources-socket",
        "",
    )
    assert s is not None
    assert (s.host, s.port, s.format, s.interval_s, s.pod_resources_socket) == (
        "127.0.0.1",
        9500,
        "dcgm",
        2.0,
        None,
    )
    assert _parse("--metrics-addr", "") is None
