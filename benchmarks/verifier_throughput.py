"""Verifier throughput on this machine: the fast tier (answer checks) and the sandbox tier.

    .venv/bin/python benchmarks/verifier_throughput.py [--seconds 3]

Prints answer checks per second for each fast-tier verifier and for the composite reward, and
sandboxed code runs per minute (trivial programs, the bubblewrap pool of 2 workers) with the
per-call overhead. Not a test: numbers depend on the machine; docs/results.md records them.
"""

from __future__ import annotations

import argparse
import random
import time

from verifiers.math_equiv import numeric_match
from verifiers.qa import exact_match, token_f1
from verifiers.rewards import RewardWeights, compute_reward


def rate(fn, items, seconds: float) -> float:
    """Calls per second of fn over items, repeated for about `seconds`."""
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for item in items:
            fn(*item)
        done += len(items)
    return done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    rng = random.Random(0)
    numbers = [(str(v + rng.choice([0, 0, 1])), str(v), 1e-6) for v in (rng.randint(0, 10**6) for _ in range(1000))]
    answers = [("the Eiffel Tower", ["Eiffel Tower", "La Tour Eiffel"]), ("Paris", "London")] * 500
    weights = RewardWeights()
    turns = [("arithmetic", ["<code>print(6*7)</code>", f"<answer>{p}</answer>"], 1, g, weights) for p, g, _ in numbers]
    print(f"fast tier, numeric_match:   {rate(numeric_match, numbers, args.seconds):>10,.0f} checks/s")
    print(f"fast tier, exact_match:     {rate(exact_match, answers, args.seconds):>10,.0f} checks/s")
    print(f"fast tier, token_f1:        {rate(token_f1, answers, args.seconds):>10,.0f} checks/s")
    print(f"composite reward (parse+check+shaping): {rate(compute_reward, turns, args.seconds):>10,.0f} rewards/s")

    from verifiers.sandbox import BubblewrapSandbox, SandboxLimits

    with BubblewrapSandbox(SandboxLimits(), pool_size=2) as box:
        box.run_many(["pass"] * 20)  # warm the workers
        codes = [f"print({i}*{i})" for i in range(400)]
        start = time.perf_counter()
        results = box.run_many(codes)
        elapsed = time.perf_counter() - start
        assert all(r.ok for r in results)
        one = time.perf_counter()
        for code in codes[:100]:
            box.run_python(code)
        per_call = (time.perf_counter() - one) / 100
    print(f"sandbox tier (bubblewrap, 2 workers): {len(codes) / elapsed * 60:>10,.0f} code runs/min; one call at a time: {per_call * 1000:.1f} ms/call")


if __name__ == "__main__":
    main()
