"""Train the bundled image classifier (timm resnet10t) used by vision benches for class accuracy
and Fréchet distance. It sees only real crops (with flip, blur and colour jitter), never generated
images. Deterministic and resumable.

Shipped weights were made with:
    python examples/train_classifier.py --steps 600
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from mmspec.vision.data import make_crops
from mmspec.vision.metrics import build_classifier, classify, normalize
from mmspec.vision.tokenizer import BUNDLED_DIR


def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """x [B, 3, H, W] in [0, 1]: random flips, brightness/contrast/saturation jitter, light blur."""
    b = x.shape[0]
    flip = torch.rand(b, generator=gen) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    bright = 1 + (torch.rand(b, 1, 1, 1, generator=gen) - 0.5) * 0.3
    contrast = 1 + (torch.rand(b, 1, 1, 1, generator=gen) - 0.5) * 0.3
    sat = 1 + (torch.rand(b, 1, 1, 1, generator=gen) - 0.5) * 0.3
    mean = x.mean((1, 2, 3), keepdim=True)
    x = (x - mean) * contrast + mean
    gray = x.mean(1, keepdim=True)
    x = ((x - gray) * sat + gray) * bright
    blur = torch.rand(b, generator=gen) < 0.3
    blurred = F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    return torch.where(blur[:, None, None, None], blurred, x).clamp(0, 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--per-class", type=int, default=3000)
    parser.add_argument("--heldout-per-class", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ckpt-every", type=int, default=100)
    parser.add_argument("--work-dir", default="runs/classifier")
    parser.add_argument("--crops-dir", default="runs/vq", help="reuse crops cached by train_vq.py")
    parser.add_argument("--out", default=str(BUNDLED_DIR / "classifier"))
    args = parser.parse_args()

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    crops = {}
    for split, n in (("train", args.per_class), ("heldout", args.heldout_per_class)):
        cached = Path(args.crops_dir) / f"crops_{split}_{n}_{args.seed}.pt"
        crops[split] = torch.load(cached, weights_only=False) if cached.exists() else make_crops(split, n, args.seed)
    train_x, train_y = crops["train"].images.float() / 255, crops["train"].labels
    held_x, held_y = crops["heldout"].images.float() / 255, crops["heldout"].labels

    torch.manual_seed(args.seed)
    model = build_classifier()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    start, ckpt = 0, work / "classifier.ckpt"
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        print(f"resumed at step {start}", flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    for _ in range(start):  # replay the data and augmentation draws
        torch.randint(0, len(train_x), (args.batch_size,), generator=gen)
        augment(torch.zeros(args.batch_size, 3, 2, 2), gen)
    model.train()
    t0 = time.time()
    for step in range(start, args.steps):
        lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(0, len(train_x), (args.batch_size,), generator=gen)
        x = augment(train_x[idx], gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(normalize(x)).float(), train_y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % args.ckpt_every == 0:
            model.eval()
            acc = float((classify(model, held_x) == held_y).float().mean())
            model.train()
            print(f"step {step + 1}/{args.steps} loss {loss.item():.3f} held-out acc {acc:.3f} "
                  f"{time.time() - t0:.0f}s", flush=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt)
    model.eval()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.half().contiguous() for k, v in model.state_dict().items() if v.is_floating_point()},
              out / "model.safetensors")
    acc = float((classify(model, held_x) == held_y).float().mean())
    print(f"saved to {out}; held-out accuracy {acc:.3f}", flush=True)


if __name__ == "__main__":
    main()
