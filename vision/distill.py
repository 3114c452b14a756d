"""Training data for drafting heads on any image pipeline: sequences its own target samples.

`eagle` / `lantern` / `lantern++` heads (plugins/lantern/train.py) and `ssd` heads (plugins/ssd/train.py) learn
the target's own distributions, so they need no dataset: the pipeline samples sequences from its bench inputs
(`ARImagePipeline.self_distillation_sequences`). With a work folder the sequences are kept there, so a rerun
that resumes a head's training sees the same data.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch


def check_trainer_arguments(pipeline, unconditional_fraction: float, **counts) -> None:
    """One line per mistake, before any sampling: counts are ints >= 1, the fraction is in [0, 1), and the
    pipeline is an image pipeline (it samples its own training sequences)."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not 0 <= unconditional_fraction < 1:
        raise ValueError(f"unconditional_fraction must be in [0, 1), got {unconditional_fraction!r}")
    if not hasattr(pipeline, "self_distillation_sequences"):
        raise ValueError(f"drafting heads are trained on an image pipeline's own samples; got a "
                         f"{type(pipeline).__name__}")


def self_distillation_data(pipeline, num_sequences: int, num_heldout: int, seed: int,
                           unconditional_fraction: float, work_dir=None, log=print):
    """(target adapter, train, held-out): train and held-out are (ids, mask, first_code) of sequences the
    target sampled (left-padded; codes are each row's last tokens). Cached in `work_dir/sequences.pt`."""
    work = Path(work_dir) if work_dir is not None else None
    cached = work / "sequences.pt" if work is not None else None
    total = num_sequences + num_heldout
    if cached is not None and cached.exists():
        saved = torch.load(cached, weights_only=True)
        if saved["ids"].shape[0] != total or saved["seed"] != seed:
            raise ValueError(f"work_dir {str(work)!r} holds {saved['ids'].shape[0]} sequences of seed "
                             f"{int(saved['seed'])}, not {total} of seed {seed}; use another work folder")
        target = pipeline.image_model.adapter(pipeline.image_model.code_grid(None, None))
        ids, mask, first = (saved[k].to(pipeline.device) for k in ("ids", "mask", "first_code"))
    else:
        log(f"sampling {total} sequences from the target")
        target, ids, mask, first = pipeline.self_distillation_sequences(total, seed, unconditional_fraction)
        if cached is not None:
            work.mkdir(parents=True, exist_ok=True)
            torch.save({"ids": ids.cpu(), "mask": mask.cpu(), "first_code": first.cpu(), "seed": torch.tensor(seed)},
                       cached)
    train = (ids[:num_sequences], mask[:num_sequences], first[:num_sequences])
    held = (ids[num_sequences:], mask[num_sequences:], first[num_sequences:])
    return target, train, held


@contextmanager
def frozen(module: torch.nn.Module):
    """The module's parameters take no gradient inside; each gets its own requires_grad back after (the
    heads read the target's layers, and the caller's model must come back as it was)."""
    params = list(module.parameters())
    trainable = [p.requires_grad for p in params]
    module.requires_grad_(False)
    try:
        yield module
    finally:
        for param, flag in zip(params, trainable):
            param.requires_grad_(flag)
