"""Held-out benchmark: sampled pass@1 with a confidence interval, greedy pass@1, tool use.

Primary pass@1 is estimated by sampling at the rollout temperature (k samples per task,
averaged), as DeepSeek-R1 reports it: greedy decoding shows only the argmax behaviour and hides
a mixed policy (FIELD-NOTES calibration). The promotion gate compares two checkpoints on the
same tasks with a *paired* interval, which is much tighter than two independent ones.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING

from configs.failpoints import failpoint
from training.graduation import count_calls

if TYPE_CHECKING:
    from configs.schema import RolloutConfig
    from environments.tools import Tool
    from training.agent.engines import RolloutEngine
    from verifiers.cascade import Cascade


def evaluate_policy(
    engine: RolloutEngine,
    tokenizer,
    tasks: list[dict],
    tools: dict[str, Tool],
    rollout: RolloutConfig,
    cascade: Cascade,
    *,
    samples_per_task: int,
    temperature: float,
    greedy: bool,
    seed: int,
    batch_size: int,
) -> list[dict]:
    """One row per task: mean outcome over its samples, tool calls and turns."""
    # imported here, not with the module: the statistics below serve the registry's commands
    # (`make models`, `make promote`), which should not load torch and transformers to start
    from training.agent.loop import run_episodes
    from training.rl.scoring import Verifying, episode_record

    k = 1 if greedy else samples_per_task
    rows = []
    per_batch = max(1, batch_size // k)
    by_id = {t["task_id"]: t for t in tasks}

    def to_record(episode):
        return episode_record(episode, round_index=0, step=0, policy_version="eval", tokenizer=tokenizer)

    for start in range(0, len(tasks), per_batch):
        chunk = tasks[start : start + per_batch]
        # finished episodes are verified while the rest of the batch generates (if the profile says so)
        with Verifying(to_record, by_id, tokenizer, cascade, background=rollout.verify_during_rollout) as verifying:
            episodes = run_episodes(
                engine,
                tokenizer,
                chunk,
                group_size=k,
                tools=tools,
                cfg=rollout,
                greedy=greedy,
                temperature=temperature,
                sampling_key=f"benchmark/seed={seed}",
                on_finished=verifying,
            )
            records, scores = verifying.results(episodes)
        failpoint("benchmark")
        by_task: dict[str, list] = {}
        for record, score in zip(records, scores):
            by_task.setdefault(record["task_id"], []).append((record, score))
        for task in chunk:
            pairs = by_task[task["task_id"]]
            counted = [count_calls(r["tool_calls"]) for r, _ in pairs]
            rows.append(
                {
                    "task_id": task["task_id"],
                    "family": task["family"],
                    "level": int(task["level"]),
                    "score": sum((s["outcome"] or 0.0) for _, s in pairs) / len(pairs),
                    "samples": len(pairs),
                    # for pass@k: every test passed, the answer right
                    "solved": sum((s["outcome"] or 0.0) >= 1.0 for _, s in pairs),
                    "tool_call_rate": sum(r["num_tool_calls"] > 0 for r, _ in pairs) / len(pairs),
                    "turns": sum(r["turns"] for r, _ in pairs) / len(pairs),
                    # what the SFT graduation exam grades (training/graduation.py)
                    "well_formed": sum(s["well_formed"] for _, s in pairs) / len(pairs),
                    "tool_calls": sum(calls for calls, _ in counted),
                    "tool_calls_valid": sum(valid for _, valid in counted),
                }
            )
    return rows


def mean_ci(values: list[float], confidence: float) -> tuple[float, float, float]:
    """Mean and a normal-approximation interval (per-task scores are bounded, n >= 1000)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values to summarize")
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    half = NormalDist().inv_cdf(0.5 + confidence / 2) * math.sqrt(var / n)
    return mean, mean - half, mean + half


def paired_difference(new: dict[str, float], old: dict[str, float], confidence: float) -> tuple[float, float, float]:
    """Mean and CI of (new - old) over the tasks both were scored on."""
    common = sorted(set(new) & set(old))
    if not common:
        raise ValueError("the two score sets share no task ids")
    return mean_ci([new[t] - old[t] for t in common], confidence)


def summarize(rows: list[dict], confidence: float, pass_at_k: tuple[int, ...] | list[int] = ()) -> dict[str, float]:
    """pass@1 (the mean outcome) overall, per family and level, with CIs; and for each k in
    `pass_at_k` that every task has samples for, the unbiased pass@k with a bootstrap CI, overall
    and per family."""
    pass_at_1, low, high = mean_ci([r["score"] for r in rows], confidence)
    summary = {
        "pass_at_1": pass_at_1,
        "pass_at_1_ci_low": low,
        "pass_at_1_ci_high": high,
        "tool_call_rate": sum(r["tool_call_rate"] for r in rows) / len(rows),
        "mean_turns": sum(r["turns"] for r in rows) / len(rows),
        "num_tasks": float(len(rows)),
    }
    for family in sorted({r["family"] for r in rows}):
        of_family = [r for r in rows if r["family"] == family]
        mean, low, high = mean_ci([r["score"] for r in of_family], confidence)
        summary.update(
            {
                f"{family}/pass_at_1": mean,
                f"{family}/pass_at_1_ci_low": low,
                f"{family}/pass_at_1_ci_high": high,
                f"{family}/tool_call_rate": sum(r["tool_call_rate"] for r in of_family) / len(of_family),
            }
        )
        for level in sorted({r["level"] for r in of_family}):
            at = [r for r in of_family if r["level"] == level]
            summary[f"{family}/level_{level}/pass_at_1"] = sum(r["score"] for r in at) / len(at)
            summary[f"{family}/level_{level}/tool_call_rate"] = sum(r["tool_call_rate"] for r in at) / len(at)
    for k in pass_at_k:
        if all(r.get("samples", 1) >= k for r in rows):
            for prefix, of in [("", rows)] + [
                (f"{f}/", [r for r in rows if r["family"] == f]) for f in sorted({r["family"] for r in rows})
            ]:
                mean, low, high = pass_at_k_ci([(r["samples"], r["solved"]) for r in of], k, confidence)
                summary.update(
                    {
                        f"{prefix}pass_at_{k}": mean,
                        f"{prefix}pass_at_{k}_ci_low": low,
                        f"{prefix}pass_at_{k}_ci_high": high,
                    }
                )
    return summary


def gate_scores(rows: list[dict], k: int = 1) -> dict[str, float]:
    """Per task, what the promotion gate compares: the mean outcome (k = 1), or the task's
    unbiased pass@k (`benchmark.gate_k`)."""
    return {r["task_id"]: r["score"] if k == 1 else pass_at_k(r["samples"], r["solved"], k) for r in rows}


def suite_summary(
    name: str, rows: list[dict], over_budget: int, confidence: float, pass_at_k: tuple[int, ...] | list[int] = ()
) -> dict[str, float]:
    """A benchmark suite's figures as `<name>.<metric>` (pass@1 and pass@k with CIs, tool-call
    rate, tasks, and how many prompts did not fit the suite's token budget: scored 0, not run)."""
    whole = {k: v for k, v in summarize(rows, confidence, pass_at_k).items() if "/" not in k}
    return {f"{name}.{k}": v for k, v in {**whole, "over_budget": float(over_budget)}.items()}


def promotion_decision(
    new: dict[str, float], champion: dict[str, float] | None, confidence: float, margin: float
) -> dict[str, float | bool]:
    """Promote iff the lower bound of the paired CI of (new - champion) is above `margin`
    (default 0): the improvement must be measurable, not a lucky draw. No champion -> promote."""
    if champion is None:
        return {"promote": True, "diff": float("nan"), "diff_ci_low": float("nan"), "diff_ci_high": float("nan")}
    diff, low, high = paired_difference(new, champion, confidence)
    return {"promote": low > margin, "diff": diff, "diff_ci_low": low, "diff_ci_high": high}


# --------------------------------------------------------------------------- pass@k
def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n samples of which c passed (Chen et al. 2021):
    1 - C(n - c, k) / C(n, k), the chance that k of the n samples, drawn without replacement,
    hold at least one pass. Computed as a running product (the paper's numerically stable form)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    fail_all = 1.0
    for i in range(n - c + 1, n + 1):
        fail_all *= 1.0 - k / i
    return 1.0 - fail_all


def pass_at_k_ci(
    counts: list[tuple[int, int]], k: int, confidence: float, *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean pass@k over tasks, given (n, c) per task, and a percentile bootstrap interval over
    tasks (pass@k of a task is not 0/1 for k > 1, and near 0 or 1 a normal interval would leave
    [0, 1]). Seeded: the same counts give the same interval."""
    import random

    if not counts:
        raise ValueError("no tasks to estimate pass@k on")
    per_task = [pass_at_k(n, c, k) for n, c in counts]
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(per_task, k=len(per_task))) / len(per_task) for _ in range(resamples))
    tail = (1 - confidence) / 2
    low, high = means[int(tail * resamples)], means[min(resamples - 1, int((1 - tail) * resamples))]
    return sum(per_task) / len(per_task), low, high
