"""Contamination and duplicates: which benchmark tasks also appear (nearly) in training.

Three tests, cheapest first:
  exact id      the same content-addressed task id (generated tasks: same text, same id)
  normalized    the same prompt after NFKC, case folding, and dropping whitespace and punctuation
                other than arithmetic operators ("Compute 47 + 8?" == "compute 47+8")
  n-gram        a shared run of `ngram` words (13 by default, the GPT-3 / PaLM contamination
                test) between two *long* prompts (at least 2 x ngram words each), the training
                prompt also stating the benchmark prompt's numbers in the same order: catches a
                benchmark passage pasted into a training prompt
Templated synthetic prompts differ only in a number or a name, so neither a fuzzy similarity
threshold nor n-grams over short prompts can tell a copy from a sibling task ("... x minus 1" vs
"... x minus 2" share 14 of 15 words); short prompts are compared whole. Long templated prompts
(arithmetic's word problems) share long runs of template text with their siblings too, but a
sibling states other numbers, or the same ones in other roles, and is another question with
another answer; a pasted copy states them all, in order. A benchmark prompt without numbers is
tested on its n-grams alone. (The cost: a training prompt holding a benchmark passage but not all
of its numbers, e.g. without its question, is no longer flagged by this test.)
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

_DROP = re.compile(r"[^\w+\-*/=<>%^]")  # keep what changes a math question's meaning


def normalize_prompt(text: str) -> str:
    return _DROP.sub("", unicodedata.normalize("NFKC", text).casefold())


def word_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", unicodedata.normalize("NFKC", text).casefold())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def overlaps(benchmark: Iterable[dict], training: Iterable[dict], *, ngram: int = 13) -> list[dict]:
    """One row per benchmark task that also appears in training: which training task, and how."""
    training = list(training)
    by_id = {str(t["task_id"]): t for t in training}
    by_text: dict[str, str] = {}
    by_gram: dict[tuple[str, ...], list[int]] = {}  # n-gram -> positions in `training` of the long prompts holding it
    numbers: dict[int, tuple[str, ...]] = {}
    for i, t in enumerate(training):
        by_text.setdefault(normalize_prompt(str(t["prompt"])), str(t["task_id"]))
        if _long(str(t["prompt"]), ngram):
            numbers[i] = _numbers(str(t["prompt"]))
            for gram in word_ngrams(str(t["prompt"]), ngram):
                by_gram.setdefault(gram, []).append(i)
    found = []
    for b in benchmark:
        bid, prompt = str(b["task_id"]), str(b["prompt"])
        if bid in by_id:
            found.append({"benchmark_id": bid, "training_id": bid, "how": "same id"})
        elif normalize_prompt(prompt) in by_text:
            found.append(
                {"benchmark_id": bid, "training_id": by_text[normalize_prompt(prompt)], "how": "same normalized prompt"}
            )
        elif _long(prompt, ngram):
            wanted = _numbers(prompt)
            sharing = {i for gram in word_ngrams(prompt, ngram) for i in by_gram.get(gram, ())}
            # the first in training order
            shared = min((i for i in sharing if _in_order(wanted, numbers[i])), default=None)
            if shared is not None:
                found.append(
                    {
                        "benchmark_id": bid,
                        "training_id": str(training[shared]["task_id"]),
                        "how": f"shared {ngram}-word run",
                    }
                )
    return found


def _long(prompt: str, ngram: int) -> bool:
    return len(re.findall(r"\w+", prompt)) >= 2 * ngram


def _numbers(prompt: str) -> tuple[str, ...]:
    """The numbers a prompt states, in order, as words ("47 boxes" -> "47"; "w3" is a word, not a number)."""
    return tuple(w for w in re.findall(r"\w+", unicodedata.normalize("NFKC", prompt)) if w.isdigit())


def _in_order(wanted: tuple[str, ...], stated: tuple[str, ...]) -> bool:
    """Whether `wanted` is a subsequence of `stated` (other numbers may come between)."""
    rest = iter(stated)
    return all(number in rest for number in wanted)


def duplicates(rows: Iterable[dict]) -> list[dict]:
    """Tasks inside one dataset whose normalized prompts collide: (first id, duplicate id)."""
    seen: dict[str, str] = {}
    found = []
    for row in rows:
        key = normalize_prompt(str(row["prompt"]))
        if key in seen:
            found.append({"task_id": str(row["task_id"]), "duplicate_of": seen[key]})
        else:
            seen[key] = str(row["task_id"])
    return found
