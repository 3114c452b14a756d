"""Train the `ssd` plugin's right and below heads on the bundled LlamaGen model, by self-distillation
on real photo crops (for any other image pipeline: `mmspec train-head ssd --model ... --out DIR`, which
samples its training sequences from the target itself; same losses, `mmspec.plugins.ssd.train`).

The target is frozen. Sequences are VQ codes of training crops, with the class
replaced by the null class 10 % of the time so the heads also serve CFG's
unconditional rows. For the target's last hidden state h_j at input j (the
state that predicts code j):
- the right head learns the target's own distribution of code j+1,
- the below head learns the target's own distribution of code j−1+W (the code
  under the input token).
Loss: cross-entropy against those distributions (forward KL up to a constant),
which is what speculative sampling's acceptance rewards. Held-out: expected
acceptance Σ_x min(p(x), q(x)) per head. Deterministic and resumable
(--work-dir); the final heads are saved in fp32 (1.6 MB).

Shipped heads were made with:
    python examples/train_ssd_heads.py --steps 600 --out plugins/ssd/bundled/heads --overwrite-shipped
(10 min on 2 CPU cores). Held-out expected acceptance went from 0.386 (right) and 0.275 (below) for
the untrained heads (both projections = the target's output layer) to 0.469 and 0.411.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from mmspec.plugins.ssd import BUNDLED_HEADS, SpatialHeads
from mmspec.plugins.ssd.train import head_losses, heads_acceptance
from mmspec.common.training import check_output_folder, warmup_cosine_lr
from mmspec.vision.data import code_dataset
from mmspec.vision.pipeline import bundled_pipeline


@torch.no_grad()
def teacher(model, codes: torch.Tensor, labels: torch.Tensor):
    """Hidden states [B, N, H] and the target's distributions [B, N, V] at inputs 0..N−1."""
    tokens = torch.cat([model.class_token(labels)[:, None], codes[:, :-1]], 1)
    logits, hidden = model(tokens, output_hidden=True)
    return hidden.float(), logits.float().softmax(-1)


@torch.no_grad()
def expected_acceptance(heads, model, data, width, batch=100) -> tuple[float, float]:
    """Each head's mean Σ_x min(p, q) on held-out sequences (the chance speculative sampling keeps a draft)."""
    batches = (teacher(model, data["codes"][i:i + batch], data["labels"][i:i + batch])
               for i in range(0, len(data["codes"]), batch))
    return heads_acceptance(heads, batches, width)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--per-class", type=int, default=300)
    parser.add_argument("--heldout-per-class", type=int, default=20)
    parser.add_argument("--null-class-prob", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--work-dir", default="runs/ssd")
    parser.add_argument("--out", required=True, help=f"where the heads go (the shipped ones are {BUNDLED_HEADS})")
    parser.add_argument("--overwrite-shipped", action="store_true", help="replace the shipped heads")
    args = parser.parse_args()
    try:
        check_output_folder(args.out, overwrite=True, overwrite_shipped=args.overwrite_shipped,
                            parent_must_exist=False)
    except ValueError as error:
        parser.error(str(error))

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    pipe = bundled_pipeline()
    model = pipe.transformer.float().eval()
    width = pipe.grid_size
    train = code_dataset(work, "train", args.per_class, args.seed, pipe.vqvae)
    held = code_dataset(work, "heldout", args.heldout_per_class, args.seed, pipe.vqvae)
    print(f"train sequences {len(train['codes'])}, held-out {len(held['codes'])}", flush=True)

    torch.manual_seed(args.seed)
    heads = SpatialHeads(hidden_size=model.config.dim, vocab_size=model.config.vocab_size, grid_width=width)
    heads.init_from_lm_head(model.output.weight.float())
    counts = torch.bincount(train["codes"].flatten(), minlength=model.config.vocab_size).float()
    heads.prior_logits.copy_((counts + 1).log())
    opt = torch.optim.AdamW([p for p in heads.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    start, ckpt = 0, work / "heads.ckpt"
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        print(f"resumed at step {start}", flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    for _ in range(start):  # replay the data order
        torch.randint(0, len(train["codes"]), (args.batch_size,), generator=gen)
        torch.rand(args.batch_size, generator=gen)
    print("held-out expected acceptance before training (right, below): "
          f"{expected_acceptance(heads, model, held, width)}", flush=True)
    t0 = time.time()
    for step in range(start, args.steps):
        for group in opt.param_groups:
            group["lr"] = warmup_cosine_lr(step, args.steps, args.lr)
        idx = torch.randint(0, len(train["codes"]), (args.batch_size,), generator=gen)
        labels = train["labels"][idx].clone()
        labels[torch.rand(args.batch_size, generator=gen) < args.null_class_prob] = model.null_class
        hidden, probs = teacher(model, train["codes"][idx], labels)
        loss_r, loss_b, *_ = head_losses(heads, hidden, probs, width)
        opt.zero_grad(set_to_none=True)
        (loss_r + loss_b).backward()
        opt.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            accept = expected_acceptance(heads, model, held, width)
            print(f"step {step + 1}/{args.steps} loss right {loss_r.item():.3f} below {loss_b.item():.3f} "
                  f"held-out expected acceptance right {accept[0]:.3f} below {accept[1]:.3f} "
                  f"{time.time() - t0:.0f}s", flush=True)
            torch.save({"heads": heads.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt)
    heads.eval().save_pretrained(args.out)
    print(f"saved the heads to {args.out}", flush=True)


if __name__ == "__main__":
    main()
