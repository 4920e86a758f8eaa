from __future__ import annotations

import os
from pathlib import Path

from agent.metrics.attribution import PodOfProcess
from agent.metrics.procmap import ProcessPodMapper

UID_A = "11111111-2222-4333-8444-555555555555"
UID_B = "66666666-7777-4888-9999-aaaaaaaaaaaa"
CID = "b" * 64


def _proc(root: Path, pid: int, cgroup: str) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(cgroup)


def test_maps_host_pids_to_pods_and_skips_what_it_cannot(tmp_path: Path) -> None:
    proc, logs = tmp_path / "proc", tmp_path / "pods"
    logs.mkdir()
    (logs / f"ml_train-0_{UID_A}").mkdir()
    (logs / "not-a-pod-dir").mkdir()
    _proc(proc, 10, f"0::/kubepods/burstable/pod{UID_A}/{CID}\n")
    _proc(proc, 11, f"0::/kubepods/burstable/pod{UID_B}/{CID}\n")  # pod without a log dir
    _proc(proc, 12, "0::/system.slice/containerd.service\n")  # host process
    mapper = ProcessPodMapper(proc_root=str(proc), pod_logs_root=str(logs))
    assert mapper.map([10, 11, 12, 13]) == {10: PodOfProcess("ml", "train-0", UID_A, CID)}


def test_pod_index_follows_the_log_directory(tmp_path: Path) -> None:
    proc, logs = tmp_path / "proc", tmp_path / "pods"
    logs.mkdir()
    _proc(proc, 10, f"0::/kubepods/pod{UID_B}/{CID}\n")
    mapper = ProcessPodMapper(proc_root=str(proc), pod_logs_root=str(logs))
    assert mapper.map([10]) == {}
    (logs / f"infer_svc-1_{UID_B}").mkdir()
    os.utime(logs, (1e9, 2e9))  # a new mtime, as a new entry gives on a real filesystem
    assert mapper.map([10]) == {10: PodOfProcess("infer", "svc-1", UID_B, CID)}


def test_missing_roots_map_nothing(tmp_path: Path) -> None:
    mapper = ProcessPodMapper(proc_root=str(tmp_path / "no-proc"), pod_logs_root=str(tmp_path / "no-logs"))
    assert mapper.map([1, 2]) == {}
    assert mapper.map([]) == {}
