from __future__ import annotations

import pytest

from agent.metrics.exporter import MetricsSettings, parse_addr


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


def test_a_port_in_use_fails_with_one_line_naming_the_flag() -> None:
    import asyncio
    import socket

    from agent.metrics.exporter import MetricsExporter
    from tests.agent.metrics.builders import make_inventory

    inv = make_inventory(gpus=1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        exporter = MetricsExporter(
            settings=MetricsSettings(host="127.0.0.1", port=port, pod_resources_socket=None),
            backend=None,  # type: ignore[arg-type]  # never reached
            inventory=lambda: inv,
            hostname="n",
        )
        with pytest.raises(RuntimeError, match=rf"--metrics-addr 127.0.0.1:{port}: cannot listen: "):
            asyncio.run(exporter.run(asyncio.Event()))
