from __future__ import annotations

import asyncio
import http.server
import io
import socket
import subprocess
import sys
import threading
import time
import urllib.error
from pathlib import Path

import pytest
import yaml

from agent.commands import demo
from agent.commands.demo import (
    DemoOptions,
    cluster_layout,
    hollow_unavailable,
    pod_labelled_gpus,
    run_demo,
    sample_gang,
)


def test_layout_names_and_specs() -> None:
    layout = cluster_layout(racks=2, dgx=1)
    assert len(layout) == 37
    assert layout[0].name == "gb200-r0-t00"
    assert layout[0].simulate == "gb200-nvl72:rack=0,tray=0,hostname=gb200-r0-t00"
    assert layout[-1].name == "dgx-h100-0"
    assert layout[-1].rack is None


def test_sample_gang_is_one_nvl72_domain() -> None:
    role = sample_gang().roles[0]
    assert (role.pods, role.gpus_per_pod, role.subgroup_size, role.subgroup_tier) == (18, 4, 18, "nvlink")


def test_demo_once_brings_up_agents_builds_the_tree_and_places_the_job(tmp_path: Path) -> None:
    out = io.StringIO()
    options = DemoOptions(racks=2, dgx=1, once=True, out=tmp_path / "out", control_plane="off")
    code = asyncio.run(run_demo(options, stop=asyncio.Event(), out=out))
    text = out.getvalue()
    assert code == 0, text
    assert "Device plugins: 37/37 registered" in text
    assert "nvidia.com/gpu: 152 healthy devices advertised" in text
    # rack 0 has busy trays, so the 72-GPU job must take rack 1 whole
    placed = [line for line in text.splitlines() if "subgroup 0 ->" in line]
    assert len(placed) == 1
    assert "gb200-r1-t00 … gb200-r1-t17" in placed[0]
    # what it would apply is on disk and well formed
    gpunodes = sorted((tmp_path / "out" / "gpunodes").glob("*.yaml"))
    assert len(gpunodes) == 37
    first = yaml.safe_load(gpunodes[0].read_text())
    assert first["kind"] == "GPUNode"
    hypernodes = [d for d in yaml.safe_load_all((tmp_path / "out" / "hypernodes.yaml").read_text()) if d]
    tier1 = [h for h in hypernodes if h["spec"]["tier"] == 1]
    assert sorted(len(h["spec"]["members"]) for h in tier1) == [1, 18, 18]
    assert "/metrics" in text


def test_demo_command_rejects_an_empty_cluster() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo", "--racks", "0", "--dgx", "0", "--once"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert "nothing to simulate" in done.stderr


def test_demo_command_rejects_a_tray_count_beyond_a_rack() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo", "--trays", "19", "--once"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--trays" in done.stderr


@pytest.mark.parametrize(
    ("control_plane", "hollow", "why"),
    [
        pytest.param("off", "auto", "--control-plane off", id="no-control-plane"),
        pytest.param("auto", "off", "--hollow off", id="hollow-off"),
    ],
)
def test_in_process_nodes_when_asked(control_plane: str, hollow: str, why: str) -> None:
    assert hollow_unavailable(DemoOptions(control_plane=control_plane, hollow=hollow)) == why


def testpod_labelled_gpus_reads_the_exposition_text() -> None:
    text = "\n".join(
        [
            "# HELP gpuagent_gpu_temperature_celsius x",
            'gpuagent_device_allocation_info{gpu="0",uuid="GPU-a",namespace="demo",pod="p",container="c"} 1',
            'gpuagent_gpu_temp{gpu="0",uuid="GPU-a",namespace="demo",pod="p",container="c"} 40',
            'gpuagent_gpu_temp{gpu="1",uuid="GPU-b",namespace="demo",pod="q",container="c"} 41',
            'gpuagent_gpu_temp{gpu="2",uuid="GPU-c"} 42',
        ]
    )
    uuids, example = pod_labelled_gpus(text, "p")
    assert uuids == {"GPU-a"}
    assert example.startswith("gpuagent_gpu_temp{")


def test_the_demo_waits_for_an_agents_metrics_listener_to_open() -> None:
    """An agent serves /metrics only once its device plugins registered: the demo's scrape waits for the
    listener (bounded) instead of failing on the first refused connection."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(urllib.error.URLError):
        demo._scrape(port, wait_s=0.2)

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"gpuagent_up 1\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    servers: list[http.server.HTTPServer] = []

    def open_later() -> None:
        time.sleep(0.3)
        servers.append(http.server.HTTPServer(("127.0.0.1", port), Metrics))
        servers[0].serve_forever()

    threading.Thread(target=open_later, daemon=True).start()
    try:
        assert demo._scrape(port, wait_s=30) == "gpuagent_up 1\n"
    finally:
        servers[0].shutdown()
        servers[0].server_close()
