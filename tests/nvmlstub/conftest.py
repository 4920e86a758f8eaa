"""Fixtures of the C-level NVML stand-in: the libraries (built once per session into a temporary folder)
and runners for the agent over the simulator (``--simulate``) and over the stand-in (the real NVML path,
the unmodified pynvml loading ``libnvidia-ml.so.1`` from ``LD_LIBRARY_PATH``), each in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.nvml.describe import describe_machine
from agent.nvml.sim_sysfs import write_sysfs
from agent.nvml.simulate import parse_spec
from tests.nvmlstub.build import VARIANTS, StubUnavailableError, build
from tests.nvmlstub.probe import probe

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def stub_libraries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Variant name → the folder holding its ``libnvidia-ml.so.1`` (each compiled once per session)."""
    out = tmp_path_factory.mktemp("nvmlstub")
    try:
        with ThreadPoolExecutor(len(VARIANTS)) as pool:  # one compiler process per variant
            paths = list(pool.map(lambda variant: build(out, variant).parent, VARIANTS))
        return dict(zip(VARIANTS, paths, strict=True))
    except StubUnavailableError as exc:
        pytest.skip(f"the C NVML stand-in cannot be built here: {exc}")
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"nvmlstub.c does not compile against nvml.h:\n{exc.stderr}")


@dataclass
class Runner:
    """Runs the agent's commands and the probe over one profile, simulated or on the stand-in."""

    libraries: dict[str, Path]
    root: Path

    def stub_env(self, profile: str, variant: str = "current") -> tuple[dict[str, str], Path]:
        """Environment for a process on the stand-in: the library, its machine description (exported from
        the simulator's profile), an empty control file and the profile's sysfs tree."""
        spec = parse_spec(profile)
        machine = spec.machine()
        base = self.root / f"{profile.replace(':', '_')}-{variant}-{len(list(self.root.iterdir()))}"
        base.mkdir()
        description = base / "machine.nvmlstub"
        description.write_text(describe_machine(machine), encoding="utf-8")
        control = base / "control"
        control.touch()
        sysfs = base / "sys"
        sysfs.mkdir()
        write_sysfs(sysfs, spec)
        # the host facts the real path reads from sysfs (the simulated node knows them from its profile)
        (sysfs / "devices" / "system" / "cpu").mkdir(parents=True, exist_ok=True)
        (sysfs / "devices" / "system" / "cpu" / "online").write_text(f"0-{machine.cpu_count - 1}\n")
        (sysfs / "class" / "dmi" / "id").mkdir(parents=True, exist_ok=True)
        (sysfs / "class" / "dmi" / "id" / "product_uuid").write_text(machine.system_uuid + "\n")
        env = dict(os.environ)
        env.update(
            LD_LIBRARY_PATH=str(self.libraries[variant]),
            NVMLSTUB_MACHINE=str(description),
            NVMLSTUB_CONTROL=str(control),
            NVMLSTUB_SYSFS=str(sysfs),
        )
        return env, sysfs

    def _run(self, argv: list[str], env: dict[str, str]) -> str:
        done = subprocess.run(
            [sys.executable, *argv],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}"
        return done.stdout

    def discover(self, profile: str, *, stub: bool) -> dict[str, Any]:
        """``gpu-node-agent discover --output json`` (``--simulate PROFILE``, or the real path on the stand-in
        with the profile's sysfs tree and host name)."""
        argv = ["-m", "agent.cli", "discover", "--output", "json", "--mps-pipe-directory", "/nonexistent-mps"]
        if stub:
            env, sysfs = self.stub_env(profile)
            argv += ["--sysfs-root", str(sysfs), "--node-name", parse_spec(profile).machine().hostname]
        else:
            env = dict(os.environ)
            argv += ["--simulate", profile]
        result: dict[str, Any] = json.loads(self._run(argv, env))
        return result

    def probe(
        self, profile: str, script: list[dict[str, Any]], *, stub: bool, variant: str = "current"
    ) -> list[Any]:
        """``tests.nvmlstub.probe`` (see there) over the stand-in in its own process, or over the simulator in
        this one (its library shaped like ``variant``); both results pass through JSON."""
        if not stub:
            return json.loads(
                json.dumps(probe("--simulate", profile, script, variant=variant), sort_keys=True)
            )
        env, _ = self.stub_env(profile, variant)
        result: list[Any] = json.loads(
            self._run(["-m", "tests.nvmlstub.probe", "--stub", profile, json.dumps(script)], env)
        )
        return result


@pytest.fixture(scope="session")
def runner(stub_libraries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Runner:
    return Runner(stub_libraries, tmp_path_factory.mktemp("nvmlstub-runs"))
