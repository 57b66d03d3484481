"""The code-interpreter tool: runs policy code in the injected sandbox, formats the observation."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from verifiers.protocol import OBSERVATION_TAGS
from verifiers.sandbox import Placeable, Sandbox


@dataclass(frozen=True)
class ToolResult:
    observation: str  # the text inside <interpreter>…</interpreter>
    error: str | None
    latency_s: float


def observation_text(stdout: str, stderr: str, error: str | None, max_chars: int) -> str:
    """What the policy reads: stdout, or the last stderr line (the exception) when the code
    failed. Truncated so one call cannot flood the context."""
    text = stdout
    if error:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else error
        text = (stdout + last).strip() + "\n"
    return text if len(text) <= max_chars else text[:max_chars] + "…\n"


def wrap_observation(text: str, tool: str = "code") -> str:
    open_tag, close_tag = OBSERVATION_TAGS[tool]
    return f"{open_tag}{text}{close_tag}"


class Tool(Protocol):
    """What the agent loop needs of a tool: a name (a key of TOOL_TAGS) and batched calls."""

    name: str

    def call_many(self, args: list[str]) -> list[ToolResult]: ...


def toolbox(*tools: Tool) -> dict[str, Tool]:
    return {tool.name: tool for tool in tools}


class CodeInterpreter:
    name = "code"

    def __init__(self, sandbox: Sandbox, max_chars: int = 64):
        self.sandbox = sandbox
        self.max_chars = max_chars

    def set_cpus(self, cpus: set[int] | None) -> None:
        """Where the code runs (a sandbox that cannot be placed, e.g. Docker's, ignores it)."""
        if isinstance(self.sandbox, Placeable):
            self.sandbox.set_cpus(cpus)

    def call_many(self, codes: list[str]) -> list[ToolResult]:
        """Run a batch of calls concurrently (the sandbox pools workers); order preserved."""
        if not codes:
            return []
        start = time.perf_counter()
        results = self.sandbox.run_many(codes)
        per_call = (time.perf_counter() - start) / len(codes)
        return [
            ToolResult(observation_text(r.stdout, r.stderr, r.error, self.max_chars), r.error, r.duration_s or per_call)
            for r in results
        ]
