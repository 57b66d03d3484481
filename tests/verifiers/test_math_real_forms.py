"""Issue 22, item 5: the `math` verifier reads final answers as a pretrained instruct model writes
them (`\\boxed{10081}`, `$10081$`, `\\dfrac{1}{2}`, `The answer is $\\boxed{10081}$.`), and every
issue-21 defense still holds on what is inside the wrappers: an expression is not an answer, a
hedge is not an answer, two boxes are not one answer (docs/verifiers.md, "Answers as real models
write them")."""

from __future__ import annotations

import random
import re
import time

import pytest

from configs import load_profile
from verifiers.base import run_precheck, run_verifier
from verifiers.cascade import Cascade
from verifiers.latex_answer import answer_text
from verifiers.protocol import is_well_formed
from verifiers.shaping import Candidate, format_term

pytestmark = pytest.mark.realmodel

ARITHMETIC = {"task_id": "t", "family": "arithmetic", "answer": "10081", "prompt": "compute 347*29+18\n"}


def score(prediction: str, gold: str, prompt: str = "", **params) -> float | None:
    return run_verifier("math", prediction, {"answer": gold, "prompt": prompt}, params).score


# --- the wrappers, as a pure function -------------------------------------------------------------


@pytest.mark.parametrize(
    "text, core",
    [
        (r"\boxed{10081}", "10081"),
        (r"\fbox{10081}", "10081"),
        (r"\boxed { 10081 }", "10081"),
        ("$10081$", "10081"),
        ("$$10081$$", "10081"),
        (r"\(10081\)", "10081"),
        (r"\[ 10081 \]", "10081"),
        (r"\frac{1}{2}", "1/2"),
        (r"\dfrac{1}{2}", "1/2"),
        (r"\tfrac{-1}{2}", "-1/2"),
        (r"-\frac{3}{4}", "-3/4"),
        ("The answer is 10081", "10081"),
        ("the final answer is: 10081", "10081"),
        ("Final answer: 10081", "10081"),
        ("Answer: 10081", "10081"),
        ("So 10081", "10081"),
        ("Therefore, 10081", "10081"),
        ("So, the answer is 10081", "10081"),
        (r"The answer is $\boxed{10081}$.", "10081"),
        (r"**Final Answer:** $\boxed{10081}$", "10081"),
        ("**The answer is 10081**", "10081"),
        ("10081.", "10081"),
        ("**10081**", "10081"),
        ("**10081.**", "10081"),
        (r"$\frac{1}{2}$.", "1/2"),
        (r"\boxed{\text{10081}}", "10081"),
        (r"\text{10081}", "10081"),
        (r"10{,}081", "10,081"),
        (r"10\,081", "10 081"),
        (r"1.0081 \times 10^{4}", "1.0081 * 10^(4)"),
        (r"347 \cdot 29 + 18", "347 * 29 + 18"),  # turned into `*` so that the final-form rule sees a computation
        (r"\frac{\sqrt{2}}{2}", "(sqrt(2))/(2)"),
        (r"\left( x+1 \right)^{2}", "( x+1 )^(2)"),
        (r"2\pi", "2pi"),
        (r"50\%", "50%"),
        (r"30^\circ", "30°"),
        (r"10081\text{ cm}", "10081  cm "),
        ("10081", "10081"),  # the fast path: nothing to peel
        ("x+1", "x+1"),
        ("10081..", "10081.."),  # one period is a sentence's; two are not peeled
        ("10081. .", "10081. ."),  # nor two with a space between (the reward fuzzer's finding: `68. .` was rewarded)
        ("The answer is 5 or 6", "5 or 6"),  # what is left after the lead is read by the usual rules
    ],
)
def test_answer_text_peels_the_wrappers(text, core):
    assert answer_text(text) == core


@pytest.mark.parametrize(
    "text, reason",
    [
        (r"\boxed{5}, \boxed{6}", "more than one \\boxed"),
        (r"\boxed{5}\boxed{5}", "more than one \\boxed"),  # exactly one box, even if they agree
        (r"\boxed{\boxed{5}}", "more than one \\boxed"),
        (r"x = \boxed{5}", "more than one \\boxed"),  # a box not around the whole answer is not searched for
        (r"\boxed{10081", "unbalanced braces"),
        (r"\boxed{10081}}", "unbalanced braces"),
        (r"\frac{10081}", "needs its argument in braces"),
        (r"\frac12", "needs its argument in braces"),
        (r"\sqrt[3]{8}", "needs its argument in braces"),
        (r"1\text{0081}", "holds digits"),
        (r"10081\text{ or 10082}", "holds digits"),
        (r"\pm 5", "\\pm is not read"),
        (r"\overline{3}", "\\overline is not read"),
        (r"\approx 10081", "\\approx is not read"),
        (r"\left[ 1 \right]", "bracket other than"),
        ("\\", "a lone backslash"),
        ("{" * 9 + "1" + "}" * 9, "nested more than 8 deep"),
        ("1" * 257, "too long: 257 chars > 256"),
    ],
)
def test_answer_text_refuses_what_is_not_one_answer(text, reason):
    with pytest.raises(ValueError, match=re.escape(reason)):
        answer_text(text)


# --- accepted, against several golds -------------------------------------------------------------

REAL_FORMS = [
    "{v}",
    r"\boxed{{{v}}}",
    "${v}$",
    "$${v}$$",
    r"\({v}\)",
    r"\[{v}\]",
    "The answer is {v}",
    r"The answer is $\boxed{{{v}}}$.",
    "{v}.",
    "**{v}**",
    "Final answer: {v}",
    r"**Final Answer:** \boxed{{{v}}}",
    r"So, the final answer is $\boxed{{{v}}}$.",
    r"Therefore, $${v}$$",
    r"\fbox{{{v}}}",
]


@pytest.mark.parametrize("form", REAL_FORMS)
@pytest.mark.parametrize(
    "written, gold",
    [
        ("10081", "10081"),  # integer
        ("-42", "-42"),  # negative
        (r"\frac{1}{2}", "1/2"),  # fraction, against a fraction or a decimal gold
        (r"\dfrac{1}{2}", "0.5"),
        (r"-\frac{3}{4}", "-0.75"),
        ("3.5", "7/2"),  # decimal
        (r"\tfrac{7}{2}", "3.5"),
        (r"1.8026 \times 10^{4}", "18026"),  # scientific notation is a result
        (r"10{,}081", "10081"),
        (r"10\,081", "10081"),
        (r"2\sqrt{2}", "sqrt(8)"),  # symbolic
        (r"\frac{\sqrt{2}}{2}", "1/sqrt(2)"),
        (r"x^{2}+2x+1", "(x+1)^2"),
        (r"\frac{\pi}{2}", "pi/2"),
    ],
)
def test_real_model_forms_of_the_right_answer_score_one(form, written, gold):
    assert score(form.format(v=written), gold) == 1.0


@pytest.mark.parametrize("form", REAL_FORMS)
@pytest.mark.parametrize(
    "written, gold",
    [("10082", "10081"), ("42", "-42"), (r"\frac{1}{3}", "0.5"), ("3.49", "3.5"), (r"3\sqrt{2}", "sqrt(8)")],
)
def test_real_model_forms_of_a_wrong_answer_score_zero(form, written, gold):
    assert score(form.format(v=written), gold) == 0.0


def test_latex_golds_are_read_like_answers():
    assert score("1/2", r"\frac{1}{2}") == 1.0
    assert score(r"\boxed{0.5}", r"\dfrac{1}{2}") == 1.0
    assert score("10081", r"\boxed{10081}") == 1.0
    assert score("2*sqrt(2)", r"2\sqrt{2}") == 1.0
    assert score("1", r"\boxed{5}, \boxed{6}") is None  # an unreadable gold is unscorable, as before


@pytest.mark.parametrize(
    "prediction, score_with_units",
    [
        (r"\boxed{10081 \text{ apples}}", 1.0),
        (r"$10081\ \mathrm{cm}$", 1.0),
        (r"\$10081", 1.0),
        (r"10081\%", 1.0),  # strip_units reads a percent as the number, as it reads 10081%
        (r"\boxed{10081\text{ thousand}}", 0.0),  # a scale word is not a unit
        (r"\boxed{10081 \text{ or } 10082}", 0.0),  # a hedge is not a unit
        (r"10081\text{ nope } 99999", 0.0),
    ],
)
def test_units_in_latex_follow_strip_units(prediction, score_with_units):
    assert score(prediction, "10081", strip_units=True) == score_with_units
    assert score(prediction, "10081") == 0.0


# --- refused: what a policy optimizing this reward would try ---------------------------------------

ATTACKS = [
    # the question copied, inside the new wrappers (issue 21's hole, class 1)
    r"\boxed{347*29+18}",
    r"\boxed{347 \times 29 + 18}",
    r"$347 \cdot 29 + 18$",
    "The answer is 347*29+18",
    r"\boxed{(347)(29)+18}",
    r"$$347\times29+18$$.",
    r"**347*29+18**",
    # the gold's value spelled as an expression
    r"\frac{20162}{2}",
    r"\boxed{\frac{20162}{2}}",
    r"\frac{10081}{1}",
    r"\dfrac{10081}{1}",
    r"\boxed{10080+1}",
    r"$10081^{1}$",
    r"\boxed{\sqrt{101626561}}",
    r"\boxed{10081 \cdot 1}",
    r"\boxed{x - x + 10081}",
    r"\left(10080+1\right)",
    r"\boxed{10081 \div 1}",
    r"\boxed{--10081}",
    r"\boxed{\frac{10081}{1}}",
    r"{10080}+{1}",
    # hedges and several answers
    "The answer is 10081 or 10082",
    r"\boxed{10081}, \boxed{10082}",
    r"\boxed{10082}, \boxed{10081}",
    r"\boxed{10081} \boxed{10081}",
    r"\boxed{\boxed{10081}}",
    r"\fbox{\boxed{10081}}",
    r"\boxed{10081 \text{ or } 10082}",
    r"10081 \pm 1",
    r"\boxed{10081 \pm 1}",
    "$10081$ or $10082$",
    r"$10081$, $10082$",
    r"\boxed{10081}\text{, not } 10082",
    "The answer is 10082. The answer is 10081",
    "So 10082, or 10081",
    r"\boxed{10081} or \boxed{10082}",
    r"\approx 10081",
    r"\boxed{\approx 10081}",
    "Answer: 10082 Answer: 10081",
    "The answer is The answer is 10081",
    r"10082 = \boxed{10081}",
    r"347 \times 29 + 18 = \boxed{10081}",
    r"\boxed{10081}.\boxed{10082}",
    # \text tricks: digits hidden in words, words hiding a second answer
    r"1\text{0081}",
    r"10\text{081}",
    r"\text{1}0081",
    r"\text{10081 or 10082}",
    r"\mathrm{10082}",
    r"\text{10081}\text{10082}",
    r"\boxed{\text{10081}}\text{10082}",
    # look-alikes and markup the grammar does not read
    r"\overline{10081}",
    r"\cancel{10082} 10081",
    r"\color{white}{10082}10081",
    r"\phantom{1}10081",
    r"\hspace{1em}10081",
    r"\mathbf{1}0081",
    r"\boxed{10081}^{\circ}",
    r"\sqrt[2]{101626561}",
    r"\{10081\}",
    r"\\boxed{10081}",
    # malformed
    r"\boxed{10081",
    r"\boxed{10081}}",
    r"\boxed10081",
    r"\frac{10081}",
    r"\frac{10081}{",
    "{10081",
    "10081}",
    r"\boxed{}",
    "$$",
    "$",
    "**",
    "****",
    "\\",
    "10081..",
    "10081. .",
    "10081 . .",
    "10081.0.5",
    r"\boxed{ }.",
    "The answer is",
    "So.",
]


@pytest.mark.parametrize("attack", ATTACKS)
def test_attacks_in_real_model_forms_earn_nothing(attack):
    assert score(attack, "10081", "compute 347*29+18\n") == 0.0
    assert score(attack, "10081", "compute 347*29+18\n", strip_units=True) == 0.0
    assert run_verifier("numeric", attack, ARITHMETIC, {}).score == 0.0


@pytest.mark.parametrize(
    "attack",
    [
        r"\boxed{347*29+18}",
        r"\frac{20162}{2}",
        r"\boxed{5}, \boxed{6}",
        r"\boxed{10081",
        r"\boxed{\boxed{10081}}",
        r"1\text{0081}",
        r"\pm 10081",
        "The answer is 10081 or 10082",
    ],
)
def test_the_fast_tier_refuses_them_before_the_verifier(attack):
    verdict = run_precheck("math", attack, ARITHMETIC, {})
    assert verdict is not None and verdict.score == 0.0 and verdict.details.startswith("prediction")


@pytest.mark.parametrize(
    "prediction, gold",
    [
        (r"\frac{2}{4}", "0.5"),  # not in lowest terms: a division restated, as 2/4 is today
        (r"\dfrac{36052}{2}", "18026"),
        (r"\frac{-2}{-4}", "0.5"),
        (r"\frac{1}{-2}", "-0.5"),
        (r"\frac{1.5}{3}", "0.5"),
        (r"\frac{1}{2}\cdot 1", "0.5"),
        (r"$2^{10}$", "1024"),
        (r"\boxed{2^{10}}", "1024"),
        (r"10^{4}", "10000"),
        (r"\sqrt{4+4}", "2*sqrt(2)"),  # a rational sub-expression inside a symbolic answer
        (r"\boxed{\sqrt{16}}", "4"),
        (r"1234{,}567", "1234567"),  # thousands grouping stays strict: head group of 1-3 digits
        (r"1{,}00{,}081", "100081"),
        (r"1\,0081", "10081"),
        (r"10{,}08{,}1", "10081"),
        (r"0.123{,}456", "0.123456"),
    ],
)
def test_computations_and_odd_groupings_in_latex_are_still_refused(prediction, gold):
    assert score(prediction, gold) == 0.0


def test_a_boxed_symbolic_answer_may_not_restate_the_question():
    for prompt in ("simplify sqrt(8)\n", "Simplify $\\sqrt{8}$.", "Simplify \\(\\sqrt{8}\\)"):
        assert score(r"\boxed{\sqrt{8}}", "2*sqrt(2)", prompt) == 0.0, prompt
        assert score(r"$\sqrt{8}$", "2*sqrt(2)", prompt) == 0.0, prompt
        assert score(r"\boxed{2\sqrt{2}}", "2*sqrt(2)", prompt) == 1.0, prompt
    # a prompt LaTeX cannot fully read
    assert score(r"\boxed{\sqrt{8}}", "2*sqrt(2)", "Simplify $\\sqrt{8}$ \\left[") == 0.0


HUGE = [
    "\\boxed{" * 200_000 + "10081" + "}" * 200_000,
    "{" * 1_000_000 + "10081",
    "$" * 500_000 + "10081" + "$" * 500_000,
    "The answer is " * 70_000 + "10081",
    "\\frac{" * 100_000 + "1}{2}" * 100_000,
    "\\boxed{10081}" * 80_000,
    "**" * 500_000 + "10081" + "**" * 500_000,
    "10081" + "." * 1_000_000,
    "\\left(" * 100_000 + "10081" + "\\right)" * 100_000,
    "10{,}" * 200_000 + "081",
    "\\text{" + "a" * 1_000_000 + "}",
    # just inside the 256-character cap: every shape the peels and the converter work hardest on
    "\\boxed{" * 8 + "10081" + "}" * 8,
    "{" * 8 + "\\frac{" + "1" * 100 + "}{" + "3" * 100 + "}" + "}" * 8,
    "The answer is " + "\\," * 118,
    "$$" + "\\left(" * 40 + "$$",
    "**" + "*" * 250 + "**",
    "\\text{" + " " * 240 + "}",
    "So " * 84 + "1",
    "^" * 255 + "1",
    "**so" + " " * 250 + "x",  # side-by-side optional whitespace: a one-regex lead took seconds on these
    "**the" + " " * 240 + "final",
    "**So ," + " \t\n" * 80 + ":",
]


@pytest.mark.serial  # 0.1 s for 3 readings: another worker's processes on the cores would eat it
@pytest.mark.parametrize("attack", HUGE, ids=lambda a: f"{a[:20]}...{len(a)}")
def test_huge_and_nested_inputs_are_refused_in_linear_time(attack):
    run_verifier("math", "1", {"answer": "1"}, {})  # warm up the caches outside the clock
    start = time.perf_counter()
    for params in ({}, {"strip_units": True}):
        assert run_verifier("math", attack, ARITHMETIC, params).score == 0.0
    assert run_verifier("numeric", attack, ARITHMETIC, {}).score == 0.0
    assert time.perf_counter() - start < 0.1, attack[:40]


_FRAGMENTS = [
    "**",
    "so",
    "the",
    "final",
    "answer",
    "is",
    ",",
    ":",
    " ",
    "\t",
    "\n",
    "$",
    "$$",
    "\\(",
    "\\)",
    "\\[",
    "\\]",
    "\\boxed{",
    "\\fbox{",
    "\\text{",
    "\\frac{",
    "\\sqrt{",
    "{",
    "}",
    "{,}",
    "\\,",
    "^",
    "^\\circ",
    "\\left(",
    "\\right)",
    ".",
    "1",
    "0081",
    "10081",
    "-",
    "*",
    "\\cdot",
    "x",
    "\\",
]


@pytest.mark.serial  # the slowest of 1,500 readings under 20 ms: one preemption by another worker fails it
def test_wrapper_soup_just_inside_the_cap_is_read_fast():
    """Random runs of the fragments the peels and the converter react to, up to the 256-character
    cap: the slowest reading bounds what a policy can make the fast tier spend on one answer."""
    rng, worst = random.Random(22), (0.0, "")
    for _ in range(1500):
        parts: list[str] = []
        while sum(map(len, parts)) < 256:
            parts.append(rng.choice(_FRAGMENTS) * rng.choice([1, 1, 1, 4, 60]))
        text = "".join(parts)[:256]
        start = time.perf_counter()
        for params in ({}, {"strip_units": True}):
            assert run_verifier("math", text, ARITHMETIC, params).score in (0.0, 1.0)
        worst = max(worst, (time.perf_counter() - start, text))
    assert worst[0] < 0.02, worst


# --- through the training reward --------------------------------------------------------------------


def test_a_boxed_answer_is_well_formed_and_rewarded_through_the_cascade():
    cascade = Cascade(load_profile("tiny").reward)
    for body, outcome in [
        (r"\boxed{10081}", 1.0),
        (r"The answer is $\boxed{10081}$.", 1.0),
        (r"\dfrac{20162}{2}", 0.0),
        (r"\boxed{347 \times 29 + 18}", 0.0),
        (r"\boxed{10081}, \boxed{10082}", 0.0),
    ]:
        turns = ["<code>print(347*29+18)</code>", f"I computed it. <answer>{body}</answer>"]
        candidate = Candidate(turns, num_policy_tokens=40, tools=("code",))
        assert is_well_formed(turns, ("code",)) and format_term(candidate) == 1.0, body  # a box is not malformed
        breakdown = cascade.score(candidate, ARITHMETIC)
        assert breakdown.outcome == outcome, (body, breakdown.details)
        assert breakdown.components["format"] > 0, body


def test_the_numeric_audit_reads_the_same_forms():
    """The default audit re-scores with `numeric` (exact): it must disagree on values, not on wrappers."""
    for prediction in (r"\boxed{10081}", r"The answer is $10081$.", "**10081**", r"10{,}081"):
        assert run_verifier("numeric", prediction, ARITHMETIC, {"rel_tol": 0.0}).score == 1.0, prediction
    assert run_verifier("numeric", r"\dfrac{1}{2}", {"answer": "0.5"}, {"rel_tol": 0.0}).score == 1.0
    assert run_verifier("numeric", r"\boxed{10082}", ARITHMETIC, {"rel_tol": 0.0}).score == 0.0
    assert run_verifier("numeric", "1", {"answer": r"\boxed{5"}, {}).score is None
