"""Multi-turn agent loop on token ids, with a batched HF sampler that keeps a KV cache.

Each turn, every unfinished episode generates until a stop tag (`</code>`, `</answer>`), EOS or
its budget. Episodes that stopped on `</code>` run their code through the tool (one batched,
concurrent call per turn), the observation's ids are appended with tool_mask 0 and
logprob 0, and the loop goes on. Ids sampled by the policy are recorded as sampled; text is
only ever derived from ids (for the tool and for logs), never the other way round.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from configs.schema import RolloutConfig
from environments import TOOLS_BY_FAMILY
from environments.tools import Tool, ToolResult
from training.sequences import encode_observation
from training.tokenizer import tag_ids
from verifiers.protocol import ANSWER_CLOSE, OBSERVATION_TAGS, TOOL_TAGS


@dataclass
class Episode:
    task: dict
    group_id: str
    sample_index: int
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    tool_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tool_calls: list[dict] = field(default_factory=list)
    turns: int = 0
    stop_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def extend(self, ids: list[int], mask_value: int, logprobs: list[float] | None = None) -> None:
        self.completion_ids += ids
        self.tool_mask += [mask_value] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


@torch.no_grad()
def sample_turn(
    model,
    sequences: list[list[int]],
    budgets: list[int],
    *,
    stop_ids: set[int],
    pad_id: int,
    temperature: float,
    greedy: bool,
    generator: torch.Generator | None,
) -> tuple[list[list[int]], list[list[float]]]:
    """Sample up to `budgets[i]` tokens for each sequence, stopping a row at a stop id.
    Returns the sampled ids and their behaviour log-probs under softmax(logits / T)."""
    B, L = len(sequences), max(map(len, sequences))
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention = torch.zeros((B, L), dtype=torch.long)
    for i, seq in enumerate(sequences):  # left padding: every row's next token is column L
        input_ids[i, L - len(seq) :] = torch.tensor(seq)
        attention[i, L - len(seq) :] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True)
    cache, logits = out.past_key_values, out.logits[:, -1]
    next_pos = positions[:, -1:] + 1
    budget = torch.tensor(budgets)
    stops = torch.tensor(sorted(stop_ids))
    finished = budget <= 0
    sampled: list[list[int]] = [[] for _ in range(B)]
    logps: list[list[float]] = [[] for _ in range(B)]
    for step in range(int(budget.max())):
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        token = logp.argmax(-1) if greedy else torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        token_logp = logp.gather(-1, token[:, None]).squeeze(-1)
        for i in (~finished).nonzero().flatten().tolist():
            sampled[i].append(int(token[i]))
            logps[i].append(float(token_logp[i]))
        finished = finished | torch.isin(token, stops) | (budget <= step + 1)
        if bool(finished.all()):
            break
        token = torch.where(finished, torch.full_like(token, pad_id), token)
        attention = torch.cat([attention, (~finished).long()[:, None]], dim=1)
        out = model(input_ids=token[:, None], attention_mask=attention, position_ids=next_pos, past_key_values=cache, use_cache=True)
        cache, logits, next_pos = out.past_key_values, out.logits[:, -1], next_pos + 1
    return sampled, logps


def _call_of_turn(tokenizer, turn_ids: list[int], open_id: int) -> str:
    """The call's text between the turn's last opening tag and the closing tag it stopped on."""
    body = turn_ids[:-1]
    if open_id in body:
        body = body[len(body) - body[::-1].index(open_id) :]
    return tokenizer.decode(body)


def _dispatch(tools: Mapping[str, Tool], calls: list[tuple[Episode, str, str]]) -> list[ToolResult]:
    """Results in call order. Calls of one tool go out as one batch (the sandbox and the index
    run them concurrently / vectorized); a call to a tool the task's family does not offer gets
    an error observation instead of running (and the reward's tool_misuse term counts it)."""
    results: list[ToolResult | None] = [None] * len(calls)
    for name in dict.fromkeys(n for _, n, _ in calls):
        index = [i for i, (episode, n, _) in enumerate(calls) if n == name and n in TOOLS_BY_FAMILY.get(episode.task["family"], ()) and n in tools]
        for i, result in zip(index, tools[name].call_many([calls[i][2] for i in index]) if index else []):
            results[i] = result
    return [r if r is not None else ToolResult(f"unknown tool {name}\n", "unknown_tool", 0.0) for r, (_, name, _) in zip(results, calls)]


def run_episodes(
    model,
    tokenizer,
    tasks: list[dict],
    *,
    group_size: int,
    tools: Mapping[str, Tool],
    cfg: RolloutConfig,
    generator: torch.Generator | None = None,
    greedy: bool = False,
    temperature: float | None = None,
    group_prefix: str = "",
) -> list[Episode]:
    """Roll out `group_size` episodes per task (one GRPO group per task). `tools` maps a tool
    name to the tool; an episode may call the tools its family offers (TOOLS_BY_FAMILY)."""
    tags = tag_ids(tokenizer)
    eos = tokenizer.eos_token_id
    closing = {tags[TOOL_TAGS[name][1]]: name for name in TOOL_TAGS}  # every tool tag stops a turn
    stop_ids = {*closing, tags[ANSWER_CLOSE], eos}
    episodes = [
        Episode(task=t, group_id=f"{group_prefix}{t['task_id']}", sample_index=k, prompt_ids=tokenizer.encode(t["prompt"], add_special_tokens=False))
        for t in tasks
        for k in range(group_size)
    ]
    model.eval()
    for _ in range(cfg.max_turns):
        active = [e for e in episodes if not e.done]
        if not active:
            break
        # 1. one policy turn for every active episode, batched
        budgets = [min(cfg.max_new_tokens_per_turn, cfg.max_total_tokens - len(e.prompt_ids) - len(e.completion_ids)) for e in active]
        turn_ids, turn_logps = sample_turn(
            model, [e.prompt_ids + e.completion_ids for e in active], budgets, stop_ids=stop_ids, pad_id=eos,
            temperature=temperature or cfg.temperature, greedy=greedy, generator=generator,
        )
        # 2. record sampled tokens (mask 1) and decide how each turn ended
        calls: list[tuple[Episode, str, str]] = []
        for episode, ids, logps in zip(active, turn_ids, turn_logps):
            episode.extend(ids, 1, logps)
            episode.turns += 1
            last = ids[-1] if ids else None
            if last in closing:
                name = closing[last]
                calls.append((episode, name, _call_of_turn(tokenizer, ids, tags[TOOL_TAGS[name][0]])))
            else:
                episode.stop_reason = {tags[ANSWER_CLOSE]: "answer", eos: "eos"}.get(last, "max_tokens")
        # 3. run this turn's tool calls together, batched per tool; append observations (mask 0)
        for (episode, name, args), result in zip(calls, _dispatch(tools, calls)):
            obs_ids = encode_observation(tokenizer, result.observation, name)
            truncated = len(obs_ids) > cfg.max_observation_tokens
            if truncated:  # keep the closing tag so the policy still sees where the output ends
                obs_ids = obs_ids[: cfg.max_observation_tokens - 1] + [tags[OBSERVATION_TAGS[name][1]]]
            episode.extend(obs_ids, 0)
            episode.tool_calls.append({
                "name": name, "args": args, "result": result.observation, "error": result.error,
                "latency_s": round(result.latency_s, 5), "truncated": truncated,
            })
            if len(episode.prompt_ids) + len(episode.completion_ids) >= cfg.max_total_tokens:
                episode.stop_reason = "max_tokens"
    for episode in episodes:
        if not episode.done:
            episode.stop_reason = "max_turns"
    return episodes
