"""Which samples each rank trains on at each step (a pure function of seed and step)."""

from __future__ import annotations

import torch


class GlobalBatches:
    """Which samples each rank trains on at each step, as a pure function of the step.

    The global batch (``global_batch_size`` samples) is the same for every world size: a
    seeded permutation per epoch, cut into global batches (the tail is dropped); rank r
    takes the r-th 1/W of it, split into ``grad_accumulation`` equal micro-batches. Because
    it depends only on (seed, step), resuming at step s needs no sampler state.
    """

    def __init__(self, n_samples: int, global_batch: int, seed: int, rank: int, world_size: int,
                 grad_accumulation: int):
        if global_batch > n_samples:
            raise ValueError(f"global_batch_size {global_batch} is larger than the "
                             f"{n_samples} training samples")
        if global_batch % (world_size * grad_accumulation):
            raise ValueError(f"global_batch_size {global_batch} does not split into world_size "
                             f"{world_size} x grad_accumulation {grad_accumulation} micro-batches")
        self.n, self.global_batch, self.seed = n_samples, global_batch, seed
        self.rank, self.world_size, self.accumulation = rank, world_size, grad_accumulation
        self.per_epoch = n_samples // global_batch
        self._epoch, self._order = -1, None

    def position(self, step: int) -> dict[str, int]:
        """(epoch, batch within epoch) of ``step``: the data position a checkpoint records."""
        return {"epoch": (step - 1) // self.per_epoch, "batch": (step - 1) % self.per_epoch}

    def micro_batches(self, step: int) -> list[torch.Tensor]:
        pos = self.position(step)
        if pos["epoch"] != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 100_003 + pos["epoch"])
            self._epoch, self._order = pos["epoch"], torch.randperm(self.n, generator=g)
        start = pos["batch"] * self.global_batch
        per_rank = self.global_batch // self.world_size
        mine = self._order[start + self.rank * per_rank: start + (self.rank + 1) * per_rank]
        return list(mine.chunk(self.accumulation))
