"""What the before/after benchmarks on warm-started policies share (benchmarks/hf_engine_work.py,
benchmarks/verify_overlap.py): their command line, the batch they draw, and the policies with the
real tools, one size at a time."""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(doc: str, argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, default=Path("/tmp/rollout-bench"))
    parser.add_argument("--sizes", default="tiny,20m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sft-steps", type=int, default=400)
    return parser.parse_args(argv)


def commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()


def families_in_turn(tasks: list[dict], n: int) -> list[dict]:
    """n tasks, the families in turn (the tiny profile's step draws them about evenly)."""
    by_family: dict[str, list[dict]] = {}
    for t in tasks:
        by_family.setdefault(t["family"], []).append(t)
    families = sorted(by_family)
    return [by_family[families[i % len(families)]][i // len(families)] for i in range(n)]


def warm_policies(args: argparse.Namespace, sandbox) -> Iterator[tuple]:
    """Per size of `--sizes`: (size, cfg, model in eval mode, tokenizer, tasks, real tools), the
    policy warm-started by benchmarks/rollout_engines.py's `warm_model` (cached under `--home`)."""
    import torch

    from benchmarks.rollout_engines import warm_model
    from environments.base import KnowledgeBase
    from environments.families import build_tools

    torch.set_num_threads(2)
    args.home.mkdir(parents=True, exist_ok=True)
    for size in args.sizes.split(","):
        cfg, _, model, tok, tasks, documents = warm_model(size, args.sft_steps, args.home, sandbox)
        model.eval()
        kb = KnowledgeBase([], {}, documents)
        yield size, cfg, model, tok, tasks, build_tools(sandbox=sandbox, kb=kb, top_k=cfg.data.knowledge_base.top_k)


def write_results(name: str, header: str, lines: list[str], rows: list[dict]) -> None:
    """benchmarks/results/<name>.md (the table) and .json (the rows, with the commit), and print the table."""
    import json

    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(header + "\n".join(lines) + "\n")
    (out / f"{name}.json").write_text(json.dumps({"commit": commit(), "rows": rows}, indent=1))
    print(header + "\n".join(lines))
