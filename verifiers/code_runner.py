"""Grading a code candidate across two process boundaries: the candidate answers calls in one
sandbox run, the task's tests replay against those answers in another, and only plain, bounded
data crosses to the host (the unit-test verifier's engine, verifiers/code_tests.py).

    outcomes, run_error = run_tests(candidate, tests, "f", sandbox, allowed_imports, forbidden_names)

Per test: True (passed), a failure reason, or None (no answer: the run ended first). A failure the
candidate caused is a failure (scored 0), never Unscorable; run_error then starts with
CANDIDATE_FAULT. Only the machinery failing (a sandbox that fails a control program too, a task
whose tests cannot run or whose output cannot fit) raises Unscorable.
"""

from __future__ import annotations

import base64
import functools
import json
import marshal
import sys
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Protocol

from verifiers.sandbox import TRUNCATION_MARKER


class _Test(Protocol):
    code: str


# --- grading across the process boundaries ------------------------------------------------------

# Who holds what. The candidate (hostile) never shares a process with what it is graded against,
# and the tests (a task file's code: data from others) never run on the host:
#
#   candidate run   the candidate answers *calls* (inputs in on stdin, as plain data). It runs in a
#                   child process of the runner whose fds 0-2 are /dev/null and whose only way out
#                   is a pipe to the runner; the runner (not dumpable, so the child cannot open its
#                   fds through /proc/<ppid>/fd) decodes each line strictly, bounded in size and
#                   depth, re-encodes it, and writes the real answer stream within a byte budget.
#   replay run      the tests run against proxies that return the recorded answers (plain data),
#                   in a child of the runner likewise; the comparison (`== 270`) happens there. A
#                   test that needs the answer to a call not made yet reports that one call.
#   host            builds the calls, parses both streams with bounded parsers, and loops: one more
#                   call needed -> one more candidate run and replay run (the candidate re-answers
#                   every call of that test from a fresh start).
#
# So: no frame, global, constant or file in the candidate's process holds a test or an expected
# value; an object whose __eq__ lies never leaves it; what it writes can only claim what its
# functions returned, which it could have returned anyway; and a test file's `import os` runs as
# the sandbox's uid in the sandbox's filesystem, never as the trainer.

# Plain data across the boundary, as tagged JSON. Shared by the sandbox programs and the host
# (which decodes strictly: whatever arrives is plain data or a ValueError; nothing is called,
# imported or unpickled). _bounded_loads bounds size and nesting *before* parsing: json.loads of a
# 1200-deep array raises RecursionError, which a verifier would report as unscorable.
_CODEC = r"""
import re as _re
from itertools import accumulate as _accumulate

_TAGS = {list: "l", tuple: "t", set: "S", frozenset: "F"}
_KINDS = {"l": list, "t": tuple, "S": set, "F": frozenset}
_MAX_DEPTH = 64
_JSON_DEPTH = 2 * _MAX_DEPTH + 8  # an encoded value nests two arrays per level, a line a few more
_SPECIAL = _re.compile(r'["\\\[\]{}]')


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


def _json_depth(text):
    # One pass over the quotes, backslashes and brackets: linear, whatever the text.
    depth, deepest, in_string, escaped = 0, 0, False, -1
    for match in _SPECIAL.finditer(text):
        i, c = match.start(), match.group()
        if i == escaped:
            continue
        if in_string:
            if c == "\\":
                escaped = i + 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _bounded_loads(text, limit):
    if type(text) is not str or len(text) > limit:
        raise ValueError("line over its size bound")
    if _json_depth(text) > _JSON_DEPTH:
        raise ValueError("line nested too deep")
    return _loads(text)


def _identifier(text, size=40):
    ok = type(text) is str and 0 < len(text) <= size and text.isascii() and text.isidentifier()
    return text if ok else "error"
"""
_codec: dict = {"_loads": json.loads}
exec(compile(_CODEC, "<codec>", "exec"), _codec)  # noqa: S102 — our own source, so host and sandbox agree
_encode, _decode, _bounded_loads, _identifier = (
    _codec[n] for n in ("_encode", "_decode", "_bounded_loads", "_identifier")
)

# The program both sandbox runs execute (the prefix sets _CANDIDATE: the candidate's source, or
# None for a replay run). The untrusted code runs in a forked child; this process, the runner,
# relays the child's lines to the answer stream.
_SANDBOX = (
    _CODEC
    + r'''
import builtins as _builtins
import json as _json
import os as _os
import sys as _sys
import types as _types

# Bound here: the candidate (in its child process) may rebind os.write, json.dumps, os._exit.
_write, _dumps, _loads, _exit = _os.write, _json.dumps, _json.loads, _os._exit


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[_write(fd, view) :]


def _reason(exc):
    return _identifier(type(exc).__name__[:24])


def _not_dumpable():
    # A same-uid process may open a dumpable process's fds through /proc/<pid>/fd (the bubblewrap
    # worker already cleared this flag; a Docker sandbox may not have). Forks inherit it.
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except Exception:
        pass


def _isolated(work, spec):
    """Fork a child running work(spec, send): fds 0-2 on /dev/null, fd 3 the write end of a pipe
    to us, nothing else open. Returns the pipe's read end."""
    r, w = _os.pipe()
    pid = _os.fork()
    if pid == 0:
        try:
            _os.close(r)
            null = _os.open(_os.devnull, _os.O_RDWR)
            for fd in (0, 1, 2):
                _os.dup2(null, fd)
            _os.dup2(w, 3)
            _os.closerange(4, max(64, _os.sysconf("SC_OPEN_MAX")))
            work(spec, lambda row: _write_all(3, (_dumps(row) + "\n").encode()))
        finally:
            _exit(0)  # no atexit hooks or threads of the code after its lines
    _os.close(w)
    return r


def _relay(rfd, order, accept, fallbacks, cap):
    """Copy the child's rows, as `accept` re-encodes them, in `order`, to the answer stream (fd 1),
    within `cap` bytes in all: each row has its fallback's size reserved, and a row too large for
    what is left is replaced by its fallback. A row that is over its bound, malformed or out of
    order ends the stream with a ["fault", what] line (the host scores the rest as the child's)."""
    room = cap - sum(len(_dumps(f)) + 1 for f in fallbacks.values())
    buf = b""
    for index in order:
        while (newline := buf.find(b"\n")) < 0:
            if len(buf) > cap:
                return _write_all(1, b'["fault", "a line over its size bound"]\n')
            chunk = _os.read(rfd, 1 << 16)
            if not chunk:
                return None  # the child ended: what it did not answer has no answer
            buf += chunk
        line, buf = buf[:newline], buf[newline + 1 :]
        try:
            row = accept(index, _bounded_loads(line.decode("utf-8"), cap))
        except Exception:
            return _write_all(1, b'["fault", "a malformed or unexpected line"]\n')
        text = _dumps(row)
        if row[0] != index:  # a final row (the candidate did not load)
            return _write_all(1, (text + "\n").encode())
        reserved = len(_dumps(fallbacks[index]))
        if len(text) - reserved > room:
            text = _dumps(fallbacks[index])
        else:
            room -= max(0, len(text) - reserved)
        _write_all(1, (text + "\n").encode())
    return None


# --- the candidate run: answer the calls -------------------------------------------------------


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


def _answer(candidate, name, args, kwargs, cap):
    try:
        value = _encode(candidate[name](*_decode(args), **_decode(kwargs)))
    except BaseException as exc:
        return ["raise", _reason(exc)]
    return ["ok", value] if len(_dumps(value)) <= cap else ["raise", "OutputTooLarge"]


def _answer_calls(spec, send):
    # The restricted builtins are defence in depth only: code the candidate reaches can evaluate its
    # strings with the real ones (typing.get_type_hints swaps a class's namespace in as the globals
    # of eval, which then gets the real builtins). The pipe to the runner is the boundary.
    candidate = {"__builtins__": _candidate_builtins(), "__name__": "candidate"}
    try:
        exec(compile(_CANDIDATE, "<candidate>", "exec"), candidate)
    except BaseException as exc:
        send(["load", _reason(exc)])
        return
    for index, calls in spec["calls"]:
        send([index, [_answer(candidate, name, args, kwargs, spec["cap"]) for name, args, kwargs in calls]])


def _answer_row(answer):
    if type(answer) is list and len(answer) == 2 and answer[0] == "ok":
        return ["ok", _encode(_decode(answer[1]))]
    if type(answer) is list and len(answer) == 2 and answer[0] == "raise":
        return ["raise", _identifier(answer[1], 24)]
    raise ValueError("not an answer")


def _answers_accepted(spec):
    counts = {index: len(calls) for index, calls in spec["calls"]}

    def accept(index, row):
        if type(row) is list and len(row) == 2 and row[0] == "load":
            return ["load", _identifier(row[1], 24)]
        if not (type(row) is list and len(row) == 2 and type(row[0]) is int and row[0] == index):
            raise ValueError("not this test's answers")
        if type(row[1]) is not list or len(row[1]) != counts[index]:
            raise ValueError("not the calls asked")
        return [index, [_answer_row(a) for a in row[1]]]

    fallbacks = {i: [i, [["raise", "OutputTooLarge"]] * n] for i, n in counts.items()}
    return [i for i, _ in spec["calls"]], accept, fallbacks


# --- the replay run: the tests against the recorded answers ------------------------------------


class _NeedsAnswer(BaseException):  # BaseException: a test's `except Exception` must not swallow it
    pass


class CandidateError(Exception):
    """The candidate raised something a test cannot catch as a builtin Exception (SystemExit,
    KeyboardInterrupt, its own classes), or its answer did not decode."""


_TEST_BUILTINS = dict(vars(_builtins))


def _seeded_random():
    """`random` as a test imports it: the module's functions bound to a fresh Random(0). A replay
    must make the same calls as the run whose answers it reads; a test drawing unseeded inputs
    (HumanEval's `for _ in range(100): x = randint(...)`) would compare answers to other inputs."""
    import random

    rng, module = random.Random(0), _types.ModuleType("random")
    for name in dir(random):
        if not name.startswith("_"):
            is_method = callable(getattr(random.Random, name, None))
            setattr(module, name, getattr(rng, name) if is_method else getattr(random, name))
    return module


def _test_import(name, globals=None, locals=None, fromlist=(), level=0):
    if name == "random" and not level:
        return _seeded_random()
    return __import__(name, globals, locals, fromlist, level)


def _global_names(compiled):
    """The global names the test reads that are not builtins: the candidate's names."""
    names, todo = set(), [compiled]
    while todo:
        current = todo.pop()
        names |= set(current.co_names)
        todo += [c for c in current.co_consts if isinstance(c, _types.CodeType)]
    return {n for n in names if n not in _TEST_BUILTINS}


def _raise_from(payload):
    cls = _TEST_BUILTINS.get(_identifier(payload, 24))
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls("raised by the candidate")  # so a test can expect ValueError
    return CandidateError(_identifier(payload, 24))


def _replay(code, entry_point, answers):
    """["pass"], ["fail", reason], or ["call", name, args, kwargs]: the first call past the record.
    A pass is its own kind, never a reason: a reason can be named by the candidate (PASS)."""
    compiled = compile(code, "<test>", "exec")
    calls = []

    def proxy(name):
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

    ns = {"__builtins__": {**_TEST_BUILTINS, "__import__": _test_import}, "__name__": "test"}
    ns.update({name: proxy(name) for name in _global_names(compiled) | {entry_point}})
    try:
        exec(compiled, ns)
        outcome = ["pass"]
    except _NeedsAnswer:
        outcome = None
    except CandidateError as exc:
        outcome = ["fail", _identifier(exc.args[0])]
    except BaseException as exc:  # any failure of the test is a failed test
        outcome = ["fail", _reason(exc)]
    if len(calls) > len(answers):  # a call past the record (even one the test swallowed) needs an answer
        return ["call", *calls[len(answers)]]
    return outcome


def _replay_tests(spec, send):
    for index, code, answers in spec["tests"]:
        send([index, _replay(code, spec["entry_point"], answers)])


def _replays_accepted(spec):
    def accept(index, row):
        if not (type(row) is list and len(row) == 2 and type(row[0]) is int and row[0] == index):
            raise ValueError("not this test's result")
        result = row[1]
        if result == ["pass"]:
            return [index, ["pass"]]
        if type(result) is list and len(result) == 2 and result[0] == "fail":
            return [index, ["fail", _identifier(result[1])]]
        if type(result) is list and len(result) == 4 and result[0] == "call":
            name, args, kwargs = result[1], _decode(result[2]), _decode(result[3])
            if not (type(name) is str and name.isidentifier() and len(name) <= 200):
                raise ValueError("not a name")
            if type(args) is not list or type(kwargs) is not dict or not all(type(k) is str for k in kwargs):
                raise ValueError("not a call")
            return [index, ["call", name, _encode(args), _encode(kwargs)]]
        raise ValueError("not a result")

    order = [index for index, _, _ in spec["tests"]]
    return order, accept, {i: [i, ["big"]] for i in order}


def _main():
    chunks = []
    while chunk := _os.read(0, 1 << 16):
        chunks.append(chunk)
    spec = _loads(b"".join(chunks))  # the host's own input
    _not_dumpable()
    work, accepted = (_replay_tests, _replays_accepted) if _CANDIDATE is None else (_answer_calls, _answers_accepted)
    order, accept, fallbacks = accepted(spec)
    _relay(_isolated(work, spec), order, accept, fallbacks, spec["cap"])
    _exit(0)


_main()
'''
)

_VERSION_MISMATCH = "runner: the sandbox's Python differs from the trainer's"
# A test making more calls than this is a broken task, not a slow one. Each call past the first
# costs one more candidate run and one more replay run (the candidate re-answers the test's calls
# so far): HumanEval's longest checks make 200 (100 random inputs, each through a prompt helper
# and the candidate).
MAX_CALLS_PER_TEST = 256
# run_error of a grading that a candidate-caused fault ended: scored as failures, and counted.
CANDIDATE_FAULT = "candidate fault"
_FAULT_ROOM = 64  # the relay's closing ["fault", ...] line, outside its budget
_FIRST_REPLAYS: OrderedDict = OrderedDict()  # (test code, entry point) -> its replay with no answers
_FIRST_REPLAYS_MAX = 4096


def runner_program(candidate: str, allowed_imports: Iterable[str] | None, forbidden_names: Iterable[str] = ()) -> str:
    """The candidate run's program: the candidate and the runner, which reads `runner_input` on
    stdin. `allowed_imports=None` drops the in-sandbox guards (restricted builtins, guarded
    import); only tests use it, to attack the boundary on its own."""
    allowed = None if allowed_imports is None else tuple(sorted(set(allowed_imports)))
    return (
        f"_CANDIDATE = {candidate!r}\n_ALLOWED = {allowed!r}\n_FORBIDDEN = {sorted(forbidden_names)!r}\n"
        + _runner_loader()
    )


def replay_program() -> str:
    """The replay run's program: the tests (on stdin, `replay_input`) against recorded answers."""
    return "_CANDIDATE = _ALLOWED = None\n_FORBIDDEN = ()\n" + _runner_loader()


def runner_input(calls: dict[int, list[list]], cap: int) -> str:
    """{test index: [[name, encoded args, encoded kwargs], ...]} as the runner reads it; `cap`:
    the bytes its answer stream may take."""
    return json.dumps({"calls": sorted(calls.items()), "cap": cap})


def replay_input(tests: dict[int, tuple[str, list]], entry_point: str, cap: int) -> str:
    """{test index: (test code, recorded answers)} as the replay reads it."""
    rows = [[i, code, answers] for i, (code, answers) in sorted(tests.items())]
    return json.dumps({"tests": rows, "entry_point": entry_point, "cap": cap})


@functools.lru_cache(maxsize=1)
def _runner_loader() -> str:
    """The sandbox program as a marshalled code object (base64: a plain string literal compiles
    ~3x faster than an escaped bytes one), compiled here once: compiling its source costs ~1 ms
    per sandbox call, reading the marshalled bytes ~0.1 ms. marshal is specific to the Python
    version: a sandbox interpreter of another version (a Docker image) makes the run unscorable."""
    code = base64.b64encode(marshal.dumps(compile(_SANDBOX, "<runner>", "exec"))).decode()
    version = tuple(sys.version_info[:2])
    return (
        f"import binascii as _binascii, marshal as _marshal, sys as _sys\n"
        f"if _sys.version_info[:2] != {version!r}:\n"
        f"    raise SystemExit({_VERSION_MISMATCH!r} + ' (runner {version}, sandbox %s)' % (_sys.version_info[:2],))\n"
        f"exec(_marshal.loads(_binascii.a2b_base64({code!r})))\n"
    )


def _rows(stdout: str, cap: int) -> tuple[list, str | None]:
    """The stream's rows that parse within the bounds, and its fault (the relay's closing
    ["fault", what] line, or the stream over its budget, which the relay never writes)."""
    rows, fault = [], None
    if stdout.endswith(TRUNCATION_MARKER):
        fault = "the answer stream ran past its budget"
    for line in stdout.split("\n"):
        try:
            row = _bounded_loads(line, cap)
        except (ValueError, RecursionError):
            continue
        if isinstance(row, list) and len(row) == 2 and row[0] == "fault":
            fault = fault or _identifier(str(row[1]).replace(" ", "_"), 60).replace("_", " ")
            break
        rows.append(row)
    return rows, fault


def parse_answers(stdout: str, expected: dict[int, int], cap: int = 1 << 20) -> tuple[str | None, dict[int, list]]:
    """(load failure reason or None, {test index: answers}) from the answer stream. A line counts
    only if it parses within the bounds and answers exactly the calls asked; the first line for a
    test wins."""
    answers: dict[int, list] = {}
    for row in _rows(stdout, cap)[0]:
        if isinstance(row, list) and len(row) == 2 and row[0] == "load" and isinstance(row[1], str):
            return _identifier(row[1], 24), {}
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


def parse_replays(stdout: str, expected: Iterable[int], cap: int) -> dict[int, list]:
    """{test index: ["pass"] | ["fail", reason] | ["call", name, args, kwargs] | ["big"]} from the
    replay's stream; anything else is skipped (a test without a row did not finish)."""
    wanted, results = set(expected), {}
    for row in _rows(stdout, cap)[0]:
        if not (isinstance(row, list) and len(row) == 2 and type(row[0]) is int and row[0] in wanted):
            continue
        index, result = row
        if index in results or not isinstance(result, list) or not result:
            continue
        if result in (["pass"], ["big"]):
            results[index] = result
        elif len(result) == 2 and result[0] == "fail" and isinstance(result[1], str):
            results[index] = ["fail", _identifier(result[1])]
        elif len(result) == 4 and result[0] == "call" and isinstance(result[1], str) and result[1].isidentifier():
            results[index] = result
    return results


class CandidateFault(Exception):
    """Something that looks like the machinery failing, caused by the candidate: scored 0."""


class Unscorable(Exception):
    """The machinery failed (a control program failed too) or the task cannot be graded."""


def _failed(result) -> bool:
    return bool(result.error and result.error.startswith("sandbox_failure:"))


def _attributed_run(sandbox, program: str, stdin: str, blame: type[Exception]):
    """One sandbox run. When it fails as a sandbox failure, a known-good control program runs on the
    same sandbox: if that fails too, the machinery is at fault (Unscorable); if it succeeds, the
    run is tried once more, and a second failure is `blame`'s (the code or data it ran)."""
    result = sandbox.run_python(program, stdin=stdin)
    if not _failed(result):
        return result
    control = sandbox.run_python(PYTHON_PROBE)
    if control.error or control.stdout.strip() != "%d.%d" % sys.version_info[:2]:
        raise Unscorable(f"{result.error} (and a control program failed: {control.error or 'wrong output'})")
    retry = sandbox.run_python(program, stdin=stdin)
    if not _failed(retry):
        return retry
    raise blame(f"{retry.error}, twice, while a control program ran on the same sandbox")


def _chunks(sizes: dict[int, int], budget: int) -> list[list[int]]:
    """Indexes in order, grouped so each group's reserved bytes fit `budget` (a test alone that
    does not fit is a task the sandbox's output limit cannot grade)."""
    groups, current, used = [], [], 0
    for index, size in sorted(sizes.items()):
        if size > budget:
            raise Unscorable(
                f"test {index}'s answer lines overflow the sandbox's output limit ({size} > {budget} bytes)"
            )
        if current and used + size > budget:
            groups.append(current)
            current, used = [], 0
        current.append(index)
        used += size
    return [*groups, current] if current else groups


def _replay_runs(sandbox, tests, entry_point, items: dict[int, list], cap: int, blame) -> dict[int, list]:
    """Replay `items` ({test index: recorded answers}) in the sandbox; {index: result}. The tests
    whose results did not fit beside the others' (["big"]) are replayed again, apart from them
    (on their own from the third pass)."""
    results: dict[int, list] = {}
    todo, passes = sorted(items), 0
    while todo:
        sizes = {i: len(json.dumps([i, ["big"]])) + 1 for i in todo}
        groups = _chunks(sizes, cap // 4) if passes < 2 else [[i] for i in todo]
        for group in groups:
            stdin = replay_input({i: (tests[i].code, items[i]) for i in group}, entry_point, cap)
            result = _attributed_run(sandbox, replay_program(), stdin, blame)
            results.update(parse_replays(result.stdout, group, cap))
        todo = [i for group in groups if len(group) > 1 for i in group if results.get(i) == ["big"]]
        passes += 1
    return results


def _first_replays(sandbox, tests, entry_point, cap: int) -> dict[int, list]:
    """Each test's replay with no answers (its first call, or its outcome if it makes none): the
    task's code on the task's data alone, so kept per (code, entry point) across candidates. A
    test that cannot get this far is a broken task: Unscorable."""
    keys = {i: (t.code, entry_point) for i, t in enumerate(tests)}
    known = {i: _FIRST_REPLAYS[key] for i, key in keys.items() if key in _FIRST_REPLAYS}
    missing = {i: [] for i in keys if i not in known}
    if missing:
        got = _replay_runs(sandbox, tests, entry_point, missing, cap, Unscorable)
        for i in missing:
            if i not in got or got[i] == ["big"]:
                what = "did not finish" if i not in got else "makes a call too large for the output limit"
                raise Unscorable(f"unscorable task: test {getattr(tests[i], 'name', i)!r} {what}")
            known[i] = _FIRST_REPLAYS[keys[i]] = got[i]
    for key in keys.values():
        if key in _FIRST_REPLAYS:
            _FIRST_REPLAYS.move_to_end(key)
    while len(_FIRST_REPLAYS) > _FIRST_REPLAYS_MAX:
        _FIRST_REPLAYS.popitem(last=False)
    return known


def _candidate_runs(sandbox, program: str, pending: dict[int, list], cap: int):
    """The candidate answers `pending` ({test index: calls}); (load failure, {index: answers},
    run error, fault)."""
    sizes = {i: len(json.dumps([i, [["raise", "OutputTooLarge"]] * len(c)])) + 1 for i, c in pending.items()}
    answers: dict[int, list] = {}
    run_error, fault = None, None
    for group in _chunks(sizes, cap // 4):
        try:
            result = _attributed_run(
                sandbox, program, runner_input({i: pending[i] for i in group}, cap), CandidateFault
            )
        except CandidateFault as exc:
            return None, answers, run_error, str(exc)
        run_error = result.error or run_error
        load_error, got = parse_answers(result.stdout, {i: len(pending[i]) for i in group}, cap)
        if load_error is not None:
            return load_error, {}, run_error, None
        answers.update(got)
        fault = fault or _rows(result.stdout, cap)[1]
    return None, answers, run_error, fault


def run_tests(
    candidate: str,
    tests: Sequence[_Test],
    entry_point: str,
    sandbox,
    allowed_imports: Iterable[str] | None,
    forbidden_names: Iterable[str] = (),
) -> tuple[list[bool | str | None], str | None]:
    """Per test True (passed), a failure reason, or None (no answer: the run ended first); and the
    last run's error (starting with CANDIDATE_FAULT when the candidate broke the protocol). Raises
    Unscorable only for the machinery or the task."""
    check_sandbox_python(sandbox)
    cap = sandbox_output_limit(sandbox) - len(TRUNCATION_MARKER) - _FAULT_ROOM
    program = runner_program(candidate, allowed_imports, forbidden_names)
    outcomes: list[bool | str | None] = [None] * len(tests)
    calls: dict[int, list] = {i: [] for i in range(len(tests))}
    results = _first_replays(sandbox, tests, entry_point, cap)
    run_error, faults = None, []
    for _ in range(MAX_CALLS_PER_TEST + 1):
        pending: dict[int, list] = {}
        for i, result in results.items():
            if result[0] == "call":
                calls[i].append(result[1:])
                if len(calls[i]) > MAX_CALLS_PER_TEST:
                    outcomes[i] = f"more than {MAX_CALLS_PER_TEST} calls"
                else:
                    pending[i] = calls[i]
            else:  # ["big"] past the first replay: a call built from the candidate's answers
                outcomes[i] = True if result == ["pass"] else result[1] if result[0] == "fail" else "call too large"
        if not pending:
            break
        load_error, answers, run_error, fault = _candidate_runs(sandbox, program, pending, cap)
        if load_error is not None:
            return ["load:" + load_error] * len(tests), run_error
        faults += [fault] if fault else []
        # A test with no answers here ended with the candidate's run: it stays None (no answer).
        try:
            results = _replay_runs(sandbox, tests, entry_point, answers, cap, CandidateFault) if answers else {}
        except CandidateFault as exc:
            results = {}
            faults.append(f"the tests' replay on its answers failed: {exc}")
        for i in set(answers) - set(results):  # its replay, on the candidate's answers, did not finish
            outcomes[i] = "replay did not finish"
            faults.append("the tests' replay did not finish on its answers")
    if faults:
        run_error = f"{CANDIDATE_FAULT}: {faults[0]}" + (f" ({run_error})" if run_error else "")
    return outcomes, run_error


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


def sandbox_output_limit(sandbox) -> int:
    limits = getattr(sandbox, "limits", None)
    return int(getattr(limits, "max_output_bytes", 65_536))
