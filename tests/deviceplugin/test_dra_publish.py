"""Publishing the pool: the generation continues from the slices already in the API (an agent restart),
stale slices are deleted after ours are applied, nothing is written while nothing changed, and a slice
removed by someone else is written again after a verify."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from deviceplugin.dra.publish import SlicePublisher
from topology.kube import KubeError


class Api:
    def __init__(self, existing: list[dict[str, Any]] | None = None) -> None:
        self.store: dict[str, dict[str, Any]] = {s["metadata"]["name"]: s for s in existing or []}
        self.calls: list[tuple[str, str]] = []
        self.refuse = False

    def node_uid(self, name: str) -> str | None:
        return "uid-n"

    def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        self.calls.append(("list", node))
        return [
            s for s in self.store.values() if s["spec"]["nodeName"] == node and s["spec"]["driver"] == driver
        ]

    def apply_slice(self, obj: Mapping[str, Any]) -> None:
        if self.refuse:
            raise KubeError(403, "forbidden")
        self.calls.append(("apply", obj["metadata"]["name"]))
        self.store[obj["metadata"]["name"]] = dict(obj)

    def delete_slice(self, name: str) -> None:
        self.calls.append(("delete", name))
        self.store.pop(name, None)


def _obj(
    name: str, generation: int, devices: list[str], node: str = "n", uid: str | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if uid:
        meta["uid_of_node"] = uid
    return {
        "metadata": meta,
        "spec": {
            "driver": "d.example.com",
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [{"name": d} for d in devices],
        },
    }


class Desired:
    def __init__(self) -> None:
        self.devices = ["gpu-a", "gpu-b"]

    def __call__(self, generation: int, uid: str | None) -> list[dict[str, Any]]:
        return [_obj("n-d.example.com-0", generation, self.devices, uid=uid)]


def test_restart_continues_the_generation_and_deletes_stale_slices() -> None:
    api = Api(
        [
            _obj("n-d.example.com-0", 5, ["gpu-a"]),
            _obj("n-d.example.com-1", 5, ["gpu-z"]),
            _obj("x", 9, [], node="other"),
        ]
    )
    pub = SlicePublisher(api=api, node_name="n", driver="d.example.com", desired=Desired())
    assert pub.publish_once() == 1
    assert api.store["n-d.example.com-0"]["spec"]["pool"]["generation"] == 6
    assert "n-d.example.com-1" not in api.store
    assert api.store["x"]["spec"]["pool"]["generation"] == 9  # another node's slice is not ours
    assert api.calls == [("list", "n"), ("apply", "n-d.example.com-0"), ("delete", "n-d.example.com-1")]


def test_writes_only_on_change() -> None:
    api = Api()
    desired = Desired()
    pub = SlicePublisher(api=api, node_name="n", driver="d.example.com", desired=desired)
    assert pub.publish_once() == 1
    assert pub.publish_once() == 0
    assert pub.publish_once() == 0
    desired.devices = ["gpu-a"]
    assert pub.publish_once() == 1
    assert api.store["n-d.example.com-0"]["spec"]["pool"]["generation"] == 2
    assert [c for c in api.calls if c[0] == "apply"] == [("apply", "n-d.example.com-0")] * 2


def test_a_slice_deleted_elsewhere_is_written_again_after_verify() -> None:
    api = Api()
    pub = SlicePublisher(api=api, node_name="n", driver="d.example.com", desired=Desired())
    pub.publish_once()
    assert pub.verify()
    api.store.clear()
    assert not pub.verify()
    assert pub.publish_once() == 1
    assert api.store["n-d.example.com-0"]["spec"]["pool"]["generation"] == 1  # nothing left: starts over
    assert pub.verify()


def test_refusal_raises_and_the_next_publish_rereads_the_pool() -> None:
    api = Api()
    pub = SlicePublisher(api=api, node_name="n", driver="d.example.com", desired=Desired())
    api.refuse = True
    with pytest.raises(KubeError):
        pub.publish_once()
    pub.forget()
    api.refuse = False
    assert pub.publish_once() == 1
    assert [c[0] for c in api.calls] == ["list", "list", "apply"]
