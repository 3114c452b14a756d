"""Small pieces shared by the training scripts of bundled models and heads."""

from __future__ import annotations

import math


def warmup_cosine_lr(step: int, total: int, peak: float, warmup: int = 50) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to 0 at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def length_batches(lengths: list[int], max_padded: int, rng) -> list[list[int]]:
    """Indices in batches of similar length, each at most `max_padded` padded elements (longest × rows).

    Shuffle with `rng` (a random.Random), sort within chunks of 2 000, cut, shuffle the batches: a pure
    function of the RNG's seed, so a resumed run finds the same batches.
    """
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches, chunk = [], 2000
    for start in range(0, len(order), chunk):
        part = sorted(order[start:start + chunk], key=lambda i: lengths[i])
        batch, longest = [], 0
        for i in part:
            longest_if_added = max(longest, lengths[i])
            if batch and longest_if_added * (len(batch) + 1) > max_padded:
                batches.append(batch)
                batch, longest_if_added = [], lengths[i]
            batch.append(i)
            longest = longest_if_added
        if batch:
            batches.append(batch)
    rng.shuffle(batches)
    return batches


def batch_of_step(step: int, epoch_batches) -> tuple[int, list[int]]:
    """(epoch, batch) that global step `step` trains on, where epoch_batches(e) gives epoch e's batches (cache
    it: it is called for every epoch up to the step's)."""
    epoch, position = 0, step
    while position >= len(epoch_batches(epoch)):
        position -= len(epoch_batches(epoch))
        epoch += 1
    return epoch, epoch_batches(epoch)[position]


def save_checkpoint(state: dict, path: str) -> None:
    """torch.save to a temporary name, then rename: an interrupted write never leaves a broken checkpoint."""
    import os

    import torch

    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)
