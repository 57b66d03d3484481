"""Arithmetic level 5: word problems. The model must build the expression from a story that also
states distractor numbers, so copying the prompt into print() (the switch that solves levels 1-4)
does not work. The teacher's demonstrations go through the real interpreter and `math` verifier."""

import json
import random
import re

import pytest

from configs import load_profile
from configs.schema import RewardConfig, TeacherConfig
from environments import families
from environments.arithmetic import (
    DEFAULT_LEVELS,
    LEVELS,
    STORIES,
    WORD_LEVEL,
    demonstrate,
    evaluate,
    generate_tasks,
    make_expression,
    make_word_problem,
)
from environments.contamination import overlaps
from environments.families import build_tools
from environments.family import get_family
from training.rl.scoring import score_records
from training.tokenizer import train_tokenizer
from training.trajectories import build_sft_trajectories, tokenizer_corpus
from verifiers.cascade import Cascade

pytestmark = pytest.mark.realmodel

BENCHMARK_SEED = 1_000_003  # the benchmark's seed offset (assets/data.py)


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks(600, seed=3, split="train", levels=(WORD_LEVEL,))


def numbers_in(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def test_level_5_is_listed_but_opt_in():
    assert LEVELS == get_family("arithmetic").levels == (1, 2, 3, 4, 5) and DEFAULT_LEVELS == (1, 2, 3, 4)
    assert {t["level"] for t in generate_tasks(400, seed=0, split="train")} == set(DEFAULT_LEVELS)
    assert {t["level"] for t in families.generate_tasks("arithmetic", 400, seed=0, split="train")} == set(
        DEFAULT_LEVELS
    )
    for profile in ("tiny", "micro"):  # tiny names levels 1-4; micro names none (the default)
        levels = load_profile(profile).data.families["arithmetic"].levels
        assert WORD_LEVEL not in (levels or get_family("arithmetic").all_default_levels())


def test_templates_are_many_and_all_drawn(tasks):
    assert len(STORIES) >= 12 and len({s.name for s in STORIES}) == len(STORIES)
    assert {json.loads(t["metadata"])["template"] for t in tasks} == {s.name for s in STORIES}


def test_answers_are_integers_equal_to_the_stored_expression(tasks):
    for t in tasks:
        expression = json.loads(t["metadata"])["expression"]
        assert t["level"] == WORD_LEVEL and t["family"] == "arithmetic"
        assert re.fullmatch(r"[1-9]\d*", t["answer"]), t["answer"]  # a positive integer: a count
        assert int(t["answer"]) == evaluate(expression)
        assert "*" in expression and max(int(n) for n in numbers_in(expression)) >= 11  # a 2-3 digit product


def test_every_number_is_an_operand_or_a_distractor(tasks):
    for t in tasks:
        meta = json.loads(t["metadata"])
        operands, distractors = numbers_in(meta["expression"]), meta["distractors"]
        assert 1 <= len(distractors) <= 2
        assert len(set(operands)) == len(operands) and not set(distractors) & set(operands)
        assert sorted(numbers_in(t["prompt"])) == sorted(operands + distractors), t["prompt"]


def test_there_is_no_expression_to_copy(tasks):
    for t in tasks:
        expression = json.loads(t["metadata"])["expression"]
        assert not set(t["prompt"]) & set("+-*/()=^"), t["prompt"]
        assert expression not in t["prompt"]
        assert t["prompt"].endswith("?\n") and t["prompt"].count("\n") == 1  # ends like every arithmetic prompt


def test_deterministic_by_seed():
    again = generate_tasks(200, seed=3, split="train", levels=(WORD_LEVEL,))
    assert again == generate_tasks(200, seed=3, split="train", levels=(WORD_LEVEL,))
    assert [t["prompt"] for t in again] != [
        t["prompt"] for t in generate_tasks(200, seed=4, split="train", levels=(WORD_LEVEL,))
    ]
    assert make_word_problem(random.Random(9)) == make_word_problem(random.Random(9))


LEVEL_SHAPES = {1: r"\d{2}\+\d", 2: r"\d{2}[-+]\d{2}", 3: r"\d{2}\*\d{2}", 4: r"\d{3}\*\d{2}[-+]\d{2}"}


def test_word_problem_ids_never_meet_levels_1_to_4():
    """Ids hash the expression on every level, so no level-5 expression may have a level 1-4 shape."""
    rng = random.Random(0)
    assert all(
        re.fullmatch(shape, make_expression(level, rng)) for level, shape in LEVEL_SHAPES.items() for _ in range(50)
    )
    for t in generate_tasks(3000, seed=5, split="train", levels=(WORD_LEVEL,)):
        expression = json.loads(t["metadata"])["expression"]
        assert not any(re.fullmatch(shape, expression) for shape in LEVEL_SHAPES.values()), expression


def test_benchmark_and_training_word_problems_are_disjoint():
    """The blocking contamination check passes on generated level-5 data: a sibling story (same
    template, other numbers) shares long runs of template text but is not a copy."""
    benchmark = generate_tasks(1200, seed=BENCHMARK_SEED, split="benchmark", levels=(WORD_LEVEL,))
    training = generate_tasks(
        6000, seed=0, split="train", levels=(WORD_LEVEL,), exclude_ids=frozenset(t["task_id"] for t in benchmark)
    )
    assert overlaps(benchmark, training) == []


def test_a_pasted_story_is_still_contamination():
    story = generate_tasks(1, seed=11, split="benchmark", levels=(WORD_LEVEL,))[0]
    pasted = {
        "task_id": "mine-1",
        "prompt": "Read this and answer. " + story["prompt"].replace("How many", "Then say how many"),
    }
    assert overlaps([story], [pasted]) == [
        {"benchmark_id": story["task_id"], "training_id": "mine-1", "how": "shared 13-word run"}
    ]
    # the same story with two numbers in each other's roles is another question with another answer
    a, b = numbers_in(json.loads(story["metadata"])["expression"])[:2]
    swapped = {
        "task_id": "mine-2",
        "prompt": re.sub(rf"\b({a}|{b})\b", lambda m: str(b if m.group() == str(a) else a), story["prompt"]),
    }
    assert swapped["prompt"] != story["prompt"]
    assert overlaps([story], [swapped]) == []


def test_direct_answers_are_near_misses_and_tool_calls_print_the_expression(tasks):
    rng = random.Random(0)
    for t in tasks[:100]:
        expression = json.loads(t["metadata"])["expression"]
        direct = demonstrate(t, rng=rng, p_direct=1.0, hard_levels=(3, 4))  # a config written before level 5
        assert direct.strategy == "direct" and not direct.correct and direct.answer != t["answer"]
        assert len(direct.answer) == len(t["answer"])  # one digit off: plausible, not random
        tool = demonstrate(t, rng=rng, p_direct=0.0, hard_levels=(3, 4))
        assert (
            tool.correct
            and tool.answer == t["answer"]
            and [(s.tool, s.args) for s in tool.steps] == [("code", f"print({expression})")]
        )


def test_alternative_detour_is_the_first_operation():
    task = {
        "task_id": "x",
        "family": "arithmetic",
        "level": WORD_LEVEL,
        "prompt": "...\n",
        "answer": "1020",
        "metadata": json.dumps({"expression": "(47+38)*12"}),
    }
    steps = get_family("arithmetic").detour_steps(task, "alternatives", random.Random(0), None)
    assert [(s.args, s.trained) for s in steps] == [("print(47+38)", False)]


def test_teacher_demonstrations_verify_through_the_interpreter_and_math_verifier(sandbox):
    """As tests/environments/test_families.py does for every family: the teacher's own `correct` flag equals the
    reward cascade's outcome on the tokenized trajectory, the tool calls run in the real sandbox."""
    word = generate_tasks(40, seed=5, split="train", levels=(WORD_LEVEL,))
    mixed = word + generate_tasks(20, seed=5, split="train")
    tok = train_tokenizer(tokenizer_corpus(mixed), 400)
    rows = build_sft_trajectories(
        mixed, tok, build_tools(sandbox=sandbox, kb=None), teacher=TeacherConfig(num_trajectories=180), seed=0
    )
    records = [
        {**r, "group_id": r["trajectory_id"], "round": 0, "step": 0, "num_tool_calls": r["completion"].count("</code>")}
        for r in rows
    ]
    by_id = {t["task_id"]: t for t in mixed}
    scores = score_records(records, by_id, tok, Cascade(RewardConfig(), sandbox, concurrency=2))
    for row, score in zip(rows, scores):
        assert (score["outcome"] == 1.0) == row["correct"], (row["strategy"], row["completion"], score["details"])
    on_words = [r for r in rows if r["level"] == WORD_LEVEL]
    assert {(r["strategy"], r["correct"]) for r in on_words} >= {("tool", True), ("direct", False)}
    for r in on_words:
        task = by_id[r["task_id"]]
        if r["strategy"] == "tool":
            expression = json.loads(task["metadata"])["expression"]
            assert (
                f"<code>print({expression})</code><interpreter>{task['answer']}\n</interpreter><answer>{task['answer']}</answer>"
                in r["completion"]
            )
        assert task["prompt"] in tok.decode(r["prompt_ids"])  # the scratch tokenizer round-trips the story
