"""Shaping terms: small, capped rewards on *how* the policy answered, registered by name.

Each term maps a candidate to a raw value; the configured weight and cap turn it into a
contribution, `clip(weight * raw, -cap, cap)` (configs.schema.ShapingTerm). The caps of all
terms together stay below the outcome weight, so no amount of shaping can outscore a right
answer (docs/verifiers.md has the weights and the reasons).

    format       1 if tags are well formed with exactly one final answer, else 0
    tool_cost    -(number of calls)                          ToolRL: learn *when* to call
    tool_misuse  -(invalid + consecutive duplicate + unknown-tool calls)
    overlong     DAPO's soft overlong penalty on policy tokens, in [-1, 0]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from configs.registry import Registry
from verifiers.protocol import TOOL_TAGS, is_well_formed, parse_tool_calls


@dataclass(frozen=True)
class Candidate:
    """What the verifiers see of one trajectory: the policy's own text, never observations."""

    policy_turns: list[str]
    num_policy_tokens: int
    tools: tuple[str, ...]  # tools the task's family offers (environments.family.tools_of)

    @property
    def text(self) -> str:
        return "".join(self.policy_turns)


ShapingFn = Callable[..., float]
SHAPING_TERMS = Registry("shaping term")
register_term = SHAPING_TERMS.register


def get_term(name: str) -> ShapingFn:
    """Raises UnknownNameError (a KeyError and a ValueError) naming the registered terms."""
    return SHAPING_TERMS.get(name)


def contribution(raw: float, weight: float, cap: float) -> float:
    return max(-cap, min(cap, weight * raw))


@register_term("format")
def format_term(c: Candidate) -> float:
    return 1.0 if is_well_formed(c.policy_turns, c.tools) else 0.0


@register_term("tool_cost")
def tool_cost_term(c: Candidate) -> float:
    return -float(len(parse_tool_calls(c.text)))


def _valid_python(body: str) -> bool:
    try:
        compile(body, "<tool call>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


# Tool name -> is this call's body acceptable? Compiling is static: nothing runs here.
CALL_VALIDATORS: dict[str, Callable[[str], bool]] = {"code": _valid_python}


def misuse_counts(c: Candidate) -> dict[str, int]:
    """Calls that cannot help: to tools the family lacks, with bodies that cannot run, or the
    same call again right after itself (the observation cannot change)."""
    counts = {"unknown": 0, "invalid": 0, "duplicate": 0}
    previous = None
    for name, body in parse_tool_calls(c.text):
        key = (name, " ".join(body.split()))
        if name not in c.tools or name not in TOOL_TAGS:
            counts["unknown"] += 1
        elif not body.strip() or not CALL_VALIDATORS.get(name, lambda _: True)(body):
            counts["invalid"] += 1
        elif key == previous:
            counts["duplicate"] += 1
        previous = key
    return counts


@register_term("tool_misuse")
def tool_misuse_term(c: Candidate) -> float:
    return -float(sum(misuse_counts(c).values()))


@register_term("overlong")
def overlong_term(c: Candidate, *, max_tokens: int, buffer: int) -> float:
    """DAPO (Yu et al. 2025, eq. 13): no penalty up to max_tokens - buffer, then linear down to
    -1 at max_tokens, -1 beyond. Counts only the policy's tokens; observations are not its fault."""
    if buffer <= 0 or max_tokens <= buffer:
        raise ValueError(f"overlong needs 0 < buffer < max_tokens, got buffer={buffer}, max_tokens={max_tokens}")
    n, soft = c.num_policy_tokens, max_tokens - buffer
    if n <= soft:
        return 0.0
    return -1.0 if n > max_tokens else (soft - n) / buffer
