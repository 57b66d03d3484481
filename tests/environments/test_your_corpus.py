"""Bring your own documents and questions for search: a corpus file becomes the knowledge base and
its BM25 index (with data contracts), question files (question + golden answers) become search
tasks scored by exact match / F1 over the aliases, and a flywheel searches the given documents."""

import json

import pandas as pd
import pytest

from environments.corpus import corpus_kb_rows, load_corpus
from environments.retrieval import BM25Retriever, load_retriever
from environments.search import SearchTool, kb_from_rows, passage
from environments.task_files import TaskFileError, load_task_file
from verifiers.qa import exact_match, token_f1

pytestmark = pytest.mark.yourdata

CORPUS, QUESTIONS = "examples/search/corpus.jsonl", "examples/search/questions.jsonl"


def test_the_example_corpus_loads_as_documents_with_titles():
    docs = load_corpus(CORPUS)
    assert len(docs) == 24 and docs[0] == {"doc_id": "isl-00", "title": "Quibble", "text": docs[0]["text"]}
    kb = kb_from_rows(corpus_kb_rows(docs))
    assert [d["doc_id"] for d in kb.documents] == [d["doc_id"] for d in docs] and kb.documents[0]["title"] == "Quibble"


def test_search_r1_contents_rows_and_parquet_read_too(tmp_path):
    rows = [
        {"id": 1, "contents": '"Tessel"\nTessel grows glass rice.'},
        {"id": 2, "contents": '"Orvin"\nIts capital is Orvport.'},
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "c.parquet")
    docs = load_corpus(str(tmp_path / "c.parquet"))
    assert docs == [
        {"doc_id": "1", "title": "Tessel", "text": "Tessel grows glass rice."},
        {"doc_id": "2", "title": "Orvin", "text": "Its capital is Orvport."},
    ]
    assert passage(docs[1]) == "Orvin: Its capital is Orvport." and passage(docs[0]) == "Tessel grows glass rice."


def test_a_bad_corpus_names_every_row_and_field(tmp_path):
    rows = [
        {"id": "a", "title": "A", "text": "fine"},
        {"title": "B", "text": "no id"},
        {"id": "c", "title": 3, "text": "x"},
        {"id": "d", "text": "   "},
        {"id": "a", "text": "again"},
    ]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(TaskFileError) as err:
        load_corpus(str(tmp_path / "c.jsonl"))
    message = str(err.value)
    assert message.startswith(f"corpus file {tmp_path / 'c.jsonl'} has 4 problem(s)")
    for expected in (
        "row 2: field 'id'",
        "row 3: field 'title'",
        "row 4: field 'text'",
        "row 5: field 'id': 'a' repeats row 1",
    ):
        assert expected in message


def test_question_files_become_search_tasks_with_aliases_and_their_held_out_rows():
    df = load_task_file(QUESTIONS)
    assert len(df) == 48 and set(df["family"]) == {"search"} and (df["split"] == "benchmark").sum() == 12
    row = df[df["task_id"] == "q-13-capital"].iloc[0]
    assert row["prompt"] == "What is the capital of Mossgate?\n" and row["answer"] == "Mosport"
    assert json.loads(row["metadata"])["aliases"] == ["the port of Mosport"]
    task = {**json.loads(row["metadata"]), **row.to_dict()}
    from verifiers.base import run_verifier

    assert run_verifier("exact_match", "The port of Mosport", task, {}).score == 1.0  # an alias, normalized
    assert run_verifier("exact_match", "Mosgate", task, {}).score == 0.0
    # best alias: 2 of its 3 words
    assert token_f1("port Mosport", ["Mosport", "the port of Mosport"]) == pytest.approx(0.8)
    assert token_f1("Mosport city", ["Mosport"]) == pytest.approx(2 / 3) and exact_match("port", ["Mosport"]) == 0.0


def test_hotpotqa_and_nq_shapes_and_bad_questions_are_named(tmp_path):
    rows = [
        {"_id": "5a8b", "question": "Which island settled first?", "answer": "Quibble", "level": 2},
        {"question": "Where?", "golden_answers": []},
        {"question": "", "golden_answers": ["x"]},
    ]
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:1]))
    df = load_task_file(str(tmp_path / "q.jsonl"))
    assert df.iloc[0][["task_id", "family", "level", "answer"]].tolist() == ["5a8b", "search", 2, "Quibble"]
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(TaskFileError) as err:
        load_task_file(str(tmp_path / "q.jsonl"))
    assert "row 2: field 'golden_answers'" in str(err.value) and "row 3: field 'question'" in str(err.value)


def test_the_saved_index_retrieves_what_the_in_memory_one_does(tmp_path):
    docs = load_corpus(CORPUS)
    passages = [passage(d) for d in docs]
    BM25Retriever.build(passages).save(tmp_path)
    queries = ["capital of Mossgate", "Ada Vell", "glass rice", "nothing matches zzz"]
    built = SearchTool(docs, top_k=2).call_many(queries)
    loaded = SearchTool(docs, top_k=2, retriever=load_retriever(tmp_path)).call_many(queries)
    assert [(r.observation, r.error) for r in built] == [(r.observation, r.error) for r in loaded]
    assert "Mossgate is an island" in built[0].observation and built[3].error == "no_results"
    with pytest.raises(ValueError, match="indexes 24 passages; there are 23 documents"):
        SearchTool(docs[:-1], retriever=load_retriever(tmp_path))


def test_the_teacher_searches_a_user_question_and_answers_its_gold():
    from configs.schema import TeacherConfig
    from environments.families import demonstrations, with_detours

    tasks = load_task_file(QUESTIONS).to_dict("records")
    demos = list(
        demonstrations(
            "search", tasks, 10, seed=0, teacher=TeacherConfig(), kb=kb_from_rows(corpus_kb_rows(load_corpus(CORPUS)))
        )
    )
    assert all(
        d.strategy == "question" and d.correct and d.steps[0].args == tasks[i]["prompt"].strip()
        for i, d in enumerate(demos)
    )
    assert (
        with_detours(
            "search", demos, {t["task_id"]: t for t in tasks}, TeacherConfig(negative_fraction=1.0), seed=0, kb=None
        )
        == demos
    )


@pytest.mark.slow
def test_a_flywheel_searches_the_given_documents(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "fw"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from pipelines.run import run_flywheel

    # enough SFT for the micro model to call the search tool in its own rollouts
    outcome = run_flywheel(
        "micro", {"data.corpus_file": CORPUS, "data.task_file": QUESTIONS, "sft.steps": 150, "sft.learning_rate": 3e-3}
    )
    assert len(outcome["rounds"]) == 1 and "search" in outcome["gains"]
    stored = tmp_path / "fw" / "artifacts" / "assets"
    kb = pd.read_parquet(stored / "knowledge_base" / "all.parquet")
    assert sorted(kb["doc_id"]) == sorted(d["doc_id"] for d in load_corpus(CORPUS)) and set(kb["type"]) == {"document"}
    index = pd.read_parquet(stored / "search_index" / "all.parquet")
    assert len(index) == 24 and (index["self_rank"] == 1).all()
    bench = pd.read_parquet(stored / "benchmark_tasks" / "all.parquet")
    train = pd.read_parquet(stored / "training_tasks" / "all.parquet")
    assert set(bench[bench["family"] == "search"]["task_id"]) == set(
        load_task_file(QUESTIONS).query("split == 'benchmark'")["task_id"]
    )
    assert set(train["family"]) == {"search"} and not set(train["task_id"]) & set(bench["task_id"])
    passages = {passage(d) for d in load_corpus(CORPUS)}
    sft = pd.read_parquet(stored / "sft_trajectories" / "all.parquet")
    taught = [obs.split("</information>")[0] for text in sft["completion"] for obs in text.split("<information>")[1:]]
    rollouts = pd.read_parquet(stored / "rollout_batches" / "1.parquet")
    searched = [
        c["result"]
        for calls in rollouts["tool_calls"]
        for c in json.loads(calls)
        if c["name"] == "search" and not c["error"]
    ]
    assert taught and searched
    for observation in taught + searched:  # every passage the tool returned is one of the given documents
        assert all(p in passages for p in _passages(observation, passages)), observation


def _passages(observation: str, passages: set[str]) -> list[str]:
    """The passages an observation is made of (top_k joins them with a space)."""
    found = [p for p in passages if p in observation]
    assert found and sum(len(p) for p in found) + len(found) - 1 >= len(observation.strip()), observation
    return found


@pytest.mark.integrity
def test_copying_the_question_or_the_passage_earns_no_exact_match():
    """As a policy would on a user's question: answer with the question, with the whole passage
    the search returned, or with every alias at once."""
    from verifiers.base import run_verifier

    docs = {d["title"]: passage(d) for d in load_corpus(CORPUS)}
    for row in load_task_file(QUESTIONS).to_dict("records"):
        task = {**json.loads(row["metadata"]), **row}
        island = next(t for t in docs if t in row["prompt"])
        golds = [row["answer"], *task["aliases"]]
        for attempt in (row["prompt"], docs[island]):
            assert run_verifier("exact_match", attempt, task, {}).score == 0.0, attempt
            assert run_verifier("token_f1", attempt, task, {}).score < 0.5, attempt
        # every alias at once: nothing under exact match; token F1 gives partial credit (it is F1:
        # "Mosport the port of Mosport" scores 0.86 against "the port of Mosport"), never full
        stuffed = " ".join(golds)
        assert run_verifier("exact_match", stuffed, task, {}).score == (1.0 if len(golds) == 1 else 0.0)
        assert len(golds) == 1 or run_verifier("token_f1", stuffed, task, {}).score < 1.0
