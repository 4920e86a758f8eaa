"""Bounded reading of YAML (and JSON) files that come from outside the program. Pure, except
:func:`read_text`.

Files the product reads from an operator, a ConfigMap or another tool go through here: the
controller's ``--from`` folder (GPUNode and Node objects, ``mapping.yaml``, ``*.ibnetdiscover``), its
``--config``, ``--mapping`` and ``--ibnetdiscover`` files, and the ``mapping.yaml`` of fabric ConfigMaps
(the agent's config file and ``plan``'s input files belong here too). ``yaml.safe_load`` alone refuses
to build arbitrary objects but not to be made to work without end; this loader adds the limits:

- **nesting** deeper than :data:`MAX_DEPTH` levels is refused before PyYAML's recursive composer would
  hit Python's recursion limit (a JSON file ``[[[[...`` 5,000 deep);
- **aliases** may repeat at most :data:`MAX_ALIAS_NODES` nodes in all (each alias counts the size of the
  node it repeats), so a "billion laughs" document is refused after a few aliases instead of growing
  exponentially in whatever later walks or prints it; an alias to a node that contains it (a recursive
  structure) is refused;
- **integers** longer than :data:`MAX_INT_DIGITS` digits are refused (Python itself refuses to convert
  more than 4,300 digits, with a traceback);
- text that is not UTF-8 is refused by :func:`decode` / :func:`read_text`.

Every refusal is an :class:`InputError` with one line naming the source, the key path and line, and the
limit. Plain YAML errors become the same one-line error.
"""

from __future__ import annotations

import pathlib
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DEPTH = 64
MAX_ALIAS_NODES = 10_000
MAX_INT_DIGITS = 100

_INT_TAG = "tag:yaml.org,2002:int"


class InputError(ValueError):
    """A file or text that cannot be read within the limits; the message is one line naming the source
    and, where known, the key path, the line and the limit."""


def decode(data: bytes, *, source: str) -> str:
    """``data`` as UTF-8 text, or :class:`InputError` naming the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1].hex()
        raise InputError(f"{source}: not UTF-8 text (byte 0x{bad} at offset {exc.start})") from None


def read_text(path: str | pathlib.Path) -> str:
    """A file's text; :class:`InputError` when it is not UTF-8 (``OSError`` when it cannot be read)."""
    return decode(pathlib.Path(path).read_bytes(), source=str(path))


def load(text: str, *, source: str) -> Any:
    """The single YAML/JSON document in ``text`` (``None`` when empty), within the limits."""
    loader = _BoundedLoader(text, source)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise _one_line(exc, source) from None
    finally:
        loader.dispose()


def load_all(text: str, *, source: str) -> list[Any]:
    """Every YAML document in ``text`` (a JSON file is one document), within the limits."""
    loader = _BoundedLoader(text, source)
    try:
        out = []
        while loader.check_data():  # type: ignore[no-untyped-call]
            out.append(loader.get_data())
        return out
    except yaml.YAMLError as exc:
        raise _one_line(exc, source) from None
    finally:
        loader.dispose()


def _one_line(exc: yaml.YAMLError, source: str) -> InputError:
    if isinstance(exc, _LimitError):
        return InputError(str(exc))
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = exc.problem or exc.context or "invalid"
        return InputError(f"{source}: not YAML: {problem}{where}")
    return InputError(f"{source}: not YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")


class _LimitError(yaml.YAMLError):
    """Raised inside the loader; :func:`load` turns it into :class:`InputError`."""


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose composer counts depth and alias expansion and knows the key path."""

    def __init__(self, text: str, source: str) -> None:
        super().__init__(text)
        self.source = source
        self.depth = 0
        self.path: list[str] = []
        self.composed = 0  # nodes composed so far, aliases counted at the size they repeat
        self.alias_nodes = 0
        self.sizes: dict[int, int] = {}  # id(anchored node) -> its size, once composed

    def compose_document(self) -> Node | None:
        node = super().compose_document()
        self.sizes = {}  # anchors do not reach past their document
        return node

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self.path.append(_segment(parent, index))
        try:
            return self._compose(parent, index)
        finally:
            self.path.pop()

    def _compose(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            target = self.anchors.get(event.anchor)
            if target is not None:
                size = self.sizes.get(id(target))
                if size is None:
                    raise self._limit(event, f"alias *{event.anchor} repeats a node that contains it")
                self.alias_nodes += size
                self.composed += size
                if self.alias_nodes > MAX_ALIAS_NODES:
                    raise self._limit(
                        event,
                        f"aliases repeat more than {MAX_ALIAS_NODES} nodes (the limit); "
                        "write the values out instead of repeating them with aliases",
                    )
            return super().compose_node(parent, index)
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self._limit(event, f"nested deeper than {MAX_DEPTH} levels (the limit)")
        start = self.composed
        self.composed += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if isinstance(node, ScalarNode) and node.tag == _INT_TAG:
            digits = len(node.value.lstrip("+-").replace("_", ""))
            if digits > MAX_INT_DIGITS:
                raise self._limit(event, f"an integer of {digits} digits (the limit is {MAX_INT_DIGITS})")
        if event.anchor is not None:
            self.sizes[id(node)] = self.composed - start
        return node

    def _limit(self, event: yaml.Event, problem: str) -> _LimitError:
        line = f"line {event.start_mark.line + 1}" if event.start_mark is not None else "?"
        key = _path_text(self.path)
        where = f"{key} ({line})" if key else line
        return _LimitError(f"{self.source}: {where}: {problem}")


def _segment(parent: Node | None, index: Any) -> str:
    if isinstance(parent, SequenceNode) and isinstance(index, int):
        return f"[{index}]"
    if isinstance(parent, MappingNode) and isinstance(index, ScalarNode):
        return str(index.value)[:64]
    if isinstance(parent, MappingNode) and isinstance(index, Node):
        return "<key>"
    return ""  # the document root, or a mapping key being composed


def _path_text(path: list[str]) -> str:
    """``metadata.labels.x`` / ``items[3].status``; a deep path keeps its first 8 steps."""
    segs = [seg for seg in path if seg]
    out = ""
    for seg in segs[:8]:
        out += seg if seg.startswith("[") or not out else f".{seg}"
    return out + ("..." if len(segs) > 8 else "")
