"""A wrong code answer cannot escape its 0 by making itself unscorable, and a task file's test code
never runs on the host (security review, items 1 and 2). Each case fails on 626e6b6: there the
reproduction scored None (RecursionError / output overflow) and the marker file was written."""

from __future__ import annotations

import os
import shutil

import pytest

if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap (`bwrap`) is not installed; the sandbox needs it", allow_module_level=True)

import verifiers.code_tests  # noqa: E402, F401  (registers unit_tests)
from verifiers.base import run_verifier  # noqa: E402
from verifiers.code_runner import CANDIDATE_FAULT, parse_answers, run_tests  # noqa: E402
from verifiers.code_tests import CodeTest  # noqa: E402
from verifiers.sandbox import DEFAULT_UID_BASE, BubblewrapSandbox, SandboxLimits, SandboxResult  # noqa: E402

pytestmark = pytest.mark.integrity

TASK = {"entry_point": "f", "tests": [{"name": "t", "code": "assert f(4) == 200", "group": "fail_to_pass"}]}
REPRODUCTION = """import typing
class A:
    x: "open(3, 'w', closefd=False).write('[' * 1200 + ']' * 1200 + chr(10))"
try:
    typing.get_type_hints(A)
except Exception:
    pass
def f(x):
    return 0
"""


@pytest.fixture(scope="module")
def box():
    uid_base = DEFAULT_UID_BASE + 9_000_000 + os.getpid() % 100_000 * 4
    with BubblewrapSandbox(SandboxLimits(), pool_size=2, uid_base=uid_base) as sandbox:
        yield sandbox


@pytest.mark.parametrize("payload", ["'[' * 1200 + ']' * 1200 + chr(10)", "'x' * 70000"])
def test_the_reported_reproduction_scores_zero_not_unscorable(box, payload):
    candidate = REPRODUCTION.replace("'[' * 1200 + ']' * 1200 + chr(10)", payload)
    verdict = run_verifier("unit_tests", candidate, TASK, {}, sandbox=box)
    assert verdict.score == 0.0, verdict


# With the in-sandbox guards off (allowed_imports=None) the candidate has all of Python: the pipe
# to the runner is what holds.
_WRITE_EVERYWHERE = """import os
for fd in range(1, 12):
    try:
        os.write(fd, (PAYLOAD).encode())
    except OSError:
        pass
"""
_PAYLOADS = [
    "'[' * 1200 + ']' * 1200 + chr(10)",
    "'x' * 70000",
    '\'[0, [["ok", ["i", "-1"]]]]\' + chr(10)',  # forged, but wrong: as if f returned -1
    '(\'[0, [["ok", ["i", "-1"]]]]\' + chr(10)) * 5000',
    '\'["fault", "x"]\' + chr(10) + \'["load", "PASS"]\' + chr(10)',
]


@pytest.mark.parametrize("payload", _PAYLOADS)
@pytest.mark.parametrize("where", ["load", "call"])
def test_writing_on_any_fd_is_a_zero_never_unscorable(box, payload, where):
    attack = _WRITE_EVERYWHERE.replace("PAYLOAD", payload)
    if where == "load":
        candidate = attack + "def f(x):\n    return 0\n"
    else:
        candidate = "def f(x):\n" + "".join("    " + line + "\n" for line in attack.splitlines()) + "    return 0\n"
    outcomes, run_error = run_tests(candidate, [CodeTest("t", "assert f(4) == 200", "fail_to_pass")], "f", box, None)
    assert outcomes[0] is not True, (outcomes, run_error)


def test_the_runner_is_out_of_the_candidates_reach(box):
    """Not through /proc/<ppid>/fd (the runner is not dumpable), nor any fd it holds."""
    candidate = (
        "import os\nGOT = []\n"
        "for path in ['/proc/%d/fd/%d' % (os.getppid(), n) for n in range(8)] + ['/proc/%d/mem' % os.getppid()]:\n"
        "    try:\n        open(path, 'wb').close()\n        GOT.append(path)\n    except OSError:\n        pass\n"
        "for fd in (0, 1, 2):\n    if os.path.realpath('/proc/self/fd/%d' % fd) != '/dev/null':\n        GOT.append(fd)\n"
        "def f(x):\n    return GOT\n"
    )
    outcomes, _ = run_tests(candidate, [CodeTest("t", "assert f(0) == []", "fail_to_pass")], "f", box, None)
    assert outcomes == [True]


def test_the_answer_stream_is_parsed_bounded():
    for stdout in ["[" * 100_000 + "\n", '[0, [["ok", ' + "[" * 5000 + "]" * 5000 + "]]]\n", "x" * 10**6]:
        assert parse_answers(stdout, {0: 1}) == (None, {})


class _Flaky:
    """The infrastructure only: fails every run whose program `fails` picks, as the sandbox would."""

    def __init__(self, inner, fails):
        self.inner, self.fails, self.limits = inner, fails, inner.limits

    def run_python(self, code, *, stdin=""):
        if self.fails(code):
            return SandboxResult("", "", None, False, 0.0, "sandbox_failure: worker died: EOFError()")
        return self.inner.run_python(code, stdin=stdin)


def test_a_sandbox_failure_only_the_candidate_meets_is_its_zero(box):
    """A control program runs fine on the same sandbox: the failure is the candidate's."""
    flaky = _Flaky(box, lambda code: "MARKER_7c1" in code)
    verdict = run_verifier("unit_tests", "def f(x):\n    return 'MARKER_7c1'\n", TASK, {}, sandbox=flaky)
    assert verdict.score == 0.0 and verdict.candidate_fault and CANDIDATE_FAULT in verdict.details


def test_a_sandbox_that_fails_a_control_program_too_is_unscorable(box):
    verdict = run_verifier("unit_tests", "def f(x):\n    return 0\n", TASK, {}, sandbox=_Flaky(box, lambda code: True))
    assert verdict.score is None and "sandbox_failure" in verdict.details


def test_a_right_answer_still_scores_through_both_runs(box):
    assert run_verifier("unit_tests", "def f(x):\n    return x * 50\n", TASK, {}, sandbox=box).score == 1.0


# --- item 2: test code from a task file runs in the sandbox, never on the host -------------------


def test_task_file_test_code_never_runs_on_the_host(box, tmp_path):
    marker, secret = tmp_path / "marker.json", tmp_path / "secret.txt"
    secret.write_text("the host's")
    test = (
        "import os, json\n"
        "try:\n"
        f"    json.dump({{'uid': os.getuid(), 'home': os.listdir(os.path.expanduser('~')), 'env': sorted(os.environ)}},"
        f" open({str(marker)!r}, 'w'))\n"
        "except OSError:\n    pass\n"
        f"assert os.getuid() != {os.getuid()} and not os.path.exists({str(secret)!r})\n"
        "assert f(2) == 4\n"
    )
    task = {"entry_point": "f", "tests": [{"name": "evil", "code": test, "group": "fail_to_pass"}]}
    verdict = run_verifier("unit_tests", "def f(x):\n    return x * 2\n", task, {}, sandbox=box)
    assert not marker.exists()
    assert verdict.score == 1.0, verdict  # it ran, as the sandbox's uid, seeing none of the host's files


def test_replayed_tests_keep_humaneval_features(box):
    """Imports, seeded random, helpers and loops of many calls, all in the sandbox."""
    test = (
        "import math, random\n"
        "def helper(v):\n    return v * 2\n"
        "def check(candidate):\n"
        "    for _ in range(20):\n"
        "        x = random.randint(0, 100)\n"
        "        assert candidate(x) == helper(x) and math.isfinite(candidate(x))\n"
        "check(f)\n"
    )
    task = {"entry_point": "f", "tests": [{"name": "check", "code": test, "group": "fail_to_pass"}]}
    assert run_verifier("unit_tests", "def f(x):\n    return 2 * x\n", task, {}, sandbox=box).score == 1.0
    assert (
        run_verifier("unit_tests", "def f(x):\n    return 2 * x if x < 50 else 0\n", task, {}, sandbox=box).score == 0.0
    )


def test_junk_a_test_writes_on_a_wrong_answer_is_that_answers_zero(box):
    """The test's code is the task's; what it writes (here, on a wrong answer) is parsed bounded, and
    a replay that breaks on the candidate's answers is the candidate's 0, not unscorable."""
    test = (
        "import os\nif f(1) != 2:\n    for fd in range(1, 12):\n        try:\n"
        "            os.write(fd, b'[' * 2000 + b'\\n' + b'x' * 70000)\n        except OSError:\n            pass\n"
        "assert f(1) == 2\n"
    )
    task = {"entry_point": "f", "tests": [{"name": "t", "code": test, "group": "fail_to_pass"}]}
    assert run_verifier("unit_tests", "def f(x):\n    return 0\n", task, {}, sandbox=box).score == 0.0
    assert run_verifier("unit_tests", "def f(x):\n    return 2 * x\n", task, {}, sandbox=box).score == 1.0
