"""Process signals from tools: a per-turn shaping term and its turn-level credit (issue 29, item 2).

A tool's result says something about the turn that called it before the outcome does: a
traceback, a compile error, a timeout, an empty search. `reward.process` turns each into a
penalty on that turn (never a bonus: a bonus per clean call pays for calls, and a policy would
make more of them).

    signal_k  = -penalties[kind of the result of turn k's call]   (0 for a clean call, the answer turn
                                                                   and a sandbox failure: not the policy's)
    total     = max(sum_k signal_k, -cap)                           cap counts among the shaping caps,
                                                                   which sum below reward.outcome_weight:
                                                                   the outcome keeps over half the range

Credit (`reward.process.credit`):

* `trajectory`: `total` is one more reward component (`reward_process`), like the other shaping
  terms; every token of the trajectory gets the sequence's advantage.
* `turn`: the outcome estimator sees the reward without it, and each policy turn k gets a
  turn-level advantage on its tokens, from the discounted return of the signals from k on:

      G_k   = sum_{j >= k} gamma^(j-k) * signal_j        (capped at -cap like the total)
      A_t   = A_sequence + turn_weight * (G_k - mean_g G) / (std_g G + eps)   for t in turn k

  where mean_g and std_g pool every turn of the group's trajectories (GiGPO's step-level term with
  the group as the anchor set: our tasks have no repeated intermediate states to group by). A
  turn that led to an error is pushed down relative to the group's other turns; the answer turn
  and the turns after the last error get G = 0. `turn_weight <= 1`: the turn term never weighs
  more than the outcome's.
"""

from __future__ import annotations

import math

# A tool result's `error` -> the kind of signal it is. Anything else (a sandbox that failed to
# start, a worker that died) is the infrastructure's failure, not the policy's: no signal.
ERROR_KINDS = {
    "nonzero_exit": "error",  # a traceback, a SyntaxError: the code did not run to the end
    "timeout": "timeout",
    "cpu_limit": "timeout",
    "memory": "error",
    "no_results": "empty_search",
}


def signal_kind(error: str | None) -> str | None:
    if error is None:
        return None
    if error.startswith("killed:"):
        return "error"
    return ERROR_KINDS.get(error)


def turn_signals(tool_calls: list[dict], penalties: dict[str, float]) -> list[float]:
    """One signal per tool call (the turn that made it), <= 0, in call order."""
    signals = []
    for call in tool_calls:
        kind = signal_kind(call.get("error"))
        signals.append(-float(penalties.get(kind, 0.0)) if kind is not None else 0.0)
    return signals


def process_total(signals: list[float], cap: float) -> float:
    """The trajectory's process term: the sum of its turn signals, no lower than -cap."""
    return max(sum(signals), -cap) if signals else 0.0


def turn_returns(signals: list[float], gamma: float, cap: float) -> list[float]:
    """G_k for every turn that called a tool, then 0 for the final turn: the discounted sum of
    the signals from turn k on, no lower than -cap."""
    returns, running = [], 0.0
    for signal in reversed(signals):
        running = signal + gamma * running
        returns.append(max(running, -cap))
    return [*reversed(returns), 0.0]


def turn_advantages(returns: list[list[float]], group_ids: list[str], eps: float = 1e-6) -> list[list[float]]:
    """(G - mean) / (std + eps) per turn, the moments pooled over every turn of a trajectory's
    group (population std). A group whose turns all have the same return gets zeros."""
    pooled: dict[str, list[float]] = {}
    for row, group in zip(returns, group_ids):
        pooled.setdefault(group, []).extend(row)
    moments = {}
    for group, values in pooled.items():
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        moments[group] = (mean, std)
    out = []
    for row, group in zip(returns, group_ids):
        mean, std = moments[group]
        out.append([0.0 if std < eps else (g - mean) / (std + eps) for g in row])
    return out


def on_turn_tokens(per_turn: list[float], tool_mask: list[int]) -> list[float]:
    """A value per policy turn spread on that turn's tokens (the k-th run of mask 1); 0 on tool
    output. Turns past the values given (a trajectory cut after a call) get the last value."""
    out, turn, previous = [], -1, 0
    for m in tool_mask:
        if m and not previous:
            turn += 1
        out.append(per_turn[min(turn, len(per_turn) - 1)] if m and per_turn else 0.0)
        previous = m
    return out
