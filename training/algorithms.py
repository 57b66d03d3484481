"""RL algorithms as registered combinations of the pure pieces in `training.rl_math`.

An algorithm is data, not code: which advantage estimator, which policy loss, how the per-token
loss is aggregated, where the KL to the reference goes, and whether the batch is refilled after
zero-variance groups are dropped (DAPO's dynamic sampling) or a critic is trained (PPO). The
training loop (`training.rl_loop`) reads these fields and never branches on an algorithm's name.

`rl.algorithm` picks a preset; any RLConfig field set explicitly overrides the preset's value
(`rl.loss_agg_mode: seq_mean_token_mean` on top of `dapo`, say). Defaults follow the papers and
verl's example configs; where they differ, the comment says which one we follow.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from configs.registry import Registry
from configs.schema import RLConfig
from training.rl_math import ADVANTAGE_ESTIMATORS, AGG_MODES, KL_ESTIMATORS, POLICY_LOSSES

__all__ = ["Algorithm", "ALGORITHMS", "resolve_algorithm"]


@dataclass(frozen=True)
class Algorithm:
    advantage_estimator: str  # name in rl_math.ADVANTAGE_ESTIMATORS, or "gae" (token-level, needs the critic)
    policy_loss: str  # rl_math.POLICY_LOSSES
    loss_agg_mode: str  # rl_math.AGG_MODES
    clip_low: float
    clip_high: float
    kl_coef: float  # beta; 0 = no reference model at all
    kl_estimator: str  # rl_math.KL_ESTIMATORS
    kl_placement: str  # "loss" (GRPO) or "reward" (PPO / REINFORCE++: -beta * KL per token in the reward)
    dynamic_sampling: bool  # DAPO: refill the batch with informative groups
    critic: bool = False  # PPO: a value model trained alongside, GAE advantages
    # Numerical bounds (issue 21): not part of any preset, always rl.*'s values (None: off). See rl_math.
    k3_clamp: float | None = 10.0  # per-token k3 KL estimate <= this (verl's low_var_kl clamp)
    clip_ratio_c: float | None = 3.0  # dual-clip: for A < 0 the per-token loss <= -A * this (verl)
    seq_log_ratio_max: float = 10.0  # GSPO's sequence log-ratio <= this (verl)

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0


ALGORITHMS = Registry("RL algorithm")


def _preset(name: str, algorithm: Algorithm) -> None:
    ALGORITHMS.register(name)(lambda: algorithm)


# GRPO (Shao et al. 2024): group-normalized outcome advantage, PPO clip, K3 KL in the loss. Token-level
# aggregation as in verl's and TRL's defaults (the paper's per-sequence mean down-weights long
# multi-turn trajectories).
_preset("grpo", Algorithm("grpo", "ppo_clip", "token_mean", 0.2, 0.2, 0.01, "k3", "loss", False))
# Dr.GRPO (Liu et al. 2025): no std normalization, token sums over a constant budget (no length bias).
_preset("dr_grpo", Algorithm("dr_grpo", "ppo_clip", "seq_mean_token_sum_norm", 0.2, 0.2, 0.01, "k3", "loss", False))
# RLOO (Ahmadian et al. 2024): leave-one-out baseline; KL in the reward as in the paper.
_preset("rloo", Algorithm("rloo", "ppo_clip", "token_mean", 0.2, 0.2, 0.01, "k1", "reward", False))
# REINFORCE++ (Hu 2025): batch-whitened return, k1 KL in the reward (OpenRLHF's default), PPO clip.
_preset("reinforce_pp", Algorithm("reinforce_pp", "ppo_clip", "token_mean", 0.2, 0.2, 0.01, "k1", "reward", False))
_preset(
    "reinforce_pp_baseline",
    Algorithm("reinforce_pp_baseline", "ppo_clip", "token_mean", 0.2, 0.2, 0.01, "k1", "reward", False),
)
# DAPO (Yu et al. 2025): clip-higher 0.28, token-level loss, dynamic sampling, overlong shaping
# (our reward's `overlong` term), and no KL term at all.
_preset("dapo", Algorithm("grpo", "ppo_clip", "token_mean", 0.2, 0.28, 0.0, "k3", "loss", True))
# GSPO (Zheng et al. 2025): sequence-level length-normalized ratio, sequence clipping. The paper's
# ranges are 3e-4 / 4e-4 for its model sizes; our tiny models move further per step (ratios are
# measured in docs/algorithms.md), so a wider band keeps most sequences unclipped.
_preset("gspo", Algorithm("grpo", "gspo", "seq_mean_token_mean", 0.003, 0.004, 0.0, "k3", "loss", False))
# PPO (Schulman et al. 2017; InstructGPT / verl recipe): critic + GAE, k1 KL in the reward.
_preset("ppo", Algorithm("gae", "ppo_clip", "token_mean", 0.2, 0.2, 0.01, "k1", "reward", False, critic=True))

_BOUNDS = ("k3_clamp", "clip_ratio_c", "seq_log_ratio_max")  # None means "off" here, not "the preset's value"
_OVERRIDABLE = [f.name for f in fields(Algorithm) if f.name != "critic" and f.name not in _BOUNDS]


def resolve_algorithm(rl: RLConfig) -> Algorithm:
    """The preset named by `rl.algorithm` with every explicitly set RLConfig field applied on top,
    and the numerical bounds taken from RLConfig as they are."""
    preset = ALGORITHMS.get(rl.algorithm)()
    overrides = {name: getattr(rl, name) for name in _OVERRIDABLE if getattr(rl, name) is not None}
    algorithm = replace(preset, **overrides, **{name: getattr(rl, name) for name in _BOUNDS})
    # The critic follows the advantage estimator: GAE needs values, nothing else uses them.
    algorithm = replace(algorithm, critic=algorithm.advantage_estimator == "gae")
    _check(algorithm, rl.algorithm)
    return algorithm


def _check(algorithm: Algorithm, name: str) -> None:
    for field_name, registry in (
        ("policy_loss", POLICY_LOSSES),
        ("loss_agg_mode", AGG_MODES),
        ("kl_estimator", KL_ESTIMATORS),
    ):
        value = getattr(algorithm, field_name)
        if value not in registry:
            raise ValueError(
                f"rl.{field_name}={value!r} (algorithm {name!r}) is not registered; available: {', '.join(registry.names())}"
            )
    if algorithm.advantage_estimator != "gae" and algorithm.advantage_estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"rl.advantage_estimator={algorithm.advantage_estimator!r} is not registered")
    if algorithm.kl_placement not in ("loss", "reward"):
        raise ValueError(f"rl.kl_placement={algorithm.kl_placement!r}; expected 'loss' or 'reward'")
