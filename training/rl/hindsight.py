"""Hindsight relabeling (issue 29, item 4): a failed trajectory whose own tool output showed the
answer becomes a corrected SFT example for the next steps and the next round.

The policy often does the work and then fails to use it: the interpreter printed 391 and the
policy answered 319, a retry after a traceback printed the right number and the policy kept
going, the second search hop returned the passage with the answer and the policy searched on.
Relabeled, such an episode is a demonstration the policy could have produced itself:

    kept      = the completion up to the end of the first observation that shows the gold answer
    corrected = kept + the answer turn <answer>gold</answer>
    loss mask = policy tokens of `kept`, minus the calls whose result was an error (a traceback, a
                timeout, an empty search: trained like the SFT data's detours, seen but not
                imitated), plus the answer turn

It is trained as an auxiliary NLL next to the RL loss (training/rl/loop.py; `rl.hindsight`), so
the outcome reward still decides what RL reinforces; the relabels only show how the failure ends
when the observation is read.

What "shows" means is strict, because an optimizer would otherwise learn to make it true:

* code interpreter: the last printed line is the answer (the same number; for words, the same
  normalized words as the exact match), so printing every candidate (`for i in range(1000):
  print(i)`) shows only the last one;
* search: the answer appears as whole words in the passage (the index returns `top_k` passages
  whatever the query, so a query cannot widen what it shows).

Tasks graded by tests (the code family) have no answer an observation can show and are never
relabeled; neither are trajectories that succeeded (outcome 1) or whose calls never showed the
answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from environments.arithmetic import answer_turn
from training.rl.process import signal_kind
from training.sequences import encode_segments
from verifiers.math_equiv import parse_number
from verifiers.qa import normalize_answer


def observation_spans(tool_mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of every run of tool-output tokens (tool_mask 0), in order: one per call."""
    spans, start = [], None
    for i, m in enumerate(tool_mask):
        if not m and start is None:
            start = i
        elif m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(tool_mask)))
    return spans


def _same_line(line: str, answer: str) -> bool:
    """A printed line that is the answer: the same number (`-5` is not `5`), else the same words."""
    number = parse_number(answer)
    if number is not None:
        return parse_number(line) == number
    return bool(line.strip()) and normalize_answer(line) == normalize_answer(answer)


def shows_answer(observation: str, answer: str, tool: str) -> bool:
    """Whether a tool's output shows `answer` (the strict rules in the module docstring)."""
    gold = normalize_answer(answer)
    if not gold:
        return False
    if tool == "search":
        return re.search(rf"(?<!\S){re.escape(gold)}(?!\S)", normalize_answer(observation)) is not None
    lines = [line for line in observation.splitlines() if line.strip()]
    return bool(lines) and _same_line(lines[-1], answer)


def relabelable(task: dict) -> bool:
    """A task with an answer an observation can show: not graded by unit tests."""
    if not str(task.get("answer") or "").strip():
        return False
    metadata = task.get("metadata")
    if isinstance(metadata, str):
        metadata = json.loads(metadata) if metadata.strip() else {}
    return not (metadata or {}).get("tests")


def relabel(record: dict, outcome: float | None, task: dict, tokenizer) -> dict | None:
    """The corrected example of one stored trajectory (a row of `rollout_batches`), or None.

    Returns {"trajectory_id", "task_id", "family", "prompt_ids", "completion_ids", "tool_mask"}
    where `tool_mask` is the loss mask (1: trained), as the SFT loss reads it."""
    if (outcome or 0.0) >= 1.0 or not relabelable(task):
        return None
    ids, mask = list(record["completion_ids"]), list(record["tool_mask"])
    calls = json.loads(record["tool_calls"]) if isinstance(record["tool_calls"], str) else list(record["tool_calls"])
    spans = observation_spans(mask)
    # the loop appends one observation per call, so the k-th tool span is the k-th call's output
    # (an episode cut by the token budget may have fewer spans than calls, never more)
    for k, ((_, end), call) in enumerate(zip(spans, calls)):
        if (
            call.get("error") is not None
            or call.get("truncated")
            or not shows_answer(call["result"], str(task["answer"]), call["name"])
        ):
            continue
        kept_ids, loss_mask = ids[:end], mask[:end]
        # the calls that failed before it: seen, not imitated (their turn's policy tokens leave the loss)
        turn_start = 0
        for (s, e), earlier in zip(spans[:k], calls[:k]):
            if signal_kind(earlier.get("error")) is not None:
                loss_mask[turn_start:s] = [0] * (s - turn_start)
            turn_start = e
        answer_ids, answer_mask = encode_segments(tokenizer, [("policy", answer_turn(str(task["answer"])))])
        return {
            "trajectory_id": f"{record['trajectory_id']}-hindsight",
            "task_id": record["task_id"],
            "family": record["family"],
            "prompt_ids": list(record["prompt_ids"]),
            "completion_ids": kept_ids + answer_ids,
            "tool_mask": loss_mask + answer_mask,
        }
    return None


def relabel_all(records: list[dict], scores: list[dict], tasks_by_id: dict[str, dict], tokenizer) -> list[dict]:
    """The corrected examples of a batch (records and their `verified_rewards` rows, in order)."""
    out = []
    for record, score in zip(records, scores):
        task = tasks_by_id.get(record["task_id"])
        example = relabel(record, score.get("outcome"), task, tokenizer) if task is not None else None
        if example is not None:
            out.append(example)
    return out
