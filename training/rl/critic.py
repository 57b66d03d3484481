"""The critic of PPO: the policy's transformer with a scalar value head (verl and OpenRLHF
initialize the critic from the actor the same way).

It is a standard `Qwen2ForTokenClassification` with one label, so it saves and loads as an HF
folder like the policy. The head starts at zero: the first values are 0 and GAE starts out as
discounted returns, instead of as noise from a random head.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForTokenClassification

from training.sequences import Batch


def critic_from_policy(policy, device: torch.device | str | None = None) -> torch.nn.Module:
    """A value model whose backbone is a copy of `policy`'s (the causal-LM head is dropped), on
    `device` (None: the policy's; rl.critic_device may put it elsewhere, e.g. the CPU)."""
    # no dropout before the head: a value estimate should not be noisy (and must not draw from the RNG)
    settings = {k: v for k, v in policy.config.to_dict().items() if k not in ("id2label", "label2id")}
    config = policy.config.__class__.from_dict({**settings, "num_labels": 1, "classifier_dropout": 0.0})
    critic = AutoModelForTokenClassification.from_config(config)
    missing, unexpected = critic.load_state_dict(policy.state_dict(), strict=False)
    head = {name for name, _ in critic.named_parameters() if not name.startswith("model.")}
    if set(missing) - head:  # only the new head may be missing: anything else is a mismatched backbone
        raise ValueError(f"critic backbone does not match the policy; missing {sorted(set(missing) - head)[:5]}")
    for name, param in critic.named_parameters():
        if name in head:
            torch.nn.init.zeros_(param)
    weight = next(policy.parameters())
    return critic.to(device=weight.device if device is None else device, dtype=weight.dtype)


def token_values(critic, batch: Batch) -> torch.Tensor:
    """V(state before each completion token): (B, C), aligned with `completion_logits`. `batch`
    on the critic's device; no KV cache (nothing is decoded from it)."""
    out = critic(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, use_cache=False
    )
    P, C = batch.prompt_width, batch.completion_ids.shape[1]
    return out.logits[:, P - 1 : P + C - 1, 0].float()
