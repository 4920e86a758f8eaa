"""The controller's /metrics: one series per NVLink domain for free, healthy, stranded GPUs, ready trays,
the IMEX quorum, the largest subgroup and fragmentation, served by the controller command's listener."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from agent.commands.controller import metrics_server
from agent.metrics.domains import controller_render
from tests.topology.factories import nvl72_tray
from tests.topology.kubefake import FakeKube, api_client
from tests.topology.test_fabrichealth import with_gpu
from topology.controller import ControllerSettings, TopologyController
from topology.gpunode import gpunode_object, inventory_from_gpunode, published_verdicts
from topology.kube import Kube
from topology.nvlinkdomain import DomainStatus, domain_statuses, tray_from_gpunode


def statuses() -> dict[str, DomainStatus]:
    trays = []
    for t in range(4):
        inv = nvl72_tray(f"rack0-tray{t}")
        if t == 3:
            inv = with_gpu(inv, 0, health={"route_unhealthy": True})
        obj = gpunode_object(inv, node_name=f"rack0-tray{t}")
        name, back, health = inventory_from_gpunode(obj)
        tray = tray_from_gpunode(
            name,
            back,
            verdicts=published_verdicts(obj),
            health=health,
            imex=None,
            used_gpus=1 if t == 0 else 0,
        )
        assert tray is not None
        trays.append(tray)
    return domain_statuses(trays)


def samples(text: str) -> dict[str, float]:
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.labels.get("domain")
    }


def test_per_domain_series() -> None:
    text = controller_render(statuses, lambda: {"reconciles": 3})().decode()
    got = samples(text)
    assert got["gpuagent_nvlink_domain_gpus"] == 16
    assert got["gpuagent_nvlink_domain_free_gpus"] == 15
    assert got["gpuagent_nvlink_domain_stranded_gpus"] == 4  # the route-unhealthy tray's free GPUs
    assert got["gpuagent_nvlink_domain_ready_trays"] == 3
    assert got["gpuagent_nvlink_domain_largest_subgroup_trays"] == 2
    assert got["gpuagent_nvlink_domain_fragmentation_ratio"] == 1 - 8 / 11
    assert "gpuagent_topology_controller_reconciles_total 3.0" in text


def test_controller_serves_metrics_on_its_listener() -> None:
    fake = FakeKube()
    with fake.serve() as url:
        controller = TopologyController(kube=Kube(api_client(url)), settings=ControllerSettings())
        controller.domains = statuses()

        async def scrape() -> str:
            server = metrics_server(controller, "127.0.0.1:0")
            await server.start()
            try:
                port = server.bound_port
                return await asyncio.to_thread(
                    lambda: (
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
                    )
                )
            finally:
                await server.stop()

        text = asyncio.run(scrape())
    assert samples(text)["gpuagent_nvlink_domain_trays"] == 4
