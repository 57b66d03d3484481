import json
import random
import re
from collections import Counter

import pytest

from environments.base import TASK_COLUMNS
from environments.search import (
    LEVELS,
    MAX_QUERY_CHARS,
    NAME_POOL,
    QUESTIONS,
    SearchTool,
    answer_turn,
    demonstrate,
    demonstrations,
    generate_kb,
    generate_tasks,
    kb_from_rows,
    kb_to_rows,
    search_turn,
    task_id_for,
    task_space,
)
from verifiers.qa import exact_match

SIZES = dict(n_people=300, n_companies=60, n_cities=60, n_countries=12)


@pytest.fixture(scope="module")
def kb():
    return generate_kb(3, **SIZES)


@pytest.fixture(scope="module")
def tool(kb):
    return SearchTool(kb.documents)


@pytest.fixture(scope="module")
def all_tasks(kb):
    return generate_tasks(kb, sum(len(task_space(kb, level)) for level in LEVELS), seed=0, split="train")


def words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z]+", text))


def mentions(text: str, name: str) -> bool:
    return words(name) <= words(text)


# ---------------------------------------------------------------- knowledge base


def test_kb_is_deterministic_with_unique_made_up_names(kb):
    assert generate_kb(3, **SIZES) == kb
    assert generate_kb(4, **SIZES) != kb
    name_words = [w for name in kb.entities for w in name.split()]
    assert len(name_words) == len(set(name_words)) == 2 * 300 + 60 + 60 + 12
    assert all(re.fullmatch(r"[A-Z][a-z]{3}", w) for w in name_words)
    assert [len(n.split()) for n, t in kb.entities.items() if t == "person"] == [2] * 300
    from bm25s.stopwords import STOPWORDS_EN

    template_words = {w.lower() for q in QUESTIONS.values() for w in words(q)}
    template_words |= {"born", "works", "company", "city", "based"}  # the documents' words
    assert not {w.lower() for w in name_words} & (set(STOPWORDS_EN) | template_words | {"data", "memo", "nazi"})
    assert len(NAME_POOL) == len(set(NAME_POOL)) > 1500


def test_every_relation_has_its_document(kb):
    by_title = {d["title"]: d["text"] for d in kb.documents}
    assert set(by_title) == {n for n, t in kb.entities.items() if t != "country"}
    assert len({d["doc_id"] for d in kb.documents}) == len(kb.documents)
    for (subject, _), obj in kb.relations.items():
        assert mentions(by_title[subject], obj)
    for text in by_title.values():
        assert text.count(".") == 2 and len(text.split()) <= 11
    assert {kb.relations[c, "in_country"] for c in kb.of_type("city")} == set(kb.of_type("country"))


def test_kb_rows_round_trip_through_parquet(kb, tmp_path):
    pd = pytest.importorskip("pandas")
    assert kb_from_rows(kb_to_rows(kb)) == kb
    pd.DataFrame(kb_to_rows(kb)).to_parquet(tmp_path / "kb.parquet")
    assert kb_from_rows(pd.read_parquet(tmp_path / "kb.parquet").to_dict("records")) == kb


def test_kb_rejects_impossible_sizes():
    with pytest.raises(ValueError, match="name words"):
        generate_kb(0, n_people=5000, n_companies=1, n_cities=2, n_countries=1)
    with pytest.raises(ValueError, match="two cities"):
        generate_kb(0, n_people=1, n_companies=1, n_cities=1, n_countries=1)


# ---------------------------------------------------------------- tasks


def test_task_rows_and_content_ids(kb):
    train = generate_tasks(kb, 50, seed=1, split="train")
    test = generate_tasks(kb, 50, seed=1, split="test")
    assert [t["task_id"] for t in train] == [t["task_id"] for t in test]
    assert len({t["task_id"] for t in train}) == 50
    for task in train:
        meta = json.loads(task["metadata"])
        assert tuple(task) == TASK_COLUMNS and task["family"] == "search" and task["split"] == "train"
        assert task["prompt"] == QUESTIONS[tuple(meta["relations"])].format(meta["seed_entity"]) + "\n"
        assert task["task_id"] == task_id_for(task["prompt"].strip())
        assert task["level"] == len(meta["relations"]) == len(meta["path"]) - 1
        assert meta["path"][0] == meta["seed_entity"] and meta["path"][-1] == task["answer"]


def test_levels_weights_and_exclusion(kb):
    assert {t["level"] for t in generate_tasks(kb, 40, seed=2, split="train", levels=(3,))} == {3}
    assert {t["level"] for t in generate_tasks(kb, 40, seed=2, split="train", level_weights=(0, 1, 0))} == {2}
    mixed = Counter(t["level"] for t in generate_tasks(kb, 600, seed=2, split="train", level_weights=(1, 1, 2)))
    assert mixed[3] > mixed[1] and mixed[3] > mixed[2]
    train = generate_tasks(kb, 200, seed=3, split="train")
    test = generate_tasks(kb, 200, seed=4, split="test", exclude_ids=frozenset(t["task_id"] for t in train))
    assert not {t["task_id"] for t in train} & {t["task_id"] for t in test}


def test_space_too_small_raises(kb):
    level3 = len(task_space(kb, 3))
    assert level3 == 300 and len(task_space(kb, 1)) == 720 and len(task_space(kb, 2)) == 660
    assert len({t["task_id"] for t in generate_tasks(kb, level3, seed=5, split="train", levels=(3,))}) == level3
    with pytest.raises(ValueError, match="only 300 distinct"):
        generate_tasks(kb, level3 + 1, seed=5, split="train", levels=(3,))
    some = frozenset(t["task_id"] for t in generate_tasks(kb, 10, seed=6, split="train", levels=(3,)))
    with pytest.raises(ValueError, match="only 290 distinct"):
        generate_tasks(kb, level3, seed=5, split="train", levels=(3,), exclude_ids=some)


def test_no_single_document_answers_a_multi_hop_question(kb, all_tasks):
    docs_with: dict[str, set[int]] = {}  # word -> documents containing it
    for i, doc in enumerate(kb.documents):
        for word in words(doc["text"]):
            docs_with.setdefault(word, set()).add(i)

    def containing(name: str) -> set[int]:
        return set.intersection(*(docs_with.get(w, set()) for w in name.split()))

    multi_hop = [t for t in all_tasks if t["level"] >= 2]
    assert len(multi_hop) == 960
    for task in multi_hop:
        seed = json.loads(task["metadata"])["seed_entity"]
        assert containing(seed) and not containing(seed) & containing(task["answer"]), task
    one_hop = [t for t in all_tasks if t["level"] == 1]  # the check does see a shared document
    assert all(containing(json.loads(t["metadata"])["seed_entity"]) & containing(t["answer"]) for t in one_hop)


# ---------------------------------------------------------------- search tool


def test_bare_name_query_ranks_own_document_first_for_every_entity(kb, tool):
    docs = [d for d in kb.documents]
    results = tool.call_many([d["title"] for d in docs])
    assert [r.observation for r in results] == [d["text"] + "\n" for d in docs]
    assert all(r.error is None and r.latency_s >= 0 for r in results)


def test_batched_equals_one_by_one_and_is_deterministic(kb, tool):
    rng = random.Random(0)
    queries = [rng.choice(list(kb.entities)) for _ in range(30)] + ["born in", "company Mirat city", ""]
    batched = [(r.observation, r.error) for r in tool.call_many(queries)]
    single = [(r.observation, r.error) for q in queries for r in tool.call_many([q])]
    assert batched == single == [(r.observation, r.error) for r in SearchTool(kb.documents).call_many(queries)]
    assert tool.call_many([]) == []


def test_no_results_and_query_cap(kb, tool):
    for query in ["", "   ", "the is in", "Qqqqq", "???"]:
        (result,) = tool.call_many([query])
        assert (result.observation, result.error) == ("no results\n", "no_results")
    city = kb.of_type("city")[0]
    padding = "xyzzy " * (MAX_QUERY_CHARS // 6 + 1)
    before, after = tool.call_many([city + " " + padding, padding + city])
    assert before.error is None and before.observation.startswith(city + " is a city")
    assert after.error == "no_results"  # the name sits past the cap


def test_top_k_joins_passages_without_titles(kb):
    city = kb.of_type("city")[0]
    (result,) = SearchTool(kb.documents, top_k=3).call_many([city])
    assert result.observation.startswith(f"{city} is a city.") and result.observation.endswith(".\n")
    assert result.observation.count(city) >= 3 and "doc-" not in result.observation


def test_tool_is_quiet(kb, capsys):
    SearchTool(kb.documents).call_many(["anything", kb.of_type("company")[0]])
    assert capsys.readouterr() == ("", "")


# ---------------------------------------------------------------- teacher


def test_expert_follows_the_path_and_its_trajectory_is_followable(kb, tool, all_tasks):
    rng = random.Random(0)
    demos = [demonstrate(t, kb, rng=rng, p_direct=0.0, p_partial=0.0) for t in all_tasks]
    queries = [step.args for d in demos for step in d.steps]
    observations = iter(r.observation for r in tool.call_many(queries))
    for task, demo in zip(all_tasks, demos):
        path = json.loads(task["metadata"])["path"]
        assert demo.strategy == "search" and demo.correct
        assert [s.tool for s in demo.steps] == ["search"] * task["level"]
        assert [s.args for s in demo.steps] == path[:-1]
        assert demo.answer == task["answer"] and exact_match(demo.answer, task["answer"]) == 1.0
        for nxt in path[1:]:
            assert mentions(next(observations), nxt)  # each observation reveals the next entity


def test_direct_guesses_and_partial_stops_early(kb, all_tasks):
    rng = random.Random(1)
    direct = [demonstrate(t, kb, rng=rng, p_direct=1.0, p_partial=0.0) for t in all_tasks]
    for task, demo in zip(all_tasks, direct):
        assert demo.strategy == "direct" and demo.steps == ()
        assert kb.entities[demo.answer] == kb.entities[task["answer"]]
        assert demo.correct == (demo.answer == task["answer"]) == (exact_match(demo.answer, task["answer"]) == 1.0)
    assert sum(d.correct for d in direct) < 0.1 * len(direct)
    for task in all_tasks:
        demo = demonstrate(task, kb, rng=rng, p_direct=0.0, p_partial=1.0)
        path = json.loads(task["metadata"])["path"]
        if task["level"] == 1:
            assert demo.strategy == "search" and demo.correct
            continue
        hops = len(demo.steps)
        assert demo.strategy == "partial" and 1 <= hops < task["level"] and demo.notes == {"hops_searched": hops}
        assert [s.args for s in demo.steps] == path[:hops] and demo.answer == path[hops]
        assert not demo.correct and exact_match(demo.answer, task["answer"]) == 0.0


def test_strategy_frequencies_match_probabilities(kb, all_tasks):
    demos = list(demonstrations(all_tasks, kb, 6000, seed=7, p_direct=0.2, p_partial=0.3))
    levels = [all_tasks[i % len(all_tasks)]["level"] for i in range(6000)]
    assert abs(sum(d.strategy == "direct" for d in demos) / 6000 - 0.2) < 0.03
    multi = [d for d, level in zip(demos, levels) if level >= 2]
    assert abs(sum(d.strategy == "partial" for d in multi) / len(multi) - 0.3) < 0.03
    assert all(d.strategy != "partial" for d, level in zip(demos, levels) if level == 1)
    assert list(demonstrations(all_tasks, kb, 50, seed=7, p_direct=0.2, p_partial=0.3)) == demos[:50]
    with pytest.raises(ValueError):
        demonstrate(all_tasks[0], kb, rng=random.Random(0), p_direct=0.7, p_partial=0.5)


def test_turns():
    assert search_turn("Tavo Relu") == "<search>Tavo Relu</search>"
    assert answer_turn("Mirat") == "<answer>Mirat</answer>"
