"""One IMEX channel per job: the per-domain record (one channel per gang, every node of the gang on it,
free once no node holds it), the gang named by a claim, the record kept in the API with optimistic
concurrency, and prepare/unprepare making and removing the node's channel device with its CDI device."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.config import ConfigError
from deviceplugin.dra.channelbook import KubeChannelBook, record_name
from deviceplugin.dra.channels import (
    ChannelError,
    ChannelRequest,
    ClaimIdentity,
    Holder,
    acquire,
    channel_request,
    parse_record,
    release,
    render_record,
)
from deviceplugin.dra.checkpoint import Checkpoint
from deviceplugin.dra.config import parse_dra_config
from deviceplugin.dra.imexchannel import IMEX_DEVICE, ImexChannels
from deviceplugin.dra.prepare import ClaimRef, Preparer
from tests.deviceplugin.test_dra_prepare import DEVICES, DRIVER, KIND, POOL, Claims, Health, result
from topology.kube import KubeError

DOMAIN = "6f1e0b4c-0000-4000-8000-000000000001.3"
A = ChannelRequest(gang="team-a/train")
B = ChannelRequest(gang="team-b/train")


# ----------------------------------------------------------------------------- the record (pure)


def test_a_gang_gets_one_channel_on_every_node_and_another_gang_another() -> None:
    holders: dict[int, Holder] = {}
    got = []
    for node in ("n0", "n1", "n2"):
        channel, holders = acquire(holders, A, node, domain=DOMAIN)
        got.append(channel)
    other, holders = acquire(holders, B, "n3", domain=DOMAIN)
    assert got == [0, 0, 0]
    assert other == 1
    assert holders[0] == Holder(gang="team-a/train", nodes=("n0", "n1", "n2"))


def test_taken_channels_are_skipped_and_a_full_domain_is_a_clear_error() -> None:
    channel, holders = acquire({}, A, "n0", domain=DOMAIN, taken={0, 1}, limit=4)
    assert channel == 2
    channel, holders = acquire(holders, B, "n0", domain=DOMAIN, taken={0, 1}, limit=4)
    assert channel == 3
    with pytest.raises(ChannelError, match=f"every IMEX channel of domain {DOMAIN} \\(0..3\\) is held"):
        acquire(holders, ChannelRequest(gang="team-c/x"), "n0", domain=DOMAIN, taken={0, 1}, limit=4)


def test_a_channel_is_free_once_its_last_node_lets_go() -> None:
    _, holders = acquire({}, A, "n0", domain=DOMAIN)
    _, holders = acquire(holders, A, "n1", domain=DOMAIN)
    holders = release(holders, gang=A.gang, channel=0, node="n0")
    assert holders[0].nodes == ("n1",)
    assert release(holders, gang=B.gang, channel=0, node="n1") == holders  # not B's: untouched
    assert release(holders, gang=A.gang, channel=0, node="n1") == {}
    channel, _ = acquire({}, B, "n5", domain=DOMAIN)
    assert channel == 0  # reused after the gang is gone


def test_asking_for_a_channel_gets_it_when_free() -> None:
    channel, holders = acquire({}, ChannelRequest(gang="team-a/train", channel=7), "n0", domain=DOMAIN)
    assert channel == 7
    assert acquire(holders, A, "n1", domain=DOMAIN)[0] == 7  # the rest of the gang follows


def test_the_record_round_trips_and_keeps_unreadable_entries_taken() -> None:
    _, holders = acquire({}, A, "n0", domain=DOMAIN)
    data = render_record(holders)
    data["channel-9"] = "not json"
    data["channel-x"] = "{}"
    data["other-key"] = "ignored"
    parsed, problems, broken = parse_record(data)
    assert parsed == holders
    assert broken == {9}
    assert len(problems) == 2
    with pytest.raises(ChannelError, match=r"IMEX channel 9 .* is reserved"):
        acquire(parsed, ChannelRequest(gang="g/h", channel=9), "n", domain=DOMAIN, taken=broken)
    assert acquire(parsed, B, "n", domain=DOMAIN, taken={*broken, 1})[0] == 2


# ----------------------------------------------------------------------------- the gang of a claim


def claim(
    labels: Mapping[str, str] | None = None, params: Any = None, namespace: str = "team-a"
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": "c", "namespace": namespace, "uid": "u", "labels": dict(labels or {})},
        "status": {"allocation": {"devices": {"results": []}}},
    }
    if params is not None:
        obj["status"]["allocation"]["devices"]["config"] = [
            {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}
        ]
    return obj


def test_the_gang_comes_from_the_opaque_config_or_the_label_and_is_namespaced() -> None:
    me = ClaimIdentity("team-a", "c", "u")  # recorded with the hold: reconcile GETs it by this
    assert channel_request(claim({"gpuagent.dev/gang": "train"}), driver=DRIVER) == ChannelRequest(
        "team-a/train", claim=me
    )
    got = channel_request(claim({"gpuagent.dev/gang": "x"}, {"gang": "job-1", "channel": 5}), driver=DRIVER)
    assert got == ChannelRequest("team-a/job-1", 5, me)
    # the same gang name in another namespace is another gang
    assert channel_request(claim({"gpuagent.dev/gang": "train"}, namespace="team-b"), driver=DRIVER).gang == (
        "team-b/train"
    )


# ----------------------------------------------------------------------------- the record in the API


class FakeConfigMaps:
    """ConfigMaps at the HTTP verbs the book uses, with resourceVersion conflicts like the API server's;
    ``before_write`` runs once before the next write (another node writing first)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.before_write: Callable[[], None] | None = None
        self.writes = 0

    def _hook(self) -> None:
        hook, self.before_write = self.before_write, None
        if hook is not None:
            hook()

    def get(self, path: str) -> dict[str, Any]:
        if path not in self.objects:
            raise KubeError(404, "not found")
        return json.loads(json.dumps(self.objects[path]))

    def create(self, collection: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._hook()
        path = f"{collection}/{body['metadata']['name']}"
        if path in self.objects:
            raise KubeError(409, "already exists")
        return self._store(path, body)

    def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._hook()
        if self.objects[path]["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise KubeError(409, "the object has been modified")
        return self._store(path, body)

    def _store(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.writes += 1
        obj = json.loads(json.dumps(body))
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.objects[path] = obj
        return obj


def test_the_book_skips_channel_0_and_rereads_after_a_conflict() -> None:
    api = FakeConfigMaps()
    one = KubeChannelBook(api, namespace="gpu-system")  # type: ignore[arg-type]
    two = KubeChannelBook(api, namespace="gpu-system")  # type: ignore[arg-type]
    assert one.acquire(DOMAIN, A, "n0") == 1  # 0 is the node-wide channel of the device plugin
    # gang B's first node writes while gang A's second node is deciding: A's node reads again
    api.before_write = lambda: two.acquire(DOMAIN, B, "n9")
    assert one.acquire(DOMAIN, A, "n1") == 1
    assert one.conflicts == 1
    assert two.acquire(DOMAIN, B, "n8") == 2
    (obj,) = api.objects.values()
    assert obj["metadata"]["name"] == record_name(DOMAIN)
    holders, problems, _ = parse_record(obj["data"])
    assert problems == []
    assert holders == {1: Holder("team-a/train", ("n0", "n1")), 2: Holder("team-b/train", ("n8", "n9"))}
    one.release(DOMAIN, gang=A.gang, channel=1, node="n0")
    one.release(DOMAIN, gang=A.gang, channel=1, node="n1")
    assert "channel-1" not in api.objects[next(iter(api.objects))]["data"]
    writes = api.writes
    one.release(DOMAIN, gang=A.gang, channel=1, node="n1")  # nothing to change: no write
    assert api.writes == writes


def test_the_book_gives_up_after_conflicts_in_a_row_with_a_clear_error() -> None:
    api = FakeConfigMaps()
    book = KubeChannelBook(api, namespace="gpu-system")  # type: ignore[arg-type]
    book.acquire(DOMAIN, A, "n0")

    class Busy(FakeConfigMaps):
        def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
            raise KubeError(409, "the object has been modified")

    busy = Busy()
    busy.objects = api.objects
    waits: list[float] = []
    stubborn = KubeChannelBook(busy, namespace="gpu-system", sleep=waits.append, jitter=lambda top: top)  # type: ignore[arg-type]
    with pytest.raises(ChannelError, match="changed under 32 writes in a row; retry"):
        stubborn.acquire(DOMAIN, B, "n1")
    assert waits[:4] == [0.02, 0.04, 0.08, 0.16]  # a doubling back-off between tries ...
    assert max(waits) == 1.0  # ... bounded


# ----------------------------------------------------------------------------- prepare and unprepare


def imex_claim(claims: Claims, name: str, uid: str, gang: str, namespace: str = "team-a") -> ClaimRef:
    ref = claims.add(name, uid, [result(IMEX_DEVICE, request="channel")], namespace=namespace)
    claims.objects[(namespace, name)]["metadata"]["labels"] = {"gpuagent.dev/gang": gang}
    return ref


def claim_get(
    claims: Claims, gets: list[tuple[str, str]] | None = None
) -> Callable[[str, str], Mapping[str, Any] | None]:
    """One claim by namespace and name, as a GET finds it (None: 404); ``gets`` records each GET."""

    def get(namespace: str, name: str) -> Mapping[str, Any] | None:
        if gets is not None:
            gets.append((namespace, name))
        return claims.objects.get((namespace, name))

    return get


def channel_preparer(tmp: Path, claims: Claims, api: FakeConfigMaps, node: str = POOL) -> Preparer:
    proc = tmp / "proc-devices"
    proc.write_text("Character devices:\n195 nvidia-frontend\n510 nvidia-caps-imex-channels\n")
    channels = ImexChannels(
        book=KubeChannelBook(api, namespace="gpu-system"),  # type: ignore[arg-type]
        node_name=node,
        driver=DRIVER,
        domain=lambda: DOMAIN,
        dev_root=tmp / "dev",
        proc_devices=proc,
        cdi_dir=tmp / "cdi",
        allow_stand_in=True,
        claim_get=claim_get(claims),
    )
    checkpoint = Checkpoint(tmp / "checkpoint.json", driver=DRIVER)
    checkpoint.load()
    return Preparer(
        checkpoint=checkpoint,
        claims=claims,
        health=Health(),
        driver=DRIVER,
        pool=node,
        kind=KIND,
        published=lambda: DEVICES,
        channels=channels,
    )


def test_prepare_makes_the_gangs_channel_and_the_container_sees_only_it(tmp_path: Path) -> None:
    api, claims = FakeConfigMaps(), Claims()
    p = channel_preparer(tmp_path, claims, api)
    a1 = imex_claim(claims, "a-0", "ua0", "train")
    a2 = imex_claim(claims, "a-1", "ua1", "train")
    b1 = imex_claim(claims, "b-0", "ub0", "eval")

    async def body() -> None:
        got_a1, got_a2, got_b1 = [await p.prepare(r) for r in (a1, a2, b1)]
        assert (got_a1.error, got_a2.error, got_b1.error) == ("", "", "")
        assert got_a1.devices[0].cdi_device_ids == ("gpu.gpuagent.dev/imex-channel=1",)
        assert got_a2.devices == got_a1.devices
        assert got_b1.devices[0].cdi_device_ids == ("gpu.gpuagent.dev/imex-channel=2",)
        for channel in (1, 2):
            st = os.stat(tmp_path / "dev" / "nvidia-caps-imex-channels" / f"channel{channel}")
            if stat.S_ISCHR(st.st_mode):  # mknod allowed (root): the real device number
                assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (510, channel)
        spec = json.loads((tmp_path / "cdi" / "gpu.gpuagent.dev-imex-channel.json").read_text())
        assert {d["name"]: d["containerEdits"]["deviceNodes"][0]["path"] for d in spec["devices"]} == {
            "1": "/dev/nvidia-caps-imex-channels/channel1",
            "2": "/dev/nvidia-caps-imex-channels/channel2",
        }
        # one claim of gang A goes: the channel stays for the other
        assert await p.unprepare(a1) == ""
        assert (tmp_path / "dev" / "nvidia-caps-imex-channels" / "channel1").exists()
        # an agent restart: the checkpoint still knows the hold, and the last claim gives it back
        p2 = channel_preparer(tmp_path, claims, api)
        assert (await p2.prepare(a2)).devices == got_a2.devices  # answered from the checkpoint
        assert await p2.unprepare(a2) == ""
        assert not (tmp_path / "dev" / "nvidia-caps-imex-channels" / "channel1").exists()
        holders, _, _ = parse_record(next(iter(api.objects.values()))["data"])
        assert set(holders) == {2}
        spec = json.loads((tmp_path / "cdi" / "gpu.gpuagent.dev-imex-channel.json").read_text())
        assert [d["name"] for d in spec["devices"]] == ["2"]

    asyncio.run(body())


def test_without_a_domain_a_channel_claim_is_refused_and_nothing_is_held(tmp_path: Path) -> None:
    api, claims = FakeConfigMaps(), Claims()
    p = channel_preparer(tmp_path, claims, api)
    assert p.channels is not None
    p.channels._domain = lambda: None
    ref = imex_claim(claims, "a-0", "ua0", "train")
    got = asyncio.run(p.prepare(ref))
    assert "in no complete NVLink domain" in got.error
    assert api.objects == {}
    assert p.checkpoint.claims == {}


def test_imex_channels_are_off_by_default_and_configured_in_the_dra_section() -> None:
    assert not parse_dra_config({}).imex_channels
    config = parse_dra_config({"dra": {"imexChannels": True, "imexNamespace": "gpu-ops"}})
    assert (config.imex_channels, config.imex_namespace) == (True, "gpu-ops")
    with pytest.raises(ConfigError, match=r"dra.imexNamespace: 'Not_A_Namespace' is not a namespace name"):
        parse_dra_config({"dra": {"imexNamespace": "Not_A_Namespace"}})


def test_a_lost_checkpoints_holds_are_given_back_at_start_and_live_claims_keep_theirs(tmp_path: Path) -> None:
    api, claims = FakeConfigMaps(), Claims()
    p = channel_preparer(tmp_path, claims, api)
    live = imex_claim(claims, "a-0", "ua0", "train")
    gone = imex_claim(claims, "b-0", "ub0", "eval")
    again_made = imex_claim(claims, "c-0", "uc0", "tune")
    moved = imex_claim(claims, "d-0", "ud0", "serve")
    for ref in (live, gone, again_made, moved):
        assert asyncio.run(p.prepare(ref)).error == ""
    KubeChannelBook(api, namespace="gpu-system").acquire(DOMAIN, B, "n9")  # #5, another node's gang
    holders, _, _ = parse_record(next(iter(api.objects.values()))["data"])
    assert holders[1] == Holder("team-a/train", (POOL,), ((POOL, ClaimIdentity("team-a", "a-0", "ua0")),))
    # the agent restarts with its checkpoint gone; meanwhile gang eval's claim was deleted, tune's was
    # deleted and made again under its name (another uid), and serve's is allocated on another node now
    (tmp_path / "checkpoint.json").unlink()
    del claims.objects[("team-a", "b-0")]
    imex_claim(claims, "c-0", "uc0-again", "tune")
    claims.objects[("team-a", "d-0")]["status"]["allocation"]["devices"]["results"][0]["pool"] = "n9"
    gets: list[tuple[str, str]] = []
    p2 = channel_preparer(tmp_path, claims, api)
    assert p2.channels is not None
    p2.channels._claim_get = claim_get(claims, gets)
    assert p2.channels.reconcile(held=[]) == [("team-a/eval", 2), ("team-a/tune", 3), ("team-a/serve", 4)]
    # one GET for each claim the record names for this node: no list, nothing of another node's
    assert sorted(gets) == [("team-a", n) for n in ("a-0", "b-0", "c-0", "d-0")]
    holders, _, _ = parse_record(next(iter(api.objects.values()))["data"])
    assert holders == {
        1: Holder("team-a/train", (POOL,), ((POOL, ClaimIdentity("team-a", "a-0", "ua0")),)),
        5: Holder("team-b/train", ("n9",)),
    }
    channels = tmp_path / "dev" / "nvidia-caps-imex-channels"
    assert (channels / "channel1").exists()
    assert not (channels / "channel2").exists()
    assert p2.channels.reconcile(held=[]) == []  # nothing left to give back: no write
    again = asyncio.run(p2.prepare(live))  # the kubelet prepares the live claim again: the same channel
    assert again.error == ""
    assert again.devices[0].cdi_device_ids == ("gpu.gpuagent.dev/imex-channel=1",)


def test_a_hold_of_the_format_without_identities_is_kept_until_the_gang_prepares_here_again(
    tmp_path: Path,
) -> None:
    """An entry an older agent wrote names no claim: nothing can be looked up, so the hold stays (a
    channel kept too long, never one given to two gangs); preparing a claim of the gang records it."""
    api, claims = FakeConfigMaps(), Claims()
    book = KubeChannelBook(api, namespace="gpu-system")  # type: ignore[arg-type]
    book.acquire(DOMAIN, ChannelRequest(gang="team-a/train"), POOL)  # the old format: gang and nodes
    data = next(iter(api.objects.values()))["data"]
    assert json.loads(data["channel-1"]) == {"gang": "team-a/train", "nodes": [POOL]}
    p = channel_preparer(tmp_path, claims, api)
    assert p.channels is not None
    gets: list[tuple[str, str]] = []
    p.channels._claim_get = claim_get(claims, gets)
    assert p.channels.reconcile(held=[]) == []
    assert gets == []
    assert parse_record(next(iter(api.objects.values()))["data"])[0] == {1: Holder("team-a/train", (POOL,))}
    ref = imex_claim(claims, "a-0", "ua0", "train")
    assert asyncio.run(p.prepare(ref)).error == ""
    holders, _, _ = parse_record(next(iter(api.objects.values()))["data"])
    assert holders[1].claims_of(POOL) == [ClaimIdentity("team-a", "a-0", "ua0")]


def test_reconcile_gives_nothing_back_when_it_cannot_see_every_claim_or_the_domain(tmp_path: Path) -> None:
    api, claims = FakeConfigMaps(), Claims()
    p = channel_preparer(tmp_path, claims, api)
    assert p.channels is not None
    ref = imex_claim(claims, "a-0", "ua0", "train")
    assert asyncio.run(p.prepare(ref)).error == ""
    del claims.objects[("team-a", "a-0")]

    def forbidden(namespace: str, name: str) -> Mapping[str, Any] | None:
        raise KubeError(403, "resourceclaims is forbidden")

    p.channels._claim_get = forbidden
    with pytest.raises(KubeError):
        p.channels.reconcile(held=[])
    p.channels._domain = lambda: None
    assert p.channels.reconcile(held=[]) is None
    holders, _, _ = parse_record(next(iter(api.objects.values()))["data"])
    assert holders == {1: Holder("team-a/train", (POOL,), ((POOL, ClaimIdentity("team-a", "a-0", "ua0")),))}


def test_a_peers_malformed_gang_held_here_is_given_back_without_reading_claims(
    tmp_path: Path,
) -> None:
    """A record entry is written by any node of the domain: a gang no namespace can have is no claim's,
    so it is given back and no API read is made with its text."""
    api, claims = FakeConfigMaps(), Claims()
    p = channel_preparer(tmp_path, claims, api)
    assert p.channels is not None
    book = KubeChannelBook(api, namespace="gpu-system")  # type: ignore[arg-type]
    book.acquire(DOMAIN, ChannelRequest(gang="../../Bad Namespace/x"), POOL)
    gets: list[tuple[str, str]] = []
    p.channels._claim_get = claim_get(claims, gets)
    assert p.channels.reconcile(held=[]) == [("../../Bad Namespace/x", 1)]
    assert gets == []
    holders, _, _ = parse_record(next(iter(api.objects.values()))["data"])
    assert holders == {}
