"""Sampling randomness keyed to the episode, not to where the episode ran.

A data-parallel RL round gives each rank a share of the prompts. If the tokens an episode samples
depended on a generator shared by its batch, moving a group to another rank, or changing how many
episodes share a batch (`rollout.max_batch_size`, the continuous schedule's admission order),
would change every trajectory after it. So each episode has its own seed, a hash of

    (sampling key = seed / round / step, task id, sample index)

and each turn's seed hashes the episode's seed with the turn's position in the episode (the
number of completion tokens so far). The HF engine turns a turn's seed into one uniform per
sampled token with a counter-based generator (SplitMix64 of seed and token index, as JAX and
Philox do it: no state to carry) and draws by inverse CDF; vLLM takes the turn's seed as the
request's own seed. Either way, the ids an episode samples depend only on its key and the policy.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def episode_seed(sampling_key: str, task_id: str, sample_index: int) -> int:
    """A 63-bit seed from the episode's identity (stable across processes and Python runs,
    unlike hash())."""
    digest = hashlib.blake2b(f"{sampling_key}\x1f{task_id}\x1f{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def turn_seed(episode: int, position: int) -> int:
    """The seed of the turn that starts `position` completion tokens into the episode."""
    return int(splitmix64(np.array([episode ^ (position * 0x9E3779B97F4A7C15 & MASK64)], dtype=np.uint64))[0]) >> 1


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 (numpy's uint64 arithmetic wraps, as it must)."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


def uniforms(seeds: list[int] | np.ndarray, index: int) -> torch.Tensor:
    """One uniform in [0, 1) per seed for token `index` of its turn: float64, 53 random bits."""
    with np.errstate(over="ignore"):
        counters = np.asarray(seeds, dtype=np.uint64) ^ (np.uint64(index + 1) * _MIX2)
    bits = splitmix64(splitmix64(counters)) >> np.uint64(11)
    return torch.from_numpy(bits.astype(np.float64) * 2.0**-53)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index drawn from each row of (B, V) `probs` (need not be normalized) by its uniform: the
    first token whose cumulative mass exceeds u * total, so a token of probability 0 is never
    drawn. The cumulative sum is float64: at a 150k vocabulary, float32's rounding would shift
    the boundaries of rare tokens."""
    cdf = probs.double().cumsum(-1)
    target = (u.to(cdf.device) * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def seeds_from(generator: torch.Generator | None, n: int) -> list[int]:
    """Per-row seeds for an engine call made without any (direct calls, tests): drawn from the
    caller's generator, so such calls stay reproducible from that generator."""
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    return torch.randint(0, 2**62, (n,), generator=gen).tolist()
