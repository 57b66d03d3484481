"""Low-rank adapters (LoRA, Hu et al. 2021) via peft, for SFT and RL.

The wrapped model is called exactly like the HF model (`input_ids`, `attention_mask`,
`position_ids`, `past_key_values`, `use_cache`), so the sampler, the SFT loss and the RL
losses need no LoRA branch. Checkpoints are saved merged (`merged`): serving and vLLM load a
plain HF folder and never see an adapter.
"""

from __future__ import annotations

import copy
import sys

import torch

from configs.schema import LoRAConfig


# peft is imported where adapters are made, not with this module: it pulls in transformers' auto
# classes and scikit-learn (~4 s), and every Dagster step process, CLI command and served model
# imports this module through the engines whether or not the profile uses LoRA.
def _is_peft(model: torch.nn.Module) -> bool:
    """A PeftModel; without importing peft (a model cannot be one if peft was never imported)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def _weight_module_names(model: torch.nn.Module) -> list[str]:
    """Short names (last path component) of the leaf modules that hold a weight: what a
    `target_modules` entry can name."""
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if name and not list(module.children()) and getattr(module, "weight", None) is not None
        }
    )


def _check_targets(model: torch.nn.Module, target_modules: tuple[str, ...]) -> None:
    # peft only complains when *no* target matches, with a message that does not say what does
    # exist; a typo in one of seven names would otherwise silently train fewer layers.
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in target_modules if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        raise ValueError(
            f"LoRA target_modules {missing} match no module of {type(model).__name__}; "
            f"modules with weights: {_weight_module_names(model)}"
        )


def apply_lora(model: torch.nn.Module, cfg: LoRAConfig) -> torch.nn.Module:
    """`model` wrapped with fresh LoRA adapters (only they require grad) if `cfg.enabled`, else
    `model` unchanged. peft wraps in place: the base model's Linear layers are replaced, so
    keep using the returned object, not the argument. B is zero-initialised, so the wrapped
    model's output equals the base model's until the first update."""
    if not cfg.enabled:
        return model
    if _is_peft(model):
        raise ValueError("model already has LoRA adapters")
    _check_targets(model, cfg.target_modules)
    from peft import LoraConfig, TaskType, get_peft_model

    peft_cfg = LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type=TaskType.CAUSAL_LM,
    )
    return get_peft_model(model, peft_cfg)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """What the optimizer should see: the adapters under LoRA, everything for a plain model."""
    return [p for p in model.parameters() if p.requires_grad]


def lora_summary(model: torch.nn.Module) -> dict[str, float]:
    """{"trainable", "total", "fraction"}; `total` counts the adapters too."""
    trainable = sum(p.numel() for p in trainable_parameters(model))
    total = sum(p.numel() for p in model.parameters())
    return {"trainable": trainable, "total": total, "fraction": trainable / total if total else 0.0}


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """A plain HF model with the adapters folded into the base weights (W + alpha/r * B A), for
    `save_checkpoint`. Merges a deep copy, so the training model keeps its adapters (at the cost
    of one model copy in memory while saving). A plain model passes through unchanged."""
    if not _is_peft(model):
        return model
    return copy.deepcopy(model).merge_and_unload()
