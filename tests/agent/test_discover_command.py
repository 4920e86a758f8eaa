from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agent import cli
from agent.commands import discover as command
from agent.nvml.errors import NVMLError_DriverNotLoaded, NVMLError_LibraryNotFound
from agent.nvml.real import RealNvml
from topology.model import NodeInventory


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["discover", "--log-format", "json", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_table_has_summary_matrix_ib_and_mps(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--simulate", "dgx-h100"], capsys)
    assert code == 0
    assert err == ""
    lines = out.splitlines()
    assert lines[0].startswith("Host    dgx-h100-su0-node0  (224 CPUs")
    assert lines[1] == "Driver  580.126.20  CUDA 13.0  NVML 13.580.126.20"
    gpu0 = next(line for line in lines if line.startswith("0    NVIDIA H100 80GB HBM3"))
    assert "81559 MiB" in gpu0
    assert "00000000:1B:00.0" in gpu0
    header = next(line for line in lines if line.lstrip().startswith("GPU0  GPU1"))
    assert header.split()[-4:] == ["CPU", "Affinity", "NUMA", "Affinity"]
    row0 = next(line for line in lines if line.startswith("GPU0 "))
    assert row0.split() == ["GPU0", "X", *["NV18"] * 7, "0-55,112-167", "0"]
    row7 = next(line for line in lines if line.startswith("GPU7 "))
    assert row7.split() == ["GPU7", *["NV18"] * 7, "X", "56-111,168-223", "1"]
    assert any(line.startswith("mlx5_0 ") and "400 Gb/s" in line for line in lines)
    assert "MPS     not running" in lines


def test_table_shows_mig_devices_and_fabric_cliques(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--simulate", "dgx-a100-mig"], capsys)
    assert code == 0
    assert "7x1g.10gb" in out
    assert "3g.40gb+2g.20gb+1g.10gb" in out
    assert sum(1 for line in out.splitlines() if "MIG-" in line) == 15

    code, out, _ = run(["--simulate", "gb200-nvl72:rack=1,tray=4"], capsys)
    assert code == 0
    gpu_rows = [line for line in out.splitlines() if line.startswith(("0 ", "1 ", "2 ", "3 "))]
    assert len(gpu_rows) == 4
    assert all(".32766 HEALTHY" in row for row in gpu_rows)
    assert out.startswith("Host    rack1-tray4 ")


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_structured_output_is_the_inventory_schema(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--simulate", "dgx1-v100", "--output", fmt, "--node-name", "node-a"], capsys)
    assert code == 0
    assert err == ""
    data = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert data["schema"] == "v1"
    for key in ("gpus", "mig", "nvlinks", "fabric", "ib", "mps", "host", "driver", "matrix", "errors"):
        assert key in data
    assert data["host"]["name"] == "node-a"
    assert data["gpus"][0]["memory_total_bytes"] == 32768 * 2**20
    assert data["matrix"]["cells"][0][:5] == ["X", "NV1", "NV1", "NV2", "NV2"]
    inv = NodeInventory.from_dict(data)
    assert len(inv.gpus) == 8
    assert inv.mps is not None
    assert not inv.mps.daemon_running


def test_faults_file_applies_before_discovery(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    faults = tmp_path / "faults.jsonl"
    faults.write_text(
        '{"event":"gpu_lost","gpu":2}\n{"event":"nvlink_down","gpu":0,"link":5}\n', encoding="utf-8"
    )
    code, out, _ = run(["--simulate", "dgx-h100", "--simulate-faults", str(faults), "-o", "json"], capsys)
    assert code == 0
    inv = NodeInventory.from_dict(json.loads(out))
    assert inv.gpu(2).lost
    assert inv.matrix is not None
    assert 2 not in inv.matrix.gpu_indices
    assert str(inv.matrix.connection(0, 1)) == "NV17"

    code, out, _ = run(["--simulate", "dgx-h100", "--simulate-faults", str(faults)], capsys)
    assert code == 0
    assert "2    LOST" in out
    assert "Problems" in out


def test_given_sysfs_root_is_read_instead_of_a_generated_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["--simulate", "dgx-h100", "--sysfs-root", str(tmp_path), "-o", "json"], capsys)
    assert code == 0
    assert json.loads(out)["ib"] == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["--simulate", "dgx-h900"], "unknown simulator profile 'dgx-h900'; valid: dgx-h100", id="profile"
        ),
        pytest.param(["--simulate", "gb200-nvl72:rack=99"], "out of range", id="option-range"),
        pytest.param(
            ["--simulate", "dgx-h100:color=red"], "unknown option 'color'; valid: su, node", id="option"
        ),
        pytest.param(["--output", "xml"], "unknown --output 'xml'; valid: table, json, yaml", id="output"),
        pytest.param(["--log-level", "loud"], "unknown --log-level 'loud'; valid: debug", id="log-level"),
        pytest.param(
            ["--simulate-faults", "x.jsonl"], "--simulate-faults needs --simulate", id="faults-alone"
        ),
        pytest.param(
            ["--simulate", "dgx-h100", "--simulate-faults", "/nonexistent.jsonl"], "no such file", id="faults"
        ),
        pytest.param(["--frobnicate"], "unrecognized arguments: --frobnicate", id="unknown-flag"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert message in err


@pytest.mark.parametrize(
    ("error", "what"),
    [
        (NVMLError_LibraryNotFound, "libnvidia-ml.so.1 was not found"),
        (NVMLError_DriverNotLoaded, "kernel driver is not loaded"),
    ],
)
def test_no_driver_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: type[Exception],
    what: str,
) -> None:
    def fail(self: RealNvml) -> None:
        raise error()

    monkeypatch.setattr(RealNvml, "init", fail)
    code, out, err = run([], capsys)
    assert code == 1
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert what in lines[0]
    assert "--simulate PROFILE" in lines[0]
    assert "Traceback" not in err


def test_missing_binding_is_reported_as_library_not_found() -> None:
    def missing() -> None:
        raise ImportError("No module named 'pynvml'")

    backend = RealNvml(loader=missing)  # type: ignore[arg-type]
    with pytest.raises(NVMLError_LibraryNotFound):
        backend.init()
    assert backend.counters().errors_by_code == {"LIBRARY_NOT_FOUND": 1}


def test_outputs_are_table_driven(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert {"table", "json", "yaml"} <= set(command.OUTPUTS)
    monkeypatch.setitem(command.OUTPUTS, "count", lambda inv, _opts: f"{len(inv.gpus)} GPUs\n")
    code, out, _ = run(["--simulate", "pcie-l40s", "--output", "count"], capsys)
    assert (code, out) == (0, "4 GPUs\n")


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    assert "--simulate PROFILE[:k=v,...]" in out
