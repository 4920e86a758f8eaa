from __future__ import annotations

import pathlib

import pytest

from topology.ibnet import IbnetError, parse_ibnetdiscover, parse_many, switch_tree

SAMPLE = (pathlib.Path(__file__).parent / "data" / "two-racks.ibnetdiscover").read_text(encoding="utf-8")
LEAF1, LEAF2 = "2c5eab0300b87b40", "2c5eab0300b87b41"
SPINE, CORE = "2c5eab0300c26280", "2c5eab0300d00001"


def test_parse_nodes_and_links() -> None:
    fabric = parse_ibnetdiscover(SAMPLE, source="two-racks")
    kinds = {g: n.kind for g, n in fabric.nodes.items()}
    assert kinds[LEAF1] == "switch"
    assert kinds["e09d7303007a4bd8"] == "ca"
    assert fabric.nodes["e09d7303007a4bd8"].host == "rack0-tray0"
    assert fabric.nodes["e09d730300aaaa02"].host is None  # description never set
    assert fabric.nodes["2c5eab0300b87b50"].host is None  # SHARP aggregation node
    assert (LEAF1, SPINE) in fabric.links
    assert fabric.nodes[SPINE].ports == 65


def test_switch_tree_levels() -> None:
    tree = switch_tree(parse_ibnetdiscover(SAMPLE))
    assert tree.tier == {LEAF1: 1, LEAF2: 1, SPINE: 2, CORE: 3}
    assert tree.uplinks == {LEAF1: frozenset({SPINE}), LEAF2: frozenset({SPINE}), SPINE: frozenset({CORE})}
    assert tree.host_leaves["e09d7303007a4bd8"] == frozenset({LEAF1})
    assert "2c5eab0300b87b50" not in tree.host_leaves  # aggregation node is not a host
    assert tree.hosts["e09d730300aaaa01"] == "rack1-tray0"
    assert "IBSPINE" in tree.descriptions[SPINE]


def test_merge_of_segments_is_order_independent() -> None:
    half = SAMPLE.split("vendid=0x2c9\ndevid=0x1021", 1)
    a = parse_many([("a", half[0]), ("b", "vendid=0x2c9\ndevid=0x1021" + half[1])])
    b = parse_many([("b", "vendid=0x2c9\ndevid=0x1021" + half[1]), ("a", half[0])])
    assert switch_tree(a) == switch_tree(b)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello world", r"bad:1: not ibnetdiscover topology output"),
        ('[1]\t"S-2c5eab0300c26280"[1]', r"bad:1: port line before any Switch/Ca line"),
        ('Switch\t65 "S-2c5eab0300c26280zz"', r"bad:1: not ibnetdiscover"),
        ('Switch\t65 "S-12345678901234567890"', r"bad:1: not an InfiniBand GUID"),
    ],
    ids=["garbage", "orphan-port", "bad-guid-chars", "guid-too-long"],
)
def test_errors_name_source_and_line(text: str, message: str) -> None:
    with pytest.raises(IbnetError, match=message):
        parse_ibnetdiscover(text, source="bad")


PORTS = """\
CA   134  1 0x7cfe9003003b4bde 4x EDR - SW  1719 10 0x7cfe9003009ce5b0 ( 'o0001 HCA-1' - 'ib-i1l1s01' )
CA   135  1 0x7cfe9003003b4bdf 4x EDR - SW  1719 11 0x7cfe9003009ce5b0 ( 'o0002 HCA-1' - 'ib-i1l1s01' )
SW  1719 10 0x7cfe9003009ce5b0 4x EDR - CA   134  1 0x7cfe9003003b4bde ( 'ib-i1l1s01' - 'o0001 HCA-1' )
SW  1719  1 0x7cfe9003009ce5b0 4x EDR - SW  1516  1 0x7cfe900300b07320 ( 'ib-i1l1s01' - 'ib-i1l2s01' )
SW  2052 37 0x506b4b03005c2740 4x ???                                    'ib-i4l1s01'
"""


def test_ports_format() -> None:
    fabric = parse_ibnetdiscover(PORTS, source="ports")
    assert fabric.nodes["7cfe9003003b4bde"].host == "o0001"
    assert fabric.nodes["506b4b03005c2740"].description == "ib-i4l1s01"
    tree = switch_tree(fabric)
    assert tree.tier == {"7cfe9003009ce5b0": 1, "7cfe900300b07320": 2}
    assert tree.host_leaves["7cfe9003003b4bdf"] == frozenset({"7cfe9003009ce5b0"})
    assert tree.uplinks == {"7cfe9003009ce5b0": frozenset({"7cfe900300b07320"})}
    with pytest.raises(IbnetError, match=r"ports:2: not ibnetdiscover --ports output"):
        parse_ibnetdiscover(PORTS.splitlines()[0] + "\nCA garbage\n", source="ports")
