"""The scheduler plugin's shape (issue 28): no class in ``scheduler_plugin``, its extender included, has
more than ``MAX_METHODS`` methods (each ``def``/``async def`` in its body, properties included), so no
class grows back into one that owns the informer store, the holds, the queue and the verbs at once."""

from __future__ import annotations

import ast
from pathlib import Path

import scheduler_plugin

MAX_METHODS = 20
ROOT = Path(scheduler_plugin.__file__).parent


def definitions(source: str) -> list[tuple[str, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every class and function of ``source``, nested ones too, by its dotted name, in source order."""
    out: list[tuple[str, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                out.append((prefix + node.name, node))
                visit(node.body, f"{prefix}{node.name}.")

    visit(ast.parse(source).body, "")
    return out


def methods_per_class(source: str) -> dict[str, int]:
    """Each class of ``source`` (nested ones by their dotted name) -> the functions defined in its body."""
    return {
        name: sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in node.body)
        for name, node in definitions(source)
        if isinstance(node, ast.ClassDef)
    }


def test_the_count_sees_methods_properties_and_nested_classes() -> None:
    source = (
        "class A:\n"
        "    x = 1\n"
        "    def a(self): pass\n"
        "    async def b(self): pass\n"
        "    @property\n"
        "    def c(self): return 1\n"
        "    class B:\n"
        "        def d(self):\n"
        "            def inner(): pass\n"
        "def f():\n"
        "    class C:\n"
        "        def e(self): pass\n"
    )
    assert methods_per_class(source) == {"A": 3, "A.B": 1, "f.C": 1}


def test_no_class_in_scheduler_plugin_has_more_than_20_methods() -> None:
    files = sorted(ROOT.rglob("*.py"))
    counts = {
        f"{path.relative_to(ROOT.parent)}:{name}": n
        for path in files
        for name, n in methods_per_class(path.read_text(encoding="utf-8")).items()
    }
    # the scan sees the extender's parts and the planner's classes
    assert counts["scheduler_plugin/extender/cache.py:Cache"] > 10
    assert counts["scheduler_plugin/planner/prepared.py:PreparedSnapshot"] > 10
    over = {name: n for name, n in counts.items() if n > MAX_METHODS}
    assert over == {}, f"classes over {MAX_METHODS} methods (split them by what they own): {over}"


# -- one reservation type, one clock (issue 28) ---------------------------------------------------------


def hold_types(source: str) -> list[str]:
    """The classes of ``source`` (nested ones by their dotted name) whose name says they are a hold: it
    ends in ``Reservation`` or ``Hold``."""
    return [
        name
        for name in methods_per_class(source)
        if name.rsplit(".", 1)[-1].endswith(("Reservation", "Hold"))
    ]


def wall_parameters(source: str) -> list[str]:
    """The functions and methods of ``source`` (dotted by their class) that take a parameter ``wall``."""
    return [
        name
        for name, node in definitions(source)
        if not isinstance(node, ast.ClassDef)
        and any(p.arg == "wall" for p in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs))
    ]


def test_the_scans_see_hold_types_and_wall_parameters() -> None:
    source = (
        "class Reservation: pass\n"
        "class GangHold: pass\n"
        "class Reservations: pass\n"
        "class Holds:\n"
        "    def tick(self, now, wall): pass\n"
        "    def run(self, *, wall): pass\n"
        "    def fine(self, now, walls): pass\n"
        "    class QueueReservation: pass\n"
        "def f(wall, /): pass\n"
    )
    assert hold_types(source) == ["Reservation", "GangHold", "Holds.QueueReservation"]
    assert wall_parameters(source) == ["Holds.tick", "Holds.run", "f"]


def test_scheduler_plugin_has_one_hold_type_and_its_state_one_clock() -> None:
    """Every hold (a started gang's, the queue's head's, a given-up plan's) is the queue's
    ``Reservation``; no function of the extender takes a second clock (``wall``) beside ``now``."""
    files = sorted(ROOT.rglob("*.py"))
    types = [
        f"{path.relative_to(ROOT.parent)}:{name}"
        for path in files
        for name in hold_types(path.read_text(encoding="utf-8"))
    ]
    assert types == ["scheduler_plugin/queue.py:Reservation"]
    extender = sorted((ROOT / "extender").glob("*.py"))
    assert len(extender) > 10  # the scan sees the extender's modules
    walls = [
        f"{path.name}:{name}"
        for path in extender
        for name in wall_parameters(path.read_text(encoding="utf-8"))
    ]
    assert walls == []
