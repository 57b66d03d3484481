"""Device and memory for real pretrained models (issue 22, item 4).

* The chunked log-prob pass (`completion_logprobs`) gives the whole-logits values, entropies and
  gradients, never holds a (B, C, V) tensor, and works through every wrapper the trainer calls:
  Qwen2 and Llama, LoRA, bf16 autocast, DeepSpeed ZeRO-3, and SmolLM2-135M itself.
* `model.gradient_checkpointing` changes no gradient, and the HF rollout engine still samples
  from the same model object afterwards.
* `device` reaches every pass: each batch goes to the device of the model it runs on (policy,
  reference, critic), and CUDA asked for where there is none is an error naming `device`.
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

from configs.schema import EngineConfig, LoRAConfig, ModelConfig, RewardConfig, RLConfig
from training import distributed_check as dc
from training.engines import build_engine, resolve_device
from training.sequences import collate, completion_logits, completion_logprobs, entropy_from_logits, token_logprobs

pytestmark = pytest.mark.realmodel

VOCAB = 300
TOL = 1e-5


def _model(arch: str, seed: int = 0, vocab: int = VOCAB) -> torch.nn.Module:
    torch.manual_seed(seed)
    shape = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**shape, tie_word_embeddings=True))
    return LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=False))


def _batch(prompt_lens=(3, 7, 5), completion_lens=(9, 4, 12), seed: int = 1, vocab: int = VOCAB):
    """Rows of different lengths (left- and right-padding), a tool span masked in one row."""
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(1, vocab, (n,), generator=g).tolist()  # noqa: E731
    completions = [ids(n) for n in completion_lens]
    masks = [[0 if (i == 0 and 2 <= j < 5) else 1 for j in range(len(c))] for i, c in enumerate(completions)]
    return collate([ids(n) for n in prompt_lens], completions, masks, 0)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _reference_pass(model, batch, temperature: float):
    """The whole-logits computation the chunked pass replaces: values, entropies, gradients."""
    model.zero_grad(set_to_none=True)
    logits = completion_logits(model, batch)
    logprobs = token_logprobs(logits, batch.completion_ids, temperature)
    entropy = entropy_from_logits(logits.detach(), temperature)
    (-(logprobs * batch.loss_mask).sum() / batch.loss_mask.sum()).backward()  # SFT's token-mean NLL
    return logprobs.detach(), entropy, _grads(model)


def _chunked_pass(model, batch, temperature: float, chunk_tokens: int | None):
    model.zero_grad(set_to_none=True)
    logprobs, entropy = completion_logprobs(model, batch, temperature, with_entropy=True, chunk_tokens=chunk_tokens)
    (-(logprobs * batch.loss_mask).sum() / batch.loss_mask.sum()).backward()  # SFT's token-mean NLL
    return logprobs.detach(), entropy, _grads(model)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and a
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# --------------------------------------------------------------------------- chunked log-probs
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("chunk_tokens", [None, 1, 5, 7, 36, 1000])
def test_chunked_logprobs_equal_the_whole_logits_in_values_and_gradients(arch, chunk_tokens):
    """Every chunking (one token, chunks that straddle rows, exactly the batch, more than the batch)
    gives the whole-logits log-probs, entropies and parameter gradients within 1e-5 (fp32)."""
    model, batch = _model(arch), _batch()
    want_lp, want_ent, want_grad = _reference_pass(model, batch, temperature=0.7)
    lp, ent, grad = _chunked_pass(model, batch, 0.7, chunk_tokens)
    assert lp.shape == ent.shape == batch.completion_ids.shape and lp.dtype == torch.float32
    assert float((lp - want_lp).abs().max()) <= TOL
    assert float((ent - want_ent).abs().max()) <= TOL
    assert _max_diff(grad, want_grad) <= TOL
    assert not ent.requires_grad  # a diagnostic: no graph is kept for it


class _LargestTensor(TorchDispatchMode):
    """The element count of the largest tensor any op produced, forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.largest = max([self.largest] + [t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
        return out


def test_a_chunked_pass_never_materializes_the_batch_logits():
    """The largest tensor of a whole-logits forward + backward is the batch's (B*C, V) logits (or
    their gradient); in a chunked one, no tensor is larger than the largest parameter (the
    embedding and its gradient): an 8-token chunk's logits are a quarter of it."""
    vocab = 4000
    model = _model("qwen2", vocab=vocab)
    batch = _batch(prompt_lens=(4, 6, 5, 3), completion_lens=(40, 38, 25, 40), vocab=vocab)
    whole, largest_parameter = batch.completion_ids.numel() * vocab, max(p.numel() for p in model.parameters())
    assert whole > 4 * largest_parameter
    for chunk_tokens in (None, 8):
        with _LargestTensor() as seen:
            logprobs = completion_logprobs(model, batch, chunk_tokens=chunk_tokens)
            (logprobs * batch.loss_mask).sum().backward()
        if chunk_tokens is None:
            assert seen.largest >= whole
        else:
            assert seen.largest <= largest_parameter, (
                f"a {seen.largest}-element tensor existed; the batch logits are {whole}"
            )
        model.zero_grad(set_to_none=True)


def test_lora_adapters_get_the_same_gradients_chunked():
    from training.lora import apply_lora

    model = apply_lora(_model("qwen2"), LoRAConfig(enabled=True, r=4, target_modules=("q_proj", "v_proj", "down_proj")))
    for p in model.parameters():
        if p.requires_grad:  # B starts at zero; random adapters make every gradient non-trivial
            torch.nn.init.normal_(p, std=0.1)
    batch = _batch()
    want_lp, _, want_grad = _reference_pass(model, batch, 1.0)
    lp, _, grad = _chunked_pass(model, batch, 1.0, 5)
    assert len(grad) == 12 and all("lora_" in name for name in grad)
    assert float((lp - want_lp).abs().max()) <= TOL and _max_diff(grad, want_grad) <= TOL
    # gradient checkpointing through peft's wrapper: the frozen base recomputed, the adapters' gradients unchanged
    build_engine(model, EngineConfig(), lr=1e-3, grad_clip=1.0, gradient_checkpointing=True).train()
    assert model.base_model.model.model.gradient_checkpointing
    _, _, checkpointed = _chunked_pass(model, batch, 1.0, 5)
    assert _max_diff(checkpointed, want_grad) <= TOL


def test_the_chunked_head_runs_under_the_engines_bf16_autocast():
    """Through the torch engine's bf16 module, the chunks run the head under the same autocast as
    the model's own head: equal to the whole-logits pass, and not to an fp32 head."""
    engine = build_engine(_model("qwen2"), EngineConfig(precision="bf16"), lr=1e-3, grad_clip=1.0)
    batch = _batch()
    with torch.no_grad():
        whole = token_logprobs(completion_logits(engine.module, batch), batch.completion_ids)
        chunked = completion_logprobs(engine.module, batch, chunk_tokens=5)
        fp32 = completion_logprobs(engine.model, batch, chunk_tokens=5)
    assert float((chunked - whole).abs().max()) <= TOL
    assert float((chunked - fp32).abs().max()) > 1e-4


DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


@pytest.fixture
def _restore_rank_env():
    """DeepSpeed makes this process a world of one through os.environ; later subprocesses must not
    inherit that (as tests/training/test_engines.py)."""
    saved = {k: os.environ.get(k) for k in DIST_ENV}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.mark.filterwarnings("ignore:`torch.distributed.*` is deprecated:FutureWarning")
def test_zero3_trains_the_chunked_head_like_the_torch_engine(_restore_rank_env):
    """ZeRO-3 partitions the head's weight; the chunks call the head module, whose hooks gather it
    (also when the backward recomputes a chunk). 4-token chunks on DeepSpeed ZeRO-3 against one
    whole-logits chunk on the torch engine: tests/training/test_engines.py's fp32 tolerance."""
    reference, reference_state = dc.run_check(EngineConfig(logit_chunk_tokens=None), steps=3)
    chunked, state = dc.run_check(
        EngineConfig(kind="deepspeed", zero_stage=3, micro_batch_size=2, logit_chunk_tokens=4), steps=3
    )
    norms = [h["grad_norm"] for h in chunked["history"]]
    assert norms[0] == pytest.approx(reference["history"][0]["grad_norm"], rel=1e-6)
    assert norms == pytest.approx([h["grad_norm"] for h in reference["history"]], rel=1e-3)
    assert max(float((state[k].double() - reference_state[k].double()).abs().max()) for k in state) < 0.1 * dc.LR


# --------------------------------------------------------------------------- SmolLM2-135M
@pytest.fixture(scope="module")
def smollm2(smollm2_folder):
    from training.model import load_policy

    return load_policy(smollm2_folder, "float32")


def test_smollm2_chunked_logprobs_match_the_whole_logits(smollm2):
    """The real model (Llama architecture, 49,152-token vocabulary, tied head): values and every
    gradient within 1e-5 with 16-token chunks."""
    batch = _batch(prompt_lens=(6, 11), completion_lens=(20, 13), vocab=smollm2.config.vocab_size)
    want_lp, want_ent, want_grad = _reference_pass(smollm2, batch, 1.0)
    lp, ent, grad = _chunked_pass(smollm2, batch, 1.0, 16)
    smollm2.zero_grad(set_to_none=True)
    assert float((lp - want_lp).abs().max()) <= TOL and float((ent - want_ent).abs().max()) <= TOL
    assert _max_diff(grad, want_grad) <= TOL


def test_smollm2_gradient_checkpointing_changes_no_gradient(smollm2):
    from training.engines import enable_gradient_checkpointing

    batch = _batch(prompt_lens=(6, 11), completion_lens=(20, 13), vocab=smollm2.config.vocab_size)
    smollm2.train()
    try:
        _, _, plain = _chunked_pass(smollm2, batch, 1.0, 16)
        enable_gradient_checkpointing(smollm2)
        _, _, checkpointed = _chunked_pass(smollm2, batch, 1.0, 16)
    finally:
        smollm2.gradient_checkpointing_disable()
        smollm2.zero_grad(set_to_none=True)
        smollm2.eval()
    assert _max_diff(checkpointed, plain) <= TOL


# --------------------------------------------------------------------------- gradient checkpointing
def test_gradient_checkpointing_same_gradients_and_the_hf_engine_still_samples():
    """model.gradient_checkpointing: the decoder layers run again in the backward, the gradients do
    not change (<= 1e-5), and after an update the HF rollout engine samples from the same object
    with its KV cache exactly as from a twin trained without checkpointing."""
    from training.agent.engines import HFEngine, Sampling

    cfg = ModelConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    from training.model import build_model

    models = {gc: build_model(cfg, VOCAB, 0, seed=3) for gc in (False, True)}
    engines = {
        gc: build_engine(m, EngineConfig(), lr=1e-2, grad_clip=1.0, gradient_checkpointing=gc)
        for gc, m in models.items()
    }
    layer_calls = {gc: 0 for gc in models}
    for gc, m in models.items():
        for layer in m.model.layers:
            # a pre-hook: the recompute stops early, once it has every saved tensor, before the layer's end
            layer.register_forward_pre_hook(lambda *_, gc=gc: layer_calls.__setitem__(gc, layer_calls[gc] + 1))
    batch, grads = _batch(), {}
    for gc, engine in engines.items():
        engine.train()
        logprobs = completion_logprobs(engine.module, batch, chunk_tokens=5)
        engine.backward(-(logprobs * batch.loss_mask).sum() / batch.loss_mask.sum())
        grads[gc] = _grads(models[gc])
        engine.step()
        engine.eval()
    assert layer_calls == {False: 2, True: 4}  # one forward, plus the recompute of each layer
    assert _max_diff(grads[True], grads[False]) <= TOL
    assert models[True].config.use_cache  # the config is left alone: trainer passes ask for no cache themselves
    prompts = [[5, 6, 7], [8, 9]]
    sampled = {
        gc: HFEngine(m).generate(
            prompts,
            [6, 6],
            stop_ids=set(),
            sampling=Sampling(temperature=1.0, greedy=True),
            generator=torch.Generator().manual_seed(0),
        )
        for gc, m in models.items()
    }
    assert [g.ids for g in sampled[True]] == [g.ids for g in sampled[False]] and all(
        len(g.ids) == 6 for g in sampled[True]
    )
    assert not models[True].training


# --------------------------------------------------------------------------- device
@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_cuda_without_cuda_is_an_error_naming_device(no_cuda, tmp_path):
    from assets.sft import load_checkpoint
    from configs.schema import SFTConfig
    from training.rl.loop import train_round
    from training.sft import Example, train_sft

    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"device='cuda'.*not available"):
        resolve_device("cuda")
    model = _model("qwen2")
    with pytest.raises(ValueError, match=r"device='cuda'"):
        build_engine(model, EngineConfig(), lr=1e-3, grad_clip=1.0, device="cuda")
    with pytest.raises(ValueError, match=r"device='cuda'"):
        train_sft(model, [Example([1, 2], [3, 4], [1, 1])], SFTConfig(steps=1), pad_id=0, seed=0, device="cuda")
    with pytest.raises(ValueError, match=r"device='cuda'"):  # before any rollout
        train_round(
            model,
            None,
            SimpleNamespace(eos_token_id=0),
            [],
            {},
            rl=RLConfig(algorithm="dapo"),
            rollout=None,
            cascade=None,
            round_index=1,
            policy_version="t",
            seed=0,
            device="cuda",
        )
    with pytest.raises(ValueError, match=r"device='cuda'"):  # the assets load checkpoints through it
        load_checkpoint(SimpleNamespace(local_path=lambda uri: tmp_path), {"uri": "x"}, "float32", "cuda")
    assert next(model.parameters()).device.type == "cpu"


def test_the_engine_refuses_to_train_elsewhere_than_device(monkeypatch):
    """An engine that ends up on another device than `device` (DeepSpeed picks its accelerator
    itself) fails instead of training there silently."""
    import training.engines as engines

    monkeypatch.setattr(engines, "model_device", lambda model: torch.device("meta"))
    with pytest.raises(ValueError, match=r"device='cpu' but the torch engine trains on meta"):
        build_engine(_model("qwen2"), EngineConfig(), lr=1e-3, grad_clip=1.0, device="cpu")


def test_the_config_fields():
    assert (
        list(ModelConfig.model_fields)[-1] == "gradient_checkpointing" and ModelConfig().gradient_checkpointing is False
    )
    assert EngineConfig().logit_chunk_tokens == 512 and EngineConfig(logit_chunk_tokens=None).logit_chunk_tokens is None
    rl = RLConfig(reference_device="cpu", critic_device="cuda")
    assert (rl.reference_device, rl.critic_device, RLConfig().reference_device, RLConfig().critic_device) == (
        "cpu",
        "cuda",
        None,
        None,
    )
    with pytest.raises(ValueError, match="reference_device"):
        RLConfig(reference_device="tpu")


def test_every_pass_runs_on_the_device_of_its_model(monkeypatch, tokenizer_and_tasks, micro_cfg, sandbox):
    """One SFT step and one PPO round (policy, frozen reference, critic), with each model given its
    own device label (a distinct torch.device object; all of them the CPU, the only device here):
    every batch reaches a model moved to that model's label, every per-token tensor of a loss is
    built on its engine's label, the reference goes to rl.reference_device and the critic to the
    policy's device (rl.critic_device unset). So nothing takes its device from anywhere but the
    model it feeds or the config: on a GPU node, the same code puts each tensor on that GPU."""
    import training.engines as engines
    import training.rl.loop as rl_loop
    import training.sft as sft
    from environments.tools import CodeInterpreter, toolbox
    from training.model import build_model
    from training.sequences import to_device
    from verifiers.cascade import Cascade

    tok, tasks = tokenizer_and_tasks
    policy = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=2)
    reference = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=2).requires_grad_(False).eval()
    label = {"policy": torch.device("cpu", 1), "reference": torch.device("cpu", 2), "critic": torch.device("cpu", 3)}

    def role(model) -> str:
        return (
            "critic"
            if isinstance(model, Qwen2ForTokenClassification)
            else "reference"
            if model is reference
            else "policy"
        )

    for module in (engines, rl_loop, sft):
        monkeypatch.setattr(module, "model_device", lambda model: label[role(model)])
    moved, mismatches, built_on = [], [], []

    def spy_to_device(batch, device):
        moved.append(device)
        return to_device(batch, device)

    def check_trainer_pass(model, args, kwargs):  # trainer passes ask for no KV cache; rollouts do
        if kwargs.get("use_cache") is False and moved[-1] != label[role(model)]:
            mismatches.append((role(model), moved[-1]))

    def spy_critic(policy_model, device=None):
        built_on.append(device)
        critic = real_critic(policy_model, device=device)
        critic.register_forward_pre_hook(check_trainer_pass, with_kwargs=True)
        return critic

    padded, update_device = [], []

    def spy_padded(rows, width, device="cpu"):
        if update_device:
            padded.append((device, update_device[-1]))
        return real_padded(rows, width, device)

    def spy_run_update(engine, *args, **kwargs):
        update_device.append(engine.device)
        try:
            return real_run_update(engine, *args, **kwargs)
        finally:
            update_device.pop()

    real_critic, real_padded, real_run_update = rl_loop.critic_from_policy, rl_loop.padded, rl_loop.run_update
    for module in (rl_loop, sft):
        monkeypatch.setattr(module, "to_device", spy_to_device)
    monkeypatch.setattr(rl_loop, "critic_from_policy", spy_critic)
    monkeypatch.setattr(rl_loop, "padded", spy_padded)
    monkeypatch.setattr(rl_loop, "run_update", spy_run_update)
    for model in (policy, reference):
        model.register_forward_pre_hook(check_trainer_pass, with_kwargs=True)
    reference_moves = []
    real_to = reference.to
    monkeypatch.setattr(reference, "to", lambda *a, **k: reference_moves.append(a) or real_to(*a, **k))

    # SFT: one step, 8-token chunks so the recomputed chunks run too
    examples = [
        sft.Example(t["prompt_ids"], t["completion_ids"], t["tool_mask"]) for t in _sft_examples(tok, tasks[:4])
    ]
    sft.train_sft(
        policy,
        examples,
        micro_cfg.sft.model_copy(update={"steps": 1, "batch_size": 4}),
        pad_id=tok.eos_token_id,
        seed=0,
        engine_cfg=EngineConfig(logit_chunk_tokens=8),
        device="cpu",
    )
    assert moved and set(moved) == {label["policy"]} and not mismatches

    # RL: PPO, whose KL sits in the reward, so the old, reference and value passes all run
    moved.clear()
    rl = micro_cfg.rl.model_copy(
        update={
            "algorithm": "ppo",
            "steps_per_round": 1,
            "prompts_per_step": 2,
            "group_size": 4,
            "reference_device": "cpu",
            "drop_zero_variance_groups": False,
        }
    )
    result = rl_loop.train_round(
        policy,
        reference,
        tok,
        tasks,
        toolbox(CodeInterpreter(sandbox)),
        rl=rl,
        rollout=micro_cfg.rollout,
        cascade=Cascade(RewardConfig(), sandbox),
        round_index=1,
        policy_version="t",
        seed=0,
        engine_cfg=EngineConfig(logit_chunk_tokens=8),
        device="cpu",
    )
    assert "critic/value_loss" in result.history[-1] and "actor/kl_ref" in result.history[-1]
    assert set(moved) == set(label.values()) and not mismatches
    assert padded and all(device == engine for device, engine in padded)
    assert {e for _, e in padded} == {label["policy"], label["critic"]}
    assert reference_moves == [(torch.device("cpu"),)]  # rl.reference_device
    assert built_on == [label["policy"]]  # rl.critic_device unset: where the policy trains
    assert all(math.isfinite(v) for v in result.history[-1].values())


def _sft_examples(tok, tasks: list[dict]) -> list[dict]:
    """Prompt and answer ids of a few tasks, with a masked span: enough for one SFT step."""
    from training.sequences import encode

    rows = []
    for t in tasks:
        completion = encode(tok, f"<answer>{t['answer']}</answer>")
        rows.append(
            {"prompt_ids": encode(tok, t["prompt"]), "completion_ids": completion, "tool_mask": [1] * len(completion)}
        )
    return rows
