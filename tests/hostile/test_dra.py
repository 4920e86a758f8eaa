"""Hostile input to the DRA driver: a garbage or foreign checkpoint, broken entries, and claims whose
allocation a tenant or a stale scheduler could make wrong. Each gets a clear error naming what and
where, and loses nothing (the bad file is kept; good claims and entries keep working)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.config import ConfigError, PluginConfig, parse_plugin_config
from deviceplugin.dra.channelbook import record_name
from deviceplugin.dra.channels import Holder, parse_record
from deviceplugin.dra.checkpoint import Checkpoint
from deviceplugin.dra.config import DraConfig, parse_dra_config, shared_conflicts
from deviceplugin.dra.prepare import ClaimRef
from tests.deviceplugin.test_dra_channels import (
    DOMAIN,
    FakeConfigMaps,
    channel_preparer,
    claim_get,
    imex_claim,
)
from tests.deviceplugin.test_dra_prepare import DRIVER, NAMES, Claims, preparer, result
from topology.kube import configmaps


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00\xff garbage",
        b"[1, 2, 3]",
        b'{"version": 2, "driver": "gpu.gpuagent.dev", "claims": {}}',
        b'{"version": 1, "driver": "other.example.com", "claims": {}}',
        b'{"version": 1, "driver": "gpu.gpuagent.dev", "claims": []}',
        b"[" * 100_000,
        b'{"version": 1, "driver": "gpu.gpuagent.dev", "claims": {' + b'"x": 1,' * 10 + b'"y": 2',
    ],
    ids=["binary", "list", "future-version", "other-driver", "claims-list", "deep-nesting", "truncated"],
)
def test_garbage_checkpoint_is_kept_aside_with_a_clear_error(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(raw)
    checkpoint = Checkpoint(path, driver=DRIVER)
    (problem,) = checkpoint.load()
    assert str(path) in problem
    assert "checkpoint.json.bad-0" in problem
    assert (tmp_path / "checkpoint.json.bad-0").read_bytes() == raw  # nothing lost
    assert checkpoint.claims == {}
    # the next write does not touch the kept file, and a second bad file gets its own name
    checkpoint.save()
    assert (tmp_path / "checkpoint.json.bad-0").read_bytes() == raw
    path.write_bytes(raw)
    Checkpoint(path, driver=DRIVER).load()
    assert (tmp_path / "checkpoint.json.bad-1").read_bytes() == raw


def test_oversized_checkpoint_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(b" " * (16 * 1024 * 1024 + 10))
    (problem,) = Checkpoint(path, driver=DRIVER).load()
    assert "larger than" in problem


def test_broken_entries_are_dropped_one_by_one_and_the_rest_kept(tmp_path: Path) -> None:
    good = {
        "namespace": "ns",
        "name": "c",
        "devices": [{"requestNames": ["r"], "poolName": "p", "deviceName": "d", "cdiDeviceIds": ["k=v"]}],
    }
    path = tmp_path / "checkpoint.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "driver": DRIVER,
                "claims": {
                    "ok": good,
                    "no-name": {"namespace": "ns", "devices": []},
                    "bad-device": {**good, "devices": [{"requestNames": "r"}]},
                    "not-a-map": 7,
                },
            }
        )
    )
    checkpoint = Checkpoint(path, driver=DRIVER)
    problems = checkpoint.load()
    assert sorted(checkpoint.claims) == ["ok"]
    assert len(problems) == 3
    assert any("claims['bad-device'].devices[0].requestNames" in p for p in problems)
    assert any("claims['no-name'].name" in p for p in problems)


def _bad(results: Any, *, uid: str = "uid-1") -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": uid},
        "status": {"allocation": {"devices": {"results": results}}},
    }


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (_bad([], uid="uid-other"), "the API has uid 'uid-other', the kubelet asked for 'uid-1'"),
        ({"metadata": {"uid": "uid-1"}, "status": {}}, "not allocated"),
        ({"metadata": {"uid": "uid-1"}, "status": "x"}, "not allocated"),
        (_bad("nope"), "results is not a list"),
        (_bad([{"driver": DRIVER}] * 2000), "at most 1024"),
        (_bad(["x"]), "results[0]: expected a mapping"),
        (_bad([{"driver": DRIVER, "device": 5, "pool": "node-a", "request": "r"}]), "must be strings"),
        (_bad([result(NAMES[0], pool="node-b")]), "pool 'node-b' is not this node's (node-a)"),
        (_bad([result("gpu-not-here")]), "device 'gpu-not-here' is not published by this node"),
    ],
    ids=[
        "uid",
        "unallocated",
        "status-string",
        "results-string",
        "too-many",
        "entry",
        "types",
        "pool",
        "device",
    ],
)
def test_hostile_claims_fail_alone_with_a_clear_error(
    tmp_path: Path, claim: dict[str, Any], message: str
) -> None:
    claims = Claims()
    claims.objects[("ns", "c")] = claim
    good = claims.add("g", "uid-good", [result(NAMES[1])])
    p = preparer(tmp_path / "cp.json", claims)
    got = asyncio.run(p.prepare(ClaimRef("ns", "uid-1", "c")))
    assert got.devices == ()
    assert message in got.error
    assert "claim ns/c" in got.error
    assert asyncio.run(p.prepare(good)).error == ""
    assert sorted(p.checkpoint.claims) == ["uid-good"]


def test_claim_missing_or_api_down_is_an_error_for_that_claim(tmp_path: Path) -> None:
    claims = Claims()
    p = preparer(tmp_path / "cp.json", claims)
    assert "not found" in asyncio.run(p.prepare(ClaimRef("ns", "u", "gone"))).error
    claims.fail = RuntimeError("connection refused")
    assert (
        "cannot read it from the API: connection refused"
        in asyncio.run(p.prepare(ClaimRef("ns", "u", "x"))).error
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"driverName": "Not_A_Name"}, "dra.driverName: 'Not_A_Name' is not a DNS subdomain"),
        ({"driverName": "nodot"}, "dra.driverName: 'nodot'"),
        ({"resources": "nvidia.com/gpu"}, "dra.resources: expected a non-empty list"),
        ({"resources": []}, "dra.resources: expected a non-empty list"),
        ({"resources": ["amd.com/gpu"]}, "dra.resources[0]: 'amd.com/gpu' is not a resource name"),
        (
            {"resources": ["nvidia.com/gpu", "nvidia.com/gpu"]},
            "dra.resources[1]: nvidia.com/gpu is named twice",
        ),
        ({"pluginDir": "relative/dir"}, "dra.pluginDir: expected an absolute path"),
        ({"cdiKind": "nokind"}, "dra.cdiKind: 'nokind' is not <vendor>/<class>"),
        ({"enabled": "yes"}, "dra.enabled: expected true or false"),
        ({"socket": "/x"}, "dra.socket: unknown key"),
    ],
)
def test_bad_dra_config_names_the_key(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_dra_config({"dra": body}, source="agent.yaml")
    assert any(p.startswith("agent.yaml: ") and message in p for p in err.value.problems), err.value.problems


def test_dra_cannot_take_a_shared_resource() -> None:
    plugin = parse_plugin_config(
        {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
    )
    dra = parse_dra_config({"dra": {"enabled": True}})
    (problem,) = shared_conflicts(dra, plugin)
    assert "nvidia.com/gpu is shared (time-slicing)" in problem
    assert shared_conflicts(DraConfig(enabled=True, resources=("nvidia.com/mig-1g.10gb",)), plugin) == []
    assert shared_conflicts(DraConfig(), plugin) == []
    assert shared_conflicts(dra, PluginConfig()) == []


# ----------------------------------------------------------------------------- IMEX channel claims


def test_a_claim_naming_another_gangs_channel_is_refused(tmp_path: Path) -> None:
    api, claims = FakeConfigMaps(), Claims()
    p = channel_preparer(tmp_path, claims, api)
    owner = imex_claim(claims, "a-0", "ua0", "train")
    intruder = imex_claim(claims, "x-0", "ux0", "mine", namespace="team-x")
    claims.objects[("team-x", "x-0")]["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"gang": "mine", "channel": 1}}}
    ]

    async def body() -> None:
        assert (await p.prepare(owner)).devices[0].cdi_device_ids == ("gpu.gpuagent.dev/imex-channel=1",)
        got = await p.prepare(intruder)
        assert "claim team-x/x-0: IMEX channel 1 in domain" in got.error
        assert "belongs to another gang; refused" in got.error
        assert "team-a" not in got.error  # the owner is not told to the intruder
        assert "ux0" not in p.checkpoint.claims
        # the owner keeps its channel and device node
        assert (tmp_path / "dev" / "nvidia-caps-imex-channels" / "channel1").exists()

    asyncio.run(body())


@pytest.mark.parametrize(
    ("params", "labels", "error"),
    [
        ("not a mapping", {}, "opaque.parameters: expected a mapping"),
        ({"gang": 5}, {}, "parameters.gang: 5 is not a name"),
        ({"gang": "a/b"}, {}, "is not a name"),
        ({"gang": "x" * 300}, {}, "is not a name of at most 253"),
        ({"gang": "ok", "channel": True}, {}, "parameters.channel: True is not a channel 0..2047"),
        ({"gang": "ok", "channel": -1}, {}, "is not a channel 0..2047"),
        ({"gang": "ok", "channel": 2048}, {}, "is not a channel 0..2047"),
        ({"gang": "ok", "channel": "3"}, {}, "is not a channel"),
        ({"gang": "ok", "channel": 0}, {}, "IMEX channel 0 in domain"),
        ({}, {}, "names no gang"),
        (None, {"gpuagent.dev/gang": "-bad-"}, "metadata.labels[gpuagent.dev/gang]: '-bad-' is not a name"),
    ],
    ids=[
        "params-not-mapping",
        "gang-int",
        "gang-slash",
        "gang-long",
        "channel-bool",
        "channel-negative",
        "channel-over-limit",
        "channel-string",
        "channel-0-reserved",
        "no-gang",
        "bad-label",
    ],
)
def test_a_bad_channel_claim_gets_one_clear_error_and_holds_nothing(
    tmp_path: Path, params: Any, labels: dict[str, str], error: str
) -> None:
    api, claims = FakeConfigMaps(), Claims()
    p = channel_preparer(tmp_path, claims, api)
    ref = claims.add("c", "uc", [result("imex-channel", request="channel")], namespace="team-a")
    obj = claims.objects[("team-a", "c")]
    obj["metadata"]["labels"] = labels
    if params is not None:
        obj["status"]["allocation"]["devices"]["config"] = [
            {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}
        ]
    got = asyncio.run(p.prepare(ref))
    assert got.error.startswith("claim team-a/c: ")
    assert got.error.count("team-a/c") == 1
    assert error in got.error
    assert len(got.error) < 400
    assert p.checkpoint.claims == {}
    holders = [o["data"] for o in api.objects.values()]
    assert all(not d for d in holders)  # nothing held in the domain's record


@pytest.mark.parametrize(
    ("identity", "problem"),
    [
        ("not-a-list", "claims: expected a list"),
        (["text"], "expected {node, namespace, name, uid}"),
        ([{"node": "n-0", "namespace": "team-a", "name": "a-0"}], "claim uid: None"),
        (
            [{"node": "n-0", "namespace": "team-a", "name": "../../../api/v1/secrets", "uid": "u"}],
            "claim name",
        ),
        ([{"node": "n-0", "namespace": "Team A", "name": "a-0", "uid": "u"}], "claim namespace"),
        ([{"node": "n-0", "namespace": "team-a", "name": "a-0", "uid": "u?watch=1"}], "claim uid"),
        ([{"node": "n-0", "namespace": "team-b", "name": "a-0", "uid": "u"}], "is not the gang's"),
        (
            [{"node": "n-other", "namespace": "team-a", "name": "a-0", "uid": "u"}],
            "holds no part of the channel",
        ),
        ([{"node": "n-0", "namespace": "team-a", "name": "a" * 300, "uid": "u"}], "claim name"),
    ],
    ids=[
        "not-a-list",
        "not-an-object",
        "no-uid",
        "path-in-name",
        "bad-namespace",
        "query-in-uid",
        "another-namespace",
        "node-not-holding",
        "name-too-long",
    ],
)
def test_a_peers_malformed_claim_identity_is_dropped_reported_and_never_read(
    tmp_path: Path, identity: Any, problem: str
) -> None:
    """Any node of the domain writes the record: a claim identity another node wrote wrong (for this
    node or not) is dropped with a problem naming it, the entry's gang and holders are kept, no GET is
    made with its text, and this node's hold, now with no identity to check, is kept (never given back
    on a guess)."""

    entry = {"gang": "team-a/train", "nodes": ["n-0", "n-1"], "claims": identity}
    holders, problems, broken = parse_record({"channel-1": json.dumps(entry)})
    assert holders == {1: Holder("team-a/train", ("n-0", "n-1"))}
    assert broken == set()
    assert any(problem in p and p.startswith("channel-1: ") for p in problems), problems

    api, claims = FakeConfigMaps(), Claims()
    p = channel_preparer(tmp_path, claims, api, node="n-0")
    assert p.channels is not None
    path = f"{configmaps('gpu-system')}/{record_name(DOMAIN)}"
    api.objects[path] = {"metadata": {"resourceVersion": "1"}, "data": {"channel-1": json.dumps(entry)}}
    gets: list[tuple[str, str]] = []
    p.channels._claim_get = claim_get(claims, gets)
    assert p.channels.reconcile(held=[]) == []
    assert gets == []
    assert parse_record(next(iter(api.objects.values()))["data"])[0] == holders
