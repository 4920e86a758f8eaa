"""``gpu-node-agent plan``: the file formats, JSON out, exit codes, one-line errors, --from-cluster."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.cli import main as cli_main
from agent.commands.plan import main
from tests.kubeconfig import token_kubeconfig

CLUSTER = {
    "tiers": ["nvlink", "leaf", "spine"],
    "nodes": [
        {
            "name": f"rack{r}-tray{t}",
            "gpus": 4,
            "free": 4 if (r, t) != (0, 0) else 0,
            "domains": {"nvlink": f"nvl-r{r}", "leaf": "leaf-0", "spine": "spine-0"},
        }
        for r in range(2)
        for t in range(4)
    ],
}
GANG = {
    "name": "train-a",
    "tier": "spine",
    "roles": [
        {"name": "worker", "pods": 4, "gpus_per_pod": 4, "subgroup_size": 4, "subgroup_tier": "nvlink"}
    ],
}


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The command configures process-wide logging; put it back for the tests that follow."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def write(tmp_path: Path, name: str, data: Any) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, Any, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_feasible_plan_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, ["--cluster", write(tmp_path, "c.yaml", CLUSTER), "--gang", write(tmp_path, "g.yaml", GANG)]
    )
    assert code == 0, err
    assert out["feasible"] is True
    assert out["placement"] == {f"worker-{i}": f"rack1-tray{i}" for i in range(4)}
    assert out["subgroups"] == [{"role": "worker", "index": 0, "domain": "nvl-r1"}]
    assert out["score"]["stranded_gpus"] == 0
    assert out["score"]["span_tier_name"] == "nvlink"


def test_infeasible_still_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gang = {**GANG, "roles": [{**GANG["roles"][0], "pods": 5, "subgroup_size": 5}]}
    code, out, _ = run(
        capsys, ["--cluster", write(tmp_path, "c.yaml", CLUSTER), "--gang", write(tmp_path, "g.yaml", gang)]
    )
    assert code == 0
    assert out["feasible"] is False
    assert "nvlink" in out["reason"]


def test_through_the_console_dispatcher(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(
        [
            "plan",
            "--cluster",
            write(tmp_path, "c.yaml", CLUSTER),
            "--gang",
            write(tmp_path, "g.yaml", GANG),
            "--indent",
            "0",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("\n") == 1
    assert json.loads(out)["feasible"] is True


def test_tier_by_number_and_soft_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gang = {
        "name": "g",
        "tier": 3,
        "mode": "soft",
        "roles": [{"pods": 5, "gpus_per_pod": 4, "subgroup_size": 5, "subgroup_tier": 1}],
    }
    code, out, _ = run(
        capsys, ["--cluster", write(tmp_path, "c.yaml", CLUSTER), "--gang", write(tmp_path, "g.yaml", gang)]
    )
    assert code == 0
    assert out["feasible"] is True
    assert out["score"]["relaxed_tiers"] >= 1


def _role(**kw: Any) -> dict[str, Any]:
    return {"gang": {"roles": [{"name": "w", "pods": 1, "gpus_per_pod": 1, **kw}]}}


@pytest.mark.parametrize(
    ("cluster", "gang", "message"),
    [
        pytest.param(
            CLUSTER,
            {"roles": [{"name": "w", "pods": 0, "gpus_per_pod": 4}]},
            "gang.roles[0].pods: expected a positive integer",
            id="zero-pods",
        ),
        pytest.param(
            CLUSTER,
            {"roles": [{"name": "w", "pods": "x", "gpus_per_pod": 4}]},
            "gang.roles[0].pods: expected a positive integer",
            id="pods-string",
        ),
        pytest.param(
            CLUSTER,
            {"roles": [{"name": "w", "pods": 1, "gpus_per_pod": -1}]},
            "gang.roles[0].gpus_per_pod: expected a non-negative integer",
            id="negative-gpus",
        ),
        pytest.param(
            CLUSTER,
            {"roles": [{"name": "w", "pods": 1, "gpus_per_pod": 1, "subgroup_tier": "rack"}]},
            "gang.roles[0].subgroup_tier: unknown tier 'rack'",
            id="unknown-tier",
        ),
        pytest.param(
            CLUSTER,
            {"tier": 9, "roles": [{"name": "w", "pods": 1, "gpus_per_pod": 1}]},
            "gang.tier: tier number 9 out of range",
            id="tier-number",
        ),
        pytest.param(
            CLUSTER,
            {"roles": [{"name": "w", "pods": 1, "gpus_per_pod": 1, "colour": "red"}]},
            "gang.roles[0].colour: unknown field",
            id="unknown-field",
        ),
        pytest.param(CLUSTER, {"roles": []}, "gang.roles: expected at least one role", id="no-roles"),
        pytest.param(
            CLUSTER,
            {"roles": [{"name": "w", "pods": 4, "gpus_per_pod": 1, "subgroup_size": 2, "min_subgroups": 3}]},
            "gang.roles[0].min_subgroups: 3 is more",
            id="min-subgroups",
        ),
        pytest.param(
            CLUSTER,
            {"mode": "maybe", "roles": [{"name": "w", "pods": 1, "gpus_per_pod": 1}]},
            "gang.mode: expected hard or soft",
            id="mode",
        ),
        pytest.param(CLUSTER, [1, 2], "gang: expected a mapping", id="gang-not-a-mapping"),
        pytest.param(
            {"tiers": ["nvlink"], "nodes": [{"name": "a", "gpus": 4, "free": 5}]},
            GANG,
            "cluster.nodes[0].free: 5 is more than gpus (4)",
            id="free-over-gpus",
        ),
        pytest.param(
            {"tiers": ["nvlink"], "nodes": [{"name": "a", "gpus": 4, "domains": {"rack": "x"}}]},
            GANG,
            "cluster.nodes[0].domains.rack: unknown tier",
            id="domain-tier",
        ),
        pytest.param(
            {"tiers": ["nvlink"], "nodes": [{"name": "a", "gpus": 4}, {"name": "a", "gpus": 4}]},
            GANG,
            "cluster.nodes[1].name: duplicate node 'a'",
            id="duplicate-node",
        ),
        pytest.param(
            {"tiers": ["nvlink"], "nodes": "lots"},
            GANG,
            "cluster.nodes: expected a list",
            id="nodes-not-a-list",
        ),
        pytest.param(
            {"tiers": ["nvlink", "nvlink"], "nodes": []},
            GANG,
            "cluster.tiers: tier names must be unique",
            id="dup-tiers",
        ),
        pytest.param(
            {"tiers": ["nvlink"], "nodes": [{"name": "a", "gpus": True}]},
            GANG,
            "cluster.nodes[0].gpus: expected a non-negative integer",
            id="bool-gpus",
        ),
        pytest.param(
            {"tiers": ["nvlink"], "nodes": [{"name": "a", "gpus": 4, "domains": {"nvlink": 7}}]},
            GANG,
            "cluster.nodes[0].domains.nvlink: expected a non-empty string",
            id="domain-not-a-string",
        ),
        pytest.param(
            {"tiers": ["nvlink"], "nodes": [{"name": "a", "gpus": 4, "domains": {"nvlink": ""}}]},
            GANG,
            "cluster.nodes[0].domains.nvlink: expected a non-empty string",
            id="domain-empty",
        ),
        pytest.param(
            {"tiers": ["nvlink"], "nodes": [{"name": "a", "gpus": 4, "domains": ["nvlink"]}]},
            GANG,
            "cluster.nodes[0].domains: expected a mapping",
            id="domains-not-a-mapping",
        ),
        pytest.param(
            {"tiers": ["nvlink"], "nodes": [{"name": "a", "gpus": 4, "rack": 1}]},
            GANG,
            "cluster.nodes[0].rack: unknown field",
            id="node-unknown-field",
        ),
        pytest.param(
            {"tiers": ["nvlink"], "nodes": [{"name": "a", "gpus": 4, "resources": {"cpu": -1}}]},
            GANG,
            "cluster.nodes[0].resources.cpu: expected a non-negative integer",
            id="resources",
        ),
        pytest.param(
            {"tiers": ["nvlink"], "nodes": [{"name": "a", "gpus": 4, "free_resources": {"cpu": "x"}}]},
            GANG,
            "cluster.nodes[0].free_resources.cpu: expected a non-negative integer",
            id="free-resources",
        ),
        pytest.param(
            {"tiers": ["nvlink"], "nodes": [{"name": "a", "gpus": 4, "schedulable": "no"}]},
            GANG,
            "cluster.nodes[0].schedulable: expected true or false",
            id="schedulable",
        ),
        pytest.param(
            {"tiers": ["nvlink"], "nodes": [{"name": "a", "gpus": 4}, "b"]},
            GANG,
            "cluster.nodes[1]: expected a mapping",
            id="node-not-a-mapping",
        ),
    ],
)
def test_invalid_input_exit_2_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cluster: Any, gang: Any, message: str
) -> None:
    code, out, err = run(
        capsys, ["--cluster", write(tmp_path, "c.yaml", cluster), "--gang", write(tmp_path, "g.yaml", gang)]
    )
    assert code == 2
    assert out is None
    assert err.count("\n") == 1
    assert message in err


def test_yaml_syntax_error_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys,
        [
            "--cluster",
            write(tmp_path, "c.yaml", "tiers: [a\nnodes: {"),
            "--gang",
            write(tmp_path, "g.yaml", GANG),
        ],
    )
    assert code == 2
    assert "cluster:" in err
    assert "not YAML" in err
    code, _, err = run(
        capsys, ["--cluster", str(tmp_path / "nope.yaml"), "--gang", write(tmp_path, "g.yaml", GANG)]
    )
    assert code == 2
    assert "cannot read" in err


def test_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--gang", "g.yaml"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["--cluster", "c.yaml", "--gang", "g.yaml", "--kubeconfig", "k"])
    assert exc.value.code == 2
    assert "--kubeconfig needs --from-cluster" in capsys.readouterr().err


def test_from_cluster_reads_the_live_api(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.integration.fakekube import FakeKube, hypernode, node, pod

    fake = FakeKube()
    for r in range(2):
        for t in range(4):
            fake.put("nodes", node(f"r{r}-t{t}", 4))
        fake.put("hypernodes", hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t{t}" for t in range(4)]))
    fake.put("pods", pod("busy", 1, node_name="r0-t2"))
    fake.start()
    try:
        kubeconfig = token_kubeconfig(fake.url)
        gang = {
            "roles": [
                {"name": "w", "pods": 4, "gpus_per_pod": 4, "subgroup_size": 4, "subgroup_tier": "nvlink"}
            ]
        }
        code, out, err = run(
            capsys,
            [
                "--from-cluster",
                "--kubeconfig",
                write(tmp_path, "k.yaml", kubeconfig),
                "--gang",
                write(tmp_path, "g.yaml", gang),
            ],
        )
    finally:
        fake.stop()
    assert code == 0, err
    assert out["subgroups"] == [{"role": "w", "index": 0, "domain": "nvl-1"}]


def test_from_cluster_counts_gpus_through_dra_claims_as_the_extender_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every GPU is served by DRA (no allocatable ``nvidia.com/gpu``): the pools' GPUs are what nodes
    have, and a bound pod's claim allocated on r0-t2 uses one there, so a gang of four whole nodes fits
    only nvl-1 (counted through ``scheduler_plugin.claims``, as the extender counts them)."""
    from agent.commands.plan import DRA
    from tests.integration import fakekube
    from tests.integration.fakekube import FakeKube, hypernode, node
    from tests.scheduler_plugin.test_claims import claim, dra_pod, gpu_slice

    for kind in ("resourceclaims", "resourceslices"):
        monkeypatch.setitem(fakekube.PATHS, DRA + kind, kind)
    fake = FakeKube()
    for r in range(2):
        for t in range(4):
            fake.put("nodes", node(f"r{r}-t{t}", 0))
            fake.put("resourceslices", gpu_slice(f"r{r}-t{t}", 4))
        fake.put("hypernodes", hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t{t}" for t in range(4)]))
    fake.put("resourceclaims", claim("busy", 1, on="r0-t2", devices=("gpu-0",)))
    fake.put("pods", dra_pod("busy", claim_name="busy", node_name="r0-t2"))
    fake.start()
    gang = {
        "roles": [{"name": "w", "pods": 4, "gpus_per_pod": 4, "subgroup_size": 4, "subgroup_tier": "nvlink"}]
    }
    argv = ["--from-cluster", "--kubeconfig", write(tmp_path, "k.yaml", token_kubeconfig("")), "--gang", ""]
    try:
        argv[2] = write(tmp_path, "k.yaml", token_kubeconfig(fake.url))
        argv[4] = write(tmp_path, "g.yaml", gang)
        code, out, err = run(capsys, argv)
        assert code == 0, err
        assert out["subgroups"] == [{"role": "w", "index": 0, "domain": "nvl-1"}]
        fake.put("resourceclaims", claim("busy", 1, on="r1-t0", devices=("gpu-0",)))  # moved: nvl-0 fits
        code, out, err = run(capsys, argv)
        assert code == 0, err
        assert out["subgroups"] == [{"role": "w", "index": 0, "domain": "nvl-0"}]
    finally:
        fake.stop()


def test_from_cluster_unreachable_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys,
        [
            "--from-cluster",
            "--kubeconfig",
            str(tmp_path / "missing"),
            "--gang",
            write(tmp_path, "g.yaml", GANG),
        ],
    )
    assert code == 2
    assert err.startswith("plan: --from-cluster:")
    assert err.count("\n") == 1
