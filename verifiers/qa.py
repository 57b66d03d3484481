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


def exact_match(prediction: str, gold: str | list[str]) -> float | None:
    """1.0 if the normalized prediction equals any normalized alias; None if no usable gold."""
    golds = _golds(gold)
    if not golds:
        return None
    if len(prediction) > _MAX_CHARS:
        return 0.0
    pred = normalize_answer(prediction)
    return 1.0 if pred and any(pred == normalize_answer(g) for g in golds) else 0.0


def token_f1(prediction: str, gold: str | list[str]) -> float | None:
    """Best token-level F1 over the aliases (SQuAD); None if no usable gold."""
    golds = _golds(gold)
    if not golds:
        return None
    if len(prediction) > _MAX_CHARS:
        return 0.0
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for g in golds:
        gold_tokens = normalize_answer(g).split()
        common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred_tokens), common / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best
