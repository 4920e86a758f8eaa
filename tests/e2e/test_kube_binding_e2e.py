"""A pod's binding sent twice, against the REAL kube-apiserver (issue 26, item 16): the API server's
refusal of the second binding (409, ``pod NAME is already assigned to node "NODE"``) is read as bound
when NODE is the node asked for, by both clients (``AsyncKube`` over the admin kubeconfig's TLS and
credentials, and the synchronous ``Kube``); on another node it stays a refusal naming the node. A pod
name of 253 characters keeps the whole message."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from topology.kube import Kube, KubeError
from topology.kube.aio import AsyncKube

pytestmark = pytest.mark.e2e


def _pod(api_client: Any, ns: str, name: str) -> str:
    """A pod no scheduler takes (no kubelet either: the binding is all that happens); its uid."""
    from kubernetes import client

    created = client.CoreV1Api(api_client).create_namespaced_pod(
        ns,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "none"}]},
        },
    )
    return str(created.metadata.uid)


def _node_of(api_client: Any, ns: str, name: str) -> str:
    from kubernetes import client

    return str(client.CoreV1Api(api_client).read_namespaced_pod(name, ns).spec.node_name or "")


@pytest.mark.parametrize("name", ["w-0", "w" + "-x" * 126], ids=["short-name", "name-of-253"])
def test_a_binding_sent_again_to_the_same_node_is_bound_and_to_another_is_refused(
    api_client: Any, namespace: str, name: str
) -> None:
    aio = AsyncKube.from_api_client(api_client)
    assert aio is not None
    sync = Kube(api_client, request_timeout_s=10)
    uid = _pod(api_client, namespace, name)

    async def main() -> list[KubeError]:
        refused = []
        try:
            await aio.bind(namespace, name, uid, "node-a")
            await aio.bind(namespace, name, uid, "node-a")  # the 409 for the same node: bound
            with pytest.raises(KubeError) as exc:
                await aio.bind(namespace, name, uid, "node-b")
            refused.append(exc.value)
        finally:
            await aio.aclose()
        return refused

    refused = asyncio.run(main())
    sync.bind(namespace, name, uid, "node-a")
    with pytest.raises(KubeError) as exc:
        sync.bind(namespace, name, uid, "node-b")
    refused.append(exc.value)
    assert _node_of(api_client, namespace, name) == "node-a"
    for err in refused:
        assert err.status == 409
        assert str(err).endswith(f'pod {name} is already assigned to node "node-a"')
