"""Gang sources: Volcano PodGroups and gpuagent.dev annotations, to a Gang and pod indices."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.gangs import (
    GangError,
    gang_for_pod,
    gang_from_annotations,
    gang_from_podgroup,
    gang_key_of,
    pod_rank,
    tier_of,
)
from scheduler_plugin.snapshot import MAX_GANG_PODS, PodSlot

TIERS = ("nvlink", "leaf", "spine")


def mkpod(
    name: str,
    gpus: int = 4,
    *,
    ann: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    cpu: str | None = None,
    ns: str = "ml",
) -> dict[str, Any]:
    res: dict[str, Any] = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    if cpu:
        res.setdefault("requests", {})["cpu"] = cpu
    return {
        "metadata": {"name": name, "namespace": ns, "annotations": ann or {}, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "resources": res}]},
    }


def annotated(name: str, rank: int | None, **extra: str) -> dict[str, Any]:
    ann = {"gpuagent.dev/gang": "job", "gpuagent.dev/gang-size": "4", **extra}
    if rank is not None:
        ann["gpuagent.dev/rank"] = str(rank)
    return mkpod(name, ann=ann)


def podgroup(spec: dict[str, Any], name: str = "pg") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": spec}


def grouped(name: str, *, labels: dict[str, str] | None = None, gpus: int = 4) -> dict[str, Any]:
    return mkpod(name, gpus, ann={"scheduling.k8s.io/group-name": "pg"}, labels=labels)


# -- annotations --------------------------------------------------------------------------------


def test_annotation_gang_with_subgroups_and_ranks() -> None:
    pods = [
        annotated(
            f"w{i}",
            3 - i,
            **{
                "gpuagent.dev/subgroup-size": "2",
                "gpuagent.dev/subgroup-tier": "1",
                "gpuagent.dev/gang-tier": "leaf",
            },
        )
        for i in range(4)
    ]
    spec = gang_from_annotations("ml/job", pods, TIERS)
    (role,) = spec.gang.roles
    assert (role.name, role.pods, role.gpus_per_pod, role.subgroup_size, role.subgroup_tier) == (
        "worker",
        4,
        4,
        2,
        "nvlink",
    )
    assert spec.gang.tier == "leaf"
    assert spec.members == {
        "ml/w0": PodSlot("worker", 3),
        "ml/w1": PodSlot("worker", 2),
        "ml/w2": PodSlot("worker", 1),
        "ml/w3": PodSlot("worker", 0),
    }
    assert spec.min_member == 4
    assert spec.source == "annotations"


def test_annotation_gang_with_missing_pods_and_unranked_ones() -> None:
    pods = [annotated("b", None), annotated("a", None), annotated("z", 0)]
    spec = gang_from_annotations("ml/job", pods, TIERS)
    assert spec.gang.roles[0].pods == 4  # the gang size, not the pods seen so far
    assert spec.members == {
        "ml/z": PodSlot("worker", 0),
        "ml/a": PodSlot("worker", 1),
        "ml/b": PodSlot("worker", 2),
    }


def test_completion_index_is_the_rank() -> None:
    p = mkpod("x", labels={"batch.kubernetes.io/job-completion-index": "7"})
    assert pod_rank(p) == 7
    assert pod_rank(mkpod("y")) is None


def test_annotation_roles_and_soft_mode() -> None:
    head = mkpod(
        "head",
        0,
        ann={"gpuagent.dev/gang": "rl", "gpuagent.dev/role": "head", "gpuagent.dev/topology-mode": "soft"},
    )
    workers = [
        mkpod(
            f"w{i}",
            ann={
                "gpuagent.dev/gang": "rl",
                "gpuagent.dev/rank": str(i),
                "gpuagent.dev/topology-mode": "soft",
            },
        )
        for i in range(2)
    ]
    spec = gang_from_annotations("ml/rl", [head, *workers], TIERS)
    assert [(r.name, r.pods, r.gpus_per_pod) for r in spec.gang.roles] == [("head", 1, 0), ("worker", 2, 4)]
    assert spec.gang.soft
    assert spec.members["ml/head"] == PodSlot("head", 0)


@pytest.mark.parametrize(
    ("pods", "needle"),
    [
        pytest.param(
            [annotated("a", 0), mkpod("b", ann={"gpuagent.dev/gang": "job", "gpuagent.dev/gang-size": "3"})],
            "disagree on gpuagent.dev/gang-size",
            id="size-disagrees",
        ),
        pytest.param([annotated("a", 0), annotated("b", 0)], "share rank 0", id="duplicate-rank"),
        pytest.param([annotated("a", 9)], "rank 9, outside 0..3", id="rank-out-of-range"),
        pytest.param(
            [annotated("a", 0, **{"gpuagent.dev/subgroup-tier": "rack"})],
            "unknown tier 'rack'",
            id="unknown-tier",
        ),
        pytest.param(
            [annotated("a", 0, **{"gpuagent.dev/subgroup-tier": "9"})],
            "tier 9 is not a cluster tier",
            id="tier-number",
        ),
        pytest.param(
            [mkpod("a", ann={"gpuagent.dev/gang": "job", "gpuagent.dev/gang-size": "many"})],
            "gpuagent.dev/gang-size: expected an integer",
            id="size-not-a-number",
        ),
        pytest.param(
            [annotated("a", 0, **{"gpuagent.dev/topology-mode": "maybe"})],
            "expected hard or soft",
            id="bad-mode",
        ),
        pytest.param(
            [annotated("a", 0), {**mkpod("b", 8), "metadata": {**annotated("b", 1)["metadata"]}}],
            "request different resources",
            id="mixed-gpus-in-a-role",
        ),
    ],
)
def test_annotation_errors_name_the_field(pods: list[dict[str, Any]], needle: str) -> None:
    with pytest.raises(GangError, match=needle.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        gang_from_annotations("ml/job", pods, TIERS)


# -- PodGroup -----------------------------------------------------------------------------------


def test_podgroup_with_partitions_by_match_label_keys() -> None:
    pg = podgroup(
        {
            "minMember": 4,
            "networkTopology": {"mode": "hard", "highestTierAllowed": 2},
            "subGroupPolicy": [
                {
                    "name": "worker",
                    "subGroupSize": 2,
                    "minSubGroups": 1,
                    "labelSelector": {"matchLabels": {"volcano.sh/task-spec": "worker"}},
                    "matchLabelKeys": ["volcano.sh/partition-id"],
                    "networkTopology": {"mode": "hard", "highestTierName": "nvlink"},
                }
            ],
        }
    )
    pods = [
        grouped(
            f"w{p}{i}",
            labels={
                "volcano.sh/task-spec": "worker",
                "volcano.sh/partition-id": str(p),
                "batch.kubernetes.io/job-completion-index": str(i),
            },
        )
        for p in (1, 0)
        for i in range(2)
    ]
    spec = gang_from_podgroup(pg, pods, TIERS)
    (role,) = spec.gang.roles
    assert (role.name, role.pods, role.subgroup_size, role.subgroup_tier, role.min_subgroups) == (
        "worker",
        4,
        2,
        "nvlink",
        1,
    )
    assert spec.gang.tier == "leaf"
    # partition 0 holds indices 0-1, partition 1 holds 2-3
    assert spec.members == {
        "ml/w00": PodSlot("worker", 0),
        "ml/w01": PodSlot("worker", 1),
        "ml/w10": PodSlot("worker", 2),
        "ml/w11": PodSlot("worker", 3),
    }
    assert spec.min_member == 4  # minMember wins over the elastic minimum of 2


def test_podgroup_without_policies_and_elastic_min_member() -> None:
    pods = [grouped(f"p{i}") for i in range(3)]
    spec = gang_from_podgroup(podgroup({"minMember": 2}), pods, TIERS)
    (role,) = spec.gang.roles
    assert (role.name, role.pods, role.subgroup_size, role.min_subgroups) == ("default", 3, 1, 2)
    assert spec.min_member == 2


def test_podgroup_expecting_pods_not_created_yet() -> None:
    spec = gang_from_podgroup(podgroup({"minMember": 8}), [grouped("p0")], TIERS)
    assert spec.gang.roles[0].pods == 8
    assert spec.min_member == 8


def test_podgroup_match_expressions_and_default_role() -> None:
    pg = podgroup(
        {
            "subGroupPolicy": [
                {
                    "name": "w",
                    "subGroupSize": 2,
                    "labelSelector": {
                        "matchExpressions": [{"key": "role", "operator": "In", "values": ["worker"]}]
                    },
                }
            ]
        }
    )
    pods = [
        grouped("w0", labels={"role": "worker"}),
        grouped("w1", labels={"role": "worker"}),
        grouped("h", gpus=0),
    ]
    spec = gang_from_podgroup(pg, pods, TIERS)
    assert [(r.name, r.pods, r.gpus_per_pod) for r in spec.gang.roles] == [("w", 2, 4), ("default", 1, 0)]


@pytest.mark.parametrize(
    ("selector", "chosen"),
    [
        pytest.param(None, {"a", "b", "c"}, id="none-selects-all"),
        pytest.param({}, {"a", "b", "c"}, id="empty-selects-all"),
        pytest.param({"matchLabels": {"t": "w"}}, {"a", "b"}, id="match-labels"),
        pytest.param(
            {"matchExpressions": [{"key": "t", "operator": "In", "values": ["w", "x"]}]}, {"a", "b"}, id="in"
        ),
        pytest.param(
            {"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["w"]}]},
            {"c"},
            id="not-in-absent",
        ),
        pytest.param({"matchExpressions": [{"key": "z", "operator": "Exists"}]}, {"b"}, id="exists"),
        pytest.param(
            {"matchExpressions": [{"key": "z", "operator": "DoesNotExist", "values": []}]},
            {"a", "c"},
            id="absent",
        ),
        pytest.param(
            {"matchLabels": {"t": "w"}, "matchExpressions": [{"key": "z", "operator": "DoesNotExist"}]},
            {"a"},
            id="all-requirements",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "t", "operator": "In", "values": ["ww"]}]}, set(), id="whole-value"
        ),
    ],
)
def test_podgroup_label_selector_semantics(selector: Any, chosen: set[str]) -> None:
    """Requirements are ANDed; NotIn and DoesNotExist hold for a pod without the label; a value matches
    whole, never as a part of a string."""
    pods = [grouped("a", labels={"t": "w"}), grouped("b", labels={"t": "w", "z": ""}), grouped("c")]
    pg = podgroup({"subGroupPolicy": [{"name": "s", "labelSelector": selector}]})
    spec = gang_from_podgroup(pg, pods, TIERS)
    assert {k.removeprefix("ml/") for k, slot in spec.members.items() if slot.role == "s"} == chosen


@pytest.mark.parametrize(
    ("spec", "pods", "needle"),
    [
        pytest.param(
            {"networkTopology": {"highestTierAllowed": 1, "highestTierName": "nvlink"}},
            [grouped("a")],
            "only one of highestTierAllowed and highestTierName",
            id="both-tier-fields",
        ),
        pytest.param(
            {"networkTopology": {"highestTierName": "rack"}},
            [grouped("a")],
            "unknown tier 'rack'",
            id="unknown-tier-name",
        ),
        pytest.param(
            {"networkTopology": {"mode": "sometimes"}}, [grouped("a")], "expected hard or soft", id="bad-mode"
        ),
        pytest.param(
            {"minMember": 5, "subGroupPolicy": [{"name": "w", "subGroupSize": 1}]},
            [grouped("a")],
            "minMember 5",
            id="min-member-too-big",
        ),
        pytest.param(
            {"subGroupPolicy": [{"name": "a"}, {"name": "b"}]},
            [grouped("x")],
            "matches both subGroupPolicy 'a' and 'b'",
            id="overlapping-policies",
        ),
        pytest.param(
            {"subGroupPolicy": [{"name": "w", "subGroupSize": 1, "matchLabelKeys": ["part"]}]},
            [grouped("x")],
            "lacks label",
            id="missing-match-label",
        ),
        pytest.param(
            {"subGroupPolicy": [{"name": "w", "subGroupSize": 1, "matchLabelKeys": ["part"]}]},
            [grouped("x", labels={"part": "0"}), grouped("y", labels={"part": "0"})],
            "more than subGroupSize 1",
            id="instance-too-big",
        ),
        pytest.param(
            {"subGroupPolicy": [{"name": "w", "subGroupSize": 0}]},
            [grouped("x")],
            "subGroupSize",
            id="zero-size",
        ),
        pytest.param(
            {"subGroupPolicy": [{"name": "w", "subGroupSize": 1, "minSubGroups": 3}]},
            [grouped("x")],
            "minSubGroups: 3 is more",
            id="min-subgroups-too-big",
        ),
        pytest.param({"minMember": "lots"}, [grouped("x")], "spec.minMember", id="min-member-not-a-number"),
    ],
)
def test_contradictory_podgroups_raise(spec: dict[str, Any], pods: list[dict[str, Any]], needle: str) -> None:
    with pytest.raises(GangError) as err:
        gang_from_podgroup(podgroup(spec), pods, TIERS)
    assert needle in str(err.value)
    assert "PodGroup ml/pg" in str(err.value)


# -- joining ------------------------------------------------------------------------------------


def test_gang_for_pod_joins_by_annotation_and_namespace() -> None:
    mine = grouped("a")
    other_ns = {**grouped("b"), "metadata": {**grouped("b")["metadata"], "namespace": "other"}}
    pgs = {"ml/pg": podgroup({"minMember": 1})}
    spec = gang_for_pod(mine, [mine, other_ns], pgs, TIERS)
    assert spec is not None
    assert set(spec.members) == {"ml/a"}
    assert gang_for_pod(mkpod("solo"), [], pgs, TIERS) is None
    assert gang_key_of(mkpod("x", ann={"gpuagent.dev/gang": "g"})) == ("annotations", "ml/g")


def test_gang_for_pod_with_missing_podgroup() -> None:
    with pytest.raises(GangError, match="PodGroup ml/pg"):
        gang_for_pod(grouped("a"), [], {}, TIERS)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("nvlink", "nvlink"), (2, "leaf"), ("3", "spine")],
)
def test_tier_by_name_or_number(value: object, expected: str) -> None:
    assert tier_of(value, TIERS, "x") == expected


# -- limits ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        pytest.param(
            {"gpuagent.dev/gang-size": "1000000000"}, "gpuagent.dev/gang-size: 1000000000 is over", id="size"
        ),
        pytest.param(
            {"gpuagent.dev/gang-size": "10001"}, "gpuagent.dev/gang-size: 10001 is over", id="size-plus-one"
        ),
        pytest.param(
            {"gpuagent.dev/gang-size": "9" * 5000}, "999999999999... (5000 digits) is over", id="digits"
        ),
        pytest.param(
            {"gpuagent.dev/subgroup-size": "20000"}, "gpuagent.dev/subgroup-size: 20000 is over", id="sub"
        ),
        pytest.param(
            {"gpuagent.dev/min-subgroups": "20000"}, "gpuagent.dev/min-subgroups: 20000 is over", id="min"
        ),
        pytest.param({"gpuagent.dev/rank": "1" * 30}, "gpuagent.dev/rank: rank 1111", id="rank"),
    ],
)
def test_annotation_sizes_are_bounded_naming_the_annotation_and_limit(
    extra: dict[str, str], needle: str
) -> None:
    p = annotated("w0", None, **extra)
    with pytest.raises(GangError) as err:
        gang_from_annotations("ml/job", [p], TIERS)
    assert needle in str(err.value)
    assert f"limit of {MAX_GANG_PODS} pods per gang" in str(err.value)


def test_the_limit_itself_is_accepted() -> None:
    spec = gang_from_annotations(
        "ml/job", [annotated("w0", 0, **{"gpuagent.dev/gang-size": str(MAX_GANG_PODS)})], TIERS
    )
    assert spec.gang.roles[0].pods == MAX_GANG_PODS


@pytest.mark.parametrize("value", ["²", "٣", "1²"], ids=["superscript", "arabic-indic", "mixed"])
def test_unicode_digits_are_not_numbers(value: str) -> None:
    with pytest.raises(GangError, match="expected an integer"):
        gang_from_annotations("ml/job", [annotated("w0", None, **{"gpuagent.dev/gang-size": value})], TIERS)
    with pytest.raises(GangError, match="unknown tier"):
        tier_of(value, TIERS, "where")
    assert pod_rank(mkpod("p", ann={"gpuagent.dev/rank": value})) is None


def test_podgroup_over_the_limit_in_all_its_roles() -> None:
    spec = {
        "subGroupPolicy": [
            {"name": "a", "subGroupSize": 6000, "labelSelector": {"matchLabels": {"r": "a"}}},
            {"name": "b", "subGroupSize": 6000, "labelSelector": {"matchLabels": {"r": "b"}}},
        ]
    }
    pods = [grouped("a0", labels={"r": "a"}), grouped("b0", labels={"r": "b"})]
    with pytest.raises(GangError, match="its roles' 12000 pods is over the limit of 10000 pods per gang"):
        gang_from_podgroup(podgroup(spec), pods, TIERS)
