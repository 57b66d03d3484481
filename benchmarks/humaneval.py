"""A benchmark suite (HumanEval by default) for one model, outside a flywheel: the same code the
benchmark assets run (`assets/benchmark.py::evaluate_suite`: the suite's budgets, samples and
verifier, the sandbox, pass@1 and pass@k with CIs, prompts over budget counted).

    .venv/bin/python benchmarks/humaneval.py --profile smol                 # the profile's pretrained model, zero-shot
    .venv/bin/python benchmarks/humaneval.py --profile smol --model DIR     # a checkpoint folder (python -m pipelines.registry load --out DIR)
    .venv/bin/python benchmarks/humaneval.py --profile tiny --model DIR --limit 40 --set benchmark.suites.humaneval.samples_per_task=4

Prints the figures and writes them, with the command and the commit, to
benchmarks/results/humaneval_<profile>.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from assets.benchmark import evaluate_suite  # noqa: E402
from assets.resources import SandboxResource  # noqa: E402
from configs import load_profile, parse_override  # noqa: E402
from environments.families import build_tools  # noqa: E402
from environments.family import resolve_families  # noqa: E402
from environments.problem_files import load_problems  # noqa: E402
from training.agent.engines import build_rollout_engine  # noqa: E402
from training.data_parallel import DataParallel  # noqa: E402
from training.model import load_policy, load_tokenizer  # noqa: E402
from training.model_sources import resolve_pretrained  # noqa: E402


def commit() -> str:
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return head + (" with uncommitted changes" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="smol")
    parser.add_argument("--suite", default="humaneval", help="a name under benchmark.suites in the profile")
    parser.add_argument("--model", help="a checkpoint folder; default the profile's pretrained model")
    parser.add_argument("--limit", type=int, help="the first N problems")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    parser.add_argument("--out", type=Path, help="default benchmarks/results/humaneval_<profile>.md")
    args = parser.parse_args(argv)
    cfg = resolve_families(load_profile(args.profile, dict(parse_override(o) for o in args.set)))
    if args.suite not in cfg.benchmark.suites:
        parser.error(
            f"profile {args.profile} has no benchmark.suites.{args.suite}; it has {sorted(cfg.benchmark.suites) or 'none'}"
        )
    if args.model is None and cfg.model.source != "pretrained":
        parser.error(
            f"profile {args.profile}'s base model is built from config (random weights): give --model, a checkpoint folder"
        )
    suite = cfg.benchmark.suites[args.suite]
    folder = args.model or resolve_pretrained(cfg.model.name_or_path)
    tasks = load_problems(suite.file, suite=args.suite, limit=args.limit or suite.limit)
    model, tok = (
        load_policy(folder, cfg.model.dtype, "cpu" if cfg.device == "cpu" else cfg.device),
        load_tokenizer(folder),
    )
    start = time.perf_counter()
    with SandboxResource.from_config(cfg.sandbox).open() as box:
        engine = build_rollout_engine(cfg.rollout, model, tok, seed=cfg.seed)
        try:
            figures = evaluate_suite(
                cfg, args.suite, tasks, engine, tok, build_tools(sandbox=box, kb=None), box, DataParallel.current()
            )
        finally:
            engine.close()
    minutes = (time.perf_counter() - start) / 60
    name = args.suite
    rows = [f"| {m.removeprefix(name + '.')} | {v:.3f} |" for m, v in figures.items()]
    command = "python benchmarks/humaneval.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = "\n".join(
        [
            f"# {name}: {args.model or cfg.model.name_or_path} ({args.profile} profile)",
            "",
            f"`{command}` at {commit()}, {minutes:.1f} min on this machine; {len(tasks)} problems x {suite.samples_per_task} samples, "
            f"budget {suite.max_total_tokens or cfg.rollout.max_total_tokens} tokens.",
            "",
            "| metric | value |",
            "|---|---|",
            *rows,
            "",
        ]
    )
    out = args.out or REPO / "benchmarks" / "results" / f"humaneval_{args.profile}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
