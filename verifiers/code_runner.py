"""Grading a code candidate across a process boundary: the candidate answers calls in the
sandbox, the tests run and compare here (the unit-test verifier's engine, verifiers/code_tests.py).

    outcomes, run_error = run_tests(candidate, tests, "f", sandbox, allowed_imports, forbidden_names)

Per test: True (passed), a failure reason, or None (no answer: the run ended first).
"""

from __future__ import annotations

import base64
import builtins
import functools
import json
import marshal
import random
import sys
import types
import weakref
from collections.abc import Iterable, Sequence
from typing import Protocol

from verifiers.sandbox import TRUNCATION_MARKER


class _Test(Protocol):
    code: str


# --- grading across the process boundary ---------------------------------------------------------

# The candidate never shares a process with what it is graded against. The sandbox runs the
# candidate and answers *calls*: inputs in (stdin), outputs out (stdout), as plain data. The tests
# run here, on the host: each test's code is executed against proxies that return the candidate's
# recorded answers, and the comparison (`== 270`) happens here. A test that needs the answer to a
# call not made yet is replayed after one more sandbox run (the candidate re-answers every call of
# that test from a fresh start); single-call tests (`assert f(2) == 270`) take exactly one run.
# So: no frame, global, constant or file in the candidate's process holds a test or an expected
# value; an object whose __eq__ lies never leaves it; and what it prints can only claim what its
# functions returned, which it could have returned anyway. No nonce is needed.

# Plain data across the boundary, as tagged JSON. Shared by the runner (in the sandbox, where it
# only builds what it sends) and the host (which decodes strictly: whatever arrives is plain data
# or a ValueError; nothing is called, imported or unpickled).
_CODEC = r"""
_TAGS = {list: "l", tuple: "t", set: "S", frozenset: "F"}
_KINDS = {"l": list, "t": tuple, "S": set, "F": frozenset}
_MAX_DEPTH = 64


def _encode(v, depth=0):
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deep")
    t = type(v)
    if v is None:
        return None
    if t is bool:
        return ["b", v]
    if t is int:
        return ["i", str(v)]
    if t is float:
        return ["f", repr(v)]
    if t is complex:
        return ["c", repr(v.real), repr(v.imag)]
    if t is str:
        return ["s", v]
    if t is bytes:
        return ["y", v.hex()]
    if t in _TAGS:
        return [_TAGS[t], [_encode(x, depth + 1) for x in v]]
    if t is dict:
        return ["d", [[_encode(k, depth + 1), _encode(x, depth + 1)] for k, x in v.items()]]
    raise TypeError("a " + t.__name__[:40] + " cannot cross to the tests (plain data only)")


def _decode(x, depth=0):
    if x is None:
        return None
    if depth > _MAX_DEPTH or type(x) is not list or not x or type(x[0]) is not str:
        raise ValueError("malformed value")
    tag, args = x[0], x[1:]
    texts = len(args) >= 1 and all(type(a) is str and len(a) <= 5000 for a in args)
    if tag == "b" and args and type(args[0]) is bool:
        return args[0]
    if tag == "i" and texts and args[0].lstrip("-").isdigit() and args[0].isascii():
        return int(args[0])
    if tag == "f" and texts:
        return float(args[0])
    if tag == "c" and texts and len(args) == 2:
        return complex(float(args[0]), float(args[1]))
    if tag == "s" and args and type(args[0]) is str:
        return args[0]
    if tag == "y" and texts:
        return bytes.fromhex(args[0])
    if tag in _KINDS and args and type(args[0]) is list:
        return _KINDS[tag](_decode(i, depth + 1) for i in args[0])
    if tag == "d" and args and type(args[0]) is list:
        if not all(type(p) is list and len(p) == 2 for p in args[0]):
            raise ValueError("malformed dict")
        return {_decode(k, depth + 1): _decode(v, depth + 1) for k, v in args[0]}
    raise ValueError("malformed value")
"""
_codec: dict = {}
exec(compile(_CODEC, "<codec>", "exec"), _codec)  # noqa: S102 — our own source, so host and runner agree
_encode, _decode = _codec["_encode"], _codec["_decode"]

# The program the sandbox runs: load the candidate under guarded builtins, answer each test's calls
# in order, one JSON line per test as it finishes (answers before a hang still count).
_RUNNER = (
    _CODEC
    + r"""
import builtins as _builtins
import json as _json
import os as _os

_write, _dumps, _exit = _os.write, _json.dumps, _os._exit
_OUT = _os.dup(1)  # what the candidate prints goes nowhere
_os.dup2(_os.open(_os.devnull, _os.O_WRONLY), 1)


def _reason(exc):
    name = type(exc).__name__[:24]
    return name if name.isidentifier() else "error"


def _candidate_builtins():
    safe = dict(vars(_builtins))
    if _ALLOWED is None:
        return safe
    real_import = safe["__import__"]

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level or name.partition(".")[0] not in _ALLOWED:
            raise ImportError("import of " + name + " is not allowed")
        return real_import(name, globals, locals, fromlist, level)

    for name in _FORBIDDEN:
        safe.pop(name, None)
    safe["__import__"] = guarded_import
    return safe


def _answer(candidate, name, args, kwargs, budget):
    try:
        value = _encode(candidate[name](*_decode(args), **_decode(kwargs)))
    except BaseException as exc:
        return ["raise", _reason(exc)]
    return ["ok", value] if len(_dumps(value)) <= budget else ["raise", "OutputTooLarge"]


def _main():
    chunks = []
    while chunk := _os.read(0, 1 << 16):
        chunks.append(chunk)
    spec = _json.loads(b"".join(chunks))
    candidate = {"__builtins__": _candidate_builtins(), "__name__": "candidate"}
    try:
        exec(compile(_CANDIDATE, "<candidate>", "exec"), candidate)
    except BaseException as exc:
        _write(_OUT, (_dumps(["load", _reason(exc)]) + "\n").encode())
        _exit(0)
    for index, calls in spec["calls"]:
        answers = [_answer(candidate, name, args, kwargs, spec["budget"]) for name, args, kwargs in calls]
        _write(_OUT, (_dumps([index, answers]) + "\n").encode())
    _exit(0)  # no atexit hooks or threads of the candidate's run after the answers


_main()
"""
)
_VERSION_MISMATCH = "runner: the sandbox's Python differs from the trainer's"
# A test making more calls than this is a broken task, not a slow one. Each call past the first
# costs one more sandbox run (the candidate re-answers the test's calls so far): HumanEval's
# longest checks make 200 (100 random inputs, each through a prompt helper and the candidate).
MAX_CALLS_PER_TEST = 256


def runner_program(candidate: str, allowed_imports: Iterable[str] | None, forbidden_names: Iterable[str] = ()) -> str:
    """The sandboxed program: the candidate and the runner, which reads `runner_input` on stdin.
    `allowed_imports=None` drops the in-sandbox guards (restricted builtins, guarded import); only
    tests use it, to attack the boundary on its own."""
    allowed = None if allowed_imports is None else tuple(sorted(set(allowed_imports)))
    return (
        f"_CANDIDATE = {candidate!r}\n_ALLOWED = {allowed!r}\n_FORBIDDEN = {sorted(forbidden_names)!r}\n"
        + _runner_loader()
    )


def runner_input(calls: dict[int, list[list]], budget: int) -> str:
    """{test index: [[name, encoded args, encoded kwargs], ...]} as the runner reads it."""
    return json.dumps({"calls": sorted(calls.items()), "budget": budget})


@functools.lru_cache(maxsize=1)
def _runner_loader() -> str:
    """The runner as a marshalled code object (base64: a plain string literal compiles ~3x faster
    than an escaped bytes one), compiled here once: compiling its source costs ~0.9 ms per
    sandbox call, reading the marshalled bytes ~0.1 ms. marshal is specific to the Python
    version: a sandbox interpreter of another version (a Docker image) makes the run unscorable."""
    code = base64.b64encode(marshal.dumps(compile(_RUNNER, "<runner>", "exec"))).decode()
    version = tuple(sys.version_info[:2])
    return (
        f"import binascii as _binascii, marshal as _marshal, sys as _sys\n"
        f"if _sys.version_info[:2] != {version!r}:\n"
        f"    raise SystemExit({_VERSION_MISMATCH!r} + ' (runner {version}, sandbox %s)' % (_sys.version_info[:2],))\n"
        f"exec(_marshal.loads(_binascii.a2b_base64({code!r})))\n"
    )


def parse_answers(stdout: str, expected: dict[int, int]) -> tuple[str | None, dict[int, list]]:
    """(load failure reason or None, {test index: answers}) from the runner's output. A line counts
    only if it parses and answers exactly the calls asked; the first line for a test wins."""
    answers: dict[int, list] = {}
    for line in stdout.split("\n"):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, list) and len(row) == 2 and row[0] == "load" and isinstance(row[1], str):
            return (row[1] if row[1].isidentifier() else "error"), {}
        if (
            isinstance(row, list)
            and len(row) == 2
            and type(row[0]) is int
            and row[0] in expected
            and row[0] not in answers
            and isinstance(row[1], list)
            and len(row[1]) == expected[row[0]]
            and all(isinstance(a, list) and len(a) == 2 and a[0] in ("ok", "raise") for a in row[1])
        ):
            answers[row[0]] = row[1]
    return None, answers


class CandidateError(Exception):
    """The candidate raised something a test cannot catch as a builtin Exception (SystemExit,
    KeyboardInterrupt, its own classes), or its answer did not decode."""


class _NeedsAnswer(BaseException):  # BaseException: a test's `except Exception` must not swallow it
    pass


_TEST_BUILTINS = dict(vars(builtins))


@functools.lru_cache(maxsize=4096)
def _compiled_test(code: str) -> tuple[types.CodeType, tuple[str, ...]]:
    """The test's code object and the global names it reads that are not builtins: the
    candidate's names (the entry point is added by the caller)."""
    compiled = compile(code, "<test>", "exec")
    names, todo = set(), [compiled]
    while todo:
        current = todo.pop()
        names |= set(current.co_names)
        todo += [c for c in current.co_consts if isinstance(c, types.CodeType)]
    return compiled, tuple(sorted(n for n in names if n not in _TEST_BUILTINS))


def _raise_from(payload: object) -> BaseException:
    name = payload if isinstance(payload, str) and payload.isidentifier() else "error"
    cls = _TEST_BUILTINS.get(name)
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls("raised by the candidate")  # so a test can expect ValueError
    return CandidateError(name[:24])


def _seeded_random() -> types.ModuleType:
    """`random` as a test imports it: the module's functions bound to a fresh Random(0). A replay
    must make the same calls as the run whose answers it reads; a test drawing unseeded inputs
    (HumanEval's `for _ in range(100): x = randint(...)`) would compare answers to other inputs."""
    rng, module = random.Random(0), types.ModuleType("random")
    for name in dir(random):
        if not name.startswith("_"):
            setattr(
                module,
                name,
                getattr(rng, name) if callable(getattr(random.Random, name, None)) else getattr(random, name),
            )
    return module


def _replay_builtins() -> dict:
    real_import = builtins.__import__

    def test_import(name, globals=None, locals=None, fromlist=(), level=0):
        return (
            _seeded_random() if name == "random" and not level else real_import(name, globals, locals, fromlist, level)
        )

    return {**_TEST_BUILTINS, "__import__": test_import}


def replay_test(code: str, entry_point: str, answers: list) -> tuple[bool | str | None, list | None]:
    """Run one test here against the candidate's recorded `answers`, in call order. Returns
    (True, None) when the test passed, (<failure reason>, None) when it failed, or (None, calls)
    when it needs the answer to one more call: `calls` are its calls so far, the new one last.
    A pass is `True`, never a string: a failure's reason can be named by the candidate (an
    exception class called PASS), so no reason may look like a pass."""
    compiled, names = _compiled_test(code)
    calls: list[list] = []

    def proxy(name: str):
        def call(*args, **kwargs):
            calls.append([name, _encode(list(args)), _encode(kwargs)])
            if len(calls) > len(answers):
                raise _NeedsAnswer
            kind, payload = answers[len(calls) - 1]
            if kind == "ok":
                try:
                    return _decode(payload)
                except (ValueError, TypeError, RecursionError, OverflowError) as exc:
                    raise CandidateError("undecodable") from exc
            raise _raise_from(payload)

        return call

    ns = {
        "__builtins__": _replay_builtins(),
        "__name__": "test",
        **{name: proxy(name) for name in {*names, entry_point} if name not in _TEST_BUILTINS or name == entry_point},
    }
    try:
        exec(compiled, ns)  # noqa: S102 — the task's own test code, on plain data
        outcome: bool | str | None = True
    except _NeedsAnswer:
        outcome = None
    except CandidateError as exc:
        outcome = exc.args[0]
    except BaseException as exc:  # noqa: BLE001 — any failure of the test is a failed test
        outcome = type(exc).__name__
    if len(calls) > len(answers):  # a call past the record (even one the test swallowed) needs an answer
        return None, calls[: len(answers) + 1]
    return outcome, None


_SAME_PYTHON: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # sandbox -> its Python runs our marshal'd code
PYTHON_PROBE = "import sys; print('%d.%d' % sys.version_info[:2])"


def check_sandbox_python(sandbox) -> None:
    """Raise Unscorable unless the sandbox's Python has the trainer's version (marshal'd code is
    version-bound). Asked once per sandbox by a probe of our own: never read from a candidate's
    run, whose stderr the candidate writes (printing the loader's mismatch message turned a wrong
    answer into an unscorable one, which escapes its 0)."""
    if _SAME_PYTHON.get(sandbox):
        return
    result = sandbox.run_python(PYTHON_PROBE)
    if result.error:
        raise Unscorable(f"the sandbox's Python version could not be read: {result.error}")
    ours = "%d.%d" % sys.version_info[:2]
    if result.stdout.strip() != ours:
        raise Unscorable(f"{_VERSION_MISMATCH} (runner {ours}, sandbox {result.stdout.strip()!r})")
    _SAME_PYTHON[sandbox] = True


def run_tests(
    candidate: str,
    tests: Sequence[_Test],
    entry_point: str,
    sandbox,
    allowed_imports: Iterable[str] | None,
    forbidden_names: Iterable[str] = (),
) -> tuple[list[bool | str | None], str | None]:
    """Per test True (passed), a failure reason, or None (no answer: the run ended first); and the
    last run's error. Unscorable runs raise Unscorable."""
    check_sandbox_python(sandbox)
    program = runner_program(candidate, allowed_imports, forbidden_names)
    outcomes: list[bool | str | None] = [None] * len(tests)
    answers: dict[int, list] = {i: [] for i in range(len(tests))}
    run_error = None
    for _ in range(MAX_CALLS_PER_TEST + 1):
        pending: dict[int, list] = {}
        for i, test in enumerate(tests):
            if outcomes[i] is None and i in answers:
                outcome, calls = replay_test(test.code, entry_point, answers[i])
                if calls is None:
                    outcomes[i] = outcome
                elif len(calls) > MAX_CALLS_PER_TEST:
                    outcomes[i] = f"more than {MAX_CALLS_PER_TEST} calls"
                else:
                    pending[i] = calls
        if not pending:
            break
        budget = max(256, sandbox_output_limit(sandbox) // (2 * sum(map(len, pending.values()))))
        result = sandbox.run_python(program, stdin=runner_input(pending, budget))
        run_error = result.error
        if result.error and result.error.startswith("sandbox_failure:"):
            raise Unscorable(result.error)
        if result.stdout.endswith(TRUNCATION_MARKER):  # lost lines would be failures that are not
            raise Unscorable(f"{len(pending)} answer lines overflow the sandbox's output limit")
        load_error, got = parse_answers(result.stdout, {i: len(c) for i, c in pending.items()})
        if load_error is not None:
            return ["load:" + load_error] * len(tests), run_error
        answers = got  # a test with no line here ended with the run: it stays None (no answer)
    return outcomes, run_error


class Unscorable(Exception):
    pass


def sandbox_output_limit(sandbox) -> int:
    limits = getattr(sandbox, "limits", None)
    return int(getattr(limits, "max_output_bytes", 65_536))
