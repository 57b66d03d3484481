"""The agent: the multi-turn loop (policy turns, tool calls, observations), the rollout engines it
drives (HF, vLLM), per-episode sampling seeds, and prompts through the model's chat template."""
