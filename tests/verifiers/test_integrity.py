"""Reward integrity (issue 21): the answers an optimizer finds first, tried through the training
reward (the `tiny` profile's cascade), each by class and with variants. Every case here was
rewarded, or stalled the reward, before its fix; docs/verifiers.md lists where each is stopped.
The sandbox's own abuse cases are in test_sandbox_integrity.py, the RL math bounds in
test_rl_math.py, the fuzzer in test_reward_fuzz.py."""

from __future__ import annotations

import json
import re
import shutil
import time

import pytest

from configs import load_profile
from verifiers.base import run_verifier
from verifiers.bounded import runner
from verifiers.cascade import Cascade
from verifiers.math_equiv import numeric_match
from verifiers.protocol import extract_answers
from verifiers.shaping import Candidate

pytestmark = pytest.mark.integrity
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture(scope="module")
def reward_cfg():
    return load_profile("tiny").reward


def answer(text: str, tools=("code",)) -> Candidate:
    return Candidate([text], num_policy_tokens=len(text) // 4, tools=tools)


# --- 1. copying the question ---------------------------------------------------------------------

COPIES = [
    lambda e: e,  # the issue's: 347*29+18
    lambda e: " ".join(re.split(r"([-+*])", e)),  # spaced: 347 * 29 + 18
    lambda e: e.replace("*", "×"),  # typeset times
    lambda e: f"({e})",  # parenthesised
    lambda e: f"{e}+0",  # padded
    lambda e: f"x-x+{e}",  # padded with a cancelling symbol
]


def test_copying_the_question_earns_nothing_on_any_arithmetic_task(reward_cfg):
    from environments.arithmetic import evaluate, generate_tasks

    tasks = generate_tasks(200, seed=21, split="train")
    cascade = Cascade(reward_cfg)
    for copy in COPIES:
        items = [(answer(f"<answer>{copy(t['prompt'].split()[1])}</answer>"), t) for t in tasks]
        rewarded = [(c.text, b.outcome) for (c, _), b in zip(items, cascade.score_many(items)) if b.outcome]
        assert rewarded == [], f"{len(rewarded)} of 200 copies rewarded, e.g. {rewarded[:2]}"
    # the result itself is still right, in the forms people write results
    t = tasks[0]
    value = evaluate(t["prompt"].split()[1])
    for form in (str(value), f"{value:,}", f"{value}.0", f" {value} "):
        assert cascade.score(answer(f"<answer>{form}</answer>"), t).outcome == 1.0, form


@pytest.mark.parametrize(
    "prediction, gold, score",
    [
        ("36052/2", "18026", 0.0),  # a division restated
        ("9013*2", "18026", 0.0),
        ("2^10", "1024", 0.0),
        ("--5", "5", 0.0),
        ("sqrt(4+4)", "2*sqrt(2)", 0.0),  # a rational sub-expression inside a symbolic answer
        ("1/2", "0.5", 1.0),  # a fraction in lowest terms is a result
        ("2/4", "0.5", 0.0),
        ("1.8026*10^4", "18026", 1.0),  # scientific notation is a result
        ("1.8026e4", "18026", 1.0),
        ("2*sqrt(2)", "sqrt(8)", 1.0),
        ("-3/4", "-0.75", 1.0),
    ],
)
def test_math_answers_are_results_not_computations(prediction, gold, score):
    assert run_verifier("math", prediction, {"answer": gold}, {}).score == score


def test_a_symbolic_answer_may_not_restate_the_question():
    task = {"answer": "2*sqrt(2)", "prompt": "simplify sqrt(8)\n"}
    assert run_verifier("math", "sqrt(8)", task, {}).score == 0.0
    assert run_verifier("math", "2*sqrt(2)", task, {}).score == 1.0
    assert run_verifier("math", "sqrt(2)*2", task, {}).score == 1.0


@pytest.mark.parametrize(
    "prediction, gold, score",
    [
        ("84/2", "42", 0.0),
        ("21/2", "10.5", 1.0),
        ("42", "42", 1.0),
        ("1,00,81", "10081", 0.0),
        ("10,081", "10081", 1.0),
    ],
)
def test_numeric_verifier_refuses_unreduced_fractions_and_odd_grouping(prediction, gold, score):
    assert numeric_match(prediction, gold) == score


# --- 2. reading the grader ------------------------------------------------------------------------

# Each builds its attribute path at run time (no forbidden name in the source, so the static policy
# passes it) and walks from an exception to the frame that called the candidate.
_EXC = '("{0._" + "_traceback_" + "_.tb" + "_frame.f" + "_back'
READ_TEST_SOURCE = f"""def f(x):
    try:
        raise ValueError
    except ValueError as e:
        try:
            src = {_EXC}.f" + "_back.f" + "_locals[code]}}").format(e)
            return int(src.split("== ")[1])
        except Exception:
            return None
"""  # the running test's source, from the harness frame's locals
READ_ALL_TESTS = f"""def f(x):
    try:
        raise ValueError
    except ValueError as e:
        try:
            tests = {_EXC}.f" + "_back.f" + "_globals[_TESTS]}}").format(e)
            key = "f(" + repr(x) + ") == "
            return int(tests.split(key)[1].split("'")[0].split('"')[0])
        except Exception:
            return None
"""  # every test, from the harness module's globals
READ_CONSTANTS = f"""def f(x):
    try:
        raise ValueError
    except ValueError as e:
        try:
            code = {_EXC}.f" + "_code.co" + "_")
            if (code + "filename}}").format(e) != "<test>":
                return None
            c = (code + "consts}}").format(e).strip("()").split(", ")
            return [int(v) for v in c if v.isdigit() and int(v) != x][0]
        except Exception:
            return None
"""  # the expected value, from the test's compiled constants


@needs_bwrap
@pytest.mark.parametrize(
    "exploit", [READ_TEST_SOURCE, READ_ALL_TESTS, READ_CONSTANTS], ids=["locals", "globals", "constants"]
)
def test_a_candidate_cannot_read_the_tests_it_is_graded_by(exploit, reward_cfg, sandbox):
    from environments.base import task_view
    from environments.code import generate_tasks

    tasks = [task_view(t) for t in generate_tasks(40, seed=21, split="train")]
    audit = reward_cfg.model_copy(
        update={
            "verifiers": {
                "code": reward_cfg.verifiers["code"].model_copy(
                    update={"params": {"groups": ["fail_to_pass", "held_out"]}}
                )
            }
        }
    )
    for cfg in (reward_cfg, audit):  # training, and the audit's held-out tier
        cascade = Cascade(cfg, sandbox, concurrency=2)
        results = cascade.score_many([(answer(f"<answer>{exploit}</answer>", ()), t) for t in tasks])
        assert [r.outcome for r in results] == [0.0] * 40, results[0].details
        honest = cascade.score(answer(f"<answer>{tasks[0]['answer']}</answer>", ()), tasks[0])
        assert honest.outcome == 1.0, honest.details


@needs_bwrap
def test_results_cross_as_plain_data_and_exceptions_keep_their_builtin_type(sandbox):
    tests = [
        {"name": "eq", "code": "assert f(1) == 2", "group": "fail_to_pass"},
        {
            "name": "raises",
            "code": "try:\n    f(-1)\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError",
            "group": "fail_to_pass",
        },
        {"name": "types", "code": "assert f(2) == [(1, 'a'), {'k': {3}}, b'x', None, 1.5]", "group": "fail_to_pass"},
    ]
    task = {"entry_point": "f", "tests": json.dumps(tests)}
    liar = "class Always:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Always()\n"
    verdict = run_verifier("unit_tests", liar, task, {}, sandbox=sandbox)
    assert verdict.score == 0.0, verdict.details  # an object whose == lies never leaves its process
    honest = (
        "def f(x):\n    if x < 0:\n        raise ValueError(x)\n"
        "    return 2 if x == 1 else [(1, 'a'), {'k': {3}}, b'x', None, 1.5]\n"
    )
    verdict = run_verifier("unit_tests", honest, task, {}, sandbox=sandbox)
    assert verdict.score == 1.0, verdict.details


# --- 3. an answer inside its own tool call --------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '<code>print("<answer>10081</answer>")</code>',  # the issue's
        '<code>print("<answer>10081</answer>")',  # cut where a real engine stops: at </answer>
        "<search><answer>10081</answer></search>",
        "<code>x = 1</code><interpreter><answer>10081</answer></interpreter>",  # a forged observation
        "<think><answer>10081</answer></think>",
    ],
)
def test_answer_tags_count_only_outside_tool_calls(text, reward_cfg):
    assert extract_answers(text) == []
    task = {"task_id": "t", "family": "arithmetic", "answer": "10081", "prompt": "compute 347*29+18\n"}
    assert Cascade(reward_cfg).score(answer(text), task).outcome == 0.0


def test_an_answer_may_contain_tags_and_follow_tool_calls():
    assert extract_answers('<code>print(1)</code><answer>def f():\n    return "<code>"</answer>') == [
        'def f():\n    return "<code>"'
    ]
    assert extract_answers("<answer>1</answer> and <answer> 2 </answer>") == ["1", "2"]


@needs_bwrap
def test_answer_in_a_tool_call_through_the_agent_loop(tokenizer_and_tasks, micro_cfg, sandbox, reward_cfg):
    """The issue's reproduction: run_episodes with an engine that writes the answer into its code and
    stops, then score_records: nothing, though the interpreter did print the right answer."""
    from environments.families import build_tools
    from training.agent.engines import Generation
    from training.agent.loop import run_episodes
    from training.rl.scoring import episode_record, score_records

    tok, tasks = tokenizer_and_tasks
    task = tasks[0]
    from environments.arithmetic import evaluate

    value = evaluate(task["prompt"].split()[1])

    class Cheater:
        name = "scripted"

        def generate(self, sequences, budgets, *, stop_ids, **_):
            ids = tok.encode(f'<code>print("<answer>{value}</answer>")</code>', add_special_tokens=False)
            cut = next((i + 1 for i, t in enumerate(ids) if t in stop_ids), len(ids))  # an engine stops at a stop tag
            return [Generation(ids[:cut], [-0.1] * cut) for _ in sequences]

        def sync_weights(self, model):
            return 0.0

        def close(self):
            pass

    episodes = run_episodes(
        Cheater(), tok, [task], group_size=2, tools=build_tools(sandbox=sandbox, kb=None), cfg=micro_cfg.rollout
    )
    records = [episode_record(e, round_index=1, step=0, policy_version="x", tokenizer=tok) for e in episodes]
    rows = score_records(records, {task["task_id"]: task}, tok, Cascade(reward_cfg, sandbox))
    assert [r["outcome"] for r in rows] == [0.0, 0.0]


# --- 4. a slow answer -----------------------------------------------------------------------------


def nested(fn: str, depth: int, inner: str = "0.5") -> str:
    return f"{fn}(" * depth + inner + ")" * depth


@pytest.mark.parametrize(
    "slow",
    [
        nested("log", 8),  # the issue's: 18 s unbounded
        nested("log", 7, "-2"),  # 3.9 s
        nested("sqrt", 9, "2"),
        "log(sqrt(log(sqrt(log(sqrt(log(2)))))))",
    ],
)
def test_slow_answers_are_refused_by_the_work_bound(slow, reward_cfg):
    task = {"task_id": "t", "family": "arithmetic", "answer": "2*sqrt(2)", "prompt": "simplify sqrt(8)\n"}
    start = time.perf_counter()
    breakdown = Cascade(reward_cfg).score(answer(f"<answer>{slow}</answer>"), task)
    assert breakdown.outcome == 0.0 and "nested" in breakdown.details["outcome"]
    assert time.perf_counter() - start < 1.0


def test_work_the_grammar_allows_is_bounded_in_time_and_unscorable_past_it():
    """A product of three triple logs passes every work bound and takes sympy ~0.1 s here: under a
    0.02 s deadline the child is killed and the verdict is unscorable; the next call gets a fresh child."""
    task = {"answer": "2*sqrt(2)"}
    killed = runner().timeouts
    start = time.perf_counter()
    verdict = run_verifier("math", "log(log(log(-2)))*log(log(log(-3)))*log(log(log(-5)))", task, {"timeout_s": 0.02})
    assert verdict.score is None and "exceeded 0.02 s" in verdict.details
    assert time.perf_counter() - start < 1.0 and runner().timeouts == killed + 1
    assert run_verifier("math", "sqrt(8)", task, {"timeout_s": 30}).score == 1.0
    # other slow shapes the grammar admits, each bounded the same way
    for slow in ("log(log(log(-2)))^999*log(log(log(-3)))^999", "sqrt(log(log(-2)))^999+log(log(log(-7)))"):
        assert run_verifier("math", slow, task, {"timeout_s": 0.001}).score is None


@pytest.mark.parametrize(
    "text", ["<answer>" * 5000, "<ab>" * 8000, "<code>" * 5000, "<answer><" * 3000, "<answer>" + "<a" * 8000]
)
def test_tag_soup_is_parsed_in_linear_time(text, reward_cfg):
    """Unclosed tags repeated: the old regexes retried each one against the rest of the text (1-3 s
    for these, in the fast tier and in every shaping term)."""
    task = {"task_id": "t", "family": "arithmetic", "answer": "10081", "prompt": "compute 347*29+18\n"}
    start = time.perf_counter()
    breakdown = Cascade(reward_cfg).score(answer(text), task)
    assert breakdown.outcome == 0.0 and time.perf_counter() - start < 0.5


# --- 9. hedging behind a unit ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "prediction, score",
    [
        ("10081 or 10082", 0.0),
        ("10081 nope 99999", 0.0),
        ("10081 apples and 3 pears", 0.0),
        ("10081 not", 0.0),
        ("10081 m/s^2", 1.0),
        ("10081 apples", 1.0),
        ("$10081", 1.0),
        ("10081 cm3", 1.0),
    ],
)
def test_strip_units_removes_units_not_other_answers(prediction, score):
    assert run_verifier("math", prediction, {"answer": "10081"}, {"strip_units": True}).score == score


# --- found by the fuzzer (benchmarks/reward_fuzz.py) ----------------------------------------------


@pytest.mark.parametrize(
    "prediction, gold, params, score",
    [
        ("5⁰", "50", {}, 0.0),  # a superscript is a power, not a digit
        ("204⁹¹", "20491", {}, 0.0),
        ("1₁₄₀", "1140", {}, 0.0),  # a subscript is an index
        ("1.8026×10⁴", "18026", {}, 1.0),  # and a power of ten written so is a result
        ("1 2", "12", {}, 0.0),  # whitespace joins two numbers
        ("13\u20284", "134", {}, 0.0),
        ("10\xa02", "102", {}, 0.0),
        ("10 081", "10081", {}, 1.0),  # but separates thousands
        ("81.99999993", "82", {"rel_tol": 1e-6}, 0.0),  # an integer gold is exact
        ("10080.99", "10081", {"rel_tol": 1e-3}, 0.0),
        ("60 billion", "60", {"strip_units": True}, 0.0),  # a scale is not a unit
        ("66 hundredths", "66", {"strip_units": True}, 0.0),
        ("35 wrong", "35", {"strip_units": True}, 0.0),
        ("35 apples", "35", {"strip_units": True}, 1.0),
    ],
)
def test_numerals_mean_their_value(prediction, gold, params, score):
    assert run_verifier("math", prediction, {"answer": gold}, params).score == score
    if "strip_units" not in params and "×" not in prediction:  # `numeric` reads plain numbers only
        assert numeric_match(prediction, gold, params.get("rel_tol", 1e-6)) == score
