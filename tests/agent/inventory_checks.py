"""Inventory invariants shared by the discovery tests and the backend contract test."""

from __future__ import annotations

import itertools

from topology.model import LinkLevel, NodeInventory, RemoteDeviceType


def assert_matrix_consistent(inv: NodeInventory) -> None:
    """Symmetric, ``X`` on the diagonal only, ``NV<n>`` exactly where the links say so."""
    matrix = inv.matrix
    assert matrix is not None
    idx = matrix.gpu_indices
    assert idx == tuple(g.index for g in inv.gpus if g.uuid and not g.lost)
    switch = dict.fromkeys(idx, 0)
    direct: dict[tuple[int, int], int] = {}
    for link in inv.nvlinks:
        if not link.active:
            continue
        if link.remote_type is RemoteDeviceType.SWITCH:
            switch[link.gpu_index] += 1
        elif link.remote_gpu_index is not None:
            key = (link.gpu_index, link.remote_gpu_index)
            direct[key] = direct.get(key, 0) + 1
    for i, a in enumerate(idx):
        for j, b in enumerate(idx):
            cell = matrix.cells[i][j]
            assert cell == matrix.cells[j][i], f"GPU{a}/GPU{b}: {cell} vs {matrix.cells[j][i]}"
            if a == b:
                assert cell == "X"
                continue
            expected = min(direct.get((a, b), 0), direct.get((b, a), 0)) + min(switch[a], switch[b])
            if expected:
                assert cell == f"NV{expected}", f"GPU{a}/GPU{b}"
            else:
                assert cell in {lv.value for lv in LinkLevel} - {"X", "NV"}, f"GPU{a}/GPU{b}: {cell}"


def assert_mig_within_slices(inv: NodeInventory) -> None:
    for state in inv.mig:
        devices = list(state.devices)
        assert sum(d.gpu_slices for d in devices) <= 7, state
        assert sum(d.memory_slices for d in devices) <= 8, state
        assert all(d.parent_index == state.gpu_index for d in devices)
        spans = sorted(
            (gi.placement_start, gi.placement_start + gi.placement_size) for gi in state.gpu_instances
        )
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, f"overlapping GPU instances on GPU {state.gpu_index}: {spans}"
