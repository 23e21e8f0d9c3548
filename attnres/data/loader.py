"""Memory-mapped token shards -> (input, target) batches for every DDP rank.

The training stream is a sequence of epochs; each epoch is a seeded permutation of the
non-overlapping windows of ``seq_len + 1`` tokens. Global batch ``i`` takes the next
``batch_size * world`` windows of that order and rank ``r`` takes every ``world``-th of them, so
ranks never share a window, and the batch at any step is a pure function of (seed, step): a
resumed run continues at exactly the batch it would have seen, mid-epoch or not.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from attnres.data.prepare import read_manifest


class TokenShards:
    """One split of a prepared dataset, as windows over memory-mapped uint16 shards."""

    def __init__(self, path: Path | str, split: str, seq_len: int) -> None:
        self.path, self.split, self.seq_len = Path(path), split, seq_len
        manifest = read_manifest(self.path)
        self.vocab_size: int = manifest["vocab_size"]
        self.shards = [np.memmap(self.path / s["file"], dtype=np.uint16, mode="r")
                       for s in manifest["splits"][split]["shards"]]
        counts = np.array([(len(s) - 1) // seq_len for s in self.shards], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(counts)])
        self.n_windows = int(self.offsets[-1])
        if self.n_windows == 0:
            raise ValueError(f"{split} split of {path} is shorter than one window of {seq_len + 1} tokens")

    def window(self, i: int) -> np.ndarray:
        shard = int(np.searchsorted(self.offsets, i, side="right") - 1)
        start = (i - int(self.offsets[shard])) * self.seq_len
        return np.asarray(self.shards[shard][start:start + self.seq_len + 1], dtype=np.int64)

    def stack(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        data = torch.from_numpy(np.stack([self.window(int(i)) for i in indices]))
        return data[:, :-1].contiguous(), data[:, 1:].contiguous()


class TrainLoader:
    """Deterministic, rank-disjoint, resumable batches: ``batch(step)`` needs no state."""

    def __init__(self, shards: TokenShards, batch_size: int, seed: int, rank: int = 0, world: int = 1) -> None:
        self.shards, self.batch_size, self.seed, self.rank, self.world = shards, batch_size, seed, rank, world
        self.global_batch = batch_size * world
        self.per_epoch = shards.n_windows // self.global_batch
        if self.per_epoch == 0:
            raise ValueError(f"{shards.n_windows} training windows cannot fill one global batch of "
                             f"{self.global_batch}; use a smaller batch or more data")
        self._perm_epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def _order(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm, self._perm_epoch = rng.permutation(self.shards.n_windows), epoch
        return self._perm

    def indices(self, step: int) -> np.ndarray:
        """Window indices that this rank reads at ``step`` (a micro-step counter)."""
        epoch, i = divmod(step, self.per_epoch)
        chunk = self._order(epoch)[i * self.global_batch:(i + 1) * self.global_batch]
        return chunk[self.rank::self.world]

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.shards.stack(self.indices(step))

    def epoch_of(self, step: int) -> float:
        return step / self.per_epoch


def eval_batches(shards: TokenShards, batch_size: int, n_batches: int, rank: int = 0,
                 world: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The fixed held-out set: the first windows of the eval split, split across ranks."""
    n = min(shards.n_windows, batch_size * n_batches * world)
    idx = np.arange(n)[rank::world]
    for start in range(0, len(idx), batch_size):
        yield shards.stack(idx[start:start + batch_size])
