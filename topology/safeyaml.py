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
- text that is not UTF-8 is refused by :func:`decode` / :func:`read_text`;
- :func:`read_text` reads through :mod:`topology.files`: regular files only (a FIFO is refused, never
  waited on) and at most ``limit`` bytes (default :data:`MAX_TEXT_BYTES`).

Speed: the text is parsed by libyaml (PyYAML's C parser, in its wheels) into events, and the values are
built from the events here, in one loop that counts the limits as it goes, with each distinct plain
scalar resolved (``4`` an int, ``true`` a bool, ``nvl-0`` a string) once per text and each distinct
string held once. What that loop leaves to PyYAML's own composer and ``SafeConstructor`` (a merge key
``<<``, a collection with a tag such as ``!!set`` or ``!!omap``, a collection as a mapping key) makes the
whole text go through them instead, still over libyaml's events and with the same limits, so the values
are those of ``yaml.safe_load`` either way (syntax errors are worded by libyaml). A 100,000-node
``plan`` cluster file (11 MB) loads in about 2 s of CPU and 90 MiB instead of 48 s and 1.1 GiB with
PyYAML's pure-Python parser. The loop does not recurse, whatever the nesting; libyaml refuses flow
nesting beyond 1,000 levels while reading ahead, which is reported as our own depth refusal. A PyYAML
built without libyaml runs the same loop on its Python parser, slower.

Every refusal is an :class:`InputError` with one line naming the source, the key path and line, and the
limit. Plain YAML errors become the same one-line error.
"""

from __future__ import annotations

import pathlib
from typing import Any

import yaml
from yaml.composer import Composer, ComposerError
from yaml.constructor import SafeConstructor
from yaml.events import (
    AliasEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from topology.files import RefusedFileError, read_bytes

MAX_DEPTH = 64
MAX_ALIAS_NODES = 10_000
MAX_INT_DIGITS = 100
MAX_TEXT_BYTES = 64 * 1024 * 1024

_INT_TAG = "tag:yaml.org,2002:int"
_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAGS = (None, "!", "tag:yaml.org,2002:map")
_SEQ_TAGS = (None, "!", "tag:yaml.org,2002:seq")
_LIBYAML_DEPTH = "exceeded maximum nesting depth"
_KEY_TAGS = ("tag:yaml.org,2002:merge", "tag:yaml.org,2002:value")  # SafeConstructor's special keys


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


def read_text(path: str | pathlib.Path, *, limit: int = MAX_TEXT_BYTES) -> str:
    """A regular file's text, at most ``limit`` bytes; :class:`InputError` naming the path when it is
    not a regular file (a FIFO, a device, a directory: refused without waiting), is longer than
    ``limit`` or is not UTF-8 (``OSError`` when it cannot be read at all, e.g. it does not exist)."""
    try:
        raw = read_bytes(path, limit=limit)
    except RefusedFileError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None
    return decode(raw, source=str(path))


def load(text: str, *, source: str) -> Any:
    """The single YAML/JSON document in ``text`` (``None`` when empty), within the limits."""
    docs = _documents(text, source, single=True)
    return docs[0] if docs else None


def load_all(text: str, *, source: str) -> list[Any]:
    """Every YAML document in ``text`` (a JSON file is one document), within the limits."""
    return _documents(text, source, single=False)


def _documents(text: str, source: str, *, single: bool) -> list[Any]:
    try:
        try:
            return _EventReader(text, source).documents(single=single)
        except _Exact:
            return _exact_documents(text, source, single=single)
    except yaml.MarkedYAMLError as exc:
        if exc.problem == _LIBYAML_DEPTH and exc.problem_mark is not None:
            raise _depth_error(text, source, exc.problem_mark) from None
        raise _one_line(exc, source) from None
    except yaml.YAMLError as exc:
        raise _one_line(exc, source) from None


def _depth_error(text: str, source: str, mark: Any) -> InputError:
    """libyaml's scanner reads flow collections ahead of the events and refuses nesting deeper than
    1,000 levels itself, before the events reach our bound of :data:`MAX_DEPTH`. The text up to where
    it stopped is still more than ``MAX_DEPTH`` deep: read again, it meets our bound, with its key
    path; the line alone where it does not."""
    cut = text[: mark.index]
    try:
        try:
            _EventReader(cut, source).documents(single=False)
        except _Exact:
            _exact_documents(cut, source, single=False)
    except _LimitError as exc:
        return InputError(str(exc))
    except yaml.YAMLError:
        pass
    return InputError(f"{source}: line {mark.line + 1}: nested deeper than {MAX_DEPTH} levels (the limit)")


def _exact_documents(text: str, source: str, *, single: bool) -> list[Any]:
    loader = _BoundedLoader(text, source)
    try:
        if single:
            return [loader.get_single_data()]
        out = []
        while loader.check_data():  # type: ignore[no-untyped-call]
            out.append(loader.get_data())
        return out
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


class _Exact(Exception):  # noqa: N818 - a signal between two readers, not an error anyone sees
    """The event reader met what it leaves to PyYAML's composer and constructor."""


_SEQ = object()  # a sequence frame's key
_DUE = object()  # a mapping frame's key while its next key is due


if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _ParsedText(CParser):
        """A text's events, parsed by libyaml."""

    _EVENT_SOURCE: Any = yaml.CSafeLoader
else:  # pragma: no cover - a PyYAML built without libyaml: the same events, parsed in Python (slower)

    class _ParsedText(Reader, Scanner, Parser):  # type: ignore[no-redef]
        def __init__(self, text: str) -> None:
            Reader.__init__(self, text)
            Scanner.__init__(self)
            Parser.__init__(self)

    _EVENT_SOURCE = yaml.SafeLoader


class _EventReader:
    """Builds the documents from libyaml's events in one loop, counting the limits as
    :class:`_BoundedLoader` does (the same nodes, the same key paths, the same messages).

    A frame of the stack is ``[container, key, key segment, anchor, composed at its start]``: the key is
    :data:`_SEQ` for a sequence, :data:`_DUE` for a mapping whose next key is due, else the key whose
    value comes next. A container enters its parent when it starts, as ``SafeConstructor`` builds it."""

    def __init__(self, text: str, source: str) -> None:
        self.events = _EVENT_SOURCE(text)  # libyaml's events; PyYAML's resolver and constructor
        self.source = source
        self.stack: list[list[Any]] = []
        self.plain: dict[str, Any] = {}  # a plain scalar's text -> its value, resolved once
        self.strings: dict[str, str] = {}  # a quoted scalar's text, held once
        self.anchors: dict[str, list[Any]] = {}  # name -> [value, size (None while open), mark, text]
        self.composed = 0  # nodes so far, an alias counted at the size of what it repeats
        self.alias_nodes = 0
        self.root: Any = None
        self.first_mark: Any = None  # the first document's start

    def documents(self, *, single: bool) -> list[Any]:
        get = self.events.get_event
        stack = self.stack
        docs: list[Any] = []
        try:
            get()  # the stream's start
            while True:
                event: Any = get()
                kind = type(event)
                if kind is ScalarEvent:
                    self._check_depth(event)
                    self._put(self._scalar_value(event), event.value, event.anchor, event.start_mark)
                elif kind is MappingStartEvent or kind is SequenceStartEvent:
                    self._start(event, kind is MappingStartEvent)
                elif kind is MappingEndEvent or kind is SequenceEndEvent:
                    frame = stack.pop()
                    if frame[3] is not None:
                        self.anchors[frame[3]][1] = self.composed - frame[4]
                    if not stack:
                        self.root = frame[0]
                elif kind is AliasEvent:
                    self._alias(event)
                elif kind is DocumentStartEvent:
                    if single and docs:
                        raise ComposerError(
                            "expected a single document in the stream",
                            self.first_mark,
                            "but found another document",
                            event.start_mark,
                        )
                    self.first_mark = event.start_mark
                    self.root = None
                elif kind is DocumentEndEvent:
                    docs.append(self.root)
                    self.anchors = {}  # anchors do not reach past their document
                elif kind is StreamEndEvent:
                    return docs
                else:  # pragma: no cover - libyaml has no other events
                    raise _Exact
        finally:
            self.events.dispose()

    def _check_depth(self, event: Any) -> None:
        if len(self.stack) >= MAX_DEPTH:
            raise self._limit(event, f"nested deeper than {MAX_DEPTH} levels (the limit)")

    def _key_due(self) -> bool:
        return bool(self.stack) and self.stack[-1][1] is _DUE

    def _scalar_value(self, event: Any) -> Any:
        text = event.value
        tag = event.tag
        if tag is not None and tag != "!":
            if tag in _KEY_TAGS and self._key_due():
                raise _Exact
            return self._scalar(tag, event)
        if not event.implicit[0]:  # quoted or a block scalar: a string, held once however often it is
            return self.strings.setdefault(text, text)  # written (JSON's keys, a domain's name)
        if text in ("<<", "=") and self._key_due():
            raise _Exact
        value = self.plain.get(text, _DUE)
        if value is _DUE:
            tag = self.events.resolve(ScalarNode, text, (True, False))
            value = self._scalar(tag, event)
            self.plain[text] = value
        return value

    def _start(self, event: Any, mapping: bool) -> None:
        self._check_depth(event)
        if event.tag not in (_MAP_TAGS if mapping else _SEQ_TAGS):
            raise _Exact
        if self._key_due():
            raise _Exact  # a collection as a mapping key
        value: Any = {} if mapping else []
        self._put(value, "", event.anchor, event.start_mark, opened=True)
        self.stack.append([value, _DUE if mapping else _SEQ, "", event.anchor, self.composed - 1])

    def _alias(self, event: Any) -> None:
        target = self.anchors.get(event.anchor)
        if target is None:
            raise ComposerError(None, None, f"found undefined alias {event.anchor!r}", event.start_mark)
        size = target[1]
        if size is None:
            raise self._limit(event, f"alias *{event.anchor} repeats a node that contains it")
        self.alias_nodes += size
        self.composed += size - 1  # _put counts one
        if self.alias_nodes > MAX_ALIAS_NODES:
            raise self._limit(
                event,
                f"aliases repeat more than {MAX_ALIAS_NODES} nodes (the limit); "
                "write the values out instead of repeating them with aliases",
            )
        if isinstance(target[0], (list, dict)) and self._key_due():
            raise _Exact  # a collection as a mapping key
        self._put(target[0], target[3] if target[3] is not None else "<key>", None, None)

    def _put(self, value: Any, seg: str, anchor: str | None, mark: Any, *, opened: bool = False) -> None:
        """One more node: ``value`` into the innermost open container (an item, a key or a key's
        value) or as the document, under ``anchor``; a collection enters when it is ``opened``."""
        self.composed += 1
        if anchor is not None:
            first = self.anchors.get(anchor)
            if first is not None:
                raise ComposerError(
                    f"found duplicate anchor {anchor!r}; first occurrence",
                    first[2],
                    "second occurrence",
                    mark,
                )
            self.anchors[anchor] = [value, None if opened else 1, mark, None if opened else seg]
        if not self.stack:
            self.root = value
            return
        frame = self.stack[-1]
        key = frame[1]
        if key is _SEQ:
            frame[0].append(value)
        elif key is _DUE:
            frame[1] = value
            frame[2] = seg
        else:
            frame[0][key] = value
            frame[1] = _DUE

    def _scalar(self, tag: str, event: Any) -> Any:
        """A scalar of ``tag`` as ``SafeConstructor`` makes it, integers bounded in digits."""
        if tag == _STR_TAG:
            return self.strings.setdefault(event.value, event.value)
        if tag == _INT_TAG:
            digits = len(event.value.lstrip("+-").replace("_", ""))
            if digits > MAX_INT_DIGITS:
                raise self._limit(event, f"an integer of {digits} digits (the limit is {MAX_INT_DIGITS})")
        node = ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
        value = self.events.construct_object(node, deep=True)
        del self.events.constructed_objects[node]
        return value

    def _limit(self, event: Any, problem: str) -> _LimitError:
        """The limit error of the node ``event`` starts, with its key path as :class:`_BoundedLoader`
        writes it."""
        path = [""]
        for depth, frame in enumerate(self.stack):
            innermost = depth == len(self.stack) - 1
            if frame[1] is _SEQ:
                path.append(f"[{len(frame[0]) - (0 if innermost else 1)}]")
            else:
                path.append("" if innermost and frame[1] is _DUE else str(frame[2])[:64])
        line = f"line {event.start_mark.line + 1}" if event.start_mark is not None else "?"
        key = _path_text(path)
        return _LimitError(f"{self.source}: {f'{key} ({line})' if key else line}: {problem}")


class _BoundedLoader(Composer, SafeConstructor, Resolver, _ParsedText):
    """PyYAML's composer and ``SafeConstructor`` over libyaml's events, the composer counting depth and
    alias expansion and knowing the key path: what :class:`_EventReader` leaves to PyYAML."""

    def __init__(self, text: str, source: str) -> None:
        _ParsedText.__init__(self, text)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
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
        event: Any = self.peek_event()
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

    def _limit(self, event: Any, problem: str) -> _LimitError:
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
