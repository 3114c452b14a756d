"""Train the `ssd` plugin's right and below heads for any image pipeline, by self-distillation.

`mmspec train-head ssd --model FOLDER --out DIR` (or `train_ssd_heads(pipeline, out)`): the frozen target
samples its own sequences (`mmspec.vision.distill`), and for the target's hidden state h_j that predicts code j
- the right head learns the target's distribution of code j+1,
- the below head learns the target's distribution of code j−1+W (the code under the input token),
by cross-entropy against those distributions (forward KL up to a constant), which is what speculative sampling's
acceptance rewards. The held-out figure per head is the expected acceptance Σ_x min(p, q). Resumable to
identical weights with a work folder. Then `load_plugin("ssd", pipeline=pipe, heads_path=DIR)`.

examples/train_ssd_heads.py trains the bundled model's heads on real photo crops with the same losses.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from mmspec.common.training import resume_step, save_step, warmup_cosine_lr

from .plugin import SpatialHeads


def head_losses(heads: SpatialHeads, hidden: torch.Tensor, probs: torch.Tensor, width: int):
    """Soft cross-entropy of each head against the target's distributions, and (logits, target) per head.

    hidden [B, N, H], probs [B, N, V]: the target's states and distributions at the inputs that predict codes
    0..N−1 of W-wide images."""
    right_logits = heads.right(hidden[:, :-1])  # input j -> code j+1 = the target's distribution at input j+1
    below_logits = heads.below(hidden[:, 1:1 - width])  # input j (j >= 1) -> code j−1+W (at input j−1+W)
    right_target, below_target = probs[:, 1:], probs[:, width:]
    loss_r = -(right_target * right_logits.float().log_softmax(-1)).sum(-1).mean()
    loss_b = -(below_target * below_logits.float().log_softmax(-1)).sum(-1).mean()
    return loss_r, loss_b, (right_logits, right_target), (below_logits, below_target)


@torch.no_grad()
def heads_acceptance(heads: SpatialHeads, batches, width: int) -> tuple[float, float]:
    """Mean Σ_x min(p, q) of each head over (hidden, probs) batches: the chance speculative sampling keeps a
    draft of that head."""
    totals, n = [0.0, 0.0], 0
    for hidden, probs in batches:
        *_, right, below = head_losses(heads, hidden, probs, width)
        for k, (logits, target) in enumerate((right, below)):
            totals[k] += torch.minimum(logits.float().softmax(-1), target).sum(-1).mean().item()
        n += 1
    return totals[0] / max(n, 1), totals[1] / max(n, 1)


@torch.no_grad()
def code_states(target, ids: torch.Tensor, mask: torch.Tensor, num_codes: int):
    """The target's hidden states [B, N, H] and distributions [B, N, V] at the inputs that predict each row's
    N codes (left-padded rows: the codes are the last N tokens), through any adapter."""
    _, out = target.prefill(ids, mask, output_hidden=True)
    length = ids.shape[1]
    window = slice(length - num_codes - 1, length - 1)
    return out.hidden[:, window].float(), out.logits[:, window].float().softmax(-1)


@torch.no_grad()
def fit_output_layer(heads: SpatialHeads, target, hidden: torch.Tensor) -> None:
    """Start both heads' projections from a least-squares fit of the target's output layer on real states (the
    layer itself when it is linear, as LlamaGen's; its best linear stand-in when it is an MLP, as Janus')."""
    states = hidden.reshape(-1, hidden.shape[-1])[:4096].float()
    logits = target.output_logits(states.to(target.token_embeddings().dtype)).float()
    logits = logits - logits.mean(-1, keepdim=True)  # softmax ignores a shift per row
    weight = torch.linalg.lstsq(states, logits).solution.T  # [V, H]
    heads.right.out.weight.copy_(weight)
    heads.below.out.weight.copy_(weight)


def train_ssd_heads(pipeline, out, *, steps: int = 300, batch_size: int = 16, lr: float = 2e-3,
                    num_sequences: int = 256, num_heldout: int = 32, unconditional_fraction: float = 0.1,
                    seed: int = 0, eval_every: int = 100, work_dir=None, log=print) -> dict:
    """Self-distil `ssd` heads for `pipeline` (an `ARImagePipeline`: bundled, saved or your own transformers
    model) at its default image size and save them to `out` (fp32); returns the settings to load them with and
    each head's held-out expected acceptance before and after.

    num_sequences / num_heldout: sequences the target samples (temperature 1, no guidance; a fraction
    `unconditional_fraction` from the unconditional prompt, so the heads also serve guidance's rows).
    work_dir: keep the sampled sequences and checkpoints there, so a rerun resumes.
    """
    from mmspec.vision.distill import check_trainer_arguments, frozen, self_distillation_data

    check_trainer_arguments(pipeline, unconditional_fraction, steps=steps, batch_size=batch_size,
                            num_sequences=num_sequences, num_heldout=num_heldout, eval_every=eval_every)
    grid = pipeline.token_structure
    width, num_codes = grid.cols, grid.rows * grid.cols
    if grid.rows < 2:
        raise ValueError(f"ssd heads need images of at least 2 code rows (the below head), got {grid.rows}")
    target, train, held = self_distillation_data(pipeline, num_sequences, num_heldout, seed, unconditional_fraction,
                                                 work_dir, log)

    def states(part, rows):
        return code_states(target, part[0][rows], part[1][rows], num_codes)

    held_batches = [states(held, slice(i, i + 32)) for i in range(0, len(held[0]), 32)]
    with frozen(pipeline.transformer):
        torch.manual_seed(seed)
        hidden, _ = states(train, slice(0, 64))
        heads = SpatialHeads(hidden_size=hidden.shape[-1], vocab_size=target.vocab_size, grid_width=width)
        heads = heads.to(hidden.device)
        fit_output_layer(heads, target, hidden)
        codes = train[0][:, -num_codes:]
        counts = torch.bincount(codes.flatten().cpu(), minlength=target.vocab_size).float()
        heads.prior_logits.copy_((counts + 1).log())
        opt = torch.optim.AdamW([p for p in heads.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
        before = heads_acceptance(heads, held_batches, width)
        log(f"held-out expected acceptance before training (right, below): {before[0]:.3f}, {before[1]:.3f}")
        checkpoint = Path(work_dir) / "ssd_heads.ckpt" if work_dir is not None else None
        start = resume_step(checkpoint, heads, opt, log)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(start):  # replay the data order
            torch.randint(0, num_sequences, (batch_size,), generator=gen)
        accept, t0 = before, time.time()
        for step in range(start, steps):
            for group in opt.param_groups:
                group["lr"] = warmup_cosine_lr(step, steps, lr)
            rows = torch.randint(0, num_sequences, (batch_size,), generator=gen).to(train[0].device)
            loss_r, loss_b, *_ = head_losses(heads, *states(train, rows), width)
            opt.zero_grad(set_to_none=True)
            (loss_r + loss_b).backward()
            opt.step()
            if (step + 1) % eval_every == 0 or step + 1 == steps:
                accept = heads_acceptance(heads, held_batches, width)
                log(f"step {step + 1}/{steps} loss right {loss_r.item():.3f} below {loss_b.item():.3f} held-out "
                    f"expected acceptance right {accept[0]:.3f} below {accept[1]:.3f} {time.time() - t0:.0f}s")
                save_step(checkpoint, heads, opt, step + 1)
        if start >= steps:  # resumed a finished run: report the held-out figures of the saved heads
            accept = heads_acceptance(heads, held_batches, width)
    heads.float().eval().save_pretrained(str(out))
    log(f"saved the heads to {out}")
    return {"load_with": {"heads_path": str(out)}, "expected_acceptance_before": {"right": before[0], "below": before[1]},
            "expected_acceptance": {"right": accept[0], "below": accept[1]}, "steps": steps}
