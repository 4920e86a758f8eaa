"""The thin Kubernetes adapter of the topology side: plain-dict REST over an injected ``ApiClient``.

Objects travel as the API serves them (camelCase JSON dicts); nothing above this module sees client
model classes. Requests go through the client's own serializer and auth (bearer token, client
certificates, CA), so a kubeconfig or the in-cluster service account work unchanged.

Also here: a Lease-based leader elector (``coordination.k8s.io/v1``), written against this adapter so
the client is injected and the clock is a parameter.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

FIELD_MANAGER = "gpu-node-agent"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"

NODES = "/api/v1/nodes"
GPUNODES = "/apis/topology.gpuagent.dev/v1alpha1/gpunodes"
HYPERNODES = "/apis/topology.volcano.sh/v1alpha1/hypernodes"


def configmaps(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/configmaps"


def leases(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"


def events(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/events"


class KubeError(Exception):
    """A request the API server refused (or could not be sent); ``status`` 0 means no answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status


def api_client_from(kubeconfig: str | None, *, environ: Mapping[str, str] | None = None) -> Any:
    """An ``ApiClient`` from a kubeconfig file (the argument, else the first file in ``$KUBECONFIG``),
    else the in-cluster service account, else ~/.kube/config. (The client library reads ``$KUBECONFIG``
    once at import; reading it here keeps the usual precedence whenever the client is built.)"""
    import os  # noqa: PLC0415

    from kubernetes import client, config  # noqa: PLC0415 - only the composition root needs it

    env = os.environ if environ is None else environ
    if not kubeconfig and env.get("KUBECONFIG"):
        kubeconfig = next((p for p in env["KUBECONFIG"].split(os.pathsep) if p and os.path.exists(p)), None)
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    try:
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return client.ApiClient(cfg)
    except config.ConfigException:
        return config.new_client_from_config()  # type: ignore[no-untyped-call]


class Kube:
    """GET/LIST/WATCH/APPLY/PUT/POST/DELETE of plain objects."""

    def __init__(self, api_client: Any, *, request_timeout_s: float = 30.0) -> None:
        self.api_client = api_client
        self.request_timeout_s = request_timeout_s

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        try:
            params = self.api_client.param_serialize(
                method=method,
                resource_path=path,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            return self.api_client.call_api(*params, _request_timeout=timeout or self.request_timeout_s)
        except Exception as exc:  # urllib3 / client errors: the API is not reachable
            if isinstance(exc, KubeError):
                raise
            status = int(getattr(exc, "status", 0) or 0)
            raise KubeError(
                status, f"{method} {path}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            ) from None

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self._call(method, path, **kwargs)
        data = resp.read()
        if not 200 <= resp.status <= 299:
            message = ""
            try:
                message = json.loads(data).get("message", "")
            except (ValueError, AttributeError):
                message = (
                    data[:200].decode("utf-8", "replace") if isinstance(data, bytes) else str(data)[:200]
                )
            raise KubeError(resp.status, f"{method} {path}: {message}")
        return json.loads(data) if data else {}

    def get(self, path: str) -> dict[str, Any]:
        out: dict[str, Any] = self.request("GET", path)
        return out

    def list(self, path: str, *, label_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        query = {"labelSelector": label_selector} if label_selector else None
        body = self.request("GET", path, query=query)
        return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion", ""))

    def watch(
        self, path: str, resource_version: str, *, timeout_s: int, label_selector: str | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(type, object)`` events until the server ends the watch (after ``timeout_s``).
        An ``ERROR`` event (410 Gone: resource version too old) raises :class:`KubeError`."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_s),
            "allowWatchBookmarks": "true",
        }
        if label_selector:
            query["labelSelector"] = label_selector
        resp = self._call("GET", path, query=query, timeout=timeout_s + 10)
        if not 200 <= resp.status <= 299:
            raise KubeError(resp.status, f"WATCH {path}: {resp.read()[:200]!r}")
        raw = resp.response
        buffer = b""
        try:
            for chunk in raw.stream(amt=None, decode_content=False):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        if event.get("type") == "ERROR":
                            obj = event.get("object") or {}
                            raise KubeError(
                                int(obj.get("code", 0) or 0), f"WATCH {path}: {obj.get('message', '')}"
                            )
                        yield str(event.get("type")), dict(event.get("object") or {})
        finally:
            raw.release_conn()

    def apply(
        self, path: str, obj: Mapping[str, Any], *, field_manager: str = FIELD_MANAGER
    ) -> dict[str, Any]:
        """Server-side apply (``force``: this manager owns what it sends)."""
        out: dict[str, Any] = self.request(
            "PATCH",
            path,
            query={"fieldManager": field_manager, "force": "true"},
            body=dict(obj),
            content_type=APPLY_CONTENT_TYPE,
        )
        return out

    def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self.request("POST", path, body=dict(obj))
        return out

    def replace(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self.request("PUT", path, body=dict(obj))
        return out

    def delete(self, path: str) -> None:
        try:
            self.request("DELETE", path)
        except KubeError as exc:
            if exc.status != 404:
                raise


# --------------------------------------------------------------------------- leader election


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
