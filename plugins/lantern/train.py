"""Train the EAGLE head that `eagle`, `lantern` and `lantern++` draft with, for any image pipeline.

`mmspec train-head lantern --model FOLDER --out DIR` (or `train_eagle_head(pipeline, out)`): self-distillation
on sequences the pipeline's own target samples (no dataset needed: `ARImagePipeline.self_distillation_sequences`),
then `load_plugin("lantern", pipeline=pipe, head_path=DIR)`. The losses are EAGLE's (see `training.py`); the
held-out figure is the expected acceptance Σ_x min(p, q) of the head's first draft token. Resumable: with a
work folder, the sampled sequences and a checkpoint per `eval_every` steps are kept there and a rerun picks
up where it stopped, to identical weights.

examples/train_eagle_head.py trains the bundled model's head on real photo crops with the same loop.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from mmspec.common.training import resume_step, save_step, warmup_cosine_lr

from .drafter import BoundHead, EagleHead
from .training import distill_losses, expected_acceptance, teacher_pass


def fit_eagle_head(target, batch_fn, num_train: int, held, *, steps: int, batch_size: int = 32, lr: float = 1e-3,
                   token_weight: float = 1.0, noise: float = 0.2, seed: int = 0, eval_every: int = 100,
                   checkpoint: Path | None = None, log=print) -> tuple[EagleHead, dict]:
    """The training loop: a new head sized for `target`, trained for `steps` AdamW steps (warm-up + cosine).

    batch_fn(indices, drop) -> (ids, mask or None, first_code): a training batch (drop: per row, one draw
    below 1 the script may use, e.g. to swap in the null class). held: (ids, mask, first_code), the
    held-out sequences. checkpoint: a file to resume from and save to every `eval_every` steps.
    Returns (the head, {"expected_acceptance_before", "expected_acceptance", "steps"}).
    """
    torch.manual_seed(seed)
    head = EagleHead.for_target(target).to(target.device)
    bound = BoundHead(head, target)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    held_ids, held_mask, held_first = held
    evaluate = lambda: expected_acceptance(bound, target, held_ids, held_mask, first_code=held_first)  # noqa: E731
    before = evaluate()  # of the untrained head, resumed or not
    log(f"held-out expected acceptance before training: {before:.3f}")
    start = resume_step(checkpoint, head, opt, log)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(start):  # replay the data and noise order
        torch.randint(0, num_train, (batch_size,), generator=gen)
        torch.rand(batch_size, generator=gen)
        torch.rand(1, generator=gen)
    accept, t0 = before, time.time()
    for step in range(start, steps):
        for group in opt.param_groups:
            group["lr"] = warmup_cosine_lr(step, steps, lr)
        idx = torch.randint(0, num_train, (batch_size,), generator=gen)
        drop = torch.rand(batch_size, generator=gen)
        noise_gen = torch.Generator(target.device).manual_seed(int(torch.rand(1, generator=gen).item() * 2**31))
        ids, mask, first_code = batch_fn(idx, drop)
        feats, probs = teacher_pass(target, ids, mask)
        feat_loss, token_loss, *_ = distill_losses(bound, ids, feats, probs, mask, first_code=first_code,
                                                   noise=noise, generator=noise_gen)
        opt.zero_grad(set_to_none=True)
        (feat_loss + token_weight * token_loss).backward()
        opt.step()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            accept = evaluate()
            log(f"step {step + 1}/{steps} feature loss {feat_loss.item():.4f} token loss {token_loss.item():.3f} "
                f"held-out expected acceptance {accept:.3f} {time.time() - t0:.0f}s")
            save_step(checkpoint, head, opt, step + 1)
    if start >= steps:  # resumed a finished run: report the held-out figure of the saved head
        accept = evaluate()
    return head.eval(), {"expected_acceptance_before": before, "expected_acceptance": accept, "steps": steps}


def train_eagle_head(pipeline, out, *, steps: int = 400, batch_size: int = 16, lr: float = 1e-3,
                     token_weight: float = 1.0, noise: float = 0.2, num_sequences: int = 256, num_heldout: int = 32,
                     unconditional_fraction: float = 0.1, seed: int = 0, eval_every: int = 100,
                     work_dir=None, log=print) -> dict:
    """Self-distil an EAGLE head for `pipeline` (an `ARImagePipeline`: bundled, saved or your own
    transformers model) and save it to `out` (fp32); returns the settings to load it with and the held-out
    expected acceptance before and after.

    num_sequences / num_heldout: sequences the target samples (temperature 1, no guidance; a fraction
    `unconditional_fraction` from the unconditional prompt) to train on and to measure on.
    token_weight: EAGLE's p_w (0.1 there; 1.0 here, see examples/train_eagle_head.py).
    work_dir: keep the sampled sequences and checkpoints there, so a rerun resumes.
    """
    from mmspec.vision.distill import check_trainer_arguments, frozen, self_distillation_data

    check_trainer_arguments(pipeline, unconditional_fraction, steps=steps, batch_size=batch_size,
                            num_sequences=num_sequences, num_heldout=num_heldout, eval_every=eval_every)
    target, train, held = self_distillation_data(pipeline, num_sequences, num_heldout, seed, unconditional_fraction,
                                                 work_dir, log)

    def batch_fn(idx, drop):  # the unconditional rows were drawn with the sequences
        idx = idx.to(train[0].device)
        return train[0][idx], train[1][idx], train[2][idx]

    with frozen(pipeline.transformer):
        head, metrics = fit_eagle_head(target, batch_fn, num_sequences, held, steps=steps, batch_size=batch_size,
                                       lr=lr, token_weight=token_weight, noise=noise, seed=seed, eval_every=eval_every,
                                       checkpoint=Path(work_dir) / "head.ckpt" if work_dir is not None else None,
                                       log=log)
    head.float().save_pretrained(str(out))
    log(f"saved the head to {out}")
    return {"load_with": {"head_path": str(out)}, **metrics}
