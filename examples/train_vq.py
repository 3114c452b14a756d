"""Train the bundled VQ tokenizer (a diffusers `VQModel`) on natural-photo crops.

64x64 RGB -> 16x16 grid of codes from a 512-entry codebook (downsampling 4).
Loss: MSE + L1 + the quantizer's commitment/codebook loss. Codes unused over
the last `--restart-every` steps are restarted on random encoder outputs,
which keeps the whole codebook alive. Deterministic and resumable (checkpoint
every --ckpt-every steps in --work-dir).

Shipped weights were made with:
    python examples/train_vq.py --steps 1200
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import VQModel

from mmspec.common.training import warmup_cosine_lr
from mmspec.vision.data import make_crops

VQ_CONFIG = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
                 up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(32, 64, 128), layers_per_block=1,
                 latent_channels=8, num_vq_embeddings=512, vq_embed_dim=8, norm_num_groups=8, sample_size=64)
BUNDLED_VQ = Path(__file__).resolve().parents[1] / "vision" / "bundled" / "vq"


def cached_crops(work: Path, split: str, per_class: int, seed: int):
    path = work / f"crops_{split}_{per_class}_{seed}.pt"
    if path.exists():
        return torch.load(path, weights_only=False)  # our own cache file
    crops = make_crops(split, per_class, seed)
    torch.save(crops, path)
    return crops


def vq_forward(vq: VQModel, x: torch.Tensor):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=x.device.type == "cpu"):
        h = vq.encode(x).latents
    quant, codebook_loss, (_, _, indices) = vq.quantize(h.float())
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=x.device.type == "cpu"):
        recon = vq.decoder(vq.post_quant_conv(quant))
    return recon.float(), codebook_loss.mean(), indices, h.float()


@torch.no_grad()
def psnr(vq: VQModel, images: torch.Tensor, batch: int = 100) -> float:
    """Mean per-image PSNR (dB) of reconstructions, images in [-1, 1]."""
    vq.eval()
    values = []
    for i in range(0, len(images), batch):
        x = images[i:i + batch]
        recon, *_ = vq_forward(vq, x)
        mse = ((recon.clamp(-1, 1) - x) / 2).pow(2).flatten(1).mean(1)
        values.append(10 * torch.log10(1 / mse.clamp(min=1e-10)))
    vq.train()
    return float(torch.cat(values).mean())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=8e-4)
    parser.add_argument("--per-class", type=int, default=3000)
    parser.add_argument("--heldout-per-class", type=int, default=200)
    parser.add_argument("--restart-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ckpt-every", type=int, default=100)
    parser.add_argument("--work-dir", default="runs/vq")
    parser.add_argument("--out", default=str(BUNDLED_VQ))
    args = parser.parse_args()

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    train = cached_crops(work, "train", args.per_class, args.seed).float_images()
    held = cached_crops(work, "heldout", args.heldout_per_class, args.seed).float_images()
    print(f"train crops {len(train)}, held-out crops {len(held)}", flush=True)

    torch.manual_seed(args.seed)
    vq = VQModel(**VQ_CONFIG)
    opt = torch.optim.AdamW(vq.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.99))
    usage = torch.zeros(VQ_CONFIG["num_vq_embeddings"])
    start, ckpt = 0, work / "vq.ckpt"
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        vq.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        usage, start = state["usage"], state["step"]
        torch.set_rng_state(state["rng"])
        print(f"resumed at step {start}", flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    for _ in range(start):  # replay the data order
        torch.randint(0, len(train), (args.batch_size,), generator=gen)
    vq.train()
    t0 = time.time()
    for step in range(start, args.steps):
        for group in opt.param_groups:
            group["lr"] = warmup_cosine_lr(step, args.steps, args.lr)
        x = train[torch.randint(0, len(train), (args.batch_size,), generator=gen)]
        recon, codebook_loss, indices, h = vq_forward(vq, x)
        loss = F.mse_loss(recon, x) + 0.5 * F.l1_loss(recon, x) + codebook_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        usage += torch.bincount(indices.flatten(), minlength=len(usage)).float()
        if (step + 1) % args.restart_every == 0:
            dead = (usage == 0).nonzero().flatten()
            if len(dead):
                pool = h.detach().permute(0, 2, 3, 1).reshape(-1, h.shape[1])
                pick = torch.randint(0, len(pool), (len(dead),))
                with torch.no_grad():
                    vq.quantize.embedding.weight[dead] = pool[pick]
            print(f"step {step + 1}/{args.steps} loss {loss.item():.4f} live codes {int((usage > 0).sum())} "
                  f"restarted {len(dead)} {time.time() - t0:.0f}s", flush=True)
            usage.zero_()
        if (step + 1) % args.ckpt_every == 0:
            torch.save({"model": vq.state_dict(), "opt": opt.state_dict(), "usage": usage, "step": step + 1,
                        "rng": torch.get_rng_state()}, ckpt)
        if (step + 1) % 200 == 0:
            print(f"  held-out PSNR {psnr(vq, held):.2f} dB", flush=True)
    vq.eval().to(torch.float16).save_pretrained(args.out)
    shipped = VQModel.from_pretrained(args.out, torch_dtype=torch.float32)  # measure what ships (fp16 weights)
    print(f"saved to {args.out}; held-out PSNR {psnr(shipped, held):.2f} dB", flush=True)


if __name__ == "__main__":
    main()
