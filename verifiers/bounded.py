"""A time bound for verifier work that its input caps cannot bound: run it in a child process
and kill the child when the deadline passes.

The reward runs in the trainer's process, and a policy is an optimizer: if some 43-character
answer makes sympy think for 18 s, it will find it, and every step stalls on it. Most verifier
work is bounded by construction (numbers of at most 64 characters, EM over at most 512, code
in the sandbox under its own limits); what is not (symbolic evaluation) goes through
`call_with_deadline`, which returns `None` when the work did not finish in time. The caller
turns that into an *unscorable* verdict, never a 0 or a 1.

    result = call_with_deadline(_symbolic_job, (pred, gold), timeout_s=1.0)   # None: too slow

The child is a long-lived interpreter (`python -m verifiers.bounded`) that imports the job's
module once and then serves calls, so a call costs a pipe round trip, not a process start. A
child past its deadline is killed (SIGKILL: nothing in it is trusted to stop) and the next call
starts a fresh one. Jobs are module-level functions named by module and qualified name; their
arguments and results are pickled between our own two processes (nothing from the policy is
ever unpickled: the child pickles results it computed itself).
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

_MAX_FRAME = 16 * 1024 * 1024
_START_TIMEOUT_S = 60.0  # a cold start imports sympy; a busy CI machine can take seconds


class DeadlineExceeded(Exception):
    pass


def _write(fd: int, payload: bytes) -> None:
    data = memoryview(struct.pack(">I", len(payload)) + payload)
    while data:
        data = data[os.write(fd, data) :]


def _read(fd: int, deadline: float | None) -> bytes:
    def exact(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                    raise DeadlineExceeded
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise EOFError("bounded worker closed its pipe")
            buf += chunk
        return bytes(buf)

    (size,) = struct.unpack(">I", exact(4))
    if size > _MAX_FRAME:
        raise EOFError(f"oversized frame ({size} bytes)")
    return exact(size)


class _Child:
    """One `python -m verifiers.bounded` process, spoken to over its stdin/stdout."""

    def __init__(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "verifiers.bounded"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            bufsize=0,
        )

    def call(self, fn: Callable, args: tuple, timeout_s: float) -> Any:
        _write(self.proc.stdin.fileno(), pickle.dumps((fn.__module__, fn.__qualname__, args)))
        ok, value = pickle.loads(_read(self.proc.stdout.fileno(), time.monotonic() + timeout_s))
        if not ok:
            raise RuntimeError(value)
        return value

    def warm(self, module: str, setup: Callable | None) -> None:
        """Import `module` and run `setup()` in the child, so that no deadline is charged the
        start-up (sympy's import alone takes ~1 s)."""
        if setup is not None:
            self.call(setup, (), _START_TIMEOUT_S)
        _write(self.proc.stdin.fileno(), pickle.dumps((module, None, ())))
        _read(self.proc.stdout.fileno(), time.monotonic() + _START_TIMEOUT_S)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()


class BoundedRunner:
    """Calls jobs in a child process under a wall-clock deadline, one at a time."""

    def __init__(self) -> None:
        self._child: _Child | None = None
        self._owner = os.getpid()  # a forked copy of this process must not share the child's pipes
        self._lock = threading.Lock()
        self.timeouts = 0  # children killed at their deadline (reported by tests and benchmarks)

    def call(self, fn: Callable, args: tuple, *, timeout_s: float, setup: Callable | None = None) -> Any:
        """fn(*args) in the child; raises DeadlineExceeded if it does not finish in timeout_s
        (the child is killed), RuntimeError naming the exception if the job raised. A fresh
        child first runs `setup()` (imports, caches) outside the deadline."""
        with self._lock:
            if self._owner != os.getpid():
                self._child, self._owner = None, os.getpid()
            if self._child is None or self._child.proc.poll() is not None:
                self._child = _Child()
                self._child.warm(fn.__module__, setup)
            try:
                return self._child.call(fn, args, timeout_s)
            except DeadlineExceeded:
                self.timeouts += 1
                self._child.kill()
                self._child = None
                raise
            except (OSError, EOFError, pickle.UnpicklingError) as exc:
                self._child.kill()
                self._child = None
                raise RuntimeError(f"bounded worker died: {exc!r}") from None

    def close(self) -> None:
        with self._lock:
            if self._child is not None:
                self._child.kill()
                self._child = None


_RUNNER = BoundedRunner()


def call_with_deadline(fn: Callable, args: tuple, *, timeout_s: float, setup: Callable | None = None) -> Any:
    """fn(*args) under a wall-clock bound, in the process-wide runner. Raises DeadlineExceeded."""
    return _RUNNER.call(fn, args, timeout_s=timeout_s, setup=setup)


def runner() -> BoundedRunner:
    return _RUNNER


def _serve() -> None:
    import importlib

    rfd, wfd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # a stray print in a job cannot corrupt a reply
    while True:
        try:
            module, qualname, args = pickle.loads(_read(rfd, None))
        except EOFError:
            return
        try:
            target = importlib.import_module(module)
            for part in qualname.split(".") if qualname else ():
                target = getattr(target, part)
            reply = (True, target(*args) if qualname else None)
        except Exception as exc:  # noqa: BLE001 — reported to the caller, who makes it unscorable
            reply = (False, f"{type(exc).__name__}: {str(exc)[:200]}")
        _write(wfd, pickle.dumps(reply))


if __name__ == "__main__":
    _serve()
