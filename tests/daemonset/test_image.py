"""What the image's build stage does works: ``pip wheel .`` from the files the Dockerfile copies gives a
wheel with every package, the generated stubs, the .proto files and the console script. (No container
runtime or base image registry is reachable here, so the image itself is not built in tests.)"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.daemonset.conftest import REPO

PACKAGES = ("agent", "deviceplugin", "topology", "scheduler_plugin")


def copied_by_dockerfile() -> set[str]:
    """Sources of the Dockerfile's ``COPY src... dest`` lines (not ``--from`` stages)."""
    text = (REPO / "daemonset" / "Dockerfile").read_text()
    return {src for line in re.findall(r"^COPY (?!--)(.+)$", text, re.M) for src in line.split()[:-1]}


def test_dockerfile_copies_every_package_and_the_build_files() -> None:
    copied = copied_by_dockerfile()
    assert {"pyproject.toml", "README.md", *PACKAGES} <= copied


def test_the_image_ships_bytecode_and_never_writes_it_at_run_time() -> None:
    """pip compiles the installed modules (no ``--no-compile``) and the container reads them only
    (``PYTHONDONTWRITEBYTECODE``): without the bytecode every agent start compiles every module again."""
    text = (REPO / "daemonset" / "Dockerfile").read_text()
    installs = [line for line in text.splitlines() if "pip install" in line]
    assert installs
    assert all("--no-compile" not in line for line in installs)
    assert re.search(r"^ENV .*PYTHONDONTWRITEBYTECODE=1", text, re.M)


def test_wheel_from_the_copied_files_has_packages_stubs_protos_and_entry_point(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "w"),
            str(src),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "w").glob("gpu_node_agent-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for pkg in PACKAGES:
        assert f"{pkg}/__init__.py" in names
        assert f"{pkg}/py.typed" in names
    for path in (
        "deviceplugin/api/deviceplugin.proto",
        "deviceplugin/api/deviceplugin_pb2.py",
        "deviceplugin/api/deviceplugin_pb2_grpc.py",
        "agent/podresources/api/api.proto",
        "agent/podresources/api/api_pb2.py",
        "agent/commands/demo.py",
        "agent/nvml/fake.py",
        "agent/benchmarks/placement.py",
        "scheduler_plugin/planner/objective.py",
    ):
        assert path in names, path
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "gpu-node-agent = agent.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
