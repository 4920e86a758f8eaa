"""Decoding NVML's GPU fabric-info ``healthMask`` (nvidia-ml-py 13.x layout), shared by the real
backend and the simulator so both report the same ``FabricHealth`` for the same mask."""

from __future__ import annotations

from collections.abc import Iterable

from topology.model import FabricHealth, FabricHealthSummary

# the 4-bit "incorrect configuration" field at bit 8
INCORRECT_CONFIGURATIONS: dict[int, str] = {
    1: "NONE",
    2: "INCORRECT_SYSGUID",
    3: "INCORRECT_CHASSIS_SN",
    4: "NO_PARTITION",
    5: "INSUFFICIENT_NVLINKS",
    6: "INCOMPATIBLE_GPU_FW",
    7: "INVALID_LOCATION",
    8: "GPU_STATE_INVALID",
}


def decode_health_mask(mask: int | None) -> FabricHealth:
    """``healthMask`` → flags: 2-bit fields (0 not supported, 1 true, 2 false), a 4-bit configuration
    field at bit 8 (1 = NONE) and the GFM state at bits 14-15 (1 connected, 2 disconnected); ``None``
    (a struct version without the mask) gives every flag ``None``."""
    if mask is None:
        return FabricHealth()

    def flag(shift: int) -> bool | None:
        return {1: True, 2: False}.get((mask >> shift) & 0x3)

    return FabricHealth(
        degraded_bandwidth=flag(0),
        route_recovery_in_progress=flag(2),
        route_unhealthy=flag(4),
        access_timeout_recovery=flag(6),
        incorrect_configuration=INCORRECT_CONFIGURATIONS.get((mask >> 8) & 0xF),
        partition_assigned=flag(12),
        gfm_connected=flag(14),
    )


# the 2-bit flags a fault can set, by the condition name the fabric policy uses (topology.fabrichealth)
MASK_FLAGS: dict[str, int] = {
    "degraded_bandwidth": 0,
    "route_recovery": 2,
    "route_unhealthy": 4,
    "access_timeout_recovery": 6,
}
_UNHEALTHY_FLAGS = frozenset({"route_unhealthy"})


def encode_health_mask(conditions: Iterable[str], incorrect_configuration: str = "NONE") -> int:
    """A ``healthMask`` with exactly ``conditions`` true (the other flags false), the configuration field
    set to ``incorrect_configuration`` and the partition flag not reported; ``ValueError`` naming an
    unknown condition or configuration."""
    wanted = set(conditions)
    unknown = wanted - set(MASK_FLAGS)
    if unknown:
        raise ValueError(
            f"unknown fabric condition(s) {', '.join(sorted(unknown))}; valid: {', '.join(MASK_FLAGS)}"
        )
    codes = {name: code for code, name in INCORRECT_CONFIGURATIONS.items()}
    if incorrect_configuration not in codes:
        raise ValueError(
            f"unknown incorrect configuration {incorrect_configuration!r}; valid: {', '.join(codes)}"
        )
    mask = codes[incorrect_configuration] << 8
    for name, shift in MASK_FLAGS.items():
        mask |= (1 if name in wanted else 2) << shift
    return mask


def summary_of(conditions: Iterable[str], incorrect_configuration: str = "NONE") -> FabricHealthSummary:
    """The ``healthSummary`` a driver gives a mask made by :func:`encode_health_mask`: ``UNHEALTHY`` for
    an unhealthy route or a wrong configuration, ``LIMITED_CAPACITY`` for degraded bandwidth or a
    recovery in progress, else ``HEALTHY``."""
    wanted = set(conditions)
    if wanted & _UNHEALTHY_FLAGS or incorrect_configuration != "NONE":
        return FabricHealthSummary.UNHEALTHY
    return FabricHealthSummary.LIMITED_CAPACITY if wanted else FabricHealthSummary.HEALTHY
