"""The data order: which rows each step sees, and where the next step starts."""

from __future__ import annotations

import numpy as np

from aleph.errors import ConfigError
from aleph.train.distributed import World


class DataOrder:
    """Row order of every epoch: a permutation derived from (seed, epoch) only, so a resume
    state stores (epoch, batch index), never the permutation. Each global batch is a
    contiguous slice of it; rank r takes the r-th contiguous part of that slice."""

    def __init__(self, seed: int, rows: int, global_batch: int) -> None:
        self.seed, self.rows, self.global_batch = seed, rows, global_batch
        # Drop the last incomplete batch: every step has the full global batch, so the
        # InfoNCE negatives and the per-rank split are the same at every step.
        self.steps_per_epoch = rows // global_batch
        if self.steps_per_epoch == 0:
            raise ConfigError(f"config field 'batch_size': {global_batch} exceeds the {rows} rows "
                              "of the data; lower batch_size")
        self._epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._epoch, self._perm = epoch, rng.permutation(self.rows)
        return self._perm

    def indices(self, epoch: int, batch: int, world: World) -> np.ndarray:
        """Rows of global batch `batch` of `epoch` that this rank encodes, (B / W,)."""
        start = batch * self.global_batch
        local = self.global_batch // world.size
        lo = start + world.rank * local
        return self.permutation(epoch)[lo:lo + local]

    def after(self, epoch: int, batch: int) -> tuple[int, int]:
        """The data position after (epoch, batch): the next batch, or the next epoch's first."""
        return (epoch + 1, 0) if batch + 1 == self.steps_per_epoch else (epoch, batch + 1)
