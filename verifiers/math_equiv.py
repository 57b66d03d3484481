"""Numeric answer equivalence for arithmetic tasks.

Exact rational arithmetic (`fractions.Fraction`) so that 18026, "18026.0", "18,026", "36052/2"
and "1.8026e4" all agree without float rounding; NFKC normalization folds look-alike digits
(fullwidth "１２") onto ASCII before parsing, so the check is about the number, not its glyphs.
"""

from __future__ import annotations

import unicodedata
from decimal import Decimal, InvalidOperation
from fractions import Fraction

_MAX_CHARS = 64  # a numeric answer longer than this is not an answer; refuse to parse it
_MAX_EXPONENT = 1000  # decimal exponent bound: no answer here needs more, and it keeps parsing O(1)


def parse_number(text: str) -> Fraction | None:
    """'1,234' '-3.5' '7/2' '1e3' -> Fraction; anything else -> None."""
    s = unicodedata.normalize("NFKC", text).strip().replace(",", "").replace(" ", "").replace("\u2212", "-")
    if not s or len(s) > _MAX_CHARS:
        return None
    try:
        if "/" in s:
            if s.count("/") != 1:
                return None
            num, den = (parse_number(part) for part in s.split("/"))
            return None if num is None or den is None or den == 0 else num / den
        value = Decimal(s)
    except (InvalidOperation, ValueError, ZeroDivisionError):
        return None
    if not value.is_finite() or abs(value.adjusted()) > _MAX_EXPONENT:
        return None  # "1e9999999" would build a ten-million-digit integer: refuse, don't hang
    return Fraction(value)


def numeric_match(prediction: str, gold: str, rel_tol: float = 1e-6) -> float | None:
    """1.0 if the numbers agree within `rel_tol` (relative), 0.0 if not or unparseable prediction,
    None if the *gold* answer is unparseable (an unscorable task, reported, never a silent 0)."""
    gold_value = parse_number(gold)
    if gold_value is None:
        return None
    pred_value = parse_number(prediction)
    if pred_value is None:
        return 0.0
    if pred_value == gold_value:
        return 1.0
    scale = max(abs(gold_value), Fraction(1))
    return 1.0 if abs(pred_value - gold_value) <= Fraction(rel_tol) * scale else 0.0
