"""The exporter on the simulator with a fake kubelet on a real unix socket, scraped over real HTTP."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.discovery import discover
from agent.metrics.exporter import MetricsExporter, MetricsSettings
from agent.nvml.simulate import build_simulator
from agent.podresources.fake import FakeContainer, FakePod, FakePodResourcesServer
from tests.agent.metrics.render_helpers import samples, value
from tests.agent.metrics.running import LoopThread, RunningExporter
from topology.model import Host, NodeInventory

GIB = 1024**3
UID_A = "aaaaaaaa-0000-4000-8000-00000000000a"
UID_B = "bbbbbbbb-0000-4000-8000-00000000000b"


@pytest.fixture
def node() -> Iterator[dict[str, Any]]:
    """dgx-a100-mig with: GPU 4 held by train-0, GPU 5 shared by infer-a/infer-b (4 replicas, host PIDs
    mapped through a fake /proc and /var/log/pods), the first MIG device of GPU 0 held by mig-a."""
    d = tempfile.mkdtemp(prefix="gm-", dir="/tmp")
    try:
        sim = build_simulator("dgx-a100-mig")
        sim.init()
        inv: NodeInventory = discover(nvml=sim, sysfs_root=Path(d) / "sys", host=Host("node-a", 1, 1))
        gpu4, gpu5 = inv.gpu(4).uuid, inv.gpu(5).uuid
        mig0 = next(m for m in inv.mig_devices() if m.parent_index == 0)
        sim.add_process(5, 4100, used_memory_bytes=3 * GIB, sm_percent=40)
        sim.add_process(5, 4200, used_memory_bytes=5 * GIB, sm_percent=10)
        sim.add_process(0, 4300, used_memory_bytes=1 * GIB, mig_uuid=mig0.uuid)
        proc, logs = Path(d) / "proc", Path(d) / "pods"
        for pid, uid in ((4100, UID_A), (4200, UID_B)):
            (proc / str(pid)).mkdir(parents=True)
            (proc / str(pid) / "cgroup").write_text(f"0::/kubepods/besteffort/pod{uid}/{'c' * 64}\n")
        logs.mkdir()
        (logs / f"ml_infer-a_{UID_A}").mkdir()
        (logs / f"ml_infer-b_{UID_B}").mkdir()
        pods = (
            FakePod("ml", "train-0", (FakeContainer("main", {"nvidia.com/gpu": [gpu4]}),)),
            FakePod("ml", "infer-a", (FakeContainer("srv", {"nvidia.com/gpu": [f"{gpu5}::0"]}),)),
            FakePod("ml", "infer-b", (FakeContainer("srv", {"nvidia.com/gpu": [f"{gpu5}::1"]}),)),
            FakePod("ml", "mig-a", (FakeContainer("main", {"nvidia.com/mig-1g.10gb": [mig0.uuid]}),)),
            FakePod("web", "nginx", (FakeContainer("nginx"),)),
        )
        yield {
            "sim": sim,
            "inventory": inv,
            "socket": os.path.join(d, "pr.sock"),
            "proc": str(proc),
            "logs": str(logs),
            "pods": pods,
            "allocatable": {"nvidia.com/gpu": [f"{gpu5}::{n}" for n in range(4)] + [gpu4]},
            "gpu4": gpu4,
            "gpu5": gpu5,
            "mig0": mig0,
        }
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _exporter(node: dict[str, Any], fmt: str) -> MetricsExporter:
    settings = MetricsSettings(
        host="127.0.0.1",
        port=0,
        format=fmt,
        interval_s=60,
        pod_resources_socket=node["socket"],
        pod_resources_interval_s=60,
        proc_root=node["proc"],
        pod_logs_root=node["logs"],
    )
    inv = node["inventory"]
    return MetricsExporter(
        settings=settings, backend=node["sim"], inventory=lambda: inv, hostname="node-a", version="test"
    )


def test_native_scrape_has_pod_labels_for_exclusive_mig_and_shared_devices(node: dict[str, Any]) -> None:
    with LoopThread() as loop:
        kubelet = FakePodResourcesServer(node["socket"], pods=node["pods"], allocatable=node["allocatable"])
        loop.call(kubelet.start())
        try:
            with RunningExporter(loop, _exporter(node, "native")) as running:
                status, text = running.get("/metrics")
                assert status == 200
                # the whole GPU held by one pod
                assert (
                    value(text, "gpuagent_gpu_memory_total_bytes", gpu="4", pod="train-0", namespace="ml")
                    == 80 * GIB
                )
                # the MIG device held by one pod
                assert (
                    value(text, "gpuagent_mig_memory_used_bytes", uuid=node["mig0"].uuid, pod="mig-a") == GIB
                )
                # the shared GPU: split per process through /proc and /var/log/pods
                g5 = {"gpu": "5", "uuid": node["gpu5"]}
                assert value(text, "gpuagent_device_replicas", **g5) == 4
                assert value(text, "gpuagent_device_replicas_allocated", **g5) == 2
                assert value(text, "gpuagent_device_pod_split", **g5) == 1
                assert value(text, "gpuagent_pod_memory_used_bytes", pod="infer-a", **g5) == 3 * GIB
                assert value(text, "gpuagent_pod_memory_used_bytes", pod="infer-b", **g5) == 5 * GIB
                # the simulator splits the GPU's load by the processes' weights (40 and 10)
                util_a = value(text, "gpuagent_pod_gpu_utilization_ratio", pod="infer-a", **g5)
                util_b = value(text, "gpuagent_pod_gpu_utilization_ratio", pod="infer-b", **g5)
                assert util_a > util_b > 0
                assert util_a + util_b <= value(text, "gpuagent_gpu_utilization_ratio", **g5)
                # every allocation listed; nginx (no devices) nowhere
                pods = sorted(
                    ls["pod"] for n, ls, _ in samples(text) if n == "gpuagent_device_allocation_info"
                )
                assert pods == ["infer-a", "infer-b", "mig-a", "train-0"]
                assert value(text, "gpuagent_podresources_up") == 1
                assert value(text, "gpuagent_podresources_pods") == 5
                lists = kubelet.calls["List"]
                assert lists == 1  # one refresh so far (the interval is 60 s)
                for _ in range(5):
                    running.get("/metrics")
                assert kubelet.calls["List"] == lists  # scrapes never call the kubelet

                # the kubelet fails: labels stay from the last good answer, the failure is visible
                kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
                running.refresh()
                _, text = running.get("/metrics")
                assert value(text, "gpuagent_podresources_up") == 0
                assert value(text, "gpuagent_podresources_errors_total") == 1
                assert value(text, "gpuagent_gpu_memory_total_bytes", gpu="4", pod="train-0") == 80 * GIB
        finally:
            loop.call(kubelet.stop())


def test_dcgm_scrape_has_dcgm_names_and_pod_labels(node: dict[str, Any]) -> None:
    with LoopThread() as loop:
        kubelet = FakePodResourcesServer(node["socket"], pods=node["pods"], allocatable=node["allocatable"])
        loop.call(kubelet.start())
        try:
            with RunningExporter(loop, _exporter(node, "dcgm")) as running:
                _, text = running.get("/metrics")
                assert value(text, "DCGM_FI_DEV_FB_USED", gpu="5", pod="infer-b", vgpu="1") == 5 * 1024
                gpu_util = value(text, "DCGM_FI_DEV_GPU_UTIL", gpu="5", pod="infer-a", vgpu="0")
                assert 0 < value(text, "DCGM_FI_DEV_GPU_UTIL", gpu="5", pod="infer-b", vgpu="1") < gpu_util
                assert (
                    value(
                        text,
                        "DCGM_FI_DEV_FB_USED",
                        gpu="0",
                        GPU_I_ID=str(node["mig0"].gpu_instance_id),
                        pod="mig-a",
                    )
                    == 1024
                )
                [(_, labels, _)] = [
                    s for s in samples(text) if s[0] == "DCGM_FI_DEV_GPU_TEMP" and s[1]["gpu"] == "4"
                ]
                assert labels["pod"] == "train-0"
                assert labels["modelName"] == node["inventory"].gpu(4).name
                assert labels["Hostname"] == "node-a"
                assert labels["UUID"] == node["gpu4"]
        finally:
            loop.call(kubelet.stop())


def test_readyz_fails_loudly_when_the_driver_changes_under_the_agent(node: dict[str, Any]) -> None:
    sim = node["sim"]
    with LoopThread() as loop, RunningExporter(loop, _exporter(node, "native")) as running:
        assert running.get("/readyz") == (200, "ok\n")
        sim.inject_error(18)  # NVML_ERROR_LIB_RM_VERSION_MISMATCH on every call
        running.refresh()
        status, body = running.get("/readyz")
        assert status == 503
        assert "nvml: NVML unusable: LIB_RM_VERSION_MISMATCH" in body
        assert "restart the agent pod" in body
        assert running.get("/healthz") == (200, "ok\n")
        _, text = running.get("/metrics")
        assert value(text, "gpuagent_nvml_up") == 0
        assert value(text, "gpuagent_nvml_errors_total", code="LIB_RM_VERSION_MISMATCH") >= 8
        sim.clear_errors()
        running.refresh()
        assert running.get("/readyz") == (200, "ok\n")
