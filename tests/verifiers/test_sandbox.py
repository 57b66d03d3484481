"""Tests for verifiers.sandbox: real isolation checks against a live bubblewrap pool."""

from __future__ import annotations

import errno
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap (`bwrap`) is not installed; the sandbox needs it", allow_module_level=True)

from verifiers.docker_sandbox import DockerSandbox  # noqa: E402
from verifiers.sandbox import (  # noqa: E402  (after the module-level skip)
    DEFAULT_UID_BASE,
    SANDBOX_ENV,
    TRUNCATION_MARKER,
    BubblewrapSandbox,
    Sandbox,
    SandboxLimits,
    _seccomp_program,
)
from verifiers.sandboxes import make_sandbox  # noqa: E402

LIMITS = SandboxLimits(timeout_s=1.0, cpu_s=2, memory_mb=256, max_processes=8, max_output_bytes=4096, max_file_mb=8)
# Every pool here runs as uids of its own, not shared with other sandboxes on this host
# (another test run, the pipeline): host-side process counts are then exact, and
# RLIMIT_NPROC, which counts per uid system-wide, is not shared either.
_uid_bases = itertools.count(DEFAULT_UID_BASE + 1_000_000 + os.getpid() % 100_000 * 100, 4)


def pool(limits: SandboxLimits, pool_size: int) -> BubblewrapSandbox:
    return BubblewrapSandbox(limits, pool_size, uid_base=next(_uid_bases))


def host_pids(uids) -> list[int]:
    """Host pids of processes whose real uid is in `uids` (from world-readable /proc/*/status)."""
    wanted, found = {str(uid) for uid in uids}, []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/status") as fh:
                uid_line = next(line for line in fh if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue  # not a pid, or exited meanwhile
        if uid_line.split()[1] in wanted:
            found.append(int(name))
    return found


@pytest.fixture(scope="module")
def sandbox():
    with pool(LIMITS, pool_size=2) as sb:
        yield sb


@pytest.fixture(scope="module")
def single():
    """One worker (so consecutive calls share it) with CPU limit < wall-clock limit."""
    with pool(SandboxLimits(timeout_s=4.0, cpu_s=1), pool_size=1) as sb:
        yield sb


@pytest.fixture(scope="module")
def hostile():
    """A pool of its own for attacks that would damage the pool (not the host) if they worked."""
    # A long wall clock, so that CPU limits fire first even on a loaded machine.
    with pool(SandboxLimits(timeout_s=10.0, cpu_s=1, max_processes=8), pool_size=1) as sb:
        yield sb


def test_prints(sandbox):
    result = sandbox.run_python("print(6*7)")
    assert result.stdout == "42\n"
    assert result.ok and result.error is None and result.exit_code == 0
    assert isinstance(sandbox, Sandbox)


def test_stdin_is_passed(sandbox):
    result = sandbox.run_python("print(input()[::-1])", stdin="abc\n")
    assert result.ok and result.stdout == "cba\n"


@pytest.mark.parametrize(
    "code, expected",
    [
        ("def f(:\n    pass", "SyntaxError"),
        ("raise ValueError('boom')", "ValueError: boom"),
    ],
)
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
    code = (
        "import os\n"
        "caps = open('/proc/self/status').read().split('CapEff:')[1].split()[0]\n"
        "print(os.getuid(), os.getgid(), int(caps, 16))"
    )
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
    """An allowlisted, read-only view of the host and a private /tmp: nothing outside scratch is writable.

    The target is a world-writable file and directory we create on the host: /var is not in the
    sandbox's view at all (ENOENT), and what is bound (/usr) is read-only (EROFS); a missing
    defense costs a temp file.
    """
    if not os.path.isdir("/var/tmp"):
        pytest.skip("no host /var/tmp to place a victim file in")
    victim_dir = Path(tempfile.mkdtemp(prefix="sandbox-victim-", dir="/var/tmp"))
    try:
        victim = victim_dir / "victim.txt"
        victim.write_text("original")
        victim_dir.chmod(0o777)
        victim.chmod(0o666)
        code = f"""
import os
for path in ({str(victim)!r}, {str(victim_dir / "new.txt")!r}, "/tmp/outside_scratch.txt", "/usr/probe.txt", "/x"):
    try:
        with open(path, "w") as fh:
            fh.write("x")
        print("WROTE", path)
    except OSError as exc:
        print("DENIED", os.path.basename(path), exc.errno)
"""
        result = sandbox.run_python(code)
        assert result.ok, result.stderr
        # the private /tmp is root's
        assert result.stdout.splitlines() == [
            f"DENIED victim.txt {errno.ENOENT}",
            f"DENIED new.txt {errno.ENOENT}",
            f"DENIED outside_scratch.txt {errno.EACCES}",
            f"DENIED probe.txt {errno.EROFS}",
            f"DENIED x {errno.EROFS}",
        ]
        assert victim.read_text() == "original"
        assert sorted(p.name for p in victim_dir.iterdir()) == ["victim.txt"]
    finally:
        shutil.rmtree(victim_dir)


def test_scratch_is_writable_but_not_shared_between_calls(single):
    write = single.run_python(
        "import os\nopen('state.txt', 'w').write('hello')\n"
        "print(open('state.txt').read(), os.getcwd() == os.environ['HOME'])"
    )
    assert write.ok, write.stderr
    assert write.stdout == "hello True\n"
    for _ in range(2):  # the same (only) worker serves these calls
        check = single.run_python("import os; print(os.listdir('.'))")
        assert check.ok and check.stdout == "[]\n"


def test_host_files_are_not_readable(sandbox, tmp_path):
    """An allowlisted view, a private /tmp, and the uid drop (no CAP_DAC_OVERRIDE) keep host files out.

    The repo (answer keys, data), /root and /home (credentials), /run (sockets) are not mounted
    (but for the path to the interpreter); /etc holds only what programs need, not /etc/shadow.
    """
    answer_key = tmp_path / "answer_key.txt"  # the host's /tmp: not the sandbox's
    answer_key.write_text("42")
    repo_file = str(Path(__file__).resolve())
    masked = [
        p
        for p in ("/root", "/home", "/work", "/run", "/mnt", "/srv", "/media")
        if os.path.isdir(p) and not os.path.islink(p)
    ]
    code = f"""
import os
for path in ("/etc/shadow", {str(answer_key)!r}, {repo_file!r}, "/proc/1/root/etc/passwd"):
    try:
        open(path, "rb").read()
        print("READ", path)
    except OSError as exc:
        print(type(exc).__name__, path)
print({{p: sorted(os.listdir(p)) if os.path.isdir(p) else None for p in {masked!r}}})
"""
    result = sandbox.run_python(code)
    assert result.ok, result.stderr
    *reads, listings = result.stdout.splitlines()
    expected = ["FileNotFoundError /etc/shadow", f"FileNotFoundError {answer_key}", f"FileNotFoundError {repo_file}"]
    expected.append("PermissionError /proc/1/root/etc/passwd")  # bwrap's root: not ours to enter
    assert reads == expected
    # Absent but for the path to the interpreter, bound read-only.
    interpreter = {
        os.path.realpath(sys.base_prefix),
        os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
    }
    inside = {
        p: sorted({os.path.relpath(x, p).split("/")[0] for x in interpreter if x.startswith(p + "/")}) for p in masked
    }
    assert eval(listings) == {p: names or None for p, names in inside.items()}


def test_host_environment_does_not_leak(monkeypatch):
    """bwrap and the workers start with SANDBOX_ENV, not the training process's environment.

    Secrets in os.environ at pool creation must not reach os.environ of the code, nor
    /proc/*/environ of anything it can see (a process it execs may read its own).
    """
    secrets = {"FLYWHEEL_TEST_SECRET": "s3cr3t-flywheel", "AWS_SECRET_ACCESS_KEY": "s3cr3t-aws"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    code = """
import json, os, subprocess
print(json.dumps(dict(os.environ)))
for path in ("/proc/self/environ", "/proc/1/environ", "/proc/2/environ"):
    try:
        print(path, open(path, "rb").read())
    except OSError as exc:
        print(path, type(exc).__name__)
print(subprocess.run(["cat", "/proc/self/environ"], capture_output=True).stdout)
"""
    with pool(LIMITS, pool_size=1) as fresh:
        result = fresh.run_python(code)
    assert result.ok, result.stderr
    env, *procs, exec_env = result.stdout.splitlines()
    assert json.loads(env) == SANDBOX_ENV
    # After setuid the child is not dumpable; bwrap (1) and the worker (2) are root's.
    assert procs == [f"{p} PermissionError" for p in ("/proc/self/environ", "/proc/1/environ", "/proc/2/environ")]
    assert "PATH=" in exec_env  # the exec'd process did read its environment
    for name, value in secrets.items():
        assert value not in result.stdout + result.stderr
        assert name not in result.stdout + result.stderr


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
            "    if pid == 0: os._exit(0)\n    os.waitpid(pid, 0)\nprint('ok')"
        )
        assert after.ok and after.stdout == "ok\n", after.stderr


def test_escaped_background_process_is_killed(single):
    spawn = single.run_python(
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nprint('spawned')"
    )
    assert spawn.ok and spawn.stdout == "spawned\n"
    # Same worker and PID namespace: only bwrap (1), the worker (2) and we may exist.
    result = single.run_python("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    pids = eval(result.stdout)
    assert pids[:2] == [1, 2] and len(pids) == 3, pids


def test_ignored_sigxcpu_still_dies_at_the_cpu_hard_limit(hostile):
    """RLIMIT_CPU's hard limit (cpu_s + 1) ends in SIGKILL, which no handler can ignore.

    Ignoring and blocking SIGXCPU (the soft-limit warning) buys one more CPU second, no more:
    the call ends inside the 10 s wall clock.
    """
    code = (
        "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGXCPU})\nwhile True:\n    pass"
    )
    result = hostile.run_python(code)
    assert result.error == "cpu_limit" and result.timed_out
    assert result.exit_code == -signal.SIGKILL
    assert result.duration_s < hostile.limits.timeout_s
    assert host_pids(hostile.uids) == []


def test_ignored_signals_still_die_at_the_wall_clock(sandbox):
    """The wall clock is enforced with SIGKILL to everything in the PID namespace.

    Code (and a grandchild in its own session) that ignores or blocks every catchable
    signal and sleeps, so that the CPU limit never fires, is still gone at timeout_s.
    """
    code = """
import os, signal, time
for sig in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU,
            signal.SIGUSR1, signal.SIGCHLD, signal.SIGPIPE):
    signal.signal(sig, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP})
if os.fork() == 0:
    os.setsid()
print("ignoring", flush=True)
time.sleep(30)
"""
    start = time.monotonic()
    result = sandbox.run_python(code)
    assert result.error == "timeout" and result.exit_code is None
    assert time.monotonic() - start < LIMITS.timeout_s + 1.0
    assert result.stdout.startswith("ignoring\n")
    assert host_pids(sandbox.uids) == []


def test_kill_attempts_on_worker_and_init_are_refused(hostile):
    """The uid drop leaves no CAP_KILL; kill(-1) only reaches the sandbox's PID namespace.

    kill(-1) is only sent after the same child has checked it is in the sandbox's own
    PID namespace (bwrap is its pid 1, the worker its parent at pid 2). A host process
    running as the sandbox uid, which a kill(-1) outside that namespace would reach,
    must survive, and the pool must serve the next call from the same worker.
    """
    code = """
import os, signal
init = open("/proc/1/cmdline", "rb").read().split(b"\\0")[0]
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
own_namespace = os.getppid() == 2 and init.endswith(b"/bwrap") and pids == [1, 2, os.getpid()]
print("own-pid-namespace", own_namespace, flush=True)
for pid in (os.getppid(), 2, 1):
    for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGSTOP):
        try:
            os.kill(pid, sig)
            print("SENT", pid, sig.name)
        except PermissionError:
            print("EPERM", pid, sig.name)
if own_namespace:
    os.kill(-1, signal.SIGKILL)
    print("kill(-1) returned")
"""
    workers = hostile.worker_pids()
    bystander = subprocess.Popen(["sleep", "30"], user=hostile.uids[0])  # sandbox uid, host side
    try:
        result = hostile.run_python(code)
        assert result.ok, result.stderr
        namespace, *lines = result.stdout.splitlines()
        assert lines[:9] == [f"EPERM {pid} {sig}" for pid in (2, 2, 1) for sig in ("SIGTERM", "SIGKILL", "SIGSTOP")]
        if namespace != "own-pid-namespace True":
            pytest.skip(f"not in the sandbox's own PID namespace ({namespace}): kill(-1) not tried")
        assert lines[9:] == ["kill(-1) returned"]
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
    assert hostile.worker_pids() == workers
    after = hostile.run_python("print('next')")
    assert after.ok and after.stdout == "next\n"


def test_proc_shows_only_the_sandbox(sandbox):
    """The private PID namespace with its own /proc, and the uid drop (ptrace access checks).

    /proc lists bwrap (1), the worker (2) and the code itself -- no host process -- and the
    environment, memory, maps, fds, cwd and root of bwrap and the worker are not readable.
    """
    code = """
import json, os
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print(json.dumps({p: open(f"/proc/{p}/cmdline", "rb").read().split(b"\\0")[0].decode()
                  for p in pids}))
for pid in (1, 2):
    for entry in ("environ", "mem", "maps", "stack", "fd", "cwd", "root", "exe"):
        path = f"/proc/{pid}/{entry}"
        try:
            if entry in ("fd",):
                os.listdir(path)
            elif entry in ("cwd", "root", "exe"):
                os.readlink(path)
            else:
                open(path, "rb").read(64)
            print("READ", path)
        except PermissionError:
            print("EACCES", path)
"""
    result = sandbox.run_python(code)
    assert result.ok, result.stderr
    listing, *reads = result.stdout.splitlines()
    cmdlines = {int(pid): argv0 for pid, argv0 in json.loads(listing).items()}
    assert sorted(cmdlines)[:2] == [1, 2] and len(cmdlines) == 3, cmdlines  # 1, 2 and us
    assert os.path.basename(cmdlines[1]) == "bwrap"
    assert cmdlines[2] == os.path.realpath(sys.executable)  # the worker interpreter
    assert reads == [
        f"EACCES /proc/{pid}/{entry}"
        for pid in (1, 2)
        for entry in ("environ", "mem", "maps", "stack", "fd", "cwd", "root", "exe")
    ]


def test_subprocesses_are_contained_and_do_not_outlive_the_call(hostile):
    """subprocess/os.system work within RLIMIT_NPROC; kill(-1) + reaping ends grandchildren.

    A daemonised grandchild (own session, double fork) and a Popen'd `sleep` must be gone
    from the host when the call returns, which it does as soon as the code itself exits.
    """
    code = """
import os, subprocess
print(subprocess.run(["sh", "-c", "echo hi"], capture_output=True, text=True).stdout.strip())
print("system", os.system("true"))
subprocess.Popen(["sleep", "30"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "30"])
    os._exit(0)
print("spawned")
"""
    result = hostile.run_python(code)
    assert result.ok, result.stderr
    assert result.stdout == "hi\nsystem 0\nspawned\n"
    assert result.duration_s < 2.0  # did not wait for the sleeps (nor the 10 s wall clock)
    assert host_pids(hostile.uids) == []


def test_fork_bomb_is_contained_by_the_process_limit(sandbox):
    """RLIMIT_NPROC (per sandbox uid) caps the processes; the wall clock then ends them all.

    The bomb doubles six times, so even with no limit at all it makes at most 64 processes
    (a missing defense fails the count, it does not take the host down). The host-side
    count of the sandbox uids' processes is sampled while it runs.
    """
    code = """
import os, time
for _ in range(6):
    try:
        os.fork()
    except OSError:
        pass
time.sleep(30)
"""
    peak = 0
    with ThreadPoolExecutor(1) as executor:
        call = executor.submit(sandbox.run_python, code)
        while not call.done():
            peak = max(peak, len(host_pids(sandbox.uids)))
            time.sleep(0.02)
        result = call.result()
    assert result.error == "timeout"
    assert result.duration_s < LIMITS.timeout_s + 1.0
    assert 1 < peak <= LIMITS.max_processes
    assert host_pids(sandbox.uids) == []
    after = sandbox.run_many(
        ["import os\npid = os.fork()\nif pid == 0: os._exit(0)\nos.waitpid(pid, 0)\nprint('ok')"] * 2
    )
    assert [r.stdout for r in after] == ["ok\n", "ok\n"]  # the uid's process count was reset


def test_ctypes_breakout_attempts_fail(hostile):
    """No capabilities after the uid drop, no_new_privs, and the seccomp filter.

    Straight libc calls to regain root, enter or create namespaces (a new user namespace
    would hand out every capability inside it), mount over the masks, or raise the rlimits
    all return -1 with EPERM, and the process stays unprivileged.
    """
    code = """
import ctypes, os, resource
libc = ctypes.CDLL(None, use_errno=True)
class RLimit(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_ulong), ("max", ctypes.c_ulong)]
def attempt(name, call):
    ctypes.set_errno(0)
    ret = call()
    if ret == 0 and name == "clone(CLONE_NEWUSER)":
        os._exit(0)  # the clone child, if it ever exists
    print(name, ret, os.strerror(ctypes.get_errno()))
os.mkdir("m")
mnt_ns = os.open("/proc/self/ns/mnt", os.O_RDONLY)
attempt("setuid(0)", lambda: libc.setuid(0))
attempt("setgid(0)", lambda: libc.setgid(0))
attempt("setgroups", lambda: libc.setgroups(1, ctypes.byref(ctypes.c_uint(0))))
attempt("unshare(CLONE_NEWUSER)", lambda: libc.unshare(0x10000000))
attempt("unshare(CLONE_NEWNS)", lambda: libc.unshare(0x00020000))
attempt("clone(CLONE_NEWUSER)", lambda: libc.syscall(56 if os.uname().machine == "x86_64" else 220,
                                                     0x10000000 | 17, 0, 0, 0, 0))
attempt("setns(mnt)", lambda: libc.setns(mnt_ns, 0x00020000))
attempt("mount(tmpfs)", lambda: libc.mount(b"none", b"/tmp/scratch/m", b"tmpfs", 0, None))
attempt("umount2(/root)", lambda: libc.umount2(b"/root", 2))
attempt("chroot", lambda: libc.chroot(b"/tmp/scratch"))
def limit(n):
    return ctypes.byref(RLimit(n, n))
attempt("setrlimit(NPROC up)", lambda: libc.setrlimit(resource.RLIMIT_NPROC, limit(4096)))
attempt("setrlimit(CPU up)", lambda: libc.setrlimit(resource.RLIMIT_CPU, limit(3600)))
attempt("prlimit(worker)", lambda: libc.prlimit(2, resource.RLIMIT_CORE, limit(0), None))
attempt("prctl(CAP_AMBIENT_RAISE)", lambda: libc.prctl(47, 2, 7, 0, 0))
attempt("prctl(SET_SECUREBITS)", lambda: libc.prctl(28, 0x2F, 0, 0, 0))
attempt("prctl(CAPBSET_DROP)", lambda: libc.prctl(24, 7, 0, 0, 0))
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print("ids", *os.getresuid(), *os.getresgid(), os.getgroups())
print("caps", *(int(status[k], 16) for k in ("CapEff", "CapPrm", "CapAmb")))
print("nnp", status["NoNewPrivs"].strip(), "seccomp", status["Seccomp"].strip())
"""
    result = hostile.run_python(code)
    assert result.ok, result.stderr
    *attempts, ids, caps, nnp = result.stdout.splitlines()
    names = [
        "setuid(0)",
        "setgid(0)",
        "setgroups",
        "unshare(CLONE_NEWUSER)",
        "unshare(CLONE_NEWNS)",
        "clone(CLONE_NEWUSER)",
        "setns(mnt)",
        "mount(tmpfs)",
        "umount2(/root)",
        "chroot",
        "setrlimit(NPROC up)",
        "setrlimit(CPU up)",
        "prlimit(worker)",
        "prctl(CAP_AMBIENT_RAISE)",
        "prctl(SET_SECUREBITS)",
        "prctl(CAPBSET_DROP)",
    ]
    assert attempts == [f"{name} -1 {os.strerror(errno.EPERM)}" for name in names]
    uid = hostile.uids[0]
    assert ids == f"ids {uid} {uid} {uid} {uid} {uid} {uid} []"
    assert caps == "caps 0 0 0"
    assert nnp == "nnp 1 seccomp 2"
    after = hostile.run_python("import os; print(os.listdir('/root'), os.getuid())")
    assert after.ok and after.stdout.split()[-1] == str(uid)  # the pool is intact


def test_ipc_and_keyrings_cannot_carry_state_between_calls(single):
    """The seccomp filter refuses SysV IPC, POSIX message queues and keyrings.

    These outlive the process that made them (per IPC namespace or per uid, both shared
    by later calls on the worker) and are not bounded by RLIMIT_AS: without the filter one
    call leaves a shared-memory segment that the next call reads, or that fills host memory.
    """
    write = single.run_python("""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
x86 = os.uname().machine == "x86_64"
for name, call in [("shmget", lambda: libc.shmget(0x5EC, 4096, 0o1000 | 0o600)),
                   ("msgget", lambda: libc.msgget(0x5EC, 0o1000 | 0o600)),
                   ("semget", lambda: libc.semget(0x5EC, 1, 0o1000 | 0o600)),
                   ("mq_open", lambda: libc.syscall(240 if x86 else 180, b"leak",
                                                    os.O_CREAT | os.O_RDWR, 0o600, None)),
                   ("add_key", lambda: libc.syscall(248 if x86 else 217, b"user", b"leak", b"v", 1,
                                                    ctypes.c_int(-4)))]:
    ctypes.set_errno(0)
    print(name, call(), os.strerror(ctypes.get_errno()))
""")
    assert write.ok, write.stderr
    assert write.stdout.splitlines() == [
        f"{name} -1 {os.strerror(errno.EPERM)}" for name in ("shmget", "msgget", "semget", "mq_open", "add_key")
    ]
    read = single.run_python("print([len(open(f'/proc/sysvipc/{k}').readlines()) for k in ('shm', 'msg', 'sem')])")
    assert read.stdout == "[1, 1, 1]\n"  # header lines only: nothing left behind


def test_seccomp_program_per_architecture():
    """The filter is built for x86_64 and aarch64 (whole instructions); elsewhere it is absent."""
    for machine in ("x86_64", "aarch64"):
        program = _seccomp_program(machine)
        assert program and len(program) % 8 == 0
    assert _seccomp_program("riscv64") is None


def test_output_truncation(sandbox):
    result = sandbox.run_python("import sys\nprint('x' * 1_000_000)\nsys.stderr.write('e' * 100_000)")
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
        "sys.path.append('/leak')\nGLOBAL_X = 5\nprint('set')"
    )
    assert leak.stdout == "set\n"
    check = (
        "import builtins, json, sys\n"
        "print(hasattr(builtins, 'LEAK'), hasattr(json, 'LEAK'), "
        "'/leak' in sys.path, 'GLOBAL_X' in globals())"
    )
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


@pytest.mark.parametrize(
    "field, value",
    [
        ("timeout_s", 0),
        ("timeout_s", float("nan")),
        ("cpu_s", 0),
        ("cpu_s", 1.5),
        ("memory_mb", 1),
        ("max_processes", 0),
        ("max_output_bytes", 0),
        ("max_file_mb", True),
    ],
)
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
