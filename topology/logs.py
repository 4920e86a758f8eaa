"""Structured logging for every command: JSON lines in the cluster, readable lines on a terminal.

Usage::

    from topology import logs

    logs.configure("auto", "info")          # once, in a command's composition root
    log = logs.get_logger("agent.discovery").bind(node="rack0-tray3")
    log.info("discovery_done", gpus=8, duration_ms=12.5)
    log.bind(gpu_uuid=uuid).warning("gpu_lost", index=3)

Event names are stable snake_case identifiers (operators alert on them); a name that is not one is a
programming error and raises ``ValueError``. Context keys (``node``, ``gpu_uuid``, ``resource``, ``gang``, …)
are bound with :meth:`Logger.bind` and repeated on every line. Records go through the standard
``logging`` module (logger names under ``gpu_node_agent.``), so pytest's ``caplog`` keeps working;
:func:`configure` installs one handler on the root logger, so plain ``logging`` users render the same
way (a snake_case message becomes the event, ``extra=`` keys become fields; other messages are
``log_message`` events with a ``message`` field).

Formats: ``json`` — one object per line with ``ts`` (UTC, ISO 8601, milliseconds), ``level``, ``logger``,
``event`` and the bound and given keys; ``text`` — ``HH:MM:SS.mmm LEVEL event key=value …``; ``auto`` — text
when the stream is a terminal, else JSON.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys
from collections.abc import Mapping
from typing import IO, Any, Final

FORMATS: Final = ("auto", "json", "text")
LEVELS: Final = ("debug", "info", "warning", "error")

ROOT = "gpu_node_agent"
_EVENT_RE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")
_FIELDS_ATTR = "gna_fields"
_EVENT_ATTR = "gna_event"
_RESERVED = frozenset({"ts", "level", "logger", "event"})


def _validate_event(event: str) -> None:
    if not _EVENT_RE.match(event):
        raise ValueError(f"log event name {event!r} is not snake_case (e.g. 'gpu_lost')")


class Logger:
    """A named logger with bound context; cheap to create and to ``bind``."""

    __slots__ = ("_context", "_logger", "name")

    def __init__(self, name: str, context: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self._logger = logging.getLogger(f"{ROOT}.{name}")
        self._context: dict[str, Any] = dict(context or {})

    @property
    def context(self) -> dict[str, Any]:
        return dict(self._context)

    def bind(self, **context: Any) -> Logger:
        """A logger that adds ``context`` to every line (later keys win)."""
        return Logger(self.name, {**self._context, **context})

    def debug(self, event: str, /, **fields: Any) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, /, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, /, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, /, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields)

    def exception(self, event: str, /, **fields: Any) -> None:
        """Like :meth:`error`, with the current exception's traceback."""
        self._log(logging.ERROR, event, fields, exc_info=True)

    def _log(self, level: int, event: str, fields: Mapping[str, Any], *, exc_info: bool = False) -> None:
        _validate_event(event)
        clash = _RESERVED.intersection(fields) | _RESERVED.intersection(self._context)
        if clash:
            raise ValueError(f"log field name(s) {', '.join(sorted(clash))} are reserved")
        if not self._logger.isEnabledFor(level):
            return
        merged = {**self._context, **fields}
        self._logger.log(
            level,
            event,
            extra={_EVENT_ATTR: event, _FIELDS_ATTR: merged},
            exc_info=exc_info,
            stacklevel=3,
        )


def get_logger(name: str, **context: Any) -> Logger:
    """A structured logger; ``name`` is the module path (``agent.discovery``)."""
    return Logger(name, context)


def _plain(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return str(value)


_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _record_parts(record: logging.LogRecord) -> tuple[str, dict[str, Any]]:
    event = getattr(record, _EVENT_ATTR, None)
    fields = getattr(record, _FIELDS_ATTR, None)
    if event is not None:
        return str(event), dict(fields or {})
    # a record from a plain ``logging`` user: its ``extra=`` keys are fields
    extras = {k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS and k not in _RESERVED}
    message = record.getMessage()
    if isinstance(record.msg, str) and not record.args and _EVENT_RE.match(message):
        return message, extras
    return "log_message", {"message": message, **extras}


def _timestamp(record: logging.LogRecord) -> dt.datetime:
    return dt.datetime.fromtimestamp(record.created, tz=dt.UTC)


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        event, fields = _record_parts(record)
        out: dict[str, Any] = {
            "ts": _timestamp(record).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name.removeprefix(ROOT + "."),
            "event": event,
        }
        out.update({k: _plain(v) for k, v in fields.items()})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"), sort_keys=False)


def _text_value(value: Any) -> str:
    plain = _plain(value)
    if isinstance(plain, str):
        return plain if plain and not re.search(r"[\s\"=]", plain) else json.dumps(plain)
    return json.dumps(plain, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``HH:MM:SS.mmm LEVEL event key=value …`` for people at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        event, fields = _record_parts(record)
        ts = _timestamp(record).astimezone()
        head = f"{ts:%H:%M:%S}.{ts.microsecond // 1000:03d} {record.levelname:<7} {event}"
        tail = " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        line = f"{head} {tail}" if tail else head
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


_HANDLER_NAME = "gpu_node_agent_handler"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at emit time (it may be replaced after configuration)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, value: IO[str]) -> None:
        pass


def resolve_format(fmt: str, stream: IO[str]) -> str:
    """``auto`` → ``text`` on a terminal, else ``json``; other values are checked and returned."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; valid: {', '.join(FORMATS)}")
    if fmt != "auto":
        return fmt
    isatty = getattr(stream, "isatty", None)
    return "text" if callable(isatty) and isatty() else "json"


def configure(fmt: str = "auto", level: str = "info", *, stream: IO[str] | None = None) -> None:
    """Install (or replace) the one handler, on the root logger; idempotent.

    ``fmt`` is one of :data:`FORMATS`, ``level`` one of :data:`LEVELS`; a bad value raises ``ValueError``
    naming the valid ones. ``stream`` defaults to ``sys.stderr`` (stdout stays the command's output).
    """
    if level not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; valid: {', '.join(LEVELS)}")
    resolved = resolve_format(fmt, stream if stream is not None else sys.stderr)
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == _HANDLER_NAME:
            root.removeHandler(old)
    handler: logging.Handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if resolved == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    logging.getLogger(ROOT).setLevel(logging.NOTSET)  # the project's loggers follow the root's level
