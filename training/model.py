"""Policy models: a small Qwen2 built from config, or any HF checkpoint (path or hub id)."""

from __future__ import annotations

import json
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


class ModelFolderError(ValueError):
    """A model folder the platform cannot use, named with the file, field and value at fault."""


WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def check_model_folder(path: str | Path) -> None:
    """Before transformers sees a local folder: config.json with an integer vocab_size, weights, a
    tokenizer, and no token id past the embedding (a tokenizer saved from another model). Raises
    ModelFolderError naming the folder, the file and the value; transformers' own errors for these
    are a stack trace deep in its loaders, or, for a too-large tokenizer, an index error mid-run."""
    folder = Path(path)
    if not folder.is_dir():
        raise ModelFolderError(f"model folder {folder}: not a directory")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelFolderError(f"model folder {folder}: no config.json")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFolderError(f"model folder {folder}: config.json is not valid JSON ({exc})") from None
    vocab_size = config.get("vocab_size") if isinstance(config, dict) else None
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1:
        raise ModelFolderError(
            f"model folder {folder}: config.json field 'vocab_size' is {vocab_size!r}, expected a positive integer"
        )
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ModelFolderError(f"model folder {folder}: no weights (one of {', '.join(WEIGHT_FILES)})")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelFolderError(
            f"model folder {folder}: no tokenizer ({' or '.join(TOKENIZER_FILES)}); save the tokenizer with the model"
        )
    if (folder / "tokenizer.json").is_file():
        tokens = _tokenizer_size(folder / "tokenizer.json")
        if tokens > vocab_size:
            raise ModelFolderError(
                f"model folder {folder}: tokenizer.json has {tokens} token ids but config.json vocab_size is {vocab_size}: "
                f"ids from {vocab_size} on have no embedding row (a tokenizer saved from another model?)"
            )


def _tokenizer_size(path: Path) -> int:
    """One more than the largest id in a `tokenizers` file (its model's vocab and added tokens)."""
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        vocab = (spec.get("model") or {}).get("vocab") or {}
        # Unigram: a list of [piece, score]
        ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
        ids += [token["id"] for token in spec.get("added_tokens") or []]
        return max(ids) + 1 if ids else 0
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, KeyError, TypeError) as exc:
        raise ModelFolderError(
            f"model folder {path.parent}: tokenizer.json is not a tokenizers file ({exc!r})"
        ) from None


def _checked(path_or_id: str | Path) -> str:
    """Local folders are checked first; anything else is a hub id for transformers to resolve."""
    if Path(path_or_id).exists():
        check_model_folder(path_or_id)
    return str(path_or_id)


def load_policy(path_or_id: str | Path, dtype: str = "float32", device: str = "cpu"):
    """Same call for our scratch checkpoints and for a hub model on the gpu profile."""
    model = AutoModelForCausalLM.from_pretrained(_checked(path_or_id), dtype=DTYPES[dtype])
    return model.to(device)


def load_tokenizer(path_or_id: str | Path):
    path = Path(path_or_id)
    if path.is_dir() and not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelFolderError(f"tokenizer folder {path}: no tokenizer ({' or '.join(TOKENIZER_FILES)})")
    return AutoTokenizer.from_pretrained(str(path_or_id))


def save_checkpoint(model, tokenizer, path: Path) -> Path:
    """A standard HF folder (safetensors + tokenizer files) that transformers and vLLM load."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
