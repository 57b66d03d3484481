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
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in (tmp_path / "ckpt").iterdir()
    }
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


# --- bad model folders are refused before transformers sees them, naming folder, file and value ------


def _break(folder, how):
    import json

    config = folder / "config.json"
    if how == "no config":
        config.unlink()
    elif how == "config not json":
        config.write_text("{vocab_size: 3")
    elif how == "vocab_size missing":
        config.write_text(json.dumps({k: v for k, v in json.loads(config.read_text()).items() if k != "vocab_size"}))
    elif how == "no weights":
        (folder / "model.safetensors").unlink()
    elif how == "no tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).unlink()
    elif how == "tokenizer of another model":  # the embedding has fewer rows than the tokenizer has ids
        config.write_text(json.dumps({**json.loads(config.read_text()), "vocab_size": 100}))


@pytest.mark.parametrize(
    "how, message",
    [
        ("no config", r"model folder .*ckpt: no config.json"),
        ("config not json", r"model folder .*ckpt: config.json is not valid JSON"),
        (
            "vocab_size missing",
            r"model folder .*ckpt: config.json field 'vocab_size' is None, expected a positive integer",
        ),
        ("no weights", r"model folder .*ckpt: no weights \(one of model.safetensors"),
        ("no tokenizer", r"model folder .*ckpt: no tokenizer \(tokenizer.json or tokenizer_config.json\)"),
        (
            "tokenizer of another model",
            r"model folder .*ckpt: tokenizer.json has \d+ token ids but config.json vocab_size is 100: ids from 100 on",
        ),
    ],
)
def test_a_bad_model_folder_is_refused_naming_the_file_and_value(
    how, message, tmp_path, tokenizer_and_tasks, micro_cfg
):
    from training.model import ModelFolderError, load_policy

    tok, _ = tokenizer_and_tasks
    folder = save_checkpoint(build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=0), tok, tmp_path / "ckpt")
    load_policy(folder)  # intact, it loads
    _break(folder, how)
    with pytest.raises(ModelFolderError, match=message):
        load_policy(folder)


def test_a_tokenizer_folder_without_a_tokenizer_is_named(tmp_path):
    from training.model import ModelFolderError, load_tokenizer

    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFolderError, match=r"tokenizer folder .*empty: no tokenizer"):
        load_tokenizer(tmp_path / "empty")
