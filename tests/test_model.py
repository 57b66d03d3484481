import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from training.model import build_model, num_parameters, save_checkpoint
from training.tokenizer import tag_ids, train_tokenizer


def test_checkpoint_is_a_standard_hf_folder(tmp_path, tokenizer_and_tasks, micro_cfg):
    """transformers' Auto classes (what vLLM uses too) rebuild the same tokenizer and model."""
    tok, tasks = tokenizer_and_tasks
    model = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=0)
    save_checkpoint(model, tok, tmp_path / "ckpt")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in (tmp_path / "ckpt").iterdir()}
    loaded_tok = AutoTokenizer.from_pretrained(tmp_path / "ckpt")
    text = tasks[0]["prompt"] + "<code>print(12*3)</code><interpreter>36\n</interpreter><answer>36</answer>"
    ids = tok.encode(text, add_special_tokens=False)
    assert loaded_tok.encode(text, add_special_tokens=False) == ids
    assert loaded_tok.decode(ids) == text
    assert tag_ids(loaded_tok) == tag_ids(tok)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    x = torch.tensor([ids])
    assert torch.allclose(model(input_ids=x).logits, loaded(input_ids=x).logits, atol=1e-6)
    assert type(loaded).__name__ == "Qwen2ForCausalLM" and num_parameters(loaded) == num_parameters(model)


def test_digits_are_single_tokens_and_tags_atomic(tokenizer_and_tasks):
    tok, _ = tokenizer_and_tasks
    pieces = tok.convert_ids_to_tokens(tok.encode("347*52-18", add_special_tokens=False))
    assert pieces == list("347*52-18")
    assert len(tok.encode("</code>", add_special_tokens=False)) == 1


def test_vocab_floor_is_enforced():
    with pytest.raises(ValueError, match="vocab_size 100 is below"):
        train_tokenizer(["x"], 100)
