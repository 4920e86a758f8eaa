"""``bench deviceplugin --peer nvidia`` without the peer (exit 2, one line), and its pure parts: the
NVLink optimum, the verdicts and the table. The run itself is ``tests/e2e/test_peer_bench.py``."""

from __future__ import annotations

import asyncio
import itertools
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent import localcluster
from agent.benchmarks import deviceplugin, floorplugin, peer
from agent.fakekubelet import FakeKubelet
from agent.simnode import open_simulated_node
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc
from deviceplugin.preferred import Topology, topology_from_inventory


def test_without_the_peer_binary_it_says_so_in_one_line_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPU_NODE_AGENT_COUNTERPARTS_DIR", str(tmp_path))
    assert deviceplugin.main(["--peer", "nvidia", "--faults", "1"]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert "NVIDIA's device plugin is not built" in out
    assert "tests/e2e/counterparts/build.sh" in out


def test_only_nvidia_is_a_peer(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        deviceplugin.main(["--peer", "amd"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.fixture(scope="module")
def v100() -> Topology:
    with open_simulated_node("dgx1-v100") as node:
        node.nvml.init()
        return topology_from_inventory(node.discover())


def test_best_nvlinks_is_the_maximum_over_every_valid_answer(v100: Topology) -> None:
    gpus = list(v100.gpus)
    request = peer.PreferredRequest(available=tuple(gpus), must_include=(gpus[0],), size=4)
    answers = [[gpus[0], *rest] for rest in itertools.combinations(gpus[1:], 3)]
    scores = {peer.nvlinks(v100, a) for a in answers}
    assert len(scores) > 1  # on the hybrid cube-mesh the choice matters
    assert peer.best_nvlinks(v100, request) == max(scores)
    narrow = peer.PreferredRequest(available=tuple(gpus[:3]), must_include=(), size=3)
    assert peer.best_nvlinks(v100, narrow) == peer.nvlinks(v100, gpus[:3])


def test_requests_are_the_same_for_both_and_valid(v100: Topology) -> None:
    first, second = peer.preferred_requests(v100.gpus, 50), peer.preferred_requests(v100.gpus, 50)
    assert first == second
    for r in first:
        assert set(r.must_include) <= set(r.available)
        assert len(r.must_include) <= r.size <= len(r.available)


def _side(**over: Any) -> dict[str, Any]:
    lat = {"p50_ms": 1.0, "p99_ms": 2.0, "n": 3}
    figures: dict[str, Any] = {
        "registration_ms": 10.0,
        "listed_ms": 12.0,
        "idle": {"rss_bytes": 40 * 2**20, "cpu_ratio": 0.01},
        "allocate": lat,
        "preferred": {**lat, "optimal": 5, "invalid": 0, "total": 5},
        "reregister": lat,
        "storm": {"events": 9, "seconds": 1.0, "rss_bytes_peak": 41 * 2**20, "cpu_ratio": 0.1,
                  "marker_after_storm_ms": 3.0, "marker_resent": 0},
        "fault_unhealthy": lat,
        "recovery_ms": 100.0,
        "healthy_after_xid79_reset": 8,
        "plugin_restarts": 0,
    }  # fmt: skip
    figures.update(over)
    return figures


def test_verdicts_judge_each_aim() -> None:
    ours = _side(
        allocate={"p50_ms": 0.5, "p99_ms": 9.0, "n": 3},
        idle={"rss_bytes": 90 * 2**20, "cpu_ratio": 0},
        registration_cpu_ms=250.0,
    )
    theirs = _side(
        recovery_ms=None, healthy_after_xid79_reset=0, idle={"rss_bytes": 40 * 2**20, "cpu_ratio": 0}
    )
    rows, aims = peer.verdicts({"ours": ours, "nvidia": theirs})
    assert aims["allocate_p50"] is True
    assert aims["allocate_p99"] is False  # 9 ms against 2 ms
    assert aims["rss"] is False  # 90 MiB against 2 x 40
    assert aims["recovery"] is True
    assert aims["preferred_optimal_ours"] is True
    table = peer.render(rows)
    assert "never" in table  # NVIDIA's recovery
    assert "MISSED" in table
    assert table.splitlines()[0].split() == ["ours", "NVIDIA's", "aim"]
    [cpu] = [line for line in table.splitlines() if "CPU used until Register" in line]
    assert cpu.split()[-3:] == ["250.00", "ms", "-"]  # theirs not measured: shown as such, no verdict


def _package(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "mod.py").write_text("VALUE = 1\n")
    return folder


def test_bytecode_is_compiled_before_ours_starts_as_the_image_ships_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = _package(tmp_path, "peerbench_pkg_ok")
    assert peer.compile_bytecode(("peerbench_pkg_ok",))
    assert sorted(p.name.split(".")[0] for p in (folder / "__pycache__").glob("*.pyc")) == ["__init__", "mod"]


def test_a_package_whose_bytecode_cannot_be_written_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = _package(tmp_path, "peerbench_pkg_ro")
    (folder / "__pycache__").write_text("not a folder")  # where the bytecode would go
    assert not peer.compile_bytecode(("peerbench_pkg_ro",))


def test_the_floor_plugin_registers_lists_and_allocates(tmp_path: Path) -> None:
    """The floor side of ``--floor`` is a working plugin: the kubelet harness sees it register and list
    its devices, and Allocate answers what it was asked (measured only once it works)."""
    ids = ["GPU-a", "GPU-b", "GPU-c"]

    async def run() -> pb.AllocateResponse:
        kubelet = FakeKubelet(tmp_path)
        await kubelet.start()
        argv = [sys.executable, "-m", "agent.benchmarks.floorplugin", str(tmp_path), peer.GPU, *ids]
        process = localcluster.ManagedProcess("floor", argv, tmp_path / "floor.log").start()
        try:
            await kubelet.wait_for(lambda: len(kubelet.devices.get(peer.GPU, {})) == len(ids), 30)
            assert kubelet.registrations[0].resource_name == peer.GPU
            assert set(kubelet.devices[peer.GPU].values()) == {"Healthy"}

            def allocate() -> pb.AllocateResponse:
                with grpc.insecure_channel(f"unix://{tmp_path / floorplugin.ENDPOINT}") as channel:
                    request = pb.ContainerAllocateRequest(devices_ids=ids[:2])
                    return pb_grpc.DevicePluginStub(channel).Allocate(
                        pb.AllocateRequest(container_requests=[request]), timeout=10
                    )

            return await asyncio.to_thread(allocate)
        finally:
            process.stop()
            await kubelet.stop()

    reply = asyncio.run(run())
    assert reply.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"


def test_the_floor_rows_put_ours_beside_the_floor() -> None:
    side = {
        "registration_ms": 250.0,
        "registration_cpu_ms": 200.0,
        "allocate": {"p50_ms": 0.9, "p99_ms": 1.5},
        "idle": {"rss_bytes": 45 * 2**20},
    }
    floor = {**side, "registration_ms": 120.0, "idle": {"rss_bytes": 30 * 2**20}}
    rows = peer.floor_rows({"ours": side, "floor": floor})
    assert rows[0].label == "registration (start -> Register)"
    assert (rows[0].ours, rows[0].theirs) == ("250.00 ms", "120.00 ms")
    assert rows[-1].theirs == "30.0 MiB"
    assert "floor" in peer.render(rows, peer.Row("", "ours", "floor"))
