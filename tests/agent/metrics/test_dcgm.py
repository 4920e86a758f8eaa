from __future__ import annotations

from agent.metrics.dcgm import render_dcgm
from agent.metrics.native import ScrapeStats
from agent.metrics.snapshot import AgentStats
from tests.agent.metrics.builders import gpu_uuid
from tests.agent.metrics.render_helpers import promtool, samples, to_text, value
from tests.agent.metrics.scenario import scenario


def render(*, pids_visible: bool = True) -> str:
    return to_text(render_dcgm(scenario(pids_visible=pids_visible), AgentStats(), ScrapeStats(), "1.2.3"))


def test_dcgm_names_units_and_labels_of_an_exclusive_gpu() -> None:
    text = render()
    [(_, labels, util)] = [s for s in samples(text) if s[0] == "DCGM_FI_DEV_GPU_UTIL" and s[1]["gpu"] == "0"]
    assert util == 97
    assert labels == {
        "gpu": "0",
        "UUID": gpu_uuid(0),
        "pci_bus_id": "00000000:10:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node-a",
        "hostname": "node-a",
        "DCGM_FI_DRIVER_VERSION": "580.126.20",
        "pod": "train-0",
        "namespace": "ml",
        "container": "main",
    }
    assert value(text, "DCGM_FI_DEV_FB_USED", gpu="0") == 70 * 1024  # MiB
    assert value(text, "DCGM_FI_DEV_FB_FREE", gpu="0") == 80 * 1024 - 70 * 1024 - 512
    assert value(text, "DCGM_FI_DEV_FB_RESERVED", gpu="0") == 512
    assert value(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="0") == 123456789  # mJ
    assert value(text, "DCGM_FI_DEV_SM_CLOCK", gpu="0") == 1980  # MHz
    assert value(text, "DCGM_FI_DEV_POWER_USAGE", gpu="0") == 312.5
    assert value(text, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 94  # the last XID, as DCGM reports it
    assert value(text, "DCGM_FI_DEV_XID_ERRORS", gpu="1", pod="infer-a") == 0
    assert value(text, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", gpu="0") == 2
    assert value(text, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", gpu="0") == 1


def test_dcgm_fabric_fields_of_a_gpu_with_fabric() -> None:
    text = render()
    assert value(text, "DCGM_FI_DEV_FABRIC_MANAGER_STATUS", gpu="0") == 3  # COMPLETED, SUCCESS
    assert value(text, "DCGM_FI_DEV_FABRIC_CLIQUE_ID", gpu="0") == 7
    assert value(text, "DCGM_FI_DEV_FABRIC_HEALTH_MASK", gpu="0") == 0x1A6
    assert value(text, "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY", gpu="0") == 1  # HEALTHY
    uuid = "5a8d3c1e-0000-4000-8000-000000000001"
    assert value(text, "DCGM_FI_DEV_FABRIC_CLUSTER_UUID", gpu="0", cluster_uuid=uuid) == 1
    assert not [s for s in samples(text) if s[0].startswith("DCGM_FI_DEV_FABRIC") and s[1]["gpu"] != "0"]


def test_mig_series_carry_the_gpu_instance_labels() -> None:
    text = render()
    assert (
        value(text, "DCGM_FI_DEV_FB_USED", gpu="3", GPU_I_ID="1", GPU_I_PROFILE="3g.40gb", pod="mig-pod")
        == 2048
    )
    assert value(text, "DCGM_FI_DEV_FB_FREE", gpu="3", GPU_I_ID="2", GPU_I_PROFILE="1g.10gb") == 10240
    [(_, labels, _)] = [
        s for s in samples(text) if s[0] == "DCGM_FI_DEV_FB_USED" and s[1].get("GPU_I_ID") == "1"
    ]
    assert labels["UUID"] == gpu_uuid(3)  # the parent's UUID, as dcgm-exporter labels MIG series


def test_shared_gpu_has_one_series_per_pod_with_split_util_and_memory() -> None:
    text = render()
    assert value(text, "DCGM_FI_DEV_GPU_UTIL", gpu="1", pod="infer-a", vgpu="0") == 45
    assert value(text, "DCGM_FI_DEV_GPU_UTIL", gpu="1", pod="infer-b", vgpu="1") == 15
    assert value(text, "DCGM_FI_DEV_FB_USED", gpu="1", pod="infer-b") == 5 * 1024
    # other fields repeat the GPU's value on each pod's series
    assert value(text, "DCGM_FI_DEV_GPU_TEMP", gpu="1", pod="infer-a") == 41
    assert value(text, "DCGM_FI_DEV_GPU_TEMP", gpu="1", pod="infer-b") == 41


def test_shared_gpu_without_visible_pids_repeats_the_gpu_values_per_pod() -> None:
    text = render(pids_visible=False)
    assert value(text, "DCGM_FI_DEV_GPU_UTIL", gpu="1", pod="infer-a") == 60
    assert value(text, "DCGM_FI_DEV_GPU_UTIL", gpu="1", pod="infer-b") == 60


def test_failed_gpu_only_reports_its_last_xid() -> None:
    text = render()
    assert {n for n, ls, _ in samples(text) if ls.get("gpu") == "2"} == {"DCGM_FI_DEV_XID_ERRORS"}


# promtool lint findings that dcgm-exporter's own names cause; dashboards need these exact names.
DCGM_OWN_LINT = (
    "label names should be written in 'snake_case' not 'camelCase'",  # modelName
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'",
    "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY metric name should not include type 'summary'",
)


def test_promtool_parses_the_dcgm_format_and_lints_only_dcgm_exporters_own_names() -> None:
    """Exit 3 is "lint findings only" (a parse error exits 1); every finding must be one of those that
    dcgm-exporter's names cause, and with those two names changed promtool is fully clean."""
    for text in (render(), render(pids_visible=False)):
        code, out = promtool(text)
        findings = [line for line in out.splitlines() if line.strip()]
        assert code in (0, 3), out
        assert all(any(known in f for known in DCGM_OWN_LINT) for f in findings), out
    renamed = (
        render()
        .replace("modelName", "model_name")
        .replace("PCIE_REPLAY_COUNTER", "PCIE_REPLAYS")
        .replace("FABRIC_HEALTH_SUMMARY", "FABRIC_HEALTH_OVERALL")
    )
    code, out = promtool(renamed)
    assert code == 0, out
