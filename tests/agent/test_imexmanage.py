"""Host-managed IMEX: the peer list from the clique's GPUNodes (own address first, the rest sorted,
bounded), written atomically, applied only on a membership change (an added member waits while the node's
GPUs are in use, a gone one applies at once), the simulated daemon's quorum over real TCP listeners, and
the agent's settings."""

from __future__ import annotations

import argparse
import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from agent.config import add_arguments, load_settings
from agent.imex import ImexDaemonStatus
from agent.imexmanage import (
    ImexManageConfig,
    ImexPeerManager,
    ManagedImexReader,
    PeerListTooLongError,
    internal_ip,
    peer_list,
    write_atomic,
)
from agent.imexsim import SimulatedImexDaemon
from deviceplugin.config import ConfigError
from tests.topology.factories import nvl72_tray
from topology.gpunode import gpunode_object
from topology.nvlink import CLIQUE_LABEL, CliqueKey, member_clique


def member(name: str, address: object) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {"imex": {"state": "ready", "status": "READY", "address": address}},
    }


def test_own_address_first_then_the_rest_sorted_as_addresses() -> None:
    members = [
        member("t10", "127.0.0.10"),
        member("t9", "127.0.0.9"),
        member("me", "10.0.0.1"),
        member("t2", "127.0.0.2"),
    ]
    peers, skipped = peer_list("127.0.0.5", "me", members, max_peers=64)
    assert peers == ("127.0.0.5", "127.0.0.2", "127.0.0.9", "127.0.0.10")
    assert skipped == ()


@pytest.mark.parametrize(
    "address",
    [
        "",
        "not-an-ip",
        "127.0.0.1; rm -rf /",
        ["127.0.0.1"],
        {"a": 1},
        "1" * 10_000,
        7,
        None,
        "127.0.0.1\n10.0.0.1",
    ],
    ids=["empty", "name", "injection", "list", "mapping", "huge", "int", "null", "two-lines"],
)
def test_a_member_with_a_hostile_address_is_left_out_and_named(address: object) -> None:
    peers, skipped = peer_list(
        "127.0.0.1", "me", [member("bad", address), member("ok", "127.0.0.3")], max_peers=64
    )
    assert peers == ("127.0.0.1", "127.0.0.3")
    assert skipped == ("bad",)


def test_more_members_than_the_cap_is_an_error() -> None:
    members = [member(f"t{i}", f"127.0.1.{i}") for i in range(70)]
    with pytest.raises(PeerListTooLongError, match=r"71 IMEX peers .* exceed imex\.maxPeers 64"):
        peer_list("127.0.0.1", "me", members, max_peers=64)


def test_write_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "etc" / "nodes_config.cfg"
    write_atomic(target, "a\n")
    inode = target.stat().st_ino
    write_atomic(target, "b\n")
    assert target.read_text() == "b\n"
    assert target.stat().st_ino != inode  # a new file renamed over the old one, never rewritten in place
    assert sorted(p.name for p in target.parent.iterdir()) == ["nodes_config.cfg"]


class FakeDaemon:
    def __init__(self, *, owned: bool = True) -> None:
        self.owned = owned
        self.restarts = 0
        self.stopped = False

    def restart(self) -> None:
        self.restarts += 1

    def stop(self) -> None:
        self.stopped = True


class Members:
    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return dict(self.items)


def manager(
    tmp_path: Path, *, busy: list[bool], max_peers: int = 64
) -> tuple[ImexPeerManager, FakeDaemon, Members]:
    daemon, members = FakeDaemon(), Members()

    async def address() -> str | None:
        return "127.0.0.1"

    async def is_busy() -> bool:
        return busy[0]

    m = ImexPeerManager(
        config=ImexManageConfig(manage=True, daemon="none", max_peers=max_peers, interval_s=0.05),
        node_name="me",
        nodes_config=tmp_path / "nodes_config.cfg",
        daemon=daemon,
        address=address,
        clique=lambda: CliqueKey("u", 1),
        watch=lambda key, changed: (members, lambda: None),
        busy=is_busy,
    )
    m.address = "127.0.0.1"
    m._members = members
    return m, daemon, members


def peers_on_disk(m: ImexPeerManager) -> list[str]:
    return [ln for ln in m.nodes_config.read_text().splitlines() if ln and not ln.startswith("#")]


def test_restart_only_on_membership_change_added_waits_for_idle_gone_applies_at_once(tmp_path: Path) -> None:
    busy = [True]
    m, daemon, members = manager(tmp_path, busy=busy)
    members.items = {"me": member("me", "127.0.0.1"), "t2": member("t2", "127.0.0.2")}

    async def scenario() -> None:
        assert await m.step()  # the first list applies even while busy (no daemon ran with it yet)
        assert (daemon.restarts, peers_on_disk(m)) == (1, ["127.0.0.1", "127.0.0.2"])
        assert not await m.step()  # nothing changed: no restart
        members.items["t3"] = member("t3", "127.0.0.3")
        assert not await m.step()  # added while a pod holds GPUs: deferred
        assert m.deferred == ("127.0.0.1", "127.0.0.2", "127.0.0.3")
        assert (daemon.restarts, peers_on_disk(m)) == (1, ["127.0.0.1", "127.0.0.2"])
        busy[0] = False
        assert await m.step()  # idle now: applied
        assert (daemon.restarts, peers_on_disk(m)) == (2, ["127.0.0.1", "127.0.0.2", "127.0.0.3"])
        busy[0] = True
        del members.items["t2"]
        assert await m.step()  # a member gone applies at once, even while busy
        assert (daemon.restarts, peers_on_disk(m)) == (3, ["127.0.0.1", "127.0.0.3"])

    asyncio.run(scenario())


def test_a_restarted_agent_leaves_a_systemd_daemon_with_the_right_list_alone(tmp_path: Path) -> None:
    m, _, members = manager(tmp_path, busy=[True])
    daemon = FakeDaemon(owned=False)
    m.daemon = daemon
    members.items = {"t2": member("t2", "127.0.0.2")}
    m.nodes_config.write_text("127.0.0.1\n127.0.0.2\n")
    m.peers = m._on_disk()
    assert not asyncio.run(m.step())  # the list on disk is right: no restart under a running job
    assert daemon.restarts == 0
    members.items["t3"] = member("t3", "127.0.0.3")
    assert not asyncio.run(m.step())  # added while busy: deferred, as after any other start
    assert daemon.restarts == 0


def test_a_list_past_the_cap_keeps_the_file(tmp_path: Path) -> None:
    m, daemon, members = manager(tmp_path, busy=[False], max_peers=3)
    members.items = {f"t{i}": member(f"t{i}", f"127.0.0.{i + 2}") for i in range(2)}

    async def scenario() -> None:
        assert await m.step()
        members.items["t9"] = member("t9", "127.0.0.9")
        assert not await m.step()

    asyncio.run(scenario())
    assert (daemon.restarts, len(peers_on_disk(m))) == (1, 3)


def test_the_running_manager_follows_its_watch_and_stops_the_daemon(tmp_path: Path) -> None:
    m, daemon, members = manager(tmp_path, busy=[False])
    m._members = None
    m.address = None
    members.items = {"t2": member("t2", "127.0.0.2")}

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(m.run(stop))
        for _ in range(200):
            if m.peers == ("127.0.0.1", "127.0.0.2"):
                break
            await asyncio.sleep(0.01)
        stop.set()
        await task

    asyncio.run(scenario())
    assert m.peers == ("127.0.0.1", "127.0.0.2")
    assert daemon.stopped


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_simulated_daemons_reach_ready_only_when_every_peer_answers(tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "nodes_config.cfg"
    cfg.write_text("127.0.0.1\n127.0.0.2\n")
    a, b = SimulatedImexDaemon(()), SimulatedImexDaemon(())
    a.expect_managed()
    assert a.read().status is ImexDaemonStatus.UNAVAILABLE  # the agent has not started it yet
    try:
        a.start_managed(address="127.0.0.1", port=port, nodes_config=cfg)
        got = a.read()
        assert got.status is ImexDaemonStatus.WAITING_FOR_PEERS
        assert got.reason == "1 peer(s) not answering: 127.0.0.2"
        b.start_managed(address="127.0.0.2", port=port, nodes_config=cfg)
        assert a.read().status is ImexDaemonStatus.READY
        assert b.read().status is ImexDaemonStatus.READY
        assert a.read().peers == ("127.0.0.1", "127.0.0.2")
        b.set_state("INIT_GPU")  # a fault line still wins
        assert b.read().status is ImexDaemonStatus.INIT_GPU
        b.close()  # its agent stops: the peer's quorum breaks
        assert a.read().status is ImexDaemonStatus.WAITING_FOR_PEERS
    finally:
        a.close()
        b.close()


def test_managed_reader_publishes_managed_and_the_address(tmp_path: Path) -> None:
    m, _, _ = manager(tmp_path, busy=[False])
    status = ManagedImexReader(SimulatedImexDaemon(("x",)), m).read()
    assert status.to_status() == {
        "state": "ready",
        "status": "READY",
        "peers": 1,
        "managed": True,
        "address": "127.0.0.1",
    }


def test_gpunode_carries_its_clique_label_for_the_watch() -> None:
    inv = nvl72_tray("rack0-tray0")
    obj = gpunode_object(inv, node_name="rack0-tray0")
    assert obj["metadata"]["labels"] == {CLIQUE_LABEL: str(member_clique(inv))}


def test_internal_ip_of_a_node() -> None:
    node = {
        "status": {
            "addresses": [{"type": "Hostname", "address": "n"}, {"type": "InternalIP", "address": "10.1.2.3"}]
        }
    }
    assert internal_ip(node) == "10.1.2.3"
    assert internal_ip({"status": {"addresses": [{"type": "InternalIP", "address": "bogus"}]}}) is None
    assert internal_ip({}) is None


def settings(argv: list[str], env: dict[str, str] | None = None, config: Path | None = None) -> Any:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = ["--node-name", "n", *argv] + (["--config", str(config)] if config else [])
    return load_settings(parser.parse_args(args), env or {})


def test_settings_from_file_flags_and_env(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        "version: v1\nimex:\n  channelIDs: [0]\n  manage: true\n  daemon: child\n"
        "  command: [nvidia-imex, -c, /etc/nvidia-imex/config.cfg]\n"
        "  nodesConfig: /tmp/x.cfg\n  maxPeers: 18\n"
    )
    s = settings([], config=cfg)
    assert s.imex == ImexManageConfig(
        manage=True,
        daemon="child",
        command=("nvidia-imex", "-c", "/etc/nvidia-imex/config.cfg"),
        nodes_config=Path("/tmp/x.cfg"),
        max_peers=18,
    )
    assert s.plugin.imex.channel_ids == (0,)  # the device plugin's keys still reach it
    s = settings(
        ["--imex-daemon", "none"], env={"IMEX_MANAGE": "true", "IMEX_ADDRESS": "127.0.0.7"}, config=cfg
    )
    assert (s.imex.manage, s.imex.daemon, s.imex.address) == (True, "none", "127.0.0.7")
    assert settings([]).imex.manage is False


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("manage: maybe", "imex.manage: expected true or false"),
        ("daemon: upstart", "imex.daemon: 'upstart' is not one of systemd, child, none"),
        ("address: tray-1", "imex.address: 'tray-1' is not an IP address"),
        ("maxPeers: 100000", "imex.maxPeers: must be 1..1024"),
        ("port: [1]", "imex.port: expected an integer"),
        ("command: []", "imex.command: expected a list of strings"),
        ("unknownKey: 1", "imex.unknownKey: unknown key"),
    ],
)
def test_bad_imex_settings_name_the_key(tmp_path: Path, body: str, expected: str) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"version: v1\nimex:\n  {body}\n")
    with pytest.raises(ConfigError) as err:
        settings([], config=cfg)
    assert any(expected in p for p in err.value.problems), err.value.problems


def test_no_kube_with_manage_refuses_to_start() -> None:
    from agent.commands.run import StartupError, _imex_manager

    s = settings(["--no-kube", "--imex-manage", "--simulate", "gb200-nvl72"])
    with pytest.raises(StartupError, match=r"imex\.manage needs the Kubernetes API"):
        _imex_manager(s, None, None)  # type: ignore[arg-type]
