"""An epoch's batches: a shuffled order cut into batches of outfits of similar length, each trimmed to its longest."""

from __future__ import annotations

import torch

BUCKET_BATCHES = 32  # batches per window sorted by outfit length (length_batches)


def length_batches(
    order: torch.Tensor, lengths: torch.Tensor, batch_size: int, generator: torch.Generator
) -> list[torch.Tensor]:
    """Split a shuffled `order` into batches of outfits of similar length, in random batch order.

    Outfits hold 4-8 items and are padded to the longest: in a random batch of 64 nearly always to 8,
    while the mean is ~5.4, so a third of every step's matrix work would go to padding. Within windows of
    BUCKET_BATCHES batches of `order`, outfits are sorted by length (stable) before batching, and the
    batches are then shuffled: each batch is trimmed to its own longest outfit, and the windows keep the
    batches' contents random. The number of batches is that of plain batching.
    """
    window = batch_size * BUCKET_BATCHES
    batches = []
    for start in range(0, len(order), window):
        chunk = order[start : start + window]
        chunk = chunk[torch.sort(lengths[chunk], stable=True).indices]
        batches += list(chunk.split(batch_size))
    shuffled = torch.randperm(len(batches), generator=generator, device=generator.device).tolist()
    return [batches[i] for i in shuffled]
