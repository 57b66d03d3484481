"""Exclusive locks between the processes of one machine: one run at a time works on an RL round
(training it, writing its checkpoint, benchmarking and registering it), and one process at a time
reads, compares and writes the model registry (registration, promotion, rollback).

A lock is an advisory `fcntl.flock` on a lock file. The kernel releases it when the process
holding it exits in any way (SIGKILL, a crash, a reboot), so a killed run never leaves a stale
lock behind. The file's content says who holds it (Dagster run, step, pid, host, since when);
it is only read to tell a refused caller who is in the way.

Processes on other machines (the cluster's step pods) do not share the file: there the Dagster run
queue keeps one run per round partition (`pipelines/instance.py`), and promotion is still a
compare-and-set on the champion (`assets/tracking.py`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dagster import Failure


class Busy(Failure):
    """The lock is held by someone else. Not retried: a retry would redo the other run's work
    (or wait on it) behind the user's back; the message says who holds it and what to do."""

    def __init__(self, message: str):
        super().__init__(description=message, allow_retries=False)


def holder(path: Path) -> dict[str, Any]:
    """Who holds the lock at `path`, as its holder recorded it ({} if nobody says). A holder
    writes its record right after taking the lock, so an empty file is read again briefly."""
    for _ in range(20):
        try:
            text = path.read_text()
        except OSError:
            return {}
        if text:
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                pass  # being rewritten
        time.sleep(0.025)
    return {}


def describe(record: dict[str, Any]) -> str:
    who = f"Dagster run {record['run_id']}" if record.get("run_id") else "another process"
    step = f"step {record['step']}, " if record.get("step") else ""
    return f"{who} ({step}pid {record.get('pid', '?')} on {record.get('host', '?')}, since {record.get('since', '?')})"


@contextlib.contextmanager
def exclusive(path: Path, what: str, record: dict[str, Any], *, wait_s: float = 0.0, then: str = "") -> Iterator[None]:
    """Hold the lock at `path` while the block runs, recording `record` (plus pid, host, time) as
    its holder. If another process holds it, wait up to `wait_s` seconds (0: not at all), then
    raise Busy: "`what` is held by <holder>. `then`"."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Busy(f"{what} is held by {describe(holder(path))}." + (f" {then}" if then else "")) from None
                time.sleep(0.05)
        mine = {
            **record,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(mine).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # the only descriptor of this open file: closing it releases the lock


def round_lock(cache_dir: str, context) -> contextlib.AbstractContextManager[None]:
    """The lock on the round of `context`'s partition, taken by every step that trains, writes,
    benchmarks or registers that round. A second run of the same round is refused at once,
    naming the run in its way, before it reads or writes anything of the round."""
    key = context.partition_key
    return exclusive(
        Path(cache_dir) / "locks" / f"rl-round-{key}.lock",
        f"RL round {key}",
        {"run_id": context.run_id, "step": context.op_def.name},
        then=f"This run stops without touching the round; wait for that run to finish (or stop it), then launch round {key} again.",
    )
