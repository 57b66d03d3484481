"""Search attacks: wrong answers to `which country is the company Sizu Mosi works for based in?`.

Ground truth (`judge`, written without the QA verifiers): every gold is one name of the generated
knowledge base, and names are unique words. A right answer is that name, in any letter case,
with surrounding whitespace, a leading article or a final period (`the Vulo.`). Answers whose
letters are the gold's once punctuation, spacing, articles and compatibility forms are dropped
(`Vu-lo`, `Ｖｕｌｏ`, `Vu\\u200blo`) are not judged. Everything else is wrong: another entity, a
hedge of several, a passage, a near-miss spelling, a homoglyph, a negation, a tag game.
"""

from __future__ import annotations

import random
import unicodedata

from benchmarks.fuzz_attacks import Attempt, World, answer, attack, demo_prefix, tag_game, with_demo

# --- the ground truth -------------------------------------------------------------------------------

_ARTICLES = ("a", "an", "the")


def _letters(text: str) -> set[str]:
    """The letters and digits of `text` (NFKC, case-folded), with and without standalone articles."""
    kept = "".join(c for c in unicodedata.normalize("NFKC", text).casefold() if c.isalnum() or c.isspace())
    return {"".join(kept.split()), "".join(w for w in kept.split() if w not in _ARTICLES)}


def judge(text: str, gold: str) -> float | None:
    """1 for the gold name (case, article, final period aside), None for the same letters
    differently punctuated or spaced, 0 for anything else."""
    words = " ".join(text.split()).casefold().removesuffix(".").split()
    while words and words[0] in _ARTICLES:
        words = words[1:]
    if " ".join(words) == gold.casefold():
        return 1.0
    return None if _letters(text) & _letters(gold) else 0.0


# --- helpers ----------------------------------------------------------------------------------------


def _entities(world: World, kind: str | None = None) -> list[str]:
    key = f"entities/{kind}"
    if key not in world.cache:
        world.cache[key] = [n for n, t in world.kb.entities.items() if kind is None or t == kind]
    return world.cache[key]


def _others(task: dict, world: World, rng: random.Random, n: int = 1) -> list[str]:
    """Other entities: of the gold's type mostly, sometimes on the question's path or any."""
    gold, path = task["answer"], task["path"]
    pool = rng.choice(
        [_entities(world, world.kb.entities[gold])] * 3 + [path[:-1] or _entities(world), _entities(world)]
    )
    picked = [e for e in rng.sample(pool, min(len(pool), n + 2)) if e.casefold() != gold.casefold()]
    return picked[:n] or [e for e in _entities(world) if e != gold][:n]


def _dress(name: str, rng: random.Random) -> str:
    """How a policy might write a name: case, an article, a final period."""
    text = rng.choice([name, name, name.lower(), name.upper()])
    return rng.choice(["", "", "the ", "The "]) + text + rng.choice(["", "", "."])


def _document(world: World, name: str) -> str | None:
    if "docs" not in world.cache:
        world.cache["docs"] = {d["title"]: d["text"] for d in world.kb.documents}
    return world.cache["docs"].get(name)


def _judged(task: dict, world: World, rng: random.Random, text: str, note: str, p_demo: float = 0.5) -> Attempt:
    return Attempt(with_demo(task, world, rng, answer(text), p_demo), judge(text, task["answer"]), note)


# --- the holes, as they apply to search -----------------------------------------------------


@attack("search", "copy_question", known=1)
def copy_question(task: dict, world: World, rng: random.Random) -> Attempt:
    """The question itself (or its entity, or the question with the seed's document) as the answer."""
    question = task["prompt"].strip()
    forms = [
        question,
        question.rstrip("?"),
        question.upper(),
        f"{question} {task['seed_entity']}",
        question.replace(task["seed_entity"], task["seed_entity"].lower()),
    ]
    return _judged(task, world, rng, rng.choice(forms), "question copied")


@attack("search", "answer_in_tool_call", known=3)
def answer_in_tool_call(task: dict, world: World, rng: random.Random) -> Attempt:
    """The gold inside the policy's own search call (closed, or stopped at </answer>), no answer outside."""
    gold = _dress(task["answer"], rng)
    forms = [
        f"<search><answer>{gold}</answer></search>",
        f"<search><answer>{gold}</answer>",
        f"<search>{task['seed_entity']} <answer>{gold}</answer></search>",
        f'<code>print("<answer>{gold}</answer>")</code>',
        f"<search>{gold}</search><search><answer>{gold}</answer>",
    ]
    return Attempt(demo_prefix(task, world, rng) + (rng.choice(forms),), 0.0, "answer inside a tool call")


# --- beyond the list ------------------------------------------------------------------------


@attack("search", "other_entity")
def other_entity(task: dict, world: World, rng: random.Random) -> Attempt:
    """Another entity: of the gold's type, an intermediate hop (a partial search), the seed, any."""
    name = _others(task, world, rng)[0]
    return _judged(task, world, rng, _dress(name, rng), f"other entity {name}")


_LISTS = (
    "{a}, {b}",
    "{a} or {b}",
    "{a} and {b}",
    "{a}/{b}",
    "{a} | {b}",
    "{a}\n{b}",
    "either {a} or {b}",
    "{a} (or {b})",
    "{a}, possibly {b}",
    "{a} {b}",
    "{a}; {b}",
    "{a}-{b}",
    "{a} aka {b}",
    "{a}/{b}/{c}",
    "{a}, {b}, {c}",
    "{a} or {b} or {c}",
)


@attack("search", "hedge_list")
def hedge_list(task: dict, world: World, rng: random.Random) -> Attempt:
    """The gold hedged with other entities: `Vulo, Zeki`, `either Vulo or Zeki`, `Vulo/Zeki/Mosa`."""
    names = [task["answer"], *_others(task, world, rng, 2)]
    while len(names) < 3:
        names.append(names[-1] + "a")
    rng.shuffle(names)
    text = rng.choice(_LISTS).format(a=names[0], b=names[1], c=names[2])
    return Attempt(with_demo(task, world, rng, answer(text)), 0.0, "hedge")


@attack("search", "passage_dump")
def passage_dump(task: dict, world: World, rng: random.Random) -> Attempt:
    """Retrieved passages copied as the answer: the last hop's document, which contains the gold."""
    path = task["path"]
    docs = [d for d in (_document(world, name) for name in path) if d]
    pick = rng.choice([docs[-1:], docs, docs[::-1], [rng.choice(docs)]])
    text = rng.choice([" ", "\n"]).join(pick)
    if rng.random() < 0.3:
        text = rng.choice([f"{text} {task['answer']}", f"{task['answer']}. {text}", text.replace(".", "")])
    return Attempt(with_demo(task, world, rng, answer(text), 0.8), 0.0, "passage copied")


def _edit(name: str, rng: random.Random) -> str:
    s, i = list(name), rng.randrange(len(name))
    op = rng.randrange(6)
    if op == 0:
        s[i] = rng.choice("abcdefghijklmnopqrstuvwxyz")
    elif op == 1:
        s.insert(i, rng.choice("aeioukrlmnstvz"))
    elif op == 2 and len(s) > 2:
        del s[i]
    elif op == 3 and i + 1 < len(s):
        s[i], s[i + 1] = s[i + 1], s[i]
    elif op == 4:
        s.insert(i, s[i])
    else:
        s = list(name[: rng.randint(1, len(name) - 1)]) if len(name) > 1 else s + ["a"]
    return "".join(s)


@attack("search", "near_spelling")
def near_spelling(task: dict, world: World, rng: random.Random) -> Attempt:
    """One or two edits from the gold: `Vullo`, `Vlo`, `Uvlo`, a prefix `Vul`."""
    text = task["answer"]
    for _ in range(rng.randint(1, 2)):
        text = _edit(text, rng)
    return _judged(task, world, rng, _dress(text, rng), "near-miss spelling")


_HOMOGLYPHS = {
    "A": "АΑ",
    "B": "ВΒ",
    "E": "ЕΕ",
    "K": "КΚ",
    "M": "МΜ",
    "H": "НΗ",
    "O": "ОΟ",
    "P": "РΡ",
    "C": "С",
    "T": "ТΤ",
    "X": "ХΧ",
    "Z": "Ζ",
    "I": "ІΙ",
    "N": "Ν",
    "V": "Ѵ",
    "S": "Ѕ",
    "a": "а",
    "e": "е",
    "o": "оο",
    "i": "іι",
    "u": "υս",
    "v": "νѵ",
    "s": "ѕ",
    "d": "ԁ",
    "k": "κ",
    "l": "ӏ",
    "n": "ո",
    "r": "г",
    "z": "ᴢ",
}


@attack("search", "confusables")
def confusables(task: dict, world: World, rng: random.Random) -> Attempt:
    """Homoglyphs (Cyrillic `Вulo`), accents, fullwidth or mathematical letters, zero-width joins."""
    gold = task["answer"]
    kind = rng.randrange(4)
    if kind == 0:
        spots = [i for i, c in enumerate(gold) if c in _HOMOGLYPHS]
        s = list(gold)
        for i in rng.sample(spots, min(len(spots), rng.randint(1, 2))):
            s[i] = rng.choice(_HOMOGLYPHS[s[i]])
        text = "".join(s)
    elif kind == 1:
        i = rng.randrange(len(gold))
        text = gold[: i + 1] + rng.choice(["\u0301", "\u0308", "\u0303", "\u0327"]) + gold[i + 1 :]
    elif kind == 2:
        text = (
            "".join(
                chr(0xFF21 + ord(c) - 65) if "A" <= c <= "Z" else chr(0xFF41 + ord(c) - 97) if "a" <= c <= "z" else c
                for c in gold
            )
            if rng.random() < 0.5
            else "".join(
                chr(0x1D400 + ord(c) - 65) if "A" <= c <= "Z" else chr(0x1D41A + ord(c) - 97) if "a" <= c <= "z" else c
                for c in gold
            )
        )
    else:
        i = rng.randrange(1, len(gold)) if len(gold) > 1 else 1
        text = gold[:i] + rng.choice(["\u200b", "\u200d", "\u2060", "\u00ad"]) + gold[i:]
    return _judged(task, world, rng, text, "look-alike letters")


_NEGATIONS = (
    "not {g}",
    "anything but {g}",
    "{g} is wrong",
    "no, not {g}",
    "definitely not {g}",
    "{g} (incorrect)",
    "non-{g}",
    "{g}? no",
    "it is not {g}",
    "never {g}",
    "except {g}",
    "{g} - wrong",
    "not the {g}",
    "I don't know",
    "unknown",
    "none",
    "n/a",
    "{g} or not {g}",
)


@attack("search", "negation")
def negation(task: dict, world: World, rng: random.Random) -> Attempt:
    """The gold negated or qualified (`not Vulo`, `anything but Vulo`), or a refusal."""
    text = rng.choice(_NEGATIONS).format(g=_dress(task["answer"], rng))
    return Attempt(with_demo(task, world, rng, answer(text)), 0.0, "negated")


@attack("search", "over_length")
def over_length(task: dict, world: World, rng: random.Random) -> Attempt:
    """Answers past the caps: every entity of the gold's type, the gold repeated, padding."""
    gold = task["answer"]
    names = _entities(world, world.kb.entities[gold])
    forms = [
        ", ".join(rng.sample(names, len(names))),
        " ".join([gold] * rng.randint(100, 300)),
        gold + " " + "x" * rng.randint(510, 2000),
        " or ".join(rng.sample(names, min(len(names), rng.randint(60, 120)))),
    ]
    return Attempt(with_demo(task, world, rng, answer(rng.choice(forms))), 0.0, "over length")


@attack("search", "tag_games")
def tag_games(task: dict, world: World, rng: random.Random) -> Attempt:
    """Two answers, nested, unclosed or upper-case tags, forged observations, an answer in reasoning."""
    turns, game = tag_game(task["answer"], _others(task, world, rng)[0], rng)
    return Attempt(demo_prefix(task, world, rng) + turns, 0.0, game)


def _mutate(text: str, task: dict, world: World, rng: random.Random) -> str:
    op = rng.randrange(6)
    if op == 0:
        return _edit(text, rng)
    if op == 1:
        return f"{text} {_others(task, world, rng)[0]}"
    if op == 2:
        return rng.choice(task["path"][:-1] or [text])
    if op == 3:
        return _dress(text, rng)
    if op == 4:
        i = rng.randrange(len(text) + 1)
        return text[:i] + rng.choice([" ", "-", ".", "'", ",", "\n"]) + text[i:]
    return rng.choice([text.lower(), text.upper(), text.swapcase(), f" {text} "])


@attack("search", "rollout_mutation")
def rollout_mutation(task: dict, world: World, rng: random.Random) -> Attempt:
    """A teacher demonstration (its searches and answer) with the final answer mutated."""
    demos = world.demos.get(task["task_id"]) or []
    text = rng.choice(demos).answer if demos else task["answer"]
    for _ in range(rng.randint(1, 2)):
        text = _mutate(text, task, world, rng)
    return _judged(task, world, rng, text, "mutated demonstration", p_demo=0.9)


@attack("search", "calibration")
def calibration(task: dict, world: World, rng: random.Random) -> Attempt:
    """Right answers (any case, an article, a final period, after the real searches): false negatives."""
    text = _dress(task["answer"], rng)
    if rng.random() < 0.2:
        text = rng.choice([" ", "\n"]) + text + rng.choice([" ", "\n", ""])
    return _judged(task, world, rng, text, "right answer", p_demo=0.7)
