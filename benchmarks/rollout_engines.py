"""Rollout throughput of each engine: pure generation vs the agent loop with tools, side by side.

    .venv/bin/python benchmarks/rollout_engines.py --home /tmp/rollout-bench [--sizes tiny,20m] [--engines hf,vllm,vllm-per-turn] [--tool-cores 0,1] [--replay-tools]

For each model size and engine, in one process and alternating:
  (2) agentic rollout: the batch's prompts through `run_episodes` with the real tools (bubblewrap
      sandbox, BM25 search), tool output appended and masked;
  (1) pure generation: the same prompts, engine and sampling, each prompt generating exactly as
      many tokens as its episode sampled in (2), in one engine call with no stops and no tools.
Throughput is tokens the policy sampled per wall-clock second; the ratio (2)/(1) is what tools,
extra turns and bookkeeping cost. With --replay-tools, each repeat also runs (2') the same
episodes again with every tool result replayed from (2) (same seed, so the same calls): the
loop, turns and observation prefill without the tools' own CPU, which on a 2-core machine
competes with the engine's threads. (2)/(1) vs (2')/(1) splits the overhead between the two. Engine start-up (HF: model load; vLLM: `LLM(...)`) and one vLLM
weight sync are timed too. The models are warm-started (short SFT on teacher trajectories,
benchmarks/warm_start.py) so they call tools; the tool-call rate is reported next to each figure.
With --tool-cores 0,1 each vLLM engine's agent loop runs both without and with a core kept for the
tool processes (rollout.tool_cores); pure generation always uses every core.

The size `smol` is the real SmolLM2-135M-Instruct (the `smol` profile: its own tokenizer, ChatML
template and system prompt, and the profile's rollout limits), not a model built from a config. Its
tokenizer splits every tag into several tokens, so turns stop on the tags' text (training/agent/loop.py
`TurnStops`); on vLLM each turn is then a request of its own (sessions need single-token stops), and
`vllm` and `vllm-per-turn` run the same schedule. As it ships it never writes a tool call with that
system prompt (0 of 32 arithmetic episodes of up to 128 tokens here, 0 of 900 benchmark episodes in
docs/results.md): it answers in prose or in a markdown code block, so its rollouts would be single
turns. `--sft-steps smol=N` with N > 0 first warm-starts it (SMOL_WARM_START: N SFT steps of 8 teacher
trajectories that always call their tools, as the tests' `smol_policy`); `smol=0` measures it as it
ships. Defaults for smol: 12 prompts (4 per family) x 4 samples, 16 warm-start SFT steps.
Writes benchmarks/results/rollout-engines.{json,md} (rollout-engines-replay.{json,md} with --replay-tools);
runs with smol in --sizes write rollout-engines-smol[-replay].{json,md} (--tag names another suffix).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The "20m" variant: where generation, not tools, dominates, and engine choice matters more.
SIZES = {
    "tiny": {},
    "20m": {
        "model.hidden_size": 512,
        "model.intermediate_size": 1408,
        "model.num_hidden_layers": 6,
        "model.num_attention_heads": 8,
        "model.num_key_value_heads": 8,
        "sft.batch_size": 16,
        "sft.learning_rate": 3e-4,
    },
}
# Enough data to warm-start tool use; the full tiny data set would only slow the set-up.
DATA = {
    "data.families.arithmetic.train_tasks": 1500,
    "data.families.search.train_tasks": 800,
    "data.families.code.train_tasks": 1500,
    "teacher.num_trajectories": 3000,
}
# Pretrained models, size -> profile: the profile's model from the model cache (training/model_sources.py)
# with its own tokenizer, chat template and system prompt.
PRETRAINED = {"smol": "smol"}
# The pretrained sizes' tasks (fewer than the profile's: set-up is quicker, and a benchmark uses a few
# dozen) and, for `--sft-steps smol=N` with N > 0, their warm start: tests/conftest.py's `smol_policy`
# recipe (batch 8, lr 2e-4, bf16 autocast) on teacher trajectories that always call their tools.
SMOL_WARM_START = {
    "data.families.arithmetic.train_tasks": 600,
    "data.families.search.train_tasks": 300,
    "data.families.code.train_tasks": 300,
    "teacher.num_trajectories": 160,
    "teacher.arithmetic.p_direct": 0.0,
    "teacher.search.p_direct": 0.0,
    "teacher.code.p_direct": 0.0,
    "sft.batch_size": 8,
    "sft.learning_rate": 2e-4,
    "sft.warmup_steps": 2,
    "engine.precision": "bf16",
}


def warm_model(size: str, sft_steps: int, home: Path, sandbox):
    """The size's warm-started policy, cached in `home` (a folder per size and step count)."""
    from benchmarks.warm_start import warm_started_policy
    from configs import load_profile
    from training.model import load_policy, load_tokenizer, num_parameters, save_checkpoint

    cfg = load_profile("tiny", {**DATA, **SIZES[size]})
    folder = home / f"{size}-sft{sft_steps}"
    tasks_file = folder / "tasks.json"
    if not tasks_file.exists():
        print(f"[bench] warm-starting the {size} model ({sft_steps} SFT steps)", flush=True)
        start = time.perf_counter()
        ws = warm_started_policy(cfg, sandbox, sft_steps=sft_steps, seed=0)
        save_checkpoint(ws.model, ws.tokenizer, folder)
        tasks_file.write_text(json.dumps({"tasks": ws.tasks, "kb": [d for d in ws.kb.documents]}))
        print(
            f"[bench]   done in {time.perf_counter() - start:.0f}s, SFT loss {ws.sft_history[-1]['loss/sft']:.3f}",
            flush=True,
        )
    saved = json.loads(tasks_file.read_text())
    model = load_policy(folder)
    print(f"[bench] {size}: {num_parameters(model) / 1e6:.1f}M parameters", flush=True)
    return cfg, folder, model, load_tokenizer(folder), saved["tasks"], saved["kb"]


def pretrained_model(size: str, sft_steps: int, home: Path, sandbox):
    """A PRETRAINED size's model and its profile's tasks, as `warm_model` returns them: as it ships
    (`sft_steps` 0: the model cache's folder) or after `sft_steps` warm-start SFT steps
    (SMOL_WARM_START); tasks, knowledge base and a warm-started model are cached in `home`."""
    from benchmarks.warm_start import warm_started_policy
    from configs import load_profile
    from environments.families import generate_tasks, make_kb
    from training.model import load_policy, load_tokenizer, num_parameters, save_checkpoint
    from training.model_sources import resolve_pretrained

    cfg = load_profile(PRETRAINED[size], SMOL_WARM_START)
    cache = home / f"{size}-sft{sft_steps}"
    tasks_file = cache / "tasks.json"
    if not tasks_file.exists():
        start = time.perf_counter()
        if sft_steps:
            print(f"[bench] warm-starting the {size} model ({sft_steps} SFT steps)", flush=True)
            ws = warm_started_policy(cfg, sandbox, sft_steps=sft_steps, seed=0)
            save_checkpoint(ws.model, ws.tokenizer, cache)
            tasks, kb = ws.tasks, ws.kb
            print(f"[bench]   SFT loss {ws.sft_history[-1]['loss/sft']:.3f}", flush=True)
        else:  # the tasks warm_started_policy would generate
            kb = make_kb(cfg.data.knowledge_base, 0)
            tasks = [
                t
                for family, fam in cfg.data.families.items()
                for t in generate_tasks(
                    family,
                    fam.train_tasks,
                    seed=0,
                    split="train",
                    levels=fam.levels,
                    level_weights=fam.level_weights,
                    kb=kb,
                )
            ]
        cache.mkdir(parents=True, exist_ok=True)
        tasks_file.write_text(json.dumps({"tasks": tasks, "kb": [d for d in kb.documents]}))
        print(f"[bench]   {size} set up in {time.perf_counter() - start:.0f}s", flush=True)
    saved = json.loads(tasks_file.read_text())
    folder = cache if sft_steps else Path(resolve_pretrained(cfg.model.name_or_path, cfg.model.gguf_file))
    model = load_policy(folder)
    print(f"[bench] {size}: {num_parameters(model) / 1e6:.1f}M parameters, {shipped_as(sft_steps)}", flush=True)
    return cfg, folder, model, load_tokenizer(folder), saved["tasks"], saved["kb"]


def load_size(size: str, sft_steps: int, home: Path, sandbox):
    """`warm_model` for a scratch size (SIZES), `pretrained_model` for a pretrained one (PRETRAINED)."""
    if size in PRETRAINED:
        return pretrained_model(size, sft_steps, home, sandbox)
    return warm_model(size, sft_steps, home, sandbox)


def shipped_as(sft_steps: int) -> str:
    return f"+{sft_steps} SFT steps" if sft_steps else "as shipped"


def per_size(value: str, sizes: list[str], flag: str) -> dict[str, int]:
    """`--flag 8` (every size) or `--flag tiny=32,smol=12` -> {size: int} for `sizes`."""
    if "=" not in value:
        return {size: int(value) for size in sizes}
    given = {k: int(v) for k, v in (item.split("=") for item in value.split(","))}
    missing = [size for size in sizes if size not in given]
    if missing:
        raise SystemExit(f"{flag} {value}: no entry for {', '.join(missing)}")
    return given


def pure_generation(engine, prompts: list[list[int]], lengths: list[int], sampling, seed: int) -> tuple[int, float]:
    """The same prompts, each generating exactly the number of tokens its episode sampled in the
    agentic run, in one engine call with no stops: the same work without tools or turns."""
    import torch

    start = time.perf_counter()
    out = engine.generate(
        prompts, lengths, stop_ids=set(), sampling=sampling, generator=torch.Generator().manual_seed(seed)
    )
    return sum(len(g.ids) for g in out), time.perf_counter() - start


def agentic(
    engine, tokenizer, tasks: list[dict], group: int, tools, cfg, seed: int
) -> tuple[int, float, float, float, list[int]]:
    import torch

    from training.agent.loop import run_episodes

    start = time.perf_counter()
    episodes = run_episodes(
        engine,
        tokenizer,
        tasks,
        group_size=group,
        tools=tools,
        cfg=cfg.rollout,
        generator=torch.Generator().manual_seed(seed),
    )
    wall = time.perf_counter() - start
    tool_s = sum(c["latency_s"] for e in episodes for c in e.tool_calls)
    lengths = [sum(e.tool_mask) for e in episodes]
    return sum(lengths), wall, sum(bool(e.tool_calls) for e in episodes) / len(episodes), tool_s, lengths


class Replay:
    """A tool wrapper that records results and, once replaying, answers from the record: the same
    observations at no CPU cost. Batch composition can differ between the two runs (tool timing
    decides which turns share an engine step), which can flip a rare near-tie sample; a call
    missing from the record then runs for real and is counted."""

    def __init__(self, tool) -> None:
        self.tool, self.name, self.results, self.replaying, self.misses = tool, tool.name, {}, False, 0

    def call_many(self, args: list[str]):
        missing = [a for a in args if a not in self.results] if self.replaying else args
        if missing:
            self.misses += len(missing) if self.replaying else 0
            self.results.update(zip(missing, self.tool.call_many(missing)))
        return [self.results[a] for a in args]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, default=Path("/tmp/rollout-bench"))
    parser.add_argument("--sizes", default="tiny,20m")
    parser.add_argument(
        "--engines", default="hf,vllm,vllm-per-turn", help="vllm-per-turn: vLLM with rollout.vllm.sessions off"
    )
    parser.add_argument(
        "--sft-steps",
        default="tiny=400,20m=120,smol=16",
        help="warm-start SFT steps per size (smol=0: SmolLM2 as it ships, which never calls a tool)",
    )
    parser.add_argument(
        "--prompts",
        default="tiny=32,20m=32,smol=12",
        help="tasks per batch (an RL step's prompts), per size or one number for all",
    )
    parser.add_argument(
        "--group",
        default="tiny=8,20m=8,smol=4",
        help="samples per task, per size or one number for all; batch = prompts x group",
    )
    parser.add_argument("--repeats", type=int, default=5, help="measured repeats per mode, after one warm-up")
    parser.add_argument(
        "--tool-cores",
        default="0",
        help="rollout.tool_cores settings to run the agent loop with, e.g. 0,1 "
        "(pure generation always runs on every core: the engine at its best without tools)",
    )
    parser.add_argument(
        "--replay-tools",
        action="store_true",
        help="also run each repeat's episodes with tool results replayed (no tool CPU)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--tag",
        default=None,
        help="suffix of the result files (rollout-engines-TAG.*); default: smol when --sizes has it, else none",
    )
    args = parser.parse_args(argv)

    import torch

    from assets.resources import SandboxResource
    from configs.schema import SandboxConfig
    from environments.base import KnowledgeBase
    from environments.families import build_tools
    from training.agent.chat import prompt_ids
    from training.agent.engines import HFEngine, Sampling, VLLMEngine

    torch.set_num_threads(args.threads)
    args.home.mkdir(parents=True, exist_ok=True)
    sizes = args.sizes.split(",")
    steps = per_size(args.sft_steps, sizes, "--sft-steps")
    n_prompts, groups = per_size(args.prompts, sizes, "--prompts"), per_size(args.group, sizes, "--group")
    rows = []
    with SandboxResource.from_config(SandboxConfig()).open() as box:
        for size in sizes:
            cfg, folder, model, tok, tasks, documents = load_size(size, steps[size], args.home, box)
            group = groups[size]
            tools = {
                name: Replay(tool)
                for name, tool in build_tools(
                    sandbox=box, kb=KnowledgeBase([], {}, documents), top_k=cfg.data.knowledge_base.top_k
                ).items()
            }
            by_family = {f: [t for t in tasks if t["family"] == f] for f in ("arithmetic", "search", "code")}
            batch = [
                t for i in range(n_prompts[size]) for t in [by_family[("arithmetic", "search", "code")[i % 3]][i // 3]]
            ]
            # the episodes' own prompts (the chat template with the profile's system prompt; a scratch
            # prompt renders as its text)
            prompts = [prompt_ids(tok, t, cfg.rollout.system_prompt) for t in batch for _ in range(group)]
            sampling = Sampling.of(cfg.rollout)
            # A core kept for tools only helps a schedule that generates while tools run (vLLM's); HF's
            # turn-by-turn schedule would leave it idle during generation, so HF runs on every core.
            runs = [
                (k, int(c))
                for k in args.engines.split(",")
                for c in (args.tool_cores.split(",") if k != "hf" else ["0"])
            ]
            for kind, tool_cores in runs:
                run_cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"tool_cores": tool_cores})})
                start = time.perf_counter()
                if kind == "hf":
                    from training.model import load_policy

                    engine = HFEngine(load_policy(folder), tok)  # the tokenizer: for stop strings (smol)
                else:  # "vllm": an episode is one session (KV kept between turns); "vllm-per-turn": a request per turn
                    rollout = cfg.rollout.model_copy(
                        update={"vllm": cfg.rollout.vllm.model_copy(update={"sessions": kind == "vllm"})}
                    )
                    engine = VLLMEngine(folder, rollout, seed=0)
                startup = time.perf_counter() - start
                sync_s = engine.sync_weights(model)
                pure_runs, agent_runs, replay_runs = [], [], []
                for repeat in range(args.repeats + 1):  # the first of each is a warm-up, not measured
                    for tool in tools.values():
                        tool.replaying, tool.results, tool.misses = False, {}, 0
                    agent = agentic(engine, tok, batch, group, tools, run_cfg, seed=repeat)
                    pure = pure_generation(engine, prompts, agent[4], sampling, seed=repeat)
                    replayed = None
                    if args.replay_tools:
                        for tool in tools.values():
                            tool.replaying = True
                        replayed = agentic(engine, tok, batch, group, tools, run_cfg, seed=repeat)
                    if repeat:
                        pure_runs.append(pure)
                        agent_runs.append(agent[:4])
                        if replayed:
                            replay_runs.append(replayed[:2])
                    print(
                        f"[bench] {size} {kind} tool_cores={tool_cores} #{repeat}: agentic {agent[0]} tok in {agent[1]:.2f}s; pure {pure[0]} tok in {pure[1]:.2f}s "
                        f"(tool calls in {agent[2]:.0%} of episodes, tool time {agent[3]:.2f}s)"
                        + (
                            f"; tools replayed: {replayed[0]} tok in {replayed[1]:.2f}s, {sum(t.misses for t in tools.values())} calls not in the record"
                            if replayed
                            else ""
                        ),
                        flush=True,
                    )
                engine.close()
                pure_tps = statistics.median(t / s for t, s in pure_runs)
                agent_tps = statistics.median(t / s for t, s, _, _ in agent_runs)
                rows.append(
                    {
                        # a pretrained size's label says how it ran: as it ships or warm-started
                        "size": size if size not in PRETRAINED else f"{size} ({shipped_as(steps[size])})",
                        "engine": kind,
                        "tool_cores": tool_cores,
                        "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
                        "episodes": len(prompts),
                        "startup_s": round(startup, 2),
                        "weight_sync_s": round(sync_s, 4),
                        "pure_tokens_per_s": round(pure_tps, 1),
                        "agentic_tokens_per_s": round(agent_tps, 1),
                        "ratio": round(agent_tps / pure_tps, 3),
                        "tool_call_rate": round(statistics.median(r[2] for r in agent_runs), 3),
                        "agentic_wall_s": round(statistics.median(r[1] for r in agent_runs), 2),
                        "pure_runs": pure_runs,
                        "agentic_runs": agent_runs,
                    }
                )
                if replay_runs:
                    replay_tps = statistics.median(t / s for t, s in replay_runs)
                    rows[-1] |= {
                        "replayed_tools_tokens_per_s": round(replay_tps, 1),
                        "replayed_ratio": round(replay_tps / pure_tps, 3),
                        "replayed_runs": replay_runs,
                    }
                print(
                    f"[bench] {size} {kind} tool_cores={tool_cores}: ratio {rows[-1]['ratio']}"
                    + (f", with tools replayed {rows[-1]['replayed_ratio']}" if replay_runs else ""),
                    flush=True,
                )
    args.out.mkdir(parents=True, exist_ok=True)
    replay = args.replay_tools
    tag = args.tag if args.tag is not None else ("smol" if "smol" in sizes else "")
    name = "-".join(part for part in ("rollout-engines", tag, "replay" if replay else "") if part)
    (args.out / f"{name}.json").write_text(
        json.dumps(
            {"command": " ".join(["benchmarks/rollout_engines.py", *(argv or sys.argv[1:])]), "rows": rows}, indent=1
        )
    )
    header = "| size | params (M) | engine | tool cores | start-up (s) | weight sync (s) | pure gen tok/s | agentic tok/s | agentic / pure | episodes with a tool call |"
    lines = [header + (" tools replayed: agentic / pure |" if replay else ""), "|---" * (11 if replay else 10) + "|"]
    for r in rows:
        lines.append(
            f"| {r['size']} | {r['parameters_m']} | {r['engine']} | {r['tool_cores']} | {r['startup_s']} | {r['weight_sync_s']} | {r['pure_tokens_per_s']} | "
            f"{r['agentic_tokens_per_s']} | **{r['ratio']}** | {r['tool_call_rate']:.0%} |"
            + (f" {r['replayed_ratio']} |" if replay else "")
        )
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
