"""The kube-scheduler extender HTTP API over the pure ``ExtenderState``: filter, prioritize, bind.

Wire format (kube-scheduler ``extender/v1``; the Go structs have no JSON tags, so keys are the Go
field names): ``ExtenderArgs{Pod, Nodes, NodeNames}`` in, ``ExtenderFilterResult{Nodes, NodeNames,
FailedNodes, FailedAndUnresolvableNodes, Error}`` out; ``[{"Host", "Score"}]`` for prioritize;
``ExtenderBindingArgs{PodName, PodNamespace, PodUID, Node}`` in, ``{"Error"}`` out for bind;
``ExtenderPreemptionArgs{Pod, NodeNameToVictims, NodeNameToMetaVictims}`` in,
``ExtenderPreemptionResult{NodeNameToMetaVictims}`` out for preempt (victim sets kept only where they
take whole gangs; none for a gang's pod, whose preemption is the queue's).

The queue also runs on its own every ``queue_interval_s`` (its inputs taken under the state lock,
``QueueDriver.begin``; the decision made outside it; the result committed under it,
``QueueDriver.commit``, against the cluster's version): what it
decides outside a request (node annotations ``gpuagent.dev/reserved-for``, evictions of whole gangs
through the Eviction API, Events) is carried out through ``QueueCluster``. The health listener serves
the queue's metrics at ``GET /metrics``.

The HTTP connection handling (keep-alive, ``Content-Length`` bodies only, bounded heads and bodies;
head, body, idle and write timeouts; a connection cap that evicts the connections not answering a
request, never-served and longest-waiting first, so idle clients cannot take every slot; optionally TLS
that requires a client certificate signed by a given CA, kube-scheduler's extender ``tlsConfig``) is
``topology.httpserver``'s; this module keeps the routes, verbs and JSON limits, and answers errors as
``{"Error": ...}``. Bad input never stops it: undecodable JSON, JSON nested deeper than
``MAX_JSON_DEPTH`` or with a number longer than ``MAX_NUMBER_CHARS``, and a body that is not
``application/json`` get HTTP 400/415; input that decodes but makes no sense gets HTTP 200 with
``Error`` set, which kube-scheduler treats as a failed call for the pod. Bind calls of a gang wait at
the barrier (an open request each) until the gang completes or its deadline passes; a connection
answering a request is never evicted, so neither is a bind waiting there.

Nothing here blocks the event loop: a touch of ``ExtenderState`` runs on the loop only when the state
lock is free at once and the call is bounded by the request (no gang to plan); otherwise (planning a
gang can take seconds) in a worker thread under the lock. Large bodies are decoded in one too.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any, Protocol, TypeVar

from scheduler_plugin.cluster import pod_key
from scheduler_plugin.extender.bind import BindDecision
from scheduler_plugin.extender.clock import ApiClock
from scheduler_plugin.extender.outbox import EventRecord, Eviction, QueueActions
from scheduler_plugin.extender.state import ExtenderState
from scheduler_plugin.queueing import VictimsError, parse_victims
from topology import logs
from topology.httpserver import ConnectionStats, HttpServer, Limits, Request, Response

log = logs.get_logger("scheduler_plugin.extender")

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_JSON_DEPTH = 64  # a Pod with managedFields nests about 12 deep; json's own recursion fails near 1,000
MAX_NUMBER_CHARS = 32  # an int64 has 19 digits; Python's int() refuses over 4,300
INLINE_DECODE_BYTES = 64 * 1024  # larger bodies are decoded in a worker thread
QUEUE_PASS_SHARE = 4.0  # passes started by cluster changes at most every 4x a pass's duration
UNKNOWN_POD_GRACE_S = 0.5  # how long filter waits for the informer to report a pod the scheduler named
HEALTH_ROUTES = ("healthz", "livez", "readyz")
T = TypeVar("T")


class Cluster(Protocol):
    """The API calls the extender makes (in production, ``topology.kube`` behind the command's root)."""

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        """Bind the pod; on the event loop, so it must not block it (many may be in flight).
        ``annotations`` go on the Binding, which the API server copies to the pod."""

    def event(self, pod: Mapping[str, Any], *, reason: str, message: str, warning: bool) -> None: ...


class QueueCluster(Protocol):
    """The API calls the queue makes besides ``Cluster``'s."""

    def annotate_node(self, node: str, value: str | None) -> None:
        """Set (None: remove) the node's ``gpuagent.dev/reserved-for`` annotation."""

    def annotate_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        """Set the pod's ``gpuagent.dev/gang-planned`` annotation (only if it still has ``uid``)."""

    def evict(self, namespace: str, name: str, uid: str, *, dry_run: bool = False) -> str | None:
        """Evict a pod through the Eviction API: None when done (or the pod is gone), else why the API
        refused (a PodDisruptionBudget: HTTP 429). ``dry_run``: only ask whether it would be done."""


@dataclass(frozen=True)
class Text:
    """A response body that is not JSON (the metrics)."""

    content_type: str
    body: bytes


class BadRequestError(ValueError):
    pass


# -- bounded JSON ----------------------------------------------------------------------------------
_ESCAPES = (b"\\\\", b'\\"')  # an escaped backslash, an escaped quote: neither delimits a string
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_BRACKET_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 opens, -1 (signed) closes


def json_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects in ``body``, without recursion and in C loops.

    Escaped backslashes and quotes go first, so every quote left opens or closes a string; then
    everything but brackets and quotes; then adjacent quote pairs (the usual case: strings without
    brackets) and, if quotes remain, every other piece between them (brackets inside strings, and
    all after a quote left open). The brackets left become +1/-1 steps and the running sum's maximum
    is the depth. Exact for valid JSON; a body it misjudges is not JSON and fails to parse anyway.
    """
    plain = body.replace(_ESCAPES[0], b"").replace(_ESCAPES[1], b"").translate(None, _NOT_STRUCTURE)
    plain = plain.replace(b'""', b"")
    if b'"' in plain:
        plain = b"".join(plain.split(b'"')[::2])
    return max(accumulate(array("b", plain.translate(_BRACKET_STEP))), default=0)


def _number(text: str) -> str:
    if len(text) > MAX_NUMBER_CHARS:
        raise BadRequestError(
            f"body: a number of {len(text)} characters is over the limit of {MAX_NUMBER_CHARS}"
        )
    return text


def _int_literal(text: str) -> int:
    return int(_number(text))


def _float_literal(text: str) -> float:
    return float(_number(text))


def _no_constant(text: str) -> Any:
    raise BadRequestError(f"body: {text} is not JSON")


def decode_json(body: bytes) -> Any:
    """``body`` as JSON, or ``BadRequestError`` naming the limit: UTF-8 only, nesting at most
    ``MAX_JSON_DEPTH`` (checked before parsing, so the parser never recurses deeper), numbers at most
    ``MAX_NUMBER_CHARS`` characters (checked before conversion), no ``NaN``/``Infinity``."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequestError(f"body is not UTF-8: {exc}") from None
    depth = json_depth(body) if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH else 0
    if depth > MAX_JSON_DEPTH:
        raise BadRequestError(f"body: JSON nested {depth} deep is over the limit of {MAX_JSON_DEPTH}")
    try:
        return json.loads(
            text, parse_int=_int_literal, parse_float=_float_literal, parse_constant=_no_constant
        )
    except json.JSONDecodeError as exc:
        raise BadRequestError(f"body is not JSON: {exc}") from None
    except RecursionError:  # not reachable past the depth check; kept so no input can crash a request
        raise BadRequestError(f"body: JSON nested over the limit of {MAX_JSON_DEPTH}") from None


# -- request fields --------------------------------------------------------------------------------
def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequestError(f"{what}: expected a JSON object")
    return value


def _node_names(args: Mapping[str, Any]) -> tuple[list[str], list[dict[str, Any]] | None]:
    """Candidate node names, and the Node objects when the scheduler sent full ones."""
    names = args.get("NodeNames")
    if names is not None:
        # every entry a str, checked at C speed (10,000 names per call)
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise BadRequestError("NodeNames: expected a list of strings")
        return list(names), None
    nodes = args.get("Nodes")
    if nodes is None:
        return [], None
    items = _obj(nodes, "Nodes").get("items") or []
    if not isinstance(items, list):
        raise BadRequestError("Nodes.items: expected a list")
    objs = [_obj(n, f"Nodes.items[{i}]") for i, n in enumerate(items)]
    return [str((n.get("metadata") or {}).get("name", "")) for n in objs], objs


def _pod(args: Mapping[str, Any]) -> dict[str, Any]:
    pod = _obj(args.get("Pod"), "Pod")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise BadRequestError("Pod.metadata.name: missing")
    if not isinstance(meta.get("namespace", ""), str | None):
        raise BadRequestError("Pod.metadata.namespace: expected a string")
    return pod


@dataclass
class _Waiter:
    key: str
    future: asyncio.Future[str]


class Extender:
    """Request handlers. Every touch of ``state`` holds ``lock`` (informer threads share it); one that
    may plan a gang, or finds the lock busy, runs in a worker thread (see ``_locked``). ``clock``: the
    state's one clock, seconds since the epoch that never step back (default ``ApiClock()``)."""

    def __init__(
        self,
        *,
        state: ExtenderState,
        cluster: Cluster,
        lock: threading.Lock | None = None,
        clock: Callable[[], float] | None = None,
        ready: Callable[[], bool] = lambda: True,
        unknown_pod_grace_s: float = UNKNOWN_POD_GRACE_S,
        queue_cluster: QueueCluster | None = None,
    ) -> None:
        self.state = state
        self.cluster = cluster
        self.queue_cluster = queue_cluster
        self.lock = lock or threading.Lock()
        self.clock = clock if clock is not None else ApiClock()
        self.ready = ready
        self.unknown_pod_grace_s = unknown_pod_grace_s
        # waiters at a gang's barrier; registered under the state lock together with the "wait"
        # decision (in a worker thread), resolved on the loop: this small lock guards the dict only
        self._waiters: dict[str, list[_Waiter]] = {}
        self._waiters_lock = threading.Lock()
        self._background: set[asyncio.Task[None]] = set()
        self._queue_wanted = asyncio.Event()  # a filter saw a gang new to the queue: tick now

    async def _locked(self, fn: Callable[..., T], *args: Any, quick: Callable[[], bool] = lambda: True) -> T:
        """``fn(*args)`` under the state lock: at once on the loop when the lock is free and ``quick()``
        (asked under the lock) says the call is bounded by the request's size (a few milliseconds at
        most); otherwise in a worker thread, so neither a busy lock nor a long plan holds up the loop."""
        if self.lock.acquire(blocking=False):
            try:
                if quick():
                    return fn(*args)
            finally:
                self.lock.release()

        def call() -> T:
            with self.lock:
                return fn(*args)

        return await asyncio.to_thread(call)

    # -- verbs ---------------------------------------------------------------------------------
    def _note_synced(self) -> None:
        """The queue reads the cluster (and rebuilds its reservations) once every informer has listed."""
        if not self.state.cache.synced and self.ready():
            self.state.cache.synced = True

    async def filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        pod = _pod(args)
        names, objs = _node_names(args)
        self._note_synced()

        def quick() -> bool:
            return not self.state.filter.may_take_long(pod)

        out = await self._locked(self.state.filter, pod, names, self.clock(), quick=quick)
        # kube-scheduler may name a pod a moment before the extender's informer reports it: ask again
        # for a little while (off the loop) so a real pod is not refused for that; a forged one still is
        for _ in range(int(self.unknown_pod_grace_s / 0.05) if out.unseen else 0):
            await asyncio.sleep(0.05)
            out = await self._locked(self.state.filter, pod, names, self.clock(), quick=quick)
            if not out.unseen:
                break
        if out.wake_queue:
            self._queue_wanted.set()
        self._record(out.events)
        passed = set(out.passed)
        result: dict[str, Any] = {
            "Nodes": None,
            "NodeNames": None,
            "FailedNodes": out.failed,
            "FailedAndUnresolvableNodes": out.unresolvable,
            "Error": out.error,
        }
        if objs is None:
            result["NodeNames"] = (
                out.passed if len(passed) == len(out.passed) else [n for n in names if n in passed]
            )
        else:
            result["Nodes"] = {
                "items": [o for o, n in zip(objs, names, strict=True) if n in passed],
            }
        return result

    async def prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        pod = _pod(args)
        names, _ = _node_names(args)
        scores = await self._locked(
            self.state.prioritize, pod, names, self.clock(), quick=self.state.cache.domains_known
        )
        return [{"Host": h, "Score": s} for h, s in scores]

    async def bind(self, args: Mapping[str, Any]) -> dict[str, Any]:
        fields = {}
        for k in ("PodName", "PodNamespace", "PodUID", "Node"):
            v = args.get(k, "")
            if not isinstance(v, str):
                raise BadRequestError(f"{k}: expected a string")
            fields[k] = v
        if not fields["PodName"] or not fields["Node"]:
            raise BadRequestError("PodName and Node are required")
        key = f"{fields['PodNamespace'] or 'default'}/{fields['PodName']}"
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def decide() -> BindDecision:  # under the state lock
            decision = self.state.bind(
                fields["PodNamespace"], fields["PodName"], fields["PodUID"], fields["Node"], self.clock()
            )
            if decision.action == "wait":  # registered before any later call can complete the gang
                with self._waiters_lock:
                    self._waiters.setdefault(decision.gang, []).append(_Waiter(key, fut))
            return decision

        decision = await self._locked(decide)
        if decision.action == "error":
            log.warning("bind_refused", pod=key, node=fields["Node"], error=decision.error)
        return {"Error": await self._carry_out(decision, key, fut)}

    async def preempt(self, args: Mapping[str, Any]) -> dict[str, Any]:
        pod = _pod(args)
        try:
            victims = parse_victims(args)
        except VictimsError as exc:
            raise BadRequestError(str(exc)) from None
        kept = await self._locked(
            self.state.preempt, pod, victims, self.clock(), quick=lambda: len(victims) <= 1000
        )
        return {"NodeNameToMetaVictims": kept}

    # -- the queue -----------------------------------------------------------------------------
    async def queue_once(self) -> QueueActions:
        """One tick of the queue (a pass when due) and what it decided carried out."""
        started = time.perf_counter()
        job = await self._locked(self.state.queue.begin, self.clock(), quick=lambda: False)
        if job is None:
            actions = await self._locked(self.state.queue.take_actions, quick=lambda: False)
        else:  # the decision on the pass's immutable inputs, outside the lock: the verbs go on meanwhile
            decision = await asyncio.to_thread(job.decide)
            actions = await self._locked(self.state.queue.commit, job, decision, quick=lambda: False)
            # passes on changes: a quarter of the time at most
            self.state.queue.min_gap_s = QUEUE_PASS_SHARE * (time.perf_counter() - started)
        await self.carry_out_queue(actions)
        return actions

    async def run_queue(self, stop: asyncio.Event, interval_s: float = 1.0) -> None:
        """Tick the queue every ``interval_s`` until ``stop``, once the informers are synced (a restart
        rebuilds the reservations from what they list). While it runs, filters leave the cluster's
        changes and new gangs to it (``QueueDriver.due``): a filter of a new gang's pod ticks it at once."""
        self.state.queue.loop = True
        while not stop.is_set():
            self._note_synced()
            if self.state.cache.synced:
                try:
                    await self.queue_once()
                except Exception:  # a bug in one tick is logged; the next tick runs
                    log.exception("queue_tick_failed")
            await _pause(stop, self._queue_wanted, interval_s)

    async def carry_out_queue(self, actions: QueueActions) -> None:
        self._record(actions.events)
        qc = self.queue_cluster
        if qc is None:
            return
        for node, value in sorted(actions.annotate.items()):
            try:
                await asyncio.to_thread(qc.annotate_node, node, value)
                log.info("node_reservation_annotated", node=node, reserved_for=value)
            except Exception as exc:  # the next tick tries again: the annotation still differs
                log.warning("node_annotation_failed", node=node, error=_short(exc))
        for pod, value in actions.nudges:
            meta = pod.get("metadata") or {}
            ns, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
            try:
                await asyncio.to_thread(qc.annotate_pod, ns, name, str(meta.get("uid") or ""), value)
                log.info("gang_pod_nudged", pod=f"{ns}/{name}", planned=value)
            except Exception as exc:  # kube-scheduler's own flush retries it later
                log.warning("gang_pod_nudge_failed", pod=f"{ns}/{name}", error=_short(exc))
        batches: dict[str, list[Eviction]] = {}
        for ev in actions.evictions:
            batches.setdefault(ev.preemptor, []).append(ev)
        for preemptor, evictions in batches.items():
            if any(ev.check_first for ev in evictions) and not await self._evictions_allowed(
                qc, preemptor, evictions
            ):
                continue
            await self._evict(qc, evictions)

    async def _evictions_allowed(self, qc: QueueCluster, preemptor: str, evictions: list[Eviction]) -> bool:
        """Whether the API would make every eviction of a preemption (each tried as a dry run first): a
        refusal of one means none is made, so no victim is left half-evicted; its victims sit out a
        while (``Preempt.blocked_by_api``) and each pod's Event says what refused it."""

        def dry_runs() -> tuple[Eviction, str] | None:
            for ev in evictions:
                ns, name, uid = _pod_ref(ev.pod)
                try:
                    refused = qc.evict(ns, name, uid, dry_run=True)
                except Exception as exc:
                    refused = f"eviction failed: {_short(exc)}"
                if refused is not None:
                    return ev, refused
            return None

        found = await asyncio.to_thread(dry_runs)
        if found is None:
            return True
        ev, refused = found
        victims = sorted({e.victim for e in evictions})
        ns, name, _ = _pod_ref(ev.pod)
        why = f"the eviction of pod {ns}/{name} ({ev.victim}) would be refused: {refused}"
        await self._locked(self.state.preempt.blocked_by_api, preemptor, victims, self.clock(), why)
        await self._locked(self.state.preempt.eviction_refused, pod_key(ev.pod))
        log.warning("preemption_blocked", gang=preemptor, victims=victims, pod=f"{ns}/{name}", error=refused)
        message = (
            f"not evicted: {why}; no pod of {', '.join(victims)} is evicted for {preemptor}, other victims "
            f"are sought ({ev.message})"
        )
        self._record([EventRecord(pod=e.pod, reason="PreemptionBlocked", message=message) for e in evictions])
        return False

    async def _evict(self, qc: QueueCluster, evictions: list[Eviction]) -> None:
        for ev in evictions:
            ns, name, uid = _pod_ref(ev.pod)
            try:
                refused = await asyncio.to_thread(qc.evict, ns, name, uid)
            except Exception as exc:
                refused = f"eviction failed: {_short(exc)}"
            if refused is None:
                await self._locked(self.state.preempt.eviction_done, f"{ns}/{name}")
                log.info("pod_evicted", pod=f"{ns}/{name}", gang=ev.victim, reason=ev.message)
                self._record([EventRecord(pod=ev.pod, reason=ev.reason, message=ev.message)])
            else:
                await self._locked(self.state.preempt.eviction_refused, f"{ns}/{name}")
                log.warning("eviction_refused", pod=f"{ns}/{name}", gang=ev.victim, error=refused)
                self._record(
                    [
                        EventRecord(
                            pod=ev.pod,
                            reason="PreemptionBlocked",
                            message=f"not evicted: {refused}; asked again later ({ev.message})",
                        )
                    ]
                )

    # -- the barrier ---------------------------------------------------------------------------
    async def _carry_out(self, decision: BindDecision, key: str, fut: asyncio.Future[str]) -> str:
        self._record(decision.events)
        if decision.action == "error":  # this pod only; the rest of its gang keeps waiting
            return decision.error
        if decision.action == "bind":
            errors = await self._bind_all(decision)
            self._resolve(decision.gang, errors, "")
            return errors.get(key, "")
        while True:
            timeout = max(0.0, decision.deadline - self.clock())
            try:
                return await asyncio.wait_for(asyncio.shield(fut), timeout)
            except TimeoutError:
                if fut.done():
                    return fut.result()
                decision = await self._locked(self.state.bind.barrier_timeout, decision.gang, self.clock())
                if fut.done():  # another waiter's timeout or the last bind resolved it meanwhile
                    return fut.result()
                if decision.action == "wait":
                    continue
                self._record(decision.events)
                if decision.action == "bind":
                    errors = await self._bind_all(decision)
                    self._resolve(decision.gang, errors, "")
                else:
                    self._resolve(decision.gang, {}, decision.error)
                return await fut

    async def _bind_all(self, decision: BindDecision) -> dict[str, str]:
        async def one(key: str, uid: str, node: str) -> tuple[str, str]:
            ns, name = key.split("/", 1)
            try:
                await self.cluster.bind(ns, name, uid, node, decision.annotations.get(key))
            except Exception as exc:  # an API failure is that pod's bind error
                return key, f"binding {key} to {node} failed: {_short(exc)}"
            return key, ""

        results = await asyncio.gather(*(one(*p) for p in decision.pods))
        errors = {k: e for k, e in results if e}
        self._record([e for e in decision.bound_events if pod_key(e.pod) not in errors])
        if errors:
            await self._locked(self.state.bind.failed, decision.gang, errors)
            log.warning("bind_failed", gang=decision.gang, errors=errors)
        else:
            log.info("pods_bound", gang=decision.gang or None, pods=[k for k, _, _ in decision.pods])
        if not decision.gang:
            for k, _, n in decision.pods:
                if k not in errors:
                    await self._locked(self.state.bind.assume_bound, k, n)
        return errors

    def _resolve(self, gang: str, errors: Mapping[str, str], error: str) -> None:
        with self._waiters_lock:
            waiters = self._waiters.pop(gang, []) if gang else []
        for w in waiters:
            if not w.future.done():
                w.future.set_result(errors.get(w.key, error))

    def _record(self, events: tuple[EventRecord, ...] | list[EventRecord]) -> None:
        if not events:
            return
        for ev in events:
            task = asyncio.get_running_loop().create_task(self._send_event(ev))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _send_event(self, ev: EventRecord) -> None:
        try:
            await asyncio.to_thread(
                self.cluster.event, ev.pod, reason=ev.reason, message=ev.message, warning=ev.warning
            )
        except Exception as exc:  # an Event that cannot be recorded is logged, never fatal
            log.warning("event_failed", reason=ev.reason, error=_short(exc))

    async def drain(self) -> None:
        """Answer every waiting bind with an error (shutdown) and let pending Events finish."""
        with self._waiters_lock:
            gangs = list(self._waiters)
        for gang in gangs:
            self._resolve(gang, {}, "extender shutting down")
        if self._background:
            await asyncio.wait(list(self._background), timeout=5)

    # -- HTTP dispatch -------------------------------------------------------------------------
    async def dispatch_health(
        self, method: str, path: str, body: bytes, content_type: str = ""
    ) -> tuple[int, Any]:
        """The health listener: ``GET /healthz``, ``/livez``, ``/readyz`` and nothing else."""
        route = path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if method == "GET" and route in HEALTH_ROUTES:
            return _health(route, self.ready)
        if method == "GET" and route == "metrics":
            body = await self._locked(self.state.queue.metrics_text)
            return 200, Text("text/plain; version=0.0.4; charset=utf-8", body)
        return 404, {
            "Error": f"unknown path {path}; this listener serves GET healthz, livez, readyz and metrics"
        }

    async def dispatch(
        self, method: str, path: str, body: bytes, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        route = path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if method == "GET" and route in HEALTH_ROUTES:
            return _health(route, self.ready)
        handlers = {
            "filter": self.filter,
            "prioritize": self.prioritize,
            "bind": self.bind,
            "preempt": self.preempt,
        }
        handler = handlers.get(route)
        if handler is None:
            return 404, {"Error": f"unknown path {path}; POST filter, prioritize, bind or preempt"}
        if method != "POST":
            return 405, {"Error": f"{route}: POST only"}
        media = content_type.split(";", 1)[0].strip().lower()
        if media != "application/json":
            return 415, {"Error": f"{route}: Content-Type {content_type[:100]!r}; send application/json"}
        try:
            if len(body) > INLINE_DECODE_BYTES:
                args = await asyncio.to_thread(decode_json, body)
            else:
                args = decode_json(body)
        except BadRequestError as exc:
            log.warning("bad_request", verb=route, error=str(exc)[:300])
            return 400, {"Error": f"{route}: {exc}"}
        try:
            return 200, await handler(_obj(args, "body"))
        except BadRequestError as exc:
            log.warning("bad_request", verb=route, error=str(exc))
            if route in ("prioritize", "preempt"):  # results without an Error field
                return 400, {"Error": f"{route}: {exc}"}
            return 200, {"Error": f"{route}: {exc}"}
        except Exception as exc:  # a bug answers this request, never stops the server
            log.exception("handler_failed", verb=route)
            return 500, {"Error": f"{route}: internal error: {_short(exc)}"}


async def _pause(stop: asyncio.Event, wanted: asyncio.Event, interval_s: float) -> None:
    """Until the queue loop's next tick: ``interval_s``, ``stop``, or ``wanted`` (a filter saw a gang new
    to the queue, ``FilterOutcome.wake_queue``)."""
    waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wanted.wait())}
    try:
        await asyncio.wait(waits, timeout=interval_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    wanted.clear()


def _health(route: str, ready: Callable[[], bool]) -> tuple[int, Any]:
    """A health route's answer: ``readyz`` is ready once ``ready()`` (the informers synced)."""
    if route == "readyz":
        ok = ready()
        return (200 if ok else 503), {"status": "ok" if ok else "informers not synced"}
    return 200, {"status": "ok"}


def _pod_ref(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    """(namespace, name, uid) of a pod to evict."""
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name")), str(meta.get("uid") or "")


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


# -- TLS -------------------------------------------------------------------------------------------
def server_tls_context(cert: Path, key: Path, client_ca: Path) -> ssl.SSLContext:
    """A server context that requires a client certificate signed by ``client_ca`` (TLS 1.2 or newer):
    the other half of kube-scheduler's extender ``tlsConfig`` (certFile, keyFile, caFile).
    Raises ``OSError``/``ssl.SSLError`` when a file cannot be read or does not match."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(client_ca))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


# -- HTTP server -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerLimits:
    """How long a client may take and how many connections there may be (the connection handling
    itself is ``topology.httpserver``'s).

    ``idle_timeout_s`` is longer than Go's default ``IdleConnTimeout`` (90 s), so kube-scheduler closes
    its idle keep-alive connections before the server does (a POST on a connection the server just
    closed is not retried by Go's client). At ``max_connections`` a new connection evicts one that is
    not answering a request (never-served first, then the longest waiting); only when every one is
    busy (binds waiting at a barrier) is the new one refused with 503.
    """

    header_timeout_s: float = 10.0  # a request head, from connect (a kept-alive one: its first byte)
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 120.0  # between keep-alive requests
    write_timeout_s: float = 30.0
    max_connections: int = 1024


def _json_response(status: int, payload: Any) -> Response:
    return Response(status, "application/json", json.dumps(payload, separators=(",", ":")).encode())


def _json_error(status: int, reason: str) -> Response:
    return _json_response(status, {"Error": reason})


class ExtenderServer:
    """``Extender.dispatch`` (or, ``health_only``, its health routes alone) over a
    ``topology.httpserver.HttpServer``; errors are answered as ``{"Error": ...}``. ``start``/``stop``
    for tests and main."""

    def __init__(
        self,
        extender: Extender,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        limits: ServerLimits = ServerLimits(),
        tls: ssl.SSLContext | None = None,
        health_only: bool = False,
    ) -> None:
        self.extender = extender
        self.limits = limits
        self.handler = extender.dispatch_health if health_only else extender.dispatch
        self._http = HttpServer(
            name="health" if health_only else "extender",
            handler=self._handle,
            limits=Limits(
                head_s=limits.header_timeout_s,
                body_s=limits.body_timeout_s,
                idle_s=limits.idle_timeout_s,
                write_s=limits.write_timeout_s,
                max_connections=limits.max_connections,
                max_body_bytes=max_body_bytes,
            ),
            log=log,
            error_response=_json_error,
            tls=tls,
            answer_when_full=True,
        )

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def connections(self) -> int:
        return self._http.open_connections

    @property
    def stats(self) -> ConnectionStats:
        return self._http.stats

    async def start(self, host: str, port: int) -> None:
        await self._http.start(host, port)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, answer every bind waiting at a barrier (shutdown), then close connections,
        giving those still answering ``grace_s``."""
        self._http.stop_accepting()
        await self.extender.drain()
        await self._http.stop(grace_s)

    async def _handle(self, request: Request, body: bytes) -> Response:
        status, payload = await self.handler(request.method, request.path, body, request.content_type)
        if isinstance(payload, Text):
            return Response(status, payload.content_type, payload.body)
        return _json_response(status, payload)
