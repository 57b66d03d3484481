"""Math answer equivalence: exact numbers first, then a safe symbolic comparison.

    "18,026" = "1.8026e4" = "1.8026×10^4" = "36052/2"    exact rationals (`Fraction`), no sympy
    "2*sqrt(2)" = "sqrt(8)",  "x+1" = "1+x",  "pi/2"       sympy, on a whitelisted grammar

This is a reward the policy is optimised against, so text never reaches sympy's `parse_expr`
(it calls `eval`). A strict character set, Python's `ast.parse` (it parses, never evaluates) and
an allow-list walk build a tuple tree, refusing whatever could be slow to evaluate (an exponent
that is not a number of at most 1000, a power inside a power, an exact power over 40,000 bits,
too many nodes) before any sympy object exists. exp/sin/cos/tan are left out: at a huge argument
(exp(exp(exp(100)))) they take seconds to forever to evaluate. Expressions are compared
structurally, then by value at fixed points (polynomial identity testing, Schwartz–Zippel),
never with `simplify`, whose running time has no bound. Functions nest at most 3 deep (each
level of log(log(...)) costs sympy ~7x more), and the symbolic comparison runs in a child process
under a deadline (`verifiers.bounded`): too slow is *unscorable*, never a verdict.

An answer is a *result*, not a computation (`final_form`, on by default): when the gold is a
number the answer must be a number (a numeral, a fraction in lowest terms, or m×10^k), so the
question copied (`compute 347*29+18` -> `347*29+18`) or padded (`x-x+10081`) earns nothing; a
symbolic answer may not contain a sub-expression that evaluates to a rational number
(`sqrt(4+4)`), nor restate an expression of the question that differs from the gold.

Answers and golds are first taken out of the wrappers a pretrained model writes around them
(`The answer is $\\boxed{10081}$.`, `\\dfrac{1}{2}`: `verifiers.latex_answer`); every rule above
runs on what remains, so `\\boxed{347 \\times 29 + 18}` is still a computation.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from fractions import Fraction
from functools import lru_cache, reduce
from math import gcd

from verifiers.base import Task, Verdict, register
from verifiers.bounded import DeadlineExceeded, call_with_deadline
from verifiers.latex_answer import MAX_WRAPPED_CHARS, answer_text, latex_to_plain
from verifiers.math_equiv import fold_text, numeric_match, parse_number

MAX_CHARS = 64  # a final answer longer than this is not an answer (same bound as math_equiv)
_MAX_GOLD_CHARS = 256  # gold answers are trusted data and may be longer expressions
_MAX_GOLD_WRAPPED_CHARS = 4 * _MAX_GOLD_CHARS  # a gold with its LaTeX (\frac{\sqrt{2}}{2}, \boxed{...})
_MAX_NODES, _MAX_EXPONENT = 100, 1000  # 10^1000 is cheap to evaluate; 10^10^10 is not
_MAX_POWER_BITS = 40_000  # an exact power's size: 99999999999^1000 is 36,500 bits; 7e837^1000 takes 0.2 s
_MAX_CALL_DEPTH = 3  # log(log(log(x))): 0.01 s; 7 levels: 2-4 s; 8 levels: 18 s (sympy's evalf)
DEFAULT_TIMEOUT_S = 1.0  # the symbolic comparison's wall-clock bound (child process, verifiers.bounded)
_FUNCTIONS = ("sqrt", "log", "ln")  # natural log, either name
_CONSTANTS = ("pi", "e")
_VARIABLES = "abcknxyz"  # not m/s/h/t...: those letters are units more often than unknowns
_EVAL_FLOOR = 1e-20  # values are evaluated to 30 digits: a smaller difference (relative, or near 0) is rounding
_rng = random.Random(1729)  # fixed points: a verdict must not depend on the run
_POINTS = [{v: _rng.uniform(0.5, 2.5) for v in _VARIABLES} for _ in range(3)]

_FOLDS = str.maketrans(
    {"\u2212": "-", "\u2013": "-", "\u00d7": "*", "\u00b7": "*", "\u22c5": "*", "\u00f7": "/", "\u03c0": "pi"}
)
# A run of digits with commas: its commas are thousands separators only if the whole run is
# grouped (1,234,567.5), else they stay and the answer does not parse (1234,567  1.5,000  1,00,81).
_NUMERAL_RUN = re.compile(r"[0-9][0-9,.]*")
_GROUPED_RUN = re.compile(r"[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]*)?")
# With strip_units, one currency sign before the number (after its sign) and one percent, degree or
# currency sign after it: "$5", "-$5", "50%", "5€". Not anywhere: "1$0081" and "5 $ 6" are not numbers.
_PREFIX_SIGNS, _SUFFIX_SIGNS = frozenset("$€£¥"), frozenset("%°$€£¥")
_UNIT_TAIL = re.compile(r"(?<=[0-9)\s])\s*([a-zμ][a-zμ/^0-9.\s]*)$")  # "12 m/s", "5 apples", "9.8 m/s^2" (NFKC µ is μ)
_WORD = re.compile(r"[a-zμ]+")
# A unit tail is words, with digits only as exponents or attached to a unit (m/s^2, cm3). A
# number standing alone after the first, or a connective, is another answer: "10081 or 10082".
_LOOSE_NUMBER = re.compile(r"(?<![a-zμ^])[0-9]")
_HEDGES = frozenset(
    {
        "or",
        "nor",
        "not",
        "no",
        "nope",
        "and",
        "but",
        "except",
        "either",
        "maybe",
        "perhaps",
        "possibly",
        "probably",
        "likely",
        "unlikely",
        "guess",
        "vs",
        "versus",
        "to",
        "than",
        "plus",
        "minus",
        "times",
        "over",
        "under",
        "above",
        "below",
        "else",
        "otherwise",
        "if",
        "unless",
        "wrong",
        "incorrect",
        "false",
        "untrue",
        "invalid",
        "approx",
        "approximately",
        "about",
        "around",
        "roughly",
        "nearly",
        "almost",
        "less",
        "more",
        "least",
        "most",
        "never",
    }
)
# Words that scale the number rather than name its unit: "60 billion" is not 60.
_SCALES = frozenset(
    {
        "hundred",
        "hundreds",
        "thousand",
        "thousands",
        "million",
        "millions",
        "billion",
        "billions",
        "trillion",
        "trillions",
        "dozen",
        "dozens",
        "half",
        "halves",
        "quarter",
        "quarters",
        "tenth",
        "tenths",
        "hundredth",
        "hundredths",
        "thousandth",
        "thousandths",
        "millionth",
        "millionths",
        "squared",
        "cubed",
        "lakh",
        "crore",
        "k",
        "bn",
        "mn",
    }
)
_MAX_UNIT_WORDS = 3
_SIGNS_IN_A_ROW = re.compile(r"[-+][-+]")
_NUM = r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[-+]?[0-9]{1,3})?"  # exponent capped: Fraction("1e9999999") takes seconds
_PLAIN_NUMBER = re.compile(rf"[-+]?{_NUM}(?:/[-+]?{_NUM})?")
_CHARSET = re.compile(r"[0-9a-z+\-*/^().]+")  # no quotes, _, [], {}, commas, colons, =, whitespace
_IMPLICIT = re.compile(r"(?<=[0-9)])(?=[a-z(])(?!e[-+]?[0-9])")  # "2x" "2(x+1)" "(a)(b)", but not "2e3"
_NAME_THEN_PAREN = re.compile(r"([a-z]+)\(")  # "x(x+1)" is a product unless the name is a function
_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "^"}


def _is_math_word(word: str) -> bool:
    """A function, a constant, or a run of one-letter names ("xy" is x*y, "ex" is e*x)."""
    return word in _FUNCTIONS or word in _CONSTANTS or all(c in _VARIABLES or c == "e" for c in word)


def normalize(text: str, strip_units: bool = False) -> str:
    """NFKC (fullwidth digits), one minus and one times sign, no whitespace, no thousands commas;
    with `strip_units`, no currency/percent/degree sign around the number and no trailing unit
    words. A tail that is not a unit (another number, a connective, more than three words) is
    kept, so the answer does not parse: "10081 or 10082" and "10081 nope 99999" are not 10081."""
    s = fold_text(text).lower().strip()  # ValueError: 5⁰, 1₄, "1 2"
    if not s.isascii():  # every fold maps a non-ASCII character
        s = s.translate(_FOLDS)
    if strip_units:
        s = _strip_prefix_sign(s)
        tail = _UNIT_TAIL.search(s)
        for word in _WORD.finditer(tail.group(1)) if tail else ():
            if not _is_math_word(word.group()):  # "2 x cm" keeps the x: cut at the first non-math word
                cut = tail.start(1) + word.start()
                if _is_unit_tail(s[cut:]):
                    s = s[:cut]
                break
        s = s.rstrip()
        s = s[:-1] if s[-1:] and s[-1] in _SUFFIX_SIGNS else s
    s = "".join(s.split()).replace("**", "^")
    return _NUMERAL_RUN.sub(_ungroup, s) if "," in s else s


def _ungroup(run: re.Match) -> str:
    text = run.group()
    return text.replace(",", "") if "," in text and _GROUPED_RUN.fullmatch(text) else text


def _strip_prefix_sign(s: str) -> str:
    sign = s[0] if s[:1] in ("-", "+") else ""
    body = s[len(sign) :].lstrip()
    return sign + body[1:] if body[:1] and body[0] in _PREFIX_SIGNS else s


def _is_unit_tail(tail: str) -> bool:
    words = _WORD.findall(tail)
    return (
        len(words) <= _MAX_UNIT_WORDS
        and not _LOOSE_NUMBER.search(tail)
        and not any(w in _HEDGES or w in _SCALES for w in words)
    )


_ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "^": operator.pow}


def rational_value(tree: tuple) -> Fraction | None:
    """The exact value of a tree of numbers, + - * / and integer powers; None otherwise."""
    kind = tree[0]
    if kind == "num":
        return tree[1]
    if kind == "neg":
        return None if (inner := rational_value(tree[1])) is None else -inner
    if kind not in _ARITHMETIC:
        return None
    left, right = rational_value(tree[1]), rational_value(tree[2])
    if left is None or right is None or (kind == "^" and right.denominator != 1):
        return None
    try:
        return _ARITHMETIC[kind](left, int(right) if kind == "^" else right)
    except ZeroDivisionError:
        return None


def parse_expression(text: str, max_chars: int = MAX_CHARS) -> tuple:
    """A normalized answer -> a tuple tree, e.g. ("+", ("name", "x"), ("num", Fraction(1))).
    Raises ValueError(reason) for anything outside the grammar or too costly to evaluate.

    `ast.parse` only parses (it never evaluates); the walk below accepts numbers, allow-listed
    names, + - * / ^, unary minus and the allow-listed functions, and nothing else."""
    if len(text) > max_chars:  # also bounds the nesting depth of parentheses
        raise ValueError(f"{len(text)} chars > {max_chars}")
    if not _CHARSET.fullmatch(text):
        raise ValueError("characters outside 0-9 a-z + - * / ^ ( ) .")
    s = _IMPLICIT.sub("*", text)
    s = _NAME_THEN_PAREN.sub(lambda m: m[0] if m[1] in _FUNCTIONS else m[1] + "*(", s).replace("^", "**")
    try:
        body = ast.parse(s, mode="eval").body
    except SyntaxError:
        raise ValueError("not an expression") from None
    if sum(1 for _ in ast.walk(body)) > _MAX_NODES:
        raise ValueError(f"more than {_MAX_NODES} nodes")
    return _tree(body, s)


def _tree(node: ast.AST, source: str, calls: int = 0) -> tuple:
    if isinstance(node, ast.Constant):
        literal = source[node.col_offset : node.end_col_offset]  # the text, not Python's float: 0.1 stays 1/10
        if not _PLAIN_NUMBER.fullmatch(literal):  # 0x10, 1j, 1e99999 (Fraction would build a 99999-digit int)
            raise ValueError(f"number {literal!r} not allowed")
        return ("num", Fraction(literal))
    if isinstance(node, ast.Name):
        if not _is_math_word(node.id) or node.id in _FUNCTIONS:
            raise ValueError(f"unknown name {node.id!r}")
        if node.id in _CONSTANTS:
            return ("name", node.id)
        return reduce(lambda a, b: ("*", a, b), [("name", c) for c in node.id])  # "xy" is x*y
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _tree(node.operand, source, calls)
        return ("neg", inner) if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        op, left, right = _OPERATORS[type(node.op)], _tree(node.left, source, calls), _tree(node.right, source, calls)
        if op == "^":  # 9^9^9^9 and 10^10^10 would take forever to evaluate: refuse them here
            if _has_power(left) or _has_power(right):
                raise ValueError("nested power")
            if (value := rational_value(right)) is None or abs(value) > _MAX_EXPONENT:
                raise ValueError(f"exponent must be a number of at most {_MAX_EXPONENT}")
            if max(_literal_bits(left), 1) * abs(value) > _MAX_POWER_BITS:  # sympy expands (7e837x)^1000 exactly
                raise ValueError(f"power larger than {_MAX_POWER_BITS} bits")
        return (op, left, right)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and len(node.args) == 1
        and not node.keywords
    ):
        if calls >= _MAX_CALL_DEPTH:  # work bound: evaluating nested functions grows ~7x per level
            raise ValueError(f"functions nested more than {_MAX_CALL_DEPTH} deep")
        return ("call", node.func.id, _tree(node.args[0], source, calls + 1))
    raise ValueError(f"{type(node).__name__} not allowed")


def _has_power(tree: tuple) -> bool:
    return tree[0] == "^" or any(isinstance(t, tuple) and _has_power(t) for t in tree[1:])


def _literal_bits(tree: tuple) -> int:
    """An upper bound on the size of any number the tree's value can hold (it has no powers)."""
    if tree[0] == "num":
        return max(tree[1].numerator.bit_length(), tree[1].denominator.bit_length())
    return sum(_literal_bits(t) for t in tree[1:] if isinstance(t, tuple))


def _parse_answer(
    text: str, strip_units: bool, symbolic: bool, max_chars: int = MAX_CHARS, final_form: bool = False
) -> Fraction | tuple:
    """An exact number, or (when `symbolic`) an expression tree. Raises ValueError(reason).
    `final_form` (predictions only): refuse a sub-expression that computes a rational number."""
    if not text.strip():
        raise ValueError("empty")
    if len(text.strip()) > max_chars:
        raise ValueError(f"too long: {len(text.strip())} chars > {max_chars}")
    s = normalize(text, strip_units)
    if _PLAIN_NUMBER.fullmatch(s) and (value := parse_number(s)) is not None:  # the fast path
        return value
    try:
        tree = parse_expression(s, max_chars)
    except ValueError as exc:
        raise ValueError(f"unparseable: {exc}") from None
    if final_form and (_computation(tree) or _SIGNS_IN_A_ROW.search(s)):  # "++5" parses to 5: no node shows it
        raise ValueError("is not a final answer: it computes a number instead of stating it")
    value = rational_value(tree)
    if value is not None:
        return value
    if not symbolic:
        raise ValueError("not a rational number (symbolic=False)")
    return tree


def _is_integer(tree: tuple) -> bool:
    inner = tree[1] if tree[0] == "neg" else tree
    return inner[0] == "num" and inner[1].denominator == 1


def _is_number_literal(tree: tuple) -> bool:
    """How results are written: -5, 7/2 in lowest terms, 1.8026*10^4 (1 <= |m| < 10)."""
    if tree[0] == "num":
        return True
    if tree[0] == "neg":
        return tree[1][0] != "neg" and _is_number_literal(tree[1])
    if tree[0] == "/":
        num, den = rational_value(tree[1]), rational_value(tree[2])
        return (
            _is_integer(tree[1])
            and tree[2][0] == "num"
            and _is_integer(tree[2])
            and den > 1
            and num.denominator == 1
            and gcd(num.numerator, int(den)) == 1
        )
    if tree[0] == "*" and (tree[1][0] == "num" or tree[1][0] == "neg" and tree[1][1][0] == "num") and tree[2][0] == "^":
        mantissa, (_, base, exponent) = rational_value(tree[1]), tree[2]
        return 1 <= abs(mantissa) < 10 and base == ("num", Fraction(10)) and _is_integer(exponent)
    return False


def _computation(tree: tuple) -> bool:
    """Whether any sub-expression evaluates to a rational number yet is not written as one
    (347*29+18, 36052/2, 2^10, sqrt(4+4), --5): a restated question, not its answer."""
    if tree[0] in ("num", "name") or _is_number_literal(tree):
        return False
    if tree[0] != "call" and rational_value(tree) is not None:
        return True
    return any(isinstance(t, tuple) and _computation(t) for t in tree[1:])


@lru_cache(maxsize=1024)
def _prompt_form(prompt: str) -> str:
    try:  # "Simplify $\sqrt{8}$" reads as "simplify$sqrt(8)$": its expression can be found in it
        prompt = latex_to_plain(prompt, strict=False)
    except ValueError:  # unbalanced braces: read the prompt as written
        pass
    try:
        return normalize(prompt)
    except ValueError:  # a prompt the answer grammar cannot read cannot be restated in it either
        return ""


def _restates_question(pred_text: str, gold_text: str, task: Task) -> bool:
    """A symbolic answer that is an expression copied from the question but not the gold's own
    form ("simplify sqrt(8)" -> "sqrt(8)"): equal in value, and no work done. Both texts are
    out of their wrappers (`answer_text`)."""
    pred = normalize(pred_text)
    if not any(op in pred for op in "+-*/^(") or pred == normalize(gold_text):
        return False
    return pred in _prompt_form(str(task.get("prompt", "")))


def _gold_text(task: Task) -> str:
    return answer_text(str(task["answer"]), _MAX_GOLD_WRAPPED_CHARS)


@lru_cache(maxsize=4096)  # a group of samples shares one gold answer: parse it once
def _gold_answer(text: str, strip_units: bool, symbolic: bool) -> Fraction | tuple:
    return _parse_answer(answer_text(text, _MAX_GOLD_WRAPPED_CHARS), strip_units, symbolic, _MAX_GOLD_CHARS)


def _close(pred, gold, rel_tol, abs_tol) -> bool:
    """Relative OR absolute tolerance: exact for Fractions (given Fraction tolerances), and for
    sympy numbers, complex ones included."""
    return bool(abs(pred - gold) <= max(rel_tol * abs(gold), abs_tol))


def _import_sympy() -> None:
    import sympy  # noqa: F401  (the bounded child's set-up: the import is not charged to a deadline)


def _to_sympy(tree: tuple):
    import sympy  # lazy: the numeric fast path and the precheck never need it

    kind = tree[0]
    if kind == "num":
        return sympy.Rational(tree[1].numerator, tree[1].denominator)
    if kind == "name":
        return {"pi": sympy.pi, "e": sympy.E}[tree[1]] if tree[1] in _CONSTANTS else sympy.Symbol(tree[1])
    if kind == "call":
        return {"sqrt": sympy.sqrt, "log": sympy.log, "ln": sympy.log}[tree[1]](_to_sympy(tree[2]))
    if kind == "neg":
        return -_to_sympy(tree[1])
    return _ARITHMETIC[kind](_to_sympy(tree[1]), _to_sympy(tree[2]))


def _values(expr) -> list | None:
    """The value at each fixed point (one point if no free symbols); None if any is not finite."""
    points = _POINTS if expr.free_symbols else _POINTS[:1]
    values = [expr.evalf(30, subs={s: p[s.name] for s in expr.free_symbols}) for p in points]
    return values if all(v.is_number and v.is_finite for v in values) else None


@lru_cache(maxsize=4096)
def _gold_expression(tree: tuple):
    expr = _to_sympy(tree)
    return expr, _values(expr)


def _symbolic_verdict(
    pred: Fraction | tuple, gold: Fraction | tuple, rel_tol: float, abs_tol: float, texts: tuple[str, str]
) -> Verdict:
    gold_expr, gold_values = _gold_expression(gold if isinstance(gold, tuple) else ("num", gold))
    if gold_values is None:
        return Verdict(None, f"gold is not finite: {_show(texts[1])}")
    try:
        pred_expr = _to_sympy(pred if isinstance(pred, tuple) else ("num", pred))
        if pred_expr == gold_expr:
            return Verdict(1.0, _detail("symbolic", True, texts))
        pred_values = _values(pred_expr)
    except Exception as exc:  # noqa: BLE001 — a prediction that breaks sympy earns 0; "unscorable" is for golds
        return Verdict(0.0, f"prediction not evaluable ({type(exc).__name__}): {_show(texts[0])}")
    if pred_values is None:
        return Verdict(0.0, f"prediction is not finite: {_show(texts[0])}")
    rel, tol = max(rel_tol, _EVAL_FLOOR), max(abs_tol, _EVAL_FLOOR)
    ok = all(p == g or _close(p, g, rel, tol) for p, g in zip(pred_values, gold_values))
    return Verdict(float(ok), _detail("symbolic, by value", ok, texts))


def _show(text: str) -> str:
    return " ".join(text.split())[:40]  # details are for audit: short, one line


def _detail(how: str, ok: bool, texts: tuple[str, str]) -> str:
    return f"{how}: {_show(texts[0])} {'==' if ok else '!='} {_show(texts[1])}"


def _prediction(
    prediction: str, task: Task, strip_units: bool, symbolic: bool, final_form: bool
) -> tuple[Fraction | tuple, Fraction | tuple]:
    """(prediction, gold) parsed; ValueError("gold ..." / "prediction ...") if either cannot be.
    `prediction` is the answer out of its wrappers (`answer_text`)."""
    try:
        pred = _parse_answer(prediction, strip_units, symbolic, final_form=final_form)
    except ValueError as exc:
        raise ValueError(f"prediction {exc}") from None
    try:
        gold = _gold_answer(str(task["answer"]), strip_units, symbolic)
    except ValueError as exc:
        raise ValueError(f"gold {exc}") from None
    if final_form and isinstance(gold, Fraction) and not isinstance(pred, Fraction):
        raise ValueError("prediction is an expression; the answer to this task is a number")
    if final_form and isinstance(gold, tuple) and _restates_question(prediction, _gold_text(task), task):
        raise ValueError("prediction restates an expression of the question")
    return pred, gold


def _unwrapped(prediction: str) -> str:
    """The answer inside a model's wrappers; ValueError("prediction ...") if none can be read."""
    try:
        return answer_text(prediction, MAX_WRAPPED_CHARS)
    except ValueError as exc:
        raise ValueError(f"prediction {exc}") from None


def math_precheck(
    prediction: str,
    task: Task,
    *,
    rel_tol: float = 1e-6,
    abs_tol: float = 0.0,
    strip_units: bool = False,
    symbolic: bool = True,
    final_form: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    exact_integers: bool = True,
) -> str | None:
    """Why the fast tier can reject `prediction` unverified (empty, too long, outside the grammar,
    not a final answer). An unusable gold is the task check's to report."""
    try:
        core = _unwrapped(prediction)
    except ValueError as exc:
        return str(exc)
    try:
        pred = _parse_answer(core, strip_units, symbolic, final_form=final_form)
    except ValueError as exc:
        return f"prediction {exc}"
    if isinstance(pred, Fraction):
        return None  # a number in final form: nothing about the gold can refuse it unverified
    try:  # an expression: the rules that compare it with the gold and the question
        _prediction(core, task, strip_units, symbolic, final_form)
    except ValueError as exc:
        return None if str(exc).startswith("gold") else str(exc)
    return None


def gold_is_parseable(
    task: Task,
    *,
    rel_tol: float = 1e-6,
    abs_tol: float = 0.0,
    strip_units: bool = False,
    symbolic: bool = True,
    final_form: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    exact_integers: bool = True,
) -> str | None:
    try:
        _gold_answer(str(task["answer"]), strip_units, symbolic)
    except ValueError as exc:
        return f"gold {exc}"
    return None


@register("math", precheck=math_precheck, task_check=gold_is_parseable)
def math_verifier(
    prediction: str,
    task: Task,
    *,
    rel_tol: float = 1e-6,
    abs_tol: float = 0.0,
    strip_units: bool = False,
    symbolic: bool = True,
    final_form: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    exact_integers: bool = True,
) -> Verdict:
    """1.0 if equivalent within rel_tol OR abs_tol (not for an integer gold, unless
    `exact_integers` is off), 0.0 if not, unparseable or not a final answer, None if the gold is
    unparseable or the symbolic comparison ran past `timeout_s`."""
    gold_text = str(task["answer"])
    if (reason := gold_is_parseable(task, strip_units=strip_units, symbolic=symbolic)) is not None:
        return Verdict(None, reason)  # an unusable gold is unscorable, whatever the prediction
    try:
        pred, gold = _prediction(_unwrapped(prediction), task, strip_units, symbolic, final_form)
    except ValueError as exc:
        return Verdict(None if str(exc).startswith("gold") else 0.0, str(exc))
    if isinstance(pred, Fraction) and isinstance(gold, Fraction):  # exact rationals: no sympy at all
        # An integer gold is exact: tolerance is for golds that are rounded (10080.99 is not 10081).
        ok = pred == gold or (
            (gold.denominator != 1 or not exact_integers) and _close(pred, gold, Fraction(rel_tol), Fraction(abs_tol))
        )
        return Verdict(float(ok), _detail("numeric", ok, (prediction, gold_text)))
    try:  # sympy's running time is not bounded by the grammar alone: a child process and a deadline
        return call_with_deadline(
            _symbolic_verdict,
            (pred, gold, rel_tol, abs_tol, (prediction, gold_text)),
            timeout_s=timeout_s,
            setup=_import_sympy,
        )
    except DeadlineExceeded:
        return Verdict(None, f"symbolic comparison exceeded {timeout_s:g} s: {_show(prediction)}")


def _plain_or_none(text: str, max_chars: int) -> str | None:
    try:
        return answer_text(text, max_chars)
    except ValueError:
        return None


def numeric_precheck(prediction: str, task: Task, *, rel_tol: float = 1e-6, exact_integers: bool = True) -> str | None:
    core = _plain_or_none(prediction, MAX_WRAPPED_CHARS)
    return (
        None
        if core is not None and parse_number(core) is not None
        else f"prediction not a number: {_show(prediction)!r}"
    )


def _numeric_task_check(task: Task, *, rel_tol: float = 1e-6, exact_integers: bool = True) -> str | None:
    gold = _plain_or_none(str(task["answer"]), _MAX_GOLD_WRAPPED_CHARS)
    return (
        None
        if gold is not None and parse_number(gold) is not None
        else f"gold not a number: {_show(str(task['answer']))!r}"
    )


@register("numeric", precheck=numeric_precheck, task_check=_numeric_task_check)
def numeric_verifier(prediction: str, task: Task, *, rel_tol: float = 1e-6, exact_integers: bool = True) -> Verdict:
    """The original exact-rational check (math_equiv.numeric_match), selectable by name, on the
    answer out of its wrappers as `math` reads it (`\\boxed{10081}` is 10081 here too, so an
    audit with `numeric` disagrees with training on values, not on wrappers)."""
    raw_gold = str(task["answer"])
    gold = _plain_or_none(raw_gold, _MAX_GOLD_WRAPPED_CHARS)
    if gold is None:
        return Verdict(None, f"gold not a number: {_show(raw_gold)!r}")
    score = numeric_match(_plain_or_none(prediction, MAX_WRAPPED_CHARS) or "", gold, rel_tol, exact_integers)
    return Verdict(
        score,
        f"numeric: {_show(prediction)} vs {_show(raw_gold)}"
        if score is not None
        else f"gold not a number: {_show(raw_gold)!r}",
    )
