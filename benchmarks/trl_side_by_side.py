"""One GRPO step of ours against one of TRL's `GRPOTrainer`, on the same work, alternating (issue 9, part 1).

    .venv/bin/python benchmarks/trl_side_by_side.py --home /tmp/rollout-bench [--sizes tiny,20m] [--steps 6]

TRL is not a dependency of the product: `bash scripts/setup.sh --bench` installs its pin into `.venv`.

The same work on both sides, per size:
- the same model and tokenizer: the size's warm-started policy (benchmarks/rollout_engines.py's
  cache), loaded from the same folder by each side;
- the same prompts per step: `--prompts` arithmetic tasks, in the same order, x `--group` samples;
- the same tool: our code interpreter (the bubblewrap sandbox), one pool per side; TRL calls it as
  a Python function `code(code)`, once per call, as its tool loop does;
- the same tokens: TRL gets a chat template that renders our tag protocol (a prompt is its text,
  a tool call is `<code>…</code>`, a tool message is `<interpreter>…</interpreter>`) and a
  response template that parses `<code>…</code>` as a call, so both sides sample from the same
  distribution over the same token sequences; generation stops at `</code>`, `</answer>` and EOS;
- the same limits: `--completion-tokens` per trajectory (ours: prompt + that many; TRL:
  `max_completion_length`), `--tool-turns` tool calls (ours: `max_turns` = that + 1; TRL:
  `max_tool_calling_iterations`), temperature 1;
- the same algorithm: GRPO, group-normalized advantages, PPO clip 0.2, K3 KL to the reference in
  the loss with beta 0.01, token-mean loss over the batch (TRL's `dapo`), AdamW (0.9, 0.99), lr
  `--lr` (constant), no weight decay, grad clip 1, one optimizer step per batch (ours:
  `rl.minibatches: 1`), every trajectory trained (ours: `rl.drop_zero_variance_groups: false`);
- the same reward: our verifier cascade scores both sides' trajectories.
Each side keeps its own defaults otherwise: ours its HF engine (batched, KV cache kept, tools
batched on threads) and old log-probs pass; TRL its `model.generate` and tool loop.

Each side runs in a child process that stops after every optimizer step until told to go on; the
parent alternates them (the first mover alternating too), so both see the same machine state.
A step is timed from "go" to the end of its optimizer step. Peak RSS is the child's process tree
(sandbox workers included) sampled every 0.2 s during its steps. The first `--warmup` steps of
each side are not counted. Writes benchmarks/results/trl-side-by-side.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRL_PIN = "1.16.0"
KL_COEF, CLIP, GRAD_CLIP = 0.01, 0.2, 1.0

# Our tag protocol as a chat template (see module docstring). Prefix-preserving, as TRL's tool
# loop requires: an assistant message ending on a tool call renders no end-of-turn token.
PROTOCOL_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' or message.role == 'system' -%}{{ message.content }}"
    "{%- elif message.role == 'assistant' -%}{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- if call.function.name == 'code' -%}<code>{{ call.function.arguments.code | default('') }}</code>"
    "{%- else -%}<{{ call.function.name }}>{{ call.function.arguments | tojson }}</{{ call.function.name }}>{%- endif -%}"  # no such tool here
    "{%- endfor -%}"
    "{%- if not message.tool_calls -%}<|endoftext|>{%- endif -%}"
    "{%- elif message.role == 'tool' -%}<interpreter>{{ message.content }}</interpreter>"
    "{%- endif -%}"
    "{%- endfor -%}"
)
# transformers' response template (>= 5.13): `<code>…</code>` is a call to `code`, the rest is content.
# The protocol has no assistant header, so the response starts where the prompt so far ends (\Z).
PROTOCOL_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor_pattern": r"\Z",
    "fields": {
        "tool_calls": {
            "open": "<code>",
            "close_pattern": r"</code>",
            "repeats": True,
            "content": "text",
            "transform": {"type": "function", "function": {"name": "code", "arguments": {"code": "{content}"}}},
        },
        "content": {"close_pattern": r"<\|endoftext\|>|$", "content": "text"},
    },
}


# --------------------------------------------------------------------------- the shared job
def step_tasks(tasks: list[dict], prompts: int, steps: int) -> list[list[dict]]:
    """The arithmetic tasks of each step, in order; both sides read the same lists."""
    pool = [t for t in tasks if t["family"] == "arithmetic"]
    if len(pool) < prompts * steps:
        raise ValueError(
            f"{prompts} prompts x {steps} steps needs {prompts * steps} arithmetic tasks; the cache has {len(pool)}"
        )
    return [pool[i * prompts : (i + 1) * prompts] for i in range(steps)]


def observation_mask(ids: list[int], open_id: int, close_id: int) -> list[int]:
    """1 for the policy's tokens, 0 inside (and on) `<interpreter>…</interpreter>`: our tool_mask."""
    mask, inside = [], False
    for token in ids:
        inside = inside or token == open_id
        mask.append(0 if inside else 1)
        inside = inside and token != close_id
    return mask


class Stages:
    """Seconds per stage within the current step: generation (the model sampling), tools (the
    interpreter's calls), verification (our cascade); the step's remainder is training (log-prob
    passes, loss, backward, optimizer) and bookkeeping. The same cut on both sides."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, stage: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

        return timed

    def take(self, wall_s: float) -> dict[str, float]:
        out = {stage: round(self.seconds.get(stage, 0.0), 3) for stage in ("generation", "tools", "verification")}
        out["training"] = round(wall_s - sum(out.values()), 3)
        self.seconds = {}
        return out


class Gate:
    """The child's side of the alternation: report a finished step on stdout, wait for 'go'."""

    def __init__(self) -> None:
        self.resumed = 0.0
        self.out = os.fdopen(os.dup(1), "w")  # the protocol's own stream; libraries' prints go to stderr
        os.dup2(2, 1)

    def send(self, message: dict) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def wait(self) -> None:
        line = sys.stdin.readline().strip()
        if line != "go":
            raise SystemExit(0)  # "stop" or the parent gone
        self.resumed = time.perf_counter()

    def step_done(self, stats: dict, stages: Stages) -> None:
        wall = time.perf_counter() - self.resumed
        self.send({"wall_s": wall, **stats, "stages": stages.take(wall)})
        self.wait()


def _sandbox():
    from assets.resources import SandboxResource
    from configs.schema import SandboxConfig

    return SandboxResource.from_config(SandboxConfig()).open()


# --------------------------------------------------------------------------- ours
def run_ours(job: dict, gate: Gate) -> None:
    import torch

    import training.rl.loop as rl_loop
    from configs import load_profile
    from environments.families import build_tools
    from training.model import load_policy, load_tokenizer
    from verifiers.cascade import Cascade

    torch.set_num_threads(job["threads"])
    folder, steps = Path(job["folder"]), job["steps"]
    longest = max(len(t["prompt"]) for batch in steps for t in batch)  # characters bound tokens from above
    cfg = load_profile(
        "tiny",
        {
            **job["overrides"],
            "rl.group_size": job["group"],
            "rl.prompts_per_step": job["prompts"],
            "rl.steps_per_round": len(steps),
            "rl.minibatches": 1,
            "rl.drop_zero_variance_groups": False,
            "rl.learning_rate": job["lr"],
            "rl.kl_coef": KL_COEF,
            "rl.grad_clip": GRAD_CLIP,
            "rl.clip_low": CLIP,
            "rl.clip_high": CLIP,
            "rollout.max_turns": job["tool_turns"] + 1,
            "rollout.max_new_tokens_per_turn": job["completion_tokens"],
            "rollout.max_observation_tokens": job["completion_tokens"],
        },
    )
    policy, reference, tok = load_policy(folder), load_policy(folder), load_tokenizer(folder)
    reference.requires_grad_(False).eval()
    # The completion budget: ours counts prompt + completion, so each prompt gets exactly
    # `completion_tokens` more. A per-episode total is not a config field; the longest prompt's is the
    # closest fixed one, which only matters to the rare trajectory that reaches the limit.
    cfg = cfg.model_copy(
        update={"rollout": cfg.rollout.model_copy(update={"max_total_tokens": longest + job["completion_tokens"]})}
    )
    queue = [list(batch) for batch in steps]
    # the job's prompts, in order (not the curriculum's draw)
    rl_loop.sample_prompts = lambda tasks, weights, k, rng: queue.pop(0)
    by_id = {t["task_id"]: t for batch in steps for t in batch}
    stages, build = Stages(), rl_loop.build_rollout_engine

    def timed_engine(*args, **kwargs):
        engine = build(*args, **kwargs)
        for method in ("generate", "submit", "poll"):  # turn-by-turn engines generate; continuous ones submit and poll
            if hasattr(engine, method):
                setattr(engine, method, stages.wrap("generation", getattr(engine, method)))
        return engine

    rl_loop.build_rollout_engine = timed_engine
    rl_loop.score_records = stages.wrap("verification", rl_loop.score_records)

    def on_step(step: int, metrics: dict) -> None:
        n = job["prompts"] * job["group"]
        gate.step_done(
            {
                "generated_tokens": round(metrics["rollout/policy_tokens"] * n),
                "trained_tokens": round(metrics["rollout/policy_tokens"] * n),
                "reward_mean": metrics["reward/total/mean"],
                "pass_rate": metrics["reward/outcome/pass_rate"],
                "tool_call_rate": metrics["rollout/tool_call_rate"],
            },
            stages,
        )

    with _sandbox() as box:
        tools = build_tools(sandbox=box, kb=None)
        for tool in tools.values():
            tool.call_many = stages.wrap("tools", tool.call_many)
        gate.send({"ready": True})
        gate.wait()
        rl_loop.train_round(
            policy,
            reference,
            tok,
            list(by_id.values()),
            tools,
            rl=cfg.rl,
            rollout=cfg.rollout,
            cascade=Cascade(cfg.reward, box, concurrency=cfg.sandbox.pool_size),
            round_index=1,
            policy_version="bench",
            seed=0,
            on_step=on_step,
        )


# --------------------------------------------------------------------------- TRL
def run_trl(job: dict, gate: Gate) -> None:
    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    from configs import load_profile
    from environments.families import build_tools
    from training.model import load_policy, load_tokenizer
    from training.rl.scoring import score_records
    from training.tokenizer import tag_ids
    from verifiers.cascade import Cascade
    from verifiers.protocol import ANSWER_CLOSE, CODE_CLOSE, OBS_CLOSE, OBS_OPEN

    if trl.__version__ != TRL_PIN:
        raise SystemExit(
            f"TRL {trl.__version__} is installed; this benchmark is pinned to {TRL_PIN} (bash scripts/setup.sh --bench)"
        )
    torch.set_num_threads(job["threads"])
    folder, steps, group = Path(job["folder"]), job["steps"], job["group"]
    cfg = load_profile("tiny", job["overrides"])
    model, tok = load_policy(folder), load_tokenizer(folder)
    tags = tag_ids(tok)
    tok.chat_template = PROTOCOL_CHAT_TEMPLATE
    tok.response_template = PROTOCOL_RESPONSE_TEMPLATE
    model.generation_config.eos_token_id = [tok.eos_token_id, tags[CODE_CLOSE], tags[ANSWER_CLOSE]]  # our stops
    by_id = {t["task_id"]: t for batch in steps for t in batch}
    rows = [
        {"prompt": [{"role": "user", "content": t["prompt"]}], "task_id": t["task_id"]}
        for batch in steps
        for t in batch
    ]
    seen = {"step": 0}
    counts: dict = {}
    stages = Stages()

    with _sandbox() as box:
        cascade = Cascade(cfg.reward, box, concurrency=cfg.sandbox.pool_size)
        run_code = stages.wrap("tools", build_tools(sandbox=box, kb=None)["code"].call_many)

        def code(code: str) -> str:
            """Run a Python program in the sandbox and return what it printed.

            Args:
                code: The Python program to run.
            """
            return run_code([code])[0].observation

        def verified_reward(prompts, completions, completion_ids, task_id, **_) -> list[float]:
            """Our cascade on the same records our loop would store (policy tokens only)."""
            records = []
            for i, (ids, tid) in enumerate(zip(completion_ids, task_id)):
                task = by_id[tid]
                mask = observation_mask(ids, tags[OBS_OPEN], tags[OBS_CLOSE])
                records.append(
                    {
                        "trajectory_id": f"s{seen['step']}-{i}",
                        "task_id": tid,
                        "group_id": f"s{seen['step']}-{i // group}",
                        "family": task["family"],
                        "level": task["level"],
                        "round": 1,
                        "step": seen["step"],
                        "completion_ids": ids,
                        "tool_mask": mask,
                        "num_tool_calls": ids.count(tags[CODE_CLOSE]),
                    }
                )
            scores = stages.wrap("verification", score_records)(records, by_id, tok, cascade)
            counts.update(
                generated=sum(sum(r["tool_mask"]) for r in records),
                calls=[r["num_tool_calls"] for r in records],
                rewards=[s["reward"] for s in scores],
                outcomes=[s["outcome"] or 0.0 for s in scores],
            )
            return [s["reward"] for s in scores]

        class Alternate(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                seen["step"] += 1
                gate.step_done(
                    {
                        "generated_tokens": counts["generated"],
                        "trained_tokens": counts["generated"],
                        "reward_mean": statistics.fmean(counts["rewards"]),
                        "pass_rate": statistics.fmean(counts["outcomes"]),
                        "tool_call_rate": sum(c > 0 for c in counts["calls"]) / len(counts["calls"]),
                    },
                    stages,
                )

        args = trl.GRPOConfig(
            output_dir=tempfile.mkdtemp(prefix="trl-bench-"),
            use_cpu=True,
            bf16=False,
            seed=0,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            max_steps=len(steps),
            shuffle_dataset=False,
            dataloader_num_workers=0,
            per_device_train_batch_size=job["prompts"] * group,
            gradient_accumulation_steps=1,
            num_generations=group,
            num_iterations=1,
            max_completion_length=job["completion_tokens"],
            max_tool_calling_iterations=job["tool_turns"],
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=KL_COEF,
            epsilon=CLIP,
            loss_type="dapo",
            scale_rewards="group",
            learning_rate=job["lr"],
            lr_scheduler_type="constant",
            warmup_steps=0,
            adam_beta1=0.9,
            adam_beta2=0.99,
            weight_decay=0.0,
            max_grad_norm=GRAD_CLIP,
        )
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=verified_reward,
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tok,
            tools=[code],
            callbacks=[Alternate()],
        )
        trainer._generate_single_turn = stages.wrap("generation", trainer._generate_single_turn)
        gate.send({"ready": True})
        gate.wait()
        trainer.train()


# --------------------------------------------------------------------------- the parent
class Side:
    def __init__(self, name: str, job_file: Path) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", name, "--job", str(job_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self.steps: list[dict] = []
        self.peak_mb = 0.0
        self.receive()  # "ready": models loaded, trainer built

    def receive(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} side exited (code {self.proc.wait()}); its stderr is above")
        return json.loads(line)

    def step(self) -> dict:
        from benchmarks.flywheel_by_asset import tree_rss_mb

        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.2):  # a /proc walk costs CPU; 0.2 s keeps it small
                self.peak_mb = max(self.peak_mb, tree_rss_mb(self.proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        result = self.receive()
        done.set()
        sampler.join()
        self.steps.append(result)
        return result

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            self.proc.wait(timeout=60)


def summarize(side: Side, warmup: int) -> dict:
    measured = side.steps[warmup:]
    walls = [s["wall_s"] for s in measured]
    return {
        "steps": len(measured),
        "wall_median_s": round(statistics.median(walls), 3),
        "wall_min_s": round(min(walls), 3),
        "wall_max_s": round(max(walls), 3),
        "generated_tokens_per_s": round(statistics.median(s["generated_tokens"] / s["wall_s"] for s in measured), 1),
        "trained_tokens_per_s": round(statistics.median(s["trained_tokens"] / s["wall_s"] for s in measured), 1),
        "generated_tokens_per_step": round(statistics.median(s["generated_tokens"] for s in measured)),
        "tool_call_rate": round(statistics.median(s["tool_call_rate"] for s in measured), 3),
        "reward_mean": round(statistics.median(s["reward_mean"] for s in measured), 3),
        "stages_median_s": {
            k: round(statistics.median(s["stages"][k] for s in measured), 3) for k in measured[0]["stages"]
        },
        "peak_rss_mb": round(side.peak_mb),
        "per_step": measured,
    }


def plot(rows: list[dict], path: Path) -> None:
    """Per size: each measured step's wall time, ours and TRL's, in the order they ran, with the
    medians as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, panels = plt.subplots(1, len(rows), figsize=(5 * len(rows), 3.6), squeeze=False)
    for ax, row in zip(panels[0], rows):
        for name, color in (("ours", "tab:blue"), ("trl", "tab:orange")):
            walls = [s["wall_s"] for s in row[name]["per_step"]]
            ax.plot(
                range(1, len(walls) + 1),
                walls,
                "o-",
                color=color,
                label=f"{'ours' if name == 'ours' else 'TRL'}: median {row[name]['wall_median_s']:.2f} s",
            )
            ax.axhline(row[name]["wall_median_s"], color=color, linestyle=":")
        ax.set_title(
            f"{row['size']} ({row['parameters_m']}M), {row['prompts'] * row['group']} trajectories: ours / TRL = {row['ratio_ours_over_trl']}",
            fontsize=9,
        )
        ax.set_xlabel("measured step")
        ax.set_ylabel("GRPO step wall (s)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--home",
        type=Path,
        default=Path("/tmp/rollout-bench"),
        help="warm-started model cache (benchmarks/rollout_engines.py)",
    )
    parser.add_argument("--sizes", default="tiny,20m")
    parser.add_argument(
        "--sft-steps",
        default="tiny=400,20m=400",
        help="warm-start SFT steps per size (20m: 150 steps left it calling tools too rarely)",
    )
    parser.add_argument(
        "--prompts",
        default="tiny=32,20m=16",
        help="prompts per step per size (the tiny profile: 32) (x --group trajectories)",
    )
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6, help="measured steps per side")
    parser.add_argument("--warmup", type=int, default=1, help="steps per side not measured")
    parser.add_argument("--completion-tokens", type=int, default=128)
    parser.add_argument("--tool-turns", type=int, default=3)
    parser.add_argument(
        "--lr",
        default="tiny=2e-4,20m=2e-5",
        help="learning rate per size, both sides (tiny: the profile's; at 2e-4 "
        "the 20m policy stops calling tools after one step, and the steps measured are no longer agentic)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--replot", action="store_true", help="only redraw trl-side-by-side.png from the JSON in --out")
    parser.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        gate = Gate()
        job = json.loads(args.job.read_text())
        (run_ours if args.child == "ours" else run_trl)(job, gate)
        return 0

    if args.replot:
        results = args.out / "trl-side-by-side.json"
        if not results.exists():
            parser.error(f"--replot: {results} does not exist; run the benchmark first")
        plot(json.loads(results.read_text())["rows"], args.out / "trl-side-by-side.png")
        return 0
    if args.steps < 1 or args.warmup < 0 or args.group < 2:
        parser.error("--steps must be >= 1, --warmup >= 0 and --group >= 2 (GRPO needs a group)")
    try:
        import trl
    except ImportError:
        parser.error(f"TRL is not installed: run `bash scripts/setup.sh --bench` (installs trl=={TRL_PIN} into .venv)")
    if trl.__version__ != TRL_PIN:
        parser.error(
            f"TRL {trl.__version__} is installed; this benchmark is pinned to {TRL_PIN}: run `bash scripts/setup.sh --bench`"
        )

    from benchmarks.rollout_engines import SIZES, warm_model

    sft_steps = dict(item.split("=") for item in args.sft_steps.split(","))
    prompts = dict(item.split("=") for item in args.prompts.split(","))
    rates = dict(item.split("=") for item in args.lr.split(","))
    rows = []
    for size in args.sizes.split(","):
        if size not in SIZES or size not in sft_steps or size not in prompts or size not in rates:
            parser.error(
                f"--sizes: {size!r} needs an entry in SIZES ({', '.join(SIZES)}), --sft-steps, --prompts and --lr"
            )
        with _sandbox() as box:
            cfg, folder, model, _, tasks, _ = warm_model(size, int(sft_steps[size]), args.home, box)
        n_params = sum(p.numel() for p in model.parameters())
        del model
        total = args.warmup + args.steps
        job = {
            "folder": str(folder),
            "overrides": SIZES[size],
            "group": args.group,
            "prompts": int(prompts[size]),
            "threads": args.threads,
            "lr": float(rates[size]),
            "completion_tokens": args.completion_tokens,
            "tool_turns": args.tool_turns,
            "steps": step_tasks(tasks, int(prompts[size]), total),
        }
        with tempfile.TemporaryDirectory() as tmp:
            job_file = Path(tmp) / "job.json"
            job_file.write_text(json.dumps(job))
            sides = [Side("ours", job_file), Side("trl", job_file)]
            try:
                for step in range(total):
                    for side in sides if step % 2 == 0 else sides[::-1]:  # who goes first alternates too
                        r = side.step()
                        print(
                            f"[bench] {size} step {step + 1}/{total} {side.name:>4}: {r['wall_s']:.2f}s, {r['generated_tokens']} policy tokens, "
                            f"tool calls in {r['tool_call_rate']:.0%}, reward {r['reward_mean']:.3f}; "
                            + ", ".join(f"{k} {v:.2f}s" for k, v in r["stages"].items())
                            + (" (warm-up)" if step < args.warmup else ""),
                            flush=True,
                        )
            finally:
                for side in sides:
                    side.close()
        ours, theirs = summarize(sides[0], args.warmup), summarize(sides[1], args.warmup)
        rows.append(
            {
                "size": size,
                "parameters_m": round(n_params / 1e6, 2),
                "prompts": int(prompts[size]),
                "group": args.group,
                "lr": float(rates[size]),
                "ours": ours,
                "trl": theirs,
                "ratio_ours_over_trl": round(ours["wall_median_s"] / theirs["wall_median_s"], 3),
                "ratio_trl_over_ours": round(theirs["wall_median_s"] / ours["wall_median_s"], 2),
            }
        )
        print(
            f"[bench] {size}: ours {ours['wall_median_s']}s vs TRL {theirs['wall_median_s']}s a step: ours / TRL = {rows[-1]['ratio_ours_over_trl']}",
            flush=True,
        )

    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(
        [".venv/bin/python benchmarks/trl_side_by_side.py", *(argv if argv is not None else sys.argv[1:])]
    )
    (args.out / "trl-side-by-side.json").write_text(
        json.dumps(
            {
                "command": command,
                "trl": TRL_PIN,
                "completion_tokens": args.completion_tokens,
                "tool_turns": args.tool_turns,
                "rows": rows,
            },
            indent=1,
        )
    )
    lines = [
        f"`{command}` (TRL {TRL_PIN}, group {args.group}, {args.completion_tokens} completion tokens, {args.tool_turns} tool turns, "
        f"median of {args.steps} steps after {args.warmup} warm-up)",
        "",
        "| size | params (M) | trajectories / step | lr | side | step wall, median (min-max) s | generated tok/s | trained tok/s | peak RSS (MB) "
        "| tool-call rate | mean reward | ours / TRL |",
        "|---" * 12 + "|",
    ]
    for r in rows:
        for name in ("ours", "trl"):
            s = r[name]
            lines.append(
                f"| {r['size']} | {r['parameters_m']} | {r['prompts'] * r['group']} | {r['lr']:g} | {name} | {s['wall_median_s']} ({s['wall_min_s']}-{s['wall_max_s']}) "
                f"| {s['generated_tokens_per_s']} | {s['trained_tokens_per_s']} | {s['peak_rss_mb']:,} | {s['tool_call_rate']} | {s['reward_mean']} "
                f"| {'**' + str(r['ratio_ours_over_trl']) + '**' if name == 'ours' else ''} |"
            )
    plot(rows, args.out / "trl-side-by-side.png")
    table = "\n".join(lines)
    (args.out / "trl-side-by-side.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
