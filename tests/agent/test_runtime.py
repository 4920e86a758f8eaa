"""The node runtime: the inventory store, the component runner and rediscovery."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from agent.healthbook import DeviceHealth
from agent.nvml.protocol import EventKind, NvmlEvent
from agent.runtime import Change, InventoryStore, Rediscovery, StoreUpdate, run_components
from tests.deviceplugin.helpers import inventory
from topology.model import Health, NodeInventory


def test_store_versions_listeners_and_xid_counts() -> None:
    async def body() -> None:
        inv = inventory("pcie-l40s")
        store = InventoryStore(inv)
        seen: list[StoreUpdate] = []
        remove = store.add_listener(seen.append)
        uuid = inv.gpus[0].uuid
        store.set_health({uuid: DeviceHealth(Health.UNHEALTHY, "XID 48")})
        store.set_health({uuid: DeviceHealth(Health.UNHEALTHY, "XID 48")})  # no change, no version
        store.record_event(NvmlEvent(EventKind.XID, 0, uuid, xid=48))
        store.set_inventory(dataclasses.replace(inv, errors=("x",)))
        remove()
        store.set_health({})
        assert [u.change for u in seen] == [Change.HEALTH, Change.EVENTS, Change.INVENTORY]
        assert store.version == 4
        assert store.xid_counts() == {(uuid, 48): 1}
        assert store.health_of(uuid).healthy
        assert store.device_health(["nope", uuid]).healthy

    asyncio.run(body())


def test_wait_for_change_and_subscribe() -> None:
    async def body() -> None:
        store = InventoryStore(inventory("pcie-l40s"))
        assert await store.wait_for_change(0, timeout=0.01) == 0
        stop = asyncio.Event()
        versions: list[int] = []

        async def follow() -> None:
            async for v in store.subscribe(stop):
                versions.append(v)
                if len(versions) == 2:
                    stop.set()

        task = asyncio.create_task(follow())
        await asyncio.sleep(0)
        store.record_event(NvmlEvent(EventKind.ECC_SBE, 0, "GPU-x"))
        await asyncio.wait_for(task, 5)
        assert versions == [0, 1]

    asyncio.run(body())


class Sleeper:
    def __init__(self) -> None:
        self.stopped = False

    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stopped = True


class Failing:
    async def run(self, stop: asyncio.Event) -> None:
        raise RuntimeError("boom")


def test_a_failing_component_stops_the_others_in_order() -> None:
    sleeper = Sleeper()

    async def body() -> None:
        await run_components([sleeper, Failing()], asyncio.Event())

    with pytest.raises(ExceptionGroup) as err:
        asyncio.run(body())
    assert sleeper.stopped  # it saw stop and returned by itself, not cancelled
    assert str(err.value.exceptions[0]) == "boom"


def test_rediscovery_on_request_and_keeps_last_inventory_on_error() -> None:
    inv = inventory("pcie-l40s")
    calls = {"n": 0}

    def discover() -> NodeInventory:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("NVML went away")
        return dataclasses.replace(inv, errors=(f"run {calls['n']}",))

    async def body() -> None:
        store = InventoryStore(inv)
        errors: list[Exception] = []
        red = Rediscovery(store=store, discover=discover, debounce_s=0.0, on_error=errors.append)
        stop = asyncio.Event()
        task = asyncio.create_task(red.run(stop))
        red.request("test")
        await store.wait_for_change(0, timeout=5)
        assert store.inventory.errors == ("run 1",)
        red.request("again")
        async with asyncio.timeout(5):
            while not errors:
                await asyncio.sleep(0.01)
        assert store.inventory.errors == ("run 1",)
        stop.set()
        await task
        assert red.reasons == ["test", "again"]

    asyncio.run(body())


def test_carry_lost_gpus_keeps_identity_and_mig_of_a_lost_gpu() -> None:
    from agent.runtime import carry_lost_gpus

    before = inventory("dgx-a100-mig")
    gone = dataclasses.replace(before.gpu(0), uuid="", lost=True, error="GPU_IS_LOST")
    after = dataclasses.replace(
        before,
        gpus=(gone, *before.gpus[1:]),
        mig=tuple(s for s in before.mig if s.gpu_index != 0),
    )
    merged = carry_lost_gpus(before, after)
    assert merged.gpu(0).uuid == before.gpu(0).uuid
    assert merged.gpu(0).lost
    assert merged.gpu(0).error == "GPU_IS_LOST"
    assert [s.gpu_index for s in merged.mig] == [s.gpu_index for s in before.mig]
    assert carry_lost_gpus(before, before) is before
