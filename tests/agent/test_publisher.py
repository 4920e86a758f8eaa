"""The publisher against Kubernetes faked at the HTTP level (tests/topology/kubefake.py)."""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import Iterator

import pytest

from agent.healthbook import DeviceHealth
from agent.publisher import KubeNodeApi, Publisher, PublisherSettings, device_health
from agent.runtime import InventoryStore
from tests.kubeconfig import write_token_kubeconfig
from tests.topology.factories import nvl72_tray
from tests.topology.kubefake import FakeKube, api_client
from topology.gpunode import inventory_from_gpunode
from topology.kube import GPUNODES, NODES, Kube
from topology.kube.client import events
from topology.model import FabricHealthSummary, Health

NODE = "rack0-tray0"


@pytest.fixture
def fake() -> Iterator[tuple[FakeKube, str]]:
    f = FakeKube()
    f.put(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"team": "ml"}}})
    with f.serve() as url:
        yield f, url


def publisher(url: str, store: InventoryStore, **kw: float) -> Publisher:
    settings = PublisherSettings(node_name=NODE, min_backoff_s=0.02, max_backoff_s=0.1, **kw)
    return Publisher(source=store, api=KubeNodeApi(Kube(api_client(url))), settings=settings)


def test_publishes_gpunode_status_and_labels_once(fake: tuple[FakeKube, str]) -> None:
    f, url = fake
    store = InventoryStore(nvl72_tray(NODE))
    p = publisher(url, store)
    assert p.publish_once() == 3
    obj = f.get(GPUNODES, NODE)
    assert obj is not None
    node = f.get(NODES, NODE)
    assert node is not None
    assert obj["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    name, inv, health = inventory_from_gpunode(obj)
    assert (name, inv) == (NODE, store.inventory)
    assert health is not None
    assert set(health.values()) == {Health.HEALTHY}
    labels = node["metadata"]["labels"]
    assert labels["team"] == "ml"  # someone else's label stays
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.clique"].endswith(".32766")
    applies = [path for method, path in f.writes() if method == "PATCH"]
    assert applies == [f"{GPUNODES}/{NODE}", f"{GPUNODES}/{NODE}/status", f"{NODES}/{NODE}"]

    # nothing changed: nothing written
    assert p.publish_once() == 0
    assert len(f.writes()) == 3


def test_health_change_writes_status_only_and_labels_follow_fabric(fake: tuple[FakeKube, str]) -> None:
    f, url = fake
    store = InventoryStore(nvl72_tray(NODE))
    p = publisher(url, store)
    p.publish_once()
    gpu2 = store.inventory.gpus[2].uuid
    store.set_health({gpu2: DeviceHealth(Health.UNHEALTHY, "xid 79")})
    assert p.publish_once() == 1
    status = f.get(GPUNODES, NODE)["status"]  # type: ignore[index]
    assert status["summary"]["health"] == "Degraded"
    assert {"id": gpu2, "health": "Unhealthy"} in status["health"]

    # fabric turns unhealthy: the tray leaves its NVLink domain (ours and GFD's clique label go)
    store.set_inventory(nvl72_tray(NODE, summary=FabricHealthSummary.UNHEALTHY))
    assert p.publish_once() == 2
    labels = f.get(NODES, NODE)["metadata"]["labels"]  # type: ignore[index]
    assert "gpuagent.dev/nvlink-domain" not in labels
    assert labels["gpuagent.dev/nvlink-fabric"] == "unhealthy"
    assert labels["gpuagent.dev/fabric-health"] == "unhealthy"
    assert "nvidia.com/gpu.clique" not in labels
    status = f.get(GPUNODES, NODE)["status"]  # type: ignore[index]
    assert status["fabric"][0] == {"gpu": 0, "level": "unhealthy", "conditions": ["summary_unhealthy"]}
    assert status["summary"]["fabricHealth"] == "unhealthy"
    assert labels["team"] == "ml"


def test_device_health_lists_every_device() -> None:
    inv = nvl72_tray(NODE)
    out = device_health(inv, {inv.gpus[0].uuid: DeviceHealth(Health.UNHEALTHY)})
    assert out[inv.gpus[0].uuid] is Health.UNHEALTHY
    assert sorted(out) == sorted(g.uuid for g in inv.gpus)


def run_for(p: Publisher, until: object, limit_s: float = 20.0, during: object = None) -> None:
    """Run the component until ``until()`` is true (bounded), calling ``during()`` on the way."""

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(p.run(stop))
        deadline = time.monotonic() + limit_s
        try:
            while not until():  # type: ignore[operator]
                if time.monotonic() > deadline:
                    raise AssertionError("timed out")
                if during is not None:
                    during()  # type: ignore[operator]
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=10)

    asyncio.run(main())


def test_retries_while_api_down_and_crd_missing_then_publishes_latest(fake: tuple[FakeKube, str]) -> None:
    f, url = fake
    f.down = True
    store = InventoryStore(nvl72_tray(NODE))
    p = publisher(url, store)
    steps = {"n": 0}

    def during() -> None:
        steps["n"] += 1
        if p.failures >= 3 and f.down:
            f.down = False
            f.missing.add(GPUNODES)  # API back, CRD not yet installed
            store.set_inventory(nvl72_tray(NODE, summary=FabricHealthSummary.UNHEALTHY))
        elif p.failures >= 5 and GPUNODES in f.missing:
            f.missing.clear()

    run_for(p, lambda: f.get(GPUNODES, NODE) is not None and "status" in f.get(GPUNODES, NODE), during=during)
    assert p.failures >= 5
    assert f.get(GPUNODES, NODE)["status"]["summary"]["fabric"] == "unhealthy"  # type: ignore[index]


def test_loop_writes_on_change_only_and_recreates_deleted_gpunode(fake: tuple[FakeKube, str]) -> None:
    f, url = fake
    store = InventoryStore(nvl72_tray(NODE))
    p = publisher(url, store, verify_interval_s=0.2)
    state = {"deleted": False}

    def during() -> None:
        if p.writes == 3 and not state["deleted"]:
            state["deleted"] = True
            f.remove(GPUNODES, NODE)

    run_for(
        p, lambda: state["deleted"] and f.get(GPUNODES, NODE) is not None and p.writes >= 5, during=during
    )
    # re-created: the object and its status again, labels untouched (they did not change)
    assert [m for m, path in f.writes(NODES)] == ["PATCH"]


def test_run_publishes_through_the_kubeconfig(
    fake: tuple[FakeKube, str], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run`` builds the publisher when a Kubernetes API is configured (here: $KUBECONFIG)."""
    import tempfile

    from agent.commands.run import serve
    from agent.config import RunSettings
    from tests.deviceplugin.helpers import running_kubelet

    f, url = fake
    kubeconfig = write_token_kubeconfig(tmp_path / "kubeconfig", url)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    with tempfile.TemporaryDirectory(prefix="pub", dir="/tmp") as d:
        settings = RunSettings(
            node_name=NODE, kubelet_dir=pathlib.Path(d), simulate="gb200-nvl72:rack=0,tray=0", metrics_addr=""
        )

        async def body() -> int:
            async with running_kubelet(pathlib.Path(d)):
                stop = asyncio.Event()
                task = asyncio.create_task(serve(settings, stop=stop))
                deadline = time.monotonic() + 30
                while f.get(GPUNODES, NODE) is None or "status" not in f.get(GPUNODES, NODE):  # type: ignore[operator]
                    assert time.monotonic() < deadline, "no GPUNode published"
                    await asyncio.sleep(0.05)
                stop.set()
                return await asyncio.wait_for(task, 20)

        assert asyncio.run(body()) == 0
    labels = f.get(NODES, NODE)["metadata"]["labels"]  # type: ignore[index]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-GB200"
    assert labels["gpuagent.dev/nvlink-domain"].startswith("nvl-")


def test_health_changes_become_node_events_once_each(fake: tuple[FakeKube, str]) -> None:
    """``kubectl describe node`` shows why a GPU left and when it came back: one Event per change."""
    f, url = fake
    store = InventoryStore(nvl72_tray(NODE))
    p = publisher(url, store)
    p.publish_once()
    assert p.announce_health() == 0  # all healthy: nothing to say
    gpu1, gpu3 = store.inventory.gpus[1], store.inventory.gpus[3]
    reason = "XID 79 (GPU has fallen off the bus); not answering NVML: needs a GPU reset or a reboot"
    store.set_health({gpu1.uuid: DeviceHealth(Health.UNHEALTHY, reason)})
    p.publish_once()
    assert p.announce_health() == 1
    assert p.announce_health() == 0  # nothing new
    store.set_health(
        {
            gpu1.uuid: DeviceHealth(Health.UNHEALTHY, reason),
            gpu3.uuid: DeviceHealth(Health.UNHEALTHY, "GPU lost (GPU is lost)"),
        }
    )
    assert p.announce_health() == 1  # only GPU 3 is news
    store.set_health({gpu3.uuid: DeviceHealth(Health.UNHEALTHY, "GPU lost (GPU is lost)")})
    assert p.announce_health() == 1  # GPU 1 is back
    recorded = list(f.items(events("default")).values())
    seen = sorted((e["reason"], e["type"], e["message"]) for e in recorded)
    assert seen == [
        ("GpuHealthy", "Normal", f"GPU 1 ({gpu1.uuid}) is healthy again and back in service"),
        ("GpuUnhealthy", "Warning", f"GPU 1 ({gpu1.uuid}) withdrawn: {reason}"),
        ("GpuUnhealthy", "Warning", f"GPU 3 ({gpu3.uuid}) withdrawn: GPU lost (GPU is lost)"),
    ]
    node_uid = f.get(NODES, NODE)["metadata"]["uid"]  # type: ignore[index]
    about = {
        (e["involvedObject"]["kind"], e["involvedObject"]["name"], e["involvedObject"]["uid"])
        for e in recorded
    }
    assert about == {("Node", NODE, node_uid)}
    assert {e["source"]["component"] for e in recorded} == {"gpu-node-agent"}


def test_a_refused_health_event_is_logged_and_publishing_goes_on(fake: tuple[FakeKube, str]) -> None:
    f, url = fake
    store = InventoryStore(nvl72_tray(NODE))
    p = publisher(url, store)
    p.publish_once()
    f.missing.add(events("default"))
    store.set_health({store.inventory.gpus[0].uuid: DeviceHealth(Health.UNHEALTHY, "XID 48")})
    assert p.announce_health() == 0
    assert p.publish_once() == 1  # the status still carries it
    assert f.items(events("default")) == {}
