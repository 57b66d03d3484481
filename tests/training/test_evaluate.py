import math

import pytest

from environments.arithmetic import evaluate, near_miss
from training.evaluate import mean_ci, paired_difference, promotion_decision, summarize


def test_mean_ci_hand_computed():
    mean, low, high = mean_ci([0.0, 1.0, 1.0, 0.0], 0.95)
    half = 1.959964 * math.sqrt((4 * 0.25 / 3) / 4)
    assert mean == 0.5 and low == pytest.approx(0.5 - half, rel=1e-5) and high == pytest.approx(0.5 + half, rel=1e-5)


def test_paired_difference_uses_common_tasks():
    new = {"a": 1.0, "b": 1.0, "c": 0.0, "only_new": 1.0}
    old = {"a": 0.0, "b": 1.0, "c": 0.0}
    diff, low, high = paired_difference(new, old, 0.95)
    assert diff == pytest.approx(1 / 3)
    assert low < diff < high
    with pytest.raises(ValueError, match="share no task ids"):
        paired_difference({"x": 1.0}, {"y": 1.0}, 0.95)


def test_promotion_needs_a_measurable_gain():
    old = {str(i): float(i % 2) for i in range(1000)}
    better = {str(i): 1.0 if i % 4 else 0.0 for i in range(1000)}  # 0.75 vs 0.5
    same = dict(old)
    assert promotion_decision(better, old, 0.95, 0.0)["promote"]
    assert not promotion_decision(same, old, 0.95, 0.0)["promote"]
    assert promotion_decision(old, None, 0.95, 0.0)["promote"]


def test_summarize_reports_levels():
    rows = [
        {"task_id": "a", "family": "arithmetic", "level": 1, "score": 1.0, "tool_call_rate": 0.0, "turns": 1},
        {"task_id": "b", "family": "arithmetic", "level": 3, "score": 0.0, "tool_call_rate": 1.0, "turns": 2},
        {"task_id": "c", "family": "search", "level": 2, "score": 1.0, "tool_call_rate": 1.0, "turns": 3},
    ]
    s = summarize(rows, 0.95)
    assert s["pass_at_1"] == pytest.approx(2 / 3) and s["mean_turns"] == 2.0
    assert (
        s["arithmetic/pass_at_1"] == 0.5
        and s["arithmetic/level_1/pass_at_1"] == 1.0
        and s["arithmetic/level_3/tool_call_rate"] == 1.0
    )
    assert s["search/pass_at_1"] == 1.0 and s["search/level_2/pass_at_1"] == 1.0


def test_teacher_near_miss_is_wrong_but_close():
    import random

    rng = random.Random(0)
    for value in (evaluate("347*52-18"), 7, -1234, 10):
        for _ in range(50):
            miss = near_miss(value, rng)
            assert miss != value and len(str(abs(miss))) == len(str(abs(value)))
