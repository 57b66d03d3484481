"""Failpoints: named places where a test makes this process die exactly as `kill -9` would, to
prove that a run killed there resumes (tests/pipelines/test_kill_resume.py). The idea of fail-rs and gofail:
a kill from outside lands wherever the process happens to be, while a failpoint lands inside the
stage under test every time.

    FLYWHEEL_FAILPOINT=rl.verify@3   # SIGKILL this process the 3rd time it reaches rl.verify

Unset (always, outside tests), `failpoint()` is one dictionary lookup. The points:

| name | where |
|---|---|
| `sft.step` | after an SFT optimizer step (and its state checkpoint, when one is due) |
| `rl.rollout` | in the agent loop: after each turn's tools (HF), after each engine step (vLLM) |
| `rl.verify` | in the verifier cascade, after the fast tier and before the sandboxed one |
| `rl.update` | after an RL step's update, before its state checkpoint |
| `benchmark` | after a batch of benchmark episodes is scored |
| `run.created` | at each event of a run `make run` launches: the first is logged while the run is stored but not started (`pipelines/run.py::execute`) |
"""

from __future__ import annotations

import os
import signal
from collections import Counter

ENV = "FLYWHEEL_FAILPOINT"
POINTS = ("sft.step", "rl.rollout", "rl.verify", "rl.update", "benchmark", "run.created")
_hits: Counter[str] = Counter()


def failpoint(name: str) -> None:
    """SIGKILL this process if FLYWHEEL_FAILPOINT names this point and this is the hit it asks for."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    target, _, nth = spec.partition("@")
    if target not in POINTS:
        raise ValueError(f"{ENV}={spec!r}: unknown failpoint {target!r}; the points are {', '.join(POINTS)}")
    if target != name:
        return
    _hits[name] += 1
    if _hits[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
