"""The IMEX daemon's status: ``nvidia-imex-ctl -q``'s answer and the peer list, the simulated daemon and its
fault lines, and where the status goes (``discover``, labels, GPUNode, metrics in both formats, the
publisher)."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

import pytest

from agent.commands import discover as discover_command
from agent.imex import (
    DCGM_VALUES,
    MAX_PEERS,
    ImexDaemonStatus,
    ImexStatus,
    parse_ctl_output,
    parse_peers,
)
from agent.imexctl import ImexCtlReader, ImexMonitor
from agent.imexsim import SimulatedImexDaemon
from agent.metrics.dcgm import render_dcgm
from agent.metrics.native import ScrapeStats, render_native
from agent.metrics.snapshot import AgentStats
from agent.nvml.faults import FaultFollower
from agent.publisher import KubeNodeApi, Publisher, PublisherSettings
from agent.runtime import InventoryStore
from agent.simnode import open_simulated_node
from tests.agent.metrics.render_helpers import to_text, value
from tests.agent.metrics.scenario import scenario
from tests.agent.test_publisher import NODE, fake  # noqa: F401 - the fixture
from tests.topology.factories import nvl72_tray
from tests.topology.kubefake import FakeKube, api_client
from topology.gpunode import gpunode_object
from topology.kube import GPUNODES, NODES, Kube
from topology.labels import LABEL_IMEX, node_labels


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("READY\n", ImexDaemonStatus.READY),
        ("Node is WAITING_FOR_PEERS\n", ImexDaemonStatus.WAITING_FOR_PEERS),
        ("status: init_gpu", ImexDaemonStatus.INIT_GPU),
        ("", ImexDaemonStatus.UNAVAILABLE),
        ("garbage \x00 here", ImexDaemonStatus.UNAVAILABLE),
    ],
)
def test_the_ctl_answer_names_the_status(text: str, status: ImexDaemonStatus) -> None:
    assert parse_ctl_output(text) is status


def test_dcgm_numbers_the_states_as_dcgm_does() -> None:
    assert DCGM_VALUES[ImexDaemonStatus.INITIALIZING] == 0
    assert DCGM_VALUES[ImexDaemonStatus.READY] == 5
    assert DCGM_VALUES[ImexDaemonStatus.UNAVAILABLE] == 7
    assert DCGM_VALUES[ImexDaemonStatus.NOT_INSTALLED] == -1
    assert DCGM_VALUES[ImexDaemonStatus.COMMAND_ERROR] == -3


def test_the_peer_list_skips_comments_and_what_is_not_a_peer() -> None:
    peers, problem = parse_peers("# the rack\n10.0.0.1\n\nrack0-tray1  # a name\nnot a peer\n" + "x" * 300)
    assert peers == ("10.0.0.1", "rack0-tray1")
    assert problem is not None
    assert problem.startswith("2 line(s) of the peer list left out")
    many, problem = parse_peers("\n".join(f"10.0.{i // 256}.{i % 256}" for i in range(MAX_PEERS + 5)))
    assert len(many) == MAX_PEERS
    assert problem is not None


def ctl(tmp_path: Path, body: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / "nvidia-imex-ctl"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_no_daemon_installed_is_absent_not_an_error(tmp_path: Path) -> None:
    status = ImexCtlReader(ctl=str(tmp_path / "nowhere" / "nvidia-imex-ctl")).read()
    assert status == ImexStatus(ImexDaemonStatus.NOT_INSTALLED)
    assert status.label == "absent"


def test_the_host_daemon_through_its_command_and_peer_list(tmp_path: Path) -> None:
    script = ctl(tmp_path, 'test "$1" = -q && echo READY')
    nodes = tmp_path / "nodes_config.cfg"
    nodes.write_text("10.1.0.1\n10.1.0.2\n")
    status = ImexCtlReader(ctl=str(script), nodes_config=nodes).read()
    assert status == ImexStatus(ImexDaemonStatus.READY, ("10.1.0.1", "10.1.0.2"))
    assert status.label == "ready"
    missing = ImexCtlReader(ctl=str(script), nodes_config=tmp_path / "none").read()
    assert missing.status is ImexDaemonStatus.READY
    assert missing.reason is not None
    assert "no peer list" in missing.reason


def test_a_failing_or_hanging_command_is_a_command_error(tmp_path: Path) -> None:
    failing = ImexCtlReader(ctl=str(ctl(tmp_path, "echo cannot connect >&2; exit 3"))).read()
    assert failing.status is ImexDaemonStatus.COMMAND_ERROR
    assert failing.reason is not None
    assert "exited 3: cannot connect" in failing.reason
    assert failing.label == "not-ready"
    hanging = ImexCtlReader(ctl=str(ctl(tmp_path, "exec sleep 30")), timeout_s=0.2).read()
    assert hanging.status is ImexDaemonStatus.COMMAND_ERROR
    assert hanging.reason is not None
    assert "gave no answer" in hanging.reason


def test_fault_lines_drive_the_simulated_daemon_of_a_gb200_tray(tmp_path: Path) -> None:
    faults = tmp_path / "faults.jsonl"
    faults.write_text('{"event":"imex","state":"WAITING_FOR_PEERS"}\n')
    with open_simulated_node("gb200-nvl72:rack=2,tray=5", faults_path=faults) as node:
        assert node.imex is not None
        assert node.imex.read().status is ImexDaemonStatus.WAITING_FOR_PEERS  # at boot
        assert node.imex.read().peers[:2] == ("rack2-tray0", "rack2-tray1")
        assert len(node.imex.read().peers) == 18
        follower = node.faults
        assert follower is not None
        with faults.open("a") as fh:
            fh.write('{"event":"imex","state":"ready"}\n{"event":"imex","state":"SLEEPY"}\n')
            fh.write('{"event":"imex"}\n')
        assert follower.poll() == 1
        assert node.imex.query() == "READY\n"
        assert [e.split(": ", 1)[1] for e in follower.errors] == [
            "unknown IMEX daemon state 'SLEEPY'; valid: INITIALIZING, STARTING_AUTH_SERVER, "
            "WAITING_FOR_PEERS, WAITING_FOR_RECOVERY, INIT_GPU, READY, SHUTTING_DOWN, UNAVAILABLE, "
            "NOT_INSTALLED, NOT_CONFIGURED, COMMAND_ERROR",
            "field 'state' must be an IMEX daemon state such as READY, got None",
        ]
        with faults.open("a") as fh:
            fh.write('{"event":"imex","state":"NOT_INSTALLED"}\n')
        follower.poll()
        assert node.imex.read() == ImexStatus(ImexDaemonStatus.NOT_INSTALLED)


def test_a_node_without_multi_node_nvlink_has_no_simulated_daemon(tmp_path: Path) -> None:
    faults = tmp_path / "faults.jsonl"
    faults.write_text("")
    with open_simulated_node("dgx-h100", faults_path=faults) as node:
        assert node.imex is None
        assert node.dev_root is None
        follower = node.faults
        assert isinstance(follower, FaultFollower)
        with faults.open("a") as fh:
            fh.write('{"event":"imex","state":"READY"}\n')
        assert follower.poll() == 0
        assert "has no IMEX daemon" in follower.errors[0]


def test_discover_publishes_the_daemon(capsys: pytest.CaptureFixture[str]) -> None:
    assert discover_command.main(["--simulate", "gb200-nvl72", "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["imex"]["state"] == "ready"
    assert out["imex"]["status"] == "READY"
    assert len(out["imex"]["peerList"]) == 18
    assert discover_command.main(["--simulate", "dgx-h100", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["imex"] == {
        "state": "absent",
        "status": "NOT_INSTALLED",
        "peers": 0,
        "peerList": [],
    }
    assert discover_command.main(["--simulate", "gb200-nvl72"]) == 0
    assert "IMEX    READY (ready, 18 peers)" in capsys.readouterr().out


def test_label_and_gpunode_field() -> None:
    inv = nvl72_tray("t")
    status = ImexStatus(ImexDaemonStatus.WAITING_FOR_PEERS, ("a", "b"))
    assert node_labels(inv, node_name="t", imex=status.label)[LABEL_IMEX] == "not-ready"
    assert LABEL_IMEX not in node_labels(inv, node_name="t")
    obj = gpunode_object(inv, node_name="t", imex=status.to_status())
    assert obj["status"]["imex"] == {"state": "not-ready", "status": "WAITING_FOR_PEERS", "peers": 2}
    with pytest.raises(ValueError, match="imex 'maybe'"):
        node_labels(inv, node_name="t", imex="maybe")


def test_metrics_in_both_formats() -> None:
    agent = AgentStats(imex_daemon_status="READY")
    native = to_text(render_native(scenario(), agent, ScrapeStats(), "1"))
    assert value(native, "gpuagent_imex_daemon_status", status="READY") == 1
    assert value(native, "gpuagent_imex_daemon_status", status="WAITING_FOR_PEERS") == 0
    dcgm = to_text(render_dcgm(scenario(), agent, ScrapeStats(), "1"))
    assert value(dcgm, "DCGM_FI_IMEX_DAEMON_STATUS", Hostname="node-a") == 5
    absent = to_text(
        render_dcgm(scenario(), AgentStats(imex_daemon_status="NOT_INSTALLED"), ScrapeStats(), "1")
    )
    assert value(absent, "DCGM_FI_IMEX_DAEMON_STATUS", Hostname="node-a") == -1
    unread = to_text(render_native(scenario(), AgentStats(), ScrapeStats(), "1"))
    assert "gpuagent_imex_daemon_status" not in unread


def test_a_daemon_change_is_published(fake: tuple[FakeKube, str]) -> None:  # noqa: F811 - the fixture
    f, url = fake
    daemon = SimulatedImexDaemon(("a",))
    monitor = ImexMonitor(reader=daemon, interval_s=0.01)
    store = InventoryStore(nvl72_tray(NODE))
    settings = PublisherSettings(node_name=NODE, min_backoff_s=0.02, max_backoff_s=0.1)
    p = Publisher(source=store, api=KubeNodeApi(Kube(api_client(url))), settings=settings, imex=monitor)

    def label() -> str | None:
        node = f.get(NODES, NODE)
        return None if node is None else node["metadata"]["labels"].get(LABEL_IMEX)

    async def body() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(monitor.run(stop)), asyncio.create_task(p.run(stop))]
        for want in ("ready", "not-ready"):
            for _ in range(500):
                if label() == want:
                    break
                await asyncio.sleep(0.01)
            assert label() == want
            daemon.set_state("INIT_GPU")
        obj = f.get(GPUNODES, NODE)
        assert obj is not None
        assert obj["status"]["imex"]["status"] == "INIT_GPU"
        stop.set()
        await asyncio.gather(*tasks)

    asyncio.run(body())


def test_a_command_that_starts_a_child_and_hangs_is_stopped_with_its_child(tmp_path: Path) -> None:
    hanging = ImexCtlReader(ctl=str(ctl(tmp_path, "sleep 30; echo READY")), timeout_s=0.2).read()
    assert hanging.status is ImexDaemonStatus.COMMAND_ERROR
