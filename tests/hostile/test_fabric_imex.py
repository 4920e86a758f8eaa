"""Hostile input in the fabric and IMEX parts of the node: fault lines, the IMEX daemon's answer and peer
list, /proc/devices, the IMEX config and environment, and node labels the extender reads. Each names what
was wrong, keeps what is still good, and stays bounded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agent.imex import MAX_PEERS, ImexDaemonStatus, parse_peers
from agent.imexctl import MAX_OUTPUT_CHARS, MAX_PEER_FILE_BYTES, ImexCtlReader, run_bounded
from agent.imexmanage import peer_list, render_peers
from agent.nvml.faults import FaultFollower
from agent.simnode import open_simulated_node
from deviceplugin.config import ConfigError, parse_plugin_config
from deviceplugin.imex import MAX_PROC_DEVICES_BYTES, channel_major
from scheduler_plugin.cluster import snapshot_from_objects
from tests.agent.test_imexmanage import manager, member, peers_on_disk
from tests.integration.fakekube import node


def test_bad_fabric_and_imex_fault_lines_are_skipped_and_the_good_ones_apply(tmp_path: Path) -> None:
    faults = tmp_path / "faults.jsonl"
    lines = [
        {"event": "fabric", "gpu": 0, "conditions": [1, 2]},
        {"event": "fabric", "gpu": 0, "conditions": ["route_unhealthy"] * 2000},  # long but valid
        {"event": "fabric", "gpu": 9, "conditions": ["route_unhealthy"]},  # no such GPU
        {"event": "fabric", "gpu": 1, "incorrect_configuration": 7},
        {"event": "imex", "state": {"nested": "READY"}},
        {"event": "imex", "state": "x" * 10_000},
        {"event": "imex", "state": "INIT_GPU"},
    ]
    faults.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with open_simulated_node("gb200-nvl72", faults_path=faults) as sim:
        follower = sim.faults
        assert isinstance(follower, FaultFollower)
        assert follower.applied == 2  # the long valid line and the last IMEX state
        assert len(follower.errors) == 5
        assert all(len(e) < 1000 for e in follower.errors)  # a huge bad value is not echoed whole
        sim.nvml.init()
        info = sim.nvml.fabric(0)
        assert info is not None
        assert info.health.route_unhealthy is True
        assert sim.imex is not None
        assert sim.imex.state is ImexDaemonStatus.INIT_GPU


def test_a_hostile_peer_list_is_bounded_and_says_what_it_left_out(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes_config.cfg"
    nodes.write_bytes(b"10.0.0.1\n\x00\xff garbage\n" + b"10.0.0.2\n" * (MAX_PEERS + 10) + b"y" * 10_000_000)
    status = ImexCtlReader(ctl="/nonexistent/nvidia-imex-ctl", nodes_config=nodes)._peers()
    peers, problem = status
    assert len(peers) == MAX_PEERS
    assert problem is not None
    peers, problem = parse_peers("c d\nbell\x07\n")  # a space, a control character: not peers
    assert peers == ()
    assert problem is not None
    assert MAX_PEER_FILE_BYTES < 10_000_000


def test_a_daemon_command_that_floods_its_output_is_cut_and_stopped(tmp_path: Path) -> None:
    script = tmp_path / "flood"
    script.write_text("#!/bin/sh\nyes READY\n")
    script.chmod(0o755)
    code, text, timed_out = run_bounded([str(script)], 10.0, MAX_OUTPUT_CHARS)
    assert len(text) <= MAX_OUTPUT_CHARS
    assert not timed_out
    assert code != 0 or text.startswith("READY")


def test_a_hostile_proc_devices_is_read_bounded(tmp_path: Path) -> None:
    devices = tmp_path / "devices"
    devices.write_bytes(
        b"Character devices:\n" + b"\xff\xfe junk line\n" * 100 + b"x" * (MAX_PROC_DEVICES_BYTES * 4)
    )
    assert channel_major(devices) is None
    devices.write_bytes(b"Character devices:\n-5 nvidia-caps-imex-channels\n99999999999999999999 x\n")
    assert channel_major(devices) is None


@pytest.mark.parametrize(
    "value",
    [[0] * 1000, "0,0", "-1", "0x0", [0.0], ["0"], {"id": 0}],
    ids=["many", "twice", "negative", "hex", "float", "string-in-list", "mapping"],
)
def test_imex_channel_ids_beyond_0_are_refused_naming_the_key(value: object) -> None:
    with pytest.raises(ConfigError) as err:
        parse_plugin_config({"imex": {"channelIDs": value}})
    assert err.value.problems[0].startswith("config: imex.channelIDs: ")
    assert len(err.value.problems[0]) < 300


@pytest.mark.parametrize("label", ["Degraded", "degraded ", "", "x" * 1000, "unhealthy"])
def test_only_the_exact_degraded_label_makes_a_node_degraded(label: str) -> None:
    (n,) = snapshot_from_objects([node("a", 4, labels={"gpuagent.dev/fabric-health": label})], []).nodes
    assert not n.degraded


# --------------------------------------------------------------------------- host-managed IMEX (issue 29)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1\n10.0.0.9",
        "10.0.0.1 # x",
        "x" * 100_000,
        {"ip": "10.0.0.1"},
        "::ffff:10.0.0.1\x00",
        "evil.example",
    ],
    ids=["newline", "comment", "huge", "mapping", "nul", "dns-name"],
)
def test_a_peer_address_that_could_inject_lines_into_the_peer_list_is_left_out(address: object) -> None:

    members = [
        {"metadata": {"name": "bad"}, "status": {"imex": {"address": address}}},
        {"metadata": {"name": "ok"}, "status": {"imex": {"address": "10.0.0.2"}}},
    ]
    peers, skipped = peer_list("10.0.0.1", "me", members, max_peers=64)
    assert peers == ("10.0.0.1", "10.0.0.2")
    assert skipped == ("bad",)
    assert parse_peers(render_peers(peers)) == (peers, None)  # what is written reads back the same


def test_a_clique_claiming_thousands_of_members_keeps_the_list_on_disk(tmp_path: Path) -> None:

    m, daemon, members = manager(tmp_path, busy=[False])
    members.items = {"t1": member("t1", "127.0.0.2")}
    asyncio.run(m.step())
    members.items = {
        f"t{i}": member(f"t{i}", f"10.{i // 65536}.{i // 256 % 256}.{i % 256}") for i in range(5000)
    }
    assert asyncio.run(m.step()) is False
    assert peers_on_disk(m) == ["127.0.0.1", "127.0.0.2"]
    assert daemon.restarts == 1
