import pytest
import torch
from safetensors import safe_open

from configs import load_profile
from configs.schema import LoRAConfig, ModelConfig
from training.agent.engines import HFEngine
from training.agent.loop import run_episodes
from training.lora import apply_lora, lora_summary, merged, trainable_parameters
from training.model import build_model, load_policy, num_parameters, save_checkpoint
from training.sft import Example, sft_loss

SMALL = ModelConfig(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=300,
)
LORA = LoRAConfig(enabled=True, r=8, alpha=16)


def lora_added(h: int, i: int, kv: int, layers: int, r: int) -> int:
    """Hand count: LoRA on Linear(n_in, n_out) adds A (r x n_in) and B (n_out x r)."""
    attn = r * (h + h) + 2 * r * (h + kv) + r * (h + h)  # q, k, v, o
    mlp = 2 * r * (h + i) + r * (i + h)  # gate, up, down
    return layers * (attn + mlp)


def adapted(vocab: int = 300, seed: int = 0):
    """A LoRA model whose adapters are not the identity (B is zero at init)."""
    model = apply_lora(build_model(SMALL, vocab, 0, seed), LORA)
    torch.manual_seed(seed + 1)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.2)
    return model


def inputs(vocab: int = 300, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row, as the sampler builds them
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def test_only_adapters_train_and_start_as_identity():
    base = build_model(SMALL, 300, 0, seed=0).eval()
    with torch.no_grad():
        expected = base(**inputs()).logits
    assert apply_lora(base, LoRAConfig(enabled=False)) is base
    model = apply_lora(base, LORA).eval()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    summary = lora_summary(model)
    assert (
        summary["trainable"]
        == sum(p.numel() for p in trainable_parameters(model))
        == lora_added(32, 64, 32, 2, 8)
        == 8704
    )
    assert summary["total"] == 30432 + 8704  # embedding (tied) + 2 layers + final norm, plus the adapters
    with torch.no_grad():
        assert torch.equal(model(**inputs()).logits, expected)  # B = 0: the adapters add exactly nothing


def test_tiny_profile_trains_a_small_fraction():
    cfg = load_profile("tiny").model
    base = build_model(cfg, cfg.vocab_size, 0, seed=0)
    assert num_parameters(base) == 656_768
    summary = lora_summary(apply_lora(base, cfg.lora.model_copy(update={"enabled": True})))
    added = lora_added(
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.hidden_size // cfg.num_attention_heads * cfg.num_key_value_heads,
        cfg.num_hidden_layers,
        cfg.lora.r,
    )
    assert summary["trainable"] == added == 47_104
    assert summary["fraction"] == pytest.approx(47_104 / (656_768 + 47_104)) and summary["fraction"] < 0.07


def test_sft_steps_lower_loss_and_touch_only_adapters():
    model = apply_lora(build_model(SMALL, 300, 0, seed=0), LORA).train()
    g = torch.Generator().manual_seed(0)
    examples = [
        Example(
            torch.randint(1, 300, (5,), generator=g).tolist(),
            c := torch.randint(1, 300, (6,), generator=g).tolist(),
            [1] * len(c),
        )
        for _ in range(4)
    ]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=1e-2, weight_decay=0.1)
    losses = []
    for _ in range(8):
        loss, _ = sft_loss(model, examples, pad_id=0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses
    for name, p in model.named_parameters():
        if "lora_" in name:
            assert not torch.equal(p, before[name]), f"adapter {name} did not move"
        else:
            assert torch.equal(p, before[name]), f"base weight {name} changed"


def test_merged_checkpoint_reloads_as_plain_model_with_same_logits(tmp_path, tokenizer_and_tasks):
    tok, _ = tokenizer_and_tasks
    model = adapted(len(tok)).eval()
    with torch.no_grad():
        expected = model(**inputs(len(tok))).logits
    plain = merged(model)
    assert merged(plain) is plain
    save_checkpoint(plain, tok, tmp_path / "ckpt")
    with safe_open(tmp_path / "ckpt" / "model.safetensors", "pt") as f:
        keys = list(f.keys())
    assert "model.layers.0.self_attn.q_proj.weight" in keys
    assert not [k for k in keys if "lora" in k or "base_layer" in k]
    assert not (tmp_path / "ckpt" / "adapter_config.json").exists()
    reloaded = load_policy(tmp_path / "ckpt").eval()
    assert type(reloaded).__name__ == "Qwen2ForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs(len(tok))).logits, expected, atol=1e-5, rtol=0)
        # merging worked on a copy: the training model still has its adapters and its outputs
        assert any("lora_B" in n for n, _ in model.named_parameters())
        assert torch.equal(model(**inputs(len(tok))).logits, expected)


def test_kv_cache_sampler_through_lora_matches_merged_and_full_forward(tokenizer_and_tasks, micro_cfg):
    """Greedy multi-turn rollouts (KV cache, past_key_values) through the peft wrapper give the
    same ids as the merged plain model, and the behaviour logprobs equal a no-cache forward."""
    tok, tasks = tokenizer_and_tasks
    model = adapted(len(tok))
    cfg = micro_cfg.rollout.model_copy(update={"max_new_tokens_per_turn": 10, "max_turns": 2})
    episodes = run_episodes(HFEngine(model), tok, tasks[:4], group_size=1, tools={}, cfg=cfg, greedy=True)
    reference = run_episodes(HFEngine(merged(model)), tok, tasks[:4], group_size=1, tools={}, cfg=cfg, greedy=True)
    assert [e.completion_ids for e in episodes] == [e.completion_ids for e in reference]
    assert sum(len(e.completion_ids) for e in episodes) >= 4 * 10
    # the trainer's recomputation (no cache, through the adapters) matches the sampler's log-probs
    from training.rl.loop import recorded_logprobs

    rows = [
        {"prompt_ids": e.prompt_ids, "completion_ids": e.completion_ids, "tool_mask": e.tool_mask} for e in episodes
    ]
    for e, recomputed in zip(episodes, recorded_logprobs(model, rows, temperature=1.0, pad_id=tok.eos_token_id)):
        sampled = [(a, b) for a, b, m in zip(recomputed, e.logprobs, e.tool_mask) if m]
        assert max(abs(a - b) for a, b in sampled) < 1e-4


@pytest.mark.parametrize("targets, missing", [(("nope_proj",), "nope_proj"), (("q_proj", "vproj"), "vproj")])
def test_unknown_target_module_is_named(targets, missing):
    model = build_model(SMALL, 300, 0, seed=0)
    with pytest.raises(ValueError, match=rf"\['{missing}'\] match no module.*'q_proj'"):
        apply_lora(model, LoRAConfig(enabled=True, target_modules=targets))


def test_rl_round_with_lora_moves_only_the_adapters(tokenizer_and_tasks, micro_cfg, sandbox, tmp_path):
    """The RL loop on a LoRA policy: sampling, the update through the engine, a saved merged checkpoint."""
    from configs.schema import RewardConfig
    from environments.tools import CodeInterpreter, toolbox
    from training.rl.loop import train_round
    from verifiers.cascade import Cascade

    tok, tasks = tokenizer_and_tasks
    policy = apply_lora(build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=2), LORA)
    base = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" not in n}
    adapters = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" in n}
    # batch-whitened: every trajectory trains, even in flat groups
    rl = micro_cfg.rl.model_copy(
        update={
            "steps_per_round": 3,
            "learning_rate": 1e-2,
            "kl_coef": 0.0,
            "drop_zero_variance_groups": False,
            "algorithm": "reinforce_pp",
        }
    )
    result = train_round(
        policy,
        None,
        tok,
        tasks,
        toolbox(CodeInterpreter(sandbox)),
        rl=rl,
        rollout=micro_cfg.rollout,
        cascade=Cascade(RewardConfig(), sandbox),
        round_index=1,
        policy_version="t",
        seed=0,
    )
    assert sum(h["rollout/trained_trajectories"] for h in result.history) > 0
    assert all(torch.equal(p, base[n]) for n, p in policy.named_parameters() if n in base)
    assert any(not torch.equal(p, adapters[n]) for n, p in policy.named_parameters() if n in adapters)
    save_checkpoint(merged(policy), tok, tmp_path)
    assert not any("lora" in k for k in load_policy(tmp_path).state_dict())
