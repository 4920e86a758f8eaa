"""The DRA driver against the real kube-apiserver (1.37, ``resource.k8s.io/v1`` served): ``run`` with
``dra.enabled`` publishes the node's pool as a ResourceSlice by server-side apply (field manager
``gpu-node-agent``), the API server accepts every attribute we write, and a claim prepared by the
kubelet's call is read from the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc.aio
import pytest

from agent import localcluster as cluster
from agent.commands.run import serve
from agent.config import RunSettings
from deviceplugin.config import parse_plugin_config
from deviceplugin.dra.api import dra_pb2 as pb
from deviceplugin.dra.channelbook import KubeChannelBook, record_name
from deviceplugin.dra.channels import ChannelRequest, parse_record
from deviceplugin.dra.config import DraConfig
from deviceplugin.dra.slices import build_slices, device_name
from deviceplugin.dra.taints import Fault, TaintCause, TaintEffect, render_taints
from deviceplugin.resources import build_plan
from tests.deviceplugin.helpers import inventory as sim_inventory
from topology.kube import RESOURCESLICES, Kube, configmaps, resourceclaims

pytestmark = pytest.mark.e2e

DRIVER = "gpu.gpuagent.dev"
PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dra", dir="/tmp") as d:
        yield Path(d)


def _slices(kube: Kube, node: str) -> list[dict[str, Any]]:
    items, _ = kube.list(RESOURCESLICES, field_selector=f"spec.nodeName={node},spec.driver={DRIVER}")
    return items


def test_resourceslice_appears_and_a_claim_is_prepared(
    control_plane: cluster.ControlPlane,
    api_client: Any,
    gpu_nodes: Any,
    namespace: str,
    short_dir: Path,
) -> None:
    (node,) = gpu_nodes(["dra-e2e-gb200"], gpus=4)
    kube = Kube(api_client)
    settings = RunSettings(
        node_name=node,
        kubelet_dir=short_dir / "dp",
        simulate="gb200-nvl72:rack=3,tray=7",
        kubeconfig=Path(control_plane.apiserver.kubeconfig),
        metrics_addr="",
        plugin=parse_plugin_config({"cdi": {"specDir": str(short_dir / "cdi")}}),
        dra=DraConfig(
            enabled=True, plugin_dir=str(short_dir / "plugins"), registry_dir=str(short_dir / "reg")
        ),
    )
    (short_dir / "dp").mkdir()

    async def body() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(settings, stop=stop, factories=()))
        try:
            await asyncio.to_thread(
                cluster.wait_until,
                lambda: bool(_slices(kube, node)),
                what="the node's ResourceSlice",
                timeout_s=60,
            )
            (obj,) = _slices(kube, node)
            spec = obj["spec"]
            assert spec["pool"]["name"] == node
            assert spec["pool"]["resourceSliceCount"] == 1
            assert len(spec["devices"]) == 4
            managers = {m["manager"] for m in obj["metadata"]["managedFields"]}
            assert managers == {"gpu-node-agent"}
            assert obj["metadata"]["ownerReferences"][0]["kind"] == "Node"
            domains = {d["attributes"]["nvlinkDomain"]["string"] for d in spec["devices"]}
            assert len(domains) == 1
            attrs = spec["devices"][0]["attributes"]
            assert attrs["cudaComputeCapability"] == {"version": "10.0.0"}
            assert attrs["tray"] == {"int": 7}
            assert "resource.kubernetes.io/pciBusID" in attrs
            device = spec["devices"][0]["name"]
            # a claim as the scheduler would have allocated it, read by NodePrepareResources
            claim = kube.create(
                resourceclaims(namespace),
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": "one-gpu"},
                    "spec": {
                        "devices": {
                            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuagent.dev"}}]
                        }
                    },
                },
            )
            claim["status"] = {
                "allocation": {
                    "devices": {
                        "results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": device}]
                    }
                }
            }
            kube.replace(f"{resourceclaims(namespace)}/one-gpu/status", claim)
            uid = claim["metadata"]["uid"]
            async with grpc.aio.insecure_channel(
                f"unix://{short_dir / 'plugins' / DRIVER / 'dra.sock'}"
            ) as ch:
                prepare = ch.unary_unary(
                    PREPARE,
                    request_serializer=pb.NodePrepareResourcesRequest.SerializeToString,
                    response_deserializer=pb.NodePrepareResourcesResponse.FromString,
                )
                got = await prepare(
                    pb.NodePrepareResourcesRequest(
                        claims=[pb.Claim(namespace=namespace, uid=uid, name="one-gpu")]
                    ),
                    timeout=20,
                    wait_for_ready=True,
                )
            assert got.claims[uid].error == ""
            assert [d.device_name for d in got.claims[uid].devices] == [device]
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)
            for s in _slices(kube, node):
                kube.delete(f"{RESOURCESLICES}/{s['metadata']['name']}")

    asyncio.run(body())


def _bytes(q: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    return int(q[:-2]) * units[q[-2:]] if q[-2:] in units else int(q)


def _counters(sets: list[dict[str, Any]]) -> dict[str, int]:
    return {c["name"]: _bytes(c["counters"]["memory"]["value"]) for c in sets}


def test_api_server_keeps_mig_counters_and_health_taints(
    control_plane: cluster.ControlPlane, api_client: Any, gpu_nodes: Any
) -> None:
    """The 1.37 API server takes our partitionable MIG layout (counter sets in their own slice, devices
    consuming them) and both taint effects, and keeps every field (a field behind a disabled feature gate
    would be dropped silently, so the objects are read back, not only dry-run)."""
    (node,) = gpu_nodes(["dra-e2e-mig"], gpus=8)
    kube = Kube(api_client)
    inv = sim_inventory("dgx-a100-mig")
    plan = build_plan(inv, parse_plugin_config({"flags": {"migStrategy": "mixed"}}))
    devices = [d for r in plan.resources for d in r.devices]
    mig = next(d for d in devices if d.kind.value == "mig")
    whole = next(d for d in devices if d.kind.value == "gpu")
    faults = {
        mig.base_uuid: [Fault(TaintCause.XID, "XID 48 (double-bit ECC error)")],
        whole.base_uuid: [Fault(TaintCause.FABRIC, "fabric degraded: limited_capacity", TaintEffect.NONE)],
    }
    taints = {u: render_taints(f, driver=DRIVER) for u, f in faults.items()}
    slices = build_slices(
        inv, devices, node_name=node, node_uid=None, driver=DRIVER, generation=1, taints=taints
    )
    assert len(slices) == 2
    try:
        stored = [kube.apply(f"{RESOURCESLICES}/{s['metadata']['name']}", s) for s in slices]
        back = {s["metadata"]["name"]: s["spec"] for s in _slices(kube, node)}
        assert set(back) == {s["metadata"]["name"] for s in stored}
        spec_devices, spec_counters = (back[s["metadata"]["name"]] for s in slices)
        # the API server writes quantities in canonical form (81920Mi as 80Gi): compared as bytes
        assert _counters(spec_counters["sharedCounters"]) == _counters(slices[1]["spec"]["sharedCounters"])
        by_name = {d["name"]: d for d in spec_devices["devices"]}
        mig_device = by_name[device_name(mig.base_uuid)]
        sent = next(d for d in slices[0]["spec"]["devices"] if d["name"] == mig_device["name"])
        (consumes,) = mig_device["consumesCounters"]
        assert consumes["counterSet"] == sent["consumesCounters"][0]["counterSet"]
        sent_memory = sent["consumesCounters"][0]["counters"]["memory"]["value"]
        assert _bytes(consumes["counters"]["memory"]["value"]) == _bytes(sent_memory)
        (xid_taint,) = mig_device["taints"]
        assert (xid_taint["key"], xid_taint["effect"], xid_taint["value"]) == (
            "gpu.gpuagent.dev/xid",
            "NoSchedule",
            "XID-48-double-bit-ECC-error",
        )
        assert xid_taint.get("timeAdded")  # stamped by the API server
        (fabric_taint,) = by_name[device_name(whole.base_uuid)]["taints"]
        assert (fabric_taint["key"], fabric_taint["effect"]) == ("gpu.gpuagent.dev/fabric", "None")
    finally:
        for s in slices:
            kube.delete(f"{RESOURCESLICES}/{s['metadata']['name']}")


def test_api_server_keeps_the_shared_imex_channel_device(api_client: Any, gpu_nodes: Any) -> None:
    (node,) = gpu_nodes(["dra-e2e-imex"], gpus=4)
    kube = Kube(api_client)
    inv = sim_inventory("gb200-nvl72:rack=4,tray=1")
    plan = build_plan(inv, parse_plugin_config({}))
    devices = [d for r in plan.resources for d in r.devices]
    (obj,) = build_slices(
        inv, devices, node_name=node, node_uid=None, driver=DRIVER, generation=1, imex_channel=True
    )
    try:
        kube.apply(f"{RESOURCESLICES}/{obj['metadata']['name']}", obj)
        (back,) = _slices(kube, node)
        channel = next(d for d in back["spec"]["devices"] if d["name"] == "imex-channel")
        assert channel["allowMultipleAllocations"] is True
        assert channel["attributes"]["type"] == {"string": "imex-channel"}
    finally:
        kube.delete(f"{RESOURCESLICES}/{obj['metadata']['name']}")


def test_imex_channel_record_on_the_api_server_gives_each_gang_one_channel(
    control_plane: cluster.ControlPlane, api_client: Any, namespace: str
) -> None:
    """Two gangs of 18 trays each prepare at once in one NVLink domain, every node its own writer: the
    real API server's conflicts keep the record consistent; each gang gets one channel on all its nodes,
    the two gangs different ones; the last node of a gang letting go frees its channel."""
    kube = Kube(api_client)
    domain = "0b7c2a8e-1111-4222-8333-444455556666.7"
    books = [KubeChannelBook(Kube(api_client), namespace=namespace) for _ in range(36)]
    jobs = [
        (book, ChannelRequest(gang=f"{namespace}/{'a' if i < 18 else 'b'}"), f"rack7-tray{i % 18}")
        for i, book in enumerate(books)
    ]
    with ThreadPoolExecutor(max_workers=12) as pool:
        got = list(pool.map(lambda job: job[0].acquire(domain, job[1], job[2]), jobs))
    assert len(set(got[:18])) == 1
    assert len(set(got[18:])) == 1
    assert got[0] != got[18]
    assert {got[0], got[18]} <= set(range(1, 2048))
    obj = kube.get(f"{configmaps(namespace)}/{record_name(domain)}")
    holders, problems, _ = parse_record(obj["data"])
    assert problems == []
    assert {c: len(h.nodes) for c, h in holders.items()} == {got[0]: 18, got[18]: 18}
    for book, request, node in jobs[:18]:
        book.release(domain, gang=request.gang, channel=got[0], node=node)
    obj = kube.get(f"{configmaps(namespace)}/{record_name(domain)}")
    assert set(parse_record(obj["data"])[0]) == {got[18]}
