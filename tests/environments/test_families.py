"""The three task families behind one interface: registries agree, the mixture adds up, and on
every family the teacher's own judgement of a trajectory equals what the reward cascade says."""

import pytest

from configs.schema import RewardConfig, TeacherConfig
from environments.families import build_tools, generate_tasks, mixture_counts
from environments.family import FAMILIES, get_family
from environments.search import generate_kb
from training.rl.scoring import score_records
from training.tokenizer import train_tokenizer
from training.trajectories import build_sft_trajectories, tokenizer_corpus
from verifiers.cascade import Cascade

MODULES = ("arithmetic", "search", "code")


def test_the_shipped_verifiers_are_the_families_defaults():
    assert set(MODULES) <= set(FAMILIES.names()) and set(MODULES) == set(RewardConfig().verifiers)
    for family in MODULES:
        assert RewardConfig().verifiers[family] == get_family(family).default_verifier


@pytest.mark.parametrize(
    "mixture, expected",
    [
        (None, {"arithmetic": 50, "search": 25, "code": 25}),
        ({"arithmetic": 1, "search": 3}, {"arithmetic": 25, "search": 75, "code": 0}),
    ],
)
def test_mixture_counts(mixture, expected):
    teacher = TeacherConfig(num_trajectories=100, mixture=mixture)
    assert mixture_counts(teacher, {"arithmetic": 200, "search": 100, "code": 100}) == expected


def test_mixture_without_weight_for_present_families_is_an_error():
    with pytest.raises(ValueError, match="no weight"):
        mixture_counts(TeacherConfig(mixture={"code": 1.0}), {"arithmetic": 10})


@pytest.fixture(scope="module")
def world():
    kb = generate_kb(3, n_people=30, n_companies=8, n_cities=8, n_countries=3)
    tasks = [t for family in MODULES for t in generate_tasks(family, 40, seed=5, split="train", kb=kb)]
    tok = train_tokenizer(tokenizer_corpus(tasks, [d["text"] for d in kb.documents]), 400)
    return kb, tasks, tok


def test_teacher_correctness_equals_the_reward_cascade_on_every_family(world, sandbox):
    kb, tasks, tok = world
    teacher = TeacherConfig(num_trajectories=240)
    rows = build_sft_trajectories(tasks, tok, build_tools(sandbox=sandbox, kb=kb), teacher=teacher, seed=0, kb=kb)
    assert {r["family"] for r in rows} == set(MODULES)
    records = [
        {
            **r,
            "group_id": r["trajectory_id"],
            "round": 0,
            "step": 0,
            "num_tool_calls": r["completion"].count("</search>") + r["completion"].count("</code>"),
        }
        for r in rows
    ]
    scores = score_records(
        records, {t["task_id"]: t for t in tasks}, tok, Cascade(RewardConfig(), sandbox, concurrency=2)
    )
    for row, score in zip(rows, scores):
        assert (score["outcome"] == 1.0) == row["correct"], (
            row["family"],
            row["strategy"],
            row["completion"],
            score["details"],
        )
    strategies = {(r["family"], r["strategy"]) for r in rows}
    assert {
        ("search", "search"),
        ("search", "direct"),
        ("search", "partial"),
        ("code", "test"),
        ("code", "direct"),
    } <= strategies


def test_search_observations_are_the_documents_along_the_path(world, sandbox):
    kb, tasks, tok = world
    rows = build_sft_trajectories(
        [t for t in tasks if t["family"] == "search"],
        tok,
        build_tools(sandbox=sandbox, kb=kb),
        teacher=TeacherConfig(num_trajectories=20, search={"p_direct": 0.0, "p_partial": 0.0}),
        seed=0,
        kb=kb,
    )
    texts = {d["title"]: d["text"] for d in kb.documents}
    for row in rows:
        for entity in row["completion"].split("<search>")[1:]:
            query = entity.split("</search>")[0]
            assert f"<information>{texts[query]}" in row["completion"]
        observed = [i for i, m in zip(row["completion_ids"], row["tool_mask"]) if m == 0]
        assert observed and observed[0] == tok.convert_tokens_to_ids("<information>")


@pytest.mark.parametrize("kind", ["negative", "alternatives"])
def test_detours_are_shown_but_masked_from_the_loss(world, sandbox, kind):
    kb, tasks, tok = world
    teacher = TeacherConfig(
        num_trajectories=150,
        negative_fraction=1.0 if kind == "negative" else 0.0,
        alternatives_fraction=1.0 if kind == "alternatives" else 0.0,
    )
    rows = build_sft_trajectories(tasks, tok, build_tools(sandbox=sandbox, kb=kb), teacher=teacher, seed=1, kb=kb)
    detoured = [r for r in rows if r["strategy"].endswith("+" + kind)]
    assert {r["family"] for r in detoured} == set(MODULES)
    for r in detoured:
        untrained = [i for i, (t, m) in enumerate(zip(r["tool_mask"], r["loss_mask"])) if t == 1 and m == 0]
        assert untrained and untrained[0] == 0, "the detour comes first and is not trained on"
        assert all(m <= t for t, m in zip(r["tool_mask"], r["loss_mask"]))
        assert r["loss_mask"][-1] == 1 and r["correct"], "the answer is still taught"
    plain = [r for r in rows if "+" not in r["strategy"]]
    assert all(r["loss_mask"] == r["tool_mask"] for r in plain)
