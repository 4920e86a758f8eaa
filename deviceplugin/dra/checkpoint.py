"""The prepared claims of this node, kept on disk so NodePrepareResources/NodeUnprepareResources stay
idempotent across agent and kubelet restarts.

The file (``<pluginDir>/<driver>/checkpoint.json``) is JSON: ``{"version": 1, "driver": ...,
"claims": {<uid>: {"namespace", "name", "devices": [{"requestNames", "poolName", "deviceName",
"cdiDeviceIds"}], "imexChannel": {"domain", "gang", "channel"} (IMEX channel claims only)}}}``.
Every write is atomic (temporary file, fsync, rename), so a crash leaves the old
or the new file, never half of one.

A file that cannot be read as a checkpoint (not JSON, a wrong shape, another driver's, larger than
:data:`MAX_BYTES`) is never overwritten: it is moved aside to ``checkpoint.json.bad-<n>`` (nothing
lost; the operator can look at it) and :meth:`Checkpoint.load` reports why, naming the file and the
field; the driver then starts with no prepared claims, and the kubelet's next prepare of each claim
prepares it again from the API (prepare is idempotent). Entries of a readable file that are broken on
their own are dropped one by one and reported, the rest kept.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION = 1
MAX_BYTES = 16 * 1024 * 1024
MAX_CLAIMS = 100_000
MAX_DEVICES_PER_CLAIM = 1024
MAX_CHANNEL = 1 << 20


class CheckpointError(RuntimeError):
    """The checkpoint cannot be written (one line: the file and the reason)."""


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "requestNames": list(self.request_names),
            "poolName": self.pool_name,
            "deviceName": self.device_name,
            "cdiDeviceIds": list(self.cdi_device_ids),
        }


@dataclass(frozen=True, slots=True)
class ChannelHold:
    """The IMEX channel a claim holds: its NVLink domain, gang and channel number."""

    domain: str
    gang: str
    channel: int

    def to_json(self) -> dict[str, Any]:
        return {"domain": self.domain, "gang": self.gang, "channel": self.channel}


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    channel: ChannelHold | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "namespace": self.namespace,
            "name": self.name,
            "devices": [d.to_json() for d in self.devices],
        }
        if self.channel is not None:
            out["imexChannel"] = self.channel.to_json()
        return out


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: expected a list of strings")
    return tuple(value)


def _string(body: Mapping[str, Any], key: str, where: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key}: expected a string, got {type(value).__name__}")
    return value


def parse_claim(uid: str, body: Any) -> PreparedClaim:
    where = f"claims[{uid[:64]!r}]"
    if not isinstance(body, Mapping):
        raise ValueError(f"{where}: expected a mapping")
    raw = body.get("devices")
    if not isinstance(raw, list) or len(raw) > MAX_DEVICES_PER_CLAIM:
        raise ValueError(f"{where}.devices: expected a list of at most {MAX_DEVICES_PER_CLAIM} devices")
    devices = []
    for i, d in enumerate(raw):
        at = f"{where}.devices[{i}]"
        if not isinstance(d, Mapping):
            raise ValueError(f"{at}: expected a mapping")
        devices.append(
            PreparedDevice(
                request_names=_strings(d.get("requestNames"), f"{at}.requestNames"),
                pool_name=_string(d, "poolName", at),
                device_name=_string(d, "deviceName", at),
                cdi_device_ids=_strings(d.get("cdiDeviceIds"), f"{at}.cdiDeviceIds"),
            )
        )
    channel = None
    raw_channel = body.get("imexChannel")
    if raw_channel is not None:
        at = f"{where}.imexChannel"
        if not isinstance(raw_channel, Mapping):
            raise ValueError(f"{at}: expected a mapping")
        number = raw_channel.get("channel")
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < MAX_CHANNEL:
            raise ValueError(f"{at}.channel: expected a channel 0..{MAX_CHANNEL - 1}")
        channel = ChannelHold(
            domain=_string(raw_channel, "domain", at), gang=_string(raw_channel, "gang", at), channel=number
        )
    return PreparedClaim(
        uid=uid,
        namespace=_string(body, "namespace", where),
        name=_string(body, "name", where),
        devices=tuple(devices),
        channel=channel,
    )


class Checkpoint:
    """The prepared claims by UID, in memory and on disk (the file is written on every change)."""

    def __init__(self, path: Path, *, driver: str) -> None:
        self.path = path
        self.driver = driver
        self.claims: dict[str, PreparedClaim] = {}

    def load(self) -> list[str]:
        """Read the file (none: no claims). Returns the problems found, one line each; a file that is
        not a checkpoint at all is moved aside first (see the module doc)."""
        try:
            with self.path.open("rb") as fh:
                raw = fh.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return []
        except OSError as exc:
            return [f"{self.path}: cannot read: {exc.strerror or exc}; starting with no prepared claims"]
        try:
            if len(raw) > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES} bytes")
            data = json.loads(raw.decode("utf-8"))
            claims = self._claims(data)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            aside = self._move_aside()
            return [
                f"{self.path}: not a checkpoint of {self.driver} ({str(exc).splitlines()[0][:200]}); "
                f"kept as {aside} and starting with no prepared claims (the kubelet prepares them again)"
            ]
        problems: list[str] = []
        for uid, body in claims.items():
            try:
                self.claims[uid] = parse_claim(uid, body)
            except ValueError as exc:
                problems.append(f"{self.path}: {exc}; entry dropped")
        return problems

    def _claims(self, data: Any) -> Mapping[str, Any]:
        if not isinstance(data, Mapping):
            raise ValueError(f"expected a JSON object at the top, got {type(data).__name__}")
        if data.get("version") != VERSION:
            raise ValueError(f"version: expected {VERSION}, got {data.get('version')!r:.40}")
        if data.get("driver") != self.driver:
            raise ValueError(f"driver: expected {self.driver!r}, got {data.get('driver')!r:.80}")
        claims = data.get("claims")
        if not isinstance(claims, Mapping) or len(claims) > MAX_CLAIMS:
            raise ValueError(f"claims: expected a mapping of at most {MAX_CLAIMS} claims")
        return claims

    def _move_aside(self) -> Path:
        n = 0
        while True:
            aside = self.path.with_name(f"{self.path.name}.bad-{n}")
            if not aside.exists():
                break
            n += 1
        try:
            os.replace(self.path, aside)
        except OSError:
            return self.path  # cannot move it: it stays where it is, and the next write replaces it
        return aside

    def put(self, claim: PreparedClaim) -> None:
        """Record ``claim`` and write the file; on a failed write the claim is not recorded."""
        previous = self.claims.get(claim.uid)
        self.claims[claim.uid] = claim
        try:
            self.save()
        except CheckpointError:
            if previous is None:
                del self.claims[claim.uid]
            else:
                self.claims[claim.uid] = previous
            raise

    def remove(self, uid: str) -> bool:
        """Forget ``uid`` and write the file; False when it was not prepared."""
        previous = self.claims.pop(uid, None)
        if previous is None:
            return False
        try:
            self.save()
        except CheckpointError:
            self.claims[uid] = previous
            raise
        return True

    def save(self) -> None:
        body = {
            "version": VERSION,
            "driver": self.driver,
            "claims": {uid: c.to_json() for uid, c in sorted(self.claims.items())},
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".checkpoint-", suffix=".tmp")
        except OSError as exc:
            raise CheckpointError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(body, fh, separators=(",", ":"))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise CheckpointError(f"cannot write {self.path}: {exc.strerror or exc}") from None
