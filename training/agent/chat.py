"""Prompts as chat messages, rendered with the model's own chat template.

Every prompt (rollouts, SFT data, benchmarks) is `[system?, user]` rendered by the tokenizer's
chat template with the generation prompt added, so a pretrained instruct model sees its own
format (SmolLM2's and Qwen2.5's ChatML: `<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n`).
The whole episode is then the assistant's one message: the policy writes `<code>…</code>`, the
environment appends `<interpreter>…</interpreter>` inside that message, and the policy ends with
`<answer>…</answer>` (Search-R1's and ReTool's layout; docs/rollout.md says how this maps to
native tool-call formats). The scratch tokenizer gets PLAIN_TEMPLATE: the messages' contents one
after the other, so without a system prompt a scratch prompt is the task's text, as before.
"""

from __future__ import annotations

from environments.family import tools_of, tools_offered
from verifiers.protocol import ANSWER_CLOSE, ANSWER_OPEN, OBSERVATION_TAGS, TOOL_TAGS

PLAIN_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}"
    "{% if message['role'] == 'system' %}{{ '\\n' }}{% endif %}{% endfor %}"
)

TOOL_USES = {
    "code": "to run Python, write the program between {open} and {close}; what it prints comes back between {obs_open} and {obs_close}",
    "search": "to search the documents, write a query between {open} and {close}; the best passages come back between {obs_open} and {obs_close}",
}

DEFAULT_SYSTEM_PROMPT = (
    "You solve tasks with tools. Tools: {tools}. Call a tool when it helps, read its output, and "
    "give the final answer, a value only, as " + ANSWER_OPEN + "…" + ANSWER_CLOSE + "."
)


def tool_descriptions(family: str) -> str:
    """The tools a family's episodes may call, described with their tags: `{tools}` in a system prompt."""
    return describe_tools(tools_of(family))


def describe_tools(names: tuple[str, ...]) -> str:
    uses = []
    for name in names:
        (open_tag, close_tag), (obs_open, obs_close) = TOOL_TAGS[name], OBSERVATION_TAGS[name]
        uses.append(TOOL_USES[name].format(open=open_tag, close=close_tag, obs_open=obs_open, obs_close=obs_close))
    return "; ".join(uses) if uses else "none"


def messages(task: dict, system_prompt: str | None) -> list[dict[str, str]]:
    chat = [{"role": "user", "content": task["prompt"]}]
    if system_prompt is not None:
        chat.insert(
            0, {"role": "system", "content": system_prompt.replace("{tools}", describe_tools(tools_offered(task)))}
        )
    return chat


def render_prompt(tokenizer, task: dict, system_prompt: str | None) -> str:
    """The prompt's text up to where the policy starts writing (the generation prompt included)."""
    template = getattr(tokenizer, "chat_template", None) or PLAIN_TEMPLATE
    return tokenizer.apply_chat_template(
        messages(task, system_prompt), chat_template=template, tokenize=False, add_generation_prompt=True
    )


def prompt_ids(tokenizer, task: dict, system_prompt: str | None) -> list[int]:
    """The prompt's ids. The template's own markers (`<|im_start|>`) are special tokens of the
    tokenizer and come out as their single ids; a template that already starts with the BOS the
    tokenizer would add is not given a second one."""
    from training.sequences import encode  # the one encoder of the project (Rust backend, no specials added)

    return encode(tokenizer, render_prompt(tokenizer, task, system_prompt))
