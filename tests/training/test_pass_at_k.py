"""pass@k (issue 24): the unbiased estimator against a hand-computed example and brute-force
enumeration of every k-subset, and its bootstrap interval."""

from __future__ import annotations

import itertools
import math

import pytest

from training.evaluate import pass_at_k, pass_at_k_ci

pytestmark = pytest.mark.yourdata


def test_hand_computed_example():
    # n = 5 samples, c = 2 passed, k = 2: 1 - C(3, 2) / C(5, 2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # pass@1 is the pass rate c / n
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0  # n - c < k: some pass is certain


@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_equals_brute_force_enumeration(n):
    """For every c and k: the fraction of k-subsets of n samples (c of them passing) that hold a pass."""
    for c in range(n + 1):
        outcomes = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            exact = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)
            assert exact == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_bad_counts_are_refused_naming_them():
    with pytest.raises(ValueError, match="n=4, c=5, k=1"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k(4, 1, 5)


def test_bootstrap_interval_holds_the_mean_and_stays_in_bounds():
    counts = [(8, c) for c in (0, 0, 1, 2, 8, 8, 3, 0, 5, 7)] * 5
    mean, low, high = pass_at_k_ci(counts, 4, 0.95)
    assert mean == pytest.approx(sum(pass_at_k(8, c, 4) for _, c in counts) / len(counts))
    assert 0.0 <= low < mean < high <= 1.0
    assert pass_at_k_ci(counts, 4, 0.95) == (mean, low, high)  # seeded
    assert pass_at_k_ci([(8, 8)] * 10, 4, 0.95) == (1.0, 1.0, 1.0)  # no spread, no interval


def test_the_benchmark_summary_reports_pass_at_k_per_family_next_to_pass_at_1():
    from training.evaluate import summarize

    # 4 samples a task; code's partial credit (0.5) counts toward pass@1's mean outcome, not as a pass
    rows = [
        {
            "task_id": f"{f}-{i}",
            "family": f,
            "level": 1,
            "score": score,
            "samples": 4,
            "solved": solved,
            "tool_call_rate": 0.0,
            "turns": 1.0,
        }
        for i, (f, score, solved) in enumerate(
            [("math", 0.25, 1), ("math", 0.0, 0), ("code", 0.5, 0), ("code", 1.0, 4)]
        )
    ]
    summary = summarize(rows, 0.95, [2, 4])
    assert summary["pass_at_1"] == pytest.approx((0.25 + 0.0 + 0.5 + 1.0) / 4)
    assert summary["pass_at_2"] == pytest.approx((pass_at_k(4, 1, 2) + 0 + 0 + 1) / 4)
    assert summary["math/pass_at_4"] == pytest.approx(0.5) and summary["code/pass_at_4"] == pytest.approx(0.5)
    assert summary["pass_at_2_ci_low"] <= summary["pass_at_2"] <= summary["pass_at_2_ci_high"]
    assert "pass_at_8" not in summarize(rows, 0.95, [8])  # a k beyond the samples taken is not estimated


def test_a_k_the_benchmark_cannot_estimate_is_refused_at_load_time():
    from configs import ConfigError, load_profile

    with pytest.raises(
        ConfigError, match=r"benchmark.pass_at_k=\[2, 8\]: each k must be 2..samples_per_task=4 \(got \[8\]"
    ):
        load_profile("micro", {"benchmark.samples_per_task": 4, "benchmark.pass_at_k": [2, 8]})
    assert load_profile(
        "micro", {"benchmark.samples_per_task": 4, "benchmark.pass_at_k": [2, 4]}
    ).benchmark.pass_at_k == [2, 4]


def test_the_gate_compares_pass_at_1_unless_gate_k_names_a_reported_k():
    from configs import ConfigError, load_profile
    from training.evaluate import gate_scores

    rows = [
        {"task_id": "a", "score": 0.25, "samples": 4, "solved": 1},
        {"task_id": "b", "score": 0.5, "samples": 4, "solved": 0},
    ]
    assert gate_scores(rows) == {"a": 0.25, "b": 0.5}  # the mean outcome (b's partial credit counts)
    assert gate_scores(rows, 2) == {"a": pytest.approx(0.5), "b": 0.0}  # a: 1 - C(3,2)/C(4,2); b: no sample passed
    with pytest.raises(ConfigError, match=r"benchmark.gate_k=4 must be 1 or one of pass_at_k=\[2\]"):
        load_profile("micro", {"benchmark.samples_per_task": 4, "benchmark.pass_at_k": [2], "benchmark.gate_k": 4})
