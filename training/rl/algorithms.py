"""RL algorithms as registered combinations of the pure pieces in `training.rl.math`.

An algorithm is data, not code: which advantage estimator, which policy loss, how the per-token
loss is aggregated, where the KL to the reference goes, and whether the batch is refilled after
zero-variance groups are dropped (DAPO's dynamic sampling) or a critic is trained (PPO). The
training loop (`training.rl.loop`) reads these fields and never branches on an algorithm's name.

`rl.algorithm` picks a preset; any RLConfig field set explicitly overrides the preset's value
(`rl.loss_agg_mode: seq_mean_token_mean` on top of `dapo`, say). Defaults follow the papers and
verl's example configs; where they differ, the comment says which one we follow.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from configs.registry import Registry
from configs.schema import RLConfig
from training.rl.math import ADVANTAGE_ESTIMATORS, AGG_MODES, KL_ESTIMATORS, POLICY_LOSSES, TOKEN_ADVANTAGE_ESTIMATORS

__all__ = ["Algorithm", "ALGORITHMS", "resolve_algorithm"]


@dataclass(frozen=True)
class Algorithm:
    """Everything an RL step reads about how to turn rewards into a loss, resolved once from the
    config (`resolve_algorithm`): the preset's choices, the user's overrides, and the step-level
    settings of `rl` that shape the batch and the update."""

    advantage_estimator: str  # rl_math.ADVANTAGE_ESTIMATORS (sequence level) or TOKEN_ADVANTAGE_ESTIMATORS (critic)
    policy_loss: str  # rl_math.POLICY_LOSSES
    loss_agg_mode: str  # rl_math.AGG_MODES
    clip_low: float
    clip_high: float
    kl_coef: float  # beta; 0 = no reference model at all
    kl_estimator: str  # rl_math.KL_ESTIMATORS
    kl_placement: str  # "loss" (GRPO) or "reward" (PPO / REINFORCE++: -beta * KL per token in the reward)
    dynamic_sampling: bool  # DAPO: refill the batch with informative groups
    critic: bool = False  # a value model trained alongside: set when the estimator is token level (GAE)
    # Not part of any preset: always rl.*'s values (None: off).
    # Numerical bounds (issue 21; see rl_math).
    k3_clamp: float | None = 10.0  # per-token k3 KL estimate <= this (verl's low_var_kl clamp)
    clip_ratio_c: float | None = 3.0  # dual-clip: for A < 0 the per-token loss <= -A * this (verl)
    seq_log_ratio_max: float = 10.0  # GSPO's sequence log-ratio <= this (verl)
    # The batch and the update.
    drop_zero_variance_groups: bool = True  # rows whose advantage is 0 everywhere leave the update
    group_filter: str = "reward"  # what must vary within a group for it to train: "reward" or "outcome"
    tis_cap: float | None = None  # truncated importance weights on the engine/trainer mismatch
    minibatches: int = 2  # optimizer steps per batch
    gamma: float = 1.0  # GAE discount (token-level estimators)
    lam: float = 0.95  # GAE lambda

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0


ALGORITHMS = Registry("RL algorithm")


def _preset(name: str, **choices) -> None:
    algorithm = Algorithm(**choices)
    ALGORITHMS.register(name)(lambda: algorithm)


# The PPO clip range of every preset but GSPO's.
_CLIP = dict(policy_loss="ppo_clip", clip_low=0.2, clip_high=0.2)

# GRPO (Shao et al. 2024): group-normalized outcome advantage, PPO clip, K3 KL in the loss. Token-level
# aggregation as in verl's and TRL's defaults (the paper's per-sequence mean down-weights long
# multi-turn trajectories).
_preset(
    "grpo",
    advantage_estimator="grpo",
    **_CLIP,
    loss_agg_mode="token_mean",
    kl_coef=0.01,
    kl_estimator="k3",
    kl_placement="loss",
    dynamic_sampling=False,
)
# Dr.GRPO (Liu et al. 2025): no std normalization, token sums over a constant budget (no length bias).
_preset(
    "dr_grpo",
    advantage_estimator="dr_grpo",
    **_CLIP,
    loss_agg_mode="seq_mean_token_sum_norm",
    kl_coef=0.01,
    kl_estimator="k3",
    kl_placement="loss",
    dynamic_sampling=False,
)
# RLOO (Ahmadian et al. 2024): leave-one-out baseline; KL in the reward as in the paper.
_preset(
    "rloo",
    advantage_estimator="rloo",
    **_CLIP,
    loss_agg_mode="token_mean",
    kl_coef=0.01,
    kl_estimator="k1",
    kl_placement="reward",
    dynamic_sampling=False,
)
# REINFORCE++ (Hu 2025): batch-whitened return, k1 KL in the reward (OpenRLHF's default), PPO clip.
for _name in ("reinforce_pp", "reinforce_pp_baseline"):
    _preset(
        _name,
        advantage_estimator=_name,
        **_CLIP,
        loss_agg_mode="token_mean",
        kl_coef=0.01,
        kl_estimator="k1",
        kl_placement="reward",
        dynamic_sampling=False,
    )
# DAPO (Yu et al. 2025): clip-higher 0.28, token-level loss, dynamic sampling, overlong shaping
# (our reward's `overlong` term), and no KL term at all.
_preset(
    "dapo",
    advantage_estimator="grpo",
    policy_loss="ppo_clip",
    clip_low=0.2,
    clip_high=0.28,
    loss_agg_mode="token_mean",
    kl_coef=0.0,
    kl_estimator="k3",
    kl_placement="loss",
    dynamic_sampling=True,
)
# GSPO (Zheng et al. 2025): sequence-level length-normalized ratio, sequence clipping. The paper's
# ranges are 3e-4 / 4e-4 for its model sizes; our tiny models move further per step (ratios are
# measured in docs/algorithms.md), so a wider band keeps most sequences unclipped.
_preset(
    "gspo",
    advantage_estimator="grpo",
    policy_loss="gspo",
    clip_low=0.003,
    clip_high=0.004,
    loss_agg_mode="seq_mean_token_mean",
    kl_coef=0.0,
    kl_estimator="k3",
    kl_placement="loss",
    dynamic_sampling=False,
)
# PPO (Schulman et al. 2017; InstructGPT / verl recipe): critic + GAE, k1 KL in the reward.
_preset(
    "ppo",
    advantage_estimator="gae",
    **_CLIP,
    loss_agg_mode="token_mean",
    kl_coef=0.01,
    kl_estimator="k1",
    kl_placement="reward",
    dynamic_sampling=False,
)

_PRESET_FIELDS = (
    "advantage_estimator",
    "policy_loss",
    "loss_agg_mode",
    "clip_low",
    "clip_high",
    "kl_coef",
    "kl_estimator",
    "kl_placement",
    "dynamic_sampling",
)
# Taken from rl.* as they are (None means "off" for the bounds, not "the preset's value").
_FROM_RL = (
    "k3_clamp",
    "clip_ratio_c",
    "seq_log_ratio_max",
    "drop_zero_variance_groups",
    "group_filter",
    "tis_cap",
    "minibatches",
)


def resolve_algorithm(rl: RLConfig) -> Algorithm:
    """The preset named by `rl.algorithm` with every explicitly set RLConfig field applied on top,
    and the step-level settings (bounds, filters, GAE's gamma and lambda) taken from RLConfig."""
    preset = ALGORITHMS.get(rl.algorithm)()
    overrides = {name: getattr(rl, name) for name in _PRESET_FIELDS if getattr(rl, name) is not None}
    algorithm = replace(
        preset,
        **overrides,
        **{name: getattr(rl, name) for name in _FROM_RL},
        gamma=rl.ppo.gamma,
        lam=rl.ppo.lam,
    )
    # The critic follows the advantage estimator: a token-level estimator needs values, nothing else uses them.
    algorithm = replace(algorithm, critic=algorithm.advantage_estimator in TOKEN_ADVANTAGE_ESTIMATORS)
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
    estimators = ADVANTAGE_ESTIMATORS.names() + TOKEN_ADVANTAGE_ESTIMATORS.names()
    if algorithm.advantage_estimator not in estimators:
        raise ValueError(
            f"rl.advantage_estimator={algorithm.advantage_estimator!r} (algorithm {name!r}) is not registered; "
            f"available: {', '.join(sorted(estimators))}"
        )
    if algorithm.kl_placement not in ("loss", "reward"):
        raise ValueError(f"rl.kl_placement={algorithm.kl_placement!r}; expected 'loss' or 'reward'")
