from __future__ import annotations

from pathlib import Path

import pytest

from agent.mps import PID_FILE, detect_mps, parse_size
from topology.model import Gpu, MpsGpuLimits


def _gpu(index: int) -> Gpu:
    return Gpu(
        index=index,
        uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
        name="NVIDIA H100 80GB HBM3",
        serial=None,
        pci_bus_id=f"00000000:{0x1B + index:02X}:00.0",
        minor_number=index,
        memory_total_bytes=81559 * 2**20,
        compute_capability=(9, 0),
        architecture="hopper",
        numa_node=0,
        cpu_affinity=None,
        persistence_mode=True,
        compute_mode="EXCLUSIVE_PROCESS",
    )


GPUS = [_gpu(i) for i in range(4)]


def _daemon(root: Path, env: dict[str, str], *, pid: int = 4242, comm: str = "nvidia-cuda-mps") -> None:
    pipe = root / "tmp/nvidia-mps"
    pipe.mkdir(parents=True)
    (pipe / PID_FILE).write_text(f"{pid}\n", encoding="utf-8")
    proc = root / "proc" / str(pid)
    proc.mkdir(parents=True)
    (proc / "comm").write_text(comm + "\n", encoding="utf-8")
    (proc / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


@pytest.mark.parametrize(
    ("text", "size"), [("1G", 2**30), ("512MB", 512 * 2**20), ("1024", 1024), ("2k", 2048)]
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_no_pid_file_means_no_daemon(tmp_path: Path) -> None:
    scan = detect_mps(root=tmp_path, gpus=GPUS)
    assert not scan.info.daemon_running
    assert scan.errors == ()


def test_stale_pid_file_and_reused_pid_are_not_running(tmp_path: Path) -> None:
    _daemon(tmp_path, {}, comm="bash")
    assert not detect_mps(root=tmp_path, gpus=GPUS).info.daemon_running
    (tmp_path / "proc/4242/comm").unlink()
    (tmp_path / "proc/4242/environ").unlink()
    (tmp_path / "proc/4242").rmdir()
    assert not detect_mps(root=tmp_path, gpus=GPUS).info.daemon_running


def test_daemon_limits_from_its_environment(tmp_path: Path) -> None:
    _daemon(
        tmp_path,
        {
            "CUDA_VISIBLE_DEVICES": f"2,{GPUS[3].uuid}",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1G,1=512MB",
        },
    )
    scan = detect_mps(root=tmp_path, gpus=GPUS)
    assert scan.errors == ()
    assert scan.info.daemon_running
    assert scan.info.pipe_directory == "/tmp/nvidia-mps"
    assert scan.info.gpus == (
        MpsGpuLimits(GPUS[2].uuid, 25, 2**30),
        MpsGpuLimits(GPUS[3].uuid, 25, 512 * 2**20),
    )


def test_bad_values_are_reported_and_the_rest_kept(tmp_path: Path) -> None:
    _daemon(
        tmp_path,
        {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "250", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=lots,1=2G,9=1G"},
    )
    scan = detect_mps(root=tmp_path, gpus=GPUS)
    assert scan.info.daemon_running
    assert scan.info.gpus == (MpsGpuLimits(GPUS[1].uuid, None, 2 * 2**30),)
    assert len(scan.errors) == 3
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='250' is not 1..100" in scan.errors[0]
    assert "not a size: 'lots'" in scan.errors[1]
    assert "device ordinal 9 is not visible" in scan.errors[2]


def test_garbage_pid_file_is_one_error(tmp_path: Path) -> None:
    pipe = tmp_path / "tmp/nvidia-mps"
    pipe.mkdir(parents=True)
    (pipe / PID_FILE).write_text("not a pid", encoding="utf-8")
    scan = detect_mps(root=tmp_path, gpus=GPUS)
    assert not scan.info.daemon_running
    assert len(scan.errors) == 1
    assert "not a process id" in scan.errors[0]


def test_non_ascii_digits_in_the_daemons_environment_are_errors_not_a_crash(tmp_path: Path) -> None:
    """``str.isdigit`` takes ``²``, which ``int`` refuses: a percentage, a visible device or an ordinal
    written with one is one error line each (it used to raise out of discovery); huge numbers too."""
    _daemon(
        tmp_path,
        {
            "CUDA_VISIBLE_DEVICES": "\u00b2",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "\u00b2",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"\u00b2=1G,0={'9' * 5000}",
        },
    )
    scan = detect_mps(root=tmp_path, gpus=GPUS)
    assert scan.info.daemon_running
    assert scan.info.gpus == ()
    assert len(scan.errors) == 4
    assert "CUDA_VISIBLE_DEVICES entry '\u00b2' is not a GPU of this node" in scan.errors[0]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='\u00b2' is not 1..100" in scan.errors[1]
    assert "expected '<ordinal>=<size>', got '\u00b2=1G'" in scan.errors[2]
    assert "device ordinal 0 is not visible" in scan.errors[3]
    assert all(len(e) < 300 for e in scan.errors)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_pid_file_that_is_not_a_regular_file_is_one_error(tmp_path: Path, kind: str) -> None:
    import os

    pipe = tmp_path / "tmp/nvidia-mps"
    pipe.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(pipe / PID_FILE)
    else:
        (pipe / PID_FILE).mkdir()
    scan = detect_mps(root=tmp_path, gpus=GPUS)
    assert not scan.info.daemon_running
    what = "a FIFO" if kind == "fifo" else "a directory"
    assert scan.errors == (f"{pipe / PID_FILE}: not a regular file ({what})",)
