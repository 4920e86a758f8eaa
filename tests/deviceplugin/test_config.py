"""The plugin's config v1 sections: defaults, NVIDIA-compatible keys, one line per problem."""

from __future__ import annotations

from typing import Any

import pytest

from deviceplugin.config import (
    ConfigError,
    ListStrategy,
    MigStrategy,
    SharingStrategy,
    parse_plugin_config,
)
from deviceplugin.preferred import Policy


def test_defaults() -> None:
    config = parse_plugin_config({})
    assert config.mig_strategy is MigStrategy.NONE
    assert config.list_strategies == (ListStrategy.ENVVAR,)
    assert config.sharing.strategy is SharingStrategy.NONE
    assert config.allocation_policy is Policy.SPREAD
    assert not config.cdi.enabled


def test_full_file() -> None:
    config = parse_plugin_config(
        {
            "flags": {
                "migStrategy": "mixed",
                "plugin": {
                    "deviceListStrategy": ["envvar", "cdi-cri"],
                    "sharedDevicesAllocationPolicy": "packed",
                },
            },
            "sharing": {
                "timeSlicing": {
                    "renameByDefault": True,
                    "resources": [
                        {
                            "name": "nvidia.com/gpu",
                            "replicas": 4,
                            "devices": [0, "GPU-0a1b2c3d-0000-4000-8000-000000000001"],
                        }
                    ],
                }
            },
            "cdi": {"specDir": "/tmp/cdi"},
        }
    )
    assert config.mig_strategy is MigStrategy.MIXED
    assert config.allocation_policy is Policy.PACK
    assert config.cdi.enabled  # implied by cdi-cri
    shared = config.sharing.resources[0]
    assert (shared.rename, shared.replicas, shared.devices) == (
        "nvidia.com/gpu.shared",
        4,
        ("0", "GPU-0a1b2c3d-0000-4000-8000-000000000001"),
    )
    assert not config.sharing.fail_requests_greater_than_one


def test_mps_fails_requests_greater_than_one_by_default() -> None:
    config = parse_plugin_config(
        {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
    )
    assert config.sharing.strategy is SharingStrategy.MPS
    assert config.sharing.fail_requests_greater_than_one


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            {"flags": {"migStrategy": "maybe"}}, "flags.migStrategy: 'maybe' is not one of", id="mig"
        ),
        pytest.param({"flags": {"bogus": 1}}, "flags.bogus: unknown key", id="unknown-flag"),
        pytest.param(
            {"flags": {"plugin": {"deviceListStrategy": "volume"}}},
            "flags.plugin.deviceListStrategy",
            id="list-strategy",
        ),
        pytest.param(
            {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1}]}}},
            "sharing.timeSlicing.resources[0].replicas: expected an integer from 2 to 1024",
            id="replicas",
        ),
        pytest.param(
            {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}},
            "sharing.timeSlicing.resources[0].name",
            id="resource-name",
        ),
        pytest.param(
            {"sharing": {"timeSlicing": {"resources": []}, "mps": {"resources": []}}},
            "mutually exclusive",
            id="both-sharings",
        ),
        pytest.param(
            {
                "flags": {"migStrategy": "mixed"},
                "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}},
            },
            "MPS cannot be combined with flags.migStrategy mixed",
            id="mps-with-mig",
        ),
        pytest.param({"cdi": {"kind": "nokind"}}, "cdi.kind", id="cdi-kind"),
    ],
)
def test_each_problem_is_one_line_naming_the_key(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_plugin_config(data, source="c.yaml")
    assert any(expected in p and p.startswith("c.yaml: ") for p in err.value.problems), err.value.problems
    assert all("\n" not in p for p in err.value.problems)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        parse_plugin_config({"flags": {"migStrategy": "x"}, "cdi": {"kind": "nokind"}})
    assert len(err.value.problems) == 2
