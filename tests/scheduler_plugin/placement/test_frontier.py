"""The queue's frontier (``scheduler_plugin.placement.frontier``): the dial's settings as written, and
the aim judged seed by seed against an anchor."""

from __future__ import annotations

import pytest

from scheduler_plugin.placement.frontier import (
    DEFAULT_SETTINGS,
    FrontierError,
    Setting,
    aim,
    mean_se,
    parse_settings,
)
from scheduler_plugin.placement.metrics import SIZE_CLASSES, size_class
from scheduler_plugin.queue import QueueConfig


def test_settings_in_seconds_multiples_and_both() -> None:
    got = parse_settings("0, 3600,2x,1800/0.5x")
    assert got == (
        Setting("0", 0.0, None),
        Setting("3600", 3600.0, None),
        Setting("2x", 0.0, 2.0),
        Setting("1800/0.5x", 1800.0, 0.5),
    )
    config = got[3].config(QueueConfig(preempt_after_s=None))
    assert (config.reserve_after_s, config.reserve_after_limits, config.preempt_after_s) == (
        1800.0,
        0.5,
        None,
    )
    assert len(parse_settings(DEFAULT_SETTINGS)) >= 3


def test_settings_with_an_idle_ratio_in_any_order() -> None:
    got = parse_settings("0.5i, 237600/0.25i, 0.25i/2x/3600")
    assert got == (
        Setting("0.5i", 0.0, None, 0.5),
        Setting("237600/0.25i", 237600.0, None, 0.25),
        Setting("0.25i/2x/3600", 3600.0, 2.0, 0.25),
    )
    config = got[1].config(QueueConfig())
    assert (config.reserve_after_s, config.reserve_after_limits, config.reserve_idle_ratio) == (
        237600.0,
        None,
        0.25,
    )
    assert parse_settings("3600")[0].config(QueueConfig(reserve_idle_ratio=1.0)).reserve_idle_ratio is None


def test_nofill_turns_fill_holes_off_and_is_a_dial_of_its_own() -> None:
    plain, nofill = parse_settings("21600/1i, nofill/1i/21600")
    assert (plain.fill_holes, nofill.fill_holes) == (True, False)
    assert nofill.config(QueueConfig()).fill_holes is False
    assert plain.config(QueueConfig(fill_holes=False)).fill_holes is True
    assert parse_settings("0/nofill")[0] == Setting("0/nofill", 0.0, None, None, False)


def test_mean_and_standard_error() -> None:
    assert mean_se([2.0]) == (2.0, None)
    mean, se = mean_se([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    assert se == pytest.approx((5 / 3 / 4) ** 0.5)


def test_size_classes_by_the_domain() -> None:
    assert [size_class(g, 72) for g in (1, 36, 37, 72, 73, 1152)] == [
        "small",
        "small",
        "one domain",
        "one domain",
        "several domains",
        "several domains",
    ]
    assert set(SIZE_CLASSES) == {"small", "one domain", "several domains"}


def runs(alloc: list[float], mean: list[float], top: list[float]) -> list[dict[str, object]]:
    return [
        {"allocation_ratio": a, "wait_mean_s": m, "wait_max_s": t}
        for a, m, t in zip(alloc, mean, top, strict=True)
    ]


def test_aim_takes_the_setting_good_on_all_three_at_once() -> None:
    anchor = runs([0.80, 0.82, 0.81], [100, 120, 110], [900, 1000, 950])
    ours = {
        "0": runs([0.85, 0.86, 0.85], [130, 150, 140], [500, 600, 550]),  # better alloc and max, worse mean
        "3600": runs([0.81, 0.83, 0.82], [90, 115, 100], [800, 950, 900]),  # at least as good on all
        "8x": runs([0.70, 0.70, 0.70], [50, 60, 55], [2000, 2100, 2050]),
    }
    verdict = aim(ours, anchor)
    assert verdict["setting"] == "3600"
    assert verdict["holds"] is True
    assert verdict["significant"] is True
    pairs = verdict["paired"]
    assert isinstance(pairs, dict)
    assert set(pairs) == {"allocation_ratio", "wait_mean_s", "wait_max_s"}


def test_aim_says_no_when_every_setting_loses_somewhere() -> None:
    anchor = runs([0.80, 0.82, 0.81], [100, 120, 110], [900, 1000, 950])
    ours = {
        "0": runs([0.85, 0.86, 0.85], [130, 150, 140], [500, 600, 550]),
        "8x": runs([0.70, 0.70, 0.70], [50, 60, 55], [2000, 2100, 2050]),
    }
    verdict = aim(ours, anchor)
    assert verdict["holds"] is False
    assert verdict["setting"] == "0"  # two of three not worse beats one of three
    assert verdict["within_noise"] is False  # its mean wait is worse by far more than two errors


def test_a_tie_within_noise_is_within_noise_but_does_not_hold() -> None:
    anchor = runs([0.80, 0.80, 0.80], [100, 100, 100], [900, 900, 900])
    ours = {"0": runs([0.80, 0.80, 0.80], [90, 120, 101], [900, 900, 900])}
    verdict = aim(ours, anchor)
    assert verdict["holds"] is False
    assert verdict["within_noise"] is True


def test_aim_without_comparable_figures_names_no_setting() -> None:
    verdict = aim({"0": [{"allocation_ratio": None}]}, [{"allocation_ratio": 0.5}])
    assert verdict["setting"] is None
    assert verdict["holds"] is False


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param("", "empty", id="empty"),
        pytest.param("0,,60", "empty", id="empty-between"),
        pytest.param("abc", "setting 1 ('abc'): not a number", id="word"),
        pytest.param("60,-5", "setting 2", id="negative"),
        pytest.param("nan", "finite", id="nan"),
        pytest.param("inf", "finite", id="inf"),
        pytest.param("1e999", "finite", id="overflow"),
        pytest.param("2xx", "setting 1 ('2xx'): not a number", id="double-x"),
        pytest.param("1x/2x", "two multiples", id="two-multiples"),
        pytest.param("60/120", "two numbers of seconds", id="two-seconds"),
        pytest.param("60/2x/3", "two numbers of seconds", id="seconds-twice-of-three"),
        pytest.param("60/2x/1i/3", "two numbers of seconds", id="seconds-twice-of-four"),
        pytest.param("60/2x/1i/nofill/3", "at most one", id="five-parts"),
        pytest.param("nofill/nofill", "nofill twice", id="nofill-twice"),
        pytest.param("no-fill", "not a number", id="nofill-misspelt"),
        pytest.param("1i/0.5i", "two idle ratios", id="two-ratios"),
        pytest.param("60/i", "not a number", id="ratio-without-number"),
        pytest.param("60/-1i", "setting 1", id="negative-ratio"),
        pytest.param("60/0.5i,0.5i/60", "the same dial as '60/0.5i'", id="repeat-reordered"),
        pytest.param("60,60.0", "the same dial as '60'", id="repeat"),
        pytest.param(",".join(str(k) for k in range(17)), "at most 16", id="too-many"),
        pytest.param("9" * 100_000 + "q", "...", id="100k-characters"),
    ],
)
def test_a_bad_setting_is_one_short_error_naming_it(text: str, needle: str) -> None:
    with pytest.raises(FrontierError) as err:
        parse_settings(text)
    assert needle in str(err.value)
    assert len(str(err.value)) < 300
