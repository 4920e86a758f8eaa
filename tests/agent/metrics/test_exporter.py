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


def test_a_first_refresh_that_fails_is_logged_and_the_exporter_keeps_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 26 item 19: the exporter's first refresh is guarded like every later one: a failure is
    logged (``metrics_refresh_failed``), /metrics and /readyz answer, and the next refresh succeeds. It
    used to end the exporter and with it the whole agent."""
    import asyncio

    from agent.metrics.exporter import MetricsExporter
    from agent.nvml.simulate import build_simulator
    from tests.deviceplugin.helpers import inventory

    sim = build_simulator("pcie-l40s")
    sim.init()
    inv = inventory("pcie-l40s")
    calls: list[int] = []

    def current() -> object:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bad answer")
        return inv

    async def body() -> None:
        exporter = MetricsExporter(
            settings=MetricsSettings(host="127.0.0.1", port=0, pod_resources_socket=None, interval_s=3600),
            backend=sim,
            inventory=current,  # type: ignore[arg-type]
            hostname="n",
            version="test",
        )
        stop = asyncio.Event()
        task = asyncio.create_task(exporter.run(stop))
        serving = asyncio.ensure_future(exporter.serving.wait())
        await asyncio.wait({serving, task}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        serving.cancel()
        assert not task.done(), task.exception()
        assert exporter.cache.nvml_problem() == "waiting for the first NVML refresh"
        assert await exporter.cache.refresh_guarded()
        assert exporter.cache.nvml_problem() is None
        assert len(exporter.cache.snapshot().gpus) == 4
        stop.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(body())
    assert [r for r in caplog.records if "metrics_refresh_failed" in r.getMessage()]
