"""Verifier throughput on this machine, tier by tier.

    .venv/bin/python benchmarks/verifier_throughput.py [--seconds 3] [--json PATH]
    .venv/bin/python benchmarks/verifier_throughput.py --baseline 4f7861c [--rounds 2]

With --baseline, the same measurements run on this tree and on the baseline commit (a git
worktree), alternating in one run, and the table gives each figure's ratio (this / baseline).

Prints a table and writes it as JSON:
* each registered answer verifier called through `run_verifier` (the interface training uses);
* the cascade's fast tier (answer extraction, empty/size guards, precheck), measured by the
  cascade's own per-tier clock over a realistic mix of candidates, and the whole composite
  reward (fast + verify + shaping) per second;
* the sandbox tier: trivial programs per minute through the bubblewrap pool (2 workers), the
  per-call overhead of one call at a time, and unit-test verifications per minute (candidate +
  3 tests in one sandboxed harness) through the cascade with its concurrency of 2.
Not a test: numbers depend on the machine; docs/verifiers.md records them with this command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from configs.schema import RewardConfig, VerifierSpec
from verifiers.base import run_verifier
from verifiers.cascade import Cascade
from verifiers.shaping import Candidate


def rate(fn, items, seconds: float) -> float:
    """Calls per second of fn over items, repeated for about `seconds`."""
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for item in items:
            fn(*item)
        done += len(items)
    return done / (time.perf_counter() - start)


def answer_verifiers(seconds: float) -> dict[str, float]:
    rng = random.Random(0)
    ints = [(str(v + rng.choice([0, 0, 1])), {"answer": str(v)}) for v in (rng.randint(0, 10**6) for _ in range(1000))]
    qa = [
        ("the Eiffel Tower", {"answer": "Eiffel Tower", "aliases": ["La Tour Eiffel"]}),
        ("Paris", {"answer": "London"}),
    ] * 500
    symbolic = [("2*sqrt(2)", {"answer": "sqrt(8)"}), ("x+1", {"answer": "1+x"}), ("1/2", {"answer": "0.5"})] * 20
    cases = {
        "numeric (integers)": ("numeric", ints),
        "math (integers)": ("math", ints),
        "math (symbolic)": ("math", symbolic),
        "exact_match": ("exact_match", qa),
        "token_f1": ("token_f1", qa),
    }
    return {
        label: rate(lambda p, t, n=name: run_verifier(n, p, t, {}), items, seconds)
        for label, (name, items) in cases.items()
    }


def cascade_rates(seconds: float) -> dict[str, float]:
    rng = random.Random(1)
    task = {"task_id": "t", "family": "arithmetic", "answer": "18026"}
    mix = [
        ["<code>print(347*52-18)</code>", "<answer>18026</answer>"],
        ["<answer>18025</answer>"],
        ["<answer>1</answer><answer>2</answer>"],
        ["no answer at all"],
        ["<answer> </answer>"],
    ]
    items = [(Candidate(rng.choice(mix), 20, ("code",)), task) for _ in range(1000)]
    cascade = Cascade(RewardConfig())
    per_second = rate(lambda batch: cascade.score_many(batch), [(items,)], seconds) * len(items)
    fast = cascade.stats["fast"]
    return {"fast tier checks": fast.calls / fast.seconds, "composite rewards (all tiers + shaping)": per_second}


def sandbox_rates(seconds: float) -> dict[str, float]:
    from verifiers.sandbox import BubblewrapSandbox, SandboxLimits

    tests = json.dumps(
        [{"name": f"t{i}", "code": f"assert add({i}, 1) == {i + 1}", "group": "fail_to_pass"} for i in range(3)]
    )
    task = {"task_id": "c", "family": "code", "entry_point": "add", "tests": tests, "answer": ""}
    candidate = Candidate(["<answer>def add(a, b):\n    return a + b</answer>"], 20, ())
    with BubblewrapSandbox(SandboxLimits(), pool_size=2) as box:
        box.run_many(["pass"] * 20)  # warm the workers
        codes = [f"print({i}*{i})" for i in range(400)]
        start = time.perf_counter()
        assert all(r.ok for r in box.run_many(codes))
        runs_per_min = len(codes) / (time.perf_counter() - start) * 60
        one = time.perf_counter()
        for code in codes[:100]:
            box.run_python(code)
        per_call_ms = (time.perf_counter() - one) / 100 * 1000
        cfg = RewardConfig(verifiers={"code": VerifierSpec(name="unit_tests")}, terms={})
        cascade = Cascade(cfg, box, concurrency=2)
        batch = [(candidate, task)] * 100
        scored = rate(lambda b: cascade.score_many(b), [(batch,)], seconds) * len(batch)
        assert all(r.outcome == 1.0 for r in cascade.score_many(batch[:4]))
    return {
        "sandbox runs/min (trivial programs, 2 workers)": runs_per_min,
        "sandbox ms per call (one at a time)": per_call_ms,
        "code verifications/min (3 unit tests, cascade, 2 workers)": scored * 60,
    }


def measure(seconds: float) -> dict:
    return {
        "answer verifiers (checks/s)": answer_verifiers(seconds),
        "cascade (per s)": cascade_rates(seconds),
        "sandbox": sandbox_rates(seconds),
    }


def _run_tree(root: Path, seconds: float) -> dict:
    """This script's measurements with `root`'s packages first on the path, in a fresh process."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = {**os.environ, "PYTHONPATH": str(root)}
        subprocess.run(
            [sys.executable, __file__, "--seconds", str(seconds), "--json", out.name, "--quiet"],
            cwd=root,
            env=env,
            check=True,
        )
        return json.loads(Path(out.name).read_text())


def side_by_side(baseline: str, seconds: float, rounds: int) -> dict:
    """Median of `rounds` alternating runs on each tree, and this tree's ratio to the baseline."""
    here = Path(__file__).resolve().parents[1]
    commit = subprocess.run(
        ["git", "-C", str(here), "rev-parse", "--short", baseline], capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(here), "worktree", "add", "--detach", str(base), commit], check=True, capture_output=True
        )
        try:
            runs: dict[str, list[dict]] = {"baseline": [], "this": []}
            for i in range(rounds):
                for name, root in (("baseline", base), ("this", here)):
                    print(f"round {i + 1}/{rounds}: {name}", flush=True)
                    runs[name].append(_run_tree(root, seconds))
        finally:
            subprocess.run(["git", "-C", str(here), "worktree", "remove", "--force", str(base)], check=False)
    table = {}
    for section, figures in runs["this"][0].items():
        if not isinstance(figures, dict):
            continue
        for label in figures:
            b = statistics.median(r[section][label] for r in runs["baseline"] if label in r.get(section, {}))
            t = statistics.median(r[section][label] for r in runs["this"])
            table[f"{section} / {label}"] = {"baseline": b, "this": t, "ratio": t / b if b else float("nan")}
    return {"baseline": commit, "rounds": rounds, "figures": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="default benchmarks/results/verifier_throughput.json (-side-by-side.json with --baseline)",
    )
    parser.add_argument("--baseline", help="a commit to measure side by side with this tree")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs per tree with --baseline")
    parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline:
        result = side_by_side(args.baseline, args.seconds, args.rounds)
        print(f"{'figure':<90} {'baseline':>12} {'this':>12} {'ratio':>7}")
        for label, row in result["figures"].items():
            print(f"{label:<90} {row['baseline']:>12,.1f} {row['this']:>12,.1f} {row['ratio']:>7.2f}")
        path = args.json or Path("benchmarks/results/verifier_throughput-side-by-side.json")
    else:
        result = measure(args.seconds)
        if not args.quiet:
            for section, figures in result.items():
                print(section)
                for label, value in figures.items():
                    print(f"  {label:<58} {value:>12,.1f}")
        path = args.json or Path("benchmarks/results/verifier_throughput.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"machine": platform.machine(), "python": platform.python_version(), **result}, indent=1)
    )
    if not args.quiet:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
