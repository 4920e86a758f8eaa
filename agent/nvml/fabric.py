"""Decoding NVML's GPU fabric-info ``healthMask`` (nvidia-ml-py 13.x layout), shared by the real
backend and the simulator so both report the same ``FabricHealth`` for the same mask."""

from __future__ import annotations

from topology.model import FabricHealth

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
