"""Token sequences and masks: segments -> ids, batches for the trainer.

A trajectory is `prompt_ids` followed by `completion_ids`; `tool_mask` (same length as
`completion_ids`) is 1 on tokens the policy sampled and 0 on tool output. Both SFT and RL train
only where `loss_mask = completion_mask * tool_mask` is 1. Ids come from the rollout or from
per-segment encoding here; a whole trajectory's text is never re-tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verifiers.protocol import OBSERVATION_TAGS


def encode(tokenizer, text: str) -> list[int]:
    # A fast tokenizer's Rust backend directly: the same ids (`PreTrainedTokenizerFast.encode`
    # calls it) without transformers' per-call bookkeeping, ~10x cheaper on the short tool
    # observations the agent loop encodes every turn.
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.encode(text, add_special_tokens=False).ids
    return tokenizer.encode(text, add_special_tokens=False)


def encode_observation(tokenizer, observation: str, tool: str = "code") -> list[int]:
    """The one place tool output becomes ids (SFT data and rollouts share it), wrapped in the
    tool's observation tags (`<interpreter>` for code, `<information>` for search)."""
    open_tag, close_tag = OBSERVATION_TAGS[tool]
    return encode(tokenizer, open_tag + observation + close_tag)


def encode_segments(tokenizer, segments: list[tuple[str, str]]) -> tuple[list[int], list[int]]:
    """[(role, text)] with role "policy" or "tool" -> (completion_ids, tool_mask)."""
    ids: list[int] = []
    mask: list[int] = []
    for role, text in segments:
        if role not in ("policy", "tool"):
            raise ValueError(f"segment role must be 'policy' or 'tool', got {role!r}")
        piece = encode(tokenizer, text)
        ids += piece
        mask += [1 if role == "policy" else 0] * len(piece)
    return ids, mask


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


def completion_logits(model, batch: Batch) -> torch.Tensor:
    """Logits that predict each completion token: (B, C, V). The LM head runs on those C
    positions only (`logits_to_keep`, the last C + 1 of P + C): prompt positions never need
    logits, and at a 1,024-token vocabulary the head is a fifth of the `tiny` model's matmuls."""
    P, C = batch.prompt_width, batch.completion_ids.shape[1]
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, logits_to_keep=C + 1)
    return out.logits[:, :C].float()
