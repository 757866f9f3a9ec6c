"""Synthetic data through a real input pipeline: DataLoader + DistributedSampler."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from parallel_kernels.workload import tensor_bytes, to_device


class Batches:
    """An endless stream of this rank's batches, advancing the sampler's epoch as it wraps.

    ``set_epoch`` reshuffles each epoch (the same permutation on every rank), and
    ``drop_last=True`` in both the sampler and the loader gives every rank the same number of
    full batches, as a real training loop does.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        device: torch.device,
        seed: int = 0,
    ) -> None:
        self.sampler = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=self.sampler,
            drop_last=True,
            pin_memory=device.type == "cuda",
        )
        if len(self.loader) == 0:
            raise ValueError(
                f"dataset of {len(dataset)} samples gives no full batch of {batch_size} per rank"
            )
        self.device = device
        self.epoch = 0
        self._it: Iterator = iter(self.loader)

    def held_bytes(self, device: torch.device) -> int:
        """Bytes the data set holds on ``device``'s kind (the synthetic samples a workload
        makes, all of them in memory: the harness's, not the configuration's)."""
        data = self.loader.dataset
        if isinstance(data, TensorDataset):
            held = data.tensors
        else:  # the workload's SampleDataset
            held = (getattr(data, "inputs", None), getattr(data, "targets", None))
        return tensor_bytes(held, device)

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> list:  # [inputs, targets], each a tensor, tuple or dict
        try:
            batch = next(self._it)
        except StopIteration:
            self.epoch += 1
            self.sampler.set_epoch(self.epoch)
            self._it = iter(self.loader)
            batch = next(self._it)
        return to_device(batch, self.device)
