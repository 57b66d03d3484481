"""Retrying a call to a store that may be unavailable for a while (the MLflow tracking store: a
sqlite file another process holds locked, a tracking server restarting).

Exponential back-off with jitter (the delay doubles from `first_delay_s` up to `max_delay_s`, and
each pause is drawn from its upper half so that processes waiting on the same store do not all
come back at once), bounded twice: at most `attempts` calls, and no pause that would end past
`budget_s` since the first call. Then the last error is raised inside `StoreUnavailable`, naming
the store and the operation, so an outage fails the step loudly instead of losing what the call
was writing. Errors the caller does not call transient (a missing run, a bad parameter) are
raised at once, unchanged.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class StoreUnavailable(RuntimeError):
    """A store stayed unavailable through every retry. Deliberately not the store's own exception
    type: code that treats "not found" as an answer (no champion yet) must not read an outage so."""


@dataclass(frozen=True)
class Backoff:
    attempts: int = 6  # calls in all, the first included
    first_delay_s: float = 1.0  # pause after the first failure; doubles after each one
    max_delay_s: float = 30.0
    budget_s: float = 120.0  # no pause may end later than this after the first call

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.first_delay_s < 0 or self.max_delay_s < self.first_delay_s or self.budget_s < 0:
            raise ValueError(
                f"invalid back-off {self}: needs attempts >= 1 and 0 <= first_delay_s <= max_delay_s, budget_s >= 0"
            )


def backoff_delays(policy: Backoff, rng: random.Random) -> list[float]:
    """The pause before the 2nd, 3rd, ... attempt: min(max_delay_s, first_delay_s * 2**i), drawn
    uniformly from its upper half ("equal jitter"). attempts - 1 values."""
    caps = [min(policy.max_delay_s, policy.first_delay_s * 2**i) for i in range(policy.attempts - 1)]
    return [cap / 2 + rng.random() * cap / 2 for cap in caps]


def redact(text: str) -> str:
    """`scheme://user:password@host` -> `scheme://***@host`: store URIs may carry credentials."""
    return re.sub(r"(?<=://)[^/@\s]+@", "***@", text)


def call_with_retries(
    fn: Callable[[], T],
    *,
    operation: str,
    store: str,
    is_transient: Callable[[BaseException], bool],
    policy: Backoff = Backoff(),
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> T:
    """`fn()`, called again after a pause each time it raises an error `is_transient` accepts;
    StoreUnavailable once the attempts or the time budget are spent."""
    start = clock()
    delays = backoff_delays(policy, rng or random.Random())
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc):
                raise
            elapsed = clock() - start
            if attempt == policy.attempts or elapsed + delays[attempt - 1] > policy.budget_s:
                raise StoreUnavailable(
                    f"{redact(store)} unavailable: {operation} failed {attempt} time(s) over {elapsed:.1f}s "
                    f"(back-off: {policy.attempts} attempts, {policy.budget_s:.0f}s budget); the step stops here rather than go on without it. "
                    f"Last error: {type(exc).__name__}: {redact(str(exc))[:500]}"
                ) from exc
            log.warning(
                "%s: %s failed (%s), attempt %d of %d; retrying in %.1fs",
                redact(store),
                operation,
                type(exc).__name__,
                attempt,
                policy.attempts,
                delays[attempt - 1],
            )
            sleep(delays[attempt - 1])
    raise AssertionError("unreachable: the last attempt returns or raises")
