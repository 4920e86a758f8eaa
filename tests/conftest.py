"""Shared test configuration: Hypothesis profiles (CI is deterministic and bounded); the Philly data
beside the repository (``../shared/data``), as CI lays it out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def philly_dir() -> Path:
    from agent.benchmarks.placement import DEFAULT_DATA

    if not (DEFAULT_DATA / "philly-jobs-seed0.tsv").is_file():
        pytest.skip(f"Philly data not found at {DEFAULT_DATA}")
    return DEFAULT_DATA
