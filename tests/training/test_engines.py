"""Training engines: the gradient contract, checked numerically.

The contract (training/engines.py): a step applies d(sum of micro-batch losses over all ranks)/dθ,
so the final weights must not depend on the micro-batch size, the world size or the engine.

Tolerances, and why they differ:
* float64 (torch engine only; DeepSpeed refuses float64): no rounding noise to speak of, so
  the checks are tight (measured max |Δθ| ~4e-13 for micro-batch 1 vs 8 and ~7e-15 for 2 ranks
  vs 1 after 3 steps).
* float32: the gradients agree to ~1e-8 absolute, but Adam's first update is ~lr·g/(|g|+eps):
  elements whose gradient is ~1e-8 (Adam's eps) turn that rounding into update differences of
  a few % of lr. Measured max |Δθ| after 3 steps at lr 1e-2: 1.3e-4 (micro 1 vs 8, torch and
  ZeRO-0/1/2), 1.1e-4 (2 ranks vs 1, ZeRO-2), 7e-5 (ZeRO-3 vs torch). FP32_ATOL = 10% of lr
  leaves room for other CPUs' rounding. A real bug moves weights by O(lr):
  `test_tolerance_catches_local_normalization` checks the tolerance tells them apart.
* Adam is (nearly) invariant to the gradient's scale, so a step that divides by the number of
  micro-batches or averages over ranks hardly moves the weights differently; the reported
  pre-clip grad_norm is compared too, and that catches it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from configs.schema import EngineConfig
from training import distributed_check as dc
from training.engines import (
    DIST_ENV,
    STALE_BUILD_LOCK_S,
    accumulate_step,
    build_engine,
    clear_stale_extension_locks,
    deepspeed_config,
    micro_batches,
    resolve_precision,
    shard,
)
from training.rl.math import agg_loss
from training.sequences import completion_logits, token_logprobs

# DeepSpeed 0.19.8 calls torch's deprecated reduce_scatter_tensor / all_gather_into_tensor.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.distributed.*` is deprecated:FutureWarning")

REPO = Path(__file__).resolve().parents[2]
STEPS = 3
FP32_ATOL = 0.1 * dc.LR
FP64_ATOL = 1e-10


@pytest.fixture(scope="module", autouse=True)
def _no_leaked_rank_env():
    """DeepSpeed engines built here make this process a world of one (RANK, MASTER_PORT, ...
    in os.environ); later tests' subprocesses must not inherit that. The process group itself
    stays: DeepSpeed caches its groups, and a new engine after destroy_process_group() fails
    ("Group ... is not registered")."""
    saved = {k: os.environ.get(k) for k in DIST_ENV}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def grad_norms(summary: dict) -> list[float]:
    return [h["grad_norm"] for h in summary["history"]]


def assert_same_training(a: tuple[dict, dict], b: tuple[dict, dict], *, atol: float, norm_rtol: float) -> float:
    """Same weights (within atol) and same gradient scale; the first step's gradients are taken
    at identical weights, so its norm must agree far more tightly than later ones."""
    (summary_a, state_a), (summary_b, state_b) = a, b
    assert grad_norms(summary_a)[0] == pytest.approx(grad_norms(summary_b)[0], rel=1e-6)
    assert grad_norms(summary_a) == pytest.approx(grad_norms(summary_b), rel=norm_rtol)
    diff = max_abs_diff(state_a, state_b)
    assert diff < atol, f"max |Δθ| = {diff:.3g} >= {atol:.3g}"
    return diff


def torchrun(tmp_path: Path, *args: str, nproc: int = 2, timeout: float = 240) -> tuple[dict, dict]:
    """Run training.distributed_check under torchrun; (summary, state_dict) of rank 0."""
    out = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}  # this process's DeepSpeed world of one
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "training.distributed_check",
        *args,
        "--out",
        str(out),
    ]
    # Own session, so a hung collective is killed with all its workers, not just torchrun.
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun timed out after {timeout}s:\n{output[-3000:]}")
    assert proc.returncode == 0, output[-3000:]
    return json.loads(out.read_text()), torch.load(out.with_suffix(".pt"), weights_only=True)


# --------------------------------------------------------------------------- config
def test_deepspeed_config_fields():
    cfg = EngineConfig(kind="deepspeed", zero_stage=2, offload_optimizer=True, precision="auto")
    ds = deepspeed_config(cfg, micro_batch_size=4, grad_accum=8, grad_clip=1.0, device="cpu", world_size=2)
    assert ds["zero_optimization"] == {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": False}}
    assert ds["bf16"] == {"enabled": False}  # auto on CPU -> fp32
    assert "data_types" not in ds
    assert ds["gradient_clipping"] == 1.0
    assert ds["train_micro_batch_size_per_gpu"] == 4 and ds["gradient_accumulation_steps"] == 8
    assert ds["train_batch_size"] == 4 * 8 * 2
    assert ds["managed_gradient_accumulation"] is False  # step() is the accumulation boundary

    ds3 = deepspeed_config(
        EngineConfig(kind="deepspeed", zero_stage=3, precision="bf16"), micro_batch_size=1, grad_accum=1, grad_clip=0.5
    )
    assert ds3["zero_optimization"] == {"stage": 3}
    assert ds3["bf16"] == {"enabled": True} and ds3["data_types"] == {"grad_accum_dtype": "fp32"}

    # Without ZeRO DeepSpeed does not report the norm: the engine clips, DeepSpeed must not.
    ds0 = deepspeed_config(EngineConfig(kind="deepspeed"), micro_batch_size=1, grad_accum=1, grad_clip=1.0)
    assert ds0["gradient_clipping"] == 0.0 and ds0["zero_optimization"] == {"stage": 0}


def test_precision_auto_is_fp32_on_cpu():
    assert resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("bf16", "cpu") == "bf16"
    assert resolve_precision("fp32", "cpu") == "fp32"


@pytest.mark.parametrize(
    "cfg, words",
    [
        (EngineConfig(kind="deepspeed", zero_stage=0, offload_optimizer=True), ["offload_optimizer", "zero_stage=0"]),
        (EngineConfig(kind="torch", zero_stage=2), ["zero_stage=2", "kind='torch'"]),
        (EngineConfig(kind="torch", offload_optimizer=True), ["offload_optimizer", "kind='torch'"]),
        (EngineConfig(kind="deepspeed", zero_stage=0, precision="bf16"), ["precision='bf16'", "zero_stage=0"]),
    ],
)
def test_bad_combinations_raise(cfg, words):
    with pytest.raises(ValueError) as err:
        build_engine(dc.tiny_model(), cfg, lr=1e-3, grad_clip=1.0)
    assert all(w in str(err.value) for w in words), str(err.value)


# --------------------------------------------------------------------------- data splitting
def test_shard_is_strided_and_covers_the_batch():
    rows = list(range(7))
    shards = [shard(rows, r, 2) for r in range(2)]
    assert shards == [[0, 2, 4, 6], [1, 3, 5]]
    assert sorted(shards[0] + shards[1]) == rows
    with pytest.raises(ValueError):
        shard(rows, 2, 2)
    assert [len(c) for c in micro_batches(rows, 3)] == [3, 3, 1]
    assert micro_batches(rows, None) == [rows]


def test_token_budget_micro_batches_sort_and_bound_padding():
    rows = [(5, 3), (20, 80), (5, 2), (6, 10), (30, 100), (4, 4), (6, 9)]
    chunks = micro_batches(rows, None, max_tokens=60, shape=lambda r: r)
    assert sorted(r for c in chunks for r in c) == sorted(rows)  # every row once
    assert chunks[0] == [(5, 2), (5, 3), (4, 4), (6, 9)]  # shortest first; 4 x (6 + 9) = 60 fits, (6, 10) would not
    for chunk in chunks:  # padded as collate pads: rows x (longest prompt + longest completion)
        padded = len(chunk) * (max(p for p, _ in chunk) + max(c for _, c in chunk))
        assert padded <= 60 or len(chunk) == 1
    assert [(20, 80)] in chunks and [(30, 100)] in chunks  # over the budget alone: a chunk of one
    assert all(len(c) <= 2 for c in micro_batches(rows, 2, max_tokens=10_000, shape=lambda r: r))  # both limits hold
    with pytest.raises(ValueError, match="max_tokens"):
        micro_batches(rows, None, max_tokens=0, shape=lambda r: r)


def test_accumulate_step_refuses_an_empty_shard():
    engine = dc.make_engine(EngineConfig())
    with pytest.raises(ValueError, match="no rows"):
        accumulate_step(engine, [], dc.sft_loss_fn(engine.module), dc.count_fn, micro_batch_size=1)


# --------------------------------------------------------------------------- torch engine
def test_torch_grad_accumulation_is_exact_in_float64():
    runs = {
        mb: dc.run_check(EngineConfig(micro_batch_size=mb), steps=STEPS, dtype=torch.float64) for mb in (None, 3, 1)
    }
    for mb in (3, 1):
        assert_same_training(runs[None], runs[mb], atol=FP64_ATOL, norm_rtol=1e-10)
    # "loss" is the minibatch loss however it was split; and training did move the weights
    losses = {mb: [h["loss"] for h in summary["history"]] for mb, (summary, _) in runs.items()}
    assert losses[3] == pytest.approx(losses[None], rel=1e-6) and losses[1] == pytest.approx(losses[None], rel=1e-6)
    assert losses[None][-1] < losses[None][0]
    assert max_abs_diff(runs[None][1], dc.tiny_model(0, torch.float64).state_dict()) > 1e-3  # measured 1.8e-2


def test_token_budget_accumulation_is_exact_in_float64():
    """Length-sorted chunks under a padded-token budget train exactly like the whole batch."""
    whole = dc.run_check(EngineConfig(micro_batch_tokens=None), steps=STEPS, dtype=torch.float64)
    for budget in (16, 40):
        assert_same_training(
            whole,
            dc.run_check(EngineConfig(micro_batch_tokens=budget), steps=STEPS, dtype=torch.float64),
            atol=FP64_ATOL,
            norm_rtol=1e-10,
        )
    # the budget really split the batch
    assert len(micro_batches(dc.synthetic_batch(), None, max_tokens=40, shape=dc.shape)) > 2


def test_torch_grad_accumulation_fp32():
    full = dc.run_check(EngineConfig(micro_batch_size=None), steps=STEPS)
    one = dc.run_check(EngineConfig(micro_batch_size=1), steps=STEPS)
    assert_same_training(full, one, atol=FP32_ATOL, norm_rtol=1e-3)


def _local_mean_loss_fn(module):
    """The classic bug: each micro-batch normalized by its own token count."""

    def loss_fn(chunk, counts):
        batch = dc._collate(chunk)
        logprobs = token_logprobs(completion_logits(module, batch), batch.completion_ids)
        return agg_loss(-logprobs, batch.loss_mask, "token_mean"), {}

    return loss_fn


def test_tolerance_catches_local_normalization():
    """The fp32 tolerance is loose enough for rounding and still far below what a wrong
    normalization does to the weights (measured 3.7e-2 here, vs FP32_ATOL 1e-3)."""
    rows = dc.synthetic_batch()
    right, wrong = dc.make_engine(EngineConfig()), dc.make_engine(EngineConfig())
    for _ in range(STEPS):
        accumulate_step(right, rows, dc.sft_loss_fn(right.module), dc.count_fn, micro_batch_size=None)
        accumulate_step(wrong, rows, _local_mean_loss_fn(wrong.module), dc.count_fn, micro_batch_size=1)
    assert max_abs_diff(right.model_state_dict(), wrong.model_state_dict()) > 10 * FP32_ATOL


def test_torch_bf16_autocasts_forward_and_keeps_fp32_weights():
    engine = dc.make_engine(EngineConfig(precision="bf16", micro_batch_size=4))
    batch = dc._collate(dc.synthetic_batch()[:2])
    assert engine.module(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.dtype == torch.bfloat16
    history = dc.train(engine, dc.synthetic_batch(), steps=STEPS, micro_batch_size=4)
    assert {p.dtype for p in engine.model.parameters()} == {torch.float32}
    assert history[-1]["loss"] < history[0]["loss"]


# --------------------------------------------------------------------------- resume
@pytest.mark.parametrize(
    "cfg",
    [
        EngineConfig(micro_batch_size=3),
        EngineConfig(kind="deepspeed", zero_stage=2, micro_batch_size=3),
        EngineConfig(kind="deepspeed", zero_stage=3, micro_batch_size=3),
    ],
    ids=["torch", "zero2", "zero3"],
)
def test_save_load_resumes_bit_for_bit(cfg, tmp_path):
    rows = dc.synthetic_batch()
    engine = dc.make_engine(cfg)
    dc.train(engine, rows, steps=2, micro_batch_size=3)
    engine.save_state(tmp_path / "state")
    history_a = dc.train(engine, rows, steps=2, micro_batch_size=3)

    resumed = dc.make_engine(cfg, seed=1)  # different initial weights: load_state must replace them
    resumed.load_state(tmp_path / "state")
    assert resumed.global_step == 2
    history_b = dc.train(resumed, rows, steps=2, micro_batch_size=3)

    expected_lrs = [dc.lr_schedule(2) * dc.LR, dc.lr_schedule(3) * dc.LR]  # the scheduler resumed too
    assert [h["lr"] for h in history_a] == [h["lr"] for h in history_b] == expected_lrs
    state_a, state_b = engine.model_state_dict(), resumed.model_state_dict()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)


# --------------------------------------------------------------------------- DeepSpeed, one process
@pytest.fixture(scope="module")
def torch_fp32_reference():
    return dc.run_check(EngineConfig(micro_batch_size=None), steps=STEPS)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_deepspeed_grad_accumulation_matches_torch(stage, torch_fp32_reference):
    for mb in (1, None):
        run = dc.run_check(EngineConfig(kind="deepspeed", zero_stage=stage, micro_batch_size=mb), steps=STEPS)
        assert_same_training(torch_fp32_reference, run, atol=FP32_ATOL, norm_rtol=1e-3)


def test_deepspeed_offload_matches_torch(torch_fp32_reference):
    run = dc.run_check(
        EngineConfig(kind="deepspeed", zero_stage=2, offload_optimizer=True, micro_batch_size=2), steps=STEPS
    )
    assert_same_training(torch_fp32_reference, run, atol=FP32_ATOL, norm_rtol=1e-3)


# --------------------------------------------------------------------------- several processes
@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")  # 2 ranks each: not next to another 2-rank job
def test_rank_invariance_torch_float64(tmp_path):
    """2 ranks vs 1, odd batch (ranks get 4 and 3 rows), RL loss: exact up to float64 rounding."""
    args = dict(steps=STEPS, num_rows=7, loss="rl", dtype=torch.float64)
    two = torchrun(
        tmp_path,
        "--engine",
        "torch",
        "--dtype",
        "float64",
        "--rows",
        "7",
        "--loss",
        "rl",
        "--micro-batch-size",
        "1",
        "--steps",
        str(STEPS),
    )
    assert two[0]["world_size"] == 2
    one = dc.run_check(EngineConfig(micro_batch_size=1), **args)
    assert_same_training(one, two, atol=FP64_ATOL, norm_rtol=1e-10)


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
@pytest.mark.parametrize("stage, rows, micro, loss", [(2, 8, 2, "sft"), (3, 7, 1, "rl")])
def test_rank_invariance_deepspeed(stage, rows, micro, loss, tmp_path):
    """2 DeepSpeed ranks vs 1 on the same global batch. The (3, 7, 1) case gives the ranks 4 and
    3 micro-batches: the short rank's filler pass keeps ZeRO-3's per-backward collectives paired."""
    two = torchrun(
        tmp_path,
        "--engine",
        "deepspeed",
        "--zero-stage",
        str(stage),
        "--rows",
        str(rows),
        "--micro-batch-size",
        str(micro),
        "--loss",
        loss,
        "--steps",
        str(STEPS),
    )
    assert two[0]["world_size"] == 2
    one = dc.run_check(
        EngineConfig(kind="deepspeed", zero_stage=stage, micro_batch_size=micro), steps=STEPS, num_rows=rows, loss=loss
    )
    assert_same_training(one, two, atol=FP32_ATOL, norm_rtol=1e-3)


def test_stale_extension_build_lock_is_cleared_and_a_live_one_kept(tmp_path, monkeypatch):
    """A run killed while DeepSpeed compiled its comm op leaves torch's `lock` file behind, and the
    next `init_distributed` would wait on it forever (a CI run hung 90 min this way)."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale, live = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock", tmp_path / "other_op" / "lock"
    for lock in (stale, live):
        lock.parent.mkdir(parents=True)
        lock.touch()
    old = time.time() - STALE_BUILD_LOCK_S - 60
    os.utime(stale, (old, old))
    assert clear_stale_extension_locks() == [stale]
    assert not stale.exists() and live.exists()
