"""Where one GRPO step's time goes, stage by stage, through the product's own RL round (issue 9, part 2).

    .venv/bin/python benchmarks/rl_step_profile.py [--sizes tiny,20m] [--steps 5] [--repeats 2] [--home /tmp/rollout-bench]

Each size runs `training.rl.loop.train_round` itself: GRPO on the `tiny` profile (32 prompts x 8
samples per step), and `20m` with benchmarks/mfu.py's overrides (the same loop, 8 prompts x 8). The
policy is warm-started (benchmarks/rollout_engines.py's `warm_model` and its cache: 400 SFT steps on
teacher trajectories) so that it calls tools; the tools are the real ones (bubblewrap sandbox, BM25
search), and so is the verifier cascade. Nothing of the product is copied or edited: the functions train_round calls are
wrapped from outside, for the round only, with timers:

  generation       the rollout engine's `generate` (HF: one batched call per turn)
  tools            each Tool's `call_many`. Busy: summed over tool batches (code and search batches
                   run at the same time). Wall: the union of their intervals minus any overlap with
                   generation, i.e. the part of the step that only tools hold up
  verification     the cascade (fast checks, then sandboxed tests / math / EM) verifies episodes as they
                   finish, during generation (training/rl/scoring.py::Verifying): the step's wait for
                   it after the rollout
  old log-probs    `recorded_logprobs` on the policy (a forward pass; skipped by train_round when the
                   update is strictly on-policy, which the tiny profile's 2 minibatches are not)
  ref log-probs    `recorded_logprobs` on the reference (a forward pass)
  update forward   the policy loss function (forward pass, GRPO loss, entropy), per micro-batch
  backward         `engine.backward`
  optimizer step   `engine.step` (clip, AdamW, LR schedule, zero grads)
  checkpoint save  `save_state`: rl.checkpoint_every=1 here, so that every step saves; the profile
                   saves every 10 steps, and the amortized figure is reported too
  other            the rest of the step's wall: the agent loop's bookkeeping, episode records,
                   advantages, metrics

Waste per kind of forward pass: the tokens it computed against the real ones it needed (padding, and
in decoding, rows that had already stopped), counted at `collate` for the trainer's passes and by a
pre-forward hook on the policy during generation.

A step's wall is train_round's own `perf/step_s`, which includes the step's save. A round's warm-up step
(first-call costs) is dropped, then `--steps` steps are measured; `--repeats` rounds per size (the
same seed, so the same work) are pooled: per stage the median, min and max. The machine is shared:
a step during which other processes held a core is replaced by another (the record says which).
Writes benchmarks/results/rl-step-profile.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STAGES = (
    "generation",
    "tools",
    "verification",
    "old log-probs",
    "ref log-probs",
    "update forward",
    "backward",
    "optimizer step",
    "checkpoint save",
    "other",
)
SFT_STEPS = (
    "tiny=400,20m=400"  # warm-start caches in /tmp/rollout-bench (rollout_engines.warm_model builds a missing one)
)
# Other processes' average cores over a step above which the step counts as contended. Our own
# sandbox's workers count as other processes: tools and code tests kept them under 0.3 core at
# `tiny`; a competing torch job takes a whole core or more.
BUSY_CORES = 0.5


PRODUCT_DIRS = ("training", "configs", "environments", "verifiers", "assets")


def code_version() -> dict:
    """Which product code was measured: the commit, and any uncommitted change to it (files and a
    hash of the diff), read-only. Profiles of a working tree in flux are otherwise not comparable."""
    import hashlib
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout

    try:
        diff = git("diff", "HEAD", "--", *PRODUCT_DIRS)
        return {
            "commit": git("rev-parse", "HEAD").strip(),
            "modified": git("diff", "HEAD", "--name-only", "--", *PRODUCT_DIRS).split(),
            "diff_sha256": hashlib.sha256(diff.encode()).hexdigest()[:16] if diff else None,
        }
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "modified": [], "diff_sha256": None, "note": f"{ROOT} is not a git checkout"}


def version_line(version: dict) -> str:
    if version["commit"] is None:
        return f"Code: {version['note']}."
    changes = (
        f"uncommitted changes to {', '.join(version['modified'])} (diff {version['diff_sha256']})"
        if version["modified"]
        else "no uncommitted changes"
    )
    return f"Code: commit {version['commit'][:10]}, {changes}."


class _RoundDone(Exception):
    """Raised from the last measured step's on_step (after its save): train_round skips the save of a
    round's last step, so the round is planned one step longer and stopped here instead of running that step."""


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has been busy (every process), from /proc/stat."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def other_cpu(window_s: float = 1.0) -> float:
    """Cores busy with other processes than this one (the sandbox's workers count as other) over
    the next `window_s` seconds."""
    busy, ours, start = _busy_cpu_seconds(), _cpu_seconds(), time.perf_counter()
    time.sleep(window_s)
    return ((_busy_cpu_seconds() - busy) - (_cpu_seconds() - ours)) / (time.perf_counter() - start)


def wait_for_quiet(limit_s: float, cores: float) -> float:
    """Wait, up to `limit_s`, until other processes use under `cores` cores: the machine is shared,
    and a step timed while another job holds a core says little about the step. Returns the last
    reading (the step then runs anyway, and its record says how busy the machine was)."""
    deadline = time.perf_counter() + limit_s
    while True:
        used = other_cpu()
        if used < cores or time.perf_counter() >= deadline:
            return used


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in spans)


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


class StageClock:
    """Seconds per stage, counters and time intervals for the step in progress. Tool batches finish
    on pool threads, hence the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.current: str | None = (
            None  # the stage the main thread is in (tool batches, on other threads, do not set it)
        )
        self.reset()

    def reset(self) -> None:
        # our process's CPU seconds (all its threads) over the step's wall: ~2 when torch has both
        # cores to itself, less when another process takes them (the machine is shared)
        self.cpu0, self.busy0, self.wall0 = _cpu_seconds(), _busy_cpu_seconds(), time.perf_counter()
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, float] = defaultdict(float)
        self.spans: dict[str, list[tuple[float, float]]] = defaultdict(list)

    def add(self, key: str, value: float) -> None:
        with self.lock:
            self.counts[key] += value

    def timed(self, stage: str, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            # model passes and batches are counted under the stage that runs them
            outer, self.current = (
                self.current,
                stage,
            )
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                self.current = outer
                with self.lock:
                    self.seconds[stage] += end - start
                    self.spans[stage].append((start, end))

        return wrapper


class TimedTool:
    """A tool whose batches are timed; anything else (e.g. `set_cpus`) goes to the tool itself."""

    def __init__(self, tool, clock: StageClock) -> None:
        self.tool, self.name, self.clock = tool, tool.name, clock

    def call_many(self, args: list[str]):
        self.clock.add(f"tool calls/{self.name}", len(args))
        start = time.perf_counter()
        try:
            return self.tool.call_many(args)
        finally:
            end = time.perf_counter()
            with self.clock.lock:
                self.clock.seconds[f"tool busy/{self.name}"] += end - start
                self.clock.spans[f"tool busy/{self.name}"].append((start, end))

    def __getattr__(self, name: str):
        return getattr(self.tool, name)


@dataclass
class Policy:
    """A warm-started policy on disk and what a round needs next to it."""

    size: str
    folder: Path
    tokenizer: object
    tasks: list[dict]
    tools: dict
    parameters: int  # all parameters
    matmul_parameters: int  # the Linear weights (benchmarks/mfu.py's N)


def setup(size: str, sft_steps: int, home: Path, box) -> Policy:
    """The size's warm-started policy (built once into `home` by rollout_engines.warm_model) and its tools."""
    from benchmarks.mfu import matmul_parameters
    from benchmarks.rollout_engines import warm_model
    from environments.base import KnowledgeBase
    from environments.families import build_tools
    from training.model import num_parameters

    cfg, folder, model, tok, tasks, documents = warm_model(size, sft_steps, home, box)
    tools = build_tools(sandbox=box, kb=KnowledgeBase([], {}, documents), top_k=cfg.data.knowledge_base.top_k)
    return Policy(size, folder, tok, tasks, tools, num_parameters(model), matmul_parameters(model))


class RoundProbe:
    """Timing wrappers for what train_round calls (training/rl/loop.py's module globals, patched
    for one round), and the per-step records they fill."""

    WRAPPED = (
        "run_episodes",
        "build_rollout_engine",
        "Verifying",
        "recorded_logprobs",
        "policy_loss_fn",
        "build_engine",
        "save_state",
        "collate",
    )

    def __init__(
        self, rl_loop, reference, *, steps: int, warmup: int, last: int, quiet_wait_s: float, busy_cores: float
    ) -> None:
        self.real = {name: getattr(rl_loop, name) for name in self.WRAPPED}
        self.reference, self.steps, self.warmup, self.last = reference, steps, warmup, last
        self.quiet_wait_s, self.busy_cores = quiet_wait_s, busy_cores
        self.clock, self.records, self.saves = StageClock(), {}, {}  # saves: by step, until its on_step
        self.hooks: list = []

    def patches(self, rl_loop) -> list:
        ours = {name: getattr(self, name) for name in self.WRAPPED}
        return [mock.patch.object(rl_loop, name, wrapper) for name, wrapper in ours.items()]

    @property
    def Verifying(self):  # noqa: N802 - stands in for the class it wraps
        clock, real = self.clock, self.real["Verifying"]

        class TimedVerifying(real):
            def results(self, episodes):
                return clock.timed("verification", super().results)(episodes)

        return TimedVerifying

    def run_episodes(self, *args, **kwargs):
        episodes = self.clock.timed("rollout", self.real["run_episodes"])(*args, **kwargs)
        self.clock.add("trajectories", len(episodes))
        self.clock.add("tokens", sum(len(e.prompt_ids) + len(e.completion_ids) for e in episodes))
        self.clock.add("policy tokens", sum(sum(e.tool_mask) for e in episodes))
        return episodes

    def build_rollout_engine(self, rollout, model, *args, **kwargs):
        engine = self.real["build_rollout_engine"](rollout, model, *args, **kwargs)
        generate, clock = self.clock.timed("generation", engine.generate), self.clock

        def timed_generate(sequences, budgets, **kw):
            before = dict(engine.counts)  # the HF engine's own tally: what its prefills computed and needed
            computed = clock.counts["generation tokens computed"]
            out = generate(sequences, budgets, **kw)
            clock.add("engine calls", 1)
            # needed: a turn's new tokens; the rest of each sequence comes from the KV the engine kept
            needed = engine.counts["prefill real"] - before["prefill real"]
            clock.add("prefill tokens", needed)
            clock.add("prefill tokens kept", sum(map(len, sequences)) - needed)
            prefill = engine.counts["prefill computed"] - before["prefill computed"]
            clock.add("prefill tokens computed", prefill)
            # every other token the model was fed in this call (counted by the hook) was a decode row
            clock.add("decode tokens computed", clock.counts["generation tokens computed"] - computed - prefill)
            clock.add("sampled tokens", sum(len(g.ids) for g in out))
            # a row's first token comes from the prefill's logits
            clock.add("decode tokens", sum(max(0, len(g.ids) - 1) for g in out))
            return out

        def count_rows(module, args, kwargs):
            # what each of the engine's forward passes computes: (rows, positions) of its input ids,
            # padding and rows that already stopped included
            if clock.current == "generation":
                ids = kwargs.get("input_ids", args[0] if args else None)
                clock.add("generation tokens computed", ids.numel())

        self.hooks.append(model.register_forward_pre_hook(count_rows, with_kwargs=True))
        engine.generate = timed_generate
        return engine

    def recorded_logprobs(self, model, *args, **kwargs):
        stage = "ref log-probs" if model is self.reference else "old log-probs"
        return self.clock.timed(stage, self.real["recorded_logprobs"])(model, *args, **kwargs)

    def policy_loss_fn(self, *args, **kwargs):
        return self.clock.timed("update forward", self.real["policy_loss_fn"](*args, **kwargs))

    def collate(self, prompts, completions, *args, **kwargs):
        """Every batch a trainer pass runs: its real tokens, and what collate pads them to (rows x
        (longest prompt + longest completion)), under the stage that asked for it."""
        if completions:
            self.clock.add(f"{self.clock.current} tokens", sum(map(len, prompts)) + sum(map(len, completions)))
            self.clock.add(
                f"{self.clock.current} tokens computed",
                len(prompts) * (max(map(len, prompts)) + max(1, max(map(len, completions)))),
            )
        return self.real["collate"](prompts, completions, *args, **kwargs)

    def build_engine(self, *args, **kwargs):
        engine = self.real["build_engine"](*args, **kwargs)
        engine.backward = self.clock.timed("backward", engine.backward)
        engine.step = self.clock.timed("optimizer step", engine.step)
        return engine

    def save_state(self, state_dir, step, *args, **kwargs):
        # the save comes before the step's on_step, and train_round's perf/step_s includes it
        start = time.perf_counter()
        self.real["save_state"](state_dir, step, *args, **kwargs)
        seconds = time.perf_counter() - start
        folder = state_dir / f"step-{step:05d}"
        self.saves[step] = {
            "checkpoint_save_s": seconds,
            "checkpoint_bytes": {
                p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()
            },
        }

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        record = self.records[step] = step_record(step, metrics, self.clock) | self.saves.pop(step, {})
        record["contended"] = record["other_cpu_cores"] > self.busy_cores
        clean = [k for k, r in self.records.items() if k > self.warmup and not r["contended"]]
        self.clock.reset()
        if len(clean) >= self.steps or step == self.last:
            raise _RoundDone
        if self.quiet_wait_s:  # between steps: neither this step's figures nor the next one's include the wait
            record["other_cpu_cores_before_next"] = wait_for_quiet(self.quiet_wait_s, self.busy_cores)

    def finished_records(self) -> list[dict]:
        """Every step, in order, with its phase: `warmup`, `measured` (the first `steps` clean steps
        after the warm-up; if too few ran clean, every step after it), or `replaced` (contended, and
        made up for). The save is added to each step, and `other` is the wall not in any stage."""
        after_warmup = [k for k in sorted(self.records) if k > self.warmup]
        clean = [k for k in after_warmup if not self.records[k]["contended"]]
        measured = set(clean if len(clean) >= self.steps else after_warmup)
        out = []
        for step, record in sorted(self.records.items()):
            record["phase"] = "warmup" if step <= self.warmup else "measured" if step in measured else "replaced"
            record["stages"]["checkpoint save"] = record.pop("checkpoint_save_s", 0.0)  # within wall_s (perf/step_s)
            record["stages"]["other"] = record["wall_s"] - sum(record["stages"].values())
            out.append(record)
        return out


def measured(records: list[dict]) -> list[dict]:
    return [r for r in records if r["phase"] == "measured"]


def profile_round(
    cfg,
    policy: Policy,
    box,
    *,
    steps: int,
    warmup: int = 1,
    seed: int = 0,
    quiet_wait_s: float = 0.0,
    busy_cores: float = BUSY_CORES,
    extra_steps: int = 0,
) -> list[dict]:
    """One GRPO round through train_round on a fresh copy of the policy, every stage timed; the
    record of every step (RoundProbe.finished_records), `steps` of them measured after `warmup` steps. The machine is shared: before each step
    it waits up to `quiet_wait_s` for other processes to leave the CPU, and a step during which
    they held more than `busy_cores` cores on average is marked `contended` and made up for by one
    more step, up to `extra_steps` more. If fewer than `steps` steps ran clean, the contended
    ones are kept, and marked."""
    from training.model import load_policy
    from training.rl import loop as rl_loop
    from verifiers.cascade import Cascade

    if cfg.rollout.engine != "hf":
        raise ValueError(
            f"rollout.engine={cfg.rollout.engine!r}: this profile times the HF engine's batched `generate`; "
            "vLLM's continuous schedule overlaps generation with tools and would need its own clock"
        )
    last = warmup + steps + extra_steps  # the latest step the round may need
    # one step more: train_round never saves the state of a round's last step
    rl = cfg.rl.model_copy(update={"steps_per_round": last + 1, "checkpoint_every": 1})
    policy_model, reference = load_policy(policy.folder), load_policy(policy.folder).requires_grad_(False).eval()
    probe = RoundProbe(
        rl_loop, reference, steps=steps, warmup=warmup, last=last, quiet_wait_s=quiet_wait_s, busy_cores=busy_cores
    )
    tools = {name: TimedTool(tool, probe.clock) for name, tool in policy.tools.items()}
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="rl-step-profile-") as state_dir:
        for patch in probe.patches(rl_loop):
            stack.enter_context(patch)
        try:
            rl_loop.train_round(
                policy_model,
                reference,
                policy.tokenizer,
                policy.tasks,
                tools,
                rl=rl,
                rollout=cfg.rollout,
                cascade=Cascade(cfg.reward, box, concurrency=cfg.sandbox.pool_size),
                round_index=1,
                policy_version="bench",
                seed=seed,
                engine_cfg=cfg.engine,
                state_dir=Path(state_dir),
                on_step=probe.on_step,
            )
        except _RoundDone:
            pass
        finally:
            for hook in probe.hooks:
                hook.remove()
    return probe.finished_records()


def step_record(step: int, metrics: dict[str, float], clock: StageClock) -> dict:
    """One step's stage seconds (without the save, which comes after train_round's on_step)."""
    s = clock.seconds
    generation = _union(clock.spans["generation"])
    tools = _union([span for stage, spans in clock.spans.items() if stage.startswith("tool busy/") for span in spans])
    overlap = _overlap(generation, tools)
    stages = {
        "generation": s["generation"],
        "tools": _length(tools) - overlap,
        "verification": s["verification"],
        "old log-probs": s["old log-probs"],
        "ref log-probs": s["ref log-probs"],
        "update forward": s["update forward"],
        "backward": s["backward"],
        "optimizer step": s["optimizer step"],
    }
    keep = ("rollout/", "perf/", "verifier/", "reward/total/mean", "reward/outcome/pass_rate", "actor/entropy")
    return {
        "step": step,
        "wall_s": metrics["perf/step_s"],
        "stages": stages,
        **contention(clock),
        "tools_busy_s": sum(v for k, v in s.items() if k.startswith("tool busy/")),
        "tools_wall_s": _length(tools),
        "tools_overlapping_generation_s": overlap,
        "rollout_s": s["rollout"],
        "tool_busy_by_tool_s": {k.split("/", 1)[1]: v for k, v in s.items() if k.startswith("tool busy/")},
        "counts": dict(clock.counts),
        "metrics": {k: v for k, v in metrics.items() if k.startswith(keep)},
    }


def contention(clock: StageClock) -> dict[str, float]:
    """Our process's cores and everyone else's, averaged over the step."""
    wall, ours = time.perf_counter() - clock.wall0, _cpu_seconds() - clock.cpu0
    return {"process_cpu_per_wall": ours / wall, "other_cpu_cores": (_busy_cpu_seconds() - clock.busy0 - ours) / wall}


def summarize(records: list[dict]) -> dict:
    """Over the measured steps: median [min, max] per stage and of the wall; shares are each stage's
    median over the sum of the stage medians (so that they add up to 100%; that sum is within noise
    of the median wall)."""
    records = measured(records)
    stages = {stage: [r["stages"][stage] for r in records] for stage in STAGES}
    medians = {stage: statistics.median(v) for stage, v in stages.items()}
    total = sum(max(0.0, m) for m in medians.values())
    walls = [r["wall_s"] for r in records]
    counts = {
        k: statistics.median(r["counts"].get(k, 0.0) for r in records)
        for k in sorted(set().union(*(r["counts"] for r in records)))
    }
    return {
        "wall_s": statistics.median(walls),
        "wall_spread_s": [min(walls), max(walls)],
        "stages": {
            stage: {"median_s": medians[stage], "spread_s": [min(v), max(v)], "share": max(0.0, medians[stage]) / total}
            for stage, v in stages.items()
        },
        "tools_busy_s": statistics.median(r["tools_busy_s"] for r in records),
        "tools_wall_s": statistics.median(r["tools_wall_s"] for r in records),
        "tools_overlapping_generation_s": statistics.median(r["tools_overlapping_generation_s"] for r in records),
        "counts": counts,
        "tool_call_rate": statistics.median(r["metrics"].get("rollout/tool_call_rate", 0.0) for r in records),
        "process_cpu_per_wall": statistics.median(r["process_cpu_per_wall"] for r in records),
        "other_cpu_cores": statistics.median(r["other_cpu_cores"] for r in records),
        "other_cpu_cores_max": max(r["other_cpu_cores"] for r in records),
        "steps": len(records),
        "contended_steps": sum(r["contended"] for r in records),
        "turns": statistics.median(r["metrics"].get("rollout/turns", 0.0) for r in records),
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    labels = [f"{r['size']}\n{r['summary']['wall_s']:.1f} s/step" for r in rows]
    colors = plt.get_cmap("tab10").colors
    for ax, key, title in ((axes[0], "median_s", "seconds per step (median)"), (axes[1], "share", "share of the step")):
        bottom = [0.0] * len(rows)
        for i, stage in enumerate(STAGES):
            values = [max(0.0, r["summary"]["stages"][stage][key]) for r in rows]
            ax.bar(labels, values, bottom=bottom, color=colors[i % len(colors)], label=stage, width=0.55)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_title(title)
    axes[1].yaxis.set_major_formatter(PercentFormatter(1.0))
    axes[1].legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle("One GRPO step through train_round, by stage")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def padding_share(counts: dict, key: str) -> float:
    """The share of what a stage's passes computed that no real token needed (padding, and rows
    that already stopped); 0 when the stage ran no pass."""
    return (
        1 - counts[f"{key} tokens"] / counts[f"{key} tokens computed"] if counts.get(f"{key} tokens computed") else 0.0
    )


def markdown(rows: list[dict]) -> str:
    head = "| stage | " + " | ".join(f"{r['size']}: median s [min, max] | {r['size']}: share" for r in rows) + " |"
    lines = [head, "|---" * (1 + 2 * len(rows)) + "|"]
    for stage in STAGES:
        cells = [
            f"{r['summary']['stages'][stage]['median_s']:.3f} [{r['summary']['stages'][stage]['spread_s'][0]:.3f}, "
            f"{r['summary']['stages'][stage]['spread_s'][1]:.3f}] | **{r['summary']['stages'][stage]['share']:.1%}**"
            for r in rows
        ]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    lines.append(
        "| **step wall** | "
        + " | ".join(
            f"**{r['summary']['wall_s']:.2f}** [{r['summary']['wall_spread_s'][0]:.2f}, "
            f"{r['summary']['wall_spread_s'][1]:.2f}] | 100%"
            for r in rows
        )
        + " |"
    )
    lines.append(
        "| step wall, median of each round | "
        + " | ".join(", ".join(f"{x['median_wall_s']:.2f}" for x in r["rounds"]) + " | " for r in rows)
        + " |"
    )
    lines += [
        "",
        (
            "| size | params (M) | prompts x group | tokens (prompt + completion) | policy tokens | tool calls | episodes with a tool call | "
            "tools busy / wall (s) | checkpoint (MB) | save every 10 steps: s per step (share) | steps (contended) | our CPU s per wall s | other processes' cores: median (max) |"
        ),
        "|---" * 13 + "|",
    ]
    for r in rows:
        s, c = r["summary"], r["summary"]["counts"]
        calls = sum(v for k, v in c.items() if k.startswith("tool calls/"))
        warm = [w["metrics"].get("rollout/tool_call_rate", 0.0) for w in r["steps"] if w["phase"] == "warmup"]
        save = s["stages"]["checkpoint save"]["median_s"]
        lines.append(
            f"| {r['size']} | {r['parameters'] / 1e6:.2f} | {r['prompts_per_step']} x {r['group_size']} | {c['tokens']:.0f} | "
            f"{c['policy tokens']:.0f} | {calls:.0f} | {s['tool_call_rate']:.0%} (warm-up step: {', '.join(f'{w:.0%}' for w in warm) or '-'}) | "
            f"{s['tools_busy_s']:.2f} / {s['tools_wall_s']:.2f} | "
            f"{r['checkpoint_mb']:.1f} | {save / 10:.3f} ({save / 10 / (s['wall_s'] - save + save / 10):.1%}) | "
            f"{s['steps']} ({s['contended_steps']}) | {s['process_cpu_per_wall']:.2f} | {s['other_cpu_cores']:.2f} ({s['other_cpu_cores_max']:.2f}) |"
        )
    lines += [
        "",
        (
            "Waste: the share of the tokens each kind of forward pass computed that no real token needed (padding, "
            "and in decoding, rows that had already stopped)."
        ),
        "",
        "| size | engine calls (turns) | generation: prefill | generation: decode | old log-probs | ref log-probs | update forward + backward | prefill tokens kept from earlier turns (not computed) |",
        "|---" * 8 + "|",
    ]
    for r in rows:
        c = r["summary"]["counts"]
        lines.append(
            f"| {r['size']} | {c['engine calls']:.0f} | {padding_share(c, 'prefill'):.0%} | {padding_share(c, 'decode'):.0%} | "
            f"{padding_share(c, 'old log-probs'):.0%} | {padding_share(c, 'ref log-probs'):.0%} | {padding_share(c, 'update forward'):.0%} | "
            f"{c.get('prefill tokens kept', 0) / max(c.get('prefill tokens kept', 0) + c.get('prefill tokens', 0), 1):.0%} |"
        )
    return "\n".join(lines) + "\n"


def parse_sizes(text: str, sft_steps: str, known) -> tuple[list[str], dict[str, int]]:
    """--sizes and --sft-steps, checked: a size needs overrides and a warm-start step count."""
    sizes = [s for s in text.split(",") if s]
    unknown = [s for s in sizes if s not in known]
    if not sizes or unknown:
        raise SystemExit(f"--sizes {text!r}: unknown size(s) {unknown or '(none given)'}; known: {', '.join(known)}")
    try:
        steps = {k: int(v) for k, v in (item.split("=") for item in sft_steps.split(","))}
    except ValueError:
        raise SystemExit(f"--sft-steps {sft_steps!r}: expected size=steps pairs, e.g. {SFT_STEPS}") from None
    missing = [s for s in sizes if s not in steps or steps[s] < 1]
    if missing:
        raise SystemExit(f"--sft-steps {sft_steps!r} gives no positive warm-start step count for {', '.join(missing)}")
    return sizes, steps


def main(argv: list[str] | None = None) -> int:
    from benchmarks.mfu import SIZES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes", default="tiny,20m", help=f"model sizes (benchmarks/mfu.py's overrides): {', '.join(SIZES)}"
    )
    parser.add_argument("--steps", type=int, default=5, help="measured steps per round, after the warm-up")
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="rounds per size, sizes alternating; each starts from the same policy and "
        "seed (the same work), so rounds differ by timing noise only, and the steps of all rounds are pooled",
    )
    parser.add_argument("--warmup", type=int, default=1, help="steps run first and not measured")
    parser.add_argument(
        "--sft-steps", default=SFT_STEPS, help="warm-start SFT steps per size (the cache folder's name)"
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="seconds to wait at most, before each step, for other processes to "
        "leave the CPU (the machine is shared); 0: never wait",
    )
    parser.add_argument("--extra-steps", type=int, default=3, help="steps run at most to make up for contended ones")
    parser.add_argument(
        "--home",
        type=Path,
        default=Path("/tmp/rollout-bench"),
        help="warm-start cache (benchmarks/rollout_engines.py's)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    sizes, sft_steps = parse_sizes(args.sizes, args.sft_steps, SIZES)
    if min(args.steps, args.repeats) < 1 or min(args.warmup, args.quiet_wait, args.extra_steps) < 0:
        parser.error(
            f"--steps and --repeats must be >= 1; --warmup, --quiet-wait and --extra-steps >= 0 "
            f"(got {args.steps}, {args.repeats}, {args.warmup}, {args.quiet_wait}, {args.extra_steps})"
        )

    import torch

    from assets.resources import SandboxResource
    from configs import load_profile

    torch.set_num_threads(2)
    started = time.perf_counter()
    records: dict[str, list[dict]] = {size: [] for size in sizes}
    rounds: dict[str, list[dict]] = {size: [] for size in sizes}
    with SandboxResource.from_config(load_profile("tiny").sandbox).open() as box:
        # a missing warm start is built first, untimed
        policies = {size: setup(size, sft_steps[size], args.home, box) for size in sizes}
        for repeat in range(args.repeats):
            for size in sizes:
                cfg = load_profile("tiny", SIZES[size])
                start = time.perf_counter()
                run = profile_round(
                    cfg,
                    policies[size],
                    box,
                    steps=args.steps,
                    warmup=args.warmup,
                    quiet_wait_s=args.quiet_wait,
                    extra_steps=args.extra_steps,
                )
                for record in run:
                    record["repeat"] = repeat
                records[size] += run
                walls = [r["wall_s"] for r in measured(run)]
                rounds[size].append({"round_s": time.perf_counter() - start, "median_wall_s": statistics.median(walls)})
                print(
                    f"[profile] {size} round {repeat + 1}/{args.repeats}: {statistics.median(walls):.2f}s per step "
                    f"[{min(walls):.2f}, {max(walls):.2f}]",
                    flush=True,
                )
    rows = []
    for size in sizes:
        cfg, summary = load_profile("tiny", SIZES[size]), summarize(records[size])
        rows.append(
            {
                "size": size,
                "parameters": policies[size].parameters,
                "matmul_parameters": policies[size].matmul_parameters,
                "prompts_per_step": cfg.rl.prompts_per_step,
                "group_size": cfg.rl.group_size,
                "rounds": rounds[size],
                "checkpoint_mb": statistics.median(sum(r["checkpoint_bytes"].values()) for r in measured(records[size]))
                / 1e6,
                "summary": summary,
                "steps": records[size],
            }
        )
        print(
            f"[profile] {size}: {summary['wall_s']:.2f}s per step; "
            + ", ".join(
                f"{stage} {summary['stages'][stage]['median_s']:.2f}s ({summary['stages'][stage]['share']:.0%})"
                for stage in STAGES
            ),
            flush=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    version = code_version()
    (args.out / "rl-step-profile.json").write_text(
        json.dumps(
            {
                "command": " ".join(["benchmarks/rl_step_profile.py", *(argv or sys.argv[1:])]),
                "code": version,
                "run_s": time.perf_counter() - started,
                "rows": rows,
            },
            indent=1,
        )
    )
    text = version_line(version) + "\n\n" + markdown(rows)
    (args.out / "rl-step-profile.md").write_text(text)
    plot(rows, args.out / "rl-step-profile.png")
    print(text)
    print(f"[profile] done in {time.perf_counter() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
