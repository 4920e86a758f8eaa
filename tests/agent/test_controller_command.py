"""``discover --output gpunode`` and ``controller --once --from DIR`` on simulated nodes, end to end."""

from __future__ import annotations

import io
import json
import logging
import pathlib
from collections.abc import Iterator

import pytest
import yaml

from agent.commands import controller as controller_command
from agent.commands import discover
from agent.nvml.sim_sysfs import ibnetdiscover_sample
from agent.nvml.simulate import parse_spec
from topology import logs

SPECS = {
    **{f"rack{r}-tray{t}": f"gb200-nvl72:rack={r},tray={t}" for r in range(2) for t in range(3)},
    "h100-0": "dgx-h100",
}


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("cluster")
    for name, spec in SPECS.items():
        opts = discover.parse_options(["--simulate", spec, "--node-name", name, "--output", "gpunode"])
        (d / f"{name}.yaml").write_text(discover.render_gpunode(discover.run(opts), opts), encoding="utf-8")
    racks = [parse_spec(s) for s in SPECS.values() if s.startswith("gb200")]
    (d / "fabric.ibnetdiscover").write_text(ibnetdiscover_sample(racks), encoding="utf-8")
    return d


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The command configures process-wide logging; put it back for the tests that follow."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = controller_command.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_discover_prints_the_gpunode(cluster_dir: pathlib.Path) -> None:
    obj = yaml.safe_load((cluster_dir / "rack1-tray2.yaml").read_text(encoding="utf-8"))
    assert obj["kind"] == "GPUNode"
    assert obj["metadata"]["name"] == "rack1-tray2"
    assert obj["status"]["summary"]["gpus"] == 4
    assert obj["status"]["summary"]["fabric"] == "ok"


def test_once_from_dir_prints_the_hypernodes(
    cluster_dir: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["--once", "--from", str(cluster_dir)], capsys)
    assert code == 0
    objs = list(yaml.safe_load_all(out))
    by_tier: dict[str, list[dict[str, object]]] = {}
    for o in objs:
        by_tier.setdefault(o["spec"]["tierName"], []).append(o)
    assert len(by_tier["nvlink"]) == 3  # two racks and the DGX H100 on its own
    rack_domains = [o for o in by_tier["nvlink"] if len(o["spec"]["members"]) == 3]
    assert len(rack_domains) == 2
    assert by_tier["leaf"]  # from the simulated fabric
    code, out_json, _ = run(["--once", "--from", str(cluster_dir), "--output", "json"], capsys)
    assert code == 0
    assert json.loads(out_json)["items"] == objs


def test_exports(
    cluster_dir: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "topology.conf"
    code, _, _ = run(
        ["--once", "--from", str(cluster_dir), "--export", "slurm", "--output", str(target)], capsys
    )
    assert code == 0
    text = target.read_text(encoding="utf-8")
    assert "Nodes=rack0-tray[0-2]" in text
    assert "BlockSizes=" in text
    code, out, _ = run(
        ["--once", "--from", str(cluster_dir), "--export", "slurm", "--slurm-form", "tree", "--output", "-"],
        capsys,
    )
    assert "SwitchName=leaf-" in out
    code, out, _ = run(["--once", "--from", str(cluster_dir), "--export", "kueue", "--output", "-"], capsys)
    docs = list(yaml.safe_load_all(out))
    assert docs[0]["kind"] == "Topology"
    assert {d["metadata"]["name"] for d in docs[1:]} == set(SPECS)
    code, out, _ = run(["--once", "--from", str(cluster_dir), "--export", "labels", "--output", "-"], capsys)
    labels = {d["metadata"]["name"]: d["metadata"]["labels"] for d in yaml.safe_load_all(out)}
    assert labels["rack0-tray0"]["accelerator.topograph.run/domain"].endswith(".32766")


def test_bad_gpunode_is_skipped_with_one_line(
    cluster_dir: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "c"
    d.mkdir()
    for f in cluster_dir.iterdir():
        (d / f.name).write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
    broken = yaml.safe_load((d / "rack0-tray0.yaml").read_text(encoding="utf-8"))
    broken["status"]["inventory"]["gpus"][0]["index"] = "zero"
    (d / "rack0-tray0.yaml").write_text(yaml.safe_dump(broken), encoding="utf-8")
    code, out, err = run(["--once", "--from", str(d)], capsys)
    assert code == 0
    assert (
        "skipped: GPUNode 'rack0-tray0': status.inventory: NodeInventory.gpus[0].index: expected int" in err
    )
    assert "rack0-tray1" in out
    assert "rack0-tray0" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "x"], "--from DIR works with --once"),
        (["--once", "--from", "/nonexistent-dir"], "not a directory"),
        (["--once", "--from", ".", "--export", "slurm"], "--export needs --output"),
        (["--once", "--from", ".", "--output", "xml"], "yaml or json"),
    ],
    ids=["from-without-once", "missing-dir", "export-without-output", "bad-format"],
)
def test_usage_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(args, capsys)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1


def test_settings_precedence_cli_over_env_over_file(tmp_path: pathlib.Path) -> None:
    cfg = tmp_path / "controller.yaml"
    cfg.write_text("version: v1\nunhealthyFabric: exclude\nslurmForm: tree\n", encoding="utf-8")
    values = controller_command.file_and_env_defaults(str(cfg), {})
    assert values == {"unhealthy_fabric": "exclude", "slurm_form": "tree"}
    env = {"GPU_TOPOLOGY_UNHEALTHY_FABRIC": "keep"}
    assert controller_command.file_and_env_defaults(str(cfg), env)["unhealthy_fabric"] == "keep"
    p = controller_command.parser()
    p.set_defaults(**controller_command.file_and_env_defaults(str(cfg), env))
    assert p.parse_args([]).unhealthy_fabric == "keep"
    assert p.parse_args(["--unhealthy-fabric", "isolate"]).unhealthy_fabric == "isolate"


@pytest.mark.parametrize(
    "case",
    [
        ("version: v1\nsurprise: 1\n", {}, "unknown key 'surprise'"),
        ("version: v2\n", {}, "version: v1"),
        ("version: v1\nunhealthyFabric: maybe\n", {}, "unhealthyFabric: 'maybe' is not a valid FabricPolicy"),
        (
            "version: v1\n",
            {"GPU_TOPOLOGY_DEBOUNCE_SECONDS": "soon"},
            "GPU_TOPOLOGY_DEBOUNCE_SECONDS: could not",
        ),
    ],
    ids=["unknown-key", "version", "bad-policy", "bad-env"],
)
def test_bad_settings_are_one_line(
    case: tuple[str, dict[str, str], str],
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text, env, message = case
    cfg = tmp_path / "controller.yaml"
    cfg.write_text(text, encoding="utf-8")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code, _, err = run(["--config", str(cfg), "--once", "--from", str(tmp_path)], capsys)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1


def test_log_lines_carry_their_context() -> None:
    """The controller logs through ``topology.logs``: an event line carries its fields, as JSON in a
    cluster and as ``key=value`` pairs on a terminal."""
    from topology import controller as controller_module

    for fmt in ("json", "text"):
        out = io.StringIO()
        logs.configure(fmt, "info", stream=out)
        controller_module.log.warning("hypernode_apply_failed", hypernode="nvl-a", error="409: conflict")
        line = out.getvalue().strip()
        if fmt == "json":
            body = json.loads(line)
            assert body["event"] == "hypernode_apply_failed"
            assert body["hypernode"] == "nvl-a"
            assert body["level"] == "warning"
            assert body["logger"] == "topology.controller"
        else:
            assert line.endswith('hypernode_apply_failed hypernode=nvl-a error="409: conflict"')


def test_the_command_configures_the_log_format(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert controller_command.main(["--once", "--from", str(tmp_path), "--log-format", "json"]) == 0
    capsys.readouterr()
    logs.get_logger("topology.controller").info("reconciled", hypernodes=0)
    assert json.loads(capsys.readouterr().err)["event"] == "reconciled"
