"""What a role asks of the planner: its pods' shape and its blocks (subgroups). Pure.

A role with ``subgroup_size`` is cut into consecutive blocks of pods by index (the last block may be
smaller); a role without one is one block of all its pods. ``min_subgroups`` lets an elastic role
place fewer blocks, always a prefix.
"""

from __future__ import annotations

from scheduler_plugin.snapshot import Role

__all__ = ["RoleKey", "block_ranges", "min_blocks", "role_key", "role_subgroups"]

# (GPUs per pod, other requests per pod sorted by name): roles of one key fit the same way
RoleKey = tuple[int, tuple[tuple[str, int], ...]]


def role_key(role: Role) -> RoleKey:
    return (role.gpus_per_pod, tuple(sorted((k, v) for k, v in role.resources_per_pod.items() if v > 0)))


def role_subgroups(role: Role) -> tuple[int, int, int]:
    """``(block size, number of full blocks, size of the short last block or 0)`` of a role.

    A role without ``subgroup_size`` is one block of all its pods.
    """
    size = role.subgroup_size if role.subgroup_size else role.pods
    size = max(1, min(size, role.pods)) if role.pods > 0 else 1
    return size, role.pods // size, role.pods % size


def block_ranges(role: Role, count: int) -> list[range]:
    """The pod indices of the role's first ``count`` blocks."""
    size, _, _ = role_subgroups(role)
    return [range(k * size, min((k + 1) * size, role.pods)) for k in range(count)]


def min_blocks(role: Role) -> int:
    """Blocks the role must place: all of them, or an elastic role's minimum (at least one)."""
    _, full, rem = role_subgroups(role)
    total = full + (1 if rem else 0)
    if role.min_subgroups is None or role.subgroup_size is None:
        return total
    return max(1, min(total, role.min_subgroups))
