"""Scraped values are physically sane, on every simulated machine and (marker ``gpu``) on real NVML.

The real-NVML case skips where NVML cannot be initialised (no GPU or driver here).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.discovery import discover
from agent.metrics.exporter import MetricsExporter, MetricsSettings
from agent.nvml.errors import NVMLError
from agent.nvml.protocol import NvmlBackend
from agent.nvml.real import RealNvml
from agent.nvml.simulate import PROFILES, build_simulator
from tests.agent.metrics.render_helpers import promtool, samples
from tests.agent.metrics.running import LoopThread, RunningExporter
from topology.model import Host

BACKENDS = [pytest.param(name, id=name) for name in sorted(PROFILES)] + [
    pytest.param("real", id="real-nvml", marks=pytest.mark.gpu)
]
GIB = 1024**3


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[str, NvmlBackend]]:
    nvml: NvmlBackend = RealNvml() if request.param == "real" else build_simulator(request.param)
    try:
        nvml.init()
    except NVMLError as exc:
        if request.param == "real":
            pytest.skip(f"no usable NVML here: {exc} ({exc.name})")
        raise
    yield request.param, nvml
    nvml.shutdown()


def _by_gpu(text: str, name: str) -> dict[str, float]:
    return {ls["gpu"]: v for n, ls, v in samples(text) if n == name and "profile" not in ls}


def test_scraped_values_are_sane(backend: tuple[str, NvmlBackend]) -> None:
    kind, nvml = backend
    with tempfile.TemporaryDirectory(prefix="mv-") as d:
        sysfs = Path("/sys") if kind == "real" else Path(d) / "sys"
        inv = discover(nvml=nvml, sysfs_root=sysfs, host=Host("node", 1, 1))
    exporter = MetricsExporter(
        settings=MetricsSettings(host="127.0.0.1", port=0, interval_s=60, pod_resources_socket=None),
        backend=nvml,
        inventory=lambda: inv,
        hostname="node",
        version="test",
    )
    with LoopThread() as loop, RunningExporter(loop, exporter) as running:
        status, text = running.get("/metrics")
        assert status == 200
        assert running.get("/readyz") == (200, "ok\n")
    live = [g for g in inv.gpus if not g.lost]
    assert len(_by_gpu(text, "gpuagent_gpu_info")) == len(inv.gpus) == nvml.device_count()
    total = _by_gpu(text, "gpuagent_gpu_memory_total_bytes")
    used = _by_gpu(text, "gpuagent_gpu_memory_used_bytes")
    assert len(total) == len(live)
    for gpu, t in total.items():
        assert 1 * GIB <= t <= 1024 * GIB, (gpu, t)
        assert 0 <= used[gpu] <= t, (gpu, used[gpu], t)
    for gpu, c in _by_gpu(text, "gpuagent_gpu_temperature_celsius").items():
        assert 0 < c < 110, (gpu, c)
    for gpu, w in _by_gpu(text, "gpuagent_gpu_power_watts").items():
        assert 0 <= w < 2000, (gpu, w)
    for gpu, hz in _by_gpu(text, "gpuagent_gpu_sm_clock_hertz").items():
        assert 0 <= hz < 4e9, (gpu, hz)
    for name in ("gpuagent_gpu_utilization_ratio", "gpuagent_gpu_memory_utilization_ratio"):
        for gpu, r in _by_gpu(text, name).items():
            assert 0 <= r <= 1, (name, gpu, r)
    for gpu, j in _by_gpu(text, "gpuagent_gpu_energy_joules_total").items():
        assert j >= 0, (gpu, j)
    mig_used = {ls["uuid"]: v for n, ls, v in samples(text) if n == "gpuagent_mig_memory_used_bytes"}
    mig_total = {ls["uuid"]: v for n, ls, v in samples(text) if n == "gpuagent_mig_memory_total_bytes"}
    assert set(mig_total) == {m.uuid for m in inv.mig_devices()}
    for uuid, u in mig_used.items():
        assert 0 <= u <= mig_total[uuid]
    code, out = promtool(text)
    assert code == 0, out
