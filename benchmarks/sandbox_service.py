"""Code verifications per minute through the sandbox service vs the in-process pool, in one run.

    .venv/bin/python benchmarks/sandbox_service.py [--calls 400] [--rounds 5] [--pool-size 2]

The same workload both ways, on pools of the same size and limits:
* code verifications: the unit-test verifier (a candidate + 3 tests, one sandbox run each)
  through the cascade, as training runs it (`Cascade(cfg.reward, box, concurrency=
  cfg.sandbox.pool_size)`); every verdict must be 1.0. Each side is measured with the cascade's
  concurrency = the pool's workers and = 2x that: over HTTP a call spends time in transit, during
  which its worker idles unless another call is queued, so a `kind: http` profile sets
  `sandbox.pool_size` above the service's `--pool-size`. The headline ratio compares each side
  at its better concurrency;
* trivial programs through `run_many` (the interpreter tool's path: one batch, order kept).
The in-process side is a BubblewrapSandbox in this process; the service side is
`python -m verifiers.sandbox_service` on 127.0.0.1 (uvicorn, a subprocess with its own pool)
reached through HTTPSandbox. Rounds alternate in-process / service so a change in machine load
hits both; the table gives medians and the ratio service / in-process (issue 23's target: >= 0.8).
Writes benchmarks/results/sandbox_service.{json,md} (or --out). Not a test: the figures depend
on the machine and on what else runs on it (the load averages are recorded).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from configs.schema import RewardConfig, VerifierSpec
from verifiers.cascade import Cascade
from verifiers.sandbox import BubblewrapSandbox, SandboxLimits
from verifiers.sandbox_client import HTTPSandbox
from verifiers.sandbox_service import TOKEN_ENV
from verifiers.shaping import Candidate

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.8
LIMITS = SandboxLimits()  # the service is started with the same (its CLI defaults)
# The in-process pool and the service's pool each take an allocated uid range (as every pool that
# names none), so they never share RLIMIT_NPROC's count.
TASK = {
    "task_id": "c",
    "family": "code",
    "entry_point": "add",
    "answer": "",
    "tests": [{"name": f"t{i}", "code": f"assert add({i}, 1) == {i + 1}", "group": "fail_to_pass"} for i in range(3)],
}
CANDIDATE = Candidate(["<answer>def add(a, b):\n    return a + b</answer>"], 20, ())
VERIFICATIONS = "code verifications/min (3 unit tests, cascade, {})"  # .format(concurrency)
PROGRAMS = "trivial programs/min (run_many)"


def verifications_per_min(box, calls: int, concurrency: int) -> float:
    cascade = Cascade(
        RewardConfig(verifiers={"code": VerifierSpec(name="unit_tests")}, terms={}), box, concurrency=concurrency
    )
    start = time.perf_counter()
    scored = cascade.score_many([(CANDIDATE, TASK)] * calls)
    elapsed = time.perf_counter() - start
    wrong = [s.details for s in scored if s.outcome != 1.0]
    assert not wrong, f"{len(wrong)} verifications did not pass: {wrong[:3]}"
    return calls / elapsed * 60


def programs_per_min(box, calls: int) -> float:
    codes = [f"print({i}*{i})" for i in range(calls)]
    start = time.perf_counter()
    results = box.run_many(codes)
    elapsed = time.perf_counter() - start
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(calls)], "wrong or failed results"
    return calls / elapsed * 60


def measure(box, calls: int, pool_size: int) -> dict[str, float]:
    box.run_many(["pass"] * 4 * pool_size)  # warm the workers (and the HTTP connections)
    figures = {
        VERIFICATIONS.format(f"concurrency {c}"): verifications_per_min(box, calls, c)
        for c in (pool_size, 2 * pool_size)
    }
    return {**figures, PROGRAMS: programs_per_min(box, 2 * calls)}


@contextlib.contextmanager
def service(pool_size: int):
    """The sandbox service on a free port of 127.0.0.1; yields (url, token)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token, url = secrets.token_hex(16), f"http://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "verifiers.sandbox_service",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--pool-size",
        str(pool_size),
        "--token-file",
        "-",  # the token on stdin: never in the service's environment (it refuses one there)
        "--log-level",
        "warning",
    ]
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=log, stderr=log)
        proc.stdin.write(token.encode() + b"\n")
        proc.stdin.close()
        try:
            _wait_healthy(url, proc, log)
            yield url, token
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_healthy(url: str, proc: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1.0):
                return  # 200; urlopen raises on anything else
        except (urllib.error.URLError, OSError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            raise RuntimeError(f"the sandbox service did not come up: {log.read().decode(errors='replace')[-2000:]}")
        time.sleep(0.05)


def run(calls: int, rounds: int, pool_size: int) -> dict:
    runs: dict[str, list[dict[str, float]]] = {"in_process": [], "service": []}
    load_start = os.getloadavg()
    with (
        service(pool_size) as (url, token),
        BubblewrapSandbox(LIMITS, pool_size) as local,
        HTTPSandbox(url, token, LIMITS, concurrency=2 * pool_size) as remote,
    ):
        for i in range(rounds):
            for name, box in (("in_process", local), ("service", remote)):
                runs[name].append(measure(box, calls, pool_size))
                print(
                    f"round {i + 1}/{rounds} {name:<10} "
                    + "  ".join(f"{k}: {v:,.0f}" for k, v in runs[name][-1].items()),
                    flush=True,
                )
    figures = {}
    for label in runs["in_process"][0]:
        local_median = statistics.median(r[label] for r in runs["in_process"])
        service_median = statistics.median(r[label] for r in runs["service"])
        figures[label] = {
            "in_process": local_median,
            "service": service_median,
            "ratio": service_median / local_median,
            "in_process_rounds": [r[label] for r in runs["in_process"]],
            "service_rounds": [r[label] for r in runs["service"]],
        }
    measured = [f for label, f in figures.items() if label != PROGRAMS]
    best = {side: max(f[side] for f in measured) for side in ("in_process", "service")}
    headline = best["service"] / best["in_process"]
    figures[VERIFICATIONS.format("each side at its better concurrency")] = {**best, "ratio": headline}
    return {
        "calls": calls,
        "rounds": rounds,
        "pool_size": pool_size,
        "target_ratio": TARGET,
        "headline_ratio": headline,
        "meets_target": headline >= TARGET,
        "figures": figures,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "commit": _commit(),
    }


def _commit() -> str:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True
    ).stdout.strip()
    return head + ("+dirty" if dirty else "")


def table(result: dict) -> str:
    rows = [
        f"| figure ({result['pool_size']} workers, medians of {result['rounds']} rounds) | in-process | service | ratio |",
        "|---|---|---|---|",
    ]
    for label, f in result["figures"].items():
        rows.append(f"| {label} | {f['in_process']:,.0f} | {f['service']:,.0f} | **{f['ratio']:.2f}** |")
    return "\n".join(rows)


def write(result: dict, out: Path, argv: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sandbox_service.json").write_text(json.dumps(result, indent=1))
    load = (
        ", ".join(f"{x:.2f}" for x in result["loadavg_start"])
        + " -> "
        + ", ".join(f"{x:.2f}" for x in result["loadavg_end"])
    )
    verdict = "meets" if result["meets_target"] else "misses"
    (out / "sandbox_service.md").write_text(
        f"# The sandbox service vs the in-process pool\n\n"
        f"`{' '.join(['.venv/bin/python benchmarks/sandbox_service.py', *argv])}` at `{result['commit']}`, "
        f"{result['cpus']} CPUs ({result['machine']}), load average {load}.\n\n{table(result)}\n\n"
        f"Code verifications through the service, each side at its better concurrency: ratio "
        f"{result['headline_ratio']:.2f}, which {verdict} issue 23's target (>= {TARGET}).\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--calls", type=int, default=400, help="verifications per measurement (2x as many trivial programs)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    result = run(args.calls, args.rounds, args.pool_size)
    print(table(result))
    write(result, args.out, sys.argv[1:] if argv is None else argv)
    print(f"wrote {args.out / 'sandbox_service.json'} and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
