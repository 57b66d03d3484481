"""Rewards for agentic rollouts: answer equivalence, format and tool-use shaping, the sandbox.

Imports no Dagster, no vLLM, no DeepSpeed (import-linter contract in pyproject.toml).
"""
