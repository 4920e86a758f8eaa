"""Hostile ``subgroup-size: auto``: minimums of 0, negative, huge and not numbers, a minimum without
``auto``, ``auto`` beside an elastic minimum or in two roles, and pod counts no size divides. The pod
annotations are a tenant's: each is an invalid gang naming the field (through the extender's state: the
pod unresolvable, one ``InvalidGang`` Event, nothing held); the plan file's are one line and exit 2; what
only the cluster's state decides (no size divides the pods within what the ready trays hold) is the
planner's infeasible reason, never an error."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.commands.plan import main
from scheduler_plugin.extender import ExtenderState
from scheduler_plugin.gangs import GangError, gang_from_annotations
from scheduler_plugin.snapshot import MAX_GANG_PODS
from tests.integration.fakekube import hypernode, node

TIERS = ("nvlink", "leaf")
NS = "ml"
HUGE = "9" * 5000


def _pod(i: int, annotations: dict[str, str], gpus: int = 4) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"p{i}",
            "namespace": NS,
            "uid": f"u{i}",
            "annotations": {"gpuagent.dev/gang": "g", "gpuagent.dev/rank": str(i), **annotations},
        },
        "spec": {
            "schedulerName": "gpu-topology-scheduler",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
    }


def _pods(count: int, annotations: dict[str, str]) -> list[dict[str, Any]]:
    return [_pod(i, annotations) for i in range(count)]


AUTO = {"gpuagent.dev/subgroup-size": "auto", "gpuagent.dev/subgroup-tier": "nvlink"}

ANNOTATION_CASES = [
    pytest.param(
        {**AUTO, "gpuagent.dev/subgroup-size-min": "0"}, "expected an integer >= 1, got 0", id="min-0"
    ),
    pytest.param(
        {**AUTO, "gpuagent.dev/subgroup-size-min": "-3"}, "expected an integer >= 1, got '-3'", id="neg"
    ),
    pytest.param({**AUTO, "gpuagent.dev/subgroup-size-min": HUGE}, "over the limit of", id="min-5000-digits"),
    pytest.param(
        {**AUTO, "gpuagent.dev/subgroup-size-min": str(MAX_GANG_PODS + 1)}, "over the limit of", id="min-huge"
    ),
    pytest.param({**AUTO, "gpuagent.dev/subgroup-size-min": "two"}, "got 'two'", id="min-text"),
    pytest.param({**AUTO, "gpuagent.dev/subgroup-size-min": "1.5"}, "got '1.5'", id="min-float"),
    pytest.param(
        {**AUTO, "gpuagent.dev/subgroup-size-min": "5"},
        "subgroup-size-min 5 is more than the role's 4 pods",
        id="min>pods",
    ),
    pytest.param(
        {"gpuagent.dev/subgroup-size": "2", "gpuagent.dev/subgroup-size-min": "1"},
        "subgroup-size-min is read only with gpuagent.dev/subgroup-size: auto",
        id="min-without-auto",
    ),
    pytest.param(
        {**AUTO, "gpuagent.dev/min-subgroups": "1"},
        "cannot be combined with gpuagent.dev/subgroup-size: auto",
        id="elastic",
    ),
    pytest.param(
        {"gpuagent.dev/subgroup-size": "AUTO"}, "expected an integer >= 1, got 'AUTO'", id="upper-case"
    ),
    pytest.param(
        {"gpuagent.dev/subgroup-size": "auto" * 1000}, "expected an integer >= 1", id="auto-repeated"
    ),
]


@pytest.mark.parametrize(("annotations", "needle"), ANNOTATION_CASES)
def test_hostile_auto_annotations_are_a_gang_error_naming_the_field(
    annotations: dict[str, str], needle: str
) -> None:
    with pytest.raises(GangError, match="gang ml/g") as err:
        gang_from_annotations("ml/g", _pods(4, annotations), TIERS)
    assert needle in str(err.value)
    assert len(str(err.value)) < 300


def test_auto_in_two_roles_is_a_gang_error() -> None:
    pods = [_pod(i, {**AUTO, "gpuagent.dev/role": "ab"[i]}) for i in range(2)]
    for p in pods:
        del p["metadata"]["annotations"]["gpuagent.dev/rank"]
    with pytest.raises(GangError, match=r"roles a and b both have gpuagent\.dev/subgroup-size: auto"):
        gang_from_annotations("ml/g", pods, TIERS)


def test_auto_annotations_read_into_the_role() -> None:
    spec = gang_from_annotations("ml/g", _pods(4, {**AUTO, "gpuagent.dev/subgroup-size-min": " 2 "}), TIERS)
    (role,) = spec.gang.roles
    assert (role.subgroup_size, role.subgroup_auto_min, role.subgroup_tier) == (None, 2, "nvlink")
    assert spec.min_member == 4  # an auto role starts whole
    default = gang_from_annotations("ml/g", _pods(4, AUTO), TIERS)
    assert default.gang.roles[0].subgroup_auto_min == 1


def _state(unready: set[int] = frozenset()) -> ExtenderState:  # type: ignore[assignment]
    s = ExtenderState()
    s.cache.replace(
        "nodes",
        [
            node(
                f"n{i}",
                4,
                labels={
                    "gpuagent.dev/nvlink-domain": "d0",
                    "gpuagent.dev/fabric-health": "healthy",
                    **({} if i in unready else {"nvidia.com/gpu.clique": "c.0"}),
                },
            )
            for i in range(4)
        ],
    )
    s.cache.replace("hypernodes", [hypernode("nvl-0", 1, "nvlink", [f"n{i}" for i in range(4)])])
    return s


@pytest.mark.parametrize(("annotations", "needle"), ANNOTATION_CASES[:3])
def test_state_answers_hostile_auto_unresolvable_and_holds_nothing(
    annotations: dict[str, str], needle: str
) -> None:
    s = _state()
    pods = _pods(4, annotations)
    s.cache.replace("pods", pods)
    names = [f"n{i}" for i in range(4)]
    out = s.filter(pods[0], names, now=1.0)
    assert not out.passed
    assert set(out.unresolvable) == set(names)
    assert needle in next(iter(out.unresolvable.values()))
    assert [e.reason for e in out.events] == ["InvalidGang"]
    assert s.holds.started == {}
    assert s.holds.held_gpus() == {}


def test_state_says_why_no_size_divides_the_pods_and_holds_nothing() -> None:
    """3 pods of minimum 2 on a domain of 4 trays, 2 of them without their clique label: the ready
    trays hold 2 of its pods and no size from 2 to 2 divides 3, which the filter says."""
    s = _state(unready={0, 1})
    pods = _pods(3, {**AUTO, "gpuagent.dev/subgroup-size-min": "2", "gpuagent.dev/gang-size": "3"})
    s.cache.replace("pods", pods)
    out = s.filter(pods[0], [f"n{i}" for i in range(4)], now=1.0)
    assert not out.passed
    msg = next(iter(out.failed.values()))
    assert "no size from 2 (subgroup_size_min) to 2" in msg
    assert "divides its 3 pods into equal subgroups; 2 node(s) not ready left out" in msg
    assert s.holds.held_gpus() == {}


# -- the plan file ----------------------------------------------------------------------------------

CLUSTER = {
    "tiers": ["nvlink", "leaf"],
    "nodes": [
        {
            "name": f"n{i}",
            "gpus": 4,
            "domains": {"nvlink": f"nvl{i // 4}", "leaf": "leaf-0"},
            "ready": i % 4 != 3,
        }
        for i in range(8)
    ],
}


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], cluster: Any, **fields: Any) -> tuple[int, str]:
    gang = {"name": "g", "roles": [{"name": "w", "gpus_per_pod": 4, "subgroup_tier": "nvlink", **fields}]}
    (tmp_path / "c.yaml").write_text(json.dumps(cluster))
    (tmp_path / "g.yaml").write_text(json.dumps(gang))
    code = main(["--cluster", str(tmp_path / "c.yaml"), "--gang", str(tmp_path / "g.yaml")])
    out = capsys.readouterr()
    return code, out.err.strip() if code else out.out


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        pytest.param(
            {"pods": 4, "subgroup_size": "auto", "subgroup_size_min": 0},
            "subgroup_size_min: expected a positive integer",
            id="min-0",
        ),
        pytest.param(
            {"pods": 4, "subgroup_size": "auto", "subgroup_size_min": -1},
            "subgroup_size_min: expected a positive integer",
            id="neg",
        ),
        pytest.param(
            {"pods": 4, "subgroup_size": "auto", "subgroup_size_min": "2"},
            "subgroup_size_min: expected a positive integer",
            id="text",
        ),
        pytest.param(
            {"pods": 4, "subgroup_size": "auto", "subgroup_size_min": 10**6},
            "subgroup_size_min: 1000000 is more than the role's 4 pods",
            id="huge",
        ),
        pytest.param(
            {"pods": 4, "subgroup_size": "auto", "subgroup_size_min": True},
            "subgroup_size_min: expected a positive integer",
            id="bool",
        ),
        pytest.param(
            {"pods": 4, "subgroup_size": "Auto"},
            "subgroup_size: expected a positive integer or auto",
            id="case",
        ),
        pytest.param(
            {"pods": 4, "subgroup_size": 0}, "subgroup_size: expected a positive integer or auto", id="size-0"
        ),
        pytest.param(
            {"pods": 4, "subgroup_size": 2, "subgroup_size_min": 1},
            "subgroup_size_min: only with subgroup_size: auto",
            id="min-without-auto",
        ),
        pytest.param(
            {"pods": 4, "subgroup_size": "auto", "min_subgroups": 1},
            "min_subgroups: a role of subgroup_size auto cannot be elastic",
            id="elastic",
        ),
    ],
)
def test_hostile_auto_in_a_plan_file_is_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fields: dict[str, Any], needle: str
) -> None:
    code, err = _run(tmp_path, capsys, CLUSTER, **fields)
    assert code == 2
    assert err.count("\n") == 0, err
    assert err.startswith("plan: gang.roles[0].")
    assert needle in err


def test_a_huge_minimum_is_refused_without_working_on_its_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(tmp_path, capsys, CLUSTER, pods=4, subgroup_size="auto", subgroup_size_min=10**400)
    assert code == 2
    assert "subgroup_size_min (line 1): an integer of 401 digits" in err  # refused as it is read
    assert len(err) < 400


def test_a_ready_field_that_is_not_a_boolean_names_the_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = {"tiers": ["nvlink"], "nodes": [{"name": "n0", "gpus": 4, "ready": "yes"}]}
    code, err = _run(tmp_path, capsys, cluster, pods=1, subgroup_size="auto")
    assert code == 2
    assert "cluster.nodes[0].ready: expected true or false" in err


def test_auto_in_a_plan_file_reports_the_chosen_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _run(tmp_path, capsys, CLUSTER, pods=6, subgroup_size="auto")
    assert code == 0
    data = json.loads(out)
    assert data["feasible"] is True
    assert data["subgroup_sizes"] == {"w": 3}  # 3 ready trays per rack
    assert not {"n3", "n7"} & set(data["placement"].values())


def test_auto_with_pods_no_size_divides_is_an_infeasible_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _run(tmp_path, capsys, CLUSTER, pods=5, subgroup_size="auto", subgroup_size_min=2)
    assert code == 0
    data = json.loads(out)
    assert data["feasible"] is False
    assert "no size from 2 (subgroup_size_min) to 3" in data["reason"]
    assert "divides its 5 pods into equal subgroups" in data["reason"]
