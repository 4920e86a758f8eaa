"""The IMEX channel record of each NVLink domain in the API: one ConfigMap per domain
(``imex-channels-<clusterUUID>-<cliqueId>`` in the agent's namespace), data ``channel-<N>`` →
``{"gang": "<namespace>/<gang>", "nodes": [...]}`` (:mod:`deviceplugin.dra.channels` decides).

Written with optimistic concurrency: every change reads the object, decides, and writes it back with
the ``resourceVersion`` it read (create when there is none); a conflict (another node of the domain wrote
first) waits a random part of a doubling back-off (so the nodes of a gang starting together spread
out) and reads and decides again, at most :data:`ATTEMPTS` times, then fails this prepare with a clear
error (the kubelet retries it). Entries it cannot read are kept as they are (their channels stay
taken) and reported. Blocking: call it from a worker thread.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

from deviceplugin.dra.channels import (
    CHANNEL_LIMIT,
    KEY_PREFIX,
    ChannelError,
    ChannelRequest,
    Holder,
    acquire,
    parse_record,
    release,
    render_record,
)
from topology import logs
from topology.kube import Kube, KubeError, configmaps

ATTEMPTS = 32
BACKOFF_S = 0.02  # the first wait after a conflict; doubles up to MAX_BACKOFF_S, each wait jittered
MAX_BACKOFF_S = 1.0
FIRST_CHANNEL = 1  # channel 0 is the node-wide one (the device plugin's imex.channelIDs: [0])
_NOT_NAME = re.compile(r"[^a-z0-9-]+")
T = TypeVar("T")


class ChannelBook(Protocol):
    def acquire(self, domain: str, request: ChannelRequest, node: str) -> int: ...

    def release(self, domain: str, *, gang: str, channel: int, node: str) -> None: ...

    def held(self, domain: str, node: str) -> dict[int, Holder]: ...


def record_name(domain: str) -> str:
    """``imex-channels-<domain>`` as a DNS subdomain (the domain is ``<clusterUUID>.<cliqueId>``)."""
    return ("imex-channels-" + _NOT_NAME.sub("-", domain.lower()))[:253].strip("-")


class KubeChannelBook:
    """:class:`ChannelBook` over ConfigMaps in ``namespace``."""

    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        limit: int = CHANNEL_LIMIT,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[float], float] = lambda top: random.uniform(0.0, top),
    ) -> None:
        self.kube = kube
        self._sleep = sleep
        self._jitter = jitter
        self.namespace = namespace
        self.limit = limit
        self.conflicts = 0
        self._log = logs.get_logger("deviceplugin.dra").bind(namespace=namespace)

    def acquire(self, domain: str, request: ChannelRequest, node: str) -> int:
        def change(holders: dict[int, Holder], taken: set[int]) -> tuple[int, dict[int, Holder]]:
            return acquire(
                holders, request, node, domain=domain, taken=taken | _below(FIRST_CHANNEL), limit=self.limit
            )

        return self._update(domain, change)

    def release(self, domain: str, *, gang: str, channel: int, node: str) -> None:
        def change(holders: dict[int, Holder], _taken: set[int]) -> tuple[None, dict[int, Holder]]:
            return None, release(holders, gang=gang, channel=channel, node=node)

        self._update(domain, change)

    def held(self, domain: str, node: str) -> dict[int, Holder]:
        """The channels the record of ``domain`` says ``node`` holds (a malformed entry is no hold)."""
        name = record_name(domain)
        try:
            current: Mapping[str, Any] | None = self.kube.get(f"{configmaps(self.namespace)}/{quote(name)}")
        except KubeError as exc:
            if exc.status != 404:
                raise ChannelError(f"domain {domain}: cannot read {self.namespace}/{name}: {exc}") from None
            return {}
        holders, _problems, _broken = parse_record(dict((current or {}).get("data") or {}), limit=self.limit)
        return {c: h for c, h in holders.items() if node in h.nodes}

    def _update(
        self, domain: str, change: Callable[[dict[int, Holder], set[int]], tuple[T, dict[int, Holder]]]
    ) -> T:
        name = record_name(domain)
        path = f"{configmaps(self.namespace)}/{quote(name)}"
        backoff = BACKOFF_S
        for attempt in range(ATTEMPTS):
            if attempt:
                self._sleep(self._jitter(backoff))
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            try:
                current: Mapping[str, Any] | None = self.kube.get(path)
            except KubeError as exc:
                if exc.status != 404:
                    raise ChannelError(
                        f"domain {domain}: cannot read {self.namespace}/{name}: {exc}"
                    ) from None
                current = None
            data = dict((current or {}).get("data") or {})
            holders, problems, broken = parse_record(data, limit=self.limit)
            for problem in problems:
                self._log.warning("imex_channel_record_problem", record=name, problem=problem)
            result, new = change(holders, broken)
            if new == holders:
                return result
            kept = {k: v for k, v in data.items() if not (k.startswith(KEY_PREFIX) and _parsed(k, holders))}
            body: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "labels": {
                        "app.kubernetes.io/name": "gpu-node-agent",
                        "gpuagent.dev/imex-channels": "true",
                    },
                },
                "data": {**kept, **render_record(new)},
            }
            try:
                if current is None:
                    self.kube.create(configmaps(self.namespace), body)
                else:
                    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                    self.kube.replace(path, body)
            except KubeError as exc:
                if exc.status in (409, 404):  # written (or created, or deleted) by another node first
                    self.conflicts += 1
                    continue
                raise ChannelError(f"domain {domain}: cannot write {self.namespace}/{name}: {exc}") from None
            return result
        raise ChannelError(
            f"domain {domain}: {self.namespace}/{name} changed under {ATTEMPTS} writes in a row; retry"
        )


def _below(first: int) -> set[int]:
    return set(range(first))


def _parsed(key: str, holders: Mapping[int, Holder]) -> bool:
    number = key[len(KEY_PREFIX) :]
    return number.isdigit() and int(number) in holders
