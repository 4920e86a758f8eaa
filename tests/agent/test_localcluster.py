"""The hollow-node helpers of ``agent.localcluster`` that run without the built counterparts."""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from agent import localcluster as cluster
from agent.config import add_arguments, load_settings


def test_missing_hollownode_is_one_line_naming_the_build_command(tmp_path: Path) -> None:
    with pytest.raises(cluster.MissingCounterpartError) as err:
        cluster.Counterparts(tmp_path).binary(cluster.HOLLOW_NODE)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("hollownode: ")
    assert "tests/e2e/counterparts/build.sh" in message


def test_starting_gpu_nodes_without_the_binary_starts_nothing(tmp_path: Path) -> None:
    apiserver: Any = None  # never reached: the binary is looked up first
    spec = cluster.GpuNodeSpec("n1", "dgx1-v100")
    with pytest.raises(cluster.MissingCounterpartError, match=r"build\.sh"):
        cluster.start_hollow_gpu_nodes(
            cluster.Counterparts(tmp_path), tmp_path / "run", apiserver=apiserver, specs=[spec]
        )
    assert not (tmp_path / "run" / "logs").exists()


def test_hollow_node_argv_carries_the_agreed_flags(tmp_path: Path) -> None:
    argv = cluster.hollow_node_argv(
        tmp_path / "bin" / "hollownode",
        name="hn-0",
        kubeconfig=tmp_path / "admin.kubeconfig",
        root_dir=tmp_path / "root",
        device_plugins_dir=tmp_path / "dp",
        record=tmp_path / "containers.jsonl",
        kubelet_port=10250,
        labels={"b": "2", "a": "1"},
        max_pods=20,
        status_update_s=1.5,
        cpus=8,
        memory="64Gi",
    )
    assert argv == [
        str(tmp_path / "bin" / "hollownode"),
        "--name=hn-0",
        f"--kubeconfig={tmp_path / 'admin.kubeconfig'}",
        f"--root-dir={tmp_path / 'root'}",
        f"--device-plugins-dir={tmp_path / 'dp'}",
        f"--record={tmp_path / 'containers.jsonl'}",
        "--kubelet-port=10250",
        "--max-pods=20",
        "--node-status-update-frequency=1500ms",
        "--node-labels=a=1,b=2",
        "--cpus=8",
        "--memory=64Gi",
        "-v=2",
    ]


@pytest.mark.parametrize(("key", "value"), [("a,b", "1"), ("a", "1,2"), ("a=b", "1")], ids=str)
def test_labels_that_node_labels_cannot_carry_are_refused(tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(ValueError, match="--node-labels"):
        cluster.hollow_node_argv(
            tmp_path / "hollownode",
            name="hn",
            kubeconfig=tmp_path / "k",
            root_dir=tmp_path / "r",
            device_plugins_dir=tmp_path / "d",
            record=tmp_path / "rec",
            kubelet_port=1,
            labels={key: value},
        )


def _fake_node(tmp_path: Path) -> cluster.HollowNode:
    apiserver: Any = None
    return cluster.HollowNode("hn-1", ("hollownode",), tmp_path / "nodes" / "hn-1", 10250, apiserver,
                              tmp_path / "logs" / "hollownode-hn-1.log")  # fmt: skip


def test_node_agent_runs_against_the_node_s_folders_with_settings_the_agent_accepts(tmp_path: Path) -> None:
    node = _fake_node(tmp_path)
    kubeconfig = tmp_path / "admin.kubeconfig"
    agent = cluster.new_node_agent(
        node,
        simulate="gb200-nvl72:rack=1,tray=2",
        kubeconfig=kubeconfig,
        config={"health": {"recoveryQuietSeconds": 1}, "flags": {"migStrategy": "mixed"}},
        faults=[{"event": "xid", "gpu": 3, "xid": 79}],
    )
    assert agent.argv[:4] == (*cluster.AGENT_COMMAND, "run")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = load_settings(parser.parse_args(list(agent.argv[4:])), {})
    assert settings.node_name == "hn-1"
    assert settings.simulate == "gb200-nvl72:rack=1,tray=2"
    assert settings.kubelet_dir == node.device_plugins_dir
    assert settings.pod_resources_socket == node.root_dir / "pod-resources" / "kubelet.sock"
    assert settings.kubeconfig == kubeconfig
    assert not settings.no_kube
    assert settings.metrics_addr == f"127.0.0.1:{agent.metrics_port}"
    assert settings.health_addr == ""
    assert settings.health.recovery_quiet_s == 1
    assert settings.plugin.mig_strategy.value == "mixed"
    assert settings.simulate_faults == agent.faults_path
    assert agent.faults_path is not None
    assert cluster.read_json_lines(agent.faults_path) == [{"event": "xid", "gpu": 3, "xid": 79}]
    agent.fault(event="recover", gpu=3)
    assert cluster.read_json_lines(agent.faults_path)[-1] == {"event": "recover", "gpu": 3}
    assert agent.log_path == tmp_path / "logs" / "agent-hn-1.log"
    assert "KUBECONFIG" not in agent.env  # nothing of the caller's environment


def test_node_agent_without_api_metrics_or_faults(tmp_path: Path) -> None:
    agent = cluster.new_node_agent(_fake_node(tmp_path), simulate="dgx1-v100", kubeconfig=None, metrics=False)
    assert "--no-kube" in agent.argv
    assert "--config" not in agent.argv
    assert "--simulate-faults" not in agent.argv
    assert agent.metrics_port is None
    with pytest.raises(RuntimeError, match="fault file"):
        agent.fault(event="xid", gpu=0, xid=79)
    agent.wait_ready()  # nothing to wait for without /metrics


def test_read_json_lines_leaves_a_line_being_written(tmp_path: Path) -> None:
    path = tmp_path / "record.jsonl"
    assert cluster.read_json_lines(path) == []
    path.write_text(json.dumps({"pod": "a"}) + "\n\n" + json.dumps({"pod": "b"}) + "\n" + '{"pod": "c"')
    assert cluster.read_json_lines(path) == [{"pod": "a"}, {"pod": "b"}]
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="not a JSON object"):
        cluster.read_json_lines(path)


def test_records_filter_by_pod_and_namespace(tmp_path: Path) -> None:
    node = _fake_node(tmp_path)
    node.workdir.mkdir(parents=True)
    rows = [
        {"namespace": "a", "pod": "p", "container": "main"},
        {"namespace": "b", "pod": "p", "container": "main"},
        {"namespace": "a", "pod": "q", "container": "main"},
    ]
    node.record_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert node.records() == rows
    assert node.records(pod="p") == rows[:2]
    assert node.records(pod="p", namespace="b") == [rows[1]]


def _proc(root: Path, pid: int, comm: str, pgrp: int, rss_kib: int | None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} ({comm}) S 1 {pgrp} {pgrp} 0 -1 4194560 0 0\n")
    vm = f"VmRSS:\t{rss_kib} kB\n" if rss_kib is not None else ""
    (d / "status").write_text(f"Name:\t{comm}\n{vm}Threads:\t1\n")


def test_group_rss_sums_the_process_group(tmp_path: Path) -> None:
    _proc(tmp_path, 100, "hollownode", 100, 1000)
    _proc(tmp_path, 101, "odd) name (x", 100, 24)  # comm with spaces and parentheses
    _proc(tmp_path, 102, "zombie", 100, None)  # no VmRSS line
    _proc(tmp_path, 200, "other", 200, 5000)
    (tmp_path / "self").mkdir()
    assert cluster.group_rss_bytes(100, proc_root=tmp_path) == 1024 * 1024
    assert cluster.group_rss_bytes(300, proc_root=tmp_path) == 0


def _node_running(tmp_path: Path, binary: Path) -> cluster.HollowNode:
    apiserver: Any = None  # not reached: the node fails before it would register
    node_dir = tmp_path / "nodes" / "hn-2"
    return cluster.HollowNode("hn-2", (str(binary), "--name=hn-2"), node_dir, 1, apiserver,
                              tmp_path / "logs" / "hollownode-hn-2.log")  # fmt: skip


def test_a_binary_that_refuses_its_flags_is_one_line_naming_the_build_command(tmp_path: Path) -> None:
    old = tmp_path / "hollownode"
    old.write_text("#!/bin/sh\necho 'hollownode: flag provided but not defined: -record' >&2\nexit 2\n")
    old.chmod(0o755)
    node = _node_running(tmp_path, old)
    with pytest.raises(cluster.MissingCounterpartError) as err:
        node.start(timeout_s=30)
    message = str(err.value)
    assert "\n" not in message
    assert "flag provided but not defined: -record" in message
    assert message.endswith("rebuild it with tests/e2e/counterparts/build.sh")
    assert node.process is None  # stopped


def test_a_binary_that_cannot_run_is_one_line_naming_the_build_command(tmp_path: Path) -> None:
    garbage = tmp_path / "hollownode"
    garbage.write_bytes(b"\x7fELF truncated")
    garbage.chmod(0o755)
    with pytest.raises(cluster.MissingCounterpartError, match=r"cannot run .*build\.sh$") as err:
        _node_running(tmp_path, garbage).start(timeout_s=30)
    assert "\n" not in str(err.value)


def test_a_node_that_crashes_otherwise_shows_its_log(tmp_path: Path) -> None:
    crash = tmp_path / "hollownode"
    crash.write_text("#!/bin/sh\necho 'hollownode: bind-mount failed' >&2\nexit 1\n")
    crash.chmod(0o755)
    with pytest.raises(cluster.StartupError, match="bind-mount failed"):
        _node_running(tmp_path, crash).start(timeout_s=30)


def test_free_port_is_outside_the_ephemeral_range_and_never_handed_out_twice() -> None:
    # a port from the kernel's ephemeral range can be taken by any outgoing connection's source port
    # before the process it was meant for binds it; ours come from below that range
    low, high = cluster._ephemeral_range()
    ports = [cluster.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert not [p for p in ports if low <= p <= high]
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))
