"""The benchmark's rollout engine is built for the longest episode it will run (assets/benchmark.py)."""

from __future__ import annotations

import pytest

from assets.benchmark import engine_budget
from configs.schema import BenchmarkSuite
from training.agent.engines import Sampling, VLLMEngine


@pytest.mark.yourdata
@pytest.mark.xdist_group("vllm")
def test_the_benchmark_engine_holds_a_suite_longer_than_any_rollout(warm_policy, micro_cfg):
    """vLLM fixes its context length when it starts. The benchmark's engine is built with the
    largest budget of the held-out tasks and the suites (`engine_budget`), so a suite's episode
    longer than any rollout runs; an engine built with the rollout's budget has no room for it (smol's
    HumanEval was refused so before 7011ddb). One engine in this module: two vLLM engines alive in
    one process share vLLM's parallel state."""
    suite = BenchmarkSuite(file="humaneval", max_total_tokens=400, max_new_tokens_per_turn=48)
    cfg = micro_cfg.model_copy(update={"benchmark": micro_cfg.benchmark.model_copy(update={"suites": {"long": suite}})})
    budget = engine_budget(cfg)
    assert budget.max_total_tokens == 400 > micro_cfg.rollout.max_total_tokens
    assert budget.max_new_tokens_per_turn == 48 == micro_cfg.rollout.max_new_tokens_per_turn
    rollout = micro_cfg.rollout
    prompt = [10] * 380  # a token of the micro vocabulary
    assert len(prompt) > rollout.max_total_tokens + rollout.max_observation_tokens + rollout.max_new_tokens_per_turn
    engine = VLLMEngine.from_model(warm_policy.model, warm_policy.tokenizer, budget, seed=0)
    try:
        [out] = engine.generate([prompt], [16], stop_ids=set(), sampling=Sampling())
        assert len(out.ids) == 16
    finally:
        engine.close()
