"""Multi-hop search over a synthetic knowledge base (Search-R1 style): tasks, a BM25 tool and an
imperfect teacher.

The knowledge base is a small graph of made-up people, companies, cities and countries with four
relations (born_in, works_for, based_in, in_country). Each person, company and city has one short
document stating only its own relations, so a question is a chain of relation projections in
WebShaper's sense (Tao et al., 2025): level = number of hops, and every hop needs a different
document, which rules out the single-document shortcut. The policy searches by copying an entity
name into `<search>…</search>` and reads `<information>…</information>` (Jin et al., 2025).

Everything is short and regular because the policy is a tiny model that must learn by copying.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from typing import Iterable, Iterator

from pydantic import BaseModel, ConfigDict, Field

from configs.schema import VerifierSpec
from environments.arithmetic import answer_turn  # noqa: F401 - re-exported: the same <answer> turn
from environments.base import Demonstration, KnowledgeBase, Step
from environments.family import TaskFamily, register_family
from environments.retrieval import BM25Retriever, Retriever
from environments.tools import ToolResult
from verifiers.protocol import SEARCH_CLOSE, SEARCH_OPEN

FAMILY = "search"
TOOL = "search"  # the tool's key in verifiers.protocol.TOOL_TAGS
LEVELS = (1, 2, 3)
TYPES = ("person", "company", "city", "country")
SUBJECT_TYPE = {"born_in": "person", "works_for": "person", "based_in": "company", "in_country": "city"}
OBJECT_TYPE = {"born_in": "city", "works_for": "company", "based_in": "city", "in_country": "country"}
# Relation chain -> question template. Fixed and few, so the chain is readable off the wording.
QUESTIONS = {
    ("born_in",): "where was {} born?",
    ("works_for",): "who does {} work for?",
    ("based_in",): "where is {} based?",
    ("in_country",): "which country is {} in?",
    ("born_in", "in_country"): "which country was {} born in?",
    ("works_for", "based_in"): "where is the company {} works for based?",
    ("based_in", "in_country"): "which country is {} based in?",
    ("works_for", "based_in", "in_country"): "which country is the company {} works for based in?",
}
MAX_QUERY_CHARS = 100  # longer than any name query; stops a degenerate policy from searching its whole context

# Names are two CV syllables ("Tavo", "Relu"). The last vowel is never "e" because silent-e words
# (made, tone, rule) are most of the English words of this shape; the rest of this shape's English
# words, well-known names and places, and a few unfortunate ones were picked out of the 2,000
# candidates by hand. Two equal syllables (Lulu, Mama) are excluded by construction.
_ONSETS, _VOWELS, _FINAL_VOWELS = "dklmnrstvz", "aeiou", "aiou"
_NOT_NAMES = frozenset(
    """
dado dali data deli demi demo desi deva dina dino diva dora dosa duma dura duro
kaka kaki kali kama kami kana kara karo kata kava keno kilo kina kino kira kiva kola kona kora koto kudo kudu
kuna kuru kuso lama lana lari lava lena leva levi lido lila lima limo lino lira lisa lita lobo loli lola loma
lota loti ludo luna mako mala mali mana mano mara masa mata memo menu mesa meta midi mila mina mini mira miro
miso modi mola mona mono mora moto mozo mula muni muso nada nadi nano nara nasa nazi nemo nero nina nino nisi
nona nora nori nota nova nuda nudi nudo raki raku rama rami rana rani rasa rata ravi raza redo reno rima rimu
rita riva roma rosa rota roti roto rumi ruta saki sala sama sami sara sari sati sato semi sera seta sida sika
silo sima sita siva soda sola soli solo soma sora sori soto sudo sumo sura taka tala tara taro tela tiki tina
tiro tito todo tola tomo tora tori toro tosa tula tuna vada vara vasa vatu veda vela vena vera veto vina vino
visa vita viva vivo zara zeno zero zeta zika zima zola zona zori zulu zuni
""".split()
)
NAME_POOL = tuple(
    name.capitalize()
    for name in (a + b + c + d for a in _ONSETS for b in _VOWELS for c in _ONSETS for d in _FINAL_VOWELS)
    if name not in _NOT_NAMES and name[:2] != name[2:]
)


def document_text(name: str, kind: str, relations: dict[tuple[str, str], str]) -> str:
    """The entity's own relations only, its name stated twice: a bare-name query then ranks this
    document above every document that merely mentions the name once (higher tf, shorter)."""
    if kind == "person":
        return f"{name} was born in {relations[name, 'born_in']}. {name} works for {relations[name, 'works_for']}."
    if kind == "company":
        return f"{name} is a company. {name} is based in {relations[name, 'based_in']}."
    if kind == "city":
        return f"{name} is a city. {name} is in {relations[name, 'in_country']}."
    raise ValueError(f"{kind} entities have no document")


def generate_kb(seed: int, *, n_people: int, n_companies: int, n_cities: int, n_countries: int) -> KnowledgeBase:
    if min(n_people, n_companies, n_countries) < 1 or n_cities < 2:
        raise ValueError("need at least one person, company and country, and two cities")
    n_words = 2 * n_people + n_companies + n_cities + n_countries
    if n_words > len(NAME_POOL):
        raise ValueError(f"the KB needs {n_words} distinct name words; only {len(NAME_POOL)} exist")
    rng = random.Random(seed)
    # Every name word is used once in the whole KB, so a person's words occur in their document only.
    words = iter(rng.sample(NAME_POOL, n_words))
    people = [f"{next(words)} {next(words)}" for _ in range(n_people)]
    companies, cities, countries = ([next(words) for _ in range(k)] for k in (n_companies, n_cities, n_countries))
    relations: dict[tuple[str, str], str] = {}
    for i, city in enumerate(cities):  # round robin: every country has a city
        relations[city, "in_country"] = countries[i % n_countries]
    for company in companies:
        relations[company, "based_in"] = rng.choice(cities)
    for person in people:
        employer = relations[person, "works_for"] = rng.choice(companies)
        # Born elsewhere than the employer's city: otherwise the person's own document would
        # contain the answer to "where is the company X works for based?" (a one-hop shortcut).
        relations[person, "born_in"] = rng.choice([c for c in cities if c != relations[employer, "based_in"]])
    entities = {
        **dict.fromkeys(people, "person"),
        **dict.fromkeys(companies, "company"),
        **dict.fromkeys(cities, "city"),
        **dict.fromkeys(countries, "country"),
    }
    documents = [
        {"doc_id": f"doc-{i:05d}", "title": name, "text": document_text(name, kind, relations)}
        for i, (name, kind) in enumerate((n, k) for n, k in entities.items() if k != "country")
    ]
    return KnowledgeBase(entities, relations, documents)


def kb_to_rows(kb: KnowledgeBase) -> list[dict]:
    """One row per entity (name, type, relations as JSON, its document or "" when it has none; the
    title is the name: environments/corpus.py writes rows of the same shape for a user's corpus)."""
    docs = {d["title"]: d for d in kb.documents}
    own: dict[str, dict[str, str]] = {name: {} for name in kb.entities}
    for (subject, relation), obj in kb.relations.items():
        own[subject][relation] = obj
    return [
        {
            "name": name,
            "type": kind,
            "relations": json.dumps(own[name]),
            "doc_id": docs.get(name, {}).get("doc_id", ""),
            "title": name,
            "text": docs.get(name, {}).get("text", ""),
        }
        for name, kind in kb.entities.items()
    ]


def kb_from_rows(rows: Iterable[dict]) -> KnowledgeBase:
    rows = list(rows)
    relations = {(row["name"], r): o for row in rows for r, o in json.loads(row["relations"]).items()}
    documents = [
        {"doc_id": row["doc_id"], "title": row.get("title") or row["name"], "text": row["text"]}
        for row in rows
        if row["doc_id"]
    ]
    return KnowledgeBase({row["name"]: row["type"] for row in rows}, relations, documents)


# ---------------------------------------------------------------- tasks


def follow(kb: KnowledgeBase, seed_entity: str, chain: tuple[str, ...]) -> list[str]:
    """[seed, e1, ..., answer]: the composition of the chain's relation projections."""
    path = [seed_entity]
    for relation in chain:
        path.append(kb.relations[path[-1], relation])
    return path


def task_id_for(question: str) -> str:
    """Content-addressed, as in arithmetic: the same question is the same task in every split."""
    return f"{FAMILY}-{hashlib.sha1(question.encode()).hexdigest()[:12]}"


def task_record(kb: KnowledgeBase, seed_entity: str, chain: tuple[str, ...], split: str) -> dict:
    question = QUESTIONS[chain].format(seed_entity)
    path = follow(kb, seed_entity, chain)
    return {
        "task_id": task_id_for(question),
        "family": FAMILY,
        "level": len(chain),
        "prompt": question + "\n",
        "answer": path[-1],
        "split": split,
        "metadata": json.dumps({"seed_entity": seed_entity, "relations": list(chain), "path": path}),
    }


def task_space(kb: KnowledgeBase, level: int) -> list[tuple[str, tuple[str, ...]]]:
    """Every (seed entity, chain) of `level` hops: the whole space generate_tasks samples from."""
    return [(seed, chain) for chain in QUESTIONS if len(chain) == level for seed in kb.of_type(SUBJECT_TYPE[chain[0]])]


def generate_tasks(
    kb: KnowledgeBase,
    n: int,
    *,
    seed: int,
    split: str,
    levels: Iterable[int] = LEVELS,
    level_weights: Iterable[float] | None = None,
    exclude_ids: frozenset[str] = frozenset(),
) -> list[dict]:
    """`n` distinct tasks not in `exclude_ids`, levels drawn by weight (a level that runs out
    leaves the draw). Raises if the space holds fewer than `n`."""
    rng = random.Random(seed)
    levels = list(levels)
    weights = list(level_weights) if level_weights is not None else [1.0] * len(levels)
    pools: dict[int, list[dict]] = {}
    for level, weight in zip(levels, weights):
        if weight > 0:
            records = (task_record(kb, s, c, split) for s, c in task_space(kb, level))
            pools[level] = [r for r in records if r["task_id"] not in exclude_ids]
            rng.shuffle(pools[level])
    available = sum(map(len, pools.values()))
    if available < n:
        raise ValueError(
            f"only {available} distinct search tasks at levels {levels} outside exclude_ids; {n} requested"
        )
    tasks = []
    for _ in range(n):
        live = [level for level in pools if pools[level]]
        level = rng.choices(live, [weights[levels.index(level)] for level in live])[0]
        tasks.append(pools[level].pop())
    return tasks


# ---------------------------------------------------------------- the search tool


def passage(document: dict) -> str:
    """What the tool returns for a document: its text, led by its title when the text does not
    already name it (a user's corpus; the generated documents state their entity's name)."""
    title, text = document.get("title") or "", document["text"]
    return text if not title or title in text else f"{title}: {text}"


class SearchTool:
    """A retriever over the documents' passages (BM25 unless given one: environments/retrieval.py),
    queried in batches; the top_k passages that match come back."""

    name = TOOL

    def __init__(
        self,
        documents: list[dict],
        top_k: int = 1,
        max_query_chars: int = MAX_QUERY_CHARS,
        retriever: Retriever | None = None,
    ):
        if not documents or top_k < 1:
            raise ValueError("SearchTool needs documents and top_k >= 1")
        self.texts = [passage(d) for d in documents]
        self.top_k = min(top_k, len(self.texts))
        self.max_query_chars = max_query_chars
        self.retriever = retriever or BM25Retriever.build(self.texts)
        if self.retriever.size != len(self.texts):
            raise ValueError(
                f"the retriever indexes {self.retriever.size} passages; there are {len(self.texts)} documents"
            )

    def call_many(self, queries: list[str]) -> list[ToolResult]:
        if not queries:
            return []
        start = time.perf_counter()
        doc_ids, scores = self.retriever.retrieve([q[: self.max_query_chars] for q in queries], self.top_k)
        per_call = (time.perf_counter() - start) / len(queries)
        results = []
        for ids, row_scores in zip(doc_ids, scores):
            passages = [self.texts[i] for i, score in zip(ids, row_scores) if score > 0]  # 0: no term matched
            if passages:
                results.append(ToolResult(" ".join(passages) + "\n", None, per_call))
            else:
                results.append(ToolResult("no results\n", "no_results", per_call))
        return results


# ---------------------------------------------------------------- teacher


def search_turn(query: str) -> str:
    return f"{SEARCH_OPEN}{query}{SEARCH_CLOSE}"


def demonstrate(
    task: dict, kb: KnowledgeBase, *, rng: random.Random, p_direct: float, p_partial: float
) -> Demonstration:
    """The expert searches each entity on the path and answers the last one it reads. With
    probability `p_direct` the teacher guesses an entity of the answer's type without searching
    (right only by luck); with `p_partial` (2+ hops) it stops early and answers the intermediate
    entity it last read: the multi-hop shortcut RL has to unlearn."""
    if not (0 <= p_direct and 0 <= p_partial and p_direct + p_partial <= 1):
        raise ValueError(f"need probabilities with p_direct + p_partial <= 1, got {p_direct}, {p_partial}")
    path = json.loads(task["metadata"]).get("path")
    if path is None:  # a user's question: no known path, so the teacher searches the question and gives the gold answer
        return Demonstration(task["task_id"], "question", (Step(TOOL, task["prompt"].strip()),), task["answer"], True)
    gold, level, draw = task["answer"], task["level"], rng.random()
    if draw < p_direct:
        guess = rng.choice(kb.of_type(kb.entities[gold]))
        return Demonstration(task["task_id"], "direct", (), guess, guess == gold)
    if level >= 2 and draw < p_direct + p_partial:
        hops = rng.randint(1, level - 1)
        steps = tuple(Step(TOOL, name) for name in path[:hops])
        return Demonstration(task["task_id"], "partial", steps, path[hops], path[hops] == gold, {"hops_searched": hops})
    steps = tuple(Step(TOOL, name) for name in path[:-1])
    return Demonstration(task["task_id"], "search", steps, gold, True)


def demonstrations(
    tasks: list[dict], kb: KnowledgeBase, n: int, *, seed: int, p_direct: float, p_partial: float
) -> Iterator[Demonstration]:
    rng = random.Random(seed)
    for i in range(n):
        yield demonstrate(tasks[i % len(tasks)], kb, rng=rng, p_direct=p_direct, p_partial=p_partial)


# ---------------------------------------------------------------- the family


class SearchTeacher(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    p_direct: float = Field(0.3, ge=0.0, le=1.0, description="Probability of guessing without searching (wrong).")
    p_partial: float = Field(
        0.3, ge=0.0, le=1.0, description="Probability of stopping a hop early on 2-3 hop questions (wrong)."
    )


class Search(TaskFamily):
    name, levels, tools = FAMILY, LEVELS, (TOOL,)
    default_verifier = VerifierSpec(name="exact_match")
    teacher_params = SearchTeacher
    needs_kb = True

    def generate_tasks(self, n, *, seed, split, levels, level_weights, exclude_ids, kb):
        if kb is None:
            raise ValueError("the search family needs the knowledge base to generate tasks")
        return generate_tasks(
            kb, n, seed=seed, split=split, levels=levels, level_weights=level_weights, exclude_ids=exclude_ids
        )

    def demonstrations(self, tasks, n, *, seed, teacher, kb):
        if kb is None:
            raise ValueError("the search teacher needs the knowledge base")
        return demonstrations(tasks, kb, n, seed=seed, p_direct=teacher.p_direct, p_partial=teacher.p_partial)

    def detour_steps(self, task, kind, rng, kb):
        # negative: the whole question as the query (BM25 finds something, rarely the right
        # document); alternatives: other entities of the seed's type
        path = json.loads(task["metadata"]).get("path")
        if path is None:  # a user's question: no entities to detour through
            return ()
        if kind == "negative":
            return (Step(TOOL, task["prompt"].strip().rstrip("?"), trained=False),)
        seed = path[0]
        others = [e for e in kb.of_type(kb.entities[seed]) if e != seed] if kb is not None else []
        return tuple(Step(TOOL, name, trained=False) for name in rng.sample(others, min(2, len(others))))

    def tokenizer_texts(self, task):
        answer = str(task["answer"])
        yield task["prompt"] + search_turn(answer) + answer_turn(answer)


register_family(Search())
