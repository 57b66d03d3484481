"""Policy models: a small Qwen2 built from config, or any HF checkpoint (path or hub id)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from configs.schema import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_model(cfg: ModelConfig, vocab_size: int, eos_token_id: int, seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,  # small models: the embedding is most of the parameters
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        use_cache=True,
    )
    model = Qwen2ForCausalLM(config)
    return model.to(DTYPES[cfg.dtype])


def load_policy(path_or_id: str | Path, dtype: str = "float32", device: str = "cpu"):
    """Same call for our scratch checkpoints and for a hub model on the gpu profile."""
    model = AutoModelForCausalLM.from_pretrained(str(path_or_id), dtype=DTYPES[dtype])
    return model.to(device)


def load_tokenizer(path_or_id: str | Path):
    return AutoTokenizer.from_pretrained(str(path_or_id))


def save_checkpoint(model, tokenizer, path: Path) -> Path:
    """A standard HF folder (safetensors + tokenizer files) that transformers and vLLM load."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
