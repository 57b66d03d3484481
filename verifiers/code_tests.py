"""Unit-test verifier for code tasks: the policy's Python, run against the task's tests in the sandbox.

Task format (the `code` family):

    entry_point  str: the function (or class) the candidate must define at top level
    tests        a JSON string, or a list, of {"name": str, "code": str, "group": str}
      code       Python that raises on failure, e.g. "assert add(2, 3) == 5". It sees the
                 candidate's top-level names and must import anything else it uses.
      group      "fail_to_pass": the behaviour the task asks for (SWE-bench's F2P)
                 "pass_to_pass": behaviour that must keep working (P2P)
                 "held_out":     never shown to the policy, run only when `groups` selects it
                                 (a stricter tier): catches candidates that hard-code answers

The candidate is the policy's final answer: Python source that defines `entry_point`.

Threat model. The candidate is written by a policy optimized against this score, so it will
find any way to make a test *report* success without being right. The defenses:

* The boundary: the candidate never shares a process with what it is graded against. The
  sandbox runs the candidate and answers *calls* (inputs in on stdin, outputs out on stdout, as
  plain data); the tests run on the host, against proxies that return those answers, and the
  comparison happens on the host (`run_tests`, `replay_test`). A test that needs one more answer
  is replayed after one more sandbox run; `assert f(2) == 270` takes exactly one. Frames,
  globals, code constants, files and stdin in the sandbox hold inputs only, and an object whose
  `__eq__` lies never leaves it: results decode strictly to None, bool, int, float, complex, str,
  bytes, list, tuple, dict, set or frozenset. Static name checks cannot win this race (issue 21:
  a traceback walked by a format string assembled at run time read `assert f(2) == 270`); the
  process boundary does not depend on them.
* Forged results (printing answer lines or "PASS", exiting 0, rebinding print / sys.stdout /
  sys.exit): what the candidate prints can only claim what its functions returned, which it
  could have returned anyway without knowing the expected values; lines that do not parse, or
  answer other calls than those asked, count nothing. Exit codes are ignored.
* Exceptions: a builtin Exception raised by the candidate is re-raised in the test by type (so a
  test can expect ValueError); anything else (SystemExit, KeyboardInterrupt, its own classes)
  fails that test, named.
* Test code is the task's (trusted, like its gold answer) and runs in the calling process on
  plain data only; a test making more than MAX_CALLS_PER_TEST calls fails as a broken task.
* The static policy (`policy_violation`, checked by the cascade's fast tier *and* again here) is
  defense in depth and the task's contract (`allowed_imports`): imports only from the allowed
  list; no dunders, no open/exec/eval/getattr/globals..., no frame attributes, no look-up of
  attributes by a runtime string; inside the sandbox the builtins lack the forbidden names and
  `import` is guarded.
* Hanging or crashing: the sandbox's limits end the run; tests that did not report PASS score 0.
* Hard-coding the visible tests' answers: the `held_out` group.

Limits: results must be plain data; a class entry point, a test that checks a mutated argument,
or a test that reads a candidate global that is not callable cannot be graded this way. The
candidate keeps its state between the tests of one run. Containing the host is
the sandbox's job (docs/sandbox.md). There is no per-test timeout: a hang ends the run.
"""

from __future__ import annotations

import ast
import base64
import builtins
import functools
import importlib
import json
import keyword
import marshal
import re
import sys
import types
from collections.abc import Iterable
from dataclasses import dataclass

from verifiers.base import Task, Verdict, register
from verifiers.sandbox import TRUNCATION_MARKER

GROUPS = ("fail_to_pass", "pass_to_pass", "held_out")
MODES = ("fraction", "all_or_nothing")
DEFAULT_GROUPS = ("fail_to_pass", "pass_to_pass")
DEFAULT_ALLOWED_IMPORTS = ("math", "itertools", "functools", "collections", "heapq", "bisect", "re",
                           "string", "operator", "fractions", "decimal", "statistics")
MAX_CANDIDATE_CHARS = 20_000
FORBIDDEN_NAMES = frozenset({"open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars",
                             "getattr", "setattr", "delattr", "breakpoint", "input", "help", "exit", "quit"})
# Frame attributes lead to the harness's globals (the nonce); the others look attributes up by a
# runtime string, which no check of the source can see.
_FRAME_ATTRS = ("gi_frame", "cr_frame", "ag_frame", "gi_code", "cr_code", "ag_code", "tb_frame",
                "tb_next", "f_back", "f_globals", "f_locals", "f_builtins", "f_code")
FORBIDDEN_ATTRS = frozenset({*_FRAME_ATTRS, "attrgetter", "methodcaller", "Formatter"})
_DUNDER = re.compile(r"__\w+__")
# In string constants: a dunder is type('X', (), {'__eq__': ...}); a frame attribute is
# "{0.gi_frame.f_back.f_globals}".format(gen).
_SUSPICIOUS_STRING = re.compile(r"__\w+__|" + "|".join(_FRAME_ATTRS))


@dataclass(frozen=True)
class CodeTest:
    name: str
    code: str
    group: str


def parse_tests(raw: object) -> list[CodeTest]:
    """The task's `tests` field as CodeTests; ValueError naming what is wrong with it."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"tests are not valid JSON: {exc}") from None
    if not isinstance(raw, list) or not raw:
        raise ValueError("tests must be a non-empty list")
    tests = []
    for i, item in enumerate(raw):
        if not (isinstance(item, dict) and isinstance(item.get("name"), str)
                and isinstance(item.get("code"), str) and item.get("group") in GROUPS):
            raise ValueError(f"test {i} is not {{name: str, code: str, group: one of {GROUPS}}}")
        try:  # a test that cannot compile would fail every candidate: the task is broken, not them
            compile(item["code"], "<test>", "exec")
        except (SyntaxError, ValueError) as exc:
            raise ValueError(f"test {item['name']!r} does not compile: {exc}") from None
        tests.append(CodeTest(item["name"], item["code"], item["group"]))
    return tests


def select_tests(task: Task, groups: Iterable[str]) -> list[CodeTest]:
    """The task's tests in `groups`; ValueError if the task cannot be scored with them."""
    unknown = set(groups) - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown test groups {sorted(unknown)}; expected some of {GROUPS}")
    entry = task.get("entry_point")
    if not isinstance(entry, str) or not entry.isidentifier() or keyword.iskeyword(entry):
        raise ValueError(f"entry_point {entry!r} is not a Python identifier")
    selected = set(groups)
    tests = [t for t in parse_tests(task.get("tests")) if t.group in selected]
    if not tests:
        raise ValueError(f"no tests in groups {list(groups)}")
    return tests


def code_task_check(task: Task, *, groups: Iterable[str] = DEFAULT_GROUPS, **_params) -> str | None:
    try:
        select_tests(task, groups)
    except ValueError as exc:
        return str(exc)
    return None


# --- the static policy ------------------------------------------------------------------------

def code_precheck(prediction: str, task: Task, *, allowed_imports: Iterable[str] = DEFAULT_ALLOWED_IMPORTS,
                  **_params) -> str | None:
    """Why the candidate cannot earn reward without running it (empty, too long, does not
    parse, no entry point, breaks the static policy), or None."""
    if not prediction.strip():
        return "empty candidate"
    if len(prediction) > MAX_CANDIDATE_CHARS:
        return f"candidate of {len(prediction)} chars > {MAX_CANDIDATE_CHARS}"
    try:
        tree = ast.parse(prediction)
    except (SyntaxError, ValueError, RecursionError) as exc:
        return f"line {getattr(exc, 'lineno', '?')}: does not parse: {type(exc).__name__}: {exc}"
    entry = task.get("entry_point")
    if isinstance(entry, str) and entry not in _top_level_names(tree):
        return f"entry point {entry!r} is not defined at top level"
    return policy_violation(tree, allowed_imports)


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
        elif isinstance(stmt, ast.ImportFrom):
            names |= {a.asname or a.name for a in stmt.names}
    return names


def policy_violation(tree: ast.AST, allowed_imports: Iterable[str]) -> str | None:
    """The first breach of the static policy as "line N: <construct>", or None."""
    allowed, nodes = frozenset(allowed_imports), list(ast.walk(tree))
    imported: dict[str, object] = {}  # name bound by an import -> what it names here on the host
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and (reason := _import_violation(node, allowed, imported)):
            return f"line {node.lineno}: {reason}"
    init_methods = {id(f) for c in nodes if isinstance(c, ast.ClassDef) for f in c.body
                    if isinstance(f, ast.FunctionDef) and f.name == "__init__"}
    one_arg_type = {id(c.func) for c in nodes if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                    and c.func.id == "type" and len(c.args) == 1 and not c.keywords
                    and not isinstance(c.args[0], ast.Starred)}
    attribute_bases = {id(a.value) for a in nodes if isinstance(a, ast.Attribute)}
    for node in nodes:
        reason = _string_violation(node, id(node) in init_methods)
        if reason is None and isinstance(node, ast.Name):
            if node.id in FORBIDDEN_NAMES:
                reason = f"use of {node.id}"
            elif node.id == "type" and id(node) not in one_arg_type:
                reason = "type() other than type(x) (three arguments create a class)"
            elif isinstance(imported.get(node.id), types.ModuleType) and id(node) not in attribute_bases:
                reason = f"module {node.id} used as a value (only module.attribute is allowed)"
        elif reason is None and isinstance(node, ast.Attribute):
            reason = _attribute_violation(node, allowed, imported)
        if reason:
            return f"line {getattr(node, 'lineno', '?')}: {reason}"
    return None


def _string_violation(node: ast.AST, is_init_method: bool) -> str | None:
    """Dunder identifiers anywhere (names, attributes, arguments, aliases...), and string
    constants that spell a dunder or a frame attribute."""
    for _, value in ast.iter_fields(node):
        for text in value if isinstance(value, list) else [value]:
            if isinstance(node, ast.Constant) and isinstance(text, (str, bytes)):
                found = _SUSPICIOUS_STRING.search(text if isinstance(text, str) else text.decode("latin-1"))
                if found:
                    return f"string constant spelling {found.group()!r}"
            elif isinstance(text, str) and not is_init_method:
                dunder = next((p for p in text.split(".") if _DUNDER.fullmatch(p)), None)
                if dunder:
                    return f"dunder name {dunder}"
    return None


def _import_violation(node: ast.Import | ast.ImportFrom, allowed: frozenset[str],
                      imported: dict[str, object]) -> str | None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.partition(".")[0] not in allowed:
                return f"import of {alias.name} (allowed: {', '.join(sorted(allowed))})"
            bound = alias.name if alias.asname else alias.name.partition(".")[0]
            imported[alias.asname or bound] = _host_module(bound)
        return None
    if node.level or node.module is None or node.module.partition(".")[0] not in allowed:
        return f"import from {'.' * node.level}{node.module or ''} (allowed: {', '.join(sorted(allowed))})"
    parent = _host_module(node.module)
    for alias in node.names:
        if alias.name == "*":
            return f"from {node.module} import * (binds names this check cannot see)"
        if alias.name in FORBIDDEN_ATTRS:
            return f"import of {node.module}.{alias.name}"
        value = getattr(parent, alias.name, None)
        if isinstance(value, types.ModuleType) and value.__name__.partition(".")[0] not in allowed:
            return f"{node.module}.{alias.name} is module {value.__name__}, not allowed"
        imported[alias.asname or alias.name] = value
    return None


def _attribute_violation(node: ast.Attribute, allowed: frozenset[str], imported: dict[str, object]) -> str | None:
    if node.attr in FORBIDDEN_ATTRS:
        return f"attribute {node.attr}"
    chain, root = [], node
    while isinstance(root, ast.Attribute):
        chain.insert(0, root.attr)
        root = root.value
    if not (isinstance(root, ast.Name) and root.id in imported):
        return None
    if not isinstance(node.ctx, ast.Load):  # the tests share the imported modules and classes
        return f"assignment to {'.'.join([root.id, *chain])} (imported objects are shared with the tests)"
    value, dotted = imported[root.id], root.id
    for attr in chain:
        dotted += "." + attr
        if attr.startswith("_"):
            return f"private attribute {dotted}"
        if not isinstance(value, types.ModuleType):
            break
        value = getattr(value, attr, None)
        if isinstance(value, types.ModuleType) and value.__name__.partition(".")[0] not in allowed:
            return f"{dotted} reaches module {value.__name__}, not allowed"
    return None


def _host_module(name: str) -> types.ModuleType | None:
    try:  # only names already checked against allowed_imports (trusted config) get here
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 — a module missing here fails the candidate in the sandbox
        return None


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
_RUNNER = _CODEC + r"""
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
_VERSION_MISMATCH = "runner: the sandbox's Python differs from the trainer's"
MAX_CALLS_PER_TEST = 16  # a test making more calls than this is a broken task, not a slow one


def runner_program(candidate: str, allowed_imports: Iterable[str] | None) -> str:
    """The sandboxed program: the candidate and the runner, which reads `runner_input` on stdin.
    `allowed_imports=None` drops the in-sandbox guards (restricted builtins, guarded import); only
    tests use it, to attack the boundary on its own."""
    allowed = None if allowed_imports is None else tuple(sorted(set(allowed_imports)))
    return (f"_CANDIDATE = {candidate!r}\n_ALLOWED = {allowed!r}\n_FORBIDDEN = {sorted(FORBIDDEN_NAMES)!r}\n"
            + _runner_loader())


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
    return (f"import binascii as _binascii, marshal as _marshal, sys as _sys\n"
            f"if _sys.version_info[:2] != {version!r}:\n"
            f"    raise SystemExit({_VERSION_MISMATCH!r} + ' (runner {version}, sandbox %s)' % (_sys.version_info[:2],))\n"
            f"exec(_marshal.loads(_binascii.a2b_base64({code!r})))\n")


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
        if (isinstance(row, list) and len(row) == 2 and type(row[0]) is int and row[0] in expected
                and row[0] not in answers and isinstance(row[1], list) and len(row[1]) == expected[row[0]]
                and all(isinstance(a, list) and len(a) == 2 and a[0] in ("ok", "raise") for a in row[1])):
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

    ns = {"__builtins__": _TEST_BUILTINS, "__name__": "test",
          **{name: proxy(name) for name in {*names, entry_point} if name not in _TEST_BUILTINS or name == entry_point}}
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


def run_tests(candidate: str, tests: list[CodeTest], entry_point: str, sandbox,
              allowed_imports: Iterable[str] | None) -> tuple[list[str | None], str | None]:
    """Per test True (passed), a failure reason, or None (no answer: the run ended first); and the
    last run's error. Unscorable runs raise _Unscorable."""
    program = runner_program(candidate, allowed_imports)
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
            raise _Unscorable(result.error)
        if _VERSION_MISMATCH in result.stderr:
            raise _Unscorable(result.stderr.strip().splitlines()[-1])
        if result.stdout.endswith(TRUNCATION_MARKER):  # lost lines would be failures that are not
            raise _Unscorable(f"{len(pending)} answer lines overflow the sandbox's output limit")
        load_error, got = parse_answers(result.stdout, {i: len(c) for i, c in pending.items()})
        if load_error is not None:
            return ["load:" + load_error] * len(tests), run_error
        answers = got  # a test with no line here ended with the run: it stays None (no answer)
    return outcomes, run_error


class _Unscorable(Exception):
    pass


def sandbox_output_limit(sandbox) -> int:
    limits = getattr(sandbox, "limits", None)
    return int(getattr(limits, "max_output_bytes", 4096))


def _details(tests: list[CodeTest], outcomes: list[bool | str | None], run_error: str | None) -> str:
    counts = [f"{g} {sum(o is True for t, o in zip(tests, outcomes) if t.group == g)}/"
              f"{sum(t.group == g for t in tests)}" for g in GROUPS if any(t.group == g for t in tests)]
    failed = [(t.name, o or "no result") for t, o in zip(tests, outcomes) if o is not True]
    extra = [f"first failure: {failed[0][0]} ({failed[0][1]})"] if failed else []
    return "; ".join([", ".join(counts), *extra, *([f"run: {run_error}"] if run_error else [])])


@register("unit_tests", needs_sandbox=True, precheck=code_precheck, task_check=code_task_check)
def unit_tests(prediction: str, task: Task, *, sandbox, mode: str = "fraction",
               groups: Iterable[str] = DEFAULT_GROUPS,
               allowed_imports: Iterable[str] = DEFAULT_ALLOWED_IMPORTS) -> Verdict:
    """fraction: passed / selected tests; all_or_nothing: 1.0 iff all pass (SWE-bench's resolved
    when groups are F2P + P2P). None if the task or the sandbox cannot score it."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    try:
        tests = select_tests(task, groups)
    except ValueError as exc:
        return Verdict(None, f"unscorable task: {exc}")
    # Defense in depth: the cascade's fast tier ran this, but a caller may not have used it.
    rejected = code_precheck(prediction, task, allowed_imports=allowed_imports)
    if rejected is not None:
        return Verdict(0.0, rejected)
    try:
        outcomes, run_error = run_tests(prediction, tests, task["entry_point"], sandbox, allowed_imports)
    except _Unscorable as exc:
        return Verdict(None, str(exc))
    passed = [o is True for o in outcomes]
    score = sum(passed) / len(tests) if mode == "fraction" else float(all(passed))
    return Verdict(score, _details(tests, outcomes, run_error))
