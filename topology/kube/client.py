"""Requests of the one Kubernetes adapter: plain-dict REST over an injected ``ApiClient``.

Objects travel as the API serves them (camelCase JSON dicts); nothing above this package sees client
model classes. Requests go through the client's own serializer and auth (bearer token, client
certificates, CA), so a kubeconfig or the in-cluster service account work unchanged. Every refusal is a
:class:`KubeError` carrying the HTTP status (0: no answer).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

import orjson

FIELD_MANAGER = "gpu-node-agent"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"

NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"  # every namespace
GPUNODES = "/apis/topology.gpuagent.dev/v1alpha1/gpunodes"
HYPERNODES = "/apis/topology.volcano.sh/v1alpha1/hypernodes"
PODGROUPS = "/apis/scheduling.volcano.sh/v1beta1/podgroups"  # every namespace
RESOURCESLICES = "/apis/resource.k8s.io/v1/resourceslices"


def configmaps(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/configmaps"


def leases(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"


def events(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/events"


def resourceclaims(namespace: str) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{quote(namespace)}/resourceclaims"


def binding(namespace: str, pod: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/binding"


class KubeError(Exception):
    """A request the API server refused (or could not be sent); ``status`` 0 means no answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status


MAX_MESSAGE_CHARS = 1024  # a refusal's message kept: room for a pod and a node name of 253 each


def bound_already(exc: KubeError, name: str, node: str) -> bool:
    """Whether a refused binding of pod ``name`` says that pod is on ``node`` already: the API server
    refuses a second binding with 409 Conflict, ``Operation cannot be fulfilled on pods/binding "NAME":
    pod NAME is already assigned to node "NODE"`` (the UID precondition, when sent, is checked before,
    so it is this pod). That is the binding done (an earlier send of it was carried out); another node,
    or any other conflict, is a refusal. Pod and node names cannot hold a quote or a space."""
    return exc.status == 409 and str(exc).endswith(f'pod {name} is already assigned to node "{node}"')


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


class Watch:
    """One open watch request: iterate for ``(type, object)`` events until the server ends it.

    ``close()`` may be called from any thread; it ends the iteration at once (the socket is shut down),
    not at the next event or the server's time-out. An ``ERROR`` event (410 Gone: the resource version
    is too old) raises :class:`KubeError` with its code.
    """

    def __init__(self, response: Any, path: str) -> None:
        self._raw = response.response  # the urllib3 response under the client's RESTResponse
        self._path = path
        self._closed = threading.Event()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(Exception):  # already ended, or released to the pool
            self._raw.shutdown()

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        buffer = b""
        ended = False
        read, raw = self._reader()
        try:
            while not self._closed.is_set():
                try:
                    chunk = read(65536)
                except Exception:
                    if self._closed.is_set():
                        return
                    raise
                if not chunk:
                    ended = True
                    return
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    if line.strip():
                        yield self._event(line)
        finally:
            if ended and not raw:
                self._raw.release_conn()
            else:  # stopped mid-stream, or read past the client: the connection is not reused
                with contextlib.suppress(Exception):
                    self._raw.close()

    def _reader(self) -> tuple[Callable[[int], bytes], bool]:
        """What reads the stream's payload, and whether it reads the socket directly.

        A chunked body without content coding (what the API server sends for a watch) is read from the
        socket's buffered reader and de-chunked here: one read takes every event that has arrived,
        where the client's own reader returns one chunk per call through two layers of Python (in a
        busy cluster that was about half of an informer's time). Anything else goes through the client."""
        plain = getattr(self._raw, "_fp", None)  # the http.client response under urllib3's
        sock = getattr(plain, "fp", None)
        headers = getattr(self._raw, "headers", None) or {}
        if (
            sock is None
            or not hasattr(sock, "read1")
            or getattr(plain, "chunked", False) is not True
            or getattr(plain, "chunk_left", None) is not None  # the client has begun reading it
            or headers.get("content-encoding")
        ):
            return self._raw.read1, False
        chunks = Dechunker()

        def read(size: int) -> bytes:
            while not chunks.done:
                data = sock.read1(size)
                if not data:
                    if self._closed.is_set():
                        return b""
                    raise KubeError(0, f"WATCH {self._path}: the connection ended inside the stream")
                out = chunks.feed(data)
                if out:
                    return out
            return b""

        return read, True

    def _event(self, line: bytes) -> tuple[str, dict[str, Any]]:
        event = _decode(line)
        if event.get("type") == "ERROR":
            obj = event.get("object") or {}
            raise KubeError(int(obj.get("code", 0) or 0), f"WATCH {self._path}: {obj.get('message', '')}")
        return str(event.get("type")), dict(event.get("object") or {})


class Dechunker:
    """HTTP/1.1 chunked transfer coding, undone incrementally: ``feed`` bytes as they arrive (split
    anywhere), get the payload they complete; ``done`` after the last chunk and its trailer. Malformed
    framing raises ``ValueError`` naming what was wrong (a size line longer than ``MAX_LINE``, a size
    that is not hexadecimal, data not followed by CRLF)."""

    MAX_LINE = 4096

    def __init__(self) -> None:
        self._buf = b""
        self._left = -1  # bytes of the current chunk still to come; -1: a size line is next
        self._crlf = False  # the CRLF after a chunk's data is next
        self._trailer = False  # after the last chunk: trailer lines up to an empty one
        self.done = False

    def feed(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos = 0
        while not self.done:
            if self._left > 0:
                take = buf[pos : pos + self._left]
                if not take:
                    break
                out.append(take)
                pos += len(take)
                self._left -= len(take)
                if self._left == 0:
                    self._crlf = True
                continue
            if self._crlf:
                if len(buf) - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise ValueError(f"chunked stream: data not followed by CRLF ({buf[pos : pos + 2]!r})")
                pos += 2
                self._crlf = False
                self._left = -1
                continue
            end = buf.find(b"\r\n", pos)
            if end < 0:
                if len(buf) - pos > self.MAX_LINE:
                    raise ValueError(
                        "chunked stream: a chunk line or trailer over the limit "
                        f"(longer than {self.MAX_LINE} bytes)"
                    )
                break
            line = buf[pos:end]
            pos = end + 2
            if self._trailer:  # trailer fields are dropped; the empty line ends the body
                self.done = not line
                continue
            size = line.split(b";", 1)[0].strip()
            if not size or len(size) > 16 or size.strip(b"0123456789abcdefABCDEF"):
                raise ValueError(f"chunked stream: bad chunk size {line[:40]!r}")
            self._left = int(size, 16)
            if self._left == 0:
                self._trailer = True
        self._buf = buf[pos:]
        return b"".join(out)

    @property
    def pending(self) -> int:
        """Bytes of the current chunk still to come (its size line read, its data not all yet)."""
        return max(self._left, 0)

    @property
    def rest(self) -> bytes:
        """What was fed past the end of the body (once ``done``)."""
        return self._buf if self.done else b""


def _decode(line: bytes) -> Any:
    """One watch event: a busy cluster sends thousands a second (every pod's and node's change), so
    they go through orjson (a C parser, about 2.5x the standard one on a 5 KB pod). What it refuses
    (a lone UTF-16 surrogate escape, which the API server passes through in a string) goes to the
    standard parser, which decides as it always did. Integers: the API server sends none beyond 64 bits
    (its own decoding made them floats already), where the two parsers would differ."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


class Kube:
    """GET/LIST/WATCH/APPLY/PUT/POST/DELETE of plain objects, and pod bindings."""

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
                status = json.loads(data)
                message = str(status.get("message", ""))[:MAX_MESSAGE_CHARS]
                causes = (status.get("details") or {}).get("causes") or []
                said = [
                    str(c["message"])[:200] for c in causes[:5] if isinstance(c, dict) and c.get("message")
                ]
                if said:  # the Eviction API names the refusing PodDisruptionBudget only here
                    message += f" ({'; '.join(said)})"
            except (ValueError, AttributeError, TypeError):
                message = (
                    data[:200].decode("utf-8", "replace") if isinstance(data, bytes) else str(data)[:200]
                )
            raise KubeError(resp.status, f"{method} {path}: {message}")
        return json.loads(data) if data else {}

    def get(self, path: str) -> dict[str, Any]:
        out: dict[str, Any] = self.request("GET", path)
        return out

    def read(self, path: str) -> tuple[int, bytes]:
        """GET ``path`` as answered: the status and the body undecoded, a refusal included (for paths
        that answer plain text, such as ``/readyz``). :class:`KubeError` (status 0) only when no answer
        came."""
        resp = self._call("GET", path)
        return int(resp.status), bytes(resp.read())

    def list(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        missing_ok: bool = False,
        field_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        """The items and the list's resourceVersion. With ``missing_ok`` a kind whose CRD is not
        installed (404) lists as empty, with no resourceVersion."""
        query = {"labelSelector": label_selector} if label_selector else {}
        if field_selector:
            query["fieldSelector"] = field_selector
        try:
            body = self.request("GET", path, query=query)
        except KubeError as exc:
            if missing_ok and exc.status == 404:
                return [], ""
            raise
        return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion", ""))

    def watch(
        self, path: str, resource_version: str, *, timeout_s: int, label_selector: str | None = None
    ) -> Watch:
        """Open a watch from ``resource_version``; the server ends it after ``timeout_s``."""
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
        return Watch(resp, path)

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

    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        """Bind a pod to a node (``pods/binding``); ``uid`` (when given) guards against a re-created pod;
        ``annotations`` go on the Binding, which the API server copies to the pod.
        A pod already on that node counts as bound (:func:`bound_already`)."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if annotations:
            meta["annotations"] = dict(annotations)
        try:
            self.create(
                binding(namespace, name),
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": meta,
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                },
            )
        except KubeError as exc:
            if not bound_already(exc, name, node):
                raise
