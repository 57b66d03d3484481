import pytest

from verifiers.math_equiv import numeric_match, parse_number
from verifiers.protocol import extract_answers, is_well_formed
from verifiers.rewards import RewardWeights, compute_reward


@pytest.mark.parametrize(
    "prediction, gold, expected",
    [
        ("42", "42", 1.0),
        (" 42 ", "42", 1.0),
        ("42.0", "42", 1.0),
        ("18,026", "18026", 1.0),
        ("1.8026e4", "18026", 1.0),
        ("84/2", "42", 1.0),
        ("\uff14\uff12", "42", 1.0),  # fullwidth look-alike digits
        ("\u221242", "-42", 1.0),  # unicode minus
        ("43", "42", 0.0),
        ("42x", "42", 0.0),
        ("", "42", 0.0),
        ("nan", "42", 0.0),
        ("9" * 100, "42", 0.0),  # enormous output is not parsed
        ("42", "not a number", None),  # unscorable gold is None, never a silent 0
    ],
)
def test_numeric_match(prediction, gold, expected):
    assert numeric_match(prediction, gold) == expected


def test_relative_tolerance():
    assert numeric_match("1000.0005", "1000", rel_tol=1e-6) == 1.0
    assert numeric_match("1000.01", "1000", rel_tol=1e-6) == 0.0
    assert parse_number("1/0") is None


def test_protocol_parsing():
    assert extract_answers("<answer>1</answer> and <answer> 2 </answer>") == ["1", "2"]
    assert is_well_formed(["<code>print(1)</code>", "<answer>1</answer>"])
    assert is_well_formed(["<answer>1</answer>"])
    assert not is_well_formed(["<answer>1</answer><answer>2</answer>"])
    assert not is_well_formed(["<code>print(1)</code><answer>1</answer>"])
    assert not is_well_formed(["<code>x</code>", "<code>y</code>"])
    assert not is_well_formed([])


W = RewardWeights(outcome_weight=1.0, format_weight=0.1, tool_cost=0.1, max_tool_penalty=0.3)


@pytest.mark.parametrize(
    "turns, calls, expected",
    [
        (["<answer>42</answer>"], 0, 1.1),  # right, direct, well formed
        (["<code>print(6*7)</code>", "<answer>42</answer>"], 1, 1.0),  # right with one tool call
        (["<answer>41</answer>"], 0, 0.1),  # wrong but well formed
        (["<answer>41</answer><answer>42</answer>"], 0, 0.0),  # hedging: two answers score nothing
        (["<code>1</code>", "<code>2</code>", "<code>3</code>", "<code>4</code>", "<answer>42</answer>"], 4, 0.8),  # 1 + 0.1 - cost capped at 0.3
        (["no tags at all 42"], 0, 0.0),
    ],
)
def test_composite_reward(turns, calls, expected):
    r = compute_reward("arithmetic", turns, calls, "42", W)
    assert r.reward == pytest.approx(expected)


def test_outcome_dominates_shaping():
    right_with_tools = compute_reward("arithmetic", ["<code>a</code>"] * 5 + ["<answer>42</answer>"], 5, "42", W).reward
    wrong_but_neat = compute_reward("arithmetic", ["<answer>41</answer>"], 0, "42", W).reward
    assert right_with_tools > wrong_but_neat


def test_unknown_family_is_an_error():
    with pytest.raises(KeyError, match="no outcome verifier for family 'chess'"):
        compute_reward("chess", ["<answer>1</answer>"], 0, "1", W)


def test_unscorable_gold_reported_as_none():
    r = compute_reward("arithmetic", ["<answer>1</answer>"], 0, "???", W)
    assert r.outcome is None and r.reward == pytest.approx(0.1)
