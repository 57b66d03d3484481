"""Multi-turn agent loop on token ids, over any rollout engine (training/rollout_engines.py).

Each turn, every active episode generates until a stop tag (`</code>`, `</search>`,
`</answer>`), EOS or its budget, in one batched engine call. Episodes that stopped on a tool's
closing tag have their calls run together (each tool's batch on its own thread; the sandbox and
the index run calls concurrently inside), the observation's ids are appended with tool_mask 0
and logprob 0, and the loop goes on. Finished episodes leave the batch and, when
`rollout.max_batch_size` caps it, waiting ones join. Ids sampled by the policy are recorded as
sampled; text is only ever derived from ids (for the tool and for logs), never the other way round.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from configs.schema import RolloutConfig
from environments import TOOLS_BY_FAMILY
from environments.tools import Tool, ToolResult
from training.rollout_engines import RolloutEngine, Sampling
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


def _call_of_turn(tokenizer, turn_ids: list[int], open_id: int) -> str:
    """The call's text between the turn's last opening tag and the closing tag it stopped on."""
    body = turn_ids[:-1]
    if open_id in body:
        body = body[len(body) - body[::-1].index(open_id) :]
    return tokenizer.decode(body)


def _run_tool(tool: Tool, args: list[str]) -> list[ToolResult]:
    """One tool's batch; a tool that raises gives every call an error observation instead of
    ending the rollout (the reward's tool-error term sees it, the episode goes on)."""
    try:
        results = tool.call_many(args)
    except Exception as exc:  # noqa: BLE001 - any tool failure becomes an observation
        return [ToolResult(f"tool error: {type(exc).__name__}\n", "tool_exception", 0.0) for _ in args]
    if len(results) != len(args):
        raise RuntimeError(f"tool {tool.name!r} returned {len(results)} results for {len(args)} calls")
    return results


def _dispatch(tools: Mapping[str, Tool], calls: list[tuple[Episode, str, str]], pool: ThreadPoolExecutor) -> list[ToolResult]:
    """Results in call order. The calls of one tool go out as one batch, and the batches of
    different tools run at the same time on `pool`; a call to a tool the task's family does not
    offer gets an error observation instead of running (the reward's tool_misuse term counts it)."""
    results: list[ToolResult | None] = [None] * len(calls)
    futures = {}
    for name in dict.fromkeys(n for _, n, _ in calls):
        index = [i for i, (episode, n, _) in enumerate(calls) if n == name and n in TOOLS_BY_FAMILY.get(episode.task["family"], ()) and n in tools]
        if index:
            futures[name] = (index, pool.submit(_run_tool, tools[name], [calls[i][2] for i in index]))
    for index, future in futures.values():
        for i, result in zip(index, future.result()):
            results[i] = result
    return [r if r is not None else ToolResult(f"unknown tool {name}\n", "unknown_tool", 0.0) for r, (_, name, _) in zip(results, calls)]


def run_episodes(
    engine: RolloutEngine,
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
    """Roll out `group_size` episodes per task (one GRPO group per task) with `engine`. `tools`
    maps a tool name to the tool; an episode may call the tools its family offers (TOOLS_BY_FAMILY)."""
    tags = tag_ids(tokenizer)
    eos = tokenizer.eos_token_id
    closing = {tags[TOOL_TAGS[name][1]]: name for name in TOOL_TAGS}  # every tool tag stops a turn
    stop_ids = {*closing, tags[ANSWER_CLOSE], eos}
    sampling = Sampling.of(cfg, greedy=greedy, temperature=temperature)
    episodes = [
        Episode(task=t, group_id=f"{group_prefix}{t['task_id']}", sample_index=k, prompt_ids=tokenizer.encode(t["prompt"], add_special_tokens=False))
        for t in tasks
        for k in range(group_size)
    ]
    waiting, active = deque(episodes), []
    limit = cfg.max_batch_size or len(episodes)
    with ThreadPoolExecutor(max_workers=cfg.tool_workers, thread_name_prefix="tools") as pool:
        while waiting or active:
            while waiting and len(active) < limit:
                active.append(waiting.popleft())
            # 1. one policy turn for every active episode, batched
            budgets = [min(cfg.max_new_tokens_per_turn, cfg.max_total_tokens - len(e.prompt_ids) - len(e.completion_ids)) for e in active]
            turns = engine.generate([e.prompt_ids + e.completion_ids for e in active], budgets, stop_ids=stop_ids, sampling=sampling, generator=generator)
            # 2. record sampled tokens (mask 1) and decide how each turn ended
            calls: list[tuple[Episode, str, str]] = []
            for episode, turn in zip(active, turns):
                episode.extend(turn.ids, 1, turn.logprobs)
                episode.turns += 1
                last = turn.ids[-1] if turn.ids else None
                if last in closing:
                    name = closing[last]
                    calls.append((episode, name, _call_of_turn(tokenizer, turn.ids, tags[TOOL_TAGS[name][0]])))
                else:
                    episode.stop_reason = {tags[ANSWER_CLOSE]: "answer", eos: "eos"}.get(last, "max_tokens")
            # 3. run this turn's tool calls together; append observations (mask 0)
            for (episode, name, args), result in zip(calls, _dispatch(tools, calls, pool)):
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
                elif episode.turns >= cfg.max_turns:
                    episode.stop_reason = "max_turns"
            active = [e for e in active if not e.done]  # finished episodes leave the batch
    return episodes
