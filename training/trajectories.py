"""Expert trajectories for SFT, and the corpus the tokenizer is trained on.

The teacher's tool calls go through the real tool, so the observations in SFT data are
byte-for-byte what rollouts will append (same sandbox, same formatting, same encoding).
"""

from __future__ import annotations

import json
from typing import Iterator

from environments.arithmetic import answer_turn, code_turn, demonstrations
from environments.tools import CodeInterpreter, wrap_observation
from training.sequences import encode, encode_observation, encode_segments


def tokenizer_corpus(tasks: list[dict]) -> Iterator[str]:
    """Prompts plus every shape of completion the protocol allows, including an error message
    so that interpreter tracebacks tokenize into words rather than single letters."""
    for task in tasks:
        expression = json.loads(task["metadata"])["expression"]
        yield task["prompt"] + code_turn(f"print({expression})") + wrap_observation(task["answer"] + "\n") + answer_turn(task["answer"])
    yield wrap_observation("NameError: name 'x' is not defined\nSyntaxError: invalid syntax\nZeroDivisionError: division by zero\n")


def build_sft_trajectories(tasks: list[dict], tokenizer, tool: CodeInterpreter, *, n: int, seed: int, p_direct: float, hard_levels: tuple[int, ...]) -> list[dict]:
    """Rows of `sft_trajectories`: ids, tool_mask (0 on the observation), and the teacher's
    strategy and correctness for the data report."""
    demos = list(demonstrations(tasks, n, seed=seed, p_direct=p_direct, hard_levels=hard_levels))
    by_id = {t["task_id"]: t for t in tasks}
    results = iter(tool.call_many([d.code for d in demos if d.code is not None]))
    rows = []
    for i, demo in enumerate(demos):
        task = by_id[demo.task_id]
        segments: list[tuple[str, str]] = []
        if demo.code is not None:
            segments.append(("policy", code_turn(demo.code)))
        completion_ids, tool_mask = encode_segments(tokenizer, segments)
        if demo.code is not None:
            observation_ids = encode_observation(tokenizer, next(results).observation)
            completion_ids += observation_ids
            tool_mask += [0] * len(observation_ids)
        answer_ids, answer_mask = encode_segments(tokenizer, [("policy", answer_turn(demo.answer))])
        completion_ids += answer_ids
        tool_mask += answer_mask
        rows.append({
            "trajectory_id": f"sft-{i:06d}",
            "task_id": demo.task_id,
            "family": task["family"],
            "level": int(task["level"]),
            "strategy": demo.strategy,
            "prompt_ids": encode(tokenizer, task["prompt"]),
            "completion_ids": completion_ids,
            "tool_mask": tool_mask,
            "completion": tokenizer.decode(completion_ids),
            "correct": demo.correct,
        })
    return rows
