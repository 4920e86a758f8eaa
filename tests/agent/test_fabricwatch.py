"""FabricWatch keeps the inventory's fabric current, and the labels, the GPUNode and the health book follow;
a tray whose fault file says ``IN_PROGRESS`` at boot is out of its NVLink domain from its first discovery."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.fabricwatch import FabricWatch
from agent.health import HealthMonitor
from agent.healthbook import HealthConfig
from agent.nvml.errors import CODES
from agent.nvml.faults import apply_fault
from agent.runtime import InventoryStore
from agent.simnode import SimulatedNode, open_simulated_node
from topology.fabrichealth import LABEL_FABRIC_HEALTH
from topology.gpunode import gpunode_object
from topology.labels import LABEL_CLIQUE, node_labels


def node(tmp_path: Path, lines: str = "") -> SimulatedNode:
    faults = tmp_path / "faults.jsonl"
    faults.write_text(lines, encoding="utf-8")
    sim = open_simulated_node("gb200-nvl72:rack=1,tray=3", faults_path=faults)
    sim.nvml.init()
    return sim


def test_in_progress_at_boot_keeps_the_tray_out_of_its_domain_until_completed(tmp_path: Path) -> None:
    sim = node(tmp_path, '{"event":"fabric","gpu":2,"state":"IN_PROGRESS"}\n')
    with sim:
        inventory = sim.discover(strict=True)
        labels = node_labels(inventory, node_name="t")
        assert LABEL_CLIQUE not in labels
        assert labels[LABEL_FABRIC_HEALTH] == "unhealthy"
        status = gpunode_object(inventory, node_name="t")["status"]
        assert status["fabric"][2] == {"gpu": 2, "level": "unhealthy", "conditions": ["not_completed"]}

        store = InventoryStore(inventory)
        watch = FabricWatch(nvml=sim.nvml, store=store, interval_s=1.0)
        assert not asyncio.run(watch.once())  # nothing changed: the store is left alone
        apply_fault(sim.nvml, {"event": "fabric", "gpu": 2, "state": "COMPLETED"})
        assert asyncio.run(watch.once())
        labels = node_labels(store.inventory, node_name="t")
        assert labels[LABEL_CLIQUE]
        assert labels[LABEL_FABRIC_HEALTH] == "healthy"


def test_a_route_fault_reaches_the_store_and_the_health_book(tmp_path: Path) -> None:
    sim = node(tmp_path)
    with sim:

        async def body() -> None:
            store = InventoryStore(sim.discover(strict=True))
            watch = FabricWatch(nvml=sim.nvml, store=store, interval_s=1.0)
            health = HealthMonitor(
                nvml=sim.nvml, store=store, config=HealthConfig(fabric_unhealthy_marks_gpu=True)
            )
            stop = asyncio.Event()
            task = asyncio.create_task(health.run(stop))
            await asyncio.wait_for(health.started.wait(), 5)
            gpu1 = store.inventory.gpu(1).uuid
            apply_fault(sim.nvml, {"event": "fabric", "gpu": 1, "conditions": ["degraded_bandwidth"]})
            assert await watch.once()
            await asyncio.sleep(0.05)
            assert store.health_of(gpu1).healthy  # degraded: still schedulable
            assert node_labels(store.inventory, node_name="t")[LABEL_FABRIC_HEALTH] == "degraded"
            assert LABEL_CLIQUE in node_labels(store.inventory, node_name="t")
            apply_fault(sim.nvml, {"event": "fabric", "gpu": 1, "conditions": ["route_unhealthy"]})
            assert await watch.once()
            for _ in range(100):
                if not store.health_of(gpu1).healthy:
                    break
                await asyncio.sleep(0.01)
            assert (store.health_of(gpu1).reason or "").startswith(
                "fabric unhealthy: route_unhealthy, summary_unhealthy"
            )
            assert all(store.health_of(g.uuid).healthy for g in store.inventory.gpus if g.index != 1)
            assert LABEL_CLIQUE not in node_labels(store.inventory, node_name="t")
            stop.set()
            await task

        asyncio.run(body())


def test_a_failed_read_keeps_the_last_fabric_facts(tmp_path: Path) -> None:
    sim = node(tmp_path)
    with sim:
        store = InventoryStore(sim.discover(strict=True))
        before = store.inventory
        sim.nvml.inject_error(CODES["UNKNOWN"], call="nvmlDeviceGetGpuFabricInfoV")
        watch = FabricWatch(nvml=sim.nvml, store=store, interval_s=1.0)
        assert not asyncio.run(watch.once())
        assert store.inventory is before
        assert watch.read_failures == 4
