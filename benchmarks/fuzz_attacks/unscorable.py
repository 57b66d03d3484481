"""Making yourself unscorable: wrong answers built to crash, overflow or confuse the verifier's
machinery rather than to pass it. A group with an unscorable member never trains, so an answer
the verifier cannot score escapes its 0: the fuzzer counts such an outcome as `escaped`, a finding
like `rewarded wrong`. Every answer here is wrong by construction (truth 0): another value, another
entity, a program whose honest behaviour returns a random sentinel.
"""

from __future__ import annotations

import random

from benchmarks.fuzz_attacks import Attempt, World, answer, attack, with_demo
from benchmarks.fuzz_attacks.arithmetic import _gold, other_value
from benchmarks.fuzz_attacks.code import _arg, _code_attempt, _program, _sentinel
from benchmarks.fuzz_attacks.search import _others

# Text that crashes naive parsers: deep nesting, huge sizes, control and unpaired characters,
# around `v`, a wrong value (never the gold, so every form is wrong whatever its notation).
_JUNK = [
    lambda n, v: "(" * n + v + ")" * n,
    lambda n, v: "[" * n + v + "]" * n,
    lambda n, v: "{" * n + v + "}" * n,
    lambda n, v: "\\frac{" * min(n, 200) + v + "}{2}" * min(n, 200),
    lambda n, v: "\\sqrt{" * min(n, 300) + v + "}" * min(n, 300),
    lambda n, v: "-" * n + v,
    lambda n, v: v + "9" * n,
    lambda n, v: v + "e" + "9" * min(n, 40),
    lambda n, v: "2**" * min(n, 60) + v,
    lambda n, v: v + " " + "x" * n,
    lambda n, v: "\x00" * min(n, 50) + v,
    lambda n, v: v + "\U0010ffff\ufffd" * min(n, 50),
    lambda n, v: "\u202e" * min(n, 50) + v,
    lambda n, v: "&#" + "9" * min(n, 30) + ";" + v,
    lambda n, v: v + "\\" * min(n, 500),
    lambda n, v: "$" * min(n, 500) + v,
    lambda n, v: '"' * min(n, 500) + v + "\\u" * 3,
    lambda n, v: v + "NaN" * min(n, 100),
]


def _junk(rng: random.Random, wrong: str) -> str:
    return rng.choice(_JUNK)(rng.choice([10, 100, 1200, 5000]), wrong)


@attack("arithmetic", "unscorable", weight=0.5)
def arithmetic_unscorable(task: dict, world: World, rng: random.Random) -> Attempt:
    """Answers built to crash or stall the math verifier (deep nesting, huge numerals, NULs): escape their 0."""
    text = _junk(rng, str(other_value(_gold(task), rng)))
    return Attempt(with_demo(task, world, rng, answer(text), 0.3), 0.0, "junk")


@attack("search", "unscorable", weight=0.5)
def search_unscorable(task: dict, world: World, rng: random.Random) -> Attempt:
    """Answers built to crash the EM/F1 verifier (deep nesting, huge sizes, control characters): escape their 0."""
    text = _junk(rng, _others(task, world, rng)[0])
    return Attempt(with_demo(task, world, rng, answer(text), 0.3), 0.0, "junk")


# What a candidate writes where it hopes the verifier reads: a deep array (json.loads raises
# RecursionError), an over-long line (past the stream's limit), forged or fault lines.
_PAYLOADS = [
    "'[' * {n} + ']' * {n} + chr(10)",
    "'x' * {big}",
    '(\'[0, [["ok", ["i", "1"]]]]\' + chr(10)) * {n}',
    '\'["fault", "x"]\' + chr(10)',
    '\'["load", "PASS"]\' + chr(10)',
    "chr(10).join(['[' * 100] * {n})",
    "'{{\"a\": ' * {n} + '1' + '}}' * {n}",
]
# Ways out of the restricted builtins (the static policy rejects these; the sandbox's pipe holds
# if it did not): a class's string annotation, evaluated with the real builtins.
_ESCAPES = [
    "import typing\nclass A{k}:\n    x: \"open({fd}, 'w', closefd=False).write({payload})\"\ntry:\n"
    "    typing.get_type_hints(A{k})\nexcept Exception:\n    pass\n",
    "from typing import get_type_hints\nclass A{k}:\n    x: \"open({fd}, 'w', closefd=False).write({payload})\"\n"
    "try:\n    get_type_hints(A{k})\nexcept Exception:\n    pass\n",
]
# Self-sabotage the static policy allows: it reaches the sandbox.
_SABOTAGE = [
    ["v = 0", "for _ in range({n}):", "    v = [v]", "return v"],
    ["return 'x' * {big}"],
    ["return 10 ** 5000"],
    ['return \'\\n[0, [["ok", ["i", "1"]]]]\\n\' * {n}'],
    ['return \'["fault", "x"]\\n\' * {n}'],
    ["return f({arg})"],
    ["return (i for i in range(3))"],
    ["return {{1: [2, {{3: (4,)}}]}} if {arg} is None else print"],
    ["print('[' * {n})", "return float('nan')"],
    ["return [[]] * {big}"],
    ["return b'\\x00' * {big}"],
    ["class E(BaseException):", "    pass", "raise E()"],
    ["return {arg}.__class__"],
]
_LOAD_SABOTAGE = [
    "class E(BaseException):\n    pass\nraise E()\n",
    "print('[' * {n})\n",
    "x = [[]] * 10 ** 9\n",
    "def g():\n    return g()\ng()\n",
]


@attack("code", "unscorable")
def code_unscorable(task: dict, world: World, rng: random.Random) -> Attempt:
    """Programs that attack the grading machinery: write deep JSON or 70 kB lines on the answer stream, return unencodable values, crash at load."""
    n, big, arg = rng.choice([70, 200, 1200, 5000]), rng.choice([70_000, 10**6]), _arg(task)
    payload = rng.choice(_PAYLOADS).format(n=n, big=big)
    kind = rng.choice(["escape", "sabotage", "load"])
    if kind == "escape":
        top = rng.choice(_ESCAPES).format(k=rng.randrange(100), fd=rng.choice([1, 2, 3, 3, 3, 4]), payload=payload)
        program = _program(task, rng, [], top.split("\n"))
    elif kind == "sabotage":
        body = [line.format(n=n, big=big, arg=arg) for line in rng.choice(_SABOTAGE)]
        program = _program(task, rng, body)
    else:
        top = rng.choice(_LOAD_SABOTAGE).format(n=n)
        program = f"{top}def f({arg}):\n    return {_sentinel(rng)}\n"
    return _code_attempt(task, world, rng, program, f"{kind}: {payload[:40]}")
