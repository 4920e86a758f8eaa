from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def deploy_tools() -> Path:
    """The bin dir holding helm and kustomize, built once per machine from their Go modules."""
    script = REPO / "tests" / "e2e" / "deploytools" / "build.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        pytest.fail(f"building helm/kustomize failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])
