"""A real Prometheus server (Debian package ``prometheus``) scrapes the exporter and answers PromQL.

Prometheus listens on 127.0.0.1 on a free port, stores into a temporary directory, scrapes every
second, and the test waits (bounded) until the first samples are queryable.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.discovery import discover
from agent.metrics.exporter import MetricsExporter, MetricsSettings
from agent.nvml.simulate import build_simulator
from tests.agent.metrics.running import LoopThread, RunningExporter, prometheus_query
from topology.model import Host

H100_FB_TOTAL_MIB = 81559  # nvidia-smi -q "FB Memory Usage / Total" of an H100 80GB HBM3

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="needs the Debian package 'prometheus' (.ci/system-packages.txt)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _exporter(fmt: str, workdir: Path) -> MetricsExporter:
    sim = build_simulator("dgx-h100")
    sim.init()
    inv = discover(nvml=sim, sysfs_root=workdir / f"sys-{fmt}", host=Host("dgx-0", 1, 1))
    return MetricsExporter(
        settings=MetricsSettings(
            host="127.0.0.1", port=0, format=fmt, interval_s=1, pod_resources_socket=None
        ),
        backend=sim,
        inventory=lambda: inv,
        hostname="dgx-0",
        version="test",
    )


@pytest.fixture
def prometheus_scraping_both_formats() -> Iterator[int]:
    """Yields the port of a Prometheus that scrapes a native and a dcgm exporter (dgx-h100 each)."""
    workdir = Path(tempfile.mkdtemp(prefix="prom-"))
    proc: subprocess.Popen[bytes] | None = None
    log = workdir / "prometheus.log"
    try:
        with (
            LoopThread() as loop,
            RunningExporter(loop, _exporter("native", workdir)) as native,
            RunningExporter(loop, _exporter("dcgm", workdir)) as dcgm,
        ):
            (workdir / "prometheus.yml").write_text(
                "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
                "scrape_configs:\n"
                f"  - job_name: native\n    static_configs: [{{targets: ['127.0.0.1:{native.port}']}}]\n"
                f"  - job_name: dcgm\n    static_configs: [{{targets: ['127.0.0.1:{dcgm.port}']}}]\n"
            )
            port = _free_port()
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [
                        "prometheus",
                        f"--config.file={workdir / 'prometheus.yml'}",
                        f"--storage.tsdb.path={workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"prometheus exited {proc.returncode}: {log.read_text()[-2000:]}")
                try:
                    up = prometheus_query(port, "sum(up)")
                    native_seen = prometheus_query(port, "count(gpuagent_gpu_info)")
                    dcgm_seen = prometheus_query(port, "count(DCGM_FI_DEV_GPU_TEMP)")
                except (OSError, AssertionError):
                    up = native_seen = dcgm_seen = []
                if up and float(up[0]["value"][1]) == 2 and native_seen and dcgm_seen:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"no samples within 60 s; prometheus log: {log.read_text()[-2000:]}")
                time.sleep(0.5)
            yield port
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


def _scalar(port: int, expr: str) -> float:
    result = prometheus_query(port, expr)
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


def test_prometheus_scrapes_both_formats_and_answers_promql(prometheus_scraping_both_formats: int) -> None:
    port = prometheus_scraping_both_formats
    # native names
    assert _scalar(port, 'count(gpuagent_gpu_info{job="native", model="NVIDIA H100 80GB HBM3"})') == 8
    assert (
        _scalar(port, 'sum(gpuagent_gpu_memory_total_bytes{job="native"})') == 8 * H100_FB_TOTAL_MIB * 2**20
    )
    assert _scalar(port, 'count(gpuagent_nvlink_up{job="native"} == 1)') == 8 * 18
    assert _scalar(port, 'max(gpuagent_gpu_temperature_celsius{job="native"})') > 0
    assert _scalar(port, 'min(gpuagent_nvml_up{job="native"})') == 1
    # dcgm-exporter names, units and labels, as an existing dashboard queries them
    assert _scalar(port, 'count(DCGM_FI_DEV_GPU_TEMP{job="dcgm", gpu=~".+", Hostname="dgx-0"})') == 8
    fb = "DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE + DCGM_FI_DEV_FB_RESERVED"
    assert _scalar(port, f"sum({fb})") == 8 * H100_FB_TOTAL_MIB
    assert (
        _scalar(
            port, 'count(count by (modelName) (DCGM_FI_DEV_POWER_USAGE{modelName="NVIDIA H100 80GB HBM3"}))'
        )
        == 1
    )
