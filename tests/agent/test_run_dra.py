"""``run`` with the ``dra`` section: parsed with the other settings (one line per problem, exit 2), off by
default, and refused at start (exit 1, one line) where it cannot work."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agent.commands import run as run_command
from agent.config import RunSettings, add_arguments, load_settings
from deviceplugin.config import ConfigError


def parse(argv: list[str]) -> RunSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return load_settings(parser.parse_args(argv), {})


def test_dra_is_off_by_default() -> None:
    dra = parse([]).dra
    assert not dra.enabled
    assert not dra.serves("nvidia.com/gpu")


def test_dra_section_is_read_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "version: v1\nflags: {migStrategy: mixed}\n"
        "dra: {enabled: true, driverName: gpu.example.com, resources: [nvidia.com/mig-1g.10gb]}\n"
    )
    dra = parse(["--config", str(path)]).dra
    assert dra.enabled
    assert dra.driver_name == "gpu.example.com"
    assert dra.serves("nvidia.com/mig-1g.10gb")
    assert not dra.serves("nvidia.com/gpu")  # the device plugin keeps serving whole GPUs
    assert dra.kind == "gpu.example.com/gpu"


def test_every_dra_problem_is_one_line_naming_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n"
        "dra: {enabled: true, registryDir: here}\n"
    )
    with pytest.raises(ConfigError) as err:
        parse(["--config", str(path)])
    assert err.value.problems == [f"{path}: dra.registryDir: expected an absolute path, got 'here'"]
    path.write_text(path.read_text().replace("registryDir: here", "registryDir: /r"))
    with pytest.raises(ConfigError) as err:
        parse(["--config", str(path)])
    problems = err.value.problems
    assert any(
        p.startswith(f"{path}: dra.resources: nvidia.com/gpu is shared (time-slicing)") for p in problems
    )


def test_dra_without_the_kubernetes_api_is_refused_at_start(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("version: v1\ndra: {enabled: true}\n")
    code = run_command.main(
        [
            "--config",
            str(path),
            "--simulate",
            "dgx-h100",
            "--no-kube",
            "--kubelet-dir",
            str(tmp_path),
            "--metrics-addr",
            "",
            "--health-addr",
            "",
        ]
    )
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "gpu-node-agent run: dra.enabled needs the Kubernetes API (claims are read from it); drop --no-kube"
    )
