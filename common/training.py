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


def load_checkpoint(path: str, model, optimizer, schedule=None) -> dict | None:
    """Restore a `save_checkpoint` dict's model, optimizer, LR schedule and (when saved) global torch RNG
    state; returns the dict for the script's own keys (step, best, ...), or None when there is no checkpoint."""
    import os

    import torch

    if not os.path.exists(path):
        return None
    saved = torch.load(path, weights_only=False)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    if schedule is not None:
        schedule.load_state_dict(saved["schedule"])
    if "torch_rng" in saved:  # dropout and other draws from the global generator continue where they were
        torch.set_rng_state(saved["torch_rng"])
    return saved


def resume_step(checkpoint, model, optimizer, log=print) -> int:
    """The step a run resumes at: restores `model` and `optimizer` from `checkpoint` (a path, or None for a run
    that keeps none) when one was saved by `save_step`, else 0."""
    saved = load_checkpoint(str(checkpoint), model, optimizer) if checkpoint is not None else None
    if not saved:
        return 0
    log(f"resumed at step {saved['step']}")
    return saved["step"]


def save_step(checkpoint, model, optimizer, step: int) -> None:
    """Checkpoint `model` and `optimizer` after `step` steps for `resume_step` (nothing when `checkpoint` is
    None)."""
    if checkpoint is not None:
        save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                        str(checkpoint))


def optimizer_step(loss, model, optimizer, schedule=None, max_grad_norm: float = 1.0) -> None:
    """Backward, clip the gradient norm, step the optimizer (and the LR schedule, if any)."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    if schedule is not None:
        schedule.step()


class RunningLosses:
    """Means of named losses since the last report, for training logs."""

    def __init__(self):
        self.sums, self.count = {}, 0

    def add(self, losses: dict) -> None:
        for name, value in losses.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value.detach())
        self.count += 1

    def report(self, digits: int = 3) -> str:
        """'name mean ...' over the losses added since the last report, then start over."""
        line = " ".join(f"{name} {total / max(1, self.count):.{digits}f}" for name, total in self.sums.items())
        self.sums, self.count = {}, 0
        return line


def check_output_folder(out, *, overwrite: bool = False, overwrite_shipped: bool = False, flag: str = "--out",
                        parent_must_exist: bool = True):
    """Where trained weights go: never over weights the package ships (a folder under one of its `bundled/`
    folders) unless `overwrite_shipped`, never into a non-empty folder unless `overwrite`; its parent folder
    must exist unless the caller creates it. Checked before any training; returns the path."""
    from pathlib import Path

    path = Path(out).resolve()
    package = Path(__file__).resolve().parents[1]
    shipped = path.is_relative_to(package) and "bundled" in path.relative_to(package).parts
    if shipped and not overwrite_shipped:
        raise ValueError(f"{flag} {str(out)!r} is inside the weights mmspec ships; write elsewhere (or, to replace "
                         "the shipped weights on purpose, pass --overwrite-shipped)")
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not (overwrite or shipped):
        raise ValueError(f"{flag} {str(out)!r} exists and is not an empty folder; choose another or pass --overwrite")
    if parent_must_exist and not path.parent.is_dir():
        raise ValueError(f"{flag} {str(out)!r}: the folder {str(path.parent)!r} does not exist")
    return path
