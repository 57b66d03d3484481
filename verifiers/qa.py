"""Search / QA answer verifiers: SQuAD-style normalized exact match and token F1.

Normalization follows the SQuAD v1.1 evaluation script (lower-case, strip punctuation and the
articles a/an/the, collapse whitespace), after NFKC so look-alike characters compare equal.
Several gold aliases are allowed; the score is the best over them.
"""

from __future__ import annotations

import json
import re
import string
import unicodedata
from collections import Counter
from functools import lru_cache

from verifiers.base import Task, Verdict, register

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_STRIP_PUNCTUATION = str.maketrans("", "", string.punctuation)
_MAX_CHARS = 512  # an "answer" longer than this is not an answer (enormous-output defense)


def normalize_answer(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    text = text.translate(_STRIP_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


@lru_cache(maxsize=8192)  # a group of samples shares one gold: normalize its aliases once
def _normalized_golds(aliases: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(n for n in map(normalize_answer, aliases) if n)


def _score(prediction: str, gold: str | list[str], best_over_aliases) -> float | None:
    """Shared guards: no usable gold -> None (unscorable); an enormous answer -> 0."""
    golds = _normalized_golds((gold,) if isinstance(gold, str) else tuple(gold))
    if not golds:
        return None
    if len(prediction) > _MAX_CHARS:
        return 0.0
    return best_over_aliases(normalize_answer(prediction), golds)


def exact_match(prediction: str, gold: str | list[str]) -> float | None:
    """1.0 if the normalized prediction equals any normalized alias; None if no usable gold."""
    return _score(prediction, gold, lambda pred, golds: 1.0 if pred and pred in golds else 0.0)


def token_f1(prediction: str, gold: str | list[str]) -> float | None:
    """Best token-level F1 over the aliases (SQuAD); None if no usable gold."""
    return _score(prediction, gold, _best_f1)


@lru_cache(maxsize=8192)
def _gold_counts(gold: str) -> tuple[Counter, int]:
    tokens = gold.split()
    return Counter(tokens), len(tokens)


def _best_f1(pred: str, golds: tuple[str, ...]) -> float:
    if pred in golds:  # the common case once a policy is good: no counting at all
        return 1.0
    tokens = pred.split()
    if not tokens:
        return 0.0
    counts, best = Counter(tokens), 0.0
    for gold in golds:
        gold_counts, gold_len = _gold_counts(gold)
        common = sum((counts & gold_counts).values())
        if common:
            precision, recall = common / len(tokens), common / gold_len
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def _aliases(task: Task) -> list[str]:
    """The task's gold answer plus its `aliases` (a list, or a JSON list as stored in Parquet)."""
    extra = task.get("aliases")
    if isinstance(extra, str):
        extra = json.loads(extra) if extra.strip() else []
    return [str(task["answer"]), *(str(a) for a in (extra if extra is not None else []))]


def _task_check(task: Task) -> str | None:
    return None if _normalized_golds(tuple(_aliases(task))) else f"no usable gold answer in {task.get('answer')!r}"


@register("exact_match", task_check=_task_check)
def exact_match_verifier(prediction: str, task: Task) -> Verdict:
    score = exact_match(prediction, _aliases(task))
    return Verdict(score, f"exact match of {prediction[:40]!r}")


@register("token_f1", task_check=_task_check)
def token_f1_verifier(prediction: str, task: Task) -> Verdict:
    score = token_f1(prediction, _aliases(task))
    return Verdict(score, f"token F1 of {prediction[:40]!r}")
