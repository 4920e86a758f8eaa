"""topology.safeyaml: YAML/JSON within limits, one-line errors naming the source, key path and limit."""

from __future__ import annotations

import pathlib
import sys

import pytest

from topology import safeyaml


def test_ordinary_documents_load_as_with_safe_load() -> None:
    text = "base: &b {x: 1, y: [1, 2]}\nderived:\n  <<: *b\n  z: 3\nlist: [*b, *b]\n"
    assert safeyaml.load(text, source="f") == {
        "base": {"x": 1, "y": [1, 2]},
        "derived": {"x": 1, "y": [1, 2], "z": 3},
        "list": [{"x": 1, "y": [1, 2]}, {"x": 1, "y": [1, 2]}],
    }
    assert safeyaml.load("", source="f") is None
    assert safeyaml.load_all("a: 1\n---\nb: 2\n---\n", source="f") == [{"a": 1}, {"b": 2}, None]
    assert safeyaml.load('{"json": [1, 2.5, null, true]}', source="f") == {"json": [1, 2.5, None, True]}


def test_anchors_do_not_reach_past_their_document() -> None:
    with pytest.raises(safeyaml.InputError, match=r"^f: not YAML: found undefined alias 'a' \(line 3"):
        safeyaml.load_all("x: &a [1]\n---\ny: *a\n", source="f")


def test_depth_limit_holds_below_the_recursion_limit() -> None:
    depth = safeyaml.MAX_DEPTH
    assert safeyaml.load("[" * depth + "]" * depth, source="f") is not None
    with pytest.raises(safeyaml.InputError) as info:
        safeyaml.load("[" * (depth + 1) + "]" * (depth + 1), source="f")
    assert (
        str(info.value)
        == f"f: [0][0][0][0][0][0][0][0]... (line 1): nested deeper than {depth} levels (the limit)"
    )
    # the bound is checked before PyYAML recurses, so even a low recursion limit is not reached
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(400)
    try:
        with pytest.raises(safeyaml.InputError):
            safeyaml.load("[" * 100_000, source="f")
    finally:
        sys.setrecursionlimit(limit)


def test_alias_expansion_is_counted_by_the_size_of_what_each_alias_repeats() -> None:
    width = 100
    ok = f"a: &a [{', '.join(['x'] * width)}]\nb: [{', '.join(['*a'] * 90)}]\n"  # 90 * 101 nodes
    assert len(safeyaml.load(ok, source="f")["b"]) == 90
    over = f"a: &a [{', '.join(['x'] * width)}]\nb: [{', '.join(['*a'] * 100)}]\n"
    with pytest.raises(safeyaml.InputError, match=r"^f: b\[99\] \(line 2\): aliases repeat more than 10000"):
        safeyaml.load(over, source="f")


def test_integers_are_bounded_in_digits_not_in_value() -> None:
    assert safeyaml.load(f"n: {'9' * safeyaml.MAX_INT_DIGITS}", source="f")["n"] > 0
    with pytest.raises(safeyaml.InputError, match=r"^f: n \(line 1\): an integer of 101 digits"):
        safeyaml.load(f"n: -{'9' * (safeyaml.MAX_INT_DIGITS + 1)}", source="f")
    assert safeyaml.load(f"s: '{'9' * 5000}'", source="f")["s"] == "9" * 5000  # a string is a string


def test_python_tags_are_refused_as_by_safe_load() -> None:
    with pytest.raises(safeyaml.InputError, match=r"^f: not YAML: could not determine a constructor"):
        safeyaml.load("!!python/object/apply:os.system ['true']", source="f")


def test_read_text_names_the_first_byte_that_is_not_utf8(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes("version: v1\nname: é\n".encode())
    assert safeyaml.read_text(path) == "version: v1\nname: é\n"
    path.write_bytes(b"version: v1\n\xe9\n")
    with pytest.raises(safeyaml.InputError) as info:
        safeyaml.read_text(path)
    assert str(info.value) == f"{path}: not UTF-8 text (byte 0xe9 at offset 12)"
    with pytest.raises(FileNotFoundError):
        safeyaml.read_text(tmp_path / "missing.yaml")
