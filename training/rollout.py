"""Multi-turn agent loop on token ids, with a batched HF sampler that keeps a KV cache.

Each turn, every unfinished episode generates until a stop tag (`</code>`, `</answer>`), EOS or
its budget. Episodes that stopped on `</code>` run their code through the tool (one batched,
concurrent call per turn), the observation's ids are appended with tool_mask 0 and
logprob 0, and the loop goes on. Ids sampled by the policy are recorded as sampled; text is
only ever derived from ids (for the tool and for logs), never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from configs.schema import RolloutConfig
from environments.tools import CodeInterpreter
from training.sequences import encode_observation
from training.tokenizer import tag_ids
from verifiers.protocol import ANSWER_CLOSE, CODE_CLOSE, CODE_OPEN, OBS_CLOSE


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


def _code_of_turn(tokenizer, turn_ids: list[int], open_id: int) -> str:
    """The code between the turn's last `<code>` and the closing `</code>` it stopped on."""
    body = turn_ids[:-1]
    if open_id in body:
        body = body[len(body) - body[::-1].index(open_id) :]
    return tokenizer.decode(body)


def run_episodes(
    model,
    tokenizer,
    tasks: list[dict],
    *,
    group_size: int,
    tool: CodeInterpreter,
    cfg: RolloutConfig,
    generator: torch.Generator | None = None,
    greedy: bool = False,
    temperature: float | None = None,
    group_prefix: str = "",
) -> list[Episode]:
    """Roll out `group_size` episodes per task (one GRPO group per task)."""
    tags = tag_ids(tokenizer)
    eos = tokenizer.eos_token_id
    stop_ids = {tags[CODE_CLOSE], tags[ANSWER_CLOSE], eos}
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
        calls: list[tuple[Episode, str]] = []
        for episode, ids, logps in zip(active, turn_ids, turn_logps):
            episode.extend(ids, 1, logps)
            episode.turns += 1
            last = ids[-1] if ids else None
            if last == tags[CODE_CLOSE]:
                calls.append((episode, _code_of_turn(tokenizer, ids, tags[CODE_OPEN])))
            else:
                episode.stop_reason = {tags[ANSWER_CLOSE]: "answer", eos: "eos"}.get(last, "max_tokens")
        # 3. run this turn's tool calls together; append observations (mask 0)
        results = tool.call_many([code for _, code in calls])
        for (episode, code), result in zip(calls, results):
            obs_ids = encode_observation(tokenizer, result.observation)
            truncated = len(obs_ids) > cfg.max_observation_tokens
            if truncated:  # keep the closing tag so the policy still sees where the output ends
                obs_ids = obs_ids[: cfg.max_observation_tokens - 1] + [tags[OBS_CLOSE]]
            episode.extend(obs_ids, 0)
            episode.tool_calls.append({
                "name": tool.name, "args": code, "result": result.observation, "error": result.error,
                "latency_s": round(result.latency_s, 5), "truncated": truncated,
            })
            if len(episode.prompt_ids) + len(episode.completion_ids) >= cfg.max_total_tokens:
                episode.stop_reason = "max_tokens"
    for episode in episodes:
        if not episode.done:
            episode.stop_reason = "max_turns"
    return episodes
