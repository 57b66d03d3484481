"""The task pool: which training tasks a round samples, re-weighted from measured pass rates.

A GRPO group teaches nothing when every sample gets the same reward: a task the policy always
solves, or never does (DAPO's dynamic sampling drops such groups after the fact; WebRL's
self-evolving curriculum stops drawing them). So after each round the pass rate of every task
that was tried is accumulated, and the next round draws:

    never tried                       weight 1        (explore)
    tried < min_attempts times        weight 1        (not enough evidence yet)
    pass rate >= solved_above         weight 0        (always solved: no signal)
    pass rate <= unsolved_below       weight 0        (never solved: no signal, yet)
    otherwise                         weight 1, or 4 p (1 - p) with `weighting: variance`
                                      (the expected reward variance of a group, max 1 at p = 1/2)

Pure functions over plain rows; `pool_frame` is the table the `rl_round` asset stores as `task_pool`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping

import pandas as pd

from configs.schema import CurriculumConfig

HISTORY_COLUMNS = ("task_id", "family", "level", "attempts", "successes", "pass_rate", "rounds", "last_round", "weight")


def update_history(history: Iterable[Mapping], rewards: Iterable[Mapping], round_index: int) -> dict[str, dict]:
    """Fold one round's verified rewards (one row per trajectory) into the per-task history.
    `successes` sums the outcome (1 right, 0 wrong, fractions for partial unit-test credit);
    unscorable trajectories (outcome None/NaN) are not attempts."""
    out = {str(h["task_id"]): {k: h[k] for k in HISTORY_COLUMNS if k in h} for h in history}
    seen_now: set[str] = set()
    for r in rewards:
        outcome = r.get("outcome")
        if outcome is None or (isinstance(outcome, float) and math.isnan(outcome)):
            continue
        task_id = str(r["task_id"])
        h = out.setdefault(
            task_id,
            {
                "task_id": task_id,
                "family": r.get("family", ""),
                "level": int(r.get("level", 0)),
                "attempts": 0,
                "successes": 0.0,
                "rounds": 0,
                "last_round": 0,
            },
        )
        h["attempts"] += 1
        h["successes"] += float(outcome)
        if task_id not in seen_now:
            h["rounds"], h["last_round"] = h["rounds"] + 1, round_index
            seen_now.add(task_id)
    for h in out.values():
        h["pass_rate"] = h["successes"] / h["attempts"] if h["attempts"] else float("nan")
    return out


def task_weight(h: Mapping | None, cfg: CurriculumConfig) -> float:
    if h is None or h["attempts"] < cfg.min_attempts:
        return 1.0
    p = h["successes"] / h["attempts"]
    if p >= cfg.solved_above or p <= cfg.unsolved_below:
        return 0.0
    return 4 * p * (1 - p) if cfg.weighting == "variance" else 1.0


def pool_weights(task_ids: Iterable[str], history: Mapping[str, Mapping], cfg: CurriculumConfig) -> dict[str, float]:
    """Sampling weight per training task. If every task would get weight 0 (all mastered or all
    hopeless), fall back to uniform: a round must still have prompts."""
    ids = list(task_ids)
    if not cfg.enabled:
        return dict.fromkeys(ids, 1.0)
    weights = {t: task_weight(history.get(t), cfg) for t in ids}
    return weights if any(weights.values()) else dict.fromkeys(ids, 1.0)


def sample_prompts(tasks: list[dict], weights: Mapping[str, float], k: int, rng: random.Random) -> list[dict]:
    """k distinct tasks, drawn with probability proportional to weight (Efraimidis-Spirakis
    keys u^(1/w)); zero-weight tasks are drawn only if fewer than k have weight."""
    keyed = []
    for task in tasks:
        w = weights.get(task["task_id"], 1.0)
        keyed.append((rng.random() ** (1.0 / w) if w > 0 else -rng.random(), task))
    keyed.sort(key=lambda pair: pair[0], reverse=True)
    return [task for _, task in keyed[: min(k, len(tasks))]]


def pool_frame(history: Mapping[str, Mapping], tasks: list[dict], cfg: CurriculumConfig) -> pd.DataFrame:
    """Every training task with its history (zeros when never tried) and its next-round weight."""
    rows = []
    for t in tasks:
        h = history.get(t["task_id"]) or {
            "attempts": 0,
            "successes": 0.0,
            "pass_rate": float("nan"),
            "rounds": 0,
            "last_round": 0,
        }
        rows.append(
            {
                "task_id": t["task_id"],
                "family": t["family"],
                "level": int(t["level"]),
                "attempts": int(h["attempts"]),
                "successes": float(h["successes"]),
                "pass_rate": float(h["pass_rate"]),
                "rounds": int(h["rounds"]),
                "last_round": int(h["last_round"]),
                "weight": task_weight(h if h["attempts"] else None, cfg) if cfg.enabled else 1.0,
            }
        )
    return pd.DataFrame(rows, columns=list(HISTORY_COLUMNS))
