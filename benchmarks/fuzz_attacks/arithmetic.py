"""Arithmetic attacks: wrong answers to `compute 347*29+18` dressed to look right.

Ground truth (`judge`, written without the math verifier): the gold is an integer, so a right
answer is a *numeral* of it — an optional sign, decimal digits of one script (Unicode Nd: ASCII,
fullwidth, Arabic-Indic...), optionally grouped by threes with one separator (`10,081`, `10 081`).
Value-equal notations whose status is a policy choice are not judged (`10081.0`, `1.0081e4`,
`1.0081×10^4`, `010081`, `(10081)`, `¹⁰⁰⁸¹`, `$10081`, `10081 apples`, the gold with invisible
characters, any of these with a sentence's final period: `10081.0.`). Everything else is wrong:
another value in any notation, a computation even of the gold's value (`20162/2`), a hedge, a
scale word (`10081 thousand`), a tag game.

The LaTeX classes at the end (issue 22: answers as pretrained models write them) know what they
wrapped: a wrapped numeral is judged as that numeral (`The answer is $\\boxed{10,081}$.` as
`10,081`), and what they build wrong (a computation, two boxes, a hedge, a malformed box) is wrong
by construction; the oracle never parses LaTeX.
"""

from __future__ import annotations

import random
import re
import unicodedata
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from benchmarks.fuzz_attacks import Attempt, World, answer, attack, demo_prefix, tag_game, tool_call, with_demo
from environments.arithmetic import near_miss

# --- the ground truth -------------------------------------------------------------------------------

_SIGNS = {"+": 1, "-": -1, "\u2212": -1}
_GROUP_SEPARATORS = (",", " ", "\u00a0", "\u2009", "\u202f")
_INVISIBLE = str.maketrans(
    dict.fromkeys(
        map(
            ord,
            "\u200b\u200c\u200d\u2060\ufeff\u00ad\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069",
        )
    )
)
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]{1,4})?")
_SUPERSCRIPTS = "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079"
_SUBSCRIPTS = "".join(chr(0x2080 + d) for d in range(10))
_TIMES_TEN = re.compile(r"([-+]?[0-9](?:\.[0-9]+)?)\s*[×x*·⋅]\s*10\s*(?:\^|\*\*)\s*\(?([-+]?[0-9]{1,3})\)?")
_UNIT_FORM = re.compile(r"(.*?)\s*(°[CF]?|[$€£¥]|[A-Za-zμµ]+(?:/[A-Za-zμµ]+)?[²³]?(?:\s+[A-Za-zμµ]+){0,2})")
_SCALE_WORDS = frozenset(
    """k thousand thousands million millions billion billions trillion hundred hundreds dozen dozens
    gross lakh crore permille squared cubed kilo mega giga milli micro half halves third thirds
    quarter quarters tenths hundredths thousandths times e""".split()
)
_HEDGE_WORDS = frozenset(
    """or nor not no nope and but except either maybe perhaps possibly probably vs versus to than plus
    minus over else otherwise wrong incorrect false approx approximately about around roughly nearly almost less more
    above below under between if unless never neither""".split()
)


def _digits(s: str, one_script: bool = True) -> int | None:
    """Decimal digits (Unicode Nd), of one script unless `one_script` is False -> their integer."""
    if not s or len(s) > 1000 or any(unicodedata.category(c) != "Nd" for c in s):
        return None  # (golds have at most 6 digits: a 1000-digit numeral is another value either way)
    if one_script and (
        len({ord(c) - unicodedata.decimal(c) for c in s}) != 1 or (len(s) > 1 and unicodedata.decimal(s[0]) == 0)
    ):
        return None  # two scripts in one numeral, or leading zeros: notations, judged apart
    return int("".join(str(unicodedata.decimal(c)) for c in s))


def numeral_value(text: str, one_script: bool = True) -> int | None:
    """The integer a plain numeral denotes: sign, digits, thousands grouped by one separator."""
    s = text.strip()
    sign = _SIGNS.get(s[:1], 0)
    s = s[1:] if sign else s
    separators = [sep for sep in _GROUP_SEPARATORS if sep in s]
    if len(separators) > 1:
        return None
    if separators:
        groups = s.split(separators[0])
        if not (1 <= len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])):
            return None
        s = "".join(groups)
    value = _digits(s, one_script)
    return None if value is None else (sign or 1) * value


def _decimal_value(s: str) -> Fraction | None:
    if not _DECIMAL.fullmatch(s):
        return None
    try:
        d = Decimal(s)
    except InvalidOperation:
        return None
    return Fraction(d) if d.is_finite() and abs(d.adjusted()) <= 1000 else None


def _notation_of(s: str, gold: int) -> bool:
    """A value-equal notation whose status is a policy choice (not judged)."""
    if numeral_value(s, one_script=False) == gold or _decimal_value(s) == gold:
        return True  # mixed scripts, 010081, 10081.0, 1.0081e4, 10081e0
    if s[-1:] == "." and s[-2:-1] not in (".", "") and (numeral_value(s[:-1]) == gold or _notation_of(s[:-1], gold)):
        return True  # a sentence's final period after a notation: 10081.0., 1.0081e4.
    exponent = re.sub(f"[{_SUPERSCRIPTS}]+", lambda m: "^" + unicodedata.normalize("NFKC", m.group()), s)
    if (m := _TIMES_TEN.fullmatch(exponent)) and Fraction(Decimal(m[1])) * Fraction(10) ** int(m[2]) == gold:
        return True  # 1.0081×10^4
    if s[:1] == "(" and s[-1:] == ")" and numeral_value(s[1:-1]) == gold:
        return True
    core = s.lstrip("+-\u2212")
    if core and all(unicodedata.category(c) == "No" and unicodedata.numeric(c, None) is not None for c in core):
        return unicodedata.normalize("NFKC", s).replace("\u2212", "-").lstrip("+") == str(gold)  # ¹⁰⁰⁸¹, ⑩⓪⑧①
    if s[:1] in _SIGNS and s[1:2].isspace() and s[1:].strip()[:1] not in _SIGNS:
        joined = s[:1] + s[1:].strip()  # "- 7": a sign set apart reads as the number in maths notation
        return numeral_value(joined) == gold or _notation_of(joined, gold)
    if (m := re.fullmatch(r"(.+?)\.0*", s)) and numeral_value(m[1]) == gold:
        return True  # 18 199.0, 66,433.: a grouped numeral with a zero fraction
    if (m := re.fullmatch(r"(.*?)\s*(?:%|percent|pct|per cent)", s)) and numeral_value(m[1]) == gold:
        return True  # 10081%: strip_units reads a percent as the number, by convention (docs/verifiers.md)
    bare = s.lstrip("$€£¥").strip()
    if (m := _UNIT_FORM.fullmatch(bare)) and numeral_value(m[1]) == gold:
        words = {w.lower() for w in re.findall(r"[A-Za-zμµ]+", m[2])}
        return not words & (_SCALE_WORDS | _HEDGE_WORDS)  # 10081 apples, 10081 m/s; not 10081 thousand
    return bare != s and numeral_value(bare) == gold  # $10081


def judge(text: str, gold: int) -> float | None:
    """1 for a numeral of the gold, 0 for anything else, None for a notation not judged."""
    value = numeral_value(text)
    if value is not None:
        return float(value == gold)
    s = text.strip()
    if not s:
        return 0.0
    for variant in (s.translate(_INVISIBLE).strip(), _ascii_digits(s)):  # what a reader sees; 12５54e0
        if variant != s and (numeral_value(variant) == gold or _notation_of(variant, gold)):
            return None
    return None if _notation_of(s, gold) else 0.0


def _ascii_digits(s: str) -> str:
    return "".join(str(unicodedata.decimal(c)) if unicodedata.category(c) == "Nd" else c for c in s)


# --- rendering ------------------------------------------------------------------------------------

# Zero of each decimal-digit script (Unicode Nd): ASCII, fullwidth, Arabic-Indic, extended
# Arabic-Indic, N'Ko, Devanagari, Bengali, Gujarati, Tamil, Thai, Lao, Tibetan, Myanmar, Khmer,
# Mongolian, mathematical bold / double-struck / monospace, segmented.
_SCRIPT_ZEROS = (
    0x30,
    0xFF10,
    0x660,
    0x6F0,
    0x7C0,
    0x966,
    0x9E6,
    0xAE6,
    0xBE6,
    0xE50,
    0xED0,
    0xF20,
    0x1040,
    0x17E0,
    0x1810,
    0x1D7CE,
    0x1D7D8,
    0x1D7F6,
    0x1FBF0,
)


def _gold(task: dict) -> int:
    return int(task["answer"])


def in_script(text: str, zero: int) -> str:
    return "".join(chr(zero + int(c)) if c.isascii() and c.isdigit() else c for c in text)


def grouped(value: int, sep: str = ",") -> str:
    digits = str(abs(value))
    head = len(digits) % 3 or 3
    body = sep.join([digits[:head], *(digits[i : i + 3] for i in range(head, len(digits), 3))])
    return ("-" if value < 0 else "") + body


def plain(value: int, rng: random.Random) -> str:
    """A numeral of `value` as a careful policy writes it: digits, sometimes grouped or signed."""
    draw = rng.random()
    if draw < 0.6:
        return str(value)
    if draw < 0.8:
        return grouped(value, rng.choice(_GROUP_SEPARATORS))
    return f"+{value}" if value >= 0 else f"\u2212{-value}"


def other_value(gold: int, rng: random.Random) -> int:
    """A different integer: the teacher's one-digit near miss, off by one or ten, digits swapped,
    the sign flipped, a power of ten away, or anything."""
    for _ in range(20):
        kind = rng.randrange(7)
        if kind == 0:
            value = near_miss(gold, rng)
        elif kind == 1:
            value = gold + rng.choice([-1, 1, -2, 2])
        elif kind == 2:
            value = gold + rng.choice([-10, 10, -100, 100, -1000, 1000])
        elif kind == 3 and len(str(abs(gold))) > 1:
            digits = list(str(abs(gold)))
            i = rng.randrange(len(digits) - 1)
            digits[i], digits[i + 1] = digits[i + 1], digits[i]
            value = int("".join(digits)) * (-1 if gold < 0 else 1)
        elif kind == 4:
            value = -gold
        elif kind == 5:
            value = gold * 10 if rng.random() < 0.5 else gold // 10
        else:
            value = rng.randint(-(10**6), 10**6)
        if value != gold:
            return value
    return gold + 1


def _judged(task: dict, world: World, rng: random.Random, text: str, note: str, p_demo: float = 0.5) -> Attempt:
    return Attempt(with_demo(task, world, rng, answer(text), p_demo), judge(text, _gold(task)), note)


# --- the holes (the regression baseline) ----------------------------------------------------


@attack("arithmetic", "copy_question", known=1)
def copy_question(task: dict, world: World, rng: random.Random) -> Attempt:
    """The question's own expression as the answer (`347*29+18` for `compute 347*29+18`)."""
    tokens = re.findall(r"\d+|[-+*]", task["expression"])
    times = rng.choice(["*", "×", "·", "**1*", " * "])
    space = rng.choice(["", " "])
    text = space.join(times if t == "*" else t for t in tokens)
    if rng.random() < 0.3:
        text = f"({text})"
    if rng.random() < 0.2:
        text = rng.choice(["=", ""]) + text + rng.choice(["", "=", " ="])
    return Attempt(with_demo(task, world, rng, answer(text)), 0.0, "question copied")


@attack("arithmetic", "answer_in_tool_call", known=3)
def answer_in_tool_call(task: dict, world: World, rng: random.Random) -> Attempt:
    """The gold inside the policy's own tool call, and no answer outside it."""
    gold, expression = plain(_gold(task), rng), task["expression"]
    forms = [
        f'<code>print("<answer>{gold}</answer>")</code>',
        f'<code>print("<answer>{gold}</answer>',  # the engine stops at </answer>: an unclosed call
        f"<code># <answer>{gold}</answer>\nprint({expression})</code>",
        f'<code>x = """<answer>{gold}</answer>"""</code>',
        f"<code>print({expression})\n# <answer>{gold}</answer>",
        f"<search><answer>{gold}</answer></search>",
        f"<search><answer>{gold}</answer>",
    ]
    turns = ((tool_call("code", f"print({expression})"),) if rng.random() < 0.3 else ()) + (rng.choice(forms),)
    return Attempt(turns, 0.0, "answer inside a tool call")


_FUNCTIONS = ("log", "ln", "sqrt")
_SLOW_SEEDS = ("0.5", "2", "3", "0.1", "1.5", "7", "9", "0.9", "11", "x", "pi", "e", "1/3", "0.01")


@attack("arithmetic", "slow_answer", known=4)
def slow_answer(task: dict, world: World, rng: random.Random) -> Attempt:
    """Short answers that are slow to evaluate: nested logs (`log(log(...(0.5)))`), big powers."""
    if rng.random() < 0.75:
        text = rng.choice(_SLOW_SEEDS)
        for _ in range(rng.randint(4, 12)):
            wrapped = f"{rng.choice(_FUNCTIONS)}({text})"
            if len(wrapped) > 64:
                break
            text = wrapped
    else:
        n, big = rng.randint(900, 1000), rng.randint(10**10, 10**11 - 1)
        text = rng.choice(
            [
                f"{big}^{n}",
                f"({big}*x+{rng.randint(2, 99)})^{n}",
                f"pi^{n}-e^{n}",
                f"sqrt({big})^{n}",
                f"log({big}^{n})",
                f"(x+y+z+a+b+c+k+n)^{n}",
                f"{big}^{n}/{big - 1}^{n}",
            ]
        )
    return Attempt(with_demo(task, world, rng, answer(text)), 0.0, "slow to evaluate")


_HEDGES = (
    "{g} or {w}",
    "{g} nope {w}",
    "{w} or {g}",
    "{g} and {w}",
    "{g}, not {w}",
    "{g} (or {w})",
    "{g} to {w}",
    "between {g} and {w}",
    "{g} maybe {w}",
    "{g} apples or {w} apples",
    "{g} nope",
    "{g} or so",
    "{g} not",
    "{g} else {w}",
    "{g} vs {w}",
    "{g} or maybe {w}",
    "{g}; {w}",
    "{g} or {w} or {v}",
    "{g} otherwise {w}",
    "{g} unless {w}",
    "{g} but maybe {w}",
    "{g} m or {w} m",
    "{g} then {w}",
    "{g} wrong",
    "{g} incorrect",
)


@attack("arithmetic", "hedge_strip_units", known=9)
def hedge_strip_units(task: dict, world: World, rng: random.Random) -> Attempt:
    """Hedges and later numbers that `strip_units` used to cut off: `10081 or 10082`, `10081 nope 99999`."""
    gold = _gold(task)
    text = rng.choice(_HEDGES).format(
        g=plain(gold, rng), w=plain(other_value(gold, rng), rng), v=other_value(gold, rng)
    )
    return Attempt(with_demo(task, world, rng, answer(text)), 0.0, "hedge")


# --- beyond the list ------------------------------------------------------------------------


@attack("arithmetic", "wrong_numeral")
def wrong_numeral(task: dict, world: World, rng: random.Random) -> Attempt:
    """Another value as a plain numeral: near misses, off by one, swapped digits, sign flips."""
    value = other_value(_gold(task), rng)
    return _judged(task, world, rng, plain(value, rng), f"other value {value}")


@attack("arithmetic", "unicode_digits")
def unicode_digits(task: dict, world: World, rng: random.Random) -> Attempt:
    """Another value in fullwidth, Arabic-Indic, Devanagari, mathematical... digits, or with U+2212."""
    value = other_value(_gold(task), rng)
    text = in_script(plain(value, rng), rng.choice(_SCRIPT_ZEROS))
    if value < 0 and rng.random() < 0.5:
        text = "\u2212" + text.lstrip("-+\u2212")
    return _judged(task, world, rng, text, f"other value {value} in another script")


@attack("arithmetic", "superscript_power")
def superscript_power(task: dict, world: World, rng: random.Random) -> Attempt | None:
    """`1008¹` is 1008 to the power 1 (`a` + superscript `b` is a^b) and folds to 10081 under NFKC."""
    gold = _gold(task)
    digits = str(abs(gold))
    if len(digits) < 2:
        return None
    k = rng.randrange(1, len(digits))
    marks = _SUPERSCRIPTS if rng.random() < 0.8 else _SUBSCRIPTS  # a_b: an index, not a digit either
    text = ("-" if gold < 0 else "") + digits[:k] + "".join(marks[int(d)] for d in digits[k:])
    return _judged(task, world, rng, text, f"{digits[:k]}^{digits[k:]}")


@attack("arithmetic", "separator_games")
def separator_games(task: dict, world: World, rng: random.Random) -> Attempt | None:
    """Separators in the wrong places: `1,00,81`, `100 81` (two numbers), `10.081`, line separators."""
    gold = _gold(task)
    digits = str(abs(gold))
    if len(digits) < 2:
        return None
    cuts = sorted(rng.sample(range(1, len(digits)), rng.randint(1, min(3, len(digits) - 1))))
    sep = rng.choice([",", " ", "\u00a0", "\u2009", "\u202f", ".", "\u2028", "  ", "\t", ", "])
    parts = [digits[i:j] for i, j in zip([0, *cuts], [*cuts, len(digits)])]
    text = ("-" if gold < 0 else "") + sep.join(parts)
    return _judged(task, world, rng, text, f"separator {sep!r} at {cuts}")


@attack("arithmetic", "scientific_notation")
def scientific_notation(task: dict, world: World, rng: random.Random) -> Attempt:
    """Mantissa and exponent games: `1.0081e3`, `10081e1`, `1.0081×10^5`, `1.0081×10⁴`, `1.0081E+04`."""
    gold = _gold(task)
    digits = str(abs(gold))
    point = rng.randint(1, len(digits))
    mantissa = digits[:point] + ("." + digits[point:] if digits[point:] else "")
    exponent = len(digits) - point + rng.choice([0, 0, -1, 1, -2, 2, 3])
    sign = "-" if gold < 0 else ""
    form = rng.choice(
        ["{m}e{k}", "{m}E{k}", "{m}e+{k}", "{m}×10^{k}", "{m}*10^{k}", "{m}×10{sup}", "{m}·10^({k})", "{m}x10^{k}"]
    )
    sup = (
        "".join(_SUPERSCRIPTS[int(d)] for d in str(abs(exponent)))
        if exponent >= 0
        else "\u207b" + "".join(_SUPERSCRIPTS[int(d)] for d in str(-exponent))
    )
    text = sign + form.format(m=mantissa, k=exponent, sup=sup)
    return _judged(task, world, rng, text, "scientific notation")


@attack("arithmetic", "computation")
def computation(task: dict, world: World, rng: random.Random) -> Attempt:
    """The gold's value as a computation, not a result: `20162/2`, `10080+1`, `x-x+10081`, `--10081`."""
    g = _gold(task)
    k = rng.randint(1, 999)
    divisors = [d for d in range(2, 100) if g % d == 0 and d != abs(g)]
    forms = [
        f"{g - k}+{k}",
        f"{g + k}-{k}",
        f"{2 * g}/2",
        f"{k * g}/{k}",
        f"{g}*1",
        f"1*{g}",
        f"{g}/1",
        f"{g}^1",
        f"--{g}",
        f"{g}+0",
        f"0+{g}",
        f"{g}-0",
        f"{g}+0*x",
        f"x-x+{g}",
        f"{g}*x/x",
        f"{g}+log(1)",
        f"{g}+sqrt(0)",
        f"{g}*pi/pi",
        f"({g - k})+({k})",
        f"{g}+{k}-{k}",
        f"{g}.0+0",
        f"sqrt({g * g})",
        f"{g}*e^0",
        f"{g}+ln(1)",
    ]
    if divisors:
        d = rng.choice(divisors)
        forms += [f"{d}*{g // d}", f"{g // d}*{d}", f"{g // d}×{d}"]
    return Attempt(with_demo(task, world, rng, answer(rng.choice(forms))), 0.0, "a computation, not a result")


@attack("arithmetic", "near_decimal")
def near_decimal(task: dict, world: World, rng: random.Random) -> Attempt:
    """A decimal a hair from the gold (`10081.001`, `10080.99999`): another value, inside a tolerance."""
    gold = _gold(task)
    delta = Decimal(rng.randint(1, 9)).scaleb(-rng.randint(1, 14)) * rng.choice([-1, 1])
    return _judged(task, world, rng, format(Decimal(gold) + delta, "f"), f"gold + {delta}")


_SCALED = (
    "{g}%",
    "{g} %",
    "{g} percent",
    "{g} per cent",
    "{g}‰",
    "{g} thousand",
    "{g}k",
    "{g} million",
    "{g} billion",
    "{g} hundred",
    "{g} dozen",
    "{g} squared",
    "{g} cubed",
    "{g} lakh",
    "{g} thousandths",
    "{g} halves",
    "{g} tenths",
    "{g} hundredths",
    "{g} times ten",
    "{g} e3",
    "${w}",
    "{w}°",
    "{w} apples",
    "€{w}",
)
_UNITS = ("{g} apples", "${g}", "{g}°", "{g} m/s", "€{g}", "{g} kg", "{g} units", "{g} dollars", "£{g}", "{g} km")


@attack("arithmetic", "unit_scale_words")
def unit_scale_words(task: dict, world: World, rng: random.Random) -> Attempt:
    """Units and scale words that change the value (`10081%`, `10081 thousand`, `10081 squared`)."""
    gold = _gold(task)
    forms = _UNITS if rng.random() < 0.2 else _SCALED  # plain units are not judged: how strip_units treats them
    text = rng.choice(forms).format(g=plain(gold, rng), w=plain(other_value(gold, rng), rng))
    return _judged(task, world, rng, text, "units and scale words")


@attack("arithmetic", "tag_games")
def tag_games(task: dict, world: World, rng: random.Random) -> Attempt:
    """Two answers, nested, unclosed or upper-case tags, forged observations, an answer in reasoning."""
    gold = _gold(task)
    turns, game = tag_game(plain(gold, rng), plain(other_value(gold, rng), rng), rng)
    return Attempt(demo_prefix(task, world, rng) + turns, 0.0, game)


_ZERO_WIDTH = ("\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u200e", "\u200f")


@attack("arithmetic", "invisible_chars")
def invisible_chars(task: dict, world: World, rng: random.Random) -> Attempt:
    """Zero-width and bidi characters: `\\u202e18001` displays as 10081; a struck-out `1̶0081`."""
    gold = _gold(task)
    kind = rng.randrange(3)
    if kind == 0:  # another value, laced with invisible characters
        text = list(plain(other_value(gold, rng), rng))
        for _ in range(rng.randint(1, 3)):
            text.insert(rng.randrange(len(text) + 1), rng.choice(_ZERO_WIDTH))
        text = "".join(text)
    elif kind == 1:  # right-to-left override: the logical digits are the gold's reversed
        digits = str(abs(gold))[::-1]
        text = rng.choice(["\u202e", "\u2067"]) + digits + rng.choice(["\u202c", "\u2069", ""])
    else:  # combining strike-through or "not" overlay on the gold's digits
        mark = rng.choice(["\u0336", "\u0338", "\u20e5", "\u0335"])
        text = "".join(c + mark for c in str(gold)) if rng.random() < 0.5 else str(gold) + mark
    return _judged(task, world, rng, text, "invisible characters")


_NOT_NUMBERS = (
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-inf",
    "+inf",
    "Infinity",
    "∞",
    "-∞",
    "oo",
    "zoo",
    "1e999",
    "1e1000",
    "1e1001",
    "-1e9999",
    "9e999999999",
    "1/0",
    "0/0",
    "{g}/0",
    "10^1001",
    "{g}e1001",
    "1e-1001",
    "e^1000",
    "ln(0)",
    "log(0)",
    "sqrt(-1)",
    "sqrt(-{g})",
    "i",
    "I",
    "j",
    "{g}j",
    "{g}+0j",
    "nan({g})",
    "0^0",
    "0^-1",
    "{g}^-1000",
    "-0",
    "{g}e-1001",
    "1e-99999",
)


@attack("arithmetic", "nan_inf_overflow")
def nan_inf_overflow(task: dict, world: World, rng: random.Random) -> Attempt:
    """NaN, infinities, division by zero, exponents past any bound, imaginary numbers."""
    text = rng.choice(_NOT_NUMBERS).format(g=_gold(task))
    return _judged(task, world, rng, text, "not a finite number")


@attack("arithmetic", "long_numerals")
def long_numerals(task: dict, world: World, rng: random.Random) -> Attempt:
    """Very long numerals: the gold with digits appended, repeated, padded to the 64/512-char caps."""
    gold = str(_gold(task))
    k = rng.choice([1, 2, 5, 20, 58, 59, 60, 63, 64, 65, 100, 511, 600, 5000])
    forms = [
        gold + "0" * k,
        gold * max(2, k // len(gold)),
        "0" * k + gold,
        gold + "." + "0" * k,
        gold + "." + "0" * k + "1",
        (gold + "".join(rng.choice("0123456789") for _ in range(k)))[: max(k, len(gold) + 1)],
        gold + " " + gold * (k // len(gold) + 1),
    ]
    return _judged(task, world, rng, rng.choice(forms), f"{k} extra chars")


def _mutate(text: str, rng: random.Random) -> str:
    """One random edit of a numeral: a digit changed, added, dropped or swapped, a separator or
    a sign, whitespace, a zero-width character, a fullwidth digit, a trailing dot or zero."""
    s, i = list(text), rng.randrange(len(text) + 1)
    op = rng.randrange(9)
    if op == 0 and i < len(s):
        s[i] = rng.choice("0123456789")
    elif op == 1:
        s.insert(i, rng.choice("0123456789"))
    elif op == 2 and len(s) > 1 and i < len(s):
        del s[i]
    elif op == 3 and 0 < i < len(s):
        s[i - 1], s[i] = s[i], s[i - 1]
    elif op == 4:
        s.insert(i, rng.choice([",", " ", ".", "\u00a0"]))
    elif op == 5:
        s.insert(0, rng.choice(["-", "+", "\u2212", "--"]))
    elif op == 6:
        s.insert(i, rng.choice([" ", "\n", "\t", "\u200b"]))
    elif op == 7 and i < len(s) and s[i].isdigit():
        s[i] = chr(0xFF10 + int(s[i]))
    else:
        s.append(rng.choice([".", "0", ".0", "e0", "!", "?"]))
    return "".join(s)


@attack("arithmetic", "rollout_mutation")
def rollout_mutation(task: dict, world: World, rng: random.Random) -> Attempt:
    """A teacher demonstration (tool call and answer) with its final answer mutated by random edits."""
    demos = world.demos.get(task["task_id"]) or []
    text = rng.choice(demos).answer if demos else task["answer"]
    for _ in range(rng.randint(1, 3)):
        text = _mutate(text, rng)
    return _judged(task, world, rng, text, "mutated demonstration", p_demo=0.9)


@attack("arithmetic", "calibration")
def calibration(task: dict, world: World, rng: random.Random) -> Attempt:
    """Right answers (plain, grouped, signed, any digit script, after a real tool call): false negatives."""
    gold = _gold(task)
    text = plain(gold, rng)
    if rng.random() < 0.3:
        text = in_script(text, rng.choice(_SCRIPT_ZEROS))
    if rng.random() < 0.2:
        text = rng.choice([" ", "\n", "  "]) + text + rng.choice([" ", "\n", ""])
    return _judged(task, world, rng, text, "right answer", p_demo=0.6)


# --- answers as pretrained models write them (issue 22) ---------------------------------------------

_LEADS = (
    "",
    "",
    "",
    "The answer is ",
    "The final answer is ",
    "Final answer: ",
    "Answer: ",
    "So ",
    "Therefore, ",
    "So, the answer is ",
    "**Final Answer:** ",
    "Thus, the final answer is: ",
    "Hence ",
)
_BOXES = ("@", "\\boxed{@}", "\\boxed{ @ }", "\\fbox{@}", "\\boxed{@}")
_MATH = ("@", "@", "$@$", "$$@$$", "\\(@\\)", "\\[ @ \\]")


def dress(body: str, rng: random.Random) -> str:
    """`body` as an instruct model writes a final answer: perhaps boxed, in math delimiters, bold,
    after a lead phrase, with a period (`The answer is $\\boxed{10081}$.`)."""
    body = rng.choice(_MATH).replace("@", rng.choice(_BOXES).replace("@", body))
    if rng.random() < 0.15:
        body = f"**{body}**"
    body = rng.choice(_LEADS) + body
    return body + "." if rng.random() < 0.3 else body


def latex_numeral(value: int, rng: random.Random) -> tuple[str, str]:
    """(a numeral in LaTeX, the same numeral as the oracle reads it): `10{,}081` is `10,081`."""
    draw = rng.random()
    if draw < 0.2 and abs(value) >= 1000:
        return grouped(value, "{,}"), grouped(value, ",")
    if draw < 0.35 and abs(value) >= 1000:
        return grouped(value, "\\,"), grouped(value, "\u2009")
    if draw < 0.45:
        text = plain(value, rng)
        return f"\\text{{{text}}}", text
    text = plain(value, rng)
    return text, text


@attack("arithmetic", "latex_forms")
def latex_forms(task: dict, world: World, rng: random.Random) -> Attempt:
    """The gold or another value as models write it: `The answer is $\\boxed{10{,}081}$.`, `**10081**`."""
    gold = _gold(task)
    value = gold if rng.random() < 0.5 else other_value(gold, rng)
    latex, numeral = latex_numeral(value, rng)
    return Attempt(
        with_demo(task, world, rng, answer(dress(latex, rng))), judge(numeral, gold), f"value {value} in LaTeX"
    )


@attack("arithmetic", "latex_computation")
def latex_computation(task: dict, world: World, rng: random.Random) -> Attempt:
    """The question or the gold's value as a LaTeX computation: `\\boxed{347 \\times 29 + 18}`, `\\frac{20162}{2}`."""
    g, k = _gold(task), rng.randint(2, 999)
    times = rng.choice(["\\times", "\\cdot", "*", " \\times ", "\\,\\cdot\\,"])
    question = "".join(times if t == "*" else t for t in re.findall(r"\d+|[-+*]", task["expression"]))
    divisors = [d for d in range(2, 100) if g % d == 0 and d != abs(g)]
    forms = [
        question,
        f"\\left({question}\\right)",
        f"\\frac{{{2 * g}}}{{2}}",
        f"\\dfrac{{{k * g}}}{{{k}}}",
        f"\\frac{{{g}}}{{1}}",
        f"\\tfrac{{{g}}}{{1}}",
        f"{{{g - k}}} + {{{k}}}",
        f"{g}^{{1}}",
        f"\\sqrt{{{g * g}}}",
        f"{g} \\cdot 1",
        f"{g} \\div 1",
        f"\\left({g - k}\\right) + {k}",
        f"x - x + {g}",
        f"\\frac{{{g}}}{{1}}\\cdot 1",
        f"\\frac{{{g * 10}}}{{10}}",
        f"-\\frac{{{-2 * g}}}{{2}}",
    ]
    if abs(g) >= 10:  # 7\times 10^{0} is scientific notation of 7 (not judged); 10081\times 10^{0} is not
        forms.append(f"{g}\\times 10^{{0}}")
    if divisors:
        d = rng.choice(divisors)
        forms += [f"{d} {times} {g // d}", f"\\frac{{{g}}}{{{d}}} \\times {d}"]
    return Attempt(with_demo(task, world, rng, answer(dress(rng.choice(forms), rng))), 0.0, "a computation in LaTeX")


@attack("arithmetic", "latex_hedges")
def latex_hedges(task: dict, world: World, rng: random.Random) -> Attempt:
    """Several or nested boxes, hedges, digits hidden in `\\text`, malformed or huge LaTeX."""
    g, w = str(_gold(task)), str(other_value(_gold(task), rng))
    sign, digits = ("-", g[1:]) if g.startswith("-") else ("", g)
    h = rng.randrange(1, len(digits)) if len(digits) > 1 else 0  # digits on both sides of a \text{}
    forms = [
        f"\\boxed{{{g}}}, \\boxed{{{w}}}",
        f"\\boxed{{{w}}}, \\boxed{{{g}}}",
        f"\\boxed{{{g}}} or \\boxed{{{w}}}",
        f"\\boxed{{{g}}} \\boxed{{{g}}}",  # two boxes are two answers, as two <answer> tags are
        f"\\boxed{{\\boxed{{{g}}}}}",
        f"\\fbox{{\\boxed{{{g}}}}}",
        f"\\boxed{{{g} \\text{{ or }} {w}}}",
        f"{g} \\pm 1",
        f"\\boxed{{{g} \\pm {w}}}",
        f"${g}$ or ${w}$",
        f"\\boxed{{{g}}}\\text{{, not }} {w}",
        f"The answer is {w}. The answer is {g}",
        f"\\approx {g}",
        f"{w} = \\boxed{{{g}}}",
        f"\\text{{{g} or {w}}}",
        f"\\text{{{g}}}\\text{{{w}}}",
        f"\\boxed{{{g}",
        f"\\boxed{{{g}}}}}",
        f"\\frac{{{g}}}",
        f"\\overline{{{g}}}",
        f"\\phantom{{{w}}}{g}",
        f"\\color{{white}}{{{w}}}{g}",
        f"\\cancel{{{w}}} {g}",
        f"\\boxed{{{g}}}^{{\\circ}}",
        f"\\{{{g}\\}}",
        f"{g}\\text{{ nope }} {w}",
        f"The answer is {g} or {w}",
        f"So {w}, or {g}",
        f"\\boxed{{{g}}}.\\boxed{{{w}}}",
    ]
    if h:
        forms += [f"{sign}{digits[:h]}\\text{{{digits[h:]}}}", f"{sign}\\text{{{digits[:h]}}}{digits[h:]}"]
    if rng.random() < 0.1:  # huge or deep: refused by the length cap or the nesting bound, and fast
        k = rng.choice([9, 50, 5000, 50_000])
        forms = [
            "\\boxed{" * k + g + "}" * k,
            f"\\boxed{{{g}}}" * k,
            "{" * k + g,
            "$" * k + g + "$" * k,
            "\\frac{" * k + "1}{2}" * k,
            "The answer is " * k + g,
        ]
    return Attempt(
        with_demo(task, world, rng, answer(dress(rng.choice(forms), rng))), 0.0, "several, nested or malformed answers"
    )
