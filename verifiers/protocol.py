"""The tag protocol shared by the policy, the tools and the verifiers.

A completion is a sequence of policy turns and tool observations:

    <code>print(347*52-18)</code><interpreter>18026\n</interpreter><answer>18026</answer>

The policy writes `<code>…</code>` (generation stops at `</code>`), the environment appends
`<interpreter>…</interpreter>` (masked from the loss), and the policy ends with
`<answer>…</answer>`. Every tag is a single token in the tokenizer.
"""

from __future__ import annotations

import re

CODE_OPEN, CODE_CLOSE = "<code>", "</code>"
OBS_OPEN, OBS_CLOSE = "<interpreter>", "</interpreter>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (CODE_OPEN, CODE_CLOSE, OBS_OPEN, OBS_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

_ANSWER_RE = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.DOTALL)
_CODE_RE = re.compile(re.escape(CODE_OPEN) + r"(.*?)" + re.escape(CODE_CLOSE), re.DOTALL)


def extract_answers(policy_text: str) -> list[str]:
    """Every `<answer>` span the *policy* wrote. Callers pass policy text only, never
    observations, so a tool cannot inject an answer."""
    return [m.strip() for m in _ANSWER_RE.findall(policy_text)]


def extract_code_calls(policy_text: str) -> list[str]:
    return _CODE_RE.findall(policy_text)


def is_well_formed(policy_turns: list[str]) -> bool:
    """Each turn but the last is exactly one `<code>…</code>` call; the last turn is exactly one
    `<answer>…</answer>` and nothing after it. Text outside tags is allowed (reasoning)."""
    if not policy_turns:
        return False
    *calls, final = policy_turns
    for turn in calls:
        if turn.count(CODE_OPEN) != 1 or not turn.rstrip().endswith(CODE_CLOSE) or ANSWER_OPEN in turn:
            return False
    if final.count(ANSWER_OPEN) != 1 or final.count(ANSWER_CLOSE) != 1 or CODE_OPEN in final:
        return False
    return final.rstrip().endswith(ANSWER_CLOSE)
