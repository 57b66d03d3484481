"""Bring your own SFT data: trajectories in the chat-messages format (OpenAI's, TRL's SFT datasets)
as the steps of one agent episode, checked row by row.

    data.sft_file: examples/sft/trajectories.jsonl     (JSONL, .jsonl.gz or Parquet; local or s3://)
    data.sft_file_mode: mix | replace                  (with the scripted teachers' trajectories, or instead)

One trajectory per row:

    messages   [{"role": "system" | "user" | "assistant" | "tool", "content": str, ...}, ...]
               - one user message (the task) after an optional system message;
               - then assistant and tool messages; an assistant message may carry `tool_calls`
                 (OpenAI: [{"type": "function", "function": {"name": "python", "arguments": "{\\"code\\": \\"...\\"}"}}])
                 or write our tags itself (`<code>…</code>`, `<search>…</search>`);
               - each tool call is answered by one tool message (its output, as the tool saw it);
               - the last message is the assistant's answer (wrapped in <answer>…</answer> if it
                 is not already).
    task_id    str, optional (default: a hash of the user message)
    family     a registered family, optional (default: search if the trajectory searches, else code)
    level      int, optional (default 1)

A trajectory becomes the same stream a rollout writes: the assistant's text and tool calls are
the policy's tokens (trained), tool outputs are wrapped in the tool's observation tags and masked
from the loss. The prompt is rendered with the profile's chat template and system prompt, as
every other SFT row (a system message in the file is not used: rollouts will not see it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from environments import bounded_json
from environments.arithmetic import answer_turn
from environments.bounded_json import JSONProblem
from environments.family import FAMILIES, get_family
from environments.task_files import TaskFileError, _summary, read_rows
from verifiers.protocol import ANSWER_OPEN, TOOL_TAGS

ROLES = ("system", "user", "assistant", "tool")
# Tool names as other datasets spell them -> ours (verifiers.protocol.TOOL_TAGS).
TOOL_NAMES = {
    "code": "code",
    "python": "code",
    "code_interpreter": "code",
    "execute_python": "code",
    "run_python": "code",
    "search": "search",
    "retrieve": "search",
    "web_search": "search",
    "wikipedia_search": "search",
}


@dataclass(frozen=True)
class Segment:
    kind: str  # "text" (the policy's words), "call" (a tool call: `tool`, `text` its argument), "observation", "answer"
    text: str
    tool: str = ""


@dataclass(frozen=True)
class FileTrajectory:
    task_id: str
    family: str
    level: int
    prompt: str  # the user message
    segments: tuple[Segment, ...]
    replaced_system: bool  # the file had a system message (not used)


def _call(call: object, where: str) -> tuple[Segment | None, str | None]:
    """An OpenAI tool call as a Segment, or the problem with it."""
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or name not in TOOL_NAMES:
        return None, f"{where}.function.name': {name!r} is not a known tool ({', '.join(sorted(TOOL_NAMES))})"
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = bounded_json.loads(arguments)
        except json.JSONDecodeError:
            pass  # a bare string argument: the code or the query itself
        except JSONProblem as exc:
            return None, f"{where}.function.arguments': {exc.reason}" + (f" (at {exc.path})" if exc.path else "")
    if isinstance(arguments, dict):
        texts = [v for v in arguments.values() if isinstance(v, str)]
        if len(texts) != 1:
            return (
                None,
                f"{where}.function.arguments': expected one string argument (the code or the query), got {sorted(arguments)}",
            )
        arguments = texts[0]
    if not isinstance(arguments, str) or not arguments.strip():
        return None, f"{where}.function.arguments': expected the code or the query, got {arguments!r:.60}"
    return Segment("call", arguments, TOOL_NAMES[name]), None


def _tagged_calls(text: str) -> list[str]:
    """Tools whose calls an assistant message writes in our tags itself."""
    return [name for name, (open_tag, close_tag) in TOOL_TAGS.items() if open_tag in text and close_tag in text]


def parse_trajectory(row: dict) -> tuple[FileTrajectory | None, list[str]]:
    number, messages = row["_row"], row.get("messages")
    at = f"row {number}: field 'messages"
    if hasattr(messages, "tolist"):  # Parquet gives arrays
        messages = messages.tolist()
    if not isinstance(messages, list) or not messages:
        return None, [f"{at}': expected a non-empty list of messages, got {messages!r:.60}"]
    problems = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            problems.append(
                f"{at}[{i}].role': expected one of {', '.join(ROLES)}, got {m.get('role') if isinstance(m, dict) else m!r:.40}"
            )
        elif not isinstance(m.get("content") or "", str):
            problems.append(f"{at}[{i}].content': expected text, got {m.get('content')!r:.40}")
    if problems:
        return None, problems
    system = messages[0]["role"] == "system"
    rest = messages[1:] if system else messages
    if not rest or rest[0]["role"] != "user" or not (rest[0].get("content") or "").strip():
        return None, [
            f"{at}[{int(system)}]': expected the user's task (a user message with content) after the optional system message"
        ]
    if len(rest) < 2 or rest[-1]["role"] != "assistant" or rest[-1].get("tool_calls"):
        return None, [f"{at}[{len(messages) - 1}]': the last message must be the assistant's answer (no tool calls)"]
    segments: list[Segment] = []
    pending: list[Segment] = []  # calls waiting for their tool message
    for i, m in enumerate(rest[1:], start=int(system) + 1):
        content = m.get("content") or ""
        if m["role"] in ("system", "user"):
            problems.append(
                f"{at}[{i}].role': {m['role']!r} after the task; only assistant and tool messages may follow"
            )
        elif m["role"] == "tool":
            if not pending:
                problems.append(f"{at}[{i}]': a tool message with no tool call before it")
                continue
            segments.append(Segment("observation", content, pending.pop(0).tool))
        elif pending:
            problems.append(f"{at}[{i}]': the assistant speaks before the tool answered its call to {pending[0].tool}")
        else:
            calls = m.get("tool_calls") or []
            tagged = _tagged_calls(content)
            if calls and tagged:
                problems.append(f"{at}[{i}]': tool calls both in tool_calls and in <{tagged[0]}> tags; use one")
                continue
            last = i == len(messages) - 1
            if last:
                segments.append(Segment("answer", content))
            elif content:
                segments.append(Segment("text", content))
            for j, call in enumerate(calls):
                segment, problem = _call(call, f"{at}[{i}].tool_calls[{j}]")
                if problem:
                    problems.append(problem)
                    pending.append(Segment("call", "", "code"))  # its tool message is then not reported too
                else:
                    segments.append(segment)
                    pending.append(segment)
            pending += [Segment("call", "", name) for name in tagged]
    if pending and not problems:
        problems.append(f"{at}': the call to {pending[0].tool} gets no tool message")
    if problems:
        return None, problems
    used = {s.tool for s in segments if s.kind in ("call", "observation")}
    family = row.get("family") if isinstance(row.get("family"), str) else None
    family = family or ("search" if "search" in used else "code")
    if family not in FAMILIES:
        return None, [f"row {number}: field 'family': {family!r} is not one of {FAMILIES.names()}"]
    level = row.get("level")
    level = 1 if level is None or level != level else level  # absent (NaN in Parquet): 1
    level = int(level) if isinstance(level, float) and level.is_integer() else level
    if isinstance(level, bool) or not isinstance(level, int) or level not in get_family(family).levels:
        return None, [f"row {number}: field 'level': {level!r} is not a level of {family} {get_family(family).levels}"]
    prompt = rest[0]["content"]
    task_id = row.get("task_id") or "sft-file-" + hashlib.sha1(prompt.encode()).hexdigest()[:12]
    return FileTrajectory(str(task_id), family, level, prompt, tuple(segments), system), []


def load_sft_file(path: str) -> list[FileTrajectory]:
    """The file's trajectories, or TaskFileError naming every bad row and field (up to 20)."""
    trajectories, problems = [], []
    for row in read_rows(path, "SFT file"):
        trajectory, bad = parse_trajectory(row)
        problems += bad
        if trajectory is not None:
            trajectories.append(trajectory)
    if problems:
        raise TaskFileError(_summary(path, problems, "SFT file"))
    if not trajectories:
        raise TaskFileError(f"SFT file {path}: no trajectories")
    return trajectories


def answer_text(content: str) -> str:
    """The final message as the policy writes it: inside <answer> tags unless it has them."""
    return content if ANSWER_OPEN in content else answer_turn(content.strip())
