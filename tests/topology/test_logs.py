from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from topology import logs


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_event_level_logger_and_bound_context() -> None:
    out = io.StringIO()
    logs.configure("json", "info", stream=out)
    log = logs.get_logger("agent.discovery").bind(node="rack0-tray3")
    log.bind(gpu_uuid="GPU-1").info("gpu_lost", index=3, reason="fell off the bus")
    log.debug("not_shown")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["event"] == "gpu_lost"
    assert record["level"] == "info"
    assert record["logger"] == "agent.discovery"
    assert record["node"] == "rack0-tray3"
    assert record["gpu_uuid"] == "GPU-1"
    assert record["index"] == 3
    assert record["reason"] == "fell off the bus"
    assert record["ts"].endswith("Z")


def test_auto_is_json_off_a_terminal_and_text_on_one() -> None:
    pipe = io.StringIO()
    logs.configure("auto", "info", stream=pipe)
    logs.get_logger("x").info("started", port=9400)
    assert json.loads(pipe.getvalue())["port"] == 9400

    tty = _Tty()
    logs.configure("auto", "info", stream=tty)
    logs.get_logger("x").warning("socket_gone", path="/var/lib/kubelet/x.sock", note="will retry")
    line = tty.getvalue().strip()
    assert " WARNING " in line
    assert "socket_gone" in line
    assert "path=/var/lib/kubelet/x.sock" in line
    assert 'note="will retry"' in line


def test_configure_replaces_its_handler_instead_of_stacking() -> None:
    out = io.StringIO()
    logs.configure("json", "info", stream=io.StringIO())
    logs.configure("json", "info", stream=out)
    logs.get_logger("x").info("once")
    assert len(out.getvalue().splitlines()) == 1


def test_level_filters() -> None:
    out = io.StringIO()
    logs.configure("json", "warning", stream=out)
    log = logs.get_logger("x")
    log.info("quiet")
    log.error("loud")
    assert [json.loads(line)["event"] for line in out.getvalue().splitlines()] == ["loud"]


@pytest.mark.parametrize("name", ["GpuLost", "gpu lost", "gpu-lost", "_gpu", "gpu__lost", ""])
def test_event_names_must_be_snake_case(name: str) -> None:
    with pytest.raises(ValueError, match="snake_case"):
        logs.get_logger("x").info(name)


def test_reserved_field_names_are_refused() -> None:
    with pytest.raises(ValueError, match="reserved"):
        logs.get_logger("x").info("ok", event="clash")


@pytest.mark.parametrize(("fmt", "level"), [("xml", "info"), ("json", "verbose")])
def test_bad_configuration_names_the_valid_values(fmt: str, level: str) -> None:
    with pytest.raises(ValueError, match="valid:"):
        logs.configure(fmt, level, stream=io.StringIO())


def test_exception_includes_traceback_and_non_json_values_are_stringified() -> None:
    out = io.StringIO()
    logs.configure("json", "info", stream=out)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logs.get_logger("x").exception("step_failed", path=io)
    record = json.loads(out.getvalue())
    assert "RuntimeError: boom" in record["exception"]
    assert isinstance(record["path"], str)


def test_records_reach_standard_logging(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=logs.ROOT):
        logs.get_logger("agent.udev").info("hotplug_event", action="add")
    assert any(r.getMessage() == "hotplug_event" for r in caplog.records)


def test_plain_logging_records_are_rendered_too() -> None:
    out = io.StringIO()
    logs.configure("json", "info", stream=out)
    logging.getLogger("some.library").info("hello %s", "world")
    logging.getLogger("agent.publisher").warning("gpunode_missing", extra={"node": "n1"})
    logging.getLogger("some.library").debug("below the level")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert (first["event"], first["message"]) == ("log_message", "hello world")
    assert first["logger"] == "some.library"
    assert (second["event"], second["node"], second["level"]) == ("gpunode_missing", "n1", "warning")


def test_default_stream_is_whatever_stderr_is_when_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    logs.configure("json", "info")
    later = io.StringIO()
    monkeypatch.setattr(sys, "stderr", later)
    logs.get_logger("x").info("after_replacement")
    assert json.loads(later.getvalue())["event"] == "after_replacement"
