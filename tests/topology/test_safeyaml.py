"""topology.safeyaml: YAML/JSON within limits, one-line errors naming the source, key path and limit."""

from __future__ import annotations

import pathlib
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


REFERENCE_DOCUMENTS = [
    pytest.param(
        "tiers: [nvlink]\nnodes:\n- {name: n0, gpus: 4, free: 4, domains: {nvlink: d}}\n", id="plan"
    ),
    pytest.param("a: &x [1, 2]\nb: *x\nc: &s text\nd: *s\n", id="anchors"),
    pytest.param("base: &b {x: 1}\nd:\n  <<: *b\n  y: 2\n", id="merge-key"),
    pytest.param("d: {<<: [{a: 1}, {b: 2}], a: 3}\n", id="merge-list"),
    pytest.param(
        "s: !!set {a, b}\no: !!omap [{a: 1}, {b: 2}]\np: !!pairs [{a: 1}]\n", id="tagged-collections"
    ),
    pytest.param("b: !!binary aGVsbG8=\ni: !!int '7'\ns: !!str 7\nf: !!float 1\n", id="tagged-scalars"),
    pytest.param(
        "t: 2001-12-14t21:59:43.10-05:00\nd: 2002-12-14\nx: 0x1f\no: 0o17\ns: 1:30\n", id="implicit"
    ),
    pytest.param("v: [yes, No, ~, null, '', .inf, -.NaN, 1_000, +12, 1.5e+3, '3', \"4\"]\n", id="scalars"),
    pytest.param("? [a, b]\n: 1\n", id="collection-key"),
    pytest.param("? &k [a]\n: 1\n? *k\n: 2\n", id="aliased-collection-key"),
    pytest.param("=: 1\nv: =\n", id="value-key"),
    pytest.param("a: <<\n", id="merge-as-value"),
    pytest.param("k: &a x\n*a : y\n", id="alias-as-key"),
    pytest.param("a: 1\na: 2\n", id="duplicate-key"),
    pytest.param("x: &a 1\ny: &a 2\n", id="duplicate-anchor"),
    pytest.param("x: *nowhere\n", id="undefined-alias"),
    pytest.param("!!python/name:os.system x\n", id="python-tag"),
    pytest.param("a: 1\n---\nb: 2\n", id="two-documents"),
    pytest.param("--- |\n  text\n  lines\n", id="block-scalar"),
    pytest.param("", id="empty"),
    pytest.param("---\n", id="empty-document"),
    pytest.param('{"json": [1, 2.5, null, true, {"k": "v"}], "e": {}}', id="json"),
]


@pytest.mark.parametrize("text", REFERENCE_DOCUMENTS)
def test_values_and_refusals_are_those_of_safe_load(text: str) -> None:
    """Whichever way a document is read (the event reader, or PyYAML's composer and constructor for
    what the event reader leaves to them), its value is ``yaml.safe_load``'s and what it refuses,
    ``yaml.safe_load`` refuses."""
    import yaml

    try:
        expected = list(yaml.safe_load_all(text))
    except yaml.YAMLError:
        with pytest.raises(safeyaml.InputError):
            safeyaml.load_all(text, source="f")
        if text.count("---") < 2:
            with pytest.raises(safeyaml.InputError):
                safeyaml.load(text, source="f")
        return
    assert safeyaml.load_all(text, source="f") == expected
    if len(expected) > 1:
        with pytest.raises(safeyaml.InputError, match=r"^f: not YAML: but found another document \(line 2"):
            safeyaml.load(text, source="f")
    else:
        assert safeyaml.load(text, source="f") == (expected[0] if expected else None)


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(["yes", "no", "~", "1:30", "0x1f", "2002-12-14", "<<", "=", "1_000", ".inf"]),
)
_DATA = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=150, deadline=None)
@given(data=_DATA, flow=st.sampled_from([None, True, False]))
def test_dumped_data_reads_back_as_safe_load_reads_it(data: object, flow: bool | None) -> None:
    import yaml

    text = yaml.safe_dump(data, default_flow_style=flow, allow_unicode=True)
    assert safeyaml.load(text, source="f") == yaml.safe_load(text)


def test_plain_documents_never_take_the_slower_exact_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain data (mappings, sequences, scalars, anchors and aliases: every plan and object file) is
    built from the events in one loop; only what that loop leaves to PyYAML goes the slower way."""
    taken: list[str] = []

    def exact(text: str, source: str, *, single: bool) -> list[object]:
        taken.append(text)
        return [{"exact": True}]

    monkeypatch.setattr(safeyaml, "_exact_documents", exact)
    plain = "tiers: [a]\nnodes:\n- &n {name: x, gpus: 4, domains: {a: d}}\n- *n\n- {name: 'y', gpus: 0x4}\n"
    assert safeyaml.load(plain, source="f")["nodes"][1] == {"name": "x", "gpus": 4, "domains": {"a": "d"}}
    assert taken == []
    assert safeyaml.load("a: {<<: {b: 1}}\n", source="f") == {"exact": True}
    assert safeyaml.load("a: !!set {b}\n", source="f") == {"exact": True}
    assert safeyaml.load("? [a]\n: 1\n", source="f") == {"exact": True}
    assert len(taken) == 3


def test_libyaml_own_depth_bound_is_reported_as_ours_with_the_key_path() -> None:
    """libyaml reads flow collections ahead and refuses more than 1,000 levels itself; the refusal
    is still ours, naming the key path where our bound is crossed."""
    text = "a: {b: " + "[" * 5000 + "]" * 5000 + "}\n"
    with pytest.raises(safeyaml.InputError) as info:
        safeyaml.load(text, source="f")
    assert str(info.value) == (
        f"f: a.b[0][0][0][0][0][0]... (line 1): nested deeper than {safeyaml.MAX_DEPTH} levels (the limit)"
    )
    for exact_too in ("x: {<<: {q: 1}}\n", ""):
        with pytest.raises(safeyaml.InputError, match="nested deeper than"):
            safeyaml.load(exact_too + "a: {b: " + "[" * 5000, source="f")


def test_read_text_reads_regular_files_within_the_limit(tmp_path: pathlib.Path) -> None:
    """``read_text`` goes through the one bounded reader: a FIFO is refused without waiting for a
    writer, a file over ``limit`` is refused, each one line naming the path."""
    import os

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(safeyaml.InputError) as info:
        safeyaml.read_text(fifo)
    assert str(info.value) == f"{fifo}: not a regular file (a FIFO)"
    big = tmp_path / "big.yaml"
    big.write_text("a: 1\n" * 10)
    assert safeyaml.read_text(big, limit=50) == "a: 1\n" * 10
    with pytest.raises(safeyaml.InputError) as info:
        safeyaml.read_text(big, limit=49)
    assert str(info.value) == f"{big}: larger than 49 bytes (the limit)"


def test_without_libyaml_the_same_reader_runs_on_pythons_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PyYAML built without libyaml gives the same events from its Python parser: the same values,
    limits and messages, only slower."""
    import importlib

    import yaml

    monkeypatch.setattr(yaml, "__with_libyaml__", False)
    pure = importlib.reload(safeyaml)
    try:
        assert pure._EVENT_SOURCE is yaml.SafeLoader
        text = "a: &x [1, 2]\nb: *x\nc: {<<: {q: 1}, z: 2}\nd: 2002-12-14\n"
        assert pure.load(text, source="f") == yaml.safe_load(text)
        assert pure.load("n: [x]\n", source="f") == {"n": ["x"]}
        with pytest.raises(
            pure.InputError, match=r"^f: a.b\[0\]\[0\]\[0\]\[0\]\[0\]\[0\]\.\.\. \(line 1\): nested"
        ):
            pure.load("a: {b: " + "[" * 5000, source="f")
    finally:
        monkeypatch.undo()
        importlib.reload(safeyaml)


def test_a_string_written_many_times_is_held_once() -> None:
    """JSON's keys and a domain's name repeat on every node of a cluster file: each distinct text is
    one string object, plain or quoted, so memory follows the distinct values, not the file."""
    text = (
        '[{"domain-name": "nvl-rack-0001"}, {"domain-name": "nvl-rack-0001"}, {domain-name: nvl-rack-0001}]'
    )
    a, b, c = safeyaml.load(text, source="f")
    assert a == b == c == {"domain-name": "nvl-rack-0001"}
    assert next(iter(a)) is next(iter(b)) is next(iter(c))
    assert a["domain-name"] is b["domain-name"]
    plain = safeyaml.load("[nvl-rack-0001, nvl-rack-0001]", source="f")
    assert plain[0] is plain[1]
