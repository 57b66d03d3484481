"""Peak memory of a log-prob pass, whole logits vs chunked LM head, side by side (issue 22, item 4).

    .venv/bin/python benchmarks/logprob_memory.py [--vocabs 49152,151936] [--rows 8] [--completion 256] [--chunks 512,128]

The pass is what an update does: forward, then backward of the summed masked completion log-probs,
at temperature 1, through a seeded 2-layer Qwen2 (hidden 64, tied embeddings, fp32) whose
vocabulary is SmolLM2's (49,152) or Qwen2.5's (151,936). Variants:

  unchunked     token_logprobs(completion_logits(...)): the whole (B, C, V) fp32 logits, as before
  chunk=<n>     completion_logprobs(..., chunk_tokens=n): the head and log-softmax over n completion
                tokens at a time, each chunk recomputed in the backward (n = 512 is engine.logit_chunk_tokens'
                default)

How the peak is measured: each variant runs in a fresh Python process, so no allocator cache or
earlier peak of another variant is counted. The child builds the model and the batch, runs the same
variant once on a 2-row batch (first-call allocations: autograd engine, kernels), drops the
gradients, and then reads VmRSS and resets the kernel's high-water mark (`5` into
/proc/self/clear_refs, Linux >= 4.0). After the measured pass it reads VmHWM: the peak is
VmHWM - VmRSS before, i.e. the most resident memory the pass added at any instant, forward and
backward, parameter gradients included (the same in every variant: 39 MB for the 151,936 x 64
head). The child runs with MALLOC_MMAP_THRESHOLD_=1 MiB, so glibc serves every block of 1 MiB or more
with mmap and returns it to the OS when torch frees it: RSS then follows the live tensors. (glibc's
default threshold rises with each freed block up to 32 MB, and blocks below it stay in the heap
after they are freed: 128-token chunks at 49,152 (25 MB of logits each) then read 601 MB, not 130.)
Each child also reports the sum of the log-probs and the gradient norm, so the variants are seen to
compute the same thing.

Then, in this process, the speed check that set the default chunk: an update pass shaped like the
`tiny` profile's (its model, 1,024-token vocabulary, 8 rows of 24 prompt + 40 completion tokens,
log-probs with entropy, backward) as before this change (whole logits), at the default chunk (one
chunk: nothing recomputed) and cut into two chunks of 160; the variants interleaved, `--repeats`
rounds of 5 passes each, min and median per pass.

Writes benchmarks/results/logprob_memory.json (with the commit measured).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT = 32  # prompt tokens per row: logits_to_keep leaves them out of the head either way


def _status_kb(field: str) -> int:
    return int(re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1))


def child(vocab: int, rows: int, completion: int, chunk: int | None) -> dict:
    """One variant's measured pass, in this (fresh) process."""
    import gc

    import torch

    from configs.schema import ModelConfig
    from training.model import build_model
    from training.sequences import collate, completion_logits, completion_logprobs, token_logprobs

    torch.set_num_threads(2)
    cfg = ModelConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    model = build_model(cfg, vocab_size=vocab, eos_token_id=0, seed=0)
    g = torch.Generator().manual_seed(0)

    def batch_of(n: int):
        ids = lambda length: torch.randint(1, vocab, (length,), generator=g).tolist()  # noqa: E731
        return collate(
            [ids(PROMPT) for _ in range(n)],
            [ids(completion) for _ in range(n)],
            [[1] * completion for _ in range(n)],
            0,
        )

    def run(batch) -> tuple[float, float]:
        if chunk is None:
            logprobs = token_logprobs(completion_logits(model, batch), batch.completion_ids)
        else:
            logprobs = completion_logprobs(model, batch, chunk_tokens=chunk)
        total = (logprobs * batch.loss_mask).sum()
        total.backward()
        grad_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])))
        return float(total.detach()), grad_norm

    run(batch_of(2))  # first-call allocations, outside the measurement
    model.zero_grad(set_to_none=True)
    batch = batch_of(rows)
    gc.collect()
    before = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    start = time.perf_counter()
    logprob_sum, grad_norm = run(batch)
    seconds = time.perf_counter() - start
    peak = _status_kb("VmHWM")
    return {
        "peak_mb": round((peak - before) / 1024, 1),
        "seconds": round(seconds, 3),
        "logprob_sum": logprob_sum,
        "grad_norm": grad_norm,
    }


def measure(vocab: int, rows: int, completion: int, chunk: int | None) -> dict:
    cmd = [sys.executable, __file__, "--child", str(vocab), str(rows), str(completion), str(chunk or 0)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def tiny_speed(repeats: int) -> list[dict]:
    """ms per update pass at `tiny`'s shapes: whole logits (before), one chunk (default), two chunks."""
    import statistics

    import torch

    from configs.schema import EngineConfig, ModelConfig
    from training.model import build_model
    from training.sequences import collate, completion_logits, completion_logprobs, entropy_from_logits, token_logprobs

    torch.set_num_threads(2)
    cfg = ModelConfig(
        hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4
    )
    model = build_model(cfg, vocab_size=1024, eos_token_id=0, seed=0)
    g = torch.Generator().manual_seed(0)
    batch = collate(
        [torch.randint(1, 1024, (24,), generator=g).tolist() for _ in range(8)],
        [torch.randint(1, 1024, (40,), generator=g).tolist() for _ in range(8)],
        [[1] * 40] * 8,
        0,
    )

    def before() -> None:  # the update's pass as it was: whole logits, entropy without a graph
        logits = completion_logits(model, batch)
        logprobs = token_logprobs(logits, batch.completion_ids)
        with torch.no_grad():
            entropy_from_logits(logits)
        (logprobs * batch.loss_mask).sum().backward()

    def chunked(chunk: int):
        def run() -> None:
            logprobs, _ = completion_logprobs(model, batch, with_entropy=True, chunk_tokens=chunk)
            (logprobs * batch.loss_mask).sum().backward()

        return run

    variants = {
        "whole logits (before)": before,
        f"chunk={EngineConfig().logit_chunk_tokens} (default: one chunk)": chunked(EngineConfig().logit_chunk_tokens),
        "chunk=160 (two chunks)": chunked(160),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for run in variants.values():
        run()
    for _ in range(repeats):
        for name, run in variants.items():
            start = time.perf_counter()
            for _ in range(5):
                run()
            times[name].append((time.perf_counter() - start) / 5 * 1000)
    return [
        {"variant": name, "min_ms": round(min(t), 2), "median_ms": round(statistics.median(t), 2)}
        for name, t in times.items()
    ]


def commit() -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout

    return {
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "uncommitted": [
            line[3:]
            for line in git(
                "status", "--porcelain", "--untracked-files=no", "--", "training", "configs", "benchmarks"
            ).splitlines()
        ],
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        vocab, rows, completion, chunk = map(int, argv[1:5])
        print(json.dumps(child(vocab, rows, completion, chunk or None)))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocabs", default="49152,151936")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--completion", type=int, default=256, help="completion tokens per row")
    parser.add_argument("--chunks", default="512,128", help="chunk_tokens values to measure next to the unchunked pass")
    parser.add_argument("--repeats", type=int, default=25, help="rounds of the tiny speed check")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "logprob_memory.json")
    args = parser.parse_args(argv)
    chunks = [int(c) for c in args.chunks.split(",")]
    tokens = args.rows * args.completion
    results = []
    print(f"{args.rows} rows x {args.completion} completion tokens ({tokens} tokens), 2-layer Qwen2, hidden 64, fp32")
    print(
        "| vocab | whole fp32 logits (MB) | variant | peak added (MB) | peak / unchunked | pass (s) | logprob sum | grad norm |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for vocab in [int(v) for v in args.vocabs.split(",")]:
        logits_mb = round(tokens * vocab * 4 / 2**20, 1)
        base = measure(vocab, args.rows, args.completion, None)
        rows = [("unchunked", None, base)] + [
            (f"chunk={c}", c, measure(vocab, args.rows, args.completion, c)) for c in chunks
        ]
        for name, chunk, r in rows:
            ratio = r["peak_mb"] / base["peak_mb"]
            results.append(
                {
                    "vocab": vocab,
                    "variant": name,
                    "chunk_tokens": chunk,
                    "logits_mb": logits_mb,
                    **r,
                    "ratio_to_unchunked": round(ratio, 3),
                }
            )
            print(
                f"| {vocab:,} | {logits_mb:,.0f} | {name} | {r['peak_mb']:,.0f} | {ratio:.3f} | {r['seconds']:.2f} | {r['logprob_sum']:.6g} "
                f"| {r['grad_norm']:.6g} |"
            )
    speed = tiny_speed(args.repeats)
    print("\ntiny-shaped update pass (ms per pass, min and median of", args.repeats, "interleaved rounds)")
    for row in speed:
        print(f"  {row['variant']}: {row['min_ms']:.1f} min, {row['median_ms']:.1f} median")
    report = {
        "command": " ".join(["benchmarks/logprob_memory.py", *argv]),
        **commit(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": __import__("torch").__version__,
        "setup": {
            "rows": args.rows,
            "prompt_tokens": PROMPT,
            "completion_tokens": args.completion,
            "hidden_size": 64,
            "layers": 2,
            "dtype": "float32",
        },
        "method": "fresh process per variant, MALLOC_MMAP_THRESHOLD_=1 MiB; peak = VmHWM after the pass - VmRSS before it, VmHWM "
        "reset via /proc/self/clear_refs",
        "results": results,
        "tiny_speed": speed,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
