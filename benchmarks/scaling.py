"""How a GRPO step's time grows with model size, group size, batch size and tool turns (issue 9, part 3).

    .venv/bin/python benchmarks/scaling.py [--quick] [--axes size,group,batch,turns] [--steps 5] [--repeats 2] [--home /tmp/rollout-bench]

The step is benchmarks/rl_step_profile.py's: `training.rl.loop.train_round` itself, on a warm-started
policy (so that it calls tools), with the real tools and verifier cascade, every stage timed from
outside. Each axis changes one thing from a base of 8 prompts x 8 samples, up to 4 turns, `tiny`:

  size    the model: tiny (0.66M matmul parameters), 5m (5.7M), 20m (19.8M, benchmarks/mfu.py's shape);
          warm starts of 400, 150 and 400 SFT steps (5m's is built on first use, ~5 min)
  group   samples per prompt (GRPO's G): 2, 4, 8, 16, 32, at 8 prompts
  batch   prompts per step: 4, 8, 16, 32, 64, at 8 samples each (32 x 8 is the tiny profile's step)
  turns   rollout.max_turns: 1, 2, 4 (a tool call ends a turn)

Per setting: the step's wall, the median over `--steps` (5) steps after a warm-up of each of `--repeats`
(2) rounds [min, max] (rounds of a setting repeat the same work, from the same seed), and per
trajectory and per token (prompt + completion, the tokens the trainer's passes see). Per axis: the
exponent, the least-squares slope of log(step time) on log(x) over every measured step, with its
standard error, split into the exponent of the tokens per step and that of the time per token. An
axis is FLAGGED super-linear when the slope minus two standard errors is above 1.1, over the whole
range or between its two largest settings (where a bend would show). The stage that added most of
the time between the smallest and the largest setting is named with its own exponent. Settings
shared by several axes (the base) run once. The full sweep takes ~7 minutes on 2 idle cores.
`--quick` (a smoke run of ~1 minute): two settings per axis, smaller batches, two measured steps, one
round, no waiting for a quiet machine; it writes scaling-quick.{json,md,png} instead.
Writes benchmarks/results/scaling.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import mfu, rollout_engines  # noqa: E402
from benchmarks.rl_step_profile import (  # noqa: E402
    STAGES,
    code_version,
    measured,
    padding_share,
    profile_round,
    setup,
    summarize,
    version_line,
)

# A size between tiny and 20m (Qwen2 blocks, head size 64 as 20m's).
FIVE_M = {
    "model.hidden_size": 384,
    "model.intermediate_size": 1024,
    "model.num_hidden_layers": 3,
    "model.num_attention_heads": 6,
    "model.num_key_value_heads": 6,
}
SIZES = {**mfu.SIZES, "5m": FIVE_M}
# rollout_engines.warm_model (the warm-start cache this reuses) reads model shapes from its own
# SIZES; 5m is registered there with the SFT settings its 20m uses.
rollout_engines.SIZES.setdefault("5m", {**FIVE_M, "sft.batch_size": 16, "sft.learning_rate": 3e-4})
SFT_STEPS = {"tiny": 400, "5m": 150, "20m": 400}  # warm-start SFT steps (the cache folder names)
AXES = {  # axis: (what x is, the setting's overrides per x), on the base below
    "size": ("matmul parameters", None),
    "group": ("samples per prompt (G)", "rl.group_size"),
    "batch": ("prompts per step", "rl.prompts_per_step"),
    "turns": ("rollout.max_turns", "rollout.max_turns"),
}
FULL = {"size": ["tiny", "5m", "20m"], "group": [2, 4, 8, 16, 32], "batch": [4, 8, 16, 32, 64], "turns": [1, 2, 4]}
QUICK = {"size": ["tiny", "20m"], "group": [2, 4], "batch": [2, 4], "turns": [1, 2]}
BASE = {"rl.prompts_per_step": 8, "rl.group_size": 8, "rollout.max_turns": 4}
QUICK_BASE = {"rl.prompts_per_step": 4, "rl.group_size": 4, "rollout.max_turns": 4}
# What the step's FLOPs and work do along each axis, for reading the fitted exponents.
MECHANISM = {
    "size": "model FLOPs are linear in matmul parameters (2N per token per forward, 6N per trained token); per-step costs that do not "
    "depend on the model (tools, verification, Python bookkeeping, per-op overhead of thin matmuls) flatten the small end",
    "group": "trajectories grow linearly with G, but a batched decode step costs little more for more rows at these widths, so time per "
    "token falls; padding (to the longest row of a pass) is what could make it super-linear, as a larger batch holds a longer trajectory",
    "batch": "as for G: trajectories grow linearly with the prompts, decode steps are shared, and padding grows with the batch's longest trajectory",
    "turns": "a turn re-prefills the whole episode in the HF engine (no KV cache is kept between turns), and longer episodes widen the "
    "padded passes; attention is quadratic in length, but at <= 256 tokens it is a small part of a forward pass",
}


@dataclass
class Setting:
    size: str
    overrides: dict
    records: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    rounds: list[dict] = field(default_factory=list)  # per repeat: seconds and median step wall

    @property
    def key(self) -> tuple:
        return self.size, tuple(sorted(self.overrides.items()))


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Slope of log y on log x by least squares, and its standard error (nan with < 3 points or one x)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    sxx = sum((x - mx) ** 2 for x in lx)
    if sxx == 0:
        return float("nan"), float("nan")
    slope = sum((x - mx) * (y - my) for x, y in zip(lx, ly)) / sxx
    if len(lx) < 3:
        return slope, float("nan")
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(lx, ly))
    return slope, math.sqrt(residual / (len(lx) - 2) / sxx)


def axis_settings(values: dict, base: dict) -> dict[str, list[tuple[str, Setting]]]:
    """Per axis, (label, setting) per x; one Setting object per distinct (size, overrides)."""
    distinct: dict[tuple, Setting] = {}
    out = {}
    for axis, xs in values.items():
        name = AXES[axis][1]
        out[axis] = []
        for x in xs:
            setting = Setting(x, dict(base)) if axis == "size" else Setting("tiny", {**base, name: x})
            out[axis].append((str(x), distinct.setdefault(setting.key, setting)))
    return out


def x_value(axis: str, label: str, setting: Setting, policies: dict) -> float:
    return float(policies[setting.size].matmul_parameters) if axis == "size" else float(label)


def analyse(axis: str, points: list[tuple[str, Setting]], policies: dict) -> dict:
    xs = [x_value(axis, label, s, policies) for label, s in points]
    per_step = [(x, r["wall_s"], r["counts"]["tokens"]) for x, (_, s) in zip(xs, points) for r in measured(s.records)]
    slope, se = fit([x for x, _, _ in per_step], [y for _, y, _ in per_step])
    # time = tokens x time per token: which of the two grows along the axis
    token_slope, _ = fit([x for x, _, _ in per_step], [t for _, _, t in per_step])
    per_token_slope, per_token_se = fit([x for x, _, _ in per_step], [y / t for _, y, t in per_step])
    # a fit over the whole range can hide a bend: the exponent between the two largest settings too
    top = [(x, y) for x, y, _ in per_step if x >= xs[-2]]
    top_slope, top_se = fit([x for x, _ in top], [y for _, y in top])
    first, last = points[0][1].summary["stages"], points[-1][1].summary["stages"]
    added = {stage: last[stage]["median_s"] - first[stage]["median_s"] for stage in STAGES}
    total_added = sum(added.values())
    driver = max(added, key=added.get)
    stage_slope = (
        fit([xs[0], xs[-1]], [first[driver]["median_s"], last[driver]["median_s"]])[0]
        if first[driver]["median_s"] > 0 and last[driver]["median_s"] > 0
        else float("nan")
    )
    flagged = slope - 2 * se > 1.1 if not math.isnan(se) else slope > 1.1
    flagged_top = top_slope - 2 * top_se > 1.1 if not math.isnan(top_se) else top_slope > 1.1
    return {
        "axis": axis,
        "x_name": AXES[axis][0],
        "exponent": slope,
        "exponent_se": se,
        "tokens_exponent": token_slope,
        "per_token_exponent": per_token_slope,
        "per_token_exponent_se": per_token_se,
        "super_linear": bool(flagged),
        "above_1_1_within_noise": bool(slope > 1.1 and not flagged),
        "top_exponent": top_slope,
        "top_exponent_se": top_se,
        "super_linear_at_top": bool(flagged_top),
        "driver": driver,
        "driver_share_of_added_time": added[driver] / total_added if total_added > 0 else float("nan"),
        "driver_exponent": stage_slope,
        "added_s_by_stage": added,
        "mechanism": MECHANISM[axis],
        "points": [
            {
                "label": label,
                "x": x,
                "size": s.size,
                "overrides": s.overrides,
                "wall_s": s.summary["wall_s"],
                "spread_s": s.summary["wall_spread_s"],
                "walls_s": [r["wall_s"] for r in measured(s.records)],
                "trajectories": s.summary["counts"]["trajectories"],
                "tokens": s.summary["counts"]["tokens"],
                "policy_tokens": s.summary["counts"]["policy tokens"],
                "turns": s.summary["turns"],
                "tool_call_rate": s.summary["tool_call_rate"],
                "other_cpu_cores": s.summary["other_cpu_cores"],
                "update_padding": padding_share(s.summary["counts"], "update forward"),
                "steps": s.summary["steps"],
                "contended_steps": s.summary["contended_steps"],
                "round_medians_s": [r["median_wall_s"] for r in s.rounds],
                "stages_s": {k: v["median_s"] for k, v in s.summary["stages"].items()},
            }
            for x, (label, s) in zip(xs, points)
        ],
    }


def markdown(axes: list[dict]) -> str:
    lines = []
    for a in axes:
        lines += [
            f"### {a['axis']}: step time vs {a['x_name']}",
            "",
            (
                f"| {a['x_name']} | trajectories | tokens | turns per episode | episodes with a tool call | step s, median [min, max] | "
                "median of each round | ms per trajectory | µs per token | padding in the update's passes | steps (contended) | other processes' cores |"
            ),
            "|---" * 12 + "|",
        ]
        for p in a["points"]:
            x = f"{p['label']} ({p['x'] / 1e6:.2f}M)" if a["axis"] == "size" else p["label"]
            lines.append(
                f"| {x} | {p['trajectories']:.0f} | {p['tokens']:.0f} | {p['turns']:.2f} | {p['tool_call_rate']:.0%} | "
                f"**{p['wall_s']:.2f}** [{p['spread_s'][0]:.2f}, {p['spread_s'][1]:.2f}] | {', '.join(f'{m:.2f}' for m in p['round_medians_s'])} | "
                f"{1000 * p['wall_s'] / p['trajectories']:.1f} | "
                f"{1e6 * p['wall_s'] / p['tokens']:.0f} | {p['update_padding']:.0%} | {p['steps']} ({p['contended_steps']}) | {p['other_cpu_cores']:.2f} |"
            )
        verdict = (
            "**FLAG: super-linear**"
            if a["super_linear"]
            else "above 1.1 but not clearly (within two standard errors)"
            if a["above_1_1_within_noise"]
            else "not super-linear"
        )
        if math.isnan(a["exponent_se"]):
            verdict += " (too few steps for an error estimate)"
        growth = (
            f"Most of the added time is {a['driver']} ({a['driver_share_of_added_time']:.0%} of it; its own exponent {a['driver_exponent']:.2f})."
            if a["driver_share_of_added_time"] == a["driver_share_of_added_time"]
            else "The step did not get slower from the first setting to the last."
        )
        top = f"between the two largest settings {a['top_exponent']:.2f} ± {a['top_exponent_se']:.2f}" + (
            " (**FLAG: super-linear at the top end**)" if a["super_linear_at_top"] else ""
        )
        lines += [
            "",
            (
                f"Exponent **{a['exponent']:.2f}** ± {a['exponent_se']:.2f}: {verdict}; {top}. It splits into tokens (exponent "
                f"{a['tokens_exponent']:.2f}) times time per token (exponent {a['per_token_exponent']:.2f} ± {a['per_token_exponent_se']:.2f}). "
                f"{growth} Mechanism: {a['mechanism']}."
            ),
            "",
        ]
    lines += [
        (
            "| axis | step time exponent ± SE | between the two largest | tokens exponent | time per token exponent | super-linear (> 1.1 by 2 SE) | "
            "most of the added time |"
        ),
        "|---" * 7 + "|",
    ]
    lines += [
        f"| {a['axis']} | **{a['exponent']:.2f}** ± {a['exponent_se']:.2f} | {a['top_exponent']:.2f} ± {a['top_exponent_se']:.2f} | {a['tokens_exponent']:.2f} | "
        f"{a['per_token_exponent']:.2f} | {'**FLAG**' if a['super_linear'] else '**FLAG at the top end**' if a['super_linear_at_top'] else 'no'} | "
        + (
            f"{a['driver']} ({a['driver_share_of_added_time']:.0%}) |"
            if a["driver_share_of_added_time"] == a["driver_share_of_added_time"]
            else "(no added time) |"
        )
        for a in axes
    ]
    return "\n".join(lines) + "\n"


def plot(axes: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    fig, panels = plt.subplots(1, len(axes), figsize=(4.2 * len(axes), 4), squeeze=False)
    panels = panels[0]
    for ax, a in zip(panels, axes):
        xs, ys = [p["x"] for p in a["points"]], [p["wall_s"] for p in a["points"]]
        low, high = (
            [y - p["spread_s"][0] for y, p in zip(ys, a["points"])],
            [p["spread_s"][1] - y for y, p in zip(ys, a["points"])],
        )
        ax.errorbar(
            xs,
            ys,
            yerr=[low, high],
            marker="o",
            capsize=3,
            color="tab:red" if a["super_linear"] else "tab:blue",
            label="step (median, min-max)",
        )
        ax.plot([xs[0], xs[-1]], [ys[0], ys[0] * xs[-1] / xs[0]], ":", color="grey", label="linear (slope 1)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        # ticks at the settings themselves, and plain numbers: log axes' default labels are unreadable here
        ax.set_xticks(
            xs, [f"{p['label']}\n{p['x'] / 1e6:.1f}M" if a["axis"] == "size" else p["label"] for p in a["points"]]
        )
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(a["x_name"])
        ax.set_title(
            f"{a['axis']}: exponent {a['exponent']:.2f} ± {a['exponent_se']:.2f}"
            + (" FLAG" if a["super_linear"] else ""),
            fontsize=10,
        )
    panels[0].set_ylabel("GRPO step (s)")
    panels[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: two settings per axis, small batches, two measured steps"
    )
    parser.add_argument("--axes", default=",".join(AXES), help=f"which axes: {', '.join(AXES)}")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="measured steps per setting, after one warm-up (default 5; 2 with --quick)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="rounds per setting, all settings once before any twice; the same seed, so "
        "the same work: rounds differ by timing noise only, and their steps are pooled (default 2; 1 with --quick)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        help="seconds to wait at most, before each step, for other processes to "
        "leave the CPU (the machine is shared; default 10, 0 with --quick: a smoke run does not wait)",
    )
    parser.add_argument(
        "--extra-steps",
        type=int,
        default=None,
        help="steps run at most per round to make up for contended ones (default 2; 0 with --quick)",
    )
    parser.add_argument(
        "--home",
        type=Path,
        default=Path("/tmp/rollout-bench"),
        help="warm-start cache (benchmarks/rollout_engines.py's)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    chosen = [a for a in args.axes.split(",") if a]
    if not chosen or any(a not in AXES for a in chosen):
        parser.error(f"--axes {args.axes!r}: choose among {', '.join(AXES)}")
    steps = args.steps if args.steps is not None else (2 if args.quick else 5)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 2)
    quiet_wait = args.quiet_wait if args.quiet_wait is not None else (0.0 if args.quick else 10.0)
    extra_steps = args.extra_steps if args.extra_steps is not None else (0 if args.quick else 2)
    if min(steps, repeats) < 1 or quiet_wait < 0 or extra_steps < 0:
        parser.error(
            f"--steps and --repeats must be >= 1, --quiet-wait and --extra-steps >= 0 "
            f"(got {steps}, {repeats}, {quiet_wait}, {extra_steps})"
        )
    values = {a: (QUICK if args.quick else FULL)[a] for a in chosen}

    import torch

    from assets.resources import SandboxResource
    from configs import load_profile

    torch.set_num_threads(2)
    started = time.perf_counter()
    by_axis = axis_settings(values, QUICK_BASE if args.quick else BASE)
    settings = list({s.key: s for points in by_axis.values() for _, s in points}.values())
    policies = {}
    with SandboxResource.from_config(load_profile("tiny").sandbox).open() as box:
        # warm starts first: a missing one is built once, outside the timings
        for size in dict.fromkeys(s.size for s in settings):
            policies[size] = setup(size, SFT_STEPS[size], args.home, box)
        sweep_start = time.perf_counter()
        for repeat in range(repeats):
            for i, setting in enumerate(settings, 1):
                cfg = load_profile("tiny", {**SIZES[setting.size], **setting.overrides})
                start = time.perf_counter()
                run = profile_round(
                    cfg, policies[setting.size], box, steps=steps, quiet_wait_s=quiet_wait, extra_steps=extra_steps
                )
                for record in run:
                    record["repeat"] = repeat
                setting.records += run
                walls = [r["wall_s"] for r in measured(run)]
                setting.rounds.append(
                    {"round_s": time.perf_counter() - start, "median_wall_s": statistics.median(walls)}
                )
                print(
                    f"[scaling] round {repeat + 1}/{repeats}, {i}/{len(settings)} {setting.size} {setting.overrides}: {statistics.median(walls):.2f}s "
                    f"per step [{min(walls):.2f}, {max(walls):.2f}], {run[-1]['counts']['trajectories']:.0f} trajectories "
                    f"(round {setting.rounds[-1]['round_s']:.0f}s)",
                    flush=True,
                )
        for setting in settings:
            setting.summary = summarize(setting.records)
        sweep_s = time.perf_counter() - sweep_start
    axes = [analyse(axis, points, policies) for axis, points in by_axis.items()]
    args.out.mkdir(parents=True, exist_ok=True)
    name, version = "scaling-quick" if args.quick else "scaling", code_version()
    (args.out / f"{name}.json").write_text(
        json.dumps(
            {
                "command": " ".join(["benchmarks/scaling.py", *(argv or sys.argv[1:])]),
                "code": version,
                "run_s": time.perf_counter() - started,
                "sweep_s": sweep_s,
                "steps": steps,
                "repeats": repeats,
                "base": QUICK_BASE if args.quick else BASE,
                "parameters": {
                    size: {"all": p.parameters, "matmul": p.matmul_parameters} for size, p in policies.items()
                },
                "axes": axes,
                "settings": [
                    {
                        "size": s.size,
                        "overrides": s.overrides,
                        "rounds": s.rounds,
                        "summary": s.summary,
                        "steps": s.records,
                    }
                    for s in settings
                ],
            },
            indent=1,
        )
    )
    text = version_line(version) + f" Sweep: {sweep_s / 60:.1f} min.\n\n" + markdown(axes)
    (args.out / f"{name}.md").write_text(text)
    plot(axes, args.out / f"{name}.png")
    print(text)
    print(f"[scaling] sweep {sweep_s:.0f}s, whole run {time.perf_counter() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
