"""Multi-turn agent loop on token ids, over any rollout engine (training/agent/engines.py).

A turn of an episode generates until a stop tag (`</code>`, `</search>`, `</answer>`), EOS or its
budget. Tags are text: a turn ends at the token that completes a closing tag's string, whatever
the tokenizer makes of it (several tokens, or one token holding the tag and more: that token is
kept whole, as sampled, and the call is the text before the tag). With a tokenizer whose tags are
single tokens (the scratch one), the engines stop on those ids instead (`TurnStops`), a fast path
with the same turns. A turn that stopped on a tool's closing tag has its call run (the calls that end together
go out batched per tool, tools concurrently), the observation's ids are appended with tool_mask 0
and logprob 0, and the episode goes on. Two schedules drive turns: one batched engine call per
turn (HF), or one request per turn fed as tool results return (vLLM, continuous). Finished
episodes leave the batch and, when `rollout.max_batch_size` caps it, waiting ones join. Ids
sampled by the policy are recorded as sampled; text is only ever derived from ids (for the tool
and for logs), never the other way round.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import torch

from configs.failpoints import failpoint
from configs.schema import RolloutConfig
from environments.family import tools_offered
from environments.tools import Tool, ToolResult
from training.agent.chat import prompt_ids
from training.agent.engines import ContinuousEngine, Generation, RolloutEngine, Sampling
from training.agent.sampling_keys import episode_seed, seeds_from, turn_seed
from training.sequences import encode, encode_observation
from verifiers.protocol import ANSWER_CLOSE, OBSERVATION_TAGS, TOOL_TAGS, TURN_STOPS, first_stop
from verifiers.sandbox import Placeable


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
    seed: int = 0  # keyed to (sampling key, task, sample index): training/agent/sampling_keys.py

    def turn_seed(self) -> int:
        """The seed of the turn that starts now (at this many completion tokens)."""
        return turn_seed(self.seed, len(self.completion_ids))

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def extend(self, ids: list[int], mask_value: int, logprobs: list[float] | None = None) -> None:
        self.completion_ids += ids
        self.tool_mask += [mask_value] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


# chat templates' end-of-message markers
END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end|>",
    "</s>",
)


@dataclass(frozen=True)
class TurnStops:
    """What ends a turn, as the engines take it. `strings`: the closing tags as text; `ids`: the
    tokenizer's end-of-sequence and end-of-message ids. When every closing tag is a single token
    of the tokenizer (the scratch one), `fast` moves the tags into `ids` and the engines stop on
    ids alone (vLLM can then keep an episode's KV cache in a session, training/agent/engines.py)."""

    ids: frozenset[int]
    strings: tuple[str, ...]
    end_ids: frozenset[int]  # the end-of-sequence / end-of-message ids (stop_reason "eos")

    @classmethod
    def of(cls, tokenizer, *, fast: bool = True) -> TurnStops:
        vocab = tokenizer.get_vocab()
        end_ids = {tokenizer.eos_token_id} | {
            vocab[t] for t in END_OF_TURN_TOKENS if t in vocab and t in tokenizer.all_special_tokens
        }
        end_ids.discard(None)
        tag_ids = [encode(tokenizer, stop) for stop in TURN_STOPS]
        if fast and all(len(ids) == 1 for ids in tag_ids):
            return cls(frozenset(end_ids | {ids[0] for ids in tag_ids}), (), frozenset(end_ids))
        return cls(frozenset(end_ids), TURN_STOPS, frozenset(end_ids))


def _call_of_turn(text: str, open_tag: str, close_end: int, close_tag: str) -> str:
    """The call's text between the turn's last opening tag and the closing tag it stopped on."""
    body = text[: close_end - len(close_tag)]
    at = body.rfind(open_tag)
    return body[at + len(open_tag) :] if at >= 0 else body


class RolloutEngineError(RuntimeError):
    """The rollout engine failed mid-batch (an error or OOM inside the model, an engine that was
    shut down). The batch is abandoned: its episodes are unfinished, so nothing of it may be scored,
    stored or trained on; the step fails, and its retry resumes from the last state checkpoint."""


@contextlib.contextmanager
def _engine_call(engine: RolloutEngine, what: str, episodes: list[Episode]) -> Iterator[None]:
    """Raise an engine's failure as a RolloutEngineError naming the engine, the call and how far
    the batch got (the engine's own error, e.g. vLLM's on a closed engine, says neither)."""
    try:
        yield
    except Exception as exc:
        unfinished = sum(not e.done for e in episodes)
        raise RolloutEngineError(
            f"rollout engine {engine.name!r} failed in {what} with {unfinished} of {len(episodes)} episodes "
            f"unfinished; the batch is abandoned: {type(exc).__name__}: {exc}"
        ) from exc


def _end_sessions(engine, keys: list[str], *, failing: bool) -> None:
    """End every episode's session. After a failure an `end` may fail too (an engine that died took
    its sessions with it): the others are still ended, and the first error is the one reported."""
    errors = []
    for key in keys:
        try:
            engine.end(key)
        except Exception as exc:  # noqa: BLE001 - collected, raised below unless an error is already on its way
            errors.append(exc)
    if errors and not failing:
        raise RolloutEngineError(
            f"rollout engine {engine.name!r} failed to end {len(errors)} of {len(keys)} sessions: "
            f"{type(errors[0]).__name__}: {errors[0]}"
        ) from errors[0]


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


def _dispatch(
    tools: Mapping[str, Tool], calls: list[tuple[Episode, str, str]], pool: ThreadPoolExecutor
) -> list[ToolResult]:
    """Results in call order. The calls of one tool go out as one batch, and the batches of
    different tools run at the same time on `pool`; a call to a tool the task does not offer
    (environments/family.py::tools_offered) gets an error observation instead of running (the reward's tool_misuse term counts it)."""
    results: list[ToolResult | None] = [None] * len(calls)
    futures = {}
    for name in dict.fromkeys(n for _, n, _ in calls):
        index = [
            i
            for i, (episode, n, _) in enumerate(calls)
            if n == name and n in tools_offered(episode.task) and n in tools
        ]
        if index:
            futures[name] = (index, pool.submit(_run_tool, tools[name], [calls[i][2] for i in index]))
    for index, future in futures.values():
        for i, result in zip(index, future.result()):
            results[i] = result
    return [
        r if r is not None else ToolResult(f"unknown tool {name}\n", "unknown_tool", 0.0)
        for r, (_, name, _) in zip(results, calls)
    ]


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
    sampling_key: str | None = None,
    on_finished: Callable[[list[Episode]], None] | None = None,
) -> list[Episode]:
    """Roll out `group_size` episodes per task (one GRPO group per task) with `engine`. `tools`
    maps a tool name to the tool; an episode may call the tools its family offers (`TaskFamily.tools`).
    Engines that take requests one by one (vLLM) run the continuous schedule, the others one
    batched call per turn; both record the same things the same way.

    Each episode samples from its own seed, a hash of (`sampling_key`, task id, sample index)
    (training/agent/sampling_keys.py), so its ids do not depend on which rank, batch or position it
    ran in. Without a `sampling_key`, one is drawn from `generator` (seed 0 if None).

    `on_finished(episodes)` is called with each batch of episodes as soon as they are done, while
    the others still generate (the caller verifies them meanwhile: training/rl/scoring.py::Verifying);
    every episode is passed exactly once, and a finished episode is never touched again."""
    loop = _Loop(tokenizer, tools, cfg, Sampling.of(cfg, greedy=greedy, temperature=temperature))
    if on_finished is not None:
        loop.on_finished = on_finished
    if sampling_key is None:
        sampling_key = str(seeds_from(generator, 1)[0])
    prompts = {t["task_id"]: prompt_ids(tokenizer, t, cfg.system_prompt) for t in tasks}
    episodes = [
        Episode(
            task=t,
            group_id=f"{group_prefix}{t['task_id']}",
            sample_index=k,
            prompt_ids=list(prompts[t["task_id"]]),
            seed=episode_seed(sampling_key, t["task_id"], k),
        )
        for t in tasks
        for k in range(group_size)
    ]
    with split_cores(cfg.tool_cores, tools) as tool_cpus, tool_threads(cfg.tool_workers, "tools", tool_cpus) as pool:
        if isinstance(engine, ContinuousEngine):
            loop.continuous(engine, episodes, pool, tool_cpus=tool_cpus)
        else:
            loop.turn_by_turn(engine, episodes, pool)
    return episodes


def tool_threads(workers: int, name: str, cpus: set[int] | None) -> ThreadPoolExecutor:
    """Threads that run tool calls, on `cpus` when the rollout keeps cores for tools."""
    return ThreadPoolExecutor(
        max_workers=workers,
        thread_name_prefix=name,
        initializer=os.sched_setaffinity if cpus else None,
        initargs=(0, cpus) if cpus else (),
    )


@contextlib.contextmanager
def split_cores(tool_cores: int, tools: Mapping[str, Tool]) -> Iterator[set[int] | None]:
    """For the block, run this thread (the engine's driver) and torch's intra-op threads on all but
    the last `tool_cores` of this process's CPUs, and the tools that can be placed (the sandbox)
    on those; yields those tool CPUs (None without placement) for the tool threads. On a small CPU
    machine a forked code run otherwise preempts one of the engine's OpenMP threads and every
    parallel region of the step waits for it (docs/rollout.md). All is restored after."""
    if not tool_cores:
        yield None
        return
    cpus = sorted(os.sched_getaffinity(0))
    if tool_cores >= len(cpus):
        raise ValueError(
            f"rollout.tool_cores={tool_cores} leaves no core for the engine: this process may use {len(cpus)} CPUs {cpus}"
        )
    engine_cpus, tool_cpus = set(cpus[:-tool_cores]), set(cpus[-tool_cores:])
    placeable = [tool for tool in tools.values() if isinstance(tool, Placeable)]
    threads = torch.get_num_threads()
    os.sched_setaffinity(0, engine_cpus)
    torch.set_num_threads(len(engine_cpus))
    try:
        for tool in placeable:
            tool.set_cpus(tool_cpus)
        yield tool_cpus
    finally:
        for tool in placeable:
            tool.set_cpus(None)
        os.sched_setaffinity(0, set(cpus))
        torch.set_num_threads(threads)


class _Loop:
    """What one turn does to an episode, and the two schedules that drive turns."""

    def __init__(
        self, tokenizer, tools: Mapping[str, Tool], cfg: RolloutConfig, sampling: Sampling, *, fast_stops: bool = True
    ):
        self.tokenizer, self.tools, self.cfg, self.sampling = tokenizer, tools, cfg, sampling
        self.stops = TurnStops.of(tokenizer, fast=fast_stops)
        self.stop_ids, self.stop_strings = set(self.stops.ids), self.stops.strings
        self.closing = {TOOL_TAGS[name][1]: name for name in TOOL_TAGS}  # every tool's closing tag stops a turn
        self.observation_close = {name: encode(tokenizer, close) for name, (_, close) in OBSERVATION_TAGS.items()}
        self.on_finished: Callable[[list[Episode]], None] = lambda finished: None  # run_episodes' hook

    def _strings(self) -> dict:
        """`stop_strings` for the engine only when there are any: engines written for id stops
        (tests' fakes, older ones) keep working on tokenizers with single-token tags."""
        return {"stop_strings": self.stop_strings} if self.stop_strings else {}

    def budget(self, episode: Episode) -> int:
        return min(
            self.cfg.max_new_tokens_per_turn,
            self.cfg.max_total_tokens - len(episode.prompt_ids) - len(episode.completion_ids),
        )

    def record_turn(self, episode: Episode, turn: Generation) -> tuple[Episode, str, str] | None:
        """Sampled tokens go in with mask 1; returns the tool call the turn ended on, if any."""
        episode.extend(turn.ids, 1, turn.logprobs)
        episode.turns += 1
        if not turn.ids:
            episode.stop_reason = "max_tokens"
            return None
        # The turn's stop is the one its last token completed (a stop string spelled earlier in
        # the turn did not stop it: there is none, on the engines' rule, or the fast path's ids).
        text = self.tokenizer.decode(turn.ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        before = len(
            self.tokenizer.decode(turn.ids[:-1], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        )
        stop = first_stop(text, after=before)
        if stop and stop[0] in self.closing:
            name = self.closing[stop[0]]
            return episode, name, _call_of_turn(text, TOOL_TAGS[name][0], stop[1], stop[0])
        if stop and stop[0] == ANSWER_CLOSE:
            episode.stop_reason = "answer"
        else:
            episode.stop_reason = "eos" if turn.ids[-1] in self.stops.end_ids else "max_tokens"
        return None

    def record_observation(self, episode: Episode, name: str, args: str, result: ToolResult) -> None:
        """The observation's ids go in with mask 0 (cut to max_observation_tokens, marked)."""
        obs_ids = encode_observation(self.tokenizer, result.observation, name)
        truncated = len(obs_ids) > self.cfg.max_observation_tokens
        if truncated:  # keep the closing tag (its ids) so the policy still sees where the output ends
            close = self.observation_close[name]
            obs_ids = obs_ids[: max(0, self.cfg.max_observation_tokens - len(close))] + close
        episode.extend(obs_ids, 0)
        episode.tool_calls.append(
            {
                "name": name,
                "args": args,
                "result": result.observation,
                "error": result.error,
                "latency_s": round(result.latency_s, 5),
                "truncated": truncated,
            }
        )
        if len(episode.prompt_ids) + len(episode.completion_ids) >= self.cfg.max_total_tokens:
            episode.stop_reason = "max_tokens"
        elif episode.turns >= self.cfg.max_turns:
            episode.stop_reason = "max_turns"

    def turn_by_turn(self, engine: RolloutEngine, episodes: list[Episode], pool: ThreadPoolExecutor) -> None:
        """One batched engine call per turn for every active episode, then that turn's tools."""
        waiting, active = deque(episodes), []
        limit = self.cfg.max_batch_size or len(episodes)
        while waiting or active:
            while waiting and len(active) < limit:
                active.append(waiting.popleft())
            with _engine_call(engine, "generate", episodes):
                turns = engine.generate(
                    [e.prompt_ids + e.completion_ids for e in active],
                    [self.budget(e) for e in active],
                    stop_ids=self.stop_ids,
                    sampling=self.sampling,
                    seeds=[e.turn_seed() for e in active],
                    # the episode's own seed names it: its next turn starts from this turn's KV cache
                    keys=[str(e.seed) for e in active],
                    **self._strings(),
                )
            calls = [call for e, turn in zip(active, turns) if (call := self.record_turn(e, turn))]
            for (episode, name, args), result in zip(calls, _dispatch(self.tools, calls, pool)):
                self.record_observation(episode, name, args, result)
            failpoint("rl.rollout")
            finished = [e for e in active if e.done]
            if finished:
                self.on_finished(finished)
            active = [e for e in active if not e.done]  # finished episodes leave the batch

    def continuous(
        self,
        engine: ContinuousEngine,
        episodes: list[Episode],
        pool: ThreadPoolExecutor,
        *,
        tool_cpus: set[int] | None = None,
    ) -> None:
        """Each turn is its own engine request (on vLLM, a chunk of the episode's session, so its
        KV cache stays put between turns). Turns that end on a tool call in the same engine step go
        to the tools as one batch on a dispatcher thread; when it returns, those episodes' next
        turns join the running batch at once. Seeds depend on the episode (and turn) only, so the
        sampled ids do not depend on which episodes happened to share a step."""
        index = {id(e): i for i, e in enumerate(episodes)}
        waiting = deque(episodes)
        limit = self.cfg.max_batch_size or len(episodes)
        live, jobs = 0, []  # episodes admitted and not done; tool batches in flight

        def key(episode: Episode) -> str:
            return f"episode-{index[id(episode)]}"

        def submit(episode: Episode) -> bool:
            budget = self.budget(episode)
            if budget <= 0:
                episode.turns += 1
                episode.stop_reason = "max_tokens"
                return False
            with _engine_call(engine, "submit", episodes):
                engine.submit(
                    key(episode),
                    episode.prompt_ids + episode.completion_ids,
                    budget,
                    stop_ids=self.stop_ids,
                    sampling=self.sampling,
                    seed=episode.turn_seed() % 2**31,
                    **self._strings(),
                )
            return True

        def finish(episode: Episode) -> int:
            with _engine_call(engine, "end", episodes):
                engine.end(key(episode))  # frees what the engine kept for the episode
            return 1

        try:
            with tool_threads(self.cfg.tool_workers, "tool-batches", tool_cpus) as dispatcher:
                while waiting or live:
                    done: list[Episode] = []  # finished in this pass, for on_finished
                    while waiting and live < limit:
                        episode = waiting.popleft()
                        if submit(episode):
                            live += 1
                        else:
                            done.append(episode)
                    calls = []
                    with _engine_call(engine, "poll", episodes):
                        finished = engine.poll() if engine.busy() else []
                    for k, turn in finished:
                        episode = episodes[int(k.split("-")[1])]
                        call = self.record_turn(episode, turn)
                        if call:
                            calls.append(call)
                        else:
                            live -= finish(episode)
                            done.append(episode)
                    if calls:
                        jobs.append((calls, dispatcher.submit(_dispatch, self.tools, calls, pool)))
                    failpoint("rl.rollout")
                    if jobs and not engine.busy():  # nothing to generate until a tool batch returns
                        wait([future for _, future in jobs], return_when=FIRST_COMPLETED)
                    for job in [job for job in jobs if job[1].done()]:
                        jobs.remove(job)
                        for (episode, name, args), result in zip(job[0], job[1].result()):
                            self.record_observation(episode, name, args, result)
                            if episode.done or not submit(episode):
                                live -= finish(episode)
                                done.append(episode)
                    if done:
                        self.on_finished(done)
        # after a failure too no session outlives the loop (and the tool batches in flight have finished)
        except BaseException:
            _end_sessions(engine, [key(e) for e in episodes], failing=True)
            raise
        _end_sessions(engine, [key(e) for e in episodes], failing=False)
