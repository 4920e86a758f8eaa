"""The queue's trade-off as a frontier: our queue at several settings of its dial, each anchor at its own.

Holding nodes for the head of the queue bounds large gangs' waits and lifts allocation; a greedy queue
lets small jobs pass and starves large gangs. The dial is when a waiting gang starts to hold anything
back (``scheduler_plugin.queue.QueueConfig``): ``reserve_after_s`` (after S seconds) and
``reserve_after_limits`` (after K times its own time limit; the later of the two when both are set),
and ``reserve_idle_ratio`` (R: a gang those keep from holding holds at once all the same when its hold
keeps idle at most R times the GPU-time it will run itself). Besides the dial, ``nofill`` turns
``fill_holes`` off (a gang that ends before a reservation's start is then not offered that
reservation's idle capacity first). A setting is written as up to four parts joined by ``/``, each at
most once: ``S`` (``3600``), ``Kx`` (``2x``), ``Ri`` (``0.25i``), ``nofill``; e.g. ``3600/2x``,
``345600/0.02i``, ``21600/1i/nofill``.

The aim, per anchor: one setting of ours at least as good on allocation, mean wait and largest wait
at once, judged seed by seed on the same job streams (``metrics.paired``): the mean difference, ours
minus the anchor, is not worse on any of the three figures (``holds``). Weaker, ``within_noise``: no
figure is worse by two standard errors or more (a difference the seeds cannot tell from zero);
stronger, ``significant``: it holds and at least one figure is better by two standard errors.

Pure: no I/O; the benchmark (``agent.benchmarks.placement``) runs the simulations and renders this.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from scheduler_plugin.placement.metrics import BETTER, paired
from scheduler_plugin.queue import QueueConfig, QueueError

AIM_FIGURES: tuple[str, ...] = ("allocation_ratio", "wait_mean_s", "wait_max_s")
DEFAULT_SETTINGS = "0,3600,43200,86400,172800,237600,345600,1x,3600/2x,345600/0.02i,21600/1i/nofill"
MAX_SETTINGS = 16
_SHOWN = 40  # characters of a bad setting an error message shows
_NOFILL = "nofill"
_KINDS = {"": "numbers of seconds", "x": "multiples of the time limit", "i": "idle ratios"}


class FrontierError(ValueError):
    """A bad ``--frontier-settings`` value; the message names the setting."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting of our queue's dial: ``label`` as written, the ``QueueConfig`` fields it sets."""

    label: str
    reserve_after_s: float = 0.0
    reserve_after_limits: float | None = None
    reserve_idle_ratio: float | None = None
    fill_holes: bool = True

    def config(self, base: QueueConfig) -> QueueConfig:
        return replace(
            base,
            reserve_after_s=self.reserve_after_s,
            reserve_after_limits=self.reserve_after_limits,
            reserve_idle_ratio=self.reserve_idle_ratio,
            fill_holes=self.fill_holes,
        )

    @property
    def dial(self) -> tuple[float, float | None, float | None, bool]:
        return (self.reserve_after_s, self.reserve_after_limits, self.reserve_idle_ratio, self.fill_holes)


def _number(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise FrontierError(f"{where}: not a number of seconds S, a multiple Kx or a ratio Ri") from None
    if not math.isfinite(value) or value < 0:
        raise FrontierError(f"{where}: each number must be finite and >= 0")
    return value


def parse_settings(text: str) -> tuple[Setting, ...]:
    """Settings separated by commas (at most ``MAX_SETTINGS``, no two the same dial), each up to four
    parts joined by ``/``, each kind at most once: ``S`` seconds, ``Kx`` times the time limit, ``Ri``
    idle ratio, ``nofill`` (module docstring)."""
    tokens = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in tokens):
        raise FrontierError(f"an empty setting in {text[:_SHOWN]!r}; give e.g. {DEFAULT_SETTINGS}")
    if len(tokens) > MAX_SETTINGS:
        raise FrontierError(f"{len(tokens)} settings; at most {MAX_SETTINGS}")
    out: list[Setting] = []
    seen: dict[tuple[float, float | None, float | None, bool], str] = {}
    for k, token in enumerate(tokens, start=1):
        shown = token if len(token) <= _SHOWN else token[:_SHOWN] + "..."
        where = f"setting {k} ({shown!r})"
        parts = token.split("/")
        if len(parts) > len(_KINDS) + 1:
            raise FrontierError(f"{where}: at most one S, one Kx, one Ri and nofill, as S/Kx/Ri/nofill")
        got: dict[str, float] = {}
        fill = True
        for part in parts:
            if part == _NOFILL:
                if not fill:
                    raise FrontierError(f"{where}: {_NOFILL} twice")
                fill = False
                continue
            kind = part[-1:] if part[-1:] in _KINDS else ""
            if kind in got:
                raise FrontierError(f"{where}: two {_KINDS[kind]}")
            got[kind] = _number(part[: len(part) - len(kind)], where)
        setting = Setting(token, got.get("", 0.0), got.get("x"), got.get("i"), fill)
        try:
            setting.config(QueueConfig())
        except QueueError as err:
            raise FrontierError(f"{where}: {err}") from None
        if setting.dial in seen:
            raise FrontierError(f"{where}: the same dial as {seen[setting.dial]!r}")
        seen[setting.dial] = token
        out.append(setting)
    return tuple(out)


def mean_se(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and its standard error (None for one value)."""
    if not values:
        raise ValueError("mean_se of no values")
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _judge(figs: Mapping[str, Mapping[str, object]]) -> tuple[bool, bool, bool, int, float]:
    """One setting against one anchor from its paired figures: holds, within noise, significant (module
    docstring), figures not worse, and the sum of the relative margins (positive: ours better)."""
    holds = within_noise = True
    better = not_worse = 0
    margin = 0.0
    for key in AIM_FIGURES:
        pair = figs[key]
        signed = (_num(pair["diff_mean"]) or 0.0) * BETTER[key]
        se = _num(pair["diff_se"])
        if signed >= 0:
            not_worse += 1
        else:
            holds = False
            if se is None or -signed >= 2 * se:
                within_noise = False
        if signed > 0 and pair["significant"] is True:
            better += 1
        margin += (_num(pair["relative"]) or 0.0) * BETTER[key]
    return holds, within_noise, holds and better > 0, not_worse, margin


def aim(
    ours: Mapping[str, Sequence[Mapping[str, object]]], anchor: Sequence[Mapping[str, object]]
) -> dict[str, object]:
    """The best setting of ``ours`` (setting label -> runs, seed by seed) against ``anchor``'s runs on
    the same seeds: one that holds (ranked by significant, then the sum of relative margins), else the
    one closest to it (within noise, then most figures not worse, then the margin). Returns the
    setting, ``holds``, ``within_noise``, ``significant`` and the paired figures of ``AIM_FIGURES``; ``None``
    as the setting when no figure could be compared."""
    best: tuple[tuple[bool, bool, bool, int, float], str, dict[str, Mapping[str, object]]] | None = None
    for label, runs in ours.items():
        pairs = paired(runs, anchor)
        figs: dict[str, Mapping[str, object]] = {}
        for key in AIM_FIGURES:
            pair = pairs.get(key)
            if isinstance(pair, Mapping):
                figs[key] = pair
        if len(figs) < len(AIM_FIGURES):
            continue
        holds, within_noise, significant, not_worse, margin = _judge(figs)
        rank = (holds, within_noise, significant, not_worse, margin)
        if best is None or rank > best[0]:
            best = (rank, label, figs)
    if best is None:
        return {"setting": None, "holds": False, "within_noise": False, "significant": False, "paired": {}}
    (holds, within_noise, significant, _, _), label, figs = best
    return {
        "setting": label,
        "holds": holds,
        "within_noise": within_noise,
        "significant": significant,
        "paired": figs,
    }
