"""The TRL side-by-side benchmark on SmolLM2 (benchmarks/trl_side_by_side.py, size `smol`): TRL's side
must see the token sequences our agent loop produces on a tokenizer that splits the tags. Checked on
SmolLM2's own tokenizer, without running a model: the same prompt ids, a `<code>` turn parsed as a call
to `code`, the tool output appended as our loop appends it, turns cut where our engines cut them, and
the tool mask found from the text equal to the one our loop records."""

from __future__ import annotations

import pytest

from benchmarks.trl_side_by_side import (
    CHATML_PROTOCOL_CHAT_TEMPLATE,
    CHATML_PROTOCOL_RESPONSE_TEMPLATE,
    append_ids_and_cut_turns,
    text_observation_mask,
    token_texts,
    turn_length,
)
from configs import load_profile
from training.agent.chat import messages, prompt_ids
from training.sequences import encode, encode_observation
from verifiers.protocol import TURN_STOPS

pytestmark = [pytest.mark.perf, pytest.mark.realmodel]

TASK = {"task_id": "t0", "family": "arithmetic", "level": 3, "prompt": "compute 47*38"}


@pytest.fixture(scope="module")
def smol_tok(smollm2_folder):
    from training.model import load_tokenizer

    return load_tokenizer(smollm2_folder)


@pytest.fixture()
def protocol_tok(smol_tok):
    import copy

    tok = copy.deepcopy(smol_tok)
    tok.chat_template = CHATML_PROTOCOL_CHAT_TEMPLATE
    tok.response_template = CHATML_PROTOCOL_RESPONSE_TEMPLATE
    return tok


def code(code: str) -> str:
    """Run a Python program in the sandbox and return what it printed.

    Args:
        code: The Python program to run.
    """
    return ""


def test_trl_prompts_are_our_prompt_ids(smol_tok, protocol_tok):
    system_prompt = load_profile("smol").rollout.system_prompt
    ours = prompt_ids(smol_tok, TASK, system_prompt)
    theirs = protocol_tok.apply_chat_template(
        messages(TASK, system_prompt), tools=[code], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert theirs == ours


def test_the_template_renders_an_episode_as_one_assistant_message(protocol_tok):
    supports_tool_calling = pytest.importorskip("trl.chat_template_utils").supports_tool_calling  # --bench extra

    chat = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "code", "arguments": {"code": "print(1)"}}}],
        },
        {"role": "tool", "name": "code", "content": "1\n"},
        {"role": "assistant", "content": "<answer>1</answer>"},
    ]
    text = protocol_tok.apply_chat_template(chat, tokenize=False)
    assert text == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\n<code>print(1)</code><interpreter>1\n</interpreter><answer>1</answer><|im_end|>\n"
    )
    # after a tool message the assistant message goes on: no new header
    assert protocol_tok.apply_chat_template(chat[:4], tokenize=False, add_generation_prompt=True).endswith(
        "</interpreter>"
    )
    assert supports_tool_calling(protocol_tok)  # GRPOTrainer's start-up check with tools


def test_a_code_turn_parses_as_a_call_and_an_answer_as_content(protocol_tok):
    parse_response = pytest.importorskip("trl.chat_template_utils").parse_response  # the --bench extra

    prefix = protocol_tok.apply_chat_template(
        messages(TASK, "S"), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    call = parse_response(protocol_tok, encode(protocol_tok, "Let me run it. <code>print(47*38)</code>"), prefix=prefix)
    assert call["tool_calls"] == [
        {"type": "function", "function": {"name": "code", "arguments": {"code": "print(47*38)"}}}
    ]
    answer = encode(protocol_tok, "<answer>1786</answer>") + [protocol_tok.eos_token_id]
    assert parse_response(protocol_tok, answer, prefix=prefix) == {
        "role": "assistant",
        "content": "<answer>1786</answer>",
    }


class FakeTrainer:
    """The two GRPOTrainer methods the adapter replaces: a turn as generate returns it to TRL (a row
    that stopped on a string, then the pad id TRL keeps, SmolLM2's EOS), and TRL's own suffix."""

    def __init__(self, rows):
        self.rows = rows

    def _generate_single_turn(self, *args, **kwargs):
        return [list(row) for row in self.rows], None

    def _get_tool_suffix_ids(self, tool_messages):
        raise AssertionError("TRL's render-and-diff suffix must not be used")


def test_turns_end_where_ours_do_and_tool_output_is_appended_as_ours(smol_tok):
    eos = smol_tok.eos_token_id
    call = encode(smol_tok, "<code>print(47*38)</code>")
    answer = encode(smol_tok, "<answer>1786</answer>")
    trainer = FakeTrainer([call + [eos], answer + [eos], encode(smol_tok, "no stop") + [eos]])
    append_ids_and_cut_turns(trainer, smol_tok, TURN_STOPS)
    ids, logprobs = trainer._generate_single_turn()
    assert ids == [call, answer, encode(smol_tok, "no stop") + [eos]] and logprobs is None
    suffix = trainer._get_tool_suffix_ids([{"role": "tool", "name": "code", "content": "1786\n"}])
    assert suffix == encode_observation(smol_tok, "1786\n")


def test_turn_length_keeps_a_token_that_completes_a_stop_whole():
    assert turn_length(["<", "code", ">", "x", "</", "code", ">\n", "junk"], TURN_STOPS) == 7
    assert turn_length(["<", "answer", ">4</", "answer", ">", "x"], TURN_STOPS) == 5
    assert turn_length(["no", " stop"], TURN_STOPS) == 2


def test_the_text_tool_mask_is_the_one_our_loop_records(smol_tok):
    first = encode(smol_tok, "<code>print(47*38)</code>")
    observation = encode_observation(smol_tok, "1786\n")
    last = encode(smol_tok, "<answer>1786</answer>")
    mask, calls = text_observation_mask(token_texts(smol_tok)(first + observation + last))
    assert mask == [1] * len(first) + [0] * len(observation) + [1] * len(last)
    assert calls == 1
