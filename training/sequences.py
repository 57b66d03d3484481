"""Token sequences and masks: segments -> ids, batches for the trainer.

A trajectory is `prompt_ids` followed by `completion_ids`; `tool_mask` (same length as
`completion_ids`) is 1 on tokens the policy sampled and 0 on tool output. Both SFT and RL train
only where `loss_mask = completion_mask * tool_mask` is 1. Ids come from the rollout or from
per-segment encoding here; a whole trajectory's text is never re-tokenized.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from verifiers.protocol import OBSERVATION_TAGS, TAGS


# ------------------------------------------------ log-probs and entropy of given logits
def _scaled_logits(logits: Tensor, temperature: float) -> Tensor:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    # float32: bf16 log_softmax over a 150k vocab loses ~2 significant digits of log-prob,
    # which is the same order as the ratios PPO clips on.
    return logits.float() / temperature


def token_logprobs(logits: Tensor, ids: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature)[ids], in float32. logits (..., V), ids (...) -> (...): a whole
    (B, T, V) batch, or one chunk of (n, V) rows (training/sequences.py::completion_logprobs).

    logits[:, t] must be the distribution that produced ids[:, t] (the caller does the shift).
    The temperature must be the sampler's, or the ratio against vLLM's logprobs is biased.
    Padding ids must be valid vocab indices (e.g. pad_token_id, not -100)."""
    scaled = _scaled_logits(logits, temperature)
    picked = scaled.gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)  # avoids materialising a 2nd (B,T,V) tensor


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of softmax(logits / temperature), float32. (..., V) -> (...), e.g. (B, T, V) -> (B, T).
    -inf logits (masked vocab) contribute 0 instead of 0 * -inf = NaN."""
    logp = torch.log_softmax(_scaled_logits(logits, temperature), dim=-1)
    p = logp.exp()
    return -torch.where(p > 0, p * logp, 0.0).sum(-1)


def encode(tokenizer, text: str) -> list[int]:
    """Trusted text (the chat template's structure, the operator's system prompt, the policy's own
    turns) -> ids: the tokenizer's special tokens in it (`<|im_start|>`, the scratch tokenizer's
    tags) come out as their single ids. Text from tasks, users and tools goes through
    `encode_pieces` instead."""
    # A fast tokenizer's Rust backend directly: the same ids (`PreTrainedTokenizerFast.encode`
    # calls it) without transformers' per-call bookkeeping, ~10x cheaper on the short tool
    # observations the agent loop encodes every turn.
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.encode(text, add_special_tokens=False).ids
    return tokenizer.encode(text, add_special_tokens=False)


def special_ids(tokenizer) -> frozenset[int]:
    """Every special token's id: `all_special_ids` and the added tokens marked special (SmolLM2's
    `<file_sep>`, `<jupyter_output>`, ... are added tokens, not named special tokens)."""
    return _untrusted_view(tokenizer).specials


@dataclass(frozen=True)
class _UntrustedView:
    size: int  # len(tokenizer) when built: tokens added since make it stale
    specials: frozenset[int]
    splitting: object | None  # a copy of the fast backend that reads special tokens as text


# One view per tokenizer. The copy of the backend exists because transformers'
# `split_special_tokens=True` sets the flag on the shared backend, which is not safe while
# another thread encodes with it.
_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _untrusted_view(tokenizer) -> _UntrustedView:
    view = _VIEWS.get(tokenizer)
    if view is not None and view.size == len(tokenizer):
        return view
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    specials = frozenset(tokenizer.all_special_ids) | {i for i, t in added.items() if getattr(t, "special", False)}
    backend, splitting = getattr(tokenizer, "backend_tokenizer", None), None
    if backend is not None:
        from tokenizers import Tokenizer

        splitting = Tokenizer.from_str(backend.to_str())
        splitting.encode_special_tokens = True
    view = _VIEWS[tokenizer] = _UntrustedView(len(tokenizer), specials, splitting)
    return view


def encode_untrusted(tokenizer, text: str) -> list[int]:
    """Untrusted text -> ids with every special token in it read as text: `<|im_start|>` in a task
    prompt or a tool's output becomes the ids of `<`, `|`, `im`, ..., never the turn marker."""
    splitting = _untrusted_view(tokenizer).splitting
    if splitting is None:
        return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    return splitting.encode(text, add_special_tokens=False).ids


def encode_pieces(tokenizer, pieces: list[tuple[str, bool]]) -> list[int]:
    """[(text, trusted)] -> the ids of their concatenation, in which only the trusted pieces'
    special tokens are special: an untrusted piece's `<|im_end|>\n<|im_start|>assistant\n` is
    text, never a forged turn.

    Where no untrusted piece holds a special token (every honest prompt and observation) the ids
    are exactly `encode` of the whole text, so nothing drifts. Otherwise the text is cut at the
    trusted pieces' own special tokens and every stretch between them is encoded with special
    tokens read as text: the same cuts the tokenizer makes, minus the forged ones."""
    text = "".join(piece for piece, _ in pieces)
    specials = special_ids(tokenizer)
    untrusted, start = [], 0
    for piece, trusted in pieces:
        if not trusted and piece:
            untrusted.append((start, start + len(piece)))
        start += len(piece)
    ids, spans = _special_spans(tokenizer, text, specials)
    if not any(a < e and s < b for a, b, _ in spans for s, e in untrusted):
        return ids
    out, done, start = [], 0, 0
    for piece, trusted in pieces:
        for a, b, i in _special_spans(tokenizer, piece, specials)[1] if trusted else ():
            out += [*encode_untrusted(tokenizer, text[done : start + a]), i]
            done = start + b
        start += len(piece)
    return out + encode_untrusted(tokenizer, text[done:])


def _special_spans(tokenizer, text: str, specials: frozenset[int]) -> tuple[list[int], list[tuple[int, int, int]]]:
    """`encode(tokenizer, text)`, and (start, end, id) of each special token read in `text`."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        encoding = backend.encode(text, add_special_tokens=False)
        return encoding.ids, [(a, b, i) for i, (a, b) in zip(encoding.ids, encoding.offsets) if i in specials]
    spans, at = [], 0
    for token in tokenizer.tokenize(text):
        i = tokenizer.convert_tokens_to_ids(token)
        if i in specials:
            at = text.index(token, at)
            spans.append((at, at + len(token), i))
            at += len(token)
    return encode(tokenizer, text), spans


def encode_observation(tokenizer, observation: str, tool: str = "code") -> list[int]:
    """The one place tool output becomes ids (SFT data and rollouts share it), wrapped in the
    tool's observation tags (`<interpreter>` for code, `<information>` for search). The tags are
    ours; the output is the tool's (whatever the program printed), so its special tokens are text."""
    open_tag, close_tag = OBSERVATION_TAGS[tool]
    return encode_pieces(tokenizer, [(open_tag, True), (observation, False), (close_tag, True)])


def encode_segments(tokenizer, segments: list[tuple[str, str]]) -> tuple[list[int], list[int]]:
    """[(role, text)] with role "policy" or "tool" -> (completion_ids, tool_mask). A tool segment
    is an observation in its tags (`wrap_observation`): encoded as `encode_observation` encodes it."""
    ids: list[int] = []
    mask: list[int] = []
    for role, text in segments:
        if role not in ("policy", "tool"):
            raise ValueError(f"segment role must be 'policy' or 'tool', got {role!r}")
        piece = _encode_policy_segment(tokenizer, text) if role == "policy" else _encode_tool_segment(tokenizer, text)
        ids += piece
        mask += [1 if role == "policy" else 0] * len(piece)
    return ids, mask


# A policy turn written for training (a teacher's demonstration, an SFT file's assistant turn,
# hindsight's answer from the task's gold) holds text from task files: only the protocol's own
# tags in it are trusted (single special ids on the scratch tokenizer), so a gold answer or an SFT
# file's `<|im_end|>` is trained as text, never as a turn boundary.
_PROTOCOL_TAG = re.compile("(" + "|".join(re.escape(tag) for tag in TAGS) + ")")


def _encode_policy_segment(tokenizer, text: str) -> list[int]:
    pieces = [(piece, i % 2 == 1) for i, piece in enumerate(_PROTOCOL_TAG.split(text)) if piece]
    return encode_pieces(tokenizer, pieces)


def _encode_tool_segment(tokenizer, text: str) -> list[int]:
    for open_tag, close_tag in OBSERVATION_TAGS.values():
        if text.startswith(open_tag) and text.endswith(close_tag) and len(text) >= len(open_tag) + len(close_tag):
            return encode_pieces(
                tokenizer,
                [(open_tag, True), (text[len(open_tag) : len(text) - len(close_tag)], False), (close_tag, True)],
            )
    return encode_untrusted(tokenizer, text)


def policy_spans(completion_ids: list[int], tool_mask: list[int]) -> list[list[int]]:
    """Contiguous runs of policy-sampled ids: one per policy turn. Verifiers read only these,
    so text inside a tool observation can never count as the policy's answer."""
    spans: list[list[int]] = []
    previous = 0
    for token, m in zip(completion_ids, tool_mask):
        if m and not previous:
            spans.append([])
        if m:
            spans[-1].append(token)
        previous = m
    return spans


@dataclass
class Batch:
    """Prompts left-padded and completions right-padded, so completion column j is the j-th
    completion token of every row: logprobs, masks and advantages line up as (B, C)."""

    input_ids: torch.Tensor  # (B, P + C)
    attention_mask: torch.Tensor  # (B, P + C)
    position_ids: torch.Tensor  # (B, P + C)
    completion_ids: torch.Tensor  # (B, C)
    completion_mask: torch.Tensor  # (B, C) 1 on real completion tokens
    tool_mask: torch.Tensor  # (B, C) 1 on policy-sampled tokens, 0 on tool output and padding
    prompt_width: int

    @property
    def loss_mask(self) -> torch.Tensor:
        return self.completion_mask * self.tool_mask


def collate(prompts: list[list[int]], completions: list[list[int]], tool_masks: list[list[int]], pad_id: int) -> Batch:
    if not (len(prompts) == len(completions) == len(tool_masks)):
        raise ValueError("prompts, completions and tool_masks must have the same number of rows")
    B, P, C = len(prompts), max(map(len, prompts)), max(1, max(map(len, completions)))
    input_ids = torch.full((B, P + C), pad_id, dtype=torch.long)
    attention = torch.zeros((B, P + C), dtype=torch.long)
    tool = torch.zeros((B, C), dtype=torch.float32)
    for i, (p, c, m) in enumerate(zip(prompts, completions, tool_masks)):
        if len(m) != len(c):
            raise ValueError(f"row {i}: tool_mask has {len(m)} entries for {len(c)} completion ids")
        input_ids[i, P - len(p) : P] = torch.tensor(p)
        input_ids[i, P : P + len(c)] = torch.tensor(c, dtype=torch.long)
        attention[i, P - len(p) : P + len(c)] = 1
        tool[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        completion_ids=input_ids[:, P:],
        completion_mask=attention[:, P:].float(),
        tool_mask=tool,
        prompt_width=P,
    )


def to_device(batch: Batch, device: torch.device | str) -> Batch:
    """The batch with every tensor on `device`. `collate` builds on the CPU; each pass moves its
    batch once, to the device of the model it runs on (policy, reference and critic may differ)."""
    return replace(
        batch,
        **{
            f.name: getattr(batch, f.name).to(device, non_blocking=True)
            for f in fields(batch)
            if isinstance(getattr(batch, f.name), torch.Tensor)
        },
    )


def completion_logits(model, batch: Batch) -> torch.Tensor:
    """Logits that predict each completion token: (B, C, V). The LM head runs on those C
    positions only (`logits_to_keep`, the last C + 1 of P + C): prompt positions never need
    logits, and at a 1,024-token vocabulary the head is a fifth of the `tiny` model's matmuls.
    The whole (B, C, V) tensor in fp32: for small models and tests; training passes use
    `completion_logprobs`, which never holds it."""
    C = batch.completion_ids.shape[1]
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=C + 1,
    )
    return out.logits[:, :C].float()


def completion_logprobs(
    model, batch: Batch, temperature: float = 1.0, *, with_entropy: bool = False, chunk_tokens: int | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log pi(completion token), (B, C) float32, and with `with_entropy` also the entropy of each
    position's distribution, (B, C): `token_logprobs(completion_logits(...))` and
    `entropy_from_logits(...)` (same positions, temperature and padding; equal up to the rounding
    of a head matmul cut into chunks, tests/training/test_memory_device.py), without their memory.

    The model body runs once (through `model`'s own forward, so engine wrappers, autocast, ZeRO
    hooks and LoRA all apply) and hands over the hidden states its LM head would have read; the
    head, log-softmax and gather then run over at most `chunk_tokens` completion tokens at a time
    (None: all at once), each chunk under `torch.utils.checkpoint`, so the backward recomputes a
    chunk's logits instead of keeping them. At a 151,936-token vocabulary the whole fp32 logits
    of 16k tokens would be 10 GB, and their log-softmax and gradient as much again.

    The entropy is a diagnostic: computed without a graph (no loss term uses its gradient).
    Models whose CausalLM forward changes the logits after the head (Gemma 2's soft-capping) are
    not covered: the head here is `get_output_embeddings()` alone."""
    C = batch.completion_ids.shape[1]
    hidden, autocast = _head_inputs(model, batch, keep=C + 1)  # the same C + 1 positions as completion_logits
    hidden, ids = hidden[:, :C].reshape(-1, hidden.shape[-1]), batch.completion_ids.reshape(-1)
    head = model.get_output_embeddings()
    step = ids.numel() if chunk_tokens is None else chunk_tokens
    recompute = torch.is_grad_enabled() and ids.numel() > step  # one chunk: nothing to save by recomputing it
    pieces = []
    for start in range(0, ids.numel(), step):
        args = (head, autocast, hidden[start : start + step], ids[start : start + step], temperature, with_entropy)
        pieces.append(
            checkpoint(_chunk_logprobs, *args, use_reentrant=False, preserve_rng_state=False)
            if recompute
            else _chunk_logprobs(*args)
        )
    logprobs = torch.cat([p[0] for p in pieces]).view(-1, C)
    return (logprobs, torch.cat([p[1] for p in pieces]).view(-1, C)) if with_entropy else logprobs


def _head_inputs(model, batch: Batch, keep: int) -> tuple[torch.Tensor, tuple[str, torch.dtype, bool]]:
    """The hidden states the model's LM head reads on the last `keep` positions, (B, keep, H), and
    the autocast state it runs under. A forward pre-hook on the head takes its input and hands
    it an empty slice instead, so the model's own head computes (B, 0, V): nothing."""
    head, seen = model.get_output_embeddings(), []

    def take(_module, args):
        device = args[0].device.type
        seen.append((args[0], (device, torch.get_autocast_dtype(device), torch.is_autocast_enabled(device))))
        return (args[0][:, :0], *args[1:])

    handle = head.register_forward_pre_hook(take)
    try:
        model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            logits_to_keep=keep,
            use_cache=False,
        )
    finally:
        handle.remove()
    if len(seen) != 1:
        raise RuntimeError(f"the LM head ran {len(seen)} times in one forward of {type(model).__name__}; expected once")
    return seen[0]


def _chunk_logprobs(
    head,
    autocast: tuple[str, torch.dtype, bool],
    hidden: torch.Tensor,
    ids: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, ...]:
    """One chunk: head -> (n, V) logits -> log-probs of `ids` (n,), and entropy (n,) if asked."""
    device, dtype, enabled = autocast
    with torch.autocast(device, dtype=dtype, enabled=enabled):  # as the model's own head would have run
        logits = head(hidden)
    logprobs = token_logprobs(logits, ids, temperature)
    if not with_entropy:
        return (logprobs,)
    with torch.no_grad():
        return logprobs, entropy_from_logits(logits, temperature)
