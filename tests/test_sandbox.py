"""Tests for verifiers.sandbox: real isolation checks against a live bubblewrap pool."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap (`bwrap`) is not installed; the sandbox needs it",
                allow_module_level=True)

from verifiers.sandbox import (  # noqa: E402  (after the module-level skip)
    TRUNCATION_MARKER,
    BubblewrapSandbox,
    Sandbox,
    SandboxLimits,
    make_sandbox,
)
from verifiers.docker_sandbox import DockerSandbox  # noqa: E402

LIMITS = SandboxLimits(timeout_s=1.0, cpu_s=2, memory_mb=256, max_processes=8,
                       max_output_bytes=4096, max_file_mb=8)


@pytest.fixture(scope="module")
def sandbox():
    with BubblewrapSandbox(LIMITS, pool_size=2) as sb:
        yield sb


@pytest.fixture(scope="module")
def single():
    """One worker (so consecutive calls share it) with CPU limit < wall-clock limit.

    Started with a secret in the host environment, to check it does not leak.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_TEST_SECRET", "s3cr3t")
        sb = BubblewrapSandbox(SandboxLimits(timeout_s=4.0, cpu_s=1), pool_size=1)
    with sb:
        yield sb


def test_prints(sandbox):
    result = sandbox.run_python("print(6*7)")
    assert result.stdout == "42\n"
    assert result.ok and result.error is None and result.exit_code == 0
    assert isinstance(sandbox, Sandbox)


def test_stdin_is_passed(sandbox):
    result = sandbox.run_python("print(input()[::-1])", stdin="abc\n")
    assert result.ok and result.stdout == "cba\n"


@pytest.mark.parametrize("code, expected", [
    ("def f(:\n    pass", "SyntaxError"),
    ("raise ValueError('boom')", "ValueError: boom"),
])
def test_errors_are_reported(sandbox, code, expected):
    result = sandbox.run_python(code)
    assert result.exit_code == 1 and not result.ok
    assert result.error == "nonzero_exit"
    assert expected in result.stderr
    assert "Traceback" in result.stderr or "SyntaxError" in result.stderr


def test_exit_codes_follow_python_semantics(sandbox):
    assert sandbox.run_python("exit(3)").exit_code == 3
    assert sandbox.run_python("import sys; sys.exit()").ok


def test_runs_unprivileged(sandbox):
    code = ("import os\n"
            "caps = open('/proc/self/status').read().split('CapEff:')[1].split()[0]\n"
            "print(os.getuid(), os.getgid(), int(caps, 16))")
    uid, gid, caps = sandbox.run_python(code).stdout.split()
    assert int(uid) != 0 and int(gid) != 0
    assert caps == "0"


def test_no_network(sandbox):
    code = """
import socket
print([name for _, name in socket.if_nameindex()])
try:
    socket.create_connection(("1.1.1.1", 53), timeout=1)
    print("connected")
except OSError as exc:
    print("connect-failed", type(exc).__name__)
try:
    socket.getaddrinfo("pypi.org", 443)
    print("resolved")
except OSError as exc:
    print("resolve-failed", type(exc).__name__)
"""
    result = sandbox.run_python(code)
    assert result.ok, result.stderr
    interfaces, connect, resolve = result.stdout.splitlines()
    assert interfaces == "['lo']"  # a private network namespace: loopback only
    assert connect.startswith("connect-failed") and resolve.startswith("resolve-failed")


def test_no_writes_outside_scratch(sandbox):
    targets = ["/work/main/should_not_exist.txt", "/etc/x", "/root/should_not_exist.txt",
               "/usr/should_not_exist.txt", "/tmp/outside_scratch.txt"]
    preexisting = {t for t in targets if os.path.exists(t)}
    code = f"""
for path in {targets!r}:
    try:
        with open(path, "w") as fh:
            fh.write("x")
        print("WROTE", path)
    except OSError as exc:
        print("DENIED", path, type(exc).__name__)
"""
    result = sandbox.run_python(code)
    assert result.ok, result.stderr
    assert "WROTE" not in result.stdout
    assert result.stdout.count("DENIED") == len(targets)
    for target in set(targets) - preexisting:
        assert not os.path.exists(target), f"{target} leaked onto the host"


def test_scratch_is_writable_but_not_shared_between_calls(single):
    write = single.run_python(
        "import os\nopen('state.txt', 'w').write('hello')\n"
        "print(open('state.txt').read(), os.getcwd() == os.environ['HOME'])")
    assert write.ok, write.stderr
    assert write.stdout == "hello True\n"
    for _ in range(2):  # the same (only) worker serves these calls
        check = single.run_python("import os; print(os.listdir('.'))")
        assert check.ok and check.stdout == "[]\n"


def test_host_secrets_are_hidden(single):
    result = single.run_python("import os; print('FLYWHEEL_TEST_SECRET' in os.environ)")
    assert result.stdout == "False\n"
    here = str(Path(__file__).resolve())
    if not any(here.startswith(p + "/") for p in ("/work", "/home", "/root")):
        pytest.skip(f"{here} is not under a masked directory")
    result = single.run_python(f"import os; print(os.path.exists({here!r}))")
    assert result.stdout == "False\n"  # the repo (answer keys, data) is not readable


@pytest.mark.parametrize("code", ["while True:\n    pass", "import time; time.sleep(30)"])
def test_wall_clock_timeout(sandbox, code):
    start = time.monotonic()
    result = sandbox.run_python("print('started', flush=True)\n" + code)
    elapsed = time.monotonic() - start
    assert result.timed_out and not result.ok
    assert result.error == "timeout" and result.exit_code is None
    assert elapsed < LIMITS.timeout_s + 1.0
    assert result.stdout == "started\n"  # output produced before the kill is kept


def test_cpu_limit(single):
    result = single.run_python("while True:\n    pass")
    # The 4 s wall clock would report "timeout"; RLIMIT_CPU (1 s) must fire first.
    assert result.timed_out and result.error == "cpu_limit"
    assert result.exit_code == -signal.SIGXCPU


def test_memory_limit(sandbox):
    result = sandbox.run_python("x = bytearray(1024**3)")
    assert result.error == "memory"
    assert result.exit_code == 1 and "MemoryError" in result.stderr


def test_process_limit(sandbox):
    code = """
import os, time
made = 0
try:
    for _ in range(64):
        if os.fork() == 0:
            time.sleep(10)
            os._exit(0)
        made += 1
except OSError as exc:
    print("blocked", type(exc).__name__, made)
"""
    result = sandbox.run_python(code)
    assert result.ok, result.stderr
    word, exc_name, made = result.stdout.split()
    assert word == "blocked" and exc_name == "BlockingIOError"
    assert int(made) <= LIMITS.max_processes - 1
    # The sleeping children were killed and reaped: forking works again at once.
    for _ in range(2):
        after = sandbox.run_python(
            "import os\nfor _ in range(3):\n    pid = os.fork()\n"
            "    if pid == 0: os._exit(0)\n    os.waitpid(pid, 0)\nprint('ok')")
        assert after.ok and after.stdout == "ok\n", after.stderr


def test_escaped_background_process_is_killed(single):
    spawn = single.run_python(
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nprint('spawned')")
    assert spawn.ok and spawn.stdout == "spawned\n"
    # Same worker and PID namespace: only bwrap (1), the worker (2) and we may exist.
    result = single.run_python(
        "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    pids = eval(result.stdout)
    assert pids[:2] == [1, 2] and len(pids) == 3, pids


def test_output_truncation(sandbox):
    result = sandbox.run_python(
        "import sys\nprint('x' * 1_000_000)\nsys.stderr.write('e' * 100_000)")
    assert result.ok
    for stream in (result.stdout, result.stderr):
        assert len(stream.encode()) <= LIMITS.max_output_bytes + len(TRUNCATION_MARKER)
        assert stream.endswith(TRUNCATION_MARKER)
    utf8 = sandbox.run_python("print('\\u00e9' * 10_000)")  # 2-byte characters
    assert "\ufffd" not in utf8.stdout  # never cut inside a character


def test_run_many_preserves_order(sandbox):
    codes = []
    for i in range(50):
        if i % 5 == 0:
            codes.append(f"raise RuntimeError('e{i}')")
        elif i % 5 == 1:
            codes.append(f"import sys; print({i}); sys.exit(2)")
        else:
            codes.append(f"print({i} * 2)")
    results = sandbox.run_many(codes)
    assert len(results) == 50
    for i, result in enumerate(results):
        if i % 5 == 0:
            assert result.error == "nonzero_exit" and f"e{i}" in result.stderr
        elif i % 5 == 1:
            assert result.exit_code == 2 and result.stdout == f"{i}\n"
        else:
            assert result.ok and result.stdout == f"{i * 2}\n"


def test_state_isolation(sandbox):
    leak = sandbox.run_python(
        "import builtins, json, sys\nbuiltins.LEAK = 1\njson.LEAK = 1\n"
        "sys.path.append('/leak')\nGLOBAL_X = 5\nprint('set')")
    assert leak.stdout == "set\n"
    check = ("import builtins, json, sys\n"
             "print(hasattr(builtins, 'LEAK'), hasattr(json, 'LEAK'), "
             "'/leak' in sys.path, 'GLOBAL_X' in globals())")
    for result in sandbox.run_many([check] * 4):  # covers both workers
        assert result.stdout == "False False False False\n"


def test_throughput(sandbox):
    start = time.monotonic()
    results = sandbox.run_many(["print(1)"] * 100)
    elapsed = time.monotonic() - start
    assert all(r.ok for r in results)
    print(f"\nsandbox throughput: {100 / elapsed:.0f} calls/s over 2 workers")


def test_killed_worker_is_replaced(single):
    [old_pid] = single.worker_pids()
    os.kill(old_pid, signal.SIGKILL)
    first = single.run_python("print('alive')")
    assert first.ok or first.error.startswith("sandbox_failure"), first
    second = single.run_python("print('alive')")
    assert second.ok and second.stdout == "alive\n"
    assert single.worker_pids() != [old_pid]


@pytest.mark.parametrize("field, value", [
    ("timeout_s", 0), ("timeout_s", float("nan")), ("cpu_s", 0), ("cpu_s", 1.5),
    ("memory_mb", 1), ("max_processes", 0), ("max_output_bytes", 0), ("max_file_mb", True),
])
def test_limits_validation_names_the_field(field, value):
    with pytest.raises(ValueError) as info:
        SandboxLimits(**{field: value})
    assert field in str(info.value) and repr(value) in str(info.value)


def test_make_sandbox_rejects_unknown_kind():
    with pytest.raises(ValueError, match="'nope'") as info:
        make_sandbox("nope", LIMITS)
    assert "bubblewrap" in str(info.value) and "docker" in str(info.value)


def test_make_sandbox_builds_bubblewrap():
    with make_sandbox("bubblewrap", LIMITS, pool_size=1) as sb:
        assert isinstance(sb, BubblewrapSandbox)
        assert sb.run_python("print('hi')").stdout == "hi\n"


@pytest.mark.parametrize("binary", ["/nonexistent/bwrap", "/bin/false"])
def test_bad_bwrap_binary_raises_clear_error(binary):
    with pytest.raises(RuntimeError, match=binary):
        BubblewrapSandbox(LIMITS, pool_size=1, bwrap_path=binary)


def _docker_engine_reachable() -> bool:
    docker = pytest.importorskip("docker")
    try:
        docker.from_env().ping()
        return True
    except Exception:
        return False


def test_docker_sandbox_without_engine_raises():
    if _docker_engine_reachable():
        pytest.skip("a Docker engine is reachable here")
    with pytest.raises(RuntimeError, match="Docker engine not reachable"):
        DockerSandbox(LIMITS)
    with pytest.raises(RuntimeError, match="Docker engine not reachable"):
        make_sandbox("docker", LIMITS)


def test_docker_sandbox_runs_code():
    if not _docker_engine_reachable():
        pytest.skip("no Docker engine reachable")
    with DockerSandbox(LIMITS) as sb:
        result = sb.run_python("print(6*7)")
        assert result.stdout == "42\n" and result.ok
        assert sb.run_python("import time; time.sleep(30)").timed_out
