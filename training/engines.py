"""Training engines: one interface over plain torch and DeepSpeed, used by SFT and RL alike.

The contract every engine keeps, so loss code never needs to know how it is run:

* Losses reach `backward` already normalized by GLOBAL counts (all micro-batches of all ranks,
  see `rl_math.agg_loss(num_tokens=...)`), so the gradient an optimizer step applies is
  d(sum over micro-batches and ranks of loss)/dθ. Engines therefore neither divide by the
  number of accumulation steps nor average over ranks (DeepSpeed's averaging is undone).
* `step` clips to `grad_clip`, steps AdamW and the LambdaLR schedule, zeroes gradients and
  reports the pre-clip global gradient norm and the learning rate that step used.
* Data-parallel ranks see strided shards of each minibatch (`shard`); `accumulate_step` is the
  one loop that turns a shard into micro-batches, global counts and one optimizer step.

DeepSpeed is imported lazily, inside its engine, so SFT on the plain torch engine (the CPU
default) never pays for its import.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from configs.schema import EngineConfig

log = logging.getLogger(__name__)

LossFn = Callable[[list, Tensor], tuple[Tensor, dict[str, float]]]  # (chunk, global_counts) -> (loss, metrics)
CountFn = Callable[[list], Tensor]  # chunk -> (k,) counts, e.g. (num_policy_tokens, num_seqs)

TORCH_STATE_FILE = "engine.pt"
DEEPSPEED_TAG = "engine"  # DeepSpeed checkpoint sub-folder; fixed, so load_state needs only the path


# --------------------------------------------------------------------------- config
def check_engine_config(cfg: EngineConfig) -> None:
    """Reject combinations that would otherwise be silently ignored by one of the engines."""
    if cfg.kind == "torch" and cfg.zero_stage != 0:
        raise ValueError(f"engine.zero_stage={cfg.zero_stage} needs engine.kind='deepspeed' (got kind='torch')")
    if cfg.kind == "torch" and cfg.offload_optimizer:
        raise ValueError("engine.offload_optimizer=True needs engine.kind='deepspeed' (got kind='torch')")
    if cfg.offload_optimizer and cfg.zero_stage == 0:
        raise ValueError(
            "engine.offload_optimizer=True needs engine.zero_stage >= 1 (got zero_stage=0): "
            "optimizer state is only offloaded by a ZeRO optimizer"
        )


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """The precision to train in, "fp32" or "bf16". "auto" picks bf16 only on CUDA devices that
    support it: on most CPUs bf16 matmuls are emulated and slower than fp32."""
    device_type = torch.device(device).type
    if precision == "auto":
        return "bf16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    if precision == "bf16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("engine.precision='bf16' but this CUDA device does not support bf16; use 'auto' or 'fp32'")
    return precision


def deepspeed_config(
    cfg: EngineConfig,
    *,
    micro_batch_size: int,
    grad_accum: int,
    grad_clip: float,
    device: torch.device | str = "cpu",
    world_size: int = 1,
) -> dict[str, Any]:
    """The DeepSpeed config dict for `cfg` (pure; what the cluster runs, readable in one place).

    Accumulation boundaries are ours, not DeepSpeed's: `managed_gradient_accumulation: false`
    makes every `engine.step()` the boundary, whatever the number of backward calls before it,
    so `train_micro_batch_size_per_gpu` and `gradient_accumulation_steps` only feed DeepSpeed's
    sample counters (and its batch-size consistency check).
    """
    check_engine_config(cfg)
    bf16 = resolve_precision(cfg.precision, device) == "bf16"
    if bf16 and cfg.zero_stage == 0:
        # Measured with DeepSpeed 0.19.8: without ZeRO, bf16 wraps our AdamW in
        # FP16_UnfusedOptimizer, whose set-up takes one zero-gradient AdamW step; Adam's bias
        # correction is then a step off and the first real update is 0.74x what it should be.
        raise ValueError(
            f"engine.precision={cfg.precision!r} resolves to bf16, which needs engine.zero_stage >= 1 "
            "on DeepSpeed (got zero_stage=0; ZeRO-1 on one rank costs nothing extra)"
        )
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.device(device).type == "cuda"}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro_batch_size * grad_accum * world_size,
        "managed_gradient_accumulation": False,
        # Without ZeRO, DeepSpeed clips inside step() but never reports the norm; the engine
        # then clips itself (in an optimizer pre-step hook) and this stays 0 (= off).
        "gradient_clipping": grad_clip if cfg.zero_stage > 0 else 0.0,
        "zero_optimization": zero,
        # bf16 weights and activations, fp32 master weights in the optimizer, and fp32 gradient
        # accumulation so many small micro-batches do not lose the low bits of their sum.
        "bf16": {"enabled": bf16},
        # We pass torch's AdamW: DeepSpeedCPUAdam needs a compiled op; FusedAdam needs CUDA.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,  # progress is logged by the caller's metrics, not here
        "wall_clock_breakdown": False,
    }
    if bf16:
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    return config


# --------------------------------------------------------------------------- processes
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STALE_BUILD_LOCK_S = 600.0  # DeepSpeed's shm op compiles in ~1 min on 2 cores


def clear_stale_extension_locks(max_age_s: float = STALE_BUILD_LOCK_S) -> list[Path]:
    """Remove torch C++-extension build locks left by a process killed mid-compile.

    DeepSpeed JIT-compiles its shared-memory comm op at `init_distributed`; torch guards the build
    with a bare `lock` file and waits forever while it exists. A run killed during that minute
    leaves the lock behind and every later DeepSpeed start hangs, so a lock older than any real
    build is removed (with a warning naming it)."""
    from torch.utils.cpp_extension import get_default_build_root

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    now, removed = time.time(), []
    for lock in [*root.glob("*/lock"), *root.glob("*/*/lock")]:
        try:
            if now - lock.stat().st_mtime > max_age_s:
                lock.unlink()
                removed.append(lock)
                log.warning("removed stale torch extension build lock %s (older than %.0f s)", lock, max_age_s)
        except FileNotFoundError:  # another process finished or removed it meanwhile
            continue
    return removed


# a process group's address and place
DIST_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
)


def ensure_process_env() -> None:
    """torchrun sets RANK/WORLD_SIZE/MASTER_*; a plain `python` process becomes a world of one
    on a free local port, so DeepSpeed (which always wants a process group) starts anyway."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _dist_rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def model_device(model: torch.nn.Module) -> torch.device:
    """Where `model` (or an engine's `module` wrapping it) keeps its weights: its inputs go there."""
    return next(model.parameters()).device


def resolve_device(device: torch.device | str) -> torch.device:
    """The configured `device` as a torch.device. CUDA asked for on a machine without it is an
    error naming the setting, never a silent CPU run."""
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={str(device)!r} but CUDA is not available here (torch {torch.__version__}, "
            "torch.cuda.is_available() is False): set `device: cpu` or run on a GPU node"
        )
    return resolved


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """HF activation checkpointing, non-reentrant (works with frozen LoRA bases and ZeRO). Only
    active in train mode: the rollout engine samples in eval mode with its KV cache, and the
    trainer's own forwards pass use_cache=False."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


# --------------------------------------------------------------------------- engines
class TrainEngine(ABC):
    """One optimizer over one model, possibly data-parallel over `world_size` processes.

    `module` is what training forwards are called on; it may wrap the model. DeepSpeed's engine
    hooks its ZeRO pre-backward work onto the outputs of its own forward: with ZeRO-3, forwards
    through the bare model trained silently wrong here (weights 0.04 off after 3 steps), so
    `module` is the DeepSpeed engine itself. `model` is the bare model for everything else
    (generate, save_pretrained). Methods are collective: call them on every rank.
    """

    module: torch.nn.Module
    model: torch.nn.Module
    rank: int
    world_size: int
    device: torch.device

    @abstractmethod
    def backward(self, loss: Tensor) -> None:
        """Accumulate d(loss)/dθ, loss being normalized by global counts (see module docstring)."""

    @abstractmethod
    def step(self) -> dict[str, float]:
        """Clip, optimizer step, scheduler step, zero grads -> {"grad_norm": pre-clip, "lr": used}."""

    @abstractmethod
    def save_state(self, path: str | Path) -> None:
        """Weights, optimizer, scheduler and step counter into directory `path`."""

    @abstractmethod
    def load_state(self, path: str | Path) -> None:
        """Restore what save_state wrote, so training resumes bit for bit."""

    @abstractmethod
    def model_state_dict(self) -> dict[str, Tensor]:
        """Full (un-partitioned) weights as detached copies, identical on every rank."""

    @property
    @abstractmethod
    def global_step(self) -> int:
        """Optimizer steps taken (restored by load_state)."""

    def finish(self) -> torch.nn.Module:
        """After training: the bare model holding whole weights on every rank, to save or sample
        from. Collective. Only ZeRO-3 has anything to do (it partitioned the weights)."""
        return self.model

    def all_reduce_sum(self, t: Tensor) -> Tensor:
        """Sum of `t` over ranks, as a new tensor on t's device; identity for a world of one."""
        if self.world_size == 1:
            return t
        out = t.detach().to(self.device, copy=True)
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.to(t.device)

    def train(self) -> None:
        self.module.train()

    def eval(self) -> None:
        self.module.eval()


class _Autocast(torch.nn.Module):
    """Runs the model's forward under bf16 autocast; the weights (and AdamW) stay fp32."""

    def __init__(self, model: torch.nn.Module, device_type: str) -> None:
        super().__init__()
        self.model = model
        self.device_type = device_type

    def forward(self, *args, **kwargs):
        with torch.autocast(device_type=self.device_type, dtype=torch.bfloat16):
            return self.model(*args, **kwargs)

    def get_output_embeddings(self) -> torch.nn.Module:
        # The chunked log-prob pass (training/sequences.py) applies the head itself, under the
        # autocast state the head's own call saw.
        return self.model.get_output_embeddings()


class TorchEngine(TrainEngine):
    """Plain torch AdamW. Under torchrun (WORLD_SIZE > 1) gradients are SUMMED over ranks in
    step(), which is exactly the contract's gradient, with nothing to undo."""

    def __init__(
        self,
        model: torch.nn.Module,
        params: list[torch.nn.Parameter],
        *,
        precision: str,
        lr: float,
        betas: tuple[float, float],
        weight_decay: float,
        grad_clip: float,
        lr_lambda: Callable[[int], float],
    ) -> None:
        self.model, self.params, self.grad_clip = model, params, grad_clip
        self.device = model_device(model)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
            dist.init_process_group(_backend(self.device))
        self.rank, self.world_size = _dist_rank_world()
        if self.world_size > 1:  # identical start on every rank, whatever each rank's seed did
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, src=0)
        self.module = _Autocast(model, self.device.type) if precision == "bf16" else model
        self.optimizer = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda)
        self._steps = 0

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def step(self) -> dict[str, float]:
        lr = self.optimizer.param_groups[0]["lr"]
        if self.world_size > 1:
            self._sum_grads_over_ranks()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._steps += 1
        return {"grad_norm": float(grad_norm), "lr": lr}

    def _sum_grads_over_ranks(self) -> None:
        # One flat buffer, one collective. A parameter no loss touched on some rank has grad None
        # there: it joins as zeros, or ranks would disagree on the buffer's size.
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for p, g in zip(self.params, flat.split([q.numel() for q in self.params])):
            p.grad = g.view_as(p).clone()

    @property
    def global_step(self) -> int:
        return self._steps

    def save_state(self, path: str | Path) -> None:
        path = Path(path)
        if self.rank == 0:  # ranks hold identical replicas
            path.mkdir(parents=True, exist_ok=True)
            state = {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "steps": self._steps,
            }
            torch.save(state, path / TORCH_STATE_FILE)
        if self.world_size > 1:
            dist.barrier()

    def load_state(self, path: str | Path) -> None:
        state = torch.load(Path(path) / TORCH_STATE_FILE, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._steps = state["steps"]

    def model_state_dict(self) -> dict[str, Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def _drop_stale_deepspeed_groups() -> None:
    """DeepSpeed caches its world group across engines in a process. Another library sharing the
    process group (vLLM's in-process engine, which builds its groups on it) can leave that cached
    group unregistered; DeepSpeed then fails with "Group ... is not registered". Drop the stale
    references so DeepSpeed creates fresh groups."""
    from deepspeed.utils import groups

    cached = groups._WORLD_GROUP
    if cached is not None and cached not in torch.distributed.distributed_c10d._world.pg_group_ranks:
        groups._release_process_group_references(None)


class DeepSpeedTrainEngine(TrainEngine):
    """DeepSpeed ZeRO 0-3 with torch's AdamW and LambdaLR handed over to it.

    DeepSpeed averages gradients over data-parallel ranks; `backward` multiplies the loss by
    world_size to undo that, and passes scale_wrt_gas=False so nothing is divided by the number
    of accumulation steps. With managed_gradient_accumulation off, ZeRO-2/3 still reduce
    gradients inside every backward, so all ranks must call backward equally often
    (`accumulate_step` guarantees it).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        params: list[torch.nn.Parameter],
        cfg: EngineConfig,
        *,
        lr: float,
        betas: tuple[float, float],
        weight_decay: float,
        grad_clip: float,
        lr_lambda: Callable[[int], float],
    ) -> None:
        import deepspeed  # lazy: heavy, and only this engine needs it
        from deepspeed.accelerator import get_accelerator

        # DeepSpeed moves the model to its accelerator; on CPU its default backend is oneCCL,
        # which is not installed, so gloo.
        device = torch.device(get_accelerator().device_name())
        ensure_process_env()
        clear_stale_extension_locks()
        deepspeed.init_distributed(dist_backend="gloo" if device.type == "cpu" else None)
        _drop_stale_deepspeed_groups()
        _, world_size = _dist_rank_world()
        config = deepspeed_config(
            cfg,
            micro_batch_size=cfg.micro_batch_size or 1,
            grad_accum=1,
            grad_clip=grad_clip,
            device=device,
            world_size=world_size,
        )
        optimizer = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
        self._own_clip = config["gradient_clipping"] == 0.0  # see deepspeed_config
        self._last_grad_norm = float("nan")
        if self._own_clip:
            optimizer.register_step_pre_hook(lambda *_: self._clip(params, grad_clip))
        self.ds, _, _, _ = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            config=config,
            dist_init_required=False,
            # a callable, so the schedule wraps whichever optimizer DeepSpeed ends up stepping
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda),
        )
        self.module, self.model = self.ds, self.ds.module
        self.rank, self.world_size = _dist_rank_world()
        self.device = torch.device(self.ds.device)
        self.zero_stage = cfg.zero_stage

    def _clip(self, params: list[torch.nn.Parameter], grad_clip: float) -> None:
        # Runs after DeepSpeed's all-reduce, right before AdamW: grads are global here.
        self._last_grad_norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip))

    def backward(self, loss: Tensor) -> None:
        self.ds.backward(loss * self.world_size, scale_wrt_gas=False)

    def step(self) -> dict[str, float]:
        lr = self.ds.get_lr()[0]
        self.ds.step()
        grad_norm = self._last_grad_norm if self._own_clip else float(self.ds.get_global_grad_norm())
        return {"grad_norm": grad_norm, "lr": lr}

    @property
    def global_step(self) -> int:
        return self.ds.global_steps

    def save_state(self, path: str | Path) -> None:
        # Every rank writes its ZeRO shard of the optimizer state; rank 0 also the weights.
        self.ds.save_checkpoint(str(path), tag=DEEPSPEED_TAG)

    def load_state(self, path: str | Path) -> None:
        load_path, _ = self.ds.load_checkpoint(
            str(path), tag=DEEPSPEED_TAG, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if load_path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint '{DEEPSPEED_TAG}' under {path}")

    def finish(self) -> torch.nn.Module:
        if self.zero_stage < 3:
            return self.model
        # Gather the shards, release DeepSpeed's hooks on the model, then give every parameter its
        # whole tensor back: the model is a plain module again (save_pretrained, generate).
        state = self.model_state_dict()
        self.ds.destroy()
        for name, tensor in self.model.state_dict(keep_vars=True).items():
            tensor.data = state[name]
        return self.model

    def model_state_dict(self) -> dict[str, Tensor]:
        if self.zero_stage < 3:
            return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        import deepspeed

        # ZeRO-3 keeps 1/world of each weight per rank: gather, copy, release.
        with deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None):
            return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def build_engine(
    model: torch.nn.Module,
    cfg: EngineConfig,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    weight_decay: float = 0.0,
    grad_clip: float,
    lr_lambda: Callable[[int], float] | None = None,
    params: Sequence[torch.nn.Parameter] | None = None,
    device: torch.device | str | None = None,
    gradient_checkpointing: bool = False,
) -> TrainEngine:
    """AdamW + LambdaLR(lr_lambda, default constant 1) over `params` (default: the model's
    parameters with requires_grad, e.g. only LoRA adapters), run by the engine `cfg.kind` names.
    `device`: where the model trains (moved there first; None: where it is). An engine that ends
    up training elsewhere (DeepSpeed picks its accelerator itself) is an error, not a silent CPU
    run. `gradient_checkpointing`: `model.gradient_checkpointing` (enable_gradient_checkpointing)."""
    check_engine_config(cfg)
    if device is not None:
        model.to(resolve_device(device))
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    engine = _build_engine(
        model,
        cfg,
        lr=lr,
        betas=betas,
        weight_decay=weight_decay,
        grad_clip=grad_clip,
        lr_lambda=lr_lambda,
        params=params,
    )
    if device is not None and engine.device.type != resolve_device(device).type:
        raise ValueError(f"device={str(device)!r} but the {cfg.kind} engine trains on {engine.device}")
    return engine


def _build_engine(
    model: torch.nn.Module,
    cfg: EngineConfig,
    *,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    grad_clip: float,
    lr_lambda: Callable[[int], float] | None,
    params: Sequence[torch.nn.Parameter] | None,
) -> TrainEngine:
    params = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    if not params:
        raise ValueError("no trainable parameters (none has requires_grad=True)")
    lr_lambda = lr_lambda or (lambda _step: 1.0)
    kwargs = dict(lr=lr, betas=betas, weight_decay=weight_decay, grad_clip=grad_clip, lr_lambda=lr_lambda)
    if cfg.kind == "deepspeed":
        return DeepSpeedTrainEngine(model, params, cfg, **kwargs)
    return TorchEngine(model, params, precision=resolve_precision(cfg.precision, model_device(model)), **kwargs)


# --------------------------------------------------------------------------- data-parallel steps
def shard(rows: list, rank: int, world_size: int) -> list:
    """This rank's rows of a global minibatch: STRIDED, rows[rank::world_size]. Shard sizes differ
    by at most one, and a minibatch ordered by length (or by group) spreads evenly over ranks."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    return rows[rank::world_size]


def micro_batches(
    rows: list,
    micro_batch_size: int | None,
    *,
    max_tokens: int | None = None,
    shape: Callable[[Any], tuple[int, int]] | None = None,
) -> list[list]:
    """The rows of one forward/backward each.

    Without `max_tokens`: consecutive chunks of `micro_batch_size` rows (the last may be shorter);
    None: one chunk. With `max_tokens` (and `shape(row)` = its prompt and completion lengths): the
    rows sorted by length, then cut so that each chunk's padded size, rows x (longest prompt +
    longest completion) as `collate` pads it, stays within `max_tokens` (and within
    `micro_batch_size` rows if set); a row over the budget on its own is a chunk alone. Sorted
    chunks are mostly real tokens: an RL batch of short answers with a few long tool episodes is
    otherwise ~4x padding at `tiny` (verl's dynamic batch size does the same)."""
    if micro_batch_size is not None and micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if max_tokens is None:
        if micro_batch_size is None:
            return [rows] if rows else []
        return [rows[i : i + micro_batch_size] for i in range(0, len(rows), micro_batch_size)]
    if max_tokens < 1 or shape is None:
        raise ValueError(f"max_tokens must be >= 1 and come with a shape function, got max_tokens={max_tokens}")
    shapes = [shape(row) for row in rows]
    order = sorted(range(len(rows)), key=lambda i: (sum(shapes[i]), i))
    chunks: list[list] = []
    chunk: list[int] = []
    widest = (0, 0)
    for i in order:
        grown = (max(widest[0], shapes[i][0]), max(widest[1], shapes[i][1]))
        full = micro_batch_size is not None and len(chunk) >= micro_batch_size
        if chunk and (full or (len(chunk) + 1) * sum(grown) > max_tokens):
            chunks.append([rows[j] for j in chunk])
            chunk, grown = [], shapes[i]
        chunk.append(i)
        widest = grown
    if chunk:
        chunks.append([rows[j] for j in chunk])
    return chunks


def _per_rank(engine: TrainEngine, values: list[int]) -> list[list[int]]:
    """Each of `values` as seen on every rank, [value][rank], with only all_reduce_sum (each
    rank fills its own column of zeros, then the sum)."""
    table = torch.zeros(len(values), engine.world_size, dtype=torch.float64)
    table[:, engine.rank] = torch.tensor(values, dtype=torch.float64)
    return [[int(v) for v in row] for row in engine.all_reduce_sum(table).tolist()]


@dataclass(frozen=True)
class Auxiliary:
    """Rows trained by a second loss in the same optimizer step as the main one (the hindsight
    examples' NLL beside the RL loss). `metrics`: the names its loss_fn reports, summed over
    micro-batches and ranks (normalized by the global counts, as `summed` metrics are)."""

    rows: list
    loss_fn: LossFn
    count_fn: CountFn
    metrics: tuple[str, ...]


def accumulate_step(
    engine: TrainEngine,
    rows: list,
    loss_fn: LossFn,
    count_fn: CountFn,
    *,
    micro_batch_size: int | None,
    max_tokens: int | None = None,
    shape: Callable[[Any], tuple[int, int]] | None = None,
    summed: Sequence[str] = (),
    auxiliary: Auxiliary | None = None,
) -> dict[str, float]:
    """ONE optimizer step over `rows`, this rank's share of a minibatch.

    1. global counts: sum of count_fn over this rank's micro-batches, summed over ranks;
    2. per micro-batch: loss, metrics = loss_fn(chunk, global_counts); engine.backward(loss);
    3. engine.step().
    Returns loss_fn's metrics averaged over the whole minibatch (all ranks), each micro-batch
    weighted by its rows; "loss" = the sum of the micro-batch losses over all ranks, which is
    exactly the minibatch loss whatever the split, and so are the metrics named in `summed` (parts
    of the loss, normalized by the global counts like it); plus the engine's grad_norm and lr. Every
    rank's loss_fn must report the same metric names (they are summed in one collective).

    `auxiliary`: other rows with their own loss, added to the same step (their gradients join the
    main loss's before the one update); split into micro-batches the same way, normalized by their
    own global counts, their metrics summed. Every rank passes one, or none does.
    """
    chunks = micro_batches(rows, micro_batch_size, max_tokens=max_tokens, shape=shape)
    aux_chunks = (
        micro_batches(auxiliary.rows, micro_batch_size, max_tokens=max_tokens, shape=shape) if auxiliary else []
    )
    rows_per_rank, chunks_per_rank, aux_per_rank = _per_rank(engine, [len(rows), len(chunks), len(aux_chunks)])
    if min(rows_per_rank) == 0:
        raise ValueError(
            f"a rank has no rows (rows per rank: {rows_per_rank}); the minibatch must have at "
            f"least world_size={engine.world_size} rows"
        )
    # ZeRO-2/3 reduce gradients inside every backward, so every rank must run as many backward
    # passes as the busiest one (else gloo aborts: "Is there a distributed collective mismatch
    # in your code?"); the others add filler passes that contribute zero gradient.
    num_passes = max(chunks_per_rank)

    # 1. global counts
    global_counts = engine.all_reduce_sum(torch.stack([count_fn(chunk) for chunk in chunks]).sum(0))
    if auxiliary is not None:
        aux_counts = engine.all_reduce_sum(
            torch.stack([auxiliary.count_fn(chunk) for chunk in aux_chunks]).sum(0)
            if aux_chunks
            else auxiliary.count_fn([])
        )

    # 2. forward/backward per micro-batch
    total_loss, weighted = 0.0, {}
    for i in range(num_passes):
        if i >= len(chunks):  # filler pass: a real forward/backward, times zero
            loss, _ = loss_fn(chunks[0][:1], global_counts)
            engine.backward(loss * 0.0)
            continue
        loss, metrics = loss_fn(chunks[i], global_counts)
        engine.backward(loss)
        total_loss += float(loss.detach())
        for name, value in metrics.items():
            weighted[name] = weighted.get(name, 0.0) + float(value) * (1 if name in summed else len(chunks[i]))
    if auxiliary is not None:
        weighted |= {name: 0.0 for name in auxiliary.metrics}  # the same names on every rank
        for i in range(max(aux_per_rank)):
            if i >= len(aux_chunks):  # filler: as many backward passes as the busiest rank (ZeRO)
                loss, _ = loss_fn(chunks[0][:1], global_counts)
                engine.backward(loss * 0.0)
                continue
            loss, metrics = auxiliary.loss_fn(aux_chunks[i], aux_counts)
            engine.backward(loss)
            total_loss += float(loss.detach())
            for name, value in metrics.items():
                weighted[name] += float(value)

    # 3. update, and metrics over the whole minibatch
    out = engine.step()
    names = sorted(weighted)
    sums = engine.all_reduce_sum(torch.tensor([weighted[n] for n in names] + [total_loss], dtype=torch.float64))
    num_rows = sum(rows_per_rank)
    kept_whole = set(summed) | set(auxiliary.metrics if auxiliary else ())
    result = {name: float(sums[j]) / (1 if name in kept_whole else num_rows) for j, name in enumerate(names)}
    return {**result, "loss": float(sums[-1]), **out}
