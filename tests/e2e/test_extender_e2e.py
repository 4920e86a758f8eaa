"""Our extender with the REAL kube-scheduler and kube-apiserver: an 18-pod x 4-GPU gang lands in one
NVL72 domain (by annotations, and by a Volcano PodGroup), an impossible gang binds nothing, two gangs
competing for one domain never end half-bound (the second gets the domain once the first leaves),
and ``plan --from-cluster`` reads the live cluster.

These are the extender's scheduling decisions on hand-made ``Node`` objects (36 of them cost nothing):
the full 2 racks x 18 trays, a PodGroup source, ``plan --from-cluster``. The same gang claims on real
kubelets -- capacity from our plugins, domains from the agents and our topology controller, every bound
pod admitted and ``Running`` with its devices -- are ``test_hollow_scheduling.py``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import localcluster as cluster

pytestmark = pytest.mark.e2e

SCHEDULER = "gpu-topology-scheduler"
RACKS = 2
TRAYS = 18
HYPERNODES = ("topology.volcano.sh", "v1alpha1", "hypernodes")


class RunningExtender:
    """``gpu-node-agent extender`` (its ``Service``) on its own event loop thread, against the real API."""

    def __init__(self, kubeconfig: str, *, tls: tuple[Path, Path, Path] | None = None) -> None:
        """``tls``: (server certificate, its key, the CA of kube-scheduler's client certificate)."""
        from kubernetes import config

        from agent.commands.extender import Service, Settings

        settings = Settings(
            host="127.0.0.1",
            port=cluster.free_port(),
            kubeconfig=kubeconfig,
            barrier_timeout_s=15.0,
            reservation_ttl_s=60.0,
            max_body_bytes=32 << 20,
            watch_timeout_s=5,
            tls_cert=tls[0] if tls else None,
            tls_key=tls[1] if tls else None,
            client_ca=tls[2] if tls else None,
        )
        self.service = Service(settings, config.new_client_from_config(config_file=kubeconfig))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.service.start(), self.loop).result(30)
        cluster.wait_until(
            lambda: all(i.synced.is_set() for i in self.service.informers), what="extender informers synced"
        )
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{settings.port}/"

    def state(self, fn: Callable[[Any], Any]) -> Any:
        with self.service.lock:
            return fn(self.service.state)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.service.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def racks(
    api_client: Any,
    counterparts: cluster.Counterparts,
    gpu_nodes: Callable[..., list[str]],
    e2e_test_label: str,
) -> Iterator[list[list[str]]]:
    """Two NVL72 racks (18 trays x 4 GPUs), each a tier-1 ``nvlink`` HyperNode when Volcano's CRDs are
    built, else each named by the node label ``gpuagent.dev/nvlink-domain`` (the extender reads both)."""
    from kubernetes import client

    try:
        crds = cluster.load_yaml_documents(counterparts.volcano_crds())
        wanted = ("hypernodes.", "podgroups.")
        cluster.apply_crds(api_client, [d for d in crds if d["metadata"]["name"].startswith(wanted)])
        use_hypernodes = True
    except cluster.MissingCounterpartError:
        use_hypernodes = False
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    out: list[list[str]] = []
    made: list[str] = []
    try:
        for r in range(RACKS):
            domain = f"nvl-{r}-{e2e_test_label}"[:63].rstrip("-")
            labels = {} if use_hypernodes else {"gpuagent.dev/nvlink-domain": domain}
            names = gpu_nodes(
                [f"{e2e_test_label}-r{r}-t{t:02d}"[-63:] for t in range(TRAYS)], gpus=4, labels=labels
            )
            for n in names:  # no node controller here lifts the not-ready taint a new Node is created with
                core.patch_node(n, {"spec": {"taints": None}})
            out.append(names)
            if use_hypernodes:
                custom.create_cluster_custom_object(
                    *HYPERNODES,
                    {
                        "apiVersion": "topology.volcano.sh/v1alpha1",
                        "kind": "HyperNode",
                        "metadata": {"name": domain},
                        "spec": {
                            "tier": 1,
                            "tierName": "nvlink",
                            "members": [
                                {"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in names
                            ],
                        },
                    },
                )
                made.append(domain)
        yield out
    finally:
        for hn in made:
            custom.delete_cluster_custom_object(*HYPERNODES, hn)


@pytest.fixture
def extender(
    control_plane: cluster.ControlPlane,
    racks: list[list[str]],
    kube_scheduler_factory: Callable[..., cluster.Scheduler],
) -> Iterator[RunningExtender]:
    ext = RunningExtender(str(control_plane.apiserver.kubeconfig))
    try:
        kube_scheduler_factory(
            scheduler_name=SCHEDULER,
            extenders=[cluster.extender_entry(ext.url)],
        )
        yield ext
    finally:
        ext.stop()


def gang_pods(ns: str, gang: str, n: int, label: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{gang}-{i}",
                "namespace": ns,
                "annotations": {
                    "gpuagent.dev/gang": gang,
                    "gpuagent.dev/gang-size": str(n),
                    "gpuagent.dev/subgroup-size": str(n),
                    "gpuagent.dev/subgroup-tier": "nvlink",
                    "gpuagent.dev/rank": str(i),
                },
            },
            "spec": {
                "schedulerName": SCHEDULER,
                "nodeSelector": {"gpuagent.dev/e2e-test": label},
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.invalid/none:0",
                        "resources": {"limits": {"nvidia.com/gpu": "4"}},
                    }
                ],
            },
        }
        for i in range(n)
    ]


def occupy(api: Any, ns: str, node: str, name: str) -> None:
    """A pod bound straight to ``node`` (no scheduler) holding its 4 GPUs."""
    create(
        api,
        [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "nodeName": node,
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.invalid/none:0",
                            "resources": {"limits": {"nvidia.com/gpu": "4"}},
                        }
                    ],
                },
            }
        ],
    )


def create(api: Any, pods: list[dict[str, Any]]) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    for p in pods:
        core.create_namespaced_pod(p["metadata"]["namespace"], p)


def bound(api: Any, ns: str, gang: str) -> dict[str, str]:
    from kubernetes import client

    return {
        p.metadata.name: p.spec.node_name
        for p in client.CoreV1Api(api).list_namespaced_pod(ns).items
        if p.metadata.name.startswith(gang + "-") and p.spec.node_name
    }


def events(api: Any, ns: str, reason: str) -> list[Any]:
    from kubernetes import client

    return [e for e in client.CoreV1Api(api).list_namespaced_event(ns).items if e.reason == reason]


def test_18_pod_gang_lands_in_one_nvl72_domain(
    api_client: Any, namespace: str, racks: list[list[str]], extender: RunningExtender, e2e_test_label: str
) -> None:
    occupy(api_client, namespace, racks[0][5], "busy")  # rack 0 cannot take the whole gang
    cluster.wait_until(
        lambda: extender.state(lambda s: f"{namespace}/busy" in s.cache.pods), what="extender sees busy pod"
    )
    create(api_client, gang_pods(namespace, "train", 18, e2e_test_label))
    cluster.wait_until(lambda: len(bound(api_client, namespace, "train")) == 18, what="all 18 pods bound")
    placement = bound(api_client, namespace, "train")
    assert len(set(placement.values())) == 18
    assert set(placement.values()) == set(racks[1])
    assert [placement[f"train-{i}"] for i in range(18)] == sorted(racks[1])  # ranks in node order
    # the bindings went from the event loop over the real API server's TLS with the kubeconfig's
    # client certificate, on a few kept-alive connections
    aio = extender.service.aio
    assert aio is not None
    assert 1 <= aio.opened <= aio.max_connections


def test_impossible_gang_binds_nothing(
    api_client: Any, namespace: str, racks: list[list[str]], extender: RunningExtender, e2e_test_label: str
) -> None:
    create(api_client, gang_pods(namespace, "huge", 19, e2e_test_label))  # 19 trays in an 18-tray domain
    # a pod filtered before the informer has seen all 19 says "1 of its 19 pods exist" first, and
    # kube-scheduler may not try it again soon: the verdict on the whole gang comes from the queue's pass
    # (GangNeverFits) or from a later filter (GangUnschedulable)
    cluster.wait_until(
        lambda: any(
            "nvlink" in e.message
            for reason in ("GangNeverFits", "GangUnschedulable")
            for e in events(api_client, namespace, reason)
        ),
        what="an Event naming the nvlink tier the gang never fits",
    )
    assert bound(api_client, namespace, "huge") == {}


def test_competing_gangs_never_half_bound(
    api_client: Any, namespace: str, racks: list[list[str]], extender: RunningExtender, e2e_test_label: str
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    for t, n in enumerate(racks[1]):  # rack 1 is full: both gangs compete for rack 0's 18 trays
        occupy(api_client, namespace, n, f"fill-{t}")
    cluster.wait_until(
        lambda: (
            extender.state(lambda s: sum(k.startswith(f"{namespace}/fill-") for k in s.cache.pods)) == TRAYS
        ),
        what="extender sees rack 1 full",
    )
    a = gang_pods(namespace, "ga", 10, e2e_test_label)
    b = gang_pods(namespace, "gb", 10, e2e_test_label)
    create(api_client, [p for pair in zip(a, b, strict=True) for p in pair])  # interleaved
    cluster.wait_until(
        lambda: max(len(bound(api_client, namespace, "ga")), len(bound(api_client, namespace, "gb"))) == 10,
        what="one gang bound",
    )
    first, second = ("ga", "gb") if len(bound(api_client, namespace, "ga")) == 10 else ("gb", "ga")
    # the other one is told why, and none of its pods is bound while the first holds the domain
    cluster.wait_until(
        lambda: any(
            e.involved_object.name.startswith(second + "-")
            for e in events(api_client, namespace, "GangUnschedulable")
        ),
        what=f"GangUnschedulable Event for {second}",
    )
    assert bound(api_client, namespace, second) == {}
    for i in range(10):
        core.delete_namespaced_pod(f"{first}-{i}", namespace, grace_period_seconds=0)
    cluster.wait_until(
        lambda: (
            not extender.state(lambda s: [k for k in s.cache.pods if k.startswith(f"{namespace}/{first}-")])
        ),
        what="extender sees the first gang gone",
    )
    # a cluster event after that makes kube-scheduler retry the waiting pods now, not after a back-off
    for i in range(10):
        core.patch_namespaced_pod(f"{second}-{i}", namespace, {"metadata": {"labels": {"retry": "1"}}})
    cluster.wait_until(
        lambda: len(bound(api_client, namespace, second)) == 10, what=f"{second} bound after {first} left"
    )
    assert set(bound(api_client, namespace, second).values()) <= set(racks[0])


def test_plan_from_the_live_cluster(
    control_plane: cluster.ControlPlane,
    namespace: str,
    racks: list[list[str]],
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    import yaml

    from agent.commands.plan import main

    api = control_plane.apiserver.api_client()
    try:
        occupy(api, namespace, racks[1][0], "busy")  # rack 1 loses a tray; rack 0 stays whole
    finally:
        api.close()
    gang = tmp_path / "g.yaml"
    gang.write_text(
        yaml.safe_dump(
            {
                "name": "live",
                "roles": [
                    {
                        "name": "w",
                        "pods": 18,
                        "gpus_per_pod": 4,
                        "subgroup_size": 18,
                        "subgroup_tier": "nvlink",
                    }
                ],
            }
        )
    )
    code = main(
        ["--from-cluster", "--kubeconfig", str(control_plane.apiserver.kubeconfig), "--gang", str(gang)]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["feasible"] is True
    assert set(out["placement"].values()) == set(racks[0])


def test_podgroup_gang_lands_in_one_domain(
    api_client: Any, namespace: str, racks: list[list[str]], extender: RunningExtender, e2e_test_label: str
) -> None:
    from kubernetes import client

    if not _has_podgroups(api_client):
        pytest.skip("Volcano's PodGroup CRD is not built on this machine")
    occupy(api_client, namespace, racks[1][3], "busy")
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        "scheduling.volcano.sh",
        "v1beta1",
        namespace,
        "podgroups",
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "pg", "namespace": namespace},
            "spec": {"minMember": 18, "networkTopology": {"mode": "hard", "highestTierName": "nvlink"}},
        },
    )
    cluster.wait_until(
        lambda: extender.state(lambda s: f"{namespace}/pg" in s.cache.podgroups),
        what="extender sees the PodGroup",
    )
    pods = gang_pods(namespace, "pgw", 18, e2e_test_label)
    for i, p in enumerate(pods):
        p["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "pg"}
        p["metadata"]["labels"] = {"batch.kubernetes.io/job-completion-index": str(i)}
    create(api_client, pods)
    cluster.wait_until(
        lambda: len(bound(api_client, namespace, "pgw")) == 18, what="all 18 PodGroup pods bound"
    )
    assert set(bound(api_client, namespace, "pgw").values()) == set(racks[0])


def _has_podgroups(api: Any) -> bool:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.ApiextensionsV1Api(api).read_custom_resource_definition("podgroups.scheduling.volcano.sh")
    except ApiException:
        return False
    return True
