"""The extender behind TLS with client certificates, called by the REAL kube-scheduler (issue 16: "the
extender trusts only kube-scheduler"): kube-scheduler's extender entry uses ``https`` and a ``tlsConfig``
with a client certificate (certFile/keyFile/caFile) that a throw-away CA signed; a 4-pod gang is filtered,
prioritized and bound through it into one NVLink domain; a client without a certificate, or with one of
another CA, gets no answer at all, while kube-scheduler's calls keep working."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent import localcluster as cluster
from tests.e2e.test_extender_e2e import SCHEDULER, RunningExtender, bound, create, gang_pods
from tests.integration.pki import ExtenderPki, make_extender_pki

pytestmark = pytest.mark.e2e

DOMAINS = 2
TRAYS = 4


@pytest.fixture
def pki(tmp_path: Any) -> ExtenderPki:
    return make_extender_pki(tmp_path / "extender-pki")


@pytest.fixture
def domains(api_client: Any, gpu_nodes: Callable[..., list[str]], e2e_test_label: str) -> list[list[str]]:
    """Two NVLink domains of 4 trays x 4 GPUs, named by the node label the extender reads."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    out = []
    for d in range(DOMAINS):
        names = gpu_nodes(
            [f"{e2e_test_label}-d{d}-t{t}"[-63:] for t in range(TRAYS)],
            gpus=4,
            labels={"gpuagent.dev/nvlink-domain": f"tls-nvl-{d}-{e2e_test_label}"[:63].rstrip("-")},
        )
        for n in names:  # no node controller lifts the not-ready taint a new Node is created with
            core.patch_node(n, {"spec": {"taints": None}})
        out.append(names)
    return out


@pytest.fixture
def tls_extender(
    control_plane: cluster.ControlPlane,
    domains: list[list[str]],
    pki: ExtenderPki,
    kube_scheduler_factory: Callable[..., cluster.Scheduler],
) -> Iterator[RunningExtender]:
    ext = RunningExtender(
        str(control_plane.apiserver.kubeconfig), tls=(pki.server_cert, pki.server_key, pki.ca)
    )
    try:
        assert ext.url.startswith("https://127.0.0.1:")
        kube_scheduler_factory(
            scheduler_name=SCHEDULER,
            extenders=[
                cluster.extender_entry(
                    ext.url,
                    tls={
                        "certFile": str(pki.client_cert),
                        "keyFile": str(pki.client_key),
                        "caFile": str(pki.ca),
                    },
                )
            ],
        )
        yield ext
    finally:
        ext.stop()


def _readyz(url: str, ctx: ssl.SSLContext) -> int:
    with urllib.request.urlopen(f"{url}readyz", timeout=5, context=ctx) as resp:
        return int(resp.status)


def test_kube_scheduler_places_and_binds_a_gang_over_mutual_tls(
    api_client: Any,
    namespace: str,
    *,
    domains: list[list[str]],
    tls_extender: RunningExtender,
    pki: ExtenderPki,
    e2e_test_label: str,
) -> None:
    create(api_client, gang_pods(namespace, "tls", TRAYS, e2e_test_label))
    cluster.wait_until(lambda: len(bound(api_client, namespace, "tls")) == TRAYS, what="the 4-pod gang bound")
    placement = bound(api_client, namespace, "tls")
    assert set(placement.values()) in ({*domains[0]}, {*domains[1]})  # one NVLink domain, one pod per tray
    # the extender bound them (it is kube-scheduler's binder), through its reservation
    assert tls_extender.state(lambda s: s.holds.started) == {}

    # a client without a certificate, or with one another CA signed, gets no answer
    no_cert = ssl.create_default_context(cafile=str(pki.ca))
    stranger = ssl.create_default_context(cafile=str(pki.ca))
    stranger.load_cert_chain(str(pki.stranger_cert), str(pki.stranger_key))
    for ctx in (no_cert, stranger):
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            _readyz(tls_extender.url, ctx)
    ours = ssl.create_default_context(cafile=str(pki.ca))
    ours.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    assert _readyz(tls_extender.url, ours) == 200
