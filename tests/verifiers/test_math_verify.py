"""The `math` verifier: numeric and symbolic equivalence, units, tolerances, and the defenses a
reward function needs against a policy that will try to break it (code injection, slow inputs)."""

import builtins
import os
import time

import pytest

from verifiers import math_verify
from verifiers.base import run_precheck, run_task_check, run_verifier
from verifiers.math_verify import math_precheck, math_verifier


def score(prediction, gold, **params):
    return math_verifier(prediction, {"answer": gold}, **params).score


@pytest.mark.parametrize(
    "prediction, gold, expected",
    [
        ("18026", "18026", 1.0),
        ("18,026", "18026", 1.0),
        ("18026.0", "18026", 1.0),
        ("1.8026e4", "18026", 1.0),
        ("1.8026×10^4", "18026", 1.0),
        ("1.8026*10^4", "18026", 1.0),
        ("1.8026 * 10**4", "18026", 1.0),
        ("7/2", "3.5", 1.0),
        ("1/2", "0.5", 1.0),
        ("2^10", "1024", 0.0),  # a computation, not a result (issue 21: the question copied)
        ("-2^2", "-4", 0.0),
        ("2*sqrt(2)", "sqrt(8)", 1.0),
        ("sqrt(2)/2", "1/sqrt(2)", 1.0),
        ("x+1", "1+x", 1.0),
        ("2x", "x*2", 1.0),
        ("2(x+1)", "2x+2", 1.0),
        ("xy", "y*x", 1.0),
        ("1/2x", "x/2", 1.0),  # implicit multiplication binds like *
        ("(x+1)^2", "x^2+2x+1", 1.0),  # equal only by value: compared at fixed points
        ("pi/2", "pi/2", 1.0),
        ("\u03c0/2", "pi/2", 1.0),  # the Greek letter
        ("3.14159265358979", "pi", 1.0),  # within the default rel_tol 1e-6
        ("e^2", "e*e", 1.0),
        ("ln(x)", "log(x)", 1.0),
        ("\uff11\uff18\uff10\uff12\uff16", "18026", 1.0),  # fullwidth look-alike digits (NFKC)
        ("\u221242", "-42", 1.0),  # U+2212 minus sign
        ("\uff12\uff58", "2x", 1.0),  # fullwidth letters too
        ("18025", "18026", 0.0),
        ("1/3", "0.33", 0.0),
        ("2*sqrt(3)", "sqrt(8)", 0.0),
        ("x+2", "1+x", 0.0),
        ("x^2", "x^3", 0.0),
        ("x/y", "y/x", 0.0),  # every variable gets its own value at each point
        ("x", "y", 0.0),
        ("3.14", "pi", 0.0),
        ("1/0", "1", 0.0),  # not finite
        ("", "42", 0.0),
        ("   ", "42", 0.0),
        ("42x", "42", 0.0),
        ("4 2 apples", "42", 0.0),
    ],
)
def test_equivalence(prediction, gold, expected):
    assert score(prediction, gold) == expected


def test_details_say_which_path_ruled():
    assert math_verifier("18026", {"answer": "18026"}).details == "numeric: 18026 == 18026"
    assert math_verifier("18025", {"answer": "18026"}).details == "numeric: 18025 != 18026"
    assert math_verifier("2*sqrt(2)", {"answer": "sqrt(8)"}).details == "symbolic: 2*sqrt(2) == sqrt(8)"
    assert math_verifier("(x+1)^2", {"answer": "x^2+2x+1"}).details.startswith("symbolic, by value:")
    assert math_verifier("os", {"answer": "1"}).details == "prediction unparseable: unknown name 'os'"


@pytest.mark.parametrize(
    "prediction, gold, with_units, without_units",
    [
        ("5 cm", "5", 1.0, 0.0),
        ("5cm", "5", 1.0, 0.0),
        ("$5", "5", 1.0, 0.0),
        ("5 apples", "5", 1.0, 0.0),
        ("50%", "50", 1.0, 0.0),
        ("12 m/s", "12", 1.0, 0.0),
        ("9.8 m/s^2", "9.8", 1.0, 0.0),
        ("1,000 dollars", "1000", 1.0, 0.0),
        ("1.8026e4 m", "18026", 1.0, 0.0),
        ("2x cm", "2x", 1.0, 0.0),  # the x is maths, the cm is a unit
        ("3 pi", "3pi", 1.0, 1.0),  # pi is not a unit
        ("6 cm", "5", 0.0, 0.0),
        ("-$5", "-5", 1.0, 0.0),
        ("5€", "5", 1.0, 0.0),
        ("1$0081", "10081", 0.0, 0.0),  # a sign goes before or after the number, not inside it
        ("10%081", "10081", 0.0, 0.0),
        ("5 $ 6", "56", 0.0, 0.0),
        ("$$$$10081$$$$", "10081", 0.0, 0.0),
    ],
)
def test_units_are_stripped_only_when_asked(prediction, gold, with_units, without_units):
    assert score(prediction, gold, strip_units=True) == with_units
    assert score(prediction, gold, strip_units=False) == without_units


@pytest.mark.parametrize(
    "prediction, gold, expected",
    [
        ("1,234,567.5", "1234567.5", 1.0),
        ("x+1,234", "x+1234", 1.0),  # each numeral of an expression is grouped on its own
        ("1234,567", "1234567", 0.0),  # a head group has 1-3 digits
        ("12345,678", "12345678", 0.0),
        ("1.5,000", "1.5", 0.0),  # no grouping after the decimal point
        ("0.123,456", "0.123456", 0.0),
        ("1,00,81", "10081", 0.0),
    ],
)
def test_thousands_commas_only_in_a_grouped_numeral(prediction, gold, expected):
    assert score(prediction, gold) == expected


@pytest.mark.parametrize(
    "prediction, gold, params, expected",
    [
        ("1000.0005", "1000", {"rel_tol": 1e-6, "exact_integers": False}, 1.0),
        ("1000.0005", "1000", {"rel_tol": 1e-6}, 0.0),  # an integer gold is exact (issue 21: 10080.99 is not 10081)
        ("1000.5000005", "1000.5", {"rel_tol": 1e-6}, 1.0),  # tolerance is for golds that are rounded
        ("1000.01", "1000", {"rel_tol": 1e-6, "exact_integers": False}, 0.0),
        ("1000.01", "1000", {"rel_tol": 1e-4, "exact_integers": False}, 1.0),
        ("0.001", "0", {"rel_tol": 1e-6, "exact_integers": False}, 0.0),  # relative tolerance of 0 is 0
        ("0.001", "0", {"abs_tol": 0.01, "exact_integers": False}, 1.0),  # absolute tolerance: either one suffices
        ("1.05", "1", {"rel_tol": 0.0, "abs_tol": 0.1, "exact_integers": False}, 1.0),
        ("1.2", "1", {"rel_tol": 0.0, "abs_tol": 0.1}, 0.0),
        ("0.3333333", "1/3", {"rel_tol": 1e-6}, 1.0),
        ("0.3333333", "1/3", {"rel_tol": 0.0}, 0.0),  # exact rationals compare exactly
        ("1/3", "2/6", {"rel_tol": 0.0}, 1.0),
        ("1.4142", "sqrt(2)", {"rel_tol": 1e-4}, 1.0),  # tolerance on the symbolic path too
        ("1.4142", "sqrt(2)", {"rel_tol": 1e-6}, 0.0),
        ("sqrt(2)", "1.4142", {"abs_tol": 1e-3, "final_form": False}, 1.0),
        # evaluated to 30 digits: rounding is not a difference
        (
            "log(8)-3log(2)",
            "0",
            {"rel_tol": 0.0, "final_form": False},
            1.0,
        ),
        ("(x+1)^2-x^2-2x-1", "0", {"rel_tol": 0.0, "final_form": False}, 1.0),
        ("sqrt(2)", "1.4142", {"abs_tol": 1e-3}, 0.0),  # by default the answer to a numeric gold is a number
        ("log(8)-3log(2)", "0", {"rel_tol": 0.0}, 0.0),
        ("(x+1)^2-x^2-2x-1", "0", {"rel_tol": 0.0}, 0.0),
    ],
)
def test_tolerance(prediction, gold, params, expected):
    assert score(prediction, gold, **params) == expected


def test_symbolic_false_accepts_numbers_only():
    assert score("1.8026×10^4", "18026", symbolic=False) == 1.0  # still a rational number
    assert score("2*sqrt(2)", "2.8284271247", symbolic=True, final_form=False) == 1.0
    assert score("2*sqrt(2)", "2.8284271247", symbolic=False) == 0.0
    assert score("8", "x", symbolic=False) is None  # a symbolic gold cannot be scored numerically


# 239 chars but more nodes than allowed
@pytest.mark.parametrize(
    "gold", ["???", "", "  ", "x =", "1/0", "import os", "9^9^9^9", "abc" * 100, "+".join(["x"] * 120)]
)
def test_unparseable_gold_is_unscorable(gold):
    verdict = math_verifier("1", {"answer": gold})
    assert verdict.score is None and verdict.details.startswith("gold")


INJECTIONS = [
    "__import__('os').system('touch {marker}')",
    "().__class__.__bases__[0].__subclasses__()",
    "().__class__",
    "lambda: 1",
    "open('{marker}', 'w')",
    "x.__class__",
    "pi.evalf",
    "exec('1')",
    "eval('1')",
    "Symbol('x')",
    "S('1')",
    "[1][0]",
    "1 if 1 else 0",
    "\uff3f\uff3fimport\uff3f\uff3f('os')",  # fullwidth underscores fold to "__" under NFKC
]


@pytest.mark.parametrize("attack", INJECTIONS)
def test_injection_attempts_score_zero_and_run_nothing(attack, tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    ran = []
    real_eval, real_exec = builtins.eval, builtins.exec

    def watch(real, name):
        def wrapper(source, *args, **kwargs):
            # importlib execs code objects of real files for lazy imports; text or compiled text is the danger
            if isinstance(source, str) or getattr(source, "co_filename", "").startswith("<"):
                ran.append((name, source))
            return real(source, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(builtins, "eval", watch(real_eval, "eval"))
    monkeypatch.setattr(builtins, "exec", watch(real_exec, "exec"))
    monkeypatch.setattr(os, "system", lambda *a: ran.append(("os.system", a)))
    text = attack.format(marker=marker)
    for gold in ("1", "x"):
        assert math_verifier(text, {"answer": gold}).score == 0.0
        assert math_precheck(text, {"answer": gold}) is not None
        assert math_verifier(text, {"answer": text}).score is None  # as a gold: unscorable
    assert ran == [] and not marker.exists()


DOS_INPUTS = [
    "9^9^9^9",
    "10^10^10",
    "2^2^2^2^2^2^2^2",
    "(10^10)^10",
    "10^100000",
    "10^999999999",
    "(((10^999)^999)^999)^999",
    "7e837^1000*7e837^1000*7e837^1000",  # each power alone is an 837,000-digit integer
    "1/1e30^1000+1/2e30^1000+1/3e30^1000+1/4e30^1000",
    "10^(10^5)",
    "1e9999999",
    "1.5e-9999999",
    "factorial(10^9)",
    "exp(exp(exp(100)))",
    "sin(exp(exp(10)))",
    "(" * 31 + "1" + ")" * 31,
    "(" * 5000 + "1" + ")" * 5000,
    "-" * 63 + "1",
    "9" * 64,
    "99999999999^1000*99999999999^1000*99999999999^1000",
    "(x+1)^1000-(x-1)^1000",
    "sqrt(99999999999^1000)+log(99999999999^1000)",
    "x" * 64,
    "1" + "+x" * 31,
]


@pytest.mark.parametrize("attack", DOS_INPUTS)
@pytest.mark.parametrize("gold", ["1", "x^2+1"])
def test_slow_inputs_return_fast(attack, gold):
    math_verifier("2*sqrt(2)", {"answer": "sqrt(8)"})  # warm up: import sympy outside the clock
    for params in ({}, {"strip_units": True}):
        start = time.perf_counter()
        verdict = math_verifier(attack, {"answer": gold}, **params)
        assert time.perf_counter() - start < 0.5, attack
        assert verdict.score is not None  # a prediction can never make the task unscorable
    start = time.perf_counter()
    run_verifier("numeric", attack, {"answer": "1"}, {})
    run_verifier("numeric", "1", {"answer": attack}, {})  # the old parser, guarded against huge exponents
    assert time.perf_counter() - start < 0.5, attack


@pytest.mark.parametrize(
    "prediction, params, reason",
    [
        ("", {}, "prediction empty"),
        ("   \n", {}, "prediction empty"),
        ("1" * 65, {}, "prediction too long: 65 chars > 64"),
        ("  42  ", {}, None),
        ("2*sqrt(2)", {}, None),
        ("2*sqrt(2)", {"symbolic": False}, "prediction not a rational number (symbolic=False)"),
        ("5 cm", {}, "prediction unparseable: unknown name 'cm'"),
        ("5 cm", {"strip_units": True}, None),
        ("open('f')", {}, "prediction unparseable: characters outside 0-9 a-z + - * / ^ ( ) ."),
        ("lambda: 1", {}, "prediction unparseable: characters outside 0-9 a-z + - * / ^ ( ) ."),
        ("x.real", {}, "prediction unparseable: Attribute not allowed"),
        ("9^9^9", {}, "prediction unparseable: nested power"),
        ("2^x", {}, "prediction unparseable: exponent must be a number of at most 1000"),
        ("2^1001", {}, "prediction unparseable: exponent must be a number of at most 1000"),
        ("x^1000", {}, None),
        ("(99999999999x)^1000", {}, None),
        ("2^1000", {}, "prediction is not a final answer: it computes a number instead of stating it"),
        ("7e837^1000", {}, "prediction unparseable: power larger than 40000 bits"),
        ("1+", {}, "prediction unparseable: not an expression"),
        ("1" * 257, {}, "prediction too long: 257 chars > 256"),  # with its wrappers (verifiers.latex_answer)
        (r"\boxed{x+1}", {}, None),
        (r"\boxed{x}, \boxed{y}", {}, "prediction more than one \\boxed, or one not around the whole answer"),
        (r"\frac{x}{2", {}, "prediction unbalanced braces"),
    ],
)
def test_precheck_reasons(prediction, params, reason):
    assert math_precheck(prediction, {"answer": "x"}, **params) == reason


def test_numeric_fast_path_needs_no_sympy(monkeypatch):
    def no_sympy(tree):
        raise AssertionError("sympy reached on the numeric fast path")

    monkeypatch.setattr(math_verify, "_to_sympy", no_sympy)
    monkeypatch.setattr(math_verify, "_gold_expression", no_sympy)
    cases = [
        ("18026", "18026"),
        ("18,026", "1.8026e4"),
        ("7/2", "3.5"),
        ("1.8026×10^4", "18026"),
        ("-1.8026×10^4", "-18026"),
    ]
    for prediction, gold in cases:
        assert score(prediction, gold) == 1.0
    assert score("18025", "18026") == 0.0


def test_plain_numbers_skip_the_expression_parser(monkeypatch):
    """Plain numbers go through math_equiv.parse_number alone: the throughput of the common case."""

    def no_parser(text, max_chars=0):
        raise AssertionError(f"expression parser reached for {text!r}")

    monkeypatch.setattr(math_verify, "parse_expression", no_parser)
    for prediction, gold in [("18026", "18026"), ("18,026", "1.8026e4"), ("7/2", "3.5"), ("\uff14\uff12", "42")]:
        assert score(prediction, gold) == 1.0


def test_agreeing_at_one_point_is_not_enough():
    x0 = repr(math_verify._POINTS[0]["x"])  # a policy that hit one evaluation point still earns nothing
    assert score(f"x+(x-{x0})", "x", rel_tol=1e-9, abs_tol=1e-9) == 0.0
    assert score(f"x+(x-{x0})", f"2x-{x0}") == 1.0


def test_registry_runs_both_verifiers():
    assert run_verifier("math", "2*sqrt(2)", {"answer": "sqrt(8)"}, {}).score == 1.0
    assert run_verifier("math", "18,026 cm", {"answer": "18026"}, {"strip_units": True}).score == 1.0
    assert run_verifier("math", "1", {"answer": "???"}, {}).score is None
    assert run_verifier("numeric", "18,026", {"answer": "18026"}, {"rel_tol": 0.0}).score == 1.0
    assert run_verifier("numeric", "2*sqrt(2)", {"answer": "2.8284271247"}, {}).score == 0.0  # numbers only
    assert run_verifier("numeric", "1", {"answer": "???"}, {}).score is None
    assert run_precheck("math", "import os", {"answer": "1"}, {}).score == 0.0
    assert run_precheck("math", "x+1", {"answer": "1+x"}, {}) is None
    assert run_precheck("math", "x-x+1", {"answer": "1"}, {}).score == 0.0  # a numeric gold takes a number
    assert run_precheck("numeric", "x+1", {"answer": "1"}, {}).score == 0.0
    assert run_task_check("math", {"answer": "sqrt(8)"}, {}) is None
    assert run_task_check("math", {"answer": "???"}, {}).startswith("gold unparseable")
    assert run_task_check("numeric", {"answer": "sqrt(8)"}, {}).startswith("gold not a number")
