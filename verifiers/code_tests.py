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

* The boundary: the candidate never shares a process with what it is graded against, and the
  tests never run on the host. One sandbox run answers *calls* (inputs in on stdin, outputs out
  as plain data; the candidate runs in a child of the runner whose only way out is a pipe, and the
  runner re-encodes each line within a byte budget); another replays the tests against proxies
  that return those answers, and the comparison happens there (`verifiers/code_runner.py`:
  `run_tests`). A test that needs one more answer is replayed after one more candidate run.
  Frames, globals, code constants, files and stdin in the candidate's run hold inputs only, and
  an object whose `__eq__` lies never leaves it: results decode strictly to None, bool, int,
  float, complex, str, bytes, list, tuple, dict, set or frozenset. Static name checks cannot win
  this race (issue 21: a traceback walked by a format string assembled at run time read
  `assert f(2) == 270`); the process boundary does not depend on them.
* Forged results (printing answer lines or "PASS", exiting 0, rebinding print / sys.stdout /
  sys.exit): what the candidate prints can only claim what its functions returned, which it
  could have returned anyway without knowing the expected values; lines that do not parse, or
  answer other calls than those asked, count nothing. Exit codes are ignored.
* Exceptions: a builtin Exception raised by the candidate is re-raised in the test by type (so a
  test can expect ValueError); anything else (SystemExit, KeyboardInterrupt, its own classes)
  fails that test, named.
* Test code comes from task files (data from others): it runs in the sandbox, as the sandbox's
  uid, on plain data only, never with the trainer's powers; a test making more than
  MAX_CALLS_PER_TEST calls fails as a broken task.
* Unscorable is attributed: a failure the candidate caused (its output, exceptions, what it
  wrote on its pipe, a sandbox failure a control program does not share) is a 0, flagged
  `candidate_fault`; only the machinery or the task is unscorable (docs/verifiers.md).
* The static policy (`policy_violation`, checked by the cascade's fast tier *and* again here) is
  defence in depth only, and the task's contract (`allowed_imports`): imports only from the allowed
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
import importlib
import json
import keyword
import re
import types
from collections.abc import Iterable
from dataclasses import dataclass

from verifiers.base import Task, Verdict, register
from verifiers.code_runner import CANDIDATE_FAULT, Unscorable, run_tests

GROUPS = ("fail_to_pass", "pass_to_pass", "held_out")
MODES = ("fraction", "all_or_nothing")
DEFAULT_GROUPS = ("fail_to_pass", "pass_to_pass")
# typing and hashlib: HumanEval's prompts import typing, one of its solutions hashlib (md5).
DEFAULT_ALLOWED_IMPORTS = (
    "math",
    "itertools",
    "functools",
    "collections",
    "heapq",
    "bisect",
    "re",
    "string",
    "operator",
    "fractions",
    "decimal",
    "statistics",
    "typing",
    "hashlib",
)
MAX_CANDIDATE_CHARS = 20_000
FORBIDDEN_NAMES = frozenset(
    {
        "open",
        "exec",
        "eval",
        "compile",
        "__import__",
        "globals",
        "locals",
        "vars",
        "getattr",
        "setattr",
        "delattr",
        "breakpoint",
        "input",
        "help",
        "exit",
        "quit",
    }
)
# Frame attributes lead to the harness's globals (the nonce); the others look attributes up by a
# runtime string, which no check of the source can see.
_FRAME_ATTRS = (
    "gi_frame",
    "cr_frame",
    "ag_frame",
    "gi_code",
    "cr_code",
    "ag_code",
    "tb_frame",
    "tb_next",
    "f_back",
    "f_globals",
    "f_locals",
    "f_builtins",
    "f_code",
)
# get_type_hints evaluates a class's string annotations with the real builtins (open, __import__):
# defence in depth only, the sandbox's pipe to the runner is what holds (verifiers/code_runner.py).
FORBIDDEN_ATTRS = frozenset({*_FRAME_ATTRS, "attrgetter", "methodcaller", "Formatter", "get_type_hints"})
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
        if not (
            isinstance(item, dict)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("code"), str)
            and item.get("group") in GROUPS
        ):
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


def forbidden_names(allow_names: Iterable[str] = ()) -> frozenset[str]:
    """FORBIDDEN_NAMES less `allow_names`: a problem set whose references need one (HumanEval/160's
    calls eval) allows it for its own verifier. Weaker defense in depth, same boundary: the tests
    still only see the candidate's answers as plain data."""
    unknown = set(allow_names) - FORBIDDEN_NAMES
    if unknown:
        raise ValueError(f"allow_names {sorted(unknown)} are not forbidden names; forbidden: {sorted(FORBIDDEN_NAMES)}")
    return FORBIDDEN_NAMES - set(allow_names)


def code_precheck(
    prediction: str,
    task: Task,
    *,
    allowed_imports: Iterable[str] = DEFAULT_ALLOWED_IMPORTS,
    allow_names: Iterable[str] = (),
    **_params,
) -> str | None:
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
    return policy_violation(tree, allowed_imports, forbidden_names(allow_names))


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


def policy_violation(
    tree: ast.AST, allowed_imports: Iterable[str], forbidden: frozenset[str] = FORBIDDEN_NAMES
) -> str | None:
    """The first breach of the static policy as "line N: <construct>", or None."""
    allowed, nodes = frozenset(allowed_imports), list(ast.walk(tree))
    imported: dict[str, object] = {}  # name bound by an import -> what it names here on the host
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and (reason := _import_violation(node, allowed, imported)):
            return f"line {node.lineno}: {reason}"
    init_methods = {
        id(f)
        for c in nodes
        if isinstance(c, ast.ClassDef)
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == "__init__"
    }
    one_arg_type = {
        id(c.func)
        for c in nodes
        if isinstance(c, ast.Call)
        and isinstance(c.func, ast.Name)
        and c.func.id == "type"
        and len(c.args) == 1
        and not c.keywords
        and not isinstance(c.args[0], ast.Starred)
    }
    attribute_bases = {id(a.value) for a in nodes if isinstance(a, ast.Attribute)}
    for node in nodes:
        reason = _string_violation(node, id(node) in init_methods)
        if reason is None and isinstance(node, ast.Name):
            if node.id in forbidden:
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


def _import_violation(
    node: ast.Import | ast.ImportFrom, allowed: frozenset[str], imported: dict[str, object]
) -> str | None:
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


def _details(tests: list[CodeTest], outcomes: list[bool | str | None], run_error: str | None) -> str:
    counts = [
        f"{g} {sum(o is True for t, o in zip(tests, outcomes) if t.group == g)}/{sum(t.group == g for t in tests)}"
        for g in GROUPS
        if any(t.group == g for t in tests)
    ]
    failed = [(t.name, o or "no result") for t, o in zip(tests, outcomes) if o is not True]
    extra = [f"first failure: {failed[0][0]} ({failed[0][1]})"] if failed else []
    return "; ".join([", ".join(counts), *extra, *([f"run: {run_error}"] if run_error else [])])


@register("unit_tests", needs_sandbox=True, precheck=code_precheck, task_check=code_task_check)
def unit_tests(
    prediction: str,
    task: Task,
    *,
    sandbox,
    mode: str = "fraction",
    groups: Iterable[str] = DEFAULT_GROUPS,
    allowed_imports: Iterable[str] = DEFAULT_ALLOWED_IMPORTS,
    allow_names: Iterable[str] = (),
) -> Verdict:
    """fraction: passed / selected tests; all_or_nothing: 1.0 iff all pass (SWE-bench's resolved
    when groups are F2P + P2P). None if the task or the sandbox cannot score it."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    try:
        tests = select_tests(task, groups)
    except ValueError as exc:
        return Verdict(None, f"unscorable task: {exc}")
    # Defense in depth: the cascade's fast tier ran this, but a caller may not have used it.
    rejected = code_precheck(prediction, task, allowed_imports=allowed_imports, allow_names=allow_names)
    if rejected is not None:
        return Verdict(0.0, rejected)
    try:
        outcomes, run_error = run_tests(
            prediction, tests, task["entry_point"], sandbox, allowed_imports, forbidden_names(allow_names)
        )
    except Unscorable as exc:
        return Verdict(None, str(exc))
    passed = [o is True for o in outcomes]
    score = sum(passed) / len(tests) if mode == "fraction" else float(all(passed))
    fault = bool(run_error and run_error.startswith(CANDIDATE_FAULT))
    return Verdict(score, _details(tests, outcomes, run_error), candidate_fault=fault)
