"""Host-side parts of the bubblewrap pool that the sandboxed worker never runs: the filesystem the
code sees, the uid range each pool runs its code as, and the memory cgroup each worker runs in.

They live apart from verifiers/sandbox.py because that file's source is the worker program
(standard library only, standing alone); `BubblewrapSandbox` imports this module lazily.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import sys
import time

log = logging.getLogger(__name__)

# --- the filesystem view: an allowlist ------------------------------------------------------
# What a standard-library Python program and the usual /usr/bin tools need. Everything else of
# the host (the repo, FLYWHEEL_HOME, the model cache, /var, /opt, /srv, /home, /root, /run,
# /sys) is simply not mounted, wherever it lives.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# /etc holds credentials and service configs on many hosts: only these entries are bound.
ETC_ENTRIES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "timezone",
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "host.conf",
    "protocols",
    "services",
    "mime.types",
)


def interpreter_prefixes() -> list[str]:
    """The directories the worker's interpreter and its standard library live in (a pyenv prefix
    under /root, a uv-managed one in the repo, /usr/local): bound read-only at their own paths."""
    exe = os.path.realpath(sys.executable)
    return sorted({os.path.realpath(sys.base_prefix), os.path.dirname(os.path.dirname(exe))})


def _under(path: str, top: str) -> bool:
    return top == "/" or path == top or path.startswith(top + "/")


def _mkdirs(path: str, start: str) -> list[str]:
    """bwrap args creating the dirs between `start` (exclusive) and `path` (exclusive) as 0755:
    bwrap would create a bind target's missing parents 0700, which the sandbox uid cannot traverse."""
    args, parent = [], start
    for part in os.path.relpath(path, start).split("/")[:-1]:
        parent = os.path.join(parent, part)
        args += ["--perms", "0755", "--dir", parent]
    return args


def view_args(hidden: tuple[str, ...], prefixes: list[str]) -> list[str]:
    """bwrap args building the code's whole filesystem on an empty root, read-only: SYSTEM_DIRS,
    ETC_ENTRIES and the interpreter `prefixes`; the `hidden` dirs are masked with an empty tmpfs
    where they lie inside what is bound (a FLYWHEEL_HOME under /usr/local, say), and /tmp is a
    small root-owned tmpfs that only holds the worker's mount points."""
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--perms", "0755", "--dir", "/etc"]
    for name in ETC_ENTRIES:
        if os.path.exists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    bound = [p for p in SYSTEM_DIRS if os.path.isdir(p) and not os.path.islink(p)]
    masks = [
        h
        for h in dict.fromkeys(os.path.realpath(p) for p in hidden)
        if os.path.isdir(h) and any(_under(h, b) and h != b for b in bound)
    ]
    for path in masks:
        args += ["--tmpfs", path]
    args += ["--perms", "0755", "--size", str(1024 * 1024), "--tmpfs", "/tmp"]
    masks.append("/tmp")
    for prefix in prefixes:
        mask = next((m for m in masks if _under(prefix, m)), None)
        if mask is None and any(_under(prefix, b) for b in bound):
            continue  # already visible (/usr/local)
        args += _mkdirs(prefix, mask or "/") + ["--ro-bind", prefix, prefix]
    return args


def default_hidden_paths(base: tuple[str, ...]) -> tuple[str, ...]:
    """`base` plus where the trainer writes: FLYWHEEL_HOME (./.flywheel unset), the model cache
    ($FLYWHEEL_MODEL_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/agentic-flywheel/models) and the
    working dir (the repo, with its data). Masked wherever they lie under a bound dir; the
    allowlist already leaves them out everywhere else."""
    cache = os.environ.get("FLYWHEEL_MODEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "agentic-flywheel", "models"
    )
    home = os.environ.get("FLYWHEEL_HOME", "").strip() or "./.flywheel"
    try:
        cwd = [os.getcwd()]
    except FileNotFoundError:  # deleted under us: nothing there to hide
        cwd = []
    extra = [os.path.abspath(os.path.expanduser(p)) for p in (home, cache, *cwd)]
    return tuple(dict.fromkeys([*base, *extra]))


# --- uid ranges: one per pool, allocated -----------------------------------------------------
# Pools take ranges from ALLOCATED_UID_BASE on, each UID_RANGE_SIZE uids, none of them owning a
# host file. They start above the explicit `uid_base`s in use (DEFAULT_UID_BASE + up to ~50M).
ALLOCATED_UID_BASE = 1_600_000_000
UID_RANGE_SIZE = 1024
UID_RANGES = 4096
# One lock file per range; every process on the host must look in the same place: /run (root's,
# the bubblewrap pool runs as root), else a root-owned dir under /tmp.
UID_LOCK_DIRS = ("/run/agentic-flywheel/sandbox-uids", "/tmp/agentic-flywheel-sandbox-uids")


def _lock_dir() -> str:
    for path in UID_LOCK_DIRS:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            info = os.lstat(path)
        except OSError:
            continue
        # a dir another user made (or a symlink) could steer where we create files, or be emptied
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022:
            return path
    raise RuntimeError(f"no usable directory for sandbox uid locks (tried {', '.join(UID_LOCK_DIRS)})")


class UidLease:
    """A uid range held by this process: an exclusive flock on the range's lock file, kept until
    release() or until the process ends (a crash frees it; the kernel drops the lock with the last
    fd). flock locks belong to an open file, so two pools in one process get two ranges too."""

    def __init__(self, base: int, fd: int) -> None:
        self.base, self._fd = base, fd

    @classmethod
    def acquire(cls, count: int) -> UidLease:
        if count > UID_RANGE_SIZE:
            raise ValueError(f"a sandbox pool of {count} workers needs more than {UID_RANGE_SIZE} uids")
        directory = _lock_dir()
        for slot in range(UID_RANGES):
            fd = os.open(f"{directory}/{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return cls(ALLOCATED_UID_BASE + slot * UID_RANGE_SIZE, fd)
        raise RuntimeError(f"all {UID_RANGES} sandbox uid ranges are held (lock files in {directory})")

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


# --- memory: a cgroup per worker -------------------------------------------------------------


def _cgroup_mounts() -> dict[int, tuple[str, str]]:
    """{2: (mount root, mount point)} for cgroup2, {1: ...} for a v1 hierarchy with `memory`."""
    found: dict[int, tuple[str, str]] = {}
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, (fstype, _source, options) = left.split(), right.split()[:3]
            if fstype == "cgroup2":
                found.setdefault(2, (fields[3], fields[4]))
            elif fstype == "cgroup" and "memory" in options.split(","):
                found.setdefault(1, (fields[3], fields[4]))
    return found


def _own_cgroups() -> dict[int, str]:
    found = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "":
                found[2] = path
            elif "memory" in controllers.split(","):
                found[1] = path
    return found


def memory_cgroup_parent() -> tuple[str, int] | None:
    """(dir, version) under which this process may create memory-limited cgroups, or None.

    v2: our own cgroup if `memory` is in its subtree_control (only the root cgroup may hold
    processes and delegate controllers), else its parent if it delegates `memory` to us and our
    siblings. v1: our own memory cgroup (v1 allows processes in inner nodes). Needs root.
    """
    try:
        mounts, own = _cgroup_mounts(), _own_cgroups()
    except OSError:
        return None
    for version in (2, 1):
        if version not in mounts or version not in own:
            continue
        root, point = mounts[version]
        if not _under(own[version], root):
            continue
        here = os.path.normpath(point + "/" + os.path.relpath(own[version], root))
        candidates = [here] if version == 1 else [here, os.path.dirname(here)] if here != point else [here]
        for path in candidates:
            if not _under(path, point) or not os.access(path, os.W_OK):
                continue
            if version == 1:
                return path, 1
            try:
                with open(f"{path}/cgroup.subtree_control") as fh:
                    if "memory" in fh.read().split():
                        return path, 2
            except OSError:
                continue
    return None


class MemoryCgroup:
    """One worker's cgroup, bounding all memory charged by the worker and every process of its calls:
    anonymous memory, tmpfs and memfd pages, SysV/POSIX shm, pipe and socket buffers (v2 counts kernel
    memory; v1 here does too). Swap is off for it, so nothing is pushed out to make room."""

    def __init__(self, path: str, version: int) -> None:
        self.path, self.version = path, version

    @classmethod
    def create(cls, name: str, limit_bytes: int) -> MemoryCgroup | None:
        """The cgroup `name` (made, or reused after a crash) limited to `limit_bytes`; None where
        this host gives us no memory cgroup (the seccomp and tmpfs bounds still apply)."""
        found = memory_cgroup_parent()
        if found is None:
            return None
        parent, version = found
        group = cls(f"{parent}/agentic-flywheel-sandbox-{name}", version)
        try:
            os.makedirs(group.path, exist_ok=True)
            if version == 2:
                group._write("memory.max", limit_bytes)
                group._write("memory.swap.max", 0, optional=True)
            else:  # memsw (memory + swap) must stay >= the memory limit: order by direction
                try:
                    group._write("memory.limit_in_bytes", limit_bytes)
                    group._write("memory.memsw.limit_in_bytes", limit_bytes, optional=True)
                except OSError:
                    group._write("memory.memsw.limit_in_bytes", limit_bytes, optional=True)
                    group._write("memory.limit_in_bytes", limit_bytes)
        except OSError as exc:
            log.warning("sandbox: no memory cgroup at %s (%s); memory is bounded per process only", group.path, exc)
            group.remove()
            return None
        return group

    def _write(self, name: str, value: int, optional: bool = False) -> None:
        try:
            with open(f"{self.path}/{name}", "w") as fh:
                fh.write(str(value))
        except FileNotFoundError:
            if not optional:
                raise

    def attach(self, pid: int) -> None:
        """Move `pid` in; what it forks later starts in the cgroup."""
        self._write("cgroup.procs", pid)

    def oom_kills(self) -> int:
        """Processes the kernel killed for this cgroup's limit so far."""
        try:
            with open(f"{self.path}/{'memory.events' if self.version == 2 else 'memory.oom_control'}") as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            pass
        return 0

    def remove(self) -> None:
        """rmdir, once the worker's processes are gone (the kernel may take a moment to reap them)."""
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    return
                time.sleep(0.01)


def worker_pid(bwrap_pid: int) -> int | None:
    """Host pid of the worker (pid 2 in its namespace) among bwrap's descendants."""
    todo = [bwrap_pid]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/status") as fh:
                nspid = next(line for line in fh if line.startswith("NSpid:")).split()
            if pid != bwrap_pid and nspid[-1] == "2":
                return pid
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    todo += [int(child) for child in fh.read().split()]
        except (OSError, StopIteration):
            continue
    return None
