"""Filter and prioritize answer ~10,000 candidates per call from kept pieces (``_filter_alone``'s last
answer per requested count, ``_rank_order``'s place per ranked node): these properties pin those answers
to the plain loop over the candidates, node by node, while informer events change the cluster between
calls (so a kept piece is used only while what it was worked out from is unchanged)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from scheduler_plugin.extender import ExtenderState
from scheduler_plugin.extender.filter import FilterOutcome
from scheduler_plugin.extender.prioritize import MAX_PRIORITY
from scheduler_plugin.queue import RESERVED_FOR
from tests.integration.fakekube import hypernode, node, pod

NAMES = [f"r{r}-t{t}" for r in range(2) for t in range(3)]
CANDIDATES = [*NAMES, "ghost-1", "ghost-2"]  # names the informer never reported

steps = st.lists(
    st.one_of(
        st.tuples(st.just("bind"), st.sampled_from(NAMES), st.integers(0, 4)),
        st.tuples(st.just("unbind"), st.integers(0, 20), st.just(0)),
        st.tuples(st.just("node"), st.sampled_from(NAMES), st.integers(0, 8)),
        st.tuples(st.just("drop"), st.sampled_from(NAMES), st.just(0)),
        st.tuples(
            st.just("check"),
            st.one_of(  # the same candidates again (a kept answer), or others; duplicates and unknowns
                st.sampled_from([CANDIDATES, NAMES, NAMES[:2]]),
                st.lists(st.sampled_from(CANDIDATES), max_size=12),
            ),
            st.integers(0, 6),
        ),
    ),
    max_size=25,
)


def plain_filter(
    s: ExtenderState, need: int, held: dict[str, int], caps: dict[str, int], names: list[str]
) -> FilterOutcome:
    """Filter's answer for a pod on its own as the per-node loop gives it."""
    out = FilterOutcome()
    for n in names:
        verdict = s.filter._verdict(n, need, held) if n in s.cache.nodes else None
        if verdict is not None:
            out.failed[n] = verdict
        elif n not in s.cache.nodes:
            out.failed[n] = "node unknown to the extender (informer not synced yet)"
        elif n in caps and caps[n] < need:
            out.failed[n] = (
                f"{need} GPU(s) requested; reserved for queued gang(s) starting before this pod's "
                f"time limit ends ({RESERVED_FOR}); {max(caps[n], 0)} usable"
            )
        else:
            out.passed.append(n)
    return out


def same_as_plain(
    s: ExtenderState, need: int, held: dict[str, int], caps: dict[str, int], names: list[str]
) -> None:
    want = plain_filter(s, need, held, caps, names)
    got = FilterOutcome()
    s.filter._alone(need, held, caps, names, got)
    assert (got.passed, got.failed) == (want.passed, want.failed)
    assert list(got.failed) == list(want.failed)  # the same order in the answer
    got.passed.append("changed by the caller")  # never the kept answer itself
    got.failed.clear()


def plain_scores(s: ExtenderState, need: int, names: list[str]) -> list[tuple[str, int]]:
    """Prioritize's scores for a pod on its own as the per-node loop gives them."""
    ranks = {n: k for n in s.cache.states if (k := s.prioritize._rank_key(n, need)) is not None}
    keys = [ranks.get(n) for n in names]
    order = {k: i for i, k in enumerate(sorted({k for k in keys if k is not None}))}
    span = max(1, len(order) - 1)
    return [
        (n, 0 if k is None else MAX_PRIORITY - (MAX_PRIORITY - 1) * order[k] // span)
        for n, k in zip(names, keys, strict=True)
    ]


def fresh_state() -> ExtenderState:
    s = ExtenderState()
    s.cache.replace("nodes", [node(n, 4) for n in NAMES])
    s.cache.replace(
        "hypernodes", [hypernode(f"nvl-{r}", 1, "nvlink", [f"r{r}-t{t}" for t in range(3)]) for r in range(2)]
    )
    return s


@given(
    steps,
    st.dictionaries(st.sampled_from(NAMES), st.integers(0, 4), max_size=4),
    st.dictionaries(st.sampled_from(CANDIDATES), st.integers(-2, 6), max_size=4),
)
def test_filter_and_prioritize_answer_as_the_plain_loop(
    plan: list[tuple[str, Any, Any]], held: dict[str, int], caps: dict[str, int]
) -> None:
    s = fresh_state()
    bound: list[dict[str, Any]] = []
    for i, (what, a, b) in enumerate(plan):
        if what == "bind":
            p = pod(f"run-{i}", b, node_name=a)
            p["status"] = {"phase": "Running"}
            s.cache.apply("pods", "ADDED", p)
            bound.append(p)
        elif what == "unbind" and bound:
            s.cache.apply("pods", "DELETED", bound.pop(a % len(bound)))
        elif what == "node":
            s.cache.apply("nodes", "ADDED", node(a, b))
        elif what == "drop":
            s.cache.apply("nodes", "DELETED", node(a, 0))
        if what != "check":  # after each change: a kept answer from before it is not used
            same_as_plain(s, 2, held, caps, CANDIDATES)
        if what == "check":
            names, need = a, b
            # the fast path itself, with holds and the queue's caps drawn freely
            # worked out, the kept answer, then other holds, caps or candidates (never the kept answer)
            for h, c, n in ((held, caps, names), (held, caps, names), ({}, caps, names), (held, {}, names)):
                same_as_plain(s, need, h, c, n)
            same_as_plain(s, need, held, caps, NAMES)
            same_as_plain(s, need, held, caps, CANDIDATES)
            # the verbs, for a pod the informer knows
            solo = pod(f"solo-{i}", need)
            s.cache.apply("pods", "ADDED", solo)
            out = s.filter(solo, names, 0.0)
            want = plain_filter(s, need, s.holds.held_gpus(), {}, names)
            assert (out.passed, out.failed, out.unresolvable) == (want.passed, want.failed, {})
            assert s.prioritize(solo, names, 0.0) == plain_scores(s, need, names)
            s.cache.apply("pods", "DELETED", solo)
