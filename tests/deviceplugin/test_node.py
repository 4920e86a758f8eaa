"""The device plugin reads the node through Protocols it defines: any object that answers them will do,
and the plugin's servers read health from it each time instead of keeping a copy."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from deviceplugin.config import PluginConfig, parse_plugin_config
from deviceplugin.node import NodeChange, NodeState
from deviceplugin.preferred import topology_from_inventory
from deviceplugin.resources import GPU_RESOURCE, build_plan
from deviceplugin.server import PluginState
from tests.deviceplugin.helpers import inventory
from topology.model import Health, NodeInventory


@dataclass(frozen=True)
class Status:
    healthy: bool
    reason: str | None = None


@dataclass
class Node:
    """A node that is not the agent's store: the Protocol is all the plugin asks for."""

    inventory: NodeInventory
    bad: dict[str, str] = field(default_factory=dict)  # key -> reason

    def device_health(self, keys: Iterable[str]) -> Status:
        for key in keys:
            if key in self.bad:
                return Status(False, self.bad[key])
        return Status(True)

    def add_listener(self, listener: Callable[[NodeChange], None]) -> Callable[[], None]:
        return lambda: None


def state_on(node: NodeState, config: PluginConfig) -> PluginState:
    resource = build_plan(node.inventory, config).by_name()[GPU_RESOURCE]
    return PluginState(
        resource=resource, topology=topology_from_inventory(node.inventory), config=config, health=node
    )


def test_plugin_state_reads_health_from_the_node_and_wakes_streams_only_when_the_list_moves() -> None:
    async def body() -> None:
        node = Node(inventory("pcie-l40s"))
        state = state_on(node, parse_plugin_config({}))
        gpu = node.inventory.gpus[1].uuid
        assert state.unhealthy == {}
        assert state.version == 0
        assert not state.refresh()  # nothing moved

        node.bad[gpu] = "XID 79"
        assert state.unhealthy == {gpu: "XID 79"}  # read now, before any refresh
        assert state.refresh()
        assert state.version == 1
        assert (gpu, Health.UNHEALTHY) in [(d, h) for d, h, _ in state.devices()]
        assert not state.refresh()  # the same list is not announced twice

        node.bad.clear()
        assert state.refresh()
        assert state.version == 2
        assert all(h is Health.HEALTHY for _, h, _ in state.devices())

    asyncio.run(body())


def test_replicas_follow_the_health_of_their_gpu() -> None:
    async def body() -> None:
        data = {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
        node = Node(inventory("pcie-l40s"))
        state = state_on(node, parse_plugin_config(data))
        node.bad[node.inventory.gpus[0].uuid] = "double-bit ECC error"
        assert sorted(state.unhealthy) == [f"{node.inventory.gpus[0].uuid}::{n}" for n in (0, 1)]

    asyncio.run(body())
