"""Search / QA answer verifiers: SQuAD-style normalized exact match and token F1.

Normalization follows the SQuAD v1.1 evaluation script (lower-case, strip punctuation and the
articles a/an/the, collapse whitespace), after NFKC so look-alike characters compare equal.
Several gold aliases are allowed; the score is the best over them.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_MAX_CHARS = 512  # an "answer" longer than this is not an answer (enormous-output defense)


def normalize_answer(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(gold: str | list[str]) -> list[str]:
    aliases = [gold] if isinstance(gold, str) else list(gold)
    return [g for g in aliases if normalize_answer(g)]


def _score(prediction: str, gold: str | list[str], best_over_aliases) -> float | None:
    """Shared guards: no usable gold -> None (unscorable); an enormous answer -> 0."""
    golds = _golds(gold)
    if not golds:
        return None
    if len(prediction) > _MAX_CHARS:
        return 0.0
    return best_over_aliases(normalize_answer(prediction), [normalize_answer(g) for g in golds])


def exact_match(prediction: str, gold: str | list[str]) -> float | None:
    """1.0 if the normalized prediction equals any normalized alias; None if no usable gold."""
    return _score(prediction, gold, lambda pred, golds: 1.0 if pred and pred in golds else 0.0)


def token_f1(prediction: str, gold: str | list[str]) -> float | None:
    """Best token-level F1 over the aliases (SQuAD); None if no usable gold."""
    return _score(prediction, gold, lambda pred, golds: max(_f1(pred.split(), g.split()) for g in golds))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)
