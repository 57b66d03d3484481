"""The tag protocol on any tokenizer (issue 22): tags are text, a turn ends at the token that
completes a closing tag's string, the record keeps exactly the sampled ids (a token that holds
the tag and more is kept whole), observations go in with tool_mask 0, and the single-token fast
path of the scratch tokenizer gives the same episodes as the string path."""

from types import SimpleNamespace

import pytest
import torch

from tests.rollout_checks import check_token_exact
from training.agent.chat import PLAIN_TEMPLATE, prompt_ids, render_prompt
from training.agent.engines import HFEngine, Sampling, VLLMEngine
from training.agent.loop import TurnStops, _Loop, run_episodes
from training.sequences import encode
from verifiers.protocol import ANSWER_CLOSE, CODE_CLOSE, TURN_STOPS, first_stop

pytestmark = pytest.mark.realmodel
FAMILIES = ("arithmetic", "search", "code")


# --------------------------------------------------------------------------- pure stop rule
def test_first_stop_finds_the_stop_completed_first():
    assert first_stop("print(1)</code>") == (CODE_CLOSE, 15)
    assert first_stop("x</answer> then </code>") == (ANSWER_CLOSE, 10)
    assert first_stop("print(1)</code>\n<int") == (CODE_CLOSE, 15)  # a stop inside the last token: text after it stays
    assert first_stop("no stop </cod") is None
    # `after`: only stops completed past that index (the turn's last token), not ones spelled earlier
    assert first_stop("a</code>b</answer>", after=8) == (ANSWER_CLOSE, 18)
    assert first_stop("a</code>b", after=8) is None
    assert first_stop("a</code>", after=7) == (CODE_CLOSE, 8)


# --------------------------------------------------------------------------- a scripted model
class _Cache:
    def __init__(self, rows):
        self.rows = rows

    def reorder_cache(self, keep):
        self.rows = [self.rows[i] for i in keep.tolist()]


class Scripted(torch.nn.Module):
    """A causal LM whose row r emits scripts[r][k] at its k-th generated step (argmax), so a test
    can make the engine sample a tag in pieces, or a token holding the tag and more."""

    def __init__(self, scripts, vocab):
        super().__init__()
        self.scripts, self.vocab, self.step = scripts, vocab, 0
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True, **_):
        if past_key_values is None:
            self.step, past_key_values = 0, _Cache(list(range(input_ids.shape[0])))
        else:
            self.step += 1
        logits = torch.full((input_ids.shape[0], input_ids.shape[1], self.vocab), -30.0)
        for b, row in enumerate(past_key_values.rows):
            script = self.scripts[row]
            logits[b, -1, script[min(self.step, len(script) - 1)]] = 30.0
        return SimpleNamespace(logits=logits, past_key_values=past_key_values)


def test_hf_engine_stops_at_the_token_completing_a_split_tag(split_policy):
    tok = split_policy.tokenizer
    call, after = encode(tok, "print(6*7)</code>"), encode(tok, "<interpreter>junk")
    merged = tok.convert_tokens_to_ids("><")  # one token: the tag's last character and the next tag's first
    assert merged != tok.unk_token_id and len(encode(tok, "</code>")) > 1
    inside = encode(tok, "print(6*7)</code")  # the tag completed inside the token "><"
    scripts = [call + after, inside + [merged] + after, encode(tok, "<answer>42</answer>") + after, after * 3]
    # a scripted row is a batch position, not a sequence: identical prompts must stay separate rows
    engine = HFEngine(Scripted(scripts, len(tok)), tok, share_prompts=False)
    out = engine.generate(
        [[1, 2]] * 4,
        [40] * 4,
        stop_ids={tok.eos_token_id},
        sampling=Sampling(greedy=True),
        generator=None,
        stop_strings=TURN_STOPS,
    )
    assert out[0].ids == call  # the multi-token tag, and nothing after it
    assert out[1].ids == inside + [merged]  # kept whole: the sampled ids exactly, "<" after the tag included
    assert out[2].ids == encode(tok, "<answer>42</answer>")
    assert len(out[3].ids) == 40  # no stop: the budget
    # without stop strings (the scratch fast path's call) the split tag does not stop the row
    plain = engine.generate(
        [[1, 2]], [len(call) + 3], stop_ids={tok.eos_token_id}, sampling=Sampling(greedy=True), generator=None
    )
    assert len(plain[0].ids) == len(call) + 3


def test_the_loop_reads_the_call_before_a_tag_that_ends_inside_a_token(split_policy, micro_cfg):
    """The record keeps the token that held the stop; the tool gets the text between the opening
    tag and the stop; the observation's ids follow with tool_mask 0."""
    tok = split_policy.tokenizer
    merged = tok.convert_tokens_to_ids("><")
    turn = encode(tok, "<code>print(6*7)</code")
    answer = encode(tok, "<answer>42</answer>")
    seen = []

    class Tool:
        name = "code"

        def call_many(self, args):
            seen.extend(args)
            from environments.tools import ToolResult

            return [ToolResult("42\n", None, 0.0) for _ in args]

    task = {"task_id": "t", "family": "arithmetic", "prompt": "compute 6*7\n", "answer": "42"}
    # no KV to keep: the scripted model counts its steps in a cache of its own
    engine = HFEngine(Scripted([turn + [merged] + answer + answer], len(tok)), tok, reuse_kv=False)
    cfg = micro_cfg.rollout.model_copy(update={"system_prompt": "Use tools."})
    # the scripted model's row 0 replays its script from the start of each call: turn 2 starts at `answer`
    engine.model.scripts = [turn + [merged]]
    first = run_episodes(
        engine,
        tok,
        [task],
        group_size=1,
        tools={"code": Tool()},
        cfg=cfg.model_copy(update={"max_turns": 1}),
        greedy=True,
    )[0]
    assert seen == ["print(6*7)"]
    assert first.completion_ids[: len(turn) + 1] == turn + [merged]
    observation = first.completion_ids[len(turn) + 1 :]
    assert observation == encode(tok, "<interpreter>42\n</interpreter>") and first.tool_mask == [1] * (
        len(turn) + 1
    ) + [0] * len(observation)
    assert first.prompt_ids == prompt_ids(tok, task, "Use tools.")


# --------------------------------------------------------------------------- stops and templates
def test_turn_stops_use_ids_for_single_token_tags_and_strings_otherwise(warm_policy, split_policy):
    scratch, split = TurnStops.of(warm_policy.tokenizer), TurnStops.of(split_policy.tokenizer)
    assert scratch.strings == () and {warm_policy.tokenizer.convert_tokens_to_ids(CODE_CLOSE)} <= scratch.ids
    assert split.strings == TURN_STOPS and split.ids == {
        split_policy.tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")
    }
    assert TurnStops.of(warm_policy.tokenizer, fast=False).strings == TURN_STOPS


def test_prompts_go_through_the_chat_template(warm_policy, split_policy):
    task = warm_policy.tasks[0]
    assert warm_policy.tokenizer.chat_template == PLAIN_TEMPLATE
    # scratch without a system prompt: the task's text
    assert render_prompt(warm_policy.tokenizer, task, None) == task["prompt"]
    text = render_prompt(split_policy.tokenizer, task, "Tools: {tools}.")
    assert text.startswith("<|im_start|>system\nTools: to run Python, write the program between <code> and </code>")
    assert text.endswith(f"<|im_start|>user\n{task['prompt']}<|im_end|>\n<|im_start|>assistant\n")
    ids = prompt_ids(split_policy.tokenizer, task, None)
    # the template's markers are single special ids
    assert ids[0] == split_policy.tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_the_fast_path_and_the_string_path_give_the_same_episodes(warm_policy, micro_cfg):
    """On the scratch tokenizer (tags are single tokens) stopping on ids and stopping on strings
    sample the same turns: the fast path is an optimization, not another protocol."""
    tasks = [t for f in FAMILIES for t in warm_policy.tasks if t["family"] == f][:12]
    episodes = {}
    for fast in (True, False):
        loop = _Loop(
            warm_policy.tokenizer, warm_policy.tools, micro_cfg.rollout, Sampling.of(micro_cfg.rollout), fast_stops=fast
        )
        from training.agent.loop import Episode
        from training.agent.sampling_keys import episode_seed

        eps = [
            Episode(
                task=t,
                group_id=t["task_id"],
                sample_index=k,
                prompt_ids=prompt_ids(warm_policy.tokenizer, t, None),
                seed=episode_seed("seed=5", t["task_id"], k),
            )
            for t in tasks
            for k in range(2)
        ]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2) as pool:
            loop.turn_by_turn(HFEngine(warm_policy.model, warm_policy.tokenizer), eps, pool)
        episodes[fast] = [(e.completion_ids, e.tool_mask, e.stop_reason) for e in eps]
    assert episodes[True] == episodes[False]
    assert any(len(m) > sum(m) for _, m, _ in episodes[True])  # tool calls happened


# --------------------------------------------------------------------------- both engines, real-shaped tokenizer
@pytest.fixture(scope="module")
def split_vllm(split_policy, micro_cfg):
    cfg = micro_cfg.rollout.model_copy(update={"system_prompt": "Answer in <answer></answer>."})
    engine = VLLMEngine.from_model(split_policy.model, split_policy.tokenizer, cfg, seed=0)
    yield engine
    engine.close()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["hf", pytest.param("vllm", marks=pytest.mark.xdist_group("vllm"))])
def test_split_tag_rollouts_are_token_exact(kind, family, split_policy, micro_cfg, tmp_path, request):
    cfg = micro_cfg.rollout.model_copy(update={"system_prompt": "Answer in <answer></answer>."})
    engine = (
        HFEngine(split_policy.model, split_policy.tokenizer) if kind == "hf" else request.getfixturevalue("split_vllm")
    )
    episodes = check_token_exact(engine, split_policy, family, cfg, tmp_path, {"hf": 1e-4, "vllm": 1e-3}[kind])
    assert all(len(encode(split_policy.tokenizer, close)) > 1 for close in TURN_STOPS)
    assert any(e.stop_reason == "answer" for e in episodes)
