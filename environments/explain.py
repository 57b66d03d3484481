"""Open-ended descriptions: the family no rule can verify, decided by the judge tier.

"Describe Tavo in one sentence." Any true sentence about Tavo that the corpus supports is right,
in any wording ("Tavo was born in Kimu and works for Dasu", "Born in Kimu, Tavo works at Dasu"),
and one that states a wrong relation is wrong. Exact match and token F1 cannot decide that (a
right paraphrase and a wrong one share most words), so this family declares `open_ended` and its
default verifier is `judge` (verifiers/judge.py): the task's reference is the entity's document,
and the judge compares the answer with it under the rubric.

The policy searches the entity (the search family's BM25 tool over the same knowledge base) and
describes what it read. The teacher paraphrases the document with one of a few templates; with
`p_wrong` it swaps one related entity for another of the same type (a confident wrong fact), so
SFT data, like the other families', has detours the outcome must tell apart.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Iterator

from pydantic import BaseModel, ConfigDict, Field

from configs.schema import VerifierSpec
from environments.arithmetic import answer_turn
from environments.base import Demonstration, KnowledgeBase, Step
from environments.family import TaskFamily, register_family
from environments.search import TOOL, document_text, search_turn

FAMILY = "explain"
KINDS = ("person", "company", "city")  # the entities with a document
# kind -> (relations described, paraphrase templates over them)
PARAPHRASES = {
    "person": (
        ("born_in", "works_for"),
        (
            "{name} was born in {born_in} and works for {works_for}.",
            "{name} works for {works_for} and was born in {born_in}.",
            "Born in {born_in}, {name} works at {works_for}.",
        ),
    ),
    "company": (("based_in",), ("{name} is a company based in {based_in}.", "{name} has its base in {based_in}.")),
    "city": (("in_country",), ("{name} is a city in {in_country}.", "{name} lies in {in_country}.")),
}


def task_id_for(question: str) -> str:
    return f"{FAMILY}-{hashlib.sha1(question.encode()).hexdigest()[:12]}"


def task_record(kb: KnowledgeBase, name: str, split: str) -> dict:
    question = f"Describe {name} in one sentence."
    return {
        "task_id": task_id_for(question),
        "family": FAMILY,
        "level": 1,
        "prompt": question + "\n",
        "answer": document_text(name, kb.entities[name], kb.relations),  # the judge's reference
        "split": split,
        "metadata": json.dumps({"open_ended": True, "entity": name}),
    }


def generate_tasks(kb: KnowledgeBase, n: int, *, seed: int, split: str, exclude_ids: frozenset[str]) -> list[dict]:
    records = [task_record(kb, name, split) for kind in KINDS for name in kb.of_type(kind)]
    pool = [r for r in records if r["task_id"] not in exclude_ids]
    if len(pool) < n:
        raise ValueError(
            f"only {len(pool)} distinct explain tasks (one per person, company and city) outside exclude_ids; {n} requested"
        )
    random.Random(seed).shuffle(pool)
    return pool[:n]


def describe(kb: KnowledgeBase, name: str, rng: random.Random, *, wrong: bool) -> str:
    """A paraphrase of `name`'s document; `wrong`: one related entity replaced by another of its type."""
    relations, templates = PARAPHRASES[kb.entities[name]]
    facts = {relation: kb.relations[name, relation] for relation in relations}
    if wrong:
        relation = rng.choice(relations)
        true = facts[relation]
        facts[relation] = rng.choice([e for e in kb.of_type(kb.entities[true]) if e != true])
    return rng.choice(templates).format(name=name, **facts)


class ExplainTeacher(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    p_wrong: float = Field(0.2, ge=0.0, le=1.0, description="Probability of describing one relation wrongly.")


class Explain(TaskFamily):
    name, levels, tools = FAMILY, (1,), (TOOL,)
    default_verifier = VerifierSpec(name="judge")
    teacher_params = ExplainTeacher
    needs_kb = True
    open_ended = True

    def generate_tasks(self, n, *, seed, split, levels, level_weights, exclude_ids, kb):
        if kb is None:
            raise ValueError("the explain family needs the knowledge base to generate tasks")
        return generate_tasks(kb, n, seed=seed, split=split, exclude_ids=exclude_ids)

    def demonstrations(self, tasks, n, *, seed, teacher, kb) -> Iterator[Demonstration]:
        if kb is None:
            raise ValueError("the explain teacher needs the knowledge base")
        rng = random.Random(seed)
        for i in range(n):
            task = tasks[i % len(tasks)]
            name = json.loads(task["metadata"])["entity"]
            wrong = rng.random() < teacher.p_wrong
            yield Demonstration(
                task["task_id"],
                "wrong" if wrong else "search",
                (Step(TOOL, name),),
                describe(kb, name, rng, wrong=wrong),
                not wrong,
            )

    def detour_steps(self, task, kind, rng, kb):
        if kind == "negative":  # the whole question as the query
            return (Step(TOOL, task["prompt"].strip().rstrip("."), trained=False),)
        return ()

    def tokenizer_texts(self, task):
        name = json.loads(task["metadata"])["entity"]
        yield task["prompt"] + search_turn(name) + answer_turn(task["answer"])


register_family(Explain())
