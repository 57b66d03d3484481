"""The rollout-engine contracts are declared, and chosen with isinstance (no capability probing)."""

from __future__ import annotations

import pytest

from training.agent.engines import ContinuousEngine, HFEngine, RolloutEngine, VLLMEngine
from training.agent.vllm_internals import UnsupportedVLLMVersion, check_version


def test_the_hf_engine_is_a_batch_engine_only(warm_policy):
    engine = HFEngine(warm_policy.model, warm_policy.tokenizer)
    assert isinstance(engine, RolloutEngine) and not isinstance(engine, ContinuousEngine)


def test_the_vllm_engine_declares_the_continuous_contract():
    # every method the agent loop's continuous schedule calls is on the class
    for method in ("generate", "sync_weights", "close", "submit", "poll", "end", "busy"):
        assert callable(getattr(VLLMEngine, method)), method


@pytest.mark.parametrize("installed", ["0.32.0", "0.32.3", "0.32.0+cpu"])
def test_the_vllm_release_the_adapter_was_written_for_is_accepted(installed):
    check_version(installed)


@pytest.mark.parametrize("installed", ["0.33.0", "0.31.2", "1.0.0"])
def test_another_vllm_release_is_refused_with_both_versions_named(installed):
    with pytest.raises(UnsupportedVLLMVersion, match=rf"vLLM {installed} is installed.*vLLM 0\.32\.x"):
        check_version(installed)


def test_the_installed_vllm_is_the_one_the_adapter_was_written_for():
    check_version()
