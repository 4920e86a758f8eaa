"""The controller against Kubernetes faked at the HTTP level (tests/topology/kubefake.py)."""

from __future__ import annotations

import asyncio
import logging
import pathlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.kubeconfig import write_token_kubeconfig
from tests.topology.factories import UUID_B, hgx_node, nvl72_tray
from tests.topology.kubefake import FakeKube, api_client
from topology.builder import SOURCE_LABEL, SOURCE_VALUE
from topology.controller import ControllerSettings, TopologyController
from topology.gpunode import gpunode_object
from topology.kube import GPUNODES, HYPERNODES, NODES, PODS, Kube, LeaseElector, configmaps, events, leases
from topology.model import FabricHealthSummary
from topology.names import clique_domain_name, node_domain_name
from topology.nvlink import CliqueKey
from topology.nvlinkdomain import NVLINKDOMAINS

SAMPLE = (pathlib.Path(__file__).parent / "data" / "two-racks.ibnetdiscover").read_text(encoding="utf-8")
NS = "gpu-system"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """``controller`` (the command) configures process-wide logging; put it back afterwards."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def wait_for(check: Callable[[], bool], what: str, limit_s: float = 20.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def seed(fake: FakeKube) -> None:
    trays = {
        "rack0-tray0": nvl72_tray("rack0-tray0"),
        "rack0-tray1": nvl72_tray("rack0-tray1"),
        "rack1-tray0": nvl72_tray("rack1-tray0", cluster_uuid=UUID_B),
        "h100-0": hgx_node("h100-0"),
    }
    for name, inv in trays.items():
        node = fake.put(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}}})
        fake.put(GPUNODES, gpunode_object(inv, node_name=name, node_uid=node["metadata"]["uid"]))
    fake.put(
        configmaps(NS),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "fabric",
                "namespace": NS,
                "labels": {"gpuagent.dev/fabric": "ibnetdiscover"},
            },
            "data": {"cluster.ibnetdiscover": SAMPLE},
        },
    )


@contextmanager
def running(controller: TopologyController) -> Iterator[None]:
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    errors: list[BaseException] = []

    def main() -> None:
        try:
            loop.run_until_complete(controller.run(stop))
        except BaseException as exc:  # surfaced by the test
            errors.append(exc)

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=15)
        loop.close()
        assert not thread.is_alive(), "controller did not stop"
        assert not errors, errors


def settings(**kw: Any) -> ControllerSettings:
    base: dict[str, Any] = {
        "namespace": NS,
        "debounce_s": 0.05,
        "max_delay_s": 0.5,
        "watch_timeout_s": 2,
        "retry_period_s": 0.2,
        "lease_duration_s": 2,
        "identity": "ctl-a",
    }
    base.update(kw)
    return ControllerSettings(**base)


@pytest.fixture
def fake() -> Iterator[tuple[FakeKube, str]]:
    f = FakeKube()
    seed(f)
    with f.serve() as url:
        yield f, url


def spec_writes(fake: FakeKube) -> list[tuple[str, str]]:
    """Writes of HyperNodes themselves (their status conditions are the NVLink domains' tests')."""
    return [w for w in fake.writes(HYPERNODES) if not w[1].endswith("/status")]


def hypernode_names(fake: FakeKube) -> set[str]:
    return set(fake.items(HYPERNODES))


def test_reconciles_tree_then_writes_only_changes(fake: tuple[FakeKube, str]) -> None:
    f, url = fake
    c = TopologyController(kube=Kube(api_client(url)), settings=settings(leader_elect=True))
    rack0 = clique_domain_name(CliqueKey("9c6f5af3-0000-4000-8000-00000000000a", 32766))
    with running(c):
        wait_for(lambda: c.stats.reconciles >= 1 and c.stats.last_diff is not None, "first reconcile")
        wait_for(lambda: "core-2c5eab0300d00001" in hypernode_names(f), "HyperNodes up to the core")
        objs = f.items(HYPERNODES)
        assert {o["spec"]["tierName"] for o in objs.values()} == {"nvlink", "leaf", "spine", "core"}
        assert all(o["metadata"]["labels"][SOURCE_LABEL] == SOURCE_VALUE for o in objs.values())
        assert [m["selector"]["exactMatch"]["name"] for m in objs[rack0]["spec"]["members"]] == [
            "rack0-tray0",
            "rack0-tray1",
        ]
        assert node_domain_name("h100-0") in objs  # no IB information: its own root domain
        assert f.get(leases(NS), "gpu-topology-controller")["spec"]["holderIdentity"] == "ctl-a"
        first_writes = len(spec_writes(f))
        assert first_writes == len(objs)

        # one tray's fabric turns unhealthy: only its clique, its new domain and its leaf change
        sick = gpunode_object(
            nvl72_tray("rack0-tray1", summary=FabricHealthSummary.UNHEALTHY), node_name="rack0-tray1"
        )
        f.put(GPUNODES, sick)
        wait_for(lambda: node_domain_name("rack0-tray1") in hypernode_names(f), "isolated domain")
        wait_for(
            lambda: any(
                e.get("reason") == "NvlinkDomainExcluded" for e in f.items(events("default")).values()
            ),
            "event",
        )
        changed = {p.rsplit("/", 1)[1] for _, p in spec_writes(f)[first_writes:]}
        assert changed == {rack0, node_domain_name("rack0-tray1"), "leaf-2c5eab0300b87b40"}
        event = next(e for e in f.items(events("default")).values() if e["reason"] == "NvlinkDomainExcluded")
        assert event["involvedObject"] == {
            "apiVersion": "v1",
            "kind": "Node",
            "name": "rack0-tray1",
            "uid": f.get(NODES, "rack0-tray1")["metadata"]["uid"],  # type: ignore[index]
        }
        assert "summary_unhealthy" in event["message"]

    # a restarted controller finds everything in place and writes nothing (nor repeats its Events)
    before = len(spec_writes(f))
    events_before = len(f.writes(events("default")))
    c2 = TopologyController(
        kube=Kube(api_client(url)), settings=settings(leader_elect=True, identity="ctl-b")
    )
    with running(c2):
        wait_for(lambda: c2.stats.reconciles >= 1, "restart reconcile")
        assert c2.stats.last_diff is not None
        assert c2.stats.last_diff.writes == 0
    assert len(spec_writes(f)) == before
    assert len(f.writes(events("default"))) == events_before


def test_foreign_hypernodes_untouched_stale_ours_deleted(fake: tuple[FakeKube, str]) -> None:
    f, url = fake
    foreign = {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": "admin-rack", "labels": {"volcano.sh/network-topology-source": "label"}},
        "spec": {"tier": 1, "members": [{"type": "Node", "selector": {"exactMatch": {"name": "x"}}}]},
    }
    squatter = {**foreign, "metadata": {"name": node_domain_name("h100-0")}}
    stale = {**foreign, "metadata": {"name": "nvl-gone", "labels": {SOURCE_LABEL: SOURCE_VALUE}}}
    for obj in (foreign, squatter, stale):
        f.put(HYPERNODES, obj)
    c = TopologyController(kube=Kube(api_client(url)), settings=settings())
    with running(c):
        wait_for(lambda: "nvl-gone" not in hypernode_names(f), "stale HyperNode deleted")
        assert c.stats.last_diff is not None
        assert c.stats.last_diff.conflicts == (node_domain_name("h100-0"),)
    assert f.get(HYPERNODES, "admin-rack") == {
        **foreign,
        "metadata": f.get(HYPERNODES, "admin-rack")["metadata"],
    }
    assert f.get(HYPERNODES, node_domain_name("h100-0"))["spec"] == squatter["spec"]
    assert ("PATCH", f"{HYPERNODES}/admin-rack") not in f.requests


def test_survives_api_down_and_missing_crd_then_catches_up(fake: tuple[FakeKube, str]) -> None:
    f, url = fake
    f.missing.add(HYPERNODES)
    c = TopologyController(kube=Kube(api_client(url)), settings=settings())
    with running(c):
        wait_for(lambda: c.stats.failed_writes >= 1, "failed writes while the CRD is missing")
        f.missing.clear()
        f.down = True
        time.sleep(0.3)
        f.down = False
        wait_for(lambda: len(hypernode_names(f)) >= 5, "HyperNodes after recovery")


def test_only_the_leader_writes(fake: tuple[FakeKube, str]) -> None:
    f, url = fake
    a = TopologyController(kube=Kube(api_client(url)), settings=settings(leader_elect=True, identity="a"))
    b = TopologyController(kube=Kube(api_client(url)), settings=settings(leader_elect=True, identity="b"))
    with running(a):
        wait_for(lambda: a.stats.reconciles >= 1, "leader reconciles")
        with running(b):
            time.sleep(0.5)
            assert b.elector is not None
            assert not b.elector.leading
            assert b.stats.reconciles == 0
    # a released the lease on stop: a new candidate takes over at once
    assert f.get(leases(NS), "gpu-topology-controller")["spec"]["holderIdentity"] in ("", "b")


def test_lease_elector_takes_over_an_expired_lease() -> None:
    f = FakeKube()
    with f.serve() as url:
        clock = [1000.0]
        mono = [0.0]
        kube = Kube(api_client(url))
        a = LeaseElector(
            kube, NS, "l", "a", lease_duration_s=10, clock=lambda: clock[0], monotonic=lambda: mono[0]
        )
        b = LeaseElector(
            kube, NS, "l", "b", lease_duration_s=10, clock=lambda: clock[0], monotonic=lambda: mono[0]
        )
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
        mono[0] += 5
        assert a.try_acquire_or_renew()  # renews
        assert not b.try_acquire_or_renew()  # saw a new renewTime: waits again
        mono[0] += 11
        clock[0] += 11
        assert b.try_acquire_or_renew()  # a stopped renewing: expired
        lease = f.get(leases(NS), "l")
        assert lease["spec"]["holderIdentity"] == "b"
        assert lease["spec"]["leaseTransitions"] == 1


def test_command_once_against_the_cluster(
    fake: tuple[FakeKube, str], tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:

    from agent.commands import controller as controller_command

    f, url = fake
    kubeconfig = write_token_kubeconfig(tmp_path / "kubeconfig", url)
    base = ["--once", "--kubeconfig", str(kubeconfig), "--lease-namespace", NS]
    assert controller_command.main([*base, "--dry-run"]) == 0
    assert "(dry run)" in capsys.readouterr().err
    assert hypernode_names(f) == set()
    export = tmp_path / "topology.conf"
    assert controller_command.main([*base, "--export", "slurm", "--output", str(export)]) == 0
    assert "0 unchanged" in capsys.readouterr().err
    assert len(hypernode_names(f)) >= 5
    assert "BlockName=" in export.read_text(encoding="utf-8")
    assert controller_command.main(base) == 0
    assert "0 applied, 0 deleted" in capsys.readouterr().err


def gpu_pod(name: str, node: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}],
        },
        "status": {"phase": phase},
    }


def test_nvlinkdomains_written_per_clique_and_only_the_changed_one_rewritten(
    fake: tuple[FakeKube, str],
) -> None:
    f, url = fake
    c = TopologyController(kube=Kube(api_client(url)), settings=settings())
    rack0 = clique_domain_name(CliqueKey("9c6f5af3-0000-4000-8000-00000000000a", 32766))
    rack1 = clique_domain_name(CliqueKey(UUID_B, 32766))
    with running(c):
        wait_for(lambda: set(f.items(NVLINKDOMAINS)) == {rack0, rack1}, "one NVLinkDomain per clique")
        wait_for(lambda: "status" in (f.get(NVLINKDOMAINS, rack0) or {}), "rack0 status")
        # both statuses written before rack1's writes are counted (it is written just after rack0's)
        wait_for(lambda: "status" in (f.get(NVLINKDOMAINS, rack1) or {}), "rack1 status")
        st = f.get(NVLINKDOMAINS, rack0)["status"]  # type: ignore[index]
        assert st["members"] == ["rack0-tray0", "rack0-tray1"]
        assert (st["readyTrays"], st["largestSubgroup"], st["gpus"]["free"]) == (2, 2, 8)
        assert st["imex"]["quorum"] == "0/2"  # the seeded agents publish no IMEX status (absent)
        cond = f.get(HYPERNODES, rack0)["status"]["conditions"]  # type: ignore[index]
        assert [(x["type"], x["status"], x["reason"]) for x in cond] == [
            ("gpuagent.dev/NVLinkDomainReady", "True", "AllTraysReady")
        ]
        rack1_writes = [w for w in f.writes(NVLINKDOMAINS) if rack1 in w[1]]

        # a pod takes 3 GPUs of rack0-tray0: only rack0's status changes
        f.put(PODS, gpu_pod("p", "rack0-tray0", 3))
        f.put(PODS, gpu_pod("done", "rack0-tray1", 4, phase="Succeeded"))  # finished: holds nothing
        wait_for(lambda: f.get(NVLINKDOMAINS, rack0)["status"]["gpus"]["free"] == 5, "free GPUs")  # type: ignore[index]
        st = f.get(NVLINKDOMAINS, rack0)["status"]  # type: ignore[index]
        assert st["largestSubgroup"] == 1
        assert st["fragmentation"] == pytest.approx(0.2)

        # tray1's managed IMEX daemon waits for peers: not ready, condition False with the reason
        obj = gpunode_object(nvl72_tray("rack0-tray1"), node_name="rack0-tray1")
        obj["status"]["imex"] = {"state": "not-ready", "status": "WAITING_FOR_PEERS", "managed": True}
        f.put(GPUNODES, obj)
        wait_for(lambda: f.get(NVLINKDOMAINS, rack0)["status"]["readyTrays"] == 1, "tray1 unready")  # type: ignore[index]
        st = f.get(NVLINKDOMAINS, rack0)["status"]  # type: ignore[index]
        assert st["degraded"] == [{"node": "rack0-tray1", "ready": False, "reason": "IMEX WAITING_FOR_PEERS"}]
        wait_for(
            lambda: f.get(HYPERNODES, rack0)["status"]["conditions"][0]["status"] == "False",  # type: ignore[index]
            "condition False",
        )
        assert (
            "rack0-tray1: IMEX WAITING_FOR_PEERS"
            in f.get(HYPERNODES, rack0)["status"]["conditions"][0]["message"]
        )  # type: ignore[index]
        assert [w for w in f.writes(NVLINKDOMAINS) if rack1 in w[1]] == rack1_writes
        assert c.domains[rack0].stranded_gpus == 4

    # a restarted controller writes no NVLinkDomain and no condition
    before = len(f.writes(NVLINKDOMAINS)), len(f.writes(HYPERNODES))
    c2 = TopologyController(kube=Kube(api_client(url)), settings=settings())
    with running(c2):
        wait_for(lambda: c2.stats.reconciles >= 1 and bool(c2.domains), "restart reconcile")
    assert (len(f.writes(NVLINKDOMAINS)), len(f.writes(HYPERNODES))) == before


def test_stale_nvlinkdomain_deleted_when_its_trays_go(fake: tuple[FakeKube, str]) -> None:
    f, url = fake
    c = TopologyController(kube=Kube(api_client(url)), settings=settings())
    rack1 = clique_domain_name(CliqueKey(UUID_B, 32766))
    with running(c):
        wait_for(lambda: rack1 in f.items(NVLINKDOMAINS), "rack1 domain")
        f.remove(NODES, "rack1-tray0")
        wait_for(lambda: rack1 not in f.items(NVLINKDOMAINS), "rack1 domain deleted")


def test_without_the_nvlinkdomain_crd_the_hypernodes_are_still_written(fake: tuple[FakeKube, str]) -> None:
    f, url = fake
    f.missing.add(NVLINKDOMAINS)
    c = TopologyController(kube=Kube(api_client(url)), settings=settings())
    with running(c):
        wait_for(lambda: c.stats.reconciles >= 1 and bool(c.domains), "a reconcile")
        wait_for(lambda: len(hypernode_names(f)) >= 4, "HyperNodes")
        assert c.stats.failed_writes == 0
