"""Numeric answer equivalence for arithmetic tasks.

Exact rational arithmetic (`fractions.Fraction`) so that 18026, "18026.0", "18,026" and
"1.8026e4" all agree without float rounding; NFKC normalization folds look-alike digits
(fullwidth "１２") onto ASCII before parsing, so the check is about the number, not its glyphs.
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from math import gcd

_MAX_CHARS = 64  # a numeric answer longer than this is not an answer; refuse to parse it
_MAX_EXPONENT = 1000  # decimal exponent bound: no answer here needs more, and it keeps parsing O(1)


# Characters NFKC would turn into digits that mean something else: a superscript is a power (5⁰
# is 1, not 50), a subscript an index (1₁₄₀ is not 1140). Read from the Unicode database once.
_SCRIPTS = re.compile(
    "["
    + "".join(
        re.escape(chr(c))
        for c in range(0x80, 0x10000)
        if unicodedata.decomposition(chr(c)).startswith(("<super>", "<sub>"))
    )
    + "]"
)
_SUPERSCRIPT_RUN = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻]+")
_FROM_SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻", "0123456789+-")
# Whitespace between digits joins two numbers into one ("1 2" is not 12) unless it separates
# groups of three, as SI and many locales write 10 081.
# "14, 971", "86 .0", "48e 0"
_SPLIT_DIGITS = re.compile(r"(?<=[0-9.,eE])\s+(?=[0-9.,])|(?<=[0-9])\s+(?=[eE][-+]?[0-9])")
_WHITESPACE = re.compile(r"\s")  # the common case has none: one cheap scan instead of the lookarounds
_SPACED_GROUPS = re.compile(r"[-+]?[0-9]{1,3}(?: [0-9]{3})+(?:\.[0-9]+)?")


def fold_text(text: str) -> str:
    """NFKC (fullwidth digits are digits), except where folding changes the number: a run of
    superscript digits becomes a power (10⁴ -> 10^(4)), any other super- or subscript and any
    whitespace between digits that is not a thousands separator raise ValueError."""
    if not text.isascii():
        if _SCRIPTS.search(text):
            text = _SUPERSCRIPT_RUN.sub(lambda m: "^(" + m.group().translate(_FROM_SUPERSCRIPT) + ")", text)
            if _SCRIPTS.search(text):
                raise ValueError("superscript or subscript characters")
        text = unicodedata.normalize("NFKC", text)
    if _WHITESPACE.search(text) and _SPLIT_DIGITS.search(text):  # after NFKC a no-break or thin space is a plain space
        stripped = text.strip()
        if not _SPACED_GROUPS.fullmatch(stripped):  # one space between groups of three, nothing else
            raise ValueError("digits separated by whitespace")
        text = stripped.replace(" ", "")
    return text


_GROUPED = re.compile(r"[-+]?[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]*)?")  # 18,026 and 1,234,567.5; not 1,00,81
_INTEGER = re.compile(r"[-+]?[0-9]+")


def parse_number(text: str) -> Fraction | None:
    """'1,234' '-3.5' '7/2' '1e3' -> Fraction; anything else -> None.

    A *result*, not a computation: a fraction is accepted only as integers in lowest terms
    ('7/2', not '84/2' or '3.5/1', which restate a division), and commas only as thousands
    separators. Otherwise a copy of the question `compute 36052/2` would be its own answer."""
    try:
        s = fold_text(text).strip().replace(" ", "").replace("\u2212", "-")
    except ValueError:
        return None
    if not s or len(s) > _MAX_CHARS:
        return None
    if "," in s:
        if not _GROUPED.fullmatch(s):
            return None
        s = s.replace(",", "")
    if _INTEGER.fullmatch(s):  # the common case, ~3x faster than through Decimal
        return Fraction(int(s))
    try:
        if "/" in s:
            num, _, den = s.partition("/")
            if not (_INTEGER.fullmatch(num) and den.isdigit() and int(den) > 1 and gcd(int(num), int(den)) == 1):
                return None
            return Fraction(int(num), int(den))
        value = Decimal(s)
    except (InvalidOperation, ValueError, ZeroDivisionError):
        return None
    if not value.is_finite() or abs(value.adjusted()) > _MAX_EXPONENT:
        return None  # "1e9999999" would build a ten-million-digit integer: refuse, don't hang
    return Fraction(value)


def numeric_match(prediction: str, gold: str, rel_tol: float = 1e-6, exact_integers: bool = True) -> float | None:
    """1.0 if the numbers agree within `rel_tol` (relative), 0.0 if not or unparseable prediction,
    None if the *gold* answer is unparseable (an unscorable task, reported, never a silent 0).
    An integer gold is exact: tolerance is for golds that are themselves rounded (10080.99 is not
    10081)."""
    gold_value = parse_number(gold)
    if gold_value is None:
        return None
    pred_value = parse_number(prediction)
    if pred_value is None:
        return 0.0
    if pred_value == gold_value:
        return 1.0
    if gold_value.denominator == 1 and exact_integers:
        return 0.0
    scale = max(abs(gold_value), Fraction(1))
    return 1.0 if abs(pred_value - gold_value) <= Fraction(rel_tol) * scale else 0.0
