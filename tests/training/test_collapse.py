"""Collapse early warnings on hand-made metric histories: what fires, at which step, and what must not."""

import math
import random

import pytest

from configs.schema import CollapseConfig
from training.rl.collapse import CollapseReport, CollapseWarning, detect_collapse, reward_drop_step, signal_series

CFG = CollapseConfig(entropy_drop=0.5)  # baseline_steps 3, window 3; the rules, not the calibrated defaults


def healthy(n: int, seed: int = 0) -> list[dict]:
    """Noisy but flat metrics, steps 1..n."""
    rng = random.Random(seed)
    return [
        {
            "step": step,
            "actor/entropy": 1.0 + rng.uniform(-0.15, 0.15),
            "reward/group_std_unsolved": 0.4 + rng.uniform(-0.08, 0.08),
            "rollout/stuck_frac": 0.5 + rng.uniform(-0.1, 0.1),
            "rollout/repeat_rate_failed": 0.1 + rng.uniform(-0.05, 0.05),
            "actor/kl_ref": 0.05 + rng.uniform(-0.02, 0.02),
            "actor/approx_kl": 0.01 + rng.uniform(-0.005, 0.005),
            "actor/clip_frac": 0.1 + rng.uniform(-0.05, 0.05),
            "actor/grad_norm": 1.0 + rng.uniform(-0.4, 0.4),
            "reward/total/mean": 0.5 + rng.uniform(-0.05, 0.05),
        }
        for step in range(1, n + 1)
    ]


def with_values(history: list[dict], key: str, values: dict[int, float | None]) -> list[dict]:
    """A copy of `history` with `key` set at the given steps (None: the step did not record it)."""
    out = [dict(row) for row in history]
    for row in out:
        if row["step"] in values:
            if values[row["step"]] is None:
                row.pop(key, None)
            else:
                row[key] = values[row["step"]]
    return out


def fired(report: CollapseReport) -> dict[str, CollapseWarning]:
    return {w.signal: w for w in report.warnings}


def test_healthy_noisy_history_fires_nothing():
    for seed in range(5):
        report = detect_collapse(healthy(30, seed), CFG)
        assert report.warnings == [] and not report.collapsed, report.to_markdown()
        assert report.first_warning_step is None and report.reward_drop_step is None and report.steps == 30
        assert report.notes == []


def test_entropy_collapse_fires_at_the_step_completing_the_window():
    h = with_values(healthy(15), "actor/entropy", {1: 1.0, 2: 1.0, 3: 1.0} | {s: 0.3 for s in range(6, 16)})
    w = fired(detect_collapse(h, CFG))["actor/entropy"]
    assert (w.first_step, w.value, w.baseline, w.threshold) == (8, 0.3, pytest.approx(1.0), pytest.approx(0.5))
    assert "actor/entropy" in w.message and "step 8" in w.message


def test_entropy_dips_shorter_than_the_window_do_not_fire():
    h = with_values(healthy(15), "actor/entropy", {1: 1.0, 2: 1.0, 3: 1.0, 6: 0.3, 8: 0.3, 9: 0.3, 12: 0.2, 13: 0.2})
    assert "actor/entropy" not in fired(detect_collapse(h, CFG))
    # steps 8-9 complete a run of 2
    assert "actor/entropy" in fired(detect_collapse(h, CollapseConfig(window=2, entropy_drop=0.5)))


def test_reward_std_decay_fires():
    decay = {s: 0.4 * 0.7 ** (s - 4) for s in range(5, 21)}  # below 0.4 * 0.4 = 0.16 from step 7 (0.137)
    h = with_values(healthy(20), "reward/group_std_unsolved", {1: 0.4, 2: 0.4, 3: 0.4} | decay)
    w = fired(detect_collapse(h, CFG))["reward/group_std_unsolved"]
    assert w.first_step == 9 and w.value == pytest.approx(0.4 * 0.7**5) and w.threshold == pytest.approx(0.16)


def test_repeat_rate_is_absolute_and_judged_from_the_first_step():
    h = with_values(healthy(10), "rollout/repeat_rate_failed", {2: 0.7, 3: 0.8, 4: 0.9})
    w = fired(detect_collapse(h, CFG))["rollout/repeat_rate_failed"]
    assert (w.first_step, w.value, w.threshold, w.baseline) == (4, 0.9, 0.6, None)


@pytest.mark.parametrize(
    "key, bad", [("actor/grad_norm", math.nan), ("actor/kl_ref", math.inf), ("actor/entropy", math.nan)]
)
def test_non_finite_fires_at_once_even_in_a_short_history(key, bad):
    h = with_values(healthy(3), key, {2: bad})
    w = fired(detect_collapse(h, CFG))[key]
    assert w.first_step == 2 and not math.isfinite(w.value) and "diverged" in w.message


def test_non_finite_reward_std_is_skipped_not_a_warning():
    h = with_values(healthy(12), "reward/group_std_unsolved", {5: math.nan, 6: math.inf})
    assert detect_collapse(h, CFG).warnings == []


def test_missing_keys_are_skipped_not_read_as_zero():
    h = healthy(15)
    for row in h[5:]:  # steps 6.. : every other step has no update, so no actor/* metrics
        if row["step"] % 2 == 0:
            for key in [k for k in row if k.startswith("actor/")]:
                del row[key]
    h[8]["reward/group_std_unsolved"] = None
    assert detect_collapse(h, CFG).warnings == []
    # a run of low entropy continues across a step that did not record it: 6, (7 missing), 8, 9
    h = with_values(healthy(15), "actor/entropy", {1: 1.0, 2: 1.0, 3: 1.0, 6: 0.3, 7: None, 8: 0.3, 9: 0.3})
    assert fired(detect_collapse(h, CFG))["actor/entropy"].first_step == 9
    # the baseline is the first steps that recorded the metric: steps 1-2 missing, baseline from 3, 4, 5
    h = with_values(
        healthy(15), "reward/group_std_unsolved", {1: None, 2: None, 3: 0.5, 4: 0.5, 5: 0.5, 9: 0.1, 10: 0.1, 11: 0.1}
    )
    w = fired(detect_collapse(h, CFG))["reward/group_std_unsolved"]
    assert (w.first_step, w.baseline, w.threshold) == (11, pytest.approx(0.5), pytest.approx(0.2))


def test_too_short_history_gives_notes_and_no_relative_warnings():
    h = with_values(healthy(5), "actor/entropy", {4: 0.1, 5: 0.1})
    h = with_values(h, "rollout/repeat_rate_failed", {3: 0.9, 4: 0.9, 5: 0.9})
    report = detect_collapse(h, CFG)
    assert set(fired(report)) == {"rollout/repeat_rate_failed"}  # absolute signals still judged
    assert any("too few steps" in n and "actor/entropy (5)" in n for n in report.notes)


def test_zero_baselines_are_notes_not_warnings():
    h = with_values(healthy(12), "reward/group_std_unsolved", {s: 0.0 for s in range(1, 13)})
    report = detect_collapse(h, CFG)
    assert report.warnings == [] and any(
        "reward/group_std_unsolved" in n and "never had reward spread" in n for n in report.notes
    )


def test_zero_variance_fraction_is_relative_to_the_round():
    rising = {s: 0.2 for s in range(1, 7)} | {s: 0.6 for s in range(7, 13)}
    w = fired(detect_collapse(with_values(healthy(12), "rollout/stuck_frac", rising), CFG))["rollout/stuck_frac"]
    assert (w.first_step, w.threshold) == (9, pytest.approx(0.5))
    # a tiny model that always solves most tasks: high but flat is healthy, and cannot rise by 0.3
    flat_high = {s: 0.85 + 0.05 * (s % 2) for s in range(1, 13)}
    report = detect_collapse(with_values(healthy(12), "rollout/stuck_frac", flat_high), CFG)
    assert report.warnings == [] and any("cannot fire" in n for n in report.notes)


def test_kl_clip_and_grad_norm_spikes():
    h = with_values(healthy(12), "actor/kl_ref", {s: 0.8 for s in range(6, 13)})
    h = with_values(h, "actor/clip_frac", {s: 0.5 for s in range(4, 13)})
    h = with_values(h, "actor/grad_norm", {1: 1.0, 2: 1.0, 3: 1.0, 10: 12.0})  # one exploding step is enough
    steps = {k: w.first_step for k, w in fired(detect_collapse(h, CFG)).items()}
    assert steps == {"actor/kl_ref": 8, "actor/clip_frac": 6, "actor/grad_norm": 10}


def test_absent_signal_is_noted():
    h = [{k: v for k, v in row.items() if k != "actor/kl_ref"} for row in healthy(10)]  # beta = 0: no reference
    report = detect_collapse(h, CFG)
    assert report.warnings == [] and "not recorded: actor/kl_ref" in report.notes


@pytest.mark.parametrize(
    "rewards, expected",
    [
        ([0.5] * 15, None),
        ([0.5] * 11 + [0.1] * 4, 12),  # sharp fall: trailing mean (0.5+0.5+0.1)/3 < 0.4
        ([0.5] * 6 + [0.25] + [0.5] * 8, None),  # one bad step: trailing mean 0.417 stays above 0.4
        ([0.5] * 8 + [0.38] * 7, 11),  # a fall just past 20 %: the 3-step mean is 0.38 < 0.4 at 11
        ([-0.5] * 5 + [-0.7] * 5, 7),  # negative baseline: below -0.6, not above -0.4
        ([0.01] * 5 + [0.002] * 5, None),  # near-zero baseline: a relative fall is noise
        ([0.01] * 5 + [-0.3] * 5, 7),  # ... an absolute fall of 0.2 is not
        ([0.5] * 3, None),  # nothing after the baseline
    ],
)
def test_reward_drop_step(rewards, expected):
    h = [{"step": i + 1, "reward/total/mean": r} for i, r in enumerate(rewards)]
    assert reward_drop_step(h, baseline_steps=3) == expected


def echo_trap(n: int = 16) -> list[dict]:
    """Entropy and within-group reward std fall over steps 5-8, groups start repeating, reward falls at 12."""
    h = healthy(n, seed=3)
    for row in h:
        s = row["step"]
        fall = min(1.0, max(0.0, (s - 4) / 4))  # 0 up to step 4, 1 from step 8
        row["actor/entropy"] *= 1.0 - 0.85 * fall
        row["reward/group_std_unsolved"] *= 1.0 - 0.9 * fall
        row["rollout/repeat_rate_failed"] = 0.1 + 0.7 * fall
        if s >= 12:
            row["reward/total/mean"] = 0.2
    return h


def test_echo_trap_warns_before_the_reward_drops():
    report = detect_collapse(echo_trap(), CFG)
    assert report.reward_drop_step == 12
    assert {"actor/entropy", "reward/group_std_unsolved", "rollout/repeat_rate_failed"} <= set(fired(report))
    assert report.first_warning_step is not None and report.first_warning_step < report.reward_drop_step
    assert report.lead_steps == report.reward_drop_step - report.first_warning_step
    assert [w.first_step for w in report.warnings] == sorted(w.first_step for w in report.warnings)


def test_markdown_and_metadata():
    report = detect_collapse(echo_trap(), CFG)
    md = report.to_markdown()
    assert md.startswith("| signal | first step | value | threshold | baseline |")
    assert "| `actor/entropy` |" in md and "Reward drop: step 12." in md and "before it" in md
    meta = report.as_metadata()
    assert meta["collapsed"] == 1 and meta["warnings"] == len(report.warnings) and meta["steps"] == 16
    assert meta["first_warning_step"] == report.first_warning_step and meta["reward_drop_step"] == 12
    w = fired(report)["actor/entropy"]
    assert (meta["actor/entropy/first_step"], meta["actor/entropy/value"], meta["actor/entropy/baseline"]) == (
        w.first_step,
        w.value,
        w.baseline,
    )
    assert "rollout/repeat_rate_failed/baseline" not in meta  # absolute signal: no baseline
    assert all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in meta.values())

    quiet = detect_collapse(healthy(4), CFG)
    assert "No collapse warnings over 4 steps." in quiet.to_markdown() and "Notes:" in quiet.to_markdown()
    meta = quiet.as_metadata()
    assert (
        meta["collapsed"] == 0
        and "first_warning_step" not in meta
        and "reward_drop_step" not in meta
        and "too few steps" in meta["notes"]
    )


def test_signal_series_orders_by_step_and_skips_non_numbers():
    h = [
        {"step": 3, "x": 1},
        {"step": 1, "x": 2.5},
        {"step": 2},
        {"step": 4, "x": None},
        {"step": 5, "x": "n/a"},
        {"x": math.nan},
    ]
    series = signal_series(h, "x")
    # no "step": its position
    assert series[:2] == [(1, 2.5), (3, 1.0)] and series[2][0] == 5 and math.isnan(series[2][1])
