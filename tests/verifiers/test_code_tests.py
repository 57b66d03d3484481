"""The unit-test verifier against a live bubblewrap sandbox: scoring, SWE-bench style groups, and
the reward hacks it closes (each case fails if its defense is removed)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import pytest

if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap (`bwrap`) is not installed; the sandbox needs it", allow_module_level=True)

from verifiers.base import get_verifier, run_precheck, run_task_check, run_verifier  # noqa: E402
from verifiers.code_runner import MAX_CALLS_PER_TEST, PYTHON_PROBE, parse_answers, run_tests  # noqa: E402
from verifiers.code_tests import (  # noqa: E402
    DEFAULT_ALLOWED_IMPORTS,
    FORBIDDEN_NAMES,
    CodeTest,
    code_precheck,
    select_tests,
)
from verifiers.sandbox import (  # noqa: E402
    DEFAULT_UID_BASE,
    BubblewrapSandbox,
    SandboxLimits,
    SandboxResult,
)

ADD_TESTS = [
    {"name": "small", "code": "assert add(2, 3) == 5", "group": "fail_to_pass"},
    {"name": "negative", "code": "assert add(-4, 1) == -3", "group": "fail_to_pass"},
    {"name": "zero", "code": "assert add(0, 0) == 0", "group": "pass_to_pass"},
    {"name": "large", "code": "assert add(10**6, 7) == 1000007", "group": "held_out"},
]
TASK = {"entry_point": "add", "tests": json.dumps(ADD_TESTS)}
ALL_GROUPS = ("fail_to_pass", "pass_to_pass", "held_out")

CORRECT = "def add(a, b):\n    return a + b\n"
PARTIAL = "def add(a, b):\n    return abs(a) + b\n"  # wrong for negative a
HARD_CODED = "def add(a, b):\n    return {(2, 3): 5, (-4, 1): -3, (0, 0): 0}[(a, b)]\n"


def verify(candidate, sandbox, task=TASK, **params):
    return run_verifier("unit_tests", candidate, task, params, sandbox=sandbox)


@pytest.fixture(scope="module")
def quick_timeout():
    """Its own pool (and uids) with a short wall clock, so the hang cases cost 0.5 s, not 2 s."""
    uid_base = DEFAULT_UID_BASE + 3_000_000 + os.getpid() % 100_000 * 4
    with BubblewrapSandbox(SandboxLimits(timeout_s=0.5, cpu_s=1), pool_size=1, uid_base=uid_base) as box:
        yield box


class FakeSandbox:
    """Test double for the infrastructure only: returns a fixed result and counts calls."""

    def __init__(self, result: SandboxResult):
        self.result, self.calls = result, 0

    def run_python(self, code, *, stdin=""):
        if code == PYTHON_PROBE and self.result.error is None:  # a working sandbox runs our Python
            return SandboxResult("%d.%d\n" % sys.version_info[:2], "", 0, False, 0.0, None)
        self.calls += 1
        return self.result


# --- scoring ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "candidate, params, score, details",
    [
        (CORRECT, {}, 1.0, "fail_to_pass 2/2, pass_to_pass 1/1"),
        (PARTIAL, {}, 2 / 3, "fail_to_pass 1/2, pass_to_pass 1/1; first failure: negative (AssertionError)"),
        (PARTIAL, {"mode": "all_or_nothing"}, 0.0, "fail_to_pass 1/2, pass_to_pass 1/1"),
        (CORRECT, {"mode": "all_or_nothing", "groups": ALL_GROUPS}, 1.0, "held_out 1/1"),
        (CORRECT, {"groups": ["pass_to_pass"]}, 1.0, "pass_to_pass 1/1"),  # a list, as YAML gives it
        # Hard-coding the visible answers passes F2P and P2P, and is caught by the held-out tier.
        (HARD_CODED, {}, 1.0, "fail_to_pass 2/2"),
        (HARD_CODED, {"groups": ALL_GROUPS}, 0.75, "held_out 0/1; first failure: large (KeyError)"),
        (HARD_CODED, {"groups": ALL_GROUPS, "mode": "all_or_nothing"}, 0.0, "held_out 0/1"),
    ],
)
def test_scores_and_swe_bench_group_counts(sandbox, candidate, params, score, details):
    verdict = verify(candidate, sandbox, **params)
    assert verdict.score == pytest.approx(score)
    assert details in verdict.details


@pytest.mark.parametrize(
    "candidate, details",
    [
        # Printing the expected output: the tests check return values, never stdout.
        ("def add(a, b):\n    print(a + b)\n", "first failure: small (AssertionError)"),
        ("print(5)\nprint(-3)\nprint(0)\ndef add(a, b):\n    pass\n", "AssertionError"),
        # Printing result-looking lines, with every nonce it could guess: not this run's nonce.
        (
            "for i in range(3):\n    print('0' * 32, i, 'PASS')\n    print(i, 'PASS')\n"
            "def add(a, b):\n    return None\n",
            "AssertionError",
        ),
        # Exiting on purpose: exit code 0 never counts; SystemExit fails the load or the test.
        ("def add(a, b):\n    return a + b\nraise SystemExit(0)\n", "load:SystemExit"),
        ("def add(a, b):\n    raise SystemExit(0)\n", "small (SystemExit)"),
    ],
)
def test_output_and_exit_tricks_score_zero(sandbox, candidate, details):
    verdict = verify(candidate, sandbox)
    assert verdict.score == 0.0
    assert details in verdict.details


def test_candidate_output_cannot_crowd_out_the_results(sandbox):
    """Its stdout goes to /dev/null: 5 kB of prints would otherwise truncate the result lines."""
    assert verify("print('x' * 5000)\n" + CORRECT, sandbox).score == 1.0


def test_exception_raised_on_purpose_fails_only_that_test(sandbox):
    candidate = "def add(a, b):\n    if a == 2:\n        raise KeyboardInterrupt\n    return a + b\n"
    verdict = verify(candidate, sandbox)
    assert verdict.score == pytest.approx(2 / 3)  # the later tests still ran
    assert "first failure: small (KeyboardInterrupt)" in verdict.details


def test_candidate_cannot_shadow_builtins_the_tests_use(sandbox):
    task = {
        "entry_point": "mean",
        "tests": [{"name": "mean", "code": "assert abs(mean([1, 2]) - 1.5) < 1e-9", "group": "fail_to_pass"}],
    }
    assert verify("def mean(xs):\n    return sum(xs) / len(xs)\n", sandbox, task).score == 1.0
    assert verify("def abs(x):\n    return 0\ndef mean(xs):\n    return 0\n", sandbox, task).score == 0.0


@pytest.mark.parametrize(
    "candidate, score",
    [
        (CORRECT + "while True:\n    pass\n", 0.0),  # hangs at import: nothing reported
        ("def add(a, b):\n    while a == 0:\n        pass\n    return a + b\n", 2 / 3),  # hangs in the third test
    ],
)
def test_hang_ends_within_the_timeout_and_keeps_earlier_passes(quick_timeout, candidate, score):
    start = time.monotonic()
    verdict = verify(candidate, quick_timeout)
    assert time.monotonic() - start < 3.0
    assert verdict.score == pytest.approx(score)
    assert "run: timeout" in verdict.details or "run: cpu_limit" in verdict.details


# --- the static policy --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "candidate, reason",
    [
        ("", "empty"),
        ("#" * 20_001, "20001 chars"),
        ("def add(a, b) return a", "does not parse"),
        ("def plus(a, b):\n    return a + b\n", "entry point 'add' is not defined"),
        ("import os\n" + CORRECT, "line 1: import of os"),
        ("from subprocess import run\n" + CORRECT, "import from subprocess"),
        ("from . import x\n" + CORRECT, "import from ."),
        ("from math import *\n" + CORRECT, "import *"),
        # Reading or editing the tests, and running code the check cannot see.
        (CORRECT + "open('/tmp/tests.py').read()\n", "line 3: use of open"),
        (CORRECT + "exec('x = 1')\n", "use of exec"),
        (CORRECT + "f = eval\n", "use of eval"),
        (CORRECT + "getattr(add, 'x')\n", "use of getattr"),
        (CORRECT + "print(globals())\n", "use of globals"),
        ("def add(a, b):\n    return vars()\n", "use of vars"),
        # Dunder escapes and objects equal to everything.
        (CORRECT + "().__class__.__bases__[0].__subclasses__()\n", "line 3: dunder name __"),
        (
            "class Always:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Always()\n",
            "line 2: dunder name __eq__",
        ),
        ("def add(a, b):\n    return type('A', (), {'__eq__': lambda s, o: True})()\n", "type()"),
        ("def add(a, b):\n    return {'__eq__': 1}\n", "string constant spelling '__eq__'"),
        ("def add(a, b):\n    return __import__('os')\n", "dunder name __import__"),
        # Reaching the harness's frame (and its nonce) or attributes by a runtime string.
        (CORRECT + "g = (x for x in [1])\nf = g.gi_frame.f_back\n", "attribute"),
        (CORRECT + "'{0.gi_frame}'.format(1)\n", "string constant spelling 'gi_frame'"),
        ("import operator\n" + CORRECT + "operator.attrgetter('x')\n", "attribute attrgetter"),
        ("from string import Formatter\n" + CORRECT, "import of string.Formatter"),
        # Modules: no way out through an allowed module, no patching what the tests share.
        ("import re\n" + CORRECT + "re.enum.sys.modules\n", "re.enum reaches module enum"),
        ("import fractions\n" + CORRECT + "fractions.sys\n", "reaches module sys"),
        ("from statistics import random\n" + CORRECT, "statistics.random is module random"),
        ("import string\n" + CORRECT + "string._re\n", "private attribute string._re"),
        ("import math\n" + CORRECT + "math.isclose = lambda *a, **k: True\n", "assignment to math.isclose"),
        ("import math\n" + CORRECT + "m = math\n", "module math used as a value"),
        ("import math\n" + CORRECT + "print(math)\n", "module math used as a value"),
    ],
)
def test_static_policy_rejects(candidate, reason):
    found = code_precheck(candidate, TASK, allowed_imports=DEFAULT_ALLOWED_IMPORTS)
    assert found is not None and reason in found, found


@pytest.mark.parametrize(
    "candidate",
    [
        CORRECT,
        "import math\nfrom collections import Counter, abc\nimport collections.abc as cabc\n"
        "def add(a, b):\n    assert isinstance(Counter(), cabc.Mapping) and collections_ok()\n"
        "    return int(math.fsum([a, b]))\n"
        "def collections_ok():\n    return abc.Iterable is not None\n",
        "class Acc:\n    def __init__(self):\n        self.total = 0\n"
        "def add(a, b):\n    acc = Acc()\n    acc.total = a + b\n    return acc.total if type(a) is int else 0\n",
        "import re\ndef add(a, b):\n    return int(re.sub('x', '', '{}'.format(a + b)))\n",
    ],
)
def test_static_policy_allows_ordinary_code(sandbox, candidate):
    assert code_precheck(candidate, TASK) is None
    assert verify(candidate, sandbox).score == 1.0


def test_policy_is_rechecked_inside_the_verifier():
    """Defense in depth: called directly (no cascade, no precheck), the sandbox is never reached."""
    box = FakeSandbox(SandboxResult("", "", 0, False, 0.0, None))
    for candidate in (CORRECT + "open('x')\n", "def add(a, b):\n    return ().__class__\n"):
        verdict = verify(candidate, box)
        assert verdict.score == 0.0 and "line" in verdict.details
    assert box.calls == 0


def test_registered_with_precheck_and_task_check():
    spec = get_verifier("unit_tests")
    assert spec.needs_sandbox and spec.precheck is code_precheck
    assert run_precheck("unit_tests", "import os\n" + CORRECT, TASK, {"mode": "fraction"}).score == 0.0
    assert run_precheck("unit_tests", CORRECT, TASK, {"groups": ALL_GROUPS}) is None
    assert run_task_check("unit_tests", TASK, {}) is None
    assert "not valid JSON" in run_task_check("unit_tests", {"entry_point": "add", "tests": "["}, {})


# --- the boundary on its own: the candidate answers calls, the tests run outside ------------------


def run_harness(box, candidate, tests=ADD_TESTS[:3]):
    """The outcomes with the static policy and the in-sandbox guards off (allowed_imports=None)."""
    outcomes, _ = run_tests(candidate, [CodeTest(**t) for t in tests], "add", box, allowed_imports=None)
    return ["PASS" if o is True else f"FAIL {o}" if o == "PASS" else o for o in outcomes]


@pytest.mark.parametrize(
    "candidate",
    [
        # Writes answer-looking lines on every fd it can (claiming wrong values), then exits 0.
        "import os\nfor fd in range(1, 8):\n    for i in range(3):\n"
        '        try:\n            os.write(fd, f\'[{i}, [["ok", ["i", "-1"]]]]\\n{i} PASS\\n\'.encode())\n'
        "        except OSError:\n            pass\nos._exit(0)\n",
        "import sys\nsys.exit(0)\n",
    ],
)
def test_forged_answers_and_exit_zero_count_nothing(sandbox, candidate):
    assert "PASS" not in run_harness(sandbox, candidate)


def test_rebinding_print_stdout_exit_and_builtins_changes_nothing(sandbox):
    rebind = (
        "import builtins, os, sys\nbuiltins.print = sys.exit = os.write = None\nsys.stdout = None\n"
        "builtins.exec = builtins.compile = lambda *a, **k: None\n"
    )
    assert run_harness(sandbox, rebind + CORRECT) == ["PASS", "PASS", "PASS"]  # answers still given
    wrong = run_harness(sandbox, rebind + "def add(a, b):\n    return 0\n")
    assert wrong == ["AssertionError", "AssertionError", "PASS"]  # and tests still really run
    # Breaking the builtins its own process needs to answer only costs the candidate: the tests
    # run in another process.
    sabotage = rebind + "builtins.BaseException = builtins.str = builtins.type = builtins.isinstance = None\n"
    for candidate in (CORRECT, "def add(a, b):\n    return 0\n"):
        assert "PASS" not in run_harness(sandbox, sabotage + candidate)


def test_runtime_guards_back_up_the_static_policy(sandbox):
    """Had the static check missed them, import and the forbidden builtins still fail in the sandbox."""
    for candidate, outcome in [
        ("import os\n" + CORRECT, "load:ImportError"),
        ("def add(a, b):\n    return open\n", "NameError"),
    ]:
        outcomes, _ = run_tests(
            candidate, [CodeTest(**ADD_TESTS[0])], "add", sandbox, DEFAULT_ALLOWED_IMPORTS, FORBIDDEN_NAMES
        )
        assert outcomes == [outcome]


@pytest.mark.integrity
@pytest.mark.parametrize(
    "candidate",
    [
        "class PASS(ValueError):\n    pass\ndef add(a, b):\n    raise PASS\n",  # found by the fuzzer (issue 21)
        "T = type(1)\ndef add(a, b):\n    raise type(T)('PASS', (ValueError,), {})()\n",
        "class PASS(BaseException):\n    pass\ndef add(a, b):\n    raise PASS\n",
    ],
)
def test_a_failure_named_pass_is_a_failure(sandbox, candidate):
    verdict = verify(candidate, sandbox, mode="fraction", groups=ALL_GROUPS)
    assert verdict.score == 0.0, verdict.details


def test_tests_never_enter_the_candidates_run(sandbox):
    """A candidate free to walk the filesystem and read its stdin finds no test's code; the tests
    replay in runs of their own, which hold no candidate."""
    marker = "assert add(2, 3) == 5  # marker-7f3a"
    search = (
        "import os, sys\nFOUND = []\nfor top in ('.', '/tmp'):\n"
        "    for root, _, files in os.walk(top):\n        for name in files:\n"
        "            try:\n                FOUND.append('marker-7f3a' in open(os.path.join(root, name)).read())\n"
        "            except OSError:\n                pass\n"
        "def add(a, b):\n    return a + b if not any(FOUND) else 0\n"
    )
    assert run_harness(sandbox, search, [{"name": "m", "code": marker, "group": "fail_to_pass"}]) == ["PASS"]
    seen = []

    class Recording:
        limits = sandbox.limits

        def run_python(self, code, *, stdin=""):
            seen.append((code, stdin))
            return sandbox.run_python(code, stdin=stdin)

    unique = "def add(a, b):\n    return a + b  # candidate-5d1e\n"
    task = {"entry_point": "add", "tests": [{"name": "m", "code": marker, "group": "fail_to_pass"}]}
    assert verify(unique, Recording(), task).score == 1.0
    candidate_runs = [code + stdin for code, stdin in seen if "candidate-5d1e" in code]
    replay_runs = [code + stdin for code, stdin in seen if "marker-7f3a" in stdin]
    assert candidate_runs and replay_runs
    assert not any("marker-7f3a" in text or "assert" in text for text in candidate_runs)  # only calls and inputs
    assert not any("candidate-5d1e" in text for text in replay_runs)


def test_a_test_with_several_calls_is_replayed_until_it_ends(sandbox):
    tests = [
        {"name": "chain", "code": "assert add(add(1, 2), 3) == 6\nassert add(0, 0) == 0", "group": "fail_to_pass"},
        {"name": "loop", "code": "for i in range(5):\n    assert add(i, i) == 2 * i", "group": "fail_to_pass"},
        {"name": "swallowed", "code": "try:\n    add(1, 1)\nexcept BaseException:\n    pass", "group": "fail_to_pass"},
    ]
    assert run_harness(sandbox, CORRECT, tests) == ["PASS", "PASS", "PASS"]
    assert run_harness(sandbox, "def add(a, b):\n    return a + b if a < 3 else 0\n", tests) == [
        "AssertionError",
        "AssertionError",
        "PASS",
    ]
    many = [
        {"name": "many", "code": f"for i in range({MAX_CALLS_PER_TEST + 1}):\n    add(i, i)", "group": "fail_to_pass"}
    ]
    assert run_harness(sandbox, CORRECT, many) == [f"more than {MAX_CALLS_PER_TEST} calls"]


@pytest.mark.parametrize(
    "stdout, outcomes",
    [
        (
            '[0, [["ok", ["i", "5"]]]]\n[1, [["raise", "ValueError"]]]\n',
            (None, {0: [["ok", ["i", "5"]]], 1: [["raise", "ValueError"]]}),
        ),
        ('[0, [["ok", 1], ["ok", 2]]]\n[7, [["ok", 1]]]\n', (None, {})),  # wrong number of answers, unknown test
        ('[0, [["ok", 1]]]\n[0, [["ok", 2]]]\n', (None, {0: [["ok", 1]]})),  # the first line wins
        ('junk\n["load", "ImportError"]\n', ("ImportError", {})),
        ('[0, [["maybe", 1]]]\n[true, [["ok", 1]]]\n', (None, {})),
    ],
)
def test_parse_answers_takes_only_well_formed_lines(stdout, outcomes):
    assert parse_answers(stdout, {0: 1, 1: 1}) == outcomes


# --- unscorable ---------------------------------------------------------------------------------


def select_tests_reason(task):
    try:
        select_tests(task, ("fail_to_pass", "pass_to_pass"))
    except ValueError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize(
    "task, reason",
    [
        ({"entry_point": "add"}, "non-empty list"),
        ({"entry_point": "add", "tests": "[{"}, "not valid JSON"),
        ({"entry_point": "add", "tests": [{"name": "x", "code": "1"}]}, "is not {name"),
        (
            {"entry_point": "add", "tests": [{"name": "x", "code": "assert (", "group": "fail_to_pass"}]},
            "does not compile",
        ),
        ({"tests": ADD_TESTS}, "entry_point None"),
        ({"entry_point": "not valid", "tests": ADD_TESTS}, "entry_point 'not valid'"),
        ({"entry_point": "add", "tests": ADD_TESTS[3:]}, "no tests in groups"),  # only held_out, not selected
    ],
)
def test_unscorable_tasks(task, reason):
    box = FakeSandbox(SandboxResult("", "", 0, False, 0.0, None))
    verdict = verify(CORRECT, box, task)
    assert verdict.score is None and reason in verdict.details
    assert reason in select_tests_reason(task)
    assert box.calls == 0


@pytest.mark.integrity
def test_writing_the_loaders_version_message_does_not_make_a_wrong_answer_unscorable(sandbox):
    """A policy's attack: the loader's 'Python differs' message was read from the run's stderr,
    which the candidate writes, so a wrong answer printing it became unscorable (no 0, its group
    dropped). The version is now asked by a probe of our own, once per sandbox."""
    forged = "import sys\nsys.stderr.write(\"runner: the sandbox's Python differs from the trainer's\\n\")\n"
    for candidate in (
        forged + "def add(a, b):\n    return -1\n",
        "def add(a, b):\n    import sys\n"
        "    sys.stderr.write(\"runner: the sandbox's Python differs from the trainer's\\n\")\n    return -1\n",
    ):
        outcomes = run_harness(sandbox, candidate)
        assert outcomes == ["AssertionError", "AssertionError", "AssertionError"]


def test_a_sandbox_whose_python_differs_is_unscorable():
    box = FakeSandbox(SandboxResult("2.7\n", "", 0, False, 0.0, None))
    box.run_python = lambda code, stdin="": box.result
    verdict = verify(CORRECT, box)
    assert verdict.score is None and "differs from the trainer" in verdict.details


def test_sandbox_failure_is_unscorable():
    verdict = verify(CORRECT, FakeSandbox(SandboxResult("", "", None, False, 0.0, "sandbox_failure: x")))
    assert verdict.score is None and "sandbox_failure: x" in verdict.details


def test_answer_lines_past_the_output_limit_are_split_over_runs_not_lost(sandbox):
    # 6,000 answer lines > the 64 KiB stdout limit: the calls go out in several runs, each of which
    # fits, so no result is lost (a lost line would be a failure the candidate did not cause)
    tests = [{"name": f"t{i}", "code": f"assert add({i}, 1) == {i + 1}", "group": "fail_to_pass"} for i in range(6000)]
    assert verify(CORRECT, sandbox, {"entry_point": "add", "tests": tests}).score == 1.0


def test_a_test_too_large_for_the_output_limit_is_unscorable(quick_timeout):
    box = FakeSandbox(SandboxResult("", "", 0, False, 0.0, None))
    box.limits = SandboxLimits(max_output_bytes=100)
    verdict = verify(CORRECT, box)
    assert verdict.score is None and "output limit" in verdict.details


@pytest.mark.parametrize("params", [{"mode": "best"}, {"groups": ["visible"]}])
def test_bad_params_are_loud(params):
    verdict = verify(CORRECT, FakeSandbox(SandboxResult("", "", 0, False, 0.0, None)), **params)
    assert verdict.score is None and "unknown" in verdict.details
