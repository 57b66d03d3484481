"""Expert trajectories for SFT, and the corpus the tokenizer is trained on.

The teacher's tool calls go through the real tool, so the observations in SFT data are
byte-for-byte what rollouts will append (same sandbox, same formatting, same encoding).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from configs.schema import TeacherConfig
from environments.arithmetic import answer_turn
from environments.base import Demonstration, KnowledgeBase
from environments.families import demonstrations, mixture_counts, with_detours
from environments.family import get_family
from environments.sft_files import FileTrajectory, answer_text
from environments.tools import Tool, ToolResult, wrap_observation
from training.agent.chat import prompt_ids
from training.sequences import encode_observation, encode_segments
from verifiers.protocol import TOOL_TAGS


def tokenizer_corpus(tasks: list[dict], documents: list[str] = ()) -> Iterator[str]:
    """Every task in the shapes its family's episodes take (`TaskFamily.tokenizer_texts`), the
    knowledge base's documents as search observations, and error messages, so that tool output
    tokenizes into words rather than single letters."""
    for task in tasks:
        yield from get_family(task["family"]).tokenizer_texts(task)
    for text in documents:
        yield wrap_observation(text, "search")
    yield wrap_observation(
        "NameError: name 'x' is not defined\nSyntaxError: invalid syntax\nZeroDivisionError: division by zero\n"
    )
    yield wrap_observation("no results\n", "search")


def call_turn(tool: str, args: str) -> str:
    open_tag, close_tag = TOOL_TAGS[tool]
    return f"{open_tag}{args}{close_tag}"


def run_steps(demos: list[Demonstration], tools: Mapping[str, Tool]) -> list[list[ToolResult]]:
    """Every demonstration's tool calls through the real tools, batched per tool."""
    results: list[list[ToolResult | None]] = [[None] * len(d.steps) for d in demos]
    for name in dict.fromkeys(step.tool for d in demos for step in d.steps):
        where = [(i, j) for i, d in enumerate(demos) for j, step in enumerate(d.steps) if step.tool == name]
        for (i, j), result in zip(where, tools[name].call_many([demos[i].steps[j].args for i, j in where])):
            results[i][j] = result
    return results  # type: ignore[return-value]


def trajectory_ids(tokenizer, demo: Demonstration, results: list[ToolResult]) -> tuple[list[int], list[int], list[int]]:
    """(completion_ids, tool_mask, loss_mask): each step's call (policy), its observation (tool),
    the answer. loss_mask is tool_mask with a detour's calls (Step.trained False) zeroed too."""
    completion_ids: list[int] = []
    tool_mask: list[int] = []
    loss_mask: list[int] = []
    for step, result in zip(demo.steps, results):
        call_ids, call_mask = encode_segments(tokenizer, [("policy", call_turn(step.tool, step.args))])
        observation_ids = encode_observation(tokenizer, result.observation, step.tool)
        completion_ids += call_ids + observation_ids
        tool_mask += call_mask + [0] * len(observation_ids)
        loss_mask += [m * int(step.trained) for m in call_mask] + [0] * len(observation_ids)
    answer_ids, answer_mask = encode_segments(tokenizer, [("policy", answer_turn(demo.answer))])
    return completion_ids + answer_ids, tool_mask + answer_mask, loss_mask + answer_mask


def build_sft_trajectories(
    tasks: list[dict],
    tokenizer,
    tools: Mapping[str, Tool],
    *,
    teacher: TeacherConfig,
    seed: int,
    kb: KnowledgeBase | None = None,
    system_prompt: str | None = None,
) -> list[dict]:
    """Rows of `sft_trajectories`: ids, tool_mask (0 on observations), and the teacher's strategy
    and correctness for the data report. Families share `teacher.num_trajectories` by `mixture`.
    Prompts are rendered as rollouts render them (the chat template, `system_prompt`)."""
    by_family: dict[str, list[dict]] = {}
    for task in tasks:
        by_family.setdefault(task["family"], []).append(task)
    counts = mixture_counts(teacher, {f: len(ts) for f, ts in by_family.items()})
    by_id = {t["task_id"]: t for t in tasks}
    demos = [
        d
        for f, n in counts.items()
        for d in with_detours(
            f,
            list(demonstrations(f, by_family[f], n, seed=seed, teacher=teacher, kb=kb)),
            by_id,
            teacher,
            seed=seed,
            kb=kb,
        )
    ]
    prompts = {d.task_id: prompt_ids(tokenizer, by_id[d.task_id], system_prompt) for d in demos}
    rows = []
    for i, (demo, results) in enumerate(zip(demos, run_steps(demos, tools))):
        task = by_id[demo.task_id]
        completion_ids, tool_mask, loss_mask = trajectory_ids(tokenizer, demo, results)
        rows.append(
            {
                "trajectory_id": f"sft-{i:06d}",
                "task_id": demo.task_id,
                "family": task["family"],
                "level": int(task["level"]),
                "strategy": demo.strategy,
                "prompt_ids": prompts[demo.task_id],
                "completion_ids": completion_ids,
                "tool_mask": tool_mask,
                "loss_mask": loss_mask,
                "completion": tokenizer.decode(completion_ids),
                "correct": demo.correct,
            }
        )
    return rows


def file_trajectory_rows(
    trajectories: list[FileTrajectory], tokenizer, *, system_prompt: str | None = None, start: int = 0
) -> list[dict]:
    """Rows of `sft_trajectories` from a user's chat-messages file (environments/sft_files.py):
    the assistant's words, tool calls and answer are policy tokens; tool outputs are wrapped in
    their observation tags and masked (tool_mask 0), exactly as a rollout's."""
    rows = []
    for i, t in enumerate(trajectories, start=start):
        segments = []
        for s in t.segments:
            if s.kind == "observation":
                segments.append(("tool", wrap_observation(s.text, s.tool)))
            elif s.kind == "call":
                segments.append(("policy", call_turn(s.tool, s.text)))
            elif s.kind == "answer":
                segments.append(("policy", answer_text(s.text)))
            else:
                segments.append(("policy", s.text))
        merged: list[
            tuple[str, str]
        ] = []  # a policy turn's words and its call are one piece, as a rollout samples them
        for role, text in segments:
            if merged and merged[-1][0] == role == "policy":
                merged[-1] = (role, merged[-1][1] + text)
            else:
                merged.append((role, text))
        completion_ids, tool_mask = encode_segments(tokenizer, merged)
        task = {"task_id": t.task_id, "family": t.family, "level": t.level, "prompt": t.prompt}
        rows.append(
            {
                "trajectory_id": f"sft-file-{i:06d}",
                "task_id": t.task_id,
                "family": t.family,
                "level": t.level,
                "strategy": "file",
                "prompt_ids": prompt_ids(tokenizer, task, system_prompt),
                "completion_ids": completion_ids,
                "tool_mask": tool_mask,
                "loss_mask": tool_mask,
                "completion": tokenizer.decode(completion_ids),
                "correct": True,
            }
        )
    return rows
