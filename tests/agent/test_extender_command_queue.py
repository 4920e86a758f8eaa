"""The extender command's queue wiring: the flags (``--preempt-after``, ``--reserve-after``,
``--queue-interval``) and the API calls the queue makes (node annotation merge patch, policy/v1
Eviction; a PodDisruptionBudget's 429 comes back as the refusal; the pod binding) against a small HTTP
server standing in for the API at the HTTP level."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from agent.commands import extender as extender_command
from agent.commands.extender import SOURCES, KubeCluster, Service, parse_settings
from scheduler_plugin.extender import GANG_PLANNED
from scheduler_plugin.queue import RESERVED_FOR
from topology import logs
from topology.kube import Kube, KubeError
from topology.kube.aio import AsyncKube


class Api:
    """Records (method, path, content type, body) and answers ``status`` per path."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, Any]] = []
        self.status: dict[str, int] = {}
        self.message: dict[str, str] = {}
        self.details: dict[str, Any] = {}  # path -> the Status's details
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                api.calls.append((self.command, self.path, self.headers.get("Content-Type", ""), body))
                code = api.status.get(self.path, 201 if self.command == "POST" else 200)
                reply: dict[str, Any] = {
                    "kind": "Status",
                    "code": code,
                    "message": api.message.get(self.path, f"answer {code}"),
                }
                if self.path in api.details:
                    reply["details"] = api.details[self.path]
                data = json.dumps(reply).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_PATCH = _answer  # noqa: N815 -- http.server's method names

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def api() -> Iterator[Api]:
    a = Api()
    a.thread.start()
    yield a
    a.server.shutdown()
    a.server.server_close()
    a.thread.join(5)


def _cluster(api: Api) -> KubeCluster:
    return KubeCluster(Kube(client.ApiClient(client.Configuration(host=api.url)), request_timeout_s=5))


def test_node_annotation_is_a_merge_patch_that_sets_and_removes(api: Api) -> None:
    kc = _cluster(api)
    kc.annotate_node("r0-t0", "ml/train")
    kc.annotate_node("r0-t0", None)
    assert [(m, p, t) for m, p, t, _ in api.calls] == [
        ("PATCH", "/api/v1/nodes/r0-t0", "application/merge-patch+json")
    ] * 2
    assert api.calls[0][3] == {"metadata": {"annotations": {RESERVED_FOR: "ml/train"}}}
    assert api.calls[1][3] == {"metadata": {"annotations": {RESERVED_FOR: None}}}


def test_a_nudge_is_a_merge_patch_of_the_pod_with_its_uid_and_a_pod_gone_is_left(api: Api) -> None:
    kc = _cluster(api)
    path = "/api/v1/namespaces/ml/pods/w-0"
    kc.annotate_pod("ml", "w-0", "uid-1", "4 pod(s) on 4 node(s) at 2026-12-02T03:00:00Z")
    assert api.calls[0][:3] == ("PATCH", path, "application/merge-patch+json")
    assert api.calls[0][3] == {
        "metadata": {
            "annotations": {GANG_PLANNED: "4 pod(s) on 4 node(s) at 2026-12-02T03:00:00Z"},
            "uid": "uid-1",  # another pod of that name now: the API answers 409
        }
    }
    for gone in (404, 409):
        api.status[path] = gone
        kc.annotate_pod("ml", "w-0", "uid-1", "x")
    api.status[path] = 500
    with pytest.raises(KubeError):
        kc.annotate_pod("ml", "w-0", "", "x")
    assert "uid" not in api.calls[-1][3]["metadata"]


def test_eviction_is_policy_v1_with_the_uid_and_a_budget_refusal_comes_back(api: Api) -> None:
    kc = _cluster(api)
    path = "/api/v1/namespaces/ml/pods/w-0/eviction"
    assert kc.evict("ml", "w-0", "uid-1") is None
    _, got, _, body = api.calls[0]
    assert got == path
    assert body["apiVersion"] == "policy/v1"
    assert body["kind"] == "Eviction"
    assert body["deleteOptions"] == {"preconditions": {"uid": "uid-1"}}
    api.status[path] = 429
    refused = kc.evict("ml", "w-0", "uid-1")
    assert refused is not None
    assert "PodDisruptionBudget" in refused
    api.status[path] = 404  # gone already: nothing to evict
    assert kc.evict("ml", "w-0", "") is None
    api.status[path] = 500
    with pytest.raises(KubeError):
        kc.evict("ml", "w-0", "uid-1")


def test_a_dry_run_eviction_asks_the_api_to_check_everything_and_evict_nothing(api: Api) -> None:
    kc = _cluster(api)
    path = "/api/v1/namespaces/ml/pods/w-0/eviction"
    assert kc.evict("ml", "w-0", "uid-1", dry_run=True) is None
    assert api.calls[0][3]["deleteOptions"] == {"preconditions": {"uid": "uid-1"}, "dryRun": ["All"]}
    api.status[path] = 429  # the budget refuses the dry run as it would the eviction
    api.details[path] = {  # where the API names the budget
        "causes": [
            {"reason": "DisruptionBudget", "message": "The disruption budget train-pdb needs 4 healthy pods"}
        ]
    }
    refused = kc.evict("ml", "w-0", "", dry_run=True)
    assert refused is not None
    assert "PodDisruptionBudget" in refused
    assert "The disruption budget train-pdb needs 4 healthy pods" in refused
    api.details[path] = {"causes": "garbage"}  # a Status of the wrong shape is still a refusal
    assert "PodDisruptionBudget" in (kc.evict("ml", "w-0", "", dry_run=True) or "")
    assert api.calls[1][3]["deleteOptions"] == {"dryRun": ["All"]}


def test_the_extender_reads_disruption_budgets_and_may_go_without() -> None:
    assert ("pdbs", "/apis/policy/v1/poddisruptionbudgets", True) in SOURCES


def test_preempt_namespaces_flag() -> None:
    assert parse_settings([]).preempt_namespaces is None  # default '*': every namespace
    assert parse_settings(["--preempt-namespaces", "ml, batch,"]).preempt_namespaces == {"ml", "batch"}
    assert parse_settings(["--preempt-namespaces", "*"]).preempt_namespaces is None


def test_queue_flags() -> None:
    s = parse_settings(["--preempt-after", "never", "--reserve-after", "30", "--queue-interval", "0.5"])
    assert s.preempt_after_s is None
    assert s.reserve_after_s == 30
    assert s.queue_interval_s == 0.5
    assert parse_settings([]).preempt_after_s == 600


def test_preemption_guard_flags_reach_the_queue_config() -> None:
    s = parse_settings(
        ["--preempt-loss-ratio", "any", "--min-run-before-preempt", "120", "--max-evictions", "3"]
    )
    q = s.queue_config()
    assert (q.preempt_loss_ratio, q.min_run_before_preempt_s, q.max_evictions) == (None, 120, 3)
    d = parse_settings([]).queue_config()
    assert (d.preempt_loss_ratio, d.min_run_before_preempt_s, d.max_evictions) == (1.0, 0.0, 1)
    assert parse_settings(["--max-evictions", "unlimited", "--preempt-loss-ratio", "0.5"]).queue_config() == (
        dataclasses.replace(d, max_evictions=None, preempt_loss_ratio=0.5)
    )


def test_time_limit_enforcement_flags_reach_the_extenders_state() -> None:
    d = parse_settings([])
    assert (d.enforce_time_limits, d.time_limit_grace_s) == ("held", 60.0)
    s = parse_settings(["--enforce-time-limits", "all", "--time-limit-grace", "15"])
    service = Service(s, client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    assert (service.state.inputs.enforce_time_limits, service.state.inputs.time_limit_grace_s) == (
        "all",
        15.0,
    )


def test_the_repair_wait_reaches_the_extenders_state() -> None:
    assert parse_settings([]).repair_wait_s == 1800.0
    s = parse_settings(["--repair-wait", "90"])
    service = Service(s, client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    assert service.state.inputs.repair_wait_s == 90.0


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        pytest.param(["--enforce-time-limits", "sometimes"], "--enforce-time-limits: invalid", id="enforce"),
        pytest.param(["--time-limit-grace", "-1"], "--time-limit-grace: must be", id="grace-negative"),
        pytest.param(["--time-limit-grace", "nan"], "--time-limit-grace: must be", id="grace-nan"),
        pytest.param(["--repair-wait", "-1"], "--repair-wait: must be", id="repair-wait-negative"),
        pytest.param(["--repair-wait", "inf"], "--repair-wait: must be", id="repair-wait-inf"),
        pytest.param(["--repair-wait", "nan"], "--repair-wait: must be", id="repair-wait-nan"),
        pytest.param(["--preempt-after", "soon"], "--preempt-after: expected seconds", id="preempt-word"),
        pytest.param(["--preempt-after", "-1"], "--preempt-after: must be", id="preempt-negative"),
        pytest.param(["--preempt-after", "inf"], "--preempt-after: must be", id="preempt-inf"),
        pytest.param(["--reserve-after", "-5"], "--reserve-after: must be", id="reserve-negative"),
        pytest.param(["--queue-interval", "0"], "--queue-interval: must be", id="interval-zero"),
        pytest.param(["--preempt-loss-ratio", "lots"], "--preempt-loss-ratio: expected", id="ratio-word"),
        pytest.param(["--preempt-loss-ratio", "nan"], "--preempt-loss-ratio: must be", id="ratio-nan"),
        pytest.param(["--preempt-loss-ratio", "-1"], "--preempt-loss-ratio: must be", id="ratio-negative"),
        pytest.param(["--max-evictions", "1.5"], "--max-evictions: expected", id="evictions-fraction"),
        pytest.param(["--max-evictions", "-1"], "--max-evictions: must be", id="evictions-negative"),
        pytest.param(["--max-evictions", "9" * 40], "--max-evictions: must be", id="evictions-huge"),
        pytest.param(["--min-run-before-preempt", "inf"], "--min-run-before-preempt: must", id="min-run-inf"),
        pytest.param(["--preempt-namespaces", ""], "--preempt-namespaces: expected", id="namespaces-empty"),
        pytest.param(
            ["--preempt-namespaces", " , "], "--preempt-namespaces: expected", id="namespaces-commas"
        ),
        pytest.param(["--preempt-namespaces", "ML"], "--preempt-namespaces: must be", id="namespaces-upper"),
        pytest.param(
            ["--preempt-namespaces", "a,*"], "--preempt-namespaces: must be", id="namespaces-star-in"
        ),
        pytest.param(
            ["--preempt-namespaces", "x" * 64], "--preempt-namespaces: must be", id="namespaces-long"
        ),
    ],
)
def test_bad_queue_flags_exit_2_with_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("on_loop", [True, False], ids=["event-loop-client", "sync-client-in-a-thread"])
def test_a_binding_is_the_same_post_from_either_client_and_a_refusal_comes_back(
    api: Api, on_loop: bool
) -> None:
    """The extender binds from its event loop (``AsyncKube``); a client configuration that one does not
    speak keeps the synchronous client in a worker thread. Both send the same ``pods/binding``."""
    api_client = client.ApiClient(client.Configuration(host=api.url))
    aio = AsyncKube.from_api_client(api_client) if on_loop else None
    assert (aio is not None) is on_loop
    kc = KubeCluster(Kube(api_client, request_timeout_s=5), aio)
    path = "/api/v1/namespaces/ml/pods/w-0/binding"

    async def bind() -> None:
        await kc.bind("ml", "w-0", "uid-1", "r0-t3")
        api.status[path] = 409
        with pytest.raises(KubeError) as exc:
            await kc.bind("ml", "w-0", "uid-1", "r0-t3")
        assert exc.value.status == 409
        assert "answer 409" in str(exc.value)
        if aio is not None:
            await aio.aclose()

    asyncio.run(bind())
    assert [(m, p) for m, p, _, _ in api.calls] == [("POST", path)] * 2
    assert api.calls[0][3] == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "w-0", "namespace": "ml", "uid": "uid-1"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "r0-t3"},
    }


@pytest.mark.parametrize("on_loop", [True, False], ids=["event-loop-client", "sync-client-in-a-thread"])
def test_a_binding_carries_the_chosen_subgroup_size_from_either_client(api: Api, on_loop: bool) -> None:
    """The subgroup size chosen for a ``subgroup-size: auto`` role rides on the Binding (the API
    server copies a Binding's annotations to the pod), the same from both clients."""
    api_client = client.ApiClient(client.Configuration(host=api.url))
    aio = AsyncKube.from_api_client(api_client) if on_loop else None
    kc = KubeCluster(Kube(api_client, request_timeout_s=5), aio)

    async def bind() -> None:
        await kc.bind("ml", "w-0", "uid-1", "r0-t3", {"gpuagent.dev/subgroup-size-chosen": "16"})
        if aio is not None:
            await aio.aclose()

    asyncio.run(bind())
    assert api.calls[0][3]["metadata"] == {
        "name": "w-0",
        "namespace": "ml",
        "uid": "uid-1",
        "annotations": {"gpuagent.dev/subgroup-size-chosen": "16"},
    }


@pytest.mark.parametrize("on_loop", [True, False], ids=["event-loop-client", "sync-client-in-a-thread"])
def test_a_binding_refused_as_already_on_that_node_is_bound_by_either_client(api: Api, on_loop: bool) -> None:
    """The API server's refusal of a second binding (409, ``pod NAME is already assigned to node
    "NODE"``): on the node asked for, the pod is bound (an earlier send of the binding was carried
    out); on another node it is a refusal. Both clients decide alike."""
    api_client = client.ApiClient(client.Configuration(host=api.url))
    aio = AsyncKube.from_api_client(api_client) if on_loop else None
    kc = KubeCluster(Kube(api_client, request_timeout_s=5), aio)
    path = "/api/v1/namespaces/ml/pods/w-0/binding"
    api.status[path] = 409
    said = 'Operation cannot be fulfilled on pods/binding "w-0": pod w-0 is already assigned to node "{}"'

    async def bind() -> None:
        api.message[path] = said.format("r0-t3")
        await kc.bind("ml", "w-0", "uid-1", "r0-t3")
        api.message[path] = said.format("r1-t0")
        with pytest.raises(KubeError) as exc:
            await kc.bind("ml", "w-0", "uid-1", "r0-t3")
        assert exc.value.status == 409
        assert 'already assigned to node "r1-t0"' in str(exc.value)
        if aio is not None:
            await aio.aclose()

    asyncio.run(bind())
    assert [(m, p) for m, p, _, _ in api.calls] == [("POST", path)] * 2


def test_the_extender_process_hands_the_gil_over_often(monkeypatch: pytest.MonkeyPatch) -> None:
    """``main`` sets the interpreter's switch interval (``GIL_SWITCH_INTERVAL_S``) so the event loop
    answering kube-scheduler waits less for threads running CPU-bound passes and informer events."""
    seen: list[float] = []
    monkeypatch.setattr(sys, "setswitchinterval", seen.append)
    monkeypatch.setattr(logs, "configure", lambda *a: None)
    monkeypatch.setattr(extender_command, "_run", lambda settings: _done())
    assert extender_command.main(["--addr", "127.0.0.1:0"]) == 0
    assert seen == [extender_command.GIL_SWITCH_INTERVAL_S]
    assert extender_command.GIL_SWITCH_INTERVAL_S < 0.005  # below the interpreter's default


async def _done() -> int:
    return 0
