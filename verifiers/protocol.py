"""The tag protocol shared by the policy, the tools and the verifiers.

A completion is a sequence of policy turns and tool observations:

    <code>print(347*52-18)</code><interpreter>18026\n</interpreter><answer>18026</answer>

The policy writes `<code>…</code>` (generation stops at `</code>`), the environment appends
`<interpreter>…</interpreter>` (masked from the loss), and the policy ends with
`<answer>…</answer>`. The search tool works the same way: `<search>query</search>`, then
`<information>passages</information>` (Search-R1's format). Tags are text: a tokenizer may split
them into several tokens (a real model's does), and a turn ends on the closing tag's *string*
(`first_stop`; training/agent/loop.py). The scratch tokenizer makes each tag one token, a fast path.
"""

from __future__ import annotations

import re

CODE_OPEN, CODE_CLOSE = "<code>", "</code>"
OBS_OPEN, OBS_CLOSE = "<interpreter>", "</interpreter>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (
    CODE_OPEN,
    CODE_CLOSE,
    OBS_OPEN,
    OBS_CLOSE,
    SEARCH_OPEN,
    SEARCH_CLOSE,
    INFO_OPEN,
    INFO_CLOSE,
    ANSWER_OPEN,
    ANSWER_CLOSE,
)

# Tool name -> its call tags. A tag-shaped block with any other name is a call to a tool that
# does not exist (penalized by the `tool_misuse` shaping term). Families add tools here.
TOOL_TAGS = {"code": (CODE_OPEN, CODE_CLOSE), "search": (SEARCH_OPEN, SEARCH_CLOSE)}
# Tool name -> the tags its observation is wrapped in (appended by the environment, masked).
OBSERVATION_TAGS = {"code": (OBS_OPEN, OBS_CLOSE), "search": (INFO_OPEN, INFO_CLOSE)}
_NOT_CALLS = {"answer", "think", "interpreter", "information"}  # answers, reasoning, observations
# The texts that end a policy turn: a tool call's closing tag (the tool runs) or the answer's.
TURN_STOPS = (*(close for _, close in TOOL_TAGS.values()), ANSWER_CLOSE)


def first_stop(text: str, stops: tuple[str, ...] = TURN_STOPS, after: int = 0) -> tuple[str, int] | None:
    """(stop, end) of the stop string that is completed first in `text` among those ending past
    `after` (end: the index just past it), or None. A generated turn ends at the token that
    completes its first stop; `after` skips stops completed before that token."""
    best: tuple[str, int] | None = None
    for stop in stops:
        at = text.find(stop, max(0, after - len(stop) + 1))
        if at >= 0 and (best is None or at + len(stop) < best[1]):
            best = (stop, at + len(stop))
    return best


# Blocks whose content is never the policy's answer: tool calls (their bodies are programs and
# queries, whose *output* might print an answer), observations (a policy that forges one is
# still only quoting) and reasoning.
_SKIPPED_BLOCKS = {
    **{open_tag: close for open_tag, close in TOOL_TAGS.values()},
    **{open_tag: close for open_tag, close in OBSERVATION_TAGS.values()},
    "<think>": "</think>",
}


# One pass, left to right (findall, in C): an answer block, or a skipped block consumed up to its
# own closing tag (or the end of the text, when it is left open). The bodies are "unrolled loops"
# ([^<]* runs between tests for the closing tag), several times faster than a lazy `.*?`.
def _body(close_tag: str) -> str:
    return r"[^<]*(?:<(?!" + re.escape(close_tag[1:]) + r")[^<]*)*"


_BLOCKS_RE = re.compile(
    "<(?:("
    + re.escape(ANSWER_OPEN[1:])
    + ")("
    + _body(ANSWER_CLOSE)
    + ")"
    + re.escape(ANSWER_CLOSE)
    + "|"
    + "|".join(re.escape(o[1:]) + _body(c) + "(?:" + re.escape(c) + ")?" for o, c in _SKIPPED_BLOCKS.items())
    + ")"
)


def extract_answers(policy_text: str) -> list[str]:
    """Every `<answer>` span the *policy* wrote **outside** its tool calls, observations and
    reasoning, read left to right as the protocol is written: `<code>print("<answer>42</answer>")`
    calls a tool (whose output would be the answer) and answers nothing. A block left open runs to
    the end of the text. Inside an answer everything is the answer (code may contain `<code>`).
    Callers pass policy text only, never observations, so a tool cannot inject an answer."""
    if policy_text.rfind(ANSWER_OPEN) > policy_text.rfind(ANSWER_CLOSE):
        return _scan_answers(policy_text)  # an answer left open: the regex would retry it from every later "<"
    return [body.strip() for is_answer, body in _BLOCKS_RE.findall(policy_text) if is_answer]


_OPEN_RE = re.compile("|".join(re.escape(tag) for tag in (ANSWER_OPEN, *_SKIPPED_BLOCKS)))


def _scan_answers(policy_text: str) -> list[str]:
    """extract_answers as a loop of str.find: linear in the text whatever it holds, for the texts
    the regex would take quadratic time on ("<answer>" repeated and never closed)."""
    answers, pos = [], 0
    while (opening := _OPEN_RE.search(policy_text, pos)) is not None:
        is_answer = opening.group() == ANSWER_OPEN
        end = policy_text.find(ANSWER_CLOSE if is_answer else _SKIPPED_BLOCKS[opening.group()], opening.end())
        if end < 0:
            break  # an unclosed block: nothing after it is outside it
        if is_answer:
            answers.append(policy_text[opening.end() : end].strip())
        pos = end + len(ANSWER_CLOSE if is_answer else _SKIPPED_BLOCKS[opening.group()])
    return answers


_TAG_OPEN_RE = re.compile(r"<([a-z_]{1,32})>")


def parse_tool_calls(policy_text: str) -> list[tuple[str, str]]:
    """Every `<name>body</name>` block the policy wrote that is not an answer, reasoning or an
    observation tag, as (name, body), in order. Known or not: the caller decides.

    What `re.findall(r"<([a-z_]{1,32})>(.*?)</\1>")` finds, in linear time: the regex retries
    every unclosed `<name>` against the rest of the text (`"<ab>" * 8000` took a second), and the
    shaping terms call this on every candidate. An opening whose closing tag does not occur later
    is skipped at the cost of one lookup."""
    calls, pos, last_close = [], 0, {}
    while (opening := _TAG_OPEN_RE.search(policy_text, pos)) is not None:
        name, close = opening.group(1), f"</{opening.group(1)}>"
        if name not in last_close:
            last_close[name] = policy_text.rfind(close)
        if last_close[name] < opening.end():
            pos = opening.start() + 1  # never closed after here: as the regex, try the next position
            continue
        end = policy_text.find(close, opening.end())
        if name not in _NOT_CALLS:
            calls.append((name, policy_text[opening.end() : end]))
        pos = end + len(close)
    return calls


def is_well_formed(policy_turns: list[str], tools: tuple[str, ...]) -> bool:
    """Each turn but the last is exactly one call to an available tool, ending with its closing
    tag; the last turn is exactly one `<answer>…</answer>` and nothing after it. Text outside
    tags is allowed (reasoning)."""
    if not policy_turns:
        return False
    *calls, final = policy_turns
    for turn in calls:
        found = parse_tool_calls(turn)
        if len(found) != 1 or found[0][0] not in tools or ANSWER_OPEN in turn:
            return False
        if not turn.rstrip().endswith(TOOL_TAGS[found[0][0]][1]):
            return False
    if final.count(ANSWER_OPEN) != 1 or final.count(ANSWER_CLOSE) != 1 or parse_tool_calls(final):
        return False
    if any(open_tag in final for open_tag, _ in TOOL_TAGS.values()):
        return False
    return final.rstrip().endswith(ANSWER_CLOSE)
