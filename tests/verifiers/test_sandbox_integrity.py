"""Sandbox abuse that must cost neither the pool's workers, nor its time bounds, nor its isolation
(issue 21): poisoned workers, entry floods, path sockets, cross-process memory reads.

Every test here failed against the sandbox before these defenses (docs/sandbox.md, "Adversarial
cases"); run them alone with `.venv/bin/python -m pytest -m integrity`.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import socket
import struct
import tempfile
import time

import pytest

if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap (`bwrap`) is not installed; the sandbox needs it", allow_module_level=True)

from verifiers.sandbox import (  # noqa: E402  (after the module-level skip)
    _DENIED_TO_CODE,
    DEFAULT_UID_BASE,
    BubblewrapSandbox,
    SandboxLimits,
    _seccomp_program,
)

pytestmark = pytest.mark.integrity

# Uids of their own (see tests/verifiers/test_sandbox.py): RLIMIT_NPROC counts per uid, host-wide.
_uid_bases = itertools.count(DEFAULT_UID_BASE + 20_000_000 + os.getpid() % 100_000 * 100, 4)


def pool(limits: SandboxLimits, pool_size: int = 1) -> BubblewrapSandbox:
    return BubblewrapSandbox(limits, pool_size, uid_base=next(_uid_bases))


# --- a worker that cannot clean up must not stay in the pool -----------------------------------

DEEP_TREES = {
    # the string: the old recursive cleanup raised RecursionError on every later call
    "chdir chain": "import os\nfor i in range(3000):\n    os.mkdir('d'); os.chdir('d')\n",
    "makedirs": "import os\nfor _ in range(5):\n    os.makedirs('/'.join(['d'] * 400)); os.chdir('/'.join(['d'] * 400))\n",
    # deeper than PATH_MAX (1500 x 256 bytes): only fd-relative calls reach the bottom
    "dir fds past PATH_MAX": """
import os
name, fd = "n" * 255, os.open(".", os.O_RDONLY)
for _ in range(1500):
    os.mkdir(name, dir_fd=fd)
    below = os.open(name, os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = below
""",
}


@pytest.mark.parametrize("attack", DEEP_TREES.values(), ids=DEEP_TREES)
def test_deep_trees_do_not_poison_the_pool(attack):
    """Two such calls on a 2-worker pool used to disable it for good; now they are ordinary calls."""
    with pool(SandboxLimits(timeout_s=5.0), pool_size=2) as box:
        attacks = box.run_many([attack, attack])
        assert all(r.ok for r in attacks), attacks
        later = [box.run_python("import os; print(os.listdir('.'))") for _ in range(6)]  # both workers
        assert all(r.ok and r.stdout == "[]\n" for r in later), later


def test_a_worker_that_fails_a_call_is_replaced():
    """Whatever the worker could not finish (cleanup included) may fail on every later call: it
    answers, exits, and the host starts a fresh one. A request without code makes the worker's
    own work fail here, since the code itself can no longer make the cleanup fail."""
    with pool(SandboxLimits(timeout_s=5.0)) as box:
        old_pids = box.worker_pids()
        worker = box._idle.get()
        try:
            broken = box._call(worker, {"stdin": ""})
        finally:
            box._idle.put(worker)
        assert broken.error.startswith("sandbox_failure: worker error: KeyError"), broken
        assert box.worker_pids() != old_pids
        after = box.run_python("print('served')")
        assert after.ok and after.stdout == "served\n"


# --- entry floods: bounded by max_files, and their cleanup is inside the call's time -----------

FLOOD = """
import os
n, full = 0, False
while True:  # keep trying until the wall clock: as much work for the cleanup as the call can make
    try:
        {make}
        n += 1
    except OSError as exc:
        if not full:
            print("full", n, exc.errno, flush=True)
            full = True
"""


@pytest.mark.serial  # the cleanup timed to 0.25 s of wall clock after a 2 s CPU-bound call
@pytest.mark.parametrize("make", ["open(f'f{n}', 'w').close()", "os.mkdir(f'd{n}')"], ids=["files", "dirs"])
def test_entry_flood_is_bounded_and_its_cleanup_is_timed(make):
    """260k-310k empty files or dirs used to make a 2 s call return after 3-12 s, saying 2.0 s.

    Bound: timeout_s + 1 s. After the wall clock come SIGKILL and reaping (at most max_processes)
    and one umount freeing at most max_files inodes (~15 ms for 10,000 here): 1 s is ample margin.
    """
    limits = SandboxLimits(timeout_s=2.0, cpu_s=3)  # wall clock first: the loop burns CPU
    with pool(limits) as box:
        start = time.monotonic()
        result = box.run_python(FLOOD.format(make=make))
        wall = time.monotonic() - start
        assert wall <= limits.timeout_s + 1.0, result
        assert limits.timeout_s <= result.duration_s <= wall < result.duration_s + 0.25  # cleanup counted
        assert result.error == "timeout", result
        assert result.stdout == f"full {limits.max_files} {errno.ENOSPC}\n"
        assert box.run_python("import os; print(os.listdir('.'))").stdout == "[]\n"


@pytest.mark.parametrize(
    "setup, make",
    [
        ("open('f', 'w').close()\nn = 1", "os.link('f', f'l{n}')"),  # tmpfs charges each link as an inode
        ("n = 0", "os.symlink('f', f's{n}')"),
        ("n = 0", "open(f'{n:0255d}', 'w').close()"),  # names of the maximum length
    ],
    ids=["hard links", "symlinks", "255-byte names"],
)
def test_max_files_bounds_every_kind_of_entry(setup, make):
    code = f"import os\n{setup}\ntry:\n    while True:\n        {make}\n        n += 1\nexcept OSError as exc:\n    print(n, exc.errno)"
    with pool(SandboxLimits(timeout_s=5.0, max_files=50)) as box:
        result = box.run_python(code)
        assert result.ok and result.stdout == f"50 {errno.ENOSPC}\n", result


# --- path sockets: nothing outside the sandbox is connectable ----------------------------------

SOCKETS = """
import asyncio, errno, os, socket

def attempt(label, make_and_use):
    try:
        make_and_use()
        print(label, "reached")
    except OSError as exc:
        print(label, errno.errorcode.get(exc.errno, exc.errno))

attempt("stream", lambda: socket.socket(socket.AF_UNIX).connect({stream!r}))
attempt("dgram", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"x", {dgram!r}))
attempt("dgram pair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)[0].sendto(b"x", {dgram!r}))
attempt("abstract", lambda: socket.socket(socket.AF_UNIX).connect({abstract!r}))
attempt("vsock", lambda: socket.socket(40, socket.SOCK_STREAM))  # AF_VSOCK: a VM's host
attempt("packet", lambda: socket.socket(17, socket.SOCK_DGRAM))  # AF_PACKET
# what code may still use: stream socketpairs (asyncio's self-pipe), pipes and fork
a, b = socket.socketpair()
a.sendall(b"ok")
print("stream pair", b.recv(2).decode())
print("asyncio", asyncio.run(asyncio.sleep(0, result="ok")))
r, w = os.pipe()
if os.fork() == 0:
    os.write(w, b"ok")
    os._exit(0)
print("fork+pipe", os.read(r, 2).decode(), os.wait()[1])
"""


@pytest.fixture
def host_unix_sockets():
    """World-writable UNIX sockets with listeners at an unmasked host path, plus an abstract one."""
    if not os.path.isdir("/var/tmp"):
        pytest.skip("no host /var/tmp to place the sockets in")
    folder = tempfile.mkdtemp(prefix="sandbox-sockets-", dir="/var/tmp")
    os.chmod(folder, 0o755)
    stream, dgram, abstract = (
        socket.socket(socket.AF_UNIX, kind) for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_STREAM)
    )
    try:
        stream.bind(f"{folder}/stream.sock")
        dgram.bind(f"{folder}/dgram.sock")
        abstract.bind(f"\0sandbox-integrity-{os.getpid()}")
        for sock in (stream, dgram, abstract):
            sock.setblocking(False)
        for path in (f"{folder}/stream.sock", f"{folder}/dgram.sock"):
            os.chmod(path, 0o777)
        stream.listen()
        abstract.listen()
        yield {"stream": stream, "dgram": dgram, "abstract": abstract}
    finally:
        for sock in (stream, dgram, abstract):
            sock.close()
        shutil.rmtree(folder)


def test_host_unix_sockets_are_not_reachable(host_unix_sockets):
    """The network namespace does not cover sockets bound at a path (the filesystem is the host's):
    seccomp refuses AF_UNIX sockets except stream socketpairs, and families the namespace does not
    scope (AF_VSOCK reaches a VM's host). Abstract names are per network namespace anyway."""
    socks = host_unix_sockets
    addresses = {name: sock.getsockname() for name, sock in socks.items()}
    with pool(SandboxLimits(timeout_s=5.0)) as box:
        result = box.run_python(SOCKETS.format(**addresses))
    assert result.ok, result.stderr
    assert result.stdout.splitlines() == [
        *(f"{label} EAFNOSUPPORT" for label in ("stream", "dgram", "dgram pair", "abstract", "vsock", "packet")),
        "stream pair ok",
        "asyncio ok",
        "fork+pipe ok 0",
    ]
    reached = []
    for name, receive in (
        ("stream", socks["stream"].accept),
        ("dgram", lambda: socks["dgram"].recv(16)),
        ("abstract", socks["abstract"].accept),
    ):
        try:
            receive()
            reached.append(name)
        except BlockingIOError:
            pass  # nothing connected, nothing arrived
    assert reached == []


# --- no process of a call reads another's memory ------------------------------------------------

MEMORY = """
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
NR = {{"process_vm_readv": (310, 270), "ptrace": (101, 117), "pidfd_getfd": (438, 438), "kcmp": (312, 272)}}
column = 0 if os.uname().machine == "x86_64" else 1
secret = ctypes.create_string_buffer(b"the harness's nonce")

def victim(dumpable):
    ready, tell = os.pipe()
    pid = os.fork()
    if pid == 0:
        if dumpable:  # what exec'ing a program makes any process
            libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
        os.write(tell, str(libc.prctl(3, 0, 0, 0, 0)).encode())  # PR_GET_DUMPABLE
        signal.pause()
    return pid, os.read(ready, 1).decode()

class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

def attempt(name, *args):
    ctypes.set_errno(0)
    rc = libc.syscall(NR[name][column], *args)
    print(name, "refused" if rc == -1 and ctypes.get_errno() == {eperm} else f"returned {{rc}}")

def read_proc_mem(pid):
    try:
        with open(f"/proc/{{pid}}/mem", "rb") as mem:
            mem.seek(ctypes.addressof(secret))
            print("/proc/pid/mem read", mem.read(len(secret.value)))
    except OSError as exc:
        print("/proc/pid/mem refused", exc.errno in ({eacces}, {eperm}))

pid, dumpable = victim(dumpable=True)
print("dumpable", dumpable)
copy = ctypes.create_string_buffer(64)
local, remote = iovec(ctypes.addressof(copy), len(secret.value)), iovec(ctypes.addressof(secret), len(secret.value))
attempt("process_vm_readv", pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
attempt("ptrace", 0x4206, pid, 0, 0)  # PTRACE_SEIZE
attempt("pidfd_getfd", os.pidfd_open(pid), 0, 0)
attempt("kcmp", os.getpid(), pid, 0, 0, 0)  # KCMP_FILE: compares fds, so it can probe another's
os.kill(pid, signal.SIGKILL)
pid, dumpable = victim(dumpable=False)  # a plain fork, like the unit-test harness's
print("dumpable", dumpable)
read_proc_mem(pid)
os.kill(pid, signal.SIGKILL)
"""


def test_processes_of_a_call_cannot_read_each_others_memory():
    """The unit-test harness and the candidate run as one uid in one call: same-uid access is all
    the kernel asks of a dumpable process. seccomp refuses the syscalls outright; every process
    starts not dumpable, so /proc/<pid>/mem of a forked (not exec'd) process is refused too."""
    code = MEMORY.format(eperm=errno.EPERM, eacces=errno.EACCES)
    with pool(SandboxLimits(timeout_s=5.0)) as box:
        result = box.run_python(code)
    assert result.ok, result.stderr
    assert result.stdout.splitlines() == [
        "dumpable 1",
        "process_vm_readv refused",
        "ptrace refused",
        "pidfd_getfd refused",
        "kcmp refused",
        "dumpable 0",
        "/proc/pid/mem refused True",
    ]


# --- the filters themselves, on both tabled CPUs (only one of which runs here) -------------------

# From the kernel's asm/unistd_64.h (x86_64) and asm-generic/unistd.h (aarch64).
SYSCALLS = {
    "x86_64": {
        "read": 0,
        "clone": 56,
        "socket": 41,
        "socketpair": 53,
        "mount": 165,
        "umount2": 166,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "kcmp": 312,
        "pidfd_getfd": 438,
    },
    "aarch64": {
        "read": 63,
        "clone": 220,
        "socket": 198,
        "socketpair": 199,
        "mount": 40,
        "umount2": 39,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "kcmp": 272,
        "pidfd_getfd": 438,
    },
}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
ALLOW, KILL = 0x7FFF_0000, 0x8000_0000


def errno_action(number: int) -> int:
    return 0x0005_0000 | number


def run_filter(program: bytes, arch: int, nr: int, *args: int) -> int:
    """Interpret a classic-BPF seccomp program on one struct seccomp_data (little-endian)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args, *[0] * (6 - len(args)))
    code = [struct.unpack_from("=HBBI", program, offset) for offset in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == 0x06:  # ret
            return k
        if op == 0x20:  # ld word at k
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == 0x54:  # and k
            acc &= k
        else:
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]  # jeq, jge, jset
            pc += jt if hit else jf
        pc += 1


@pytest.mark.parametrize("machine", sorted(SYSCALLS))
def test_filters_refuse_memory_access_mounts_and_unscoped_sockets(machine):
    nr, arch = SYSCALLS[machine], AUDIT_ARCH[machine]
    worker = _seccomp_program(machine)
    child = _seccomp_program(machine, _DENIED_TO_CODE, argument_checks=False)
    af_unix, af_inet, af_inet6, af_netlink, af_vsock = 1, 2, 10, 16, 40
    sock_stream, sock_dgram, sock_seqpacket, sock_cloexec = 1, 2, 5, 0x80000
    noaf = errno_action(errno.EAFNOSUPPORT)
    for name in ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp"):
        assert run_filter(worker, arch, nr[name]) == errno_action(errno.EPERM), name
    for name in ("mount", "umount2"):  # the worker mounts each call's scratch; its children may not
        assert run_filter(worker, arch, nr[name]) == ALLOW
        assert run_filter(child, arch, nr[name]) == errno_action(errno.EPERM)
    assert run_filter(worker, arch, nr["clone"], 0x10000000) == errno_action(errno.EPERM)  # CLONE_NEWUSER
    expected = {
        ("socket", af_inet, sock_stream, 0): ALLOW,
        ("socket", af_inet6, sock_dgram, 0): ALLOW,
        ("socket", af_netlink, sock_dgram, 0): ALLOW,  # NETLINK_ROUTE: glibc's if_nameindex, getaddrinfo
        ("socket", af_netlink, sock_dgram, 15): noaf,  # NETLINK_KOBJECT_UEVENT: the host's device events
        ("socket", af_unix, sock_stream, 0): noaf,
        ("socket", af_vsock, sock_stream, 0): noaf,
        ("socketpair", af_unix, sock_stream | sock_cloexec, 0): ALLOW,
        ("socketpair", af_unix, sock_dgram, 0): noaf,
        ("socketpair", af_unix, sock_seqpacket, 0): noaf,
        ("read", 0, 0, 0): ALLOW,
        ("clone", 17, 0, 0): ALLOW,  # SIGCHLD: a plain fork
    }
    for (name, *args), action in expected.items():
        assert run_filter(worker, arch, nr[name], *args) == action, (name, args)
        assert run_filter(child, arch, nr[name], *args) == ALLOW, (name, args)
    other = AUDIT_ARCH["aarch64" if machine == "x86_64" else "x86_64"]
    assert run_filter(worker, other, nr["read"]) == run_filter(child, other, nr["read"]) == KILL


# --- security review items 3, 8, 10: memory outside RLIMIT_AS, shared uids, a home in view ------

MEMFDS = """
import errno, os
held = 0
try:
    for i in range(40):
        fd = os.memfd_create(f"hold{i}")
        os.write(fd, b"\\1" * (8 << 20))
        held += 8
except OSError as exc:
    print("refused", errno.errorcode[exc.errno])
print("held", held)
"""


def test_memfds_cannot_hold_memory_outside_the_limit():
    """The review's reproduction: 40 memfds of 8 MiB each held 320 MB in one process under a
    256 MB memory_mb (memfd pages are not in RLIMIT_AS). memfd_create is refused to the code."""
    with pool(SandboxLimits(timeout_s=10.0, memory_mb=256)) as box:
        result = box.run_python(MEMFDS)
    assert result.ok, result.stderr
    assert result.stdout.splitlines() == ["refused EPERM", "held 0"]


SHARED_MEMORY = """
import ctypes, errno, os
for path in ("/dev/shm/hold", "/dev/shm/sem.hold"):
    try:
        open(path, "wb").write(b"x")
        print("wrote", path)
    except OSError as exc:
        print(path, errno.errorcode[exc.errno])
try:
    import _posixshmem
    _posixshmem.shm_open("/hold", os.O_CREAT | os.O_RDWR, 0o600)
    print("shm_open ok")
except OSError as exc:
    print("shm_open", errno.errorcode[exc.errno])
libc = ctypes.CDLL(None, use_errno=True)
print("shmget", libc.shmget(0, 1 << 20, 0o1600), errno.errorcode[ctypes.get_errno()])  # IPC_PRIVATE, IPC_CREAT
"""


def test_posix_and_sysv_shared_memory_are_refused():
    """/dev/shm is a read-only, root-owned dir (no POSIX shm, no named semaphores there); SysV
    segments, which outlive the call in the worker's IPC namespace, are refused by seccomp."""
    with pool(SandboxLimits(timeout_s=5.0)) as box:
        result = box.run_python(SHARED_MEMORY)
    assert result.ok, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines[:2]] == ["/dev/shm/hold", "/dev/shm/sem.hold"]
    assert all(line.split()[1] in ("EROFS", "EACCES") for line in lines[:2]), lines
    assert lines[2].split()[0] == "shm_open" and lines[2].split()[1] in ("EROFS", "EACCES"), lines
    assert lines[3] == "shmget -1 EPERM"


PROCESSES_HOLDING = """
import os, time
pids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        block = b"\\1" * (100 << 20)  # touched: 100 MB resident, under RLIMIT_AS (128 MB)
        print("held", i, flush=True)
        time.sleep(2)
        os._exit(0)
    pids.append(pid)
print("exits", [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids])
"""


def test_the_processes_of_a_call_share_one_memory_bound():
    """RLIMIT_AS is per process: 4 processes held 4 x 100 MB under memory_mb = 128. The worker's
    memory cgroup bounds them together (memory_mb + the output buffers + 16 MB); without one on
    this host the test skips (the seccomp and tmpfs bounds above still hold)."""
    from verifiers.sandbox_host import memory_cgroup_parent

    if memory_cgroup_parent() is None:
        pytest.skip("no writable memory cgroup (v2 with memory delegated, or v1) on this host")
    limits = SandboxLimits(timeout_s=10.0, memory_mb=128)
    with pool(limits) as box:
        result = box.run_python(PROCESSES_HOLDING)
        after = box.run_python("print('ok')")
    bound_mb = limits.memory_mb + 2 * limits.max_file_mb + 16
    held = [line for line in result.stdout.splitlines() if line.startswith("held")]
    assert len(held) * 100 <= bound_mb, result
    assert result.stdout.splitlines()[-1].startswith("exits") and "-9" in result.stdout, result
    assert after.ok and after.stdout == "ok\n"  # the worker survived its call's OOM


HOG = """
import os, time
if os.fork() == 0:
    block = b"\\1" * (80 << 20)
    time.sleep(3)
    os._exit(0)
time.sleep(0.5)
block = b"\\2" * (130 << 20)  # under RLIMIT_AS (160 MB), over what is left of the cgroup's bound
print("not killed")
"""


def test_a_call_killed_for_its_cgroup_bound_reports_memory():
    """The kernel's OOM kill in the worker's cgroup (its largest process: the code's main one) is
    `error == "memory"`, as a MemoryError is, and the worker serves the next call."""
    from verifiers.sandbox_host import memory_cgroup_parent

    if memory_cgroup_parent() is None:
        pytest.skip("no writable memory cgroup on this host")
    with pool(SandboxLimits(timeout_s=10.0, memory_mb=160)) as box:
        result = box.run_python(HOG)
        after = box.run_python("print('ok')")
    assert (result.exit_code, result.error, result.stdout) == (-9, "memory", ""), result
    assert after.ok and after.stdout == "ok\n"


def test_pools_get_disjoint_uid_ranges():
    """Every pool used DEFAULT_UID_BASE, so RLIMIT_NPROC (per uid, host-wide) was shared by the
    training, benchmark, serve and audit pools. Now each takes a range under an flock."""
    import fcntl
    import subprocess
    import sys

    from verifiers.sandbox_host import ALLOCATED_UID_BASE, UID_RANGE_SIZE, UidLease, _lock_dir

    limits = SandboxLimits(timeout_s=2.0)
    with BubblewrapSandbox(limits, 2) as first, BubblewrapSandbox(limits, 2) as second:
        assert not set(first.uids) & set(second.uids)
        other = subprocess.Popen(
            [sys.executable, "-c", "from verifiers.sandbox_host import UidLease; import time; "
             "print(UidLease.acquire(8).base, flush=True); time.sleep(60)"],
            stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        )  # fmt: skip
        try:
            base = int(other.stdout.readline())
            assert not {*first.uids, *second.uids} & set(range(base, base + UID_RANGE_SIZE))
        finally:
            other.kill()  # a crash: the kernel drops its lock with its last fd
            other.wait()
    lock = f"{_lock_dir()}/{(base - ALLOCATED_UID_BASE) // UID_RANGE_SIZE}.lock"
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
    finally:
        os.close(fd)
    lease = UidLease.acquire(2)
    lease.release()


HOLD_THREADS = """
import threading, time
threads = [threading.Thread(target=time.sleep, args=({seconds},)) for _ in range({count})]
for t in threads:
    t.start()
print("started", len(threads))
"""


def test_a_pool_holding_its_threads_does_not_starve_another():
    """Pool A's call holds max_processes tasks (its process + 3 threads); pool B's call, meanwhile,
    starts threads of its own. With one uid base B got `can't start new thread`."""
    from concurrent.futures import ThreadPoolExecutor

    limits = SandboxLimits(timeout_s=5.0, max_processes=4)
    with BubblewrapSandbox(limits, 1) as a, BubblewrapSandbox(limits, 1) as b, ThreadPoolExecutor(1) as ex:
        holding = ex.submit(a.run_python, HOLD_THREADS.format(seconds=2.0, count=3))
        time.sleep(0.7)
        starved = b.run_python(HOLD_THREADS.format(seconds=0.1, count=3))
        held = holding.result()
    assert held.ok and held.stdout == "started 3\n", held
    assert starved.ok and starved.stdout == "started 3\n", starved


READ_HOME = """
import os
for path in {paths!r}:
    try:
        print("READ", path, open(path).read())
    except OSError as exc:
        print(type(exc).__name__, path)
"""


def _trainer_state(parent: str) -> tuple[str, str, list[str]]:
    home = tempfile.mkdtemp(prefix="flywheel-home-", dir=parent)
    cache = tempfile.mkdtemp(prefix="flywheel-models-", dir=parent)
    files = [f"{home}/training_tasks/all.parquet", f"{cache}/tiny/config.json"]
    for path in files:
        os.makedirs(os.path.dirname(path))
        with open(path, "w") as fh:
            fh.write("answer key")
        os.chmod(path, 0o644)
    for path in (home, cache, *(os.path.dirname(p) for p in files)):
        os.chmod(path, 0o755)  # world-readable: only the sandbox's view keeps them out
    return home, cache, files


@pytest.mark.parametrize("parent", ["/var/tmp", "/usr/local/share"])
def test_trainer_home_and_model_cache_are_not_readable(monkeypatch, parent):
    """A FLYWHEEL_HOME outside the masked dirs (/var/tmp) was readable: training_tasks/all.parquet.
    The view is an allowlist (/var is not in it); a home inside a bound dir (/usr/local) is masked."""
    if not os.access(parent, os.W_OK):
        pytest.skip(f"cannot create a trainer home under {parent}")
    home, cache, files = _trainer_state(parent)
    try:
        monkeypatch.setenv("FLYWHEEL_HOME", home)
        monkeypatch.setenv("FLYWHEEL_MODEL_CACHE", cache)
        with pool(SandboxLimits(timeout_s=5.0)) as box:
            result = box.run_python(READ_HOME.format(paths=files))
    finally:
        shutil.rmtree(home)
        shutil.rmtree(cache)
    assert result.ok, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["FileNotFoundError"] * 2, result.stdout
