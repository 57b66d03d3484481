"""One GRPO step of ours against one of TRL's `GRPOTrainer`, on the same work, alternating (issue 9, part 1).

    .venv/bin/python benchmarks/trl_side_by_side.py --home /tmp/rollout-bench [--sizes tiny,20m] [--steps 6]
    .venv/bin/python benchmarks/trl_side_by_side.py --home /tmp/rollout-bench --sizes smol   # SmolLM2-135M-Instruct

TRL is not a dependency of the product: `bash scripts/setup.sh --bench` installs its pin into `.venv`.

The same work on both sides, per size:
- the same model and tokenizer: the size's warm-started policy (benchmarks/rollout_engines.py's
  cache), loaded from the same folder by each side;
- the same prompts per step: `--prompts` arithmetic tasks, in the same order, x `--group` samples;
- the same tool: our code interpreter (the bubblewrap sandbox), one pool per side; TRL calls it as
  a Python function `code(code)`, once per call, as its tool loop does;
- the same tokens: TRL gets a chat template that renders our tag protocol (a prompt is its text,
  a tool call is `<code>…</code>`, a tool message is `<interpreter>…</interpreter>`) and a
  response template that parses `<code>…</code>` as a call, so both sides sample from the same
  distribution over the same token sequences; generation stops at `</code>`, `</answer>` and EOS;
- the same limits: `--completion-tokens` per trajectory (ours: prompt + that many; TRL:
  `max_completion_length`), `--tool-turns` tool calls (ours: `max_turns` = that + 1; TRL:
  `max_tool_calling_iterations`), temperature 1;
- the same algorithm: GRPO, group-normalized advantages, PPO clip 0.2, K3 KL to the reference in
  the loss with beta 0.01, token-mean loss over the batch (TRL's `dapo`), AdamW (0.9, 0.99), lr
  `--lr` (constant), no weight decay, grad clip 1, one optimizer step per batch (ours:
  `rl.minibatches: 1`), every trajectory trained (ours: `rl.drop_zero_variance_groups: false`);
- the same reward: our verifier cascade scores both sides' trajectories.
Each side keeps its own defaults otherwise: ours its HF engine (batched, KV cache kept, tools
batched on threads) and old log-probs pass; TRL its `model.generate` and tool loop.

Each side runs in a child process that stops after every optimizer step until told to go on; the
parent alternates them (the first mover alternating too), so both see the same machine state.
A step is timed from "go" to the end of its optimizer step. Peak RSS is the child's process tree
(sandbox workers included) sampled every 0.2 s during its steps. The first `--warmup` steps of
each side are not counted. Writes benchmarks/results/trl-side-by-side.{json,md,png}.

The size `smol` is the real SmolLM2-135M-Instruct (134.5M parameters; benchmarks/rollout_engines.py
`pretrained_model`), with the `smol` profile's tokenizer, ChatML template and system prompt
(`rollout.system_prompt`), and that profile's settings that would change the work set back to the
scratch sizes' (SMOL_SAME_WORK: HF engine, no dynamic sampling, no TIS, no batch cap); both sides
train in fp32 (the profile's bf16 autocast is not used). Its tokenizer splits every tag into several
tokens (`</code>` is `</`, `code`, `>`), so the same work needs more than a chat template on TRL's side:
- turns stop on the tags' text on both sides: ours as our loop does (`TurnStops`), TRL's through
  `generation_kwargs={"stop_strings": ...}` (transformers' StopStringCriteria: the token that completes
  the string ends the row, as in our engines), with `<|im_end|>` and `<|endoftext|>` as EOS. generate
  pads a stopped row with the pad id, which on SmolLM2 is its EOS, and TRL keeps one of those as if
  sampled: each turn is cut back to the token that completed its stop;
- CHATML_PROTOCOL_CHAT_TEMPLATE renders the protocol inside ChatML as our loop lays it out
  (training/agent/chat.py: the episode is one assistant message, `<|im_end|>` only at its end), and
  TRL's prompts come out as the same ids as ours (checked at start-up);
- tool output is appended as ids encoded on their own (training/sequences.py `encode_observation`),
  which no re-tokenized text reproduces: BPE merges `</code><interpreter>` across the tags into a
  `><` token. So TRL's tool suffix (`_get_tool_suffix_ids`, a render-and-diff of the template) is
  replaced by `encode_observation`, and its start-up check that the template is prefix-preserving
  under tokenization (which fails on that merge) is skipped; both are TRL 1.16 internals (pinned);
- the reward function's tool mask is found from the text (`<interpreter>…</interpreter>`).
As it ships, SmolLM2 never writes a tool call with the profile's system prompt (0 of 32 arithmetic
episodes of up to 128 tokens here, 0 of 900 benchmark episodes in docs/results.md: it answers in prose
or a markdown code block), so its steps would be single-turn. By default it is warm-started first
(`--sft-steps smol=16`: rollout_engines.SMOL_WARM_START, cached in --home); `smol=0` runs it as it
ships. Defaults for smol: 8 prompts x 4 samples, lr 5e-6 (a pretrained 135M: small steps keep the
measured steps' work alike). Writes benchmarks/results/trl-side-by-side-smol.{json,md,png} when
--sizes has smol (--tag names another suffix).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRL_PIN = "1.16.0"
KL_COEF, CLIP, GRAD_CLIP = 0.01, 0.2, 1.0

# Our tag protocol as a chat template (see module docstring). Prefix-preserving, as TRL's tool
# loop requires: an assistant message ending on a tool call renders no end-of-turn token.
PROTOCOL_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' or message.role == 'system' -%}{{ message.content }}"
    "{%- elif message.role == 'assistant' -%}{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- if call.function.name == 'code' -%}<code>{{ call.function.arguments.code | default('') }}</code>"
    "{%- else -%}<{{ call.function.name }}>{{ call.function.arguments | tojson }}</{{ call.function.name }}>{%- endif -%}"  # no such tool here
    "{%- endfor -%}"
    "{%- if not message.tool_calls -%}<|endoftext|>{%- endif -%}"
    "{%- elif message.role == 'tool' -%}<interpreter>{{ message.content }}</interpreter>"
    "{%- endif -%}"
    "{%- endfor -%}"
)
# transformers' response template (>= 5.13): `<code>…</code>` is a call to `code`, the rest is content.
# The protocol has no assistant header, so the response starts where the prompt so far ends (\Z).
PROTOCOL_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor_pattern": r"\Z",
    "fields": {
        "tool_calls": {
            "open": "<code>",
            "close_pattern": r"</code>",
            "repeats": True,
            "content": "text",
            "transform": {"type": "function", "function": {"name": "code", "arguments": {"code": "{content}"}}},
        },
        "content": {"close_pattern": r"<\|endoftext\|>|$", "content": "text"},
    },
}
# The protocol inside ChatML, as our agent loop lays out a ChatML model's episode (training/agent/chat.py):
# system and user turns as the model's own template renders them, then the whole episode as one
# assistant message, `<code>…</code>` calls and `<interpreter>…</interpreter>` output inside it, and
# `<|im_end|>` only after the message that calls no tool. Every prompt has a system message (the
# profile's), so SmolLM2's default system prompt never applies.
CHATML_PROTOCOL_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' or message.role == 'system' -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
    "{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- if call.function.name == 'code' -%}<code>{{ call.function.arguments.code | default('') }}</code>"
    "{%- else -%}<{{ call.function.name }}>{{ call.function.arguments | tojson }}</{{ call.function.name }}>{%- endif -%}"  # no such tool here
    "{%- endfor -%}"
    "{%- if not message.tool_calls -%}{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- elif message.role == 'tool' -%}<interpreter>{{ message.content }}</interpreter>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt and (not messages or messages[-1].role in ('system', 'user')) -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- endif -%}"
)
# Its response template: the same fields, the message ending at ChatML's end of turn.
CHATML_PROTOCOL_RESPONSE_TEMPLATE = {
    **PROTOCOL_RESPONSE_TEMPLATE,
    "fields": {
        **PROTOCOL_RESPONSE_TEMPLATE["fields"],
        "content": {"close_pattern": r"<\|im_end\|>|$", "content": "text"},
    },
}
# The smol profile's settings that would make our side do other work than TRL's (the scratch sizes
# run the tiny profile's values): its vLLM engine, DAPO's refills, TIS against vLLM, the batch cap.
SMOL_SAME_WORK = {
    "rollout.engine": "hf",
    "rollout.max_batch_size": None,
    "rl.dynamic_sampling": False,
    "rl.tis_cap": None,
}


# --------------------------------------------------------------------------- the shared job
def step_tasks(tasks: list[dict], prompts: int, steps: int) -> list[list[dict]]:
    """The arithmetic tasks of each step, in order; both sides read the same lists."""
    pool = [t for t in tasks if t["family"] == "arithmetic"]
    if len(pool) < prompts * steps:
        raise ValueError(
            f"{prompts} prompts x {steps} steps needs {prompts * steps} arithmetic tasks; the cache has {len(pool)}"
        )
    return [pool[i * prompts : (i + 1) * prompts] for i in range(steps)]


def observation_mask(ids: list[int], open_id: int, close_id: int) -> list[int]:
    """1 for the policy's tokens, 0 inside (and on) `<interpreter>…</interpreter>`: our tool_mask."""
    mask, inside = [], False
    for token in ids:
        inside = inside or token == open_id
        mask.append(0 if inside else 1)
        inside = inside and token != close_id
    return mask


def text_observation_mask(texts: list[str]) -> tuple[list[int], int]:
    """`observation_mask` for tags written as text over several tokens (`texts`: each id's text): 0 on
    the tokens of `<interpreter>…</interpreter>` (appended as ids of their own, so they start and end
    on token boundaries), and the number of `</code>` outside them (the tool calls)."""
    from verifiers.protocol import CODE_CLOSE, OBS_CLOSE, OBS_OPEN

    text = "".join(texts)
    observation = re.escape(OBS_OPEN) + ".*?(?:" + re.escape(OBS_CLOSE) + r"|\Z)"
    spans = [m.span() for m in re.finditer(observation, text, re.S)]
    mask, start = [], 0
    for piece in texts:
        end = start + len(piece)
        mask.append(0 if any(a < max(end, start + 1) and start < b for a, b in spans) else 1)
        start = end
    policy_text = "".join(piece for piece, m in zip(texts, mask) if m)
    return mask, policy_text.count(CODE_CLOSE)


def turn_length(texts: list[str], stops: tuple[str, ...]) -> int:
    """Tokens up to the one that completes the first of `stops` (all of them if none does): where our
    engines end a turn (training/agent/engines.py)."""
    keep, tail = max(map(len, stops)) - 1, ""
    for k, piece in enumerate(texts):
        window = tail + piece
        if any(stop in window for stop in stops):
            return k + 1
        tail = window[-keep:]
    return len(texts)


class Stages:
    """Seconds per stage within the current step: generation (the model sampling), tools (the
    interpreter's calls), verification (our cascade runs during generation: what the step waits for
    after it); the step's remainder is training (log-prob passes, loss, backward, optimizer) and
    bookkeeping. The same cut on both sides."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, stage: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

        return timed

    def take(self, wall_s: float) -> dict[str, float]:
        out = {stage: round(self.seconds.get(stage, 0.0), 3) for stage in ("generation", "tools", "verification")}
        out["training"] = round(wall_s - sum(out.values()), 3)
        self.seconds = {}
        return out


class Gate:
    """The child's side of the alternation: report a finished step on stdout, wait for 'go'."""

    def __init__(self) -> None:
        self.resumed = 0.0
        self.out = os.fdopen(os.dup(1), "w")  # the protocol's own stream; libraries' prints go to stderr
        os.dup2(2, 1)

    def send(self, message: dict) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def wait(self) -> None:
        line = sys.stdin.readline().strip()
        if line != "go":
            raise SystemExit(0)  # "stop" or the parent gone
        self.resumed = time.perf_counter()

    def step_done(self, stats: dict, stages: Stages) -> None:
        wall = time.perf_counter() - self.resumed
        self.send({"wall_s": wall, **stats, "stages": stages.take(wall)})
        self.wait()


def use_single_token_tags(model, tok):
    """TRL's side of the protocol on the scratch tokenizer (every tag one token): its templates, and
    the closing tags' ids as EOS. Returns a completion's (tool mask, tool calls)."""
    from training.tokenizer import tag_ids
    from verifiers.protocol import ANSWER_CLOSE, CODE_CLOSE, OBS_CLOSE, OBS_OPEN

    tags = tag_ids(tok)
    tok.chat_template = PROTOCOL_CHAT_TEMPLATE
    tok.response_template = PROTOCOL_RESPONSE_TEMPLATE
    model.generation_config.eos_token_id = [tok.eos_token_id, tags[CODE_CLOSE], tags[ANSWER_CLOSE]]  # our stops
    return lambda ids: (observation_mask(ids, tags[OBS_OPEN], tags[OBS_CLOSE]), ids.count(tags[CODE_CLOSE]))


def token_texts(tok):
    """ids -> each id's text (cached per id). The tags are ASCII, so finding them in the concatenation
    finds what finding them in the decoded sequence would (as training/agent/engines.py HFEngine)."""

    @functools.cache
    def one(token: int) -> str:
        return tok.decode([token], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    return lambda ids: [one(token) for token in ids]


def use_text_tags(model, tok, stops):
    """TRL's side of the protocol on a tokenizer that splits the tags (SmolLM2; module docstring): the
    ChatML templates, the end-of-turn ids as EOS (the stop strings go in GRPOConfig.generation_kwargs).
    Returns a completion's (tool mask, tool calls)."""
    tok.chat_template = CHATML_PROTOCOL_CHAT_TEMPLATE
    tok.response_template = CHATML_PROTOCOL_RESPONSE_TEMPLATE
    model.generation_config.eos_token_id = sorted(stops.end_ids)
    # generate's stop strings need the tokenizer, which TRL does not pass
    model.generate = functools.partial(model.generate, tokenizer=tok)
    texts = token_texts(tok)
    return lambda ids: text_observation_mask(texts(ids))


@contextlib.contextmanager
def prefix_check_skipped():
    """GRPOTrainer's start-up check that the chat template is prefix-preserving *as tokens*, which no
    template of the text-tag protocol is (BPE merges `</code><interpreter>` into `...><...`); the tool
    suffix it guards is replaced by `append_ids_and_cut_turns`. TRL 1.16 internals (pinned)."""
    from unittest import mock

    from trl.trainer import grpo_trainer

    with mock.patch.object(grpo_trainer, "is_chat_template_prefix_preserving", return_value=True):
        yield


def append_ids_and_cut_turns(trainer, tok, stops: tuple[str, ...]) -> None:
    """Make TRL's tool loop produce our loop's token sequences on a text-tag tokenizer (module
    docstring): a tool result is appended as `encode_observation`'s ids (TRL's `_get_tool_suffix_ids`
    would re-tokenize a rendered dummy conversation), and each generated turn is cut at the token that
    completed its stop (generate pads a stopped row with the pad id, SmolLM2's EOS, and TRL keeps one).
    TRL 1.16 internals (pinned)."""
    from training.sequences import encode_observation

    trainer._get_tool_suffix_ids = lambda tool_messages: [
        token for message in tool_messages for token in encode_observation(tok, str(message["content"]))
    ]
    generate, texts = trainer._generate_single_turn, token_texts(tok)

    def cut(*args, **kwargs):
        ids, logprobs = generate(*args, **kwargs)
        ends = [turn_length(texts(row), stops) for row in ids]
        ids = [row[:end] for row, end in zip(ids, ends)]
        return ids, None if logprobs is None else [row[:end] for row, end in zip(logprobs, ends)]

    trainer._generate_single_turn = cut


def _sandbox():
    from assets.resources import SandboxResource
    from configs.schema import SandboxConfig

    return SandboxResource.from_config(SandboxConfig()).open()


# --------------------------------------------------------------------------- ours
def run_ours(job: dict, gate: Gate) -> None:
    import torch

    import training.rl.loop as rl_loop
    from configs import load_profile
    from environments.families import build_tools
    from training.agent.chat import prompt_ids
    from training.model import load_policy, load_tokenizer
    from verifiers.cascade import Cascade

    torch.set_num_threads(job["threads"])
    folder, steps = Path(job["folder"]), job["steps"]
    cfg = load_profile(
        job["profile"],
        {
            **job["overrides"],
            "rl.group_size": job["group"],
            "rl.prompts_per_step": job["prompts"],
            "rl.steps_per_round": len(steps),
            "rl.minibatches": 1,
            "rl.drop_zero_variance_groups": False,
            "rl.learning_rate": job["lr"],
            "rl.kl_coef": KL_COEF,
            "rl.grad_clip": GRAD_CLIP,
            "rl.clip_low": CLIP,
            "rl.clip_high": CLIP,
            "rollout.max_turns": job["tool_turns"] + 1,
            "rollout.max_new_tokens_per_turn": job["completion_tokens"],
            "rollout.max_observation_tokens": job["completion_tokens"],
        },
    )
    policy, reference, tok = load_policy(folder), load_policy(folder), load_tokenizer(folder)
    reference.requires_grad_(False).eval()
    system_prompt = cfg.rollout.system_prompt
    if system_prompt is None:  # a scratch prompt is its text: characters bound tokens from above
        longest = max(len(t["prompt"]) for batch in steps for t in batch)
    else:  # a chat template around it, the system prompt most of it: the rendered prompt's tokens
        longest = max(len(prompt_ids(tok, t, system_prompt)) for batch in steps for t in batch)
    # The completion budget: ours counts prompt + completion, so each prompt gets exactly
    # `completion_tokens` more. A per-episode total is not a config field; the longest prompt's is the
    # closest fixed one, which only matters to the rare trajectory that reaches the limit.
    cfg = cfg.model_copy(
        update={"rollout": cfg.rollout.model_copy(update={"max_total_tokens": longest + job["completion_tokens"]})}
    )
    queue = [list(batch) for batch in steps]
    # the job's prompts, in order (not the curriculum's draw)
    rl_loop.sample_prompts = lambda tasks, weights, k, rng: queue.pop(0)
    by_id = {t["task_id"]: t for batch in steps for t in batch}
    stages, build = Stages(), rl_loop.build_rollout_engine

    def timed_engine(*args, **kwargs):
        engine = build(*args, **kwargs)
        for method in ("generate", "submit", "poll"):  # turn-by-turn engines generate; continuous ones submit and poll
            if hasattr(engine, method):
                setattr(engine, method, stages.wrap("generation", getattr(engine, method)))
        return engine

    rl_loop.build_rollout_engine = timed_engine
    # our cascade verifies during generation: what the step waits for after it is verification's share
    rl_loop.Verifying.results = stages.wrap("verification", rl_loop.Verifying.results)

    def on_step(step: int, metrics: dict) -> None:
        n = job["prompts"] * job["group"]
        gate.step_done(
            {
                "generated_tokens": round(metrics["rollout/policy_tokens"] * n),
                "trained_tokens": round(metrics["rollout/policy_tokens"] * n),
                "reward_mean": metrics["reward/total/mean"],
                "pass_rate": metrics["reward/outcome/pass_rate"],
                "tool_call_rate": metrics["rollout/tool_call_rate"],
            },
            stages,
        )

    with _sandbox() as box:
        tools = build_tools(sandbox=box, kb=None)
        for tool in tools.values():
            tool.call_many = stages.wrap("tools", tool.call_many)
        gate.send({"ready": True})
        gate.wait()
        rl_loop.train_round(
            policy,
            reference,
            tok,
            list(by_id.values()),
            tools,
            rl=cfg.rl,
            rollout=cfg.rollout,
            cascade=Cascade(cfg.reward, box, concurrency=cfg.sandbox.pool_size),
            round_index=1,
            policy_version="bench",
            seed=0,
            on_step=on_step,
        )


# --------------------------------------------------------------------------- TRL
def run_trl(job: dict, gate: Gate) -> None:
    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    from configs import load_profile
    from environments.families import build_tools
    from training.agent.chat import messages, prompt_ids
    from training.agent.loop import TurnStops
    from training.model import load_policy, load_tokenizer
    from training.rl.scoring import score_records
    from verifiers.cascade import Cascade

    if trl.__version__ != TRL_PIN:
        raise SystemExit(
            f"TRL {trl.__version__} is installed; this benchmark is pinned to {TRL_PIN} (bash scripts/setup.sh --bench)"
        )
    torch.set_num_threads(job["threads"])
    folder, steps, group = Path(job["folder"]), job["steps"], job["group"]
    cfg = load_profile(job["profile"], job["overrides"])
    system_prompt = cfg.rollout.system_prompt
    model, tok = load_policy(folder), load_tokenizer(folder)
    by_id = {t["task_id"]: t for batch in steps for t in batch}
    ours = {tid: prompt_ids(tok, t, system_prompt) for tid, t in by_id.items()}  # our loop's prompts (its template)
    stops = TurnStops.of(tok)  # the tags as single ids (scratch) or as text (smol): what ends our turns
    mask_and_calls = use_text_tags(model, tok, stops) if stops.strings else use_single_token_tags(model, tok)
    rows = [{"prompt": messages(t, system_prompt), "task_id": t["task_id"]} for batch in steps for t in batch]
    seen = {"step": 0}
    counts: dict = {}
    stages = Stages()

    with _sandbox() as box:
        cascade = Cascade(cfg.reward, box, concurrency=cfg.sandbox.pool_size)
        run_code = stages.wrap("tools", build_tools(sandbox=box, kb=None)["code"].call_many)

        def code(code: str) -> str:
            """Run a Python program in the sandbox and return what it printed.

            Args:
                code: The Python program to run.
            """
            return run_code([code])[0].observation

        def verified_reward(prompts, completions, completion_ids, task_id, **_) -> list[float]:
            """Our cascade on the same records our loop would store (policy tokens only)."""
            records = []
            for i, (ids, tid) in enumerate(zip(completion_ids, task_id)):
                task = by_id[tid]
                mask, calls = mask_and_calls(ids)
                records.append(
                    {
                        "trajectory_id": f"s{seen['step']}-{i}",
                        "task_id": tid,
                        "group_id": f"s{seen['step']}-{i // group}",
                        "family": task["family"],
                        "level": task["level"],
                        "round": 1,
                        "step": seen["step"],
                        "completion_ids": ids,
                        "tool_mask": mask,
                        "num_tool_calls": calls,
                    }
                )
            scores = stages.wrap("verification", score_records)(records, by_id, tok, cascade)
            counts.update(
                generated=sum(sum(r["tool_mask"]) for r in records),
                calls=[r["num_tool_calls"] for r in records],
                rewards=[s["reward"] for s in scores],
                outcomes=[s["outcome"] or 0.0 for s in scores],
            )
            return [s["reward"] for s in scores]

        class Alternate(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                seen["step"] += 1
                gate.step_done(
                    {
                        "generated_tokens": counts["generated"],
                        "trained_tokens": counts["generated"],
                        "reward_mean": statistics.fmean(counts["rewards"]),
                        "pass_rate": statistics.fmean(counts["outcomes"]),
                        "tool_call_rate": sum(c > 0 for c in counts["calls"]) / len(counts["calls"]),
                    },
                    stages,
                )

        args = trl.GRPOConfig(
            output_dir=tempfile.mkdtemp(prefix="trl-bench-"),
            use_cpu=True,
            bf16=False,
            seed=0,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            max_steps=len(steps),
            shuffle_dataset=False,
            dataloader_num_workers=0,
            per_device_train_batch_size=job["prompts"] * group,
            gradient_accumulation_steps=1,
            num_generations=group,
            num_iterations=1,
            max_completion_length=job["completion_tokens"],
            max_tool_calling_iterations=job["tool_turns"],
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=KL_COEF,
            epsilon=CLIP,
            loss_type="dapo",
            scale_rewards="group",
            learning_rate=job["lr"],
            lr_scheduler_type="constant",
            warmup_steps=0,
            adam_beta1=0.9,
            adam_beta2=0.99,
            weight_decay=0.0,
            max_grad_norm=GRAD_CLIP,
            # tags over several tokens: turns stop on their text (transformers' StopStringCriteria)
            generation_kwargs={"stop_strings": list(stops.strings)} if stops.strings else None,
        )
        with prefix_check_skipped() if stops.strings else contextlib.nullcontext():
            trainer = trl.GRPOTrainer(
                model=model,
                reward_funcs=verified_reward,
                args=args,
                train_dataset=Dataset.from_list(rows),
                processing_class=tok,
                tools=[code],
                callbacks=[Alternate()],
            )
        if stops.strings:
            append_ids_and_cut_turns(trainer, tok, stops.strings)
        trainer._generate_single_turn = stages.wrap("generation", trainer._generate_single_turn)
        for row in rows:  # the same prompt ids on both sides
            theirs = tok.apply_chat_template(
                row["prompt"], tools=[code], add_generation_prompt=True, tokenize=True, return_dict=False
            )
            if theirs != ours[row["task_id"]]:
                raise SystemExit(
                    f"TRL's prompt of task {row['task_id']} is not ours: {theirs} vs {ours[row['task_id']]}"
                )
        gate.send({"ready": True})
        gate.wait()
        trainer.train()


# --------------------------------------------------------------------------- the parent
class Side:
    def __init__(self, name: str, job_file: Path) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", name, "--job", str(job_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self.steps: list[dict] = []
        self.peak_mb = 0.0
        self.receive()  # "ready": models loaded, trainer built

    def receive(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} side exited (code {self.proc.wait()}); its stderr is above")
        return json.loads(line)

    def step(self) -> dict:
        from benchmarks.flywheel_by_asset import tree_rss_mb

        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.2):  # a /proc walk costs CPU; 0.2 s keeps it small
                self.peak_mb = max(self.peak_mb, tree_rss_mb(self.proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        result = self.receive()
        done.set()
        sampler.join()
        self.steps.append(result)
        return result

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            self.proc.wait(timeout=60)


def summarize(side: Side, warmup: int) -> dict:
    measured = side.steps[warmup:]
    walls = [s["wall_s"] for s in measured]
    return {
        "steps": len(measured),
        "wall_median_s": round(statistics.median(walls), 3),
        "wall_min_s": round(min(walls), 3),
        "wall_max_s": round(max(walls), 3),
        "generated_tokens_per_s": round(statistics.median(s["generated_tokens"] / s["wall_s"] for s in measured), 1),
        "trained_tokens_per_s": round(statistics.median(s["trained_tokens"] / s["wall_s"] for s in measured), 1),
        "generated_tokens_per_step": round(statistics.median(s["generated_tokens"] for s in measured)),
        "tool_call_rate": round(statistics.median(s["tool_call_rate"] for s in measured), 3),
        "reward_mean": round(statistics.median(s["reward_mean"] for s in measured), 3),
        "stages_median_s": {
            k: round(statistics.median(s["stages"][k] for s in measured), 3) for k in measured[0]["stages"]
        },
        "peak_rss_mb": round(side.peak_mb),
        "per_step": measured,
    }


def plot(rows: list[dict], path: Path) -> None:
    """Per size: each measured step's wall time, ours and TRL's, in the order they ran, with the
    medians as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, panels = plt.subplots(1, len(rows), figsize=(5 * len(rows), 3.6), squeeze=False)
    for ax, row in zip(panels[0], rows):
        for name, color in (("ours", "tab:blue"), ("trl", "tab:orange")):
            walls = [s["wall_s"] for s in row[name]["per_step"]]
            ax.plot(
                range(1, len(walls) + 1),
                walls,
                "o-",
                color=color,
                label=f"{'ours' if name == 'ours' else 'TRL'}: median {row[name]['wall_median_s']:.2f} s",
            )
            ax.axhline(row[name]["wall_median_s"], color=color, linestyle=":")
        ax.set_title(
            f"{row['size']} ({row['parameters_m']}M), {row['prompts'] * row['group']} trajectories: ours / TRL = {row['ratio_ours_over_trl']}",
            fontsize=9,
        )
        ax.set_xlabel("measured step")
        ax.set_ylabel("GRPO step wall (s)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--home",
        type=Path,
        default=Path("/tmp/rollout-bench"),
        help="warm-started model cache (benchmarks/rollout_engines.py)",
    )
    parser.add_argument("--sizes", default="tiny,20m")
    parser.add_argument(
        "--sft-steps",
        default="tiny=400,20m=400,smol=16",
        help="warm-start SFT steps per size (20m: 150 steps left it calling tools too rarely; "
        "smol=0: SmolLM2 as it ships, which never calls a tool)",
    )
    parser.add_argument(
        "--prompts",
        default="tiny=32,20m=16,smol=8",
        help="prompts per step per size (the tiny profile: 32) (x --group trajectories)",
    )
    parser.add_argument("--group", default="tiny=8,20m=8,smol=4", help="samples per prompt, per size or one for all")
    parser.add_argument("--steps", type=int, default=6, help="measured steps per side")
    parser.add_argument("--warmup", type=int, default=1, help="steps per side not measured")
    parser.add_argument("--completion-tokens", type=int, default=128)
    parser.add_argument("--tool-turns", type=int, default=3)
    parser.add_argument(
        "--lr",
        default="tiny=2e-4,20m=2e-5,smol=5e-6",
        help="learning rate per size, both sides (tiny: the profile's; at 2e-4 "
        "the 20m policy stops calling tools after one step, and the steps measured are no longer agentic; "
        "smol: a pretrained 135M, where small steps keep the measured steps' work alike)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--tag",
        default=None,
        help="suffix of the result files (trl-side-by-side-TAG.*); default: smol when --sizes has it, else none",
    )
    parser.add_argument(
        "--replot", action="store_true", help="only redraw trl-side-by-side[-TAG].png from the JSON in --out"
    )
    parser.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        gate = Gate()
        job = json.loads(args.job.read_text())
        (run_ours if args.child == "ours" else run_trl)(job, gate)
        return 0

    sizes = args.sizes.split(",")
    tag = args.tag if args.tag is not None else ("smol" if "smol" in sizes else "")
    stem = "-".join(part for part in ("trl-side-by-side", tag) if part)
    if args.replot:
        results = args.out / f"{stem}.json"
        if not results.exists():
            parser.error(f"--replot: {results} does not exist; run the benchmark first")
        plot(json.loads(results.read_text())["rows"], args.out / f"{stem}.png")
        return 0

    from benchmarks.rollout_engines import PRETRAINED, SIZES, load_size, per_size, shipped_as

    groups = per_size(args.group, sizes, "--group")
    if args.steps < 1 or args.warmup < 0 or min(groups.values()) < 2:
        parser.error("--steps must be >= 1, --warmup >= 0 and --group >= 2 (GRPO needs a group)")
    try:
        import trl
    except ImportError:
        parser.error(f"TRL is not installed: run `bash scripts/setup.sh --bench` (installs trl=={TRL_PIN} into .venv)")
    if trl.__version__ != TRL_PIN:
        parser.error(
            f"TRL {trl.__version__} is installed; this benchmark is pinned to {TRL_PIN}: run `bash scripts/setup.sh --bench`"
        )

    sft_steps = dict(item.split("=") for item in args.sft_steps.split(","))
    prompts = dict(item.split("=") for item in args.prompts.split(","))
    rates = dict(item.split("=") for item in args.lr.split(","))
    rows = []
    for size in sizes:
        if (size not in SIZES and size not in PRETRAINED) or any(size not in d for d in (sft_steps, prompts, rates)):
            parser.error(
                f"--sizes: {size!r} needs an entry in SIZES ({', '.join(SIZES)}) or PRETRAINED ({', '.join(PRETRAINED)}), "
                "--sft-steps, --prompts and --lr"
            )
        with _sandbox() as box:
            cfg, folder, model, _, tasks, _ = load_size(size, int(sft_steps[size]), args.home, box)
        n_params = sum(p.numel() for p in model.parameters())
        del model
        total = args.warmup + args.steps
        job = {
            "folder": str(folder),
            # a pretrained size runs its own profile, less what would change the work (SMOL_SAME_WORK)
            "profile": PRETRAINED.get(size, "tiny"),
            "overrides": SMOL_SAME_WORK if size in PRETRAINED else SIZES[size],
            "group": groups[size],
            "prompts": int(prompts[size]),
            "threads": args.threads,
            "lr": float(rates[size]),
            "completion_tokens": args.completion_tokens,
            "tool_turns": args.tool_turns,
            "steps": step_tasks(tasks, int(prompts[size]), total),
        }
        # a pretrained size's label says how it ran: as it ships or warm-started
        label = size if size not in PRETRAINED else f"{size} ({shipped_as(int(sft_steps[size]))})"
        with tempfile.TemporaryDirectory() as tmp:
            job_file = Path(tmp) / "job.json"
            job_file.write_text(json.dumps(job))
            sides = [Side("ours", job_file), Side("trl", job_file)]
            try:
                for step in range(total):
                    for side in sides if step % 2 == 0 else sides[::-1]:  # who goes first alternates too
                        r = side.step()
                        print(
                            f"[bench] {size} step {step + 1}/{total} {side.name:>4}: {r['wall_s']:.2f}s, {r['generated_tokens']} policy tokens, "
                            f"tool calls in {r['tool_call_rate']:.0%}, reward {r['reward_mean']:.3f}; "
                            + ", ".join(f"{k} {v:.2f}s" for k, v in r["stages"].items())
                            + (" (warm-up)" if step < args.warmup else ""),
                            flush=True,
                        )
            finally:
                for side in sides:
                    side.close()
        ours, theirs = summarize(sides[0], args.warmup), summarize(sides[1], args.warmup)
        rows.append(
            {
                "size": label,
                "parameters_m": round(n_params / 1e6, 2),
                "prompts": int(prompts[size]),
                "group": groups[size],
                "lr": float(rates[size]),
                "ours": ours,
                "trl": theirs,
                "ratio_ours_over_trl": round(ours["wall_median_s"] / theirs["wall_median_s"], 3),
                "ratio_trl_over_ours": round(theirs["wall_median_s"] / ours["wall_median_s"], 2),
            }
        )
        print(
            f"[bench] {size}: ours {ours['wall_median_s']}s vs TRL {theirs['wall_median_s']}s a step: ours / TRL = {rows[-1]['ratio_ours_over_trl']}",
            flush=True,
        )

    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(
        [".venv/bin/python benchmarks/trl_side_by_side.py", *(argv if argv is not None else sys.argv[1:])]
    )
    (args.out / f"{stem}.json").write_text(
        json.dumps(
            {
                "command": command,
                "trl": TRL_PIN,
                "completion_tokens": args.completion_tokens,
                "tool_turns": args.tool_turns,
                "rows": rows,
            },
            indent=1,
        )
    )
    group = " / ".join(sorted({str(groups[size]) for size in sizes}))
    lines = [
        f"`{command}` (TRL {TRL_PIN}, group {group}, {args.completion_tokens} completion tokens, {args.tool_turns} tool turns, "
        f"median of {args.steps} steps after {args.warmup} warm-up)",
        "",
        "| size | params (M) | trajectories / step | lr | side | step wall, median (min-max) s | generated tok/s | trained tok/s | peak RSS (MB) "
        "| tool-call rate | mean reward | ours / TRL |",
        "|---" * 12 + "|",
    ]
    for r in rows:
        for name in ("ours", "trl"):
            s = r[name]
            lines.append(
                f"| {r['size']} | {r['parameters_m']} | {r['prompts'] * r['group']} | {r['lr']:g} | {name} | {s['wall_median_s']} ({s['wall_min_s']}-{s['wall_max_s']}) "
                f"| {s['generated_tokens_per_s']} | {s['trained_tokens_per_s']} | {s['peak_rss_mb']:,} | {s['tool_call_rate']} | {s['reward_mean']} "
                f"| {'**' + str(r['ratio_ours_over_trl']) + '**' if name == 'ours' else ''} |"
            )
    plot(rows, args.out / f"{stem}.png")
    table = "\n".join(lines)
    (args.out / f"{stem}.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
