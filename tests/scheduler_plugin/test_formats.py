"""The plan file's gang ``mnnvl: required|preferred|off``: read into ``Gang.mnnvl`` (default ``off``,
the gang file says what the extender would resolve from annotations and fabric), validated like the
other fields (one line naming ``gang.mnnvl``, exit 2), and honoured by ``gpu-node-agent plan``."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.commands.plan import main
from scheduler_plugin.formats import FormatError, gang_from_data

# two racks of 4 trays; rack 0's last two trays and rack 1's last are not ready
CLUSTER = {
    "tiers": ["nvlink", "leaf"],
    "nodes": [
        {
            "name": f"n{i}",
            "gpus": 4,
            "domains": {"nvlink": f"nvl{i // 4}", "leaf": "leaf-0"},
            "ready": i not in {2, 3, 7},
        }
        for i in range(8)
    ],
}
ROLE = {"name": "w", "pods": 4, "gpus_per_pod": 4, "subgroup_size": 4, "subgroup_tier": "nvlink"}


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], **gang_fields: Any) -> tuple[int, str]:
    (tmp_path / "c.yaml").write_text(json.dumps(CLUSTER))
    (tmp_path / "g.yaml").write_text(json.dumps({"name": "g", "roles": [ROLE], **gang_fields}))
    code = main(["--cluster", str(tmp_path / "c.yaml"), "--gang", str(tmp_path / "g.yaml")])
    out = capsys.readouterr()
    return code, out.err.strip() if code else out.out


@pytest.mark.parametrize("mode", ["required", "preferred", "off"])
def test_mnnvl_is_read_into_the_gang(mode: str) -> None:
    assert gang_from_data({"roles": [ROLE], "mnnvl": mode}).mnnvl == mode


def test_mnnvl_defaults_to_off() -> None:
    assert gang_from_data({"roles": [ROLE]}).mnnvl == "off"


def test_plan_honours_each_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A subgroup of 4 trays: no rack has 4 ready ones. ``required`` has no plan and says why;
    ``preferred`` and ``off`` place it on one rack, unready trays included."""
    code, out = _run(tmp_path, capsys, mnnvl="required")
    assert code == 0
    result = json.loads(out)
    assert result["feasible"] is False
    assert "mnnvl: required" in result["reason"]
    for mode in ("preferred", "off"):
        code, out = _run(tmp_path, capsys, mnnvl=mode)
        assert code == 0
        result = json.loads(out)
        assert result["feasible"] is True, (mode, result)
        assert len({int(n[1:]) // 4 for n in result["placement"].values()}) == 1


def test_plan_required_places_on_ready_trays_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """3 pods fit rack 1's 3 ready trays under ``required``; ``off`` may take rack 0 (fewer ready)."""
    role = {**ROLE, "pods": 3, "subgroup_size": 3}
    (tmp_path / "c.yaml").write_text(json.dumps(CLUSTER))
    (tmp_path / "g.yaml").write_text(json.dumps({"name": "g", "roles": [role], "mnnvl": "required"}))
    assert main(["--cluster", str(tmp_path / "c.yaml"), "--gang", str(tmp_path / "g.yaml")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert sorted(result["placement"].values()) == ["n4", "n5", "n6"]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        pytest.param("Required", "'Required'", id="case"),
        pytest.param("", "''", id="empty"),
        pytest.param(True, "True", id="bool"),
        pytest.param(1, "1", id="number"),
        pytest.param(None, "None", id="null"),
        pytest.param(["required"], "list", id="list"),
        pytest.param({"mode": "required"}, "dict", id="mapping"),
        pytest.param("x" * 100_000, "'xxxx", id="huge"),
    ],
)
def test_bad_mnnvl_is_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: Any, shown: str
) -> None:
    with pytest.raises(FormatError, match=r"^gang\.mnnvl: expected required, preferred or off, got ") as err:
        gang_from_data({"roles": [ROLE], "mnnvl": value})
    assert shown in str(err.value)
    assert len(str(err.value)) < 150
    code, msg = _run(tmp_path, capsys, mnnvl=value)
    assert code == 2
    assert msg.count("\n") == 0, msg
    assert msg.startswith("plan: gang.mnnvl: expected required, preferred or off")
