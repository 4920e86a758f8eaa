"""The Philly data lives beside the repository (``../shared/data``), as CI lays it out."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_plugin.placement.bench import DEFAULT_DATA


@pytest.fixture
def philly_dir() -> Path:
    if not (DEFAULT_DATA / "philly-jobs-seed0.tsv").is_file():
        pytest.skip(f"Philly data not found at {DEFAULT_DATA}")
    return DEFAULT_DATA
