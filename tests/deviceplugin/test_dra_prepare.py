"""Prepare/unprepare over the checkpoint: idempotent, answered from disk after a restart, one claim's
error never failing another, and the checkpoint written atomically."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.config import PluginConfig
from deviceplugin.dra.checkpoint import Checkpoint, CheckpointError
from deviceplugin.dra.prepare import ClaimRef, Preparer
from deviceplugin.dra.slices import SliceDevice, slice_devices
from deviceplugin.resources import build_plan
from tests.deviceplugin.helpers import inventory

DRIVER = "gpu.gpuagent.dev"
POOL = "node-a"
KIND = "gpu.gpuagent.dev/gpu"


class Health:
    def __init__(self) -> None:
        self.bad: dict[str, str] = {}

    def device_health(self, keys: Any) -> Any:
        keys = list(keys)
        reason = next((self.bad[k] for k in keys if k in self.bad), None)
        return type("S", (), {"healthy": reason is None, "reason": reason})()


class Claims:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.reads = 0
        self.fail: Exception | None = None

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return self.objects.get((namespace, name))

    def add(self, name: str, uid: str, results: list[dict[str, Any]], namespace: str = "ns") -> ClaimRef:
        self.objects[(namespace, name)] = {
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }
        return ClaimRef(namespace=namespace, uid=uid, name=name)


def published() -> dict[str, SliceDevice]:
    plan = build_plan(inventory("dgx-h100"), PluginConfig())
    return {sd.name: sd for sd in slice_devices(d for r in plan.resources for d in r.devices)}


DEVICES = published()
NAMES = sorted(DEVICES)


def result(device: str, request: str = "gpus", pool: str = POOL, driver: str = DRIVER) -> dict[str, str]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


def preparer(path: Path, claims: Claims, health: Health | None = None) -> Preparer:
    checkpoint = Checkpoint(path, driver=DRIVER)
    assert checkpoint.load() == []

    async def inline(fn: Any, *args: Any) -> Any:
        return fn(*args)

    return Preparer(
        checkpoint=checkpoint,
        claims=claims,
        health=health or Health(),
        driver=DRIVER,
        pool=POOL,
        kind=KIND,
        published=lambda: DEVICES,
        to_thread=inline,
    )


def test_prepare_gives_cdi_ids_and_survives_a_restart_without_the_api(tmp_path: Path) -> None:
    claims = Claims()
    ref = claims.add("c1", "uid-1", [result(NAMES[0]), result(NAMES[1], "other"), result(NAMES[0], "again")])
    p = preparer(tmp_path / "cp.json", claims)
    got = asyncio.run(p.prepare(ref))
    assert got.error == ""
    assert [d.device_name for d in got.devices] == [NAMES[0], NAMES[1]]
    assert got.devices[0].request_names == ("gpus", "again")
    assert got.devices[0].cdi_device_ids == (f"{KIND}={DEVICES[NAMES[0]].device.base_uuid}",)
    assert got.devices[0].pool_name == POOL
    # the agent restarts: a new preparer over the same file answers without asking the API
    claims.fail = RuntimeError("API down")
    again = asyncio.run(preparer(tmp_path / "cp.json", claims).prepare(ref))
    assert again == got
    assert claims.reads == 1


def test_prepare_twice_reads_the_api_once(tmp_path: Path) -> None:
    claims = Claims()
    ref = claims.add("c1", "uid-1", [result(NAMES[0])])
    p = preparer(tmp_path / "cp.json", claims)
    first = asyncio.run(p.prepare(ref))
    second = asyncio.run(p.prepare(ref))
    assert first == second
    assert claims.reads == 1


def test_unprepare_forgets_and_is_idempotent(tmp_path: Path) -> None:
    claims = Claims()
    ref = claims.add("c1", "uid-1", [result(NAMES[0])])
    p = preparer(tmp_path / "cp.json", claims)
    asyncio.run(p.prepare(ref))
    assert asyncio.run(p.unprepare(ref)) == ""
    assert asyncio.run(p.unprepare(ref)) == ""
    assert json.loads((tmp_path / "cp.json").read_text())["claims"] == {}
    assert asyncio.run(p.unprepare(ClaimRef("ns", "never", "x"))) == ""


def test_other_drivers_results_are_not_ours(tmp_path: Path) -> None:
    claims = Claims()
    ref = claims.add("c1", "uid-1", [result(NAMES[0]), result("nic-0", driver="net.example.com")])
    got = asyncio.run(preparer(tmp_path / "cp.json", claims).prepare(ref))
    assert [d.device_name for d in got.devices] == [NAMES[0]]


def test_unhealthy_device_is_refused_with_the_reason(tmp_path: Path) -> None:
    claims = Claims()
    health = Health()
    health.bad[DEVICES[NAMES[0]].device.base_uuid] = "xid 79"
    ref = claims.add("c1", "uid-1", [result(NAMES[0])])
    p = preparer(tmp_path / "cp.json", claims, health)
    got = asyncio.run(p.prepare(ref))
    assert got.devices == ()
    assert "unhealthy (xid 79)" in got.error
    assert p.checkpoint.claims == {}


def test_failed_checkpoint_write_is_an_error_and_records_nothing(tmp_path: Path) -> None:
    claims = Claims()
    ref = claims.add("c1", "uid-1", [result(NAMES[0])])
    p = preparer(tmp_path / "d" / "cp.json", claims)
    (tmp_path / "d").write_text("")  # the directory is a file now: every write fails
    got = asyncio.run(p.prepare(ref))
    assert "cannot write" in got.error
    assert p.checkpoint.claims == {}


def test_checkpoint_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cp.json"
    claims = Claims()
    p = preparer(path, claims)
    asyncio.run(p.prepare(claims.add("c1", "uid-1", [result(NAMES[0])])))
    before = path.read_bytes()

    def crash(*_: Any, **__: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("deviceplugin.dra.checkpoint.os.replace", crash)
    with pytest.raises(CheckpointError, match="No space left"):
        p.checkpoint.remove("uid-1")
    assert path.read_bytes() == before  # the old file, whole
    assert "uid-1" in p.checkpoint.claims  # and memory agrees with it
    assert [f.name for f in tmp_path.iterdir()] == ["cp.json"]  # no temporary left behind
