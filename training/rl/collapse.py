"""Collapse early warnings for an RL round, read from its per-step metric history.

RAGEN (Wang et al. 2025) names the failure the "Echo Trap": the policy settles on a few
trajectories, so within-group reward spread and token entropy fall and groups fill with identical
rollouts *before* the reward itself drops. GRPO learns only from within-group differences, so once
the spread is gone nothing pulls the policy back. Watching those signals gives a warning while the
reward still looks healthy; `CollapseReport.reward_drop_step` records when the reward did fall, to
show that the warning came first.

The signals (`SIGNALS`), and why each threshold is relative to the round's own first steps or absolute:

    actor/entropy               relative: value < entropy_drop × baseline. Entropy's level depends on
                                the model, vocabulary and temperature; only its fall means anything.

  The next three are measured on UNSOLVED groups only (some outcome below 1; training/rl/loop.py
  `unsolved_group_metrics`): a correct, confident policy repeats itself on tasks it has mastered,
  which is success, not collapse. Measured on all groups, they fired on every healthy tiny run.

    reward/group_std_unsolved   relative: value < reward_std_drop × baseline. The spread a round starts
                                with depends on its tasks and verifier (binary vs partial credit).
    rollout/stuck_frac          relative, additive: value > baseline + stuck_rise. The share of groups
                                whose every sample failed alike; a rise from the round's level is not noise.
    actor/grad_norm             absolute and immediate: value > grad_norm_max (pre-clip norm). An update
                                that blows up does its damage in the round's first steps, inside any
                                baseline, so a relative spike cannot see it (measured: docs/algorithms.md).
    rollout/repeat_rate_failed absolute: value > repeat_rate_max. A share of identical trajectories
                                is comparable across models: an unsolved group echoing one is the trap.
    actor/kl_ref                absolute: value > kl_max. Per-token KL to the reference is in nats
    actor/approx_kl             whatever the model; the same bound applies to the approximate KL to
                                the behaviour policy (the only KL when beta = 0, no reference).
    actor/clip_frac             absolute: value > clip_frac_max. A fraction of clipped tokens.

Rules:
  * A baseline is the mean of the first `baseline_steps` finite values of a metric (steps missing the
    metric do not count). Relative signals are judged only on the steps after their baseline.
  * A signal fires at the step that completes a run of `window` consecutive recorded steps past its
    threshold; the warning reports that step and the value there. Steps that did not record the
    metric are skipped: they neither count towards nor break a run, and are never read as 0.
  * A non-finite (NaN / inf) entropy, KL or grad norm fires at once (window 1, even inside the
    baseline): the update has already diverged. Non-finite values of other metrics are skipped.
  * A relative signal cannot fire when its metric has fewer than baseline_steps + window recorded
    steps, nor when a multiplicative baseline is ~0 (a reward-std baseline of 0 means the round never
    had a learning signal: a fact about the round, not a collapse). Both are reported as `notes`.

Pure Python, no torch / dagster / mlflow: the `rl_round` asset check and the docs both read it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from configs.schema import CollapseConfig

__all__ = [
    "SIGNALS",
    "Signal",
    "CollapseWarning",
    "CollapseReport",
    "detect_collapse",
    "reward_drop_step",
    "signal_series",
]

ENTROPY = "actor/entropy"
REWARD_GROUP_STD = "reward/group_std_unsolved"
STUCK_FRAC = "rollout/stuck_frac"
REPEAT_RATE = "rollout/repeat_rate_failed"
KL_REF = "actor/kl_ref"
APPROX_KL = "actor/approx_kl"
CLIP_FRAC = "actor/clip_frac"
GRAD_NORM = "actor/grad_norm"
REWARD = "reward/total/mean"

_NEAR_ZERO = 1e-6  # a multiplicative baseline at or below this is "never had any": no relative threshold


@dataclass(frozen=True)
class _Rule:
    threshold: Callable[[float | None, float], float]  # (baseline, config value) -> threshold
    past: Callable[[float, float], bool]  # (value, threshold) -> past it?
    symbol: str
    relative: bool
    multiplicative: bool = False  # a ~0 baseline makes the threshold meaningless


_RULES = {
    "below_fraction": _Rule(lambda b, t: b * t, operator.lt, "<", relative=True, multiplicative=True),
    "above_multiple": _Rule(lambda b, t: b * t, operator.gt, ">", relative=True, multiplicative=True),
    "above_plus": _Rule(lambda b, t: b + t, operator.gt, ">", relative=True),
    "above": _Rule(lambda b, t: t, operator.gt, ">", relative=False),
}


@dataclass(frozen=True)
class Signal:
    key: str  # metric name in the history
    rule: str  # a key of _RULES
    param: str  # the CollapseConfig field holding the threshold
    nonfinite_fires: bool  # NaN / inf is a collapse in itself
    immediate: bool = False  # one step past the threshold is enough (window 1)


SIGNALS: tuple[Signal, ...] = (
    Signal(ENTROPY, "below_fraction", "entropy_drop", nonfinite_fires=True),
    Signal(REWARD_GROUP_STD, "below_fraction", "reward_std_drop", nonfinite_fires=False),
    Signal(STUCK_FRAC, "above_plus", "stuck_rise", nonfinite_fires=False),
    Signal(REPEAT_RATE, "above", "repeat_rate_max", nonfinite_fires=False),
    Signal(KL_REF, "above", "kl_max", nonfinite_fires=True),
    Signal(APPROX_KL, "above", "kl_max", nonfinite_fires=True),
    Signal(CLIP_FRAC, "above", "clip_frac_max", nonfinite_fires=False),
    Signal(GRAD_NORM, "above", "grad_norm_max", nonfinite_fires=True, immediate=True),
)


@dataclass(frozen=True)
class CollapseWarning:
    signal: str
    first_step: int  # the step that completed the run (or the first non-finite value)
    value: float  # the metric at first_step
    threshold: float
    baseline: float | None  # None for absolute signals
    message: str


@dataclass(frozen=True)
class CollapseReport:
    warnings: list[CollapseWarning]
    first_warning_step: int | None
    reward_drop_step: int | None
    steps: int
    notes: list[str] = field(default_factory=list)  # why a signal could not be judged

    @property
    def collapsed(self) -> bool:
        return bool(self.warnings)

    @property
    def lead_steps(self) -> int | None:
        """How many steps the first warning came before the reward dropped (negative: after)."""
        if self.first_warning_step is None or self.reward_drop_step is None:
            return None
        return self.reward_drop_step - self.first_warning_step

    def to_markdown(self) -> str:
        lines = []
        if self.warnings:
            lines += ["| signal | first step | value | threshold | baseline |", "|---|---|---|---|---|"]
            lines += [
                f"| `{w.signal}` | {w.first_step} | {_fmt(w.value)} | {_fmt(w.threshold)} | {_fmt(w.baseline)} |"
                for w in self.warnings
            ]
        else:
            lines.append(f"No collapse warnings over {self.steps} steps.")
        drop = "none" if self.reward_drop_step is None else f"step {self.reward_drop_step}"
        lines += ["", f"Reward drop: {drop}."]
        if self.lead_steps is not None:
            lines[-1] += f" First warning {self.lead_steps} steps before it."
        if self.notes:
            lines += ["", "Notes:"] + [f"- {n}" for n in self.notes]
        return "\n".join(lines)

    def as_metadata(self) -> dict[str, float | int | str]:
        """Flat keys for an asset check; absent facts (no reward drop) are left out, not set to 0."""
        meta: dict[str, float | int | str] = {
            "collapsed": int(self.collapsed),
            "warnings": len(self.warnings),
            "steps": self.steps,
        }
        optional = {
            "first_warning_step": self.first_warning_step,
            "reward_drop_step": self.reward_drop_step,
            "lead_steps": self.lead_steps,
        }
        meta.update({k: v for k, v in optional.items() if v is not None})
        if self.warnings:
            meta["signals"] = ", ".join(w.signal for w in self.warnings)
        for w in self.warnings:
            meta.update(
                {
                    f"{w.signal}/first_step": w.first_step,
                    f"{w.signal}/value": w.value,
                    f"{w.signal}/threshold": w.threshold,
                }
            )
            if w.baseline is not None:
                meta[f"{w.signal}/baseline"] = w.baseline
        if self.notes:
            meta["notes"] = "; ".join(self.notes)
        # "nan": JSON-safe
        return {k: v if not isinstance(v, float) or math.isfinite(v) else str(v) for k, v in meta.items()}


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def _as_float(value) -> float | None:
    if value is None or isinstance(value, (str, bytes)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def signal_series(history: Sequence[Mapping], key: str) -> list[tuple[int, float]]:
    """(step, value) for the steps that recorded `key`, in step order. Non-finite values are kept
    (callers decide what NaN means); None and non-numbers are skipped. A row without "step" takes
    its position in the history."""
    out = []
    for i, row in enumerate(history):
        value = _as_float(row.get(key))
        if value is not None:
            out.append((int(row.get("step", i)), value))
    return sorted(out, key=lambda p: p[0])


def _first_run(
    points: Sequence[tuple[int, float]], past: Callable[[float], bool], window: int
) -> tuple[int, float] | None:
    """The (step, value) completing the first run of `window` consecutive points past the threshold."""
    run = 0
    for step, value in points:
        run = run + 1 if past(value) else 0
        if run >= window:
            return step, value
    return None


def _check(
    signal: Signal, series: list[tuple[int, float]], cfg: CollapseConfig, notes: list[str], short: list[str]
) -> CollapseWarning | None:
    rule, param = _RULES[signal.rule], getattr(cfg, signal.param)
    finite = [(s, v) for s, v in series if math.isfinite(v)]
    nonfinite = next(((s, v) for s, v in series if not math.isfinite(v)), None) if signal.nonfinite_fires else None

    baseline, run = None, None
    threshold = math.nan if rule.relative else rule.threshold(None, param)  # relative: NaN until a baseline exists
    window = 1 if signal.immediate else cfg.window
    if not rule.relative:
        run = _first_run(finite, lambda v: rule.past(v, threshold), window)
    elif len(finite) < cfg.baseline_steps + cfg.window:
        short.append(f"{signal.key} ({len(finite)})")
    else:
        baseline = sum(v for _, v in finite[: cfg.baseline_steps]) / cfg.baseline_steps
        threshold = rule.threshold(baseline, param)
        if rule.multiplicative and abs(baseline) <= _NEAR_ZERO:
            what = (
                "the round never had reward spread to learn from"
                if signal.key == REWARD_GROUP_STD
                else "no relative threshold"
            )
            notes.append(f"{signal.key}: baseline ~0 ({baseline:.3g}): {what}")
        elif signal.key == STUCK_FRAC and threshold >= 1.0:  # a fraction: past 1 it can never fire
            notes.append(f"{signal.key}: baseline {baseline:.3g} + {param:g} >= 1, cannot fire")
        else:
            run = _first_run(finite[cfg.baseline_steps :], lambda v: rule.past(v, threshold), cfg.window)

    if nonfinite and (run is None or nonfinite[0] <= run[0]):
        step, value = nonfinite
        return CollapseWarning(
            signal.key, step, value, threshold, baseline, f"{signal.key} is {value} at step {step}: the update diverged"
        )
    if run is None:
        return None
    step, value = run
    bound = (
        f"{param:g} × baseline {baseline:.4g} = "
        if rule.multiplicative
        else f"baseline {baseline:.4g} + {param:g} = "
        if rule.relative
        else ""
    )
    message = f"{signal.key} {rule.symbol} {bound}{threshold:.4g} for {window} consecutive step(s), up to step {step} ({value:.4g})"
    return CollapseWarning(signal.key, step, value, threshold, baseline, message)


def detect_collapse(history: Sequence[Mapping], cfg: CollapseConfig) -> CollapseReport:
    """Which early warnings fired over a round's per-step metrics (one dict per RL step, with "step")."""
    warnings, notes, short, absent = [], [], [], []
    for signal in SIGNALS:
        series = signal_series(history, signal.key)
        if not series:
            absent.append(signal.key)
            continue
        if (w := _check(signal, series, cfg, notes, short)) is not None:
            warnings.append(w)
    if short:
        notes.append(
            f"too few steps for relative signals (need baseline_steps + window = {cfg.baseline_steps + cfg.window}): "
            + ", ".join(short)
        )
    if absent:
        notes.append("not recorded: " + ", ".join(absent))
    warnings.sort(key=lambda w: w.first_step)
    return CollapseReport(
        warnings=warnings,
        first_warning_step=warnings[0].first_step if warnings else None,
        reward_drop_step=reward_drop_step(history, baseline_steps=cfg.baseline_steps, window=cfg.window),
        steps=len(history),
        notes=notes,
    )


def reward_drop_step(
    history: Sequence[Mapping],
    *,
    baseline_steps: int,
    drop: float = 0.2,
    window: int = 3,
    near_zero: float = 0.05,
    key: str = REWARD,
) -> int | None:
    """The first step after the baseline where the reward's trailing mean (over the last `window`
    recorded values, fewer at the start) falls below the baseline mean b by `drop`:

        below b - drop * |b|    (= (1 - drop) * b for a positive baseline; |b| keeps a negative one right)
        below b - drop          when |b| < near_zero: a relative fall from ~0 is noise, so the reward
                                must fall by `drop` in absolute terms (with rewards in [0, 1] a round
                                that starts at ~0 reward has nothing to drop from and never reports one)

    None when the reward never dropped, or was recorded on fewer than baseline_steps + 1 steps."""
    finite = [(s, v) for s, v in signal_series(history, key) if math.isfinite(v)]
    if len(finite) <= baseline_steps:
        return None
    baseline = sum(v for _, v in finite[:baseline_steps]) / baseline_steps
    threshold = baseline - drop if abs(baseline) < near_zero else baseline - drop * abs(baseline)
    values = [v for _, v in finite]
    for i in range(baseline_steps, len(finite)):
        trailing = values[max(0, i - window + 1) : i + 1]
        if sum(trailing) / len(trailing) < threshold:
            return finite[i][0]
    return None
