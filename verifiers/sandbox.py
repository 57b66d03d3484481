"""Isolated execution of untrusted, policy-generated Python code.

Two backends share one interface (:class:`Sandbox`):

* :class:`BubblewrapSandbox` -- the local, fast path. A small pool of long-lived
  worker processes runs inside bubblewrap (no network, private PID/IPC/UTS
  namespaces, read-only host filesystem, private /tmp, a fixed environment, a
  seccomp filter). Per call a worker mounts a fresh tmpfs as the scratch dir (bounded
  in bytes and entries; one umount removes it) and forks a child into it, which
  applies rlimits, drops to an unprivileged uid and ``exec``s the code. Forking a
  warm interpreter costs a few ms, whereas a fresh ``bwrap`` + interpreter per call
  costs ~20 ms -- too slow for RL rollouts issuing hundreds of tool calls per step.
  The worker itself never runs untrusted code, so every call starts from the same
  clean state.
* :class:`DockerSandbox` -- one throwaway container per call, for hosts with a
  Docker engine (slower, but the isolation boundary is a container).

This file is also the worker program: the bubblewrap backend starts
``python -I -S -c <this file's source> --worker <config>`` inside the sandbox,
so worker code is ordinary, testable Python. Hence: standard library only.
"""

from __future__ import annotations

import atexit
import errno
import json
import linecache
import math
import os
import queue
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

# tempfile and concurrent.futures are imported lazily by host-side code: they pull
# in random and logging, whose at-fork hooks would run in (and slow) every child.

TRUNCATION_MARKER = "...[truncated]"
# Unprivileged ids that own no host files; one per pool slot so RLIMIT_NPROC
# (which counts processes per uid, system-wide) is not shared between workers. Pools
# that pass no uid_base get a range of their own (verifiers/sandbox_host.py::UidLease);
# this base is for explicit callers (tests pick theirs above it).
DEFAULT_UID_BASE = 1_500_000_000
# Host directories that may hold credentials, datasets or answer keys. The code's filesystem
# is an allowlist (sandbox_host.view_args) that mounts none of them; these, FLYWHEEL_HOME, the
# model cache and the working dir are also masked with an empty tmpfs wherever they lie inside
# what is bound (reward-hacking guard).
DEFAULT_HIDDEN_PATHS = ("/root", "/home", "/work", "/mnt", "/srv", "/media", "/run")
# Capabilities the (trusted) worker needs: mount and unmount the per-call scratch tmpfs,
# drop to the sandbox uid in the child, kill/reap leftovers, and pin the OOM killer's choice
# (itself never, the code first and for good: oom_score_adj below its minimum needs SYS_RESOURCE).
_WORKER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_SYS_ADMIN", "CAP_SYS_RESOURCE")
_SETUP_EXIT, _SETUP_MARKER = 121, "sandbox setup failed"
# Same path on every call (reproducible for the policy): a fresh tmpfs per call, mounted
# by the worker in its private /tmp and unmounted after the call (_Scratch).
SCRATCH_DIR = "/tmp/scratch"
# The whole environment of bwrap, the workers and the code: nothing from the host's
# (API keys, tokens, paths), whatever the training process has in os.environ.
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": SCRATCH_DIR,
    "TMPDIR": SCRATCH_DIR,
    "PWD": SCRATCH_DIR,
    "PYTHONDONTWRITEBYTECODE": "1",
}
_MAX_FRAME = 64 * 1024 * 1024


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 2.0  # wall clock per call
    cpu_s: int = 2  # RLIMIT_CPU
    memory_mb: int = 256  # RLIMIT_AS
    max_processes: int = 8  # RLIMIT_NPROC (processes + threads of the sandbox uid)
    max_output_bytes: int = (
        65_536  # stdout and stderr are each truncated to this (the unit-test verifier's answers must fit)
    )
    max_file_mb: int = 8  # RLIMIT_FSIZE
    max_files: int = 10_000  # entries (files, dirs, links) in the scratch dir: its tmpfs's nr_inodes

    @classmethod
    def of(cls, settings) -> "SandboxLimits":
        """The limits a `sandbox` config section (or the resource, or the service's arguments, with
        the same names) sets; the CPU limit follows the wall-clock one."""
        return cls(
            timeout_s=settings.timeout_s,
            cpu_s=max(1, int(settings.timeout_s)),
            memory_mb=settings.memory_mb,
            max_processes=settings.max_processes,
            max_files=settings.max_files,
            max_output_bytes=settings.max_output_bytes,
        )

    def __post_init__(self) -> None:
        minimums = {
            "cpu_s": 1,
            "memory_mb": 64,
            "max_processes": 1,
            "max_output_bytes": 1,
            "max_file_mb": 1,
            "max_files": 1,
        }
        for name, low in minimums.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"SandboxLimits.{name} must be an int >= {low}, got {value!r}")
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"SandboxLimits.timeout_s must be a finite number > 0, got {t!r}")


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # -N when killed by signal N; None on wall-clock timeout
    timed_out: bool  # wall-clock or CPU-time limit hit
    duration_s: float
    error: str | None  # None on success, else e.g. "timeout", "memory", "nonzero_exit"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@runtime_checkable
class Sandbox(Protocol):
    """What verifiers and tools rely on; run_many runs concurrently, keeping order."""

    def run_python(self, code: str, *, stdin: str = "") -> SandboxResult: ...
    def run_many(self, codes: list[str]) -> list[SandboxResult]: ...
    def close(self) -> None: ...
    def __enter__(self) -> Sandbox: ...
    def __exit__(self, *exc_info: object) -> None: ...


@runtime_checkable
class Placeable(Protocol):
    """A sandbox (or a tool over one) whose code runs can be pinned to CPUs (rollout.tool_cores)."""

    def set_cpus(self, cpus: set[int] | None) -> None: ...  # None: anywhere again


def failure_result(reason: str, duration_s: float = 0.0) -> SandboxResult:
    return SandboxResult("", "", None, False, duration_s, f"sandbox_failure: {reason}")


def truncate_output(data: bytes, limit: int) -> str:
    if len(data) <= limit:
        return data.decode("utf-8", "replace")
    cut = limit
    while cut > 0 and (data[cut] & 0xC0) == 0x80:  # don't split a UTF-8 character
        cut -= 1
    return data[:cut].decode("utf-8", "replace") + TRUNCATION_MARKER


def classify_exit(exit_code: int | None, timed_out: bool, stderr_tail: bytes, cpu_exceeded: bool = False) -> str | None:
    """Map a finished run to a short, machine-readable reason (shared by both backends)."""
    if timed_out:
        return "cpu_limit" if cpu_exceeded else "timeout"
    if exit_code == 0:
        return None
    if exit_code is not None and exit_code < 0:
        return f"killed:{signal.Signals(-exit_code).name}"
    tail = stderr_tail.decode("utf-8", "replace").rstrip()
    if exit_code == _SETUP_EXIT and _SETUP_MARKER in tail:
        return f"sandbox_failure: {tail.splitlines()[-1]}"
    if tail.rsplit("\n", 1)[-1].startswith("MemoryError"):
        return "memory"
    return "nonzero_exit"


# --- framing: 4-byte big-endian length + UTF-8 JSON, used in both directions ---


def _write_frame(fd: int, obj: dict) -> None:
    body = json.dumps(obj).encode()
    data = memoryview(struct.pack(">I", len(body)) + body)
    while data:
        data = data[os.write(fd, data) :]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError("no reply from worker in time")
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError("worker closed its pipe")
        buf += chunk
    return bytes(buf)


def _read_frame(fd: int, deadline: float | None = None) -> dict:
    (size,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
    if size > _MAX_FRAME:
        raise EOFError(f"oversized frame ({size} bytes)")
    return json.loads(_read_exact(fd, size, deadline))


# --- seccomp: the syscalls the code is refused ---------------------------------
# Syscalls refused with EPERM, as (x86_64, aarch64) numbers. Most already need a capability the
# code lacks; the filter is for what the kernel lets anyone do: create a user namespace (with
# every capability inside it), keep IPC objects and keys after exit, read a same-uid process.
# Two filters stack (a call must pass both): the worker installs _DENIED_SYSCALLS plus the
# argument checks once, and every child inherits it; each child then adds _DENIED_TO_CODE, the
# calls the worker itself still needs (it mounts and unmounts the per-call scratch tmpfs).
_DENIED_SYSCALLS = {
    # namespaces: a new user namespace would open up the kernel's root-only interfaces
    "unshare": (272, 97),
    "setns": (308, 268),
    # the rest of the mount family: could unmask hidden paths (also needs CAP_SYS_ADMIN)
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "open_tree_attr": (467, 467),
    # state that outlives the call (per IPC namespace or per uid, both shared by the
    # worker's later calls) and is not bounded by RLIMIT_AS: SysV IPC, queues, keyrings
    "shmget": (29, 194),
    "semget": (64, 190),
    "msgget": (68, 186),
    "mq_open": (240, 180),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "keyctl": (250, 219),
    # another process's memory or files: every process of a call has the same uid, which is
    # all the kernel asks of a process that has exec'd (and so is dumpable again)
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438),
    "kcmp": (312, 272),
    # kernel attack surface no Python program here needs
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
}
_DENIED_TO_CODE = {
    "mount": (165, 40),
    "umount2": (166, 39),
    # memory outside RLIMIT_AS and outside the scratch tmpfs (40 memfds of 8 MiB: 320 MB under a
    # 256 MB memory_mb); the worker itself uses memfds for the call's stdin/stdout/stderr
    "memfd_create": (319, 279),
    "memfd_secret": (447, 447),
}
_CLONE_NR = {"x86_64": 56, "aarch64": 220}  # allowed unless it asks for new namespaces
_CLONE3_NR = 435  # its flags sit behind a pointer BPF cannot read: ENOSYS, libc falls back to clone
_CLONE_NEW_NAMESPACES = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
# The network namespace scopes IPv4/IPv6 and rtnetlink, not a UNIX socket bound at a path (the
# filesystem is the host's) nor families such as AF_VSOCK (a VM's host): socket() gets only the
# former, socketpair() only AF_UNIX stream pairs (asyncio's self-pipe), which cannot be
# connect()ed or sendto() a path; a datagram pair could.
_SOCKET_NR = {"x86_64": (41, 53), "aarch64": (198, 199)}  # socket, socketpair
_AF_UNIX, _AF_INET, _AF_INET6, _AF_NETLINK, _NETLINK_ROUTE, _SOCK_STREAM = 1, 2, 10, 16, 0, 1
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def _seccomp_program(
    machine: str, denied: dict[str, tuple[int, int]] = _DENIED_SYSCALLS, *, argument_checks: bool = True
) -> bytes | None:
    """Classic-BPF seccomp filter (struct sock_filter[]) for `machine`, None if not tabled.

    Refuses `denied` with EPERM; with argument_checks (the worker's filter) also clone3
    (ENOSYS), clone with namespace flags (EPERM), and sockets outside _SOCKET_NR's comment
    (EAFNOSUPPORT, what a kernel without the family says). Reads struct seccomp_data: nr at
    offset 0, arch at 4, the low half of args[i] at 16 + 8*i (both tabled CPUs are little-endian).
    Another ABI on the same CPU (i386, x32) has other syscall numbers: such calls kill.
    """
    if machine not in _AUDIT_ARCH:
        return None
    column = 0 if machine == "x86_64" else 1
    # BPF_LD|W|ABS, BPF_JMP|{JEQ,JGE,JSET}|K, BPF_ALU|AND|K, BPF_RET|K
    ld, jeq, jge, jset, and_, ret = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
    allow = 0x7FFF_0000  # SECCOMP_RET_ALLOW; below: _ERRNO | errno, _KILL_PROCESS
    # (opcode, k, jump-if-true label, jump-if-false label); None = next instruction;
    # a 1-tuple is a label. Jumps only go forward.
    code = [(ld, 4, None, None), (jeq, _AUDIT_ARCH[machine], None, "kill"), (ld, 0, None, None)]
    if machine == "x86_64":
        code.append((jge, 0x4000_0000, "kill", None))  # __X32_SYSCALL_BIT
    code += [(jeq, nr, "eperm", None) for nr in sorted({n[column] for n in denied.values()})]
    if argument_checks:
        socket_nr, socketpair_nr = _SOCKET_NR[machine]
        code += [
            (jeq, _CLONE3_NR, "enosys", None),
            (jeq, _CLONE_NR[machine], "clone", None),
            (jeq, socket_nr, "socket", None),
            (jeq, socketpair_nr, "socketpair", None),
        ]
    code.append((ret, allow, None, None))
    if argument_checks:
        code += [
            ("clone",),
            (ld, 16, None, None),
            (jset, _CLONE_NEW_NAMESPACES, "eperm", "allow"),
            ("socket",),
            (ld, 16, None, None),
            (jeq, _AF_INET, "allow", None),
            (jeq, _AF_INET6, "allow", None),
            (jeq, _AF_NETLINK, None, "noaf"),
            (ld, 32, None, None),
            (jeq, _NETLINK_ROUTE, "allow", "noaf"),
            ("socketpair",),
            (ld, 16, None, None),
            (jeq, _AF_UNIX, None, "noaf"),
            (ld, 24, None, None),
            (and_, 0xF, None, None),
            (jeq, _SOCK_STREAM, "allow", "noaf"),
        ]
    for label, action in (
        ("allow", allow),
        ("eperm", 0x0005_0000 | errno.EPERM),
        ("enosys", 0x0005_0000 | errno.ENOSYS),
        ("noaf", 0x0005_0000 | errno.EAFNOSUPPORT),
        ("kill", 0x8000_0000),
    ):
        code += [(label,), (ret, action, None, None)]
    labels, instructions = {}, []
    for item in code:
        if len(item) == 1:
            labels[item[0]] = len(instructions)
        else:
            instructions.append(item)
    out = b""
    for i, (op, k, jt, jf) in enumerate(instructions):
        jumps = [0 if t is None else labels[t] - i - 1 for t in (jt, jf)]
        out += struct.pack("=HBBI", op, *jumps, k)
    return out


def _confiner(program: bytes | None) -> Callable[[], None]:
    """A call that confines the calling process: no_new_privs (setuid and file-cap binaries grant
    nothing), not dumpable (a same-uid process cannot ptrace it or open /proc/<pid>/mem; forks
    inherit this, exec resets it) and the seccomp filter `program`, kept across fork and exec.

    The buffers are built here, so the call itself is three prctl()s: cheap in a forked child.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    buffers = []
    if program is not None:  # else no syscall table for this CPU: the other layers still apply
        buffers.append(ctypes.create_string_buffer(program, len(program)))
        sock_fprog = struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(buffers[0]))
        buffers.append(ctypes.create_string_buffer(sock_fprog, len(sock_fprog)))

    def confine() -> None:
        # PR_SET_NO_NEW_PRIVS (38), PR_SET_DUMPABLE (4), PR_SET_SECCOMP (22) + SECCOMP_MODE_FILTER (2)
        if (
            libc.prctl(38, 1, 0, 0, 0)
            or libc.prctl(4, 0, 0, 0, 0)
            or (buffers and libc.prctl(22, 2, ctypes.addressof(buffers[1]), 0, 0))
        ):
            raise OSError(ctypes.get_errno(), "could not confine the process (prctl)")

    return confine


# --- worker side: runs inside bubblewrap, as root with only _WORKER_CAPS -------


class _Scratch:
    """The code's working dir: a tmpfs of its own per call, bounded in bytes and in entries.

    Removing it is one umount, whatever the code left in it (a chain of directories deeper than
    PATH_MAX, 300k empty files, odd modes): nothing recurses, and it takes as long as the kernel
    needs to free at most max_files inodes (~15 ms for 10,000 here), counted in the call's time.
    """

    def __init__(self, uid: int, limits: SandboxLimits) -> None:
        import ctypes

        self._ctypes = ctypes
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
        self._libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        # tmpfs pages are memory: the scratch fits in the call's memory bound (memory_mb)
        size = min(max(64, 4 * limits.max_file_mb), limits.memory_mb) * 1024 * 1024
        # nr_inodes counts the tmpfs root too, and tmpfs charges every extra hard link as an inode
        self._options = (f"size={size},nr_inodes={limits.max_files + 1},mode=0700,uid={uid},gid={uid}").encode()
        os.mkdir(SCRATCH_DIR, 0o755)  # the mount point, in this worker's private /tmp

    def mount(self) -> None:
        # MS_NOSUID | MS_NODEV, like the rest of the sandbox's mounts
        if self._libc.mount(b"scratch", SCRATCH_DIR.encode(), b"tmpfs", 2 | 4, self._options):
            raise OSError(self._ctypes.get_errno(), f"could not mount a tmpfs at {SCRATCH_DIR}")

    def unmount(self) -> str | None:
        """None once the scratch is gone, else why not (the worker must then be replaced).

        With every process of the call reaped, only the kernel can still hold one of its files
        (say, in an AF_UNIX message awaiting garbage collection): then EBUSY, and MNT_DETACH
        takes it out of reach of every later call; the kernel frees it with that reference.
        """
        target = SCRATCH_DIR.encode()
        if self._libc.umount2(target, 0) == 0:
            return None
        if self._ctypes.get_errno() == errno.EBUSY and self._libc.umount2(target, 2) == 0:  # MNT_DETACH
            return None
        return f"could not unmount {SCRATCH_DIR}: {os.strerror(self._ctypes.get_errno())}"


@dataclass(frozen=True)
class _WorkerState:
    uid: int  # the code runs as this uid
    limits: SandboxLimits
    scratch: _Scratch
    confine_child: Callable[[], None]  # run by each child after dropping to `uid`


def _worker_main(cfg: dict) -> None:
    """Serve requests until the host closes the pipe; each one runs in a fresh forked child.

    A call the worker cannot finish cleanly (its scratch would not unmount, or anything else
    raised) is answered with `retire` and the worker exits: whatever went wrong could go wrong
    on every later call, so the host starts a fresh worker (and bwrap, namespaces, /tmp) instead.
    """
    if os.getpid() != 2:  # bwrap's init is pid 1, we are pid 2 of a private PID namespace
        raise SystemExit("sandbox worker refused to start outside bwrap --unshare-pid")
    rfd, wfd = os.dup(0), os.dup(1)  # private protocol channel...
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # ...so a stray print can never corrupt a reply
    os.dup2(devnull, 1)
    state = _prepare_for_children(cfg["uid"], SandboxLimits(**cfg["limits"]))
    _write_frame(wfd, {"ready": True})
    while True:
        try:
            request = _read_frame(rfd)
        except EOFError:
            return  # host closed the pipe: shut down
        try:
            reply = _serve_one(request, state)
        except Exception as exc:
            reply = {**asdict(failure_result(f"worker error: {exc!r}")), "retire": True}
        _write_frame(wfd, reply)
        if reply.get("retire"):
            return


def _prepare_for_children(uid: int, limits: SandboxLimits) -> _WorkerState:
    """Process state every forked child inherits, set up once instead of per call.

    Forks are cheap only while the child touches few pages (each first write
    to a page is a copy-on-write fault), so per-call work in the child is kept
    to dup2/rlimits/setuid and three prctl()s.
    """
    import builtins
    import ctypes
    import gc

    # PR_SET_CHILD_SUBREAPER: orphans of the code are reparented to us, so we
    # can reap them (resetting the uid's process count) before the next call.
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
    try:  # never the OOM killer's victim, where the host lets us (CAP_SYS_RESOURCE in its bounding set)
        _set_oom_score_adj(-1000)
    except PermissionError:
        pass  # then the code's processes are still first (1000), but may go back down to 0
    machine = os.uname().machine
    _confiner(_seccomp_program(machine))()  # once, inherited by every child
    state = _WorkerState(
        uid, limits, _Scratch(uid, limits), _confiner(_seccomp_program(machine, _DENIED_TO_CODE, argument_checks=False))
    )
    builtins.exit = builtins.quit = sys.exit  # -S skips `site`, which defines these
    os.environ["PWD"] = SCRATCH_DIR  # bwrap sets PWD; the rest is SANDBOX_ENV as given
    sys.argv = [""]
    # Children dup2 their memfds onto fds 0-2, so these objects then read/write
    # the call's stdin/stdout/stderr. Line buffering keeps output of killed code.
    sys.stdin.reconfigure(encoding="utf-8")
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
    gc.freeze()  # a GC pass in a child won't walk (and so copy) the worker's objects
    return state


def _serve_one(request: dict, state: _WorkerState) -> dict:
    limits = state.limits
    # Read before the fork: a child that raised here would unwind into the worker's loop.
    code, stdin = request["code"], request.get("stdin", "").encode()
    start = time.monotonic()
    state.scratch.mount()
    fds = [os.memfd_create(name) for name in ("stdin", "stdout", "stderr")]
    try:
        os.write(fds[0], stdin)
        os.lseek(fds[0], 0, os.SEEK_SET)
        pid = os.fork()
        if pid == 0:
            _child_main(code, fds, state)  # never returns
        timed_out = _wait_for_exit(pid, limits.timeout_s)
        status, cpu_used = _kill_and_reap(pid)
        out, err = (_read_memfd(fd, limits.max_output_bytes) for fd in fds[1:])
    finally:
        for fd in fds:
            os.close(fd)
        cleanup_error = state.scratch.unmount()
    duration = time.monotonic() - start  # cleanup included: the call costs it
    exit_code = None if timed_out else os.waitstatus_to_exitcode(status)
    # RLIMIT_CPU sends SIGXCPU at the soft limit and SIGKILL at the hard one.
    cpu_exceeded = exit_code == -signal.SIGXCPU or (exit_code == -signal.SIGKILL and cpu_used >= limits.cpu_s)
    reply = {
        "stdout": truncate_output(out[0], limits.max_output_bytes),
        "stderr": truncate_output(err[0], limits.max_output_bytes),
        "exit_code": exit_code,
        "timed_out": timed_out or cpu_exceeded,
        "duration_s": duration,
        "error": classify_exit(exit_code, timed_out or cpu_exceeded, err[1], cpu_exceeded),
    }
    if cleanup_error is not None:  # the call's result stands; the worker is not reused
        os.write(2, f"sandbox worker retiring: {cleanup_error}\n".encode())  # the host's log
        reply["retire"] = True
    return reply


def _wait_for_exit(pid: int, timeout_s: float) -> bool:
    """Block until the child exits or the wall clock runs out; True on timeout."""
    pidfd = os.pidfd_open(pid)
    try:
        return not select.select([pidfd], [], [], timeout_s)[0]
    finally:
        os.close(pidfd)


def _kill_and_reap(pid: int) -> tuple[int, float]:
    """SIGKILL everything else in our PID namespace, reap it all, return (status, cpu_s).

    Only the bwrap init (pid 1, spared by kill(-1)) and this worker are not
    untrusted code, so kill(-1) also catches grandchildren that left the child's
    process group via setsid(). Reaping them all here resets the uid's process
    count before the next call.
    """
    if os.getpid() != 2:  # outside a private PID namespace kill(-1) would hit the host
        raise RuntimeError("refusing kill(-1) outside the sandbox PID namespace")
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass  # nothing left running: the common case
    status, cpu = 0, 0.0
    while True:
        try:
            wpid, wstatus, usage = os.wait4(-1, 0)
        except ChildProcessError:
            return status, cpu
        if wpid == pid:
            status, cpu = wstatus, usage.ru_utime + usage.ru_stime


def _read_memfd(fd: int, limit: int) -> tuple[bytes, bytes]:
    """Return (first limit+1 bytes, last 256 bytes): enough to truncate and classify."""
    size = os.fstat(fd).st_size
    return os.pread(fd, limit + 1, 0), os.pread(fd, 256, max(0, size - 256))


def _child_main(code: str, fds: list[int], state: _WorkerState) -> None:
    """Forked child: confine itself, then run the code. Always ends in os._exit."""
    exit_code = _SETUP_EXIT
    try:
        # A process group, not setsid(): a new session also creates a scheduler
        # autogroup, which costs ~2 ms per call. Cleanup doesn't rely on it anyway.
        os.setpgid(0, 0)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # incl. the worker's protocol pipes
        _apply_rlimits(state.limits)
        _set_oom_score_adj(1000)  # first to die on an OOM, its cgroup's or the host's; a floor it keeps
        os.setgroups([])
        os.setgid(state.uid)
        os.setuid(state.uid)  # from here on no capabilities: RLIMIT_NPROC is enforced
        os.umask(0o077)
        os.chdir(SCRATCH_DIR)  # mode 0700, the uid's: root without CAP_DAC_OVERRIDE can't enter
        state.confine_child()  # after setuid, which resets dumpability to fs.suid_dumpable
    except BaseException as exc:
        os.write(2, f"{_SETUP_MARKER}: {exc!r}\n".encode())
        os._exit(_SETUP_EXIT)
    try:
        exit_code = _run_code(code)
    finally:
        os._exit(exit_code)


def _set_oom_score_adj(value: int) -> None:
    """With CAP_SYS_RESOURCE this also sets the floor the process and its forks may go back to."""
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def _apply_rlimits(limits: SandboxLimits) -> None:
    mb = 1024 * 1024
    for res, soft, hard in (
        (resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 1),  # SIGXCPU, then SIGKILL
        (resource.RLIMIT_AS, limits.memory_mb * mb, limits.memory_mb * mb),
        (resource.RLIMIT_NPROC, limits.max_processes, limits.max_processes),
        (resource.RLIMIT_FSIZE, limits.max_file_mb * mb, limits.max_file_mb * mb),
        (resource.RLIMIT_NOFILE, 64, 64),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        resource.setrlimit(res, (soft, hard))


def _run_code(code: str) -> int:
    """Execute code as a fresh __main__ module, mimicking `python -c` exit semantics."""
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main  # so pickling/`import __main__` see the policy's module
    linecache.cache["<policy>"] = (len(code), None, code.splitlines(True), "<policy>")
    try:
        exec(compile(code, "<policy>", "exec"), main.__dict__)
        exit_code = 0
    except SystemExit as exc:
        exit_code = _system_exit_code(exc)
    except BaseException as exc:
        # Skip our own frame so the traceback shows only the policy's code.
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None
        traceback.print_exception(type(exc), exc, tb)
        exit_code = 1
    try:  # normal interpreter shutdown: join non-daemon threads, run atexit hooks
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    return exit_code


def _system_exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


# --- host side ------------------------------------------------------------------


class _WorkerDied(Exception):
    pass


def _process_tree(pid: int) -> list[int]:
    """`pid` and its descendants, from /proc/<pid>/task/<tid>/children."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    todo += [int(child) for child in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while we looked
    return tree


class _Worker:
    """One bwrap'd worker process, spoken to over its stdin/stdout pipes."""

    def __init__(self, argv: list[str], cgroup=None) -> None:
        import tempfile

        self.argv = argv
        self.cgroup = cgroup  # sandbox_host.MemoryCgroup or None: the worker is moved in once ready
        self.oom_kills = 0  # the cgroup's count when last looked at
        self.proc: subprocess.Popen | None = None
        self.stderr_log = tempfile.TemporaryFile()  # a file, not a pipe: can never block the worker

    def start(self, startup_timeout_s: float = 15.0) -> None:
        self.stderr_log.seek(0)
        self.stderr_log.truncate()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr_log,
                env=dict(SANDBOX_ENV),
                bufsize=0,
            )
            _read_frame(self.proc.stdout.fileno(), time.monotonic() + startup_timeout_s)
            self._enter_cgroup()
        except (OSError, EOFError, TimeoutError, ValueError) as exc:
            self.kill()
            self.stderr_log.seek(0)
            err = self.stderr_log.read().decode(errors="replace").strip()
            raise RuntimeError(
                f"bubblewrap ({self.argv[0]}) failed to start the sandbox worker: {exc!r}; stderr: {err or '<empty>'}"
            ) from exc

    def _enter_cgroup(self) -> None:
        """Move the worker (not bwrap) into its memory cgroup; it has forked nothing yet, and each
        call's processes start there. Charges from before stay where they were."""
        if self.cgroup is None:
            return
        from verifiers.sandbox_host import worker_pid

        pid = worker_pid(self.proc.pid)
        if pid is None:
            raise OSError("sandbox worker process not found under bwrap")
        self.cgroup.attach(pid)
        self.oom_kills = self.cgroup.oom_kills()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def call(self, request: dict, reply_timeout_s: float) -> dict:
        try:
            _write_frame(self.proc.stdin.fileno(), request)
            return _read_frame(self.proc.stdout.fileno(), time.monotonic() + reply_timeout_s)
        except (OSError, EOFError, TimeoutError, ValueError) as exc:
            raise _WorkerDied(repr(exc)) from exc

    def pin(self, cpus: set[int]) -> None:
        """Run bwrap, the worker and whatever it has forked on `cpus` (children forked later
        inherit it). A process that exits meanwhile is skipped."""
        if self.proc is None:
            return
        for pid in _process_tree(self.proc.pid):
            try:
                os.sched_setaffinity(pid, cpus)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        if self.proc is not None:
            for pipe in (self.proc.stdin, self.proc.stdout):
                pipe.close()
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()


class BubblewrapSandbox:
    """Pool of warm, bubblewrap-confined workers; see the module docstring.

    `uid_base`: the first of the pool_size uids the code runs as; None (the default) takes a
    range no other pool on this host holds (sandbox_host.UidLease), released by close() or
    when the process ends. `hidden_paths`: dirs masked even where they lie inside the bound
    system dirs; None: DEFAULT_HIDDEN_PATHS plus FLYWHEEL_HOME, the model cache and the
    working dir (sandbox_host.default_hidden_paths).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        pool_size: int = 2,
        *,
        bwrap_path: str | None = None,
        uid_base: int | None = None,
        hidden_paths: tuple[str, ...] | None = None,
    ) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from verifiers import sandbox_host

        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size!r}")
        binary = bwrap_path or shutil.which("bwrap")
        if binary is None or not os.access(binary, os.X_OK):
            raise RuntimeError(
                f"bubblewrap binary {bwrap_path or 'bwrap'!r} not found or not "
                "executable; install bubblewrap or use make_sandbox('docker', ...)"
            )
        self.limits = limits or SandboxLimits()
        self._lease = sandbox_host.UidLease.acquire(pool_size) if uid_base is None else None
        uid_base = self._lease.base if self._lease is not None else uid_base
        self.uids = tuple(range(uid_base, uid_base + pool_size))  # the code runs as one of these
        hidden = sandbox_host.default_hidden_paths(DEFAULT_HIDDEN_PATHS) if hidden_paths is None else hidden_paths
        view = sandbox_host.view_args(hidden, sandbox_host.interpreter_prefixes())
        with open(__file__, encoding="utf-8") as fh:
            source = fh.read()
        mb = 1024 * 1024
        # The call's memory, its stdout/stderr memfds (RLIMIT_FSIZE each) and the worker's own
        # per-call pages (the child's copies of the pages it writes before exec'ing the code)
        cgroup_bytes = (self.limits.memory_mb + 2 * self.limits.max_file_mb + 16) * mb
        self._workers = [
            _Worker(self._argv(binary, source, uid, view), sandbox_host.MemoryCgroup.create(str(uid), cgroup_bytes))
            for uid in self.uids
        ]
        # "cgroup v2" / "cgroup v1": all memory of a call is bounded; None: per process only
        self.memory_bound = next((f"cgroup v{w.cgroup.version}" for w in self._workers if w.cgroup), None)
        # bwrap --die-with-parent fires when the *thread* that spawned it exits, so
        # all (re)starts happen on one thread that lives as long as the sandbox.
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="sandbox-spawn")
        self._calls = ThreadPoolExecutor(pool_size, thread_name_prefix="sandbox-call")
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._closed = False
        self._all_cpus = os.sched_getaffinity(0)
        self._cpus: set[int] | None = None  # set_cpus; None: wherever the scheduler puts them
        try:
            for worker in self._workers:
                self._spawner.submit(worker.start).result()
                self._idle.put(worker)
        except BaseException:
            self.close()
            raise

    def _argv(self, binary: str, source: str, uid: int, view: list[str]) -> list[str]:
        # The code's filesystem is `view` on an empty root (sandbox_host.view_args), read-only;
        # /dev is bwrap's minimal one, read-only too: its /dev/shm is a root-owned dir on an
        # unbounded tmpfs, so no POSIX shm or other files there.
        argv = [
            binary,
            "--unshare-net",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "sandbox",
            "--die-with-parent",
            "--new-session",
            *view,
            "--dev",
            "/dev",
            "--remount-ro",
            "/dev",
            "--proc",
            "/proc",
            "--remount-ro",
            "/",
            "--cap-drop",
            "ALL",
        ]
        for cap in _WORKER_CAPS:
            argv += ["--cap-add", cap]
        config = {"uid": uid, "limits": asdict(self.limits)}
        exe = os.path.realpath(sys.executable)
        return argv + ["--", exe, "-I", "-S", "-c", source, "--worker", json.dumps(config)]

    def run_python(self, code: str, *, stdin: str = "") -> SandboxResult:
        if self._closed:
            raise RuntimeError("BubblewrapSandbox is closed")
        worker = self._idle.get()
        try:
            return self._call(worker, {"code": code, "stdin": stdin})
        finally:
            self._idle.put(worker)

    def _call(self, worker: _Worker, request: dict) -> SandboxResult:
        start = time.monotonic()
        if not worker.alive():  # died between calls (killed, OOM, ...): restart quietly
            try:
                self._restart(worker)
            except RuntimeError as exc:
                return failure_result(f"worker restart failed: {exc}")
        try:
            # Generous slack: the worker enforces timeout_s itself; this only
            # catches a wedged or dead worker.
            reply = worker.call(request, self.limits.timeout_s + 10.0)
        except _WorkerDied as exc:
            oom_killed = self._oom_killed(worker)  # before the restart resets the count
            self._replace(worker)
            if oom_killed:  # the call's memory took the worker with it: the code's doing
                return SandboxResult("", "", -signal.SIGKILL, False, time.monotonic() - start, "memory")
            return failure_result(f"worker died: {exc}", time.monotonic() - start)
        if reply.pop("retire", False):  # it could not clean up after the call, and has exited
            self._replace(worker)
        if reply["exit_code"] == -signal.SIGKILL and not reply["timed_out"] and self._oom_killed(worker):
            reply["error"] = "memory"  # the kernel killed it for the cgroup's memory limit
        return SandboxResult(**reply)

    @staticmethod
    def _oom_killed(worker: _Worker) -> bool:
        """Whether the kernel OOM-killed in `worker`'s cgroup since this was last asked."""
        if worker.cgroup is None:
            return False
        seen, worker.oom_kills = worker.oom_kills, worker.cgroup.oom_kills()
        return worker.oom_kills > seen

    def _replace(self, worker: _Worker) -> None:
        """Restart `worker` before it serves again; if that fails, the next call retries."""
        try:
            self._restart(worker)
        except RuntimeError:
            pass

    def _restart(self, worker: _Worker) -> None:
        worker.kill()
        self._spawner.submit(worker.start).result()
        if self._cpus is not None:
            worker.pin(self._cpus)

    def set_cpus(self, cpus: set[int] | None) -> None:
        """Run the workers, and the code they fork per call, on `cpus` only (None: every CPU
        this process could use when the sandbox started). A rollout uses it to keep tool
        processes off the cores its engine's threads run on (rollout.tool_cores)."""
        if cpus is not None and not set(cpus) <= self._all_cpus:
            raise ValueError(
                f"sandbox CPUs {sorted(cpus)} are not all available to this process ({sorted(self._all_cpus)})"
            )
        self._cpus = set(cpus) if cpus is not None else None
        for worker in self._workers:
            worker.pin(self._cpus or self._all_cpus)

    def run_many(self, codes: list[str]) -> list[SandboxResult]:
        return list(self._calls.map(self.run_python, codes))

    def worker_pids(self) -> list[int]:
        """Host pids of the bwrap processes (for monitoring and tests)."""
        return [w.proc.pid for w in self._workers if w.proc is not None]

    def close(self) -> None:
        self._closed = True
        self._calls.shutdown(wait=True)
        for worker in self._workers:
            worker.kill()
            worker.stderr_log.close()
            if worker.cgroup is not None:
                worker.cgroup.remove()
        self._spawner.shutdown(wait=True)
        if self._lease is not None:
            self._lease.release()

    def __enter__(self) -> BubblewrapSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker_main(json.loads(sys.argv[2]))
