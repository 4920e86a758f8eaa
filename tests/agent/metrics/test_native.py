from __future__ import annotations

import pytest

from agent.metrics.native import ScrapeStats, render_native
from agent.metrics.snapshot import AgentStats
from tests.agent.metrics.builders import GIB, gpu_uuid, mig_uuid
from tests.agent.metrics.render_helpers import promtool, samples, to_text, value
from tests.agent.metrics.scenario import scenario

AGENT = AgentStats(
    discovery_duration_seconds=0.25,
    registrations=3,
    registered=(("nvidia.com/gpu", True), ("nvidia.com/mig-1g.10gb", False)),
    kubelet_restarts=1,
)


def render(*, pids_visible: bool = True) -> str:
    return to_text(render_native(scenario(pids_visible=pids_visible), AGENT, ScrapeStats(5, 0.01), "1.2.3"))


def test_base_units_and_values_of_a_gpu() -> None:
    text = render()
    g0 = {"gpu": "0", "uuid": gpu_uuid(0)}
    assert value(text, "gpuagent_gpu_utilization_ratio", **g0) == 0.97
    assert value(text, "gpuagent_gpu_memory_used_bytes", **g0) == 70 * GIB
    assert value(text, "gpuagent_gpu_memory_total_bytes", **g0) == 80 * GIB
    assert value(text, "gpuagent_gpu_temperature_celsius", **g0) == 41
    assert value(text, "gpuagent_gpu_power_watts", **g0) == 312.5
    assert value(text, "gpuagent_gpu_energy_joules_total", **g0) == 123456.789
    assert value(text, "gpuagent_gpu_sm_clock_hertz", **g0) == 1980e6
    assert value(text, "gpuagent_gpu_memory_clock_hertz", **g0) == 2619e6
    assert value(text, "gpuagent_gpu_clocks_event_active", reason="sw_power_cap", **g0) == 1
    assert value(text, "gpuagent_gpu_clocks_event_active", reason="hw_slowdown", **g0) == 0
    assert value(text, "gpuagent_gpu_ecc_errors_total", type="uncorrected", scope="aggregate", **g0) == 1
    assert value(text, "gpuagent_gpu_remapped_rows_total", type="correctable", **g0) == 2
    assert value(text, "gpuagent_gpu_pcie_replays_total", **g0) == 3
    assert value(text, "gpuagent_gpu_processes", **g0) == 1
    assert value(text, "gpuagent_nvlink_up", link="1", **g0) == 0
    assert value(text, "gpuagent_nvlink_errors_total", link="0", type="replay", **g0) == 2
    assert value(text, "gpuagent_nvlink_transmitted_bytes_total", link="0", **g0) == 1000
    assert value(text, "gpuagent_gpu_xid_errors_total", xid="48", **g0) == 2
    assert value(text, "gpuagent_gpu_xid_errors_total", xid="94", **g0) == 1
    assert value(text, "gpuagent_fabric_state", state="COMPLETED", **g0) == 1
    assert value(text, "gpuagent_fabric_state", state="IN_PROGRESS", **g0) == 0
    assert value(text, "gpuagent_fabric_health", summary="HEALTHY", **g0) == 1
    assert value(text, "gpuagent_fabric_info", clique_id="7", **g0) == 1
    assert value(text, "gpuagent_fabric_condition", condition="route_recovery", **g0) == 1
    assert value(text, "gpuagent_fabric_condition", condition="route_unhealthy", **g0) == 0
    assert value(text, "gpuagent_fabric_condition", condition="not_completed", **g0) == 0
    assert value(text, "gpuagent_fabric_health_mask", **g0) == 0x1A6


@pytest.mark.parametrize(
    ("mask", "assigned"),
    [
        pytest.param(0x11A6, 1, id="assigned"),
        pytest.param(0x21A6, 0, id="not-assigned"),
        pytest.param(0x1A6, None, id="not-reported"),
    ],
)
def test_partition_assigned_is_exported_as_information_only(mask: int, assigned: int | None) -> None:
    """The health mask's partition flag (bits 12-13) is its own gauge, absent where the driver does not
    report it; it is no fabric condition, so it moves neither the conditions nor the GPU's level."""
    text = to_text(render_native(scenario(fabric_mask=mask), AGENT, ScrapeStats(5, 0.01), "1.2.3"))
    g0 = {"gpu": "0", "uuid": gpu_uuid(0)}
    got = [v for name, labels, v in samples(text) if name == "gpuagent_fabric_partition_assigned"]
    if assigned is None:
        assert got == []
    else:
        assert value(text, "gpuagent_fabric_partition_assigned", **g0) == assigned
        assert len(got) == 1  # only GPU 0 has fabric info
    conditions = {
        labels["condition"]: v
        for name, labels, v in samples(text)
        if name == "gpuagent_fabric_condition" and labels["gpu"] == "0"
    }
    assert "partition_assigned" not in conditions
    assert {c for c, v in conditions.items() if v} == {"route_recovery"}  # as without the flag


def test_info_metric_carries_the_static_facts() -> None:
    text = render()
    [(_, labels, v)] = [s for s in samples(text) if s[0] == "gpuagent_gpu_info" and s[1]["gpu"] == "3"]
    assert v == 1
    assert labels == {
        "gpu": "3",
        "uuid": gpu_uuid(3),
        "model": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:13:00.0",
        "driver_version": "580.126.20",
        "mig_mode": "enabled",
        "architecture": "hopper",
        "device": "nvidia3",
    }


def test_exclusive_device_series_carry_the_pod_labels() -> None:
    text = render()
    assert (
        value(
            text, "gpuagent_gpu_utilization_ratio", gpu="0", pod="train-0", namespace="ml", container="main"
        )
        == 0.97
    )
    assert (
        value(text, "gpuagent_mig_memory_used_bytes", uuid=mig_uuid(3, 1), pod="mig-pod", profile="3g.40gb")
        == 2 * GIB
    )
    assert value(text, "gpuagent_mig_memory_free_bytes", uuid=mig_uuid(3, 1)) == 38 * GIB
    unheld = [
        ls
        for n, ls, _ in samples(text)
        if n == "gpuagent_mig_memory_used_bytes" and ls["uuid"] == mig_uuid(3, 2)
    ]
    assert unheld == [{"gpu": "3", "uuid": mig_uuid(3, 2), "profile": "1g.10gb", "gpu_instance_id": "2"}]


def test_shared_gpu_is_split_per_pod_and_gpu_series_stay_unlabelled() -> None:
    text = render()
    g1 = {"gpu": "1", "uuid": gpu_uuid(1)}
    [(_, labels, _)] = [
        s for s in samples(text) if s[0] == "gpuagent_gpu_utilization_ratio" and s[1]["gpu"] == "1"
    ]
    assert "pod" not in labels
    assert value(text, "gpuagent_device_replicas", **g1) == 4
    assert value(text, "gpuagent_device_replicas_allocated", **g1) == 2
    assert value(text, "gpuagent_device_pod_split", **g1) == 1
    assert value(text, "gpuagent_pod_gpu_utilization_ratio", pod="infer-a", **g1) == 0.45
    assert value(text, "gpuagent_pod_gpu_utilization_ratio", pod="infer-b", **g1) == 0.15
    assert value(text, "gpuagent_pod_memory_used_bytes", pod="infer-b", **g1) == 5 * GIB


def test_shared_gpu_without_visible_pids_lists_pods_without_values() -> None:
    text = render(pids_visible=False)
    assert value(text, "gpuagent_device_pod_split", gpu="1") == 0
    assert not [s for s in samples(text) if s[0].startswith("gpuagent_pod_")]
    holders = sorted(
        ls["pod"] for n, ls, _ in samples(text) if n == "gpuagent_device_allocation_info" and ls["gpu"] == "1"
    )
    assert holders == ["infer-a", "infer-b"]


def test_failed_and_unhealthy_gpu() -> None:
    text = render()
    assert value(text, "gpuagent_gpu_sample_ok", gpu="2") == 0
    assert value(text, "gpuagent_device_healthy", gpu="2") == 0
    assert value(text, "gpuagent_gpu_sample_ok", gpu="0") == 1
    assert not [s for s in samples(text) if s[0] == "gpuagent_gpu_temperature_celsius" and s[1]["gpu"] == "2"]


def test_agent_self_metrics() -> None:
    text = render()
    assert value(text, "gpuagent_build_info", version="1.2.3") == 1
    assert value(text, "gpuagent_discovery_duration_seconds") == 0.25
    assert value(text, "gpuagent_plugin_registrations_total") == 3
    assert value(text, "gpuagent_plugin_registered", resource="nvidia.com/gpu") == 1
    assert value(text, "gpuagent_plugin_registered", resource="nvidia.com/mig-1g.10gb") == 0
    assert value(text, "gpuagent_kubelet_restarts_total") == 1
    assert value(text, "gpuagent_nvml_errors_total", code="GPU_IS_LOST") == 2
    assert value(text, "gpuagent_nvml_up") == 1
    assert value(text, "gpuagent_metrics_scrape_duration_seconds_count") == 5
    assert value(text, "gpuagent_podresources_up") == 1
    assert value(text, "gpuagent_podresources_pods") == 4


def test_labels_are_bounded() -> None:
    allowed = {
        "gpu",
        "uuid",
        "namespace",
        "pod",
        "container",
        "link",
        "type",
        "scope",
        "reason",
        "xid",
        "state",
        "summary",
        "profile",
        "gpu_instance_id",
        "resource",
        "device_id",
        "code",
        "version",
        "python_version",
        "model",
        "pci_bus_id",
        "driver_version",
        "mig_mode",
        "architecture",
        "device",
        "cluster_uuid",
        "clique_id",
        "condition",
        "parent_uuid",
        "compute_instance_id",
    }
    used = {k for _, labels, _ in samples(render()) for k in labels}
    assert used <= allowed


def test_promtool_accepts_the_native_format() -> None:
    code, out = promtool(render())
    assert code == 0, out
    code, out = promtool(render(pids_visible=False))
    assert code == 0, out
