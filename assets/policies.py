"""How Dagster runs the heavy and the flaky steps: retry policies and the GPU concurrency pool."""

from dagster import Backoff, Jitter, RetryPolicy

# Steps that drive many rollouts on tools and the sandbox pool fail transiently (a tool worker
# killed by its limits, a pool that could not start). The RL round resumes from its last saved
# step (cache/rl-state), and the others are deterministic, so a retry costs time, never results.
FLAKY_STEP_RETRY = RetryPolicy(max_retries=2, delay=10, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS)

# Steps that need the accelerator (training, rollouts, benchmarks) share the `gpu` pool. The
# cluster's Dagster instance limits it (infra: `concurrency.pools`) so two runs never share a
# GPU node's memory; the local instance leaves it unlimited (one in-process run at a time anyway).
GPU_POOL = "gpu"
