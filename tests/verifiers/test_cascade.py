"""The composite reward and the verification cascade: components, tiers, and the defenses
against reward hacking that live in the cascade (each case fails if its defense is removed)."""

import pytest

from configs.schema import RewardConfig, StrictTierConfig, VerifierSpec
from verifiers.base import Verdict, register
from verifiers.cascade import Cascade
from verifiers.shaping import Candidate, misuse_counts, overlong_term

TASK = {"task_id": "t1", "family": "arithmetic", "answer": "42", "level": 1}


def reward_of(turns, tokens=20, cfg=None, task=TASK):
    return Cascade(cfg or RewardConfig()).score(Candidate(turns, tokens, ("code",)), task)


@pytest.mark.parametrize(
    "turns, tokens, expected",
    [
        (["<answer>42</answer>"], 8, 1.1),  # right, direct, well formed
        (["<code>print(6*7)</code>", "<answer>42</answer>"], 20, 1.0),  # right with one call: -0.1
        (["<answer>41</answer>"], 8, 0.1),  # wrong but well formed
        (["<answer>41</answer><answer>42</answer>"], 8, 0.0),  # hedging: two answers score nothing
        # cost capped at 0.3
        (
            ["<code>1</code>", "<code>2</code>", "<code>3</code>", "<code>4</code>", "<answer>42</answer>"],
            30,
            0.8,
        ),
        # consecutive duplicate: -0.1
        (
            ["<code>print(1)</code>", "<code>print(1)</code>", "<answer>42</answer>"],
            20,
            0.8,
        ),
        (["<code>print(</code>", "<answer>42</answer>"], 20, 0.9),  # invalid call: -0.1
        # a tool that does not exist: not well formed, -0.1 -0.1
        (
            ["<search>x</search>", "<answer>42</answer>"],
            20,
            0.8,
        ),
        (["<answer>42</answer>"], 112, 1.0),  # 16 tokens into the 32-token overlong buffer: -0.5 * 0.2
        (["<answer>42</answer>"], 129, 0.9),  # beyond max_tokens: -1 * 0.2
        (["no tags at all 42"], 8, 0.0),
    ],
)
def test_composite_reward(turns, tokens, expected):
    r = reward_of(turns, tokens)
    assert r.reward == pytest.approx(expected)
    assert sum(r.components.values()) == pytest.approx(r.reward)
    assert set(r.components) == {"outcome", "format", "tool_cost", "tool_misuse", "overlong"}


def test_outcome_dominates_any_shaping():
    worst_right = reward_of(["<code>print(</code>"] * 6 + ["<search>q</search><answer>42</answer>"], 500).reward
    best_wrong = reward_of(["<answer>41</answer>"], 1).reward
    assert worst_right > best_wrong


def test_shaping_caps_must_stay_below_outcome():
    with pytest.raises(ValueError, match="must stay below outcome_weight"):
        RewardConfig(outcome_weight=0.5)


def test_composite_is_configured_not_coded():
    cfg = RewardConfig(terms={"format": {"weight": 0.05, "cap": 0.05}})
    r = reward_of(["<code>print(6*7)</code>", "<answer>42</answer>"], cfg=cfg)
    assert r.components == {"outcome": 1.0, "format": 0.05} and r.reward == pytest.approx(1.05)


def test_misuse_counts_each_kind():
    c = Candidate(
        [
            "<code>print(1)</code>",
            "<code>print( 1 )</code>",
            "<code>def</code>",
            "<browse>x</browse>",
            "<answer>1</answer>",
        ],
        10,
        ("code",),
    )
    assert misuse_counts(c) == {"unknown": 1, "invalid": 1, "duplicate": 0}
    c = Candidate(["<code>print(1)</code>", "<code>print(1)</code>", "<answer>1</answer>"], 10, ("code",))
    assert misuse_counts(c)["duplicate"] == 1


def test_overlong_is_dapo_soft_penalty():
    shape = [overlong_term(Candidate([], n, ("code",)), max_tokens=100, buffer=20) for n in (80, 90, 100, 101)]
    assert shape == [0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError, match="buffer"):
        overlong_term(Candidate([], 1, ("code",)), max_tokens=10, buffer=10)


# ---- defenses -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "turns, why",
    [
        (["I think it is 42. <answer>41</answer>"], "answer hidden in the reasoning"),
        (["the answer is 42"], "no answer tag"),
        (["<answer>42</answer><answer>41</answer>"], "several answers"),
        (["<answer>41</answer> or maybe <answer>42</answer>"], "several answers, right one last"),
        (["<answer>   </answer>"], "whitespace answer"),
        (["<answer></answer>"], "empty answer"),
        (["<answer>" + "4" * 600 + "</answer>"], "enormous answer"),
        (["<answer>" + "42 " * 300 + "</answer>"], "enormous answer made of the gold"),
        (["<answer>4Ƨ</answer>"], "look-alike letter instead of a digit"),
        (["<answer>l0</answer>"], "letter l for one"),
    ],
)
def test_hacks_earn_no_outcome(turns, why):
    assert reward_of(turns).outcome == 0.0, why


def test_lookalike_digits_fold_to_the_number():
    assert reward_of(["<answer>\uff14\uff12</answer>"]).outcome == 1.0  # fullwidth 42 *is* 42


def test_fast_tier_rejects_before_the_verifier_runs():
    calls = []

    @register("spy_equals")
    def spy(prediction, task):
        calls.append(prediction)
        return Verdict(1.0 if prediction == task["answer"] else 0.0, "spy")

    cascade = Cascade(RewardConfig(verifiers={"arithmetic": VerifierSpec(name="spy_equals")}))
    items = [
        (Candidate([t], 5, ("code",)), TASK)
        for t in ("<answer>42</answer>", "<answer>1</answer><answer>2</answer>", "<answer> </answer>", "x")
    ]
    rewards = cascade.score_many(items)
    assert calls == ["42"]
    assert [r.tier for r in rewards] == ["verify", "fast", "fast", "fast"]
    m = cascade.metrics()
    assert m["verifier/fast/calls"] == 4 and m["verifier/fast/pass_rate"] == 0.25 and m["verifier/verify/calls"] == 1
    assert m["verifier/verify/latency_ms"] > 0


def test_exception_inside_verifier_is_unscorable_not_reward():
    @register("raises_on_purpose")
    def boom(prediction, task):
        raise RecursionError("crafted input")

    cascade = Cascade(RewardConfig(verifiers={"arithmetic": VerifierSpec(name="raises_on_purpose")}))
    r = cascade.score(Candidate(["<answer>42</answer>"], 5, ("code",)), TASK)
    assert r.outcome is None and r.components["outcome"] == 0.0
    assert "RecursionError" in r.details["outcome"]
    assert cascade.metrics()["verifier/verify/unscorable"] == 1


def test_out_of_range_score_is_unscorable():
    @register("returns_two")
    def two(prediction, task):
        return Verdict(2.0, "too generous")

    r = Cascade(RewardConfig(verifiers={"arithmetic": VerifierSpec(name="returns_two")})).score(
        Candidate(["<answer>1</answer>"], 5, ("code",)), TASK
    )
    assert r.outcome is None


def test_unscorable_gold_is_none_even_for_malformed_candidates():
    bad = {**TASK, "answer": "???"}
    for turns in (["<answer>42</answer>"], ["no answer"]):
        assert reward_of(turns, task=bad).outcome is None


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"reward.verifiers.arithmetic.name: unknown verifier 'mathz'"):
        Cascade(RewardConfig(verifiers={"arithmetic": VerifierSpec(name="mathz")}))
    with pytest.raises(ValueError, match=r"reward.terms.politeness"):
        Cascade(RewardConfig(terms={"politeness": {"weight": 0.1, "cap": 0.1}}))
    with pytest.raises(ValueError, match="no verifier for task family 'chess'"):
        Cascade(RewardConfig()).score(Candidate(["<answer>1</answer>"], 5, ("code",)), {**TASK, "family": "chess"})


def test_strict_tier_overrides_and_counts_disagreements():
    cfg = RewardConfig(
        verifiers={"arithmetic": VerifierSpec(name="numeric", params={"rel_tol": 1e-3, "exact_integers": False})},
        strict=StrictTierConfig(verifiers={"arithmetic": VerifierSpec(name="numeric", params={"rel_tol": 0.0})}),
    )
    cascade = Cascade(cfg)
    lenient_only = cascade.score(Candidate(["<answer>42.01</answer>"], 5, ("code",)), TASK)
    exact = cascade.score(Candidate(["<answer>42</answer>"], 5, ("code",)), TASK)
    wrong = cascade.score(Candidate(["<answer>7</answer>"], 5, ("code",)), TASK)
    assert (lenient_only.outcome, lenient_only.tier) == (0.0, "strict")
    assert (exact.outcome, exact.tier) == (1.0, "strict")
    assert wrong.tier == "verify"  # select=passed: the strict tier only sees rewarded candidates
    m = cascade.metrics()
    assert m["verifier/strict/calls"] == 2 and m["verifier/strict/disagreements"] == 1


def test_strict_sampling_is_deterministic_by_key():
    cfg = RewardConfig(strict=StrictTierConfig(verifiers={"arithmetic": VerifierSpec(name="numeric")}, sample_rate=0.5))
    items = [(Candidate(["<answer>42</answer>"], 5, ("code",)), TASK)] * 200
    keys = [f"traj-{i}" for i in range(200)]
    first = [r.tier for r in Cascade(cfg).score_many(items, keys)]
    assert first == [r.tier for r in Cascade(cfg).score_many(items, keys)]
    assert 60 < first.count("strict") < 140
