"""The data-parallel RL round's collectives: who rolls out what, and how ranks see the global batch.

Under torchrun every rank runs the same round (`training/rl/loop.py`). The prompts of a step are
drawn identically on every rank (one seeded generator), each rank rolls out and verifies the whole
groups `prompts[rank::world]` with its own engine, and `gather` then gives every rank the global
batch in prompt order. From there each rank computes the same filtering (dynamic sampling), the
same metrics (collapse signals are global) and the same advantages on whole groups; the per-token
passes (old, reference log-probs, values) are split again (`map_sharded`); the update shards the
batch over ranks through the training engine (ZeRO-2/3 reduce the gradients). Sampling is keyed
to the episode (training/agent/sampling_keys.py), so the global batch does not depend on the world size.

For a world of one every operation is the identity: the single-process round is the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

import torch.distributed as dist

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class DataParallel:
    rank: int = 0
    world_size: int = 1

    @classmethod
    def current(cls) -> DataParallel:
        """The process group torchrun (or the engine) set up; a world of one without one."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def leader(self) -> bool:
        """Rank 0: the one that writes what all ranks hold alike (state files, the checkpoint)."""
        return self.rank == 0

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def mine(self, items: list[T]) -> list[T]:
        """This rank's share: strided, so each rank gets whole items (whole groups' prompts)."""
        return items[self.rank :: self.world_size]

    def gather(self, mine: list[T]) -> list[T]:
        """Every rank's `mine` (as `mine(items)` split them), put back in the order of `items`."""
        if self.world_size == 1:
            return list(mine)
        shares: list[list[T] | None] = [None] * self.world_size
        dist.all_gather_object(shares, list(mine))
        return interleave(shares)

    def gather_objects(self, value: T) -> list[T]:
        """Each rank's `value`, in rank order."""
        if self.world_size == 1:
            return [value]
        out: list[T | None] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def map_sharded(self, items: list[T], fn: Callable[[list[T]], list[R]]) -> list[R]:
        """fn over the whole list, each rank computing its share: [fn(items)[i] for i] on every rank."""
        mine = self.mine(items)
        return self.gather(fn(mine) if mine else [])


def interleave(shares: list[list]) -> list:
    """Undo the strided split: shares[r] held items r, r + W, r + 2W, ..."""
    world, total = len(shares), sum(len(s) for s in shares)
    out = [None] * total
    for r, share in enumerate(shares):
        if len(share) != len(range(r, total, world)):
            raise ValueError(f"rank {r} returned {len(share)} items for the {len(range(r, total, world))} it was given")
        out[r::world] = share
    return out


def leave_together() -> None:
    """At the end of a rank's successful work: wait for the others, then close the process group.
    A gloo group left open at exit sometimes aborts a rank in its destructor ("terminate called
    without an active exception", exit -6), and torchrun then kills the rank still finishing up.
    A no-op without a group; not for a failing rank (the others would wait for it)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
