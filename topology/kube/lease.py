"""Lease-based leader election (``coordination.k8s.io/v1``) over the adapter's :class:`Kube`.

The client is injected and both clocks are parameters, so a test drives expiry without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from topology.kube.client import Kube, KubeError, leases


def micro_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaseElector:
    """One ``try_acquire_or_renew`` per ``retry_period_s``; leader while it keeps renewing.

    Expiry is judged by the local clock from when this process last saw the record change (as
    client-go does), so clock skew between candidates does not matter.
    """

    kube: Kube
    namespace: str
    name: str
    identity: str
    lease_duration_s: int = 15
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    _seen: tuple[str, str] | None = None  # (holder, renewTime) last observed
    _seen_at: float = 0.0
    leading: bool = False

    def _path(self, name: str | None = None) -> str:
        base = leases(self.namespace)
        return f"{base}/{quote(name)}" if name else base

    def try_acquire_or_renew(self) -> bool:
        now = self.clock()
        try:
            lease = self.kube.get(self._path(self.name))
        except KubeError as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, acquire=True, transitions=0),
            }
            try:
                self.kube.create(self._path(), body)
            except KubeError as err:
                if err.status == 409:
                    self.leading = False
                    return False
                raise
            self.leading = True
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._seen:
            self._seen, self._seen_at = record, self.monotonic()
        duration = int(spec.get("leaseDurationSeconds") or self.lease_duration_s)
        if holder and holder != self.identity and self.monotonic() < self._seen_at + duration:
            self.leading = False
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        new_spec = {**spec, **self._spec(now, acquire=holder != self.identity, transitions=transitions)}
        if holder == self.identity:
            new_spec["acquireTime"] = spec.get("acquireTime") or micro_time(now)
        lease["spec"] = new_spec
        try:
            self.kube.replace(self._path(self.name), lease)
        except KubeError as exc:
            if exc.status == 409:
                self.leading = False
                return False
            raise
        self.leading = True
        return True

    def _spec(self, now: float, *, acquire: bool, transitions: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_duration_s,
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        }
        if acquire:
            spec["acquireTime"] = micro_time(now)
        return spec

    def release(self) -> None:
        """Give the lease up at shutdown so a standby takes over at once."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = self.kube.get(self._path(self.name))
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            lease["spec"] = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1}
            self.kube.replace(self._path(self.name), lease)
        except KubeError:
            return
